//! The lists a replayed evaluation consults. A replay answers a rule's
//! list calls as the stored evaluation was answered: each list from the
//! version its stored decision recorded; a list that decision did not
//! consult (a candidate asking for a new one) from the version in force
//! at the evaluation's time (the latest created at or before it), else
//! `unknown`. A candidate list ([`CandidateList`]) takes the place of its
//! name in every replay. Each `(list, version)` is read from the store and
//! compiled once per run ([`RunLists`]).
//!
//! Which lists a rule asks for is known only once it runs. A replay pins
//! the lists its stored decision recorded and every name an earlier replay
//! of the run asked for ([`PinnedLists`]); a rule that asks for a name not
//! pinned is told `unknown`, and the replay is judged again once the run
//! has pinned that name too. Each name costs an evaluation at most one
//! repeat, and later evaluations pin it from the start.

use crate::clock::Millis;
use crate::lists::{self, CompiledList, Entry, EntryError, ListKind, ListSource, ListsConfig};
use crate::rules::ListUse;
use crate::store::{Lists, StoreResult};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

/// Versions read per round trip while loading a list's history.
const HISTORY_PAGE: i64 = 500;

/// Candidate lists one backtest may give.
pub const MAX_CANDIDATE_LISTS: usize = 16;

/// Content given for a backtest in place of a stored list, checked and
/// compiled as `PUT /v1/lists/{name}` would check and compile it.
#[derive(Debug, Clone)]
pub struct CandidateList {
    pub kind: ListKind,
    pub compiled: Arc<CompiledList>,
}

/// A candidate list as a report names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ListRef {
    pub name: String,
    pub kind: ListKind,
    /// Entries once in canonical form.
    pub entries: usize,
    /// sha256 of the canonical entries, as a stored version of the same
    /// content would have.
    pub digest: String,
}

impl CandidateList {
    pub fn describe(&self) -> ListRef {
        ListRef {
            name: self.compiled.name.clone(),
            kind: self.kind,
            entries: self.compiled.entries,
            digest: self.compiled.digest.clone(),
        }
    }
}

/// Why candidate lists were refused.
#[derive(Debug, thiserror::Error)]
pub enum CandidateListError {
    #[error("at most {MAX_CANDIDATE_LISTS} candidate lists")]
    TooMany,
    #[error(
        "{0:?} is not a list name: 1-64 lowercase letters, digits, `.`, `_` and `-`, starting with a letter or digit"
    )]
    Name(String),
    #[error("list {0} does not exist: give its kind")]
    KindRequired(String),
    #[error("list {name} holds {stored}; a candidate of kind {given} cannot take its place")]
    KindMismatch {
        name: String,
        stored: ListKind,
        given: ListKind,
    },
    #[error("candidate list {name}: {error}")]
    Entry { name: String, error: EntryError },
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
}

/// A candidate list as given: its entries in any spelling `PUT` accepts,
/// and its kind (needed only for a list the store does not have).
#[derive(Debug, Clone)]
pub struct GivenList {
    pub name: String,
    pub kind: Option<ListKind>,
    pub entries: Vec<Entry>,
}

/// Checks and compiles `given` under `limits`: each of a stored list's
/// kind (a different kind is refused; a new list needs one), its entries
/// refused as `PUT` refuses them. Compiling runs off the async threads.
pub async fn candidate_lists(
    store: &dyn Lists,
    given: Vec<GivenList>,
    limits: &ListsConfig,
) -> Result<BTreeMap<String, CandidateList>, CandidateListError> {
    if given.len() > MAX_CANDIDATE_LISTS {
        return Err(CandidateListError::TooMany);
    }
    if given.is_empty() {
        return Ok(BTreeMap::new());
    }
    let stored: HashMap<String, ListKind> = store.lists().await?.into_iter().map(|r| (r.name, r.kind)).collect();
    let mut out = BTreeMap::new();
    for g in given {
        if !lists::valid_name(&g.name) {
            return Err(CandidateListError::Name(g.name));
        }
        let kind = match (stored.get(&g.name), g.kind) {
            (Some(&stored), Some(given)) if stored != given => {
                return Err(CandidateListError::KindMismatch {
                    name: g.name,
                    stored,
                    given,
                });
            }
            (Some(&kind), _) | (None, Some(kind)) => kind,
            (None, None) => return Err(CandidateListError::KindRequired(g.name)),
        };
        let (name, limits) = (g.name.clone(), limits.clone());
        let checked = tokio::task::spawn_blocking(move || lists::check(&name, kind, g.entries, &limits))
            .await
            .expect("checking a list does not panic")
            .map_err(|error| CandidateListError::Entry {
                name: g.name.clone(),
                error,
            })?;
        out.insert(
            g.name,
            CandidateList {
                kind,
                compiled: Arc::new(checked.compiled),
            },
        );
    }
    Ok(out)
}

/// When a stored evaluation ran, and the list versions its stored decision
/// recorded (none for a plugin that did not judge it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct ListPlan {
    pub at: Millis,
    pub recorded: Vec<ListUse>,
}

impl ListPlan {
    pub fn of(decision: Option<&crate::store::DecisionRecord>, at: Millis) -> ListPlan {
        ListPlan {
            at,
            recorded: decision.map(|d| d.lists.clone()).unwrap_or_default(),
        }
    }
}

/// The version of a list in force at `at`: the newest created at or
/// before it. `versions` are `(version, created_at)`, in any order.
pub(super) fn version_at(versions: &[(i64, Millis)], at: Millis) -> Option<i64> {
    versions
        .iter()
        .filter(|(_, created)| *created <= at)
        .map(|(version, _)| *version)
        .max()
}

/// The list versions of one backtest run: candidate lists, the names its
/// replays asked for, and every version read so far, compiled.
pub(super) struct RunLists {
    limits: ListsConfig,
    candidates: BTreeMap<String, Arc<CompiledList>>,
    /// Names a replay asked for that its stored decision had not consulted:
    /// pinned in every replay from then on.
    asked: BTreeSet<String>,
    /// Each asked list's versions, `(version, created_at)`.
    histories: HashMap<String, Vec<(i64, Millis)>>,
    /// Versions read and compiled; `None`: not in the store, or it does
    /// not compile under this process's limits (the rule is told `unknown`).
    compiled: HashMap<(String, i64), Option<Arc<CompiledList>>>,
}

impl RunLists {
    pub fn new(limits: ListsConfig, candidates: &BTreeMap<String, CandidateList>) -> RunLists {
        RunLists {
            limits,
            candidates: candidates
                .iter()
                .map(|(name, c)| (name.clone(), c.compiled.clone()))
                .collect(),
            asked: BTreeSet::new(),
            histories: HashMap::new(),
            compiled: HashMap::new(),
        }
    }

    /// Whether `list` is a candidate list of this run.
    pub fn is_candidate(&self, list: &str) -> bool {
        self.candidates.contains_key(list)
    }

    /// Pins, in every later replay, the names replays asked for unpinned.
    pub fn learn(&mut self, asked: impl IntoIterator<Item = String>) {
        self.asked.extend(asked);
    }

    /// The lists a replay of `plan` answers from: the candidate lists, the
    /// recorded versions, and each name asked for so far at its version
    /// in force then.
    pub async fn pin(&mut self, store: &dyn Lists, plan: &ListPlan) -> StoreResult<Arc<PinnedLists>> {
        let mut pinned: HashMap<String, Option<Arc<CompiledList>>> = HashMap::new();
        for used in &plan.recorded {
            if !self.is_candidate(&used.name) {
                let list = self.version(store, &used.name, used.version).await?;
                pinned.insert(used.name.clone(), list);
            }
        }
        let unpinned: Vec<String> = self
            .asked
            .iter()
            .filter(|name| !pinned.contains_key(*name) && !self.is_candidate(name))
            .cloned()
            .collect();
        for name in unpinned {
            let list = match version_at(self.history(store, &name).await?, plan.at) {
                Some(version) => self.version(store, &name, version).await?,
                None => None,
            };
            pinned.insert(name, list);
        }
        for (name, list) in &self.candidates {
            pinned.insert(name.clone(), Some(list.clone()));
        }
        Ok(Arc::new(PinnedLists {
            lists: pinned,
            asked: Mutex::default(),
        }))
    }

    /// Every version of `name`, read once per run.
    async fn history(&mut self, store: &dyn Lists, name: &str) -> StoreResult<&[(i64, Millis)]> {
        if !self.histories.contains_key(name) {
            let mut versions = Vec::new();
            let mut before = None;
            loop {
                let page = store.list_history(name, before, HISTORY_PAGE).await?;
                versions.extend(page.iter().map(|r| (r.version, r.created_at)));
                match page.last() {
                    Some(last) if page.len() as i64 == HISTORY_PAGE => before = Some(last.version),
                    _ => break,
                }
            }
            self.histories.insert(name.to_string(), versions);
        }
        Ok(&self.histories[name])
    }

    /// Version `version` of `name`, read and compiled once per run.
    async fn version(&mut self, store: &dyn Lists, name: &str, version: i64) -> StoreResult<Option<Arc<CompiledList>>> {
        let key = (name.to_string(), version);
        if let Some(list) = self.compiled.get(&key) {
            return Ok(list.clone());
        }
        let list = match store.list_content(name, Some(version)).await? {
            Some(content) => {
                let limits = self.limits.clone();
                let compiled =
                    tokio::task::spawn_blocking(move || crate::lists::ServedLists::compile(&content, &limits))
                        .await
                        .expect("compiling a list does not panic");
                match compiled {
                    Ok(list) => Some(Arc::new(list)),
                    Err(e) => {
                        tracing::warn!(list = %name, version, error = %e, "list version does not compile here; replays are told it is unknown");
                        None
                    }
                }
            }
            None => None,
        };
        self.compiled.insert(key, list.clone());
        Ok(list)
    }
}

/// The lists one replayed evaluation answers from, and the names its rule
/// asked for that were not pinned (told `unknown`; the replay is judged
/// again once they are).
pub(super) struct PinnedLists {
    /// By name: the version pinned, or `None` when the list did not exist
    /// at the evaluation's time.
    lists: HashMap<String, Option<Arc<CompiledList>>>,
    asked: Mutex<Vec<String>>,
}

impl PinnedLists {
    /// The names asked for unpinned, once each.
    pub fn unpinned(&self) -> Vec<String> {
        let mut asked = self.asked.lock().expect("not poisoned").clone();
        asked.sort();
        asked.dedup();
        asked
    }

    pub fn source(self: &Arc<Self>) -> Arc<dyn ListSource> {
        self.clone()
    }
}

impl ListSource for PinnedLists {
    fn list(&self, name: &str) -> Option<Arc<CompiledList>> {
        match self.lists.get(name) {
            Some(list) => list.clone(),
            None => {
                self.asked.lock().expect("not poisoned").push(name.to_string());
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_in_force_is_the_newest_created_by_then() {
        let versions = [(1, 100), (2, 200), (3, 300)];
        assert_eq!(version_at(&versions, 99), None, "before the list existed");
        assert_eq!(version_at(&versions, 100), Some(1), "created at that very time");
        assert_eq!(version_at(&versions, 250), Some(2));
        assert_eq!(version_at(&versions, 300), Some(3));
        assert_eq!(version_at(&versions, i64::MAX), Some(3));
        assert_eq!(version_at(&[], 500), None);
        // Order does not matter (the store pages newest first), and two
        // versions written within one millisecond resolve to the later one.
        assert_eq!(version_at(&[(3, 300), (2, 300), (1, 100)], 300), Some(3));
    }

    fn compiled(name: &str) -> Arc<CompiledList> {
        let checked = lists::check(name, ListKind::Strings, vec![Entry::new("x")], &ListsConfig::default()).unwrap();
        Arc::new(checked.compiled)
    }

    #[test]
    fn a_pinned_set_answers_what_it_pins_and_notes_the_rest() {
        let pinned = PinnedLists {
            lists: HashMap::from([
                ("here".to_string(), Some(compiled("here"))),
                ("not-yet".to_string(), None),
            ]),
            asked: Mutex::default(),
        };
        assert_eq!(pinned.list("here").map(|l| l.name.clone()).as_deref(), Some("here"));
        assert!(pinned.list("not-yet").is_none(), "absent at the time: unknown");
        assert!(
            pinned.unpinned().is_empty(),
            "a list known to be absent is not asked again"
        );
        assert!(pinned.list("new").is_none());
        assert!(pinned.list("new").is_none());
        assert_eq!(pinned.unpinned(), ["new"]);
    }
}
