//! Judging stored evaluations again: the tally of a backtest, chunk by
//! chunk, and the step-by-step replay of one item's history.

use super::report::{
    Example, Fidelity, Flips, Latencies, Latency, Matrix, Moderators, Report, Sample, VersionRef, Window,
};
use super::{BacktestError, Cancel, Candidate, Request, config_map, phase_of};
use crate::clock::Millis;
use crate::domain::{ItemStatus, Mode, Outcome, Phase, Verdict};
use crate::rules::{Evaluation, RuleEngine, Snapshot, snapshot_from_spec};
use crate::store::{DecisionRecord, History, ReplayUnit, StoreError, StoreResult};
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt, TryStreamExt};
use gavel_plugin_sdk::spec::SnapshotSpec;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

/// Examples kept per flip bucket.
const EXAMPLES: usize = 20;
/// Characters of text in an example.
const EXCERPT_CHARS: usize = 160;

/// Whether a status takes the item down (held for review or rejected).
fn actioned(status: ItemStatus) -> bool {
    matches!(status, ItemStatus::HeldForReview | ItemStatus::Rejected)
}

/// Whether a verdict takes the item down.
fn actions(verdict: Option<Verdict>) -> bool {
    matches!(verdict, Some(Verdict::Hold | Verdict::Reject))
}

/// A decision's verdict as it counts when combined: a failed evaluation is
/// `hold` when fail-closed; `defer` does not count in the sync phase.
fn counted(outcome: Outcome, verdict: Option<Verdict>, phase: Phase, fail_closed: bool) -> Option<Verdict> {
    let v = match (outcome, verdict) {
        (Outcome::Ok, v) => v,
        (o, _) if fail_closed && o.is_failure() => Some(Verdict::Hold),
        _ => None,
    };
    v.filter(|v| !(phase == Phase::Sync && *v == Verdict::Defer))
}

/// The status enforcing verdicts settle an item in (with the item's sync
/// verdict in the async phase, as the worker combines them).
fn combine(verdicts: impl Iterator<Item = Option<Verdict>>, phase: Phase, sync: Option<Verdict>) -> ItemStatus {
    let sync = if phase == Phase::Async { sync } else { None };
    let v = Verdict::most_severe(verdicts.flatten().chain(sync));
    v.map_or(ItemStatus::Visible, ItemStatus::for_verdict)
}

/// Decisions read per round trip around one evaluation: more than one
/// evaluation's (the plugins of a phase) as deployed; a longer evaluation
/// is read again with four times the span.
const SPAN: i64 = 16;

/// Store reads of one unit's evaluation at once (the read pool's size).
const READS_IN_FLIGHT: usize = 4;

/// The stored decisions one replayed evaluation is combined with.
struct Context {
    /// The unit's own decision.
    decision: DecisionRecord,
    /// Every decision of its evaluation (itself included), by id.
    evaluation: Vec<DecisionRecord>,
    /// In the async phase, the item's sync decisions in force before it.
    sync: Vec<DecisionRecord>,
}

/// The decisions of the evaluation that made decision `id` of `item`: the
/// run of the item's decisions around it made in one evaluation (written
/// in one transaction, so nothing of the item comes between), by id;
/// `None` if the decision is gone. Two keyset reads of at most a span each
/// on `decisions_item`, whatever the item's history.
async fn evaluation_of(store: &dyn History, item: &str, id: i64) -> StoreResult<Option<Vec<DecisionRecord>>> {
    let mut span = SPAN;
    loop {
        let later = store.item_decisions_from(item, id, span).await?;
        let Some(unit) = later.first().filter(|d| d.id == id) else {
            return Ok(None);
        };
        let earlier = store.item_decisions(item, Some(id), span).await?;
        let before = earlier.iter().take_while(|d| same_evaluation(d, unit)).count();
        let after = later.iter().take_while(|d| same_evaluation(d, unit)).count();
        if before as i64 == span || after as i64 == span {
            span *= 4;
            continue;
        }
        let mut run: Vec<DecisionRecord> = earlier.into_iter().take(before).rev().collect();
        run.extend(later.into_iter().take(after));
        return Ok(Some(run));
    }
}

/// The item's sync-phase decisions in force before decision `before`: those
/// of its latest sync evaluation before it, by id (a seek on the sync
/// decisions' own index, however many async ones came since).
async fn sync_before(store: &dyn History, item: &str, before: i64) -> StoreResult<Vec<DecisionRecord>> {
    let mut span = SPAN;
    loop {
        let newest = store.sync_decisions_before(item, before, span).await?;
        let Some(last) = newest.first() else {
            return Ok(Vec::new());
        };
        let n = newest.iter().take_while(|d| same_evaluation(d, last)).count();
        if n as i64 == span {
            span *= 4;
            continue;
        }
        return Ok(newest.into_iter().take(n).rev().collect());
    }
}

/// What a unit is combined with; `None` if its decision is gone.
async fn context_of(store: &dyn History, unit: &ReplayUnit) -> StoreResult<Option<Context>> {
    let Some(evaluation) = evaluation_of(store, &unit.item_id, unit.decision_id).await? else {
        return Ok(None);
    };
    let Some(decision) = evaluation.iter().find(|d| d.id == unit.decision_id).cloned() else {
        return Ok(None);
    };
    let sync = if phase_of(&decision) == Some(Phase::Async) {
        sync_before(store, &unit.item_id, decision.id).await?
    } else {
        Vec::new()
    };
    Ok(Some(Context {
        decision,
        evaluation,
        sync,
    }))
}

/// Whether two decisions of an item were made in one evaluation: on one
/// stored snapshot, or (none stored) in one phase at one time and version.
fn same_evaluation(a: &DecisionRecord, b: &DecisionRecord) -> bool {
    match (&a.snapshot_digest, &b.snapshot_digest) {
        (Some(x), Some(y)) => x == y,
        (None, None) => a.phase == b.phase && a.created_at == b.created_at && a.item_version == b.item_version,
        _ => false,
    }
}

/// A decision as one word: its verdict, or how it failed.
fn word(outcome: Outcome, verdict: Option<Verdict>) -> String {
    match (outcome, verdict) {
        (Outcome::Ok, Some(v)) => v.as_str().to_string(),
        (o, _) => o.as_str().to_string(),
    }
}

fn bump(m: &mut Matrix, from: &str, to: &str) {
    *m.entry(from.to_string())
        .or_default()
        .entry(to.to_string())
        .or_default() += 1;
}

fn excerpt(text: &str) -> String {
    text.chars().take(EXCERPT_CHARS).collect()
}

/// The snapshot a stored evaluation judged, with `config` in place.
fn rebuild(json: &[u8], config: BTreeMap<String, String>) -> Result<(SnapshotSpec, Snapshot), String> {
    let mut spec: SnapshotSpec = serde_json::from_slice(json).map_err(|e| e.to_string())?;
    spec.config = config;
    let snapshot = snapshot_from_spec(&spec);
    Ok((spec, snapshot))
}

/// The config the candidate runs with on a decision: its own (or the stored
/// one), then the overrides.
fn config_for(
    candidate: &Candidate,
    overrides: &[(String, String)],
    stored: Option<&[u8]>,
) -> Result<BTreeMap<String, String>, String> {
    let mut config = match (&candidate.config, stored) {
        (Some(own), _) => config_map(own),
        (None, Some(json)) => serde_json::from_slice(json).map_err(|e| format!("stored config: {e}"))?,
        (None, None) => BTreeMap::new(),
    };
    config.extend(overrides.iter().cloned());
    Ok(config)
}

/// The last replayed evaluation of an item before a moderator decided it.
#[derive(Debug, Clone, Copy)]
struct Reviewed {
    at: Millis,
    old_actioned: bool,
    new_actioned: bool,
    incumbent_actioned: bool,
    incumbent_reversed: bool,
    candidate_actioned: bool,
}

/// What moderators did to an item: when they first decided, and their last status.
#[derive(Debug, Clone, Copy)]
struct ModeratorView {
    first_at: Millis,
    last: ItemStatus,
}

/// One evaluation ready for the candidate.
struct Prepared {
    decision: DecisionRecord,
    /// Every decision of its evaluation.
    evaluation: Vec<DecisionRecord>,
    /// The item's sync decisions in force (async phase).
    sync_decisions: Vec<DecisionRecord>,
    item_id: String,
    phase: Phase,
    spec: SnapshotSpec,
    snapshot: Snapshot,
    /// sha256 of the config the candidate runs with.
    config_digest: String,
    /// In the async phase, when the replaced plugin decided the item's
    /// sync phase too: that sync snapshot (digest, snapshot) for the
    /// candidate to judge, or `None` when it is gone (the stored sync
    /// verdict is then kept).
    sync: Option<Option<(String, Snapshot)>>,
}

/// What the replaced plugin's part of an item's sync verdict becomes on the
/// new side of an async evaluation.
enum SyncPart {
    /// It had none, or the candidate does not run in the sync phase.
    Dropped,
    /// Its sync snapshot is gone: the stored verdict stands.
    Kept,
    /// The candidate's verdict on the same sync snapshot.
    Judged(Option<Verdict>),
}

/// The running totals of a backtest.
pub(super) struct Tally {
    candidate: Candidate,
    overrides: Vec<(String, String)>,
    since_ms: Millis,
    until_ms: Millis,
    fail_closed: bool,
    /// Units are the replaced plugin's own decisions (not a new plugin).
    replacing: bool,
    replayed: u64,
    not_replayable: BTreeMap<String, u64>,
    verdicts: Matrix,
    statuses: Matrix,
    flips: Flips,
    outcomes: BTreeMap<String, u64>,
    candidate_us: Vec<u64>,
    incumbent_us: Vec<u64>,
    fidelity: Fidelity,
    incumbents: BTreeSet<(String, String, String)>,
    /// What moderators did to the replayed items they decided (items
    /// without a moderator decision are not kept).
    moderators: HashMap<String, ModeratorView>,
    reviewed: HashMap<String, Reviewed>,
    cancel: Cancel,
}

impl Tally {
    pub(super) fn new(candidate: &Candidate, req: &Request, replacing: bool, cancel: Cancel) -> Tally {
        Tally {
            candidate: candidate.clone(),
            overrides: req.overrides.clone(),
            since_ms: req.since_ms,
            until_ms: req.until_ms,
            fail_closed: req.fail_closed,
            replacing,
            replayed: 0,
            not_replayable: BTreeMap::new(),
            verdicts: Matrix::new(),
            statuses: Matrix::new(),
            flips: Flips::default(),
            outcomes: BTreeMap::new(),
            candidate_us: Vec::new(),
            incumbent_us: Vec::new(),
            fidelity: Fidelity::default(),
            incumbents: BTreeSet::new(),
            moderators: HashMap::new(),
            reviewed: HashMap::new(),
            cancel,
        }
    }

    fn skip(&mut self, reason: &str) {
        *self.not_replayable.entry(reason.to_string()).or_default() += 1;
    }

    /// Replays one chunk of units: reads each one's evaluation (bounded
    /// reads, whatever its item's history), snapshots and configs, judges
    /// them with the candidate, and counts.
    pub(super) async fn replay_chunk(
        &mut self,
        store: &dyn History,
        engine: &Arc<RuleEngine>,
        units: &[ReplayUnit],
    ) -> Result<(), BacktestError> {
        // Boxed with one named lifetime: a spawned runner's future must be
        // `Send` for every borrow, which an unboxed closure's future is not
        // proven to be.
        let reads: Vec<BoxFuture<'_, StoreResult<Option<Context>>>> =
            units.iter().map(|unit| context_of(store, unit).boxed()).collect();
        let contexts: Vec<Option<Context>> = futures::stream::iter(reads)
            .buffered(READS_IN_FLIGHT)
            .try_collect()
            .await?;

        // The documents to read: each unit's snapshot, and its stored config
        // when the candidate has none of its own.
        let mut wanted: Vec<(&ReplayUnit, Context, Phase, Option<String>)> = Vec::new();
        let judges_sync = self.candidate.plugin.phases.contains(&Phase::Sync);
        let mut digests: HashSet<String> = HashSet::new();
        for (unit, context) in units.iter().zip(contexts) {
            let Some(context) = context else {
                self.skip("decision deleted");
                continue;
            };
            let d = &context.decision;
            let Some(phase) = phase_of(d) else { continue };
            if !self.candidate.plugin.phases.contains(&phase) {
                self.skip("phase not declared by the candidate");
                continue;
            }
            let Some(snapshot) = d.snapshot_digest.clone() else {
                self.skip("no stored snapshot");
                continue;
            };
            digests.insert(snapshot);
            if self.candidate.config.is_none()
                && self.replacing
                && let Some(config) = d.config_digest.clone()
            {
                digests.insert(config);
            }
            // An async evaluation combines with the item's sync verdict: the
            // candidate judges the sync snapshot the replaced plugin judged.
            let sync_digest = (phase == Phase::Async && self.replacing && judges_sync)
                .then(|| {
                    context
                        .sync
                        .iter()
                        .find(|s| s.plugin == d.plugin)
                        .map(|s| s.snapshot_digest.clone().unwrap_or_default())
                })
                .flatten();
            if let Some(s) = sync_digest.as_ref().filter(|s| !s.is_empty()) {
                digests.insert(s.clone());
            }
            wanted.push((unit, context, phase, sync_digest));
        }
        let digests: Vec<&str> = digests.iter().map(String::as_str).collect();
        let docs = store.input_docs(&digests).await?;

        let mut prepared = Vec::with_capacity(wanted.len());
        for (unit, context, phase, sync_digest) in wanted {
            let d = &context.decision;
            let digest = d.snapshot_digest.as_deref().unwrap_or_default();
            let Some(json) = docs.get(digest) else {
                self.skip("snapshot expired");
                continue;
            };
            let stored_config = match (&self.candidate.config, self.replacing, d.config_digest.as_deref()) {
                (None, true, Some(c)) => match docs.get(c) {
                    Some(json) => Some(json.as_slice()),
                    None => {
                        self.skip("config expired");
                        continue;
                    }
                },
                _ => None,
            };
            let config = match config_for(&self.candidate, &self.overrides, stored_config) {
                Ok(c) => c,
                Err(_) => {
                    self.skip("stored config unreadable");
                    continue;
                }
            };
            let pairs: Vec<(String, String)> = config.clone().into_iter().collect();
            let sync = sync_digest.map(|digest| {
                docs.get(&digest)
                    .and_then(|json| rebuild(json, config.clone()).ok())
                    .map(|(_, snapshot)| (digest, snapshot))
            });
            let Ok((spec, snapshot)) = rebuild(json, config) else {
                self.skip("stored snapshot unreadable");
                continue;
            };
            prepared.push(Prepared {
                decision: context.decision,
                evaluation: context.evaluation,
                sync_decisions: context.sync,
                item_id: unit.item_id.clone(),
                phase,
                spec,
                snapshot,
                config_digest: crate::judge::config_doc(&pairs).digest.clone(),
                sync,
            });
        }
        // Only the items replayed here: a unit skipped above keeps no state.
        let mut items: Vec<&str> = prepared.iter().map(|p| p.item_id.as_str()).collect();
        items.sort_unstable();
        items.dedup();
        self.learn_moderators(store, &items).await?;

        let plugin = self.candidate.plugin.clone();
        let engine = engine.clone();
        let cancel = self.cancel.clone();
        let stopped = move || cancel.is_set();
        let judged = tokio::task::spawn_blocking(move || {
            // One sync snapshot judged once for all its item's async evaluations.
            let mut sync_verdicts: HashMap<String, Option<Evaluation>> = HashMap::new();
            prepared
                .into_iter()
                .map_while(|p| {
                    (!stopped()).then(|| {
                        let e = plugin.evaluate(&engine, &p.snapshot, p.phase);
                        let sync = match &p.sync {
                            None => SyncPart::Dropped,
                            Some(None) => SyncPart::Kept,
                            Some(Some((digest, snapshot))) => {
                                let judged = sync_verdicts
                                    .entry(digest.clone())
                                    .or_insert_with(|| plugin.evaluate(&engine, snapshot, Phase::Sync).ok());
                                match judged {
                                    Some(s) => SyncPart::Judged(
                                        s.decision
                                            .as_ref()
                                            .map(|d| d.verdict)
                                            .filter(|_| s.outcome == Outcome::Ok),
                                    ),
                                    None => SyncPart::Kept,
                                }
                            }
                        };
                        (p, e, sync)
                    })
                })
                .collect::<Vec<_>>()
        })
        .await
        .map_err(|e| BacktestError::Failed(format!("the candidate's evaluation thread failed: {e}")))?;
        if self.cancel.is_set() {
            return Err(BacktestError::Cancelled);
        }

        for (p, e, sync_part) in judged {
            match e {
                Ok(e) => {
                    let evaluation: Vec<&DecisionRecord> = p.evaluation.iter().collect();
                    let sync: Vec<&DecisionRecord> = p.sync_decisions.iter().collect();
                    self.count(&p, &e, &evaluation, &sync, sync_part);
                }
                Err(_) => self.skip("host busy"),
            }
        }
        Ok(())
    }

    /// Reads what moderators did to `items` not seen in an earlier chunk.
    async fn learn_moderators(&mut self, store: &dyn History, items: &[&str]) -> Result<(), StoreError> {
        let new: Vec<&str> = items
            .iter()
            .copied()
            .filter(|i| !self.moderators.contains_key(*i))
            .collect();
        if new.is_empty() {
            return Ok(());
        }
        for m in store.moderator_decisions(&new).await? {
            self.moderators
                .entry(m.item_id)
                .and_modify(|v| v.last = m.to)
                .or_insert(ModeratorView {
                    first_at: m.at,
                    last: m.to,
                });
        }
        Ok(())
    }

    /// Counts one replayed evaluation. `sync` are the item's sync-phase
    /// decisions in force: in the async phase their verdict combines with
    /// the evaluation's, the replaced plugin's part on the new side as
    /// `sync_part` says.
    fn count(
        &mut self,
        p: &Prepared,
        e: &Evaluation,
        evaluation: &[&DecisionRecord],
        sync: &[&DecisionRecord],
        sync_part: SyncPart,
    ) {
        let fail_closed = self.fail_closed;
        let incumbent = self.replacing.then_some(&p.decision);
        let replaced = incumbent.map(|d| d.plugin.as_str());
        let sync_verdict = |leave_out: Option<&str>| {
            Verdict::most_severe(
                sync.iter()
                    .filter(|d| d.mode == Mode::Enforce && Some(d.plugin.as_str()) != leave_out)
                    .filter_map(|d| counted(d.outcome, d.verdict, Phase::Sync, fail_closed)),
            )
        };
        let same_phase = |d: &&&DecisionRecord| phase_of(d) == Some(p.phase);
        let enforcing = |d: &&&DecisionRecord| d.mode == Mode::Enforce;
        let old = combine(
            evaluation
                .iter()
                .filter(same_phase)
                .filter(enforcing)
                .map(|d| counted(d.outcome, d.verdict, p.phase, fail_closed)),
            p.phase,
            sync_verdict(None),
        );
        let candidate_verdict = e.decision.as_ref().map(|d| d.verdict);
        let new = combine(
            evaluation
                .iter()
                .filter(same_phase)
                .filter(enforcing)
                .filter(|d| Some(d.plugin.as_str()) != replaced)
                .map(|d| counted(d.outcome, d.verdict, p.phase, fail_closed))
                .chain([counted(e.outcome, candidate_verdict, p.phase, fail_closed)]),
            p.phase,
            match sync_part {
                SyncPart::Dropped => sync_verdict(replaced),
                SyncPart::Kept => sync_verdict(None),
                // `defer` does not count in the sync phase.
                SyncPart::Judged(v) => Verdict::most_severe(
                    sync_verdict(replaced)
                        .into_iter()
                        .chain(v.filter(|v| *v != Verdict::Defer)),
                ),
            },
        );
        self.replayed += 1;
        let old_word = incumbent.map_or_else(|| "none".to_string(), |d| word(d.outcome, d.verdict));
        let new_word = word(e.outcome, candidate_verdict);
        bump(&mut self.verdicts, &old_word, &new_word);
        bump(&mut self.statuses, old.as_str(), new.as_str());
        *self.outcomes.entry(e.outcome.as_str().to_string()).or_default() += 1;
        self.candidate_us.push(e.duration.as_micros() as u64);
        if let Some(d) = incumbent {
            self.incumbent_us.push(d.duration_us.max(0) as u64);
            self.incumbents
                .insert((d.plugin.clone(), d.plugin_version.clone(), d.plugin_digest.clone()));
            if d.plugin_digest == e.plugin.digest.to_hex() && d.config_digest.as_deref() == Some(&p.config_digest) {
                self.fidelity.checked += 1;
                if same_decision(d, e) {
                    self.fidelity.identical += 1;
                }
            }
        }
        let bucket = match (actioned(old), actioned(new)) {
            _ if old == new => None,
            (false, true) => Some("newly_actioned"),
            (true, false) => Some("newly_cleared"),
            _ => Some("changed"),
        };
        match bucket {
            None => self.flips.unchanged += 1,
            Some("newly_actioned") => self.flips.newly_actioned += 1,
            Some("newly_cleared") => self.flips.newly_cleared += 1,
            Some(_) => self.flips.changed += 1,
        }
        if let Some(bucket) = bucket {
            let examples = self.flips.examples.entry(bucket.to_string()).or_default();
            if examples.len() < EXAMPLES {
                examples.push(Example {
                    item_id: p.item_id.clone(),
                    at_ms: p.decision.created_at,
                    old_decision: old_word,
                    old_reason: incumbent.map(|d| d.reason.clone()).unwrap_or_default(),
                    new_decision: new_word,
                    new_reason: e
                        .decision
                        .as_ref()
                        .map(|d| d.reason.clone())
                        .or_else(|| e.error.clone())
                        .unwrap_or_default(),
                    old_status: old.as_str().to_string(),
                    new_status: new.as_str().to_string(),
                    excerpt: excerpt(&p.spec.item.text),
                });
            }
        }
        if let Some(m) = self.moderators.get(&p.item_id)
            && p.decision.created_at < m.first_at
        {
            let seen = Reviewed {
                at: p.decision.created_at,
                old_actioned: actioned(old),
                new_actioned: actioned(new),
                incumbent_actioned: incumbent.is_some_and(|d| d.outcome == Outcome::Ok && actions(d.verdict)),
                incumbent_reversed: incumbent.is_some_and(|d| d.reversed_at.is_some()),
                candidate_actioned: actions(candidate_verdict),
            };
            let slot = self.reviewed.entry(p.item_id.clone()).or_insert(seen);
            if seen.at >= slot.at {
                *slot = seen;
            }
        }
    }

    fn moderators(&self) -> Moderators {
        let mut m = Moderators::default();
        for (item, r) in &self.reviewed {
            let Some(view) = self.moderators.get(item) else {
                continue;
            };
            let moderator = actioned(view.last);
            m.decided += 1;
            m.old_agree += u64::from(r.old_actioned == moderator);
            m.new_agree += u64::from(r.new_actioned == moderator);
            m.reversals_avoided += u64::from(r.incumbent_actioned && r.incumbent_reversed && !r.candidate_actioned);
            m.overturns_reintroduced += u64::from(!moderator && !r.incumbent_actioned && r.candidate_actioned);
        }
        let rate = |n: u64| (m.decided > 0).then(|| n as f64 / m.decided as f64);
        m.old_agreement = rate(m.old_agree);
        m.new_agreement = rate(m.new_agree);
        m
    }

    pub(super) fn report(self, replaces: String, sample: Sample, started_at_ms: Millis, elapsed_ms: u64) -> Report {
        let stamp = &self.candidate.plugin.plugin.stamp;
        let moderators = self.moderators();
        Report {
            candidate: VersionRef::of(stamp),
            incumbent: self
                .incumbents
                .iter()
                .map(|(name, version, digest)| VersionRef {
                    name: name.clone(),
                    version: version.clone(),
                    digest: digest.clone(),
                })
                .collect(),
            replaces,
            config: self.candidate.config.as_deref().map(config_map),
            overrides: config_map(&self.overrides),
            window: Window {
                since_ms: self.since_ms,
                until_ms: self.until_ms,
            },
            sample: Sample {
                replayed: self.replayed,
                not_replayable: self.not_replayable,
                ..sample
            },
            verdicts: self.verdicts,
            statuses: self.statuses,
            flips: self.flips,
            moderators,
            outcomes: self.outcomes,
            latency_us: Latencies {
                candidate: percentiles(self.candidate_us),
                incumbent: (!self.incumbent_us.is_empty()).then(|| percentiles(self.incumbent_us)),
            },
            fidelity: (self.fidelity.checked > 0).then_some(self.fidelity),
            started_at_ms,
            elapsed_ms,
        }
    }
}

/// Whether the candidate decided exactly as stored.
fn same_decision(stored: &DecisionRecord, e: &Evaluation) -> bool {
    match &e.decision {
        Some(d) => {
            stored.outcome == Outcome::Ok
                && stored.verdict == Some(d.verdict)
                && stored.score as f32 == d.score
                && stored.labels == d.labels
                && stored.reason == d.reason
        }
        None => stored.outcome == e.outcome,
    }
}

fn percentiles(mut v: Vec<u64>) -> Latency {
    if v.is_empty() {
        return Latency::default();
    }
    v.sort_unstable();
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    Latency {
        p50: at(0.5),
        p99: at(0.99),
    }
}

/// One stored decision of an evaluation, as `gavel replay` shows it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ReplayedDecision {
    pub id: i64,
    pub plugin: String,
    pub plugin_version: String,
    pub plugin_digest: String,
    pub mode: Mode,
    pub applied: bool,
    pub outcome: Outcome,
    pub verdict: Option<Verdict>,
    pub score: f64,
    pub labels: Vec<String>,
    pub reason: String,
    pub duration_us: i64,
    pub reversed_at: Option<Millis>,
}

/// One stored evaluation of an item, and what the candidate decides on it now.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ReplayedEvaluation {
    pub at_ms: Millis,
    pub phase: crate::domain::DecisionPhase,
    pub item_version: i64,
    pub snapshot_digest: Option<String>,
    /// Why the candidate could not judge it again (`null` when it did, or
    /// when no candidate was given and the snapshot is stored).
    pub not_replayable: Option<String>,
    /// The snapshot as the rules saw it (without config), when stored.
    #[schema(value_type = Option<Object>)]
    pub snapshot: Option<serde_json::Value>,
    pub decisions: Vec<ReplayedDecision>,
    /// The candidate's evaluation of the stored snapshot.
    #[schema(value_type = Option<Object>)]
    pub candidate: Option<Evaluation>,
}

/// A page of an item's history of evaluations, oldest first.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ItemReplay {
    pub item_id: String,
    pub candidate: Option<VersionRef>,
    pub evaluations: Vec<ReplayedEvaluation>,
    /// When older evaluations are stored: pass it as `before` for the page
    /// before this one (`null` on the oldest page).
    pub older: Option<i64>,
}

/// At most this many evaluations of one item in one page.
pub const MAX_REPLAYED_EVALUATIONS: usize = 200;

/// Decisions read per round trip while gathering a page of evaluations.
const HISTORY_PAGE: i64 = 256;

/// Which evaluations of an item one replay shows: the newest `limit` made
/// before decision `before` (the newest of all when `None`).
#[derive(Debug, Clone, Copy)]
pub struct ReplayPage {
    pub before: Option<i64>,
    pub limit: usize,
}

/// The newest `limit` evaluations of `item_id` before decision `before`,
/// newest first, each its decisions by id; and whether older ones exist.
/// The item's decisions are read newest first, a page at a time, and each
/// run of one evaluation's decisions grouped as it comes (one pass): the
/// work is the page's, not the item's whole history.
async fn newest_evaluations(
    store: &dyn History,
    item_id: &str,
    page: ReplayPage,
) -> StoreResult<(Vec<Vec<DecisionRecord>>, bool)> {
    let mut groups: Vec<Vec<DecisionRecord>> = Vec::new();
    let mut cursor = page.before;
    let older = loop {
        let decisions = store.item_decisions(item_id, cursor, HISTORY_PAGE).await?;
        let exhausted = (decisions.len() as i64) < HISTORY_PAGE;
        cursor = decisions.last().map(|d| d.id).or(cursor);
        let mut full = false;
        for d in decisions {
            if let Some(group) = groups.last_mut().filter(|g| same_evaluation(&g[0], &d)) {
                group.push(d);
            } else if groups.len() == page.limit {
                // One more evaluation begins: the last one kept is whole.
                full = true;
                break;
            } else {
                groups.push(vec![d]);
            }
        }
        if full || exhausted {
            break full;
        }
    };
    for group in &mut groups {
        group.reverse();
    }
    Ok((groups, older))
}

/// A page of `item_id`'s stored evaluations (see [`ReplayPage`]), each with
/// what its plugins decided and, given a candidate, what it decides on the
/// stored snapshot now (with its own config, else the stored config of the
/// decision of the same name, else none). Reading is bounded by the page;
/// unpacking the snapshots and judging them run on a blocking thread, off
/// the async runtime.
pub async fn replay_item(
    store: &dyn History,
    engine: &Arc<RuleEngine>,
    item_id: &str,
    candidate: Option<&Candidate>,
    page: ReplayPage,
) -> Result<ItemReplay, BacktestError> {
    let page = ReplayPage {
        limit: page.limit.clamp(1, MAX_REPLAYED_EVALUATIONS),
        ..page
    };
    let (mut groups, has_older) = newest_evaluations(store, item_id, page).await?;
    groups.reverse();
    let older = has_older.then(|| groups.first().map(|g| g[0].id)).flatten();
    let name = candidate.map(|c| c.plugin.plugin.info.name.as_str());
    let mut digests: Vec<&str> = Vec::new();
    for ds in &groups {
        digests.extend(ds[0].snapshot_digest.as_deref());
        if candidate.is_some_and(|c| c.config.is_none()) {
            digests.extend(
                ds.iter()
                    .filter(|d| Some(d.plugin.as_str()) == name)
                    .filter_map(|d| d.config_digest.as_deref()),
            );
        }
    }
    let docs = store.input_docs(&digests).await?;
    let candidate_ref = candidate.map(|c| VersionRef::of(&c.plugin.plugin.stamp));
    let candidate = candidate.cloned();
    let engine = engine.clone();
    let evaluations = tokio::task::spawn_blocking(move || replay_groups(&groups, &docs, &engine, candidate.as_ref()))
        .await
        .map_err(|e| BacktestError::Failed(format!("the replay thread failed: {e}")))?;
    Ok(ItemReplay {
        item_id: item_id.to_string(),
        candidate: candidate_ref,
        evaluations,
        older,
    })
}

/// Each evaluation as shown, judged by `candidate` when given. Blocking:
/// parses the snapshots and runs the candidate.
fn replay_groups(
    groups: &[Vec<DecisionRecord>],
    docs: &HashMap<String, Vec<u8>>,
    engine: &Arc<RuleEngine>,
    candidate: Option<&Candidate>,
) -> Vec<ReplayedEvaluation> {
    let name = candidate.map(|c| c.plugin.plugin.info.name.as_str());
    groups
        .iter()
        .map(|ds| {
            let first = &ds[0];
            let snapshot_digest = first.snapshot_digest.clone();
            let json = snapshot_digest.as_deref().and_then(|d| docs.get(d));
            let mut evaluation = ReplayedEvaluation {
                at_ms: first.created_at,
                phase: first.phase,
                item_version: first.item_version,
                not_replayable: match (&snapshot_digest, json) {
                    (None, _) => Some("no stored snapshot".to_string()),
                    (Some(_), None) => Some("snapshot expired".to_string()),
                    _ => None,
                },
                snapshot_digest,
                snapshot: json.and_then(|j| serde_json::from_slice(j).ok()),
                decisions: ds.iter().map(replayed_decision).collect(),
                candidate: None,
            };
            if let (Some(c), Some(json), Some(phase)) = (candidate, json, phase_of(first)) {
                let stored_config = ds
                    .iter()
                    .find(|d| Some(d.plugin.as_str()) == name)
                    .and_then(|d| d.config_digest.as_deref())
                    .and_then(|d| docs.get(d))
                    .map(|v| v.as_slice());
                match config_for(c, &[], stored_config).and_then(|config| rebuild(json, config)) {
                    Ok((_, snapshot)) if c.plugin.phases.contains(&phase) => {
                        match c.plugin.evaluate(engine, &snapshot, phase) {
                            Ok(e) => evaluation.candidate = Some(e),
                            Err(e) => evaluation.not_replayable = Some(format!("host busy: {e}")),
                        }
                    }
                    Ok(_) => evaluation.not_replayable = Some("phase not declared by the candidate".into()),
                    Err(e) => evaluation.not_replayable = Some(format!("stored snapshot unreadable: {e}")),
                }
            }
            evaluation
        })
        .collect()
}

fn replayed_decision(d: &DecisionRecord) -> ReplayedDecision {
    ReplayedDecision {
        id: d.id,
        plugin: d.plugin.clone(),
        plugin_version: d.plugin_version.clone(),
        plugin_digest: d.plugin_digest.clone(),
        mode: d.mode,
        applied: d.applied,
        outcome: d.outcome,
        verdict: d.verdict,
        score: d.score,
        labels: d.labels.clone(),
        reason: d.reason.clone(),
        duration_us: d.duration_us,
        reversed_at: d.reversed_at,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn combining_follows_the_worker() {
        let v = |v| Some(v);
        assert_eq!(
            combine([v(Verdict::Allow), v(Verdict::Hold)].into_iter(), Phase::Async, None),
            ItemStatus::HeldForReview
        );
        assert_eq!(combine([None].into_iter(), Phase::Async, None), ItemStatus::Visible);
        // The sync verdict counts in the async phase only.
        assert_eq!(
            combine([v(Verdict::Allow)].into_iter(), Phase::Async, Some(Verdict::Reject)),
            ItemStatus::Rejected
        );
        assert_eq!(
            combine([v(Verdict::Allow)].into_iter(), Phase::Sync, Some(Verdict::Reject)),
            ItemStatus::Visible
        );
        assert_eq!(counted(Outcome::Ok, v(Verdict::Defer), Phase::Sync, false), None);
        assert_eq!(counted(Outcome::Trap, None, Phase::Async, true), v(Verdict::Hold));
        assert_eq!(counted(Outcome::Error, None, Phase::Async, true), None);
        assert_eq!(counted(Outcome::Trap, None, Phase::Async, false), None);
    }

    #[test]
    fn percentiles_of_nothing_are_zero() {
        assert_eq!(percentiles(Vec::new()), Latency::default());
        let p = percentiles((1..=100).collect());
        assert_eq!((p.p50, p.p99), (51, 99));
    }
}
