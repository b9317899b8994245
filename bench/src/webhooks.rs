//! B18 (docs/BENCHMARKS.md): webhook deliveries drain at a steady rate
//! after a receiver's outage. The receiver answers `410 Gone`, which
//! disables its endpoint; `n` items are judged meanwhile, so every one of
//! their transitions waits as a pending delivery. Then the receiver answers
//! 204 again and the endpoint is enabled (`POST /v1/webhooks/NAME/enable`):
//! the whole backlog is pending at once. The delivery rate of the first
//! tenth (the backlog at its deepest) must stay within 1.2 × of the last
//! tenth's: no per-claim cost that grows with the backlog.

use crate::report::Figure;
use crate::system::{B4_TUNING, Gavel, MODERATOR_TOKEN, committed, distributed_config, rust_plugins, seed_items};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use serde_json::{Value, json};
use std::collections::HashSet;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A receiver that answers `410 Gone` while `gone`, else 204 and notes
/// when each event (by `webhook-id`, the same on every retry) first came.
#[derive(Default)]
struct Receiver {
    gone: AtomicBool,
    seen: Mutex<(HashSet<String>, Vec<Instant>)>,
}

async fn receive(State(r): State<Arc<Receiver>>, headers: HeaderMap) -> StatusCode {
    if r.gone.load(Ordering::SeqCst) {
        return StatusCode::GONE;
    }
    let Some(id) = headers.get("webhook-id").and_then(|v| v.to_str().ok()) else {
        return StatusCode::BAD_REQUEST;
    };
    let mut seen = r.seen.lock().expect("lock");
    if seen.0.insert(id.to_string()) {
        seen.1.push(Instant::now());
    }
    StatusCode::NO_CONTENT
}

/// The delivery rates of the first and the last tenth of one drain, its
/// whole duration and the gavel process's CPU per delivery.
struct Drain {
    deliveries: usize,
    first: f64,
    last: f64,
    secs: f64,
    cpu_us: f64,
}

/// The pending deliveries of the endpoint `bench`.
async fn pending(http: &reqwest::Client, url: &str) -> anyhow::Result<i64> {
    let list: Value = http
        .get(format!("{url}/v1/webhooks"))
        .bearer_auth(MODERATOR_TOKEN)
        .send()
        .await?
        .json()
        .await?;
    list.as_array()
        .and_then(|l| l.iter().find(|e| e["endpoint"] == "bench"))
        .and_then(|e| e["pending"].as_i64())
        .ok_or_else(|| anyhow::anyhow!("GET /v1/webhooks has no endpoint `bench`: {list}"))
}

async fn drain(gavel_bin: &Path, dir: &Path, config: &str, n: usize) -> anyhow::Result<Drain> {
    let receiver = Arc::new(Receiver::default());
    receiver.gone.store(true, Ordering::SeqCst);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let hook = format!("http://{}/hook", listener.local_addr()?);
    let app = axum::Router::new()
        .route("/hook", axum::routing::post(receive))
        .with_state(receiver.clone());
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let config = format!("{config}[webhooks.bench]\nurl = \"{hook}\"\n");
    let gavel = Gavel::start(gavel_bin, dir, &rust_plugins(), &config).await?;
    let http = reqwest::Client::new();
    seed_items(&http, &gavel.url, n, |tag, i| {
        json!({"kind": "post", "author": format!("w{tag}-{}", i % 1000), "text": format!("webhook backlog {tag} {i}")})
    })
    .await?;
    // Every item judged and every transition fanned out to the disabled
    // endpoint: the pending count holds still for a second.
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut last = -1;
    loop {
        let now = pending(&http, &gavel.url).await?;
        if committed(&http, &gavel.url).await? >= n as u64 && now == last && now >= n as i64 {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the backlog did not build in 10 minutes ({now} pending)"
        );
        last = now;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let total = last as usize;
    anyhow::ensure!(receiver.seen.lock().expect("lock").1.is_empty(), "delivered while gone");
    receiver.gone.store(false, Ordering::SeqCst);
    let cpu_before = gavel_tests::servers::cpu_seconds(gavel.pid()).unwrap_or(0.0);
    let start = Instant::now();
    let enabled = http
        .post(format!("{}/v1/webhooks/bench/enable", gavel.url))
        .bearer_auth(MODERATOR_TOKEN)
        .send()
        .await?;
    anyhow::ensure!(enabled.status().is_success(), "enable answered {}", enabled.status());
    let deadline = Instant::now() + Duration::from_secs(1_800);
    loop {
        let got = receiver.seen.lock().expect("lock").1.len();
        if got >= total {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{got} of {total} deliveries in 30 minutes; see {}",
            dir.join("gavel.log").display()
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let cpu = gavel_tests::servers::cpu_seconds(gavel.pid()).unwrap_or(0.0) - cpu_before;
    drop(gavel);
    server.abort();
    let times = receiver.seen.lock().expect("lock").1.clone();
    let tenth = total / 10;
    // Each tenth between the deliveries that open and close it (the first
    // from the first delivery: the dispatcher's idle poll is not its rate).
    let first = tenth as f64 / (times[tenth] - times[0]).as_secs_f64();
    let last = tenth as f64 / (times[total - 1] - times[total - 1 - tenth]).as_secs_f64();
    let secs = (times[total - 1] - start).as_secs_f64();
    Ok(Drain {
        deliveries: total,
        first,
        last,
        secs,
        cpu_us: cpu * 1e6 / total as f64,
    })
}

/// B18: a webhook backlog's drain, embedded and on PostgreSQL + Redis.
pub async fn b18(gavel_bin: &Path, sizes: crate::system::Sizes) -> anyhow::Result<Vec<Figure>> {
    let n = if sizes.quick { 1_000 } else { 10_000 };
    let dir = tempfile::tempdir()?;
    let embedded = drain(gavel_bin, &dir.path().join("embedded"), B4_TUNING, n).await?;
    let pg = gavel_tests::servers::postgres();
    let database = pg.database().await;
    let redis = gavel_tests::servers::Redis::start();
    let config = format!("{}{B4_TUNING}", distributed_config(&database, &redis));
    let distributed = drain(gavel_bin, &dir.path().join("pg"), &config, n).await?;
    let figure = |setup: &str, d: &Drain| {
        Figure::new(
            "B18",
            format!(
                "webhook backlog of {} deliveries after an outage, first tenth's rate, {setup}",
                d.deliveries
            ),
            d.first,
            "deliveries/s",
        )
        .against("last tenth", d.last)
        .goal("last tenth ≤ 1.2 × first tenth", d.last <= 1.2 * d.first)
        .note(format!(
            "drained in {:.1} s ({:.0} deliveries/s overall), {:.0} µs of gavel's CPU per delivery",
            d.secs,
            d.deliveries as f64 / d.secs,
            d.cpu_us
        ))
    };
    Ok(vec![
        figure("embedded", &embedded),
        figure("PostgreSQL + Redis", &distributed),
    ])
}
