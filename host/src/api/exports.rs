//! `GET /v1/exports/{table}`: the record as NDJSON or CSV, streamed page by
//! page in constant memory (see `crate::export`).

use super::AppState;
use super::auth::Moderator;
use super::error::{ApiError, ErrorBody, Path, Query};
use crate::export::{self, Format};
use crate::store::{ExportFilter, ExportTable};
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use std::io::{self, Write};
use std::sync::{Arc, Mutex};
use utoipa::IntoParams;

/// The header an export of a log answers with: the cursor it ends with,
/// known before the first row (the log's horizon).
pub const CURSOR_HEADER: &str = "gavel-export-cursor";

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct ExportQuery {
    /// `ndjson` (default) or `csv`; Parquet is `gavel export --format parquet`.
    pub format: Option<Format>,
    /// Rows from this time on, ms since the epoch (by `created_at`; authors by `last_seen`).
    pub since: Option<i64>,
    /// Rows before this time, ms since the epoch.
    pub until: Option<i64>,
    /// Only this client's rows.
    pub client: Option<String>,
    /// Continue behind this cursor: the `gavel-export-cursor` of an earlier
    /// export, or the last row's key (a decision's or transition's `id`, an
    /// item's `id`, an author as `["CLIENT","AUTHOR"]`) to resume one that
    /// was cut off.
    pub after: Option<String>,
}

/// The record for a warehouse: decisions, transitions, items or authors,
/// one row per line (NDJSON) or a CSV with a header, streamed. The
/// columns are documented in the README ("Exports"). Decisions and
/// transitions are logs: the `gavel-export-cursor` header gives the cursor
/// the export ends with; `after` it, the next export misses and repeats
/// nothing, whatever was written meanwhile.
#[utoipa::path(
    get, path = "/v1/exports/{table}", tag = "moderator",
    params(("table" = String, Path, description = "decisions, transitions, items or authors"), ExportQuery),
    responses(
        (status = 200, content((String = "application/x-ndjson"), (String = "text/csv")),
         headers(("gavel-export-cursor" = String, description = "decisions and transitions: where the next export continues"))),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 503, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn export(
    State(state): State<AppState>,
    _moderator: Moderator,
    Path(table): Path<String>,
    Query(q): Query<ExportQuery>,
) -> Result<Response, ApiError> {
    let table: ExportTable = table
        .parse()
        .map_err(|e: String| ApiError::new(StatusCode::NOT_FOUND, "not_found", e))?;
    let format = q.format.unwrap_or(Format::Ndjson);
    if format == Format::Parquet {
        return Err(ApiError::bad_request(
            "invalid_query",
            "Parquet is written by `gavel export --format parquet`; this route streams ndjson or csv",
        ));
    }
    let filter = ExportFilter {
        since: q.since.unwrap_or(i64::MIN),
        until: q.until.unwrap_or(i64::MAX),
        client: q.client.clone(),
    };
    if filter.since >= filter.until {
        return Err(ApiError::bad_request("invalid_query", "`since` must be before `until`"));
    }
    if let Some(client) = &filter.client {
        super::validate::identifier("client", client, 256)?;
    }
    let after = export::parse_cursor(table, q.after.as_deref().unwrap_or(""))
        .map_err(|e| ApiError::bad_request("invalid_cursor", e))?;
    let mut run = export::Export::start(state.store.clone(), table, filter, after).await?;
    let cursor = table.is_log().then(|| export::cursor_text(&run.final_cursor()));
    let buffer = Buffer::default();
    let mut writer = export::writer(format, table, buffer.clone()).expect("a CSV header or nothing, written to memory");
    // Two pages in flight at most: a slow reader holds the export back
    // instead of the process buffering it.
    let (tx, rx) = tokio::sync::mpsc::channel::<io::Result<Bytes>>(2);
    tokio::spawn(async move {
        loop {
            let more = run.next_page(writer.as_mut()).await;
            let flushed = writer.flush();
            let chunk = match (more, flushed) {
                (Ok(more), Ok(())) => Ok((more, buffer.take())),
                (Err(e), _) => Err(io::Error::other(e.to_string())),
                (_, Err(e)) => Err(e),
            };
            match chunk {
                Ok((more, bytes)) => {
                    if !bytes.is_empty() && tx.send(Ok(bytes)).await.is_err() {
                        return; // The client went away.
                    }
                    if !more {
                        return;
                    }
                }
                Err(e) => {
                    // Cut the body off: the client sees an incomplete
                    // response, never a short one that looks whole.
                    tracing::warn!(error = %e, table = table.as_str(), "export failed mid-way");
                    let _ = tx.send(Err(e)).await;
                    return;
                }
            }
        }
    });
    let body = Body::from_stream(futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|chunk| (chunk, rx))
    }));
    let mut response = ([(header::CONTENT_TYPE, format.content_type())], body).into_response();
    if let Some(cursor) = cursor.and_then(|c| HeaderValue::from_str(&c).ok()) {
        response.headers_mut().insert(CURSOR_HEADER, cursor);
    }
    Ok(response)
}

/// What the writer wrote since the last page was sent.
#[derive(Clone, Default)]
struct Buffer(Arc<Mutex<Vec<u8>>>);

impl Buffer {
    fn take(&self) -> Bytes {
        Bytes::from(std::mem::take(&mut *self.0.lock().expect("no panic holds the buffer")))
    }
}

impl Write for Buffer {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.0
            .lock()
            .expect("no panic holds the buffer")
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
