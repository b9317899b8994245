//! SQLite backend: the default for one node. WAL journal; one thread owns
//! the write connection and takes every write from one queue into shared
//! transactions ([`writer`]); a thread of its own reads the snapshots of
//! claimed batches ([`reader`]); the cold paths' reads go through a pool of
//! read-only sqlx connections, and their writes through sqlx on a second
//! write connection during a turn the writer lends them. WAL checkpoints
//! run passively on a thread of their own, never on the writer's.
//!
//! Durability: `synchronous = FULL` by default, so a write acknowledged
//! with 202 survives an OS crash or a power cut (the writer answers after
//! `COMMIT`, and one fsync serves every write of a transaction). `NORMAL`
//! is an opt-in: a commit survives a crash of the gavel process, but an OS
//! crash or power loss may lose the last transactions.
//!
//! # Layout
//!
//! - [`writer`]: the writer thread, its queue, savepoints and turns.
//! - [`reader`]: the snapshot reader thread.
//! - `submissions`, `events`, `evaluations`, `idempotency`: the hot writes
//!   (and the snapshot read), one row per statement through rusqlite's
//!   prepared-statement cache.
//! - `records`: the rows they share (audit rows, decisions, keys).
//! - `error`: rusqlite's errors as store errors.

mod error;
mod evaluations;
mod events;
mod idempotency;
mod known;
mod reader;
mod records;
mod submissions;
mod writer;

pub use writer::Turn;

use super::dialect::{Dialect, Tx};
use super::group::WriteQueue;
use super::{
    CommitOutcome, CreateOutcome, EvaluationCommit, EventOutcome, EventWrite, IdempotencyClaim, IdempotencyStart,
    ItemWrite, SnapshotData, SnapshotWindows, StoreError, StoreResult,
};
use crate::metrics::{KindLabel, Metrics};
use prometheus_client::metrics::counter::Counter;
use reader::Reader;
use rusqlite::{Connection, OpenFlags};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteRow, SqliteSynchronous};
use sqlx::{Pool, Sqlite};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Arc, RwLock};
use std::time::Duration;
use writer::{BatchObserver, Isolation, Kind, Writer};

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

impl Synchronous {
    fn pragma(self) -> &'static str {
        match self {
            Synchronous::Full => "FULL",
            Synchronous::Normal => "NORMAL",
        }
    }
}

/// How long a connection waits for SQLite's write lock (the writer and a
/// cold path's turn never contend; a rollback still in flight may).
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);
/// The writer's page cache (pages of the hot indexes stay in it; the rest
/// of the file is read through mmap). SQLite walks the whole cache's hash
/// table at the end of many of its transactions, so a bigger cache costs
/// every commit.
const WRITER_CACHE_KIB: i64 = 16_384;
/// Readers' page caches: small, since a read after another connection's
/// commit discards the whole cache (WAL mode), at a cost that grows with
/// it; the database file itself is read through mmap.
const READER_CACHE_KIB: i64 = 4_096;
const MMAP_BYTES: i64 = 256 << 20;

/// The SQLite store.
#[derive(Clone)]
pub struct SqliteStore {
    /// The cold paths' write connection (used only during a [`Turn`]).
    write: Pool<Sqlite>,
    /// The cold paths' read connections.
    read: Pool<Sqlite>,
    writer: Arc<Writer>,
    reader: Arc<Reader>,
    /// Where the writer reports its transactions (set by [`Backend::write_queue`]).
    observer: Arc<RwLock<Option<Arc<BatchCounters>>>>,
    path: PathBuf,
    /// Dropped with the last handle of the store: the checkpoint thread ends.
    _checkpoints: Arc<std::sync::mpsc::Sender<()>>,
}

impl SqliteStore {
    /// Opens (creating if missing) the database at `url` and migrates it.
    pub async fn open(url: &str, max_read_connections: u32, synchronous: Synchronous) -> anyhow::Result<Self> {
        without_memory_statistics();
        let options = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(match synchronous {
                Synchronous::Full => SqliteSynchronous::Full,
                Synchronous::Normal => SqliteSynchronous::Normal,
            })
            .busy_timeout(BUSY_TIMEOUT)
            // Every multi-row text (five sizes per statement) stays prepared.
            .statement_cache_capacity(512)
            .pragma("cache_size", format!("-{READER_CACHE_KIB}"))
            .pragma("mmap_size", MMAP_BYTES.to_string())
            .pragma("temp_store", "memory")
            // Only the checkpoint thread checkpoints.
            .pragma("wal_autocheckpoint", "0")
            .foreign_keys(true);
        let path = options.get_filename().to_path_buf();
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent)?;
        }
        {
            // Migrations that rebuild a referenced table need the foreign
            // key checks off while they run (SQLite's documented procedure):
            // they run on a connection of their own, and the keys are
            // checked as a whole afterwards, when any ran (the check reads
            // every table: an open with nothing to migrate stays cheap).
            let migrate = SqlitePoolOptions::new()
                .max_connections(1)
                .connect_with(options.clone().foreign_keys(false))
                .await?;
            let applied = async || -> i64 {
                sqlx::query_scalar("SELECT COUNT(*) FROM _sqlx_migrations")
                    .fetch_one(&migrate)
                    .await
                    .unwrap_or(0)
            };
            let before = applied().await;
            sqlx::migrate!("./migrations/sqlite").run(&migrate).await?;
            if applied().await != before {
                let broken: Vec<(String,)> = sqlx::query_as("SELECT \"table\" FROM pragma_foreign_key_check")
                    .fetch_all(&migrate)
                    .await?;
                anyhow::ensure!(broken.is_empty(), "foreign keys broken after migrating: {broken:?}");
            }
            migrate.close().await;
        }
        let write = SqlitePoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(30))
            // The connection is used only during a turn; a ping on every
            // acquire is a round trip to its thread for nothing.
            .test_before_acquire(false)
            .connect_with(options.clone())
            .await?;
        let read = SqlitePoolOptions::new()
            .max_connections(max_read_connections.max(1))
            .acquire_timeout(Duration::from_secs(10))
            .test_before_acquire(false)
            .connect_with(options.read_only(true))
            .await?;
        let observer: Arc<RwLock<Option<Arc<BatchCounters>>>> = Arc::default();
        let writer = Writer::start(
            writer_connection(&path, synchronous)?,
            Box::new(SharedObserver(observer.clone())),
        )?;
        let writer = Arc::new(writer);
        let reader = Reader::start(reader_connection(&path)?)?;
        let checkpoints = start_checkpoints(&path, Arc::downgrade(&writer))?;
        Ok(SqliteStore {
            _checkpoints: Arc::new(checkpoints),
            write,
            read,
            writer,
            reader: Arc::new(reader),
            observer,
            path,
        })
    }

    /// The `synchronous` setting the writer's connection runs with (0 off,
    /// 1 normal, 2 full), read back from SQLite on that connection.
    pub async fn synchronous(&self) -> StoreResult<i64> {
        self.writer
            .write(Kind::Other, 1, |conn, _| {
                Ok(conn.pragma_query_value(None, "synchronous", |r| r.get(0))?)
            })
            .await
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Turns SQLite's memory statistics off, process-wide, before its first
/// use: with them on, every allocation SQLite makes takes one global mutex
/// (shared by every connection's thread), which was most of the writer's
/// lock traffic. gavel reads none of them. Once SQLite is initialised the
/// setting can no longer change; a later call is a no-op.
fn without_memory_statistics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: `sqlite3_config` before `sqlite3_initialize` is the
        // documented way to set it; after, it returns SQLITE_MISUSE and
        // changes nothing.
        let rc = unsafe { rusqlite::ffi::sqlite3_config(rusqlite::ffi::SQLITE_CONFIG_MEMSTATUS, 0 as std::ffi::c_int) };
        if rc != rusqlite::ffi::SQLITE_OK {
            tracing::debug!(rc, "SQLite was initialised already; its memory statistics stay on");
        }
    });
}

/// Opens a connection with the settings every connection shares.
fn connect(path: &Path, flags: OpenFlags, cache_kib: i64) -> rusqlite::Result<Connection> {
    let conn = Connection::open_with_flags(path, flags)?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    conn.pragma_update(None, "cache_size", -cache_kib)?;
    conn.pragma_update(None, "mmap_size", MMAP_BYTES)?;
    conn.pragma_update(None, "temp_store", "memory")?;
    conn.pragma_update(None, "wal_autocheckpoint", 0)?;
    conn.set_prepared_statement_cache_capacity(256);
    Ok(conn)
}

/// The writer's connection, with its settings read back: a database that
/// will not run WAL, or a `synchronous` or foreign-key setting that did not
/// take, is refused at start rather than discovered after an outage.
fn writer_connection(path: &Path, synchronous: Synchronous) -> anyhow::Result<Connection> {
    let conn = connect(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        WRITER_CACHE_KIB,
    )?;
    let journal: String = conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))?;
    anyhow::ensure!(
        journal.eq_ignore_ascii_case("wal"),
        "SQLite refused WAL mode ({journal})"
    );
    conn.pragma_update(None, "synchronous", synchronous.pragma())?;
    let level: i64 = conn.pragma_query_value(None, "synchronous", |r| r.get(0))?;
    let wanted = match synchronous {
        Synchronous::Full => 2,
        Synchronous::Normal => 1,
    };
    anyhow::ensure!(level == wanted, "SQLite runs synchronous = {level}, not {wanted}");
    conn.pragma_update(None, "foreign_keys", true)?;
    let keys: bool = conn.pragma_query_value(None, "foreign_keys", |r| r.get(0))?;
    anyhow::ensure!(keys, "SQLite refused to enforce foreign keys");
    // The WAL shrinks back to this after a checkpoint that emptied it.
    conn.pragma_update(None, "journal_size_limit", 64i64 << 20)?;
    Ok(conn)
}

fn reader_connection(path: &Path) -> anyhow::Result<Connection> {
    let conn = connect(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        READER_CACHE_KIB,
    )?;
    conn.pragma_update(None, "query_only", true)?;
    Ok(conn)
}

/// How often the checkpoint thread looks at the WAL when it is idle, and
/// how long it rests between checkpoints that still left frames behind.
const CHECKPOINT_IDLE: Duration = Duration::from_millis(100);
const CHECKPOINT_BUSY: Duration = Duration::from_millis(5);
/// A WAL of more frames than this (4 KiB each) is brought back to its
/// beginning: see [`start_checkpoints`].
const WAL_RESTART_FRAMES: i64 = 8_192;
/// A WAL still this long was not started over at an idle moment of the
/// writer (it had none, or a reader held the old frames): the checkpoint
/// thread takes a turn.
const WAL_TURN_FRAMES: i64 = 2 * WAL_RESTART_FRAMES;

/// Starts the thread that moves the WAL's pages into the database file
/// with `PASSIVE` checkpoints, which never wait for the writer nor block
/// it: the copying and the database file's fsync happen here, not on the
/// writer's thread.
///
/// The WAL only starts over from its beginning at a write transaction that
/// finds every frame already copied, which under a steady stream of
/// commits a passive checkpoint never quite reaches; SQLite's own
/// auto-checkpoint gets there by checkpointing on the committing thread.
/// Here, once the WAL holds more than [`WAL_RESTART_FRAMES`], the thread
/// takes a [`Turn`] from the writer and checkpoints once more: with the
/// bulk already copied, the writer waits only for the last frames. The
/// thread holds a connection of its own and ends when the returned sender
/// is dropped.
fn start_checkpoints(path: &Path, writer: std::sync::Weak<Writer>) -> anyhow::Result<std::sync::mpsc::Sender<()>> {
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    let conn = connect(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        READER_CACHE_KIB,
    )?;
    std::thread::Builder::new()
        .name("gavel-sqlite-checkpoint".into())
        .spawn(move || {
            loop {
                let pause = match passive_checkpoint(&conn) {
                    Ok(c) if c.log > WAL_TURN_FRAMES => {
                        if let Some(turn) = writer.upgrade().and_then(|w| w.turn_blocking().ok())
                            && let Err(e) = passive_checkpoint(&conn)
                        {
                            tracing::warn!(error = %e, "WAL checkpoint failed; trying again");
                            drop(turn);
                        }
                        CHECKPOINT_BUSY
                    }
                    Ok(c) if c.log > WAL_RESTART_FRAMES => {
                        if let Some(w) = writer.upgrade() {
                            w.restart_wal();
                        }
                        CHECKPOINT_BUSY
                    }
                    Ok(c) if c.log > 0 && c.copied < c.log => CHECKPOINT_BUSY,
                    Ok(_) => CHECKPOINT_IDLE,
                    Err(e) => {
                        tracing::warn!(error = %e, "WAL checkpoint failed; trying again");
                        CHECKPOINT_IDLE
                    }
                };
                if let Err(std::sync::mpsc::RecvTimeoutError::Disconnected) = stopped.recv_timeout(pause) {
                    break;
                }
            }
        })?;
    Ok(stop)
}

/// What a `PRAGMA wal_checkpoint` reports.
struct Checkpoint {
    /// Whether it could not run (another checkpoint was under way).
    busy: bool,
    /// Frames in the WAL.
    log: i64,
    /// Of those, frames copied to the database file.
    copied: i64,
}

/// A `PASSIVE` checkpoint on `conn`: it copies the WAL's frames no reader
/// still needs into the database file, and never waits for the writer,
/// readers or another checkpoint.
fn passive_checkpoint(conn: &Connection) -> rusqlite::Result<Checkpoint> {
    conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
        Ok(Checkpoint {
            busy: r.get::<_, i64>(0)? != 0,
            log: r.get(1)?,
            copied: r.get(2)?,
        })
    })
}

/// Runs `f` in a savepoint of its own: its failure rolls back only what it wrote.
fn savepoint<T>(conn: &Connection, f: impl FnOnce(&Connection) -> StoreResult<T>) -> StoreResult<T> {
    conn.prepare_cached("SAVEPOINT e")?.raw_execute()?;
    let out = f(conn);
    if out.is_err() {
        conn.prepare_cached("ROLLBACK TO e")?.raw_execute()?;
    }
    conn.prepare_cached("RELEASE e")?.raw_execute()?;
    out
}

/// Applies `f` to every entry of a write, one answer per entry, in order.
/// Together with the transaction's other writes, the first failing entry
/// fails the write (the writer then runs the transaction again); alone,
/// each entry is in a savepoint of its own, so a failing entry fails alone.
fn each<W, T>(
    conn: &Connection,
    isolation: Isolation,
    entries: &[W],
    mut f: impl FnMut(&Connection, &W) -> StoreResult<T>,
) -> StoreResult<Vec<StoreResult<T>>> {
    match (isolation, entries) {
        (Isolation::Together, _) | (Isolation::Alone, [_]) => entries.iter().map(|w| f(conn, w).map(Ok)).collect(),
        (Isolation::Alone, _) => Ok(entries.iter().map(|w| savepoint(conn, |conn| f(conn, w))).collect()),
    }
}

impl SqliteStore {
    /// A log's horizon (see `super::exports`): its newest id. One writer
    /// commits in id order, so a reader always sees a prefix of the ids.
    pub(crate) async fn log_horizon(&self, table: &'static str) -> StoreResult<i64> {
        Ok(sqlx::query_scalar(&format!("SELECT COALESCE(MAX(id), 0) FROM {table}"))
            .fetch_one(&self.read)
            .await?)
    }
}

impl Dialect for SqliteStore {
    type DB = Sqlite;
    const SKIP_LOCKED: &'static str = "";
    const FOR_UPDATE: &'static str = "";
    const FEED_HORIZON: &'static str = "";
    const DUE_ORDER: &'static str = " INDEXED BY deliveries_due";
    const ITEM_ORDER: &'static str = " INDEXED BY deliveries_order";
    const FEED_AFTER: &'static str = "(seq > $2 AND txid = $1)";
    const FEED_AFTER_CURSOR: &'static str = "(o.seq > c.seq AND o.txid = c.txid)";
    const FEED_ORDER: &'static str = "seq";
    const FEED_ORDER_DESC: &'static str = "seq DESC";
    const NOW_MS: &'static str = "CAST(unixepoch('subsec') * 1000 AS INTEGER)";
    const BYTE_ORDER: &'static str = "";
    const POSITION: &'static str = "instr";
    const HAS_LABEL: &'static str = "EXISTS (SELECT 1 FROM json_each(d.labels) WHERE json_each.value = {})";
    const ANONYMOUS_PARAMETERS: bool = true;

    fn read_pool(&self) -> &Pool<Sqlite> {
        &self.read
    }

    /// A cold path's write transaction: the writer lends its turn first,
    /// so this connection and the writer's never wait on each other.
    async fn begin_write(&self) -> StoreResult<Tx<'_, Sqlite>> {
        let turn = self.writer.turn().await?;
        Ok(Tx::new(self.write.begin_with("BEGIN IMMEDIATE").await?, Some(turn)))
    }

    async fn begin_snapshot(&self) -> StoreResult<Tx<'_, Sqlite>> {
        Ok(Tx::new(self.read.begin().await?, None))
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

    fn write_queue(&self, metrics: &Metrics) -> Option<Arc<dyn WriteQueue>> {
        let counters = Arc::new(BatchCounters::new(metrics));
        *self.observer.write().expect("observer lock") = Some(counters.clone());
        Some(Arc::new(SqliteWrites {
            store: self.clone(),
            counters,
        }))
    }
}

/// The writer's transactions counted per kind of write (`/metrics`):
/// `store_batches` counts the transactions that held writes of a kind,
/// `store_batched_writes` those writes.
struct BatchCounters {
    kinds: Vec<(Kind, Counter, Counter)>,
}

impl BatchCounters {
    fn new(metrics: &Metrics) -> Self {
        let kinds = Kind::ALL
            .into_iter()
            .map(|kind| {
                let label = KindLabel { kind: kind.as_str() };
                (
                    kind,
                    metrics.store_batches.get_or_create(&label).clone(),
                    metrics.store_batched_writes.get_or_create(&label).clone(),
                )
            })
            .collect();
        BatchCounters { kinds }
    }

    fn counts(&self, kind: Kind) -> (u64, u64) {
        self.kinds
            .iter()
            .find(|(k, ..)| *k == kind)
            .map_or((0, 0), |(_, batches, writes)| (batches.get(), writes.get()))
    }
}

struct SharedObserver(Arc<RwLock<Option<Arc<BatchCounters>>>>);

impl BatchObserver for SharedObserver {
    fn committed(&self, writes: &[(Kind, usize)]) {
        let Some(counters) = self.0.read().expect("observer lock").clone() else {
            return;
        };
        for (kind, n) in writes {
            if let Some((_, batches, total)) = counters.kinds.iter().find(|(k, ..)| k == kind) {
                batches.inc();
                total.inc_by(*n as u64);
            }
        }
    }
}

/// The hot writes of the API and the worker, straight onto the writer's
/// queue: each caller's writes are answered one by one, a failing write
/// failing alone.
struct SqliteWrites {
    store: SqliteStore,
    counters: Arc<BatchCounters>,
}

/// The most evaluation commits one writer job carries: about 2.8 ms of the
/// writer's time (five decisions, two snapshots and a transition each).
/// Jobs of 8, 16 and 32 measured alike in B3 and B4 (full runs: 242–250 µs
/// of CPU per item); 32 makes the fewest commits.
const EVALUATION_JOB: usize = 32;

/// Every answer of a job that failed as a whole.
fn all_failed<T>(n: usize, e: StoreError) -> Vec<StoreResult<T>> {
    (0..n).map(|_| Err(e.clone())).collect()
}

#[async_trait::async_trait]
impl WriteQueue for SqliteWrites {
    async fn create_items(&self, writes: Vec<ItemWrite>) -> Vec<StoreResult<CreateOutcome>> {
        let n = writes.len();
        self.store
            .writer
            .write(Kind::Submissions, n, move |conn, isolation| {
                each(conn, isolation, &writes, submissions::create_item)
            })
            .await
            .unwrap_or_else(|e| all_failed(n, e))
    }

    async fn append_events(&self, writes: Vec<EventWrite>) -> Vec<StoreResult<EventOutcome>> {
        let n = writes.len();
        self.store
            .writer
            .write(Kind::Events, n, move |conn, isolation| {
                let mut appender = events::Appender::new(conn)?;
                each(conn, isolation, &writes, |_, w| appender.append(w))
            })
            .await
            .unwrap_or_else(|e| all_failed(n, e))
    }

    /// A batch goes to the writer in jobs of [`EVALUATION_JOB`] commits, so
    /// the writer can put the writes requests wait on between them.
    async fn commit_evaluations(&self, mut commits: Vec<EvaluationCommit>) -> Vec<StoreResult<CommitOutcome>> {
        let mut jobs = Vec::with_capacity(commits.len().div_ceil(EVALUATION_JOB));
        while !commits.is_empty() {
            let rest = commits.split_off(commits.len().min(EVALUATION_JOB));
            let job = std::mem::replace(&mut commits, rest);
            let n = job.len();
            let write = self.store.writer.write(Kind::Evaluations, n, move |conn, isolation| {
                each(conn, isolation, &job, evaluations::commit_evaluation)
            });
            jobs.push(async move { write.await.unwrap_or_else(|e| all_failed(n, e)) });
        }
        futures::future::join_all(jobs).await.into_iter().flatten().collect()
    }

    fn item_counts(&self) -> (u64, u64) {
        self.counters.counts(Kind::Submissions)
    }
}

#[async_trait::async_trait]
impl super::Submissions for SqliteStore {
    /// All or nothing, as the trait says: the batch is one write of the writer.
    async fn create_items(&self, batch: &[ItemWrite]) -> StoreResult<Vec<CreateOutcome>> {
        let writes = batch.to_vec();
        self.writer
            .write(Kind::Submissions, writes.len(), move |conn, _| {
                writes.iter().map(|w| submissions::create_item(conn, w)).collect()
            })
            .await
    }
}

#[async_trait::async_trait]
impl super::Events for SqliteStore {
    async fn append_events(&self, batch: &[EventWrite]) -> StoreResult<Vec<EventOutcome>> {
        let writes = batch.to_vec();
        self.writer
            .write(Kind::Events, writes.len(), move |conn, _| {
                let mut appender = events::Appender::new(conn)?;
                writes.iter().map(|w| appender.append(w)).collect()
            })
            .await
    }
}

#[async_trait::async_trait]
impl super::Evaluations for SqliteStore {
    async fn snapshots(&self, ids: &[&str], windows: SnapshotWindows) -> StoreResult<Vec<SnapshotData>> {
        let ids: Vec<String> = ids.iter().map(|s| s.to_string()).collect();
        self.reader
            .read(move |conn| evaluations::snapshots(conn, &ids, windows))
            .await
    }

    async fn commit_evaluations(&self, batch: &[EvaluationCommit]) -> StoreResult<Vec<CommitOutcome>> {
        let commits = batch.to_vec();
        self.writer
            .write(Kind::Evaluations, commits.len(), move |conn, _| {
                commits
                    .iter()
                    .map(|c| evaluations::commit_evaluation(conn, c))
                    .collect()
            })
            .await
    }
}

#[async_trait::async_trait]
impl super::Idempotency for SqliteStore {
    async fn idempotency_start(&self, claim: &IdempotencyClaim) -> StoreResult<IdempotencyStart> {
        let claim = claim.clone();
        let token = uuid::Uuid::new_v4().simple().to_string();
        self.writer
            .write(Kind::Keys, 1, move |conn, _| idempotency::start(conn, &claim, &token))
            .await
    }

    async fn idempotency_release(&self, scope: &str, key: &str, token: &str) -> StoreResult<()> {
        let (scope, key, token) = (scope.to_string(), key.to_string(), token.to_string());
        self.writer
            .write(Kind::Keys, 1, move |conn, _| {
                idempotency::release(conn, &scope, &key, &token)
            })
            .await
    }
}

super::shared::impl_shared!(SqliteStore, Sqlite, SqliteRow);
super::items::impl_items!(SqliteStore, Sqlite, SqliteRow);
super::evaluations::impl_dead_letters!(SqliteStore, Sqlite, SqliteRow);
super::outbox::impl_outbox!(SqliteStore, Sqlite, SqliteRow);
super::providers::impl_providers!(SqliteStore, Sqlite, SqliteRow);
super::plugins::impl_plugin_history!(SqliteStore, Sqlite, SqliteRow);
super::retention::impl_retention!(SqliteStore, Sqlite, SqliteRow);
super::review::impl_review!(SqliteStore, Sqlite, SqliteRow);
super::history::impl_history!(SqliteStore, Sqlite, SqliteRow);

/// A SQLite row's values by position.
struct SqliteFields<'r, 's>(&'r rusqlite::Row<'s>);

impl super::exports::Fields for SqliteFields<'_, '_> {
    fn int(&self, i: usize) -> StoreResult<i64> {
        Ok(self.0.get(i)?)
    }
    fn opt_int(&self, i: usize) -> StoreResult<Option<i64>> {
        Ok(self.0.get(i)?)
    }
    fn float(&self, i: usize) -> StoreResult<f64> {
        Ok(self.0.get(i)?)
    }
    fn boolean(&self, i: usize) -> StoreResult<bool> {
        Ok(self.0.get(i)?)
    }
    fn text(&self, i: usize) -> StoreResult<String> {
        Ok(self.0.get(i)?)
    }
    fn opt_text(&self, i: usize) -> StoreResult<Option<String>> {
        Ok(self.0.get(i)?)
    }
}

/// Exports read pages on a read-only connection of their own, off the
/// runtime: rows come straight from SQLite, not one message each.
#[async_trait::async_trait]
impl super::Exports for SqliteStore {
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
        let (path, filter, after) = (self.path.clone(), filter.clone(), after.clone());
        let read = move || -> StoreResult<Vec<super::ExportRow>> {
            let conn = reader_connection(&path).map_err(|e| StoreError::Unavailable(e.to_string()))?;
            // A scan reads each page once: through read(2), not a mapping
            // that would hold up to 256 MiB of the file in the process's RSS.
            conn.pragma_update(None, "mmap_size", 0)?;
            let mut stmt = conn.prepare(sql_for(table, filter.client.is_some()))?;
            let k = if filter.client.is_some() { 5 } else { 4 };
            let (first, second) = (format!("${k}"), format!("${}", k + 1));
            let mut params: Vec<(&str, &dyn rusqlite::ToSql)> =
                vec![("$1", &filter.since), ("$2", &filter.until), ("$3", &limit)];
            if let Some(client) = &filter.client {
                params.push(("$4", client));
            }
            let keys = key_values(table, &after, upto);
            match &keys {
                KeyValues::Log(id, upto) => params.extend([(first.as_str(), id as _), (second.as_str(), upto as _)]),
                KeyValues::Item(id) => params.push((first.as_str(), id)),
                KeyValues::Author(client, author) => {
                    params.extend([(first.as_str(), client as _), (second.as_str(), author as _)])
                }
            }
            let mut rows = stmt.query(params.as_slice())?;
            let mut page = Vec::with_capacity(limit.clamp(0, 10_000) as usize);
            while let Some(r) = rows.next()? {
                page.push(row_of(table, &SqliteFields(r))?);
            }
            Ok(page)
        };
        tokio::task::spawn_blocking(read)
            .await
            .map_err(|e| StoreError::Database(format!("export read: {e}")))?
    }
}
super::authors::impl_authors!(SqliteStore, Sqlite, SqliteRow);
super::appeals::impl_appeals!(SqliteStore, Sqlite, SqliteRow);
super::lists::impl_lists!(SqliteStore, Sqlite, SqliteRow);

#[cfg(test)]
mod tests {
    /// Every connection keeps a page cache of its own: SQLite is built
    /// without `SQLITE_ENABLE_MEMORY_MANAGEMENT` (`.cargo/config.toml`),
    /// which would put the pages of every connection of the process behind
    /// one mutex, taken on each page fetched and released.
    #[test]
    fn sqlite_keeps_a_page_cache_per_connection() {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        let options: Vec<String> = conn
            .prepare("PRAGMA compile_options")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert!(options.iter().any(|o| o == "THREADSAFE=1"), "{options:?}");
        assert!(!options.iter().any(|o| o == "ENABLE_MEMORY_MANAGEMENT"), "{options:?}");
    }
}
