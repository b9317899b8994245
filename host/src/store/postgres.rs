//! PostgreSQL backend: for several gavel processes. Every state change is a
//! conditional `UPDATE … RETURNING` in READ COMMITTED: the row lock plus the
//! version check decide races; unique constraints decide duplicates. Paths
//! that change an item lock the item before anything else, and
//! serialization failures or deadlocks are retried as a whole.

use super::dialect::{Dialect, Tx};
use super::{StoreError, StoreResult};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgRow};
use sqlx::{Pool, Postgres};
use std::str::FromStr;
use std::time::Duration;

/// The PostgreSQL store.
#[derive(Clone)]
pub struct PgStore {
    pool: Pool<Postgres>,
}

impl PgStore {
    /// Connects to `url` and migrates the database.
    pub async fn open(url: &str, max_connections: u32) -> anyhow::Result<Self> {
        // Every multi-row text (five sizes per statement) stays prepared.
        let options = PgConnectOptions::from_str(url)?.statement_cache_capacity(512);
        let pool = PgPoolOptions::new()
            .max_connections(max_connections.max(2))
            .acquire_timeout(Duration::from_secs(5))
            .connect_with(options)
            .await?;
        sqlx::migrate!("./migrations/postgres").run(&pool).await?;
        Ok(PgStore { pool })
    }

    /// A write transaction of group commit (submissions, events,
    /// evaluation commits), whose statements find every row they read or
    /// change by its key. The planner is kept to index lookups in it:
    /// PostgreSQL caches a prepared statement's generic plan for the life
    /// of the connection, and one made while a table is still small (a new
    /// database, before its first `ANALYZE`) scans the whole table and
    /// hashes it, a plan that then stays while the table grows, until
    /// autoanalyze invalidates it. On a new database that made runs of the
    /// same load settle anywhere between 2,150 and 3,336 items/s (README,
    /// "Performance").
    pub(crate) async fn begin_batch(&self) -> StoreResult<Tx<'_, Postgres>> {
        let tx = self
            .pool
            .begin_with(
                "BEGIN; SET LOCAL enable_seqscan = off; SET LOCAL enable_hashjoin = off; \
                 SET LOCAL enable_mergejoin = off",
            )
            .await?;
        Ok(Tx::new(tx, None))
    }

    /// The read-only transaction a claimed batch's snapshots are read in
    /// (`store/evaluations.rs`), kept to index lookups as `begin_batch` is:
    /// its statements bind the batch as arrays, one text whatever the
    /// batch's length, so each connection makes one generic plan of each
    /// and keeps it until an ANALYZE of its tables, and one made while a
    /// table is small would scan it. Planned under these settings, every
    /// read is an index lookup whatever the statistics.
    pub(crate) async fn begin_batch_snapshot(&self) -> StoreResult<Tx<'_, Postgres>> {
        let tx = self
            .pool
            .begin_with(
                "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET LOCAL enable_seqscan = off; \
                 SET LOCAL enable_hashjoin = off; SET LOCAL enable_mergejoin = off",
            )
            .await?;
        Ok(Tx::new(tx, None))
    }

    /// Takes the row locks of these items, in id order, before a write
    /// that touches several of them over more than one statement.
    /// Concurrent multi-item writes (evaluation commits, event batches)
    /// then queue on the first item they share instead of deadlocking:
    /// PostgreSQL only detects a deadlock after `deadlock_timeout` (a
    /// second) and aborts one side. One statement over the ids bound as one
    /// array, so the whole set is locked in one order, and one text
    /// whatever their number. (SQLite has one writer: nothing to lock.)
    pub(crate) async fn lock_items(tx: &mut Tx<'_, Postgres>, ids: &[&str]) -> StoreResult<()> {
        if ids.is_empty() {
            return Ok(());
        }
        sqlx::query("SELECT id FROM items WHERE id = ANY($1) ORDER BY id FOR UPDATE")
            .bind(ids)
            .fetch_all(&mut **tx)
            .await?;
        Ok(())
    }

    /// A log's horizon (see `super::exports`): the newest id visible now,
    /// once every transaction that was writing when it was read has ended.
    /// Ids come from one sequence, so any id at or below it was drawn
    /// before the read, by a transaction that had committed (and is
    /// visible), had rolled back, or was open then; once the open ones end,
    /// no row at or below it can appear any more.
    pub(crate) async fn log_horizon(&self, table: &'static str) -> StoreResult<i64> {
        let (top, open): (i64, Vec<i64>) = sqlx::query_as(&format!(
            "SELECT COALESCE((SELECT MAX(id) FROM {table}), 0), \
             ARRAY(SELECT x::text::bigint FROM pg_snapshot_xip(pg_current_snapshot()) x)"
        ))
        .fetch_one(&self.pool)
        .await?;
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let mut pause = Duration::from_millis(1);
        while !open.is_empty() {
            let running: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM unnest($1::bigint[]) x WHERE pg_xact_status(x::text::xid8) = 'in progress'",
            )
            .bind(&open)
            .fetch_one(&self.pool)
            .await?;
            if running == 0 {
                break;
            }
            if std::time::Instant::now() > deadline {
                return Err(StoreError::Unavailable(format!(
                    "{running} writing transactions stayed open for 30 s; the export's horizon cannot be fixed"
                )));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(50));
        }
        Ok(top)
    }
}

impl Dialect for PgStore {
    type DB = Postgres;
    const SKIP_LOCKED: &'static str = " FOR UPDATE SKIP LOCKED";
    const FOR_UPDATE: &'static str = " FOR UPDATE";
    const FEED_HORIZON: &'static str = " AND txid < pg_snapshot_xmin(pg_current_snapshot())::text::bigint";
    const DUE_ORDER: &'static str = "";
    const ITEM_ORDER: &'static str = "";
    const FEED_AFTER: &'static str = "((txid, seq) > ($1, $2))";
    const FEED_AFTER_CURSOR: &'static str = "((o.txid, o.seq) > (c.txid, c.seq))";
    const FEED_ORDER: &'static str = "txid, seq";
    const FEED_ORDER_DESC: &'static str = "txid DESC, seq DESC";
    const NOW_MS: &'static str = "(EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::bigint";
    const BYTE_ORDER: &'static str = " COLLATE \"C\"";
    const POSITION: &'static str = "strpos";
    const HAS_LABEL: &'static str = "d.labels::jsonb @> jsonb_build_array(CAST({} AS TEXT))";
    const ANONYMOUS_PARAMETERS: bool = false;

    fn read_pool(&self) -> &Pool<Postgres> {
        &self.pool
    }

    async fn begin_write(&self) -> StoreResult<Tx<'_, Postgres>> {
        Ok(Tx::new(self.pool.begin().await?, None))
    }

    async fn begin_snapshot(&self) -> StoreResult<Tx<'_, Postgres>> {
        let tx = self
            .pool
            .begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            .await?;
        Ok(Tx::new(tx, None))
    }
}

#[async_trait::async_trait]
impl super::Backend for PgStore {
    fn backend(&self) -> &'static str {
        "postgres"
    }

    async fn ping(&self) -> StoreResult<()> {
        sqlx::query("SELECT 1")
            .execute(&self.pool)
            .await
            .map_err(StoreError::from)?;
        Ok(())
    }
}

super::shared::impl_shared!(PgStore, Postgres, PgRow);
super::items::impl_items!(PgStore, Postgres, PgRow);
super::submissions::impl_submissions!(PgStore, Postgres, PgRow);
super::events::impl_events!(PgStore, Postgres, PgRow);
super::idempotency::impl_idempotency!(PgStore, Postgres, PgRow);
super::evaluations::impl_evaluations!(PgStore, Postgres, PgRow);
super::evaluations::impl_dead_letters!(PgStore, Postgres, PgRow);
super::outbox::impl_outbox!(PgStore, Postgres, PgRow);
super::providers::impl_providers!(PgStore, Postgres, PgRow);
super::plugins::impl_plugin_history!(PgStore, Postgres, PgRow);
super::retention::impl_retention!(PgStore, Postgres, PgRow);
super::review::impl_review!(PgStore, Postgres, PgRow);
super::history::impl_history!(PgStore, Postgres, PgRow);

/// A PostgreSQL row's values by position.
struct PgFields<'r>(&'r PgRow);

impl super::exports::Fields for PgFields<'_> {
    fn int(&self, i: usize) -> StoreResult<i64> {
        Ok(sqlx::Row::try_get(self.0, i)?)
    }
    fn opt_int(&self, i: usize) -> StoreResult<Option<i64>> {
        Ok(sqlx::Row::try_get(self.0, i)?)
    }
    fn float(&self, i: usize) -> StoreResult<f64> {
        Ok(sqlx::Row::try_get(self.0, i)?)
    }
    fn boolean(&self, i: usize) -> StoreResult<bool> {
        Ok(sqlx::Row::try_get(self.0, i)?)
    }
    fn text(&self, i: usize) -> StoreResult<String> {
        Ok(sqlx::Row::try_get(self.0, i)?)
    }
    fn opt_text(&self, i: usize) -> StoreResult<Option<String>> {
        Ok(sqlx::Row::try_get(self.0, i)?)
    }
}

#[async_trait::async_trait]
impl super::Exports for PgStore {
    async fn export_horizon(&self, table: super::ExportTable) -> StoreResult<i64> {
        match table.log_table() {
            Some(log) => self.log_horizon(log).await,
            None => Ok(0),
        }
    }

    async fn export_page(
        &self,
        table: super::ExportTable,
        filter: &super::ExportFilter,
        after: &super::ExportKey,
        upto: i64,
        limit: i64,
    ) -> StoreResult<Vec<super::ExportRow>> {
        use super::exports::{KeyValues, key_values, row_of, sql_for};
        let mut q = sqlx::query(sql_for(table, filter.client.is_some()))
            .bind(filter.since)
            .bind(filter.until)
            .bind(limit);
        if let Some(client) = &filter.client {
            q = q.bind(client.as_str());
        }
        q = match key_values(table, after, upto) {
            KeyValues::Log(id, upto) => q.bind(id).bind(upto),
            KeyValues::Item(id) => q.bind(id),
            KeyValues::Author(client, author) => q.bind(client).bind(author),
        };
        q.fetch_all(&self.pool)
            .await?
            .iter()
            .map(|r| row_of(table, &PgFields(r)))
            .collect()
    }
}
super::authors::impl_authors!(PgStore, Postgres, PgRow);
super::appeals::impl_appeals!(PgStore, Postgres, PgRow);
super::lists::impl_lists!(PgStore, Postgres, PgRow);
