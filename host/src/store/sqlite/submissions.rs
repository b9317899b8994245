//! Submissions on the writer thread: each one decided and stored in a
//! savepoint of its own, so the duplicate count of a later submission in
//! the same transaction sees the earlier ones, and a submission that fails
//! rolls back alone.

use super::records;
use crate::domain::policy::{SubmissionInputs, submission};
use crate::domain::{Actor, ItemStatus};
use crate::store::shared::NewTransition;
use crate::store::{CreateOutcome, ItemWrite, StoreResult};
use rusqlite::{Connection, OptionalExtension, params};

/// Stores one submission: its key sealed, its external id checked, its
/// author's row upserted (the account state read with it), its duplicates
/// counted, its status decided by [`submission`], then the item, its
/// creation audit row (and outbox event), its sync decisions and the
/// stored response.
pub(super) fn create_item(conn: &Connection, w: &ItemWrite) -> StoreResult<CreateOutcome> {
    if let Some(k) = &w.key
        && !records::seal_key(conn, k)?
    {
        return Ok(CreateOutcome::KeyLost);
    }
    let it = &w.item;
    if let Some(ext) = &it.external_id
        && let Some(existing_id) = conn
            .prepare_cached("SELECT id FROM items WHERE client = ?1 AND external_id = ?2")?
            .query_row(params![it.client, ext], |r| r.get::<_, String>(0))
            .optional()?
    {
        if let Some(k) = &w.key {
            records::release_key(conn, k)?;
        }
        return Ok(CreateOutcome::DuplicateExternalId { existing_id });
    }
    // Upserted, then read: SQLite runs `RETURNING` through a temporary
    // table, opened and freed on every call, which costs more than the read.
    conn.prepare_cached(
        "INSERT INTO authors (client, author, first_seen, last_seen, status) VALUES (?1, ?2, ?3, ?3, ?4) \
         ON CONFLICT (client, author) DO UPDATE SET last_seen = excluded.last_seen",
    )?
    .execute(params![it.client, it.author, it.now, w.standing.initial()])?;
    let state: String = conn
        .prepare_cached("SELECT status FROM authors WHERE client = ?1 AND author = ?2")?
        .query_row(params![it.client, it.author], |r| r.get(0))?;
    let duplicates: i64 = conn
        .prepare_cached(
            "SELECT COUNT(*) FROM (SELECT 1 FROM items INDEXED BY items_client_fingerprint \
             WHERE client = ?1 AND author = ?2 AND fingerprint = ?3 \
             AND created_at >= ?4 LIMIT ?5)",
        )?
        .query_row(
            params![
                it.client,
                it.author,
                it.fingerprint,
                it.now - w.duplicates.window_ms,
                crate::store::HISTORY_CAP
            ],
            |r| r.get(0),
        )?;
    let decision = submission(&SubmissionInputs {
        sync_verdict: w.sync_verdict,
        sync_reason: w.sync_reason.clone(),
        duplicates,
        duplicate_hold_at: w.duplicates.hold_at,
        degraded: w.degraded,
        standing: w.standing.effect(&state),
    });
    let item = it.stored(&decision);
    conn.prepare_cached(
        "INSERT INTO items (id, client, external_id, kind, author, body, context, fingerprint, status, version, \
         decided_by, sync_verdict, needs_eval_since, created_at, updated_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)",
    )?
    .execute(params![
        item.id,
        item.client,
        item.external_id,
        item.kind,
        item.author,
        item.body,
        item.context,
        item.fingerprint,
        item.status.as_str(),
        item.version,
        item.decided_by.map(|a| a.as_str()),
        item.sync_verdict.map(|v| v.as_str()),
        item.needs_eval_since,
        item.created_at,
        item.updated_at,
    ])?;
    records::insert_transition(
        conn,
        &NewTransition {
            item_id: &item.id,
            from: ItemStatus::Received,
            to: item.status,
            version: 1,
            cause: decision.cause,
            actor: Actor::System,
            actor_name: None,
            actor_note: None,
            reason: &decision.reason,
            correlation_id: &it.correlation_id,
            now: item.created_at,
            policy: None,
            ends_at: None,
        },
    )?;
    records::insert_decisions(conn, &item.id, 1, &w.decisions)?;
    if let Some(k) = &w.key {
        records::store_response(conn, k, &(w.respond)(&item))?;
    }
    Ok(CreateOutcome::Created {
        item,
        cause: decision.cause,
    })
}
