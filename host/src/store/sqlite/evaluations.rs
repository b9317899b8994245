//! Evaluations on SQLite: the fenced commit of a judged item on the writer
//! thread, and the snapshots of a claimed batch read on the reader's
//! connection (see `store/evaluations.rs` for the fence).

use super::records;
use crate::clock::Millis;
use crate::domain::policy::Cause;
use crate::domain::{Actor, ItemStatus, ProviderRequestStatus};
use crate::store::rows;
use crate::store::shared::NewTransition;
use crate::store::{
    CommitOutcome, EvaluationCommit, HISTORY_CAP, Item, ProviderAnswerRecord, SnapshotData, SnapshotWindows,
    StandingData, StoreResult, others,
};
use rusqlite::{Connection, OptionalExtension, Row, params};

/// Commits one evaluation, fenced on the snapshot it judged: a status
/// change applies only while the item is still at the snapshot's version,
/// status and evaluation round and no moderator decided; a record-only
/// commit only while the version and round hold. Anything else is `Stale`
/// and writes nothing.
pub(super) fn commit_evaluation(conn: &Connection, c: &EvaluationCommit) -> StoreResult<CommitOutcome> {
    let outcome =
        match c.to {
            Some(to) => {
                // No `RETURNING`: the fence names the version, so the new
                // one is known (SQLite runs `RETURNING` through a temporary
                // table, opened and freed on every call).
                let n = conn
                    .prepare_cached(
                        "UPDATE items SET status = ?6, version = version + 1, decided_by = 'rules', updated_at = ?7, \
                     needs_eval_since = CASE WHEN event_seq = ?3 THEN NULL ELSE needs_eval_since END, \
                     evaluated_seq = ?3, eval_round = eval_round + 1 \
                     WHERE id = ?1 AND version = ?2 AND status = ?5 AND eval_round = ?4 \
                     AND (decided_by IS NULL OR decided_by <> 'moderator')",
                    )?
                    .execute(params![
                        c.item_id,
                        c.snapshot_version,
                        c.snapshot_event_seq,
                        c.snapshot_round,
                        c.from.as_str(),
                        to.as_str(),
                        c.now
                    ])?;
                if n == 0 {
                    return Ok(CommitOutcome::Stale);
                }
                let version = c.snapshot_version + 1;
                records::insert_transition(
                    conn,
                    &NewTransition {
                        item_id: &c.item_id,
                        from: c.from,
                        to,
                        version,
                        cause: Cause::Evaluation,
                        actor: Actor::Rules,
                        actor_name: None,
                        actor_note: None,
                        reason: &c.reason,
                        correlation_id: &c.correlation_id,
                        now: c.now,
                        policy: None,
                        ends_at: None,
                    },
                )?;
                if c.handoff.is_some() || c.from == ItemStatus::AwaitingProvider {
                    let handoff = c.handoff.as_ref().filter(|_| to == ItemStatus::AwaitingProvider);
                    records::settle_provider_requests(conn, &c.item_id, c.from, version, handoff, c.now)?;
                }
                CommitOutcome::Transitioned { version }
            }
            None => {
                let n = conn
                .prepare_cached(
                    "UPDATE items SET needs_eval_since = CASE WHEN event_seq = ?3 THEN NULL ELSE needs_eval_since END, \
                     evaluated_seq = ?3, eval_round = eval_round + 1 \
                     WHERE id = ?1 AND version = ?2 AND eval_round = ?4",
                )?
                .execute(params![c.item_id, c.snapshot_version, c.snapshot_event_seq, c.snapshot_round])?;
                if n == 0 {
                    return Ok(CommitOutcome::Stale);
                }
                CommitOutcome::Recorded
            }
        };
    records::insert_decisions(conn, &c.item_id, c.snapshot_version, &c.decisions)?;
    Ok(outcome)
}

const ITEM_COLUMNS: &str = "id, client, external_id, kind, author, body, context, fingerprint, status, version, \
     decided_by, sync_verdict, needs_eval_since, event_seq, evaluated_seq, eval_round, content_version, created_at, \
     updated_at";

/// An item from a row of [`ITEM_COLUMNS`].
pub(super) fn item_from_row(r: &Row<'_>) -> StoreResult<Item> {
    Ok(Item {
        id: r.get(0)?,
        client: r.get(1)?,
        external_id: r.get(2)?,
        kind: r.get(3)?,
        author: r.get(4)?,
        body: r.get(5)?,
        context: r.get(6)?,
        fingerprint: r.get(7)?,
        status: rows::parse(r.get_ref(8)?.as_str()?)?,
        version: r.get(9)?,
        decided_by: rows::parse_opt(r.get_ref(10)?.as_str_or_null()?)?,
        sync_verdict: rows::parse_opt(r.get_ref(11)?.as_str_or_null()?)?,
        needs_eval_since: r.get(12)?,
        event_seq: r.get(13)?,
        evaluated_seq: r.get(14)?,
        eval_round: r.get(15)?,
        content_version: r.get(16)?,
        created_at: r.get(17)?,
        updated_at: r.get(18)?,
    })
}

/// The snapshots of `ids` (unknown ids left out), in one read transaction
/// of `conn`: per item a handful of point queries through the prepared
/// statement cache.
pub(super) fn snapshots(conn: &Connection, ids: &[String], w: SnapshotWindows) -> StoreResult<Vec<SnapshotData>> {
    // One read transaction: every snapshot of the batch from one view.
    conn.prepare_cached("BEGIN")?.raw_execute()?;
    let read = ids.iter().filter_map(|id| snapshot(conn, id, w).transpose()).collect();
    conn.prepare_cached("COMMIT")?.raw_execute()?;
    read
}

fn snapshot(conn: &Connection, id: &str, w: SnapshotWindows) -> StoreResult<Option<SnapshotData>> {
    let mut stmt = conn.prepare_cached(&format!("SELECT {ITEM_COLUMNS} FROM items WHERE id = ?1"))?;
    let mut found = stmt.query(params![id])?;
    let Some(row) = found.next()? else { return Ok(None) };
    let item = item_from_row(row)?;
    drop(found);
    let counters = conn
        .prepare_cached("SELECT name, value FROM counters WHERE item_id = ?1 ORDER BY name")?
        .query_map(params![id], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<rusqlite::Result<Vec<(String, i64)>>>()?;
    let mut trigger = if item.event_seq > item.evaluated_seq {
        conn.prepare_cached(
            "SELECT kind, actor, created_at FROM events WHERE item_id = ?1 AND seq > ?2 ORDER BY seq DESC LIMIT 64",
        )?
        .query_map(params![id, item.evaluated_seq], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })?
        .collect::<rusqlite::Result<Vec<(String, String, Millis)>>>()?
    } else {
        Vec::new()
    };
    trigger.reverse();
    let (provider_answers, waiting_on) = provider_state(conn, &item)?;
    // Each figure a bounded count over one index (`HISTORY_CAP`), three
    // reads in all: the author's newest items since the wider of the two
    // windows give both windowed counts (each window's items are the newest
    // of them, so a count below the cap is exact), the newest rejected
    // items both counts of rejections, and the held items theirs. The
    // counts by status read the partial indexes that hold only the items
    // now in that status (`INDEXED BY`: an error, not a scan of the
    // author's history, if an index were ever gone).
    let figures = conn
        .prepare_cached(
            "SELECT w.recent, r.rejected, \
             (SELECT COUNT(*) FROM (SELECT 1 FROM items INDEXED BY items_author_held \
              WHERE client = ?1 AND author = ?2 AND status = 'held_for_review' LIMIT ?5)), \
             w.standing, r.standing \
             FROM (SELECT COALESCE(SUM(created_at >= ?3), 0) AS recent, COALESCE(SUM(created_at >= ?4), 0) AS standing \
              FROM (SELECT created_at FROM items INDEXED BY items_client_author \
              WHERE client = ?1 AND author = ?2 AND created_at >= MIN(?3, ?4) ORDER BY created_at DESC LIMIT ?5)) w, \
             (SELECT COUNT(*) AS rejected, COALESCE(SUM(created_at >= ?4), 0) AS standing \
              FROM (SELECT created_at FROM items INDEXED BY items_author_rejected \
              WHERE client = ?1 AND author = ?2 AND status = 'rejected' ORDER BY created_at DESC LIMIT ?5)) r",
        )?
        .query_row(
            params![
                item.client,
                item.author,
                w.author_since,
                w.standing_since,
                HISTORY_CAP + 1
            ],
            |r| Ok([r.get::<_, i64>(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?]),
        )?;
    let account: Option<(Option<String>, Option<f64>, Option<i64>)> = conn
        .prepare_cached("SELECT status, strikes, first_seen FROM authors WHERE client = ?1 AND author = ?2")?
        .query_row(params![item.client, item.author], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .optional()?;
    let duplicate_count: i64 = conn
        .prepare_cached(
            "SELECT COUNT(*) FROM (SELECT 1 FROM items INDEXED BY items_client_fingerprint \
             WHERE client = ?1 AND author = ?2 AND fingerprint = ?3 \
             AND created_at >= ?4 AND id <> ?5 LIMIT ?6)",
        )?
        .query_row(
            params![
                item.client,
                item.author,
                item.fingerprint,
                w.duplicate_since,
                item.id,
                HISTORY_CAP
            ],
            |r| r.get(0),
        )?;
    // The author's figures, without this item's own contribution.
    let in_standing = item.created_at >= w.standing_since;
    let (state, strikes, first_seen) = account.unwrap_or_default();
    let (state, strikes, first_seen) = (
        state.unwrap_or_default(),
        strikes.unwrap_or(0.0),
        first_seen.unwrap_or(0),
    );
    Ok(Some(SnapshotData {
        counters,
        author_recent_items: others(figures[0], item.created_at >= w.author_since),
        author_rejected_items: others(figures[1], item.status == ItemStatus::Rejected),
        author_held_items: others(figures[2], item.status == ItemStatus::HeldForReview),
        standing: StandingData {
            state,
            strikes,
            items: others(figures[3], in_standing),
            rejected_items: others(figures[4], in_standing && item.status == ItemStatus::Rejected),
            first_seen,
        },
        duplicate_count,
        trigger,
        provider_answers,
        waiting_on,
        signals: Default::default(),
        item,
    }))
}

/// For the item's current content: the providers' answers, and which
/// provider it still waits on.
fn provider_state(conn: &Connection, item: &Item) -> StoreResult<(Vec<ProviderAnswerRecord>, Option<String>)> {
    let mut stmt = conn.prepare_cached(
        "SELECT provider, status, answer_verdict, answer_score, answer_labels, answer_reason, answered_at \
         FROM provider_requests WHERE item_id = ?1 AND content_version = ?2 \
         AND status IN ('answered', 'pending', 'sent') ORDER BY created_at",
    )?;
    let mut rows_ = stmt.query(params![item.id, item.content_version])?;
    let (mut answers, mut waiting) = (Vec::new(), None);
    while let Some(r) = rows_.next()? {
        let status: ProviderRequestStatus = rows::parse(r.get_ref(1)?.as_str()?)?;
        if status.is_active() {
            waiting = Some(r.get(0)?);
        } else if let Some(verdict) = rows::parse_opt(r.get_ref(2)?.as_str_or_null()?)? {
            answers.push(ProviderAnswerRecord {
                provider: r.get(0)?,
                verdict,
                score: r.get::<_, Option<f64>>(3)?.unwrap_or(0.0),
                labels: rows::labels(r.get_ref(4)?.as_str_or_null()?.unwrap_or("[]"))?,
                reason: r.get::<_, Option<String>>(5)?.unwrap_or_default(),
                answered_at: r.get::<_, Option<i64>>(6)?.unwrap_or(0),
            });
        }
    }
    Ok((answers, waiting))
}
