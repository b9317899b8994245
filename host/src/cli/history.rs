//! `gavel backtest` and `gavel replay`: judging stored history again with a
//! candidate plugin, from the command line. Both read the store `gavel
//! serve` uses (the same configuration) and write no data to it (opening
//! it applies pending migrations, as every gavel command does).

use super::parse_pair;
use crate::backtest::{self, Candidate, Progress, Report};
use crate::clock::{Millis, format_utc, now_ms};
use anyhow::Context;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

/// Where the store is: the same settings `gavel serve` reads.
#[derive(Debug, Clone, clap::Args)]
pub struct StoreFlags {
    /// The gavel config file (`gavel serve --config`).
    #[arg(long = "gavel-config", env = "GAVEL_CONFIG")]
    pub gavel_config: Option<PathBuf>,
    /// Data directory (default ./data).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Database URL: sqlite://PATH or postgres://… (default sqlite://DATA_DIR/gavel.db).
    #[arg(long)]
    pub database_url: Option<String>,
}

impl StoreFlags {
    fn config(&self) -> anyhow::Result<crate::config::Config> {
        crate::config::Config::load(&crate::config::ServeFlags {
            config: self.gavel_config.clone(),
            data_dir: self.data_dir.clone(),
            database_url: self.database_url.clone(),
            ..Default::default()
        })
    }
}

#[derive(Debug, clap::Args)]
pub struct BacktestArgs {
    /// The candidate component (`.wasm`); its sidecar `NAME.toml`, if any,
    /// gives its config and limits.
    #[arg(long)]
    pub candidate: PathBuf,
    /// The plugin whose decisions it replaces (default: its own name).
    #[arg(long)]
    pub replaces: Option<String>,
    /// Config pairs on top of the candidate's config, `key=value` (repeatable).
    #[arg(long = "config", value_parser = parse_pair)]
    pub config: Vec<(String, String)>,
    /// Start of the window: ms since the epoch, or an age such as `30m`,
    /// `24h`, `7d` (default: 7d).
    #[arg(long, value_parser = parse_time, default_value = "7d")]
    pub since: Millis,
    /// End of the window (excluded), as `--since` (default: now).
    #[arg(long, value_parser = parse_time)]
    pub until: Option<Millis>,
    /// Evaluations to draw at random (reproducibly) from the window.
    #[arg(long, conflicts_with = "all")]
    pub sample: Option<u64>,
    /// Replay every evaluation of the window.
    #[arg(long)]
    pub all: bool,
    /// Write the report as JSON to this file (`-`: standard output).
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write the report as a self-contained HTML page to this file.
    #[arg(long)]
    pub html: Option<PathBuf>,
    #[command(flatten)]
    pub store: StoreFlags,
}

#[derive(Debug, clap::Args)]
pub struct ReplayArgs {
    /// The item's id.
    pub item: String,
    /// Also judge each stored snapshot with this component.
    #[arg(long)]
    pub candidate: Option<PathBuf>,
    /// Evaluations shown, the newest first chosen (1-200).
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..=200))]
    pub limit: u64,
    /// Only evaluations made before this decision id (the `older` a
    /// previous page printed).
    #[arg(long)]
    pub before: Option<i64>,
    /// Print the replay as JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub store: StoreFlags,
}

/// `1700000000000` (ms since the epoch) or an age: `90s`, `30m`, `24h`, `7d`.
pub fn parse_time(s: &str) -> Result<Millis, String> {
    if let Ok(ms) = s.parse::<i64>() {
        return Ok(ms);
    }
    let unit = s.chars().last().ok_or("empty time")?;
    let per: i64 = match unit {
        's' => 1_000,
        'm' => 60_000,
        'h' => 3_600_000,
        'd' => 86_400_000,
        _ => return Err(format!("expected ms since the epoch or an age like 7d, got {s:?}")),
    };
    let n: i64 = s[..s.len() - 1]
        .parse()
        .map_err(|_| format!("expected ms since the epoch or an age like 7d, got {s:?}"))?;
    Ok(now_ms() - n.saturating_mul(per))
}

/// The store, the engine (the server's limits and compilation cache) and
/// a registry to prepare candidates with.
async fn open(
    flags: &StoreFlags,
) -> anyhow::Result<(
    crate::config::Config,
    crate::store::SharedStore,
    Arc<crate::rules::Registry>,
)> {
    let (config, store) = open_store(flags).await?;
    let engine = crate::rules::RuleEngine::new(config.limits.clone())?;
    let cache = config.data_dir.join("cache");
    let engine = match std::fs::create_dir_all(&cache) {
        Ok(()) => engine.with_cache(&cache)?,
        Err(_) => engine,
    };
    Ok((config, store, Arc::new(crate::rules::Registry::new(Arc::new(engine)))))
}

/// The store `gavel serve` uses, as `flags` name it; never a new, empty
/// SQLite database made by mistake.
pub(super) async fn open_store(
    flags: &StoreFlags,
) -> anyhow::Result<(crate::config::Config, crate::store::SharedStore)> {
    let config = flags.config()?;
    let url = config.database_url();
    if let Some(path) = url.strip_prefix("sqlite://").and_then(|p| p.split('?').next()) {
        anyhow::ensure!(
            Path::new(path).is_file(),
            "no database at {path}: give the store `gavel serve` uses (--gavel-config, --data-dir or --database-url)"
        );
    }
    let store = crate::store::open(&crate::store::StoreOptions {
        max_connections: 2,
        ..config.store_options()
    })
    .await?;
    Ok((config, store))
}

async fn prepare(registry: &Arc<crate::rules::Registry>, file: &Path) -> anyhow::Result<Candidate> {
    let (registry, file) = (registry.clone(), file.to_path_buf());
    tokio::task::spawn_blocking(move || Candidate::from_file(&registry, &file))
        .await?
        .map_err(|e| anyhow::anyhow!("candidate not loadable: {e}"))
}

/// A progress bar on a terminal (nothing otherwise).
struct Bar(indicatif::ProgressBar);

#[async_trait::async_trait]
impl Progress for Bar {
    async fn advance(&mut self, done: u64, total: u64) -> bool {
        self.0.set_length(total);
        self.0.set_position(done);
        true
    }
}

pub async fn backtest(args: BacktestArgs) -> anyhow::Result<ExitCode> {
    let (config, store, registry) = open(&args.store).await?;
    let candidate = prepare(&registry, &args.candidate).await?;
    let request = backtest::Request {
        replaces: args.replaces.clone(),
        overrides: args.config.clone(),
        since_ms: args.since,
        until_ms: args.until.unwrap_or_else(now_ms),
        sample: backtest::sample_size(args.all, args.sample),
        max_all: config.evaluation.backtest_max_all,
        fail_closed: config.evaluation.fail_closed,
    };
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} evaluations, {per_sec}, {eta} left")
            .expect("a valid template"),
    );
    let mut progress = Bar(bar);
    let report = backtest::run(
        store.as_ref(),
        registry.engine().clone(),
        &candidate,
        &request,
        &mut progress,
    )
    .await;
    progress.0.finish_and_clear();
    let report = report?;
    print!("{}", summary(&report));
    if let Some(path) = &args.json {
        let json = serde_json::to_string_pretty(&report)?;
        if path.as_os_str() == "-" {
            println!("{json}");
        } else {
            std::fs::write(path, json).with_context(|| format!("writing {}", path.display()))?;
        }
    }
    if let Some(path) = &args.html {
        std::fs::write(path, backtest::html::render(&report)).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("report: {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// The terminal summary of a report.
pub fn summary(r: &Report) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let c = &r.candidate;
    let _ = writeln!(out, "candidate   {} {} (sha256:{})", c.name, c.version, &c.digest[..12]);
    let incumbents: Vec<String> = r
        .incumbent
        .iter()
        .map(|v| {
            format!(
                "{} {} (sha256:{})",
                v.name,
                v.version,
                &v.digest[..12.min(v.digest.len())]
            )
        })
        .collect();
    let _ = writeln!(
        out,
        "replaces    {}",
        if incumbents.is_empty() {
            format!("{} (no stored decisions: judged as a new plugin)", r.replaces)
        } else {
            incumbents.join(", ")
        }
    );
    let _ = writeln!(
        out,
        "window      {} to {}",
        format_utc(r.window.since_ms),
        format_utc(r.window.until_ms)
    );
    let s = &r.sample;
    let skipped: u64 = s.not_replayable.values().sum();
    let _ = writeln!(
        out,
        "sample      {} replayed of {} drawn ({} in the window){}",
        s.replayed,
        s.replayed + skipped,
        s.available,
        if skipped > 0 {
            let reasons: Vec<String> = s.not_replayable.iter().map(|(k, v)| format!("{k}: {v}")).collect();
            format!("; not replayable: {}", reasons.join(", "))
        } else {
            String::new()
        }
    );
    let f = &r.flips;
    let _ = writeln!(out);
    let _ = writeln!(out, "{:<16}{:>10}", "status", "evaluations");
    for (name, n) in [
        ("unchanged", f.unchanged),
        ("newly actioned", f.newly_actioned),
        ("newly cleared", f.newly_cleared),
        ("changed", f.changed),
    ] {
        let _ = writeln!(out, "{name:<16}{n:>10}");
    }
    let _ = writeln!(out);
    let _ = writeln!(out, "verdicts (old → new)");
    for (from, row) in &r.verdicts {
        for (to, n) in row {
            let _ = writeln!(out, "  {from:>8} → {to:<8}{n:>10}");
        }
    }
    let m = &r.moderators;
    let pct = |x: Option<f64>| x.map_or_else(|| "-".to_string(), |x| format!("{:.1} %", x * 100.0));
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "moderators  {} decided; agree with old {}, with new {}; reversals avoided {}, overturns reintroduced {}",
        m.decided,
        pct(m.old_agreement),
        pct(m.new_agreement),
        m.reversals_avoided,
        m.overturns_reintroduced
    );
    let outcomes: Vec<String> = r.outcomes.iter().map(|(k, v)| format!("{k} {v}")).collect();
    let _ = writeln!(out, "outcomes    {}", outcomes.join(", "));
    let l = &r.latency_us;
    let _ = writeln!(
        out,
        "latency     candidate p50 {} µs p99 {} µs{}",
        l.candidate.p50,
        l.candidate.p99,
        l.incumbent
            .map(|i| format!("; incumbent p50 {} µs p99 {} µs", i.p50, i.p99))
            .unwrap_or_default()
    );
    if let Some(fid) = r.fidelity {
        let _ = writeln!(
            out,
            "fidelity    {} of {} stored decisions of this digest reproduced{}",
            fid.identical,
            fid.checked,
            if fid.identical == fid.checked {
                ""
            } else {
                " (MISMATCH)"
            }
        );
    }
    out
}

pub async fn replay(args: ReplayArgs) -> anyhow::Result<ExitCode> {
    let (_, store, registry) = open(&args.store).await?;
    let candidate = match &args.candidate {
        Some(file) => Some(prepare(&registry, file).await?),
        None => None,
    };
    let page = backtest::ReplayPage {
        before: args.before,
        limit: args.limit as usize,
    };
    let replay = backtest::replay_item(store.as_ref(), registry.engine(), &args.item, candidate.as_ref(), page).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&replay)?);
        return Ok(ExitCode::SUCCESS);
    }
    if replay.evaluations.is_empty() {
        eprintln!("no stored evaluation of item {}", args.item);
        return Ok(ExitCode::FAILURE);
    }
    for (i, e) in replay.evaluations.iter().enumerate() {
        println!(
            "#{} {}  {} phase, item version {}{}",
            i + 1,
            format_utc(e.at_ms),
            e.phase,
            e.item_version,
            e.snapshot_digest
                .as_deref()
                .map(|d| format!(", snapshot sha256:{}", &d[..12]))
                .unwrap_or_default()
        );
        if let Some(s) = &e.snapshot {
            let text = s["item"]["text"].as_str().unwrap_or_default();
            let text: String = text.chars().take(100).collect();
            println!("   text      {text:?}");
            println!("   counters  {}", s["counters"]);
            println!("   author    {}", s["author"]);
        }
        for d in &e.decisions {
            println!(
                "   {:<14} {:<8} {:<7} {:<6} {:.2} [{}] {:?}{}{}",
                d.plugin,
                d.plugin_version,
                d.mode.as_str(),
                d.verdict.map_or(d.outcome.as_str(), |v| v.as_str()),
                d.score,
                d.labels.join(","),
                d.reason,
                if d.applied { " (applied)" } else { "" },
                if d.reversed_at.is_some() { " (overturned)" } else { "" }
            );
        }
        match (&e.candidate, &e.not_replayable) {
            (Some(c), _) => println!("   candidate {}", crate::cli::describe(c)),
            (None, Some(why)) if candidate.is_some() => println!("   candidate not replayable: {why}"),
            (None, Some(why)) => println!("   ({why})"),
            _ => {}
        }
    }
    if let Some(older) = replay.older {
        println!("older evaluations are stored: --before {older}");
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::parse_time;

    #[test]
    fn times_are_epoch_ms_or_ages() {
        assert_eq!(parse_time("1700000000000"), Ok(1_700_000_000_000));
        let week = parse_time("7d").unwrap();
        assert!((crate::clock::now_ms() - week - 7 * 86_400_000).abs() < 5_000);
        assert!(parse_time("7w").is_err());
        assert!(parse_time("").is_err());
        assert!(parse_time("xd").is_err());
    }
}
