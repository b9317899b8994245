//! gavel: a moderation and anti-spam rule host.
//!
//! Moderation rules are sandboxed WebAssembly components written against one
//! WIT contract (`wit/`); the host evaluates them under deadlines and memory
//! caps and stamps every decision with the plugin's name, declared version
//! and content digest.
//!
//! # Layout
//!
//! - [`rules`]: the rule runtime — engine, loading, sandboxed evaluation.
//! - [`verdict`]: verdicts and their severity order.
//! - [`cli`]: the `gavel` command line (`gavel plugin check|eval|test`).
//! - [`telemetry`]: tracing subscriber set-up.

pub mod cli;
pub mod config;
pub mod rules;
pub mod status;
pub mod store;
pub mod telemetry;
pub mod verdict;

/// Serde helper: a `Duration` as whole milliseconds (config files say `*_ms`).
pub(crate) mod duration_ms {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_millis() as u64)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_millis)
    }
}
