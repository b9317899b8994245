//! Entity signals: `GET /v1/signals` (the signals counted now) and
//! `GET /v1/signals/{name}?client=&key=` (one key's value now), for
//! moderators.

use super::AppState;
use super::auth::Moderator;
use super::error::{ApiError, ErrorBody, Json, Path, Query};
use super::validate;
use crate::signals::SignalReading;
use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

/// Which key of which client.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct SignalQuery {
    /// The client token whose items are counted (signals are scoped per
    /// client, as items are).
    #[param(min_length = 1, max_length = 256)]
    pub client: String,
    /// The key: a registrable domain (`bit.ly`), an author id, a context
    /// value, as the signal counts by.
    #[param(min_length = 1, max_length = 256)]
    pub key: String,
}

/// A signal as the loaded plugins declare it.
#[derive(Debug, Serialize, ToSchema)]
pub struct SignalView {
    pub name: String,
    /// `author`, `link-domain` or `context.NAME`.
    pub key_field: String,
    /// `items` or `distinct FIELD`.
    pub count: String,
    pub window_ms: i64,
    /// Counts only items whose context value is a number below this.
    #[schema(value_type = Option<Object>)]
    pub when: Option<crate::domain::signals::When>,
}

/// The signals counted now.
#[derive(Debug, Serialize, ToSchema)]
pub struct SignalList {
    pub signals: Vec<SignalView>,
    /// False while some signal is still being rebuilt from stored items.
    pub complete: bool,
}

/// The entity signals the loaded plugins declare.
#[utoipa::path(
    get, path = "/v1/signals", tag = "moderator",
    responses((status = 200, body = SignalList), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)),
    security(("bearer" = []))
)]
pub async fn list(State(state): State<AppState>, _m: Moderator) -> Json<SignalList> {
    let signals = state
        .signals
        .specs()
        .into_iter()
        .map(|s| SignalView {
            key_field: s.key.to_string(),
            count: String::from(s.count),
            window_ms: s.window_ms,
            when: s.when,
            name: s.name,
        })
        .collect();
    Json(SignalList {
        signals,
        complete: state.signals.complete(),
    })
}

/// A signal's value for one key of one client, now.
#[utoipa::path(
    get, path = "/v1/signals/{name}", tag = "moderator",
    params(("name" = String, Path, description = "The signal's name"), SignalQuery),
    responses(
        (status = 200, body = SignalReading), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 503, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn get_one(
    State(state): State<AppState>,
    _m: Moderator,
    Path(name): Path<String>,
    Query(q): Query<SignalQuery>,
) -> Result<Json<SignalReading>, ApiError> {
    validate::path_id("name", &name)?;
    for (field, value) in [("client", &q.client), ("key", &q.key)] {
        validate::identifier(field, value, 256).map_err(|e| ApiError::bad_request("invalid_query", e.message))?;
    }
    let reading = state.signals.reading(&name, &q.client, &q.key).await.map_err(|e| {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "signals_unavailable", e.to_string()).retry_after(1)
    })?;
    reading.map(Json).ok_or_else(|| ApiError::not_found("signal"))
}
