//! The budgets a rule runs under (docs/ARCHITECTURE.md, "Limits").

use std::time::Duration;

/// Limits applied to every plugin unless its sidecar overrides them.
#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct RuntimeLimits {
    /// CPU-time budget of one evaluation in the async phase (the rule's own
    /// work; time spent waiting for a core does not count, up to
    /// `wall_cap_factor` times this).
    #[serde(with = "crate::duration_ms", rename = "async_deadline_ms")]
    pub async_deadline: Duration,
    /// CPU-time budget of one evaluation in the sync phase (inline in a request).
    #[serde(with = "crate::duration_ms", rename = "sync_deadline_ms")]
    pub sync_deadline: Duration,
    /// Linear memory one evaluation may use; a grow past it traps (outcome `memory`).
    pub memory_bytes: usize,
    /// Wasm stack; deeper recursion traps.
    pub stack_bytes: usize,
    /// Component files larger than this are not loaded.
    pub max_file_bytes: u64,
    /// The snapshot handed to a rule is cut to this size (text truncated first).
    pub max_snapshot_bytes: usize,
    /// A decision whose reason is longer is refused (outcome `invalid`).
    pub max_reason_bytes: usize,
    /// A decision with more labels is refused (outcome `invalid`).
    pub max_labels: usize,
    /// A decision with a longer label is refused (outcome `invalid`).
    pub max_label_bytes: usize,
    /// Epoch tick: the granularity of deadlines. Lower is more precise, costs
    /// a wake-up of one thread per tick.
    #[serde(with = "crate::duration_ms", rename = "epoch_tick_ms")]
    pub epoch_tick: Duration,
    /// Evaluations that may run at once (slots of the pooling allocator).
    pub max_concurrent_evaluations: u32,
    /// Log lines one evaluation may write; the rest are dropped and counted.
    pub max_log_lines: u32,
    /// A component whose compilation takes longer is reported, not loaded.
    #[serde(with = "crate::duration_ms", rename = "compile_timeout_ms")]
    pub compile_timeout: Duration,
    /// Deadlines are CPU time; a call that gets less than its budget of CPU
    /// (an overloaded host) is still ended after `deadline × wall_cap_factor`
    /// of wall time, as a host failure.
    pub wall_cap_factor: u32,
    /// When a failing plugin is quarantined, and how it recovers.
    pub breaker: super::BreakerConfig,
}

impl Default for RuntimeLimits {
    fn default() -> Self {
        RuntimeLimits {
            async_deadline: Duration::from_millis(50),
            sync_deadline: Duration::from_millis(5),
            memory_bytes: 64 << 20,
            stack_bytes: 512 << 10,
            max_file_bytes: 32 << 20,
            max_snapshot_bytes: 64 << 10,
            max_reason_bytes: 1 << 10,
            max_labels: 16,
            max_label_bytes: 64,
            epoch_tick: Duration::from_millis(1),
            max_concurrent_evaluations: 128,
            max_log_lines: 32,
            wall_cap_factor: 4,
            breaker: super::BreakerConfig::default(),
            compile_timeout: Duration::from_secs(120),
        }
    }
}

/// The largest memory cap any plugin may ask for: the pooling allocator's
/// slot size. Sidecar overrides above it are refused.
pub const MEMORY_CEILING_BYTES: usize = 1 << 30;

impl RuntimeLimits {
    /// The number of epoch ticks that make up `deadline` (at least one).
    pub(crate) fn ticks(&self, deadline: Duration) -> u64 {
        let tick = self.epoch_tick.as_nanos().max(1);
        (deadline.as_nanos().div_ceil(tick) as u64).max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_round_up_and_never_zero() {
        let limits = RuntimeLimits::default();
        assert_eq!(limits.ticks(Duration::from_millis(50)), 50);
        assert_eq!(limits.ticks(Duration::from_micros(1500)), 2);
        assert_eq!(limits.ticks(Duration::ZERO), 1);
    }

    #[test]
    fn limits_parse_from_toml_with_millisecond_names() {
        let limits: RuntimeLimits = toml::from_str("async_deadline_ms = 100\nmemory_bytes = 1048576").unwrap();
        assert_eq!(limits.async_deadline, Duration::from_millis(100));
        assert_eq!(limits.memory_bytes, 1 << 20);
        assert_eq!(limits.sync_deadline, Duration::from_millis(5));
        assert!(toml::from_str::<RuntimeLimits>("deadline = 3").is_err());
    }
}
