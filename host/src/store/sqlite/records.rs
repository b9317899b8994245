//! The rows every write of the writer thread shares: audit rows with their
//! outbox events, decision rows with the documents they name, authors marked
//! for recomputation, idempotency keys sealed, released and answered, and
//! provider requests settled by a transition. One row per statement
//! through the connection's prepared-statement cache: on the writer's own
//! thread a statement costs a few microseconds, so there is nothing to gain
//! from multi-row texts (which PostgreSQL needs to save round trips).

use super::known;
use crate::clock::Millis;
use crate::domain::ItemStatus;
use crate::store::shared::NewTransition;
use crate::store::{DecisionInputs, Handoff, InputDoc, KeyCompletion, NewDecision, StoreResult, provider_request_key};
use rusqlite::{Connection, OptionalExtension, params};

/// Inserts an audit row and its outbox event. On SQLite the event is
/// written here, not by a trigger on `transitions` as on PostgreSQL: a
/// statement that fires a trigger is a statement transaction, which first
/// copies every page it changes to the statement journal (a quarter of
/// this function's time under a stream of submissions); see
/// migrations/sqlite/0073_outbox_written_with_each_transition.sql. The
/// two rows go in one transaction, and every transition SQLite stores goes
/// through here or through `store::shared`'s `insert_transitions`.
pub(super) fn insert_transition(conn: &Connection, t: &NewTransition<'_>) -> StoreResult<()> {
    conn.prepare_cached(
        "INSERT INTO transitions (item_id, from_status, to_status, version, cause, actor, actor_name, actor_note, \
         reason, correlation_id, created_at, policy, ends_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
    )?
    .execute(params![
        t.item_id,
        t.from.as_str(),
        t.to.as_str(),
        t.version,
        t.cause.as_str(),
        t.actor.as_str(),
        t.actor_name,
        t.actor_note,
        t.reason,
        t.correlation_id,
        t.now,
        t.policy,
        t.ends_at,
    ])?;
    // Read, then inserted with `VALUES`: an `INSERT … SELECT` may write many
    // rows, so it too would be a statement transaction.
    let (client, kind, external_id): (String, String, Option<String>) = conn
        .prepare_cached("SELECT client, kind, external_id FROM items WHERE id = ?1")?
        .query_row(params![t.item_id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
    conn.prepare_cached(
        "INSERT INTO outbox (event_id, item_id, item_version, client, kind, external_id, from_status, to_status, \
         cause, actor, reason, correlation_id, created_at) \
         VALUES (?1 || ':' || ?2, ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
    )?
    .execute(params![
        t.item_id,
        t.version,
        client,
        kind,
        external_id,
        t.from.as_str(),
        t.to.as_str(),
        t.cause.as_str(),
        t.actor.as_str(),
        t.reason,
        t.correlation_id,
        t.now,
    ])?;
    Ok(())
}

/// Inserts one item version's decisions with the documents they name, and
/// marks the item's author for recomputation when one may count against
/// them (in this transaction, so no change to a score goes unnoticed).
pub(super) fn insert_decisions(
    conn: &Connection,
    item_id: &str,
    item_version: i64,
    decisions: &[NewDecision],
) -> StoreResult<()> {
    if decisions.is_empty() {
        return Ok(());
    }
    let now = decisions.iter().map(|d| d.decided_at).max().unwrap_or_default();
    let snapshot_ids = insert_input_docs(conn, decisions.iter().filter_map(|d| d.inputs.as_ref()), now)?;
    let mut insert = conn.prepare_cached(
        "INSERT INTO decisions (item_id, item_version, plugin, plugin_ref, phase, verdict, score, labels, reason, \
         mode, applied, duration_us, outcome, error, created_at, snapshot_digest, config_digest, lists, snapshot_id) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19)",
    )?;
    let mut striking = false;
    for d in decisions {
        let snapshot = d.inputs.as_ref().map(|i| i.snapshot.digest.as_str());
        let snapshot_id = snapshot
            .and_then(|digest| snapshot_ids.iter().find(|(d, _)| *d == digest))
            .map(|(_, id)| *id);
        insert.execute(params![
            item_id,
            item_version,
            d.plugin,
            plugin_ref(conn, d)?,
            d.phase.as_str(),
            d.verdict.map(|v| v.as_str()),
            d.score,
            crate::store::rows::labels_json(&d.labels),
            d.reason,
            d.mode.as_str(),
            d.applied,
            d.duration_us,
            d.outcome.as_str(),
            d.error,
            d.decided_at,
            snapshot,
            d.inputs.as_ref().map(|i| i.config.digest.as_str()),
            crate::store::rows::lists_json(&d.lists),
            snapshot_id,
        ])?;
        striking |= d.weighs;
    }
    if striking {
        mark_author(conn, item_id, now)?;
    }
    Ok(())
}

/// The `plugin_refs` id of a decision's code, stored the first time it is
/// seen (and then known to the writer thread, see `known.rs`).
fn plugin_ref(conn: &Connection, d: &NewDecision) -> StoreResult<i64> {
    if let Some(id) = known::plugin_ref(&d.plugin, &d.plugin_version, &d.plugin_digest) {
        return Ok(id);
    }
    let found = conn
        .prepare_cached("SELECT id FROM plugin_refs WHERE digest = ?1 AND name = ?2 AND version = ?3")?
        .query_row(params![d.plugin_digest, d.plugin, d.plugin_version], |r| r.get(0))
        .optional()?;
    let id = match found {
        Some(id) => id,
        None => conn
            .prepare_cached("INSERT INTO plugin_refs (name, version, digest) VALUES (?1, ?2, ?3) RETURNING id")?
            .query_row(params![d.plugin, d.plugin_version, d.plugin_digest], |r| r.get(0))?,
    };
    known::note_plugin_ref(&d.plugin, &d.plugin_version, &d.plugin_digest, id);
    Ok(id)
}

/// Stores the documents the decisions name: each snapshot appended once
/// (an evaluation's decisions share it), each config once ever (one
/// already stored is left as it is). Returns the `id` of each snapshot,
/// by digest.
fn insert_input_docs<'d>(
    conn: &Connection,
    inputs: impl Iterator<Item = &'d DecisionInputs>,
    now: Millis,
) -> StoreResult<Vec<(&'d str, i64)>> {
    let mut snapshots: Vec<(&'d str, i64)> = Vec::new();
    let mut configs: Vec<&'d InputDoc> = Vec::new();
    let mut insert = conn.prepare_cached(
        "INSERT INTO snapshots (digest, kind, body, bytes, stored_bytes, used_at) VALUES (?1, 'snapshot', ?2, ?3, ?4, ?5)",
    )?;
    for i in inputs {
        let (snapshot, config) = (&*i.snapshot, &*i.config);
        if !snapshots.iter().any(|(d, _)| *d == snapshot.digest) {
            insert.execute(params![
                snapshot.digest,
                snapshot.body,
                snapshot.bytes,
                snapshot.body.len() as i64,
                now
            ])?;
            snapshots.push((snapshot.digest.as_str(), conn.last_insert_rowid()));
        }
        if !configs.iter().any(|c| c.digest == config.digest) && !known::config(&config.digest) {
            configs.push(config);
        }
    }
    let mut insert = conn.prepare_cached(
        "INSERT INTO snapshots (digest, kind, body, bytes, stored_bytes, used_at) VALUES (?1, 'config', ?2, ?3, ?4, ?5) \
         ON CONFLICT (digest) WHERE kind = 'config' DO NOTHING",
    )?;
    for c in configs {
        insert.execute(params![c.digest, c.body, c.bytes, c.body.len() as i64, now])?;
        known::note_config(&c.digest);
    }
    Ok(snapshots)
}

/// Marks the author of `item_id` due for recomputation at `now`, unless due sooner already.
pub(super) fn mark_author(conn: &Connection, item_id: &str, now: Millis) -> StoreResult<()> {
    conn.prepare_cached(
        "UPDATE authors SET recheck_at = ?1 WHERE (recheck_at IS NULL OR recheck_at > ?1) \
         AND (client, author) = (SELECT client, author FROM items WHERE id = ?2)",
    )?
    .execute(params![now, item_id])?;
    Ok(())
}

/// Marks a claimed key done, if its claim token still holds it; `false`
/// when a retry took it over (then this write's effect must not apply).
pub(super) fn seal_key(conn: &Connection, k: &KeyCompletion) -> StoreResult<bool> {
    let n = conn
        .prepare_cached(
            "UPDATE idempotency_keys SET state = 'done' WHERE scope = ?1 AND key = ?2 AND claim = ?3 \
             AND state = 'in_flight'",
        )?
        .execute(params![k.scope, k.key, k.token])?;
    Ok(n == 1)
}

/// Deletes the key of a request whose effect was refused, so a retry can go ahead.
pub(super) fn release_key(conn: &Connection, k: &KeyCompletion) -> StoreResult<()> {
    conn.prepare_cached("DELETE FROM idempotency_keys WHERE scope = ?1 AND key = ?2 AND claim = ?3")?
        .execute(params![k.scope, k.key, k.token])?;
    Ok(())
}

/// Stores the response of a sealed key.
pub(super) fn store_response(conn: &Connection, k: &KeyCompletion, body: &str) -> StoreResult<()> {
    conn.prepare_cached(
        "UPDATE idempotency_keys SET response_status = ?3, response_body = ?4 WHERE scope = ?1 AND key = ?2",
    )?
    .execute(params![k.scope, k.key, i32::from(k.status), body])?;
    Ok(())
}

/// After a transition of `item_id` to `version`: a hand-off stores its
/// request (superseding the outstanding one); leaving `awaiting_provider`
/// otherwise cancels the outstanding one.
pub(super) fn settle_provider_requests(
    conn: &Connection,
    item_id: &str,
    from: ItemStatus,
    version: i64,
    handoff: Option<&Handoff>,
    now: Millis,
) -> StoreResult<()> {
    match handoff {
        Some(h) => {
            let key = provider_request_key(item_id, version, &h.provider);
            conn.prepare_cached(
                "UPDATE provider_requests SET status = 'superseded', superseded_by = ?2, updated_at = ?3 \
                 WHERE item_id = ?1 AND status IN ('pending', 'sent')",
            )?
            .execute(params![item_id, key, now])?;
            conn.prepare_cached(
                "INSERT INTO provider_requests (key, provider, item_id, item_version, status, next_attempt_at, \
                 deadline_at, created_at, updated_at, content_version) \
                 SELECT ?1, ?2, ?3, ?4, 'pending', ?5, ?6, ?5, ?5, content_version FROM items WHERE id = ?3",
            )?
            .execute(params![key, h.provider, item_id, version, now, h.deadline_at])?;
        }
        None if from == ItemStatus::AwaitingProvider => {
            conn.prepare_cached(
                "UPDATE provider_requests SET status = 'cancelled', updated_at = ?2 \
                 WHERE item_id = ?1 AND status IN ('pending', 'sent')",
            )?
            .execute(params![item_id, now])?;
        }
        None => {}
    }
    Ok(())
}
