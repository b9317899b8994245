//! How a platform learns outcomes: `GET /v1/changes` (pull), the webhook
//! deliveries' dead letters (`GET /v1/deliveries`, replay), and the
//! endpoints a `410 Gone` disabled (`GET /v1/webhooks`, enable).

use super::AppState;
use super::auth::{Caller, Moderator};
use super::error::{ApiError, ErrorBody, Json, Path, Query};
use crate::config::Role;
use crate::store::{Change, ChangeCursor, DeliveryRecord, EndpointState};
use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct ChangesQuery {
    /// `next_cursor` of the previous page; omit (or send empty) to start at
    /// the beginning.
    #[param(pattern = r"^([0-9]{1,18}\.[0-9]{1,18})?$")]
    pub after: Option<String>,
    /// 1-1000, default 100.
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<i64>,
}

/// A page of the changes feed.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ChangesPage {
    pub changes: Vec<Change>,
    /// Pass as `after` for the next page. Always present: when `changes`
    /// is empty it is the cursor you sent, to poll again later.
    pub next_cursor: String,
}

/// Transitions in commit order, with no gaps: a consumer that was down
/// resumes from its last cursor. Client tokens see their own items only.
/// The same events (same `event_id`) are delivered by webhooks.
#[utoipa::path(
    get, path = "/v1/changes", tag = "items",
    params(ChangesQuery),
    responses((status = 200, body = ChangesPage), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody)),
    security(("bearer" = []))
)]
pub async fn changes(
    State(state): State<AppState>,
    caller: Caller,
    Query(q): Query<ChangesQuery>,
) -> Result<Json<ChangesPage>, ApiError> {
    let limit = q.limit.unwrap_or(100);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::bad_request("invalid_query", "limit must be 1-1000"));
    }
    let after = match q.after.as_deref() {
        None | Some("") => ChangeCursor::default(),
        Some(c) => ChangeCursor::parse(c)
            .ok_or_else(|| ApiError::bad_request("invalid_cursor", "cursor is not one gavel issued"))?,
    };
    let client = (caller.role != Role::Moderator).then_some(caller.name.as_str());
    let changes = state.store.changes(client, after, limit).await?;
    let next_cursor = changes.last().map_or_else(|| after.encode(), |c| c.cursor.clone());
    Ok(Json(ChangesPage { changes, next_cursor }))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct DeliveriesQuery {
    /// Include pending and delivered ones (default: dead only).
    #[serde(default)]
    pub all: bool,
}

/// Webhook deliveries, newest first: by default the dead ones (attempts
/// exhausted), which `POST /v1/deliveries/{id}/replay` sends again.
#[utoipa::path(
    get, path = "/v1/deliveries", tag = "moderator",
    params(DeliveriesQuery),
    responses((status = 200, body = Vec<DeliveryRecord>), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)),
    security(("bearer" = []))
)]
pub async fn deliveries(
    State(state): State<AppState>,
    Moderator(_moderator): Moderator,
    Query(q): Query<DeliveriesQuery>,
) -> Result<Json<Vec<DeliveryRecord>>, ApiError> {
    Ok(Json(state.store.deliveries(q.all, 500).await?))
}

/// Send a dead delivery again (attempts start over).
#[utoipa::path(
    post, path = "/v1/deliveries/{id}/replay", tag = "moderator",
    params(("id" = i64, Path)),
    responses((status = 202, description = "queued"), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = []))
)]
pub async fn replay_delivery(
    State(state): State<AppState>,
    Moderator(_moderator): Moderator,
    Path(id): Path<i64>,
) -> Result<StatusCode, ApiError> {
    if !state.store.replay_delivery(id, crate::clock::now_ms()).await? {
        return Err(ApiError::not_found("dead delivery"));
    }
    Ok(StatusCode::ACCEPTED)
}

/// Every webhook endpoint: enabled, or disabled since its receiver answered
/// `410 Gone` (its deliveries wait, counted in `pending`).
#[utoipa::path(
    get, path = "/v1/webhooks", tag = "moderator",
    responses((status = 200, body = Vec<EndpointState>), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)),
    security(("bearer" = []))
)]
pub async fn webhook_endpoints(
    State(state): State<AppState>,
    Moderator(_moderator): Moderator,
) -> Result<Json<Vec<EndpointState>>, ApiError> {
    Ok(Json(state.store.webhook_endpoints().await?))
}

/// Enable an endpoint a `410 Gone` disabled: its waiting deliveries are sent
/// (oldest first per item, as ever). 404 if it is not disabled.
#[utoipa::path(
    post, path = "/v1/webhooks/{endpoint}/enable", tag = "moderator",
    params(("endpoint" = String, Path)),
    responses((status = 200, body = EndpointState), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = []))
)]
pub async fn enable_endpoint(
    State(state): State<AppState>,
    Moderator(moderator): Moderator,
    Path(endpoint): Path<String>,
) -> Result<Json<EndpointState>, ApiError> {
    super::validate::path_id("endpoint", &endpoint)?;
    let actor = format!("moderator:{}", moderator.name);
    if !state
        .store
        .enable_endpoint(&endpoint, &actor, crate::clock::now_ms())
        .await?
    {
        return Err(ApiError::not_found("disabled webhook endpoint"));
    }
    tracing::info!(%endpoint, %actor, "webhook endpoint enabled again");
    let endpoints = state.store.webhook_endpoints().await?;
    let enabled = endpoints
        .into_iter()
        .find(|e| e.endpoint == endpoint)
        .ok_or_else(|| ApiError::not_found("webhook endpoint"))?;
    Ok(Json(enabled))
}
