//! A plugin's circuit breaker. A plugin that fails (trap, timeout, memory,
//! invalid) on a large share of its evaluations within a window is
//! quarantined (open); after a cool-down one evaluation is let through as a
//! probe (half-open): success closes the breaker, failure opens it again
//! for twice as long (up to a ceiling). One input that always fails cannot
//! disable a rule for everyone: it is one failure among many successes.
//! Host-side failures (overload, an exhausted pool) never count.

use std::sync::Mutex;

/// When a breaker opens, and for how long.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BreakerConfig {
    /// The window failures are counted over.
    pub window_ms: i64,
    /// Evaluations in the window before the rate is trusted.
    pub min_evaluations: u32,
    /// Share of failed evaluations in the window that opens the breaker.
    pub failure_rate: f64,
    /// First cool-down before a probe.
    pub open_ms: i64,
    /// Longest cool-down (each failed probe doubles it up to this).
    pub max_open_ms: i64,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig {
            window_ms: 60_000,
            min_evaluations: 20,
            failure_rate: 0.5,
            open_ms: 30_000,
            max_open_ms: 10 * 60_000,
        }
    }
}

/// Whether an evaluation may run now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Closed: run.
    Run,
    /// Half-open: run, as the one probe.
    Probe,
    /// Open (or a probe is already out): skip this plugin.
    Skip,
}

/// What recording an outcome did to the breaker.
#[derive(Debug, Clone, PartialEq)]
pub enum BreakerChange {
    /// The breaker opened: the plugin is quarantined until a probe succeeds.
    Opened { detail: String },
    /// A probe succeeded: the plugin serves again.
    Recovered,
}

/// Buckets the window is divided into.
const BUCKETS: usize = 10;

#[derive(Debug)]
enum Mode {
    Closed,
    Open { until: i64, cool_down: i64 },
    HalfOpen { probing: bool, cool_down: i64 },
}

#[derive(Debug)]
struct State {
    mode: Mode,
    /// (bucket start, evaluations, failures), a ring over the window.
    buckets: [(i64, u32, u32); BUCKETS],
}

/// One plugin version's breaker.
#[derive(Debug)]
pub struct Breaker {
    config: BreakerConfig,
    state: Mutex<State>,
}

impl Breaker {
    pub fn new(config: BreakerConfig) -> Self {
        Breaker {
            config,
            state: Mutex::new(State {
                mode: Mode::Closed,
                buckets: [(i64::MIN, 0, 0); BUCKETS],
            }),
        }
    }

    /// Whether the plugin is quarantined (open or half-open).
    pub fn is_open(&self) -> bool {
        !matches!(self.state.lock().expect("breaker lock").mode, Mode::Closed)
    }

    /// Asks to run an evaluation at `now`.
    pub fn admit(&self, now: i64) -> Admission {
        let mut s = self.state.lock().expect("breaker lock");
        match s.mode {
            Mode::Closed => Admission::Run,
            Mode::Open { until, cool_down } if now >= until => {
                s.mode = Mode::HalfOpen {
                    probing: true,
                    cool_down,
                };
                Admission::Probe
            }
            Mode::Open { .. } => Admission::Skip,
            Mode::HalfOpen {
                probing: false,
                cool_down,
            } => {
                s.mode = Mode::HalfOpen {
                    probing: true,
                    cool_down,
                };
                Admission::Probe
            }
            Mode::HalfOpen { probing: true, .. } => Admission::Skip,
        }
    }

    /// Records how an admitted evaluation ended (`failed`: the plugin
    /// misbehaved). `probe` says it was admitted as the probe.
    pub fn record(&self, now: i64, failed: bool, probe: bool) -> Option<BreakerChange> {
        let c = &self.config;
        let mut s = self.state.lock().expect("breaker lock");
        if probe {
            let cool_down = match s.mode {
                Mode::HalfOpen { cool_down, .. } | Mode::Open { cool_down, .. } => cool_down,
                Mode::Closed => c.open_ms,
            };
            return if failed {
                let next = (cool_down.saturating_mul(2)).min(c.max_open_ms.max(c.open_ms));
                s.mode = Mode::Open {
                    until: now + next,
                    cool_down: next,
                };
                None
            } else {
                s.mode = Mode::Closed;
                s.buckets = [(i64::MIN, 0, 0); BUCKETS];
                Some(BreakerChange::Recovered)
            };
        }
        if !matches!(s.mode, Mode::Closed) {
            return None;
        }
        let width = (c.window_ms / BUCKETS as i64).max(1);
        let start = now - now.rem_euclid(width);
        let slot = ((now.div_euclid(width)).rem_euclid(BUCKETS as i64)) as usize;
        if s.buckets[slot].0 != start {
            s.buckets[slot] = (start, 0, 0);
        }
        s.buckets[slot].1 += 1;
        s.buckets[slot].2 += u32::from(failed);
        if !failed {
            return None;
        }
        let (total, failures) = s
            .buckets
            .iter()
            .filter(|(at, ..)| *at > now - c.window_ms)
            .fold((0u32, 0u32), |(t, f), (_, n, x)| (t + n, f + x));
        if total >= c.min_evaluations.max(1) && f64::from(failures) >= c.failure_rate * f64::from(total) {
            s.mode = Mode::Open {
                until: now + c.open_ms,
                cool_down: c.open_ms,
            };
            return Some(BreakerChange::Opened {
                detail: format!(
                    "{failures} of {total} evaluations failed within {} s",
                    c.window_ms / 1000
                ),
            });
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> BreakerConfig {
        BreakerConfig {
            window_ms: 10_000,
            min_evaluations: 10,
            failure_rate: 0.5,
            open_ms: 1_000,
            max_open_ms: 4_000,
        }
    }

    #[test]
    fn rare_failures_never_open_it() {
        let b = Breaker::new(config());
        for i in 0..1000 {
            assert_eq!(b.admit(i), Admission::Run);
            assert_eq!(b.record(i, i % 10 == 0, false), None, "one input in ten failing");
        }
    }

    #[test]
    fn a_high_failure_rate_opens_it_and_a_probe_closes_it() {
        let b = Breaker::new(config());
        let mut opened = None;
        for i in 0..10 {
            opened = opened.or(b.record(i, true, false));
        }
        assert!(matches!(opened, Some(BreakerChange::Opened { .. })), "{opened:?}");
        assert!(b.is_open());
        assert_eq!(b.admit(500), Admission::Skip, "cooling down");
        assert_eq!(b.admit(1_100), Admission::Probe);
        assert_eq!(b.admit(1_100), Admission::Skip, "one probe at a time");
        assert_eq!(b.record(1_101, false, true), Some(BreakerChange::Recovered));
        assert!(!b.is_open());
        assert_eq!(b.admit(1_102), Admission::Run);
    }

    #[test]
    fn failed_probes_back_off_to_the_ceiling() {
        let b = Breaker::new(config());
        for i in 0..10 {
            b.record(i, true, false);
        }
        let mut at = 1_009;
        for expected in [2_000, 4_000, 4_000] {
            assert_eq!(b.admit(at), Admission::Probe);
            assert_eq!(b.record(at, true, true), None);
            assert_eq!(b.admit(at + expected - 1), Admission::Skip);
            at += expected;
        }
        assert_eq!(b.admit(at), Admission::Probe);
    }

    #[test]
    fn failures_age_out_of_the_window() {
        let b = Breaker::new(config());
        for i in 0..9 {
            b.record(i * 1_000, true, false);
        }
        // Nine failures spread over nine seconds, then successes later on.
        for i in 0..20 {
            assert_eq!(b.record(30_000 + i, false, false), None);
        }
        assert_eq!(b.record(30_100, true, false), None, "the old failures left the window");
    }
}
