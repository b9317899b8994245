//! A long stored history for one item, written through the store's own
//! evaluation commits (fenced, with their snapshot documents), as the
//! worker would have written it over a day of re-evaluations.

use gavel::domain::{DecisionPhase, InputKind, Mode, Outcome, Verdict};
use gavel::store::{DecisionInputs, EvaluationCommit, InputDoc, NewDecision, SharedStore};
use gavel_plugin_sdk::spec::SnapshotSpec;
use std::sync::Arc;

/// Evaluations per commit call (one transaction).
const PER_COMMIT: usize = 500;

/// Stores `n` async evaluations of `item_id`, one millisecond apart from
/// `start_ms`, each judged by every plugin of `plugins` (name, version,
/// digest) with `allow`, on its own snapshot (the item's text, `flag`
/// counted up). The item must be settled; its status stays.
pub async fn seed_evaluations(
    store: &SharedStore,
    item_id: &str,
    text: &str,
    plugins: &[(&str, &str, &str)],
    n: usize,
    start_ms: i64,
) -> anyhow::Result<()> {
    let config = Arc::new(InputDoc::new(InputKind::Config, b"{}"));
    let mut done = 0;
    while done < n {
        let item = store
            .item(item_id)
            .await?
            .ok_or_else(|| anyhow::anyhow!("no item {item_id}"))?;
        let batch: Vec<EvaluationCommit> = (done..(done + PER_COMMIT).min(n))
            .enumerate()
            .map(|(round, k)| {
                let now = start_ms + k as i64;
                let mut spec = SnapshotSpec::default();
                spec.item.id = item_id.to_string();
                spec.item.text = text.to_string();
                spec.counters.insert("flag".into(), k as u64);
                spec.now_ms = now as u64;
                let json = serde_json::to_vec(&spec).expect("a snapshot serializes");
                let inputs = DecisionInputs {
                    snapshot: Arc::new(InputDoc::new(InputKind::Snapshot, &json)),
                    config: config.clone(),
                };
                EvaluationCommit {
                    item_id: item_id.to_string(),
                    snapshot_version: item.version,
                    snapshot_event_seq: item.event_seq,
                    // Each commit of the batch is the next round of the item.
                    snapshot_round: item.eval_round + round as i64,
                    from: item.status,
                    to: None,
                    decisions: plugins
                        .iter()
                        .map(|(name, version, digest)| NewDecision {
                            plugin: name.to_string(),
                            plugin_version: version.to_string(),
                            plugin_digest: digest.to_string(),
                            phase: DecisionPhase::Async,
                            verdict: Some(Verdict::Allow),
                            score: 0.0,
                            labels: Vec::new(),
                            reason: String::new(),
                            mode: Mode::Enforce,
                            applied: false,
                            duration_us: 10,
                            outcome: Outcome::Ok,
                            error: None,
                            decided_at: now,
                            inputs: Some(inputs.clone()),
                            weighs: false,
                            lists: Vec::new(),
                        })
                        .collect(),
                    reason: "seeded".into(),
                    correlation_id: format!("seed-{k}"),
                    now,
                    handoff: None,
                }
            })
            .collect();
        let outcomes = store.commit_evaluations(&batch).await?;
        let stale = outcomes
            .iter()
            .filter(|o| **o == gavel::store::CommitOutcome::Stale)
            .count();
        anyhow::ensure!(stale == 0, "{stale} seeded evaluations of {item_id} were stale");
        done += batch.len();
    }
    Ok(())
}
