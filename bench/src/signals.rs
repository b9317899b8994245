//! B17: what entity signals cost. End to end: B4's embedded run with
//! three signals declared (in the examples' sidecars: items per author,
//! items per link domain, distinct authors per link domain) against the
//! same run without, side by side in one run, on B4's traffic with every
//! tenth item link spam (so the link-domain keys are counted too). And the
//! memory of the embedded counts per 1,000,000 live keys, in this process:
//! the counts' own estimate and the resident memory they added.

use crate::report::Figure;
use crate::system::{Gavel, Sizes, rust_plugins, settle_runs_with};
use gavel::domain::signals::{SignalDeclaration, SignalSpec};
use gavel::signals::MemoryCounts;
use std::path::Path;

/// The three signals, one per example's sidecar (no rule reads them: what
/// is measured is the host's counting and the values every snapshot of a
/// declaring plugin carries).
const SIDECARS: [(&str, &str); 3] = [
    (
        "flag-ratio",
        "[[signals]]\nname = \"author-items\"\nkey = \"author\"\ncount = \"items\"\nwindow = \"1h\"\n",
    ),
    (
        "duplicate-burst",
        "[[signals]]\nname = \"domain-items\"\nkey = \"link-domain\"\ncount = \"items\"\nwindow = \"10m\"\n",
    ),
    (
        "link-spam",
        "[[signals]]\nname = \"domain-authors\"\nkey = \"link-domain\"\ncount = \"distinct author\"\nwindow = \"10m\"\n",
    ),
];

pub async fn b17(gavel_bin: &Path, sizes: Sizes) -> anyhow::Result<Vec<Figure>> {
    let dir = tempfile::tempdir()?;
    let tuning = crate::system::B4_TUNING;
    let off = Gavel::start(gavel_bin, &dir.path().join("off"), &rust_plugins(), tuning).await?;
    let ((o, o_lo, o_hi), o_cpu) = settle_runs_with(&[&off], sizes.runs, sizes.items, 1, 10).await?;
    drop(off);
    let on_dir = dir.path().join("on");
    std::fs::create_dir_all(on_dir.join("plugins"))?;
    for (plugin, sidecar) in SIDECARS {
        std::fs::write(on_dir.join("plugins").join(format!("{plugin}.toml")), sidecar)?;
    }
    let on = Gavel::start(gavel_bin, &on_dir, &rust_plugins(), tuning).await?;
    let ((n, n_lo, n_hi), n_cpu) = settle_runs_with(&[&on], sizes.runs, sizes.items, 1, 10).await?;
    // The key gauges are set by the counts' sweep, every 5 s.
    tokio::time::sleep(std::time::Duration::from_secs(6)).await;
    let metrics = reqwest::get(format!("{}/metrics", on.url)).await?.text().await?;
    drop(on);
    let gauge = |name: &str| {
        metrics
            .lines()
            .filter(|l| l.starts_with(name))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .fold(0.0, |a, b| a + b)
    };
    let keys = gauge("gavel_signal_keys");
    let (est, rss) = memory_per_million_keys();
    Ok(vec![
        Figure::new("B17", "submitted → settled, embedded, three signals", n, "items/s")
            .spread(n_lo, n_hi)
            .against("no signals", o)
            .goal("≥ 0.9 × no signals", n >= 0.9 * o)
            .note(format!(
                "{} items per run, a tenth link spam; no signals: {o_lo:.0}–{o_hi:.0}; {keys:.0} live keys at the end",
                sizes.items
            )),
        Figure::new("B17", "CPU per settled item, three signals", n_cpu, "µs")
            .against("no signals", o_cpu)
            .note(format!(
                "the gavel process, user + system (/proc), ÷ items; signals add {:.1} µs per item",
                n_cpu - o_cpu
            )),
        Figure::new("B17", "memory per 1,000,000 live keys, embedded", rss, "MiB").note(format!(
            "resident memory the counts added in this process (one item per key, `items` and \
                 `distinct author` signals, half each); the counts' own estimate: {est:.0} MiB"
        )),
    ])
}

/// Memory 1,000,000 live keys take: (the counts' estimate, resident memory
/// added), in MiB, over one `items` and one `distinct author` signal with
/// 500,000 keys each.
fn memory_per_million_keys() -> (f64, f64) {
    let spec = |count: &str| {
        SignalSpec::parse(&SignalDeclaration {
            name: "m".into(),
            key: "context.ip".into(),
            count: count.into(),
            window: "10m".into(),
            when: None,
        })
        .expect("a valid signal")
    };
    let before = gavel_tests::rss_bytes();
    let items = MemoryCounts::new(spec("items"), 2_000_000);
    let authors = MemoryCounts::new(spec("distinct author"), 2_000_000);
    let now = 1_700_000_000_000;
    for i in 0..500_000u32 {
        let ip = format!("10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255);
        items.add("bench", now, &[(ip.clone(), None)]);
        authors.add("bench", now, &[(ip, Some(format!("author-{i}")))]);
    }
    let after = gavel_tests::rss_bytes();
    let estimate = (items.sweep(now).bytes + authors.sweep(now).bytes) as f64;
    let mib = |b: f64| b / (1 << 20) as f64;
    (mib(estimate), mib(after.saturating_sub(before) as f64))
}
