//! Author standing: the weights of decisions, the tiers an author's strike
//! score reaches, and what a tier does to a submission. Pure functions of
//! their inputs; the store derives the score from the decision log with one
//! aggregate query and commits the result with a conditional write
//! (`store/authors.rs`).
//!
//! The score is never incremented. At any time it is the sum, over the
//! author's items, of the heaviest counting decision on each item inside
//! the window: an item judged five times on its way to `rejected` is one
//! strike, not five, a moderator's decision that overturns it removes the
//! strike by itself (`ItemStatus::overturned_verdicts`), and expiry is the
//! window moving.

use super::{Mode, Outcome, Verdict};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

super::string_enum! {
    /// Why an author's account state changed (the audit row's `cause`).
    pub enum AuthorCause("author transition cause") {
        /// Automation: the strike score reached another tier.
        Strikes = "strikes",
        /// A moderator set or cleared the state.
        Moderation = "moderation",
        /// A state a moderator set until a time reached it: automation
        /// decides again, from the strikes.
        Expiry = "expiry",
    }
}

super::string_enum! {
    /// Who decided an author's account state.
    pub enum AuthorActor("author actor") {
        Rules = "rules",
        Moderator = "moderator",
    }
}

/// What an account tier does to the author's new submissions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum TierEffect {
    /// Nothing: submissions are judged as anyone's.
    #[default]
    None,
    /// New submissions wait for a moderator (`held_for_review`) at once.
    Hold,
    /// New submissions are rejected at once.
    Reject,
}

impl TierEffect {
    pub fn verdict(self) -> Option<Verdict> {
        match self {
            TierEffect::None => None,
            TierEffect::Hold => Some(Verdict::Hold),
            TierEffect::Reject => Some(Verdict::Reject),
        }
    }
}

/// One account tier: reached when the strike score is at least `strikes`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tier {
    pub name: String,
    pub strikes: f64,
    #[serde(default)]
    pub effect: TierEffect,
}

/// The `[standing]` configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StandingPolicy {
    /// Whether account states are computed and enforced. Off, nothing
    /// changes them: the rules still see each author's figures and stored
    /// state (the first tier, for an author first seen while it is off).
    pub enabled: bool,
    /// Decisions older than this no longer count (default 90 days).
    pub window_ms: i64,
    /// The strikes an enforced decision of each verdict weighs.
    pub weights: BTreeMap<Verdict, f64>,
    /// Heavier weights for decisions carrying a label (the heaviest of the
    /// verdict's and the labels' weights counts).
    pub labels: BTreeMap<String, f64>,
    /// The tiers, in increasing order of `strikes`; the first is the state
    /// of every author with no strikes and must start at 0.
    pub tiers: Vec<Tier>,
}

impl Default for StandingPolicy {
    fn default() -> Self {
        let tier = |name: &str, strikes: f64, effect| Tier {
            name: name.into(),
            strikes,
            effect,
        };
        StandingPolicy {
            enabled: false,
            window_ms: 90 * 24 * 3_600_000,
            weights: BTreeMap::from([(Verdict::Reject, 1.0)]),
            labels: BTreeMap::new(),
            tiers: vec![
                tier("good", 0.0, TierEffect::None),
                tier("watch", 2.0, TierEffect::None),
                tier("restricted", 4.0, TierEffect::Hold),
                tier("suspended", 8.0, TierEffect::Reject),
            ],
        }
    }
}

/// Whether a decision, as recorded, may count as a strike against its
/// item's author: enforced, applied, decided, and a verdict a weight can be
/// given to. The store marks the author for recomputation in the decision's
/// transaction when it does.
pub fn may_count(mode: Mode, applied: bool, outcome: Outcome, verdict: Option<Verdict>) -> bool {
    mode == Mode::Enforce
        && applied
        && outcome == Outcome::Ok
        && matches!(verdict, Some(Verdict::Flag | Verdict::Hold | Verdict::Reject))
}

/// An author's strike score at one time, as the store derives it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Strikes {
    /// A sum of non-negative weights: never negative, never `-0.0`.
    pub score: f64,
    /// How many decisions count: one per item (its heaviest, the latest of equals).
    pub counted: i64,
    /// When the score can next drop by the window moving: the oldest
    /// counting decision's expiry. `None` when nothing counts.
    pub next_expiry: Option<i64>,
}

impl StandingPolicy {
    /// Checks the configuration; the error names what is wrong.
    pub fn validate(&self) -> Result<(), String> {
        if self.window_ms <= 0 {
            return Err("standing.window_ms must be positive".into());
        }
        let Some(first) = self.tiers.first() else {
            return Err("standing.tiers must name at least one tier".into());
        };
        if first.strikes != 0.0 || first.effect != TierEffect::None {
            return Err(format!(
                "standing.tiers: the first tier ({}) is every author's state without strikes: it starts at 0 strikes, with no effect",
                first.name
            ));
        }
        for pair in self.tiers.windows(2) {
            if pair[1].strikes.partial_cmp(&pair[0].strikes) != Some(std::cmp::Ordering::Greater) {
                return Err(format!(
                    "standing.tiers must be in increasing order of strikes ({} then {})",
                    pair[0].name, pair[1].name
                ));
            }
        }
        let mut names: Vec<&str> = self.tiers.iter().map(|t| t.name.as_str()).collect();
        names.sort_unstable();
        if names.windows(2).any(|w| w[0] == w[1]) {
            return Err("standing.tiers: two tiers have one name".into());
        }
        for t in &self.tiers {
            let ok = !t.name.is_empty()
                && t.name.len() <= 64
                && t.name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
            if !ok {
                return Err(format!(
                    "standing.tiers: {:?} is not a tier name (1-64 of a-z, 0-9, '_', '-')",
                    t.name
                ));
            }
            if !t.strikes.is_finite() {
                return Err(format!("standing.tiers: {} has no finite strikes", t.name));
            }
        }
        for (what, w) in self
            .weights
            .iter()
            .map(|(v, w)| (v.as_str().to_string(), w))
            .chain(self.labels.iter().map(|(l, w)| (format!("label {l}"), w)))
        {
            if !w.is_finite() || *w < 0.0 {
                return Err(format!("standing weight of {what} must be a number >= 0"));
            }
        }
        Ok(())
    }

    /// The state of an author without strikes.
    pub fn initial(&self) -> &str {
        self.tiers.first().map_or("good", |t| t.name.as_str())
    }

    /// The tier a score reaches: the last whose threshold it meets.
    pub fn tier_for(&self, score: f64) -> &Tier {
        self.tiers
            .iter()
            .rev()
            .find(|t| score >= t.strikes)
            .or(self.tiers.first())
            .expect("validated: at least one tier")
    }

    /// A tier by name.
    pub fn tier(&self, name: &str) -> Option<&Tier> {
        self.tiers.iter().find(|t| t.name == name)
    }

    /// The strikes one decision weighs: the heaviest of its verdict's and
    /// its labels' weights (0: it does not count).
    pub fn weight(&self, verdict: Verdict, labels: &[String]) -> f64 {
        let by_verdict = self.weights.get(&verdict).copied().unwrap_or(0.0);
        labels
            .iter()
            .filter_map(|l| self.labels.get(l))
            .fold(by_verdict, |a, b| a.max(*b))
    }

    /// The verdicts whose decisions can weigh anything (the store reads only those).
    pub fn counted_verdicts(&self) -> Vec<Verdict> {
        if self.labels.values().any(|w| *w > 0.0) {
            // A label can weigh on any verdict but `allow`.
            return [Verdict::Flag, Verdict::Hold, Verdict::Reject].to_vec();
        }
        self.weights
            .iter()
            .filter(|(_, w)| **w > 0.0)
            .map(|(v, _)| *v)
            .collect()
    }

    /// Whether a decision as recorded can change its author's score under
    /// this policy: it may count ([`may_count`]) and weighs more than 0.
    /// Only such decisions queue a recomputation of the author.
    pub fn weighs(
        &self,
        mode: Mode,
        applied: bool,
        outcome: Outcome,
        verdict: Option<Verdict>,
        labels: &[String],
    ) -> bool {
        match verdict {
            Some(v) if may_count(mode, applied, outcome, verdict) => self.weight(v, labels) > 0.0,
            _ => false,
        }
    }

    /// What an author's state does to a new submission (`None`: nothing,
    /// or standing is off).
    pub fn effect(&self, state: &str) -> Option<super::policy::StandingEffect> {
        if !self.enabled {
            return None;
        }
        let verdict = self.tier(state)?.effect.verdict()?;
        Some(super::policy::StandingEffect {
            verdict,
            state: state.to_string(),
        })
    }
}

/// What an automated recomputation does to an author's state: the tier the
/// score reaches, unless a moderator decided the state (a manual state wins
/// over automation until a moderator clears it).
pub fn automated_target<'a>(policy: &'a StandingPolicy, current: &str, manual: bool, score: f64) -> Option<&'a str> {
    if manual {
        return None;
    }
    let target = policy.tier_for(score).name.as_str();
    (target != current).then_some(target)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_enforced_applied_decided_verdicts_may_count() {
        assert!(may_count(Mode::Enforce, true, Outcome::Ok, Some(Verdict::Reject)));
        assert!(may_count(Mode::Enforce, true, Outcome::Ok, Some(Verdict::Flag)));
        assert!(!may_count(Mode::Shadow, true, Outcome::Ok, Some(Verdict::Reject)));
        assert!(!may_count(Mode::Enforce, false, Outcome::Ok, Some(Verdict::Reject)));
        assert!(!may_count(Mode::Enforce, true, Outcome::Timeout, None));
        assert!(!may_count(Mode::Enforce, true, Outcome::Ok, Some(Verdict::Allow)));
        assert!(!may_count(Mode::Enforce, true, Outcome::Ok, Some(Verdict::Defer)));
    }

    #[test]
    fn the_heaviest_of_the_verdicts_and_the_labels_weight_counts() {
        let mut p = StandingPolicy::default();
        p.labels.insert("scam".into(), 5.0);
        let scam = ["scam".to_string()];
        assert_eq!(p.weight(Verdict::Flag, &scam), 5.0);
        assert_eq!(p.weight(Verdict::Reject, &[]), 1.0);
        assert_eq!(p.weight(Verdict::Hold, &["other".to_string()]), 0.0);
        // A zero weight never queues a recomputation; a label can make it weigh.
        assert!(!p.weighs(Mode::Enforce, true, Outcome::Ok, Some(Verdict::Hold), &[]));
        assert!(p.weighs(Mode::Enforce, true, Outcome::Ok, Some(Verdict::Hold), &scam));
        assert!(!p.weighs(Mode::Shadow, true, Outcome::Ok, Some(Verdict::Reject), &scam));
        // The store reads only the verdicts that can weigh.
        assert_eq!(
            p.counted_verdicts(),
            vec![Verdict::Flag, Verdict::Hold, Verdict::Reject]
        );
        assert_eq!(StandingPolicy::default().counted_verdicts(), vec![Verdict::Reject]);
    }

    #[test]
    fn tiers_are_reached_by_threshold_and_manual_states_win() {
        let p = StandingPolicy {
            enabled: true,
            ..StandingPolicy::default()
        };
        assert_eq!(p.tier_for(0.0).name, "good");
        assert_eq!(p.tier_for(1.9).name, "good");
        assert_eq!(p.tier_for(2.0).name, "watch");
        assert_eq!(p.tier_for(20.0).name, "suspended");
        assert_eq!(automated_target(&p, "good", false, 9.0), Some("suspended"));
        assert_eq!(automated_target(&p, "suspended", false, 9.0), None);
        assert_eq!(automated_target(&p, "watch", true, 9.0), None);
        // A state no tier names any more (the configuration changed) moves to the score's tier.
        assert_eq!(automated_target(&p, "probation", false, 0.0), Some("good"));
        assert_eq!(p.effect("restricted").map(|e| e.verdict), Some(Verdict::Hold));
        assert_eq!(p.effect("suspended").map(|e| e.verdict), Some(Verdict::Reject));
        assert_eq!(p.effect("watch"), None);
        assert_eq!(StandingPolicy::default().effect("suspended"), None, "off: no effect");
    }

    #[test]
    fn bad_configurations_are_refused() {
        assert_eq!(StandingPolicy::default().validate(), Ok(()));
        let with = |f: &dyn Fn(&mut StandingPolicy)| {
            let mut p = StandingPolicy::default();
            f(&mut p);
            p.validate().unwrap_err()
        };
        assert!(with(&|p| p.tiers.clear()).contains("at least one"));
        assert!(with(&|p| p.tiers[0].strikes = 1.0).contains("starts at 0"));
        assert!(with(&|p| p.tiers[2].strikes = 1.0).contains("increasing"));
        assert!(with(&|p| p.tiers[3].name = "watch".into()).contains("one name"));
        assert!(with(&|p| p.tiers[1].name = "Watch Out".into()).contains("not a tier name"));
        assert!(with(&|p| p.window_ms = 0).contains("window_ms"));
        assert!(
            with(&|p| {
                p.weights.insert(Verdict::Hold, -1.0);
            })
            .contains("hold")
        );
    }

    #[test]
    fn check_constraints_mirror_the_enums() {
        let causes: Vec<&str> = AuthorCause::ALL.iter().map(|c| c.as_str()).collect();
        crate::domain::check_constraints::assert_mirrors("author_transitions", "cause", &causes);
        let actors: Vec<&str> = AuthorActor::ALL.iter().map(|a| a.as_str()).collect();
        crate::domain::check_constraints::assert_mirrors("author_transitions", "actor", &actors);
        crate::domain::check_constraints::assert_mirrors("authors", "decided_by", &actors);
    }
}
