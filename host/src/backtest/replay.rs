//! Judging stored evaluations again: the tally of a backtest, chunk by
//! chunk, and the step-by-step replay of one item's history.

use super::lists::{CandidateList, ListPlan, ListRef, PinnedLists, RunLists};
use super::report::{
    Example, Fidelity, Flips, Latencies, Latency, Matrix, Moderators, Report, Sample, VersionRef, Window,
};
use super::{BacktestError, Cancel, Candidate, Candidates, Request, config_map, phase_of};
use crate::clock::Millis;
use crate::domain::{ItemStatus, Mode, Outcome, Phase, Verdict};
use crate::lists::ListsConfig;
use crate::rules::{CallInputs, Evaluation, RegisteredPlugin, RuleEngine, SignalValues, Snapshot, snapshot_from_spec};
use crate::store::{BacktestStore, DecisionRecord, History, ReplayUnit, StoreError, StoreResult};
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

/// The snapshot a stored evaluation judged, with `config` in place, and
/// the signal values stored with it.
fn rebuild(json: &[u8], config: BTreeMap<String, String>) -> Result<(SnapshotSpec, Stored), String> {
    let mut spec: SnapshotSpec = serde_json::from_slice(json).map_err(|e| e.to_string())?;
    spec.config = config;
    let stored = Stored {
        snapshot: snapshot_from_spec(&spec),
        signals: Arc::new(std::mem::take(&mut spec.signals)),
    };
    Ok((spec, stored))
}

/// A stored snapshot ready to judge again: the WIT snapshot and the
/// signal values the rules read with it.
struct Stored {
    snapshot: Snapshot,
    signals: Arc<SignalValues>,
}

impl Stored {
    /// A candidate's judgement of it, its list calls answered from `lists`.
    fn judge(
        &self,
        plugin: &RegisteredPlugin,
        engine: &RuleEngine,
        phase: Phase,
        lists: &Arc<dyn crate::lists::ListSource>,
    ) -> Result<Evaluation, crate::rules::HostError> {
        let signals = plugin.signal_values(&self.signals);
        let inputs = CallInputs {
            lists: Some(lists),
            signals: signals.as_ref(),
        };
        plugin.evaluate_from(engine, &self.snapshot, phase, inputs)
    }
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

/// One evaluation ready for the candidates.
struct Prepared {
    /// The unit's decision: the first of the replaced plugins' in this
    /// evaluation, or (a new plugin) the evaluation's first.
    decision: DecisionRecord,
    /// Every decision of its evaluation.
    evaluation: Vec<DecisionRecord>,
    /// The item's sync decisions in force (async phase).
    sync_decisions: Vec<DecisionRecord>,
    item_id: String,
    phase: Phase,
    /// The stored snapshot as the rules saw it (for the examples' excerpt).
    spec: SnapshotSpec,
    /// One per candidate judging it.
    replays: Vec<Replay>,
}

/// One candidate's judgement of a stored evaluation, to be made.
struct Replay {
    /// Index into the tally's candidates.
    candidate: usize,
    /// The stored decision it takes the place of (`None`: a new plugin).
    incumbent: Option<DecisionRecord>,
    /// The stored snapshot with the candidate's config.
    snapshot: Stored,
    /// sha256 of the config the candidate runs with.
    config_digest: String,
    /// The list versions the evaluation was judged with, and those the
    /// replay answers from (pinned before each judging pass).
    lists: ListPlan,
    pinned: Option<Arc<PinnedLists>>,
    /// In the async phase, when the replaced plugin decided the item's
    /// sync phase too: that sync snapshot for the candidate to judge, or
    /// `None` when it is gone (the stored sync verdict is then kept).
    sync: Option<Option<SyncReplay>>,
}

/// The sync snapshot a candidate judges again for an async evaluation.
struct SyncReplay {
    digest: String,
    snapshot: Stored,
    lists: ListPlan,
    pinned: Option<Arc<PinnedLists>>,
}

/// What the replaced plugin's part of an item's sync verdict becomes on the
/// new side of an async evaluation.
#[derive(Debug, Clone, Copy)]
enum SyncPart {
    /// It had none, or the candidate does not run in the sync phase.
    Dropped,
    /// Its sync snapshot is gone: the stored verdict stands.
    Kept,
    /// The candidate's verdict on the same sync snapshot.
    Judged(Option<Verdict>),
}

/// A replay judged: the candidate's evaluation and its sync part.
struct Judgement {
    evaluation: Result<Evaluation, crate::rules::HostError>,
    sync: SyncPart,
}

/// The candidates' sync verdicts, by candidate and sync snapshot: judged
/// once for all of an item's async evaluations.
type SyncVerdicts = HashMap<(usize, String), SyncPart>;

/// A judging pass over prepared evaluations: those judged, and those whose
/// rule asked for a list not pinned (with the names), to be judged again.
type Pass = (
    Vec<(Prepared, Vec<Judgement>)>,
    Vec<(Prepared, Vec<String>)>,
    SyncVerdicts,
);

/// Judges each prepared evaluation with its candidates, on their pinned
/// lists, until `stopped`. Blocking: runs the sandbox.
fn judge(
    pending: Vec<Prepared>,
    plugins: &[Arc<RegisteredPlugin>],
    engine: &RuleEngine,
    mut sync_verdicts: SyncVerdicts,
    stopped: impl Fn() -> bool,
) -> Pass {
    let (mut judged, mut missed) = (Vec::new(), Vec::new());
    for p in pending {
        if stopped() {
            break;
        }
        let mut unpinned: Vec<String> = Vec::new();
        let mut judgements = Vec::with_capacity(p.replays.len());
        for r in &p.replays {
            let plugin = &plugins[r.candidate];
            let pinned = r.pinned.as_ref().expect("lists are pinned before judging");
            let evaluation = r.snapshot.judge(plugin, engine, p.phase, &pinned.source());
            unpinned.extend(pinned.unpinned());
            let sync = match &r.sync {
                None => SyncPart::Dropped,
                Some(None) => SyncPart::Kept,
                Some(Some(s)) => {
                    let key = (r.candidate, s.digest.clone());
                    match sync_verdicts.get(&key) {
                        Some(part) => *part,
                        None => {
                            let pinned = s.pinned.as_ref().expect("lists are pinned before judging");
                            let part = match s.snapshot.judge(plugin, engine, Phase::Sync, &pinned.source()) {
                                Ok(e) => SyncPart::Judged(
                                    e.decision
                                        .as_ref()
                                        .map(|d| d.verdict)
                                        .filter(|_| e.outcome == Outcome::Ok),
                                ),
                                Err(_) => SyncPart::Kept,
                            };
                            let asked = pinned.unpinned();
                            if asked.is_empty() {
                                sync_verdicts.insert(key, part);
                            }
                            unpinned.extend(asked);
                            part
                        }
                    }
                }
            };
            judgements.push(Judgement { evaluation, sync });
        }
        if unpinned.is_empty() {
            judged.push((p, judgements));
        } else {
            missed.push((p, unpinned));
        }
    }
    (judged, missed, sync_verdicts)
}

/// The running totals of a backtest.
pub(super) struct Tally {
    candidates: Vec<Candidate>,
    /// The plugin each candidate replaces, in order.
    replaced: Vec<String>,
    lists: RunLists,
    list_refs: Vec<ListRef>,
    overrides: Vec<(String, String)>,
    since_ms: Millis,
    until_ms: Millis,
    fail_closed: bool,
    /// Units are the replaced plugins' own decisions (not a new plugin).
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
    /// Values of signals the candidates declare that stored snapshots do
    /// not carry, and how many were recomputed, by signal.
    recompute: Option<super::signals::Recompute>,
    recomputed: BTreeMap<String, u64>,
    cancel: Cancel,
}

impl Tally {
    pub(super) fn new(
        candidates: &Candidates,
        replaced: &[String],
        lists: RunLists,
        req: &Request,
        replacing: bool,
        cancel: Cancel,
    ) -> Tally {
        Tally {
            candidates: candidates.plugins.clone(),
            replaced: replaced.to_vec(),
            lists,
            list_refs: candidates.lists.values().map(CandidateList::describe).collect(),
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
            recompute: super::signals::Recompute::for_specs(
                &candidates
                    .plugins
                    .iter()
                    .flat_map(|c| &c.plugin.signals)
                    .collect::<Vec<_>>(),
            ),
            recomputed: BTreeMap::new(),
            cancel,
        }
    }

    fn skip(&mut self, reason: &str) {
        *self.not_replayable.entry(reason.to_string()).or_default() += 1;
    }

    /// The candidates judging an evaluation in `phase` and the stored
    /// decisions they replace: each candidate whose replaced plugin decided
    /// it (held fixed when the candidate does not run in the phase), or the
    /// one new plugin.
    fn judges<'e>(&self, evaluation: &'e [DecisionRecord], phase: Phase) -> Vec<(usize, Option<&'e DecisionRecord>)> {
        let judges: Vec<(usize, Option<&DecisionRecord>)> = if self.replacing {
            self.replaced
                .iter()
                .enumerate()
                .filter_map(|(i, name)| evaluation.iter().find(|d| &d.plugin == name).map(|d| (i, Some(d))))
                .collect()
        } else {
            vec![(0, None)]
        };
        judges
            .into_iter()
            .filter(|(i, _)| self.candidates[*i].plugin.phases.contains(&phase))
            .collect()
    }

    /// Replays one chunk of units: reads each one's evaluation (bounded
    /// reads, whatever its item's history), snapshots and configs, judges
    /// them with the candidates on the list versions of the time (or the
    /// candidate lists), and counts.
    pub(super) async fn replay_chunk(
        &mut self,
        store: &dyn BacktestStore,
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

        // The documents to read: each unit's snapshot, the stored configs
        // of candidates that have none of their own, and the sync
        // snapshots the replaced plugins judged.
        let mut wanted: Vec<(&ReplayUnit, Context, Phase)> = Vec::new();
        let mut snapshots: HashSet<i64> = HashSet::new();
        let mut configs: HashSet<String> = HashSet::new();
        for (unit, context) in units.iter().zip(contexts) {
            let Some(context) = context else {
                self.skip("decision deleted");
                continue;
            };
            let d = &context.decision;
            let Some(phase) = phase_of(d) else { continue };
            let judges = self.judges(&context.evaluation, phase);
            if judges.is_empty() {
                self.skip("phase not declared by the candidate");
                continue;
            }
            if d.snapshot_digest.is_none() {
                self.skip("no stored snapshot");
                continue;
            }
            // A snapshot stored before snapshots were numbered and expired
            // since has no id: `prepare` finds it expired.
            snapshots.extend(d.snapshot_id);
            for (i, incumbent) in judges {
                if self.candidates[i].config.is_none()
                    && let Some(config) = incumbent.and_then(|d| d.config_digest.clone())
                {
                    configs.insert(config);
                }
                if let Some(sync) = self.sync_decision(i, incumbent, &context, phase) {
                    snapshots.extend(sync.snapshot_id);
                }
            }
            wanted.push((unit, context, phase));
        }
        let snapshots: Vec<i64> = snapshots.into_iter().collect();
        let configs: Vec<&str> = configs.iter().map(String::as_str).collect();
        let docs = store.input_docs(&snapshots, &configs).await?;

        let mut prepared = Vec::with_capacity(wanted.len());
        for (unit, context, phase) in wanted {
            match self.prepare(unit, context, phase, &docs) {
                Ok(p) => prepared.push(p),
                Err(reason) => self.skip(reason),
            }
        }
        self.recompute_signals(store, &mut prepared).await?;
        // Only the items replayed here: a unit skipped above keeps no state.
        let mut items: Vec<&str> = prepared.iter().map(|p| p.item_id.as_str()).collect();
        items.sort_unstable();
        items.dedup();
        self.learn_moderators(store, &items).await?;

        let plugins: Arc<Vec<Arc<RegisteredPlugin>>> =
            Arc::new(self.candidates.iter().map(|c| c.plugin.clone()).collect());
        let mut sync_verdicts = SyncVerdicts::new();
        let mut pending = prepared;
        let mut judged = Vec::new();
        // A pass judges what is pending; an evaluation whose rule asked for
        // a list not pinned goes round again with that list pinned (every
        // round pins at least one more name, so this ends).
        while !pending.is_empty() {
            for p in &mut pending {
                for r in &mut p.replays {
                    r.pinned = Some(self.lists.pin(store, &r.lists).await?);
                    if let Some(Some(s)) = &mut r.sync {
                        s.pinned = Some(self.lists.pin(store, &s.lists).await?);
                    }
                }
            }
            let (plugins, engine, cancel) = (plugins.clone(), engine.clone(), self.cancel.clone());
            let (done, missed, verdicts) = tokio::task::spawn_blocking(move || {
                judge(pending, &plugins, &engine, sync_verdicts, move || cancel.is_set())
            })
            .await
            .map_err(|e| BacktestError::Failed(format!("the candidate's evaluation thread failed: {e}")))?;
            if self.cancel.is_set() {
                return Err(BacktestError::Cancelled);
            }
            sync_verdicts = verdicts;
            judged.extend(done);
            pending = Vec::with_capacity(missed.len());
            for (p, asked) in missed {
                self.lists.learn(asked);
                pending.push(p);
            }
        }

        for (p, judgements) in judged {
            if judgements.iter().all(|j| j.evaluation.is_ok()) {
                self.count(&p, &judgements);
            } else {
                self.skip("host busy");
            }
        }
        Ok(())
    }

    /// For candidate `i` replacing `incumbent` in an async evaluation: the
    /// replaced plugin's sync decision in force, which the candidate
    /// judges again when it runs in the sync phase (`None`: nothing to
    /// judge, the replaced plugin's part of the sync floor is dropped).
    fn sync_decision<'c>(
        &self,
        i: usize,
        incumbent: Option<&DecisionRecord>,
        context: &'c Context,
        phase: Phase,
    ) -> Option<&'c DecisionRecord> {
        let incumbent = incumbent?;
        if phase != Phase::Async || !self.candidates[i].plugin.phases.contains(&Phase::Sync) {
            return None;
        }
        context.sync.iter().find(|s| s.plugin == incumbent.plugin)
    }

    /// One evaluation ready to judge: each candidate's snapshot (its
    /// config in place), list plan and sync snapshot; or why it cannot be.
    fn prepare(
        &self,
        unit: &ReplayUnit,
        context: Context,
        phase: Phase,
        docs: &HashMap<String, Vec<u8>>,
    ) -> Result<Prepared, &'static str> {
        let d = &context.decision;
        let json = docs
            .get(d.snapshot_digest.as_deref().unwrap_or_default())
            .ok_or("snapshot expired")?;
        let mut replays = Vec::new();
        let mut spec = None;
        for (i, incumbent) in self.judges(&context.evaluation, phase) {
            let candidate = &self.candidates[i];
            let stored_config = match (&candidate.config, incumbent.and_then(|d| d.config_digest.as_deref())) {
                (None, Some(c)) => Some(docs.get(c).ok_or("config expired")?.as_slice()),
                _ => None,
            };
            let config =
                config_for(candidate, &self.overrides, stored_config).map_err(|_| "stored config unreadable")?;
            let pairs: Vec<(String, String)> = config.clone().into_iter().collect();
            // Its sync snapshot gone (or never stored): the stored verdict stands.
            let sync = self.sync_decision(i, incumbent, &context, phase).map(|sync| {
                let digest = sync.snapshot_digest.clone()?;
                let (_, snapshot) = rebuild(docs.get(&digest)?, config.clone()).ok()?;
                Some(SyncReplay {
                    digest,
                    snapshot,
                    lists: ListPlan::of(Some(sync), sync.created_at),
                    pinned: None,
                })
            });
            let (s, snapshot) = rebuild(json, config).map_err(|_| "stored snapshot unreadable")?;
            spec.get_or_insert(s);
            replays.push(Replay {
                candidate: i,
                incumbent: incumbent.cloned(),
                snapshot,
                config_digest: crate::judge::config_doc(&pairs).digest.clone(),
                lists: ListPlan::of(incumbent, d.created_at),
                pinned: None,
                sync,
            });
        }
        Ok(Prepared {
            decision: context.decision,
            evaluation: context.evaluation,
            sync_decisions: context.sync,
            item_id: unit.item_id.clone(),
            phase,
            spec: spec.ok_or("phase not declared by the candidate")?,
            replays,
        })
    }

    /// Gives each replay the values of the signals its candidate declares
    /// that its stored snapshot does not carry, recomputed from the stored
    /// items at the snapshot's time (see `backtest/signals.rs`).
    async fn recompute_signals(&mut self, store: &dyn BacktestStore, prepared: &mut [Prepared]) -> StoreResult<()> {
        let Some(recompute) = self.recompute.as_mut() else {
            return Ok(());
        };
        let missing = |plugin: &RegisteredPlugin, stored: &Stored| -> Vec<String> {
            plugin
                .signals
                .iter()
                .filter(|s| !stored.signals.contains_key(&s.name))
                .map(|s| s.name.clone())
                .collect()
        };
        let candidates = &self.candidates;
        let wanting: Vec<&str> = prepared
            .iter()
            .filter(|p| {
                p.replays
                    .iter()
                    .any(|r| !missing(&candidates[r.candidate].plugin, &r.snapshot).is_empty())
            })
            .map(|p| p.item_id.as_str())
            .collect();
        if wanting.is_empty() {
            return Ok(());
        }
        let clients: HashMap<String, String> = store
            .items(&wanting)
            .await?
            .into_iter()
            .map(|i| (i.id, i.client))
            .collect();
        for p in prepared.iter_mut() {
            let Some(client) = clients.get(&p.item_id) else {
                continue;
            };
            for r in &mut p.replays {
                let plugin = &candidates[r.candidate].plugin;
                let mut stored: Vec<&mut Stored> = vec![&mut r.snapshot];
                if let Some(Some(sync)) = &mut r.sync {
                    stored.push(&mut sync.snapshot);
                }
                for s in stored {
                    for name in missing(plugin, s) {
                        let item = &s.snapshot.item;
                        let context: serde_json::Map<String, serde_json::Value> = item
                            .context
                            .iter()
                            .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
                            .collect();
                        let view = crate::domain::signals::SignalItem::new(&item.author, &item.text, &context);
                        let now = s.snapshot.now_ms as Millis;
                        let values = recompute.values(store, &name, client, &view, now).await?;
                        Arc::make_mut(&mut s.signals).insert(name.clone(), values);
                        *self.recomputed.entry(name).or_default() += 1;
                    }
                }
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

    /// Whether a replay's fidelity can be checked: the candidate is the
    /// code and config of the stored decision, and neither consulted a
    /// candidate list (which is meant to answer otherwise).
    fn reproduces(&self, r: &Replay, d: &DecisionRecord, e: &Evaluation) -> bool {
        d.plugin_digest == e.plugin.digest.to_hex()
            && d.config_digest.as_deref() == Some(&r.config_digest)
            && !d.lists.iter().chain(&e.lists).any(|l| self.lists.is_candidate(&l.name))
    }

    /// Counts one replayed evaluation: its stored decisions recombined
    /// before, and with each replay's verdict in place of the decision it
    /// replaces after. In the async phase the item's sync-phase decisions
    /// in force combine too, each replaced plugin's part on the new side
    /// as its replay's [`SyncPart`] says.
    fn count(&mut self, p: &Prepared, judgements: &[Judgement]) {
        let fail_closed = self.fail_closed;
        let judged: Vec<(&Replay, &Evaluation, SyncPart)> = p
            .replays
            .iter()
            .zip(judgements)
            .filter_map(|(r, j)| Some((r, j.evaluation.as_ref().ok()?, j.sync)))
            .collect();
        let replaced: Vec<&str> = judged
            .iter()
            .filter_map(|(r, ..)| r.incumbent.as_ref().map(|d| d.plugin.as_str()))
            .collect();
        let sync_verdict = |leave_out: &[&str]| {
            Verdict::most_severe(
                p.sync_decisions
                    .iter()
                    .filter(|d| d.mode == Mode::Enforce && !leave_out.contains(&d.plugin.as_str()))
                    .filter_map(|d| counted(d.outcome, d.verdict, Phase::Sync, fail_closed)),
            )
        };
        let stored = |d: &&DecisionRecord| phase_of(d) == Some(p.phase) && d.mode == Mode::Enforce;
        let old = combine(
            p.evaluation
                .iter()
                .filter(stored)
                .map(|d| counted(d.outcome, d.verdict, p.phase, fail_closed)),
            p.phase,
            sync_verdict(&[]),
        );
        // The replaced plugins' parts of the sync floor: dropped or judged
        // again by their candidates, else kept as stored. `defer` does not
        // count in the sync phase.
        let sync_replaced: Vec<&str> = judged
            .iter()
            .filter(|(.., part)| !matches!(part, SyncPart::Kept))
            .filter_map(|(r, ..)| r.incumbent.as_ref().map(|d| d.plugin.as_str()))
            .collect();
        let sync_judged = judged.iter().filter_map(|(.., part)| match part {
            SyncPart::Judged(v) => v.filter(|v| *v != Verdict::Defer),
            _ => None,
        });
        let new =
            combine(
                p.evaluation
                    .iter()
                    .filter(stored)
                    .filter(|d| !replaced.contains(&d.plugin.as_str()))
                    .map(|d| counted(d.outcome, d.verdict, p.phase, fail_closed))
                    .chain(judged.iter().map(|(_, e, _)| {
                        counted(e.outcome, e.decision.as_ref().map(|d| d.verdict), p.phase, fail_closed)
                    })),
                p.phase,
                Verdict::most_severe(sync_verdict(&sync_replaced).into_iter().chain(sync_judged)),
            );
        self.replayed += 1;
        for (r, e, _) in &judged {
            let old_word = r
                .incumbent
                .as_ref()
                .map_or_else(|| "none".to_string(), |d| word(d.outcome, d.verdict));
            bump(
                &mut self.verdicts,
                &old_word,
                &word(e.outcome, e.decision.as_ref().map(|d| d.verdict)),
            );
            *self.outcomes.entry(e.outcome.as_str().to_string()).or_default() += 1;
            self.candidate_us.push(e.duration.as_micros() as u64);
            if let Some(d) = &r.incumbent {
                self.incumbent_us.push(d.duration_us.max(0) as u64);
                self.incumbents
                    .insert((d.plugin.clone(), d.plugin_version.clone(), d.plugin_digest.clone()));
                if self.reproduces(r, d, e) {
                    self.fidelity.checked += 1;
                    if same_decision(d, e) {
                        self.fidelity.identical += 1;
                    }
                }
            }
        }
        bump(&mut self.statuses, old.as_str(), new.as_str());
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
                // One replay (a plugin backtest) reads as before; several
                // name their plugins.
                let each = |part: &dyn Fn(&Replay, &Evaluation) -> String| -> String {
                    match &judged[..] {
                        [(r, e, _)] => part(r, e),
                        many => many
                            .iter()
                            .map(|(r, e, _)| format!("{}: {}", e.plugin.name, part(r, e)))
                            .collect::<Vec<_>>()
                            .join("; "),
                    }
                };
                examples.push(Example {
                    item_id: p.item_id.clone(),
                    at_ms: p.decision.created_at,
                    old_decision: each(&|r, _| {
                        r.incumbent
                            .as_ref()
                            .map_or_else(|| "none".to_string(), |d| word(d.outcome, d.verdict))
                    }),
                    old_reason: each(&|r, _| r.incumbent.as_ref().map(|d| d.reason.clone()).unwrap_or_default()),
                    new_decision: each(&|_, e| word(e.outcome, e.decision.as_ref().map(|d| d.verdict))),
                    new_reason: each(&|_, e| {
                        e.decision
                            .as_ref()
                            .map(|d| d.reason.clone())
                            .or_else(|| e.error.clone())
                            .unwrap_or_default()
                    }),
                    old_status: old.as_str().to_string(),
                    new_status: new.as_str().to_string(),
                    excerpt: excerpt(&p.spec.item.text),
                });
            }
        }
        if let Some(m) = self.moderators.get(&p.item_id)
            && p.decision.created_at < m.first_at
        {
            let incumbent_actioned = |d: &DecisionRecord| d.outcome == Outcome::Ok && actions(d.verdict);
            let seen = Reviewed {
                at: p.decision.created_at,
                old_actioned: actioned(old),
                new_actioned: actioned(new),
                incumbent_actioned: judged
                    .iter()
                    .any(|(r, ..)| r.incumbent.as_ref().is_some_and(incumbent_actioned)),
                incumbent_reversed: judged.iter().any(|(r, ..)| {
                    r.incumbent
                        .as_ref()
                        .is_some_and(|d| incumbent_actioned(d) && d.reversed_at.is_some())
                }),
                candidate_actioned: judged
                    .iter()
                    .any(|(_, e, _)| actions(e.decision.as_ref().map(|d| d.verdict))),
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
            m.reversals_avoided += u64::from(r.incumbent_reversed && !r.candidate_actioned);
            m.overturns_reintroduced += u64::from(!moderator && !r.incumbent_actioned && r.candidate_actioned);
        }
        let rate = |n: u64| (m.decided > 0).then(|| n as f64 / m.decided as f64);
        m.old_agreement = rate(m.old_agree);
        m.new_agreement = rate(m.new_agree);
        m
    }

    pub(super) fn report(self, sample: Sample, started_at_ms: Millis, elapsed_ms: u64) -> Report {
        let moderators = self.moderators();
        let candidates: Vec<VersionRef> = self
            .candidates
            .iter()
            .map(|c| VersionRef::of(&c.plugin.plugin.stamp))
            .collect();
        // One candidate's config (its own, or `null`: the stored one);
        // several run each with its own deployed config.
        let config = match &self.candidates[..] {
            [one] => one.config.as_deref().map(config_map),
            _ => None,
        };
        Report {
            candidate: candidates[0].clone(),
            candidates,
            lists: self.list_refs,
            incumbent: self
                .incumbents
                .iter()
                .map(|(name, version, digest)| VersionRef {
                    name: name.clone(),
                    version: version.clone(),
                    digest: digest.clone(),
                })
                .collect(),
            replaces: self.replaced.join(", "),
            config,
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
            recomputed_signals: self.recomputed,
            started_at_ms,
            elapsed_ms,
        }
    }
}

/// Whether the candidate decided exactly as stored, on the same list
/// versions.
fn same_decision(stored: &DecisionRecord, e: &Evaluation) -> bool {
    let same = match &e.decision {
        Some(d) => {
            stored.outcome == Outcome::Ok
                && stored.verdict == Some(d.verdict)
                && stored.score as f32 == d.score
                && stored.labels == d.labels
                && stored.reason == d.reason
        }
        None => stored.outcome == e.outcome,
    };
    same && stored.lists == e.lists
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
/// decision of the same name, else none), its list calls answered from the
/// versions of the time (those the decision of the same name recorded,
/// else the versions in force then; compiled under `limits`). Reading is
/// bounded by the page; unpacking the snapshots and judging them run on a
/// blocking thread, off the async runtime.
pub async fn replay_item(
    store: &dyn BacktestStore,
    engine: &Arc<RuleEngine>,
    item_id: &str,
    candidate: Option<&Candidate>,
    page: ReplayPage,
    limits: &ListsConfig,
) -> Result<ItemReplay, BacktestError> {
    let page = ReplayPage {
        limit: page.limit.clamp(1, MAX_REPLAYED_EVALUATIONS),
        ..page
    };
    let (mut groups, has_older) = newest_evaluations(store, item_id, page).await?;
    groups.reverse();
    let older = has_older.then(|| groups.first().map(|g| g[0].id)).flatten();
    let name = candidate.map(|c| c.plugin.plugin.info.name.as_str());
    let (mut snapshots, mut configs): (Vec<i64>, Vec<&str>) = (Vec::new(), Vec::new());
    for ds in &groups {
        snapshots.extend(ds[0].snapshot_id);
        if candidate.is_some_and(|c| c.config.is_none()) {
            configs.extend(
                ds.iter()
                    .filter(|d| Some(d.plugin.as_str()) == name)
                    .filter_map(|d| d.config_digest.as_deref()),
            );
        }
    }
    let docs = store.input_docs(&snapshots, &configs).await?;
    let candidate_ref = candidate.map(|c| VersionRef::of(&c.plugin.plugin.stamp));
    let shown = {
        let candidate = candidate.cloned();
        tokio::task::spawn_blocking(move || replay_groups(&groups, &docs, candidate.as_ref()))
    };
    let (mut evaluations, mut pending) = shown
        .await
        .map_err(|e| BacktestError::Failed(format!("the replay thread failed: {e}")))?;
    // As in a backtest: a rule that asked for a list not pinned is judged
    // again with that list pinned.
    let mut lists = RunLists::new(limits.clone(), &BTreeMap::new());
    while let Some(c) = candidate.filter(|_| !pending.is_empty()) {
        for j in &mut pending {
            j.pinned = Some(lists.pin(store, &j.lists).await?);
        }
        let (plugin, engine) = (c.plugin.clone(), engine.clone());
        let judging = tokio::task::spawn_blocking(move || {
            let mut judged = Vec::new();
            let mut missed = Vec::new();
            for j in pending {
                let pinned = j.pinned.as_ref().expect("lists are pinned before judging");
                let e = j.snapshot.judge(&plugin, &engine, j.phase, &pinned.source());
                match pinned.unpinned() {
                    asked if asked.is_empty() => judged.push((j.index, e)),
                    asked => missed.push((j, asked)),
                }
            }
            (judged, missed)
        });
        let (judged, missed) = judging
            .await
            .map_err(|e| BacktestError::Failed(format!("the replay thread failed: {e}")))?;
        for (index, e) in judged {
            match e {
                Ok(e) => evaluations[index].candidate = Some(e),
                Err(e) => evaluations[index].not_replayable = Some(format!("host busy: {e}")),
            }
        }
        pending = missed
            .into_iter()
            .map(|(j, asked)| {
                lists.learn(asked);
                j
            })
            .collect();
    }
    Ok(ItemReplay {
        item_id: item_id.to_string(),
        candidate: candidate_ref,
        evaluations,
        older,
    })
}

/// A stored evaluation of an item for the candidate to judge.
struct ToJudge {
    /// Its place in the page.
    index: usize,
    snapshot: Stored,
    phase: Phase,
    lists: ListPlan,
    pinned: Option<Arc<PinnedLists>>,
}

/// Each evaluation as shown, and those the candidate (when given) is to
/// judge. Blocking: parses the snapshots.
fn replay_groups(
    groups: &[Vec<DecisionRecord>],
    docs: &HashMap<String, Vec<u8>>,
    candidate: Option<&Candidate>,
) -> (Vec<ReplayedEvaluation>, Vec<ToJudge>) {
    let name = candidate.map(|c| c.plugin.plugin.info.name.as_str());
    let mut to_judge = Vec::new();
    let shown = groups
        .iter()
        .enumerate()
        .map(|(index, ds)| {
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
                let own = ds.iter().find(|d| Some(d.plugin.as_str()) == name);
                let stored_config = own
                    .and_then(|d| d.config_digest.as_deref())
                    .and_then(|d| docs.get(d))
                    .map(|v| v.as_slice());
                match config_for(c, &[], stored_config).and_then(|config| rebuild(json, config)) {
                    Ok((_, snapshot)) if c.plugin.phases.contains(&phase) => to_judge.push(ToJudge {
                        index,
                        snapshot,
                        phase,
                        lists: ListPlan::of(own, first.created_at),
                        pinned: None,
                    }),
                    Ok(_) => evaluation.not_replayable = Some("phase not declared by the candidate".into()),
                    Err(e) => evaluation.not_replayable = Some(format!("stored snapshot unreadable: {e}")),
                }
            }
            evaluation
        })
        .collect();
    (shown, to_judge)
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
