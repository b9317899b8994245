//! The per-evaluation store data: a locked-down WASI context, the memory
//! limiter and the `host` import a rule can call.

use super::bindings::{self, Level};
use wasmtime::ResourceLimiter;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
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
    stdout: MemoryOutputPipe,
    stderr: MemoryOutputPipe,
    /// Tags the rule's log lines.
    plugin: String,
    log_budget: u32,
    pub(crate) logs_dropped: u32,
}

impl Sandbox {
    /// A sandbox with no preopened directories, no environment, no arguments
    /// and no network: a rule sees only what the snapshot hands it.
    pub(crate) fn new(plugin: &str, memory_bytes: usize, log_budget: u32) -> Self {
        let stdout = MemoryOutputPipe::new(CAPTURED_OUTPUT_BYTES);
        let stderr = MemoryOutputPipe::new(CAPTURED_OUTPUT_BYTES);
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
            plugin: plugin.to_string(),
            log_budget,
            logs_dropped: 0,
        }
    }

    /// Re-emits what the guest wrote to stdout and stderr as tracing events.
    pub(crate) fn flush_output(&self) {
        for (stream, pipe) in [("stdout", &self.stdout), ("stderr", &self.stderr)] {
            let bytes = pipe.contents();
            if bytes.is_empty() {
                continue;
            }
            for line in String::from_utf8_lossy(&bytes).lines() {
                tracing::info!(target: "plugin", plugin = %self.plugin, stream, "{line}");
            }
        }
        if self.logs_dropped > 0 {
            tracing::warn!(target: "plugin", plugin = %self.plugin, dropped = self.logs_dropped, "log lines over budget dropped");
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
        let plugin = self.plugin.as_str();
        match level {
            Level::Trace => tracing::trace!(target: "plugin", plugin, "{message}"),
            Level::Debug => tracing::debug!(target: "plugin", plugin, "{message}"),
            Level::Info => tracing::info!(target: "plugin", plugin, "{message}"),
            Level::Warn => tracing::warn!(target: "plugin", plugin, "{message}"),
            Level::Error => tracing::error!(target: "plugin", plugin, "{message}"),
        }
    }
}

/// Caps linear memory and remembers whether the cap was hit, so a trap that
/// follows a refused grow is reported as outcome `memory`, not a plain trap.
/// (wasmtime's `StoreLimits` caps, but does not say afterwards why it trapped.)
pub(crate) struct MemoryLimiter {
    memory_bytes: usize,
    pub(crate) exceeded: bool,
}

impl MemoryLimiter {
    fn new(memory_bytes: usize) -> Self {
        MemoryLimiter {
            memory_bytes,
            exceeded: false,
        }
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
        Ok(true)
    }

    fn table_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        Ok(desired <= MAX_TABLE_ELEMENTS)
    }
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
