//! The result of one evaluation: what the rule said, how it went, and which
//! exact code said it.

use crate::domain::{Digest, Outcome, Verdict};
use serde::Serialize;
use std::sync::Arc;
use std::time::Duration;

/// The stamp every decision carries: plugin name, declared version, digest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PluginStamp {
    pub name: String,
    pub version: String,
    pub digest: Digest,
}

/// A rule's decision, validated against the output limits.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Decision {
    pub verdict: Verdict,
    pub score: f32,
    pub labels: Vec<String>,
    pub reason: String,
    /// The provider a `defer` verdict hands the item to.
    pub provider: Option<String>,
}

/// One evaluation of one plugin on one snapshot.
#[derive(Debug, Clone, Serialize)]
pub struct Evaluation {
    pub plugin: Arc<PluginStamp>,
    pub outcome: Outcome,
    /// Present exactly when `outcome` is `ok`.
    pub decision: Option<Decision>,
    /// What went wrong, for every outcome but `ok`.
    pub error: Option<String>,
    #[serde(rename = "duration_us", serialize_with = "micros")]
    pub duration: Duration,
    /// The lists the rule consulted, each at the version it answered from.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub lists: Vec<ListUse>,
}

/// A list an evaluation consulted: stamped on its decision like the code.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct ListUse {
    pub name: String,
    pub version: i64,
    /// sha256 of the version's canonical entries.
    pub digest: String,
}

fn micros<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(d.as_micros() as u64)
}

/// An evaluation that could not run for reasons of the host, not the rule:
/// never recorded as the plugin's outcome, never counted against its
/// breaker; the item is judged again later.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    /// The host is overloaded: the rule did not get its CPU budget within
    /// the wall-clock cap, or waited too long for an evaluation thread.
    #[error("host overloaded: {0}")]
    Overloaded(String),
    /// The instance pool had no free slot.
    #[error("instance pool exhausted: {0}")]
    PoolExhausted(String),
}
