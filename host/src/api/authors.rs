//! Author standing: `GET /v1/authors/{author}` (a client reads its own
//! authors, a moderator any client's) and `POST /v1/authors/{author}/moderation`
//! (a moderator sets or clears an author's account state).

use super::AppState;
use super::auth::{Caller, Moderator};
use super::error::{ApiError, ErrorBody, Json, Path, Query};
use super::validate;
use crate::config::Role;
use crate::domain::standing::{AuthorActor, TierEffect};
use crate::store::{AuthorDetails, AuthorModeration, AuthorModerationOutcome, AuthorTransitionRecord};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

/// Which client's author (authors are scoped per client, as items are).
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct AuthorQuery {
    /// The client token the author's items came through. A client token
    /// reads its own authors (and may omit it); a moderator must name it.
    #[param(min_length = 1, max_length = 256)]
    pub client: Option<String>,
}

/// An author's account standing.
#[derive(Debug, Serialize, ToSchema)]
pub struct AuthorView {
    pub client: String,
    pub author: String,
    /// The account state (a tier of `[standing]`).
    pub status: String,
    /// What the state does to the author's new submissions (`none` while
    /// standing is off).
    pub effect: TierEffect,
    /// Bumped by every change of state; send it as `If-Match` to moderate.
    pub version: i64,
    /// Whether a moderator set the state (automation leaves it alone until
    /// a moderator clears it).
    pub manual: bool,
    /// `rules`, `moderator`, or `null` before the first change.
    pub decided_by: Option<AuthorActor>,
    /// The strike score now, derived from the decision log.
    pub strikes: f64,
    /// The window strikes count in, in milliseconds.
    pub window_ms: i64,
    /// The decisions that count, one per item (its heaviest), by id.
    pub decisions: Vec<i64>,
    /// When the oldest counting decision leaves the window.
    pub next_expiry: Option<i64>,
    pub first_seen: i64,
    pub last_seen: i64,
    /// Every change of state, oldest first.
    pub transitions: Vec<AuthorTransitionRecord>,
}

fn view(state: &AppState, d: AuthorDetails) -> AuthorView {
    let p = &state.standing;
    let r = d.record;
    let effect = if p.enabled {
        p.tier(&r.status).map(|t| t.effect).unwrap_or_default()
    } else {
        TierEffect::None
    };
    AuthorView {
        effect,
        manual: r.decided_by == Some(AuthorActor::Moderator),
        decided_by: r.decided_by,
        client: r.client,
        author: r.author,
        status: r.status,
        version: r.version,
        strikes: d.strikes.score,
        window_ms: p.window_ms,
        decisions: d.strikes.decisions,
        next_expiry: d.strikes.next_expiry,
        first_seen: r.first_seen,
        last_seen: r.last_seen,
        transitions: d.transitions,
    }
}

/// The client whose author the caller asks about: a client token its own
/// (naming another is 404, as another client's item is), a moderator the
/// one named.
fn client_of<'a>(caller: &'a Caller, q: &'a AuthorQuery) -> Result<&'a str, ApiError> {
    if let Some(c) = &q.client {
        validate::identifier("client", c, 256).map_err(|e| ApiError::bad_request("invalid_query", e.message))?;
    }
    match (caller.role, q.client.as_deref()) {
        (Role::Moderator, Some(c)) => Ok(c),
        // Well formed, but a moderator's question needs the client too.
        (Role::Moderator, None) => Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "client_required",
            "a moderator names the author's client: ?client=NAME",
        )),
        (Role::Client, Some(c)) if c != caller.name => Err(ApiError::not_found("author")),
        (Role::Client, _) => Ok(caller.name.as_str()),
    }
}

/// Read an author's standing: state, strikes derived now from the decision
/// log (and the decisions that count), and every change of state.
#[utoipa::path(
    get, path = "/v1/authors/{author}", tag = "authors",
    params(("author" = String, Path), AuthorQuery),
    responses(
        (status = 200, body = AuthorView), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 422, body = ErrorBody), (status = 503, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn get_author(
    State(state): State<AppState>,
    caller: Caller,
    Path(author): Path<String>,
    Query(q): Query<AuthorQuery>,
) -> Result<Json<AuthorView>, ApiError> {
    validate::path_id("author", &author)?;
    let client = client_of(&caller, &q)?;
    let details = state
        .store
        .author(client, &author, &state.standing, crate::clock::now_ms())
        .await?
        .ok_or_else(|| ApiError::not_found("author"))?;
    Ok(Json(view(&state, details)))
}

/// A moderator's decision about an author's account.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AuthorModerationRequest {
    /// The state to set (a tier of `[standing]`): it stays until a
    /// moderator changes or clears it. `null` (or absent) clears a manual
    /// state: automation sets the tier the strikes reach, at once.
    #[serde(default)]
    #[schema(min_length = 1, max_length = 64)]
    pub status: Option<String>,
    /// Why; kept in the audit trail.
    #[schema(max_length = 1024)]
    pub reason: String,
}

/// Set or clear an author's account state by hand. `If-Match: VERSION`
/// makes it conditional on the version the moderator saw.
#[utoipa::path(
    post, path = "/v1/authors/{author}/moderation", tag = "moderator",
    request_body = AuthorModerationRequest,
    params(
        ("author" = String, Path), AuthorQuery,
        ("If-Match" = Option<String>, Header, description = "the author version the decision is based on, bare or quoted", pattern = r#"^([0-9]{1,18}|"[0-9]{1,18}")$"#),
    ),
    responses(
        (status = 200, body = AuthorView), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
        (status = 422, body = ErrorBody), (status = 503, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn moderate_author(
    State(state): State<AppState>,
    Moderator(caller): Moderator,
    Path(author): Path<String>,
    Query(q): Query<AuthorQuery>,
    headers: HeaderMap,
    Json(req): Json<AuthorModerationRequest>,
) -> Result<Json<AuthorView>, ApiError> {
    validate::path_id("author", &author)?;
    let client = client_of(&caller, &q)?;
    validate::text("reason", &req.reason, 1024)?;
    let if_match = super::moderation::if_match(&headers, "author")?;
    let policy = &state.standing;
    if !policy.enabled {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "standing_disabled",
            "author standing is off: set [standing] enabled = true",
        ));
    }
    if let Some(s) = &req.status
        && policy.tier(s).is_none()
    {
        let names: Vec<&str> = policy.tiers.iter().map(|t| t.name.as_str()).collect();
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "unknown_state",
            format!("{s:?} is not an account state; the states are {}", names.join(", ")),
        ));
    }
    let correlation_id = super::request_id(&headers);
    let now = crate::clock::now_ms();
    let outcome = state
        .store
        .moderate_author(
            &AuthorModeration {
                client,
                author: &author,
                status: req.status.as_deref(),
                if_match,
                actor_name: &caller.name,
                reason: &req.reason,
                correlation_id: &correlation_id,
                now,
            },
            policy,
        )
        .await?;
    match outcome {
        AuthorModerationOutcome::Applied { .. } => {
            let details = state
                .store
                .author(client, &author, policy, now)
                .await?
                .ok_or_else(|| ApiError::not_found("author"))?;
            Ok(Json(view(&state, details)))
        }
        AuthorModerationOutcome::NotFound => Err(ApiError::not_found("author")),
        AuthorModerationOutcome::VersionMismatch { current } => Err(ApiError::new(
            StatusCode::CONFLICT,
            "version_mismatch",
            format!("the author is at version {current}, not the version in If-Match"),
        )),
    }
}
