//! The per-evaluation store data: a locked-down WASI context, the memory
//! limiter and the `host`, `lists` and `signals` imports a rule can call.

use super::bindings::{self, Level, ListError, SignalError};
use super::capture::Capture;
use super::evaluation::ListUse;
use crate::lists::{CompiledList, ListSource, WrongKind};
use std::sync::Arc;
use wasmtime::ResourceLimiter;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

/// Bytes of guest stdout/stderr kept per evaluation and re-emitted as tracing events.
const CAPTURED_OUTPUT_BYTES: usize = 4096;

/// Longest log line kept from a rule.
const MAX_LOG_LINE_BYTES: usize = 1024;

/// Everything a `wasmtime::Store` holds for one evaluation (or one `info()` call).
pub(crate) struct Sandbox {
    wasi: WasiCtx,
    table: ResourceTable,
    pub(crate) limiter: MemoryLimiter,
    stdout: Capture,
    stderr: Capture,
    /// Tags the rule's log lines.
    /// Who is running: every log line is tagged with its name and version.
    plugin: Arc<super::PluginStamp>,
    /// Log lines one call may write, and what is left of it in this call.
    log_lines: u32,
    log_budget: u32,
    pub(crate) logs_dropped: u32,
    /// This thread's CPU time when the current call started, and the CPU
    /// budget it has: the deadline counts the rule's own work, not time
    /// spent waiting for a core.
    pub(crate) cpu_started: std::time::Duration,
    pub(crate) cpu_budget: std::time::Duration,
    /// Wall-clock time the call started, and the most it may take however
    /// little CPU it gets (a backstop under extreme overload).
    pub(crate) wall_started: std::time::Instant,
    pub(crate) wall_cap: std::time::Duration,
    /// Set when the wall cap, not the CPU budget, ended the call: the host
    /// was overloaded, the rule did nothing wrong.
    pub(crate) overloaded: bool,
    /// Where this call's list lookups are answered from (none: every
    /// list is `unknown`), set per call.
    lists: Option<Arc<dyn ListSource>>,
    /// The lists this call consulted, each pinned at the version it first
    /// answered from: one call sees one version of a list, and its
    /// decision names it.
    consulted: Vec<Arc<CompiledList>>,
    /// The item's values of the signals the plugin declares, set per call
    /// (none: every signal is `undeclared`).
    signals: Option<Arc<super::SignalValues>>,
    /// Keeps the epoch ticker running while a call is armed (set by
    /// `RuleEngine::arm`, cleared when a reused instance goes back idle).
    pub(crate) awake: Option<super::ticker::Awake>,
}

impl Sandbox {
    /// A sandbox with no preopened directories, no environment, no arguments
    /// and no network: a rule sees only what the snapshot hands it.
    pub(crate) fn new(plugin: Arc<super::PluginStamp>, memory_bytes: usize, log_budget: u32) -> Self {
        let stdout = Capture::new(CAPTURED_OUTPUT_BYTES);
        let stderr = Capture::new(CAPTURED_OUTPUT_BYTES);
        let wasi = WasiCtx::builder()
            .stdout(stdout.clone())
            .stderr(stderr.clone())
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .build();
        Sandbox {
            wasi,
            table: ResourceTable::new(),
            limiter: MemoryLimiter::new(memory_bytes),
            stdout,
            stderr,
            plugin,
            log_lines: log_budget,
            log_budget,
            logs_dropped: 0,
            // Set by `start_call`, which always follows (a clock read here
            // would be a system call per evaluation for nothing).
            cpu_started: std::time::Duration::ZERO,
            cpu_budget: std::time::Duration::MAX,
            wall_started: std::time::Instant::now(),
            wall_cap: std::time::Duration::MAX,
            overloaded: false,
            lists: None,
            consulted: Vec::new(),
            signals: None,
            awake: None,
        }
    }

    /// Starts a call with `budget` of CPU time and `wall_cap` of wall time,
    /// its list and signal calls answered from `inputs`: a fresh log
    /// budget, nothing captured, no memory failure yet, no list consulted.
    pub(crate) fn start_call(
        &mut self,
        budget: std::time::Duration,
        wall_cap: std::time::Duration,
        inputs: super::CallInputs<'_>,
    ) {
        self.log_budget = self.log_lines;
        self.logs_dropped = 0;
        self.limiter.exceeded = false;
        self.overloaded = false;
        self.stdout.drain();
        self.stderr.drain();
        self.cpu_started = thread_cpu_time();
        self.cpu_budget = budget;
        self.wall_started = std::time::Instant::now();
        self.wall_cap = wall_cap;
        self.lists = inputs.lists.cloned();
        self.consulted.clear();
        self.signals = inputs.signals.cloned();
    }

    /// The lists this call consulted, with the version each answered from,
    /// by name.
    pub(crate) fn lists_consulted(&self) -> Vec<ListUse> {
        let mut used: Vec<ListUse> = self
            .consulted
            .iter()
            .map(|l| ListUse {
                name: l.name.clone(),
                version: l.version,
                digest: l.digest.clone(),
            })
            .collect();
        used.sort_by(|a, b| a.name.cmp(&b.name));
        used
    }

    /// List `name` as this call sees it: the version it first consulted, or
    /// the one its source gives now (then pinned).
    fn list(&mut self, name: &str) -> Result<Arc<CompiledList>, ListError> {
        if let Some(list) = self.consulted.iter().find(|l| l.name == name) {
            return Ok(list.clone());
        }
        let list = self
            .lists
            .as_ref()
            .and_then(|l| l.list(name))
            .ok_or(ListError::Unknown)?;
        self.consulted.push(list.clone());
        Ok(list)
    }

    /// CPU time this call has used so far.
    pub(crate) fn cpu_used(&self) -> std::time::Duration {
        thread_cpu_time().saturating_sub(self.cpu_started)
    }

    /// Re-emits what the guest wrote to stdout and stderr since the last
    /// call as tracing events, and empties the capture.
    pub(crate) fn flush_output(&self) {
        for (stream, pipe) in [("stdout", &self.stdout), ("stderr", &self.stderr)] {
            let (bytes, dropped) = pipe.drain();
            for line in String::from_utf8_lossy(&bytes).lines() {
                tracing::info!(target: "plugin", plugin = %self.plugin.name, plugin_version = %self.plugin.version, stream, "{line}");
            }
            if dropped > 0 {
                tracing::warn!(target: "plugin", plugin = %self.plugin.name, plugin_version = %self.plugin.version, stream, dropped, "output past the capture cap dropped");
            }
        }
        if self.logs_dropped > 0 {
            tracing::warn!(target: "plugin", plugin = %self.plugin.name, plugin_version = %self.plugin.version, dropped = self.logs_dropped, "log lines over budget dropped");
        }
    }
}

impl WasiView for Sandbox {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl bindings::gavel::rules::types::Host for Sandbox {}

impl bindings::gavel::rules::host::Host for Sandbox {
    fn log(&mut self, level: Level, message: String) {
        if self.log_budget == 0 {
            self.logs_dropped += 1;
            return;
        }
        self.log_budget -= 1;
        let message = truncate_str(&message, MAX_LOG_LINE_BYTES);
        let (plugin, plugin_version) = (self.plugin.name.as_str(), self.plugin.version.as_str());
        match level {
            Level::Trace => tracing::trace!(target: "plugin", plugin, plugin_version, "{message}"),
            Level::Debug => tracing::debug!(target: "plugin", plugin, plugin_version, "{message}"),
            Level::Info => tracing::info!(target: "plugin", plugin, plugin_version, "{message}"),
            Level::Warn => tracing::warn!(target: "plugin", plugin, plugin_version, "{message}"),
            Level::Error => tracing::error!(target: "plugin", plugin, plugin_version, "{message}"),
        }
    }
}

/// A lookup on a list of another kind.
fn wrong_kind(e: WrongKind) -> ListError {
    ListError::WrongKind(e.kind.to_string())
}

impl bindings::gavel::rules::lists::Host for Sandbox {
    fn find_terms(&mut self, list: String, text: String) -> Result<Vec<String>, ListError> {
        self.list(&list)?.find_terms(&text).map_err(wrong_kind)
    }

    fn match_patterns(&mut self, list: String, text: String) -> Result<Vec<String>, ListError> {
        self.list(&list)?.match_patterns(&text).map_err(wrong_kind)
    }

    fn match_domain(&mut self, list: String, host: String) -> Result<Option<String>, ListError> {
        self.list(&list)?.match_domain(&host).map_err(wrong_kind)
    }

    fn contains(&mut self, list: String, value: String) -> Result<bool, ListError> {
        self.list(&list)?.contains(&value).map_err(wrong_kind)
    }

    fn in_cidrs(&mut self, list: String, ip: String) -> Result<Option<String>, ListError> {
        let list = self.list(&list)?;
        let ip: std::net::IpAddr = ip
            .trim()
            .parse()
            .map_err(|_| ListError::Invalid(format!("{:?} is not an IP address", truncate_str(&ip, 64))))?;
        Ok(list.in_cidrs(ip).map_err(wrong_kind)?.map(|net| net.to_string()))
    }
}

impl bindings::gavel::rules::signals::Host for Sandbox {
    fn values(&mut self, name: String) -> Result<Vec<(String, u64)>, SignalError> {
        let keys = self
            .signals
            .as_ref()
            .and_then(|s| s.get(&name))
            .ok_or(SignalError::Undeclared)?;
        Ok(keys.iter().map(|(k, v)| (k.clone(), *v)).collect())
    }
}

/// Caps linear memory and remembers whether the cap was hit, so a trap that
/// follows a refused grow is reported as outcome `memory`, not a plain trap.
/// (wasmtime's `StoreLimits` caps, but does not say afterwards why it trapped.)
pub(crate) struct MemoryLimiter {
    memory_bytes: usize,
    pub(crate) exceeded: bool,
    /// The largest linear memory the instance has grown to, in bytes.
    pub(crate) largest: usize,
}

impl MemoryLimiter {
    fn new(memory_bytes: usize) -> Self {
        MemoryLimiter {
            memory_bytes,
            exceeded: false,
            largest: 0,
        }
    }

    /// Whether a reused instance has grown past half its cap and should be
    /// retired rather than kept: language runtimes (a JavaScript engine)
    /// may never give memory back between calls, and an instance left to
    /// grow would end a later call on the cap, an outcome the rule did
    /// nothing to deserve on that item.
    pub(crate) fn past_half(&self) -> bool {
        self.largest > self.memory_bytes / 2
    }
}

/// Tables are bounded too, so a rule cannot grow one without limit.
const MAX_TABLE_ELEMENTS: usize = 1 << 20;

impl ResourceLimiter for MemoryLimiter {
    fn memory_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        if desired > self.memory_bytes {
            self.exceeded = true;
            // An error (not `Ok(false)`) traps at once: the guest does not get
            // to run its out-of-memory path on our time.
            return Err(wasmtime::format_err!(
                "linear memory cap of {} bytes exceeded (wanted {desired})",
                self.memory_bytes
            ));
        }
        self.largest = self.largest.max(desired);
        Ok(true)
    }

    fn table_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        Ok(desired <= MAX_TABLE_ELEMENTS)
    }
}

/// CPU time the calling thread has used (Linux `CLOCK_THREAD_CPUTIME_ID`).
pub fn thread_cpu_time() -> std::time::Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a constant
    // every Linux kernel supports.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return std::time::Duration::ZERO;
    }
    std::time::Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// `s` cut to at most `max` bytes on a char boundary.
pub(crate) fn truncate_str(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}
