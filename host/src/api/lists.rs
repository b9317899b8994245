//! Lists moderators edit (`/v1/lists`): read them, replace one atomically
//! (`PUT`), add and remove entries (`PATCH`), page through the versions and
//! compare two. Every edit names the version it is based on (`If-Match`);
//! on a mismatch nothing is written and the answer is 409. An edit is
//! checked and compiled before it is written, so no stored version fails
//! to compile, and this process serves it before it answers.

use super::AppState;
use super::auth::Moderator;
use super::error::{ApiError, ErrorBody, Json, Path, Query};
use super::moderation::if_match;
use super::validate;
use crate::lists::{CompiledList, Diff, Entry, EntryError, ListKind, Served, ServedLists, diff};
use crate::store::{ListContent, ListVersionRecord, ListWrite, NewListVersion};
use axum::extract::{FromRequest, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;
use utoipa::{IntoParams, ToSchema};

/// What a list name may be: lowercase letters, digits, `.`, `_` and `-`,
/// starting with a letter or digit, at most 64 characters.
pub(super) const LIST_NAME_PATTERN: &str = "^[a-z0-9][a-z0-9._-]{0,63}$";

/// Characters of an edit's reason.
const MAX_REASON_CHARS: usize = 1024;

/// The whole new content of a list.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReplaceListRequest {
    /// Fixed when the list is created.
    pub kind: ListKind,
    /// Why; kept with the version (required).
    #[schema(min_length = 1, max_length = 1024)]
    pub reason: String,
    pub entries: Vec<Entry>,
}

/// Entries to add (or re-note, when listed already) and to remove.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PatchListRequest {
    /// Why; kept with the version (required).
    #[schema(min_length = 1, max_length = 1024)]
    pub reason: String,
    #[serde(default)]
    pub add: Vec<Entry>,
    /// Values to remove, as listed or in any form that normalises to one.
    #[serde(default)]
    pub remove: Vec<String>,
}

/// A list at one version, without its entries.
#[derive(Debug, Serialize, ToSchema)]
pub struct ListSummary {
    pub name: String,
    pub kind: ListKind,
    pub version: i64,
    /// sha256 of the canonical entries.
    pub digest: String,
    pub entry_count: i64,
    /// The moderator token that made this version, why, and when.
    pub updated_by: String,
    pub reason: String,
    pub updated_at: i64,
    /// The version this process serves (the store's, once propagated).
    pub served: Option<Served>,
}

/// A list at one version, with its entries in canonical order.
#[derive(Debug, Serialize, ToSchema)]
pub struct ListView {
    #[serde(flatten)]
    pub summary: ListSummary,
    pub entries: Vec<Entry>,
}

/// Every list.
#[derive(Debug, Serialize, ToSchema)]
pub struct ListsView {
    pub lists: Vec<ListSummary>,
}

/// A page of a list's versions, newest first.
#[derive(Debug, Serialize, ToSchema)]
pub struct VersionsPage {
    pub versions: Vec<ListVersionRecord>,
    /// Pass as `before` for the next page; absent on the last.
    pub next_before: Option<i64>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct VersionsQuery {
    /// Only versions older than this one.
    #[param(minimum = 1)]
    pub before: Option<i64>,
    /// At most this many (default 50).
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<i64>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct DiffQuery {
    #[param(minimum = 1)]
    pub from: i64,
    #[param(minimum = 1)]
    pub to: i64,
}

/// One side of a diff.
#[derive(Debug, Serialize, ToSchema)]
pub struct VersionRef {
    pub version: i64,
    pub digest: String,
}

/// What changed from one version of a list to another.
#[derive(Debug, Serialize, ToSchema)]
pub struct DiffView {
    pub name: String,
    pub from: VersionRef,
    pub to: VersionRef,
    #[serde(flatten)]
    pub changes: Diff,
}

fn summary(r: ListVersionRecord, served: Option<Served>) -> ListSummary {
    ListSummary {
        name: r.name,
        kind: r.kind,
        version: r.version,
        digest: r.digest,
        entry_count: r.entry_count,
        updated_by: r.actor_name,
        reason: r.reason,
        updated_at: r.created_at,
        served,
    }
}

fn view(c: ListContent, lists: &ServedLists) -> ListView {
    let served = lists.served().remove(&c.record.name);
    ListView {
        summary: summary(c.record, served),
        entries: c.entries,
    }
}

/// A JSON answer with the version as its `ETag` (what `If-Match` takes).
fn with_etag(version: i64, body: impl Serialize) -> Response {
    let mut r = Json(body).into_response();
    r.headers_mut().insert(
        header::ETAG,
        HeaderValue::from_str(&format!("\"{version}\"")).expect("digits are a valid header"),
    );
    r
}

fn check_name(name: &str) -> Result<(), ApiError> {
    if crate::lists::valid_name(name) {
        Ok(())
    } else {
        Err(ApiError::bad_request(
            "invalid_path",
            "a list name is 1-64 characters: lowercase letters, digits, `.`, `_` and `-`, starting with a letter or digit",
        ))
    }
}

fn check_reason(reason: &str) -> Result<(), ApiError> {
    validate::text("reason", reason, MAX_REASON_CHARS)?;
    if reason.trim().is_empty() {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_reason",
            "reason: say why the list changes",
        ));
    }
    Ok(())
}

/// A refused entry: 413 for too many, 422 for a bad one (named).
pub(super) fn entry_error(e: EntryError) -> ApiError {
    match e {
        EntryError::TooMany { .. } => ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "list_too_large", e.to_string()),
        EntryError::Invalid { .. } => ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_entry", e.to_string()),
    }
}

/// Canonical entries, their digest and their compiled matcher, or the
/// entry refused ([`crate::lists::check`]). Compiling may take a while (a
/// big pattern set), so it runs off the async threads.
async fn prepare(
    lists: &Arc<ServedLists>,
    name: &str,
    kind: ListKind,
    entries: Vec<Entry>,
) -> Result<crate::lists::Checked, ApiError> {
    let lists = lists.clone();
    let name = name.to_string();
    tokio::task::spawn_blocking(move || crate::lists::check(&name, kind, entries, lists.limits()).map_err(entry_error))
        .await
        .expect("checking a list does not panic")
}

/// Writes a prepared version and serves it here once written.
async fn store_version(
    state: &AppState,
    edit: NewListVersion<'_>,
    mut compiled: CompiledList,
) -> Result<ListSummary, ApiError> {
    let created = edit.if_match.is_none();
    let outcome = state.store.write_list(&edit).await?;
    let version = match outcome {
        ListWrite::Written { version } => version,
        ListWrite::VersionMismatch { current: Some(current) } if created => {
            return Err(ApiError::conflict(
                "version_mismatch",
                format!(
                    "list {} exists at version {current}; send `If-Match: {current}` to replace it",
                    edit.name
                ),
            ));
        }
        ListWrite::VersionMismatch { current: Some(current) } => {
            return Err(ApiError::conflict(
                "version_mismatch",
                format!(
                    "list {} is at version {current}, not the version in If-Match",
                    edit.name
                ),
            ));
        }
        ListWrite::VersionMismatch { current: None } => return Err(ApiError::not_found("list")),
        ListWrite::KindMismatch { current } => {
            return Err(ApiError::conflict(
                "kind_mismatch",
                format!("list {} holds {current}, not {}", edit.name, edit.kind),
            ));
        }
        ListWrite::TooManyLists => {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "too_many_lists",
                format!(
                    "this deployment has {} lists already (`lists.max_lists`)",
                    edit.max_lists
                ),
            ));
        }
    };
    compiled.version = version;
    state.lists.install(Arc::new(compiled));
    let record = ListVersionRecord {
        name: edit.name.to_string(),
        kind: edit.kind,
        version,
        digest: edit.digest.to_string(),
        entry_count: edit.entries.len() as i64,
        actor_name: edit.actor_name.to_string(),
        reason: edit.reason.to_string(),
        created_at: edit.now,
    };
    let served = state.lists.served().remove(edit.name);
    Ok(summary(record, served))
}

/// [`store_version`] answered: 201 for a new list, else 200, with the
/// version as `ETag`.
async fn write(state: &AppState, edit: NewListVersion<'_>, compiled: CompiledList) -> Result<Response, ApiError> {
    let created = edit.if_match.is_none();
    let written = store_version(state, edit, compiled).await?;
    let mut response = with_etag(written.version, written);
    if created {
        *response.status_mut() = StatusCode::CREATED;
    }
    Ok(response)
}

/// A JSON body under `lists.max_body_bytes` (a list is bigger than the
/// items `ingest.max_body_bytes` is sized for).
pub struct ListBody<T>(pub T);

impl<T: serde::de::DeserializeOwned> FromRequest<AppState> for ListBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        let limit = state.config.lists.max_body_bytes;
        let (parts, body) = req.into_parts();
        let bytes = axum::body::to_bytes(body, limit).await.map_err(|_| {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body_too_large",
                format!("request body is over `lists.max_body_bytes` ({limit} bytes) or broken off"),
            )
        })?;
        let req = Request::from_parts(parts, axum::body::Body::from(bytes));
        let Json(value) = Json::<T>::from_request(req, state).await?;
        Ok(ListBody(value))
    }
}

/// Every list at its current version, with the version this process serves.
#[utoipa::path(
    get, path = "/v1/lists", tag = "lists",
    responses((status = 200, body = ListsView)),
    security(("bearer" = []))
)]
pub async fn list_all(State(state): State<AppState>, _moderator: Moderator) -> Result<Json<ListsView>, ApiError> {
    let mut served: BTreeMap<String, Served> = state.lists.served();
    let lists = state
        .store
        .lists()
        .await?
        .into_iter()
        .map(|r| {
            let s = served.remove(&r.name);
            summary(r, s)
        })
        .collect();
    Ok(Json(ListsView { lists }))
}

/// A list at its current version, with its entries. `ETag` is the version.
#[utoipa::path(
    get, path = "/v1/lists/{name}", tag = "lists",
    params(("name" = String, Path)),
    responses((status = 200, body = ListView), (status = 404, body = ErrorBody)),
    security(("bearer" = []))
)]
pub async fn get_list(
    State(state): State<AppState>,
    _moderator: Moderator,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    check_name(&name)?;
    let content = state
        .store
        .list_content(&name, None)
        .await?
        .ok_or_else(|| ApiError::not_found("list"))?;
    let version = content.record.version;
    Ok(with_etag(version, view(content, &state.lists)))
}

/// A list at one of its versions, with its entries.
#[utoipa::path(
    get, path = "/v1/lists/{name}/versions/{version}", tag = "lists",
    params(("name" = String, Path), ("version" = i64, Path, minimum = 1)),
    responses((status = 200, body = ListView), (status = 404, body = ErrorBody)),
    security(("bearer" = []))
)]
pub async fn get_version(
    State(state): State<AppState>,
    _moderator: Moderator,
    Path((name, version)): Path<(String, i64)>,
) -> Result<Json<ListView>, ApiError> {
    check_name(&name)?;
    let content = state
        .store
        .list_content(&name, Some(version))
        .await?
        .ok_or_else(|| ApiError::not_found("list version"))?;
    Ok(Json(view(content, &state.lists)))
}

/// Creates a list, or replaces all its entries at once. Without
/// `If-Match` the list must not exist yet; with it, the list must be at
/// that version (else 409, nothing written).
#[utoipa::path(
    put, path = "/v1/lists/{name}", tag = "lists",
    request_body = ReplaceListRequest,
    params(("name" = String, Path), ("If-Match" = Option<String>, Header, description = "the list version the edit is based on, bare or quoted; absent, the list is created", pattern = r#"^([0-9]{1,18}|"[0-9]{1,18}")$"#)),
    responses(
        (status = 200, body = ListSummary, description = "replaced"), (status = 201, body = ListSummary, description = "created"),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 413, body = ErrorBody),
        (status = 422, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn replace(
    State(state): State<AppState>,
    Moderator(caller): Moderator,
    Path(name): Path<String>,
    headers: HeaderMap,
    ListBody(req): ListBody<ReplaceListRequest>,
) -> Result<Response, ApiError> {
    check_name(&name)?;
    let if_match = if_match(&headers, "list")?;
    check_reason(&req.reason)?;
    let crate::lists::Checked {
        entries,
        digest,
        compiled,
    } = prepare(&state.lists, &name, req.kind, req.entries).await?;
    let edit = NewListVersion {
        name: &name,
        kind: req.kind,
        if_match,
        entries: &entries,
        digest: &digest,
        actor_name: &caller.name,
        reason: &req.reason,
        max_lists: state.config.lists.max_lists,
        now: crate::clock::now_ms(),
    };
    write(&state, edit, compiled).await
}

/// Adds and removes entries. `If-Match` is required: the edit applies to
/// that version only (else 409, nothing written).
#[utoipa::path(
    patch, path = "/v1/lists/{name}", tag = "lists",
    request_body = PatchListRequest,
    params(("name" = String, Path), ("If-Match" = String, Header, description = "the list version the edit is based on, bare or quoted", pattern = r#"^([0-9]{1,18}|"[0-9]{1,18}")$"#)),
    responses(
        (status = 200, body = ListSummary), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
        (status = 413, body = ErrorBody), (status = 422, body = ErrorBody), (status = 428, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn patch(
    State(state): State<AppState>,
    Moderator(caller): Moderator,
    Path(name): Path<String>,
    headers: HeaderMap,
    ListBody(req): ListBody<PatchListRequest>,
) -> Result<Response, ApiError> {
    check_name(&name)?;
    let Some(if_match) = if_match(&headers, "list")? else {
        return Err(ApiError::new(
            StatusCode::PRECONDITION_REQUIRED,
            "if_match_required",
            "send `If-Match: VERSION`, the list version the edit is based on",
        ));
    };
    let written = edit_entries(&state, &name, if_match, req.add, &req.remove, &req.reason, &caller.name).await?;
    Ok(with_etag(written.version, written))
}

/// Adds and removes entries of list `name`, at version `if_match` only
/// (else 409, nothing written), as `actor` for `reason`: what `PATCH`
/// does, and the console's add and remove.
pub(crate) async fn edit_entries(
    state: &AppState,
    name: &str,
    if_match: i64,
    add: Vec<Entry>,
    remove: &[String],
    reason: &str,
    actor: &str,
) -> Result<ListSummary, ApiError> {
    check_name(name)?;
    check_reason(reason)?;
    let current = state
        .store
        .list_content(name, None)
        .await?
        .ok_or_else(|| ApiError::not_found("list"))?;
    if current.record.version != if_match {
        return Err(ApiError::conflict(
            "version_mismatch",
            format!(
                "list {name} is at version {}, not the version in If-Match",
                current.record.version
            ),
        ));
    }
    let kind = current.record.kind;
    let entries = apply_patch(kind, current.entries, add, remove).map_err(entry_error)?;
    let crate::lists::Checked {
        entries,
        digest,
        compiled,
    } = prepare(&state.lists, name, kind, entries).await?;
    let edit = NewListVersion {
        name,
        kind,
        if_match: Some(if_match),
        entries: &entries,
        digest: &digest,
        actor_name: actor,
        reason,
        max_lists: state.config.lists.max_lists,
        now: crate::clock::now_ms(),
    };
    store_version(state, edit, compiled).await
}

/// `current` (canonical) without `remove` and with `add`: an added value
/// listed already takes the new note. Removing a value not listed is
/// refused, naming it.
fn apply_patch(
    kind: ListKind,
    current: Vec<Entry>,
    add: Vec<Entry>,
    remove: &[String],
) -> Result<Vec<Entry>, EntryError> {
    let mut entries: BTreeMap<String, Option<String>> = current.into_iter().map(|e| (e.value, e.note)).collect();
    for value in remove {
        let key = crate::lists::normalise(kind, value).map_err(|p| EntryError::Invalid {
            value: value.clone(),
            problem: p,
        })?;
        if entries.remove(&key).is_none() {
            return Err(EntryError::Invalid {
                value: value.clone(),
                problem: "is not in the list".into(),
            });
        }
    }
    // Added entries are checked (and normalised) with the rest by `canonical`.
    let replaced: std::collections::HashSet<String> = add
        .iter()
        .filter_map(|e| crate::lists::normalise(kind, &e.value).ok())
        .collect();
    let mut out: Vec<Entry> = Vec::with_capacity(entries.len() + add.len());
    out.extend(
        entries
            .into_iter()
            .filter(|(value, _)| !replaced.contains(value))
            .map(|(value, note)| Entry { value, note }),
    );
    out.extend(add);
    Ok(out)
}

/// A page of a list's versions, newest first: who made each, why, when,
/// and its digest.
#[utoipa::path(
    get, path = "/v1/lists/{name}/versions", tag = "lists",
    params(("name" = String, Path), VersionsQuery),
    responses((status = 200, body = VersionsPage), (status = 404, body = ErrorBody)),
    security(("bearer" = []))
)]
pub async fn versions(
    State(state): State<AppState>,
    _moderator: Moderator,
    Path(name): Path<String>,
    Query(q): Query<VersionsQuery>,
) -> Result<Json<VersionsPage>, ApiError> {
    check_name(&name)?;
    let limit = q.limit.unwrap_or(50);
    if !(1..=500).contains(&limit) || q.before.is_some_and(|b| b < 1) {
        return Err(ApiError::bad_request(
            "invalid_query",
            "`limit` is 1-500 and `before` a version (1 or more)",
        ));
    }
    let versions = state.store.list_history(&name, q.before, limit).await?;
    if versions.is_empty() && state.store.list_content(&name, None).await?.is_none() {
        return Err(ApiError::not_found("list"));
    }
    let next_before = (versions.len() as i64 == limit)
        .then(|| versions.last().map(|v| v.version))
        .flatten()
        .filter(|v| *v > 1);
    Ok(Json(VersionsPage { versions, next_before }))
}

/// What changed between two versions of a list: entries added, removed,
/// and whose note changed.
#[utoipa::path(
    get, path = "/v1/lists/{name}/diff", tag = "lists",
    params(("name" = String, Path), DiffQuery),
    responses((status = 200, body = DiffView), (status = 404, body = ErrorBody)),
    security(("bearer" = []))
)]
pub async fn compare(
    State(state): State<AppState>,
    _moderator: Moderator,
    Path(name): Path<String>,
    Query(q): Query<DiffQuery>,
) -> Result<Json<DiffView>, ApiError> {
    check_name(&name)?;
    let load = |version| {
        let state = state.clone();
        let name = name.clone();
        async move {
            state
                .store
                .list_content(&name, Some(version))
                .await?
                .ok_or_else(|| ApiError::not_found(&format!("version {version} of the list")))
        }
    };
    let (from, to) = (load(q.from).await?, load(q.to).await?);
    Ok(Json(DiffView {
        name,
        changes: diff(&from.entries, &to.entries),
        from: VersionRef {
            version: from.record.version,
            digest: from.record.digest,
        },
        to: VersionRef {
            version: to.record.version,
            digest: to.record.digest,
        },
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lists::canonical;

    #[test]
    fn a_patch_removes_by_any_spelling_and_renotes_on_add() {
        let current = vec![Entry::new("crypto"), Entry::new("free money")];
        let add = vec![Entry {
            value: "Crypto".into(),
            note: Some("again".into()),
        }];
        let out = apply_patch(ListKind::Terms, current.clone(), add, &["FREE money!".into()]).unwrap();
        let out = canonical(ListKind::Terms, out, &Default::default()).unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].value, "crypto");
        assert_eq!(out[0].note.as_deref(), Some("again"));
        let e = apply_patch(ListKind::Terms, current, vec![], &["absent".into()]).unwrap_err();
        assert_eq!(e.to_string(), r#"entry "absent": is not in the list"#);
    }

    #[test]
    fn list_names_follow_their_pattern() {
        let pattern = regex::Regex::new(LIST_NAME_PATTERN).unwrap();
        for name in ["banned-terms", "a", "url.shorteners_2", &"x".repeat(64)] {
            assert!(check_name(name).is_ok() && pattern.is_match(name), "{name}");
        }
        for name in ["", "-a", "A", "a b", "a/b", &"x".repeat(65), "é"] {
            assert!(check_name(name).is_err() && !pattern.is_match(name), "{name}");
        }
    }
}
