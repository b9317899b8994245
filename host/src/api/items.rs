//! `GET /v1/items/{id}`: an item with its counters, events, decisions and
//! audit trail; `DELETE /v1/items/{id}`: its author deletes it.

use super::AppState;
use super::auth::Caller;
use super::error::{ApiError, ErrorBody, Json, Path};
use super::validate;
use crate::domain::{Actor, ItemStatus};
use crate::store::{
    DecisionRecord, EventRecord, ItemDetails, ProviderCallbackRecord, ProviderRequestRecord, TransitionRecord,
};
use axum::extract::State;
use serde::Serialize;
use std::collections::BTreeMap;
use utoipa::ToSchema;

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
    pub decided_by: Option<Actor>,
    /// Set while an evaluation is pending.
    pub needs_eval_since: Option<i64>,
    /// Bumped by every edit.
    pub content_version: i64,
    pub created_at: i64,
    pub updated_at: i64,
    pub counters: BTreeMap<String, i64>,
    /// The latest events (at most 200), oldest first.
    pub events: Vec<EventRecord>,
    pub decisions: Vec<DecisionRecord>,
    pub transitions: Vec<TransitionRecord>,
    /// Hand-offs to external classifiers, oldest first, with their outcome.
    pub provider_requests: Vec<ProviderRequestRecord>,
    /// Callbacks received for this item, with what each did.
    pub provider_callbacks: Vec<ProviderCallbackRecord>,
}

/// Read an item: status, counters, every decision (stamped with plugin
/// name, version and digest) and the full transition trail.
#[utoipa::path(
    get, path = "/v1/items/{id}", tag = "items",
    params(("id" = String, Path)),
    responses(
        (status = 200, body = ItemView), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 503, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn get_item(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<ItemView>, ApiError> {
    validate::path_id("id", &id)?;
    let details = state.store.item_details(&id).await?;
    let Some(d) = details.filter(|d| caller.may_read(&d.item.client)) else {
        return Err(ApiError::not_found("item"));
    };
    Ok(Json(item_view(d)))
}

/// The item's author deleted it: the client that submitted it says so.
/// Deletion is final (no rule, provider or moderator changes it after) and
/// repeatable: deleting a deleted item answers the item as it is.
#[utoipa::path(
    delete, path = "/v1/items/{id}", tag = "items",
    params(("id" = String, Path)),
    responses(
        (status = 200, body = ItemView), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 503, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn delete_item(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    headers: axum::http::HeaderMap,
) -> Result<Json<ItemView>, ApiError> {
    use crate::store::{ManualActor, Moderation, ModerationOutcome, moderate};
    validate::path_id("id", &id)?;
    let correlation_id = super::request_id(&headers);
    let outcome = moderate(
        state.store.as_ref(),
        &Moderation {
            id: &id,
            to: ItemStatus::Deleted,
            if_match: None,
            by: ManualActor::Author { client: &caller.name },
            name: &caller.name,
            note: None,
            reason: "deleted by its author",
            correlation_id: &correlation_id,
            policy: None,
            until: None,
            appeal: None,
        },
    )
    .await?;
    match outcome {
        // Applied, or already deleted: either way the item is deleted now.
        ModerationOutcome::Applied { .. }
        | ModerationOutcome::Illegal {
            from: ItemStatus::Deleted,
        } => {
            let d = state
                .store
                .item_details(&id)
                .await?
                .ok_or_else(|| ApiError::not_found("item"))?;
            Ok(Json(item_view(d)))
        }
        ModerationOutcome::NotFound => Err(ApiError::not_found("item")),
        ModerationOutcome::Illegal { from } => Err(ApiError::new(
            axum::http::StatusCode::CONFLICT,
            "illegal_transition",
            format!("an item in status {from} cannot be deleted"),
        )),
        // Only an `If-Match` asks for this answer, and a deletion sends none;
        // only an appeal's decision the other.
        ModerationOutcome::VersionMismatch { current } => Err(ApiError::new(
            axum::http::StatusCode::CONFLICT,
            "version_mismatch",
            format!("the item is at version {current}"),
        )),
        ModerationOutcome::AppealStale => Err(ApiError::conflict("conflict", "the item changed; try again")),
    }
}

pub(super) fn item_view(details: ItemDetails) -> ItemView {
    let ItemDetails {
        item,
        counters,
        events,
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
        content_version: item.content_version,
        created_at: item.created_at,
        updated_at: item.updated_at,
        counters: counters.into_iter().collect(),
        events,
        decisions,
        transitions,
        provider_requests,
        provider_callbacks,
    }
}
