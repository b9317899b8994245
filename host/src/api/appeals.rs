//! Statements of reasons and appeals (docs/ARCHITECTURE.md, "Statements of
//! reasons and appeals"): `GET /v1/items/{id}/statements`,
//! `POST|GET /v1/items/{id}/appeals`, the moderators' appeal queue
//! `GET /v1/appeals`, one appeal `GET /v1/appeals/{id}`, its decision
//! `POST /v1/appeals/{id}/decision`, and `GET /v1/appeals/figures`.

use super::AppState;
use super::auth::{Caller, Moderator};
use super::error::{ApiError, ErrorBody, Json, Path, Query};
use super::idempotency::{claim_key, idempotency_key, request_hash};
use super::moderation::{decide, keyset_page, known_policy, next_keyset};
use super::validate;
use crate::clock::now_ms;
use crate::domain::ItemStatus;
use crate::statements::{self, ItemStatement};
use crate::store::{
    Appeal, AppealClose, AppealFigures, AppealOpened, AppealStatus, Appellant, ManualActor, Moderation,
    ModerationOutcome, NewAppeal,
};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

/// An item's statements, if the caller may read the item.
async fn statements_of(state: &AppState, caller: &Caller, id: &str) -> Result<Vec<ItemStatement>, ApiError> {
    validate::path_id("id", id)?;
    let details = state.store.item_details(id).await?;
    let Some(d) = details.filter(|d| caller.may_read(&d.item.client)) else {
        return Err(ApiError::not_found("item"));
    };
    Ok(statements::for_item(&d, &state.policies))
}

/// The statements of reasons of an item's restrictive decisions, oldest
/// first: each in the DSA Transparency Database's field set
/// (`statement`), with the policy, the rules behind it and until when it
/// may be appealed.
#[utoipa::path(
    get, path = "/v1/items/{id}/statements", tag = "appeals",
    params(("id" = String, Path)),
    responses(
        (status = 200, body = Vec<ItemStatement>), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 503, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn item_statements(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<Vec<ItemStatement>>, ApiError> {
    Ok(Json(statements_of(&state, &caller, &id).await?))
}

/// An appeal, as the platform opens it.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AppealRequest {
    /// On whose behalf: `author` or `notifier`.
    pub appellant: Appellant,
    /// What the appellant says.
    #[schema(min_length = 1, max_length = 5000)]
    pub text: String,
    /// The item version the appealed decision made (a statement's
    /// `item_version`); default: the decision in force.
    #[serde(default)]
    #[schema(minimum = 1)]
    pub item_version: Option<i64>,
}

/// The JSON an appeal is answered with (and a replayed key answers again).
fn appeal_body(a: &Appeal) -> String {
    serde_json::to_string(a).expect("an appeal serializes")
}

/// Appeal the decision in force on an item (or the one `item_version`
/// names, if it is still in force): allowed while its statement is
/// appealable (`[statements] appeal_window_days`), one open appeal per
/// decision. `Idempotency-Key` makes retries open one appeal.
#[utoipa::path(
    post, path = "/v1/items/{id}/appeals", tag = "appeals",
    request_body = AppealRequest,
    params(("id" = String, Path), ("Idempotency-Key" = Option<String>, Header, description = "1-255 printable ASCII characters")),
    responses(
        (status = 201, body = Appeal), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 422, body = ErrorBody),
        (status = 503, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn open_appeal(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    headers: HeaderMap,
    Json(req): Json<AppealRequest>,
) -> Result<Response, ApiError> {
    validate::path_id("id", &id)?;
    validate::text("text", &req.text, 5_000)?;
    if req.text.is_empty() {
        return Err(ApiError::bad_request("invalid_body", "`text` must not be empty"));
    }
    let key = idempotency_key(&headers)?;
    super::rate_limited(&state.client_limiter, &caller.name)?;
    // The key first: a retry is answered as the first request was, even
    // once the decision has moved on.
    let claimed = match key {
        Some(k) => match claim_key(
            &state,
            "appeals",
            &caller.name,
            &k,
            request_hash(&format!("POST /v1/items/{id}/appeals"), &req),
        )
        .await
        {
            Ok(c) => Some(c),
            Err(answer) => return Ok(answer),
        },
        None => None,
    };
    let checked = appealable(&state, &caller, &id, req.item_version).await;
    let s = match checked {
        Ok(s) => s,
        Err(e) => {
            if let Some(k) = &claimed {
                k.release(&state).await;
            }
            return Err(e);
        }
    };
    let now = now_ms();
    let rule = s.rules.first();
    let new = NewAppeal {
        appeal: Appeal {
            id: uuid::Uuid::now_v7().to_string(),
            item_id: id.clone(),
            client: caller.name.clone(),
            decision_version: s.item_version,
            decision_status: s.status,
            policy: s.policy.clone(),
            plugin: rule.map(|r| r.plugin.clone()),
            plugin_version: rule.map(|r| r.version.clone()),
            appellant: req.appellant,
            text: req.text.clone(),
            status: AppealStatus::Open,
            opened_at: now,
            closed_at: None,
            closed_by: None,
            close_reason: None,
            outcome_version: None,
            claimed_by: None,
            claim_expires_at: None,
        },
        key: claimed.as_ref().map(|k| k.completion(StatusCode::CREATED)),
        respond: appeal_body,
    };
    let opened = match state.store.open_appeal(&new).await {
        Ok(o) => o,
        Err(e) => {
            if let Some(k) = &claimed {
                k.release(&state).await;
            }
            return Err(e.into());
        }
    };
    match opened {
        AppealOpened::Opened(a) => {
            state.metrics.appeals_opened.get_or_create(&appeal_labels(&a)).inc();
            Ok(super::json_response(StatusCode::CREATED, appeal_body(&a)))
        }
        AppealOpened::AlreadyOpen(open) => {
            if let Some(k) = &claimed {
                k.release(&state).await;
            }
            Err(ApiError::conflict(
                "appeal_open",
                format!("the decision already has an open appeal ({open})"),
            ))
        }
        AppealOpened::KeyLost => Err(ApiError::conflict(
            "idempotency_key_lost",
            "the Idempotency-Key expired while the request ran; send it again",
        )),
    }
}

/// The statement of the decision an appeal of item `id` is about: the one
/// of `version` (default: the decision in force), if it is in force,
/// appealable and within its window.
async fn appealable(
    state: &AppState,
    caller: &Caller,
    id: &str,
    version: Option<i64>,
) -> Result<ItemStatement, ApiError> {
    let Some(details) = state.store.item_details(id).await? else {
        return Err(ApiError::not_found("item"));
    };
    // Only the client whose item it is appeals on its users' behalf.
    if details.item.client != caller.name {
        return Err(ApiError::not_found("item"));
    }
    let in_force = details.item.version;
    let wanted = version.unwrap_or(in_force);
    let unprocessable = |code, msg: String| ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, code, msg);
    let Some(s) = statements::for_item(&details, &state.policies)
        .into_iter()
        .find(|s| s.item_version == wanted)
    else {
        return Err(unprocessable(
            "no_decision",
            format!("version {wanted} of the item is not a restrictive decision: there is nothing to appeal"),
        ));
    };
    if wanted != in_force {
        return Err(unprocessable(
            "decision_superseded",
            format!("the decision of version {wanted} is no longer in force (the item is at version {in_force})"),
        ));
    }
    let Some(until) = s.appealable_until else {
        return Err(unprocessable(
            "not_appealable",
            format!(
                "a {} item cannot be reinstated, so its decision cannot be appealed",
                s.status
            ),
        ));
    };
    if now_ms() > until {
        return Err(unprocessable(
            "appeal_window_closed",
            format!(
                "the decision of {} could be appealed until {} ({} days)",
                s.statement.application_date,
                crate::domain::statements::date(until),
                state.config.statements.appeal_window_days
            ),
        ));
    }
    Ok(s)
}

fn appeal_labels(a: &Appeal) -> crate::metrics::AppealLabels {
    crate::metrics::AppealLabels {
        policy: a.policy.clone(),
        plugin: a.plugin.clone().unwrap_or_default(),
        version: a.plugin_version.clone().unwrap_or_default(),
    }
}

/// An item's appeals, oldest first.
#[utoipa::path(
    get, path = "/v1/items/{id}/appeals", tag = "appeals",
    params(("id" = String, Path)),
    responses(
        (status = 200, body = Vec<Appeal>), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 503, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn item_appeals(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<Vec<Appeal>>, ApiError> {
    validate::path_id("id", &id)?;
    let Some(item) = state.store.item(&id).await?.filter(|i| caller.may_read(&i.client)) else {
        return Err(ApiError::not_found("item"));
    };
    Ok(Json(state.store.item_appeals(&item.id).await?))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct AppealQueueQuery {
    /// `open` (default), `upheld` or `overturned`.
    pub status: Option<AppealStatus>,
    /// Appeals per page, 1-500 (default 50).
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<i64>,
    /// `next_cursor` of the previous page.
    #[param(pattern = r"^[0-9]{1,18}_[^\u0000-\u001f\u007f-\u009f]{1,256}$")]
    pub cursor: Option<String>,
}

/// A page of appeals.
#[derive(Debug, Serialize, ToSchema)]
pub struct AppealPage {
    pub appeals: Vec<Appeal>,
    /// Pass as `cursor` for the next page; absent on the last page.
    pub next_cursor: Option<String>,
}

/// The appeal queue: appeals in one status, oldest first.
#[utoipa::path(
    get, path = "/v1/appeals", tag = "appeals",
    params(AppealQueueQuery),
    responses((status = 200, body = AppealPage), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)),
    security(("bearer" = []))
)]
pub async fn appeal_queue(
    State(state): State<AppState>,
    Moderator(_moderator): Moderator,
    Query(q): Query<AppealQueueQuery>,
) -> Result<Json<AppealPage>, ApiError> {
    let (limit, cursor) = keyset_page(q.limit, q.cursor.as_deref())?;
    let appeals = state
        .store
        .appeal_queue(
            q.status.unwrap_or(AppealStatus::Open),
            cursor.as_ref().map(|(at, id)| (*at, id.as_str())),
            limit,
        )
        .await?;
    let next_cursor = next_keyset(&appeals, limit, |a| (a.opened_at, a.id.clone()));
    Ok(Json(AppealPage { appeals, next_cursor }))
}

/// One appeal: to a moderator, or to the client whose item it is.
#[utoipa::path(
    get, path = "/v1/appeals/{id}", tag = "appeals",
    params(("id" = String, Path)),
    responses((status = 200, body = Appeal), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = []))
)]
pub async fn get_appeal(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<Appeal>, ApiError> {
    validate::path_id("id", &id)?;
    state
        .store
        .appeal(&id)
        .await?
        .filter(|a| caller.may_read(&a.client))
        .map(Json)
        .ok_or_else(|| ApiError::not_found("appeal"))
}

/// What a moderator decides on an appeal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum AppealOutcome {
    /// The decision stands: the item is (again) in the status it set.
    Uphold,
    /// The decision is reversed: the item becomes visible.
    Overturn,
}

/// A moderator's decision on an appeal.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AppealDecision {
    pub outcome: AppealOutcome,
    /// Why; the appellant is told (the outcome's statement and event carry it).
    #[schema(max_length = 1024)]
    pub reason: String,
    /// The policy an upheld decision is stated under from now on
    /// (default: the appealed decision's).
    #[serde(default)]
    #[schema(min_length = 1, max_length = 64)]
    pub policy: Option<String>,
}

/// Decide an appeal. Only a moderator does (an automated decision never
/// closes an appeal: the store refuses it). Upholding confirms the appealed
/// status, overturning makes the item visible; either is the moderator's
/// decision on the item, in one transaction with the appeal's closing:
/// its audit row and webhook event (`cause` `appeal`), the reversal of the
/// rules' actions it overturns (strikes undone, counted against the plugin
/// version once), and a new statement when it restricts.
#[utoipa::path(
    post, path = "/v1/appeals/{id}/decision", tag = "appeals",
    request_body = AppealDecision,
    params(("id" = String, Path)),
    responses(
        (status = 200, body = Appeal), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
        (status = 422, body = ErrorBody), (status = 503, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn decide_appeal(
    State(state): State<AppState>,
    Moderator(caller): Moderator,
    Path(id): Path<String>,
    headers: HeaderMap,
    Json(req): Json<AppealDecision>,
) -> Result<Json<Appeal>, ApiError> {
    validate::path_id("id", &id)?;
    validate::text("reason", &req.reason, 1024)?;
    known_policy(&state, req.policy.as_deref())?;
    let correlation_id = super::request_id(&headers);
    close(&state, &caller.name, &id, &req, &correlation_id).await.map(Json)
}

/// A moderator's (`moderator`, a token name) decision on appeal `id`: the
/// API's and the console's. `req` is validated by the caller.
pub(crate) async fn close(
    state: &AppState,
    moderator: &str,
    id: &str,
    req: &AppealDecision,
    correlation_id: &str,
) -> Result<Appeal, ApiError> {
    for _ in 0..8 {
        let Some(appeal) = state.store.appeal(id).await? else {
            return Err(ApiError::not_found("appeal"));
        };
        if appeal.status != AppealStatus::Open {
            return Err(ApiError::conflict(
                "appeal_closed",
                format!("the appeal was already decided: {}", appeal.status),
            ));
        }
        let (to, status, policy) = match req.outcome {
            AppealOutcome::Uphold => (
                appeal.decision_status,
                AppealStatus::Upheld,
                Some(req.policy.clone().unwrap_or_else(|| appeal.policy.clone())),
            ),
            AppealOutcome::Overturn => (ItemStatus::Visible, AppealStatus::Overturned, None),
        };
        let outcome = decide(
            state,
            &Moderation {
                id: &appeal.item_id,
                to,
                if_match: None,
                by: ManualActor::Moderator,
                name: moderator,
                note: None,
                reason: &req.reason,
                correlation_id,
                policy: policy.as_deref(),
                until: None,
                appeal: Some(AppealClose {
                    id: id.to_string(),
                    status,
                }),
            },
        )
        .await?;
        match outcome {
            ModerationOutcome::Applied { .. } => {
                let closed = state
                    .store
                    .appeal(id)
                    .await?
                    .ok_or_else(|| ApiError::not_found("appeal"))?;
                let labels = appeal_labels(&closed);
                state
                    .metrics
                    .appeals_closed
                    .get_or_create(&crate::metrics::AppealOutcomeLabels {
                        policy: labels.policy.clone(),
                        plugin: labels.plugin.clone(),
                        version: labels.version.clone(),
                        outcome: status.as_str(),
                    })
                    .inc();
                if let Some(closed_at) = closed.closed_at {
                    state
                        .metrics
                        .appeal_decision_seconds
                        .get_or_create(&labels)
                        .observe((closed_at - closed.opened_at).max(0) as f64 / 1_000.0);
                }
                return Ok(closed);
            }
            ModerationOutcome::NotFound => return Err(ApiError::not_found("item")),
            ModerationOutcome::Illegal { from } => {
                return Err(ApiError::conflict(
                    "illegal_transition",
                    format!("the item is {from}: it cannot become {to}"),
                ));
            }
            // The item or the appeal moved on: read the appeal again.
            ModerationOutcome::AppealStale | ModerationOutcome::VersionMismatch { .. } => continue,
        }
    }
    Err(ApiError::conflict("conflict", "the item kept changing; try again").retry_after(1))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct FiguresQuery {
    /// Appeals opened from this time on (ms since the epoch; default: the
    /// last 30 days).
    pub since: Option<i64>,
}

/// Appeals per plugin version and policy: volume, time to decision (p50,
/// p99) and the share overturned.
#[utoipa::path(
    get, path = "/v1/appeals/figures", tag = "appeals",
    params(FiguresQuery),
    responses((status = 200, body = Vec<AppealFigures>), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)),
    security(("bearer" = []))
)]
pub async fn appeal_figures(
    State(state): State<AppState>,
    Moderator(_moderator): Moderator,
    Query(q): Query<FiguresQuery>,
) -> Result<Json<Vec<AppealFigures>>, ApiError> {
    let since = q.since.unwrap_or_else(|| now_ms() - 30 * 86_400_000);
    Ok(Json(state.store.appeal_figures(since).await?))
}
