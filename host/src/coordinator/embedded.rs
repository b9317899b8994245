//! The embedded coordinator: one process, an ordered set of (fire time,
//! item) and a lease map behind one mutex.
//!
//! Every schedule goes through it, so an idle claim loop need not poll:
//! [`Coordinator::until_due`] sleeps until the first queued item fires or a
//! new one is scheduled, whichever comes first.

use super::{Coordinator, CoordinatorError, Lease, QueueStats, Schedule, fire_time};
use crate::clock::{Millis, now_ms};
use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::Notify;

/// The longest an idle claim loop waits without looking at the queue. Only
/// a backstop: a schedule wakes it, and it wakes when the first item fires
/// (a wall clock set back could otherwise stretch that wait).
const IDLE_BACKSTOP: Duration = Duration::from_secs(1);

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
    /// Signalled on every schedule; wakes a claim loop in `until_due`.
    scheduled: Notify,
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
        drop(s);
        // A stored permit if no loop waits: the next wait returns at once.
        self.scheduled.notify_one();
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

    /// `poll` first, as on any backend; then, if nothing is due, until the
    /// first queued item fires, or an item is scheduled and `poll` more has
    /// passed. Claims are never closer than `poll`, so a busy queue is still
    /// claimed in batches, not item by item as each is scheduled. An item
    /// first in the queue but leased (scheduled again while its evaluation
    /// runs) becomes claimable when its lease ends, which no schedule
    /// signals: then the loop polls.
    async fn until_due(&self, poll: Duration) {
        loop {
            tokio::time::sleep(poll).await;
            let scheduled = self.scheduled.notified();
            let wait = {
                let s = self.state.lock().expect("coordinator lock poisoned");
                let now = now_ms();
                match s.queue.first() {
                    None => IDLE_BACKSTOP,
                    Some((fire, _)) if *fire <= now => return,
                    Some((_, item)) if s.leases.get(item).is_some_and(|(_, expires)| *expires > now) => return,
                    Some((fire, _)) => Duration::from_millis((fire - now) as u64).min(IDLE_BACKSTOP),
                }
            };
            tokio::select! {
                _ = scheduled => {}
                _ = tokio::time::sleep(wait) => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Instant;

    const POLL: Duration = Duration::from_millis(1);

    /// An idle claim loop waits for the queue instead of polling it: with
    /// nothing queued it keeps waiting, a schedule ends the wait, an item
    /// queued for later ends it when the item fires (not before), and a
    /// leased item's follow-up, which no schedule will announce when the
    /// lease ends, is polled for.
    #[tokio::test]
    async fn an_idle_wait_ends_when_an_item_is_scheduled_or_fires() {
        let c = Arc::new(EmbeddedCoordinator::new());
        let waiting = tokio::spawn({
            let c = c.clone();
            async move { c.until_due(POLL).await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!waiting.is_finished(), "an empty queue ended the wait");
        c.schedule("a", now_ms(), Schedule::At(now_ms())).await.unwrap();
        tokio::time::timeout(Duration::from_millis(500), waiting)
            .await
            .expect("a schedule did not end the wait")
            .unwrap();
        let a = c.claim_due(now_ms(), 10, 30_000).await.unwrap();
        assert_eq!(a.len(), 1);

        let started = Instant::now();
        c.schedule("b", now_ms(), Schedule::At(now_ms() + 300)).await.unwrap();
        c.until_due(POLL).await;
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_millis(250),
            "the wait ended {waited:?} in, before the item fired"
        );
        assert!(
            waited < IDLE_BACKSTOP,
            "the wait ended only at the backstop ({waited:?})"
        );
        assert_eq!(c.claim_due(now_ms(), 10, 30_000).await.unwrap().len(), 1);

        // "a" is still leased; scheduled again for later, it heads the queue.
        c.schedule("a", now_ms(), Schedule::At(now_ms() + 60_000))
            .await
            .unwrap();
        tokio::time::timeout(Duration::from_millis(500), c.until_due(POLL))
            .await
            .expect("a leased item's follow-up was waited for instead of polled");
        assert!(c.release(&a[0]).await.unwrap());
    }
}
