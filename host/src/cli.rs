//! The `gavel` command line.

use crate::domain::Outcome;
use crate::rules::{Evaluation, HostError, LoadedPlugin, RuleEngine, RuntimeLimits, fit_snapshot, snapshot_from_spec};
use crate::telemetry::LogFormat;
use anyhow::Context;
use clap::{Parser, Subcommand};
use gavel_plugin_sdk::spec::{SnapshotSpec, parse_cases};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// gavel: a moderation and anti-spam rule host.
#[derive(Debug, Parser)]
#[command(version, about)]
pub struct Cli {
    /// Log line format on stderr.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "GAVEL_LOG_FORMAT")]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the HTTP API and the evaluation loop (SQLite in ./data and the
    /// plugins in ./plugins by default).
    Serve(crate::config::ServeFlags),
    /// Work with plugin files (for rule authors).
    #[command(subcommand)]
    Plugin(PluginCommand),
    /// Evaluations that failed in the host past their retry budget.
    DeadLetters {
        #[command(subcommand)]
        command: DeadLetterCommand,
        #[command(flatten)]
        flags: crate::config::ServeFlags,
    },
    /// Webhook deliveries that exhausted their attempts.
    Deliveries {
        #[command(subcommand)]
        command: DeliveryCommand,
        #[command(flatten)]
        flags: crate::config::ServeFlags,
    },
    /// Tools for development and demos.
    #[command(subcommand)]
    Dev(DevCommand),
}

#[derive(Debug, Subcommand)]
pub enum DeliveryCommand {
    /// List dead deliveries (or every delivery with --all).
    List {
        #[arg(long)]
        all: bool,
    },
    /// Send a dead delivery again (the running gavel's dispatcher picks it up).
    Replay { id: i64 },
}

#[derive(Debug, Subcommand)]
pub enum DevCommand {
    /// A stand-in classifier: accepts gavel's signed provider requests and
    /// answers each with a signed callback.
    FakeProvider {
        #[arg(long, default_value = "127.0.0.1:9090")]
        listen: std::net::SocketAddr,
        /// The provider's shared secret (as in `[providers.NAME] secret`).
        #[arg(long, env = "GAVEL_FAKE_PROVIDER_SECRET")]
        secret: String,
        /// The verdict of every answer: allow, flag, hold or reject.
        #[arg(long, default_value = "allow")]
        verdict: String,
        #[arg(long, default_value = "looks fine to the fake classifier")]
        reason: String,
        /// Wait this long before answering.
        #[arg(long, default_value_t = 1000)]
        delay_ms: u64,
        /// Send each answer this many times (a provider retrying its webhook).
        #[arg(long, default_value_t = 1)]
        copies: u32,
        /// Never answer (to watch the provider timeout).
        #[arg(long)]
        silent: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum DeadLetterCommand {
    /// List dead letters (open ones, or all with --all).
    List {
        #[arg(long)]
        all: bool,
    },
    /// Replay one: its item is evaluated again (by the running gavel).
    Replay { id: i64 },
}

#[derive(Debug, Subcommand)]
pub enum PluginCommand {
    /// Load and validate a component, print its info and digest, and
    /// evaluate it once on a sample snapshot.
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
    /// SDK's native harness runs), printing one line per case.
    Test {
        file: PathBuf,
        #[arg(long)]
        cases: PathBuf,
    },
}

fn parse_pair(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("expected key=value, got {s:?}"))
}

/// Runs a parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Serve(flags) => {
            let config = crate::config::Config::load(&flags)?;
            let runtime = tokio::runtime::Runtime::new()?;
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::bind(config.listen)
                    .await
                    .with_context(|| format!("binding {}", config.listen))?;
                crate::serve(config, listener, crate::shutdown_signal()).await
            })?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Plugin(cmd) => run_plugin(cmd),
        Command::DeadLetters { command, flags } => {
            let config = crate::config::Config::load(&flags)?;
            tokio::runtime::Runtime::new()?.block_on(run_dead_letters(config, command))
        }
        Command::Deliveries { command, flags } => {
            let config = crate::config::Config::load(&flags)?;
            tokio::runtime::Runtime::new()?.block_on(run_deliveries(config, command))
        }
        Command::Dev(DevCommand::FakeProvider {
            listen,
            secret,
            verdict,
            reason,
            delay_ms,
            copies,
            silent,
        }) => {
            anyhow::ensure!(
                verdict
                    .parse::<crate::domain::Verdict>()
                    .is_ok_and(|v| v != crate::domain::Verdict::Defer),
                "--verdict must be allow, flag, hold or reject"
            );
            let options = crate::providers::fake::FakeOptions {
                secret,
                verdict,
                reason,
                delay: std::time::Duration::from_millis(delay_ms),
                copies,
                silent,
                fail_first: 0,
            };
            tokio::runtime::Runtime::new()?.block_on(async move {
                let listener = tokio::net::TcpListener::bind(listen)
                    .await
                    .with_context(|| format!("binding {listen}"))?;
                let mut fake = crate::providers::fake::FakeProvider::start(listener, options)?;
                eprintln!("fake provider listening: configure `url = \"{}\"`", fake.url);
                tokio::select! {
                    _ = fake.wait() => {}
                    _ = crate::shutdown_signal() => {}
                }
                anyhow::Ok(())
            })?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

async fn run_deliveries(config: crate::config::Config, cmd: DeliveryCommand) -> anyhow::Result<ExitCode> {
    let store = crate::store::open(&crate::store::StoreOptions {
        max_connections: 2,
        ..config.store_options()
    })
    .await?;
    match cmd {
        DeliveryCommand::List { all } => {
            let deliveries = store.deliveries(all, 1000).await?;
            for d in &deliveries {
                println!(
                    "{}\t{}\tendpoint={}\tevent={}\tattempts={}\t{}",
                    d.id,
                    d.status,
                    d.endpoint,
                    d.event_id,
                    d.attempts,
                    d.last_error.as_deref().unwrap_or("")
                );
            }
            eprintln!("{} deliver(ies)", deliveries.len());
            Ok(ExitCode::SUCCESS)
        }
        DeliveryCommand::Replay { id } => {
            if store.replay_delivery(id, crate::clock::now_ms()).await? {
                println!("delivery {id} is pending again");
                Ok(ExitCode::SUCCESS)
            } else {
                eprintln!("no dead delivery {id}");
                Ok(ExitCode::FAILURE)
            }
        }
    }
}

fn run_plugin(cmd: PluginCommand) -> anyhow::Result<ExitCode> {
    let engine = RuleEngine::new(RuntimeLimits::default())?;
    match cmd {
        PluginCommand::Check { file, config } => {
            let plugin = match engine.load_file(&file) {
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
            let evaluation = evaluate_spec(&engine, &plugin, &spec)?;
            println!("sample:      {}", describe(&evaluation));
            Ok(exit_for(&evaluation))
        }
        PluginCommand::Eval { file, snapshot, config } => {
            let plugin = engine.load_file(&file)?;
            let json = match snapshot.strip_prefix('@') {
                Some(path) => std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?,
                None => snapshot,
            };
            let mut spec: SnapshotSpec = serde_json::from_str(&json).context("parsing --snapshot")?;
            spec.config.extend(config);
            let evaluation = evaluate_spec(&engine, &plugin, &spec)?;
            println!("{}", serde_json::to_string_pretty(&evaluation)?);
            Ok(exit_for(&evaluation))
        }
        PluginCommand::Test { file, cases } => run_cases(&engine, &file, &cases),
    }
}

fn print_info(plugin: &LoadedPlugin) {
    let phases: Vec<&str> = plugin.info.phases.iter().map(|p| p.as_str()).collect();
    println!("file:        {} ({} bytes)", plugin.path.display(), plugin.size);
    println!("name:        {}", plugin.info.name);
    println!("version:     {}", plugin.info.version);
    println!("description: {}", plugin.info.description);
    println!("phases:      {}", phases.join(", "));
    println!("digest:      sha256:{}", plugin.stamp.digest);
    println!("compiled in: {} ms", plugin.compile_time.as_millis());
}

fn evaluate_spec(engine: &RuleEngine, plugin: &LoadedPlugin, spec: &SnapshotSpec) -> Result<Evaluation, HostError> {
    let mut snapshot = snapshot_from_spec(spec);
    fit_snapshot(&mut snapshot, engine.limits().max_snapshot_bytes);
    engine.evaluate(plugin, &snapshot)
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

fn run_cases(engine: &RuleEngine, file: &Path, cases: &Path) -> anyhow::Result<ExitCode> {
    let plugin = engine.load_file(file)?;
    let json = std::fs::read_to_string(cases).with_context(|| format!("reading {}", cases.display()))?;
    let cases = parse_cases(&json).with_context(|| format!("parsing {}", file.display()))?;
    println!(
        "{} {} (sha256:{})",
        plugin.info.name,
        plugin.info.version,
        &plugin.stamp.digest.to_hex()[..16]
    );
    let mut failed = 0;
    for case in &cases {
        let evaluation = evaluate_spec(engine, &plugin, &case.snapshot)?;
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

async fn run_dead_letters(config: crate::config::Config, cmd: DeadLetterCommand) -> anyhow::Result<ExitCode> {
    let store = crate::store::open(&crate::store::StoreOptions {
        max_connections: 2,
        ..config.store_options()
    })
    .await?;
    match cmd {
        DeadLetterCommand::List { all } => {
            let letters = store.dead_letters(all, 1000).await?;
            for d in &letters {
                println!(
                    "{}\titem={}\tattempts={}\tfailed_at={}\treplayed_at={}\t{}",
                    d.id,
                    d.item_id,
                    d.attempts,
                    d.failed_at,
                    d.replayed_at.map_or_else(|| "-".to_string(), |t| t.to_string()),
                    d.last_error
                );
            }
            eprintln!("{} dead letter(s)", letters.len());
            Ok(ExitCode::SUCCESS)
        }
        DeadLetterCommand::Replay { id } => {
            match store.replay_dead_letter(id, crate::clock::now_ms()).await? {
                Some(item) => {
                    // With Redis, queue it now; the embedded coordinator lives in
                    // the serving process, whose reconciler picks the item up.
                    if let Some(url) = &config.redis_url {
                        let coordinator =
                            crate::coordinator::open(Some(url), &config.redis_prefix, config.redis_partitions).await?;
                        let now = crate::clock::now_ms();
                        coordinator
                            .schedule(&item, now, crate::coordinator::Schedule::At(now))
                            .await?;
                    }
                    println!("replayed dead letter {id}: item {item} will be evaluated again");
                    Ok(ExitCode::SUCCESS)
                }
                None => {
                    eprintln!("no open dead letter {id}");
                    Ok(ExitCode::FAILURE)
                }
            }
        }
    }
}
