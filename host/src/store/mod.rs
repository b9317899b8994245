//! The store: the only source of truth. Two backends, SQLite (default, one
//! node) and PostgreSQL (many nodes), implement one small trait per
//! capability; [`ItemStore`] is their union. Every state change is one
//! conditional write with its audit row in the same transaction; a batch
//! (group commit, the batch API) shares a transaction and multi-row
//! statements, but every write in it is still fenced on its own.
//!
//! # Layout
//!
//! One file per capability, holding its SQL (one text for both dialects,
//! `$N` parameters) and its implementation, instantiated for each backend
//! by a macro:
//!
//! - [`appeals`]: appeals of restrictive decisions, closed only by a moderator ([`Appeals`]).
//! - [`authors`]: authors' account standing, fenced by the author's version ([`Authors`]).
//! - [`submissions`]: new items, their status decided in the write ([`Submissions`]).
//! - [`events`]: interaction events, the high-volume input ([`Events`]).
//! - [`items`]: reads, manual transitions, the review queue ([`Items`]).
//! - [`idempotency`]: claiming keys; responses are stored with the effect ([`Idempotency`]).
//! - [`evaluations`]: snapshots, fenced evaluation commits, dead letters ([`Evaluations`]).
//! - [`outbox`]: the changes feed and webhook deliveries ([`Outbox`]).
//! - [`providers`]: hand-offs to external classifiers and their callbacks ([`Providers`]).
//! - [`plugins`]: which code ran when, and its figures ([`PluginHistory`]).
//! - [`history`]: the input of every evaluation, and backtest runs ([`History`]).
//! - [`exports`]: the record in key order, for exports ([`Exports`]).
//! - [`retention`]: what is deleted when ([`Retention`]).
//! - [`lists`]: lists moderators edit and their versions ([`Lists`]).
//! - [`review`]: the moderator console's sessions, review claims and reads ([`Review`]).
//! - `shared`: the transaction helpers every capability uses (audit rows,
//!   decisions, key completion).
//! - `dialect`: the few things the two backends do differently.
//! - [`group`]: group commit of concurrent writes.
//! - `rows`: stored strings to enums, in one place.

pub mod appeals;
pub mod authors;
mod bulk;
mod dialect;
pub mod evaluations;
pub mod events;
pub mod exports;
mod group;
pub mod history;
pub mod idempotency;
pub mod items;
pub mod lists;
pub mod outbox;
pub mod plugins;
mod postgres;
pub mod providers;
pub mod retention;
pub mod review;
mod rows;
mod shared;
mod sqlite;
pub mod submissions;

pub use appeals::*;
pub use authors::*;
pub use evaluations::*;
pub use events::*;
pub use exports::*;
pub use group::{GroupCommit, WriteQueue, Writes};
pub use history::*;
pub use idempotency::*;
pub use items::*;
pub use lists::{ListContent, ListVersionRecord, ListWrite, Lists, NewListVersion};
pub use outbox::*;
pub use plugins::*;
pub use postgres::PgStore;
pub use providers::*;
pub use retention::*;
pub use review::*;
pub use sqlite::{SqliteStore, Synchronous};
pub use submissions::*;

use std::sync::Arc;

/// A store error. Bad input is refused by the API before it gets here;
/// [`StoreError::Invalid`] is the backstop when some still does.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// The database cannot be reached right now (down, restarting, pool
    /// exhausted). The API answers 503 with `Retry-After`.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The database refused a value (SQLSTATE class 22, e.g. a NUL byte in
    /// text on PostgreSQL). The API answers 400.
    #[error("invalid value: {0}")]
    Invalid(String),
    /// A serialization failure or deadlock (40001, 40P01): the transaction
    /// was rolled back and is retried; if it keeps failing, the API answers 503.
    #[error("conflicting transactions: {0}")]
    Conflict(String),
    /// A row the store wrote cannot be read back (a bug, or a hand edit).
    #[error("corrupt row: {0}")]
    Corrupt(String),
    /// Any other database error.
    #[error("database error: {0}")]
    Database(String),
}

impl StoreError {
    /// Whether retrying the whole transaction may succeed.
    pub fn is_conflict(&self) -> bool {
        matches!(self, StoreError::Conflict(_))
    }
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        use sqlx::Error as E;
        match &e {
            E::PoolTimedOut | E::PoolClosed | E::Io(_) | E::Tls(_) | E::WorkerCrashed => {
                StoreError::Unavailable(e.to_string())
            }
            E::Database(db) => match db.code().as_deref() {
                // PostgreSQL: connection exceptions, shutdown, recovery, too many connections.
                Some(c) if c.starts_with("08") || c.starts_with("57P") || c == "53300" => {
                    StoreError::Unavailable(e.to_string())
                }
                Some("40001" | "40P01") => StoreError::Conflict(e.to_string()),
                // PostgreSQL data exceptions: a value the database refuses.
                Some(c) if c.starts_with("22") => StoreError::Invalid(e.to_string()),
                // SQLite: busy/locked (only past the busy timeout), I/O, cannot open.
                Some("5" | "6" | "10" | "14") => StoreError::Unavailable(e.to_string()),
                // SQLite: a string or blob too big.
                Some("18") => StoreError::Invalid(e.to_string()),
                _ => StoreError::Database(e.to_string()),
            },
            E::ColumnDecode { .. } | E::Decode(_) | E::ColumnNotFound(_) | E::TypeNotFound { .. } => {
                StoreError::Corrupt(e.to_string())
            }
            _ => StoreError::Database(e.to_string()),
        }
    }
}

impl From<crate::domain::UnknownVariant> for StoreError {
    fn from(e: crate::domain::UnknownVariant) -> Self {
        StoreError::Corrupt(e.to_string())
    }
}

pub type StoreResult<T> = Result<T, StoreError>;

/// What every backend says about itself.
#[async_trait::async_trait]
pub trait Backend: Send + Sync + 'static {
    /// Which backend this is, for logs and `/readyz`.
    fn backend(&self) -> &'static str;

    /// Checks the database answers.
    async fn ping(&self) -> StoreResult<()>;

    /// A queue of its own for the hot writes, if the backend batches them
    /// itself (SQLite's writer thread); `None` takes group commit over the
    /// batch methods ([`Writes::start`]).
    fn write_queue(&self, _metrics: &crate::metrics::Metrics) -> Option<Arc<dyn WriteQueue>> {
        None
    }
}

/// Every capability of a store. Run the conformance suite in
/// `tests/tests/suite/store.rs` against a new backend. Consumers take the
/// narrowest capability they need (`Arc<dyn Outbox>` for the dispatcher).
pub trait ItemStore:
    Backend
    + Appeals
    + Authors
    + Items
    + Submissions
    + Events
    + Idempotency
    + Evaluations
    + DeadLetters
    + Outbox
    + Providers
    + PluginHistory
    + History
    + Exports
    + Retention
    + Review
    + Lists
    + BacktestStore
{
}

/// What a backtest reads: stored history, the lists' versions its replays
/// answer from, and the items a new signal's values are recomputed from.
pub trait BacktestStore: History + Lists + Items {}

impl<T: History + Lists + Items + ?Sized> BacktestStore for T {}

impl<T> ItemStore for T where
    T: Backend
        + Appeals
        + Authors
        + Items
        + Submissions
        + Events
        + Idempotency
        + Evaluations
        + DeadLetters
        + Outbox
        + Providers
        + PluginHistory
        + History
        + Exports
        + Retention
        + Review
        + Lists
{
}

/// A shared store handle.
pub type SharedStore = Arc<dyn ItemStore>;

/// How to open the store.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// `sqlite://PATH` or `postgres://...`.
    pub url: String,
    pub max_connections: u32,
    /// SQLite only: `FULL` (default) or `NORMAL`.
    pub synchronous: Synchronous,
}

/// Opens the store a URL names and runs its migrations.
pub async fn open(options: &StoreOptions) -> anyhow::Result<SharedStore> {
    let url = options.url.as_str();
    if url.starts_with("sqlite:") {
        Ok(Arc::new(
            SqliteStore::open(url, options.max_connections, options.synchronous).await?,
        ))
    } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
        Ok(Arc::new(PgStore::open(url, options.max_connections).await?))
    } else {
        anyhow::bail!("unsupported database URL {url:?}: use sqlite://PATH or postgres://...")
    }
}

/// Opens `url` with the defaults (FULL sync on SQLite), for tools and tests.
pub async fn open_url(url: &str, max_connections: u32) -> anyhow::Result<SharedStore> {
    open(&StoreOptions {
        url: url.to_string(),
        max_connections,
        synchronous: Synchronous::Full,
    })
    .await
}

/// The statements of the keyset pages read after a cursor of two columns
/// (the review queue, an appeal queue, the authors export), one text on
/// both stores, for the test that reads their plans.
#[doc(hidden)]
pub fn keyset_pages_sql() -> [&'static str; 3] {
    [
        items::review_page(),
        appeals::queue_page(),
        exports::sql_for(ExportTable::Authors, false),
    ]
}
