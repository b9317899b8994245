//! What gavel deletes, and when: expired idempotency keys, delivered
//! webhook deliveries and the outbox rows behind them, events already
//! evaluated, provider callbacks, after their configured retention; and the
//! console's expired sessions and claims, and skips of decided items;
//! evaluation snapshots and finished backtests. Each
//! run deletes in bounded chunks, so a transaction (on SQLite, the write
//! lock) stays short; the background task runs until a table is caught up.

use super::StoreResult;
use crate::clock::Millis;

/// How long each kind of row is kept (ms); `None` keeps it forever.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetentionPolicy {
    /// Whether the background task runs at all.
    pub enabled: bool,
    /// How often it runs.
    pub interval_ms: u64,
    /// Delivered webhook deliveries, and outbox rows once every delivery of
    /// them is gone (the changes feed reaches back this far). Dead
    /// deliveries are kept until replayed and delivered.
    pub outbox_ms: Option<i64>,
    /// Events whose evaluation has committed (counters keep their totals).
    pub events_ms: Option<i64>,
    /// Provider callbacks (their effect stays in decisions and transitions).
    pub callbacks_ms: Option<i64>,
    /// Stored evaluation snapshots (a backtest counts decisions whose
    /// snapshot is gone `not_replayable`), and finished backtests.
    pub snapshots_ms: Option<i64>,
    /// Rows deleted per table per statement.
    pub chunk: i64,
}

impl Default for RetentionPolicy {
    fn default() -> Self {
        const DAY: i64 = 86_400_000;
        RetentionPolicy {
            enabled: true,
            interval_ms: 60_000,
            outbox_ms: Some(7 * DAY),
            events_ms: Some(30 * DAY),
            callbacks_ms: Some(30 * DAY),
            snapshots_ms: Some(30 * DAY),
            chunk: 5_000,
        }
    }
}

/// Rows deleted by one pass, per table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pruned {
    pub idempotency_keys: u64,
    pub deliveries: u64,
    pub outbox: u64,
    pub events: u64,
    pub provider_callbacks: u64,
    /// Console sign-ins past their expiry.
    pub console_sessions: u64,
    /// Review claims past their expiry.
    pub review_claims: u64,
    /// Skips of items no longer held for review.
    pub review_skips: u64,
    /// Evaluation snapshots past their retention.
    pub snapshots: u64,
    /// Finished backtests past the snapshots' retention.
    pub backtests: u64,
}

impl Pruned {
    /// (table, rows) pairs, for metrics and logs.
    pub fn tables(&self) -> [(&'static str, u64); 10] {
        [
            ("idempotency_keys", self.idempotency_keys),
            ("deliveries", self.deliveries),
            ("outbox", self.outbox),
            ("events", self.events),
            ("provider_callbacks", self.provider_callbacks),
            ("console_sessions", self.console_sessions),
            ("review_claims", self.review_claims),
            ("review_skips", self.review_skips),
            ("snapshots", self.snapshots),
            ("backtests", self.backtests),
        ]
    }

    pub fn total(&self) -> u64 {
        self.tables().iter().map(|(_, n)| n).sum()
    }
}

/// Deleting what is past its retention.
#[async_trait::async_trait]
pub trait Retention: Send + Sync {
    /// Deletes up to `policy.chunk` rows per table that are past their
    /// retention at `now` (idempotency keys: past their own expiry, by the
    /// database's clock).
    async fn prune(&self, policy: &RetentionPolicy, now: Millis) -> StoreResult<Pruned>;
}

/// Instantiates [`Retention`] for one backend.
macro_rules! impl_retention {
    ($store:ty, $db:ty, $row:ty) => {
        const _: () = {
            use std::sync::LazyLock;
            use $crate::clock::Millis;
            use $crate::store::dialect::{Dialect, retry_conflicts};
            use $crate::store::*;

            static EXPIRED_KEYS: LazyLock<String> = LazyLock::new(|| {
                format!(
                    "DELETE FROM idempotency_keys WHERE (scope, key) IN (SELECT scope, key FROM idempotency_keys \
                     WHERE expires_at <= {} LIMIT $1)",
                    <$store as Dialect>::NOW_MS
                )
            });

            async fn delete(store: &$store, sql: &str, cutoff: Option<Millis>, chunk: i64) -> StoreResult<u64> {
                delete_up_to(store, sql, cutoff, chunk, None).await
            }

            /// [`delete`] with a third parameter, `$3`: the last key of the
            /// rows it may look at (see [`last_older_than`]).
            async fn delete_up_to(
                store: &$store,
                sql: &str,
                cutoff: Option<Millis>,
                chunk: i64,
                last: Option<i64>,
            ) -> StoreResult<u64> {
                retry_conflicts!(async {
                    let mut tx = store.begin_write().await?;
                    let mut q = sqlx::query(sql);
                    if let Some(cutoff) = cutoff {
                        q = q.bind(cutoff);
                    }
                    q = q.bind(chunk);
                    if let Some(last) = last {
                        q = q.bind(last);
                    }
                    let n = q.execute(&mut *tx).await?.rows_affected();
                    tx.commit().await?;
                    Ok(n)
                })
            }

            /// The greatest `key` of `table` whose row was created (column
            /// `created_at`) before `cutoff`, if any, found by bisecting the
            /// key range with point reads on the primary key. Keys grow
            /// with the time (up to the moment between a write reading the
            /// clock and committing), so the rows past their time lie at the
            /// start of the key order: retention reads them there, and
            /// inserts into these tables (an outbox row per transition, an
            /// event per vote or flag, a snapshot per evaluation) pay for no
            /// index on the time. A row a little out of that order is
            /// deleted by a later pass; a row created after `cutoff` never,
            /// whatever its key (the deletes check the time too).
            async fn last_older_than(
                store: &$store,
                table: &str,
                key: &str,
                created_at: &str,
                cutoff: Millis,
            ) -> StoreResult<Option<i64>> {
                let first_from =
                    format!("SELECT {key}, {created_at} FROM {table} WHERE {key} >= $1 ORDER BY {key} LIMIT 1");
                let first = async |from: i64| -> StoreResult<Option<(i64, Millis)>> {
                    Ok(sqlx::query_as::<_, (i64, Millis)>(&first_from)
                        .bind(from)
                        .fetch_optional(store.read_pool())
                        .await?)
                };
                let Some((mut lo, created)) = first(i64::MIN).await? else {
                    return Ok(None);
                };
                if created >= cutoff {
                    return Ok(None);
                }
                let hi: Option<i64> = sqlx::query_scalar(&format!("SELECT MAX({key}) FROM {table}"))
                    .fetch_one(store.read_pool())
                    .await?;
                // (Emptied meanwhile: the first row's key is as good a bound.)
                let mut hi = hi.unwrap_or(lo);
                // `lo` is a key older than `cutoff`; no key past `hi` is.
                while lo < hi {
                    let mid = lo + (hi - lo + 1) / 2;
                    match first(mid).await? {
                        Some((k, created)) if k <= hi && created < cutoff => lo = k,
                        _ => hi = mid - 1,
                    }
                }
                Ok(Some(lo))
            }

            /// Deletes with `sql` among the rows of `table` up to the last
            /// one past `cutoff` by `time` in `key` order ([`last_older_than`],
            /// bound to `$3`); nothing when no row is that old.
            async fn delete_in_key_order(
                store: &$store,
                (table, key, time): (&str, &str, &str),
                sql: &str,
                cutoff: Millis,
                chunk: i64,
            ) -> StoreResult<u64> {
                match last_older_than(store, table, key, time, cutoff).await? {
                    Some(last) => delete_up_to(store, sql, Some(cutoff), chunk, Some(last)).await,
                    None => Ok(0),
                }
            }

            #[async_trait::async_trait]
            impl Retention for $store {
                async fn prune(&self, p: &RetentionPolicy, now: Millis) -> StoreResult<Pruned> {
                    let mut out = Pruned {
                        idempotency_keys: delete(self, EXPIRED_KEYS.as_str(), None, p.chunk).await?,
                        ..Pruned::default()
                    };
                    if let Some(keep) = p.outbox_ms {
                        out.deliveries = delete(
                            self,
                            "DELETE FROM deliveries WHERE id IN (SELECT id FROM deliveries \
                             WHERE status = 'delivered' AND created_at < $1 LIMIT $2)",
                            Some(now - keep),
                            p.chunk,
                        )
                        .await?;
                        out.outbox = delete_in_key_order(
                            self,
                            ("outbox", "seq", "created_at"),
                            // Past its time, no delivery left, and every endpoint's
                            // cursor past it (a cursor that has not moved for the
                            // whole period belongs to an endpoint nobody serves).
                            &format!(
                                "DELETE FROM outbox WHERE seq IN (SELECT o.seq FROM outbox o WHERE o.seq <= $3 \
                                 AND o.created_at < $1 \
                                 AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.event_id = o.event_id) \
                                 AND NOT EXISTS (SELECT 1 FROM webhook_cursors c WHERE c.updated_at >= $1 \
                                 AND {}) LIMIT $2)",
                                <$store as Dialect>::FEED_AFTER_CURSOR
                            ),
                            now - keep,
                            p.chunk,
                        )
                        .await?;
                    }
                    if let Some(keep) = p.events_ms {
                        out.events = delete_in_key_order(
                            self,
                            ("events", "id", "created_at"),
                            "DELETE FROM events WHERE id IN (SELECT e.id FROM events e JOIN items i ON i.id = e.item_id \
                             WHERE e.id <= $3 AND e.created_at < $1 AND e.seq <= i.evaluated_seq LIMIT $2)",
                            now - keep,
                            p.chunk,
                        )
                        .await?;
                    }
                    if let Some(keep) = p.callbacks_ms {
                        out.provider_callbacks = delete(
                            self,
                            "DELETE FROM provider_callbacks WHERE id IN (SELECT id FROM provider_callbacks \
                             WHERE received_at < $1 LIMIT $2)",
                            Some(now - keep),
                            p.chunk,
                        )
                        .await?;
                    }
                    if let Some(keep) = p.snapshots_ms {
                        // Config documents, in the same key order, are kept.
                        out.snapshots = delete_in_key_order(
                            self,
                            ("snapshots", "id", "used_at"),
                            "DELETE FROM snapshots WHERE id IN (SELECT id FROM snapshots \
                             WHERE id <= $3 AND kind = 'snapshot' AND used_at < $1 LIMIT $2)",
                            now - keep,
                            p.chunk,
                        )
                        .await?;
                        out.backtests = delete(
                            self,
                            "DELETE FROM backtests WHERE id IN (SELECT id FROM backtests \
                             WHERE status <> 'running' AND finished_at < $1 LIMIT $2)",
                            Some(now - keep),
                            p.chunk,
                        )
                        .await?;
                    }
                    // The console's own state, kept only while it means something.
                    out.console_sessions = delete(
                        self,
                        "DELETE FROM console_sessions WHERE id_hash IN (SELECT id_hash FROM console_sessions \
                         WHERE expires_at < $1 LIMIT $2)",
                        Some(now),
                        p.chunk,
                    )
                    .await?;
                    out.review_claims = delete(
                        self,
                        "DELETE FROM review_claims WHERE item_id IN (SELECT item_id FROM review_claims \
                         WHERE expires_at < $1 LIMIT $2)",
                        Some(now),
                        p.chunk,
                    )
                    .await?;
                    out.review_skips = delete(
                        self,
                        "DELETE FROM review_skips WHERE (item_id, moderator) IN (SELECT s.item_id, s.moderator \
                         FROM review_skips s JOIN items i ON i.id = s.item_id \
                         WHERE i.status <> 'held_for_review' LIMIT $1)",
                        None,
                        p.chunk,
                    )
                    .await?;
                    Ok(out)
                }
            }
        };
    };
}
pub(super) use impl_retention;
