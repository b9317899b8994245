//! The review queue: what waits for a human, and "Start reviewing", which
//! claims the next item for the signed-in moderator.

use super::layout::{self, PageError, age, page_shell};
use super::session::{ConsoleForm, SignedIn};
use crate::api::AppState;
use crate::clock::now_ms;
use crate::store::{PAGE_ROWS, QueueFilter, QueueSort};
use axum::extract::{Query, State};
use axum::response::Response;
use maud::{Markup, html};
use serde::{Deserialize, Serialize};

/// The queue filters as they travel in query strings and forms: through
/// the queue page, "Start reviewing", and every item page of a review run,
/// so "submit & next" and "skip" keep to the same slice of the queue.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
pub struct Filters {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub label: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub plugin: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub author: String,
    /// `flags` for most flags first; anything else is oldest first.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sort: String,
}

impl Filters {
    /// The store's filter; blank fields match everything.
    pub fn to_store(&self) -> QueueFilter {
        let some = |s: &str| {
            let s = s.trim();
            (!s.is_empty()).then(|| s.chars().take(256).collect())
        };
        QueueFilter {
            kind: some(&self.kind),
            label: some(&self.label),
            plugin: some(&self.plugin),
            author: some(&self.author),
        }
    }

    pub fn sort(&self) -> QueueSort {
        if self.sort == "flags" {
            QueueSort::Flags
        } else {
            QueueSort::Oldest
        }
    }

    /// `?kind=...` (empty when no filter is set).
    pub fn query(&self) -> String {
        let q = serde_urlencoded::to_string(self).unwrap_or_default();
        if q.is_empty() { q } else { format!("?{q}") }
    }

    /// Hidden inputs carrying the filters in a form.
    pub fn hidden(&self) -> Markup {
        html! {
            @for (name, value) in [("kind", &self.kind), ("label", &self.label), ("plugin", &self.plugin), ("author", &self.author), ("sort", &self.sort)] {
                @if !value.is_empty() { input type="hidden" name=(name) value=(value); }
            }
        }
    }
}

#[derive(Debug, Default, Deserialize)]
pub struct QueueQuery {
    #[serde(flatten)]
    filters: Filters,
    /// A string: inside a flattened struct every query value arrives as one.
    #[serde(default)]
    page: Option<String>,
    #[serde(default)]
    empty: Option<String>,
}

/// `GET /console/queue`.
pub async fn queue_page(
    State(state): State<AppState>,
    session: SignedIn,
    Query(q): Query<QueueQuery>,
) -> Result<Response, PageError> {
    let now = now_ms();
    let sort = q.filters.sort();
    let page = i64::from(q.page.and_then(|p| p.parse::<u32>().ok()).unwrap_or(0).min(10_000));
    let filter = q.filters.to_store();
    let overview = state.store.queue_overview(now).await?;
    let rows = state.store.queue_page(&filter, sort, page).await?;
    let next_page = {
        let q = q.filters.query();
        let sep = if q.is_empty() { "?" } else { "&" };
        format!("/console/queue{q}{sep}page={}", page + 1)
    };
    let body = html! {
        main {
            h1 { "Review queue" }
            section #counts.counts {
                div { span.n data-count="held_for_review" { (overview.held) } " held for review" }
                div { span.n data-count="awaiting_provider" { (overview.awaiting_provider) } " awaiting a provider" }
                div #oldest { "oldest held: " @match overview.oldest_held_at { Some(t) => { (age(now - t)) }, None => { "—" } } }
                div { span.n data-count="decided_hour" { (overview.decided_hour) } " decided in the last hour" }
                div { span.n data-count="decided_day" { (overview.decided_day) } " in the last day" }
            }
            @if q.empty.is_some() {
                p #queue-empty.notice { "Nothing left to review here: every held item matching these filters is decided, claimed by someone else, or skipped by you." }
            }
            form #filters.filters method="get" action="/console/queue" {
                label { "kind " input name="kind" value=(q.filters.kind); }
                label { "label " input name="label" value=(q.filters.label); }
                label { "held by plugin " input name="plugin" value=(q.filters.plugin); }
                label { "author " input name="author" value=(q.filters.author); }
                label { "sort "
                    select name="sort" {
                        option value="oldest" selected[sort == QueueSort::Oldest] { "oldest first" }
                        option value="flags" selected[sort == QueueSort::Flags] { "most flags first" }
                    }
                }
                button type="submit" { "Filter" }
            }
            form #start-review method="post" action="/console/review/start" {
                input type="hidden" name="csrf" value=(session.csrf);
                (q.filters.hidden())
                button #start.primary type="submit" { "Start reviewing" }
                @if q.filters != Filters::default() { " " span.hint { "in this filtered order" } }
            }
            table #queue {
                thead { tr { th { "held" } th { "item" } th { "kind" } th { "author" } th { "flags" } th { "held by" } th { "claimed by" } } }
                tbody {
                    @for r in &rows {
                        tr data-item=(r.item.id) {
                            td { (age(now - r.item.updated_at)) }
                            td.text { a.open href={ "/console/items/" (encode(&r.item.id)) } { (excerpt(&r.item.body, 120)) } }
                            td { (r.item.kind) }
                            td { (r.item.author) }
                            td { (r.flags) }
                            td { (r.held_by.as_deref().unwrap_or("—")) }
                            td { (r.claimed_by.as_deref().unwrap_or("")) }
                        }
                    }
                }
            }
            @if rows.len() as i64 == PAGE_ROWS { p { a #next-page href=(next_page) { "Next page" } } }
        }
    };
    Ok(axum::response::IntoResponse::into_response(page_shell(
        "Queue",
        Some(&session),
        body,
    )))
}

/// The first `chars` characters of `text`, with `…` when cut.
pub fn excerpt(text: &str, chars: usize) -> String {
    let mut out: String = text.chars().take(chars).collect();
    if text.chars().nth(chars).is_some() {
        out.push('…');
    }
    out
}

#[derive(Debug, Deserialize)]
pub struct StartForm {
    csrf: Option<String>,
    #[serde(flatten)]
    filters: Filters,
}

/// `POST /console/review/start`: claims the next item.
pub async fn start_review(
    State(state): State<AppState>,
    session: SignedIn,
    ConsoleForm(form): ConsoleForm<StartForm>,
) -> Result<Response, PageError> {
    session.check_csrf(form.csrf.as_deref())?;
    next_item(&state, &session, &form.filters).await
}

/// Claims the next item of `filters` for the session's moderator and sends
/// the browser to it, or to the queue saying nothing is left.
pub async fn next_item(state: &AppState, session: &SignedIn, filters: &Filters) -> Result<Response, PageError> {
    let claimed = state
        .store
        .claim_next(
            &session.moderator,
            &filters.to_store(),
            filters.sort(),
            state.config.console.claim_ttl_ms,
        )
        .await?;
    Ok(match claimed {
        Some(id) => layout::see_other(&format!("/console/items/{}{}", encode(&id), filters.query())),
        None => {
            let q = filters.query();
            let sep = if q.is_empty() { "?" } else { "&" };
            layout::see_other(&format!("/console/queue{q}{sep}empty=1"))
        }
    })
}

/// An id as one path segment.
pub fn encode(id: &str) -> String {
    let mut out = String::with_capacity(id.len());
    for b in id.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_round_trip_through_a_query_string() {
        let f = Filters {
            kind: "post".into(),
            plugin: "link-spam".into(),
            ..Filters::default()
        };
        assert_eq!(f.query(), "?kind=post&plugin=link-spam");
        assert_eq!(Filters::default().query(), "");
        assert_eq!(f.to_store().kind.as_deref(), Some("post"));
        assert_eq!(f.to_store().label, None);
    }

    #[test]
    fn excerpts_and_path_segments() {
        assert_eq!(excerpt("héllo", 3), "hél…");
        assert_eq!(excerpt("abc", 3), "abc");
        assert_eq!(encode("a b/c"), "a%20b%2Fc");
    }
}
