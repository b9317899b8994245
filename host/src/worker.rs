//! The evaluation loop: claim due items from the coordinator with a lease,
//! judge each on a snapshot read from the store, commit with the version
//! fence, release the lease. Host-side failures are retried with backoff and
//! dead-lettered past a budget; a lost race is counted and the item judged
//! again. The reconciler re-queues whatever the store says still needs an
//! evaluation, so a killed process or a flushed Redis loses nothing.

use crate::config::{Config, EvaluationConfig, IngestConfig};
use crate::coordinator::{Lease, Schedule, SharedCoordinator};
use crate::judge::{judge, snapshot_of, status_for};
use crate::metrics::Metrics;
use crate::rules::{Phase, Registry};
use crate::status::{Actor, ItemStatus};
use crate::store::{CommitOutcome, EvaluationCommit, SharedStore, StoreError, Writes, now_ms};
use crate::verdict::Verdict;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// Asks the coordinator for evaluations. Cheap to clone.
#[derive(Clone)]
pub struct Scheduler {
    coordinator: SharedCoordinator,
    evaluation: Arc<EvaluationConfig>,
}

impl Scheduler {
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

/// Running background tasks; [`WorkerHandle::shutdown`] stops claiming and
/// waits for the evaluations in flight to commit.
pub struct WorkerHandle {
    cancel: CancellationToken,
    tasks: tokio::task::JoinSet<()>,
}

impl WorkerHandle {
    pub async fn shutdown(mut self, grace: Duration) {
        self.cancel.cancel();
        let _ = tokio::time::timeout(grace, async { while self.tasks.join_next().await.is_some() {} }).await;
    }
}

struct Worker {
    store: SharedStore,
    /// Evaluation commits go through group commit.
    writes: Writes,
    coordinator: SharedCoordinator,
    registry: Arc<Registry>,
    evaluation: Arc<EvaluationConfig>,
    ingest: IngestConfig,
    /// Providers a `defer` may name, with their deadlines.
    providers: std::collections::BTreeMap<String, crate::config::ProviderConfig>,
    metrics: Arc<Metrics>,
    /// Host-side failures per item, for the retry budget (per process).
    attempts: Mutex<HashMap<String, u32>>,
}

/// Starts the queue-lag sampler, and when `evaluate` is set, the claim loop
/// and the reconciler.
pub fn start(
    config: &Config,
    store: SharedStore,
    writes: Writes,
    coordinator: SharedCoordinator,
    registry: Arc<Registry>,
    metrics: Arc<Metrics>,
    evaluate: bool,
) -> (Scheduler, WorkerHandle) {
    let evaluation = Arc::new(config.evaluation.clone());
    let scheduler = Scheduler::new(coordinator.clone(), evaluation.clone());
    let worker = Arc::new(Worker {
        store,
        writes,
        coordinator,
        registry,
        evaluation,
        ingest: config.ingest.clone(),
        providers: config.providers.clone(),
        metrics,
        attempts: Mutex::new(HashMap::new()),
    });
    let cancel = CancellationToken::new();
    let mut tasks = tokio::task::JoinSet::new();

    let (w, c) = (worker.clone(), cancel.clone());
    tasks.spawn(async move {
        loop {
            w.sample_queue().await;
            tokio::select! {
                _ = c.cancelled() => break,
                _ = tokio::time::sleep(Duration::from_millis(250)) => {}
            }
        }
    });
    if evaluate {
        let (w, c) = (worker.clone(), cancel.clone());
        tasks.spawn(async move { w.claim_loop(c).await });
        let (w, c) = (worker.clone(), cancel.clone());
        tasks.spawn(async move {
            // At start-up everything pending is queued at once: an embedded
            // queue starts empty, and a Redis one may have been flushed.
            w.reconcile(now_ms()).await;
            let every = Duration::from_millis(w.evaluation.reconcile_interval_ms.max(10));
            loop {
                tokio::select! {
                    _ = c.cancelled() => break,
                    _ = tokio::time::sleep(every) => {}
                }
                let horizon = w.evaluation.longest_wait_ms() + w.evaluation.reconcile_grace_ms;
                w.reconcile(now_ms() - horizon).await;
            }
        });
        // Webhook deliveries from the outbox, and provider hand-offs.
        match crate::delivery::Dispatcher::new(
            worker.store.clone(),
            config.webhooks.clone(),
            config.delivery.clone(),
            worker.metrics.clone(),
        ) {
            Ok(d) => {
                tasks.spawn(Arc::new(d).run(cancel.clone()));
            }
            Err(e) => tracing::error!(error = %e, "cannot start the webhook dispatcher"),
        }
        match crate::providers::Requester::new(
            worker.store.clone(),
            config.providers.clone(),
            config.public_url(),
            worker.metrics.clone(),
            // Provider deadlines and retries are seconds apart: a tenth of a second is plenty.
            Duration::from_millis(100),
        ) {
            Ok(r) => {
                tasks.spawn(Arc::new(r).run(cancel.clone()));
            }
            Err(e) => tracing::error!(error = %e, "cannot start the provider requester"),
        }
    }
    (scheduler, WorkerHandle { cancel, tasks })
}

/// `base · 2^(attempt-1)`, capped, with ±50 % jitter so retries of many
/// items do not land together.
pub(crate) fn backoff_ms(attempt: u32, base: i64, max: i64) -> i64 {
    let exp = base
        .saturating_mul(1i64 << attempt.saturating_sub(1).min(20))
        .min(max)
        .max(1);
    let jitter = (uuid::Uuid::new_v4().as_u128() % 1000) as i64; // 0..999 per mille
    exp / 2 + exp * jitter / 1000
}

impl Worker {
    async fn sample_queue(&self) {
        let now = now_ms();
        if let Ok(s) = self.coordinator.stats(now).await {
            self.metrics.queue_depth.set(s.depth as i64);
            let lag_ms = s.oldest_due.map_or(0, |due| (now - due).max(0));
            self.metrics.queue_lag_seconds.set(lag_ms as f64 / 1000.0);
        }
    }

    async fn claim_loop(self: Arc<Self>, cancel: CancellationToken) {
        let permits = Arc::new(Semaphore::new(self.evaluation.concurrency.max(1)));
        let poll = Duration::from_millis(self.evaluation.poll_interval_ms.max(1));
        let mut inflight = tokio::task::JoinSet::new();
        let mut failures = 0u32;
        while !cancel.is_cancelled() {
            while inflight.try_join_next().is_some() {}
            let free = permits.available_permits();
            let claimed = if free == 0 {
                Ok(Vec::new())
            } else {
                self.coordinator
                    .claim_due(now_ms(), free, self.evaluation.lease_ttl_ms)
                    .await
            };
            let pause = match claimed {
                Ok(leases) if !leases.is_empty() => {
                    failures = 0;
                    for lease in leases {
                        let permit = permits
                            .clone()
                            .acquire_owned()
                            .await
                            .expect("the semaphore is never closed");
                        let w = self.clone();
                        inflight.spawn(async move {
                            w.process(lease).await;
                            drop(permit);
                        });
                    }
                    continue;
                }
                Ok(_) => poll,
                Err(e) => {
                    failures += 1;
                    let wait = backoff_ms(failures, 100, 5_000);
                    tracing::warn!(error = %e, retry_in_ms = wait, "cannot claim from the coordinator");
                    Duration::from_millis(wait as u64)
                }
            };
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = tokio::time::sleep(pause) => {}
            }
        }
        // Let the evaluations in flight commit: no half-done work at shutdown.
        while inflight.join_next().await.is_some() {}
    }

    async fn process(&self, lease: Lease) {
        let item = lease.item.as_str();
        self.metrics.evaluations_in_flight.inc();
        let result = self.evaluate(item).await;
        self.metrics.evaluations_in_flight.dec();
        match result {
            Ok(true) => {
                self.attempts.lock().expect("lock").remove(item);
            }
            Ok(false) => {
                // Fenced out: the item moved on under us. Nothing was applied;
                // judge it again on fresh state.
                self.metrics.stale_commits.inc();
                tracing::info!(item, "stale commit refused by the version check; evaluating again");
                self.reschedule(item, Schedule::At(now_ms())).await;
            }
            Err(e) => self.failed(item, e).await,
        }
        match self.coordinator.release(&lease).await {
            Ok(true) => {}
            Ok(false) => {
                self.metrics.leases_lost.inc();
                tracing::warn!(
                    item,
                    "lease expired during the evaluation (the version check kept it safe)"
                );
            }
            Err(e) => {
                tracing::warn!(item, error = %e, "cannot release a lease; it expires by itself")
            }
        }
    }

    async fn failed(&self, item: &str, error: StoreError) {
        let attempt = {
            let mut attempts = self.attempts.lock().expect("lock");
            let n = attempts.entry(item.to_string()).or_insert(0);
            *n += 1;
            *n
        };
        if attempt < self.evaluation.max_attempts {
            self.metrics.retries.inc();
            let wait = backoff_ms(attempt, self.evaluation.retry_base_ms, self.evaluation.retry_max_ms);
            tracing::warn!(item, attempt, retry_in_ms = wait, error = %error, "evaluation failed in the host; retrying");
            self.reschedule(item, Schedule::At(now_ms() + wait)).await;
            return;
        }
        match self
            .store
            .dead_letter(item, i64::from(attempt), &error.to_string(), now_ms())
            .await
        {
            Ok(_) => {
                self.attempts.lock().expect("lock").remove(item);
                self.metrics.dead_letters.inc();
                tracing::error!(item, attempts = attempt, error = %error, "evaluation dead-lettered");
            }
            Err(e) => {
                // The store itself is down: keep retrying at the slowest pace.
                tracing::error!(item, error = %e, "cannot record a dead letter; retrying later");
                self.reschedule(item, Schedule::At(now_ms() + self.evaluation.retry_max_ms))
                    .await;
            }
        }
    }

    async fn reschedule(&self, item: &str, how: Schedule) {
        if let Err(e) = self.coordinator.schedule(item, now_ms(), how).await {
            tracing::warn!(item, error = %e, "cannot re-queue; the reconciler will");
        }
    }

    /// Queues every item the store says is waiting since before `before`
    /// and that no worker holds.
    async fn reconcile(&self, before: i64) {
        let pending = match self.store.pending_evaluations(before, 1000).await {
            Ok(ids) => ids,
            Err(e) => {
                tracing::warn!(error = %e, "reconcile: cannot list pending items");
                return;
            }
        };
        let now = now_ms();
        for id in pending {
            match self.coordinator.is_leased(&id, now).await {
                Ok(false) => {
                    self.reschedule(&id, Schedule::At(now)).await;
                    self.metrics.reconciled.inc();
                }
                Ok(true) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "reconcile: coordinator unavailable");
                    return;
                }
            }
        }
    }

    fn count_commit(&self, verdict: crate::verdict::Verdict) {
        self.metrics.evaluations_committed.inc();
        self.metrics
            .decisions
            .get_or_create(&crate::metrics::VerdictLabel {
                verdict: verdict.as_str(),
            })
            .inc();
    }

    /// One evaluation; `Ok(false)` when the commit lost a race.
    async fn evaluate(&self, id: &str) -> Result<bool, StoreError> {
        let now = now_ms();
        let Some(data) = self
            .store
            .snapshot_data(
                id,
                now - self.ingest.author_window_ms,
                now - self.ingest.duplicate_window_ms,
            )
            .await?
        else {
            return Ok(true);
        };
        if data.item.needs_eval_since.is_none() {
            return Ok(true);
        }
        let registry = self.registry.clone();
        let metrics = self.metrics.clone();
        let fail_closed = self.evaluation.fail_closed;
        let max = registry.engine().limits().max_snapshot_bytes;
        let span = tracing::info_span!("item.evaluate", item = id, version = data.item.version);
        let (data, judgement) = tokio::task::spawn_blocking(move || {
            let _enter = span.enter();
            let mut snapshot = snapshot_of(&data, Phase::Async, now, max);
            let judgement = judge(&registry, &mut snapshot, Phase::Async, fail_closed, &metrics);
            (data, judgement)
        })
        .await
        .map_err(|e| StoreError::Database(format!("evaluation task failed: {e}")))?;

        let item = &data.item;
        let manual = item.decided_by == Some(Actor::Moderator);
        let combined = judgement
            .verdict
            .into_iter()
            .chain(item.sync_verdict)
            .max()
            .unwrap_or(Verdict::Allow);
        // A hand-off to a provider this deployment does not know cannot
        // happen: a human decides instead.
        let unknown_provider = (combined == Verdict::Defer)
            .then(|| judgement.provider.clone().unwrap_or_default())
            .filter(|p| !self.providers.contains_key(p));
        let target = match &unknown_provider {
            Some(_) => ItemStatus::HeldForReview,
            None => status_for(combined),
        };
        for (plugin, e) in &judgement.evaluations {
            plugin.evaluations.fetch_add(1, Ordering::Relaxed);
            if plugin.mode == crate::store::Mode::Shadow
                && let Some(d) = &e.decision
                && status_for(
                    d.verdict
                        .max(item.sync_verdict.unwrap_or(crate::verdict::Verdict::Allow)),
                ) != target
            {
                plugin.disagreements.fetch_add(1, Ordering::Relaxed);
                self.metrics
                    .shadow_disagreements
                    .get_or_create(&Metrics::plugin(&e.plugin.name, &e.plugin.version))
                    .inc();
            }
        }
        // Deferring again while waiting is a new request that supersedes the
        // outstanding one (the item changed since: an evaluation follows events).
        let changes = item.status != target || target == ItemStatus::AwaitingProvider;
        let to =
            (!manual && changes && crate::status::can_transition(item.status, target, Actor::Rules)).then_some(target);
        let handoff = judgement
            .provider
            .as_ref()
            .filter(|_| to == Some(ItemStatus::AwaitingProvider))
            .and_then(|p| self.providers.get_key_value(p))
            .map(|(name, p)| crate::store::Handoff {
                provider: name.clone(),
                deadline_at: now_ms() + p.deadline_ms,
            });
        let reason = match &unknown_provider {
            Some(p) => format!(
                "{}; provider {p:?} is not configured, so a human decides",
                judgement.reason()
            ),
            None => judgement.reason(),
        };
        let commit = EvaluationCommit {
            item_id: id.to_string(),
            snapshot_version: item.version,
            snapshot_event_seq: item.event_seq,
            from: item.status,
            to,
            decisions: judgement.decisions(Phase::Async, !manual),
            reason,
            correlation_id: format!("eval-{}", uuid::Uuid::now_v7()),
            now: now_ms(),
            handoff,
        };
        let span = tracing::info_span!(
            "item.transition",
            item = id,
            version = item.version,
            from = %item.status,
            to = %to.map_or(item.status, |t| t),
            correlation_id = %commit.correlation_id
        );
        match self.writes.commit_evaluation(commit).instrument(span).await? {
            CommitOutcome::Transitioned { version } => {
                self.count_commit(combined);
                tracing::info!(item = id, from = %item.status, to = %target, version, "item.transition");
                Ok(true)
            }
            CommitOutcome::Recorded => {
                self.count_commit(combined);
                Ok(true)
            }
            CommitOutcome::Stale => Ok(false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::backoff_ms;

    #[test]
    fn backoff_doubles_with_jitter_and_caps() {
        for _ in 0..100 {
            let b1 = backoff_ms(1, 100, 10_000);
            assert!((50..150).contains(&b1), "{b1}");
            let b3 = backoff_ms(3, 100, 10_000);
            assert!((200..600).contains(&b3), "{b3}");
            let capped = backoff_ms(30, 100, 10_000);
            assert!((5_000..15_000).contains(&capped), "{capped}");
        }
    }
}
