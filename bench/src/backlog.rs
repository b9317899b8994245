//! B10 (docs/BENCHMARKS.md): a backlog drains at a steady rate. An `api`
//! process stores `n` items that nothing evaluates; then an `all` process
//! on the same store starts and drains them. The settle rate of the last
//! tenth must stay within 1.2 × of the first tenth's: no per-claim cost
//! that grows with the queue.

use crate::report::Figure;
use crate::system::{Gavel, Sizes, committed, distributed_config, rust_plugins, seed_items};
use serde_json::json;
use std::path::Path;
use std::time::{Duration, Instant};

/// The settle rates of the first and the last tenth of one drain, and its
/// whole duration.
struct Drain {
    first: f64,
    last: f64,
    secs: f64,
}

/// Seeds `n` items through an `api` process in `dir` (stopped afterwards),
/// starts an `all` process with the same configuration and times its drain.
async fn drain(gavel_bin: &Path, dir: &Path, config: &str, n: usize) -> anyhow::Result<Drain> {
    let http = reqwest::Client::new();
    let api = Gavel::start(gavel_bin, dir, &rust_plugins(), &format!("role = \"api\"\n{config}")).await?;
    seed_items(&http, &api.url, n, |tag, i| {
        json!({"kind": "post", "author": format!("b{tag}-{}", i % 1000), "text": format!("backlog {tag} {i}")})
    })
    .await?;
    anyhow::ensure!(committed(&http, &api.url).await? == 0, "the api process evaluated");
    drop(api);
    let all = Gavel::start(gavel_bin, dir, &rust_plugins(), config).await?;
    // Samples of (time, evaluations committed) until every item settled.
    let mut samples: Vec<(Instant, u64)> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(1_800);
    loop {
        let done = committed(&http, &all.url).await?;
        samples.push((Instant::now(), done));
        if done >= n as u64 {
            break;
        }
        anyhow::ensure!(Instant::now() < deadline, "{done} of {n} items settled in 30 minutes");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    // The first time the count reached `k`.
    let at = |k: u64| samples.iter().find(|(_, c)| *c >= k).map(|(t, _)| *t).expect("reached");
    let tenth = (n / 10) as u64;
    let start = at(1);
    let first = (tenth - 1) as f64 / (at(tenth) - start).as_secs_f64();
    let last = tenth as f64 / (at(n as u64) - at(n as u64 - tenth)).as_secs_f64();
    Ok(Drain {
        first,
        last,
        secs: (at(n as u64) - start).as_secs_f64(),
    })
}

/// B10: the drain of a backlog, embedded (the queue rebuilt from the store
/// by the reconciler at start) and on PostgreSQL + Redis (the queue kept in
/// Redis's partitions).
pub async fn b10(gavel_bin: &Path, sizes: Sizes) -> anyhow::Result<Vec<Figure>> {
    let n = if sizes.quick { 3_000 } else { 100_000 };
    let dir = tempfile::tempdir()?;
    let tuning = crate::system::B4_TUNING;
    let embedded = drain(gavel_bin, &dir.path().join("embedded"), tuning, n).await?;
    let pg = gavel_tests::servers::postgres();
    let database = pg.database().await;
    let redis = gavel_tests::servers::Redis::start();
    let config = format!("{}{tuning}", distributed_config(&database, &redis));
    let distributed = drain(gavel_bin, &dir.path().join("pg"), &config, n).await?;
    let items = format!("{},{:03}", n / 1000, n % 1000);
    let figure = |setup: &str, d: &Drain, restart: &str| {
        let ratio = d.first / d.last;
        Figure::new(
            "B10",
            format!("backlog of {items} items, last tenth's settle rate, {setup}"),
            d.last,
            "items/s",
        )
        .against("first tenth", d.first)
        .goal("first tenth ≤ 1.2 × last tenth", ratio <= 1.2)
        .note(format!(
            "drained in {:.0} s ({:.0} items/s overall); {restart}",
            d.secs,
            n as f64 / d.secs
        ))
    };
    Ok(vec![
        figure(
            "embedded",
            &embedded,
            "the queue was rebuilt from the store by the reconciler when the process started",
        ),
        figure(
            "PostgreSQL + Redis",
            &distributed,
            "the queue waited in Redis's partitions for a new process",
        ),
    ])
}
