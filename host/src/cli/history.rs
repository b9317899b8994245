//! `gavel backtest` and `gavel replay`: judging stored history again with a
//! candidate plugin or candidate lists, from the command line. Both read
//! the store `gavel serve` uses (the same configuration) and write no data
//! to it (opening it applies pending migrations, as every gavel command
//! does).

use super::parse_pair;
use crate::backtest::{self, Candidate, Candidates, GivenList, Progress, Report};
use crate::clock::{Millis, format_utc, now_ms};
use crate::lists::{Entry, ListKind};
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

/// What `gavel backtest --help` says after the options.
const BACKTEST_HELP: &str = "\
Every rule's list calls are answered from the list versions each replayed decision used (a list it did \
not consult: the version in force at its time, else unknown), or from a candidate list given with --list.

A candidate list file holds one entry per line (each line trimmed; blank lines and lines starting with `#` \
are left out), or, named `*.json`, the body `PUT /v1/lists/{name}` takes \
(`{\"kind\": …, \"entries\": [{\"value\": …, \"note\": …}]}`; `kind` and `reason` optional). Its entries are \
checked as `PUT` checks them.

Examples:
  gavel backtest --candidate new/banned-terms.wasm --since 7d
  gavel backtest --list scam-phrases=phrases.txt --since 7d    (the deployed plugins that consulted it)
  gavel backtest --candidate probe.wasm --list new-domains:domains=domains.txt";

/// `gavel backtest`: what to replay with, over which window, and where
/// the report goes.
#[derive(Debug, clap::Args)]
#[command(after_help = BACKTEST_HELP)]
pub struct BacktestArgs {
    /// The candidate component (`.wasm`); its sidecar `NAME.toml`, if any,
    /// gives its config and limits. Without one, `--list` is required and
    /// the deployed plugins (`--plugin-dir`) whose decisions in the window
    /// consulted one of the lists are replayed, each in place of its own
    /// decisions.
    #[arg(long, required_unless_present = "lists")]
    pub candidate: Option<PathBuf>,
    /// The plugin whose decisions it replaces (default: its own name).
    #[arg(long, requires = "candidate")]
    pub replaces: Option<String>,
    /// A candidate list, `NAME=FILE`, in place of the stored list NAME
    /// (repeatable); `NAME:KIND=FILE` for a list the store does not have
    /// (KIND: terms, patterns, domains, strings or cidrs).
    #[arg(long = "list", id = "lists", value_name = "NAME[:KIND]=FILE", value_parser = parse_list_arg)]
    pub lists: Vec<ListArg>,
    /// The deployed plugins, for `--list` without `--candidate` (default:
    /// the configuration's `plugin_dir`).
    #[arg(long, conflicts_with = "candidate")]
    pub plugin_dir: Option<PathBuf>,
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

/// `--list NAME[:KIND]=FILE`, as given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListArg {
    pub name: String,
    pub kind: Option<ListKind>,
    pub file: PathBuf,
}

fn parse_list_arg(s: &str) -> Result<ListArg, String> {
    let (target, file) = s
        .split_once('=')
        .filter(|(_, file)| !file.is_empty())
        .ok_or_else(|| format!("expected NAME=FILE or NAME:KIND=FILE, got {s:?}"))?;
    let (name, kind) = match target.split_once(':') {
        Some((name, kind)) => (name, Some(kind.parse::<ListKind>().map_err(|e| e.to_string())?)),
        None => (target, None),
    };
    if !crate::lists::valid_name(name) {
        return Err(format!(
            "{name:?} is not a list name: 1-64 lowercase letters, digits, `.`, `_` and `-`"
        ));
    }
    Ok(ListArg {
        name: name.to_string(),
        kind,
        file: PathBuf::from(file),
    })
}

/// A candidate list file in JSON: the body `PUT /v1/lists/{name}` takes,
/// its reason optional (and unused here).
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ListFile {
    kind: Option<ListKind>,
    #[serde(default)]
    #[allow(dead_code, reason = "accepted so a PUT body can be backtested as it is")]
    reason: Option<String>,
    entries: Vec<Entry>,
}

/// The entries of a text list file: one per line, trimmed; blank lines and
/// lines starting with `#` left out.
fn entries_from_lines(text: &str) -> Vec<Entry> {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(Entry::new)
        .collect()
}

/// A `--list` file's entries (and kind, when its JSON gives one): JSON
/// when named `*.json`, else one entry per line.
fn read_list_file(arg: &ListArg) -> anyhow::Result<GivenList> {
    let path = &arg.file;
    let text = std::fs::read_to_string(path).with_context(|| format!("reading list file {}", path.display()))?;
    let (kind, entries) = if path.extension().is_some_and(|e| e.eq_ignore_ascii_case("json")) {
        let file: ListFile = serde_json::from_str(&text).with_context(|| format!("list file {}", path.display()))?;
        (file.kind, file.entries)
    } else {
        (None, entries_from_lines(&text))
    };
    let kind = match (arg.kind, kind) {
        (Some(a), Some(f)) if a != f => {
            anyhow::bail!(
                "--list {} says kind {a}, its file {} says {f}",
                arg.name,
                path.display()
            )
        }
        (a, f) => a.or(f),
    };
    Ok(GivenList {
        name: arg.name.clone(),
        kind,
        entries,
    })
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

/// What `args` judges with: its candidate, else the plugins of the plugin
/// directory whose decisions in the window consulted its lists.
async fn candidates(
    args: &BacktestArgs,
    config: &crate::config::Config,
    store: &crate::store::SharedStore,
    registry: &Arc<crate::rules::Registry>,
    request: &backtest::Request,
) -> anyhow::Result<Candidates> {
    let given = args
        .lists
        .iter()
        .map(read_list_file)
        .collect::<anyhow::Result<Vec<_>>>()?;
    let lists = backtest::candidate_lists(store.as_ref(), given, &config.lists).await?;
    if let Some(file) = &args.candidate {
        return Ok(Candidates::plugin(prepare(registry, file).await?, lists));
    }
    let dir = args.plugin_dir.clone().unwrap_or_else(|| config.plugin_dir.clone());
    let loading = registry.clone();
    let loaded = dir.clone();
    tokio::task::spawn_blocking(move || loading.load_dir(&loaded))
        .await?
        .with_context(|| format!("loading the deployed plugins from {}", dir.display()))?;
    let names: Vec<String> = lists.keys().cloned().collect();
    let found = Candidates::deployed_consulting(store.as_ref(), registry, lists, request).await?;
    anyhow::ensure!(
        !found.plugins.is_empty(),
        "no plugin of {} made a decision in the window that consulted {}",
        dir.display(),
        names.join(", ")
    );
    Ok(found)
}

pub async fn backtest(args: BacktestArgs) -> anyhow::Result<ExitCode> {
    let (config, store, registry) = open(&args.store).await?;
    let request = backtest::Request {
        replaces: args.replaces.clone(),
        overrides: args.config.clone(),
        since_ms: args.since,
        until_ms: args.until.unwrap_or_else(now_ms),
        sample: backtest::sample_size(args.all, args.sample),
        max_all: config.evaluation.backtest_max_all,
        fail_closed: config.evaluation.fail_closed,
    };
    let candidates = candidates(&args, &config, &store, &registry, &request).await?;
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} evaluations, {per_sec}, {eta} left")
            .expect("a valid template"),
    );
    let mut progress = Bar(bar);
    let report = backtest::run(
        store.as_ref(),
        registry.engine().clone(),
        &candidates,
        &config.lists,
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

/// `NAME VERSION (sha256:PREFIX)`.
fn version(v: &backtest::report::VersionRef) -> String {
    format!(
        "{} {} (sha256:{})",
        v.name,
        v.version,
        &v.digest[..12.min(v.digest.len())]
    )
}

/// The terminal summary of a report.
pub fn summary(r: &Report) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let candidates: Vec<String> = match &r.candidates[..] {
        [] => vec![version(&r.candidate)],
        many => many.iter().map(version).collect(),
    };
    let _ = writeln!(out, "candidate   {}", candidates.join(", "));
    for l in &r.lists {
        let _ = writeln!(
            out,
            "list        {} ({}, {} entries, sha256:{})",
            l.name,
            l.kind,
            l.entries,
            &l.digest[..12.min(l.digest.len())]
        );
    }
    let incumbents: Vec<String> = r.incumbent.iter().map(version).collect();
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
    let (config, store, registry) = open(&args.store).await?;
    let candidate = match &args.candidate {
        Some(file) => Some(prepare(&registry, file).await?),
        None => None,
    };
    let page = backtest::ReplayPage {
        before: args.before,
        limit: args.limit as usize,
    };
    let replay = backtest::replay_item(
        store.as_ref(),
        registry.engine(),
        &args.item,
        candidate.as_ref(),
        page,
        &config.lists,
    )
    .await?;
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
    use super::*;

    #[test]
    fn a_list_argument_names_the_list_its_kind_and_file() {
        assert_eq!(
            parse_list_arg("scam-phrases=new/phrases.txt"),
            Ok(ListArg {
                name: "scam-phrases".into(),
                kind: None,
                file: "new/phrases.txt".into()
            })
        );
        let arg = parse_list_arg("short.links:domains=a=b.txt").unwrap();
        assert_eq!(
            (arg.name.as_str(), arg.kind, arg.file),
            ("short.links", Some(ListKind::Domains), PathBuf::from("a=b.txt")),
            "the first `=` ends the name"
        );
        assert!(parse_list_arg("scam").is_err());
        assert!(parse_list_arg("scam=").is_err());
        assert!(parse_list_arg("Scam=x.txt").unwrap_err().contains("not a list name"));
        assert!(parse_list_arg("scam:words=x.txt").is_err(), "no such kind");
    }

    #[test]
    fn a_text_list_file_is_one_entry_per_line_without_comments() {
        let text =
            "# phrases seen in the March wave\nfree money\n\n  miracle cure  \r\n\t# indented comment\nc#-sharp scam\n";
        let values: Vec<String> = entries_from_lines(text).into_iter().map(|e| e.value).collect();
        assert_eq!(values, ["free money", "miracle cure", "c#-sharp scam"]);
        assert!(entries_from_lines("").is_empty());
    }

    #[test]
    fn a_json_list_file_is_a_put_body() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("hosts.JSON");
        std::fs::write(
            &file,
            r#"{"kind": "domains", "reason": "tried first", "entries": [{"value": "bit.ly", "note": "shortener"}]}"#,
        )
        .unwrap();
        let arg = ListArg {
            name: "hosts".into(),
            kind: None,
            file: file.clone(),
        };
        let given = read_list_file(&arg).unwrap();
        assert_eq!(given.kind, Some(ListKind::Domains));
        assert_eq!(given.entries[0].note.as_deref(), Some("shortener"));
        let clash = ListArg {
            kind: Some(ListKind::Terms),
            ..arg.clone()
        };
        assert!(
            read_list_file(&clash)
                .unwrap_err()
                .to_string()
                .contains("says kind terms")
        );
        std::fs::write(&file, r#"{"entries": [], "extra": 1}"#).unwrap();
        assert!(read_list_file(&arg).is_err(), "unknown fields are refused");
        let missing = ListArg {
            file: dir.path().join("absent.txt"),
            ..arg
        };
        assert!(read_list_file(&missing).unwrap_err().to_string().contains("absent.txt"));
    }

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
