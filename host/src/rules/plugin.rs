//! Loading a component file: size and format checks, compilation,
//! linking against the `rule` world, and one `info()` call.

use super::bindings::{self, RulePre};
use super::contract::{self, Imports};
use super::evaluation::PluginStamp;
use super::sandbox::{Sandbox, truncate_str};
use super::{CallInputs, RuleEngine};
use crate::domain::{Digest, Phase};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use wasmtime::component::Component;

impl From<bindings::Phase> for Phase {
    fn from(p: bindings::Phase) -> Self {
        match p {
            bindings::Phase::Sync => Phase::Sync,
            bindings::Phase::Async => Phase::Async,
        }
    }
}

impl From<Phase> for bindings::Phase {
    fn from(p: Phase) -> Self {
        match p {
            Phase::Sync => bindings::Phase::Sync,
            Phase::Async => bindings::Phase::Async,
        }
    }
}

/// What a plugin says about itself, validated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PluginInfo {
    pub name: String,
    pub version: String,
    pub description: String,
    pub phases: Vec<Phase>,
}

/// How a [`LoadErrorKind::HostBusy`] message starts.
pub const BUSY: &str = "the host had no free instance slot to load it";

/// Why a file was not loaded. Every variant names what to fix.
#[derive(Debug, thiserror::Error)]
pub enum LoadErrorKind {
    #[error("cannot read the file: {0}")]
    Io(#[from] std::io::Error),
    #[error("file is {size} bytes, over the limit of {max} bytes")]
    TooLarge { size: u64, max: u64 },
    #[error("precompiled native code is never loaded from the plugin directory; deploy the .wasm component")]
    Precompiled,
    #[error("not a WebAssembly file (no \\0asm header)")]
    NotWasm,
    #[error(
        "a core WebAssembly module, not a component; build with `--target wasm32-wasip2` or run `wasm-tools component new`"
    )]
    CoreModule,
    #[error("unsupported WebAssembly binary version or layer {0:02x?}")]
    UnknownVersion([u8; 4]),
    #[error("does not compile: {0}")]
    Compile(String),
    #[error("does not implement the gavel:rules/rule world: {0}")]
    WrongWorld(String),
    /// Imports a capability the contract does not grant (files, network).
    #[error("{0}")]
    OutsideContract(String),
    /// Built against a `gavel:rules` version this host cannot run.
    #[error("{0}")]
    ContractVersion(String),
    #[error("info() failed: {0}")]
    Info(String),
    /// The host, not the file: no instance slot was free to call `info()`.
    /// The watcher tries the file again instead of recording it as failed.
    #[error("{BUSY}: {0}")]
    HostBusy(String),
    #[error("info() returned an invalid description: {0}")]
    BadInfo(String),
}

/// A file that could not be loaded, and why.
#[derive(Debug, thiserror::Error)]
#[error("{}: {kind}", path.display())]
pub struct LoadError {
    pub path: PathBuf,
    pub kind: LoadErrorKind,
}

/// A compiled, linked, validated plugin, ready to evaluate. Cheap to share:
/// an evaluation holds an `Arc<LoadedPlugin>`, so a reload never swaps code
/// under a running evaluation. A clone shares the compiled code.
#[derive(Clone)]
pub struct LoadedPlugin {
    pub info: PluginInfo,
    pub stamp: Arc<PluginStamp>,
    pub path: PathBuf,
    /// Size of the component file in bytes.
    pub size: u64,
    /// Time spent compiling, or reading the compilation cache.
    pub compile_time: Duration,
    /// Whether the compiled code came from the compilation cache.
    pub from_cache: bool,
    /// The `gavel:rules` version the component was built against, from its
    /// imports (`None` if it imports no interface of the contract).
    pub contract: Option<String>,
    pub(crate) pre: RulePre<Sandbox>,
}

impl std::fmt::Debug for LoadedPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedPlugin")
            .field("info", &self.info)
            .field("digest", &self.stamp.digest)
            .field("path", &self.path)
            .finish()
    }
}

const WASM_MAGIC: &[u8; 4] = b"\0asm";
const CORE_MODULE_VERSION: [u8; 4] = [1, 0, 0, 0];
const COMPONENT_VERSION: [u8; 4] = [0x0d, 0, 1, 0];
const ELF_MAGIC: &[u8; 4] = b"\x7fELF";

/// Checks the bytes are a component before handing them to the compiler,
/// so the common mistakes get a precise message.
fn check_format(path: &Path, bytes: &[u8]) -> Result<(), LoadErrorKind> {
    if path.extension().is_some_and(|e| e == "cwasm") || bytes.starts_with(ELF_MAGIC) {
        return Err(LoadErrorKind::Precompiled);
    }
    if bytes.len() < 8 || &bytes[..4] != WASM_MAGIC {
        return Err(LoadErrorKind::NotWasm);
    }
    let version: [u8; 4] = bytes[4..8].try_into().expect("slice of length 4");
    match version {
        COMPONENT_VERSION => Ok(()),
        CORE_MODULE_VERSION => Err(LoadErrorKind::CoreModule),
        other => Err(LoadErrorKind::UnknownVersion(other)),
    }
}

/// Gives the heap freed by a load back to the OS. Compiling a large
/// component (CPython, a JavaScript engine) allocates hundreds of MiB on the
/// compiler's threads, and glibc keeps what they free (and large buffers
/// such as the file's bytes) in its arenas, resident for the life of the
/// process unless trimmed. Called after a compilation, and by the registry
/// once a loaded file's bytes are dropped.
pub(crate) fn release_freed_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` only walks glibc's own arenas, under their locks.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Whether `name` is a valid plugin name: 1-64 bytes of lowercase letters,
/// digits and `-`, not starting with `-`.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
}

impl RuleEngine {
    /// Reads, validates, compiles and links a component file, then calls its
    /// `info()` once. Blocking and CPU-heavy (compilation): call it from a
    /// blocking thread, never from the async runtime.
    pub fn load_file(&self, path: &Path) -> Result<LoadedPlugin, LoadError> {
        let read = || -> Result<Vec<u8>, LoadErrorKind> {
            let size = std::fs::metadata(path)?.len();
            if size > self.limits.max_file_bytes {
                return Err(LoadErrorKind::TooLarge {
                    size,
                    max: self.limits.max_file_bytes,
                });
            }
            Ok(std::fs::read(path)?)
        };
        let bytes = read().map_err(|kind| LoadError {
            path: path.to_path_buf(),
            kind,
        })?;
        self.load_bytes(path, &bytes)
    }

    /// Like [`RuleEngine::load_file`], for bytes already read from `path`
    /// (the path only names the plugin in errors and in `LoadedPlugin`).
    pub fn load_bytes(&self, path: &Path, bytes: &[u8]) -> Result<LoadedPlugin, LoadError> {
        self.load_inner(path, bytes).map_err(|kind| LoadError {
            path: path.to_path_buf(),
            kind,
        })
    }

    fn load_inner(&self, path: &Path, bytes: &[u8]) -> Result<LoadedPlugin, LoadErrorKind> {
        let size = bytes.len() as u64;
        if size > self.limits.max_file_bytes {
            return Err(LoadErrorKind::TooLarge {
                size,
                max: self.limits.max_file_bytes,
            });
        }
        check_format(path, bytes)?;
        let digest = Digest::of(bytes);
        let started = Instant::now();
        let (component, from_cache) = match self.cache.as_ref().and_then(|c| c.get(&self.engine, &digest)) {
            Some(component) => (component, true),
            None => (self.compile(&digest, bytes)?, false),
        };
        self.link(path, size, digest, component, started.elapsed(), from_cache)
    }

    /// Compiles a component in a child process when the engine has one
    /// ([`RuleEngine::with_compiler_process`]); else on an engine of its own (the same settings,
    /// without the instance pool) that is dropped afterwards: the compiler
    /// keeps its working buffers for reuse, sized by the largest functions
    /// it compiled (about 39 MiB after the Python example). The artifact goes to the compilation cache and is
    /// mapped from there (see [`CompileCache::store_and_map`]), or, without a
    /// cache, is loaded from memory.
    ///
    /// [`CompileCache::store_and_map`]: super::CompileCache::store_and_map
    fn compile(&self, digest: &Digest, bytes: &[u8]) -> Result<Component, LoadErrorKind> {
        if let (Some(program), Some(cache)) = (&self.compiler_process, &self.cache)
            && let Some(compiled) = self.compile_in_child(program, cache, digest, bytes)
        {
            return compiled;
        }
        let compiled = wasmtime::Engine::new(&self.compiler).and_then(|compiler| compiler.precompile_component(bytes));
        let component = compiled.and_then(|artifact| match &self.cache {
            Some(cache) => cache.store_and_map(&self.engine, digest, &artifact),
            // SAFETY: an artifact compiled a moment ago with this engine's settings.
            None => unsafe { Component::deserialize(&self.engine, &artifact) },
        });
        release_freed_heap();
        component.map_err(|e| LoadErrorKind::Compile(format!("{e:#}")))
    }

    /// A component of the compilation cache, by digest (an earlier version
    /// whose file is gone): `None` when the cache does not hold it.
    pub fn load_cached(&self, digest: &Digest) -> Option<Result<LoadedPlugin, LoadError>> {
        let started = Instant::now();
        let component = self.cache.as_ref()?.get(&self.engine, digest)?;
        let path = PathBuf::from(format!("cache:{}", digest.to_hex()));
        Some(
            self.link(&path, 0, *digest, component, started.elapsed(), true)
                .map_err(|kind| LoadError { path, kind }),
        )
    }

    /// Checks a compiled component's imports against the contract, links
    /// it and calls its `info()`.
    fn link(
        &self,
        path: &Path,
        size: u64,
        digest: Digest,
        component: Component,
        compile_time: Duration,
        from_cache: bool,
    ) -> Result<LoadedPlugin, LoadErrorKind> {
        let imports = Imports::judge(component.component_type().imports(&self.engine).map(|(name, _)| name));
        if let Some(why) = imports.refusal() {
            return Err(LoadErrorKind::OutsideContract(why));
        }
        if let Some(version) = &imports.contract {
            contract::compatibility(version).map_err(LoadErrorKind::ContractVersion)?;
        }
        let pre = self
            .linker
            .instantiate_pre(&component)
            .map_err(|e| LoadErrorKind::WrongWorld(format!("{e:#}")))?;
        let pre = RulePre::new(pre).map_err(|e| LoadErrorKind::WrongWorld(format!("{e:#}")))?;
        let info = self.call_info(&pre, digest)?;
        Ok(LoadedPlugin {
            stamp: Arc::new(PluginStamp {
                name: info.name.clone(),
                version: info.version.clone(),
                digest,
            }),
            info,
            path: path.to_path_buf(),
            size,
            compile_time,
            from_cache,
            contract: imports.contract,
            pre,
        })
    }

    fn call_info(&self, pre: &RulePre<Sandbox>, digest: Digest) -> Result<PluginInfo, LoadErrorKind> {
        const INFO_DEADLINE: std::time::Duration = std::time::Duration::from_secs(1);
        let loading = Arc::new(PluginStamp {
            name: "(loading)".into(),
            version: String::new(),
            digest,
        });
        // Called once per load, not per item: a language runtime's first
        // call (CPython, a JS engine) initialises it, and a busy host must
        // not refuse a healthy rule for that. Still bounded: an `info` that
        // loops is refused.
        let deadline = self.limits.async_deadline.max(INFO_DEADLINE);
        let mut store = self.new_store(loading, self.limits.memory_bytes, deadline, CallInputs::default());
        let raw = pre
            .instantiate(&mut store)
            .and_then(|rule| rule.call_info(&mut store))
            .map_err(|e| match e.downcast_ref::<wasmtime::PoolConcurrencyLimitError>() {
                Some(_) => LoadErrorKind::HostBusy(format!("{e:#}")),
                None => LoadErrorKind::Info(format!("{e:#}")),
            });
        store.data().flush_output();
        let raw = raw?;
        if !valid_name(&raw.name) {
            return Err(LoadErrorKind::BadInfo(format!(
                "name {:?} must be 1-64 bytes of lowercase letters, digits and '-'",
                truncate_str(&raw.name, 80)
            )));
        }
        if raw.version.is_empty() || raw.version.len() > 64 || raw.version.chars().any(char::is_control) {
            return Err(LoadErrorKind::BadInfo("version must be 1-64 printable bytes".into()));
        }
        if raw.phases.is_empty() {
            return Err(LoadErrorKind::BadInfo("declares no phase".into()));
        }
        let mut phases: Vec<Phase> = raw.phases.into_iter().map(Phase::from).collect();
        phases.sort_by_key(|p| *p as u8);
        phases.dedup();
        Ok(PluginInfo {
            name: raw.name,
            version: raw.version,
            description: truncate_str(&raw.description, 256).to_string(),
            phases,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_check_names_the_mistake() {
        let p = Path::new("x.wasm");
        assert!(matches!(
            check_format(p, b"\0asm\x01\0\0\0"),
            Err(LoadErrorKind::CoreModule)
        ));
        assert!(matches!(check_format(p, b"\0asm\x0d\0\x01\0"), Ok(())));
        assert!(matches!(check_format(p, b"garbage!"), Err(LoadErrorKind::NotWasm)));
        assert!(matches!(check_format(p, b"\0as"), Err(LoadErrorKind::NotWasm)));
        assert!(matches!(
            check_format(p, b"\x7fELF\x02\x01\x01\0"),
            Err(LoadErrorKind::Precompiled)
        ));
        assert!(matches!(
            check_format(Path::new("x.cwasm"), b"\0asm\x0d\0\x01\0"),
            Err(LoadErrorKind::Precompiled)
        ));
    }

    #[test]
    fn plugin_names() {
        assert!(valid_name("link-spam"));
        assert!(valid_name("rule2"));
        assert!(!valid_name(""));
        assert!(!valid_name("Link"));
        assert!(!valid_name("-x"));
        assert!(!valid_name("a/b"));
        assert!(!valid_name(&"a".repeat(65)));
    }
}
