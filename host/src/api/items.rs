//! `POST /v1/items` (the sync path), `POST /v1/items/{id}/events`,
//! `GET /v1/items/{id}`.

use super::AppState;
use super::auth::Caller;
use super::error::{ApiError, ErrorBody, Json, Path};
use crate::fingerprint::fingerprint;
use crate::judge::{judge, snapshot_of};
use crate::rules::Phase;
use crate::status::ItemStatus;
use crate::store::{
    CreateOutcome, DecisionRecord, EventKind, EventOutcome, IdempotencyClaim, IdempotencyResponse, IdempotencyStart,
    Item, ItemWrite, NewEvent, NewItem, SnapshotData, TransitionRecord, now_ms,
};
use crate::verdict::Verdict;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use tracing::Instrument;
use utoipa::ToSchema;

/// A submission.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SubmitRequest {
    /// The platform's own id; unique per client when given.
    #[serde(default)]
    pub external_id: Option<String>,
    /// `post`, `comment`, `profile`, ... (1-64 characters).
    pub kind: String,
    /// The author's id on the platform (1-256 characters).
    pub author: String,
    /// The content.
    pub text: String,
    /// Free-form facts passed to rules as string pairs.
    #[serde(default)]
    #[schema(value_type = Object)]
    pub context: Option<BTreeMap<String, serde_json::Value>>,
}

/// An accepted submission.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct SubmitResponse {
    pub id: String,
    /// `pending_scan`, or already `held_for_review` / `rejected` when a
    /// sync-phase rule or the duplicate check decided.
    pub status: ItemStatus,
    pub version: i64,
}

/// An interaction with an item.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EventRequest {
    pub kind: EventKind,
    /// Who interacted (platform user id).
    pub actor: String,
    /// The new text, for `edit` (required there, refused elsewhere).
    #[serde(default)]
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

/// An item with its counters, decisions and audit trail.
#[derive(Debug, Serialize, ToSchema)]
pub struct ItemView {
    pub id: String,
    pub external_id: Option<String>,
    pub kind: String,
    pub author: String,
    pub text: String,
    #[schema(value_type = Object)]
    pub context: serde_json::Value,
    pub status: ItemStatus,
    pub version: i64,
    #[schema(value_type = Option<String>)]
    pub decided_by: Option<crate::status::Actor>,
    /// Set while an evaluation is pending.
    pub needs_eval_since: Option<i64>,
    pub created_at: i64,
    pub updated_at: i64,
    pub counters: BTreeMap<String, i64>,
    pub decisions: Vec<DecisionRecord>,
    pub transitions: Vec<TransitionRecord>,
    /// Hand-offs to external classifiers, oldest first, with their outcome.
    pub provider_requests: Vec<crate::store::ProviderRequestRecord>,
    /// Callbacks received for this item, with what each did.
    pub provider_callbacks: Vec<crate::store::ProviderCallbackRecord>,
}

const MAX_ID_BYTES: usize = 256;

fn check_len(field: &str, value: &str, max: usize) -> Result<(), ApiError> {
    if value.trim().is_empty() {
        return Err(ApiError::bad_request(
            "invalid_body",
            format!("`{field}` must not be empty"),
        ));
    }
    if value.len() > max {
        return Err(ApiError::bad_request(
            "invalid_body",
            format!("`{field}` is {} bytes, over the limit of {max}", value.len()),
        ));
    }
    Ok(())
}

/// The `Idempotency-Key` header, validated (IETF draft: 1-255 printable ASCII).
pub fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(raw) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    let bad = |why: &str| ApiError::bad_request("invalid_idempotency_key", format!("Idempotency-Key {why}"));
    let key = raw.to_str().map_err(|_| bad("must be printable ASCII"))?;
    if key.is_empty() {
        return Err(bad("must not be empty"));
    }
    if key.len() > 255 {
        return Err(bad("must be at most 255 characters"));
    }
    if !key.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        return Err(bad("must be printable ASCII"));
    }
    Ok(Some(key.to_string()))
}

/// The request id the middleware put on the request (and echoes back).
pub fn request_id(headers: &HeaderMap) -> String {
    headers
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .map_or_else(|| uuid::Uuid::now_v7().to_string(), str::to_string)
}

fn request_hash(route: &str, body: &impl Serialize) -> String {
    let mut h = Sha256::new();
    h.update(route.as_bytes());
    h.update([0]);
    h.update(serde_json::to_vec(body).expect("request bodies serialize"));
    hex::encode(h.finalize())
}

/// The stored response of the first request, replayed byte for byte.
fn replay(status: u16, body: String) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
    let mut r = (status, body).into_response();
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r.headers_mut()
        .insert("idempotent-replayed", HeaderValue::from_static("true"));
    r
}

fn json_response(status: StatusCode, body: String) -> Response {
    let mut r = (status, body).into_response();
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// Claims an idempotency key; `Err` carries the response to send instead.
async fn claim_key(
    state: &AppState,
    route: &'static str,
    scope: &str,
    key: &str,
    hash: String,
) -> Result<(), Response> {
    let ingest = &state.config.ingest;
    let claim = IdempotencyClaim {
        scope: scope.to_string(),
        key: key.to_string(),
        request_hash: hash,
        now: now_ms(),
        lock_ms: ingest.idempotency_lock_ms,
        ttl_ms: ingest.idempotency_ttl_ms,
    };
    match state.store.idempotency_start(&claim).await {
        Ok(IdempotencyStart::Started) => Ok(()),
        Ok(IdempotencyStart::Replay { status, body }) => {
            state
                .metrics
                .idempotency_replays
                .get_or_create(&crate::metrics::RouteLabel { route })
                .inc();
            Err(replay(status, body))
        }
        Ok(IdempotencyStart::InFlight) => Err(ApiError::conflict(
            "idempotency_key_in_flight",
            "a request with this Idempotency-Key is still being processed",
        )
        .retry_after(1)
        .into_response()),
        Ok(IdempotencyStart::Mismatch) => Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "idempotency_key_reused",
            "this Idempotency-Key was used with a different request",
        )
        .into_response()),
        Err(e) => Err(ApiError::from(e).into_response()),
    }
}

/// Undoes a key claim when the request fails before its effect.
async fn release_key(state: &AppState, scope: &str, key: Option<&str>) {
    if let Some(key) = key
        && let Err(e) = state.store.idempotency_release(scope, key).await
    {
        tracing::warn!(error = %e, "releasing an idempotency key failed; it frees itself after the lock time");
    }
}

fn rate_limited(limiter: &super::RateLimiter, key: String) -> Result<(), ApiError> {
    limiter.check_key(&key).map_err(|not_until| {
        let wait = not_until.wait_time_from(governor::clock::Clock::now(&governor::clock::DefaultClock::default()));
        ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limited",
            "too many requests; slow down",
        )
        .retry_after(wait.as_secs_f64().ceil() as u64)
    })
}

/// Submit content.
#[utoipa::path(
    post, path = "/v1/items", tag = "items",
    request_body = SubmitRequest,
    params(("Idempotency-Key" = Option<String>, Header, description = "1-255 printable ASCII; scoped to the token; kept 24 h")),
    responses(
        (status = 202, body = SubmitResponse, description = "Accepted (or the replay of the first response for a repeated key)"),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 409, body = ErrorBody),
        (status = 413, body = ErrorBody), (status = 415, body = ErrorBody), (status = 422, body = ErrorBody),
        (status = 429, body = ErrorBody), (status = 503, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn submit(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Json(req): Json<SubmitRequest>,
) -> Result<Response, ApiError> {
    let ingest = &state.config.ingest;
    if let Some(ext) = &req.external_id {
        check_len("external_id", ext, MAX_ID_BYTES)?;
    }
    check_len("kind", &req.kind, 64)?;
    check_len("author", &req.author, MAX_ID_BYTES)?;
    if req.text.len() > ingest.max_text_bytes {
        return Err(ApiError::bad_request(
            "invalid_body",
            format!(
                "`text` is {} bytes, over the limit of {}",
                req.text.len(),
                ingest.max_text_bytes
            ),
        ));
    }
    let key = idempotency_key(&headers)?;
    let correlation_id = request_id(&headers);
    let span = tracing::info_span!(
        "item.submit",
        client = %caller.name,
        idempotency_key = key.as_deref().unwrap_or(""),
        request_id = %correlation_id
    );
    let result = async {
        rate_limited(&state.client_limiter, caller.name.clone())?;

        if let Some(key) = &key
            && let Err(response) =
                claim_key(&state, "items", &caller.name, key, request_hash("POST /v1/items", &req)).await
        {
            return Ok(response);
        }
        // After the key claim: retries of one submission are not an author posting more.
        let author = format!("{}\u{0}{}", caller.name, req.author);
        let result = match rate_limited(&state.author_limiter, author) {
            Ok(()) => create(&state, &caller, &req, key.as_deref(), correlation_id).await,
            Err(e) => Err(e),
        };
        if result.is_err() {
            release_key(&state, &caller.name, key.as_deref()).await;
        }
        result
    }
    .instrument(span)
    .await;
    state.metrics.submission(submission_outcome(&result));
    result
}

/// The `outcome` label of a submission's answer.
fn submission_outcome(result: &Result<Response, ApiError>) -> &'static str {
    match result {
        Ok(r) if r.headers().contains_key("idempotent-replayed") => "replayed",
        Ok(r) => match r.extensions().get::<ItemStatus>() {
            Some(ItemStatus::Rejected) => "rejected_sync",
            Some(ItemStatus::HeldForReview) => "held_sync",
            _ if r.status() == StatusCode::CONFLICT => "conflict",
            _ if r.status() == StatusCode::UNPROCESSABLE_ENTITY => "key_mismatch",
            _ => "accepted",
        },
        Err(e) if e.status == StatusCode::TOO_MANY_REQUESTS => "rate_limited",
        Err(e) if e.status == StatusCode::CONFLICT => "conflict",
        Err(e) if e.status == StatusCode::SERVICE_UNAVAILABLE => "unavailable",
        Err(_) => "invalid",
    }
}

async fn create(
    state: &AppState,
    caller: &Caller,
    req: &SubmitRequest,
    key: Option<&str>,
    correlation_id: String,
) -> Result<Response, ApiError> {
    let ingest = &state.config.ingest;
    let now = now_ms();
    let fingerprint = fingerprint(&req.text);
    let duplicates = state
        .store
        .fingerprint_count(&req.author, &fingerprint, now - ingest.duplicate_window_ms)
        .await?;
    let context = serde_json::to_string(&req.context.clone().unwrap_or_default()).expect("a JSON map serializes");
    let id = uuid::Uuid::now_v7().to_string();

    // Sync-phase rules, inline under their tight deadline.
    let data = SnapshotData {
        item: Item {
            id: id.clone(),
            client: caller.name.clone(),
            external_id: req.external_id.clone(),
            kind: req.kind.clone(),
            author: req.author.clone(),
            body: req.text.clone(),
            context: context.clone(),
            fingerprint: fingerprint.clone(),
            status: ItemStatus::Received,
            version: 1,
            decided_by: None,
            sync_verdict: None,
            needs_eval_since: None,
            event_seq: 0,
            evaluated_seq: 0,
            created_at: now,
            updated_at: now,
        },
        counters: Vec::new(),
        author_recent_items: 0,
        author_rejected_items: 0,
        author_held_items: 0,
        duplicate_count: duplicates,
        trigger: Vec::new(),
    };
    let registry = state.registry.clone();
    let metrics = state.metrics.clone();
    let fail_closed = state.config.evaluation.fail_closed;
    let judgement = if registry.plugins().iter().any(|p| p.runs_in(Phase::Sync)) {
        let max = registry.engine().limits().max_snapshot_bytes;
        Some(
            tokio::task::spawn_blocking(move || {
                let mut snapshot = snapshot_of(&data, Phase::Sync, now, max);
                judge(&registry, &mut snapshot, Phase::Sync, fail_closed, &metrics)
            })
            .await
            .map_err(|e| {
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    format!("sync rules: {e}"),
                )
            })?,
        )
    } else {
        None
    };

    let duplicate_hold = duplicates + 1 >= i64::from(ingest.duplicate_hold_at);
    if duplicate_hold {
        state.metrics.fingerprint_duplicates.inc();
    }
    let sync_verdict = judgement
        .as_ref()
        .and_then(|j| j.verdict)
        .into_iter()
        .chain(duplicate_hold.then_some(Verdict::Hold))
        .max();
    let (status, cause, reason) = match sync_verdict {
        Some(Verdict::Reject) => (
            ItemStatus::Rejected,
            "sync_rules",
            judgement.as_ref().map_or_else(String::new, |j| j.reason()),
        ),
        Some(Verdict::Hold) if duplicate_hold && judgement.as_ref().and_then(|j| j.verdict) != Some(Verdict::Hold) => (
            ItemStatus::HeldForReview,
            "duplicate_text",
            format!(
                "same text from this author {} times in the duplicate window",
                duplicates + 1
            ),
        ),
        Some(Verdict::Hold) => (
            ItemStatus::HeldForReview,
            "sync_rules",
            judgement.as_ref().map_or_else(String::new, |j| j.reason()),
        ),
        _ if state.metrics.queue_lag_seconds.get() * 1000.0 > state.config.evaluation.degraded_lag_ms as f64 => {
            // Degraded mode: evaluation is far behind, so new content waits
            // hidden rather than visible-and-unjudged; it is judged when the
            // queue catches up.
            (
                ItemStatus::HeldForReview,
                "degraded",
                "evaluation queue is behind; held until judged".to_string(),
            )
        }
        _ => (ItemStatus::PendingScan, "submitted", String::new()),
    };
    let body = serde_json::to_string(&SubmitResponse {
        id: id.clone(),
        status,
        version: 1,
    })
    .expect("the response serializes");
    let new = NewItem {
        id: id.clone(),
        client: caller.name.clone(),
        external_id: req.external_id.clone(),
        kind: req.kind.clone(),
        author: req.author.clone(),
        body: req.text.clone(),
        context,
        fingerprint,
        status,
        sync_verdict,
        // A rejection at submission is final for automation; anything else
        // gets the full asynchronous judgement.
        needs_eval: status != ItemStatus::Rejected,
        cause: cause.into(),
        reason,
        correlation_id,
        now,
    };
    let decisions = judgement
        .as_ref()
        .map_or_else(Vec::new, |j| j.decisions(Phase::Sync, true));
    let response = key.map(|key| IdempotencyResponse {
        scope: caller.name.clone(),
        key: key.to_string(),
        status: StatusCode::ACCEPTED.as_u16(),
        body: body.clone(),
    });
    let write = ItemWrite {
        item: new,
        decisions,
        response,
    };
    match state.writes.create_item(write).await? {
        CreateOutcome::Created(item) => {
            if item.needs_eval_since.is_some() {
                state.scheduler.schedule(&item.id, "submit").await;
            }
            tracing::info!(item = %item.id, status = %item.status, "item accepted");
            let mut response = json_response(StatusCode::ACCEPTED, body);
            // For the submission-outcome metric.
            response.extensions_mut().insert(item.status);
            Ok(response)
        }
        CreateOutcome::DuplicateExternalId { existing_id } => Err(ApiError::conflict(
            "duplicate_external_id",
            format!(
                "this client already submitted external_id {:?} as item {existing_id}",
                req.external_id.as_deref().unwrap_or("")
            ),
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
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 422, body = ErrorBody),
        (status = 429, body = ErrorBody), (status = 503, body = ErrorBody),
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
    check_len("actor", &req.actor, MAX_ID_BYTES)?;
    match (&req.kind, &req.text) {
        (EventKind::Edit, None) => {
            return Err(ApiError::bad_request("invalid_body", "`edit` needs `text`"));
        }
        (EventKind::Edit, Some(t)) if t.len() > state.config.ingest.max_text_bytes => {
            return Err(ApiError::bad_request("invalid_body", "`text` is over the size limit"));
        }
        (EventKind::Edit, _) => {}
        (_, Some(_)) => {
            return Err(ApiError::bad_request("invalid_body", "only `edit` carries `text`"));
        }
        _ => {}
    }
    let key = idempotency_key(&headers)?;
    rate_limited(&state.client_limiter, caller.name.clone())?;
    match state.store.item(&id).await? {
        Some(item) if caller.may_read(&item.client) => {}
        _ => return Err(ApiError::not_found("item")),
    }
    if let Some(key) = &key
        && let Err(response) = claim_key(
            &state,
            "events",
            &caller.name,
            key,
            request_hash(&format!("POST /v1/items/{id}/events"), &req),
        )
        .await
    {
        return Ok(response);
    }
    let event = NewEvent {
        item_id: id.clone(),
        kind: req.kind,
        actor: req.actor.clone(),
        fingerprint: req.text.as_deref().map(fingerprint),
        text: req.text.clone(),
        now: now_ms(),
    };
    let (scope, item_id) = (caller.name.clone(), id.clone());
    let key_for_response = key.clone();
    let respond = move |event_seq: i64, since: i64| IdempotencyResponse {
        scope: scope.clone(),
        key: key_for_response.clone().unwrap_or_default(),
        status: StatusCode::ACCEPTED.as_u16(),
        body: event_body(&item_id, event_seq, since),
    };
    let outcome = state
        .store
        .append_event(
            &event,
            key.is_some().then_some(&respond as &crate::store::EventResponse),
        )
        .await;
    let outcome = match outcome {
        Ok(o) => o,
        Err(e) => {
            release_key(&state, &caller.name, key.as_deref()).await;
            return Err(e.into());
        }
    };
    match outcome {
        EventOutcome::Appended {
            event_seq,
            needs_eval_since,
        } => {
            state.scheduler.schedule(&id, req.kind.as_str()).await;
            Ok(json_response(
                StatusCode::ACCEPTED,
                event_body(&id, event_seq, needs_eval_since),
            ))
        }
        EventOutcome::NotFound => {
            release_key(&state, &caller.name, key.as_deref()).await;
            Err(ApiError::not_found("item"))
        }
        EventOutcome::Deleted => {
            release_key(&state, &caller.name, key.as_deref()).await;
            Err(ApiError::conflict("item_deleted", "the item is deleted"))
        }
    }
}

fn event_body(item: &str, event_seq: i64, scheduled_for: i64) -> String {
    serde_json::to_string(&EventResponse {
        item: item.to_string(),
        event_seq,
        scheduled_for,
    })
    .expect("the response serializes")
}

/// Read an item: status, counters, every decision (stamped with plugin
/// name, version and digest) and the full transition trail.
#[utoipa::path(
    get, path = "/v1/items/{id}", tag = "items",
    params(("id" = String, Path)),
    responses((status = 200, body = ItemView), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = []))
)]
pub async fn get_item(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<ItemView>, ApiError> {
    let details = state.store.item_details(&id).await?;
    let Some(d) = details.filter(|d| caller.may_read(&d.item.client)) else {
        return Err(ApiError::not_found("item"));
    };
    Ok(Json(item_view(d)))
}

pub(super) fn item_view(details: crate::store::ItemDetails) -> ItemView {
    let crate::store::ItemDetails {
        item,
        counters,
        decisions,
        transitions,
        provider_requests,
        provider_callbacks,
    } = details;
    ItemView {
        context: serde_json::from_str(&item.context).unwrap_or(serde_json::Value::Null),
        id: item.id,
        external_id: item.external_id,
        kind: item.kind,
        author: item.author,
        text: item.body,
        status: item.status,
        version: item.version,
        decided_by: item.decided_by,
        needs_eval_since: item.needs_eval_since,
        created_at: item.created_at,
        updated_at: item.updated_at,
        counters: counters.into_iter().collect(),
        decisions,
        transitions,
        provider_requests,
        provider_callbacks,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idempotency_keys_are_validated() {
        let with = |v: &[u8]| {
            let mut h = HeaderMap::new();
            h.insert("idempotency-key", HeaderValue::from_bytes(v).unwrap());
            idempotency_key(&h)
        };
        assert_eq!(with(b"abc-123").unwrap().as_deref(), Some("abc-123"));
        assert!(with(b"").is_err());
        assert!(with(&[b'a'; 256]).is_err());
        assert!(with(&[b'a'; 255]).is_ok());
        assert!(with(b"tab\there").is_err());
        assert!(with("é".as_bytes()).is_err());
        assert_eq!(idempotency_key(&HeaderMap::new()).unwrap(), None);
    }
}
