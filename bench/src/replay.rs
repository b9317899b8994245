//! B16 (docs/BENCHMARKS.md): one item's replay over a long history. An
//! item re-evaluated all day (a client flagging its own item every ~1 s)
//! has ~80,000 stored evaluations; `GET /v1/items/{id}/replay` pages them
//! at the store, so a page costs the same at 100,000 as at 10. Measured
//! against one `gavel serve` on the embedded default (SQLite) with the four
//! Rust rules: sequential pages with and without a candidate, the process's
//! memory over them, and the latency of an ordinary read while 8 replays
//! judged by a candidate run at once.

use crate::report::Figure;
use crate::system::{Gavel, MODERATOR_TOKEN, Sizes, rust_plugins};
use std::path::Path;
use std::time::{Duration, Instant};

/// Plugins each seeded evaluation carries a decision of.
const PLUGINS: [(&str, &str, &str); 4] = [
    ("link-spam", "0.0.1", "seeded-link-spam"),
    ("duplicate-burst", "0.0.1", "seeded-duplicate-burst"),
    ("flag-ratio", "0.0.1", "seeded-flag-ratio"),
    ("banned-terms", "0.0.1", "seeded-banned-terms"),
];

/// Replays running at once in the responsiveness figure.
const CONCURRENT: usize = 8;

/// p50 and p99 of `v` (ms).
fn p50_p99(v: &mut [f64]) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.99))
}

/// Peak and current RSS of `pid`, MiB.
fn memory_mib(pid: u32) -> anyhow::Result<(f64, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .map(|kib| kib / 1024.0)
            .ok_or_else(|| anyhow::anyhow!("no {name} for {pid}"))
    };
    Ok((field("VmHWM:")?, field("VmRSS:")?))
}

/// Times `n` sequential GETs of `path` as the moderator (ms each).
async fn time_gets(http: &reqwest::Client, url: &str, path: &str, n: usize) -> anyhow::Result<Vec<f64>> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let started = Instant::now();
        let r = http
            .get(format!("{url}{path}"))
            .bearer_auth(MODERATOR_TOKEN)
            .send()
            .await?;
        anyhow::ensure!(r.status().is_success(), "B16: GET {path}: {}", r.status());
        r.bytes().await?;
        out.push(started.elapsed().as_secs_f64() * 1e3);
    }
    Ok(out)
}

pub async fn b16(gavel_bin: &Path, sizes: Sizes) -> anyhow::Result<Vec<Figure>> {
    let evaluations = if sizes.quick { 10_000 } else { 100_000 };
    let gets = if sizes.quick { 20 } else { 100 };
    let dir = tempfile::tempdir()?;
    let gavel = Gavel::start(gavel_bin, dir.path(), &rust_plugins(), "").await?;
    let http = reqwest::Client::new();
    let hot = crate::system::seed_items(&http, &gavel.url, 2, |tag, i| {
        serde_json::json!({"kind": "post", "author": format!("{tag}-{i}"), "text": format!("an ordinary post {i}")})
    })
    .await?;
    let (hot, other) = (&hot[0], &hot[1]);
    crate::system::wait_settled(&http, &gavel.url, hot).await?;
    crate::system::wait_settled(&http, &gavel.url, other).await?;

    // The history, written through the store as the worker writes it.
    let seeding = Instant::now();
    let store = gavel::store::open_url(&format!("sqlite://{}", dir.path().join("data/gavel.db").display()), 1).await?;
    gavel_tests::history::seed_evaluations(
        &store,
        hot,
        "an ordinary post 0",
        &PLUGINS,
        evaluations,
        gavel::clock::now_ms() - evaluations as i64,
    )
    .await?;
    drop(store);
    eprintln!(
        "B16: {evaluations} evaluations ({} decisions) stored in {:.1} s",
        evaluations * PLUGINS.len(),
        seeding.elapsed().as_secs_f64()
    );

    let page = format!("/v1/items/{hot}/replay");
    let judged = format!("/v1/items/{hot}/replay?candidate=link-spam");
    let oldest_page = format!("/v1/items/{hot}/replay?limit=50&before={}", 1 + 4 * 50);
    time_gets(&http, &gavel.url, &judged, 3).await?;
    let (_, rss_before) = memory_mib(gavel.pid())?;
    let (plain_p50, plain_p99) = p50_p99(&mut time_gets(&http, &gavel.url, &page, gets).await?);
    let (judged_p50, judged_p99) = p50_p99(&mut time_gets(&http, &gavel.url, &judged, gets).await?);
    let (oldest_p50, _) = p50_p99(&mut time_gets(&http, &gavel.url, &oldest_page, gets).await?);
    let (peak, _) = memory_mib(gavel.pid())?;

    // An ordinary read alone, then while 8 judged replays run back to back.
    let read = format!("/v1/items/{other}");
    let (idle_p50, idle_p99) = p50_p99(&mut time_gets(&http, &gavel.url, &read, gets * 2).await?);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut load = Vec::new();
    for _ in 0..CONCURRENT {
        let (http, url, judged, stop) = (http.clone(), gavel.url.clone(), judged.clone(), stop.clone());
        load.push(tokio::spawn(async move {
            let mut done = 0usize;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                time_gets(&http, &url, &judged, 1).await?;
                done += 1;
            }
            anyhow::Ok(done)
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = Instant::now();
    let mut busy = time_gets(&http, &gavel.url, &read, gets * 2).await?;
    let busy_secs = started.elapsed().as_secs_f64();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut replays = 0;
    for l in load {
        replays += l.await??;
    }
    let (busy_p50, busy_p99) = p50_p99(&mut busy);
    let (peak_loaded, _) = memory_mib(gavel.pid())?;
    let history = format!("an item with {evaluations} stored evaluations × 4 decisions");
    Ok(vec![
        Figure::new("B16", "replay, newest page of 50 evaluations, p99", plain_p99, "ms").note(format!(
            "{history}; p50 {plain_p50:.1} ms; the oldest page's p50 {oldest_p50:.1} ms"
        )),
        Figure::new(
            "B16",
            "replay judged by link-spam (50 snapshots), p99",
            judged_p99,
            "ms",
        )
        .note(format!(
            "p50 {judged_p50:.1} ms; the candidate runs on a blocking thread"
        )),
        Figure::new(
            "B16",
            "RSS growth over the sequential replays",
            peak - rss_before,
            "MiB",
        )
        .note(format!(
            "peak {peak:.0} MiB; {peak_loaded:.0} MiB after the 8 concurrent replays"
        )),
        Figure::new(
            "B16",
            "GET /v1/items/{id} p99 while 8 judged replays run",
            busy_p99,
            "ms",
        )
        .against("nothing else running", idle_p99)
        .goal("≤ 100 ms", busy_p99 <= 100.0)
        .note(format!(
            "p50 {busy_p50:.1} ms (idle {idle_p50:.1} ms); {replays} replays answered in {busy_secs:.1} s"
        )),
    ])
}
