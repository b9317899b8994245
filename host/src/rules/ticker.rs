//! The one thread that advances the engine's epoch every tick while a rule
//! runs; deadlines are counted in ticks.
//!
//! The epoch follows the clock, not the number of wake-ups: on a busy
//! machine the ticker can wake several ticks late (two cores, both busy
//! running guests), and counting one tick per wake-up would then let a
//! runaway guest run several times its deadline before its first check.
//! Each wake-up adds every tick that has passed since the last one.
//!
//! While no call is armed the thread parks instead of waking every tick:
//! an idle host, or one between bursts, pays nothing for it. A call holds
//! an [`Awake`] from before its deadline is set until it returns (the
//! engine arms every store through `RuleEngine::arm`), and the first
//! `Awake` taken unparks the thread. The hand-off cannot lose a wake-up:
//! the ticker parks only after it read no call in flight, and an unpark
//! that comes between that read and the park makes the park return at
//! once (`std::thread::park`'s token). A deadline is counted from the
//! epoch at which it was set, so the ticks that passed while the thread
//! was parked are not added: with no call in flight they bound nothing.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The longest the parked ticker sleeps before it looks again. Only a
/// backstop: a call unparks it, and so does `stop`.
const PARKED: Duration = Duration::from_millis(250);

struct Shared {
    stop: AtomicBool,
    /// Calls armed and not yet returned.
    in_flight: AtomicUsize,
}

pub(super) struct EpochTicker {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// Held by a call from before its epoch deadline is set until it returns:
/// the ticker runs while any is held.
pub(crate) struct Awake {
    shared: Arc<Shared>,
}

impl Drop for Awake {
    fn drop(&mut self) {
        self.shared.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

impl EpochTicker {
    /// Starts the thread, which calls `advance` once per tick that passes
    /// while a call is armed (the engine's `increment_epoch`).
    pub(super) fn start(advance: impl Fn() + Send + 'static, tick: Duration) -> Self {
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
        });
        let ticking = shared.clone();
        let thread = std::thread::Builder::new()
            .name("gavel-epoch".into())
            .spawn(move || {
                let (started, tick_ns) = (Instant::now(), tick.as_nanos().max(1));
                let due = || started.elapsed().as_nanos() / tick_ns;
                let mut ticked: u128 = 0;
                while !ticking.stop.load(Ordering::SeqCst) {
                    if ticking.in_flight.load(Ordering::SeqCst) == 0 {
                        std::thread::park_timeout(PARKED);
                        // Nothing was armed while parked: its ticks bound nothing.
                        ticked = due();
                        continue;
                    }
                    std::thread::sleep(tick);
                    let now = due();
                    while ticked < now {
                        advance();
                        ticked += 1;
                    }
                }
            })
            .expect("spawning the epoch ticker thread");
        EpochTicker {
            shared,
            thread: Some(thread),
        }
    }

    /// Keeps the epoch advancing until the returned guard is dropped.
    pub(super) fn awake(&self) -> Awake {
        if self.shared.in_flight.fetch_add(1, Ordering::SeqCst) == 0
            && let Some(t) = &self.thread
        {
            t.thread().unpark();
        }
        Awake {
            shared: self.shared.clone(),
        }
    }

    pub(super) fn stop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            // The thread only sleeps and increments; joining takes a tick.
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    fn counting() -> (EpochTicker, Arc<AtomicU64>) {
        let count = Arc::new(AtomicU64::new(0));
        let c = count.clone();
        let ticker = EpochTicker::start(
            move || {
                c.fetch_add(1, Ordering::SeqCst);
            },
            Duration::from_millis(1),
        );
        (ticker, count)
    }

    /// Waits (up to 5 s) until `count` holds still for 50 ms, then returns it.
    fn settled(count: &AtomicU64) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let before = count.load(Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(50));
            let after = count.load(Ordering::SeqCst);
            if after == before {
                return after;
            }
            assert!(Instant::now() < deadline, "the epoch never stopped advancing");
        }
    }

    /// Waits (up to 5 s) until `count` has passed `from`.
    fn advances(count: &AtomicU64, from: u64) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while count.load(Ordering::SeqCst) <= from {
            assert!(
                Instant::now() < deadline,
                "the epoch did not advance while a call was armed"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn the_epoch_advances_only_while_a_call_is_armed() {
        let (mut ticker, count) = counting();
        // Nothing armed: the thread parks at once and never advances.
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(count.load(Ordering::SeqCst), 0, "the epoch advanced with nothing armed");
        for _ in 0..3 {
            let at = count.load(Ordering::SeqCst);
            let awake = ticker.awake();
            advances(&count, at);
            // Two calls at once, one ending: the other still keeps it going.
            let second = ticker.awake();
            drop(awake);
            let at = count.load(Ordering::SeqCst);
            advances(&count, at);
            drop(second);
            // The last call ended: it parks again, and stays parked.
            let parked = settled(&count);
            std::thread::sleep(Duration::from_millis(100));
            assert_eq!(
                count.load(Ordering::SeqCst),
                parked,
                "the epoch advanced after the last call ended"
            );
        }
        ticker.stop();
    }
}
