//! PostgreSQL backend: for several gavel processes. Every state change is a
//! conditional `UPDATE … RETURNING` in READ COMMITTED: the row lock plus the
//! version check decide races; unique constraints decide duplicates.

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Pool, Postgres};
use std::str::FromStr;
use std::time::Duration;

/// The PostgreSQL store.
#[derive(Clone)]
pub struct PgStore {
    write: Pool<Postgres>,
    /// The same pool: PostgreSQL needs no separate readers.
    read: Pool<Postgres>,
}

impl PgStore {
    /// Connects to `url` and migrates the database.
    pub async fn open(url: &str, max_connections: u32) -> anyhow::Result<Self> {
        let options = PgConnectOptions::from_str(url)?;
        let pool = PgPoolOptions::new()
            .max_connections(max_connections.max(2))
            .acquire_timeout(Duration::from_secs(5))
            .connect_with(options)
            .await?;
        sqlx::migrate!("./migrations/postgres").run(&pool).await?;
        Ok(PgStore {
            write: pool.clone(),
            read: pool,
        })
    }
}

super::sql::impl_store!(
    PgStore,
    Postgres,
    sqlx::postgres::PgRow,
    "postgres",
    lock = " FOR UPDATE SKIP LOCKED",
    row_lock = " FOR UPDATE",
    horizon = " AND txid < pg_snapshot_xmin(pg_current_snapshot())::text::bigint",
    |s| s.write.begin()
);
