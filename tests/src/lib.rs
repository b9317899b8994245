//! Shared harness for gavel's integration tests.
//!
//! The guests (example plugins, the Python example, misbehaving fixtures) are
//! built by `build.rs` and exposed in [`guests`] as paths to real `.wasm`
//! components.

use gavel::rules::{Evaluation, LoadedPlugin, RuleEngine, RuntimeLimits, Snapshot, fit_snapshot, snapshot_from_spec};
use gavel_plugin_sdk::spec::SnapshotSpec;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub mod history;
pub mod peer;
pub mod receiver;

pub mod server;
pub mod servers;
pub mod transparency;

/// A small deterministic generator (xorshift), so a seed replays a test's
/// random choices.
pub struct Rng(pub u64);

impl Rng {
    /// Seeded from the clock (never 0); print the seed to replay.
    pub fn from_clock() -> Rng {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        Rng(nanos | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// Fisher-Yates.
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            v.swap(i, self.below(i as u64 + 1) as usize);
        }
    }
}

/// Paths of the built guest components, one constant per guest
/// (`guests::LINK_SPAM`, `guests::MISBEHAVE`, `guests::SHOUTING`, ...).
pub mod guests {
    include!(concat!(env!("OUT_DIR"), "/guests.rs"));
}

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The four Rust example rules every test server loads: (name, component).
pub fn example_rust_plugins() -> [(&'static str, &'static str); 4] {
    [
        ("link-spam", guests::LINK_SPAM),
        ("duplicate-burst", guests::DUPLICATE_BURST),
        ("flag-ratio", guests::FLAG_RATIO),
        ("banned-terms", guests::BANNED_TERMS),
    ]
}

/// The example plugins: (component path, `cases.json` path).
pub fn example_plugins() -> Vec<(&'static str, PathBuf)> {
    let root = repo_root();
    vec![
        (guests::LINK_SPAM, root.join("plugins/link-spam/cases.json")),
        (guests::LINK_WAVE, root.join("plugins/link-wave/cases.json")),
        (guests::DUPLICATE_BURST, root.join("plugins/duplicate-burst/cases.json")),
        (guests::FLAG_RATIO, root.join("plugins/flag-ratio/cases.json")),
        (guests::BANNED_TERMS, root.join("plugins/banned-terms/cases.json")),
        (guests::SHOUTING, root.join("plugins/python/shouting/cases.json")),
        (guests::SHOUTING_JS, root.join("plugins/js/shouting-js/cases.json")),
    ]
}

/// Limits shrunk for tests (docs/RELIABILITY.md): deadlines short enough
/// that a runaway rule costs the suite little.
pub fn test_limits() -> RuntimeLimits {
    RuntimeLimits {
        async_deadline: Duration::from_millis(100),
        sync_deadline: Duration::from_millis(20),
        ..RuntimeLimits::default()
    }
}

/// An engine with [`test_limits`].
pub fn engine() -> RuleEngine {
    RuleEngine::new(test_limits()).expect("building the rule engine")
}

/// Loads a guest, panicking with the load error if it does not load.
pub fn load(engine: &RuleEngine, path: &str) -> LoadedPlugin {
    engine
        .load_file(Path::new(path))
        .unwrap_or_else(|e| panic!("loading {path}: {e}"))
}

/// A snapshot with `text` and the given config pairs.
pub fn snapshot(text: &str, config: &[(&str, &str)]) -> Snapshot {
    let mut spec = SnapshotSpec::default();
    spec.item.text = text.into();
    spec.config = config.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    snapshot_from_spec(&spec)
}

/// Evaluates `plugin` on a spec, fitted to the engine's snapshot limit as the host does.
pub fn evaluate_spec(engine: &RuleEngine, plugin: &LoadedPlugin, spec: &SnapshotSpec) -> Evaluation {
    let mut s = snapshot_from_spec(spec);
    fit_snapshot(&mut s, engine.limits().max_snapshot_bytes);
    engine.evaluate(plugin, &s).expect("the host runs the evaluation")
}

/// Evaluates `plugin` on a `cases.json` case as `gavel plugin test` does:
/// the case's lists, if it gives any, answer the rule's list calls, and its
/// `snapshot.signals` its signal calls.
pub fn evaluate_case(engine: &RuleEngine, plugin: &LoadedPlugin, case: &gavel_plugin_sdk::spec::Case) -> Evaluation {
    gavel::cli::evaluate_case(engine, plugin, case).unwrap_or_else(|e| panic!("{}: {e:#}", case.name))
}

/// Resident set size of this process, in bytes (Linux).
pub fn rss_bytes() -> u64 {
    proc_status_kib("VmRSS:") * 1024
}

/// Memory this process holds itself, in bytes: anonymous and shared-memory
/// pages (Linux). Unlike [`rss_bytes`] it leaves out file pages (the
/// binary's code, mapped files), which are shared with the page cache.
pub fn private_rss_bytes() -> u64 {
    (proc_status_kib("RssAnon:") + proc_status_kib("RssShmem:")) * 1024
}

/// Threads of this process (Linux).
pub fn thread_count() -> u64 {
    proc_status_kib("Threads:")
}

fn proc_status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("reading /proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{field} missing from /proc/self/status"))
}

/// `wasm` with a custom section appended: a valid component with the same
/// behaviour and declared version, and a different digest (for hot-swap tests).
pub fn component_variant(wasm: &[u8], n: u32) -> Vec<u8> {
    fn leb(mut v: u32, out: &mut Vec<u8>) {
        loop {
            let byte = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(byte);
                return;
            }
            out.push(byte | 0x80);
        }
    }
    let name = b"gavel-test-variant";
    let mut payload = Vec::new();
    leb(name.len() as u32, &mut payload);
    payload.extend_from_slice(name);
    payload.extend_from_slice(&n.to_le_bytes());
    let mut out = wasm.to_vec();
    out.push(0);
    leb(payload.len() as u32, &mut out);
    out.extend_from_slice(&payload);
    out
}
