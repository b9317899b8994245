//! The native test harness: a rule's unit tests run with plain `cargo test`
//! on the host target, no wasm toolchain or runtime involved.
//!
//! ```
//! use gavel_plugin_sdk::testing::SnapshotBuilder;
//! let snapshot = SnapshotBuilder::new().text("hello").counter("flag", 3).config("quorum", "5").build();
//! assert_eq!(snapshot.counter("flag"), 3);
//! assert_eq!(snapshot.config_or("quorum", 0).unwrap(), 5);
//! ```

use crate::{AuthorStats, Event, Item, Level, Phase, Snapshot, Standing};
use std::cell::RefCell;

thread_local! {
    static LOGS: RefCell<Vec<(Level, String)>> = const { RefCell::new(Vec::new()) };
}

/// Called by [`crate::log`] on native targets: keeps the line for
/// [`take_logs`] and echoes it to stderr (shown by `cargo test` on failure).
pub(crate) fn capture_log(level: Level, message: &str) {
    eprintln!("[plugin {level:?}] {message}");
    LOGS.with(|logs| logs.borrow_mut().push((level, message.to_string())));
}

/// The lines the rule logged on this thread since the last call.
pub fn take_logs() -> Vec<(Level, String)> {
    LOGS.with(|logs| std::mem::take(&mut *logs.borrow_mut()))
}

/// Builds a [`Snapshot`] with sensible defaults (an async-phase `post` by
/// `author-1`, version 1, no counters, an author in `good` standing with no
/// history and an unknown first-seen time, 0).
#[derive(Debug, Clone)]
pub struct SnapshotBuilder {
    snapshot: Snapshot,
    signals: crate::signals::native::Values,
}

impl Default for SnapshotBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl SnapshotBuilder {
    pub fn new() -> Self {
        SnapshotBuilder {
            snapshot: Snapshot {
                item: Item {
                    id: "item-1".into(),
                    kind: "post".into(),
                    author: "author-1".into(),
                    text: String::new(),
                    text_truncated: false,
                    context: Vec::new(),
                    created_at_ms: 0,
                    version: 1,
                },
                counters: Vec::new(),
                author: AuthorStats {
                    recent_items: 0,
                    rejected_items: 0,
                    held_items: 0,
                    standing: Standing {
                        state: "good".into(),
                        strikes: 0.0,
                        items: 0,
                        rejected_items: 0,
                        first_seen_ms: 0,
                    },
                },
                duplicate_count: 0,
                trigger: Vec::new(),
                config: Vec::new(),
                phase: Phase::Async,
                now_ms: 0,
            },
            signals: Default::default(),
        }
    }

    pub fn text(mut self, text: &str) -> Self {
        self.snapshot.item.text = text.into();
        self
    }

    pub fn kind(mut self, kind: &str) -> Self {
        self.snapshot.item.kind = kind.into();
        self
    }

    pub fn author(mut self, author: &str) -> Self {
        self.snapshot.item.author = author.into();
        self
    }

    pub fn context(mut self, key: &str, value: &str) -> Self {
        self.snapshot.item.context.push((key.into(), value.into()));
        self
    }

    pub fn counter(mut self, name: &str, value: u64) -> Self {
        self.snapshot.counters.retain(|(n, _)| n != name);
        self.snapshot.counters.push((name.into(), value));
        self
    }

    pub fn config(mut self, key: &str, value: &str) -> Self {
        self.snapshot.config.retain(|(k, _)| k != key);
        self.snapshot.config.push((key.into(), value.into()));
        self
    }

    pub fn duplicate_count(mut self, count: u32) -> Self {
        self.snapshot.duplicate_count = count;
        self
    }

    /// Sets the author's recent history; the standing is kept.
    pub fn author_stats(mut self, recent_items: u32, rejected_items: u32, held_items: u32) -> Self {
        self.snapshot.author.recent_items = recent_items;
        self.snapshot.author.rejected_items = rejected_items;
        self.snapshot.author.held_items = held_items;
        self
    }

    /// Sets the author's account standing: the state (`good`, `watch`, ...),
    /// the strike score, the items and rejected items in the standing window,
    /// and when gavel first saw the author (ms since the Unix epoch; compare
    /// with [`SnapshotBuilder::now_ms`]).
    pub fn standing(mut self, state: &str, strikes: f32, items: u32, rejected_items: u32, first_seen_ms: u64) -> Self {
        self.snapshot.author.standing = Standing {
            state: state.into(),
            strikes,
            items,
            rejected_items,
            first_seen_ms,
        };
        self
    }

    pub fn trigger(mut self, kind: &str, actor: &str, at_ms: u64) -> Self {
        self.snapshot.trigger.push(Event {
            kind: kind.into(),
            actor: actor.into(),
            at_ms,
        });
        self
    }

    /// Sets the host's clock when the snapshot was taken (ms since the Unix epoch).
    pub fn now_ms(mut self, now_ms: u64) -> Self {
        self.snapshot.now_ms = now_ms;
        self
    }

    pub fn phase(mut self, phase: Phase) -> Self {
        self.snapshot.phase = phase;
        self
    }

    /// Signal `name` has `value` for the item's key `key` (a test may give
    /// a signal with no keys by `signal_keys(name, &[])`).
    pub fn signal(mut self, name: &str, key: &str, value: u64) -> Self {
        self.signals.entry(name.into()).or_default().insert(key.into(), value);
        self
    }

    /// Signal `name` with these `(key, value)` pairs (none: declared, but
    /// the item has no key for it).
    pub fn signal_keys(mut self, name: &str, keys: &[(&str, u64)]) -> Self {
        let entry = self.signals.entry(name.into()).or_default();
        entry.extend(keys.iter().map(|(k, v)| (k.to_string(), *v)));
        self
    }

    /// The snapshot; the builder's signals become what
    /// [`crate::signals::values`] answers on this thread (none given: every
    /// signal is undeclared).
    pub fn build(self) -> Snapshot {
        crate::signals::native::set(self.signals);
        self.snapshot
    }
}

#[cfg(feature = "spec")]
mod cases {
    use super::*;
    use crate::Rule;
    use crate::spec::{SnapshotSpec, parse_cases};

    impl From<&SnapshotSpec> for Snapshot {
        fn from(spec: &SnapshotSpec) -> Self {
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
    }

    /// Runs every case of a `cases.json` document through `R` and panics with
    /// the list of failing cases. The host's integration tests run the same
    /// document through the built `.wasm`, so both must agree.
    ///
    /// A case that gives list contents needs the host to answer its list
    /// calls: it is left to `gavel plugin test` (which runs every case) and
    /// named on stderr, never counted here; a document of nothing but
    /// such cases fails.
    pub fn run_cases<R: Rule>(json: &str) {
        let cases = parse_cases(json).expect("cases.json does not parse");
        let (hosted, native): (Vec<_>, Vec<_>) = cases.iter().partition(|c| !c.lists.is_empty());
        assert!(
            !native.is_empty(),
            "cases.json holds no case that runs without the host's lists"
        );
        for case in &hosted {
            eprintln!(
                "case {:?} gives lists: run by `gavel plugin test`, not natively",
                case.name
            );
        }
        let failures: Vec<String> = native
            .iter()
            .filter_map(|case| {
                let snapshot = Snapshot::from(&case.snapshot);
                crate::signals::native::set(case.snapshot.signals.clone());
                let result = match R::evaluate(&snapshot) {
                    Ok(d) => case.expect.check(d.verdict.as_str(), &d.labels, d.provider.as_deref()),
                    Err(e) => Err(format!("rule returned an error: {e}")),
                };
                result.err().map(|e| format!("{}: {e}", case.name))
            })
            .collect();
        assert!(failures.is_empty(), "failing cases:\n  {}", failures.join("\n  "));
    }
}

#[cfg(feature = "spec")]
pub use cases::run_cases;
