//! Entity signals, counted: the signals the loaded plugins declare
//! (`[[signals]]` in their sidecars), each item added once when it is
//! created, and the values a snapshot reads.
//!
//! The counts are derived from the record. On one node they live in this
//! process ([`memory`]); with Redis configured, in Redis ([`redis`]),
//! shared by every process. Either way they are rebuilt from the stored
//! items of their window when a signal first appears (a plugin declaring
//! it loads, the process starts on the embedded default, or Redis is found
//! to have lost them), so a restart or a crash loses nothing. Items are
//! added after their creation commits, exactly once: a retried request
//! replays its stored response and creates nothing.
//!
//! A signal counts live the items created from the moment counting began
//! (`since`), and its rebuild adds the stored ones created before; until
//! the rebuild is done, [`SignalReading::complete`] says so.

mod memory;
mod redis;

use crate::clock::{Millis, now_ms};
use crate::coordinator::RedisConn;
use crate::domain::Phase;
use crate::domain::signals::{SignalItem, SignalSpec, SignalValues, SignalsConfig};
use crate::metrics::{KindLabel, Metrics, SignalLabel};
use crate::rules::{RegisteredPlugin, Registry};
use crate::store::{Item, SharedStore};
pub use memory::{MemoryCounts, Swept};
pub use redis::RedisCounts;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// Items read per page when a signal is rebuilt from the store.
const REBUILD_PAGE: i64 = 1000;

/// How long a rebuild waits before it reads the store, so an item created
/// just before counting began has committed (it is counted by the
/// rebuild, not live).
const REBUILD_DELAY: Duration = Duration::from_millis(1000);

/// How often the counts are swept (embedded) or checked for a loss (Redis).
const SWEEP_EVERY: Duration = Duration::from_secs(5);

/// Where one signal's counts are.
enum Counts {
    Memory(MemoryCounts),
    Redis(RedisCounts),
}

impl Counts {
    fn spec(&self) -> &SignalSpec {
        match self {
            Counts::Memory(c) => c.spec(),
            Counts::Redis(c) => c.spec(),
        }
    }

    /// Adds observations; returns how many keys a bound dropped.
    async fn add(
        &self,
        client: &str,
        at_ms: Millis,
        observations: &[(String, Option<String>)],
    ) -> Result<usize, String> {
        if observations.is_empty() {
            return Ok(0);
        }
        match self {
            Counts::Memory(c) => Ok(c.add(client, at_ms, observations)),
            Counts::Redis(c) => c
                .add(client, at_ms, observations)
                .await
                .map(|()| 0)
                .map_err(|e| e.to_string()),
        }
    }

    async fn values(&self, client: &str, keys: &[String], now: Millis) -> Result<Vec<u64>, String> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        match self {
            Counts::Memory(c) => Ok(c.values(client, keys, now)),
            Counts::Redis(c) => c.values(client, keys, now).await.map_err(|e| e.to_string()),
        }
    }
}

/// One signal being counted.
struct Tracked {
    counts: Counts,
    /// When counting began: items created from then on are counted live,
    /// the ones before by the rebuild.
    since: AtomicI64,
    /// Whether the rebuild is done.
    complete: AtomicBool,
}

impl Tracked {
    fn spec(&self) -> &SignalSpec {
        self.counts.spec()
    }
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
    /// (after a restart, just after the plugin declaring it loaded, or
    /// after Redis lost its counts).
    pub complete: bool,
}

/// Counts could not be read or written (Redis unreachable).
#[derive(Debug, Clone, thiserror::Error)]
#[error("signals unavailable: {0}")]
pub struct SignalsError(pub String);

/// The entity signals of this process.
pub struct Signals {
    registry: Arc<Registry>,
    store: SharedStore,
    config: SignalsConfig,
    metrics: Arc<Metrics>,
    /// With Redis: the connection and the key prefix.
    redis: Option<(RedisConn, String)>,
    active: RwLock<Active>,
}

impl Signals {
    /// Signals counted in this process, or in Redis when `redis_url` is
    /// set (`prefix` as the coordinator's).
    pub async fn open(
        registry: Arc<Registry>,
        store: SharedStore,
        config: SignalsConfig,
        metrics: Arc<Metrics>,
        redis: Option<(&str, &str)>,
    ) -> anyhow::Result<Arc<Self>> {
        let redis = match redis {
            Some((url, prefix)) => Some((RedisConn::open(url).await?, prefix.to_string())),
            None => None,
        };
        Ok(Arc::new(Signals {
            registry,
            store,
            config,
            metrics,
            redis,
            active: RwLock::default(),
        }))
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
            .map(|spec| match active.tracked.iter().find(|t| t.spec() == spec) {
                Some(kept) => kept.clone(),
                None => {
                    let counts = match &self.redis {
                        Some((conn, prefix)) => Counts::Redis(RedisCounts::new(spec.clone(), conn.clone(), prefix)),
                        None => Counts::Memory(MemoryCounts::new(spec.clone(), self.config.max_keys)),
                    };
                    let t = Arc::new(Tracked {
                        counts,
                        since: AtomicI64::new(now),
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
            self.metrics.signal_keys.remove(&label(gone.spec()));
            tracing::info!(signal = %gone.spec().name, "signal no longer declared by a loaded plugin: its counts are dropped");
        }
        active.tracked = Arc::new(tracked);
        active.plugins = Some(plugins);
        if !fresh.is_empty() {
            let this = self.clone();
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => {
                    rt.spawn(async move { this.begin(fresh, now).await });
                }
                Err(_) => tracing::warn!("signals appeared outside the runtime: not rebuilt from the store"),
            }
        }
        active.tracked.clone()
    }

    /// Starts counting signals that appeared at `now`: in this process, a
    /// rebuild; in Redis, a rebuild by the first process to begin (the
    /// others take its `since` and wait for its rebuild, see the sweep).
    async fn begin(self: Arc<Self>, fresh: Vec<Arc<Tracked>>, now: Millis) {
        let mut rebuild = Vec::new();
        for t in fresh {
            match &t.counts {
                Counts::Memory(_) => rebuild.push(t),
                Counts::Redis(r) => loop {
                    match r.begin(now).await {
                        Ok(Some(since)) => {
                            t.since.store(since, Ordering::Release);
                            rebuild.push(t.clone());
                            break;
                        }
                        Ok(None) => {
                            // Begun before (by another process, or by this
                            // one before a reload): take its `since`; the
                            // sweep marks it complete once its rebuild is.
                            if let Ok(Some(since)) = r.since().await {
                                t.since.store(since, Ordering::Release);
                            }
                            if r.ready().await.unwrap_or(false) {
                                t.complete.store(true, Ordering::Release);
                            }
                            break;
                        }
                        Err(e) => {
                            tracing::warn!(signal = %t.spec().name, error = %e, "cannot begin counting a signal in Redis; trying again");
                            tokio::time::sleep(Duration::from_secs(1)).await;
                        }
                    }
                },
            }
        }
        if !rebuild.is_empty() {
            self.rebuild(rebuild).await;
        }
    }

    /// Adds a newly created item to every signal (call once, after its
    /// creation committed). A signal whose counts cannot be written (Redis
    /// unreachable) misses the item, logged and counted in
    /// `gavel_host_errors_total{kind="signals"}`.
    pub async fn record(self: &Arc<Self>, item: &Item) {
        let tracked = self.tracked();
        if tracked.is_empty() {
            return;
        }
        let context = parse_context(&item.context);
        let view = SignalItem::new(&item.author, &item.body, &context);
        for t in tracked
            .iter()
            .filter(|t| item.created_at >= t.since.load(Ordering::Acquire))
        {
            let observations = t.spec().observations(&view);
            match t.counts.add(&item.client, item.created_at, &observations).await {
                Ok(0) => {}
                Ok(evicted) => {
                    self.metrics
                        .signal_evictions
                        .get_or_create(&label(t.spec()))
                        .inc_by(evicted as u64);
                }
                Err(e) => {
                    self.metrics
                        .host_errors
                        .get_or_create(&KindLabel { kind: "signals" })
                        .inc();
                    tracing::warn!(signal = %t.spec().name, item = %item.id, error = %e, "cannot count an item in a signal");
                }
            }
        }
    }

    /// The values, as of `now_ms`, of the signals declared by the plugins
    /// that run in `phase`, for an item (its keys each): what its snapshot
    /// carries. Nothing is read when no such plugin declares one.
    pub async fn values_for(
        self: &Arc<Self>,
        phase: Phase,
        client: &str,
        author: &str,
        text: &str,
        context: &str,
        now_ms: Millis,
    ) -> Result<SignalValues, SignalsError> {
        let tracked = self.tracked();
        if tracked.is_empty() {
            return Ok(SignalValues::new());
        }
        let plugins = self.registry.plugins();
        let declared = |name: &str| {
            plugins
                .iter()
                .any(|p| p.runs_in(phase) && p.signals.iter().any(|s| s.name == name))
        };
        let context = parse_context(context);
        let view = SignalItem::new(author, text, &context);
        let mut out = SignalValues::new();
        for t in tracked.iter().filter(|t| declared(&t.spec().name)) {
            let spec = t.spec();
            let keys = view.values(&spec.key);
            let values = t.counts.values(client, &keys, now_ms).await.map_err(SignalsError)?;
            out.insert(spec.name.clone(), keys.into_iter().zip(values).collect());
        }
        Ok(out)
    }

    /// [`Signals::values_for`] a stored item.
    pub async fn values_of(
        self: &Arc<Self>,
        phase: Phase,
        item: &Item,
        now_ms: Millis,
    ) -> Result<SignalValues, SignalsError> {
        self.values_for(phase, &item.client, &item.author, &item.body, &item.context, now_ms)
            .await
    }

    /// Signal `name`'s value for `key` of `client` now; `Ok(None)` when no
    /// loaded plugin declares it.
    pub async fn reading(
        self: &Arc<Self>,
        name: &str,
        client: &str,
        key: &str,
    ) -> Result<Option<SignalReading>, SignalsError> {
        let tracked = self.tracked();
        let Some(t) = tracked.iter().find(|t| t.spec().name == name) else {
            return Ok(None);
        };
        let spec = t.spec();
        let now = now_ms();
        let value = t
            .counts
            .values(client, &[key.to_string()], now)
            .await
            .map_err(SignalsError)?[0];
        Ok(Some(SignalReading {
            name: spec.name.clone(),
            key_field: spec.key.to_string(),
            count: String::from(spec.count.clone()),
            window_ms: spec.window_ms,
            key: key.to_string(),
            value,
            at_ms: now,
            complete: t.complete.load(Ordering::Acquire),
        }))
    }

    /// Begins counting the signals the loaded plugins declare now: their
    /// rebuild from the store starts, instead of on the first item.
    pub fn start(self: &Arc<Self>) {
        self.tracked();
    }

    /// The signals counted now.
    pub fn specs(self: &Arc<Self>) -> Vec<SignalSpec> {
        self.tracked().iter().map(|t| t.spec().clone()).collect()
    }

    /// Whether every signal counted now has been rebuilt.
    pub fn complete(self: &Arc<Self>) -> bool {
        self.tracked().iter().all(|t| t.complete.load(Ordering::Acquire))
    }

    /// Adds the stored items created before each signal's `since` (within
    /// its window) to it, then marks it complete (in Redis too, for the
    /// other processes). A store error is retried.
    async fn rebuild(self: &Arc<Self>, fresh: Vec<Arc<Tracked>>) {
        tokio::time::sleep(REBUILD_DELAY).await;
        let started = std::time::Instant::now();
        let since_of = |t: &Tracked| t.since.load(Ordering::Acquire);
        let until = fresh.iter().map(|t| since_of(t)).max().unwrap_or(0);
        let since = fresh
            .iter()
            .map(|t| t.spec().window().start(since_of(t)))
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
                let view = SignalItem::new(&item.author, &item.body, &context);
                for t in fresh.iter().filter(|t| item.created_at < since_of(t)) {
                    let observations = t.spec().observations(&view);
                    // Redis unreachable mid-rebuild: try the item again.
                    while let Err(e) = t.counts.add(&item.client, item.created_at, &observations).await {
                        tracing::warn!(signal = %t.spec().name, error = %e, "cannot rebuild a signal; trying again");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
            }
            items += page.len();
            match page.last() {
                Some(last) if page.len() as i64 == REBUILD_PAGE => after = Some(last.id.clone()),
                _ => break,
            }
        }
        for t in &fresh {
            if let Counts::Redis(r) = &t.counts {
                while let Err(e) = r.set_ready().await {
                    tracing::warn!(signal = %t.spec().name, error = %e, "cannot mark a signal rebuilt in Redis; trying again");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
            t.complete.store(true, Ordering::Release);
        }
        let names: Vec<&str> = fresh.iter().map(|t| t.spec().name.as_str()).collect();
        tracing::info!(signals = ?names, items, ms = started.elapsed().as_millis() as u64, "signals rebuilt from stored items");
    }

    /// Every few seconds until `cancel`: drops what has left every window
    /// and enforces the memory bound (in this process), or notices that
    /// Redis lost a signal's counts and rebuilds them (the first process to
    /// notice does) and that another process's rebuild is done.
    pub async fn sweep_loop(self: Arc<Self>, cancel: tokio_util::sync::CancellationToken) {
        loop {
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = tokio::time::sleep(SWEEP_EVERY) => {}
            }
            self.sweep(now_ms());
            self.check_redis().await;
        }
    }

    /// One sweep of the counts held in this process (see
    /// [`Signals::sweep_loop`]); sets the signal metrics.
    pub fn sweep(self: &Arc<Self>, now: Millis) {
        let tracked = self.tracked();
        let memory: Vec<(&Arc<Tracked>, &MemoryCounts)> = tracked
            .iter()
            .filter_map(|t| match &t.counts {
                Counts::Memory(c) => Some((t, c)),
                Counts::Redis(_) => None,
            })
            .collect();
        if memory.is_empty() {
            return;
        }
        let mut swept: Vec<Swept> = memory.iter().map(|(_, c)| c.sweep(now)).collect();
        let mut total: usize = swept.iter().map(|s| s.bytes).sum();
        // Over the memory bound: shed the least recent keys of every
        // signal, in proportion, until under it.
        while total > self.config.max_memory_bytes && swept.iter().any(|s| s.keys > 0) {
            let fraction = (1.0 - self.config.max_memory_bytes as f64 / total as f64).clamp(0.05, 1.0);
            for ((t, c), s) in memory.iter().zip(swept.iter_mut()) {
                let evicted = c.shed(fraction);
                if evicted > 0 {
                    self.metrics
                        .signal_evictions
                        .get_or_create(&label(t.spec()))
                        .inc_by(evicted as u64);
                }
                *s = c.sweep(now);
            }
            total = swept.iter().map(|s| s.bytes).sum();
        }
        for ((t, _), s) in memory.iter().zip(&swept) {
            self.metrics
                .signal_keys
                .get_or_create(&label(t.spec()))
                .set(s.keys as i64);
        }
        self.metrics.signal_memory_bytes.set(total as i64);
    }

    /// Redis's side of a sweep: a signal whose `since` is gone lost its
    /// counts (Redis restarted empty, or evicted them) and is begun and
    /// rebuilt again; one whose rebuild another process finished is
    /// complete.
    async fn check_redis(self: &Arc<Self>) {
        let tracked = self.tracked();
        let mut lost = Vec::new();
        for t in tracked.iter() {
            let Counts::Redis(r) = &t.counts else { continue };
            match r.since().await {
                Ok(Some(since)) => {
                    t.since.store(since, Ordering::Release);
                    if !t.complete.load(Ordering::Acquire) && r.ready().await.unwrap_or(false) {
                        t.complete.store(true, Ordering::Release);
                    }
                }
                Ok(None) => {
                    tracing::warn!(signal = %t.spec().name, "Redis lost a signal's counts: rebuilding them from the store");
                    t.complete.store(false, Ordering::Release);
                    lost.push(t.clone());
                }
                Err(e) => tracing::warn!(signal = %t.spec().name, error = %e, "cannot check a signal in Redis"),
            }
        }
        if !lost.is_empty() {
            let this = self.clone();
            tokio::spawn(async move { this.begin(lost, now_ms()).await });
        }
    }
}

fn label(spec: &SignalSpec) -> SignalLabel {
    SignalLabel {
        signal: spec.name.clone(),
    }
}

/// A stored `context` (JSON text) as an object; anything else as empty.
pub(crate) fn parse_context(json: &str) -> serde_json::Map<String, serde_json::Value> {
    match serde_json::from_str(json) {
        Ok(serde_json::Value::Object(map)) => map,
        _ => serde_json::Map::new(),
    }
}
