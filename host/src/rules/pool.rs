//! The evaluation threads: a fixed pool sized to the cores (rayon), so
//! evaluations of many items run side by side without oversubscribing the
//! machine, and sync-phase evaluations of many requests are bounded too.
//! A job that waited past its start deadline does not run: the host is
//! overloaded, which is the host's failure, not the rule's.

use super::HostError;
use std::time::Instant;

/// A fixed pool of evaluation threads.
pub struct EvaluationPool {
    pool: rayon::ThreadPool,
    threads: usize,
}

impl EvaluationPool {
    /// `threads` evaluation threads (0: one per core).
    pub fn new(threads: usize) -> anyhow::Result<Self> {
        let threads = if threads == 0 {
            std::thread::available_parallelism().map_or(2, |n| n.get())
        } else {
            threads
        };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("gavel-eval-{i}"))
            .panic_handler(|p| {
                let what = p
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                tracing::error!(panic = %what, "an evaluation job panicked");
            })
            .build()?;
        Ok(EvaluationPool { pool, threads })
    }

    /// How many evaluation threads there are.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Runs `job` on an evaluation thread and waits for its result.
    pub async fn run<T: Send + 'static>(&self, job: impl FnOnce() -> T + Send + 'static) -> Result<T, HostError> {
        self.run_before(None, job).await
    }

    /// [`EvaluationPool::run`], unless the job has not started by `start_by`
    /// (then it does not run: `HostError::Overloaded`).
    pub async fn run_before<T: Send + 'static>(
        &self,
        start_by: Option<Instant>,
        job: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, HostError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.pool.spawn(move || {
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
}
