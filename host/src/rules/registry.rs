//! The set of loaded plugins: `name → Arc<RegisteredPlugin>`, swapped
//! atomically. An evaluation holds its `Arc`, so a reload never changes a
//! plugin under a running evaluation.

use super::{LoadedPlugin, Phase, RuleEngine};
use crate::store::Mode;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

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
    /// Passed to the rule as `snapshot.config` (values as strings; lists comma-joined).
    pub config: toml::Table,
}

impl Default for Manifest {
    fn default() -> Self {
        Manifest {
            mode: Mode::Enforce,
            enabled: true,
            phases: None,
            limits: ManifestLimits::default(),
            config: toml::Table::new(),
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
    pub fn for_component(wasm: &Path) -> Result<Manifest, String> {
        let path = wasm.with_extension("toml");
        match std::fs::read_to_string(&path) {
            Ok(text) => toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Manifest::default()),
            Err(e) => Err(format!("{}: {e}", path.display())),
        }
    }

    /// The `config` table as the string pairs a rule receives.
    pub fn config_pairs(&self) -> Result<Vec<(String, String)>, String> {
        self.config
            .iter()
            .map(|(k, v)| {
                let json = serde_json::to_value(v).map_err(|e| format!("config `{k}`: {e}"))?;
                gavel_plugin_sdk::spec::config_value_string(&json)
                    .map(|s| (k.clone(), s))
                    .ok_or_else(|| {
                        format!("config `{k}`: use a string, number, boolean or list of those")
                    })
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
    pub deadline_async: Duration,
    pub deadline_sync: Duration,
    pub memory_bytes: usize,
    pub loaded_at_ms: i64,
    /// Failed evaluations in a row (reset by a success).
    pub consecutive_failures: AtomicU32,
    /// Set after `quarantine_after` failures in a row; cleared only by
    /// loading the file again (a new `RegisteredPlugin`).
    pub quarantined: AtomicBool,
}

impl RegisteredPlugin {
    /// Whether this plugin runs in `phase` (enabled, declared, not quarantined).
    pub fn runs_in(&self, phase: Phase) -> bool {
        self.enabled && self.phases.contains(&phase) && !self.quarantined.load(Ordering::Relaxed)
    }

    /// Counts an evaluation's outcome towards quarantine; returns `true` when
    /// this outcome quarantined the plugin.
    pub fn record_outcome(&self, outcome: super::Outcome, quarantine_after: u32) -> bool {
        if !outcome.is_failure() {
            self.consecutive_failures.store(0, Ordering::Relaxed);
            return false;
        }
        let failures = self.consecutive_failures.fetch_add(1, Ordering::Relaxed) + 1;
        failures >= quarantine_after.max(1) && !self.quarantined.swap(true, Ordering::Relaxed)
    }
}

/// A file that did not load, and why.
#[derive(Debug, Clone, Serialize)]
pub struct LoadFailure {
    pub path: PathBuf,
    pub error: String,
    pub at_ms: i64,
}

/// The loaded plugins.
pub struct Registry {
    engine: Arc<RuleEngine>,
    plugins: RwLock<Arc<Vec<Arc<RegisteredPlugin>>>>,
    failures: RwLock<Vec<LoadFailure>>,
}

impl Registry {
    pub fn new(engine: Arc<RuleEngine>) -> Self {
        Registry {
            engine,
            plugins: RwLock::new(Arc::new(Vec::new())),
            failures: RwLock::new(Vec::new()),
        }
    }

    pub fn engine(&self) -> &Arc<RuleEngine> {
        &self.engine
    }

    /// The current plugins, ordered by name. Cheap: one `Arc` clone.
    pub fn plugins(&self) -> Arc<Vec<Arc<RegisteredPlugin>>> {
        self.plugins.read().expect("registry lock poisoned").clone()
    }

    /// Files that failed to load at the last scan.
    pub fn failures(&self) -> Vec<LoadFailure> {
        self.failures
            .read()
            .expect("registry lock poisoned")
            .clone()
    }

    /// Loads every `*.wasm` directly in `dir` (subdirectories are ignored),
    /// with its sidecar, and swaps the whole set in. Blocking (compiles):
    /// call from a blocking thread. A file that fails is reported, never fatal.
    pub fn load_dir(&self, dir: &Path) -> std::io::Result<()> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "wasm" || e == "cwasm"))
            .collect();
        files.sort();
        let mut loaded: BTreeMap<String, Arc<RegisteredPlugin>> = BTreeMap::new();
        let mut failures = Vec::new();
        for path in files {
            match self.load_one(&path) {
                Ok(p) if loaded.contains_key(&p.plugin.info.name) => {
                    let other = &loaded[&p.plugin.info.name].plugin.path;
                    failures.push(self.failure(
                        &path,
                        format!(
                            "plugin name {:?} is already loaded from {}; refused",
                            p.plugin.info.name,
                            other.display()
                        ),
                    ));
                }
                Ok(p) => {
                    tracing::info!(
                        plugin = %p.plugin.info.name, version = %p.plugin.info.version,
                        digest = %p.plugin.stamp.digest, mode = p.mode.as_str(), path = %path.display(),
                        "plugin loaded"
                    );
                    loaded.insert(p.plugin.info.name.clone(), Arc::new(p));
                }
                Err(error) => failures.push(self.failure(&path, error)),
            }
        }
        *self.plugins.write().expect("registry lock poisoned") =
            Arc::new(loaded.into_values().collect());
        *self.failures.write().expect("registry lock poisoned") = failures;
        Ok(())
    }

    fn failure(&self, path: &Path, error: String) -> LoadFailure {
        tracing::error!(path = %path.display(), %error, "plugin not loaded");
        LoadFailure {
            path: path.to_path_buf(),
            error,
            at_ms: crate::store::now_ms(),
        }
    }

    fn load_one(&self, path: &Path) -> Result<RegisteredPlugin, String> {
        let manifest = Manifest::for_component(path)?;
        let config = manifest.config_pairs()?;
        let plugin = self.engine.load_file(path).map_err(|e| e.to_string())?;
        let limits = self.engine.limits();
        let memory_bytes = manifest.limits.memory_bytes.unwrap_or(limits.memory_bytes);
        if memory_bytes > super::MEMORY_CEILING_BYTES {
            return Err(format!(
                "limits.memory_bytes {memory_bytes} is over the ceiling of {}",
                super::MEMORY_CEILING_BYTES
            ));
        }
        Ok(RegisteredPlugin {
            phases: manifest
                .phases
                .clone()
                .unwrap_or_else(|| plugin.info.phases.clone()),
            mode: manifest.mode,
            enabled: manifest.enabled,
            config,
            deadline_async: manifest
                .limits
                .async_deadline_ms
                .map_or(limits.async_deadline, Duration::from_millis),
            deadline_sync: manifest
                .limits
                .sync_deadline_ms
                .map_or(limits.sync_deadline, Duration::from_millis),
            memory_bytes,
            loaded_at_ms: crate::store::now_ms(),
            consecutive_failures: AtomicU32::new(0),
            quarantined: AtomicBool::new(false),
            plugin,
        })
    }
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
