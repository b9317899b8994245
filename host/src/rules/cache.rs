//! The compilation cache: components compiled by gavel itself, serialized
//! into the data directory under their sha256 digest, so restarts and
//! re-deploys of a known file skip compilation.
//!
//! Only files gavel wrote are ever deserialized (native code from the plugin
//! directory never is). wasmtime refuses an artifact built by another
//! version or configuration; gavel then compiles afresh and overwrites it.

use crate::domain::Digest;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use wasmtime::Engine;
use wasmtime::component::Component;

/// A directory of serialized components keyed by digest.
#[derive(Debug)]
pub struct CompileCache {
    dir: PathBuf,
    /// Loads served from the cache, for operators and tests.
    pub hits: AtomicU64,
    pub misses: AtomicU64,
}

impl CompileCache {
    pub fn new(dir: &Path) -> std::io::Result<CompileCache> {
        std::fs::create_dir_all(dir)?;
        Ok(CompileCache {
            dir: dir.to_path_buf(),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        })
    }

    fn path(&self, digest: &Digest) -> PathBuf {
        self.dir.join(format!("{}.cwasm", digest.to_hex()))
    }

    /// The cached component for `digest`, if present and compatible.
    pub fn get(&self, engine: &Engine, digest: &Digest) -> Option<Component> {
        let path = self.path(digest);
        if !path.exists() {
            self.misses.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        // SAFETY: the file was written by `put` below, from `Component::serialize`
        // of this very digest, into gavel's own data directory; wasmtime
        // checks version and configuration compatibility before using it.
        match unsafe { Component::deserialize_file(engine, &path) } {
            Ok(c) => {
                self.hits.fetch_add(1, Ordering::Relaxed);
                tracing::info!(digest = %digest, "compilation cache hit");
                Some(c)
            }
            Err(e) => {
                self.misses.fetch_add(1, Ordering::Relaxed);
                tracing::info!(digest = %digest, error = %e, "compilation cache entry unusable; compiling");
                None
            }
        }
    }

    /// Stores an artifact (compiled with `engine`'s settings) under `digest`
    /// and maps it back from that file, so that the compiled code and the
    /// rule's initial memory image are pages of the file (shared with the
    /// page cache, read in as they are touched, dropped under memory
    /// pressure) rather than anonymous memory held for as long as the plugin
    /// is loaded. If the file cannot be written or mapped, the artifact is
    /// used from memory.
    pub fn store_and_map(&self, engine: &Engine, digest: &Digest, artifact: &[u8]) -> wasmtime::Result<Component> {
        let mapped = self.store(digest, artifact).and_then(|path| {
            // SAFETY: `path` was just written by `store` from an artifact of
            // `engine`'s settings; files are replaced by rename, never changed
            // in place, so the mapping stays valid while it is in use.
            unsafe { Component::deserialize_file(engine, &path) }.map_err(|e| format!("{e:#}"))
        });
        match mapped {
            Ok(component) => Ok(component),
            Err(e) => {
                tracing::warn!(digest = %digest, error = %e, "cannot use the compilation cache; the code stays in memory");
                // SAFETY: the artifact was compiled with `engine`'s settings.
                unsafe { Component::deserialize(engine, artifact) }
            }
        }
    }

    /// Writes an artifact (to a temporary file, then renamed: a file once
    /// in place never changes, so mapping it is safe); returns its path.
    fn store(&self, digest: &Digest, artifact: &[u8]) -> Result<PathBuf, String> {
        let tmp = self.temp_path(digest);
        let path = self.path(digest);
        std::fs::write(&tmp, artifact)
            .and_then(|_| std::fs::rename(&tmp, &path))
            .map_err(|e| e.to_string())?;
        Ok(path)
    }

    /// Where an artifact for `digest` is written before it is renamed into
    /// place (by this process, or by a child compiler it started). Unique
    /// per process and call, so concurrent compilations never share one.
    pub(super) fn temp_path(&self, digest: &Digest) -> PathBuf {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        self.dir.join(format!(
            ".{}.tmp-{}-{}",
            digest.to_hex(),
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ))
    }

    /// Moves an artifact a child compiler wrote to `tmp` (with `engine`'s
    /// settings) into place under `digest` and maps it from there.
    pub(super) fn adopt_and_map(&self, engine: &Engine, digest: &Digest, tmp: &Path) -> Result<Component, String> {
        let path = self.path(digest);
        std::fs::rename(tmp, &path).map_err(|e| {
            let _ = std::fs::remove_file(tmp);
            format!("moving the compiled artifact into the cache: {e}")
        })?;
        // SAFETY: the file was just written by a child `gavel
        // compile-component` with this engine's compiler settings, and moved
        // into gavel's own data directory by rename (never changed in
        // place); wasmtime checks version and configuration compatibility.
        unsafe { Component::deserialize_file(engine, &path) }.map_err(|e| format!("{e:#}"))
    }
}
