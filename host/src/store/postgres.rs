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
}

impl Dialect for PgStore {
    type DB = Postgres;
    const SKIP_LOCKED: &'static str = " FOR UPDATE SKIP LOCKED";
    const FOR_UPDATE: &'static str = " FOR UPDATE";
    const FEED_HORIZON: &'static str = " AND txid < pg_snapshot_xmin(pg_current_snapshot())::text::bigint";
    const FEED_AFTER: &'static str = "(txid > $1 OR (txid = $1 AND seq > $2))";
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
super::authors::impl_authors!(PgStore, Postgres, PgRow);
super::lists::impl_lists!(PgStore, Postgres, PgRow);
