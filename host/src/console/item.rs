//! One item: its content (always escaped), its author's record, one
//! timeline of everything that happened to it, and the decision bar.

use super::layout::{self, PageError, page_shell, short, when};
use super::queue::{Filters, encode, excerpt, next_item};
use super::session::{ConsoleForm, SignedIn};
use crate::api::{AppState, decide as api_decide, may_set};
use crate::clock::{Millis, now_ms};
use crate::domain::ItemStatus;
use crate::store::{
    AuthorDetails, AuthorSummary, DeliveryRecord, ItemDetails, ManualActor, Moderation, ModerationOutcome, ReviewClaim,
};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use maud::{Markup, html};
use serde::Deserialize;

#[derive(Debug, Default, Deserialize)]
pub struct ItemQuery {
    #[serde(flatten)]
    filters: Filters,
    #[serde(default)]
    decided: Option<String>,
    /// Show the decisions made before this decision id (a number; kept a
    /// string here: flattened query fields arrive as strings).
    #[serde(default)]
    decisions_before: Option<String>,
}

/// Decisions the item page shows at once; older ones are a link away.
pub const PAGE_DECISIONS: i64 = 50;

/// Everything the item page shows.
struct ItemPage {
    details: ItemDetails,
    deliveries: Vec<DeliveryRecord>,
    author: AuthorSummary,
    /// The author's account standing (with `[standing]` on).
    standing: Option<AuthorDetails>,
    claim: Option<ReviewClaim>,
    /// The decisions shown are the ones before this id (`None`: the newest).
    decisions_before: Option<i64>,
    /// The oldest decision shown, when older ones are stored.
    older_decisions: Option<i64>,
    /// The entity signals the newest stored snapshot carried, and when it
    /// was judged.
    signals: Option<(Millis, crate::domain::signals::SignalValues)>,
}

async fn load(state: &AppState, id: &str, decisions_before: Option<i64>) -> Result<ItemPage, PageError> {
    // One decision more than shown: whether older ones exist.
    let mut details = state
        .store
        .item_details_page(id, decisions_before, PAGE_DECISIONS + 1)
        .await?
        .ok_or_else(|| PageError::new(StatusCode::NOT_FOUND, "No item has this id."))?;
    let older_decisions = (details.decisions.len() as i64 > PAGE_DECISIONS).then(|| {
        details.decisions.remove(0);
        details.decisions[0].id
    });
    let deliveries = state.store.item_deliveries(id).await?;
    let author = state
        .store
        .author_summary(&details.item.client, &details.item.author)
        .await?;
    let standing = if state.standing.enabled {
        let item = &details.item;
        let now = crate::clock::now_ms();
        state
            .store
            // The panel shows the state and the score: no lists.
            .author(
                &item.client,
                &item.author,
                &state.standing,
                now,
                crate::store::AuthorPage::first(0),
            )
            .await?
    } else {
        None
    };
    let claim = state.store.claim_of(id).await?;
    let signals = signals_judged(state, &details).await?;
    Ok(ItemPage {
        details,
        deliveries,
        author,
        standing,
        claim,
        decisions_before,
        older_decisions,
        signals,
    })
}

/// The signal values of the newest evaluation shown whose stored
/// snapshot carried any (its sync phase may have read none), and when it
/// was judged.
async fn signals_judged(
    state: &AppState,
    details: &ItemDetails,
) -> Result<Option<(Millis, crate::domain::signals::SignalValues)>, PageError> {
    let mut newest: Vec<(&str, i64, Millis)> = Vec::new();
    for d in details.decisions.iter().rev() {
        if let (Some(digest), Some(id)) = (d.snapshot_digest.as_deref(), d.snapshot_id)
            && !newest.iter().any(|(x, ..)| *x == digest)
        {
            newest.push((digest, id, d.created_at));
        }
        if newest.len() == 4 {
            break;
        }
    }
    if newest.is_empty() {
        return Ok(None);
    }
    let ids: Vec<i64> = newest.iter().map(|(_, id, _)| *id).collect();
    let docs = state.store.input_docs(&ids, &[]).await?;
    Ok(newest.into_iter().find_map(|(digest, _, at)| {
        let spec: gavel_plugin_sdk::spec::SnapshotSpec = serde_json::from_slice(docs.get(digest)?).ok()?;
        (!spec.signals.is_empty()).then_some((at, spec.signals))
    }))
}

/// The signals the item's newest stored evaluation read.
fn signals_panel(signals: &Option<(Millis, crate::domain::signals::SignalValues)>, now: Millis) -> Markup {
    html! {
        @if let Some((at, values)) = signals {
            h3 { "Signals" }
            p.hint { "as the rules read them, " (when(*at, now)) }
            ul #signals {
                @for (name, keys) in values {
                    li data-signal=(name) {
                        strong { (name) } ": "
                        @if keys.is_empty() { span.hint { "no key in this item" } }
                        @for (i, (key, value)) in keys.iter().enumerate() {
                            @if i > 0 { ", " }
                            code { (key) } " " span.value { (value) }
                        }
                    }
                }
            }
        }
    }
}

/// `GET /console/items/{id}`.
pub async fn item_page(
    State(state): State<AppState>,
    session: SignedIn,
    Path(id): Path<String>,
    Query(q): Query<ItemQuery>,
) -> Result<Response, PageError> {
    let before = q.decisions_before.as_deref().and_then(|b| b.parse::<i64>().ok());
    let page = load(&state, &id, before).await?;
    let flash = q.decided.is_some().then_some(Banner::Decided);
    Ok(render(&session, &page, &q.filters, flash, StatusCode::OK))
}

/// A message above the item.
enum Banner {
    Decided,
    /// The item changed since the page was rendered.
    Conflict,
    Refused(String),
}

fn render(
    session: &SignedIn,
    page: &ItemPage,
    filters: &Filters,
    banner: Option<Banner>,
    status: StatusCode,
) -> Response {
    let now = now_ms();
    let item = &page.details.item;
    let body = html! {
        main.item {
            @match &banner {
                Some(Banner::Decided) => p #flash.notice { "Decided." },
                Some(Banner::Conflict) => p #conflict.error {
                    "This item changed since you opened it: another moderator or a rule decided it. "
                    "Its current state is below; nothing of yours was applied."
                },
                Some(Banner::Refused(why)) => p #error.error { (why) },
                None => {},
            }
            h1 { "Item " code { (item.id) } }
            p.status {
                span #item-status.badge data-status=(item.status) data-version=(item.version) { (item.status) }
                " version " (item.version) " · " (item.kind) " · client " (item.client)
                @if let Some(e) = &item.external_id { " · external id " code { (e) } }
                " · received " (when(item.created_at, now))
            }
            @match &page.claim {
                Some(c) => p #claim data-moderator=(c.moderator) { "Claimed by " strong { (c.moderator) } " until " (layout::time(c.expires_at)) },
                None => p #claim { "Not claimed." },
            }
            div.columns {
                section.content {
                    h2 { "Content" }
                    pre #item-text { (item.body) }
                    (context(&item.context))
                    h3 { "Counters" }
                    ul #counters {
                        @for (name, value) in &page.details.counters { li { (name) ": " (value) } }
                        @if page.details.counters.is_empty() { li.hint { "no events yet" } }
                    }
                    (signals_panel(&page.signals, now))
                }
                (author_panel(&page.author, page.standing.as_ref(), &item.id, now))
            }
            (decision_bar(session, page, filters))
            h2 { "Timeline" }
            (decision_pages(page))
            (timeline(page, now))
        }
    };
    (status, page_shell(&format!("Item {}", item.id), Some(session), body)).into_response()
}

fn context(json: &str) -> Markup {
    let pairs: Vec<(String, String)> = serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(json)
        .map(|m| {
            m.into_iter()
                .map(|(k, v)| (k, v.as_str().map_or_else(|| v.to_string(), str::to_string)))
                .collect()
        })
        .unwrap_or_default();
    html! {
        h3 { "Context" }
        table #context { @for (k, v) in &pairs { tr { th { (k) } td { (v) } } } }
        @if pairs.is_empty() { p.hint { "none sent" } }
    }
}

/// `1 item`, `3 items`.
fn plural(n: i64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

fn author_panel(a: &AuthorSummary, standing: Option<&AuthorDetails>, current: &str, now: Millis) -> Markup {
    html! {
        aside #author-panel {
            h2 { "Author" }
            @if let Some(s) = standing {
                p #standing data-status=(s.record.status) {
                    "Account " strong { (s.record.status) } " · " (s.strikes.score) " strikes"
                    @if s.record.decided_by == Some(crate::domain::standing::AuthorActor::Moderator) {
                        " · set by a moderator"
                    }
                }
            }
            p { (plural(a.items, "item", "items")) " · " (a.rejected) " rejected · "
                (plural(a.reversals, "decision", "decisions")) " overturned by moderators" }
            ul {
                @for i in &a.recent {
                    li.recent data-status=(i.status) {
                        @if i.id == current { strong { "this item" } } @else {
                            a href={ "/console/items/" (encode(&i.id)) } { (excerpt(&i.body, 60)) }
                        }
                        " — " (i.status) " · " (layout::age(now - i.created_at)) " ago"
                    }
                }
            }
        }
    }
}

fn decision_bar(session: &SignedIn, page: &ItemPage, filters: &Filters) -> Markup {
    let item = &page.details.item;
    let id = encode(&item.id);
    let mine = page.claim.as_ref().is_some_and(|c| c.moderator == session.moderator);
    let theirs = page.claim.as_ref().filter(|c| c.moderator != session.moderator);
    let choices = [
        (ItemStatus::Visible, "Visible", "v"),
        (ItemStatus::HeldForReview, "Hold", "h"),
        (ItemStatus::Rejected, "Reject", "r"),
        (ItemStatus::Deleted, "Delete", "d"),
    ];
    html! {
        @if item.status != ItemStatus::Deleted {
            form #decide.decide method="post" action={ "/console/items/" (id) "/decide" }
                data-renew=[mine.then(|| format!("/console/items/{id}/claim"))] {
                input type="hidden" name="csrf" value=(session.csrf);
                input type="hidden" name="version" value=(item.version);
                (filters.hidden())
                fieldset {
                    legend { "Decision" }
                    @for (status, label, key) in choices {
                        label for={ "status-" (status) } {
                            input id={ "status-" (status) } type="radio" name="status" value=(status) required;
                            " " (label) " " kbd { (key) }
                        }
                    }
                }
                @if let Some(c) = theirs {
                    label.override for="override" {
                        input #override type="checkbox" name="override" value="1";
                        " Decide anyway: " strong { (c.moderator) } " is reviewing this item"
                    }
                }
                label for="reason" { "Reason (kept in the audit trail)" }
                textarea #reason name="reason" rows="2" maxlength="1024" required {}
                div.buttons {
                    button #submit type="submit" name="then" value="stay" { "Submit" kbd { "Ctrl+Enter" } }
                    button #submit-next.primary type="submit" name="then" value="next" { "Submit & next" kbd { "Ctrl+Shift+Enter" } }
                }
            }
        }
        @if item.status == ItemStatus::HeldForReview {
            form #skip method="post" action={ "/console/items/" (id) "/skip" } {
                input type="hidden" name="csrf" value=(session.csrf);
                (filters.hidden())
                button #skip-button type="submit" { "Skip" kbd { "s" } }
            }
        }
        p.hint { "Press " kbd { "?" } " for keyboard shortcuts." }
        aside #shortcuts hidden {
            h2 { "Keyboard shortcuts" }
            dl {
                dt { kbd { "v" } " " kbd { "h" } " " kbd { "r" } " " kbd { "d" } } dd { "choose visible, hold, reject or delete, and type the reason" }
                dt { kbd { "Ctrl+Enter" } } dd { "submit" }
                dt { kbd { "Ctrl+Shift+Enter" } } dd { "submit and open the next item" }
                dt { kbd { "s" } } dd { "skip this item (it goes to another moderator)" }
                dt { kbd { "Esc" } } dd { "leave the reason field" }
                dt { kbd { "?" } } dd { "show or hide this list" }
            }
        }
    }
}

/// Which decisions the timeline holds, with links to older and newest ones.
fn decision_pages(page: &ItemPage) -> Markup {
    let id = encode(&page.details.item.id);
    html! {
        p #decision-pages.hint {
            @if page.decisions_before.is_some() {
                "Older decisions. " a #newest-decisions href={ "/console/items/" (id) } { "Newest decisions" } " "
            } @else {
                "The latest " (PAGE_DECISIONS) " decisions at most. "
            }
            @if let Some(older) = page.older_decisions {
                a #older-decisions href={ "/console/items/" (id) "?decisions_before=" (older) } { "Older decisions" }
            }
        }
    }
}

/// One line of the timeline.
struct Entry {
    at: Millis,
    kind: &'static str,
    body: Markup,
}

fn timeline(page: &ItemPage, now: Millis) -> Markup {
    let d = &page.details;
    let mut entries: Vec<Entry> = Vec::new();
    for e in &d.events {
        entries.push(Entry {
            at: e.created_at,
            kind: "event",
            body: html! { "event #" (e.seq) ": " strong { (e.kind) } " by " (e.actor) },
        });
    }
    for x in &d.decisions {
        entries.push(Entry {
            at: x.created_at,
            kind: "decision",
            body: html! {
                strong { (x.plugin) } " " (x.plugin_version) " " code title=(x.plugin_digest) { (short(&x.plugin_digest)) }
                " (" (x.phase) ", " (x.mode) @if x.applied { ", applied" } "): "
                strong { @match x.verdict { Some(v) => (v), None => "no verdict" } }
                @if !x.reason.is_empty() { " — " (x.reason) }
                " · " (x.outcome) " in " (x.duration_us) " µs"
                @if !x.labels.is_empty() { " · labels " (x.labels.join(", ")) }
                @if !x.lists.is_empty() {
                    " · lists "
                    @for (i, l) in x.lists.iter().enumerate() {
                        @if i > 0 { ", " }
                        a.list-use href={ "/console/lists/" (super::queue::encode(&l.name)) } { (l.name) }
                        " v" (l.version) " " code title=(l.digest) { (short(&l.digest)) }
                    }
                }
                @if let Some(err) = &x.error { " · error: " (err) }
                @if let Some(r) = x.reversed_at { " · " span.reversed { "overturned " (layout::time(r)) } }
            },
        });
    }
    for t in &d.transitions {
        entries.push(Entry {
            at: t.created_at,
            kind: "transition",
            body: html! {
                (t.from_status) " → " strong { (t.to_status) } " (version " (t.version) ") by " (t.actor)
                @if let Some(n) = &t.actor_name { " " strong.actor { (n) } }
                @if let Some(n) = &t.actor_note { " (note: " (n) ")" }
                " · " (t.cause) @if !t.reason.is_empty() { " — " (t.reason) }
                " · " code.correlation { (t.correlation_id) }
            },
        });
    }
    for p in &d.provider_requests {
        entries.push(Entry {
            at: p.created_at,
            kind: "provider_request",
            body: html! {
                "asked " strong { (p.provider) } " (version " (p.item_version) "): " (p.status)
                " after " (p.attempts) " attempts"
                @if let Some(v) = p.answer { " · answered " strong { (v) } }
                @if let Some(e) = &p.last_error { " · last error: " (e) }
            },
        });
    }
    for c in &d.provider_callbacks {
        entries.push(Entry {
            at: c.received_at,
            kind: "provider_callback",
            body: html! { "callback from " strong { (c.provider) } " (" (c.event_id) "): " (c.outcome) @if !c.detail.is_empty() { " — " (c.detail) } },
        });
    }
    for w in &page.deliveries {
        entries.push(Entry {
            at: w.created_at,
            kind: "delivery",
            body: html! {
                "webhook " strong { (w.endpoint) } " of version " (w.item_version) ": " (w.status)
                " after " (w.attempts) " attempts"
                @if let Some(e) = &w.last_error { " · last error: " (e) }
            },
        });
    }
    entries.sort_by_key(|e| e.at);
    html! {
        ol #timeline {
            @for e in &entries {
                li.entry data-kind=(e.kind) { span.when { (when(e.at, now)) } " " span.kind { (e.kind.replace('_', " ")) } " " (e.body) }
            }
        }
    }
}

#[derive(Debug, Deserialize)]
pub struct DecideForm {
    csrf: Option<String>,
    #[serde(default)]
    version: String,
    #[serde(default)]
    status: String,
    #[serde(default)]
    reason: String,
    #[serde(default)]
    then: String,
    /// `1`: decide although another moderator holds the review claim.
    #[serde(default)]
    r#override: String,
    #[serde(flatten)]
    filters: Filters,
}

/// `POST /console/items/{id}/decide`: the same decision as
/// `POST /v1/items/{id}/moderation`, conditional on the version the page showed.
pub async fn decide(
    State(state): State<AppState>,
    session: SignedIn,
    Path(id): Path<String>,
    headers: HeaderMap,
    ConsoleForm(form): ConsoleForm<DecideForm>,
) -> Result<Response, PageError> {
    session.check_csrf(form.csrf.as_deref())?;
    let refuse = |why: &str| PageError::new(StatusCode::UNPROCESSABLE_ENTITY, why);
    let to: ItemStatus = form
        .status
        .parse()
        .ok()
        .filter(|s| may_set(*s))
        .ok_or_else(|| refuse("Choose visible, hold, reject or delete."))?;
    let reason = form.reason.trim();
    if reason.is_empty() || reason.chars().count() > 1024 || reason.contains('\0') {
        return Err(refuse("A reason of 1 to 1,024 characters is required."));
    }
    let version: i64 = crate::domain::parse_decimal(&form.version)
        .ok_or_else(|| PageError::new(StatusCode::BAD_REQUEST, "The form's item version is missing."))?;
    // A claim shares out work: deciding an item someone else is reviewing
    // takes an explicit "decide anyway" (the version check still decides
    // which decision lands).
    if form.r#override != "1"
        && let Some(c) = state.store.claim_of(&id).await?
        && c.moderator != session.moderator
    {
        let page = load(&state, &id, None).await?;
        let why = format!(
            "{} is reviewing this item. Tick \"Decide anyway\" to decide it yourself.",
            c.moderator
        );
        return Ok(render(
            &session,
            &page,
            &form.filters,
            Some(Banner::Refused(why)),
            StatusCode::CONFLICT,
        ));
    }
    let correlation_id = crate::api::request_id(&headers);
    let outcome = api_decide(
        &state,
        &Moderation {
            id: &id,
            to,
            if_match: Some(version),
            by: ManualActor::Moderator,
            name: &session.moderator,
            note: None,
            reason,
            correlation_id: &correlation_id,
            policy: None,
            until: None,
            appeal: None,
        },
    )
    .await?;
    let banner = match outcome {
        ModerationOutcome::Applied { .. } => {
            state.store.release_claim(&id, &session.moderator).await?;
            if form.then == "next" {
                return next_item(&state, &session, &form.filters).await;
            }
            return Ok(layout::see_other(&format!(
                "/console/items/{}?decided=1{}",
                encode(&id),
                form.filters.query().replacen('?', "&", 1)
            )));
        }
        ModerationOutcome::NotFound => return Err(PageError::new(StatusCode::NOT_FOUND, "No item has this id.")),
        ModerationOutcome::VersionMismatch { .. } | ModerationOutcome::AppealStale => Banner::Conflict,
        ModerationOutcome::Illegal { from } => Banner::Refused(format!("An item that is {from} cannot become {to}.")),
    };
    let page = load(&state, &id, None).await?;
    Ok(render(
        &session,
        &page,
        &form.filters,
        Some(banner),
        StatusCode::CONFLICT,
    ))
}

#[derive(Debug, Deserialize)]
pub struct SkipForm {
    csrf: Option<String>,
    #[serde(flatten)]
    filters: Filters,
}

/// `POST /console/items/{id}/skip`: this moderator passes; someone else gets it.
pub async fn skip(
    State(state): State<AppState>,
    session: SignedIn,
    Path(id): Path<String>,
    ConsoleForm(form): ConsoleForm<SkipForm>,
) -> Result<Response, PageError> {
    session.check_csrf(form.csrf.as_deref())?;
    state.store.skip(&id, &session.moderator).await?;
    next_item(&state, &session, &form.filters).await
}

/// `POST /console/items/{id}/claim` (the open page's heartbeat, CSRF token
/// in `X-CSRF-Token`): `{"claimed": true}` while the claim is this
/// moderator's, `false` once it is not (an answer, not an error: the page
/// just says so).
pub async fn renew_claim(
    State(state): State<AppState>,
    session: SignedIn,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<axum::Json<serde_json::Value>, PageError> {
    session.check_csrf(headers.get("x-csrf-token").and_then(|v| v.to_str().ok()))?;
    let claimed = state
        .store
        .renew_claim(&id, &session.moderator, state.config.console.claim_ttl_ms)
        .await?;
    Ok(axum::Json(serde_json::json!({ "claimed": claimed })))
}
