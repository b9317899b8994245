//! The evaluation loop: claim a batch of due items from the coordinator
//! with leases, read their snapshots together, judge them side by side on
//! the evaluation threads, commit the batch (each item fenced on its own),
//! release the leases. Host-side failures are retried with backoff and
//! dead-lettered past a budget; a commit refused by the fence is counted and
//! the item judged again. The reconciler re-queues whatever the store says
//! still needs an evaluation, so a killed process or a flushed Redis loses
//! nothing.

use crate::clock::now_ms;
use crate::config::{EvaluationConfig, IngestConfig, ProviderConfig};
use crate::coordinator::{CoordinatorError, Lease, Schedule, SharedCoordinator};
use crate::domain::policy::{EvaluationInputs, ProviderAnswer, evaluation};
use crate::domain::standing::StandingPolicy;
use crate::domain::{Actor, ItemStatus, Mode, Phase, Verdict};
use crate::judge::{Judgement, judge, snapshot_of};
use crate::metrics::Metrics;
use crate::rules::{EvaluationPool, HostError, Registry};
use crate::store::{
    CommitOutcome, EvaluationCommit, Handoff, SharedStore, SnapshotData, SnapshotWindows, StoreError, Writes,
};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// The longest the worker waits on one coordinator call. The Redis client
/// times out sooner; this bounds every path of every backend, so a call
/// that never answers costs a retry (and, for a claim, a reconcile of the
/// items it may have taken), never the claim loop.
const COORDINATOR_CALL: Duration = Duration::from_secs(10);

async fn bounded<T>(
    call: &'static str,
    f: impl std::future::Future<Output = Result<T, CoordinatorError>>,
) -> Result<T, CoordinatorError> {
    tokio::time::timeout(COORDINATOR_CALL, f).await.unwrap_or_else(|_| {
        tracing::warn!(call, "the coordinator did not answer in 10 s");
        Err(CoordinatorError(format!("{call}: no answer in 10 s")))
    })
}

/// Keys the reconciler lists per store query.
const RECONCILE_PAGE: i64 = 1_000;
/// Keys a periodic reconcile pass checks, about: a backlog longer than that
/// is covered over several passes.
const RECONCILE_BUDGET: usize = 20_000;
/// Coordinator calls the reconciler has in flight at once.
const REQUEUE_IN_FLIGHT: usize = 32;

/// Where the reconciler's pass stands in the store's (time, key) orders;
/// `None` is the beginning.
#[derive(Default)]
struct ReconcileCursor {
    items: Option<(i64, String)>,
    authors: Option<(i64, String, String)>,
}

/// The coordinator's key of an author (an entity of its own in the queue,
/// beside items, whose keys are UUIDs): `author:LEN:CLIENT:AUTHOR`, the
/// client's length making any client and author names unambiguous.
pub fn author_key(client: &str, author: &str) -> String {
    format!("author:{}:{client}:{author}", client.len())
}

/// The (client, author) of an [`author_key`]; `None` for an item's key.
pub fn parse_author_key(key: &str) -> Option<(&str, &str)> {
    let rest = key.strip_prefix("author:")?;
    let (len, rest) = rest.split_once(':')?;
    let len: usize = len.parse().ok()?;
    let client = rest.get(..len)?;
    let author = rest.get(len..)?.strip_prefix(':')?;
    Some((client, author))
}

/// Strike expiries at most this far ahead are queued in the coordinator;
/// later ones are left to the reconciler (the store's `recheck_at`), so the
/// queue does not hold every author with a strike for the whole window.
const SOON_MS: i64 = 60_000;

/// Asks the coordinator for evaluations. Cheap to clone.
#[derive(Clone)]
pub struct Scheduler {
    coordinator: SharedCoordinator,
    evaluation: Arc<EvaluationConfig>,
}

impl Scheduler {
    /// Whether the coordinator answers (`Err` says why).
    pub async fn ping(&self) -> Result<(), String> {
        self.coordinator
            .stats(now_ms())
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    pub fn new(coordinator: SharedCoordinator, evaluation: Arc<EvaluationConfig>) -> Self {
        Scheduler {
            coordinator,
            evaluation,
        }
    }

    /// Queues `item` after a request of `kind` (`submit`, or an event kind),
    /// debounced as configured. Call it after the store committed the
    /// request (which set `needs_eval_since`): if the coordinator is down,
    /// the reconciler queues the item later, so this never fails the request.
    pub async fn schedule(&self, item: &str, kind: &str) {
        let now = now_ms();
        self.schedule_with(item, self.evaluation.schedule_for(kind, now)).await;
    }

    /// Queues a recomputation of an author's standing, debounced like an
    /// item (`[evaluation.kinds.author]` overrides it): a burst of decisions
    /// on one author's items is counted once, after it goes quiet. The
    /// store marked the author in the decisions' transaction, so a lost
    /// request is found by the reconciler.
    pub async fn schedule_author(&self, client: &str, author: &str) {
        let now = now_ms();
        self.schedule_with(&author_key(client, author), self.evaluation.schedule_for("author", now))
            .await;
    }

    /// Queues `item` to be evaluated as soon as a worker is free (the
    /// priority path: a moderator's "re-evaluate now", a replayed dead letter).
    pub async fn schedule_now(&self, item: &str) {
        self.schedule_with(item, Schedule::At(now_ms())).await;
    }

    async fn schedule_with(&self, item: &str, how: Schedule) {
        if let Err(e) = self.coordinator.schedule(item, now_ms(), how).await {
            tracing::warn!(item, error = %e, "cannot queue the item now; the reconciler will");
        }
    }
}

/// What the worker needs, handed over by the composition root.
pub struct WorkerParts {
    pub store: SharedStore,
    pub writes: Writes,
    pub coordinator: SharedCoordinator,
    pub registry: Arc<Registry>,
    pub pool: Arc<EvaluationPool>,
    pub evaluation: Arc<EvaluationConfig>,
    pub ingest: IngestConfig,
    /// Providers a `defer` may name, with their deadlines.
    pub providers: BTreeMap<String, ProviderConfig>,
    /// Author standing: recomputed when an author's key is claimed.
    pub standing: Arc<StandingPolicy>,
    /// Entity signals: snapshots carry their values.
    pub signals: Arc<crate::signals::Signals>,
    pub metrics: Arc<Metrics>,
}

/// The evaluation loop of one process.
pub struct Worker {
    parts: WorkerParts,
    /// Host-side failures per item, for the retry budget (per process).
    attempts: Mutex<HashMap<String, u32>>,
}

/// Why one item's evaluation did not commit.
#[derive(Debug)]
enum Failure {
    Store(StoreError),
    Host(HostError),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Store(e) => e.fmt(f),
            Failure::Host(e) => e.fmt(f),
        }
    }
}

/// One item judged, ready to commit.
struct Judged {
    /// Index into the claimed ids.
    index: usize,
    commit: EvaluationCommit,
    verdict: Verdict,
    /// The item's (client, author), when a decision may count against them.
    author: Option<(String, String)>,
}

/// How one claimed item's evaluation ended.
#[derive(Debug)]
enum Settled {
    /// Committed (or nothing to do).
    Done,
    /// Refused by the fence: the item moved on; judge it again.
    Stale,
    Failed(Failure),
}

impl Worker {
    pub fn new(parts: WorkerParts) -> Arc<Self> {
        Arc::new(Worker {
            parts,
            attempts: Mutex::new(HashMap::new()),
        })
    }

    /// Samples the queue for `/metrics` (and degraded mode) until `cancel`.
    pub async fn sample_queue(self: Arc<Self>, cancel: CancellationToken) {
        loop {
            let now = now_ms();
            if let Ok(s) = bounded("stats", self.parts.coordinator.stats(now)).await {
                self.parts.metrics.queue_depth.set(s.depth as i64);
                let lag_ms = s.oldest_due.map_or(0, |due| (now - due).max(0));
                self.parts.metrics.queue_lag_seconds.set(lag_ms as f64 / 1000.0);
            }
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = tokio::time::sleep(Duration::from_millis(250)) => {}
            }
        }
    }

    /// Re-queues what the store says is pending: everything at start-up (an
    /// embedded queue starts empty, a Redis one may have been flushed), then
    /// whatever waited past its window plus the grace, every interval.
    pub async fn reconcile_loop(self: Arc<Self>, cancel: CancellationToken) {
        let e = &self.parts.evaluation;
        // At start everything pending is queued at once (an embedded queue
        // starts empty); later passes go on in budgets.
        let mut cursor = ReconcileCursor::default();
        self.reconcile(now_ms(), &mut cursor, usize::MAX).await;
        let every = Duration::from_millis(e.reconcile_interval_ms.max(10));
        loop {
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = tokio::time::sleep(every) => {}
            }
            let horizon = e.longest_wait_ms() + e.reconcile_grace_ms;
            self.reconcile(now_ms() - horizon, &mut cursor, RECONCILE_BUDGET).await;
        }
    }

    /// Claims and evaluates until `cancel`; then lets the batches in flight commit.
    pub async fn claim_loop(self: Arc<Self>, cancel: CancellationToken) {
        let e = &self.parts.evaluation;
        let permits = Arc::new(Semaphore::new(e.concurrency.max(1)));
        let poll = Duration::from_millis(e.poll_interval_ms.max(1));
        let mut inflight = tokio::task::JoinSet::new();
        let mut failures = 0u32;
        while !cancel.is_cancelled() {
            while inflight.try_join_next().is_some() {}
            let free = permits.available_permits().min(e.batch.max(1));
            let batches_full = e.batches_in_flight > 0 && inflight.len() >= e.batches_in_flight;
            if free == 0 || batches_full {
                // Wait for capacity: some batch in flight finishing.
                tokio::select! {
                    _ = cancel.cancelled() => break,
                    _ = inflight.join_next() => {}
                }
                continue;
            }
            let backoff = match bounded(
                "claim_due",
                self.parts.coordinator.claim_due(now_ms(), free, e.lease_ttl_ms),
            )
            .await
            {
                Ok(mut leases) if !leases.is_empty() => {
                    failures = 0;
                    if leases.len() > free {
                        // Waiting for permits the semaphore does not have
                        // would stop this loop for good (a Redis claim once
                        // took more than asked): hand the excess back.
                        let excess = leases.split_off(free);
                        self.parts.metrics.claims_over_limit.inc();
                        tracing::error!(
                            asked = free,
                            excess = excess.len(),
                            "the coordinator claimed more than asked"
                        );
                        self.hand_back(&excess).await;
                    }
                    self.parts.metrics.claimed_batch_items.observe(leases.len() as f64);
                    // Only this loop takes permits and `free` were free.
                    let permit = permits
                        .clone()
                        .try_acquire_many_owned(leases.len() as u32)
                        .expect("the claim took at most the free permits");
                    // Fewer than asked: the queues hold nothing more that is
                    // due, so the next claim waits a poll interval, as an
                    // idle worker's does, and takes what came due meanwhile
                    // in one claim (on Redis each claim reads every
                    // partition's due count, however few items it finds).
                    // The embedded queue then waits for its next item
                    // (`Coordinator::until_due`).
                    let drained = leases.len() < free;
                    let w = self.clone();
                    inflight.spawn(async move {
                        w.process(leases).await;
                        drop(permit);
                    });
                    if !drained {
                        continue;
                    }
                    None
                }
                Ok(_) => None,
                Err(err) => {
                    failures += 1;
                    let wait = crate::retry::backoff_ms(failures, 100, 5_000);
                    tracing::warn!(error = %err, retry_in_ms = wait, "cannot claim from the coordinator");
                    Some(Duration::from_millis(wait as u64))
                }
            };
            let coordinator = &self.parts.coordinator;
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = async {
                    match backoff {
                        Some(wait) => tokio::time::sleep(wait).await,
                        None => coordinator.until_due(poll).await,
                    }
                } => {}
            }
        }
        // Let the evaluations in flight commit: no half-done work at shutdown.
        while inflight.join_next().await.is_some() {}
    }

    /// Queues claimed items again at once and releases their leases,
    /// unevaluated.
    async fn hand_back(&self, leases: &[Lease]) {
        for lease in leases {
            self.reschedule(&lease.item, Schedule::At(now_ms())).await;
        }
        if let Err(e) = bounded("release_many", self.parts.coordinator.release_many(leases)).await {
            tracing::warn!(leases = leases.len(), error = %e, "cannot release the leases; they expire by themselves");
        }
    }

    async fn process(&self, leases: Vec<Lease>) {
        let m = &self.parts.metrics;
        m.evaluations_in_flight.inc_by(leases.len() as i64);
        let (authors, items): (Vec<&Lease>, Vec<&Lease>) =
            leases.iter().partition(|l| parse_author_key(&l.item).is_some());
        let ids: Vec<&str> = items.iter().map(|l| l.item.as_str()).collect();
        let (settled, _) = tokio::join!(self.evaluate_batch(&ids), self.recompute_authors(&authors));
        m.evaluations_in_flight.dec_by(leases.len() as i64);
        for (lease, outcome) in items.into_iter().zip(settled) {
            let item = lease.item.as_str();
            match outcome {
                Settled::Done => {
                    self.attempts.lock().expect("lock").remove(item);
                }
                Settled::Stale => {
                    // Fenced out: the item moved on under us. Nothing was
                    // applied; judge it again on fresh state.
                    m.stale_commits.inc();
                    tracing::info!(item, "stale commit refused by the fence; evaluating again");
                    self.reschedule(item, Schedule::At(now_ms())).await;
                }
                Settled::Failed(e) => self.failed(item, e).await,
            }
        }
        // The batch's leases go back in one coordinator call.
        match bounded("release_many", self.parts.coordinator.release_many(&leases)).await {
            Ok(released) => {
                for (lease, _) in leases.iter().zip(released).filter(|(_, held)| !held) {
                    m.leases_lost.inc();
                    tracing::warn!(item = %lease.item, "lease expired during the evaluation (the fence kept it safe)");
                }
            }
            Err(e) => {
                tracing::warn!(leases = leases.len(), error = %e, "cannot release the leases; they expire by themselves")
            }
        }
    }

    /// Recomputes the claimed authors' standing, each in one transaction
    /// of its own (the store locks the author's row and fences the change on
    /// its version: two workers recomputing one author change it once).
    /// A failure is retried with backoff, for as long as it takes: the
    /// store's `recheck_at` keeps the author due meanwhile.
    async fn recompute_authors(&self, leases: &[&Lease]) {
        let p = &self.parts;
        if !p.standing.enabled {
            return;
        }
        let jobs = leases.iter().filter_map(|l| parse_author_key(&l.item).map(|k| (l, k)));
        let runs = jobs.map(|(lease, (client, author))| async move {
            let correlation_id = format!("standing-{}", uuid::Uuid::now_v7());
            let outcome = p
                .store
                .recompute_author(client, author, &p.standing, &correlation_id, now_ms())
                .await;
            if outcome.is_ok() {
                self.attempts.lock().expect("lock").remove(&lease.item);
            }
            match outcome {
                Ok(Some(r)) => {
                    p.metrics.author_recomputations.inc();
                    if let Some((from, version)) = &r.transitioned {
                        p.metrics
                            .author_transitions
                            .get_or_create(&crate::metrics::AuthorTransitionLabel {
                                to: r.status.clone(),
                            })
                            .inc();
                        tracing::info!(client, author, %from, to = %r.status, version, strikes = r.strikes, "author.transition");
                    }
                    // The window moving is the next change nothing else
                    // announces. The store's `recheck_at` says when, and the
                    // reconciler queues the author then; an expiry this
                    // close is queued now, to be on time.
                    if let Some(at) = r.recheck_at
                        && at - now_ms() <= SOON_MS
                    {
                        self.reschedule(&lease.item, Schedule::At(at)).await;
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    let attempt = {
                        let mut attempts = self.attempts.lock().expect("lock");
                        let n = attempts.entry(lease.item.clone()).or_insert(0);
                        *n = n.saturating_add(1);
                        *n
                    };
                    let e_cfg = &p.evaluation;
                    let wait = crate::retry::backoff_ms(attempt, e_cfg.retry_base_ms, e_cfg.retry_max_ms);
                    p.metrics.retries.inc();
                    tracing::warn!(client, author, attempt, retry_in_ms = wait, error = %e, "author recomputation failed; retrying");
                    self.reschedule(&lease.item, Schedule::At(now_ms() + wait)).await;
                }
            }
        });
        futures::future::join_all(runs).await;
    }

    async fn failed(&self, item: &str, error: Failure) {
        let e = &self.parts.evaluation;
        let attempt = {
            let mut attempts = self.attempts.lock().expect("lock");
            let n = attempts.entry(item.to_string()).or_insert(0);
            *n += 1;
            *n
        };
        if attempt < e.max_attempts {
            self.parts.metrics.retries.inc();
            let wait = crate::retry::backoff_ms(attempt, e.retry_base_ms, e.retry_max_ms);
            tracing::warn!(item, attempt, retry_in_ms = wait, error = %error, "evaluation failed in the host; retrying");
            self.reschedule(item, Schedule::At(now_ms() + wait)).await;
            return;
        }
        match self
            .parts
            .store
            .dead_letter(item, i64::from(attempt), &error.to_string(), now_ms())
            .await
        {
            Ok(_) => {
                self.attempts.lock().expect("lock").remove(item);
                self.parts.metrics.dead_letters.inc();
                tracing::error!(item, attempts = attempt, error = %error, "evaluation dead-lettered");
            }
            Err(err) => {
                // The store itself is down: keep retrying at the slowest pace.
                tracing::error!(item, error = %err, "cannot record a dead letter; retrying later");
                self.reschedule(item, Schedule::At(now_ms() + e.retry_max_ms)).await;
            }
        }
    }

    async fn reschedule(&self, item: &str, how: Schedule) {
        if let Err(e) = bounded("schedule", self.parts.coordinator.schedule(item, now_ms(), how)).await {
            tracing::warn!(item, error = %e, "cannot re-queue; the reconciler will");
        }
    }

    /// Queues every item (and author) the store says is waiting since
    /// before `before` and that no worker holds, walking the store's
    /// backlog in keyset pages from where `cursor` stands. A pass stops after
    /// about `budget` keys and the next one goes on from there, so one pass
    /// never costs a coordinator round trip per item of a long backlog; a
    /// pass that reaches the end starts the next one from the beginning.
    async fn reconcile(&self, before: i64, cursor: &mut ReconcileCursor, budget: usize) {
        self.end_timed_restrictions(now_ms()).await;
        let store = &self.parts.store;
        let mut checked = 0;
        while checked < budget {
            let after = cursor.items.as_ref().map(|(at, id)| (*at, id.as_str()));
            let page = match store.pending_evaluations(before, after, RECONCILE_PAGE).await {
                Ok(page) => page,
                Err(e) => {
                    tracing::warn!(error = %e, "reconcile: cannot list pending items");
                    return;
                }
            };
            let full = page.len() as i64 == RECONCILE_PAGE;
            let next = page.last().cloned().filter(|_| full);
            checked += page.len();
            // The cursor moves past a page only once it is queued.
            if !self.requeue(page.into_iter().map(|(_, id)| id)).await {
                return;
            }
            cursor.items = next;
            if !full {
                break;
            }
        }
        if !self.parts.standing.enabled {
            return;
        }
        let mut checked = 0;
        while checked < budget {
            let after = cursor.authors.as_ref().map(|(at, c, a)| (*at, c.as_str(), a.as_str()));
            let page = match store.authors_due(before, after, RECONCILE_PAGE).await {
                Ok(page) => page,
                Err(e) => {
                    tracing::warn!(error = %e, "reconcile: cannot list authors due");
                    return;
                }
            };
            let full = page.len() as i64 == RECONCILE_PAGE;
            checked += page.len();
            if !self.requeue(page.iter().map(|(_, c, a)| author_key(c, a))).await {
                return;
            }
            cursor.authors = page.last().cloned().filter(|_| full);
            if !full {
                break;
            }
        }
    }

    /// Lifts the moderators' restrictions whose time has come: items made
    /// visible again, accounts handed back to automation. Each is one
    /// conditional write in the store, so of several processes doing this
    /// at once one writes each; a pass does at most a page of each.
    async fn end_timed_restrictions(&self, now: i64) {
        let store = &self.parts.store;
        match store.lift_restrictions(now, RECONCILE_PAGE).await {
            Ok(lifted) => {
                for (item, version) in lifted {
                    tracing::info!(item, version, "a timed restriction ended: the item is visible");
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot lift ended restrictions; the next pass will"),
        }
        match store.end_timed_states(&self.parts.standing, now, RECONCILE_PAGE).await {
            Ok(ended) => {
                for (client, author, version) in ended {
                    tracing::info!(
                        client,
                        author,
                        version,
                        "a timed account state ended: automation decides again"
                    );
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot end timed account states; the next pass will"),
        }
    }

    /// Queues, due now, each of `keys` that no worker holds (a few
    /// coordinator calls in flight at once); `false` when the coordinator
    /// is unavailable.
    async fn requeue(&self, keys: impl Iterator<Item = String>) -> bool {
        use futures::TryStreamExt as _;
        let now = now_ms();
        let coordinator = &self.parts.coordinator;
        let done = futures::stream::iter(keys.map(Ok))
            .try_for_each_concurrent(REQUEUE_IN_FLIGHT, |key: String| async move {
                if !bounded("is_leased", coordinator.is_leased(&key, now)).await? {
                    self.reschedule(&key, Schedule::At(now)).await;
                    self.parts.metrics.reconciled.inc();
                }
                Ok::<_, CoordinatorError>(())
            })
            .await;
        if let Err(e) = &done {
            tracing::warn!(error = %e, "reconcile: coordinator unavailable");
        }
        done.is_ok()
    }

    /// Evaluates the claimed `ids`; one outcome per id, in order.
    async fn evaluate_batch(&self, ids: &[&str]) -> Vec<Settled> {
        if ids.is_empty() {
            return Vec::new();
        }
        let p = &self.parts;
        let now = now_ms();
        let windows = SnapshotWindows {
            author_since: now - p.ingest.author_window_ms,
            duplicate_since: now - p.ingest.duplicate_window_ms,
            standing_since: now - p.standing.window_ms,
        };
        let snapshots = match p.store.snapshots(ids, windows).await {
            Ok(s) => s,
            Err(e) => return ids.iter().map(|_| Settled::Failed(Failure::Store(e.clone()))).collect(),
        };
        let mut pending: Vec<SnapshotData> = snapshots
            .into_iter()
            .filter(|d| d.item.needs_eval_since.is_some())
            .collect();
        let signals =
            futures::future::join_all(pending.iter().map(|d| p.signals.values_of(Phase::Async, &d.item, now))).await;
        for (d, values) in pending.iter_mut().zip(signals) {
            match values {
                Ok(v) => d.signals = v,
                Err(e) => {
                    let e = StoreError::Unavailable(e.to_string());
                    return ids.iter().map(|_| Settled::Failed(Failure::Store(e.clone()))).collect();
                }
            }
        }
        let by_id: HashMap<String, SnapshotData> = pending.into_iter().map(|d| (d.item.id.clone(), d)).collect();
        let (mut settled, commits) = self.judge_all(ids, by_id).await;
        if !commits.is_empty() {
            self.commit_all(commits, &mut settled).await;
        }
        settled
    }

    /// Judges every item with a snapshot side by side on the evaluation
    /// threads, handed over as one job for the whole batch; returns each
    /// id's outcome so far and the commits to make (index into `ids`,
    /// commit, verdict).
    async fn judge_all(&self, ids: &[&str], mut by_id: HashMap<String, SnapshotData>) -> (Vec<Settled>, Vec<Judged>) {
        use rayon::prelude::*;
        let p = &self.parts;
        let now = now_ms();
        let items: Vec<(usize, SnapshotData)> = ids
            .iter()
            .enumerate()
            .filter_map(|(i, id)| by_id.remove(*id).map(|data| (i, data)))
            .collect();
        let judging: Vec<usize> = items.iter().map(|(i, _)| *i).collect();
        let (registry, metrics) = (p.registry.clone(), p.metrics.clone());
        let (fail_closed, keep) = (p.evaluation.fail_closed, p.evaluation.store_snapshots);
        let batch = p
            .pool
            .run(move || {
                items
                    .into_par_iter()
                    .map(|(i, data)| {
                        let span =
                            tracing::info_span!("item.evaluate", item = %data.item.id, version = data.item.version);
                        let _enter = span.enter();
                        let max = registry.engine().limits().max_snapshot_bytes;
                        let mut snapshot = snapshot_of(&data, Phase::Async, now, max);
                        let judgement = judge(
                            &registry,
                            &mut snapshot,
                            &data.signals,
                            Phase::Async,
                            fail_closed,
                            keep,
                            &metrics,
                        );
                        (i, judgement.map(|j| (data, j)))
                    })
                    .collect::<Vec<_>>()
            })
            .await;
        let mut settled: Vec<Settled> = ids.iter().map(|_| Settled::Done).collect();
        let judged = match batch {
            Ok(judged) => judged,
            Err(e) => {
                for i in judging {
                    settled[i] = Settled::Failed(Failure::Host(e.clone()));
                }
                return (settled, Vec::new());
            }
        };
        let mut commits = Vec::new();
        for (i, judged) in judged {
            match judged {
                Ok((data, judgement)) => {
                    let (commit, verdict) = self.decide(&data, &judgement);
                    // Only a decision that weighs can change the score: no
                    // recomputation is queued for one that cannot.
                    let author = commit
                        .decisions
                        .iter()
                        .any(|d| d.weighs)
                        .then(|| (data.item.client.clone(), data.item.author.clone()));
                    commits.push(Judged {
                        index: i,
                        commit,
                        verdict,
                        author,
                    });
                }
                Err(e) => settled[i] = Settled::Failed(Failure::Host(e)),
            }
        }
        (settled, commits)
    }

    /// Commits the judgements through group commit and settles each.
    async fn commit_all(&self, commits: Vec<Judged>, settled: &mut [Settled]) {
        let p = &self.parts;
        let mut index = Vec::with_capacity(commits.len());
        let mut batch = Vec::with_capacity(commits.len());
        let mut combined = Vec::with_capacity(commits.len());
        let mut authors = Vec::new();
        for j in commits {
            let c = j.commit;
            combined.push((c.item_id.clone(), c.from, c.to, j.verdict));
            index.push(j.index);
            batch.push(c);
            authors.push(j.author);
        }
        let span = tracing::info_span!("item.transition", items = batch.len());
        let outcomes = p.writes.commit_evaluations(batch).instrument(span).await;
        let committed = |verdict: crate::domain::Verdict| {
            p.metrics.evaluations_committed.inc();
            p.metrics
                .decisions
                .get_or_create(&crate::metrics::VerdictLabel {
                    verdict: verdict.as_str(),
                })
                .inc();
        };
        let mut strikes = std::collections::BTreeSet::new();
        for (((i, outcome), (item, from, to, verdict)), author) in
            index.into_iter().zip(outcomes).zip(combined).zip(authors)
        {
            if let (Ok(CommitOutcome::Transitioned { .. } | CommitOutcome::Recorded), Some(author)) = (&outcome, author)
            {
                strikes.insert(author);
            }
            settled[i] = match outcome {
                Ok(CommitOutcome::Transitioned { version }) => {
                    committed(verdict);
                    tracing::info!(item = %item, %from, to = %to.unwrap_or(from), version, "item.transition");
                    Settled::Done
                }
                Ok(CommitOutcome::Recorded) => {
                    committed(verdict);
                    Settled::Done
                }
                Ok(CommitOutcome::Stale) => Settled::Stale,
                Err(e) => Settled::Failed(Failure::Store(e)),
            };
        }
        // Decisions that may count against their authors: each author once,
        // debounced (the store marked them in the commit's transaction).
        for (client, author) in strikes {
            self.reschedule(
                &author_key(&client, &author),
                self.parts.evaluation.schedule_for("author", now_ms()),
            )
            .await;
        }
    }

    /// What one judgement commits: the policy's decision, the decision rows,
    /// and the shadow plugins' disagreements counted.
    fn decide(&self, data: &SnapshotData, judgement: &Judgement) -> (EvaluationCommit, crate::domain::Verdict) {
        let p = &self.parts;
        let item = &data.item;
        let answers: Vec<ProviderAnswer> = data
            .provider_answers
            .iter()
            .map(|a| ProviderAnswer {
                provider: a.provider.clone(),
                verdict: a.verdict,
            })
            .collect();
        let provider = judgement.provider.as_deref();
        let decision = evaluation(&EvaluationInputs {
            status: item.status,
            manual: item.decided_by == Some(Actor::Moderator),
            sync_verdict: item.sync_verdict,
            verdict: judgement.verdict,
            provider,
            reason: judgement.reason(),
            provider_known: provider.is_some_and(|p| self.parts.providers.contains_key(p)),
            answers: &answers,
            waiting_on: data.waiting_on.as_deref(),
        });
        for (plugin, e) in &judgement.evaluations {
            plugin.evaluations.fetch_add(1, Ordering::Relaxed);
            if plugin.mode == Mode::Shadow
                && let Some(d) = &e.decision
                && ItemStatus::for_verdict(
                    d.verdict
                        .max(item.sync_verdict.unwrap_or(crate::domain::Verdict::Allow)),
                ) != decision.target
            {
                plugin.disagreements.fetch_add(1, Ordering::Relaxed);
                p.metrics
                    .shadow_disagreements
                    .get_or_create(&Metrics::plugin(&e.plugin.name, &e.plugin.version))
                    .inc();
            }
        }
        let handoff = decision.handoff.as_ref().and_then(|name| {
            p.providers.get(name).map(|cfg| Handoff {
                provider: name.clone(),
                deadline_at: now_ms() + cfg.deadline_ms,
            })
        });
        let commit = EvaluationCommit {
            item_id: item.id.clone(),
            snapshot_version: item.version,
            snapshot_event_seq: item.event_seq,
            snapshot_round: item.eval_round,
            from: item.status,
            to: decision.to,
            decisions: judgement.decisions(Phase::Async, decision.applied, &p.standing),
            reason: decision.reason,
            correlation_id: format!("eval-{}", uuid::Uuid::now_v7()),
            now: now_ms(),
            handoff,
        };
        (commit, decision.verdict)
    }
}
