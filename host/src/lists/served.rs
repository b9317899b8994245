//! The lists this process serves: one compiled version per list behind an
//! `Arc`, swapped whole on an edit (a reader keeps the version it took).
//! The process that makes an edit installs the version it compiled before
//! it answers; every process polls the store's versions
//! (`lists.poll_interval_ms`) and compiles what others wrote, on both
//! backends alike.

use super::matcher::{CompiledList, Matcher};
use super::{EntryError, ListSource, ListsConfig};
use crate::metrics::{ListLabel, Metrics};
use crate::store::{ListContent, Lists, StoreResult};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The version of a list a process serves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Served {
    pub version: i64,
    pub digest: String,
}

/// Every list this process serves, compiled.
pub struct ServedLists {
    lists: RwLock<HashMap<String, Arc<CompiledList>>>,
    /// The version of each list that would not compile here (say, under
    /// lower limits than the process that wrote it), so the poll does not
    /// try it again; the list's previous version stays served.
    refused: Mutex<HashMap<String, i64>>,
    limits: ListsConfig,
    metrics: Arc<Metrics>,
}

impl ServedLists {
    pub fn new(limits: ListsConfig, metrics: Arc<Metrics>) -> Self {
        ServedLists {
            lists: RwLock::default(),
            refused: Mutex::default(),
            limits,
            metrics,
        }
    }

    pub fn limits(&self) -> &ListsConfig {
        &self.limits
    }

    /// The version of `name` served now.
    pub fn get(&self, name: &str) -> Option<Arc<CompiledList>> {
        self.lists.read().expect("lists lock").get(name).cloned()
    }

    /// The version and digest of every list served now.
    pub fn served(&self) -> BTreeMap<String, Served> {
        self.lists
            .read()
            .expect("lists lock")
            .iter()
            .map(|(name, l)| {
                (
                    name.clone(),
                    Served {
                        version: l.version,
                        digest: l.digest.clone(),
                    },
                )
            })
            .collect()
    }

    /// Compiles one stored version (entries already canonical).
    pub fn compile(content: &ListContent, limits: &ListsConfig) -> Result<CompiledList, EntryError> {
        let r = &content.record;
        Ok(CompiledList {
            name: r.name.clone(),
            version: r.version,
            digest: r.digest.clone(),
            entries: content.entries.len(),
            matcher: Matcher::compile(r.kind, &content.entries, limits)?,
        })
    }

    /// Serves `list` unless a newer version of it is served already (the
    /// poll and an edit may race to install).
    pub fn install(&self, list: Arc<CompiledList>) {
        let mut lists = self.lists.write().expect("lists lock");
        if lists.get(&list.name).is_some_and(|l| l.version >= list.version) {
            return;
        }
        self.metrics
            .list_version
            .get_or_create(&ListLabel {
                list: list.name.clone(),
            })
            .set(list.version);
        lists.insert(list.name.clone(), list);
    }

    /// Compiles and serves every list the store has at a newer version
    /// than served here; returns how many it installed.
    pub async fn refresh(&self, store: &dyn Lists) -> StoreResult<usize> {
        let mut installed = 0;
        for (name, version) in store.list_versions_now().await? {
            let served = self.get(&name).map(|l| l.version);
            let refused = self.refused.lock().expect("refused lock").get(&name).copied();
            if served.is_some_and(|v| v >= version) || refused == Some(version) {
                continue;
            }
            let Some(content) = store.list_content(&name, Some(version)).await? else {
                continue;
            };
            let limits = self.limits.clone();
            let compiled = tokio::task::spawn_blocking(move || Self::compile(&content, &limits))
                .await
                .expect("compiling a list does not panic");
            match compiled {
                Ok(list) => {
                    self.install(Arc::new(list));
                    installed += 1;
                }
                Err(e) => {
                    tracing::error!(list = %name, version, error = %e, "list version does not compile here; serving the previous one");
                    self.refused.lock().expect("refused lock").insert(name, version);
                }
            }
        }
        Ok(installed)
    }

    /// Polls the store until `cancel`: edits made by other processes are
    /// served within one interval (plus their compilation).
    pub async fn poll(self: Arc<Self>, store: crate::store::SharedStore, cancel: CancellationToken) {
        let interval = Duration::from_millis(self.limits.poll_interval_ms.max(10));
        loop {
            if let Err(e) = self.refresh(store.as_ref()).await {
                tracing::warn!(error = %e, "polling list versions failed; retrying");
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(interval) => {}
            }
        }
    }
}

/// Live evaluations consult the version served now.
impl ListSource for ServedLists {
    fn list(&self, name: &str) -> Option<Arc<CompiledList>> {
        self.get(name)
    }
}
