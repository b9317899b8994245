//! The multi-row inserts of the audit trail (transitions with their outbox
//! events, decisions, stored snapshots and configs): the one place where
//! the backends bind a batch's rows differently.
//!
//! PostgreSQL binds each column as an array and inserts the whole batch
//! with one statement over `unnest`: one round trip and one prepared text
//! whatever the batch's size, and a plan that reads no table, so it cannot
//! go stale as the tables grow. A transition's outbox event is inserted by
//! the same statement, from the rows the audit insert returns, in their
//! order (`0074_outbox_written_with_each_transition.sql`). SQLite, whose
//! statements cost no round trip and which has no array type, binds
//! multi-row `VALUES` in chunks ([`chunk_sizes`]) and writes each outbox
//! row right after.

use super::dialect::{Dialect, Statements, Tx, chunk_sizes, values};
use super::history::InputDoc;
use super::postgres::PgStore;
use super::shared::{DecisionRow, NewTransition};
use super::sqlite::SqliteStore;
use super::{StoreResult, rows};
use crate::clock::Millis;

/// A config already stored is left as it is, and returns no row (both
/// backends' text).
macro_rules! config_conflict {
    () => {
        "ON CONFLICT (digest) WHERE kind = 'config' DO NOTHING"
    };
}

/// A backend's inserts of audit rows, decisions and stored documents.
pub(super) trait BulkInsert: Dialect {
    /// Inserts audit rows, each with its outbox event, in the order given.
    async fn insert_transitions(tx: &mut Tx<'_, Self::DB>, rows: &[NewTransition<'_>]) -> StoreResult<()>;

    /// Inserts decision rows.
    async fn insert_decisions(tx: &mut Tx<'_, Self::DB>, rows: &[DecisionRow<'_>]) -> StoreResult<()>;

    /// Inserts `docs` into `snapshots`; returns the `(digest, id)` of each
    /// row inserted. `configs`: the documents are configs, each stored once
    /// ever (one already stored is left as it is and returns no row).
    async fn insert_docs(
        tx: &mut Tx<'_, Self::DB>,
        docs: &[&InputDoc],
        configs: bool,
        now: Millis,
    ) -> StoreResult<Vec<(String, i64)>>;
}

impl BulkInsert for PgStore {
    async fn insert_transitions(tx: &mut Tx<'_, Self::DB>, rows: &[NewTransition<'_>]) -> StoreResult<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let column = |f: for<'r> fn(&'r NewTransition<'r>) -> &'r str| rows.iter().map(f).collect::<Vec<_>>();
        sqlx::query(
            "WITH t AS (INSERT INTO transitions (item_id, from_status, to_status, version, cause, actor, \
             actor_name, actor_note, reason, correlation_id, created_at, policy, ends_at) \
             SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::text[], $6::text[], \
             $7::text[], $8::text[], $9::text[], $10::text[], $11::bigint[], $12::text[], $13::bigint[]) \
             RETURNING id, item_id, version, from_status, to_status, cause, actor, reason, correlation_id, created_at) \
             INSERT INTO outbox (event_id, item_id, item_version, client, kind, external_id, from_status, to_status, \
             cause, actor, reason, correlation_id, created_at) \
             SELECT t.item_id || ':' || t.version, i.id, t.version, i.client, i.kind, i.external_id, t.from_status, \
             t.to_status, t.cause, t.actor, t.reason, t.correlation_id, t.created_at \
             FROM t JOIN items i ON i.id = t.item_id ORDER BY t.id",
        )
        .bind(column(|t| t.item_id))
        .bind(column(|t| t.from.as_str()))
        .bind(column(|t| t.to.as_str()))
        .bind(rows.iter().map(|t| t.version).collect::<Vec<_>>())
        .bind(column(|t| t.cause.as_str()))
        .bind(column(|t| t.actor.as_str()))
        .bind(rows.iter().map(|t| t.actor_name).collect::<Vec<_>>())
        .bind(rows.iter().map(|t| t.actor_note).collect::<Vec<_>>())
        .bind(column(|t| t.reason))
        .bind(column(|t| t.correlation_id))
        .bind(rows.iter().map(|t| t.now).collect::<Vec<_>>())
        .bind(rows.iter().map(|t| t.policy).collect::<Vec<_>>())
        .bind(rows.iter().map(|t| t.ends_at).collect::<Vec<_>>())
        .execute(&mut **tx)
        .await?;
        Ok(())
    }

    async fn insert_decisions(tx: &mut Tx<'_, Self::DB>, rows: &[DecisionRow<'_>]) -> StoreResult<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let column = |f: for<'r> fn(&'r DecisionRow<'r>) -> &'r str| rows.iter().map(f).collect::<Vec<_>>();
        let inputs = |f: for<'r> fn(&'r DecisionRow<'r>) -> Option<&'r str>| rows.iter().map(f).collect::<Vec<_>>();
        sqlx::query(
            "INSERT INTO decisions (item_id, item_version, plugin, plugin_ref, phase, verdict, score, labels, \
             reason, mode, applied, duration_us, outcome, error, created_at, snapshot_digest, config_digest, lists, \
             snapshot_id) \
             SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[], $4::bigint[], $5::text[], $6::text[], \
             $7::float8[], $8::text[], $9::text[], $10::text[], $11::bool[], $12::bigint[], $13::text[], $14::text[], \
             $15::bigint[], $16::text[], $17::text[], $18::text[], $19::bigint[])",
        )
        .bind(column(|r| r.item_id))
        .bind(rows.iter().map(|r| r.item_version).collect::<Vec<_>>())
        .bind(column(|r| r.decision.plugin.as_str()))
        .bind(rows.iter().map(|r| r.plugin_ref).collect::<Vec<_>>())
        .bind(column(|r| r.decision.phase.as_str()))
        .bind(inputs(|r| r.decision.verdict.map(|v| v.as_str())))
        .bind(rows.iter().map(|r| r.decision.score).collect::<Vec<_>>())
        .bind(
            rows.iter()
                .map(|r| rows::labels_json(&r.decision.labels))
                .collect::<Vec<_>>(),
        )
        .bind(column(|r| r.decision.reason.as_str()))
        .bind(column(|r| r.decision.mode.as_str()))
        .bind(rows.iter().map(|r| r.decision.applied).collect::<Vec<_>>())
        .bind(rows.iter().map(|r| r.decision.duration_us).collect::<Vec<_>>())
        .bind(column(|r| r.decision.outcome.as_str()))
        .bind(inputs(|r| r.decision.error.as_deref()))
        .bind(rows.iter().map(|r| r.decision.decided_at).collect::<Vec<_>>())
        .bind(inputs(|r| {
            r.decision.inputs.as_ref().map(|i| i.snapshot.digest.as_str())
        }))
        .bind(inputs(|r| r.decision.inputs.as_ref().map(|i| i.config.digest.as_str())))
        .bind(
            rows.iter()
                .map(|r| rows::lists_json(&r.decision.lists))
                .collect::<Vec<_>>(),
        )
        .bind(rows.iter().map(|r| r.snapshot_id).collect::<Vec<_>>())
        .execute(&mut **tx)
        .await?;
        Ok(())
    }

    async fn insert_docs(
        tx: &mut Tx<'_, Self::DB>,
        docs: &[&InputDoc],
        configs: bool,
        now: Millis,
    ) -> StoreResult<Vec<(String, i64)>> {
        if docs.is_empty() {
            return Ok(Vec::new());
        }
        macro_rules! insert {
            ($conflict:expr) => {
                concat!(
                    "INSERT INTO snapshots (digest, kind, body, bytes, stored_bytes, used_at) \
                     SELECT d, k, b, n, s, $6 FROM unnest($1::text[], $2::text[], $3::bytea[], $4::bigint[], \
                     $5::bigint[]) AS v (d, k, b, n, s) ",
                    $conflict,
                    " RETURNING digest, id"
                )
            };
        }
        let sql = if configs {
            insert!(config_conflict!())
        } else {
            insert!("")
        };
        Ok(sqlx::query_as::<_, (String, i64)>(sql)
            .bind(docs.iter().map(|d| d.digest.as_str()).collect::<Vec<_>>())
            .bind(docs.iter().map(|d| d.kind.as_str()).collect::<Vec<_>>())
            .bind(docs.iter().map(|d| d.body.as_slice()).collect::<Vec<_>>())
            .bind(docs.iter().map(|d| d.bytes).collect::<Vec<_>>())
            .bind(docs.iter().map(|d| d.body.len() as i64).collect::<Vec<_>>())
            .bind(now)
            .fetch_all(&mut **tx)
            .await?)
    }
}

/// SQLite's texts, with anonymous parameters (see `Dialect::ANONYMOUS_PARAMETERS`).
static SQLITE_STATEMENTS: Statements = Statements::new(true);

impl BulkInsert for SqliteStore {
    async fn insert_transitions(tx: &mut Tx<'_, Self::DB>, rows: &[NewTransition<'_>]) -> StoreResult<()> {
        let mut rest = rows;
        for size in chunk_sizes(rows.len()) {
            let (chunk, tail) = rest.split_at(size);
            rest = tail;
            let sql = SQLITE_STATEMENTS.get("transitions", size, |n| {
                format!(
                    "INSERT INTO transitions (item_id, from_status, to_status, version, cause, actor, \
                     actor_name, actor_note, reason, correlation_id, created_at, policy, ends_at) VALUES {}",
                    values(n, 13)
                )
            });
            let mut q = sqlx::query(sql);
            for t in chunk {
                q = q
                    .bind(t.item_id)
                    .bind(t.from.as_str())
                    .bind(t.to.as_str())
                    .bind(t.version)
                    .bind(t.cause.as_str())
                    .bind(t.actor.as_str())
                    .bind(t.actor_name)
                    .bind(t.actor_note)
                    .bind(t.reason)
                    .bind(t.correlation_id)
                    .bind(t.now)
                    .bind(t.policy)
                    .bind(t.ends_at);
            }
            q.execute(&mut **tx).await?;
        }
        for t in rows {
            sqlx::query(
                "INSERT INTO outbox (event_id, item_id, item_version, client, kind, external_id, \
                 from_status, to_status, cause, actor, reason, correlation_id, created_at) \
                 SELECT $1 || ':' || $2, id, $2, client, kind, external_id, $3, $4, $5, $6, $7, $8, $9 \
                 FROM items WHERE id = $1",
            )
            .bind(t.item_id)
            .bind(t.version)
            .bind(t.from.as_str())
            .bind(t.to.as_str())
            .bind(t.cause.as_str())
            .bind(t.actor.as_str())
            .bind(t.reason)
            .bind(t.correlation_id)
            .bind(t.now)
            .execute(&mut **tx)
            .await?;
        }
        Ok(())
    }

    async fn insert_decisions(tx: &mut Tx<'_, Self::DB>, rows: &[DecisionRow<'_>]) -> StoreResult<()> {
        let mut rest = rows;
        for size in chunk_sizes(rows.len()) {
            let (chunk, tail) = rest.split_at(size);
            rest = tail;
            let sql = SQLITE_STATEMENTS.get("decisions", size, |n| {
                format!(
                    "INSERT INTO decisions (item_id, item_version, plugin, plugin_ref, \
                     phase, verdict, score, labels, reason, mode, applied, duration_us, outcome, error, \
                     created_at, snapshot_digest, config_digest, lists, snapshot_id) VALUES {}",
                    values(n, 19)
                )
            });
            let mut q = sqlx::query(sql);
            for r in chunk {
                let d = r.decision;
                q = q
                    .bind(r.item_id)
                    .bind(r.item_version)
                    .bind(&d.plugin)
                    .bind(r.plugin_ref)
                    .bind(d.phase.as_str())
                    .bind(d.verdict.map(|v| v.as_str()))
                    .bind(d.score)
                    .bind(rows::labels_json(&d.labels))
                    .bind(&d.reason)
                    .bind(d.mode.as_str())
                    .bind(d.applied)
                    .bind(d.duration_us)
                    .bind(d.outcome.as_str())
                    .bind(d.error.as_deref())
                    .bind(d.decided_at)
                    .bind(d.inputs.as_ref().map(|i| i.snapshot.digest.as_str()))
                    .bind(d.inputs.as_ref().map(|i| i.config.digest.as_str()))
                    .bind(rows::lists_json(&d.lists))
                    .bind(r.snapshot_id);
            }
            q.execute(&mut **tx).await?;
        }
        Ok(())
    }

    async fn insert_docs(
        tx: &mut Tx<'_, Self::DB>,
        docs: &[&InputDoc],
        configs: bool,
        now: Millis,
    ) -> StoreResult<Vec<(String, i64)>> {
        let (key, conflict) = match configs {
            false => ("snapshot_docs", ""),
            true => ("config_docs", config_conflict!()),
        };
        let mut inserted = Vec::with_capacity(docs.len());
        let mut rest = docs;
        for size in chunk_sizes(docs.len()) {
            let (chunk, tail) = rest.split_at(size);
            rest = tail;
            let sql = SQLITE_STATEMENTS.get(key, size, |n| {
                format!(
                    "INSERT INTO snapshots (digest, kind, body, bytes, stored_bytes, used_at) VALUES {} \
                     {conflict} RETURNING digest, id",
                    values(n, 6)
                )
            });
            let q = chunk.iter().fold(sqlx::query_as::<_, (String, i64)>(sql), |q, d| {
                q.bind(d.digest.as_str())
                    .bind(d.kind.as_str())
                    .bind(d.body.as_slice())
                    .bind(d.bytes)
                    .bind(d.body.len() as i64)
                    .bind(now)
            });
            inserted.extend(q.fetch_all(&mut **tx).await?);
        }
        Ok(inserted)
    }
}
