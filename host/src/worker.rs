//! Evaluation of submitted items in this process: a queue of item ids fed
//! by [`Scheduler::schedule`], a bounded number of concurrent evaluations,
//! and a reconciler that re-schedules whatever the store says still needs
//! an evaluation (after a crash, or a lost race).
//!
//! The seam: the API only calls [`Scheduler::schedule`] after its commit has
//! set `needs_eval_since`; the store, not this queue, is the truth about
//! what is pending.

use crate::config::{EvaluationConfig, IngestConfig};
use crate::judge::{judge, snapshot_of, status_for};
use crate::rules::{Phase, Registry};
use crate::status::Actor;
use crate::store::{CommitOutcome, EvaluationCommit, SharedStore, StoreError, now_ms};
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

/// Hands item ids to the evaluation loop.
#[derive(Clone)]
pub struct Scheduler {
    tx: mpsc::UnboundedSender<String>,
}

impl Scheduler {
    /// Asks for an evaluation of `id`. Never blocks; if the loop is gone
    /// (shutting down) the reconciler of the next start picks the item up.
    pub fn schedule(&self, id: &str) {
        let _ = self.tx.send(id.to_string());
    }
}

/// The evaluation loop's shared parts.
struct Worker {
    store: SharedStore,
    registry: Arc<Registry>,
    evaluation: EvaluationConfig,
    ingest: IngestConfig,
    scheduler: Scheduler,
    /// Items being evaluated now; a second request for one is folded into a
    /// follow-up evaluation.
    running: Mutex<HashSet<String>>,
    /// Items requested while being evaluated.
    again: Mutex<HashSet<String>>,
}

/// A running evaluation loop; [`WorkerHandle::shutdown`] stops it after the
/// evaluations in flight finish.
pub struct WorkerHandle {
    cancel: CancellationToken,
    tasks: tokio::task::JoinSet<()>,
}

impl WorkerHandle {
    pub async fn shutdown(mut self, grace: Duration) {
        self.cancel.cancel();
        let _ = tokio::time::timeout(grace, async {
            while self.tasks.join_next().await.is_some() {}
        })
        .await;
    }
}

/// Starts the evaluation loop and the reconciler.
pub fn start(
    store: SharedStore,
    registry: Arc<Registry>,
    evaluation: EvaluationConfig,
    ingest: IngestConfig,
) -> (Scheduler, WorkerHandle) {
    let (tx, mut rx) = mpsc::unbounded_channel::<String>();
    let scheduler = Scheduler { tx };
    let cancel = CancellationToken::new();
    let worker = Arc::new(Worker {
        store,
        registry,
        evaluation,
        ingest,
        scheduler: scheduler.clone(),
        running: Mutex::new(HashSet::new()),
        again: Mutex::new(HashSet::new()),
    });
    let mut tasks = tokio::task::JoinSet::new();

    let permits = Arc::new(Semaphore::new(worker.evaluation.concurrency.max(1)));
    let (w, c) = (worker.clone(), cancel.clone());
    tasks.spawn(async move {
        let mut inflight = tokio::task::JoinSet::new();
        loop {
            let id = tokio::select! {
                _ = c.cancelled() => break,
                id = rx.recv() => match id { Some(id) => id, None => break },
            };
            if !w.running.lock().expect("lock").insert(id.clone()) {
                w.again.lock().expect("lock").insert(id);
                continue;
            }
            let Ok(permit) = permits.clone().acquire_owned().await else {
                break;
            };
            let w = w.clone();
            inflight.spawn(async move {
                w.evaluate_until_settled(&id).await;
                drop(permit);
            });
            while inflight.try_join_next().is_some() {}
        }
        // Let the evaluations in flight commit: no half-done work at shutdown.
        while inflight.join_next().await.is_some() {}
    });

    let (w, c) = (worker.clone(), cancel.clone());
    tasks.spawn(async move {
        let every = Duration::from_millis(w.evaluation.reconcile_interval_ms.max(10));
        loop {
            w.reconcile().await;
            tokio::select! {
                _ = c.cancelled() => break,
                _ = tokio::time::sleep(every) => {}
            }
        }
    });
    (scheduler, WorkerHandle { cancel, tasks })
}

impl Worker {
    /// Re-schedules every item the store says is waiting.
    async fn reconcile(&self) {
        match self.store.pending_evaluations(now_ms(), 1000).await {
            Ok(ids) => {
                for id in ids {
                    self.scheduler.schedule(&id);
                }
            }
            Err(e) => tracing::warn!(error = %e, "reconcile: cannot list pending items"),
        }
    }

    async fn evaluate_until_settled(&self, id: &str) {
        loop {
            match self.evaluate(id).await {
                Ok(true) => {}
                Ok(false) => {
                    // Lost a race: the item changed under us. Judge it again on fresh state.
                    continue;
                }
                Err(e) => {
                    tracing::warn!(item = id, error = %e, "evaluation not committed; the reconciler retries")
                }
            }
            let again = self.again.lock().expect("lock").remove(id);
            if !again {
                self.running.lock().expect("lock").remove(id);
                // A request that raced the removal above is picked up by the reconciler.
                return;
            }
        }
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
        let fail_closed = self.evaluation.fail_closed;
        let max = registry.engine().limits().max_snapshot_bytes;
        let span = tracing::info_span!("item.evaluate", item = id, version = data.item.version);
        let (data, judgement) = tokio::task::spawn_blocking(move || {
            let _enter = span.enter();
            let mut snapshot = snapshot_of(&data, Phase::Async, now, max);
            let judgement = judge(&registry, &mut snapshot, Phase::Async, fail_closed);
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
            .unwrap_or(crate::verdict::Verdict::Allow);
        let target = status_for(combined);
        let to = (!manual
            && item.status != target
            && crate::status::can_transition(item.status, target, Actor::Rules))
        .then_some(target);
        let commit = EvaluationCommit {
            item_id: id.to_string(),
            snapshot_version: item.version,
            snapshot_event_seq: item.event_seq,
            from: item.status,
            to,
            decisions: judgement.decisions(Phase::Async, !manual),
            reason: judgement.reason(),
            correlation_id: format!("eval-{}", uuid::Uuid::now_v7()),
            now: now_ms(),
        };
        match self.store.commit_evaluation(&commit).await? {
            CommitOutcome::Transitioned { version } => {
                tracing::info!(item = id, from = %item.status, to = %target, version, "item.transition");
                Ok(true)
            }
            CommitOutcome::Recorded => Ok(true),
            CommitOutcome::Stale => {
                tracing::info!(
                    item = id,
                    version = item.version,
                    "evaluation lost a race; judging again"
                );
                Ok(false)
            }
        }
    }
}
