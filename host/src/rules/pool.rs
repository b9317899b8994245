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
//!
//! The batch threads run at a lower CPU priority (`evaluation.nice` above
//! the process's own, on Linux), as a database runs its compactions: when
//! requests and batches want the same cores, the requests' handling, their
//! sync rules and the writer go first, and the batches take what is left,
//! catching up once the load eases. Batches never stop: a nice value only
//! shares the CPU unevenly, and `evaluation.degraded_lag_ms` bounds how far
//! they may fall behind before new submissions are held for review.

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

fn pool(threads: usize, name: &'static str, nice: i32) -> anyhow::Result<rayon::ThreadPool> {
    Ok(rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(move |i| format!("gavel-{name}-{i}"))
        .start_handler(move |_| lower_priority(nice))
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
    /// `threads` evaluation threads per pool (0: one per core); the batch
    /// threads at `nice` (0–19).
    pub fn new(threads: usize, nice: i32) -> anyhow::Result<Self> {
        let threads = if threads == 0 {
            std::thread::available_parallelism().map_or(2, |n| n.get())
        } else {
            threads
        };
        Ok(EvaluationPool {
            batches: pool(threads, "eval", nice)?,
            requests: pool(threads, "sync", 0)?,
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

/// Lowers the calling thread's CPU priority by `nice` (added to the nice
/// value it inherited, at most 19). On Linux a nice value belongs to a
/// thread, not to the whole process; elsewhere this does nothing. Lowering
/// one's own priority needs no privilege, so a failure here is unexpected:
/// it is logged, and the thread keeps the priority it had.
fn lower_priority(nice: i32) {
    #[cfg(target_os = "linux")]
    if nice > 0 {
        // SAFETY: plain system calls on the calling thread's own id;
        // `getpriority` can return -1 as a value, told from an error by errno.
        let failed = unsafe {
            let tid = libc::gettid() as libc::id_t;
            *libc::__errno_location() = 0;
            let own = libc::getpriority(libc::PRIO_PROCESS, tid);
            (own == -1 && *libc::__errno_location() != 0)
                || libc::setpriority(libc::PRIO_PROCESS, tid, (own + nice).min(19)) != 0
        };
        if failed {
            tracing::warn!(nice, error = %std::io::Error::last_os_error(), "could not lower an evaluation thread's priority");
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = nice;
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

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// The calling thread's nice value.
    fn nice() -> i32 {
        // SAFETY: plain system calls on the calling thread's own id.
        unsafe {
            *libc::__errno_location() = 0;
            libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t)
        }
    }

    #[tokio::test]
    async fn batches_run_at_the_configured_nice_value_and_requests_at_the_process_own() {
        let own = nice();
        let pool = EvaluationPool::new(2, 7).unwrap();
        // Whichever batch thread runs a part of the job.
        let batch = pool
            .run(|| {
                use rayon::prelude::*;
                (0..64).into_par_iter().map(|_| nice()).collect::<Vec<_>>()
            })
            .await
            .unwrap();
        assert!(batch.iter().all(|&n| n == (own + 7).min(19)), "{batch:?}");
        let request = pool.run_before(None, nice).await.unwrap();
        assert_eq!(request, own);
    }
}
