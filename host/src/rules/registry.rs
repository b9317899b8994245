//! The set of loaded plugins: `name → Arc<RegisteredPlugin>`, swapped
//! atomically. An evaluation holds its `Arc`, so a reload never changes a
//! plugin under a running evaluation.

use super::{Breaker, HostError, LoadedPlugin, RuleEngine};
use crate::clock::now_ms;
use crate::domain::signals::SignalSpec;
use crate::domain::{Digest, Mode, Phase, PluginEvent};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

/// Sidecars larger than this are refused (a sidecar is a few lines of TOML).
const MAX_SIDECAR_BYTES: u64 = 64 << 10;

/// A plugin's sidecar `NAME.toml`, next to `NAME.wasm`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct Manifest {
    /// `enforce` (decisions count) or `shadow` (recorded, never applied).
    pub mode: Mode,
    /// A disabled plugin is loaded and validated but never evaluated.
    pub enabled: bool,
    /// Overrides the phases the plugin declares.
    pub phases: Option<Vec<Phase>>,
    pub limits: ManifestLimits,
    /// Keep instances between evaluations instead of a fresh one each time:
    /// much faster for rules with a costly start-up (Python: ~1.4 ms → ~25
    /// µs), at the price of isolation: whatever one evaluation leaves in the
    /// rule's memory (globals, caches) is visible to the next. An instance
    /// that trapped, timed out or hit the memory cap is discarded.
    pub reuse_instances: bool,
    /// Passed to the rule as `snapshot.config` (values as strings; lists comma-joined).
    pub config: toml::Table,
    /// The entity signals the rule reads (`[[signals]]`), counted by the
    /// host from the moment a plugin declaring them loads (and rebuilt
    /// from stored items for their window).
    #[serde(skip_serializing)]
    pub signals: Vec<crate::domain::signals::SignalDeclaration>,
}

impl Default for Manifest {
    fn default() -> Self {
        Manifest {
            mode: Mode::Enforce,
            enabled: true,
            phases: None,
            limits: ManifestLimits::default(),
            reuse_instances: false,
            config: toml::Table::new(),
            signals: Vec::new(),
        }
    }
}

/// Per-plugin limit overrides.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ManifestLimits {
    pub async_deadline_ms: Option<u64>,
    pub sync_deadline_ms: Option<u64>,
    pub memory_bytes: Option<usize>,
}

impl Manifest {
    /// Reads `NAME.toml` next to `wasm`, or the defaults when there is none.
    /// A sidecar that is a symbolic link, or larger than 64 KiB, is refused.
    pub fn for_component(wasm: &Path) -> Result<Manifest, String> {
        let path = wasm.with_extension("toml");
        match read_regular_file(&path, MAX_SIDECAR_BYTES) {
            Ok(bytes) => {
                let text = String::from_utf8(bytes).map_err(|_| format!("{}: not UTF-8", path.display()))?;
                toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Manifest::default()),
            Err(e) => Err(format!("{}: {e}", path.display())),
        }
    }

    /// The declared signals, checked: at most
    /// [`crate::domain::signals::MAX_SIGNALS_PER_PLUGIN`], each name once.
    pub fn signal_specs(&self) -> Result<Vec<SignalSpec>, String> {
        use crate::domain::signals::MAX_SIGNALS_PER_PLUGIN;
        if self.signals.len() > MAX_SIGNALS_PER_PLUGIN {
            return Err(format!(
                "{} signals declared; at most {MAX_SIGNALS_PER_PLUGIN}",
                self.signals.len()
            ));
        }
        let mut specs: Vec<SignalSpec> = Vec::new();
        for d in &self.signals {
            let spec = SignalSpec::parse(d)?;
            if specs.iter().any(|s| s.name == spec.name) {
                return Err(format!("signal {} declared twice", spec.name));
            }
            specs.push(spec);
        }
        Ok(specs)
    }

    /// The `config` table as the string pairs a rule receives.
    pub fn config_pairs(&self) -> Result<Vec<(String, String)>, String> {
        self.config
            .iter()
            .map(|(k, v)| {
                let json = serde_json::to_value(v).map_err(|e| format!("config `{k}`: {e}"))?;
                gavel_plugin_sdk::spec::config_value_string(&json)
                    .map(|s| (k.clone(), s))
                    .ok_or_else(|| format!("config `{k}`: use a string, number, boolean or list of those"))
            })
            .collect()
    }
}

/// A loaded plugin with its settings.
#[derive(Debug)]
pub struct RegisteredPlugin {
    pub plugin: LoadedPlugin,
    pub mode: Mode,
    pub enabled: bool,
    pub phases: Vec<Phase>,
    pub config: Vec<(String, String)>,
    /// The entity signals it reads.
    pub signals: Vec<SignalSpec>,
    pub deadline_async: Duration,
    pub deadline_sync: Duration,
    pub memory_bytes: usize,
    /// Idle instances kept for reuse, when the sidecar opts in.
    pub instances: Option<super::InstancePool>,
    pub loaded_at_ms: i64,
    /// Quarantines the plugin when it fails too often, and lets a probe
    /// through after a cool-down.
    pub breaker: Breaker,
    /// Asynchronous evaluations of this version in this process.
    pub evaluations: AtomicU64,
    /// For a shadow plugin: evaluations whose verdict would have given the
    /// item another status than the enforcing plugins did.
    pub disagreements: AtomicU64,
}

impl RegisteredPlugin {
    /// Evaluates under this plugin's deadline for `phase` and memory cap, on
    /// a fresh instance or (when opted in) a reused one; its list calls
    /// answered from the lists the engine serves, its signal calls from
    /// `signals` (the item's values of the signals it declares).
    pub fn evaluate(
        &self,
        engine: &super::RuleEngine,
        snapshot: &super::Snapshot,
        phase: Phase,
        signals: Option<&Arc<super::SignalValues>>,
    ) -> Result<super::Evaluation, HostError> {
        let inputs = super::CallInputs {
            lists: engine.served_lists(),
            signals,
        };
        self.run(engine, snapshot, phase, inputs)
    }

    /// [`RegisteredPlugin::evaluate`], the rule's list and signal calls
    /// answered from `inputs` instead: a replay's list versions of the
    /// time and the signal values its snapshot stored. Passed per
    /// evaluation, so the live path pays nothing for it.
    pub fn evaluate_from(
        &self,
        engine: &super::RuleEngine,
        snapshot: &super::Snapshot,
        phase: Phase,
        inputs: super::CallInputs<'_>,
    ) -> Result<super::Evaluation, HostError> {
        self.run(engine, snapshot, phase, inputs)
    }

    fn run(
        &self,
        engine: &super::RuleEngine,
        snapshot: &super::Snapshot,
        phase: Phase,
        inputs: super::CallInputs<'_>,
    ) -> Result<super::Evaluation, HostError> {
        let deadline = match phase {
            Phase::Sync => self.deadline_sync,
            Phase::Async => self.deadline_async,
        };
        match &self.instances {
            Some(pool) => engine.evaluate_pooled(&self.plugin, pool, snapshot, deadline, self.memory_bytes, inputs),
            None => engine.evaluate_fresh(&self.plugin, snapshot, deadline, self.memory_bytes, inputs),
        }
    }

    /// This plugin's view of an item's signal values: the signals it
    /// declares (each present, empty when the item has no key for it);
    /// `None` when it declares none.
    pub fn signal_values(&self, all: &super::SignalValues) -> Option<Arc<super::SignalValues>> {
        if self.signals.is_empty() {
            return None;
        }
        Some(Arc::new(
            self.signals
                .iter()
                .map(|s| (s.name.clone(), all.get(&s.name).cloned().unwrap_or_default()))
                .collect(),
        ))
    }

    /// Whether this plugin runs in `phase` (enabled and declared; its
    /// breaker decides per evaluation).
    pub fn runs_in(&self, phase: Phase) -> bool {
        self.enabled && self.phases.contains(&phase)
    }
}

/// A file that did not load, and why.
#[derive(Debug, Clone, Serialize)]
pub struct LoadFailure {
    pub path: PathBuf,
    pub error: String,
    pub at_ms: i64,
}

/// What a plugin file provided at the last scan.
#[derive(Debug, Clone, PartialEq)]
struct FileState {
    /// sha256 of the component file and of its sidecar (if any; a sidecar
    /// that cannot be read is remembered by its error, so fixing it reloads).
    digest: Digest,
    sidecar: Option<Result<Digest, String>>,
    /// The plugin it serves, if it loaded.
    serves: Option<String>,
    /// Length and modification time of the file and its sidecar at that
    /// scan: a later scan that finds both unchanged reads nothing.
    stat: FileStat,
}

type FileStat = (
    Option<(u64, std::time::SystemTime)>,
    Option<(u64, std::time::SystemTime)>,
);

fn file_stat(path: &Path) -> FileStat {
    let stat = |p: &Path| {
        std::fs::metadata(p)
            .ok()
            .and_then(|m| Some((m.len(), m.modified().ok()?)))
    };
    (stat(path), stat(&path.with_extension("toml")))
}

/// A file seen changing recently fails to load only once it has settled:
/// a file still being written (no atomic rename) is retried, not reported.
const SETTLE_MS: i64 = 50;
/// A file that still does not load this long after its last change is reported.
const SETTLE_TIMEOUT_MS: i64 = 5_000;

/// The loaded plugins, in step with the plugin directory.
pub struct Registry {
    engine: Arc<RuleEngine>,
    plugins: RwLock<Arc<Vec<Arc<RegisteredPlugin>>>>,
    failures: RwLock<BTreeMap<PathBuf, LoadFailure>>,
    /// Serialises directory scans (the watcher's and start-up's).
    files: Mutex<BTreeMap<PathBuf, FileState>>,
    events: Option<tokio::sync::mpsc::UnboundedSender<PluginEvent>>,
}

impl Registry {
    pub fn new(engine: Arc<RuleEngine>) -> Self {
        Registry {
            engine,
            plugins: RwLock::new(Arc::new(Vec::new())),
            failures: RwLock::new(BTreeMap::new()),
            files: Mutex::new(BTreeMap::new()),
            events: None,
        }
    }

    /// Reports every load, unload, quarantine and failure to `events`
    /// (gavel writes them to `plugin_versions`).
    pub fn with_events(mut self, events: tokio::sync::mpsc::UnboundedSender<PluginEvent>) -> Self {
        self.events = Some(events);
        self
    }

    pub fn engine(&self) -> &Arc<RuleEngine> {
        &self.engine
    }

    /// The current plugins, ordered by name. Cheap: one `Arc` clone.
    pub fn plugins(&self) -> Arc<Vec<Arc<RegisteredPlugin>>> {
        self.plugins.read().expect("registry lock poisoned").clone()
    }

    /// Files that currently fail to load (whatever served before keeps serving).
    pub fn failures(&self) -> Vec<LoadFailure> {
        self.failures
            .read()
            .expect("registry lock poisoned")
            .values()
            .cloned()
            .collect()
    }

    fn emit(&self, event: PluginEvent) {
        if let Some(tx) = &self.events {
            let _ = tx.send(event);
        }
    }

    /// Records a change of `plugin`'s breaker in the plugin history.
    pub fn breaker_changed(&self, plugin: &RegisteredPlugin, change: &super::BreakerChange) {
        let (name, digest, at) = (
            plugin.plugin.info.name.clone(),
            plugin.plugin.stamp.digest.to_hex(),
            now_ms(),
        );
        self.emit(match change {
            super::BreakerChange::Opened { detail } => PluginEvent::Quarantined {
                name,
                digest,
                detail: detail.clone(),
                at,
            },
            super::BreakerChange::Recovered => PluginEvent::Recovered { name, digest, at },
        });
    }

    /// Loads the directory at start-up: [`Registry::sync_dir`] until every
    /// file has settled (files still being written are waited for, up to the
    /// settle timeout), so gavel starts serving with its plugins loaded.
    pub fn load_dir(&self, dir: &Path) -> std::io::Result<()> {
        let deadline = std::time::Instant::now() + Duration::from_millis(SETTLE_TIMEOUT_MS as u64 * 2);
        while self.sync_dir(dir)? && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(SETTLE_MS as u64));
        }
        Ok(())
    }

    /// Brings the registry in step with `dir`: loads new and changed
    /// `*.wasm` files (and sidecars) found directly in it (subdirectories are
    /// ignored), unloads deleted ones, refuses precompiled `.cwasm` files.
    /// A file that fails keeps the previous version of its plugin serving.
    /// Blocking (compiles): call from a blocking thread. Returns `true` when
    /// some file has not settled yet and the scan should run again shortly.
    pub fn sync_dir(&self, dir: &Path) -> std::io::Result<bool> {
        let mut files = self.files.lock().expect("registry lock poisoned");
        let mut present = Vec::new();
        let mut unsettled = false;
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            let path = entry.path();
            let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
            if !(ext == "wasm" || ext == "cwasm") || file_name(&path).starts_with('.') {
                continue;
            }
            // Not followed: a link could point anywhere on the machine.
            if entry.file_type()?.is_symlink() {
                present.push(path.clone());
                self.fail(
                    &path,
                    None,
                    "a symbolic link; plugin files are read only as regular files".into(),
                );
                continue;
            }
            if !entry.file_type()?.is_file() {
                continue;
            }
            present.push(path.clone());
            unsettled |= self.sync_file(&mut files, &path);
        }
        let gone: Vec<PathBuf> = files.keys().filter(|p| !present.contains(p)).cloned().collect();
        for path in gone {
            if let Some(state) = files.remove(&path)
                && let Some(name) = state.serves
            {
                tracing::info!(plugin = %name, path = %path.display(), "plugin file deleted: unloaded");
                self.swap(Some(&name), None);
            }
            self.failures.write().expect("registry lock poisoned").remove(&path);
        }
        Ok(unsettled)
    }

    /// Loads one file if it changed; returns `true` if it has not settled.
    fn sync_file(&self, files: &mut BTreeMap<PathBuf, FileState>, path: &Path) -> bool {
        // Unchanged length and time: unchanged file. Trusted only for a file
        // last modified over a second ago, since a rewrite within the file
        // system's timestamp granularity can keep both.
        let stat = file_stat(path);
        let quiet = stat.0.is_some()
            && [stat.0, stat.1]
                .iter()
                .flatten()
                .all(|(_, t)| t.elapsed().is_ok_and(|age| age > Duration::from_secs(1)));
        if quiet && files.get(path).is_some_and(|p| p.stat == stat) {
            return false;
        }
        let now = now_ms();
        let modified_ms = std::fs::metadata(path)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_millis() as i64);
        let age = now - modified_ms;
        let bytes = match read_limited(path, self.engine.limits().max_file_bytes) {
            Ok(b) => b,
            Err(error) => {
                self.fail(path, None, error);
                return false;
            }
        };
        let digest = Digest::of(&bytes);
        let sidecar = match read_regular_file(&path.with_extension("toml"), MAX_SIDECAR_BYTES) {
            Ok(b) => Some(Ok(Digest::of(&b))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => Some(Err(e.to_string())),
        };
        let previous = files.get(path).cloned();
        if previous
            .as_ref()
            .is_some_and(|p| p.digest == digest && p.sidecar == sidecar)
        {
            return false;
        }
        if age < SETTLE_MS {
            // Still being written, perhaps: look again once it is quiet.
            return true;
        }
        let serves_before = previous.and_then(|p| p.serves);
        // What this scan saw of the file, whichever way its load went.
        let seen = |serves: Option<String>| FileState {
            digest,
            sidecar: sidecar.clone(),
            serves,
            stat,
        };
        let loaded = self.load_one(path, &bytes);
        drop(bytes);
        super::plugin::release_freed_heap();
        match loaded {
            Ok(p) => {
                let name = p.plugin.info.name.clone();
                let taken_by = files
                    .iter()
                    .find(|(other, st)| other.as_path() != path && st.serves.as_deref() == Some(name.as_str()))
                    .map(|(other, _)| other.clone());
                if let Some(other) = taken_by {
                    let error = format!(
                        "plugin name {name:?} is already loaded from {}; refused",
                        other.display()
                    );
                    self.fail(path, Some(digest), error);
                    files.insert(path.to_path_buf(), seen(serves_before));
                    return false;
                }
                tracing::info!(
                    plugin = %name, version = %p.plugin.info.version, digest = %p.plugin.stamp.digest,
                    mode = p.mode.as_str(), path = %path.display(), from_cache = p.plugin.from_cache,
                    compile_ms = p.plugin.compile_time.as_millis() as u64, "rule.reload: plugin loaded"
                );
                if let Some(old) = serves_before.as_deref().filter(|old| *old != name) {
                    self.swap(Some(old), None);
                }
                self.swap(Some(&name), Some(Arc::new(p)));
                self.failures.write().expect("registry lock poisoned").remove(path);
                files.insert(path.to_path_buf(), seen(Some(name)));
                false
            }
            // A busy host is not a bad file: look again shortly.
            Err(error) if error.contains(super::plugin::BUSY) => {
                tracing::debug!(path = %path.display(), %error, "plugin not loaded yet: the host is busy");
                true
            }
            Err(error) if age < SETTLE_TIMEOUT_MS => {
                tracing::debug!(path = %path.display(), %error, "plugin file not loadable yet; waiting for it to settle");
                true
            }
            Err(error) => {
                self.fail(path, Some(digest), error);
                files.insert(path.to_path_buf(), seen(serves_before));
                false
            }
        }
    }

    /// Replaces (or removes) the plugin called `name`, atomically for readers.
    fn swap(&self, name: Option<&str>, new: Option<Arc<RegisteredPlugin>>) {
        let mut guard = self.plugins.write().expect("registry lock poisoned");
        let mut next: Vec<Arc<RegisteredPlugin>> = guard.iter().cloned().collect();
        let now = now_ms();
        if let Some(name) = name
            && let Some(i) = next.iter().position(|p| p.plugin.info.name == name)
        {
            let old = next.remove(i);
            self.emit(PluginEvent::Unloaded {
                name: old.plugin.info.name.clone(),
                digest: old.plugin.stamp.digest.to_hex(),
                at: now,
            });
        }
        if let Some(p) = new {
            self.emit(PluginEvent::Loaded {
                name: p.plugin.info.name.clone(),
                version: p.plugin.info.version.clone(),
                digest: p.plugin.stamp.digest.to_hex(),
                path: p.plugin.path.display().to_string(),
                mode: p.mode,
                at: p.loaded_at_ms,
            });
            next.push(p);
            next.sort_by(|a, b| a.plugin.info.name.cmp(&b.plugin.info.name));
        }
        *guard = Arc::new(next);
    }

    fn fail(&self, path: &Path, digest: Option<Digest>, error: String) {
        let mut failures = self.failures.write().expect("registry lock poisoned");
        if failures.get(path).is_some_and(|f| f.error == error) {
            return;
        }
        tracing::error!(path = %path.display(), %error, "rule.reload: plugin not loaded; the previous version keeps serving");
        let at = now_ms();
        self.emit(PluginEvent::Failed {
            path: path.display().to_string(),
            digest: digest.map(|d| d.to_hex()),
            error: error.clone(),
            at,
        });
        failures.insert(
            path.to_path_buf(),
            LoadFailure {
                path: path.to_path_buf(),
                error,
                at_ms: at,
            },
        );
    }

    /// A component file prepared as it would be deployed (its sidecar's
    /// config and limits), but not registered: a backtest's candidate.
    /// Blocking (compilation).
    pub fn prepare_file(&self, path: &Path) -> Result<RegisteredPlugin, String> {
        let bytes = read_regular_file(path, self.engine.limits().max_file_bytes)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        self.load_one(path, &bytes)
    }

    /// A copy of a registered plugin with the same code, config and limits
    /// but its own instances, breaker and counters: a backtest's candidate
    /// never shares a reused instance (or a quarantine) with live traffic.
    pub fn detached(&self, p: &RegisteredPlugin) -> RegisteredPlugin {
        let limits = self.engine.limits();
        RegisteredPlugin {
            plugin: p.plugin.clone(),
            mode: p.mode,
            enabled: p.enabled,
            phases: p.phases.clone(),
            config: p.config.clone(),
            signals: p.signals.clone(),
            deadline_async: p.deadline_async,
            deadline_sync: p.deadline_sync,
            memory_bytes: p.memory_bytes,
            instances: p.instances.as_ref().map(|_| super::InstancePool::new(1)),
            loaded_at_ms: p.loaded_at_ms,
            breaker: Breaker::new(limits.breaker.clone()),
            evaluations: AtomicU64::new(0),
            disagreements: AtomicU64::new(0),
        }
    }

    /// A compiled plugin prepared with the default settings (no sidecar):
    /// a candidate from the compilation cache.
    pub fn prepare_loaded(&self, plugin: LoadedPlugin) -> RegisteredPlugin {
        self.register_with(
            plugin,
            &Manifest::default(),
            (Vec::new(), Vec::new()),
            self.engine.limits().memory_bytes,
        )
    }

    fn load_one(&self, path: &Path, bytes: &[u8]) -> Result<RegisteredPlugin, String> {
        let manifest = Manifest::for_component(path)?;
        let config = manifest.config_pairs()?;
        let signals = manifest.signal_specs()?;
        self.check_signals(path, &signals)?;
        let plugin = self.compile_bounded(path, bytes)?;
        let limits = self.engine.limits();
        let memory_bytes = manifest.limits.memory_bytes.unwrap_or(limits.memory_bytes);
        if memory_bytes > super::MEMORY_CEILING_BYTES {
            return Err(format!(
                "limits.memory_bytes {memory_bytes} is over the ceiling of {}",
                super::MEMORY_CEILING_BYTES
            ));
        }
        Ok(self.register_with(plugin, &manifest, (config, signals), memory_bytes))
    }

    /// Refuses signals another loaded plugin (from another file) declares
    /// under the same name with another definition: one name, one count.
    fn check_signals(&self, path: &Path, signals: &[SignalSpec]) -> Result<(), String> {
        for p in self.plugins().iter().filter(|p| p.plugin.path != path) {
            for theirs in &p.signals {
                if let Some(ours) = signals.iter().find(|s| s.name == theirs.name && *s != theirs) {
                    return Err(format!(
                        "signal {} is declared differently by plugin {} ({} by {}, {}, window {} ms); \
                         one name, one definition",
                        ours.name,
                        p.plugin.info.name,
                        String::from(theirs.count.clone()),
                        theirs.key,
                        theirs
                            .when
                            .as_ref()
                            .map_or("every item".into(), |w| format!("when {} < {}", w.context, w.below)),
                        theirs.window_ms
                    ));
                }
            }
        }
        Ok(())
    }

    fn register_with(
        &self,
        plugin: LoadedPlugin,
        manifest: &Manifest,
        (config, signals): (Vec<(String, String)>, Vec<SignalSpec>),
        memory_bytes: usize,
    ) -> RegisteredPlugin {
        let limits = self.engine.limits();
        RegisteredPlugin {
            phases: manifest.phases.clone().unwrap_or_else(|| plugin.info.phases.clone()),
            mode: manifest.mode,
            enabled: manifest.enabled,
            config,
            signals,
            deadline_async: manifest
                .limits
                .async_deadline_ms
                .map_or(limits.async_deadline, Duration::from_millis),
            deadline_sync: manifest
                .limits
                .sync_deadline_ms
                .map_or(limits.sync_deadline, Duration::from_millis),
            memory_bytes,
            // One idle instance per evaluation that can run at once, at most.
            instances: manifest
                .reuse_instances
                .then(|| super::InstancePool::new(limits.max_concurrent_evaluations.clamp(1, 8) as usize)),
            loaded_at_ms: now_ms(),
            breaker: Breaker::new(limits.breaker.clone()),
            evaluations: AtomicU64::new(0),
            disagreements: AtomicU64::new(0),
            plugin,
        }
    }

    /// Compiles on a helper thread and gives up after `compile_timeout`: a
    /// pathological file is reported instead of holding the reload thread.
    /// (wasmtime cannot interrupt a compilation; the abandoned thread finishes
    /// on its own and its result is dropped.)
    fn compile_bounded(&self, path: &Path, bytes: &[u8]) -> Result<LoadedPlugin, String> {
        let timeout = self.engine.limits().compile_timeout;
        let (tx, rx) = std::sync::mpsc::channel();
        let (engine, path_buf, bytes) = (self.engine.clone(), path.to_path_buf(), bytes.to_vec());
        std::thread::Builder::new()
            .name("gavel-compile".into())
            .spawn(move || {
                let started = std::time::Instant::now();
                let result = engine.load_bytes(&path_buf, &bytes);
                // Freed before the answer, so the trim that follows it finds it free.
                drop(bytes);
                let _ = tx.send((result, started.elapsed()));
            })
            .map_err(|e| format!("cannot start a compile thread: {e}"))?;
        // The compile thread's own measure decides, so a waiting thread that
        // was descheduled does not let a slow compilation through.
        match rx.recv_timeout(timeout) {
            Ok((result, took)) if took <= timeout => result.map_err(|e| e.to_string()),
            _ => Err(format!(
                "{}: compilation took longer than {} ms; not loaded",
                path.display(),
                timeout.as_millis()
            )),
        }
    }

    /// Unloads everything (process shutdown), recording it.
    pub fn unload_all(&self) {
        let names: Vec<String> = self.plugins().iter().map(|p| p.plugin.info.name.clone()).collect();
        for name in names {
            self.swap(Some(&name), None);
        }
    }
}

fn file_name(path: &Path) -> &str {
    path.file_name().and_then(|n| n.to_str()).unwrap_or("")
}

/// Reads a file once, refusing it past `max` bytes (checked before reading).
fn read_limited(path: &Path, max: u64) -> Result<Vec<u8>, String> {
    if path.extension().is_some_and(|e| e == "cwasm") {
        return Err(super::LoadErrorKind::Precompiled.to_string());
    }
    read_regular_file(path, max).map_err(|e| match e.kind() {
        std::io::ErrorKind::FileTooLarge => e.to_string(),
        _ => format!("cannot read the file: {e}"),
    })
}

/// Reads a regular file (not through a symbolic link) of at most `max`
/// bytes; the size is checked on the opened file, so a file swapped after
/// the check is not read past it either.
fn read_regular_file(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                std::io::Error::other("a symbolic link; plugin files are read only as regular files")
            } else {
                e
            }
        })?;
    let size = file.metadata()?.len();
    if size > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::FileTooLarge,
            super::LoadErrorKind::TooLarge { size, max }.to_string(),
        ));
    }
    let mut bytes = Vec::with_capacity(size as usize);
    file.take(max + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::FileTooLarge,
            super::LoadErrorKind::TooLarge {
                size: bytes.len() as u64,
                max,
            }
            .to_string(),
        ));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifest_parses_and_refuses_unknown_keys() {
        let m: Manifest = toml::from_str(
            "mode = \"shadow\"\nphases = [\"sync\", \"async\"]\n[limits]\nasync_deadline_ms = 20\n[config]\nterms = [\"a\", \"b c\"]\nquorum = 5\n",
        )
        .unwrap();
        assert_eq!(m.mode, Mode::Shadow);
        assert_eq!(m.phases, Some(vec![Phase::Sync, Phase::Async]));
        assert_eq!(m.limits.async_deadline_ms, Some(20));
        let pairs = m.config_pairs().unwrap();
        assert!(pairs.contains(&("terms".into(), "a,b c".into())));
        assert!(pairs.contains(&("quorum".into(), "5".into())));
        assert!(toml::from_str::<Manifest>("mdoe = \"shadow\"").is_err());
        let nested: Manifest = toml::from_str("[config.x]\ny = 1").unwrap();
        assert!(nested.config_pairs().is_err());
    }
}
