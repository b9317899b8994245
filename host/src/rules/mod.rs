//! The rule runtime: sandboxed WebAssembly components evaluated under
//! deadlines and memory caps.
//!
//! One wasmtime [`Engine`] (component model, pooling allocator, epoch
//! interruption driven by one ticker thread), one [`Linker`] with a
//! locked-down WASI context, an `InstancePre` per plugin, and a fresh `Store`
//! per evaluation, so nothing one evaluation leaves in memory is visible to
//! the next. A failing rule yields an [`Evaluation`] with its [`Outcome`];
//! it never panics or stalls the host.

mod bindings;
pub mod breaker;
mod cache;
mod capture;
mod compiler;
pub mod contract;
mod evaluation;
mod limits;
mod plugin;
mod pool;
mod registry;
mod sandbox;
mod snapshot;
mod ticker;
mod watcher;

pub use bindings::{AuthorStats, Event, Item, SignalError, Snapshot, Standing};
pub use breaker::{Admission, Breaker, BreakerChange, BreakerConfig};
pub use cache::CompileCache;
pub use compiler::compile_from_stdin;
pub use evaluation::{Decision, Evaluation, HostError, ListUse, PluginStamp};
pub use limits::{MEMORY_CEILING_BYTES, RuntimeLimits};
pub use plugin::{LoadError, LoadErrorKind, LoadedPlugin, PluginInfo, valid_name};
pub use pool::EvaluationPool;
pub use registry::{LoadFailure, Manifest, RegisteredPlugin, Registry};
pub use sandbox::thread_cpu_time;
pub use snapshot::{fit_snapshot, snapshot_from_spec, spec_from_snapshot};
pub use watcher::PluginWatcher;

use crate::domain::{Outcome, Verdict};
use crate::lists::ListSource;

pub use crate::domain::signals::SignalValues;

/// What a call's host imports answer from, besides the snapshot.
#[derive(Clone, Copy, Default)]
pub struct CallInputs<'a> {
    /// The lists a rule consults (none: every list is `unknown`).
    pub lists: Option<&'a Arc<dyn ListSource>>,
    /// The item's values of the signals this plugin declares (a name
    /// absent here is `undeclared`).
    pub signals: Option<&'a Arc<SignalValues>>,
}
use sandbox::Sandbox;
use std::sync::Arc;
use std::time::{Duration, Instant};
use ticker::EpochTicker;
use wasmtime::component::Linker;
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, Store, Trap};

/// Linear memory kept mapped in a pool slot between evaluations, reset in
/// place instead of returned to the OS, so a fresh instance does not
/// page-fault its stack and heap in on every call. With the `PAGEMAP_SCAN`
/// ioctl (Linux 6.7+, used when available) only the pages the last
/// evaluation dirtied are reset, so a generous bound costs nothing for a
/// small rule; without it the whole resident part is memset. Measured with
/// `bench/examples/fresh_loop.rs` (CPU of 40,000 evaluations): the page
/// scan makes a fresh evaluation of banned-terms 0.69× as costly at
/// 256 KiB, and 1 MiB with the scan another 0.85× for link-spam.
const KEEP_RESIDENT_BYTES: usize = 1 << 20;

/// The wasmtime configuration components are compiled with: the engine's
/// own, without its instance pool. A child compiler
/// ([`compile_from_stdin`]) builds the same from the same limit.
fn compiler_config(stack_bytes: usize) -> Config {
    let mut compiler = Config::new();
    compiler
        .wasm_component_model(true)
        .epoch_interruption(true)
        .max_wasm_stack(stack_bytes);
    compiler
}

/// Owns the engine, the linker and the epoch ticker. Clone-free: share it
/// behind an `Arc`.
pub struct RuleEngine {
    engine: Engine,
    /// The engine's configuration without its instance pool: components are
    /// compiled on an engine of their own, built from it and dropped after
    /// the compilation (see `RuleEngine::compile`).
    compiler: Config,
    linker: Linker<Sandbox>,
    limits: RuntimeLimits,
    /// Compiled components by digest, when a data directory is configured.
    cache: Option<CompileCache>,
    /// The program components are compiled in (a `gavel` binary, run as
    /// `gavel compile-component`), when they are not compiled in this
    /// process; see [`RuleEngine::with_compiler_process`].
    compiler_process: Option<std::path::PathBuf>,
    /// The lists rules consult (`gavel:rules/lists`) unless an evaluation
    /// names its own source (a backtest's replay); none in the author's
    /// commands, where a lookup answers `unknown`.
    lists: Option<Arc<dyn ListSource>>,
    ticker: EpochTicker,
}

impl RuleEngine {
    /// Builds the engine and starts its epoch ticker thread.
    pub fn new(limits: RuntimeLimits) -> anyhow::Result<Self> {
        anyhow::ensure!(
            limits.memory_bytes <= MEMORY_CEILING_BYTES,
            "memory_bytes {} is over the ceiling of {MEMORY_CEILING_BYTES}",
            limits.memory_bytes
        );
        let slots = limits.max_concurrent_evaluations.max(1);
        let mut pool = PoolingAllocationConfig::new();
        pool.total_component_instances(slots)
            // Components built by componentize-py link a dozen core modules.
            .max_core_instances_per_component(64)
            .total_core_instances(slots * 16)
            .max_memories_per_component(8)
            .total_memories(slots * 2)
            .max_tables_per_component(16)
            .total_tables(slots * 8)
            .max_memory_size(MEMORY_CEILING_BYTES)
            .max_core_instance_size(8 << 20)
            .max_component_instance_size(8 << 20)
            .linear_memory_keep_resident(KEEP_RESIDENT_BYTES)
            .table_keep_resident(64 << 10)
            // Memory past the resident part is returned to the OS as soon as
            // the instance ends (wasmtime's default batch of one), not in
            // batches: a slot waiting in a batch is not free, so the next
            // instance of the rule takes another slot and maps and faults its
            // memory image in from scratch, and every waiting slot keeps what
            // its instance touched. Measured with `bench/examples/fresh_loop.rs`
            // (200 fresh evaluations, debug build, busy machine): with batches
            // of 32 the Python example took 3.8 ms per evaluation and added
            // 47 MiB of RSS, the JavaScript one 2.1 ms and 23 MiB; with
            // batches of one 1.7 ms and 0.56 ms, and RSS stayed flat.
            .decommit_batch_size(1)
            // Reset only the pages an evaluation dirtied (Linux 6.7+).
            .pagemap_scan(wasmtime::Enabled::Auto);
        let compiler = compiler_config(limits.stack_bytes);
        let mut config = compiler.clone();
        config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        let engine = Engine::new(&config).map_err(|e| anyhow::anyhow!("wasmtime engine: {e:#}"))?;

        let mut linker = Linker::<Sandbox>::new(&engine);
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker).map_err(|e| anyhow::anyhow!("linking WASI: {e:#}"))?;
        bindings::Rule::add_to_linker::<_, wasmtime::component::HasSelf<_>>(&mut linker, |s| s)
            .map_err(|e| anyhow::anyhow!("linking the host interface: {e:#}"))?;

        let ticking = engine.clone();
        let ticker = EpochTicker::start(move || ticking.increment_epoch(), limits.epoch_tick);
        Ok(RuleEngine {
            engine,
            compiler,
            linker,
            limits,
            cache: None,
            compiler_process: None,
            lists: None,
            ticker,
        })
    }

    /// Caches compiled components in `dir` (see [`CompileCache`]).
    pub fn with_cache(mut self, dir: &std::path::Path) -> anyhow::Result<Self> {
        self.cache = Some(CompileCache::new(dir)?);
        Ok(self)
    }

    /// Compiles components in a child process, `program compile-component`
    /// (the running `gavel` binary), instead of in this one; used with a
    /// compilation cache, into which the child writes the artifact. What
    /// the compiler allocates (hundreds of MiB for CPython or a JavaScript
    /// engine, much of it kept by the allocator after it is freed) then
    /// leaves with the child, a compiler that crashes or runs out of memory
    /// takes only the child with it, and one past `compile_timeout` is
    /// killed rather than left running. `gavel serve` uses it; the author's
    /// commands, short-lived, compile in process.
    pub fn with_compiler_process(mut self, program: Option<std::path::PathBuf>) -> Self {
        self.compiler_process = program;
        self
    }

    /// Answers rules' list lookups from `lists`.
    pub fn with_lists(mut self, lists: Arc<crate::lists::ServedLists>) -> Self {
        self.lists = Some(lists);
        self
    }

    /// The compilation cache, if any.
    pub fn cache(&self) -> Option<&CompileCache> {
        self.cache.as_ref()
    }

    pub fn limits(&self) -> &RuntimeLimits {
        &self.limits
    }

    /// The wasmtime engine, for callers that precompile or serialize components.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The lists the engine serves: what an evaluation consults unless it
    /// names its own source.
    pub(crate) fn served_lists(&self) -> Option<&Arc<dyn ListSource>> {
        self.lists.as_ref()
    }

    fn new_store(
        &self,
        plugin: Arc<PluginStamp>,
        memory_bytes: usize,
        deadline: Duration,
        inputs: CallInputs<'_>,
    ) -> Store<Sandbox> {
        let mut store = Store::new(
            &self.engine,
            Sandbox::new(plugin, memory_bytes, self.limits.max_log_lines),
        );
        store.limiter(|s| &mut s.limiter);
        let tick = self.limits.epoch_tick;
        // The deadline is CPU time the rule itself used: when the epoch
        // deadline passes, a call that was only waiting for a core gets the
        // rest of its budget; the wall cap ends it anyway under overload,
        // as a host failure, not the rule's.
        store.epoch_deadline_callback(move |mut ctx| {
            let s = ctx.data();
            let used = s.cpu_used();
            if used >= s.cpu_budget {
                return Ok(wasmtime::UpdateDeadline::Interrupt);
            }
            let waited = s.wall_started.elapsed();
            if waited >= s.wall_cap {
                ctx.data_mut().overloaded = true;
                return Ok(wasmtime::UpdateDeadline::Interrupt);
            }
            let left = (s.cpu_budget - used).min(s.wall_cap - waited);
            let ticks = (left.as_nanos().div_ceil(tick.as_nanos().max(1)) as u64).max(1);
            Ok(wasmtime::UpdateDeadline::Continue(ticks))
        });
        self.arm(&mut store, deadline, inputs);
        store
    }

    /// Starts a call on `store`: its CPU budget, its wall cap, the epoch
    /// deadline at which the budget is first checked, and where its list
    /// and signal calls are answered from.
    fn arm(&self, store: &mut Store<Sandbox>, deadline: Duration, inputs: CallInputs<'_>) {
        let wall_cap = deadline.saturating_mul(self.limits.wall_cap_factor.max(1));
        // The ticker runs from before the deadline is set until the call
        // returns (its store is dropped, or a reused instance goes back idle).
        store.data_mut().awake = Some(self.ticker.awake());
        store.data_mut().start_call(deadline, wall_cap, inputs);
        store.set_epoch_deadline(self.limits.ticks(deadline));
    }

    /// Evaluates `plugin` on `snapshot` in a fresh instance, under the
    /// deadline of `snapshot.phase` and the memory cap. Blocking: call it from
    /// a blocking thread. Never panics on guest misbehaviour.
    pub fn evaluate(&self, plugin: &LoadedPlugin, snapshot: &Snapshot) -> Result<Evaluation, HostError> {
        self.evaluate_with(plugin, snapshot, self.deadline_for(snapshot), self.limits.memory_bytes)
    }

    /// The default CPU deadline of an evaluation in `snapshot.phase`.
    pub fn deadline_for(&self, snapshot: &Snapshot) -> Duration {
        match snapshot.phase {
            bindings::Phase::Sync => self.limits.sync_deadline,
            bindings::Phase::Async => self.limits.async_deadline,
        }
    }

    /// [`RuleEngine::evaluate`] with a plugin's own deadline and memory cap
    /// (sidecar overrides).
    pub fn evaluate_with(
        &self,
        plugin: &LoadedPlugin,
        snapshot: &Snapshot,
        deadline: Duration,
        memory_bytes: usize,
    ) -> Result<Evaluation, HostError> {
        self.evaluate_fresh(plugin, snapshot, deadline, memory_bytes, self.served())
    }

    /// [`RuleEngine::evaluate`], the rule's list and signal calls answered
    /// from `inputs` (a `plugin test` case's lists and signals).
    pub fn evaluate_from(
        &self,
        plugin: &LoadedPlugin,
        snapshot: &Snapshot,
        inputs: CallInputs<'_>,
    ) -> Result<Evaluation, HostError> {
        let deadline = self.deadline_for(snapshot);
        self.evaluate_fresh(plugin, snapshot, deadline, self.limits.memory_bytes, inputs)
    }

    /// What a call answers from by default: the lists the engine serves,
    /// no signals.
    fn served(&self) -> CallInputs<'_> {
        CallInputs {
            lists: self.served_lists(),
            signals: None,
        }
    }

    /// [`RuleEngine::evaluate_with`], the rule's list and signal calls
    /// answered from `inputs`.
    pub fn evaluate_fresh(
        &self,
        plugin: &LoadedPlugin,
        snapshot: &Snapshot,
        deadline: Duration,
        memory_bytes: usize,
        inputs: CallInputs<'_>,
    ) -> Result<Evaluation, HostError> {
        let started = Instant::now();
        let mut store = self.new_store(plugin.stamp.clone(), memory_bytes, deadline, inputs);
        let rule = match plugin.pre.instantiate(&mut store) {
            Ok(rule) => rule,
            Err(e) => return self.instantiation_failed(plugin, &store, e, started, deadline, memory_bytes),
        };
        let result = rule.call_evaluate(&mut store, snapshot);
        self.conclude(plugin, &store, result, started, deadline, memory_bytes)
    }

    /// Evaluates on an instance from `pool` (created on demand), which goes
    /// back to the pool unless the call trapped, timed out or hit the memory
    /// cap, or the instance has grown past half its memory cap (it is
    /// retired before it can fail a call on the cap). The opt-in of `reuse_instances = true`: state a call leaves in
    /// the guest's memory is visible to later calls.
    pub fn evaluate_reusing(
        &self,
        plugin: &LoadedPlugin,
        pool: &InstancePool,
        snapshot: &Snapshot,
        deadline: Duration,
        memory_bytes: usize,
    ) -> Result<Evaluation, HostError> {
        self.evaluate_pooled(plugin, pool, snapshot, deadline, memory_bytes, self.served())
    }

    /// [`RuleEngine::evaluate_reusing`], the rule's list and signal calls
    /// answered from `inputs` (the engine's served lists, a replay's
    /// versions, or a `plugin test` case's lists; the item's signals).
    pub fn evaluate_pooled(
        &self,
        plugin: &LoadedPlugin,
        pool: &InstancePool,
        snapshot: &Snapshot,
        deadline: Duration,
        memory_bytes: usize,
        inputs: CallInputs<'_>,
    ) -> Result<Evaluation, HostError> {
        let started = Instant::now();
        let taken = pool.idle.lock().expect("not poisoned").pop();
        let mut instance = match taken {
            Some(mut i) => {
                // A fresh budget, log allowance, capture, lists and signals for this call.
                self.arm(&mut i.store, deadline, inputs);
                i
            }
            None => {
                let mut store = self.new_store(plugin.stamp.clone(), memory_bytes, deadline, inputs);
                match plugin.pre.instantiate(&mut store) {
                    Ok(rule) => ReusedInstance { store, rule },
                    Err(e) => return self.instantiation_failed(plugin, &store, e, started, deadline, memory_bytes),
                }
            }
        };
        let result = instance.rule.call_evaluate(&mut instance.store, snapshot);
        let evaluation = self.conclude(plugin, &instance.store, result, started, deadline, memory_bytes)?;
        // Idle in the pool, the instance runs nothing: the ticker may park.
        instance.store.data_mut().awake = None;
        let healthy = matches!(evaluation.outcome, Outcome::Ok | Outcome::Error | Outcome::Invalid);
        if healthy && !instance.store.data().limiter.past_half() {
            let mut idle = pool.idle.lock().expect("not poisoned");
            if idle.len() < pool.max_idle {
                idle.push(instance);
            }
        }
        Ok(evaluation)
    }

    /// An instantiation that failed: the pooling allocator out of slots is
    /// the host's failure (load); anything else is the component's (a trap
    /// in its start-up code), an outcome like any other.
    fn instantiation_failed(
        &self,
        plugin: &LoadedPlugin,
        store: &Store<Sandbox>,
        e: wasmtime::Error,
        started: Instant,
        deadline: Duration,
        memory_bytes: usize,
    ) -> Result<Evaluation, HostError> {
        if e.downcast_ref::<wasmtime::PoolConcurrencyLimitError>().is_some() {
            return Err(HostError::PoolExhausted(format!("{e:#}")));
        }
        self.conclude(plugin, store, Err(e), started, deadline, memory_bytes)
    }

    /// Turns a call's result into an [`Evaluation`] with its outcome.
    fn conclude(
        &self,
        plugin: &LoadedPlugin,
        store: &Store<Sandbox>,
        result: wasmtime::Result<Result<bindings::Decision, String>>,
        started: Instant,
        deadline: Duration,
        memory_bytes: usize,
    ) -> Result<Evaluation, HostError> {
        let duration = started.elapsed();
        store.data().flush_output();
        let memory_exceeded = store.data().limiter.exceeded;
        if result.is_err() && store.data().overloaded {
            return Err(HostError::Overloaded(format!(
                "{} got less than its {} ms of CPU within {} ms",
                plugin.stamp.name,
                deadline.as_millis(),
                store.data().wall_cap.as_millis()
            )));
        }

        let (outcome, decision, error) = match result {
            Ok(Ok(raw)) => match self.validate(raw) {
                Ok(decision) => (Outcome::Ok, Some(decision), None),
                Err(why) => (Outcome::Invalid, None, Some(why)),
            },
            Ok(Err(message)) => (
                Outcome::Error,
                None,
                Some(sandbox::truncate_str(&message, self.limits.max_reason_bytes).to_string()),
            ),
            Err(_) if memory_exceeded => (
                Outcome::Memory,
                None,
                Some(format!("linear memory cap of {memory_bytes} bytes exceeded")),
            ),
            Err(err) => match err.downcast_ref::<Trap>() {
                Some(Trap::Interrupt) => (
                    Outcome::Timeout,
                    None,
                    Some(format!("CPU budget of {} ms used up", deadline.as_millis())),
                ),
                _ => (Outcome::Trap, None, Some(format!("{err:#}"))),
            },
        };
        Ok(Evaluation {
            plugin: plugin.stamp.clone(),
            outcome,
            decision,
            error,
            duration,
            lists: store.data().lists_consulted(),
        })
    }

    /// Applies the output limits; a decision outside them is `invalid`.
    fn validate(&self, raw: bindings::Decision) -> Result<Decision, String> {
        let l = &self.limits;
        if !raw.score.is_finite() {
            return Err(format!("score {} is not a finite number", raw.score));
        }
        if raw.reason.len() > l.max_reason_bytes {
            return Err(format!(
                "reason is {} bytes, over {}",
                raw.reason.len(),
                l.max_reason_bytes
            ));
        }
        if raw.labels.len() > l.max_labels {
            return Err(format!("{} labels, over {}", raw.labels.len(), l.max_labels));
        }
        if let Some(label) = raw.labels.iter().find(|s| s.is_empty() || s.len() > l.max_label_bytes) {
            return Err(format!(
                "label {:?} must be 1-{} bytes",
                sandbox::truncate_str(label, 80),
                l.max_label_bytes
            ));
        }
        let verdict = match raw.verdict {
            bindings::Verdict::Allow => Verdict::Allow,
            bindings::Verdict::Flag => Verdict::Flag,
            bindings::Verdict::Defer => Verdict::Defer,
            bindings::Verdict::Hold => Verdict::Hold,
            bindings::Verdict::Reject => Verdict::Reject,
        };
        match (&raw.provider, verdict) {
            (None, Verdict::Defer) => return Err("verdict defer without a provider".into()),
            (Some(p), Verdict::Defer) if p.is_empty() || p.len() > l.max_label_bytes => {
                return Err(format!("provider name must be 1-{} bytes", l.max_label_bytes));
            }
            (Some(_), v) if v != Verdict::Defer => {
                return Err(format!("a provider is named with verdict {v}; only defer names one"));
            }
            _ => {}
        }
        Ok(Decision {
            verdict,
            score: raw.score.clamp(0.0, 1.0),
            labels: raw.labels,
            reason: raw.reason,
            provider: raw.provider,
        })
    }
}

/// Idle instances of one plugin kept for reuse (`reuse_instances = true`
/// in its sidecar), at most `max_idle`.
pub struct InstancePool {
    idle: std::sync::Mutex<Vec<ReusedInstance>>,
    max_idle: usize,
}

impl std::fmt::Debug for InstancePool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let idle = self.idle.lock().map_or(0, |i| i.len());
        f.debug_struct("InstancePool")
            .field("idle", &idle)
            .field("max_idle", &self.max_idle)
            .finish()
    }
}

impl InstancePool {
    pub fn new(max_idle: usize) -> Self {
        InstancePool {
            idle: std::sync::Mutex::new(Vec::new()),
            max_idle,
        }
    }
}

/// One instance kept across evaluations (see [`InstancePool`]).
struct ReusedInstance {
    store: Store<Sandbox>,
    rule: bindings::Rule,
}

impl Drop for RuleEngine {
    fn drop(&mut self) {
        self.ticker.stop();
    }
}
