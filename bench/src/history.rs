//! B11: historical analysis. What storing every evaluation's snapshot costs
//! end to end (B4's embedded run with `store_snapshots` off and on, side by
//! side in one run, their runs alternating), what it takes on disk, and how
//! fast `gavel backtest` replays stored snapshots (on one core: a backtest
//! judges on one thread).

use crate::report::Figure;
use crate::system::{Gavel, Sizes, rust_plugins, settle_runs_alternating};
use std::path::Path;
use std::time::Instant;

/// User + system CPU seconds of this process's finished children.
fn children_cpu() -> f64 {
    // SAFETY: getrusage writes into the zeroed struct it is given.
    let usage = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_CHILDREN, &mut u);
        u
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

pub async fn b11(gavel_bin: &Path, sizes: Sizes) -> anyhow::Result<Vec<Figure>> {
    let dir = tempfile::tempdir()?;
    let tuning = crate::system::B4_TUNING;
    let off = Gavel::start(
        gavel_bin,
        &dir.path().join("off"),
        &rust_plugins(),
        &format!("{tuning}store_snapshots = false\n"),
    )
    .await?;
    let on_dir = dir.path().join("on");
    let on = Gavel::start(gavel_bin, &on_dir, &rust_plugins(), tuning).await?;
    // Both processes run throughout, and their runs alternate: the one
    // not measured is idle.
    let [((o, o_lo, o_hi), o_cpu), ((n, n_lo, n_hi), n_cpu)] =
        settle_runs_alternating(&off, &on, sizes.runs, sizes.items).await?;
    drop(off);
    let settled = (sizes.runs * sizes.items) as f64;
    let store = gavel::store::open_url(&format!("sqlite://{}", on_dir.join("data/gavel.db").display()), 1).await?;
    let (snapshots, bytes) = store.snapshot_footprint().await?;
    drop(store);

    // Every stored evaluation judged again by link-spam, as deployed.
    let report_path = dir.path().join("report.json");
    let cpu_before = children_cpu();
    let started = Instant::now();
    let out = std::process::Command::new(gavel_bin)
        .arg("backtest")
        .arg("--candidate")
        .arg(on_dir.join("plugins/link-spam.wasm"))
        .args(["--all", "--since", "1d", "--gavel-config"])
        .arg(on_dir.join("gavel.toml"))
        .arg("--json")
        .arg(&report_path)
        .output()?;
    let wall = started.elapsed().as_secs_f64();
    let cpu = children_cpu() - cpu_before;
    drop(on);
    anyhow::ensure!(
        out.status.success(),
        "gavel backtest failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&report_path)?)?;
    let replayed = report["sample"]["replayed"].as_f64().unwrap_or(0.0);
    let elapsed = report["elapsed_ms"].as_f64().unwrap_or(0.0).max(1.0) / 1e3;
    let fidelity = &report["fidelity"];
    anyhow::ensure!(
        replayed > 0.0 && fidelity["checked"] == fidelity["identical"],
        "the backtest did not reproduce link-spam's decisions: {fidelity}"
    );
    Ok(vec![
        Figure::new("B11", "submitted → settled, embedded, snapshots stored", n, "items/s")
            .spread(n_lo, n_hi)
            .against("snapshots not stored", o)
            .goal("≥ 0.9 × without", n >= 0.9 * o)
            .note(format!("{} items per run, as B4; off: {o_lo:.0}–{o_hi:.0}", sizes.items)),
        Figure::new("B11", "CPU per settled item, snapshots stored", n_cpu, "µs")
            .against("snapshots not stored", o_cpu)
            .note("the gavel process, user + system (/proc), ÷ items"),
        Figure::new("B11", "stored snapshot size", bytes as f64 / snapshots.max(1) as f64, "bytes")
            .note(format!(
                "{snapshots} snapshots for {settled:.0} settled items ({} bytes in all)",
                bytes
            )),
        Figure::new("B11", "backtest: snapshots replayed per second", replayed / elapsed, "snapshots/s")
            .note(format!(
                "link-spam over all {replayed:.0} stored evaluations, one thread; the run took {elapsed:.2} s of {wall:.2} s \
                 (process start, store open, selection); {:.0} µs CPU per snapshot for the whole command",
                cpu / replayed * 1e6
            )),
    ])
}
