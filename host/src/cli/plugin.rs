//! `gavel plugin ...`: the rule author's commands. `new` writes a project
//! (see `scaffold.rs`); `check`, `eval`, `test` and `bench` run a built
//! component through the same sandbox and limits as `gavel serve`.

use super::parse_pair;
use super::scaffold::{self, Lang};
use crate::domain::Outcome;
use crate::lists::{FixedLists, ListSource};
use crate::rules::contract;
use crate::rules::{
    CallInputs, Evaluation, HostError, InstancePool, LoadedPlugin, RuleEngine, RuntimeLimits, SignalValues, Snapshot,
    fit_snapshot, snapshot_from_spec,
};
use anyhow::Context;
use clap::Subcommand;
use gavel_plugin_sdk::spec::{Case, SnapshotSpec, parse_cases};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, Subcommand)]
pub enum PluginCommand {
    /// Write a new rule project (source with a worked example, cases.json,
    /// build set-up, README) that builds as it is.
    New {
        /// The plugin name: lowercase letters, digits and `-`.
        name: String,
        /// The language of the rule.
        #[arg(long, value_enum)]
        lang: Lang,
        /// Where to write the project (default: ./NAME). Must not exist or be empty.
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Rust only: the `plugin-sdk` directory of a gavel checkout (default:
        /// $GAVEL_SDK, else the checkout this gavel was built from).
        #[arg(long, env = "GAVEL_SDK")]
        sdk: Option<PathBuf>,
    },
    /// Load and validate a component (format, imports against the contract,
    /// world), print its info, digest and contract version, and evaluate it
    /// once on a sample snapshot.
    Check {
        file: PathBuf,
        /// Config pairs passed to the rule, `key=value` (repeatable).
        #[arg(long = "config", value_parser = parse_pair)]
        config: Vec<(String, String)>,
    },
    /// Evaluate a component on one snapshot and print the evaluation as JSON.
    Eval {
        file: PathBuf,
        /// The snapshot as JSON, or `@PATH` to read it from a file.
        #[arg(long)]
        snapshot: String,
        /// Config pairs passed to the rule, `key=value` (repeatable); they
        /// override the snapshot's own `config`.
        #[arg(long = "config", value_parser = parse_pair)]
        config: Vec<(String, String)>,
    },
    /// Run a `cases.json` file through a component (the same file the
    /// SDK's native harness runs), printing one line per case. A case's
    /// `lists` (`{"NAME": {"kind": "terms", "entries": [...]}}`) answer
    /// the rule's list calls; without them every list is unknown.
    Test {
        file: PathBuf,
        #[arg(long)]
        cases: PathBuf,
    },
    /// Time a component per case, in a fresh instance (gavel's default) and
    /// in a reused one (`reuse_instances = true`), under the default limits.
    Bench {
        file: PathBuf,
        /// The cases to time (default: one sample post).
        #[arg(long)]
        cases: Option<PathBuf>,
        /// Evaluations per case and instance mode (after 5 warm-up calls).
        #[arg(long, default_value_t = 200)]
        iterations: u32,
        /// Config pairs passed to the rule, `key=value` (repeatable).
        #[arg(long = "config", value_parser = parse_pair)]
        config: Vec<(String, String)>,
    },
}

/// Runs one `gavel plugin` command.
pub fn run(cmd: PluginCommand) -> anyhow::Result<ExitCode> {
    let engine = || -> anyhow::Result<RuleEngine> {
        let engine = RuleEngine::new(RuntimeLimits::default())?;
        Ok(
            match cache_dir().map(|dir| std::fs::create_dir_all(&dir).map(|()| dir)) {
                Some(Ok(dir)) => engine.with_cache(&dir)?,
                // Without a cache every command compiles afresh: slower, same result.
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "no compilation cache");
                    engine
                }
                None => engine,
            },
        )
    };
    match cmd {
        PluginCommand::New { name, lang, dir, sdk } => {
            let dir = dir.unwrap_or_else(|| PathBuf::from(&name));
            scaffold::write_project(&name, lang, &dir, sdk.as_deref()).map(|()| ExitCode::SUCCESS)
        }
        PluginCommand::Check { file, config } => check(&engine()?, &file, config),
        PluginCommand::Eval { file, snapshot, config } => eval(&engine()?, &file, snapshot, config),
        PluginCommand::Test { file, cases } => run_cases(&engine()?, &file, &cases),
        PluginCommand::Bench {
            file,
            cases,
            iterations,
            config,
        } => bench(&engine()?, &file, cases.as_deref(), iterations.max(1), &config),
    }
}

fn eval(engine: &RuleEngine, file: &Path, snapshot: String, config: Vec<(String, String)>) -> anyhow::Result<ExitCode> {
    let plugin = engine.load_file(file)?;
    let json = match snapshot.strip_prefix('@') {
        Some(path) => std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?,
        None => snapshot,
    };
    let mut spec: SnapshotSpec = serde_json::from_str(&json).context("parsing --snapshot")?;
    spec.config.extend(config);
    let evaluation = evaluate_spec(engine, &plugin, &spec)?;
    println!("{}", serde_json::to_string_pretty(&evaluation)?);
    Ok(exit_for(&evaluation))
}

/// Where the author's commands keep compiled components, so `check`,
/// `test` and `bench` of one file compile it once (a JavaScript or Python
/// component takes seconds): `$GAVEL_CACHE_DIR`, else the user's cache
/// directory (`$XDG_CACHE_HOME/gavel`, `~/.cache/gavel`).
fn cache_dir() -> Option<PathBuf> {
    let var = |name| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    var("GAVEL_CACHE_DIR")
        .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("gavel")))
        .or_else(|| var("HOME").map(|d| d.join(".cache/gavel")))
}

fn check(engine: &RuleEngine, file: &Path, config: Vec<(String, String)>) -> anyhow::Result<ExitCode> {
    let plugin = match engine.load_file(file) {
        Ok(p) => p,
        Err(err) => {
            eprintln!("not loadable: {err}");
            return Ok(ExitCode::FAILURE);
        }
    };
    print_info(&plugin);
    let mut spec = SnapshotSpec::default();
    spec.item.text = "Hello from gavel plugin check: a friendly sample post.".into();
    spec.config.extend(config);
    let evaluation = evaluate_spec(engine, &plugin, &spec)?;
    println!("sample:      {}", describe(&evaluation));
    Ok(exit_for(&evaluation))
}

fn print_info(plugin: &LoadedPlugin) {
    let phases: Vec<&str> = plugin.info.phases.iter().map(|p| p.as_str()).collect();
    println!("file:        {} ({} bytes)", plugin.path.display(), plugin.size);
    println!("name:        {}", plugin.info.name);
    println!("version:     {}", plugin.info.version);
    println!("description: {}", plugin.info.description);
    println!("phases:      {}", phases.join(", "));
    println!("digest:      sha256:{}", plugin.stamp.digest);
    let host = contract::host_version();
    match &plugin.contract {
        Some(built) => {
            println!("contract:    {}@{built} (this host: {host})", contract::PACKAGE);
            // Loading already refused an incompatible version; this is the warning.
            if let Ok(Some(warning)) = contract::compatibility(built) {
                eprintln!("warning:     {warning}");
            }
        }
        None => println!(
            "contract:    imports no {} interface (this host: {host})",
            contract::PACKAGE
        ),
    }
    println!("compiled in: {} ms", plugin.compile_time.as_millis());
}

fn evaluate_spec(engine: &RuleEngine, plugin: &LoadedPlugin, spec: &SnapshotSpec) -> Result<Evaluation, HostError> {
    let signals = spec_signals(spec);
    let inputs = CallInputs {
        lists: None,
        signals: signals.as_ref(),
    };
    engine.evaluate_from(plugin, &snapshot_of(engine, spec), inputs)
}

/// The signal values a snapshot in JSON gives (`snapshot.signals`): the
/// rule reads those, and every other signal is `undeclared`.
fn spec_signals(spec: &SnapshotSpec) -> Option<Arc<SignalValues>> {
    (!spec.signals.is_empty()).then(|| Arc::new(spec.signals.clone()))
}

/// Evaluates `plugin` on a `cases.json` case in a fresh instance, as
/// `gavel plugin test` does: the snapshot fitted to the engine's limit, the
/// rule's list calls answered from the lists the case gives (none: every
/// name `unknown`), its signal calls from the case's `snapshot.signals`.
/// An error is a case whose lists do not compile, or the host failing to
/// run the evaluation.
pub fn evaluate_case(engine: &RuleEngine, plugin: &LoadedPlugin, case: &Case) -> anyhow::Result<Evaluation> {
    let snapshot = snapshot_of(engine, &case.snapshot);
    let (lists, signals) = (case_lists(case)?, spec_signals(&case.snapshot));
    let inputs = CallInputs {
        lists: lists.as_ref(),
        signals: signals.as_ref(),
    };
    Ok(engine.evaluate_from(plugin, &snapshot, inputs)?)
}

/// A case `plugin bench` times: name, snapshot, lists.
type BenchCase = (String, SnapshotSpec, Option<Arc<dyn ListSource>>);

/// Where a case's list calls are answered from: the lists it gives, or
/// none (every name `unknown`).
fn case_lists(case: &Case) -> anyhow::Result<Option<Arc<dyn ListSource>>> {
    if case.lists.is_empty() {
        return Ok(None);
    }
    let fixed = FixedLists::from_case(&case.lists).map_err(|why| anyhow::anyhow!("case {:?}: {why}", case.name))?;
    Ok(Some(fixed.source()))
}

fn snapshot_of(engine: &RuleEngine, spec: &SnapshotSpec) -> Snapshot {
    let mut snapshot = snapshot_from_spec(spec);
    fit_snapshot(&mut snapshot, engine.limits().max_snapshot_bytes);
    snapshot
}

/// One line: outcome, verdict, reason, duration.
pub fn describe(e: &Evaluation) -> String {
    match &e.decision {
        Some(d) => format!(
            "{} {} score={:.2} labels=[{}] reason={:?} ({} µs)",
            e.outcome,
            d.verdict,
            d.score,
            d.labels.join(","),
            d.reason,
            e.duration.as_micros()
        ),
        None => format!(
            "{}: {} ({} µs)",
            e.outcome,
            e.error.as_deref().unwrap_or(""),
            e.duration.as_micros()
        ),
    }
}

fn exit_for(e: &Evaluation) -> ExitCode {
    if e.outcome == Outcome::Ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The cases of a `cases.json` file; a file with none is an error, not a pass.
fn read_cases(path: &Path) -> anyhow::Result<Vec<Case>> {
    let json = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let cases = parse_cases(&json).with_context(|| format!("parsing {}", path.display()))?;
    anyhow::ensure!(!cases.is_empty(), "{} holds no case", path.display());
    Ok(cases)
}

fn run_cases(engine: &RuleEngine, file: &Path, cases: &Path) -> anyhow::Result<ExitCode> {
    let plugin = engine.load_file(file)?;
    let cases = read_cases(cases)?;
    println!(
        "{} {} (sha256:{})",
        plugin.info.name,
        plugin.info.version,
        &plugin.stamp.digest.to_hex()[..16]
    );
    let mut failed = 0;
    for case in &cases {
        let evaluation = evaluate_case(engine, &plugin, case)?;
        let result = match &evaluation.decision {
            Some(d) => case.expect.check(d.verdict.as_str(), &d.labels, d.provider.as_deref()),
            None => Err(describe(&evaluation)),
        };
        match result {
            Ok(()) => println!("  ok    {} -> {}", case.name, describe(&evaluation)),
            Err(why) => {
                failed += 1;
                println!("  FAIL  {}: {why}", case.name);
            }
        }
    }
    println!("{} passed, {failed} failed", cases.len() - failed);
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Wall time of `iterations` evaluations, sorted, after a short warm-up.
fn time_evaluations(
    iterations: u32,
    mut evaluate: impl FnMut() -> Result<Evaluation, HostError>,
) -> anyhow::Result<(Vec<Duration>, Evaluation)> {
    let mut last = None;
    for _ in 0..5 {
        last = Some(evaluate()?);
    }
    let mut times = Vec::with_capacity(iterations as usize);
    for _ in 0..iterations {
        let started = Instant::now();
        let evaluation = evaluate()?;
        times.push(started.elapsed());
        last = Some(evaluation);
    }
    times.sort();
    Ok((times, last.expect("at least one evaluation")))
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1e6
}

fn bench(
    engine: &RuleEngine,
    file: &Path,
    cases: Option<&Path>,
    iterations: u32,
    config: &[(String, String)],
) -> anyhow::Result<ExitCode> {
    let plugin = engine.load_file(file)?;
    let cases: Vec<BenchCase> = match cases {
        Some(path) => read_cases(path)?
            .into_iter()
            .map(|c| Ok((c.name.clone(), c.snapshot.clone(), case_lists(&c)?)))
            .collect::<anyhow::Result<_>>()?,
        None => {
            let mut snapshot = SnapshotSpec::default();
            snapshot.item.text = "Hello from gavel plugin bench: a friendly sample post.".into();
            vec![("sample post".into(), snapshot, None)]
        }
    };
    let limits = engine.limits();
    println!(
        "{} {} (sha256:{}), {} bytes; {iterations} evaluations per case and mode, \
         under the default limits ({} ms async, {} MiB)",
        plugin.info.name,
        plugin.info.version,
        &plugin.stamp.digest.to_hex()[..16],
        plugin.size,
        limits.async_deadline.as_millis(),
        limits.memory_bytes >> 20
    );
    println!(
        "  {:<40} {:>8}  {:>10} {:>10}  {:>10} {:>10}",
        "case", "outcome", "fresh p50", "fresh p99", "reused p50", "reused p99"
    );
    let (mut fresh_all, mut reused_all) = (Vec::new(), Vec::new());
    for (name, spec, lists) in &cases {
        let mut spec = spec.clone();
        spec.config.extend(config.iter().cloned());
        let snapshot = snapshot_of(engine, &spec);
        let signals = spec_signals(&spec);
        let inputs = CallInputs {
            lists: lists.as_ref(),
            signals: signals.as_ref(),
        };
        let (fresh, evaluation) = time_evaluations(iterations, || engine.evaluate_from(&plugin, &snapshot, inputs))?;
        let deadline = engine.deadline_for(&snapshot);
        let pool = InstancePool::new(1);
        let (reused, _) = time_evaluations(iterations, || {
            engine.evaluate_pooled(&plugin, &pool, &snapshot, deadline, limits.memory_bytes, inputs)
        })?;
        let outcome = match &evaluation.decision {
            Some(d) => d.verdict.to_string(),
            None => evaluation.outcome.to_string(),
        };
        println!(
            "  {:<40} {:>8}  {:>8.1}µs {:>8.1}µs  {:>8.1}µs {:>8.1}µs",
            truncate(name, 40),
            outcome,
            percentile(&fresh, 0.5),
            percentile(&fresh, 0.99),
            percentile(&reused, 0.5),
            percentile(&reused, 0.99)
        );
        fresh_all.extend(fresh);
        reused_all.extend(reused);
    }
    fresh_all.sort();
    reused_all.sort();
    let (fresh, reused) = (percentile(&fresh_all, 0.5), percentile(&reused_all, 0.5));
    println!(
        "all cases: fresh instance p50 {fresh:.1} µs, reused instance p50 {reused:.1} µs ({:.1}× faster reused)",
        fresh / reused.max(0.001)
    );
    Ok(ExitCode::SUCCESS)
}

fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let mut t: String = s.chars().take(max - 1).collect();
    t.push('…');
    t
}
