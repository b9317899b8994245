//! Author standing: an author's strike score, derived from the decision log
//! inside a window, and the account state (tier) it reaches. Pure functions
//! of their inputs; the store reads the decisions and commits the result
//! with a conditional write (`store/authors.rs`).
//!
//! The score is never incremented. At any time it is the sum, over the
//! author's items, of the heaviest counting decision on each item inside
//! the window: an item judged five times on its way to `rejected` is one
//! strike, not five, a moderator's reversal removes the strike by itself,
//! and expiry is the window moving.

use super::{ItemStatus, Mode, Outcome, Verdict};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

super::string_enum! {
    /// Why an author's account state changed (the audit row's `cause`).
    pub enum AuthorCause("author transition cause") {
        /// Automation: the strike score reached another tier.
        Strikes = "strikes",
        /// A moderator set or cleared the state.
        Moderation = "moderation",
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

/// A decision that may count as a strike, as the store reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct CountedDecision {
    pub id: i64,
    pub item_id: String,
    pub verdict: Verdict,
    pub labels: Vec<String>,
    pub created_at: i64,
    /// The item's status when a moderator decided it (`None`: automation's).
    pub manual_status: Option<ItemStatus>,
}

impl CountedDecision {
    /// Whether a moderator's decision on the item overrules this one: a
    /// moderator who made it visible overrules every automated decision on
    /// it, one who held it overrules rejections; a rejection or a deletion
    /// by a moderator overrules nothing. (Reversal marks only the decisions
    /// behind the item's latest automated status; this covers earlier ones.)
    pub fn overruled(&self) -> bool {
        match self.manual_status {
            Some(ItemStatus::Visible) => true,
            Some(ItemStatus::HeldForReview) => self.verdict == Verdict::Reject,
            _ => false,
        }
    }
}

/// An author's strike score at one time, and what made it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Strikes {
    pub score: f64,
    /// The decisions that count (one per item: its heaviest, the latest of equals), by id.
    pub decisions: Vec<i64>,
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

    /// The score at `now` of an author whose enforced, not reversed
    /// decisions are `decisions` (any order; older ones are ignored).
    pub fn strikes(&self, decisions: &[CountedDecision], now: i64) -> Strikes {
        let since = now - self.window_ms;
        // Per item: the heaviest decision in the window (the latest of equals).
        let mut per_item: BTreeMap<&str, (f64, i64, i64)> = BTreeMap::new();
        for d in decisions.iter().filter(|d| d.created_at > since && !d.overruled()) {
            let w = self.weight(d.verdict, &d.labels);
            if w <= 0.0 {
                continue;
            }
            let slot = per_item.entry(d.item_id.as_str()).or_insert((w, d.id, d.created_at));
            if (w, d.created_at, d.id) > (slot.0, slot.2, slot.1) {
                *slot = (w, d.id, d.created_at);
            }
        }
        let mut decisions: Vec<i64> = per_item.values().map(|(_, id, _)| *id).collect();
        decisions.sort_unstable();
        Strikes {
            score: per_item.values().map(|(w, ..)| w).sum(),
            decisions,
            next_expiry: per_item.values().map(|(_, _, at)| at + self.window_ms).min(),
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

    fn d(id: i64, item: &str, verdict: Verdict, at: i64) -> CountedDecision {
        CountedDecision {
            id,
            item_id: item.into(),
            verdict,
            labels: Vec::new(),
            created_at: at,
            manual_status: None,
        }
    }

    #[test]
    fn one_strike_per_item_however_often_it_was_judged() {
        let p = StandingPolicy::default();
        let ds = [
            d(1, "a", Verdict::Reject, 100),
            d(2, "a", Verdict::Reject, 200),
            d(3, "b", Verdict::Reject, 150),
            d(4, "c", Verdict::Hold, 150),
        ];
        let s = p.strikes(&ds, 1_000);
        assert_eq!(s.score, 2.0);
        // Item a counts its latest decision; c's hold weighs nothing by default.
        assert_eq!(s.decisions, vec![2, 3]);
        assert_eq!(s.next_expiry, Some(150 + p.window_ms));
    }

    #[test]
    fn a_moderators_decision_overrules_the_more_severe_automated_ones() {
        let p = StandingPolicy::default();
        let on = |status, verdict| CountedDecision {
            manual_status: status,
            ..d(1, "a", verdict, 100)
        };
        // An earlier rejection the reversal did not mark (another item version) no longer counts...
        assert_eq!(
            p.strikes(&[on(Some(ItemStatus::Visible), Verdict::Reject)], 200).score,
            0.0
        );
        assert_eq!(
            p.strikes(&[on(Some(ItemStatus::HeldForReview), Verdict::Reject)], 200)
                .score,
            0.0
        );
        // ...but a moderator who confirms a rejection, or deletes the item, keeps it counting.
        assert_eq!(
            p.strikes(&[on(Some(ItemStatus::Rejected), Verdict::Reject)], 200).score,
            1.0
        );
        assert_eq!(
            p.strikes(&[on(Some(ItemStatus::Deleted), Verdict::Reject)], 200).score,
            1.0
        );
        assert_eq!(p.strikes(&[on(None, Verdict::Reject)], 200).score, 1.0);
        let mut held = StandingPolicy::default();
        held.weights.insert(Verdict::Hold, 0.5);
        assert_eq!(
            held.strikes(&[on(Some(ItemStatus::HeldForReview), Verdict::Hold)], 200)
                .score,
            0.5
        );
    }

    #[test]
    fn only_enforced_applied_decided_verdicts_may_count() {
        use super::super::{Mode, Outcome};
        assert!(may_count(Mode::Enforce, true, Outcome::Ok, Some(Verdict::Reject)));
        assert!(may_count(Mode::Enforce, true, Outcome::Ok, Some(Verdict::Flag)));
        assert!(!may_count(Mode::Shadow, true, Outcome::Ok, Some(Verdict::Reject)));
        assert!(!may_count(Mode::Enforce, false, Outcome::Ok, Some(Verdict::Reject)));
        assert!(!may_count(Mode::Enforce, true, Outcome::Timeout, None));
        assert!(!may_count(Mode::Enforce, true, Outcome::Ok, Some(Verdict::Allow)));
        assert!(!may_count(Mode::Enforce, true, Outcome::Ok, Some(Verdict::Defer)));
    }

    #[test]
    fn the_window_moving_drops_old_strikes() {
        let p = StandingPolicy {
            window_ms: 1_000,
            ..StandingPolicy::default()
        };
        let ds = [d(1, "a", Verdict::Reject, 100), d(2, "b", Verdict::Reject, 900)];
        assert_eq!(p.strikes(&ds, 1_099).score, 2.0);
        assert_eq!(p.strikes(&ds, 1_099).next_expiry, Some(1_100));
        let later = p.strikes(&ds, 1_100);
        assert_eq!((later.score, later.decisions.as_slice()), (1.0, &[2][..]));
        assert_eq!(p.strikes(&ds, 1_900), Strikes::default());
    }

    #[test]
    fn labels_weigh_more_than_their_verdict() {
        let mut p = StandingPolicy::default();
        p.labels.insert("scam".into(), 5.0);
        let mut flagged = d(1, "a", Verdict::Flag, 10);
        flagged.labels = vec!["scam".into()];
        assert_eq!(p.weight(Verdict::Flag, &flagged.labels), 5.0);
        assert_eq!(p.weight(Verdict::Reject, &[]), 1.0);
        assert_eq!(p.strikes(&[flagged], 20).score, 5.0);
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
