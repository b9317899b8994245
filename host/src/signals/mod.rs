//! Entity signals, counted: the signals the loaded plugins declare
//! (`[[signals]]` in their sidecars), each item added once when it is
//! created, and the values a snapshot reads.
//!
//! The counts are derived from the record: they live in this process
//! ([`memory`]) and are rebuilt from the stored items of their window when
//! a signal first appears (a plugin declaring it loads, or the process
//! starts), so a restart or a crash loses nothing. Items are added after
//! their creation commits, exactly once: a retried request replays its
//! stored response and creates nothing.
//!
//! A new signal counts live the items created from the moment it appears,
//! and a rebuild adds the stored ones created before that moment; until
//! the rebuild is done, [`SignalReading::complete`] says so.

mod memory;

use crate::clock::{Millis, now_ms};
use crate::domain::signals::{SignalItem, SignalSpec, SignalValues, SignalsConfig};
use crate::metrics::{Metrics, SignalLabel};
use crate::rules::{RegisteredPlugin, Registry};
use crate::store::{Item, SharedStore};
use memory::MemoryCounts;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// Items read per page when a signal is rebuilt from the store.
const REBUILD_PAGE: i64 = 1000;

/// How long a rebuild waits before it reads the store, so an item created
/// just before the signal appeared has committed (it is counted by the
/// rebuild, not live).
const REBUILD_DELAY: Duration = Duration::from_millis(1000);

/// One signal being counted.
struct Tracked {
    counts: MemoryCounts,
    /// When it appeared: items created from then on are counted live, the
    /// ones before by the rebuild.
    since: Millis,
    /// Whether the rebuild is done.
    complete: AtomicBool,
}

/// The signals counted now, and the plugin set they were read from.
#[derive(Default)]
struct Active {
    plugins: Option<Arc<Vec<Arc<RegisteredPlugin>>>>,
    tracked: Arc<Vec<Arc<Tracked>>>,
}

/// A signal's value for one key, as the API reports it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, utoipa::ToSchema)]
pub struct SignalReading {
    pub name: String,
    /// `author`, `link-domain` or `context.NAME`.
    pub key_field: String,
    /// `items` or `distinct FIELD`.
    pub count: String,
    pub window_ms: i64,
    pub key: String,
    pub value: u64,
    /// When the value was read, milliseconds since the Unix epoch.
    pub at_ms: Millis,
    /// False while the signal is still being rebuilt from stored items
    /// (after a restart, or just after the plugin declaring it loaded).
    pub complete: bool,
}

/// The entity signals of this process.
pub struct Signals {
    registry: Arc<Registry>,
    store: SharedStore,
    config: SignalsConfig,
    metrics: Arc<Metrics>,
    active: RwLock<Active>,
}

impl Signals {
    pub fn new(registry: Arc<Registry>, store: SharedStore, config: SignalsConfig, metrics: Arc<Metrics>) -> Arc<Self> {
        Arc::new(Signals {
            registry,
            store,
            config,
            metrics,
            active: RwLock::default(),
        })
    }

    /// The signals counted now, in step with the loaded plugins: a signal
    /// that appears starts counting (and its rebuild), one no plugin
    /// declares any more is dropped. Cheap when nothing changed (a pointer
    /// comparison).
    fn tracked(self: &Arc<Self>) -> Arc<Vec<Arc<Tracked>>> {
        let plugins = self.registry.plugins();
        {
            let active = self.active.read().expect("not poisoned");
            if active.plugins.as_ref().is_some_and(|p| Arc::ptr_eq(p, &plugins)) {
                return active.tracked.clone();
            }
        }
        let mut active = self.active.write().expect("not poisoned");
        if active.plugins.as_ref().is_some_and(|p| Arc::ptr_eq(p, &plugins)) {
            return active.tracked.clone();
        }
        let mut specs: Vec<&SignalSpec> = Vec::new();
        for spec in plugins.iter().flat_map(|p| &p.signals) {
            if !specs.iter().any(|s| s.name == spec.name) {
                specs.push(spec);
            }
        }
        specs.sort_by(|a, b| a.name.cmp(&b.name));
        let now = now_ms();
        let mut fresh = Vec::new();
        let tracked: Vec<Arc<Tracked>> = specs
            .into_iter()
            .map(|spec| match active.tracked.iter().find(|t| t.counts.spec() == spec) {
                Some(kept) => kept.clone(),
                None => {
                    let t = Arc::new(Tracked {
                        counts: MemoryCounts::new(spec.clone(), self.config.max_keys),
                        since: now,
                        complete: AtomicBool::new(false),
                    });
                    fresh.push(t.clone());
                    t
                }
            })
            .collect();
        for gone in active
            .tracked
            .iter()
            .filter(|t| !tracked.iter().any(|k| Arc::ptr_eq(k, t)))
        {
            self.metrics.signal_keys.remove(&label(gone.counts.spec()));
            tracing::info!(signal = %gone.counts.spec().name, "signal no longer declared by a loaded plugin: its counts are dropped");
        }
        active.tracked = Arc::new(tracked);
        active.plugins = Some(plugins);
        if !fresh.is_empty() {
            let this = self.clone();
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => {
                    rt.spawn(async move { this.rebuild(fresh).await });
                }
                Err(_) => tracing::warn!("signals appeared outside the runtime: not rebuilt from the store"),
            }
        }
        active.tracked.clone()
    }

    /// Adds a newly created item to every signal (call once, after its
    /// creation committed).
    pub fn record(self: &Arc<Self>, item: &Item) {
        let tracked = self.tracked();
        if tracked.is_empty() {
            return;
        }
        let context = parse_context(&item.context);
        let view = SignalItem {
            author: &item.author,
            text: &item.body,
            context: &context,
        };
        for t in tracked.iter().filter(|t| item.created_at >= t.since) {
            let observations = t.counts.spec().observations(&view);
            let evicted = t.counts.add(&item.client, item.created_at, &observations);
            if evicted > 0 {
                self.metrics
                    .signal_evictions
                    .get_or_create(&label(t.counts.spec()))
                    .inc_by(evicted as u64);
            }
        }
    }

    /// The values of every declared signal for an item (its keys each),
    /// as of `now_ms`: what its snapshot carries.
    pub fn values_for(
        self: &Arc<Self>,
        client: &str,
        author: &str,
        text: &str,
        context: &str,
        now_ms: Millis,
    ) -> SignalValues {
        let tracked = self.tracked();
        if tracked.is_empty() {
            return SignalValues::new();
        }
        let context = parse_context(context);
        let view = SignalItem {
            author,
            text,
            context: &context,
        };
        tracked
            .iter()
            .map(|t| {
                let spec = t.counts.spec();
                let keys = view.values(&spec.key);
                let values = t.counts.values(client, &keys, now_ms);
                (spec.name.clone(), keys.into_iter().zip(values).collect())
            })
            .collect()
    }

    /// [`Signals::values_for`] a stored item.
    pub fn values_of(self: &Arc<Self>, item: &Item, now_ms: Millis) -> SignalValues {
        self.values_for(&item.client, &item.author, &item.body, &item.context, now_ms)
    }

    /// Signal `name`'s value for `key` of `client` now; `None` when no
    /// loaded plugin declares it.
    pub fn reading(self: &Arc<Self>, name: &str, client: &str, key: &str) -> Option<SignalReading> {
        let tracked = self.tracked();
        let t = tracked.iter().find(|t| t.counts.spec().name == name)?;
        let spec = t.counts.spec();
        let now = now_ms();
        Some(SignalReading {
            name: spec.name.clone(),
            key_field: spec.key.to_string(),
            count: String::from(spec.count.clone()),
            window_ms: spec.window_ms,
            key: key.to_string(),
            value: t.counts.values(client, &[key.to_string()], now)[0],
            at_ms: now,
            complete: t.complete.load(Ordering::Acquire),
        })
    }

    /// The signals counted now.
    pub fn specs(self: &Arc<Self>) -> Vec<SignalSpec> {
        self.tracked().iter().map(|t| t.counts.spec().clone()).collect()
    }

    /// Whether every signal counted now has been rebuilt.
    pub fn complete(self: &Arc<Self>) -> bool {
        self.tracked().iter().all(|t| t.complete.load(Ordering::Acquire))
    }

    /// Adds the stored items created before each signal appeared (within
    /// its window) to it, then marks it complete. A store error is retried.
    async fn rebuild(self: Arc<Self>, fresh: Vec<Arc<Tracked>>) {
        tokio::time::sleep(REBUILD_DELAY).await;
        let started = std::time::Instant::now();
        let until = fresh.iter().map(|t| t.since).max().unwrap_or(0);
        let since = fresh
            .iter()
            .map(|t| t.counts.spec().window().start(t.since))
            .min()
            .unwrap_or(until);
        let mut after: Option<String> = None;
        let mut items = 0usize;
        loop {
            let page = match self
                .store
                .items_created(since, until, after.as_deref(), REBUILD_PAGE)
                .await
            {
                Ok(page) => page,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read stored items to rebuild signals; trying again");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            };
            for item in &page {
                let context = parse_context(&item.context);
                let view = SignalItem {
                    author: &item.author,
                    text: &item.body,
                    context: &context,
                };
                for t in fresh.iter().filter(|t| item.created_at < t.since) {
                    let observations = t.counts.spec().observations(&view);
                    t.counts.add(&item.client, item.created_at, &observations);
                }
            }
            items += page.len();
            match page.last() {
                Some(last) if page.len() as i64 == REBUILD_PAGE => after = Some(last.id.clone()),
                _ => break,
            }
        }
        for t in &fresh {
            t.complete.store(true, Ordering::Release);
        }
        let names: Vec<&str> = fresh.iter().map(|t| t.counts.spec().name.as_str()).collect();
        tracing::info!(signals = ?names, items, ms = started.elapsed().as_millis() as u64, "signals rebuilt from stored items");
    }

    /// Drops what has left every window, enforces the memory bound and
    /// updates the metrics, every few seconds until `cancel`.
    pub async fn sweep_loop(self: Arc<Self>, cancel: tokio_util::sync::CancellationToken) {
        loop {
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = tokio::time::sleep(Duration::from_secs(5)) => {}
            }
            self.sweep(now_ms());
        }
    }

    /// One sweep (see [`Signals::sweep_loop`]).
    pub fn sweep(self: &Arc<Self>, now: Millis) {
        let tracked = self.tracked();
        let mut swept: Vec<memory::Swept> = tracked.iter().map(|t| t.counts.sweep(now)).collect();
        let mut total: usize = swept.iter().map(|s| s.bytes).sum();
        // Over the memory bound: shed the least recent keys of every
        // signal, in proportion, until under it.
        while total > self.config.max_memory_bytes && swept.iter().any(|s| s.keys > 0) {
            let fraction = (1.0 - self.config.max_memory_bytes as f64 / total as f64).clamp(0.05, 1.0);
            for (t, s) in tracked.iter().zip(swept.iter_mut()) {
                let evicted = t.counts.shed(fraction);
                if evicted > 0 {
                    self.metrics
                        .signal_evictions
                        .get_or_create(&label(t.counts.spec()))
                        .inc_by(evicted as u64);
                }
                *s = t.counts.sweep(now);
            }
            total = swept.iter().map(|s| s.bytes).sum();
        }
        for (t, s) in tracked.iter().zip(&swept) {
            self.metrics
                .signal_keys
                .get_or_create(&label(t.counts.spec()))
                .set(s.keys as i64);
        }
        self.metrics.signal_memory_bytes.set(total as i64);
    }
}

fn label(spec: &SignalSpec) -> SignalLabel {
    SignalLabel {
        signal: spec.name.clone(),
    }
}

/// A stored `context` (JSON text) as an object; anything else as empty.
fn parse_context(json: &str) -> serde_json::Map<String, serde_json::Value> {
    match serde_json::from_str(json) {
        Ok(serde_json::Value::Object(map)) => map,
        _ => serde_json::Map::new(),
    }
}
