//! Lists: named, typed sets of entries that moderators edit at runtime
//! (`/v1/lists`), each edit an immutable version with its sha256 digest,
//! author, reason and time.
//!
//! # Layout
//!
//! The kinds, each entry's canonical form, the limits, the digest and the
//! diff between two versions are the domain's (`crate::domain::lists`),
//! re-exported here.
//!
//! - `matcher`: a version compiled once into the matcher of its kind.
//! - `served`: the compiled version of every list this process serves,
//!   swapped on an edit, and the poll that picks up other processes' edits.
//!
//! A rule's list calls are answered by a [`ListSource`]: live evaluations
//! ask [`ServedLists`]; a backtest's replays ask the versions of the time
//! they replay (`crate::backtest`).

mod matcher;
mod served;

pub use crate::domain::lists::{
    Diff, Entry, EntryError, ListKind, ListsConfig, Renote, canonical, diff, digest, normalise, valid_name,
};
pub use matcher::{CompiledList, Matcher, WrongKind};
pub use served::{Served, ServedLists};

use gavel_plugin_sdk::spec::CaseList;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// Where one evaluation's list calls are answered from. The sandbox asks
/// it once per list and call (then keeps the answer: one call sees one
/// version of a list), so a source is free to answer each evaluation
/// differently.
pub trait ListSource: Send + Sync {
    /// List `name` as the evaluation sees it; `None`: the rule is told
    /// `unknown`.
    fn list(&self, name: &str) -> Option<Arc<CompiledList>>;
}

/// Lists given whole, by name: a `plugin test` case's (its `lists` in
/// `cases.json`). Any other name is unknown.
#[derive(Debug, Default)]
pub struct FixedLists(HashMap<String, Arc<CompiledList>>);

impl FixedLists {
    /// Checks and compiles a case's lists as `PUT /v1/lists/{name}` would
    /// (default limits); the error names the list and what is wrong.
    pub fn from_case(lists: &BTreeMap<String, CaseList>) -> Result<Self, String> {
        let limits = ListsConfig::default();
        let mut fixed = HashMap::with_capacity(lists.len());
        for (name, list) in lists {
            let fail = |why: String| format!("list {name:?}: {why}");
            if !valid_name(name) {
                return Err(fail("is not a valid list name".into()));
            }
            let kind: ListKind = list.kind.parse().map_err(|e| fail(format!("{e}")))?;
            let entries = list.entries.iter().map(Entry::new).collect();
            let checked = check(name, kind, entries, &limits).map_err(|e| fail(e.to_string()))?;
            fixed.insert(name.clone(), Arc::new(checked.compiled));
        }
        Ok(FixedLists(fixed))
    }

    pub fn source(self) -> Arc<dyn ListSource> {
        Arc::new(self)
    }
}

impl ListSource for FixedLists {
    fn list(&self, name: &str) -> Option<Arc<CompiledList>> {
        self.0.get(name).cloned()
    }
}

/// A version about to be written (or tried in a backtest): its entries in
/// canonical form, their digest, and the matcher compiled from them (with
/// version 0 until the store numbers it).
#[derive(Debug)]
pub struct Checked {
    pub entries: Vec<Entry>,
    pub digest: String,
    pub compiled: CompiledList,
}

/// Checks `entries` as a version of list `name` of `kind` under `limits`:
/// canonical form (a bad entry refused by name, too many refused as a
/// whole), digest, compiled matcher (a pattern over its size limit refused
/// by name). What `PUT` and `PATCH /v1/lists/{name}` write, and what a
/// backtest's candidate list is. Compiling may take a while: call it off
/// the async threads.
pub fn check(name: &str, kind: ListKind, entries: Vec<Entry>, limits: &ListsConfig) -> Result<Checked, EntryError> {
    let entries = canonical(kind, entries, limits)?;
    let digest = digest(kind, &entries);
    let matcher = Matcher::compile(kind, &entries, limits)?;
    let compiled = CompiledList {
        name: name.to_string(),
        version: 0,
        digest: digest.clone(),
        entries: entries.len(),
        matcher,
    };
    Ok(Checked {
        entries,
        digest,
        compiled,
    })
}
