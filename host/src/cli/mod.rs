//! The `gavel` command line.

mod export;
mod history;
mod plugin;
mod scaffold;

pub use plugin::{PluginCommand, describe, evaluate_case};
pub use scaffold::Lang;

use crate::telemetry::LogFormat;
use anyhow::Context;
use clap::{Parser, Subcommand};
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

impl Cli {
    /// The log filter when `RUST_LOG` is unset: `info`; the rule author's
    /// commands show the rule's own log lines and gavel's warnings, and
    /// `plugin bench` not even the rule's lines, which would bury the timings.
    pub fn default_log_filter(&self) -> &'static str {
        match self.command {
            Command::Plugin(PluginCommand::Bench { .. }) => "warn,plugin=off",
            Command::Plugin(_) => "warn,plugin=info",
            // A backtest evaluates thousands of times: the rule's own lines would bury the summary.
            Command::Backtest(_) | Command::Replay(_) => "warn,plugin=off",
            // A child compiler's output is read by its parent.
            Command::CompileComponent { .. } => "error",
            _ => "info",
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the HTTP API and the evaluation loop (SQLite in ./data and the
    /// plugins in ./plugins by default).
    Serve(crate::config::ServeFlags),
    /// Work with plugin files (for rule authors).
    #[command(subcommand)]
    Plugin(PluginCommand),
    /// Replay stored evaluations with a candidate plugin version, candidate
    /// list contents, or both, and report what would have changed (reads
    /// the store; writes nothing).
    Backtest(history::BacktestArgs),
    /// Every stored evaluation of one item, what each plugin decided, and
    /// what a candidate decides on the same snapshot now.
    Replay(history::ReplayArgs),
    /// Write decisions, transitions, items or authors to NDJSON, CSV or
    /// Parquet for a warehouse (reads the store; writes nothing to it).
    Export(export::ExportArgs),
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
    /// Print a new signing secret (`whsec_` + 32 random bytes, base64) to
    /// add to a secrets file when rotating.
    Secret,
    /// Tools for development and demos.
    #[command(subcommand)]
    Dev(DevCommand),
    /// Compile the component on standard input for `gavel serve`, which
    /// runs it as a child process (not for direct use).
    #[command(name = "compile-component", hide = true)]
    CompileComponent {
        /// The engine's wasm stack limit, which the compiler settings follow.
        #[arg(long)]
        max_wasm_stack: usize,
        /// Where to write the compiled artifact.
        #[arg(long)]
        output: std::path::PathBuf,
    },
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
    /// List webhook endpoints: enabled, or disabled by a 410 Gone answer.
    Endpoints,
    /// Enable an endpoint its receiver disabled with 410 Gone (its waiting
    /// deliveries are sent by the running gavel).
    Enable { endpoint: String },
}

#[derive(Debug, Subcommand)]
pub enum DevCommand {
    /// A stand-in classifier: accepts gavel's signed provider requests and
    /// answers each with a signed callback.
    FakeProvider {
        #[arg(long, default_value = "127.0.0.1:9090")]
        listen: std::net::SocketAddr,
        /// The provider's shared secret (as in `[providers.NAME] secret`,
        /// `whsec_…` or a legacy raw secret).
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

pub(crate) fn parse_pair(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("expected key=value, got {s:?}"))
}

/// Runs a parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Serve(flags) => {
            let mut config = crate::config::Config::load(&flags)?;
            // Components are compiled by this binary in a child process
            // (`/proc/self/exe` is the running binary even once its file
            // has been replaced by an upgrade).
            config.compiler_process = Some(
                Some(std::path::PathBuf::from("/proc/self/exe"))
                    .filter(|p| p.exists())
                    .map_or_else(std::env::current_exe, Ok)?,
            );
            let runtime = tokio::runtime::Runtime::new()?;
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::bind(config.listen)
                    .await
                    .with_context(|| format!("binding {}", config.listen))?;
                crate::serve(config, listener, crate::shutdown_signal()).await
            })?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Plugin(cmd) => plugin::run(cmd),
        Command::Backtest(args) => tokio::runtime::Runtime::new()?.block_on(history::backtest(args)),
        Command::Replay(args) => tokio::runtime::Runtime::new()?.block_on(history::replay(args)),
        Command::Export(args) => tokio::runtime::Runtime::new()?.block_on(export::export(args)),
        Command::DeadLetters { command, flags } => {
            let config = crate::config::Config::load(&flags)?;
            tokio::runtime::Runtime::new()?.block_on(run_dead_letters(config, command))
        }
        Command::Deliveries { command, flags } => {
            let config = crate::config::Config::load(&flags)?;
            tokio::runtime::Runtime::new()?.block_on(run_deliveries(config, command))
        }
        Command::CompileComponent { max_wasm_stack, output } => {
            crate::rules::compile_from_stdin(max_wasm_stack, &output)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Secret => {
            println!("{}", crate::signing::Secret::generate());
            Ok(ExitCode::SUCCESS)
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
        DeliveryCommand::Endpoints => {
            for e in store.webhook_endpoints().await? {
                let state = match (&e.disabled_at, &e.disabled_reason) {
                    (Some(at), reason) => format!("disabled at {at} ({})", reason.as_deref().unwrap_or("")),
                    (None, _) => "enabled".to_string(),
                };
                println!("{}	{state}	pending={}", e.endpoint, e.pending);
            }
            Ok(ExitCode::SUCCESS)
        }
        DeliveryCommand::Enable { endpoint } => {
            if store.enable_endpoint(&endpoint, "cli", crate::clock::now_ms()).await? {
                println!("endpoint {endpoint} is enabled again");
                Ok(ExitCode::SUCCESS)
            } else {
                eprintln!("no disabled endpoint {endpoint}");
                Ok(ExitCode::FAILURE)
            }
        }
    }
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
