//! The evaluation threads: fixed pools sized to the cores (rayon), so
//! evaluations of many items run side by side without oversubscribing the
//! machine, and sync-phase evaluations of many requests are bounded too.
//!
//! Two pools: the worker's claimed batches (hundreds of items, split over
//! the threads by rayon) run on one, the sync phase of submissions on the
//! other. A request's sync rules have a start deadline of a few
//! milliseconds; on a shared pool they would queue behind a whole batch
//! (rayon's threads finish the batch's split work before they take a job
//! from outside). A job that waited past its start deadline does not run:
//! the host is overloaded, which is the host's failure, not the rule's.

use super::HostError;
use std::time::Instant;

/// The evaluation threads.
pub struct EvaluationPool {
    /// The worker's batches (and anything without a start deadline).
    batches: rayon::ThreadPool,
    /// Sync-phase evaluations of requests, under their start deadline.
    requests: rayon::ThreadPool,
    threads: usize,
}

fn pool(threads: usize, name: &'static str) -> anyhow::Result<rayon::ThreadPool> {
    Ok(rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(move |i| format!("gavel-{name}-{i}"))
        .panic_handler(|p| {
            let what = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            tracing::error!(panic = %what, "an evaluation job panicked");
        })
        .build()?)
}

impl EvaluationPool {
    /// `threads` evaluation threads per pool (0: one per core).
    pub fn new(threads: usize) -> anyhow::Result<Self> {
        let threads = if threads == 0 {
            std::thread::available_parallelism().map_or(2, |n| n.get())
        } else {
            threads
        };
        Ok(EvaluationPool {
            batches: pool(threads, "eval")?,
            requests: pool(threads, "sync")?,
            threads,
        })
    }

    /// How many evaluation threads there are (per pool).
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Runs `job` (a batch; it may split itself with rayon) on the batch
    /// threads and waits for its result.
    pub async fn run<T: Send + 'static>(&self, job: impl FnOnce() -> T + Send + 'static) -> Result<T, HostError> {
        spawn(&self.batches, None, job).await
    }

    /// Runs a request's sync-phase `job` on the request threads, unless it
    /// has not started by `start_by` (then it does not run:
    /// `HostError::Overloaded`).
    pub async fn run_before<T: Send + 'static>(
        &self,
        start_by: Option<Instant>,
        job: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, HostError> {
        spawn(&self.requests, start_by, job).await
    }
}

async fn spawn<T: Send + 'static>(
    pool: &rayon::ThreadPool,
    start_by: Option<Instant>,
    job: impl FnOnce() -> T + Send + 'static,
) -> Result<T, HostError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    pool.spawn(move || {
        if start_by.is_some_and(|t| Instant::now() > t) {
            let _ = tx.send(Err(HostError::Overloaded(
                "no evaluation thread was free in time".into(),
            )));
            return;
        }
        let _ = tx.send(Ok(job()));
    });
    rx.await
        .unwrap_or_else(|_| Err(HostError::Overloaded("the evaluation job did not finish".into())))
}
