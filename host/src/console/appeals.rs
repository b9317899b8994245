//! The appeal queue: open appeals oldest first, "Take the next appeal"
//! (a claim, like review's: it shares out work, the appeal's `open` status
//! decides which decision lands), and an appeal's page with the decision
//! appealed, its statement, the appellant's words and the uphold/overturn
//! form (keys `u`, `o`, Ctrl+Enter). Deciding goes through the API's
//! `close_appeal`, so the console and `POST /v1/appeals/{id}/decision`
//! are one path.

use super::layout::{self, PageError, age, page_shell, when};
use super::queue::{encode, excerpt};
use super::session::{ConsoleForm, SignedIn};
use crate::api::{AppState, AppealDecision, AppealOutcome, close_appeal};
use crate::clock::now_ms;
use crate::store::{AppealStatus, PAGE_ROWS};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use maud::html;
use serde::Deserialize;

#[derive(Debug, Default, Deserialize)]
pub struct AppealsQuery {
    #[serde(default)]
    empty: Option<String>,
}

/// `GET /console/appeals`.
pub async fn appeals_page(
    State(state): State<AppState>,
    session: SignedIn,
    Query(q): Query<AppealsQuery>,
) -> Result<Response, PageError> {
    let now = now_ms();
    let open = state.store.appeal_queue(AppealStatus::Open, None, PAGE_ROWS).await?;
    let figures = state.store.appeal_figures(now - 30 * 86_400_000).await?;
    let body = html! {
        main {
            h1 { "Appeals" }
            @if q.empty.is_some() {
                p #appeals-empty.notice { "No appeal left to take: every open appeal is decided or claimed by someone else." }
            }
            form #take-appeal method="post" action="/console/appeals/next" {
                input type="hidden" name="csrf" value=(session.csrf);
                button #take.primary type="submit" { "Take the next appeal" }
            }
            table #appeals {
                thead { tr { th { "waiting" } th { "appellant says" } th { "decision" } th { "policy" } th { "rule" } th { "claimed by" } } }
                tbody {
                    @for a in &open {
                        @let live = a.claim_expires_at.is_some_and(|t| t > now);
                        tr data-appeal=(a.id) data-item=(a.item_id) {
                            td { (age(now - a.opened_at)) }
                            td.text { a.open href={ "/console/appeals/" (encode(&a.id)) } { (excerpt(&a.text, 120)) } }
                            td { (a.decision_status) }
                            td { (a.policy) }
                            td { @if let Some(p) = &a.plugin { (p) " " (a.plugin_version.as_deref().unwrap_or("")) } @else { "moderator" } }
                            td { @if live { (a.claimed_by.as_deref().unwrap_or("")) } }
                        }
                    }
                }
            }
            h2 { "The last 30 days" }
            table #appeal-figures {
                thead { tr { th { "rule" } th { "policy" } th { "open" } th { "upheld" } th { "overturned" } th { "overturn rate" } th { "decided in (p50 / p99)" } } }
                tbody {
                    @for f in &figures {
                        tr {
                            td { @if let Some(p) = &f.plugin { (p) " " (f.plugin_version.as_deref().unwrap_or("")) } @else { "moderator" } }
                            td { (f.policy) }
                            td { (f.open) }
                            td { (f.upheld) }
                            td { (f.overturned) }
                            td { @match f.overturn_rate { Some(r) => { (format!("{:.0} %", r * 100.0)) }, None => { "—" } } }
                            td { @match (f.decision_ms_p50, f.decision_ms_p99) { (Some(a), Some(b)) => { (age(a)) " / " (age(b)) }, _ => { "—" } } }
                        }
                    }
                }
            }
        }
    };
    Ok(page_shell("Appeals", Some(&session), body).into_response())
}

#[derive(Debug, Deserialize)]
pub struct CsrfForm {
    csrf: Option<String>,
}

/// `POST /console/appeals/next`: claims the next appeal and opens it.
pub async fn take_next(
    State(state): State<AppState>,
    session: SignedIn,
    ConsoleForm(form): ConsoleForm<CsrfForm>,
) -> Result<Response, PageError> {
    session.check_csrf(form.csrf.as_deref())?;
    let claimed = state
        .store
        .claim_next_appeal(&session.moderator, state.config.console.claim_ttl_ms)
        .await?;
    Ok(match claimed {
        Some(id) => layout::see_other(&format!("/console/appeals/{}", encode(&id))),
        None => layout::see_other("/console/appeals?empty=1"),
    })
}

/// `GET /console/appeals/{id}`.
pub async fn appeal_page(
    State(state): State<AppState>,
    session: SignedIn,
    Path(id): Path<String>,
) -> Result<Response, PageError> {
    render(&state, &session, &id, None, StatusCode::OK).await
}

async fn render(
    state: &AppState,
    session: &SignedIn,
    id: &str,
    error: Option<String>,
    status: StatusCode,
) -> Result<Response, PageError> {
    let now = now_ms();
    let appeal = state
        .store
        .appeal(id)
        .await?
        .ok_or_else(|| PageError::new(StatusCode::NOT_FOUND, "No appeal has this id."))?;
    let details = state
        .store
        .item_details(&appeal.item_id)
        .await?
        .ok_or_else(|| PageError::new(StatusCode::NOT_FOUND, "The appeal's item is gone."))?;
    let statement = crate::statements::for_item(&details, &state.policies)
        .into_iter()
        .find(|s| s.item_version == appeal.decision_version);
    let claim_live = appeal.claim_expires_at.is_some_and(|t| t > now);
    let body = html! {
        main.item {
            h1 { "Appeal" }
            @if let Some(e) = &error { p #error.error { (e) } }
            p #appeal-status data-status=(appeal.status) {
                "Status: " strong { (appeal.status) }
                @if let (Some(by), Some(at)) = (&appeal.closed_by, appeal.closed_at) {
                    " by " strong { (by) } " " (when(at, now))
                    @if let Some(r) = &appeal.close_reason { " — " (r) }
                }
                @if appeal.status == AppealStatus::Open && claim_live {
                    " · claimed by " (appeal.claimed_by.as_deref().unwrap_or(""))
                }
            }
            section.appellant {
                h2 { "The " (appeal.appellant) " says" }
                blockquote #appeal-text { (appeal.text) }
                p { "Opened " (when(appeal.opened_at, now)) }
            }
            section.decision {
                h2 { "The decision appealed" }
                p {
                    a #appeal-item href={ "/console/items/" (encode(&appeal.item_id)) } { "Item" }
                    " (" (details.item.kind) " by " (details.item.author) "), now " strong #item-status { (details.item.status) }
                }
                pre #item-text { (details.item.body) }
                @if let Some(s) = &statement {
                    dl #statement {
                        dt { "decision" } dd { (s.status) " by " (s.actor) " (version " (s.item_version) ") " (when(s.decided_at, now)) }
                        dt { "policy" } dd { (s.policy) " · " (s.statement.category) }
                        dt { "automation" } dd { (s.statement.automated_decision.describe()) }
                        dt { "facts" } dd { (s.statement.decision_facts) }
                    }
                }
            }
            @if appeal.status == AppealStatus::Open {
                form #decide method="post" action={ "/console/appeals/" (encode(&appeal.id)) "/decide" } {
                    input type="hidden" name="csrf" value=(session.csrf);
                    fieldset {
                        legend { "Decide" }
                        label { input #outcome-uphold type="radio" name="outcome" value="uphold" required; " uphold " kbd { "u" } }
                        label { input #outcome-overturn type="radio" name="outcome" value="overturn"; " overturn " kbd { "o" } }
                    }
                    label { "reason (the appellant is told) " textarea #reason name="reason" required maxlength="1024" {} }
                    button #submit.primary type="submit" name="then" value="stay" { "Decide " kbd { "Ctrl+Enter" } }
                }
                p.hint #shortcuts hidden { "u uphold · o overturn · Ctrl+Enter decide · ? these keys" }
            }
        }
    };
    Ok((status, page_shell("Appeal", Some(session), body)).into_response())
}

#[derive(Debug, Deserialize)]
pub struct DecideForm {
    csrf: Option<String>,
    #[serde(default)]
    outcome: String,
    #[serde(default)]
    reason: String,
    #[serde(default)]
    #[allow(dead_code)]
    then: String,
}

/// `POST /console/appeals/{id}/decide`: the same decision as
/// `POST /v1/appeals/{id}/decision`.
pub async fn decide(
    State(state): State<AppState>,
    session: SignedIn,
    Path(id): Path<String>,
    headers: HeaderMap,
    ConsoleForm(form): ConsoleForm<DecideForm>,
) -> Result<Response, PageError> {
    session.check_csrf(form.csrf.as_deref())?;
    let refuse = |why: &str| PageError::new(StatusCode::UNPROCESSABLE_ENTITY, why);
    let outcome = match form.outcome.as_str() {
        "uphold" => AppealOutcome::Uphold,
        "overturn" => AppealOutcome::Overturn,
        _ => return Err(refuse("Choose uphold or overturn.")),
    };
    let reason = form.reason.trim();
    if reason.is_empty() || reason.chars().count() > 1024 || reason.contains('\0') {
        return Err(refuse("A reason of 1 to 1,024 characters is required."));
    }
    let correlation_id = crate::api::request_id(&headers);
    let req = AppealDecision {
        outcome,
        reason: reason.to_string(),
        policy: None,
    };
    match close_appeal(&state, &session.moderator, &id, &req, &correlation_id).await {
        Ok(_) => Ok(layout::see_other(&format!("/console/appeals/{}", encode(&id)))),
        Err(e) if e.status == StatusCode::CONFLICT => render(&state, &session, &id, Some(e.message), e.status).await,
        Err(e) => Err(PageError::new(e.status, &e.message)),
    }
}
