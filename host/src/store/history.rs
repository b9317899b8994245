//! History: the input of every evaluation, stored content-addressed with
//! its decisions, and the reads and runs of backtests over it.
//!
//! An evaluation's snapshot (without config) and each plugin's config are
//! [`InputDoc`]s: canonical JSON, named by its sha256, compressed with
//! zstd from [`COMPRESS_FROM`] bytes up, and stored in the same transaction
//! as the decisions that name them (`txn::insert_decisions`): a snapshot
//! appended under a new `id`, which its decisions store (it holds its
//! evaluation's `now_ms`, so no other evaluation shares it), a config
//! once (`ON CONFLICT DO NOTHING`). `used_at` is the first decision's
//! time. Retention deletes
//! snapshot documents older than `retention.snapshots_ms`; config
//! documents (a few hundred bytes per distinct config ever deployed) are
//! kept, since every later decision of that config names them.

use super::{DecisionRecord, StoreResult};
use crate::clock::Millis;
pub use crate::domain::InputKind;
use crate::domain::{BacktestStatus, ItemStatus};
use serde::Serialize;
use std::collections::HashMap;
use std::sync::Arc;

/// zstd level: fast (a snapshot of a few KiB compresses in microseconds)
/// and still about 3× smaller than the JSON.
const ZSTD_LEVEL: i32 = 3;

/// Documents from this many bytes of JSON up are stored compressed;
/// smaller ones as their JSON. A typical snapshot is ~500 bytes: zstd
/// makes it ~1.6× smaller, and building its entropy tables for so little
/// input cost more CPU than all the rest of storing it (the B11 profile in
/// docs/BENCHMARKS.md), for ~190 bytes saved.
pub const COMPRESS_FROM: usize = 1024;

/// A stored document: canonical JSON, compressed if large, named by the
/// sha256 of the JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputDoc {
    /// sha256 of the canonical JSON, lowercase hex.
    pub digest: String,
    pub kind: InputKind,
    /// The JSON as stored: zstd-compressed (a frame, which begins with
    /// zstd's magic number), or the JSON itself (which begins with `{`)
    /// when it is shorter than [`COMPRESS_FROM`].
    pub body: Vec<u8>,
    /// Length of the JSON.
    pub bytes: i64,
}

impl InputDoc {
    /// Names and stores `json`, a JSON object (which the caller encodes
    /// canonically: the same input always gives the same bytes).
    pub fn new(kind: InputKind, json: &[u8]) -> InputDoc {
        debug_assert_eq!(json.first(), Some(&b'{'), "a document is a JSON object");
        thread_local! {
            // A compression context per thread: making one per call (its
            // tables) would cost more than compressing a snapshot.
            static COMPRESSOR: std::cell::RefCell<zstd::bulk::Compressor<'static>> = std::cell::RefCell::new(
                zstd::bulk::Compressor::new(ZSTD_LEVEL).expect("a valid zstd level"),
            );
        }
        let body = if json.len() < COMPRESS_FROM {
            json.to_vec()
        } else {
            COMPRESSOR.with_borrow_mut(|c| c.compress(json).expect("compressing to memory cannot fail"))
        };
        InputDoc {
            digest: crate::domain::Digest::of(json).to_hex(),
            kind,
            body,
            bytes: json.len() as i64,
        }
    }

    /// The JSON of a stored body: a zstd frame is decompressed, a JSON
    /// object (stored as it was) returned as it is.
    pub fn decompress(body: &[u8], bytes: i64) -> StoreResult<Vec<u8>> {
        let corrupt = |e: &dyn std::fmt::Display| super::StoreError::Corrupt(format!("stored snapshot: {e}"));
        if body.first() == Some(&b'{') {
            if body.len() as i64 != bytes {
                return Err(corrupt(&format_args!(
                    "{} bytes of JSON stored for {bytes}",
                    body.len()
                )));
            }
            return Ok(body.to_vec());
        }
        zstd::bulk::decompress(body, bytes.max(0) as usize).map_err(|e| corrupt(&e))
    }
}

/// The documents one decision judged: the evaluation's snapshot (shared by
/// every plugin of the evaluation) and the plugin's config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecisionInputs {
    pub snapshot: Arc<InputDoc>,
    pub config: Arc<InputDoc>,
}

/// One decision a backtest may replay, as the selection lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayUnit {
    pub decision_id: i64,
    pub item_id: String,
    pub created_at: Millis,
}

/// Where a page of [`History::replay_units`] starts: after this
/// `(created_at, id)`; `(Millis::MIN, 0)` for the first page.
pub type UnitCursor = (Millis, i64);

/// A decision with its item, as a backtest reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct ItemDecision {
    pub item_id: String,
    pub decision: DecisionRecord,
}

/// A status a moderator set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModeratorDecision {
    pub item_id: String,
    pub to: ItemStatus,
    pub at: Millis,
}

/// A backtest run started through the API.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct BacktestRecord {
    pub id: String,
    pub status: BacktestStatus,
    /// The request as it was accepted (its candidate `lists` as name, kind,
    /// entry count and digest, not entry by entry).
    #[schema(value_type = Object)]
    pub request: serde_json::Value,
    /// The candidate plugin: `NAME VERSION (sha256:…)`.
    pub candidate: String,
    /// The moderator who started it.
    pub created_by: String,
    pub progress: BacktestProgress,
    /// The report, once done (see `Report` in the OpenAPI document).
    #[schema(value_type = Option<Object>)]
    pub report: Option<serde_json::Value>,
    pub error: Option<String>,
    pub created_at: Millis,
    pub finished_at: Option<Millis>,
}

/// How far a backtest is: evaluations judged of the sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct BacktestProgress {
    pub done: i64,
    pub total: i64,
}

/// How list `name` appears in a decision's `lists` column: the JSON of
/// its [`crate::rules::ListUse`] up to the name's closing quote (no other
/// name has it as a prefix).
pub(crate) fn list_key(name: &str) -> String {
    format!("\"name\":{}", serde_json::Value::from(name))
}

/// Stored inputs, and backtest runs.
#[async_trait::async_trait]
pub trait History: Send + Sync {
    /// Decisions of `plugins` made in `[since, until)` after `after`, by
    /// `(created_at, id)` (index `decisions_plugin_time`: each page is a
    /// range scan): with several plugins, one per evaluation (the first of
    /// theirs); with `None`, every plugin's, one per evaluation. Provider
    /// answers are not evaluations and are left out.
    async fn replay_units(
        &self,
        plugins: Option<&[String]>,
        since: Millis,
        until: Millis,
        after: UnitCursor,
        limit: i64,
    ) -> StoreResult<Vec<ReplayUnit>>;

    /// How many units [`History::replay_units`] would list for the window,
    /// counting no further than `cap` (a bounded read: at most `cap` index
    /// entries).
    async fn count_units(&self, plugins: Option<&[String]>, since: Millis, until: Millis, cap: i64)
    -> StoreResult<i64>;

    /// Whether `plugin` made a decision in `[since, until)` that consulted
    /// one of `lists`: the plugins a backtest of candidate lists alone
    /// replays. Reads the plugin's decisions of the window until the first
    /// that did.
    async fn consulted_lists(&self, plugin: &str, lists: &[String], since: Millis, until: Millis) -> StoreResult<bool>;

    /// The decisions of `item_id` before decision `before` (the newest when
    /// `None`), newest first, at most `limit`: one range of index
    /// `decisions_item`.
    async fn item_decisions(&self, item_id: &str, before: Option<i64>, limit: i64) -> StoreResult<Vec<DecisionRecord>>;

    /// The decisions of `item_id` from decision `from` on (`from` itself
    /// included), oldest first, at most `limit`.
    async fn item_decisions_from(&self, item_id: &str, from: i64, limit: i64) -> StoreResult<Vec<DecisionRecord>>;

    /// The sync-phase decisions of `item_id` before decision `before`,
    /// newest first, at most `limit` (partial index `decisions_item_sync`:
    /// the async decisions in between are not read).
    async fn sync_decisions_before(&self, item_id: &str, before: i64, limit: i64) -> StoreResult<Vec<DecisionRecord>>;

    /// The JSON of the stored snapshots `snapshots` (their `snapshot_id`)
    /// and configs `configs` (their digest), by digest: a decision finds
    /// its documents under the digests it names. Unknown, expired or
    /// unreadable ones are left out.
    async fn input_docs(&self, snapshots: &[i64], configs: &[&str]) -> StoreResult<HashMap<String, Vec<u8>>>;

    /// The statuses moderators set on the items `ids`, oldest first.
    async fn moderator_decisions(&self, ids: &[&str]) -> StoreResult<Vec<ModeratorDecision>>;

    /// Stored snapshot documents: (documents, compressed bytes).
    async fn snapshot_footprint(&self) -> StoreResult<(i64, i64)>;

    /// Records a new running backtest.
    async fn create_backtest(
        &self,
        id: &str,
        request: &serde_json::Value,
        candidate: &str,
        created_by: &str,
        now: Millis,
    ) -> StoreResult<()>;

    /// Records progress (and the heartbeat); `false` when the backtest is
    /// no longer running (cancelled), so the runner stops.
    async fn backtest_progress(&self, id: &str, done: i64, total: i64, now: Millis) -> StoreResult<bool>;

    /// Ends a running backtest as `status` (`done` with its report, or
    /// `failed` with an error) at `progress`; `false` if it was no longer running.
    async fn finish_backtest(
        &self,
        id: &str,
        status: BacktestStatus,
        progress: BacktestProgress,
        report: Option<&serde_json::Value>,
        error: Option<&str>,
        now: Millis,
    ) -> StoreResult<bool>;

    /// Cancels a running backtest; the record as it is after (unchanged if
    /// it had already ended: cancelling twice is the same as once), `None`
    /// if unknown.
    async fn cancel_backtest(&self, id: &str, now: Millis) -> StoreResult<Option<BacktestRecord>>;

    async fn backtest(&self, id: &str) -> StoreResult<Option<BacktestRecord>>;

    /// The newest backtests first, without their reports.
    async fn backtests(&self, limit: i64) -> StoreResult<Vec<BacktestRecord>>;

    /// Marks failed the running backtests whose heartbeat stopped before
    /// `before` (their process went away); how many.
    async fn fail_stale_backtests(&self, before: Millis, now: Millis) -> StoreResult<u64>;
}

/// Instantiates [`History`] for one backend.
macro_rules! impl_history {
    ($store:ty, $db:ty, $row:ty) => {
        const _: () = {
            use sqlx::Row as _;
            use std::collections::HashMap;
            use $crate::clock::Millis;
            use $crate::domain::BacktestStatus;
            use $crate::store::dialect::{Dialect, placeholders, retry_conflicts};
            use $crate::store::history::*;
            use $crate::store::rows;
            use $crate::store::*;

            fn in_list(sql: &str, n: usize) -> String {
                sql.replace("LIST", &placeholders(1, n))
            }

            /// Decisions `d` of the `n` plugins `$1..$n`; with several, one
            /// per evaluation: the first of theirs.
            fn of_plugins(n: usize) -> String {
                let list = placeholders(1, n);
                if n == 1 {
                    return format!("d.plugin IN ({list})");
                }
                format!(
                    "d.plugin IN ({list}) AND NOT EXISTS (SELECT 1 FROM decisions e WHERE e.item_id = d.item_id \
                     AND e.snapshot_digest = d.snapshot_digest AND e.id < d.id AND e.plugin IN ({list}))"
                )
            }

            fn record_from_row(r: &$row, with_report: bool) -> StoreResult<BacktestRecord> {
                let json = |s: Option<String>| -> StoreResult<Option<serde_json::Value>> {
                    s.map(|s| serde_json::from_str(&s).map_err(|e| StoreError::Corrupt(format!("backtest json: {e}"))))
                        .transpose()
                };
                Ok(BacktestRecord {
                    id: r.try_get("id")?,
                    status: rows::parse(r.try_get::<&str, _>("status")?)?,
                    request: json(r.try_get("request")?)?.unwrap_or_default(),
                    candidate: r.try_get("candidate")?,
                    created_by: r.try_get("created_by")?,
                    progress: BacktestProgress {
                        done: r.try_get("done")?,
                        total: r.try_get("total")?,
                    },
                    report: if with_report { json(r.try_get("report")?)? } else { None },
                    error: r.try_get("error")?,
                    created_at: r.try_get("created_at")?,
                    finished_at: r.try_get("finished_at")?,
                })
            }

            async fn decision_rows<'q>(
                store: &$store,
                q: sqlx::query::Query<'q, $db, <$db as sqlx::Database>::Arguments<'q>>,
            ) -> StoreResult<Vec<DecisionRecord>> {
                q.fetch_all(store.read_pool())
                    .await?
                    .iter()
                    .map(txn::decision_from_row)
                    .collect()
            }

            const BACKTEST_COLUMNS: &str =
                "id, status, request, candidate, created_by, done, total, report, error, created_at, finished_at";

            #[async_trait::async_trait]
            impl History for $store {
                async fn replay_units(
                    &self,
                    plugins: Option<&[String]>,
                    since: Millis,
                    until: Millis,
                    after: UnitCursor,
                    limit: i64,
                ) -> StoreResult<Vec<ReplayUnit>> {
                    let since = since.max(after.0);
                    let rows = match plugins {
                        Some(plugins) => {
                            let n = plugins.len();
                            let sql = format!(
                                "SELECT d.id, d.item_id, d.created_at FROM decisions d WHERE {} \
                                 AND d.created_at >= ${} AND d.created_at < ${} AND (d.created_at > ${} OR d.id > ${}) \
                                 AND d.phase <> 'provider' ORDER BY d.created_at, d.id LIMIT ${}",
                                of_plugins(n),
                                n + 1,
                                n + 2,
                                n + 3,
                                n + 4,
                                n + 5
                            );
                            plugins
                                .iter()
                                .fold(sqlx::query_as::<_, (i64, String, i64)>(&sql), |q, p| q.bind(p))
                                .bind(since)
                                .bind(until)
                                .bind(after.0)
                                .bind(after.1)
                                .bind(limit)
                                .fetch_all(self.read_pool())
                                .await?
                        }
                        // A new plugin: one decision per stored evaluation (the
                        // first of the evaluation's decisions stands for it).
                        None => {
                            sqlx::query_as::<_, (i64, String, i64)>(
                                "SELECT d.id, d.item_id, d.created_at FROM decisions d \
                                 WHERE d.created_at >= $1 AND d.created_at < $2 \
                                 AND (d.created_at > $3 OR d.id > $4) \
                                 AND d.phase <> 'provider' AND d.snapshot_digest IS NOT NULL \
                                 AND d.id = (SELECT MIN(e.id) FROM decisions e WHERE e.item_id = d.item_id \
                                 AND e.snapshot_digest = d.snapshot_digest) ORDER BY d.created_at, d.id LIMIT $5",
                            )
                            .bind(since)
                            .bind(until)
                            .bind(after.0)
                            .bind(after.1)
                            .bind(limit)
                            .fetch_all(self.read_pool())
                            .await?
                        }
                    };
                    Ok(rows
                        .into_iter()
                        .map(|(decision_id, item_id, created_at)| ReplayUnit {
                            decision_id,
                            item_id,
                            created_at,
                        })
                        .collect())
                }

                async fn count_units(
                    &self,
                    plugins: Option<&[String]>,
                    since: Millis,
                    until: Millis,
                    cap: i64,
                ) -> StoreResult<i64> {
                    match plugins {
                        Some(plugins) => {
                            let n = plugins.len();
                            let sql = format!(
                                "SELECT COUNT(*) FROM (SELECT 1 FROM decisions d WHERE {} \
                                 AND d.created_at >= ${} AND d.created_at < ${} AND d.phase <> 'provider' LIMIT ${}) w",
                                of_plugins(n),
                                n + 1,
                                n + 2,
                                n + 3
                            );
                            Ok(plugins
                                .iter()
                                .fold(sqlx::query_scalar(&sql), |q, p| q.bind(p))
                                .bind(since)
                                .bind(until)
                                .bind(cap)
                                .fetch_one(self.read_pool())
                                .await?)
                        }
                        None => Ok(sqlx::query_scalar(
                            "SELECT COUNT(*) FROM (SELECT 1 FROM decisions d \
                             WHERE d.created_at >= $1 AND d.created_at < $2 \
                             AND d.phase <> 'provider' AND d.snapshot_digest IS NOT NULL \
                             AND d.id = (SELECT MIN(e.id) FROM decisions e WHERE e.item_id = d.item_id \
                             AND e.snapshot_digest = d.snapshot_digest) LIMIT $3) w",
                        )
                        .bind(since)
                        .bind(until)
                        .bind(cap)
                        .fetch_one(self.read_pool())
                        .await?),
                    }
                }

                async fn consulted_lists(
                    &self,
                    plugin: &str,
                    lists: &[String],
                    since: Millis,
                    until: Millis,
                ) -> StoreResult<bool> {
                    if lists.is_empty() {
                        return Ok(false);
                    }
                    // `lists` holds the JSON the decision was written with:
                    // `[{"name":"NAME","version":…},…]`.
                    let position = <$store as Dialect>::POSITION;
                    let any: Vec<String> = (0..lists.len())
                        .map(|i| format!("{position}(lists, ${}) > 0", i + 4))
                        .collect();
                    let sql = format!(
                        "SELECT 1 FROM decisions WHERE plugin = $1 AND created_at >= $2 AND created_at < $3 \
                         AND lists IS NOT NULL AND ({}) LIMIT 1",
                        any.join(" OR ")
                    );
                    let q = sqlx::query_scalar::<_, i32>(&sql).bind(plugin).bind(since).bind(until);
                    let q = lists.iter().fold(q, |q, name| q.bind(list_key(name)));
                    Ok(q.fetch_optional(self.read_pool()).await?.is_some())
                }

                async fn item_decisions(
                    &self,
                    item_id: &str,
                    before: Option<i64>,
                    limit: i64,
                ) -> StoreResult<Vec<DecisionRecord>> {
                    let sql = format!(
                        "SELECT {} FROM {} WHERE d.item_id = $1 AND d.id < $2 ORDER BY d.id DESC LIMIT $3",
                        txn::DECISIONS,
                        txn::DECISIONS_TABLE
                    );
                    decision_rows(self, sqlx::query(&sql).bind(item_id).bind(before.unwrap_or(i64::MAX)).bind(limit)).await
                }

                async fn item_decisions_from(&self, item_id: &str, from: i64, limit: i64) -> StoreResult<Vec<DecisionRecord>> {
                    let sql = format!(
                        "SELECT {} FROM {} WHERE d.item_id = $1 AND d.id >= $2 ORDER BY d.id LIMIT $3",
                        txn::DECISIONS,
                        txn::DECISIONS_TABLE
                    );
                    decision_rows(self, sqlx::query(&sql).bind(item_id).bind(from).bind(limit)).await
                }

                async fn sync_decisions_before(&self, item_id: &str, before: i64, limit: i64) -> StoreResult<Vec<DecisionRecord>> {
                    // `phase = 'sync'` as written: the partial index's predicate.
                    let sql = format!(
                        "SELECT {} FROM {} WHERE d.item_id = $1 AND d.phase = 'sync' AND d.id < $2 \
                         ORDER BY d.id DESC LIMIT $3",
                        txn::DECISIONS,
                        txn::DECISIONS_TABLE
                    );
                    decision_rows(self, sqlx::query(&sql).bind(item_id).bind(before).bind(limit)).await
                }

                async fn input_docs(&self, snapshots: &[i64], configs: &[&str]) -> StoreResult<HashMap<String, Vec<u8>>> {
                    let mut out = HashMap::new();
                    let mut rows = Vec::new();
                    for chunk in snapshots.chunks(256) {
                        let sql = in_list("SELECT digest, body, bytes FROM snapshots WHERE id IN (LIST) AND kind = 'snapshot'", chunk.len());
                        let q = chunk.iter().fold(sqlx::query_as::<_, (String, Vec<u8>, i64)>(&sql), |q, id| q.bind(*id));
                        rows.extend(q.fetch_all(self.read_pool()).await?);
                    }
                    for chunk in configs.chunks(256) {
                        // `kind = 'config'` as written: the partial index's predicate.
                        let sql = in_list("SELECT digest, body, bytes FROM snapshots WHERE kind = 'config' AND digest IN (LIST)", chunk.len());
                        let q = chunk.iter().fold(sqlx::query_as::<_, (String, Vec<u8>, i64)>(&sql), |q, d| q.bind(*d));
                        rows.extend(q.fetch_all(self.read_pool()).await?);
                    }
                    for (digest, body, bytes) in rows {
                        // An unreadable document is left out: its decisions are counted
                        // not replayable, the rest of a backtest goes on.
                        match InputDoc::decompress(&body, bytes) {
                            Ok(json) => {
                                out.insert(digest, json);
                            }
                            Err(e) => tracing::warn!(%digest, error = %e, "stored snapshot unreadable"),
                        }
                    }
                    Ok(out)
                }

                async fn moderator_decisions(&self, ids: &[&str]) -> StoreResult<Vec<ModeratorDecision>> {
                    let mut out = Vec::new();
                    for chunk in ids.chunks(256) {
                        let sql = in_list(
                            "SELECT item_id, to_status, created_at FROM transitions \
                             WHERE item_id IN (LIST) AND actor = 'moderator' ORDER BY id",
                            chunk.len(),
                        );
                        let q = chunk.iter().fold(sqlx::query_as::<_, (String, String, i64)>(&sql), |q, id| q.bind(*id));
                        for (item_id, to, at) in q.fetch_all(self.read_pool()).await? {
                            out.push(ModeratorDecision {
                                item_id,
                                to: rows::parse(&to)?,
                                at,
                            });
                        }
                    }
                    out.sort_by_key(|m| m.at);
                    Ok(out)
                }

                async fn snapshot_footprint(&self) -> StoreResult<(i64, i64)> {
                    Ok(sqlx::query_as(
                        "SELECT COUNT(*), CAST(COALESCE(SUM(stored_bytes), 0) AS BIGINT) FROM snapshots WHERE kind = 'snapshot'",
                    )
                    .fetch_one(self.read_pool())
                    .await?)
                }

                async fn create_backtest(
                    &self,
                    id: &str,
                    request: &serde_json::Value,
                    candidate: &str,
                    created_by: &str,
                    now: Millis,
                ) -> StoreResult<()> {
                    retry_conflicts!(async {
                        let mut tx = self.begin_write().await?;
                        sqlx::query(
                            "INSERT INTO backtests (id, status, request, candidate, created_by, created_at, heartbeat_at) \
                             VALUES ($1, 'running', $2, $3, $4, $5, $5)",
                        )
                        .bind(id)
                        .bind(request.to_string())
                        .bind(candidate)
                        .bind(created_by)
                        .bind(now)
                        .execute(&mut *tx)
                        .await?;
                        tx.commit().await?;
                        Ok(())
                    })
                }

                async fn backtest_progress(&self, id: &str, done: i64, total: i64, now: Millis) -> StoreResult<bool> {
                    retry_conflicts!(async {
                        let mut tx = self.begin_write().await?;
                        let n = sqlx::query(
                            "UPDATE backtests SET done = $2, total = $3, heartbeat_at = $4 \
                             WHERE id = $1 AND status = 'running'",
                        )
                        .bind(id)
                        .bind(done)
                        .bind(total)
                        .bind(now)
                        .execute(&mut *tx)
                        .await?
                        .rows_affected();
                        tx.commit().await?;
                        Ok(n == 1)
                    })
                }

                async fn finish_backtest(
                    &self,
                    id: &str,
                    status: BacktestStatus,
                    progress: BacktestProgress,
                    report: Option<&serde_json::Value>,
                    error: Option<&str>,
                    now: Millis,
                ) -> StoreResult<bool> {
                    let report = report.map(|r| r.to_string());
                    retry_conflicts!(async {
                        let mut tx = self.begin_write().await?;
                        let n = sqlx::query(
                            "UPDATE backtests SET status = $2, report = $3, error = $4, finished_at = $5, \
                             heartbeat_at = $5, done = $6, total = $7 WHERE id = $1 AND status = 'running'",
                        )
                        .bind(id)
                        .bind(status.as_str())
                        .bind(report.as_deref())
                        .bind(error)
                        .bind(now)
                        .bind(progress.done)
                        .bind(progress.total)
                        .execute(&mut *tx)
                        .await?
                        .rows_affected();
                        tx.commit().await?;
                        Ok(n == 1)
                    })
                }

                async fn cancel_backtest(&self, id: &str, now: Millis) -> StoreResult<Option<BacktestRecord>> {
                    retry_conflicts!(async {
                        let mut tx = self.begin_write().await?;
                        sqlx::query(
                            "UPDATE backtests SET status = 'cancelled', finished_at = $2 \
                             WHERE id = $1 AND status = 'running'",
                        )
                        .bind(id)
                        .bind(now)
                        .execute(&mut *tx)
                        .await?;
                        let row = sqlx::query(&format!("SELECT {BACKTEST_COLUMNS} FROM backtests WHERE id = $1"))
                            .bind(id)
                            .fetch_optional(&mut *tx)
                            .await?;
                        tx.commit().await?;
                        row.map(|r| record_from_row(&r, true)).transpose()
                    })
                }

                async fn backtest(&self, id: &str) -> StoreResult<Option<BacktestRecord>> {
                    sqlx::query(&format!("SELECT {BACKTEST_COLUMNS} FROM backtests WHERE id = $1"))
                        .bind(id)
                        .fetch_optional(self.read_pool())
                        .await?
                        .map(|r| record_from_row(&r, true))
                        .transpose()
                }

                async fn backtests(&self, limit: i64) -> StoreResult<Vec<BacktestRecord>> {
                    sqlx::query(&format!(
                        "SELECT {BACKTEST_COLUMNS} FROM backtests ORDER BY created_at DESC, id DESC LIMIT $1"
                    ))
                    .bind(limit)
                    .fetch_all(self.read_pool())
                    .await?
                    .iter()
                    .map(|r| record_from_row(r, false))
                    .collect()
                }

                async fn fail_stale_backtests(&self, before: Millis, now: Millis) -> StoreResult<u64> {
                    retry_conflicts!(async {
                        let mut tx = self.begin_write().await?;
                        let n = sqlx::query(
                            "UPDATE backtests SET status = 'failed', finished_at = $2, \
                             error = 'the process running it stopped' \
                             WHERE status = 'running' AND heartbeat_at < $1",
                        )
                        .bind(before)
                        .bind(now)
                        .execute(&mut *tx)
                        .await?
                        .rows_affected();
                        tx.commit().await?;
                        Ok(n)
                    })
                }
            }
        };
    };
}
pub(super) use impl_history;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_are_named_by_their_json_and_round_trip() {
        let small = br#"{"item":{"text":"hello hello hello hello"}}"#.to_vec();
        let large = format!(r#"{{"item":{{"text":"{}"}}}}"#, "hello ".repeat(400)).into_bytes();
        assert!(small.len() < COMPRESS_FROM && large.len() >= COMPRESS_FROM);
        for json in [small, large] {
            let a = InputDoc::new(InputKind::Snapshot, &json);
            let b = InputDoc::new(InputKind::Snapshot, &json);
            assert_eq!(a, b);
            assert_eq!(a.digest, crate::domain::Digest::of(&json).to_hex());
            assert_eq!(a.bytes, json.len() as i64);
            assert_eq!(InputDoc::decompress(&a.body, a.bytes).unwrap(), json);
        }
        assert_ne!(
            InputDoc::new(InputKind::Snapshot, br#"{"a":1}"#).digest,
            InputDoc::new(InputKind::Snapshot, b"{}").digest
        );
        assert!(InputDoc::decompress(b"not zstd", 10).is_err());
    }

    #[test]
    fn small_documents_are_stored_as_json_and_large_ones_compressed() {
        let small = InputDoc::new(InputKind::Snapshot, br#"{"item":{"text":"hi"}}"#);
        assert_eq!(small.body, br#"{"item":{"text":"hi"}}"#);
        let json = format!(r#"{{"item":{{"text":"{}"}}}}"#, "spam ".repeat(1000));
        let large = InputDoc::new(InputKind::Snapshot, json.as_bytes());
        assert!(
            large.body.len() * 10 < json.len(),
            "{} bytes compressed",
            large.body.len()
        );
        // Bodies stored before small documents were kept as JSON are zstd
        // frames of any size: they still read.
        let framed = zstd::bulk::compress(br#"{"a":1}"#, 3).unwrap();
        assert_eq!(InputDoc::decompress(&framed, 7).unwrap(), br#"{"a":1}"#);
        // A JSON body whose length disagrees with its row is corrupt.
        assert!(InputDoc::decompress(br#"{"a":1}"#, 8).is_err());
    }

    #[test]
    fn a_list_key_finds_its_list_in_the_stored_json_and_no_other() {
        let used = |name: &str| crate::rules::ListUse {
            name: name.into(),
            version: 3,
            digest: "ab".into(),
        };
        let json = serde_json::to_string(&[used("scam.v2"), used("urls")]).unwrap();
        assert!(json.contains(&super::list_key("scam.v2")), "{json}");
        assert!(json.contains(&super::list_key("urls")), "{json}");
        assert!(!json.contains(&super::list_key("scam")), "a prefix is another list");
        assert!(!json.contains(&super::list_key("rls")));
    }
}
