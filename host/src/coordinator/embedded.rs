//! The embedded coordinator: one process, an ordered set of (fire time,
//! item) and a lease map behind one mutex.

use super::{Coordinator, CoordinatorError, Lease, QueueStats, Schedule, fire_time};
use crate::clock::Millis;
use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Default)]
struct State {
    /// The debounce queue, ordered by fire time.
    queue: BTreeSet<(Millis, String)>,
    /// item → (fire time, first pending request).
    queued: HashMap<String, (Millis, Millis)>,
    /// item → (token, expires at).
    leases: HashMap<String, (String, Millis)>,
}

/// In-process scheduling for a single gavel process.
#[derive(Default)]
pub struct EmbeddedCoordinator {
    state: Mutex<State>,
    next_token: AtomicU64,
}

impl EmbeddedCoordinator {
    pub fn new() -> Self {
        Self::default()
    }
}

#[async_trait::async_trait]
impl Coordinator for EmbeddedCoordinator {
    fn backend(&self) -> &'static str {
        "embedded"
    }

    async fn schedule(&self, item: &str, now: Millis, how: Schedule) -> Result<Millis, CoordinatorError> {
        let mut s = self.state.lock().expect("coordinator lock poisoned");
        let (current, first) = match s.queued.get(item) {
            Some(&(fire, first)) => (Some(fire), first),
            None => (None, now),
        };
        let fire = fire_time(current, first, now, how);
        if let Some(c) = current {
            s.queue.remove(&(c, item.to_string()));
        }
        s.queue.insert((fire, item.to_string()));
        s.queued.insert(item.to_string(), (fire, first));
        Ok(fire)
    }

    async fn claim_due(&self, now: Millis, limit: usize, ttl_ms: i64) -> Result<Vec<Lease>, CoordinatorError> {
        let mut guard = self.state.lock().expect("coordinator lock poisoned");
        let s = &mut *guard;
        // Walk the due part of the queue in order, stopping at `limit`: a
        // claim costs O(limit + items skipped because leased), never
        // O(backlog). Skipped items are ones scheduled again while their
        // evaluation runs, at most one per lease.
        let mut taken = Vec::new();
        for (fire, item) in s.queue.iter() {
            if *fire > now || taken.len() >= limit {
                break;
            }
            if s.leases.get(item).is_some_and(|(_, expires)| *expires > now) {
                continue;
            }
            taken.push((*fire, item.clone()));
        }
        let mut claimed = Vec::with_capacity(taken.len());
        for (fire, item) in taken {
            s.queue.remove(&(fire, item.clone()));
            s.queued.remove(&item);
            let token = format!("embedded-{}", self.next_token.fetch_add(1, Ordering::Relaxed));
            s.leases.insert(item.clone(), (token.clone(), now + ttl_ms));
            claimed.push(Lease { item, token });
        }
        // Expired leases of items never claimed again are dropped as they are met.
        if s.leases.len() > 4 * (s.queue.len() + limit) + 1024 {
            s.leases.retain(|_, (_, expires)| *expires > now);
        }
        Ok(claimed)
    }

    async fn release(&self, lease: &Lease) -> Result<bool, CoordinatorError> {
        let mut s = self.state.lock().expect("coordinator lock poisoned");
        if s.leases.get(&lease.item).is_some_and(|(t, _)| *t == lease.token) {
            s.leases.remove(&lease.item);
            return Ok(true);
        }
        Ok(false)
    }

    async fn release_many(&self, leases: &[Lease]) -> Result<Vec<bool>, CoordinatorError> {
        let mut s = self.state.lock().expect("coordinator lock poisoned");
        Ok(leases
            .iter()
            .map(|lease| {
                let held = s.leases.get(&lease.item).is_some_and(|(t, _)| *t == lease.token);
                if held {
                    s.leases.remove(&lease.item);
                }
                held
            })
            .collect())
    }

    async fn is_leased(&self, item: &str, now: Millis) -> Result<bool, CoordinatorError> {
        let s = self.state.lock().expect("coordinator lock poisoned");
        Ok(s.leases.get(item).is_some_and(|(_, expires)| *expires > now))
    }

    async fn stats(&self, now: Millis) -> Result<QueueStats, CoordinatorError> {
        let s = self.state.lock().expect("coordinator lock poisoned");
        Ok(QueueStats {
            depth: s.queue.len() as u64,
            oldest_due: s.queue.first().map(|(fire, _)| *fire).filter(|fire| *fire <= now),
        })
    }
}
