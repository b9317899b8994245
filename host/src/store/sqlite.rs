//! SQLite backend: the default for one node. WAL journal; one write
//! connection taking `BEGIN IMMEDIATE`, so writers queue in the pool instead
//! of failing with SQLITE_BUSY; a separate pool of read connections.
//!
//! Durability: `synchronous = FULL` by default, so a write acknowledged
//! with 202 survives an OS crash or a power cut (group commit shares one
//! fsync among a batch). `NORMAL` is an opt-in: a commit survives a crash of
//! the gavel process, but an OS crash or power loss may lose the last
//! transactions.

use super::dialect::Dialect;
use super::{StoreError, StoreResult};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteRow, SqliteSynchronous};
use sqlx::{Pool, Sqlite, Transaction};
use std::str::FromStr;
use std::time::Duration;

/// How SQLite makes a commit durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Synchronous {
    /// fsync on every commit: an acknowledged write survives power loss.
    #[default]
    Full,
    /// fsync at checkpoints only: survives a process crash, not power loss.
    Normal,
}

/// The SQLite store.
#[derive(Clone)]
pub struct SqliteStore {
    write: Pool<Sqlite>,
    read: Pool<Sqlite>,
}

impl SqliteStore {
    /// Opens (creating if missing) the database at `url` and migrates it.
    pub async fn open(url: &str, max_read_connections: u32, synchronous: Synchronous) -> anyhow::Result<Self> {
        let options = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(match synchronous {
                Synchronous::Full => SqliteSynchronous::Full,
                Synchronous::Normal => SqliteSynchronous::Normal,
            })
            .busy_timeout(Duration::from_secs(10))
            // Every multi-row text (five sizes per statement) stays prepared.
            .statement_cache_capacity(512)
            // A page cache large enough for the hot parts of the indexes
            // (the default is 2 MiB), and reads through mmap instead of
            // copying each page out of the OS cache.
            .pragma("cache_size", "-65536")
            .pragma("mmap_size", "268435456")
            .pragma("temp_store", "memory")
            .foreign_keys(true);
        if let Some(parent) = url
            .strip_prefix("sqlite://")
            .map(|p| std::path::Path::new(p.split('?').next().unwrap_or(p)))
            .and_then(|p| p.parent())
            .filter(|p| !p.as_os_str().is_empty())
        {
            std::fs::create_dir_all(parent)?;
        }
        {
            // Migrations that rebuild a referenced table need the foreign
            // key checks off while they run (SQLite's documented procedure):
            // they run on a connection of their own, and the keys are
            // checked as a whole afterwards.
            let migrate = SqlitePoolOptions::new()
                .max_connections(1)
                .connect_with(options.clone().foreign_keys(false))
                .await?;
            sqlx::migrate!("./migrations/sqlite").run(&migrate).await?;
            let broken: Vec<(String,)> = sqlx::query_as("SELECT \"table\" FROM pragma_foreign_key_check")
                .fetch_all(&migrate)
                .await?;
            anyhow::ensure!(broken.is_empty(), "foreign keys broken after migrating: {broken:?}");
            migrate.close().await;
        }
        let write = SqlitePoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(options.clone())
            .await?;
        let read = SqlitePoolOptions::new()
            .max_connections(max_read_connections.max(1))
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(options.read_only(true))
            .await?;
        Ok(SqliteStore { write, read })
    }

    /// The `synchronous` setting the write connection runs with (0 off,
    /// 1 normal, 2 full), read back from SQLite.
    pub async fn synchronous(&self) -> StoreResult<i64> {
        Ok(sqlx::query_scalar("PRAGMA synchronous").fetch_one(&self.write).await?)
    }
}

impl Dialect for SqliteStore {
    type DB = Sqlite;
    const SKIP_LOCKED: &'static str = "";
    const FOR_UPDATE: &'static str = "";
    const FEED_HORIZON: &'static str = "";
    const NOW_MS: &'static str = "CAST(unixepoch('subsec') * 1000 AS INTEGER)";
    const BYTE_ORDER: &'static str = "";
    const POSITION: &'static str = "instr";
    const ANONYMOUS_PARAMETERS: bool = true;

    fn read_pool(&self) -> &Pool<Sqlite> {
        &self.read
    }

    async fn begin_write(&self) -> StoreResult<Transaction<'_, Sqlite>> {
        Ok(self.write.begin_with("BEGIN IMMEDIATE").await?)
    }

    async fn begin_snapshot(&self) -> StoreResult<Transaction<'_, Sqlite>> {
        Ok(self.read.begin().await?)
    }
}

#[async_trait::async_trait]
impl super::Backend for SqliteStore {
    fn backend(&self) -> &'static str {
        "sqlite"
    }

    async fn ping(&self) -> StoreResult<()> {
        sqlx::query("SELECT 1")
            .execute(&self.read)
            .await
            .map_err(StoreError::from)?;
        Ok(())
    }
}

super::shared::impl_shared!(SqliteStore, Sqlite, SqliteRow);
super::items::impl_items!(SqliteStore, Sqlite, SqliteRow);
super::submissions::impl_submissions!(SqliteStore, Sqlite, SqliteRow);
super::events::impl_events!(SqliteStore, Sqlite, SqliteRow);
super::idempotency::impl_idempotency!(SqliteStore, Sqlite, SqliteRow);
super::evaluations::impl_evaluations!(SqliteStore, Sqlite, SqliteRow);
super::outbox::impl_outbox!(SqliteStore, Sqlite, SqliteRow);
super::providers::impl_providers!(SqliteStore, Sqlite, SqliteRow);
super::plugins::impl_plugin_history!(SqliteStore, Sqlite, SqliteRow);
super::retention::impl_retention!(SqliteStore, Sqlite, SqliteRow);
super::review::impl_review!(SqliteStore, Sqlite, SqliteRow);
super::history::impl_history!(SqliteStore, Sqlite, SqliteRow);
super::authors::impl_authors!(SqliteStore, Sqlite, SqliteRow);
