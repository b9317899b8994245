//! The SQLite writer: one thread owns the write connection and takes every
//! write from one queue — submissions, events, evaluation commits,
//! idempotency claims, and turns for the transactions of the cold paths.
//!
//! The thread drains whatever is queued (bounded by [`MAX_WRITES`] and by
//! time, so a burst cannot hold a commit back for long) into **one**
//! `BEGIN IMMEDIATE … COMMIT`. The time bound is [`MAX_BATCH_TIME`], or
//! six times what the last `COMMIT` took if that is longer (see
//! [`batch_time`]): writes spread over many rows dirty many pages, which
//! the `COMMIT` writes to the WAL, and more of them in one transaction
//! share those pages. Evaluation commits, the one kind no
//! request waits on, queue behind the others: a transaction applies every
//! other write queued first, and once it holds one, it takes evaluation
//! commits for at most [`EVALUATIONS_TIME`] (always at least one, so they
//! cannot starve). A submission that arrives while the worker's commits
//! are queued then waits for the job under way and about a millisecond
//! more of them, not for all of them. A failing write fails alone: should
//! any write of a transaction fail, the transaction is rolled back and run
//! again with every write in a savepoint of its own ([`Isolation::Alone`]).
//! Failures are rare (the API refuses bad input before it gets here), and
//! a savepoint is not free: every page a write touches inside one is first
//! copied to the statement journal, so the common case runs without them.
//! A write is answered only after `COMMIT` returned: with `synchronous =
//! FULL` its effect is on disk by then. A failed `COMMIT` fails every write
//! of its transaction. A panic on the thread aborts the process: nothing is
//! ever answered early.
//!
//! Why a thread of our own rather than sqlx's connection: sqlx runs every
//! SQLite statement on a worker thread of its own and hands each statement,
//! and each row it returns, over a channel, so a settled item cost ~30
//! thread hand-offs. Here a write crosses one channel in and one out, and
//! its statements run back to back through rusqlite's prepared-statement
//! cache, on the same `libsqlite3-sys` build sqlx links.
//!
//! When the WAL has grown long, the writer also finishes the checkpoint
//! that lets it start over, at a moment it has nothing queued (see
//! [`Writer::restart_wal`]): the few frames left are copied while no write
//! waits, instead of in a turn that stops the writes behind it.
//!
//! The cold paths (moderation, deliveries, retention, …) keep their sqlx
//! code, one SQL text for both stores: they queue a [`Turn`], and the
//! writer hands them the database between two of its transactions and
//! waits until they release it, so the two connections never contend for
//! SQLite's write lock.

use super::error::from_sqlite;
use super::known;
use crate::store::{StoreError, StoreResult};
use rusqlite::Connection;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};

/// The most writes one transaction takes (a batch request counts each entry).
pub(super) const MAX_WRITES: usize = 8192;

/// A transaction stops taking queued writes once it has been open this
/// long, so a deep queue does not delay the writes already applied...
pub(super) const MAX_BATCH_TIME: Duration = Duration::from_millis(4);

/// ...or, when the last `COMMIT` took longer than a sixth of that, once it
/// has been open [`COMMIT_SPREAD`] times what that `COMMIT` took, so that
/// committing takes at most about a seventh of the writer's time while
/// writes are queued...
const COMMIT_SPREAD: u32 = 6;

/// ...but never longer than this.
const MAX_OPEN: Duration = Duration::from_millis(60);

/// How long a transaction keeps taking queued writes after a `COMMIT` that
/// took `commit`. A `COMMIT` writes every page the transaction dirtied to
/// the WAL, and writes spread over many rows (a batch of events over many
/// items) dirty a page each: a transaction that takes more of them shares
/// those pages, and the `COMMIT` costs about the same.
fn batch_time(commit: Duration) -> Duration {
    (commit * COMMIT_SPREAD).clamp(MAX_BATCH_TIME, MAX_OPEN)
}

/// Once a transaction holds a write some request waits on, it takes
/// evaluation commits for at most this long (see the module's comment).
pub(super) const EVALUATIONS_TIME: Duration = Duration::from_millis(1);

/// Jobs waiting for the writer, at most; callers wait for room beyond it.
const QUEUE: usize = 8192;

/// How a write is applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Isolation {
    /// With the transaction's other writes, no savepoint: if it fails, the
    /// whole transaction is rolled back and run again [`Isolation::Alone`].
    Together,
    /// In a savepoint of its own: a failure rolls back only this write (a
    /// write of many entries puts each entry in a savepoint of its own).
    Alone,
}

/// One write: applied inside the batch's transaction, answered after it.
pub(super) trait Write: Send {
    /// How many writes it carries (the batch bound counts these).
    fn weight(&self) -> usize;
    /// Which kind it is, for `/metrics`.
    fn kind(&self) -> Kind;
    /// Applies the write (again, if the transaction is run a second time);
    /// an `Err` is its failure.
    fn apply(&mut self, conn: &Connection, isolation: Isolation) -> StoreResult<()>;
    /// Answers the caller once the transaction's fate is known: `Ok` if it
    /// committed (the write's own result, which may be its error), or the
    /// error that ended the transaction.
    fn answer(self: Box<Self>, committed: Result<(), StoreError>);
}

/// The kinds of writes, for the batch metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Submissions,
    Events,
    Evaluations,
    Keys,
    Other,
}

impl Kind {
    pub(crate) const ALL: [Kind; 5] = [
        Kind::Submissions,
        Kind::Events,
        Kind::Evaluations,
        Kind::Keys,
        Kind::Other,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Kind::Submissions => "submissions",
            Kind::Events => "events",
            Kind::Evaluations => "evaluations",
            Kind::Keys => "idempotency",
            Kind::Other => "other",
        }
    }
}

/// A write made of a closure: the result is kept until the commit.
struct Job<T, F> {
    run: F,
    out: Option<StoreResult<T>>,
    reply: oneshot::Sender<StoreResult<T>>,
    kind: Kind,
    weight: usize,
}

impl<T, F> Write for Job<T, F>
where
    T: Send,
    F: Fn(&Connection, Isolation) -> StoreResult<T> + Send,
{
    fn weight(&self) -> usize {
        self.weight
    }

    fn kind(&self) -> Kind {
        self.kind
    }

    fn apply(&mut self, conn: &Connection, isolation: Isolation) -> StoreResult<()> {
        let out = (self.run)(conn, isolation);
        let result = out.as_ref().map(|_| ()).map_err(Clone::clone);
        self.out = Some(out);
        result
    }

    fn answer(self: Box<Self>, committed: Result<(), StoreError>) {
        let out = match committed {
            Ok(()) => self
                .out
                .unwrap_or_else(|| Err(StoreError::Database("a write was never applied".into()))),
            Err(e) => Err(e),
        };
        // The caller may have gone (a client disconnected): its write stands.
        let _ = self.reply.send(out);
    }
}

enum Message {
    Write(Box<dyn Write>),
    /// A cold path asks for the database between two transactions.
    Turn(oneshot::Sender<Turn>),
}

/// The database lent to a cold path: the writer waits until this is dropped.
pub struct Turn {
    _release: std::sync::mpsc::Sender<()>,
}

/// Counts of what the writer committed, for `/metrics`.
pub(crate) trait BatchObserver: Send + Sync + 'static {
    /// One transaction committed with `writes` writes per kind.
    fn committed(&self, writes: &[(Kind, usize)]);
}

/// The handle of the writer thread. The thread ends when every handle is gone.
pub(crate) struct Writer {
    queue: mpsc::Sender<Message>,
    /// Set by [`Writer::restart_wal`], taken by the thread when idle.
    restart: Arc<AtomicBool>,
}

impl Writer {
    /// Starts the writer thread on `conn` (already configured: WAL,
    /// `synchronous`, foreign keys).
    pub(crate) fn start(conn: Connection, observer: Box<dyn BatchObserver>) -> std::io::Result<Writer> {
        let (queue, jobs) = mpsc::channel(QUEUE);
        let restart = Arc::new(AtomicBool::new(false));
        let due = restart.clone();
        std::thread::Builder::new()
            .name("gavel-sqlite-writer".into())
            .spawn(move || {
                let run = std::panic::AssertUnwindSafe(|| run(conn, jobs, &*observer, &due));
                if std::panic::catch_unwind(run).is_err() {
                    // A write may be half applied and its callers unanswered;
                    // nothing of this transaction has been acknowledged. Stop
                    // rather than answer anything from this state.
                    tracing::error!("the SQLite writer panicked; stopping the process");
                    std::process::abort();
                }
            })?;
        Ok(Writer { queue, restart })
    }

    /// Asks the thread to checkpoint on its own connection the next time
    /// it has nothing queued, so that its next transaction starts the WAL
    /// over. SQLite restarts the WAL only at a write transaction that finds
    /// every frame copied to the database file, which the checkpoint
    /// thread's passes, running beside a stream of commits, never quite
    /// reach. Done by the writer between two transactions, the last copy
    /// and the database file's fsync delay only the writes that arrive
    /// meanwhile. (A reader still on the old frames can keep the WAL from
    /// starting over; the checkpoint thread then asks again.)
    pub(crate) fn restart_wal(&self) {
        self.restart.store(true, Ordering::Relaxed);
    }

    /// Runs `f` inside the writer's next transaction; answers after the
    /// transaction committed. `f` may run twice (see [`Isolation`]): the
    /// result of its last run is the answer.
    pub(crate) async fn write<T, F>(&self, kind: Kind, weight: usize, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: Fn(&Connection, Isolation) -> StoreResult<T> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let job = Job {
            run: f,
            out: None,
            reply,
            kind,
            weight: weight.max(1),
        };
        self.queue
            .send(Message::Write(Box::new(job)))
            .await
            .map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }

    /// Waits for the database between two of the writer's transactions; the
    /// writer resumes when the [`Turn`] is dropped.
    pub(crate) async fn turn(&self) -> StoreResult<Turn> {
        let (grant, granted) = oneshot::channel();
        self.queue.send(Message::Turn(grant)).await.map_err(|_| stopped())?;
        granted.await.map_err(|_| stopped())
    }
}

impl Writer {
    /// [`Writer::turn`] for a thread outside the async runtime.
    pub(crate) fn turn_blocking(&self) -> StoreResult<Turn> {
        let (grant, granted) = oneshot::channel();
        self.queue.blocking_send(Message::Turn(grant)).map_err(|_| stopped())?;
        granted.blocking_recv().map_err(|_| stopped())
    }
}

fn stopped() -> StoreError {
    StoreError::Unavailable("the SQLite writer has stopped".into())
}

fn run(conn: Connection, mut jobs: mpsc::Receiver<Message>, observer: &dyn BatchObserver, restart: &AtomicBool) {
    known::enable();
    let mut queued = Queued::default();
    let mut batch: Vec<Box<dyn Write>> = Vec::new();
    loop {
        if queued.is_empty() {
            let next = match jobs.try_recv() {
                Ok(m) => Some(m),
                Err(mpsc::error::TryRecvError::Disconnected) => None,
                Err(mpsc::error::TryRecvError::Empty) => {
                    // Idle: nothing received, nothing waiting.
                    if restart.swap(false, Ordering::Relaxed) {
                        checkpoint(&conn);
                    }
                    jobs.blocking_recv()
                }
            };
            match next {
                Some(first) => queued.push(first),
                None => return,
            }
        }
        // A cold path waiting for its turn gets it between two transactions.
        if let Some(grant) = queued.turn.take() {
            lend(grant);
            continue;
        }
        let outcome =
            transaction(&conn, &mut batch, &mut queued, &mut jobs).map(|commit| queued.batch_time = batch_time(commit));
        match outcome {
            Ok(()) => known::committed(),
            Err(_) => known::rolled_back(),
        }
        let mut counts: Vec<(Kind, usize)> = Vec::new();
        for w in &batch {
            match counts.iter_mut().find(|(k, _)| *k == w.kind()) {
                Some((_, n)) => *n += w.weight(),
                None => counts.push((w.kind(), w.weight())),
            }
        }
        if outcome.is_ok() {
            observer.committed(&counts);
        }
        for w in batch.drain(..) {
            w.answer(outcome.clone());
        }
    }
}

/// What the writer has taken off the channel and not yet applied.
struct Queued {
    /// Every write but evaluation commits, in the order received.
    urgent: VecDeque<Box<dyn Write>>,
    /// Evaluation commits, in the order received.
    evaluations: VecDeque<Box<dyn Write>>,
    /// A cold path's turn: nothing behind it is received until it is lent.
    turn: Option<oneshot::Sender<Turn>>,
    /// How long the next transaction takes queued writes ([`batch_time`]).
    batch_time: Duration,
}

impl Default for Queued {
    fn default() -> Self {
        Queued {
            urgent: VecDeque::new(),
            evaluations: VecDeque::new(),
            turn: None,
            batch_time: MAX_BATCH_TIME,
        }
    }
}

impl Queued {
    fn is_empty(&self) -> bool {
        self.urgent.is_empty() && self.evaluations.is_empty() && self.turn.is_none()
    }

    fn push(&mut self, message: Message) {
        match message {
            Message::Turn(grant) => self.turn = Some(grant),
            Message::Write(w) if w.kind() == Kind::Evaluations => self.evaluations.push_back(w),
            Message::Write(w) => self.urgent.push_back(w),
        }
    }

    /// Takes what the channel holds, without waiting: up to a turn, or
    /// until [`QUEUE`] writes are held here (the channel's bound then holds
    /// the callers back, as it would without this queue).
    fn receive(&mut self, jobs: &mut mpsc::Receiver<Message>) {
        while self.turn.is_none() && self.urgent.len() + self.evaluations.len() < QUEUE {
            match jobs.try_recv() {
                Ok(m) => self.push(m),
                Err(_) => break,
            }
        }
    }

    /// The next write for a transaction open for `open`, holding `weight`
    /// writes, `urgent` if one of them is not an evaluation commit and
    /// `evaluations` if one is: the other writes first, within the batch's
    /// bounds; then evaluation commits within their time, unless a turn
    /// waits. One evaluation commit is taken whatever the bounds, so that a
    /// stream of other writes cannot hold them back for ever.
    fn next(&mut self, open: Duration, weight: usize, urgent: bool, evaluations: bool) -> Option<Box<dyn Write>> {
        let full = weight > 0 && (weight >= MAX_WRITES || open >= self.batch_time);
        if !full && let Some(w) = self.urgent.pop_front() {
            return Some(w);
        }
        if !evaluations {
            return self.evaluations.pop_front();
        }
        let limit = if urgent { EVALUATIONS_TIME } else { self.batch_time };
        if full || self.turn.is_some() || open >= limit {
            return None;
        }
        self.evaluations.pop_front()
    }
}

/// One transaction: applies what is queued, in the order [`Queued::next`]
/// gives, then commits; returns how long the `COMMIT` took. If a write
/// failed, the transaction is rolled back and run again with each write in
/// a savepoint of its own.
fn transaction(
    conn: &Connection,
    batch: &mut Vec<Box<dyn Write>>,
    queued: &mut Queued,
    jobs: &mut mpsc::Receiver<Message>,
) -> Result<Duration, StoreError> {
    let started = Instant::now();
    execute(conn, "BEGIN IMMEDIATE")?;
    let (mut weight, mut urgent, mut evaluations) = (0, false, false);
    loop {
        queued.receive(jobs);
        let Some(mut w) = queued.next(started.elapsed(), weight, urgent, evaluations) else {
            break;
        };
        weight += w.weight();
        match w.kind() {
            Kind::Evaluations => evaluations = true,
            _ => urgent = true,
        }
        let failed = w.apply(conn, Isolation::Together).is_err();
        batch.push(w);
        if failed {
            execute(conn, "ROLLBACK")?;
            known::rolled_back();
            execute(conn, "BEGIN IMMEDIATE")?;
            for w in batch.iter_mut() {
                apply_alone(conn, &mut **w).inspect_err(|_| rollback(conn))?;
            }
            break;
        }
    }
    let committing = Instant::now();
    execute(conn, "COMMIT").inspect_err(|_| rollback(conn))?;
    Ok(committing.elapsed())
}

/// Applies one write in a savepoint; its own failure rolls back only the
/// savepoint (and is its answer). An error of the savepoint statements
/// themselves ends the transaction.
fn apply_alone(conn: &Connection, write: &mut dyn Write) -> Result<(), StoreError> {
    execute(conn, "SAVEPOINT w")?;
    let mark = known::mark();
    if write.apply(conn, Isolation::Alone).is_err() {
        execute(conn, "ROLLBACK TO w")?;
        known::rollback_to(mark);
    }
    execute(conn, "RELEASE w")
}

fn execute(conn: &Connection, sql: &str) -> Result<(), StoreError> {
    conn.prepare_cached(sql)
        .and_then(|mut s| s.raw_execute())
        .map(|_| ())
        .map_err(from_sqlite)
}

fn rollback(conn: &Connection) {
    if !conn.is_autocommit()
        && let Err(e) = conn.execute_batch("ROLLBACK")
    {
        tracing::error!(error = %e, "cannot roll back the writer's transaction");
    }
}

/// Copies the WAL's frames not yet in the database file (see
/// [`Writer::restart_wal`]); a checkpoint the checkpoint thread has under
/// way makes it return at once.
fn checkpoint(conn: &Connection) {
    let started = Instant::now();
    match super::passive_checkpoint(conn) {
        Ok(c) => tracing::debug!(
            busy = c.busy,
            log = c.log,
            copied = c.copied,
            took = ?started.elapsed(),
            "the writer checkpointed"
        ),
        Err(e) => tracing::warn!(error = %e, "the writer's WAL checkpoint failed"),
    }
}

/// Hands the database to a cold path and waits until it gives it back.
fn lend(grant: oneshot::Sender<Turn>) {
    let (release, released) = std::sync::mpsc::channel();
    // If the asker has gone, the turn comes straight back (dropped here).
    let _ = grant.send(Turn { _release: release });
    // Ends when the `Turn` is dropped: no message is ever sent.
    let _ = released.recv();
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Entry(Kind);

    impl Write for Entry {
        fn weight(&self) -> usize {
            1
        }
        fn kind(&self) -> Kind {
            self.0
        }
        fn apply(&mut self, _: &Connection, _: Isolation) -> StoreResult<()> {
            Ok(())
        }
        fn answer(self: Box<Self>, _: Result<(), StoreError>) {}
    }

    fn queued(kinds: &[Kind]) -> Queued {
        let mut q = Queued::default();
        for k in kinds {
            q.push(Message::Write(Box::new(Entry(*k))));
        }
        q
    }

    const EVAL: Kind = Kind::Evaluations;
    const SUB: Kind = Kind::Submissions;
    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn other_writes_go_before_evaluation_commits_received_earlier() {
        let mut q = queued(&[EVAL, EVAL, SUB, Kind::Events]);
        let order: Vec<Kind> =
            std::iter::from_fn(|| q.next(Duration::ZERO, 0, false, false).map(|w| w.kind())).collect();
        assert_eq!(order, [SUB, Kind::Events, EVAL, EVAL]);
    }

    #[test]
    fn evaluation_commits_get_their_time_once_a_request_waits_and_the_whole_batch_time_otherwise() {
        // With a submission in the transaction: one millisecond of them.
        let mut q = queued(&[EVAL, EVAL]);
        assert!(q.next(EVALUATIONS_TIME / 2, 1, true, true).is_some());
        assert!(q.next(EVALUATIONS_TIME, 2, true, true).is_none());
        // Without one: until the transaction's own bound.
        assert!(q.next(EVALUATIONS_TIME + MS, 2, false, true).is_some());
        let mut q = queued(&[EVAL]);
        assert!(q.next(MAX_BATCH_TIME, 3, false, true).is_none());
    }

    #[test]
    fn every_transaction_takes_an_evaluation_commit_if_one_waits() {
        // Past the batch's bounds, a transaction of requests' writes still
        // takes one evaluation commit (and only one), so a stream of
        // submissions cannot hold them back for ever...
        let mut q = queued(&[SUB, EVAL, EVAL]);
        assert!(
            q.next(MAX_BATCH_TIME, MAX_WRITES, true, false)
                .is_some_and(|w| w.kind() == EVAL)
        );
        assert!(q.next(MAX_BATCH_TIME, MAX_WRITES + 1, true, true).is_none());
        // ...and a transaction's first write is taken whatever the clock.
        assert!(
            q.next(MAX_BATCH_TIME * 2, 0, false, false)
                .is_some_and(|w| w.kind() == SUB)
        );
    }

    #[test]
    fn the_batch_bounds_hold_for_other_writes() {
        let mut q = queued(&[SUB]);
        assert!(q.next(MAX_BATCH_TIME, 1, true, false).is_none());
        assert!(q.next(Duration::ZERO, MAX_WRITES, true, false).is_none());
        assert!(q.next(Duration::ZERO, 1, true, false).is_some());
    }

    #[test]
    fn a_slow_commit_keeps_the_next_transaction_open_longer_within_the_cap() {
        // A quick COMMIT leaves the bound where it was...
        assert_eq!(batch_time(Duration::from_micros(300)), MAX_BATCH_TIME);
        // ...a slow one spreads over the next transaction...
        assert_eq!(batch_time(8 * MS), 8 * MS * COMMIT_SPREAD);
        // ...up to the cap.
        assert_eq!(batch_time(Duration::from_secs(1)), MAX_OPEN);
        // The queue keeps taking writes past the usual bound once the
        // bound is longer, and stops at it.
        let mut q = queued(&[Kind::Events, Kind::Events]);
        q.batch_time = batch_time(8 * MS);
        assert!(q.next(MAX_BATCH_TIME * 2, 1_000, true, false).is_some());
        assert!(q.next(q.batch_time, 2_000, true, false).is_none());
    }

    #[test]
    fn a_waiting_turn_ends_the_evaluation_commits_of_a_transaction_not_its_other_writes() {
        let mut q = queued(&[EVAL, EVAL, SUB]);
        let (grant, _granted) = oneshot::channel();
        q.push(Message::Turn(grant));
        assert!(q.next(Duration::ZERO, 1, true, false).is_some_and(|w| w.kind() == SUB));
        assert!(q.next(Duration::ZERO, 2, true, false).is_some_and(|w| w.kind() == EVAL));
        assert!(q.next(Duration::ZERO, 3, true, true).is_none());
        assert!(!q.is_empty());
    }

    struct Nobody;

    impl BatchObserver for Nobody {
        fn committed(&self, _: &[(Kind, usize)]) {}
    }

    /// A writer thread on a fresh database file holding `schema`.
    fn writer_on(schema: &str) -> (tempfile::TempDir, std::path::PathBuf, Writer) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.db");
        Connection::open(&path).unwrap().execute_batch(schema).unwrap();
        let conn = super::super::writer_connection(&path, crate::store::Synchronous::Full).unwrap();
        let writer = Writer::start(conn, Box::new(Nobody)).unwrap();
        (dir, path, writer)
    }

    /// Frames in the WAL, as a passive checkpoint from another connection
    /// reports them (it also copies them, as the checkpoint thread does).
    fn wal_frames(conn: &Connection) -> i64 {
        super::super::passive_checkpoint(conn).unwrap().log
    }

    /// A row the writer noted as stored (`known.rs`) is kept only if its
    /// write committed: a failed write's row is gone, and its id may be
    /// given to another row, which must not be mistaken for it.
    #[tokio::test]
    async fn the_writer_forgets_what_a_failed_write_noted() {
        use super::super::known;
        let (_dir, path, writer) = writer_on("CREATE TABLE refs (id INTEGER PRIMARY KEY, name TEXT NOT NULL)");
        let store = |name: &'static str, fail: bool| {
            writer.write(Kind::Other, 1, move |c, _| {
                if let Some(id) = known::plugin_ref(name, "1", "d") {
                    return Ok(id);
                }
                c.execute("INSERT INTO refs (name) VALUES (?1)", [name])?;
                let id = c.last_insert_rowid();
                known::note_plugin_ref(name, "1", "d", id);
                if fail {
                    return Err(StoreError::Database("this write fails".into()));
                }
                Ok(id)
            })
        };
        // Alone and together with a write that commits: the failed write
        // is rolled back with its transaction, then alone in a savepoint.
        let (lost, kept) = tokio::join!(store("lost", true), store("kept", false));
        assert!(lost.is_err());
        let kept = kept.unwrap();
        // "kept" may have been given the id "lost" had for a moment.
        let again = store("lost", false).await.unwrap();
        let name: String = Connection::open(&path)
            .unwrap()
            .query_row("SELECT name FROM refs WHERE id = ?1", [again], |r| r.get(0))
            .unwrap();
        assert_eq!(name, "lost", "the id of a row rolled back was taken for it");
        assert_eq!(store("kept", false).await.unwrap(), kept, "a committed row is known");
        let rows: i64 = Connection::open(&path)
            .unwrap()
            .query_row("SELECT COUNT(*) FROM refs", [], |r| r.get(0))
            .unwrap();
        assert_eq!(rows, 2, "a known row was stored again");
    }

    #[tokio::test]
    async fn the_writer_starts_the_wal_over_when_asked_and_idle() {
        let (_dir, path, writer) = writer_on("CREATE TABLE t (v BLOB NOT NULL)");
        let other = Connection::open(&path).unwrap();
        let insert = async |n: usize| {
            for _ in 0..n {
                writer
                    .write(Kind::Other, 1, |c, _| {
                        c.execute("INSERT INTO t (v) VALUES (zeroblob(4000))", [])?;
                        Ok(())
                    })
                    .await
                    .unwrap();
            }
        };
        // Nothing copied: every transaction appends to the WAL.
        insert(50).await;
        insert(1).await;
        let before = wal_frames(&other);
        assert!(before > 50, "the WAL holds {before} frames");
        // That read copied them all: the next transaction starts the WAL
        // over, and the ones after it append again.
        insert(51).await;
        // Asked: at its next idle moment (after the write that wakes it),
        // the writer copies the frames itself, and its next transaction
        // writes from the WAL's beginning.
        writer.restart_wal();
        insert(1).await;
        let deadline = Instant::now() + Duration::from_secs(5);
        while writer.restart.load(Ordering::Relaxed) {
            assert!(Instant::now() < deadline, "the idle writer never took the request");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        insert(1).await;
        let after = wal_frames(&other);
        assert!(
            after < 10,
            "the WAL did not start over: {after} frames (before: {before})"
        );
    }
}
