//! One evaluation: how it ended ([`Outcome`]), when it ran ([`Phase`],
//! [`DecisionPhase`]), whether it counts ([`Mode`]), and which exact code
//! ran ([`Digest`]).

use std::fmt;

super::string_enum! {
    /// How an evaluation ended.
    pub enum Outcome("outcome") {
        /// The rule returned a decision within every limit.
        Ok = "ok",
        /// The rule returned `err`: it could not decide.
        Error = "error",
        /// The rule trapped (`unreachable`, stack overflow, divide by zero, ...).
        Trap = "trap",
        /// The rule used up its CPU budget and was interrupted.
        Timeout = "timeout",
        /// The rule tried to grow its memory past the cap.
        Memory = "memory",
        /// The rule returned a decision outside the limits (reason too long,
        /// too many labels, score not a number).
        Invalid = "invalid",
    }
}

impl Outcome {
    /// Whether this outcome counts against the plugin's circuit breaker: the
    /// plugin itself misbehaved (as opposed to declining to decide).
    pub fn is_failure(self) -> bool {
        matches!(
            self,
            Outcome::Trap | Outcome::Timeout | Outcome::Memory | Outcome::Invalid
        )
    }
}

super::string_enum! {
    /// When a rule runs.
    pub enum Phase("phase") {
        /// Inline in the submission request, under a tight deadline.
        Sync = "sync",
        /// In a worker, once the item has gone quiet, on a full snapshot.
        Async = "async",
    }
}

super::string_enum! {
    /// What made a decision: a rule in the submission (`sync`) or evaluation
    /// (`async`) phase, or a provider's callback (`provider`).
    pub enum DecisionPhase("decision phase") {
        Sync = "sync",
        Async = "async",
        Provider = "provider",
    }
}

impl From<Phase> for DecisionPhase {
    fn from(p: Phase) -> Self {
        match p {
            Phase::Sync => DecisionPhase::Sync,
            Phase::Async => DecisionPhase::Async,
        }
    }
}

super::string_enum! {
    /// Whether a plugin's decisions count (`enforce`) or are only recorded (`shadow`).
    #[derive(Default)]
    pub enum Mode("mode") {
        #[default]
        Enforce = "enforce",
        Shadow = "shadow",
    }
}

/// A sha256 digest of a component file: the identity of the code that decided.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
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

    /// Parses 64 hex characters.
    pub fn from_hex(s: &str) -> Option<Digest> {
        let mut out = [0u8; 32];
        hex::decode_to_slice(s, &mut out).ok()?;
        Some(Digest(out))
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

impl serde::Serialize for Digest {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::check_constraints::assert_mirrors;

    fn strings<T: Copy>(all: &[T], f: fn(T) -> &'static str) -> Vec<&'static str> {
        all.iter().map(|v| f(*v)).collect()
    }

    #[test]
    fn check_constraints_mirror_the_enums() {
        assert_mirrors("decisions", "outcome", &strings(Outcome::ALL, Outcome::as_str));
        assert_mirrors(
            "decisions",
            "phase",
            &strings(DecisionPhase::ALL, DecisionPhase::as_str),
        );
        assert_mirrors("decisions", "mode", &strings(Mode::ALL, Mode::as_str));
        assert_mirrors(
            "decisions",
            "verdict",
            &strings(crate::domain::Verdict::ALL, crate::domain::Verdict::as_str),
        );
    }

    #[test]
    fn digests_round_trip_through_hex() {
        let d = Digest::of(b"gavel");
        assert_eq!(Digest::from_hex(&d.to_hex()), Some(d));
        assert_eq!(Digest::from_hex("xyz"), None);
    }
}
