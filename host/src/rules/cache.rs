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

    /// Stores a compiled component (write to a temporary file, then rename).
    pub fn put(&self, digest: &Digest, component: &Component) {
        let result = component.serialize().map_err(|e| e.to_string()).and_then(|bytes| {
            let tmp = self
                .dir
                .join(format!(".{}.tmp-{}", digest.to_hex(), std::process::id()));
            std::fs::write(&tmp, bytes)
                .and_then(|_| std::fs::rename(&tmp, self.path(digest)))
                .map_err(|e| e.to_string())
        });
        if let Err(e) = result {
            tracing::warn!(digest = %digest, error = %e, "cannot write the compilation cache");
        }
    }
}
