//! The result of one evaluation: what the rule said, how it went, and which
//! exact code said it.

use crate::verdict::Verdict;
use serde::Serialize;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// A sha256 digest of a component file: the identity of the code that decided.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Digest(pub [u8; 32]);

impl Digest {
    pub fn of(bytes: &[u8]) -> Self {
        use sha2::{Digest as _, Sha256};
        Digest(Sha256::digest(bytes).into())
    }

    /// Lowercase hex, 64 characters.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({})", &self.to_hex()[..12])
    }
}

impl Serialize for Digest {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

/// The stamp every decision carries: plugin name, declared version, digest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PluginStamp {
    pub name: String,
    pub version: String,
    pub digest: Digest,
}

/// How an evaluation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The rule returned a decision within every limit.
    Ok,
    /// The rule returned `err`: it could not decide.
    Error,
    /// The rule trapped (`unreachable`, stack overflow, divide by zero, ...).
    Trap,
    /// The rule ran past its deadline and was interrupted.
    Timeout,
    /// The rule tried to grow its memory past the cap.
    Memory,
    /// The rule returned a decision outside the limits (reason too long,
    /// too many labels, score not a number).
    Invalid,
}

impl Outcome {
    pub const ALL: [Outcome; 6] = [
        Outcome::Ok,
        Outcome::Error,
        Outcome::Trap,
        Outcome::Timeout,
        Outcome::Memory,
        Outcome::Invalid,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Error => "error",
            Outcome::Trap => "trap",
            Outcome::Timeout => "timeout",
            Outcome::Memory => "memory",
            Outcome::Invalid => "invalid",
        }
    }

    /// Whether this outcome counts towards quarantine: the plugin itself
    /// misbehaved (as opposed to declining to decide).
    pub fn is_failure(self) -> bool {
        matches!(
            self,
            Outcome::Trap | Outcome::Timeout | Outcome::Memory | Outcome::Invalid
        )
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
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
}

fn micros<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(d.as_micros() as u64)
}
