//! The lists pages: every list, one list's entries (searchable, with add
//! and remove forms that require a reason) and its version history, and
//! the diff between two versions. Edits go through the same code as
//! `PATCH /v1/lists/{name}`: based on the version the page showed, so a
//! moderator who edits a list someone else changed meanwhile gets 409 and
//! nothing is written.

use super::layout::{PageError, page_shell, see_other, short, when};
use super::queue::encode;
use super::session::{ConsoleForm, SignedIn};
use crate::api::{ApiError, AppState, edit_entries};
use crate::clock::now_ms;
use crate::lists::{Entry, diff};
use crate::store::ListVersionRecord;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use maud::html;
use serde::Deserialize;

/// Entries shown on a list's page at most (a search narrows them).
const SHOWN_ENTRIES: usize = 500;
/// Versions shown in a list's history.
const SHOWN_VERSIONS: i64 = 50;

/// An API refusal as a console page: the same status and message.
fn refused(e: ApiError) -> PageError {
    PageError::new(e.status, &e.message)
}

/// `GET /console/lists`.
pub async fn lists_page(State(state): State<AppState>, session: SignedIn) -> Result<Response, PageError> {
    let now = now_ms();
    let lists = state.store.lists().await?;
    let served = state.lists.served();
    let body = html! {
        main {
            h1 { "Lists" }
            p.hint {
                "Terms, patterns, domains, strings and address ranges that rules consult. Every edit makes a new "
                "version with its digest; the version this process serves is shown beside the store's."
            }
            table #lists {
                thead { tr {
                    th { "list" } th { "kind" } th { "version" } th { "digest" } th { "entries" }
                    th { "last edit" } th { "served here" }
                } }
                tbody { @for l in &lists { tr data-list=(l.name) {
                    td { a href={ "/console/lists/" (encode(&l.name)) } { (l.name) } }
                    td { (l.kind) } td { (l.version) }
                    td { code title=(l.digest) { (short(&l.digest)) } }
                    td { (l.entry_count) }
                    td { (l.actor_name) ": " (l.reason) " " small { (when(l.created_at, now)) } }
                    td { @match served.get(&l.name) {
                        Some(s) if s.version == l.version => { "version " (s.version) }
                        Some(s) => { span.bad { "version " (s.version) } }
                        None => { span.bad { "not yet" } }
                    } }
                } } }
            }
            @if lists.is_empty() {
                p { "No lists yet. Create one with " code { "PUT /v1/lists/NAME" } " (see the README)." }
            }
        }
    };
    Ok(page_shell("Lists", Some(&session), body).into_response())
}

#[derive(Debug, Deserialize)]
pub struct ListQuery {
    #[serde(default)]
    q: String,
}

/// `GET /console/lists/{name}?q=`: the entries (those whose value or note
/// contains `q`), the add form and the history.
pub async fn list_page(
    State(state): State<AppState>,
    session: SignedIn,
    Path(name): Path<String>,
    Query(query): Query<ListQuery>,
) -> Result<Response, PageError> {
    let now = now_ms();
    let Some(content) = state.store.list_content(&name, None).await? else {
        return Err(PageError::new(StatusCode::NOT_FOUND, "No list has this name."));
    };
    let history = state.store.list_history(&name, None, SHOWN_VERSIONS).await?;
    let q: String = query.q.trim().chars().take(256).collect();
    let needle = q.to_lowercase();
    let matching: Vec<&Entry> = content
        .entries
        .iter()
        .filter(|e| {
            needle.is_empty()
                || e.value.to_lowercase().contains(&needle)
                || e.note.as_deref().is_some_and(|n| n.to_lowercase().contains(&needle))
        })
        .collect();
    let r = &content.record;
    let path = format!("/console/lists/{}", encode(&name));
    let body = html! {
        main {
            h1 { "List " code { (name) } }
            p #list-version data-version=(r.version) {
                (r.kind) " · version " (r.version) " · digest " code title=(r.digest) { (short(&r.digest)) }
                " · " (r.entry_count) " entries · last edit by " (r.actor_name) ", " (when(r.created_at, now))
            }
            h2 { "Add an entry" }
            form #add-entry method="post" action={ (path) "/add" } {
                input type="hidden" name="csrf" value=(session.csrf);
                input type="hidden" name="version" value=(r.version);
                label { "Entry " input type="text" name="value" required maxlength="1024"; }
                label { "Note on the entry " input type="text" name="note" maxlength="256"; }
                label { "Why (kept with the version) " input type="text" name="reason" required maxlength="1024"; }
                button type="submit" { "Add" }
            }
            h2 { "Entries" }
            form method="get" action=(path) {
                input type="search" name="q" value=(q) aria-label="Search entries" placeholder="search entries";
                button type="submit" { "Search" }
            }
            @if !q.is_empty() || matching.len() > SHOWN_ENTRIES {
                p.hint {
                    (matching.len()) " of " (content.entries.len()) " entries match"
                    @if matching.len() > SHOWN_ENTRIES { "; the first " (SHOWN_ENTRIES) " are shown" }
                    "."
                }
            }
            table #entries {
                thead { tr { th { "entry" } th { "note" } th { "remove (say why)" } } }
                tbody { @for e in matching.iter().take(SHOWN_ENTRIES) { tr data-entry=(e.value) {
                    td { code { (e.value) } }
                    td { (e.note.as_deref().unwrap_or("")) }
                    td {
                        form.inline.remove-entry method="post" action={ (path) "/remove" } {
                            input type="hidden" name="csrf" value=(session.csrf);
                            input type="hidden" name="version" value=(r.version);
                            input type="hidden" name="value" value=(e.value);
                            input type="text" name="reason" required maxlength="1024" aria-label="Why remove it";
                            button type="submit" { "Remove" }
                        }
                    }
                } } }
            }
            h2 { "Versions" }
            (history_table(&name, &history, now))
        }
    };
    Ok(page_shell(&format!("List {name}"), Some(&session), body).into_response())
}

fn history_table(name: &str, history: &[ListVersionRecord], now: i64) -> maud::Markup {
    html! {
        table #versions {
            thead { tr { th { "version" } th { "digest" } th { "entries" } th { "by" } th { "why" } th { "when" } th {} } }
            tbody { @for v in history { tr data-version=(v.version) {
                td { (v.version) }
                td { code title=(v.digest) { (short(&v.digest)) } }
                td { (v.entry_count) } td { (v.actor_name) } td { (v.reason) } td { (when(v.created_at, now)) }
                td { @if v.version > 1 {
                    a.diff href={ "/console/lists/" (encode(name)) "/diff?from=" (v.version - 1) "&to=" (v.version) } {
                        "changes"
                    }
                } }
            } } }
        }
    }
}

#[derive(Debug, Deserialize)]
pub struct DiffQuery {
    from: i64,
    to: i64,
}

/// `GET /console/lists/{name}/diff?from=&to=`.
pub async fn diff_page(
    State(state): State<AppState>,
    session: SignedIn,
    Path(name): Path<String>,
    Query(query): Query<DiffQuery>,
) -> Result<Response, PageError> {
    let load =
        |version: i64| {
            let (state, name) = (state.clone(), name.clone());
            async move {
                state.store.list_content(&name, Some(version)).await?.ok_or_else(|| {
                    PageError::new(StatusCode::NOT_FOUND, &format!("The list has no version {version}."))
                })
            }
        };
    let (from, to) = (load(query.from).await?, load(query.to).await?);
    let changes = diff(&from.entries, &to.entries);
    let note = |n: &Option<String>| n.clone().unwrap_or_default();
    let body = html! {
        main {
            h1 { "List " a href={ "/console/lists/" (encode(&name)) } { code { (name) } } ": version "
                (from.record.version) " → " (to.record.version) }
            p.hint { (to.record.actor_name) ": " (to.record.reason) }
            table #diff {
                thead { tr { th { "change" } th { "entry" } th { "note" } } }
                tbody {
                    @for e in &changes.added { tr.added { td { "added" } td { code { (e.value) } } td { (note(&e.note)) } } }
                    @for e in &changes.removed { tr.removed { td { "removed" } td { code { (e.value) } } td { (note(&e.note)) } } }
                    @for r in &changes.renoted { tr.renoted {
                        td { "note changed" } td { code { (r.value) } } td { (note(&r.from_note)) " → " (note(&r.to_note)) }
                    } }
                }
            }
            @if changes.added.is_empty() && changes.removed.is_empty() && changes.renoted.is_empty() { p { "No change." } }
        }
    };
    Ok(page_shell(&format!("List {name}"), Some(&session), body).into_response())
}

#[derive(Debug, Deserialize)]
pub struct EditForm {
    csrf: Option<String>,
    /// The version the page showed: the edit applies to it only.
    version: i64,
    value: String,
    #[serde(default)]
    note: String,
    #[serde(default)]
    reason: String,
}

/// `POST /console/lists/{name}/add`.
pub async fn add_entry(
    State(state): State<AppState>,
    session: SignedIn,
    Path(name): Path<String>,
    ConsoleForm(form): ConsoleForm<EditForm>,
) -> Result<Response, PageError> {
    session.check_csrf(form.csrf.as_deref())?;
    let note = Some(form.note.trim().to_string()).filter(|n| !n.is_empty());
    let entry = Entry {
        value: form.value,
        note,
    };
    edit(&state, &session, &name, form.version, vec![entry], &[], &form.reason).await
}

/// `POST /console/lists/{name}/remove`.
pub async fn remove_entry(
    State(state): State<AppState>,
    session: SignedIn,
    Path(name): Path<String>,
    ConsoleForm(form): ConsoleForm<EditForm>,
) -> Result<Response, PageError> {
    session.check_csrf(form.csrf.as_deref())?;
    edit(
        &state,
        &session,
        &name,
        form.version,
        Vec::new(),
        &[form.value],
        &form.reason,
    )
    .await
}

async fn edit(
    state: &AppState,
    session: &SignedIn,
    name: &str,
    version: i64,
    add: Vec<Entry>,
    remove: &[String],
    reason: &str,
) -> Result<Response, PageError> {
    let written = edit_entries(state, name, version, add, remove, reason, &session.moderator)
        .await
        .map_err(|e| match e.code {
            "version_mismatch" => PageError::new(
                StatusCode::CONFLICT,
                &format!(
                    "List {name} changed since this page showed version {version}: nothing was written. \
                     Reload the list and edit it again."
                ),
            ),
            _ => refused(e),
        })?;
    tracing::info!(list = %name, version = written.version, moderator = %session.moderator, "list edited in the console");
    Ok(see_other(&format!("/console/lists/{}", encode(name))))
}
