//! Moderator routes: `POST /v1/items/{id}/moderation`, `GET /v1/review-queue`.

use super::AppState;
use super::auth::Moderator;
use super::error::{ApiError, ErrorBody, Json, Path, Query};
use super::items::{ItemView, item_view};
use super::validate;
use crate::domain::ItemStatus;
use crate::store::{ManualActor, Moderation, ModerationOutcome, StoreError, moderate as store_moderate};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

/// A moderator's decision.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ModerationRequest {
    /// `visible`, `held_for_review`, `rejected` or `deleted`.
    pub status: ItemStatus,
    /// Why; kept in the audit trail.
    #[schema(max_length = 1024)]
    pub reason: String,
    /// A display note kept beside the decision (e.g. the person at the
    /// keyboard of a shared tool). The identity in the audit trail is always
    /// the token's name.
    #[serde(default)]
    #[schema(min_length = 1, max_length = 256)]
    pub moderator: Option<String>,
    /// The id of the `[[policies]]` entry the decision is taken under; its
    /// statement of reasons names it. Without one, a restriction is stated
    /// under the policy the rules' labels map to, or the default.
    #[serde(default)]
    #[schema(min_length = 1, max_length = 64)]
    pub policy: Option<String>,
    /// For `held_for_review` or `rejected`: when the restriction ends (ms
    /// since the epoch, in the future, before 2038-01-01). gavel makes the
    /// item visible then (an audited transition, cause `restriction_ended`)
    /// unless a later decision replaced this one; the statement of reasons
    /// gives the end date.
    #[serde(default)]
    #[schema(minimum = 1)]
    pub until: Option<i64>,
}

/// `until` checked for a decision setting `status`.
pub(super) fn valid_until(until: Option<i64>, restricts: bool) -> Result<(), ApiError> {
    let Some(at) = until else {
        return Ok(());
    };
    let refuse = |why: &str| ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_until", why.to_string());
    if !restricts {
        return Err(refuse(
            "until applies to a restriction (held_for_review or rejected, for an account a state)",
        ));
    }
    if at <= crate::clock::now_ms() || at >= crate::domain::statements::LATEST_END_MS {
        return Err(refuse(
            "until must be in the future and before 2038-01-01 (ms since the epoch)",
        ));
    }
    Ok(())
}

/// `policy` checked against the configured policies.
pub(super) fn known_policy(state: &AppState, policy: Option<&str>) -> Result<(), ApiError> {
    let Some(id) = policy else {
        return Ok(());
    };
    if state.policies.get(id).is_none() {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "unknown_policy",
            format!("no [[policies]] entry has id {id:?}"),
        ));
    }
    Ok(())
}

/// The statuses `POST /v1/items/{id}/moderation` sets: a moderator's
/// decisions, and deletion.
pub fn may_set(status: ItemStatus) -> bool {
    status.is_moderator_target() || status == ItemStatus::Deleted
}

/// Decide an item by hand. A manual decision is final for automation:
/// later automated transitions are refused by the store. `If-Match: VERSION`
/// makes the change conditional on the version the moderator saw.
#[utoipa::path(
    post, path = "/v1/items/{id}/moderation", tag = "moderator",
    request_body = ModerationRequest,
    params(("id" = String, Path), ("If-Match" = Option<String>, Header, description = "the item version the decision is based on, bare or quoted", pattern = r#"^([0-9]{1,18}|"[0-9]{1,18}")$"#)),
    responses(
        (status = 200, body = ItemView), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
        (status = 422, body = ErrorBody), (status = 503, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn moderate(
    State(state): State<AppState>,
    Moderator(caller): Moderator,
    Path(id): Path<String>,
    headers: HeaderMap,
    Json(req): Json<ModerationRequest>,
) -> Result<Json<ItemView>, ApiError> {
    if !may_set(req.status) {
        return Err(ApiError::bad_request(
            "illegal_transition",
            format!("a moderator cannot set status {}", req.status),
        ));
    }
    validate::path_id("id", &id)?;
    validate::text("reason", &req.reason, 1024)?;
    if let Some(note) = &req.moderator {
        validate::identifier("moderator", note, 256)?;
    }
    known_policy(&state, req.policy.as_deref())?;
    valid_until(
        req.until,
        matches!(req.status, ItemStatus::HeldForReview | ItemStatus::Rejected),
    )?;
    let if_match = if_match(&headers, "item")?;
    let correlation_id = super::request_id(&headers);
    let outcome = decide(
        &state,
        &Moderation {
            id: &id,
            to: req.status,
            if_match,
            by: ManualActor::Moderator,
            name: &caller.name,
            note: req.moderator.as_deref().filter(|n| *n != caller.name),
            reason: &req.reason,
            correlation_id: &correlation_id,
            policy: req.policy.as_deref(),
            until: req.until,
            appeal: None,
        },
    )
    .await?;
    match outcome {
        ModerationOutcome::Applied { .. } => {
            let d = state
                .store
                .item_details(&id)
                .await?
                .ok_or_else(|| ApiError::not_found("item"))?;
            Ok(Json(item_view(d)))
        }
        ModerationOutcome::NotFound => Err(ApiError::not_found("item")),
        ModerationOutcome::VersionMismatch { current } => Err(ApiError::new(
            StatusCode::CONFLICT,
            "version_mismatch",
            format!("the item is at version {current}, not the version in If-Match"),
        )),
        // The request is well formed; the item's current status refuses it.
        ModerationOutcome::Illegal { from } => Err(ApiError::new(
            StatusCode::CONFLICT,
            "illegal_transition",
            format!("an item in status {from} cannot become {}", req.status),
        )),
        // Only a decision closing an appeal is answered this.
        ModerationOutcome::AppealStale => Err(ApiError::conflict("conflict", "the item changed; try again")),
    }
}

/// The version an `If-Match` header names (bare or quoted), if any.
pub(super) fn if_match(headers: &HeaderMap, what: &str) -> Result<Option<i64>, ApiError> {
    let Some(v) = headers.get(axum::http::header::IF_MATCH) else {
        return Ok(None);
    };
    v.to_str()
        .ok()
        .and_then(|v| crate::domain::parse_decimal(v.strip_prefix('"').and_then(|v| v.strip_suffix('"')).unwrap_or(v)))
        .map(Some)
        .ok_or_else(|| ApiError::bad_request("invalid_if_match", format!("If-Match must be an {what} version number")))
}

/// A decision by hand through the store, counting the overturns it makes
/// in `/metrics`: the API and the console both decide through here. An
/// overturn, or a confirmation of what an earlier decision overturned,
/// changes the author's strikes: the store marked the author in the same
/// transaction, and the author is queued for recomputation.
pub async fn decide(state: &AppState, m: &Moderation<'_>) -> Result<ModerationOutcome, StoreError> {
    let outcome = store_moderate(state.store.as_ref(), m).await?;
    if let ModerationOutcome::Applied { reversals } = &outcome {
        for ((plugin, version), n) in &reversals.overturned {
            state
                .metrics
                .reversals
                .get_or_create(&crate::metrics::Metrics::plugin(plugin, version))
                .inc_by(*n);
        }
        if !reversals.is_empty()
            && state.standing.enabled
            && let Ok(Some(item)) = state.store.item(m.id).await
        {
            state.scheduler.schedule_author(&item.client, &item.author).await;
        }
    }
    Ok(outcome)
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct ReviewQueueQuery {
    /// Items per page, 1-500 (default 50).
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<i64>,
    /// `next_cursor` of the previous page.
    #[param(pattern = r"^[0-9]{1,18}_[^\u0000-\u001f\u007f-\u009f]{1,256}$")]
    pub cursor: Option<String>,
}

/// A page of the review queue.
#[derive(Debug, Serialize, ToSchema)]
pub struct ReviewQueuePage {
    pub items: Vec<ReviewItem>,
    /// Pass as `cursor` for the next page; absent on the last page.
    pub next_cursor: Option<String>,
}

/// An item waiting for a human.
#[derive(Debug, Serialize, ToSchema)]
pub struct ReviewItem {
    pub id: String,
    pub kind: String,
    pub author: String,
    pub text: String,
    pub version: i64,
    /// When it was held (ms since the epoch).
    pub held_since: i64,
}

/// A page of a queue read by `(time, id)` keyset: `limit` (1-500, default
/// 50) and the cursor a previous page handed out.
pub(super) fn keyset_page(
    limit: Option<i64>,
    cursor: Option<&str>,
) -> Result<(i64, Option<crate::store::ReviewCursor>), ApiError> {
    let limit = limit.unwrap_or(50);
    if !(1..=500).contains(&limit) {
        return Err(ApiError::bad_request("invalid_query", "limit must be 1-500"));
    }
    let cursor = cursor
        .map(|c| {
            crate::store::parse_review_cursor(c)
                .ok_or_else(|| ApiError::bad_request("invalid_cursor", "cursor is not one gavel issued"))
        })
        .transpose()?;
    Ok((limit, cursor))
}

/// The cursor of the page after `rows` (a full page of `limit`), keyed by
/// `key` of its last row; `None` on the last page.
pub(super) fn next_keyset<T>(rows: &[T], limit: i64, key: impl Fn(&T) -> (i64, String)) -> Option<String> {
    (rows.len() as i64 == limit)
        .then(|| rows.last().map(|r| crate::store::encode_review_cursor(&key(r))))
        .flatten()
}

/// Items held for review, oldest first.
#[utoipa::path(
    get, path = "/v1/review-queue", tag = "moderator",
    params(ReviewQueueQuery),
    responses((status = 200, body = ReviewQueuePage), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)),
    security(("bearer" = []))
)]
pub async fn review_queue(
    State(state): State<AppState>,
    Moderator(_moderator): Moderator,
    Query(q): Query<ReviewQueueQuery>,
) -> Result<Json<ReviewQueuePage>, ApiError> {
    let (limit, cursor) = keyset_page(q.limit, q.cursor.as_deref())?;
    let items = state.store.review_queue(cursor.as_ref(), limit).await?;
    let next_cursor = next_keyset(&items, limit, |i| (i.updated_at, i.id.clone()));
    Ok(Json(ReviewQueuePage {
        items: items
            .into_iter()
            .map(|i| ReviewItem {
                id: i.id,
                kind: i.kind,
                author: i.author,
                text: i.body,
                version: i.version,
                held_since: i.updated_at,
            })
            .collect(),
        next_cursor,
    }))
}

/// Judge an item again now, without waiting for the debounce window
/// (the priority path; the lease and the version fence still apply).
#[utoipa::path(
    post, path = "/v1/items/{id}/evaluate", tag = "moderator",
    params(("id" = String, Path)),
    responses((status = 202, description = "queued"), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = []))
)]
pub async fn evaluate_now(
    State(state): State<AppState>,
    Moderator(_moderator): Moderator,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    validate::path_id("id", &id)?;
    if !state.store.request_evaluation(&id, crate::clock::now_ms()).await? {
        return Err(ApiError::not_found("item"));
    }
    state.scheduler.schedule_now(&id).await;
    Ok(StatusCode::ACCEPTED)
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct DeadLettersQuery {
    /// Include replayed dead letters.
    #[serde(default)]
    pub all: bool,
}

/// Evaluations that failed in the host past their retry budget, newest first.
#[utoipa::path(
    get, path = "/v1/dead-letters", tag = "moderator",
    params(DeadLettersQuery),
    responses((status = 200, body = Vec<crate::store::DeadLetter>), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)),
    security(("bearer" = []))
)]
pub async fn dead_letters(
    State(state): State<AppState>,
    Moderator(_moderator): Moderator,
    Query(q): Query<DeadLettersQuery>,
) -> Result<Json<Vec<crate::store::DeadLetter>>, ApiError> {
    Ok(Json(state.store.dead_letters(q.all, 500).await?))
}

/// Replay a dead letter: its item is evaluated again now.
#[utoipa::path(
    post, path = "/v1/dead-letters/{id}/replay", tag = "moderator",
    params(("id" = i64, Path)),
    responses((status = 202, description = "queued"), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = []))
)]
pub async fn replay_dead_letter(
    State(state): State<AppState>,
    Moderator(_moderator): Moderator,
    Path(id): Path<i64>,
) -> Result<StatusCode, ApiError> {
    let Some(item) = state.store.replay_dead_letter(id, crate::clock::now_ms()).await? else {
        return Err(ApiError::not_found("open dead letter"));
    };
    state.scheduler.schedule_now(&item).await;
    Ok(StatusCode::ACCEPTED)
}
