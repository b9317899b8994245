//! Author standing: `GET /v1/authors/{author}` (a client reads its own
//! authors, a moderator any client's) and `POST /v1/authors/{author}/moderation`
//! (a moderator sets or clears an author's account state).

use super::AppState;
use super::auth::{Caller, Moderator};
use super::error::{ApiError, ErrorBody, Json, Path, Query};
use super::validate;
use crate::config::Role;
use crate::domain::standing::{AuthorActor, TierEffect};
use crate::store::{AuthorDetails, AuthorModeration, AuthorModerationOutcome, AuthorPage, AuthorTransitionRecord};
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
    /// Entries per list and page, 1-500 (default 100).
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<i64>,
    /// `next_decisions_after` of the previous page.
    #[param(minimum = 0)]
    pub decisions_after: Option<i64>,
    /// `next_transitions_after` of the previous page.
    #[param(minimum = 0)]
    pub transitions_after: Option<i64>,
}

/// The page of the author's lists a query asks for.
fn page_of(q: &AuthorQuery) -> Result<AuthorPage, ApiError> {
    let limit = q.limit.unwrap_or(100);
    if !(1..=500).contains(&limit) {
        return Err(ApiError::bad_request("invalid_query", "limit must be 1-500"));
    }
    let cursor = |name: &str, v: Option<i64>| match v {
        Some(v) if v < 0 => Err(ApiError::bad_request("invalid_query", format!("{name} must be >= 0"))),
        v => Ok(v.unwrap_or(0)),
    };
    Ok(AuthorPage {
        decisions_after: cursor("decisions_after", q.decisions_after)?,
        transitions_after: cursor("transitions_after", q.transitions_after)?,
        limit,
    })
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
    /// When a moderator's timed state ends (automation decides again then).
    pub until: Option<i64>,
    /// The strike score now, derived from the decision log (never negative).
    pub strikes: f64,
    /// The window strikes count in, in milliseconds.
    pub window_ms: i64,
    /// How many decisions count: one per item (its heaviest).
    pub counted: i64,
    /// A page of the decisions that count, by id (`limit`, `decisions_after`).
    pub decisions: Vec<i64>,
    /// Pass as `decisions_after` for the next page; `null` on the last one.
    pub next_decisions_after: Option<i64>,
    /// When the oldest counting decision leaves the window.
    pub next_expiry: Option<i64>,
    pub first_seen: i64,
    pub last_seen: i64,
    /// A page of the changes of state, oldest first (`limit`, `transitions_after`).
    pub transitions: Vec<AuthorTransitionRecord>,
    /// Pass as `transitions_after` for the next page; `null` on the last one.
    pub next_transitions_after: Option<i64>,
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
        until: r.state_until,
        client: r.client,
        author: r.author,
        status: r.status,
        version: r.version,
        strikes: d.strikes.score,
        window_ms: p.window_ms,
        counted: d.strikes.counted,
        decisions: d.decisions,
        next_decisions_after: d.next_decisions_after,
        next_expiry: d.strikes.next_expiry,
        first_seen: r.first_seen,
        last_seen: r.last_seen,
        transitions: d.transitions,
        next_transitions_after: d.next_transitions_after,
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
/// log, and a page of the decisions that count and of the changes of state.
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
    let page = page_of(&q)?;
    let details = state
        .store
        .author(client, &author, &state.standing, crate::clock::now_ms(), page)
        .await?
        .ok_or_else(|| ApiError::not_found("author"))?;
    Ok(Json(view(&state, details)))
}

/// The statements of reasons of an author's account decisions (a state
/// that restricts them, set by automation or a moderator), oldest first,
/// from the page of transitions the query asks for (`limit`,
/// `transitions_after`).
#[utoipa::path(
    get, path = "/v1/authors/{author}/statements", tag = "appeals",
    params(("author" = String, Path), AuthorQuery),
    responses(
        (status = 200, body = Vec<crate::statements::AccountStatement>), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 404, body = ErrorBody), (status = 422, body = ErrorBody),
        (status = 503, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn author_statements(
    State(state): State<AppState>,
    caller: Caller,
    Path(author): Path<String>,
    Query(q): Query<AuthorQuery>,
) -> Result<Json<Vec<crate::statements::AccountStatement>>, ApiError> {
    validate::path_id("author", &author)?;
    let client = client_of(&caller, &q)?;
    let page = page_of(&q)?;
    let details = state
        .store
        .author(client, &author, &state.standing, crate::clock::now_ms(), page)
        .await?
        .ok_or_else(|| ApiError::not_found("author"))?;
    Ok(Json(
        details
            .transitions
            .iter()
            .filter(|t| crate::statements::account_has_statement(t, &state.standing))
            .map(|t| crate::statements::derive_account(&details.record, t, &state.standing, &state.policies))
            .collect(),
    ))
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
    /// With `status`: when the state ends (ms since the epoch, in the
    /// future, before 2038-01-01). gavel hands the account back to
    /// automation then (an audited transition, cause `expiry`), unless a
    /// moderator changed it before.
    #[serde(default)]
    #[schema(minimum = 1)]
    pub until: Option<i64>,
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
    let page = page_of(&q)?;
    validate::text("reason", &req.reason, 1024)?;
    super::moderation::valid_until(req.until, req.status.is_some())?;
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
                until: req.until,
            },
            policy,
        )
        .await?;
    match outcome {
        AuthorModerationOutcome::Applied { .. } => {
            let details = state
                .store
                .author(client, &author, policy, now, page)
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
