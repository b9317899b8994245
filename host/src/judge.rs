//! Judging an item: build the snapshot, run every plugin of a phase (each
//! admitted by its circuit breaker), combine the verdicts. Shared by the
//! submission path (sync phase) and the worker (async phase). Blocking:
//! runs on an evaluation thread.

use crate::clock::now_ms;
use crate::domain::standing::StandingPolicy;
use crate::domain::{Mode, Outcome, Phase, Verdict};
use crate::metrics::Metrics;
use crate::rules::{
    Admission, AuthorStats, Evaluation, Event, HostError, Item, RegisteredPlugin, Registry, SignalValues, Snapshot,
    Standing, fit_snapshot,
};
use crate::store::{DecisionInputs, InputDoc, InputKind, NewDecision, SnapshotData};
use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

/// The WIT snapshot of stored data, cut to the snapshot size limit.
pub fn snapshot_of(data: &SnapshotData, phase: Phase, now_ms: i64, max_bytes: usize) -> Snapshot {
    let item = &data.item;
    let mut snapshot = Snapshot {
        item: Item {
            id: item.id.clone(),
            kind: item.kind.clone(),
            author: item.author.clone(),
            text: item.body.clone(),
            text_truncated: false,
            context: context_pairs(&item.context),
            created_at_ms: item.created_at as u64,
            version: item.version as u64,
        },
        counters: data.counters.iter().map(|(n, v)| (n.clone(), *v as u64)).collect(),
        author: AuthorStats {
            recent_items: clamp_u32(data.author_recent_items),
            rejected_items: clamp_u32(data.author_rejected_items),
            held_items: clamp_u32(data.author_held_items),
            standing: Standing {
                state: data.standing.state.clone(),
                strikes: data.standing.strikes as f32,
                items: clamp_u32(data.standing.items),
                rejected_items: clamp_u32(data.standing.rejected_items),
                first_seen_ms: data.standing.first_seen.max(0) as u64,
            },
        },
        duplicate_count: clamp_u32(data.duplicate_count),
        trigger: data
            .trigger
            .iter()
            .map(|(kind, actor, at)| Event {
                kind: kind.clone(),
                actor: actor.clone(),
                at_ms: *at as u64,
            })
            .collect(),
        config: Vec::new(),
        phase: phase.into(),
        now_ms: now_ms as u64,
    };
    fit_snapshot(&mut snapshot, max_bytes);
    snapshot
}

fn clamp_u32(v: i64) -> u32 {
    v.clamp(0, u32::MAX as i64) as u32
}

/// A stored `context` object as string pairs (non-string values as JSON text).
pub fn context_pairs(json: &str) -> Vec<(String, String)> {
    match serde_json::from_str::<serde_json::Value>(json) {
        Ok(serde_json::Value::Object(map)) => map
            .into_iter()
            .map(|(k, v)| match v {
                serde_json::Value::String(s) => (k, s),
                other => (k, other.to_string()),
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// The result of running one phase's plugins on a snapshot.
#[derive(Debug)]
pub struct Judgement {
    pub evaluations: Vec<(Arc<RegisteredPlugin>, Evaluation)>,
    /// When the decisions were made: the judgement's start, but never before
    /// the plugin version was loaded, so every decision falls inside its
    /// version's `plugin_versions` interval.
    pub started_at: i64,
    /// The most severe verdict among enforcing plugins (failures count as
    /// `hold` when fail-closed), `None` if no enforcing plugin decided.
    /// `defer` never comes out of the `sync` phase.
    pub verdict: Option<Verdict>,
    /// With a `defer` verdict: the provider the first deferring enforcing
    /// plugin named.
    pub provider: Option<String>,
    /// What each evaluation judged, to store with its decision (one per
    /// evaluation, in order), when the caller keeps inputs.
    pub inputs: Vec<DecisionInputs>,
}

impl Judgement {
    /// The decision rows to store; `applied` when the plugin enforces, it
    /// decided, and the result is applied at all (not after a manual
    /// decision); each `weighs` as `standing` says.
    pub fn decisions(&self, phase: Phase, applied: bool, standing: &StandingPolicy) -> Vec<NewDecision> {
        self.evaluations
            .iter()
            .enumerate()
            .map(|(i, (p, e))| {
                let d = e.decision.as_ref();
                let applied = applied && p.mode == Mode::Enforce && e.outcome == Outcome::Ok;
                let verdict = d.map(|d| d.verdict);
                let labels = d.map_or_else(Vec::new, |d| d.labels.clone());
                NewDecision {
                    plugin: e.plugin.name.clone(),
                    plugin_version: e.plugin.version.clone(),
                    plugin_digest: e.plugin.digest.to_hex(),
                    phase: phase.into(),
                    weighs: standing.enabled && standing.weighs(p.mode, applied, e.outcome, verdict, &labels),
                    verdict,
                    score: d.map_or(0.0, |d| d.score as f64),
                    labels,
                    reason: d.map_or_else(String::new, |d| d.reason.clone()),
                    mode: p.mode,
                    applied,
                    duration_us: e.duration.as_micros() as i64,
                    outcome: e.outcome,
                    error: e.error.clone(),
                    decided_at: self.started_at.max(p.loaded_at_ms),
                    inputs: self.inputs.get(i).cloned(),
                    lists: e.lists.clone(),
                }
            })
            .collect()
    }

    /// A one-line reason for the audit row: which plugins drove the verdict.
    pub fn reason(&self) -> String {
        let Some(verdict) = self.verdict else {
            return "no enforcing plugin decided".into();
        };
        let by: Vec<String> = self
            .evaluations
            .iter()
            .filter(|(p, e)| p.mode == Mode::Enforce && e.decision.as_ref().is_some_and(|d| d.verdict == verdict))
            .map(|(_, e)| {
                let reason = e.decision.as_ref().map_or("", |d| d.reason.as_str());
                if reason.is_empty() {
                    e.plugin.name.clone()
                } else {
                    format!("{}: {reason}", e.plugin.name)
                }
            })
            .collect();
        if by.is_empty() {
            format!("{verdict} (a failing plugin, fail-closed)")
        } else {
            format!("{verdict} by {}", by.join("; "))
        }
    }
}

/// Records one evaluation: its metrics, its failure logged, and its
/// outcome fed to the plugin's circuit breaker (a change of the breaker goes
/// to the plugin history).
fn observe(registry: &Registry, p: &RegisteredPlugin, e: &Evaluation, admission: Admission, metrics: &Metrics) {
    let labels = Metrics::plugin(&e.plugin.name, &e.plugin.version);
    metrics
        .rule_evaluation_seconds
        .get_or_create(&labels)
        .observe(e.duration.as_secs_f64());
    metrics
        .rule_evaluations
        .get_or_create(&crate::metrics::PluginOutcomeLabels {
            plugin: labels.plugin,
            version: labels.version,
            outcome: e.outcome.as_str(),
        })
        .inc();
    if e.outcome != Outcome::Ok {
        tracing::warn!(
            plugin = %e.plugin.name, version = %e.plugin.version, outcome = %e.outcome,
            error = e.error.as_deref().unwrap_or(""), "rule evaluation failed"
        );
    }
    if let Some(change) = p
        .breaker
        .record(now_ms(), e.outcome.is_failure(), admission == Admission::Probe)
    {
        registry.breaker_changed(p, &change);
        match &change {
            crate::rules::BreakerChange::Opened { detail } => {
                metrics.plugin_quarantines.inc();
                tracing::error!(
                    plugin = %e.plugin.name, version = %e.plugin.version, digest = %e.plugin.digest,
                    %detail, "plugin quarantined: its circuit breaker opened"
                );
            }
            crate::rules::BreakerChange::Recovered => tracing::info!(
                plugin = %e.plugin.name, version = %e.plugin.version, digest = %e.plugin.digest,
                "plugin recovered: a probe evaluation succeeded"
            ),
        }
    }
}

/// The stored form of a snapshot: its canonical JSON without the config
/// (which each decision names separately), with the item's signal values,
/// compressed and named.
pub fn snapshot_doc(snapshot: &Snapshot, signals: &SignalValues) -> InputDoc {
    let mut spec = crate::rules::spec_from_snapshot(snapshot);
    spec.config.clear();
    spec.signals.clone_from(signals);
    InputDoc::new(
        InputKind::Snapshot,
        &serde_json::to_vec(&spec).expect("a snapshot serializes"),
    )
}

/// The stored form of a plugin config. A config changes only with its
/// sidecar, so the few in use are kept encoded.
pub fn config_doc(config: &[(String, String)]) -> Arc<InputDoc> {
    type Docs = HashMap<Vec<(String, String)>, Arc<InputDoc>>;
    static DOCS: LazyLock<Mutex<Docs>> = LazyLock::new(Default::default);
    let mut docs = DOCS.lock().expect("not poisoned");
    if let Some(doc) = docs.get(config) {
        return doc.clone();
    }
    if docs.len() >= 1024 {
        docs.clear();
    }
    let map: std::collections::BTreeMap<&str, &str> = config.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let doc = Arc::new(InputDoc::new(
        InputKind::Config,
        &serde_json::to_vec(&map).expect("a config serializes"),
    ));
    docs.insert(config.to_vec(), doc.clone());
    doc
}

/// Runs every enabled plugin of `phase` its breaker admits on `snapshot`
/// (each with its own config and limits, and the values of the signals it
/// declares out of `signals`) and combines their verdicts. A
/// host-side failure of any plugin fails the whole judgement (a rule is
/// never skipped because the host was overloaded). With `keep_inputs`, the
/// judgement carries the stored form of what each plugin judged. Blocking:
/// call from an evaluation thread.
pub fn judge(
    registry: &Registry,
    snapshot: &mut Snapshot,
    signals: &SignalValues,
    phase: Phase,
    fail_closed: bool,
    keep_inputs: bool,
    metrics: &Metrics,
) -> Result<Judgement, HostError> {
    let engine = registry.engine();
    // Taken before the plugin list: a version swapped out after this still
    // served at this time.
    let started_at = now_ms();
    let plugins = registry.plugins();
    let mut evaluations = Vec::new();
    for p in plugins.iter().filter(|p| p.runs_in(phase)) {
        let admission = p.breaker.admit(now_ms());
        if admission == Admission::Skip {
            continue;
        }
        snapshot.config.clone_from(&p.config);
        let span = tracing::debug_span!("rule.evaluate", plugin = %p.plugin.info.name, plugin_version = %p.plugin.info.version, item = %snapshot.item.id);
        let own = p.signal_values(signals);
        let e = span.in_scope(|| p.evaluate(engine, snapshot, phase, own.as_ref()))?;
        observe(registry, p, &e, admission, metrics);
        evaluations.push((p.clone(), e));
    }
    let enforcing = || evaluations.iter().filter(|(p, _)| p.mode == Mode::Enforce);
    // A hand-off cannot happen inside a submission request: the async phase
    // asks the provider.
    let counts = |v: Verdict| !(phase == Phase::Sync && v == Verdict::Defer);
    let verdict = Verdict::most_severe(enforcing().filter_map(|(_, e)| {
        match (&e.decision, fail_closed && e.outcome.is_failure()) {
            (Some(d), _) => Some(d.verdict).filter(|v| counts(*v)),
            (None, true) => Some(Verdict::Hold),
            (None, false) => None,
        }
    }));
    let provider = (verdict == Some(Verdict::Defer))
        .then(|| enforcing().find_map(|(_, e)| e.decision.as_ref().and_then(|d| d.provider.clone())))
        .flatten();
    let inputs = if keep_inputs && !evaluations.is_empty() {
        let snapshot_doc = Arc::new(snapshot_doc(snapshot, signals));
        evaluations
            .iter()
            .map(|(p, _)| DecisionInputs {
                snapshot: snapshot_doc.clone(),
                config: config_doc(&p.config),
            })
            .collect()
    } else {
        Vec::new()
    };
    Ok(Judgement {
        evaluations,
        started_at,
        verdict,
        provider,
        inputs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_becomes_string_pairs() {
        let mut pairs = context_pairs(r#"{"lang":"en","age_days":3}"#);
        pairs.sort();
        assert_eq!(
            pairs,
            vec![("age_days".into(), "3".into()), ("lang".into(), "en".into())]
        );
        assert!(context_pairs("not json").is_empty());
    }
}
