//! What the writer thread knows is stored, so it need not ask again: the
//! `plugin_refs` id of each plugin version, and the digest of each config
//! document. Both are content-addressed rows that nothing deletes (see
//! `store/retention.rs`: retention deletes snapshot documents only), so
//! once one is committed it stays.
//!
//! Every evaluation commit would otherwise look up the `plugin_refs` id of
//! each decision and insert each plugin's config `ON CONFLICT DO NOTHING`:
//! about twenty statements per settled item that find what the writer has
//! seen thousands of times.
//!
//! A row written or found inside a transaction is only *pending* until
//! that transaction commits: it may have been inserted by the transaction
//! itself and vanish with a rollback (then its id may even be handed to
//! another row). The writer settles them ([`committed`], [`rolled_back`],
//! [`rollback_to`] for a savepoint). The cache lives on the writer thread
//! only ([`enable`]); on any other thread every lookup goes to SQLite.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};

/// A plugin version as `plugin_refs` names it, with its id.
struct PluginRef {
    name: String,
    version: String,
    digest: String,
    id: i64,
}

impl PluginRef {
    fn is(&self, name: &str, version: &str, digest: &str) -> bool {
        self.digest == digest && self.name == name && self.version == version
    }
}

#[derive(Default)]
struct Known {
    /// By digest (the same code may be deployed under two names).
    plugin_refs: HashMap<String, Vec<PluginRef>>,
    configs: HashSet<String>,
    /// Found or written by the transaction under way, in that order.
    pending: Vec<Pending>,
}

enum Pending {
    PluginRef(PluginRef),
    Config(String),
}

thread_local! {
    /// `Some` on the writer thread only.
    static KNOWN: RefCell<Option<Known>> = const { RefCell::new(None) };
}

/// Turns the cache on for the calling thread (the writer's).
pub(super) fn enable() {
    KNOWN.with_borrow_mut(|k| *k = Some(Known::default()));
}

/// The id of a plugin version already stored (or written by this
/// transaction), if known.
pub(super) fn plugin_ref(name: &str, version: &str, digest: &str) -> Option<i64> {
    KNOWN.with_borrow(|k| {
        let k = k.as_ref()?;
        let stored = k.plugin_refs.get(digest).into_iter().flatten();
        let pending = k.pending.iter().filter_map(|p| match p {
            Pending::PluginRef(r) => Some(r),
            Pending::Config(_) => None,
        });
        stored
            .chain(pending)
            .find(|r| r.is(name, version, digest))
            .map(|r| r.id)
    })
}

/// Notes the id of a plugin version this transaction found or wrote.
pub(super) fn note_plugin_ref(name: &str, version: &str, digest: &str, id: i64) {
    KNOWN.with_borrow_mut(|k| {
        if let Some(k) = k {
            k.pending.push(Pending::PluginRef(PluginRef {
                name: name.to_owned(),
                version: version.to_owned(),
                digest: digest.to_owned(),
                id,
            }));
        }
    });
}

/// Whether a config document is known to be stored.
pub(super) fn config(digest: &str) -> bool {
    KNOWN.with_borrow(|k| {
        k.as_ref().is_some_and(|k| {
            k.configs.contains(digest) || k.pending.iter().any(|p| matches!(p, Pending::Config(d) if d == digest))
        })
    })
}

/// Notes a config document this transaction stored (or found stored).
pub(super) fn note_config(digest: &str) {
    KNOWN.with_borrow_mut(|k| {
        if let Some(k) = k {
            k.pending.push(Pending::Config(digest.to_owned()));
        }
    });
}

/// A point to roll the pending rows back to (a savepoint's).
#[derive(Debug, Clone, Copy)]
pub(super) struct Mark(usize);

pub(super) fn mark() -> Mark {
    Mark(KNOWN.with_borrow(|k| k.as_ref().map_or(0, |k| k.pending.len())))
}

/// The savepoint taken at `mark` was rolled back: what it noted is gone.
pub(super) fn rollback_to(mark: Mark) {
    KNOWN.with_borrow_mut(|k| {
        if let Some(k) = k {
            k.pending.truncate(mark.0);
        }
    });
}

/// The transaction committed: what it noted is stored for good.
pub(super) fn committed() {
    KNOWN.with_borrow_mut(|k| {
        if let Some(k) = k {
            for p in k.pending.drain(..) {
                match p {
                    Pending::PluginRef(r) => k.plugin_refs.entry(r.digest.clone()).or_default().push(r),
                    Pending::Config(d) => {
                        k.configs.insert(d);
                    }
                }
            }
        }
    });
}

/// The transaction was rolled back (or its `COMMIT` failed): nothing it
/// noted can be trusted.
pub(super) fn rolled_back() {
    KNOWN.with_borrow_mut(|k| {
        if let Some(k) = k {
            k.pending.clear();
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_a_transaction_committed_is_kept() {
        // Off the writer thread nothing is cached.
        std::thread::spawn(|| {
            note_config("a");
            committed();
            assert!(!config("a"));
        })
        .join()
        .unwrap();

        std::thread::spawn(|| {
            enable();
            note_config("a");
            note_plugin_ref("p", "1", "d", 7);
            assert!(config("a"), "the transaction sees its own rows");
            assert_eq!(plugin_ref("p", "1", "d"), Some(7));
            rolled_back();
            assert!(!config("a"));
            assert_eq!(plugin_ref("p", "1", "d"), None);

            note_config("a");
            let m = mark();
            note_config("b");
            note_plugin_ref("p", "1", "d", 8);
            rollback_to(m);
            assert!(config("a") && !config("b"));
            assert_eq!(plugin_ref("p", "1", "d"), None);
            committed();
            rolled_back();
            assert!(config("a"), "a committed row outlives later rollbacks");
            assert!(!config("b"));
            note_plugin_ref("p", "1", "d", 9);
            committed();
            assert_eq!(plugin_ref("p", "1", "d"), Some(9));
            assert_eq!(plugin_ref("p", "2", "d"), None);
        })
        .join()
        .unwrap();
    }
}
