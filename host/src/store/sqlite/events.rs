//! Events on the writer thread: each event bumps its item's sequence (the
//! number it gets), marks the item for evaluation, is inserted with that
//! number and counted, with its key's response. This is the one place
//! SQLite appends events, so it is the one place that counts them
//! (migrations/sqlite/0072_events_counted_by_the_writer.sql).

use super::records;
use crate::store::{EventAppended, EventOutcome, EventWrite, StoreResult};
use rusqlite::{CachedStatement, Connection, OptionalExtension, params};

/// Appends the events of one write. Its statements are taken from the
/// connection's cache once for the whole write, not once per event:
/// finding a statement in the cache (hashing its text) and handing it back
/// (resetting it, clearing its bindings) cost a tenth of the writer's time
/// under batches of a thousand events.
pub(super) struct Appender<'c> {
    conn: &'c Connection,
    bump: CachedStatement<'c>,
    read: CachedStatement<'c>,
    mark: CachedStatement<'c>,
    insert: CachedStatement<'c>,
    count: CachedStatement<'c>,
}

impl<'c> Appender<'c> {
    pub(super) fn new(conn: &'c Connection) -> StoreResult<Self> {
        Ok(Appender {
            conn,
            // Bumped, then read: SQLite runs `RETURNING` through a temporary
            // table, opened and freed on every call, which costs more than
            // the read.
            bump: conn.prepare_cached(
                "UPDATE items SET event_seq = event_seq + 1 \
                 WHERE id = ?1 AND status <> 'deleted' AND (?2 IS NULL OR client = ?2)",
            )?,
            read: conn.prepare_cached("SELECT event_seq, needs_eval_since FROM items WHERE id = ?1")?,
            mark: conn.prepare_cached("UPDATE items SET needs_eval_since = ?2 WHERE id = ?1")?,
            insert: conn.prepare_cached(
                "INSERT INTO events (item_id, seq, kind, actor, payload, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )?,
            count: conn.prepare_cached(
                "INSERT INTO counters (item_id, name, value) VALUES (?1, ?2, 1) \
                 ON CONFLICT (item_id, name) DO UPDATE SET value = value + 1",
            )?,
        })
    }

    /// Appends one event.
    pub(super) fn append(&mut self, w: &EventWrite) -> StoreResult<EventOutcome> {
        let conn = self.conn;
        if let Some(k) = &w.key
            && !records::seal_key(conn, k)?
        {
            return Ok(EventOutcome::KeyLost);
        }
        let e = &w.event;
        let bumped: Option<(i64, Option<i64>)> = match self.bump.execute(params![e.item_id, e.owner])? {
            0 => None,
            _ => Some(
                self.read
                    .query_row(params![e.item_id], |r| Ok((r.get(0)?, r.get(1)?)))?,
            ),
        };
        let Some((seq, since)) = bumped else {
            if let Some(k) = &w.key {
                records::release_key(conn, k)?;
            }
            let client: Option<String> = conn
                .prepare_cached("SELECT client FROM items WHERE id = ?1")?
                .query_row(params![e.item_id], |r| r.get(0))
                .optional()?;
            // Another client's item is not there for this one.
            let visible = client.is_some_and(|c| e.owner.as_ref().is_none_or(|o| *o == c));
            return Ok(if visible {
                EventOutcome::Deleted
            } else {
                EventOutcome::NotFound
            });
        };
        // Marked for evaluation only if it was not already: an `UPDATE` that
        // names `needs_eval_since` rewrites its index entry even when the
        // value stays, and an item takes many events while it waits.
        let since = match since {
            Some(since) => since,
            None => {
                self.mark.execute(params![e.item_id, e.now])?;
                e.now
            }
        };
        if let Some(text) = &e.text {
            // The content changed: a provider's answer no longer holds.
            conn.prepare_cached(
                "UPDATE items SET body = ?2, fingerprint = ?3, content_version = content_version + 1 WHERE id = ?1",
            )?
            .execute(params![e.item_id, text, e.fingerprint.as_deref().unwrap_or_default()])?;
        }
        self.insert
            .execute(params![e.item_id, seq, e.kind.as_str(), e.actor, e.text, e.now])?;
        self.count.execute(params![e.item_id, e.kind.as_str()])?;
        let appended = EventAppended {
            item_id: e.item_id.clone(),
            event_seq: seq,
            needs_eval_since: since,
        };
        if let Some(k) = &w.key {
            records::store_response(conn, k, &(w.respond)(&appended))?;
        }
        Ok(EventOutcome::Appended(appended))
    }
}
