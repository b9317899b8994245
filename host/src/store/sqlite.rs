//! SQLite backend: the default for one node. WAL journal; one write
//! connection taking `BEGIN IMMEDIATE`, so writers queue in the pool instead
//! of failing with SQLITE_BUSY; a separate pool of read connections.

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Pool, Sqlite};
use std::str::FromStr;
use std::time::Duration;

/// The SQLite store.
#[derive(Clone)]
pub struct SqliteStore {
    write: Pool<Sqlite>,
    read: Pool<Sqlite>,
}

impl SqliteStore {
    /// Opens (creating if missing) the database at `url` and migrates it.
    pub async fn open(url: &str, max_read_connections: u32) -> anyhow::Result<Self> {
        let options = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            // NORMAL in WAL mode: a commit survives a process crash; only an
            // OS crash or power loss may lose the last transactions.
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(10))
            .foreign_keys(true);
        if let Some(parent) = url
            .strip_prefix("sqlite://")
            .map(|p| std::path::Path::new(p.split('?').next().unwrap_or(p)))
            .and_then(|p| p.parent())
            .filter(|p| !p.as_os_str().is_empty())
        {
            std::fs::create_dir_all(parent)?;
        }
        let write = SqlitePoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(options.clone())
            .await?;
        sqlx::migrate!("./migrations/sqlite").run(&write).await?;
        let read = SqlitePoolOptions::new()
            .max_connections(max_read_connections.max(1))
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(options.read_only(true))
            .await?;
        Ok(SqliteStore { write, read })
    }
}

super::sql::impl_store!(
    SqliteStore,
    Sqlite,
    sqlx::sqlite::SqliteRow,
    "sqlite",
    lock = "",
    row_lock = "",
    horizon = "",
    |s| s.write.begin_with("BEGIN IMMEDIATE")
);
