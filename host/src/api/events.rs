//! `POST /v1/items/{id}/events` and `POST /v1/events/batch`: interactions
//! (votes, flags, reports, edits), the high-volume input. Each is durable
//! once answered: the event row, its counter and the item's evaluation mark
//! commit together (group-committed with concurrent events), then the item
//! is scheduled, debounced.

use super::AppState;
use super::auth::Caller;
use super::error::{ApiError, ErrorBody, Json, Path};
use super::idempotency::{ClaimedKey, claim_key, idempotency_key, request_hash};
use super::submit::{BatchResult, batch_result};
use super::validate;
use crate::clock::now_ms;
use crate::domain::EventKind;
use crate::fingerprint::fingerprint;
use crate::store::{EventAppended, EventOutcome, EventWrite, NewEvent, StoreResult};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use utoipa::ToSchema;

/// An interaction with an item.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EventRequest {
    pub kind: EventKind,
    /// Who interacted (platform user id).
    #[schema(min_length = 1, max_length = 256)]
    pub actor: String,
    /// The new text, for `edit` (required there, refused elsewhere).
    #[serde(default)]
    #[schema(max_length = 65536)]
    pub text: Option<String>,
}

/// An accepted event.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct EventResponse {
    pub item: String,
    /// The item's event sequence number after this event.
    pub event_seq: i64,
    /// When the item was marked for evaluation (ms since the epoch).
    pub scheduled_for: i64,
}

fn event_response(a: &EventAppended) -> EventResponse {
    EventResponse {
        item: a.item_id.clone(),
        event_seq: a.event_seq,
        scheduled_for: a.needs_eval_since,
    }
}

fn event_body(a: &EventAppended) -> String {
    serde_json::to_string(&EventResponse {
        item: a.item_id.clone(),
        event_seq: a.event_seq,
        scheduled_for: a.needs_eval_since,
    })
    .expect("the response serializes")
}

fn validate_event(req: &EventRequest, max_text_chars: usize) -> Result<(), ApiError> {
    validate::identifier("actor", &req.actor, 256)?;
    match (&req.kind, &req.text) {
        (EventKind::Edit, None) => Err(ApiError::bad_request("invalid_body", "`edit` needs `text`")),
        (EventKind::Edit, Some(t)) => validate::text("text", t, max_text_chars),
        (_, Some(_)) => Err(ApiError::bad_request("invalid_body", "only `edit` carries `text`")),
        _ => Ok(()),
    }
}

/// An event ready to store, and the key it holds.
struct Prepared {
    write: EventWrite,
    key: Option<ClaimedKey>,
}

/// Validation, the client's rate limit and the key claim; `Err` is the
/// answer to send instead. The item must exist and be the caller's: the
/// store's write decides (another client's item is not found).
async fn prepare(
    state: &AppState,
    caller: &Caller,
    item_id: &str,
    req: EventRequest,
    key: Option<String>,
) -> Result<Prepared, Response> {
    validate_event(&req, state.config.ingest.max_text_chars).map_err(IntoResponse::into_response)?;
    super::rate_limited(&state.client_limiter, &caller.name).map_err(IntoResponse::into_response)?;
    let key = match key {
        Some(key) => Some(
            claim_key(
                state,
                "events",
                &caller.name,
                &key,
                request_hash(&format!("POST /v1/items/{item_id}/events"), &req),
            )
            .await?,
        ),
        None => None,
    };
    let write = EventWrite {
        event: NewEvent {
            item_id: item_id.to_string(),
            kind: req.kind,
            actor: req.actor,
            fingerprint: req.text.as_deref().map(fingerprint),
            text: req.text,
            owner: (!caller.may_read_all()).then(|| caller.name.clone()),
            now: now_ms(),
        },
        key: key.as_ref().map(|k| k.completion(StatusCode::ACCEPTED)),
        respond: event_body,
    };
    Ok(Prepared { write, key })
}

/// What a stored event answers: the appended event, or the error its
/// request gets (a failed write releases its key).
async fn settle(
    state: &AppState,
    key: Option<ClaimedKey>,
    outcome: StoreResult<EventOutcome>,
) -> Result<EventAppended, ApiError> {
    let outcome = match outcome {
        Ok(o) => o,
        Err(e) => {
            if let Some(k) = &key {
                k.release(state).await;
            }
            return Err(e.into());
        }
    };
    match outcome {
        EventOutcome::Appended(a) => Ok(a),
        EventOutcome::NotFound => Err(ApiError::not_found("item")),
        EventOutcome::Deleted => Err(ApiError::conflict("item_deleted", "the item is deleted")),
        EventOutcome::KeyLost => Err(ApiError::conflict(
            "idempotency_key_taken_over",
            "this request held its Idempotency-Key past the lock time and a retry took it over; the retry's result stands",
        )),
    }
}

/// Record an interaction (vote, flag, report, edit).
#[utoipa::path(
    post, path = "/v1/items/{id}/events", tag = "items",
    request_body = EventRequest,
    params(("id" = String, Path), ("Idempotency-Key" = Option<String>, Header)),
    responses(
        (status = 202, body = EventResponse), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 413, body = ErrorBody),
        (status = 415, body = ErrorBody), (status = 422, body = ErrorBody), (status = 429, body = ErrorBody),
        (status = 503, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn append_event(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    headers: HeaderMap,
    Json(req): Json<EventRequest>,
) -> Result<Response, ApiError> {
    validate::path_id("id", &id)?;
    let key = idempotency_key(&headers)?;
    let kind = req.kind;
    let prepared = match prepare(&state, &caller, &id, req, key).await {
        Ok(p) => p,
        Err(answer) => return Ok(answer),
    };
    let outcome = state.writes.append_event(prepared.write).await;
    let appended = settle(&state, prepared.key, outcome).await?;
    state.scheduler.schedule(&appended.item_id, kind.as_str()).await;
    Ok(super::json_response(StatusCode::ACCEPTED, event_body(&appended)))
}

/// Up to this many events in one batch request.
pub const MAX_BATCH_EVENTS: usize = 10_000;

/// A batch of events, on any of the caller's items.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EventBatch {
    #[schema(min_items = 1, max_items = 10000)]
    pub events: Vec<BatchEvent>,
}

/// One event of a batch: the item it is about, the fields of a single
/// event and its own optional idempotency key. Each entry's values are
/// checked as a single event's are, and a bad one gets its own 400 in
/// `results` instead of failing the batch, so the schema states types only.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchEvent {
    pub item: String,
    /// Like the `Idempotency-Key` header of a single event.
    #[serde(default)]
    pub idempotency_key: Option<String>,
    pub kind: EventKind,
    pub actor: String,
    #[serde(default)]
    pub text: Option<String>,
}

/// The answers to an event batch, in the order of its entries.
#[derive(Debug, Serialize, ToSchema)]
pub struct EventBatchResults {
    pub results: Vec<BatchResult>,
}

/// Record up to 10,000 interactions at once. Each entry gets the answer
/// its single request would have (202, 404, 409, 422, 429, ...), with its
/// own idempotency key; one refused entry never fails the others.
#[utoipa::path(
    post, path = "/v1/events/batch", tag = "items",
    request_body = EventBatch,
    responses(
        (status = 200, body = EventBatchResults, description = "One result per entry, in order"),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 413, body = ErrorBody),
        (status = 415, body = ErrorBody), (status = 422, body = ErrorBody), (status = 503, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn append_batch(
    State(state): State<AppState>,
    caller: Caller,
    Json(batch): Json<EventBatch>,
) -> Result<Json<EventBatchResults>, ApiError> {
    if batch.events.is_empty() || batch.events.len() > MAX_BATCH_EVENTS {
        return Err(ApiError::bad_request(
            "invalid_body",
            format!("`events` must hold 1-{MAX_BATCH_EVENTS} events"),
        ));
    }
    let mut answers: Vec<Option<BatchResult>> = Vec::with_capacity(batch.events.len());
    let mut prepared = Vec::new();
    for (i, entry) in batch.events.into_iter().enumerate() {
        if let Err(e) = validate::identifier("item", &entry.item, 256) {
            answers.push(Some(e.into_batch_result()));
            continue;
        }
        let key = match entry
            .idempotency_key
            .as_deref()
            .map(super::idempotency::validate_key)
            .transpose()
        {
            Ok(k) => k,
            Err(e) => {
                answers.push(Some(e.into_batch_result()));
                continue;
            }
        };
        let BatchEvent {
            item,
            kind,
            actor,
            text,
            ..
        } = entry;
        match prepare(&state, &caller, &item, EventRequest { kind, actor, text }, key).await {
            Ok(p) => {
                prepared.push((i, kind, p));
                answers.push(None);
            }
            // A refusal before the write (rate limit, key replay or conflict).
            Err(answer) => answers.push(Some(batch_result(answer).await)),
        }
    }
    let (meta, writes): (Vec<_>, Vec<_>) = prepared.into_iter().map(|(i, k, p)| ((i, k, p.key), p.write)).unzip();
    let outcomes = state.writes.append_events(writes).await;
    let mut scheduled: HashMap<String, EventKind> = HashMap::new();
    for ((i, kind, key), outcome) in meta.into_iter().zip(outcomes) {
        answers[i] = Some(match settle(&state, key, outcome).await {
            Ok(a) => {
                let result = BatchResult {
                    status: StatusCode::ACCEPTED.as_u16(),
                    body: serde_json::to_value(event_response(&a)).expect("an event response serializes"),
                };
                scheduled.entry(a.item_id).or_insert(kind);
                result
            }
            Err(e) => e.into_batch_result(),
        });
    }
    // Each item queued once, after every entry.
    for (item, kind) in scheduled {
        state.scheduler.schedule(&item, kind.as_str()).await;
    }
    let results = answers.into_iter().map(|a| a.expect("every entry answered")).collect();
    Ok(Json(EventBatchResults { results }))
}
