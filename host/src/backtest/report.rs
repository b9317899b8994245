//! The report of a backtest: one JSON object, the same from `gavel backtest
//! --json` and `GET /v1/backtests/{id}`, and the HTML page rendered from it
//! (`html.rs`).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A plugin version: name, declared version, sha256 of the component.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct VersionRef {
    pub name: String,
    pub version: String,
    pub digest: String,
}

impl VersionRef {
    /// The stamp of a loaded plugin.
    pub fn of(stamp: &crate::rules::PluginStamp) -> VersionRef {
        VersionRef {
            name: stamp.name.clone(),
            version: stamp.version.clone(),
            digest: stamp.digest.to_hex(),
        }
    }
}

/// The time window replayed, milliseconds since the Unix epoch (`until` exclusive).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Window {
    pub since_ms: i64,
    pub until_ms: i64,
}

/// How many evaluations were asked for, replayed, and could not be.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Sample {
    /// Evaluations in the window (the population the sample is drawn from).
    pub available: u64,
    /// The sample size asked for (`null`: all).
    pub requested: Option<u64>,
    /// Evaluations the candidate judged.
    pub replayed: u64,
    /// Evaluations of the sample that could not be replayed, by reason
    /// (`snapshot expired`, `no stored snapshot`, `config expired`,
    /// `phase not declared by the candidate`).
    pub not_replayable: BTreeMap<String, u64>,
}

/// `from → to → count`: rows are the old value, columns the new one.
pub type Matrix = BTreeMap<String, BTreeMap<String, u64>>;

/// One evaluation whose combined status the candidate changes (or not).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Example {
    pub item_id: String,
    /// When the evaluation ran.
    pub at_ms: i64,
    /// The incumbent's stored decision (`verdict` or the failed outcome),
    /// `none` when it did not judge this evaluation.
    pub old_decision: String,
    pub old_reason: String,
    pub new_decision: String,
    pub new_reason: String,
    pub old_status: String,
    pub new_status: String,
    /// The start of the item's text as the rule saw it (at most 160 chars).
    pub excerpt: String,
}

/// Evaluations by how the combined status moved.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Flips {
    /// Same combined status.
    pub unchanged: u64,
    /// Not actioned before (visible, awaiting a provider), actioned now
    /// (held for review or rejected).
    pub newly_actioned: u64,
    /// Actioned before, not now.
    pub newly_cleared: u64,
    /// Another status on the same side (held ↔ rejected, visible ↔ awaiting a provider).
    pub changed: u64,
    /// Up to 20 per bucket but `unchanged`, keyed `newly_actioned`,
    /// `newly_cleared`, `changed`.
    pub examples: BTreeMap<String, Vec<Example>>,
}

/// How the old and the new combined status compare with what moderators
/// decided, on whether the item is actioned.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Moderators {
    /// Replayed items a moderator decided (each judged by the last replayed
    /// evaluation before the moderator's decision).
    pub decided: u64,
    /// Of those, how many the old combined status agrees with.
    pub old_agree: u64,
    pub new_agree: u64,
    /// `old_agree / decided` (`null` when nothing was decided).
    pub old_agreement: Option<f64>,
    pub new_agreement: Option<f64>,
    /// Items the incumbent actioned and a moderator reversed, that the
    /// candidate would not have actioned.
    pub reversals_avoided: u64,
    /// Items a moderator cleared that the incumbent did not action, that the
    /// candidate would action.
    pub overturns_reintroduced: u64,
}

/// Latency percentiles of one side, microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Latency {
    pub p50: u64,
    pub p99: u64,
}

/// Evaluation time of the candidate (measured now) and the incumbent (as stored).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Latencies {
    pub candidate: Latency,
    pub incumbent: Option<Latency>,
}

/// Whether the candidate reproduces the stored decisions of its own digest.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Fidelity {
    /// Replayed evaluations whose stored decision was made by the candidate's digest.
    pub checked: u64,
    /// Of those, how many the candidate decided identically (outcome,
    /// verdict, score, labels, reason).
    pub identical: u64,
}

/// What a candidate would have done to stored history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Report {
    /// The plugin judging (the first, when several did).
    pub candidate: VersionRef,
    /// Every plugin judging: the candidate; in a backtest of candidate
    /// lists alone, the deployed version of each plugin whose decisions in
    /// the window consulted them, each in place of its own decisions.
    #[serde(default)]
    pub candidates: Vec<VersionRef>,
    /// The candidate lists answering the rules' calls in place of the
    /// stored lists of the same names (empty: every list answered from the
    /// version each replayed decision used).
    #[serde(default)]
    pub lists: Vec<super::ListRef>,
    /// The versions of the replaced plugins whose decisions were replayed
    /// (usually one; several when it changed inside the window). Empty for
    /// a new plugin.
    pub incumbent: Vec<VersionRef>,
    /// The plugin names replaced (comma-separated when several).
    pub replaces: String,
    /// The candidate's own config (its sidecar's, or a loaded plugin's);
    /// `null` when it has none and each evaluation used the config stored
    /// with the replaced decision, or when several plugins judged (each
    /// with its deployed config).
    pub config: Option<BTreeMap<String, String>>,
    /// Config pairs set for this backtest, on top of either.
    pub overrides: BTreeMap<String, String>,
    pub window: Window,
    pub sample: Sample,
    /// The replaced plugin's verdict (or failed outcome, or `none`) → the
    /// candidate's (each judging plugin's, when several did).
    pub verdicts: Matrix,
    /// The combined status before → after, the other enforcing plugins'
    /// stored decisions held fixed.
    pub statuses: Matrix,
    pub flips: Flips,
    pub moderators: Moderators,
    /// The candidate's outcomes: ok, error, trap, timeout, memory, invalid.
    pub outcomes: BTreeMap<String, u64>,
    pub latency_us: Latencies,
    /// Present when the candidate's digest has stored decisions among the replayed.
    pub fidelity: Option<Fidelity>,
    /// Entity signals a candidate declares that the stored snapshots did
    /// not carry (new since they were judged): how many snapshots got
    /// values recomputed from the stored items, by signal. Every other
    /// value is the one stored with the snapshot, as the rules saw it.
    pub recomputed_signals: BTreeMap<String, u64>,
    /// When the run started and how long it took.
    pub started_at_ms: i64,
    pub elapsed_ms: u64,
}
