//! The coordinator: the debounce queue, leases and scheduling. An
//! accelerator only: everything in it can be lost (Redis flushed, process
//! killed) and rebuilt from the store by the reconciler, because the store's
//! `needs_eval_since` is the truth about what is pending and its version
//! check, not a lease, decides which commit wins.
//!
//! Two backends behind one trait: [`EmbeddedCoordinator`] (one process) and
//! [`RedisCoordinator`] (many processes).

mod embedded;
mod redis;
pub(crate) use self::redis::Conn as RedisConn;

pub use embedded::EmbeddedCoordinator;
pub use redis::RedisCoordinator;

use crate::clock::Millis;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;

/// A coordinator error: it is unreachable right now. Callers retry with
/// backoff; the store stays the truth meanwhile.
#[derive(Debug, thiserror::Error)]
#[error("coordinator unavailable: {0}")]
pub struct CoordinatorError(pub String);

/// How the evaluation time of an item is pushed by a new request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DebounceMode {
    /// Each event pushes the evaluation to `now + window`, but never past
    /// `first pending event + max_wait`: a burst is judged once, after it
    /// goes quiet, and a continuous stream still at least every `max_wait`.
    Sliding,
    /// The first event sets the evaluation to `now + window`; later events
    /// inside the window do not move it.
    Fixed,
}

/// When an item should be evaluated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Schedule {
    /// Debounced by `mode` over `window_ms`, capped by `max_wait_ms`.
    Debounced {
        mode: DebounceMode,
        window_ms: i64,
        max_wait_ms: i64,
    },
    /// At `at` (or earlier if already due earlier): the priority path, and retries.
    At(Millis),
}

/// A claimed item: evaluate it, then release the lease. The token proves
/// ownership on release; correctness never depends on it (fencing does).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub item: String,
    pub token: String,
}

/// Queue figures for backpressure and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QueueStats {
    /// Items waiting in the queue (due or not).
    pub depth: u64,
    /// Fire time of the oldest due item, if any is due.
    pub oldest_due: Option<Millis>,
}

/// The coordinator every backend implements; `tests/tests/suite/coordinator.rs`
/// is its conformance suite.
#[async_trait::async_trait]
pub trait Coordinator: Send + Sync + 'static {
    fn backend(&self) -> &'static str;

    /// Asks for an evaluation of `item`; returns the time it will fire.
    async fn schedule(&self, item: &str, now: Millis, how: Schedule) -> Result<Millis, CoordinatorError>;

    /// Claims up to `limit` items due at `now` whose lease is free, leasing
    /// each for `ttl_ms` and taking it off the queue, in one atomic step.
    /// An item scheduled again while leased stays queued and is claimable
    /// once the lease is released or expires: exactly one follow-up.
    async fn claim_due(&self, now: Millis, limit: usize, ttl_ms: i64) -> Result<Vec<Lease>, CoordinatorError>;

    /// Releases a lease if `lease.token` still holds it; `false` if it had
    /// expired (or was taken over).
    async fn release(&self, lease: &Lease) -> Result<bool, CoordinatorError>;

    /// Releases a batch of leases in one call (a claimed batch ends
    /// together): one answer per lease, in order, as [`Coordinator::release`].
    async fn release_many(&self, leases: &[Lease]) -> Result<Vec<bool>, CoordinatorError>;

    /// Whether `item` has a live lease.
    async fn is_leased(&self, item: &str, now: Millis) -> Result<bool, CoordinatorError>;

    async fn stats(&self, now: Millis) -> Result<QueueStats, CoordinatorError>;

    /// Waits before the next claim, after one that found everything that was
    /// due (or nothing): `poll` here, because another process may schedule
    /// at any time and only a claim would see it. A backend that sees every
    /// schedule may wait for the queue instead (the embedded one does).
    async fn until_due(&self, poll: Duration) {
        tokio::time::sleep(poll).await;
    }
}

pub type SharedCoordinator = Arc<dyn Coordinator>;

/// Opens the coordinator a URL names: `redis://HOST:PORT` (one server),
/// `redis+cluster://HOST:PORT,HOST:PORT,...` (a Redis Cluster, the nodes to
/// start from), or the embedded one when `None`. The Redis queue is sharded
/// into `partitions` partitions (fixed for a deployment: every process
/// sharing the queue uses the same number).
pub async fn open(redis_url: Option<&str>, key_prefix: &str, partitions: u32) -> anyhow::Result<SharedCoordinator> {
    match redis_url {
        None => Ok(Arc::new(EmbeddedCoordinator::new())),
        Some(url) => Ok(Arc::new(RedisCoordinator::open(url, key_prefix, partitions).await?)),
    }
}

/// The fire time a new request sets, given the current one (if queued) and
/// when the item first became pending. Shared by both backends (the Redis
/// Lua script mirrors it; the conformance suite checks they agree).
pub fn fire_time(current: Option<Millis>, first: Millis, now: Millis, how: Schedule) -> Millis {
    let proposed = match how {
        Schedule::At(at) => at,
        Schedule::Debounced {
            mode: DebounceMode::Fixed,
            window_ms,
            ..
        } => match current {
            Some(c) => c,
            None => now + window_ms,
        },
        Schedule::Debounced {
            mode: DebounceMode::Sliding,
            window_ms,
            max_wait_ms,
        } => (now + window_ms).min(first + max_wait_ms),
    };
    // Never delay an item that is already due (a priority request, a retry).
    match current {
        Some(c) if c <= now || matches!(how, Schedule::At(_)) => proposed.min(c),
        _ => proposed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SLIDING: Schedule = Schedule::Debounced {
        mode: DebounceMode::Sliding,
        window_ms: 250,
        max_wait_ms: 1000,
    };
    const FIXED: Schedule = Schedule::Debounced {
        mode: DebounceMode::Fixed,
        window_ms: 250,
        max_wait_ms: 1000,
    };

    #[test]
    fn sliding_window_pushes_until_max_wait() {
        assert_eq!(fire_time(None, 0, 0, SLIDING), 250);
        assert_eq!(fire_time(Some(250), 0, 200, SLIDING), 450);
        assert_eq!(
            fire_time(Some(950), 0, 900, SLIDING),
            1000,
            "capped at first + max_wait"
        );
    }

    #[test]
    fn fixed_window_keeps_the_first_fire_time() {
        assert_eq!(fire_time(None, 0, 0, FIXED), 250);
        assert_eq!(fire_time(Some(250), 0, 200, FIXED), 250);
    }

    #[test]
    fn priority_and_due_items_are_never_delayed() {
        assert_eq!(fire_time(Some(5000), 0, 100, Schedule::At(100)), 100);
        assert_eq!(fire_time(Some(50), 0, 100, Schedule::At(300)), 50);
        assert_eq!(fire_time(Some(80), 0, 100, SLIDING), 80, "already due stays due");
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    fn schedule() -> impl Strategy<Value = Schedule> {
        prop_oneof![
            (0i64..10_000).prop_map(Schedule::At),
            (
                proptest::sample::select(&[DebounceMode::Fixed, DebounceMode::Sliding][..]),
                1i64..5_000,
                0i64..20_000
            )
                .prop_map(|(mode, window_ms, max_wait_ms)| Schedule::Debounced {
                    mode,
                    window_ms,
                    max_wait_ms
                }),
        ]
    }

    proptest! {
        #[test]
        fn fire_times_never_delay_due_work_nor_pass_the_bounds(
            current in proptest::option::of(0i64..20_000),
            first in 0i64..10_000,
            elapsed in 0i64..10_000,
            how in schedule(),
        ) {
            let now = first + elapsed;
            let t = fire_time(current, first, now, how);
            // An item already due stays due.
            if let Some(c) = current.filter(|c| *c <= now) {
                prop_assert!(t <= c);
            }
            match how {
                // An explicit time is honoured or brought forward, never pushed back.
                Schedule::At(at) => prop_assert!(t <= at),
                // A sliding window never passes its maximum wait.
                Schedule::Debounced { mode: DebounceMode::Sliding, max_wait_ms, window_ms } => {
                    prop_assert!(t <= (first + max_wait_ms).min(now + window_ms).max(current.unwrap_or(i64::MIN).min(now)));
                }
                // A fixed window keeps the first fire time once set.
                Schedule::Debounced { mode: DebounceMode::Fixed, window_ms, .. } => match current {
                    Some(c) => prop_assert_eq!(t, c),
                    None => prop_assert_eq!(t, now + window_ms),
                },
            }
        }
    }
}
