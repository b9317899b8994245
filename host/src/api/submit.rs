//! `POST /v1/items` and `POST /v1/items/batch`: the submission path. The
//! handler validates, claims the idempotency key, applies the rate limits
//! and runs the sync-phase rules; the store decides the status inside the
//! write's transaction (duplicate text, degraded mode, sync verdict) and
//! completes the key there, group-committed with concurrent submissions.

use super::AppState;
use super::auth::Caller;
use super::error::{ApiError, ErrorBody, Json};
use super::idempotency::{ClaimedKey, claim_key, idempotency_key, request_hash};
use super::validate;
use crate::clock::now_ms;
use crate::domain::policy::Cause;
use crate::domain::{ItemStatus, Phase};
use crate::fingerprint::fingerprint;
use crate::judge::{judge, snapshot_of};
use crate::store::{CreateOutcome, DuplicateRule, Item, ItemWrite, NewItem, SnapshotData, StoreResult};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use tracing::Instrument;
use utoipa::ToSchema;

/// A submission.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SubmitRequest {
    /// The platform's own id; unique per client when given.
    #[serde(default)]
    #[schema(min_length = 1, max_length = 256)]
    pub external_id: Option<String>,
    /// `post`, `comment`, `profile`, ...
    #[schema(min_length = 1, max_length = 64)]
    pub kind: String,
    /// The author's id on the platform.
    #[schema(min_length = 1, max_length = 256)]
    pub author: String,
    /// The content: any text without NUL, at most `ingest.max_text_chars`
    /// characters (65,536 by default; the served document says this
    /// deployment's limit).
    #[schema(max_length = 65536)]
    pub text: String,
    /// Free-form facts passed to rules as string pairs.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub context: Option<BTreeMap<String, serde_json::Value>>,
}

/// An accepted submission.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct SubmitResponse {
    pub id: String,
    /// `pending_scan`, or already `held_for_review` / `rejected` when a
    /// sync-phase rule, the duplicate check or the author's standing decided.
    pub status: ItemStatus,
    pub version: i64,
}

/// The stored (and first) response body of an accepted submission.
fn submit_body(item: &Item) -> String {
    serde_json::to_string(&SubmitResponse {
        id: item.id.clone(),
        status: item.status,
        version: item.version,
    })
    .expect("the response serializes")
}

/// Refuses a submission that could not be stored as it is.
pub(super) fn validate_submission(req: &SubmitRequest, max_text_chars: usize) -> Result<(), ApiError> {
    if let Some(ext) = &req.external_id {
        validate::identifier("external_id", ext, 256)?;
    }
    validate::identifier("kind", &req.kind, 64)?;
    if req.kind == crate::store::AUTHOR_KIND {
        // Well formed, but the outbox's events of this kind are accounts'.
        return Err(ApiError::new(
            axum::http::StatusCode::UNPROCESSABLE_ENTITY,
            "reserved_kind",
            "`kind` \"author\" is reserved for account transitions in the outbox; name the content kind",
        ));
    }
    validate::identifier("author", &req.author, 256)?;
    validate::text("text", &req.text, max_text_chars)?;
    if let Some(context) = &req.context {
        for (k, v) in context {
            validate::text("context", k, 256)?;
            validate::json(&format!("context.{k}"), v)?;
        }
    }
    Ok(())
}

/// A submission ready to store, and the key it holds.
pub(super) struct Prepared {
    pub write: ItemWrite,
    pub key: Option<ClaimedKey>,
    /// Whether a sync decision weighs against the author (then the stored
    /// item queues a recomputation of their standing).
    pub weighs: bool,
}

/// A submission admitted (valid, within its limits, its key claimed),
/// before its sync rules.
pub(super) struct Admitted {
    item: NewItem,
    key: Option<ClaimedKey>,
}

/// Everything before the write: validation, the key claim, the rate limits,
/// the sync rules. `Err` is the answer to send instead (a replay, a
/// conflict, a refusal).
pub(super) async fn prepare(
    state: &AppState,
    caller: &Caller,
    req: SubmitRequest,
    key: Option<String>,
    correlation_id: String,
) -> Result<Prepared, Response> {
    let admitted = admit(state, caller, req, key, correlation_id).await?;
    let sync = sync_rules(state, vec![admitted.item.clone()])
        .await
        .pop()
        .unwrap_or_default();
    Ok(prepared(state, admitted, sync))
}

/// Validation, the client rate limit, the key claim, the author rate
/// limit; the new item. `Err` is the answer to send instead.
pub(super) async fn admit(
    state: &AppState,
    caller: &Caller,
    req: SubmitRequest,
    key: Option<String>,
    correlation_id: String,
) -> Result<Admitted, Response> {
    let ingest = &state.config.ingest;
    validate_submission(&req, ingest.max_text_chars).map_err(IntoResponse::into_response)?;
    super::rate_limited(&state.client_limiter, &caller.name).map_err(IntoResponse::into_response)?;
    let key = match key {
        Some(key) => Some(claim_key(state, "items", &caller.name, &key, request_hash("POST /v1/items", &req)).await?),
        None => None,
    };
    // After the key claim: retries of one submission are not an author posting more.
    if let Err(e) = state.author_limiter.check(&caller.name, &req.author) {
        if let Some(k) = &key {
            k.release(state).await;
        }
        return Err(e.into_response());
    }
    let now = now_ms();
    let item = NewItem {
        id: uuid::Uuid::now_v7().to_string(),
        client: caller.name.clone(),
        external_id: req.external_id.clone(),
        kind: req.kind.clone(),
        author: req.author.clone(),
        fingerprint: fingerprint(&req.text),
        body: req.text,
        context: serde_json::to_string(&req.context.unwrap_or_default()).expect("a JSON map serializes"),
        correlation_id,
        now,
    };
    Ok(Admitted { item, key })
}

/// What the sync-phase rules said of one submission.
#[derive(Default)]
pub(super) struct SyncOutcome {
    verdict: Option<crate::domain::Verdict>,
    reason: String,
    decisions: Vec<crate::store::NewDecision>,
}

/// An admitted submission with its sync rules' outcome, ready to store.
fn prepared(state: &AppState, admitted: Admitted, sync: SyncOutcome) -> Prepared {
    let Admitted { item, key } = admitted;
    let weighs = sync.decisions.iter().any(|d| d.weighs);
    let ingest = &state.config.ingest;
    let degraded = state.metrics.queue_lag_seconds.get() * 1000.0 > state.config.evaluation.degraded_lag_ms as f64;
    let write = ItemWrite {
        item,
        sync_verdict: sync.verdict,
        sync_reason: sync.reason,
        decisions: sync.decisions,
        degraded,
        duplicates: DuplicateRule {
            window_ms: ingest.duplicate_window_ms,
            hold_at: ingest.duplicate_hold_at,
        },
        standing: state.standing.clone(),
        key: key.as_ref().map(|k| k.completion(StatusCode::ACCEPTED)),
        respond: submit_body,
    };
    Prepared { write, key, weighs }
}

/// The sync-phase rules of these submissions (one answer each, in order),
/// inline under their tight deadline, the submissions side by side on the
/// evaluation threads as one job. When the host is too busy to start them
/// in time, the items are stored without them: the asynchronous rules
/// judge them (a host failure never becomes a verdict).
async fn sync_rules(state: &AppState, items: Vec<NewItem>) -> Vec<SyncOutcome> {
    use rayon::prelude::*;
    let registry = state.registry.clone();
    if !registry.plugins().iter().any(|p| p.runs_in(Phase::Sync)) {
        return items.iter().map(|_| SyncOutcome::default()).collect();
    }
    let n = items.len();
    let standing = state.config.standing.initial().to_string();
    let metrics = state.metrics.clone();
    let (fail_closed, keep) = (
        state.config.evaluation.fail_closed,
        state.config.evaluation.store_snapshots,
    );
    let start_by = std::time::Instant::now() + registry.engine().limits().sync_deadline;
    // The sync phase reads the signals as they stand before this item;
    // unreadable (Redis down), the item is stored without its sync rules,
    // as when the host is too busy to start them.
    let signals = futures::future::join_all(items.iter().map(|i| {
        state
            .signals
            .values_for(Phase::Sync, &i.client, &i.author, &i.body, &i.context, i.now)
    }))
    .await;
    let signals: Vec<_> = match signals.into_iter().collect::<Result<Vec<_>, _>>() {
        Ok(s) => s,
        Err(e) => {
            sync_skipped(state, "signals unreadable", &e);
            return items.iter().map(|_| SyncOutcome::default()).collect();
        }
    };
    let judged = state
        .pool
        .run_before(Some(start_by), move || {
            items
                .into_par_iter()
                .zip(signals)
                .map(|(item, signals)| {
                    let max = registry.engine().limits().max_snapshot_bytes;
                    let now = item.now;
                    let mut snapshot = snapshot_of(&sync_data(item, &standing), Phase::Sync, now, max);
                    judge(
                        &registry,
                        &mut snapshot,
                        &signals,
                        Phase::Sync,
                        fail_closed,
                        keep,
                        &metrics,
                    )
                })
                .collect::<Vec<_>>()
        })
        .await;
    let judged = match judged {
        Ok(judged) => judged,
        Err(e) => (0..n).map(|_| Err(e.clone())).collect(),
    };
    judged
        .into_iter()
        .map(|j| match j {
            Ok(j) => SyncOutcome {
                verdict: j.verdict,
                reason: j.reason(),
                decisions: j.decisions(Phase::Sync, true, &state.standing),
            },
            Err(e) => {
                sync_skipped(state, "the host is overloaded", &e);
                SyncOutcome::default()
            }
        })
        .collect()
}

/// Sync rules that could not run (`why`): counted as a host error and
/// logged; the item is stored without them and the async rules judge it
/// (a host failure never becomes a verdict).
fn sync_skipped(state: &AppState, why: &str, error: &dyn std::fmt::Display) {
    state
        .metrics
        .host_errors
        .get_or_create(&crate::metrics::KindLabel { kind: "sync_phase" })
        .inc();
    tracing::warn!(%error, "sync rules skipped: {why}; the async rules judge the item");
}

/// What a submission's sync-phase snapshot is built from: the item as it
/// is about to be stored; the sync phase reads no history (the first tier,
/// nothing counted).
fn sync_data(item: NewItem, standing: &str) -> SnapshotData {
    SnapshotData {
        item: Item {
            id: item.id,
            client: item.client,
            external_id: item.external_id,
            kind: item.kind,
            author: item.author,
            body: item.body,
            context: item.context,
            fingerprint: item.fingerprint,
            status: ItemStatus::Received,
            version: 1,
            decided_by: None,
            sync_verdict: None,
            needs_eval_since: None,
            event_seq: 0,
            evaluated_seq: 0,
            eval_round: 0,
            content_version: 1,
            created_at: item.now,
            updated_at: item.now,
        },
        counters: Vec::new(),
        author_recent_items: 0,
        author_rejected_items: 0,
        author_held_items: 0,
        standing: crate::store::StandingData {
            state: standing.to_string(),
            ..Default::default()
        },
        duplicate_count: 0,
        trigger: Vec::new(),
        provider_answers: Vec::new(),
        waiting_on: None,
        signals: Default::default(),
    }
}

/// Everything after the write: the answer, the schedule, the metrics.
pub(super) async fn finish(
    state: &AppState,
    req_external_id: Option<&str>,
    key: Option<ClaimedKey>,
    weighs: bool,
    outcome: StoreResult<CreateOutcome>,
) -> Result<Response, ApiError> {
    let item = settle(state, req_external_id, key, weighs, outcome).await?;
    let mut response = super::json_response(StatusCode::ACCEPTED, submit_body(&item));
    // For the submission-outcome metric.
    response.extensions_mut().insert(item.status);
    Ok(response)
}

/// After the write: the item stored (queued for its evaluation), or the
/// error its request gets (a failed write releases its key).
async fn settle(
    state: &AppState,
    req_external_id: Option<&str>,
    key: Option<ClaimedKey>,
    weighs: bool,
    outcome: StoreResult<CreateOutcome>,
) -> Result<Item, ApiError> {
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
        CreateOutcome::Created { item, cause } => {
            // Counted once: only the request that created the item gets here.
            state.signals.record(&item).await;
            if item.needs_eval_since.is_some() {
                state.scheduler.schedule(&item.id, "submit").await;
            }
            // A sync decision that weighs against the author (the store
            // marked the author in the same transaction).
            if weighs {
                state.scheduler.schedule_author(&item.client, &item.author).await;
            }
            if cause == Cause::DuplicateText {
                state.metrics.fingerprint_duplicates.inc();
            }
            tracing::info!(item = %item.id, status = %item.status, %cause, "item accepted");
            Ok(item)
        }
        CreateOutcome::DuplicateExternalId { existing_id } => Err(ApiError::conflict(
            "duplicate_external_id",
            format!(
                "this client already submitted external_id {:?} as item {existing_id}",
                req_external_id.unwrap_or("")
            ),
        )),
        CreateOutcome::KeyLost => Err(ApiError::conflict(
            "idempotency_key_taken_over",
            "this request held its Idempotency-Key past the lock time and a retry took it over; the retry's result stands",
        )),
    }
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
    let key = idempotency_key(&headers)?;
    let correlation_id = super::request_id(&headers);
    let span = tracing::info_span!(
        "item.submit",
        client = %caller.name,
        idempotency_key = key.as_deref().unwrap_or(""),
        request_id = %correlation_id
    );
    let result = async {
        let external_id = req.external_id.clone();
        let prepared = match prepare(&state, &caller, req, key, correlation_id).await {
            Ok(p) => p,
            Err(answer) => return Ok(answer),
        };
        let outcome = state.writes.create_item(prepared.write).await;
        finish(&state, external_id.as_deref(), prepared.key, prepared.weighs, outcome).await
    }
    .instrument(span)
    .await;
    state.metrics.submission(submission_outcome(&result));
    result
}

/// Up to this many submissions in one batch request.
pub const MAX_BATCH_ITEMS: usize = 1000;

/// A batch of submissions.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SubmitBatch {
    #[schema(min_items = 1, max_items = 1000)]
    pub items: Vec<BatchSubmission>,
}

/// One submission of a batch: the fields of a single submission and its
/// own optional idempotency key. Each entry's values are checked as a single
/// submission's are, and a bad one gets its own 400 in `results` instead of
/// failing the batch, so the schema states types only.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchSubmission {
    /// Like the `Idempotency-Key` header of a single submission.
    #[serde(default)]
    pub idempotency_key: Option<String>,
    #[serde(default)]
    pub external_id: Option<String>,
    pub kind: String,
    pub author: String,
    pub text: String,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub context: Option<BTreeMap<String, serde_json::Value>>,
}

impl BatchSubmission {
    fn split(self) -> (Option<String>, SubmitRequest) {
        let Self {
            idempotency_key,
            external_id,
            kind,
            author,
            text,
            context,
        } = self;
        (
            idempotency_key,
            SubmitRequest {
                external_id,
                kind,
                author,
                text,
                context,
            },
        )
    }
}

/// The answer to one entry of a batch: what the single request would have got.
#[derive(Debug, Serialize, ToSchema)]
pub struct BatchResult {
    /// 202, or the 4xx/503 of a refused entry.
    pub status: u16,
    /// The single request's body: a [`SubmitResponse`] or an error.
    #[schema(value_type = Object)]
    pub body: serde_json::Value,
}

/// The answers to a batch, in the order of its entries.
#[derive(Debug, Serialize, ToSchema)]
pub struct BatchResults {
    pub results: Vec<BatchResult>,
}

/// Turns an answer into a batch entry's result.
pub(super) async fn batch_result(response: Response) -> BatchResult {
    let status = response.status().as_u16();
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap_or_default();
    BatchResult {
        status,
        body: serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null),
    }
}

/// Submit up to 1,000 items at once. Each entry is judged and stored as a
/// single submission would be, with its own idempotency key and its own
/// answer (202, 409, 422, 429, ...): one refused entry never fails the
/// others. The entries share store transactions (group commit).
#[utoipa::path(
    post, path = "/v1/items/batch", tag = "items",
    request_body = SubmitBatch,
    responses(
        (status = 200, body = BatchResults, description = "One result per entry, in order"),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 413, body = ErrorBody),
        (status = 415, body = ErrorBody), (status = 422, body = ErrorBody), (status = 503, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn submit_batch(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Json(batch): Json<SubmitBatch>,
) -> Result<Json<BatchResults>, ApiError> {
    if batch.items.is_empty() || batch.items.len() > MAX_BATCH_ITEMS {
        return Err(ApiError::bad_request(
            "invalid_body",
            format!("`items` must hold 1-{MAX_BATCH_ITEMS} submissions"),
        ));
    }
    let correlation_id = super::request_id(&headers);
    let span = tracing::info_span!("item.submit_batch", client = %caller.name, items = batch.items.len(), request_id = %correlation_id);
    async {
        // Every entry admitted (their keys claimed concurrently), then the
        // sync rules of all of them as one job on the evaluation threads.
        let admissions = batch.items.into_iter().enumerate().map(|(i, entry)| {
            let (state, caller, correlation_id) = (&state, &caller, &correlation_id);
            async move {
                let (key, item) = entry.split();
                let key = key
                    .as_deref()
                    .map(super::idempotency::validate_key)
                    .transpose()
                    .map_err(IntoResponse::into_response)?;
                let external_id = item.external_id.clone();
                admit(state, caller, item, key, format!("{correlation_id}#{i}"))
                    .await
                    .map(|a| (external_id, a))
            }
        });
        let admitted = futures::future::join_all(admissions).await;
        let mut answers: Vec<Option<Response>> = Vec::with_capacity(admitted.len());
        let mut accepted = Vec::with_capacity(admitted.len());
        for (i, a) in admitted.into_iter().enumerate() {
            match a {
                Ok(a) => {
                    accepted.push((i, a));
                    answers.push(None);
                }
                Err(answer) => answers.push(Some(answer)),
            }
        }
        let outcomes = sync_rules(&state, accepted.iter().map(|(_, (_, a))| a.item.clone()).collect()).await;
        let prepared: Vec<(usize, Option<String>, Prepared)> = accepted
            .into_iter()
            .zip(outcomes)
            .map(|((i, (external_id, a)), sync)| (i, external_id, prepared(&state, a, sync)))
            .collect();
        let (meta, writes): (Vec<_>, Vec<_>) = prepared
            .into_iter()
            .map(|(i, ext, p)| ((i, ext, p.key, p.weighs), p.write))
            .unzip();
        let outcomes = state.writes.create_items(writes).await;
        let mut results: Vec<Option<BatchResult>> = Vec::with_capacity(answers.len());
        for answer in answers {
            // A refusal before the write (validation, limits, a key replay).
            results.push(match answer {
                Some(answer) => Some(batch_result(answer).await),
                None => None,
            });
        }
        for ((i, ext, key, weighs), outcome) in meta.into_iter().zip(outcomes) {
            results[i] = Some(match settle(&state, ext.as_deref(), key, weighs, outcome).await {
                Ok(item) => {
                    state.metrics.submission(match item.status {
                        ItemStatus::Rejected => "rejected_sync",
                        ItemStatus::HeldForReview => "held_sync",
                        _ => "accepted",
                    });
                    BatchResult {
                        status: StatusCode::ACCEPTED.as_u16(),
                        body: serde_json::to_value(SubmitResponse {
                            id: item.id,
                            status: item.status,
                            version: item.version,
                        })
                        .expect("a submission response serializes"),
                    }
                }
                Err(e) => {
                    state.metrics.submission(submission_outcome(&Err(e.clone())));
                    e.into_batch_result()
                }
            });
        }
        let results = results.into_iter().map(|r| r.expect("every entry answered")).collect();
        Ok(Json(BatchResults { results }))
    }
    .instrument(span)
    .await
}

/// The `outcome` label of a submission's answer.
pub(super) fn submission_outcome(result: &Result<Response, ApiError>) -> &'static str {
    match result {
        Ok(r) if r.headers().contains_key("idempotent-replayed") => "replayed",
        Ok(r) => match r.extensions().get::<ItemStatus>() {
            Some(ItemStatus::Rejected) => "rejected_sync",
            Some(ItemStatus::HeldForReview) => "held_sync",
            _ if r.status() == StatusCode::CONFLICT => "conflict",
            _ if r.status() == StatusCode::UNPROCESSABLE_ENTITY => "key_mismatch",
            _ if r.status() == StatusCode::TOO_MANY_REQUESTS => "rate_limited",
            _ if r.status().is_client_error() => "invalid",
            _ => "accepted",
        },
        Err(e) if e.code == "idempotency_key_taken_over" => "key_lost",
        Err(e) if e.status == StatusCode::TOO_MANY_REQUESTS => "rate_limited",
        Err(e) if e.status == StatusCode::CONFLICT => "conflict",
        Err(e) if e.status == StatusCode::SERVICE_UNAVAILABLE => "unavailable",
        Err(_) => "invalid",
    }
}
