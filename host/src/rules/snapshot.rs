//! Building the snapshot a rule sees, and cutting it to the size limit.

use super::bindings::{AuthorStats, Event, Item, Phase, Snapshot, Standing};
use super::sandbox::truncate_str;
use gavel_plugin_sdk::spec::SnapshotSpec;

/// Trigger events handed to a rule (the most recent ones; counters are complete).
pub const MAX_TRIGGER_EVENTS: usize = 64;
/// Context pairs handed to a rule.
const MAX_CONTEXT_PAIRS: usize = 32;
/// Bytes of one context key or value.
const MAX_CONTEXT_ENTRY_BYTES: usize = 256;

/// Converts the JSON form (CLI, test cases) into the WIT snapshot.
pub fn snapshot_from_spec(spec: &SnapshotSpec) -> Snapshot {
    Snapshot {
        item: Item {
            id: spec.item.id.clone(),
            kind: spec.item.kind.clone(),
            author: spec.item.author.clone(),
            text: spec.item.text.clone(),
            text_truncated: spec.item.text_truncated,
            context: spec.item.context.clone().into_iter().collect(),
            created_at_ms: spec.item.created_at_ms,
            version: spec.item.version,
        },
        counters: spec.counters.clone().into_iter().collect(),
        author: AuthorStats {
            recent_items: spec.author.recent_items,
            rejected_items: spec.author.rejected_items,
            held_items: spec.author.held_items,
            standing: Standing {
                state: spec.author.standing.state.clone(),
                strikes: spec.author.standing.strikes,
                items: spec.author.standing.items,
                rejected_items: spec.author.standing.rejected_items,
                first_seen_ms: spec.author.standing.first_seen_ms,
            },
        },
        duplicate_count: spec.duplicate_count,
        trigger: spec
            .trigger
            .iter()
            .map(|e| Event {
                kind: e.kind.clone(),
                actor: e.actor.clone(),
                at_ms: e.at_ms,
            })
            .collect(),
        config: spec.config.clone().into_iter().collect(),
        phase: if spec.phase == "sync" {
            Phase::Sync
        } else {
            Phase::Async
        },
        now_ms: spec.now_ms,
    }
}

/// The JSON form of a WIT snapshot, the inverse of [`snapshot_from_spec`]
/// for every snapshot the host builds (context keys and counter names are
/// unique there, and the JSON form keeps them sorted). Serialized with
/// `serde_json`, it is the canonical encoding stored snapshots are named by.
pub fn spec_from_snapshot(s: &Snapshot) -> SnapshotSpec {
    use gavel_plugin_sdk::spec::{AuthorSpec, EventSpec, ItemSpec, StandingSpec};
    SnapshotSpec {
        item: ItemSpec {
            id: s.item.id.clone(),
            kind: s.item.kind.clone(),
            author: s.item.author.clone(),
            text: s.item.text.clone(),
            text_truncated: s.item.text_truncated,
            context: s.item.context.iter().cloned().collect(),
            created_at_ms: s.item.created_at_ms,
            version: s.item.version,
        },
        counters: s.counters.iter().cloned().collect(),
        author: AuthorSpec {
            recent_items: s.author.recent_items,
            rejected_items: s.author.rejected_items,
            held_items: s.author.held_items,
            standing: StandingSpec {
                state: s.author.standing.state.clone(),
                strikes: s.author.standing.strikes,
                items: s.author.standing.items,
                rejected_items: s.author.standing.rejected_items,
                first_seen_ms: s.author.standing.first_seen_ms,
            },
        },
        duplicate_count: s.duplicate_count,
        trigger: s
            .trigger
            .iter()
            .map(|e| EventSpec {
                kind: e.kind.clone(),
                actor: e.actor.clone(),
                at_ms: e.at_ms,
            })
            .collect(),
        config: s.config.iter().cloned().collect(),
        phase: match s.phase {
            Phase::Sync => "sync",
            Phase::Async => "async",
        }
        .to_string(),
        now_ms: s.now_ms,
        signals: Default::default(),
    }
}

/// Cuts `snapshot` to about `max_bytes`: keeps the most recent trigger
/// events, bounds the context, then truncates the text (setting
/// `text_truncated`). Counters and config are never cut.
pub fn fit_snapshot(snapshot: &mut Snapshot, max_bytes: usize) {
    let t = &mut snapshot.trigger;
    if t.len() > MAX_TRIGGER_EVENTS {
        t.drain(..t.len() - MAX_TRIGGER_EVENTS);
    }
    let ctx = &mut snapshot.item.context;
    ctx.truncate(MAX_CONTEXT_PAIRS);
    for (k, v) in ctx.iter_mut() {
        if k.len() > MAX_CONTEXT_ENTRY_BYTES {
            *k = truncate_str(k, MAX_CONTEXT_ENTRY_BYTES).to_string();
        }
        if v.len() > MAX_CONTEXT_ENTRY_BYTES {
            *v = truncate_str(v, MAX_CONTEXT_ENTRY_BYTES).to_string();
        }
    }
    let others = size_without_text(snapshot);
    let budget = max_bytes.saturating_sub(others);
    if snapshot.item.text.len() > budget {
        let cut = truncate_str(&snapshot.item.text, budget).len();
        snapshot.item.text.truncate(cut);
        snapshot.item.text_truncated = true;
    }
}

/// Approximate encoded size of everything but the text: string bytes plus
/// 16 bytes per list entry for lengths and scalars.
fn size_without_text(s: &Snapshot) -> usize {
    let pairs = |v: &[(String, String)]| v.iter().map(|(a, b)| a.len() + b.len() + 16).sum::<usize>();
    let item = &s.item;
    64 + item.id.len()
        + item.kind.len()
        + item.author.len()
        + pairs(&item.context)
        + s.counters.iter().map(|(n, _)| n.len() + 16).sum::<usize>()
        + s.trigger
            .iter()
            .map(|e| e.kind.len() + e.actor.len() + 16)
            .sum::<usize>()
        + pairs(&s.config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_text_is_cut_on_a_char_boundary_and_marked() {
        let mut spec = SnapshotSpec::default();
        spec.item.text = "é".repeat(100_000);
        let mut s = snapshot_from_spec(&spec);
        fit_snapshot(&mut s, 64 << 10);
        assert!(s.item.text_truncated);
        assert!(s.item.text.len() <= 64 << 10);
        assert!(s.item.text.len() > 60 << 10);
        assert!(s.item.text.chars().all(|c| c == 'é'));
    }

    #[test]
    fn the_json_form_round_trips() {
        let mut spec = SnapshotSpec::default();
        spec.item.text = "hello".into();
        spec.item.context.insert("lang".into(), "en".into());
        spec.counters.insert("flag".into(), 3);
        spec.config.insert("threshold".into(), "2".into());
        spec.phase = "sync".into();
        spec.now_ms = 42;
        spec.trigger.push(gavel_plugin_sdk::spec::EventSpec {
            kind: "flag".into(),
            actor: "u1".into(),
            at_ms: 40,
        });
        assert_eq!(spec_from_snapshot(&snapshot_from_spec(&spec)), spec);
    }

    #[test]
    fn small_snapshot_is_untouched_and_old_triggers_dropped() {
        let mut spec = SnapshotSpec::default();
        spec.item.text = "hello".into();
        for i in 0..100 {
            spec.trigger.push(gavel_plugin_sdk::spec::EventSpec {
                kind: "flag".into(),
                actor: format!("u{i}"),
                at_ms: i,
            });
        }
        let mut s = snapshot_from_spec(&spec);
        fit_snapshot(&mut s, 64 << 10);
        assert_eq!(s.item.text, "hello");
        assert!(!s.item.text_truncated);
        assert_eq!(s.trigger.len(), MAX_TRIGGER_EVENTS);
        assert_eq!(s.trigger[0].actor, "u36");
    }
}
