//! B15 (docs/BENCHMARKS.md): `gavel export decisions` over a store of
//! 1,000,000 decisions (250,000 evaluations × 4 rules, written through the
//! store's own evaluation commits), to NDJSON, Parquet and CSV: rows per
//! second of wall time, the export process's CPU, and its peak RSS, against
//! an export of a tenth of the rows (flat: memory does not grow with rows).

use crate::report::Figure;
use crate::system::{Gavel, Sizes, rust_plugins};
use std::path::Path;
use std::time::{Duration, Instant};

/// Plugins each seeded evaluation carries a decision of.
const PLUGINS: [(&str, &str, &str); 4] = [
    ("link-spam", "0.0.1", "seeded-link-spam"),
    ("duplicate-burst", "0.0.1", "seeded-duplicate-burst"),
    ("flag-ratio", "0.0.1", "seeded-flag-ratio"),
    ("banned-terms", "0.0.1", "seeded-banned-terms"),
];

/// One export's cost: wall seconds, CPU seconds, peak RSS (MiB), rows.
struct Run {
    wall: f64,
    cpu: f64,
    peak_mib: f64,
    rows: u64,
}

/// Runs `gavel export decisions --format FORMAT` (with `extra` flags) and
/// measures that one process: CPU from its own rusage (wait4), peak RSS
/// from its `VmHWM`, read every 5 ms while it runs. (`ru_maxrss` is no use
/// here: Linux folds the RSS of the memory the child was forked with, this
/// harness's, into it at exec.)
fn export(gavel_bin: &Path, config: &Path, format: &str, out: &Path, extra: &[String]) -> anyhow::Result<Run> {
    let started = Instant::now();
    let child = std::process::Command::new(gavel_bin)
        .args(["export", "decisions", "--format", format, "--gavel-config"])
        .arg(config)
        .arg("--out")
        .arg(out)
        .args(extra)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    let pid = child.id() as libc::pid_t;
    let watching = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let watcher = {
        let watching = watching.clone();
        std::thread::spawn(move || {
            let mut peak_kib = 0u64;
            while watching.load(std::sync::atomic::Ordering::Relaxed) {
                // Gone (exited) or not yet there: the last reading stands.
                if let Some(kib) = std::fs::read_to_string(format!("/proc/{pid}/status"))
                    .ok()
                    .and_then(|s| {
                        s.lines()
                            .find_map(|l| l.strip_prefix("VmHWM:"))
                            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                    })
                {
                    peak_kib = peak_kib.max(kib);
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            peak_kib
        })
    };
    let mut stderr = child.stderr.expect("piped");
    let mut said = String::new();
    std::io::Read::read_to_string(&mut stderr, &mut said)?;
    // SAFETY: wait4 reaps our own child and fills the zeroed structs it is given.
    let (status, usage) = unsafe {
        let mut status = 0;
        let mut usage: libc::rusage = std::mem::zeroed();
        anyhow::ensure!(libc::wait4(pid, &mut status, 0, &mut usage) == pid, "wait4 failed");
        (status, usage)
    };
    let wall = started.elapsed().as_secs_f64();
    watching.store(false, std::sync::atomic::Ordering::Relaxed);
    let peak_kib = watcher.join().expect("the RSS watcher does not panic");
    anyhow::ensure!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "B15: export failed: {said}"
    );
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    let rows = said
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("B15: no row count in {said:?}"))?;
    Ok(Run {
        wall,
        cpu: secs(usage.ru_utime) + secs(usage.ru_stime),
        peak_mib: peak_kib as f64 / 1024.0,
        rows,
    })
}

pub async fn b15(gavel_bin: &Path, sizes: Sizes) -> anyhow::Result<Vec<Figure>> {
    let evaluations = if sizes.quick { 5_000 } else { 250_000 };
    let dir = tempfile::tempdir()?;
    let gavel = Gavel::start(gavel_bin, dir.path(), &rust_plugins(), "").await?;
    let http = reqwest::Client::new();
    let hot = crate::system::seed_items(&http, &gavel.url, 1, |tag, i| {
        serde_json::json!({"kind": "post", "author": format!("{tag}-{i}"), "text": format!("an ordinary post {i}")})
    })
    .await?;
    let hot = &hot[0];
    crate::system::wait_settled(&http, &gavel.url, hot).await?;
    let seeding = Instant::now();
    let start_ms = gavel::clock::now_ms() - evaluations as i64;
    let store = gavel::store::open_url(&format!("sqlite://{}", dir.path().join("data/gavel.db").display()), 1).await?;
    gavel_tests::history::seed_evaluations(&store, hot, "an ordinary post 0", &PLUGINS, evaluations, start_ms).await?;
    drop(store);
    drop(gavel);
    eprintln!(
        "B15: {} decisions stored in {:.1} s",
        evaluations * PLUGINS.len(),
        seeding.elapsed().as_secs_f64()
    );
    let config = dir.path().join("gavel.toml");
    let out = dir.path().join("export");
    // The last tenth of the window: the same export over a tenth of the rows.
    let tenth = vec![
        "--since".to_string(),
        (start_ms + evaluations as i64 * 9 / 10).to_string(),
    ];
    // No row at all: what opening the store costs the process.
    let none = vec!["--since".to_string(), (gavel::clock::now_ms() + 86_400_000).to_string()];
    let empty = export(gavel_bin, &config, "ndjson", &out, &none)?;
    let mut figures = Vec::new();
    for (format, goal) in [("ndjson", Some(200_000.0)), ("parquet", Some(100_000.0)), ("csv", None)] {
        let all = export(gavel_bin, &config, format, &out, &[])?;
        let size = std::fs::metadata(&out)?.len() as f64 / (1 << 20) as f64;
        let part = export(gavel_bin, &config, format, &out, &tenth)?;
        let rate = all.rows as f64 / all.wall;
        let mut figure = Figure::new("B15", format!("export decisions to {format}"), rate, "rows/s").note(format!(
            "{} rows in {:.2} s ({:.2} µs CPU/row), {size:.0} MiB; peak RSS {:.0} MiB, {:.0} MiB for {} rows, \
             {:.0} MiB for none (the open store)",
            all.rows,
            all.wall,
            all.cpu / all.rows as f64 * 1e6,
            all.peak_mib,
            part.peak_mib,
            part.rows,
            empty.peak_mib
        ));
        if let Some(goal) = goal {
            figure = figure.goal(format!("≥ {goal:.0} rows/s"), rate >= goal);
        }
        figures.push(figure);
        figures.push(
            Figure::new(
                "B15",
                format!("{format} export peak RSS, all rows vs a tenth"),
                all.peak_mib,
                "MiB",
            )
            .against("a tenth of the rows", part.peak_mib)
            .goal("flat (≤ 1.2× a tenth's)", all.peak_mib <= part.peak_mib * 1.2),
        );
    }
    Ok(figures)
}
