//! B3–B8 (docs/BENCHMARKS.md) against real `gavel serve` processes (the release
//! binary), a bare-axum baseline process, wrk, PostgreSQL and Redis started
//! here like the tests start them.

use crate::report::Figure;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How much work each figure does.
#[derive(Debug, Clone, Copy)]
pub struct Sizes {
    pub quick: bool,
    /// wrk run length and repetitions (B3).
    pub wrk_secs: u32,
    pub runs: usize,
    /// Items per end-to-end run (B4).
    pub items: usize,
    /// Upserts per coordinator run (B6).
    pub upserts: usize,
    /// Hot reloads measured (B7).
    pub reloads: usize,
    /// Items stored before the console pages are timed (B12).
    pub console_items: usize,
    /// Sequential GETs timed per console page (B12).
    pub console_gets: usize,
}

impl Sizes {
    pub fn new(quick: bool) -> Sizes {
        if quick {
            Sizes {
                quick,
                wrk_secs: 2,
                runs: 1,
                items: 300,
                upserts: 5_000,
                reloads: 2,
                console_items: 2_000,
                console_gets: 20,
            }
        } else {
            Sizes {
                quick,
                wrk_secs: 10,
                runs: 3,
                items: 5_000,
                upserts: 200_000,
                reloads: 5,
                console_items: 100_000,
                console_gets: 200,
            }
        }
    }
}

/// The evaluation settings of B4 and the figures measured like it: claimed
/// batches of 256 (the defaults), and an idle worker polling every
/// millisecond so that the settle time is not the poll interval.
pub(crate) const B4_TUNING: &str = "[evaluation]\nconcurrency = 512\nbatch = 256\npoll_interval_ms = 1\n";

pub(crate) const CLIENT_TOKEN: &str = "bench-client-token-0123456789abcdef";
pub(crate) const MODERATOR_TOKEN: &str = "bench-moderator-token-0123456789abcdef";

/// A `gavel serve` process on a free port, killed when dropped.
pub struct Gavel {
    pub url: String,
    pub dir: PathBuf,
    child: Child,
}

impl Gavel {
    /// Starts `binary` with the four example Rust rules (plus `extra`
    /// plugin files) and `config` appended to a base configuration.
    pub async fn start(binary: &Path, dir: &Path, plugins: &[(&str, &str)], config: &str) -> anyhow::Result<Gavel> {
        let g = Self::spawn(binary, dir, plugins, config)?;
        g.wait_ready(plugins.len()).await?;
        Ok(g)
    }

    /// A `gavel serve --role worker` process: it serves only health and
    /// metrics, so it is ready when `/readyz` answers 200.
    pub async fn start_worker(
        binary: &Path,
        dir: &Path,
        plugins: &[(&str, &str)],
        config: &str,
    ) -> anyhow::Result<Gavel> {
        let g = Self::spawn(binary, dir, plugins, &format!("role = \"worker\"\n{config}"))?;
        let deadline = Instant::now() + Duration::from_secs(120);
        let http = reqwest::Client::new();
        while !http
            .get(format!("{}/readyz", g.url))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            anyhow::ensure!(
                Instant::now() < deadline,
                "the worker did not become ready; see {}",
                dir.join("gavel.log").display()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(g)
    }

    fn spawn(binary: &Path, dir: &Path, plugins: &[(&str, &str)], config: &str) -> anyhow::Result<Gavel> {
        let plugin_dir = dir.join("plugins");
        std::fs::create_dir_all(&plugin_dir)?;
        for (name, path) in plugins {
            std::fs::copy(path, plugin_dir.join(format!("{name}.wasm")))?;
        }
        let port = gavel_tests::servers::free_port();
        let toml = format!(
            r#"listen = "127.0.0.1:{port}"
data_dir = "{data}"
plugin_dir = "{plugins}"
{config}
[[tokens]]
name = "bench"
token = "{CLIENT_TOKEN}"
role = "client"
[[tokens]]
name = "mod"
token = "{MODERATOR_TOKEN}"
role = "moderator"
[ingest]
client_rate_per_second = 10000000
client_burst = 10000000
author_rate_per_second = 10000000
author_burst = 10000000
"#,
            data = dir.join("data").display(),
            plugins = plugin_dir.display(),
        );
        let config_path = dir.join("gavel.toml");
        std::fs::write(&config_path, toml)?;
        let log = std::fs::File::create(dir.join("gavel.log"))?;
        let child = Command::new(binary)
            .args(["serve", "--config"])
            .arg(&config_path)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()?;
        Ok(Gavel {
            url: format!("http://127.0.0.1:{port}"),
            dir: dir.to_path_buf(),
            child,
        })
    }

    /// Waits until the API answers and at least `plugins` plugins are loaded.
    pub async fn wait_ready(&self, plugins: usize) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(120);
        let http = reqwest::Client::new();
        loop {
            let list = async {
                http.get(format!("{}/v1/plugins", self.url))
                    .bearer_auth(MODERATOR_TOKEN)
                    .send()
                    .await?
                    .json::<Value>()
                    .await
            };
            if let Ok(list) = list.await
                && list["plugins"].as_array().is_some_and(|p| p.len() >= plugins)
            {
                return Ok(());
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "gavel did not become ready; see {}",
                self.dir.join("gavel.log").display()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Gavel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn rust_plugins() -> Vec<(&'static str, &'static str)> {
    use gavel_tests::guests;
    vec![
        ("link-spam", guests::LINK_SPAM),
        ("duplicate-burst", guests::DUPLICATE_BURST),
        ("flag-ratio", guests::FLAG_RATIO),
        ("banned-terms", guests::BANNED_TERMS),
    ]
}

fn median(v: &mut [f64]) -> Spread {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

/// One wrk run: requests per second, and the count of non-2xx answers.
/// Every request is a new author's new text; the tag keeps them new
/// across runs against the same server (wrk seeds no random generator, so
/// a random number in the script is the same in every run).
fn wrk(url: &str, secs: u32, dir: &Path) -> anyhow::Result<(f64, u64)> {
    let script = dir.join("post.lua");
    let tag = uuid::Uuid::new_v4().simple();
    std::fs::write(
        &script,
        format!(
            r#"local n = 0
request = function()
  n = n + 1
  local body = string.format('{{"kind":"post","author":"a{tag}-%d","text":"benchmark post {tag}-%d, nothing to see"}}', n, n)
  return wrk.format("POST", "/v1/items", {{["Content-Type"] = "application/json", ["Authorization"] = "Bearer {CLIENT_TOKEN}"}}, body)
end
"#
        ),
    )?;
    let out = Command::new("wrk")
        .args(["-t1", "-c32", &format!("-d{secs}s"), "-s"])
        .arg(&script)
        .arg(format!("{url}/v1/items"))
        .output()
        .map_err(|e| anyhow::anyhow!("running wrk: {e} (cargo xtask bench installs it)"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let rps = text
        .lines()
        .find_map(|l| l.strip_prefix("Requests/sec:"))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .ok_or_else(|| anyhow::anyhow!("unexpected wrk output: {text}"))?;
    let non_2xx = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("Non-2xx or 3xx responses:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    Ok((rps, non_2xx))
}

/// Open-loop load: requests scheduled at a fixed `rate` for `secs`,
/// latency measured from each request's scheduled time (no coordinated
/// omission).
async fn open_loop(url: &str, rate: f64, secs: f64) -> anyhow::Result<OpenLoop> {
    let http = reqwest::Client::builder().pool_max_idle_per_host(512).build()?;
    let total = (rate * secs) as u64;
    let interval = Duration::from_secs_f64(1.0 / rate);
    let start = tokio::time::Instant::now() + Duration::from_millis(50);
    let mut tasks = tokio::task::JoinSet::new();
    let tag = uuid::Uuid::new_v4().simple().to_string();
    for i in 0..total {
        let at = start + interval * i as u32;
        tokio::time::sleep_until(at).await;
        let req = http
            .post(format!("{url}/v1/items"))
            .bearer_auth(CLIENT_TOKEN)
            .json(&json!({"kind": "post", "author": format!("o{tag}-{i}"), "text": format!("open loop {tag} {i}")}));
        tasks.spawn(async move {
            let outcome = match req.send().await {
                Ok(r) if r.status().is_success() => Ok(()),
                Ok(r) => Err(format!("answered {}", r.status())),
                Err(e) => Err(format!("{e:?}")),
            };
            (at.elapsed(), outcome)
        });
    }
    let mut latencies = Vec::with_capacity(total as usize);
    let (mut failed, mut first_error) = (0, None);
    while let Some(r) = tasks.join_next().await {
        let (latency, outcome) = r?;
        if let Err(e) = outcome {
            failed += 1;
            first_error.get_or_insert(e);
        }
        latencies.push(latency.as_secs_f64() * 1000.0);
    }
    latencies.sort_by(f64::total_cmp);
    let p = |q: f64| latencies[((latencies.len() - 1) as f64 * q) as usize];
    Ok(OpenLoop {
        p50: p(0.50),
        p99: p(0.99),
        failed,
        first_error,
    })
}

/// What an open-loop run measured: latency percentiles (ms), and the
/// requests that failed (a transport error or a non-2xx answer), with the
/// first failure's description.
struct OpenLoop {
    p50: f64,
    p99: f64,
    failed: u64,
    first_error: Option<String>,
}

/// B3: `POST /v1/items` against the bare-axum baseline doing the same
/// durable insert on the same SQLite settings.
pub async fn b3(gavel_bin: &Path, sizes: Sizes) -> anyhow::Result<Vec<Figure>> {
    let dir = tempfile::tempdir()?;
    let gavel = Gavel::start(gavel_bin, &dir.path().join("gavel"), &rust_plugins(), "").await?;
    let baseline = crate::baseline::Process::start(&dir.path().join("baseline")).await?;
    let (mut g_rps, mut b_rps) = (Vec::new(), Vec::new());
    let mut non_2xx = 0;
    let http = reqwest::Client::new();
    for _ in 0..sizes.runs {
        let (rps, bad) = wrk(&gavel.url, sizes.wrk_secs, dir.path())?;
        g_rps.push(rps);
        non_2xx += bad;
        // gavel judges what it accepted after the run too: the baseline's
        // run must not share the cores with that.
        drained(&http, &gavel.url).await?;
        let (rps, bad) = wrk(&baseline.url, sizes.wrk_secs, dir.path())?;
        b_rps.push(rps);
        non_2xx += bad;
    }
    let (g, g_lo, g_hi) = median(&mut g_rps);
    let (b, ..) = median(&mut b_rps);
    let secs = if sizes.quick { 1.0 } else { 5.0 };
    let open = open_loop(&gavel.url, g * 0.5, secs).await?;
    drained(&http, &gavel.url).await?;
    let bare = open_loop(&baseline.url, g * 0.5, secs).await?;
    let failures = match (&open.first_error, &bare.first_error) {
        (None, None) => String::new(),
        (g, b) => format!("; first failure: gavel {g:?}, bare {b:?}"),
    };
    let mut out = vec![
        Figure::new("B3", "POST /v1/items throughput (SQLite)", g, "req/s")
            .spread(g_lo, g_hi)
            .against("bare axum + same insert, same group commit", b)
            .goal("≥ 1.0 × the bare handler", g >= b)
            .note(format!(
                "wrk -t1 -c32 closed loop, {} × {} s each, median; non-2xx answers: {non_2xx}",
                sizes.runs, sizes.wrk_secs
            )),
        Figure::new("B3", "p99 latency at 50 % of max rate", open.p99, "ms")
            .against("bare handler at the same rate", bare.p99)
            .goal("≤ 5 ms, 0 failed requests", open.p99 <= 5.0 && open.failed == 0)
            .note(format!(
                "open loop at {:.0} req/s for {secs} s; p50 {:.2} ms (bare {:.2} ms); failed requests: gavel {}, bare {}{failures}",
                g * 0.5,
                open.p50,
                bare.p50,
                open.failed,
                bare.failed,
            )),
    ];
    if non_2xx > 0 {
        out[0].note = Some(format!(
            "{} — some answers were not 2xx",
            out[0].note.clone().unwrap_or_default()
        ));
    }
    Ok(out)
}

/// Waits (up to 120 s) until the process at `url` has judged everything
/// it accepted: its evaluation queue empty (claimed batches no longer
/// count there) and no evaluation committed for half a second.
async fn drained(http: &reqwest::Client, url: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut last = committed(http, url).await?;
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let text = http.get(format!("{url}/metrics")).send().await?.text().await?;
        let depth = text
            .lines()
            .find_map(|l| l.strip_prefix("gavel_queue_depth "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .ok_or_else(|| anyhow::anyhow!("{url}: no gavel_queue_depth in /metrics"))?;
        let now = committed(http, url).await?;
        if depth == 0.0 && now == last {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < deadline, "{url}: the evaluation queue did not drain");
        last = now;
    }
}

/// Committed evaluations so far, from `/metrics`.
pub(crate) async fn committed(http: &reqwest::Client, url: &str) -> anyhow::Result<u64> {
    let text = http.get(format!("{url}/metrics")).send().await?.text().await?;
    Ok(text
        .lines()
        .find_map(|l| l.strip_prefix("gavel_evaluations_committed_total "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or(0.0) as u64)
}

/// The configuration lines of a process on `database` and `redis`.
pub(crate) fn distributed_config(database: &str, redis: &gavel_tests::servers::Redis) -> String {
    format!(
        "database_url = \"{database}\"\nredis_url = \"{}\"\ndatabase_max_connections = 16\n",
        redis.url()
    )
}

/// CPU time (user + system) the process `pid` used so far, in seconds,
/// with that of the children it has reaped (a `gavel serve` compiles
/// plugins in child processes, at start and on reload: outside the runs).
fn cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    gavel_tests::servers::cpu_seconds(pid).ok_or_else(|| anyhow::anyhow!("no /proc/{pid}/stat"))
}

/// Evaluations committed by all of `processes`.
async fn committed_by(http: &reqwest::Client, processes: &[&Gavel]) -> anyhow::Result<u64> {
    let mut total = 0;
    for p in processes {
        total += committed(http, &p.url).await?;
    }
    Ok(total)
}

/// CPU seconds used so far by all of `processes`.
fn cpu_of(processes: &[&Gavel]) -> anyhow::Result<f64> {
    processes.iter().map(|p| cpu_seconds(p.pid())).sum()
}

/// One end-to-end run: items settled per second and the gavel process's
/// CPU time per settled item (µs).
struct Settled {
    rate: f64,
    cpu_us: f64,
}

/// Submits `n` items from 64 concurrent clients (one item per request, or
/// `per_request` per `POST /v1/items/batch`) and waits until every one has
/// been judged: items settled per second, first submission to last commit,
/// and the CPU the gavel process `pid` spent per item meanwhile.
async fn end_to_end(processes: &[&Gavel], n: usize, per_request: usize, spam_every: usize) -> anyhow::Result<Settled> {
    let http = reqwest::Client::builder().pool_max_idle_per_host(128).build()?;
    let url = processes[0].url.as_str();
    let before = committed_by(&http, processes).await?;
    let cpu_before = cpu_of(processes)?;
    let started = Instant::now();
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let mut lanes = tokio::task::JoinSet::new();
    for _ in 0..64 {
        let (http, url, next, tag) = (http.clone(), url.to_string(), next.clone(), tag.clone());
        lanes.spawn(async move {
            let item = |i: usize| {
                if spam_every > 0 && i.is_multiple_of(spam_every) {
                    let links =
                        format!("https://bit.ly/a{i} https://tinyurl.com/b{i} https://t.co/c{i} https://x.example/{i}");
                    json!({"kind": "post", "author": format!("s{tag}-{}", i / spam_every % 10),
                        "text": format!("deal {tag} {i} {links} https://y.example/{i}")})
                } else {
                    json!({"kind": "post", "author": format!("e{tag}-{i}"), "text": format!("end to end {tag} {i}")})
                }
            };
            loop {
                let first = next.fetch_add(per_request, std::sync::atomic::Ordering::Relaxed);
                if first >= n {
                    return anyhow::Ok(());
                }
                let last = (first + per_request).min(n);
                let r = if per_request == 1 {
                    http.post(format!("{url}/v1/items"))
                        .bearer_auth(CLIENT_TOKEN)
                        .json(&item(first))
                } else {
                    let items: Vec<Value> = (first..last).map(item).collect();
                    http.post(format!("{url}/v1/items/batch"))
                        .bearer_auth(CLIENT_TOKEN)
                        .json(&json!({ "items": items }))
                }
                .send()
                .await?;
                anyhow::ensure!(r.status().is_success(), "submission answered {}", r.status());
                if per_request > 1 {
                    let body: Value = r.json().await?;
                    let refused = body["results"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter(|e| e["status"] != 202)
                        .count();
                    anyhow::ensure!(refused == 0, "{refused} batch entries were refused: {body}");
                }
            }
        });
    }
    while let Some(r) = lanes.join_next().await {
        r??;
    }
    let deadline = Instant::now() + Duration::from_secs(600);
    while committed_by(&http, processes).await? < before + n as u64 {
        anyhow::ensure!(Instant::now() < deadline, "items never settled");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let cpu = cpu_of(processes)? - cpu_before;
    Ok(Settled {
        rate: n as f64 / elapsed,
        cpu_us: cpu / n as f64 * 1e6,
    })
}

/// A median with its min and max.
type Spread = (f64, f64, f64);

/// Median rate and median CPU per item of `runs` end-to-end runs, through
/// the first of `processes` (the API), judged by any of them.
pub(crate) async fn settle_runs(
    processes: &[&Gavel],
    runs: usize,
    n: usize,
    per_request: usize,
) -> anyhow::Result<(Spread, f64)> {
    settle_runs_with(processes, runs, n, per_request, 0).await
}

/// [`settle_runs`] where every `spam_every`-th item (0: none) is link spam
/// from one of ten spammers, which link-spam rejects in the async phase.
pub(crate) async fn settle_runs_with(
    processes: &[&Gavel],
    runs: usize,
    n: usize,
    per_request: usize,
    spam_every: usize,
) -> anyhow::Result<(Spread, f64)> {
    let (mut rates, mut cpu) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        let s = end_to_end(processes, n, per_request, spam_every).await?;
        rates.push(s.rate);
        cpu.push(s.cpu_us);
    }
    Ok((median(&mut rates), median(&mut cpu).0))
}

/// [`settle_runs`] of two single processes side by side: their runs
/// alternate (a, b, then b, a, …), so a drift of the machine over the
/// figure weighs on both alike rather than on whichever ran last.
pub(crate) async fn settle_runs_alternating(
    a: &Gavel,
    b: &Gavel,
    runs: usize,
    n: usize,
) -> anyhow::Result<[(Spread, f64); 2]> {
    let mut measured: [(Vec<f64>, Vec<f64>); 2] = Default::default();
    for run in 0..runs {
        let order = if run % 2 == 0 { [0, 1] } else { [1, 0] };
        for arm in order {
            let s = end_to_end(&[[a, b][arm]], n, 1, 0).await?;
            measured[arm].0.push(s.rate);
            measured[arm].1.push(s.cpu_us);
        }
    }
    Ok(measured.map(|(mut rates, mut cpu)| (median(&mut rates), median(&mut cpu).0)))
}

/// B4: submitted → settled, four enforcing plugins: embedded, PostgreSQL
/// and Redis in one process and split into 1 api + 2 workers, one item per
/// request and 100 per batch request, with the CPU per settled item.
pub async fn b4(gavel_bin: &Path, sizes: Sizes) -> anyhow::Result<Vec<Figure>> {
    let dir = tempfile::tempdir()?;
    let tuning = B4_TUNING;
    let embedded = Gavel::start(gavel_bin, &dir.path().join("embedded"), &rust_plugins(), tuning).await?;
    let ((e, e_lo, e_hi), e_cpu) = settle_runs(&[&embedded], sizes.runs, sizes.items, 1).await?;
    let ((eb, eb_lo, eb_hi), eb_cpu) = settle_runs(&[&embedded], sizes.runs, sizes.items, 100).await?;
    drop(embedded);
    let pg = gavel_tests::servers::postgres();
    let database = pg.database().await;
    let redis = gavel_tests::servers::Redis::start();
    let distributed = Gavel::start(
        gavel_bin,
        &dir.path().join("pg"),
        &rust_plugins(),
        &format!("{}{tuning}", distributed_config(&database, &redis)),
    )
    .await?;
    // The servers' CPU over the same runs: PostgreSQL's processes and Redis.
    let servers_cpu = || -> anyhow::Result<(f64, f64)> {
        let missing = || anyhow::anyhow!("no CPU time for the PostgreSQL or Redis server");
        Ok((
            pg.cpu_seconds().ok_or_else(missing)?,
            redis.cpu_seconds().ok_or_else(missing)?,
        ))
    };
    let (pg_before, redis_before) = servers_cpu()?;
    let ((d, d_lo, d_hi), d_cpu) = settle_runs(&[&distributed], sizes.runs, sizes.items, 1).await?;
    let (pg_after, redis_after) = servers_cpu()?;
    let settled = (sizes.runs * sizes.items) as f64;
    let (pg_cpu, redis_cpu) = (
        (pg_after - pg_before) / settled * 1e6,
        (redis_after - redis_before) / settled * 1e6,
    );
    drop(distributed);
    // The same store and coordinator kind, split: one `api` and two `worker`
    // processes on a fresh database and Redis.
    let database = pg.database().await;
    let redis = gavel_tests::servers::Redis::start();
    let shared = distributed_config(&database, &redis);
    let api = Gavel::start(
        gavel_bin,
        &dir.path().join("api"),
        &rust_plugins(),
        &format!("role = \"api\"\n{shared}{tuning}"),
    )
    .await?;
    let w1 = Gavel::start_worker(
        gavel_bin,
        &dir.path().join("w1"),
        &rust_plugins(),
        &format!("{shared}{tuning}"),
    )
    .await?;
    let w2 = Gavel::start_worker(
        gavel_bin,
        &dir.path().join("w2"),
        &rust_plugins(),
        &format!("{shared}{tuning}"),
    )
    .await?;
    let ((m, m_lo, m_hi), m_cpu) = settle_runs(&[&api, &w1, &w2], sizes.runs, sizes.items, 1).await?;
    drop((api, w1, w2));
    let clients = format!("{} items per run, 64 concurrent clients, one process", sizes.items);
    Ok(vec![
        Figure::new("B4", "submitted → settled, embedded (SQLite)", e, "items/s")
            .spread(e_lo, e_hi)
            .against("PostgreSQL + Redis", d)
            .goal("≥ 10,000 items/s on 2 cores", e >= 10_000.0)
            .note(clients.clone()),
        Figure::new("B4", "submitted → settled, PostgreSQL + Redis", d, "items/s")
            .spread(d_lo, d_hi)
            .against("embedded", e)
            .goal("≥ 5,000 items/s and ≥ 0.7 × embedded", d >= 5_000.0 && d >= 0.7 * e),
        Figure::new(
            "B4",
            "submitted → settled, 1 api + 2 worker processes (PostgreSQL + Redis)",
            m,
            "items/s",
        )
        .spread(m_lo, m_hi)
        .against("one `all` process", d)
        .goal("faster than one process", m > d)
        .note(format!("CPU per settled item over the three processes: {m_cpu:.0} µs")),
        Figure::new(
            "B4",
            "submitted → settled, embedded, 100 per batch request",
            eb,
            "items/s",
        )
        .spread(eb_lo, eb_hi)
        .against("one item per request", e)
        .note(format!("{} items per run through POST /v1/items/batch", sizes.items)),
        Figure::new("B4", "CPU per settled item, embedded", e_cpu, "µs")
            .against("100 per batch request", eb_cpu)
            .goal("≤ 200 µs", e_cpu <= 200.0)
            .note("gavel process user + system time (/proc) over the run, ÷ items; the load generator is not counted"),
        Figure::new("B4", "CPU per settled item, PostgreSQL + Redis", d_cpu, "µs")
            .goal("≤ 200 µs", d_cpu <= 200.0)
            .note("the gavel process only; the servers' CPU is the next figure"),
        Figure::new(
            "B4",
            "CPU per settled item, PostgreSQL + Redis, with the servers",
            d_cpu + pg_cpu + redis_cpu,
            "µs",
        )
        .note(format!(
            "gavel {d_cpu:.0} µs (median run) + PostgreSQL {pg_cpu:.0} µs (all its processes) + Redis {redis_cpu:.0} µs \
             (both over all the runs); the load generator is not counted"
        )),
    ])
}

/// Waits (up to 60 s) until item `id` has settled: judged, nothing pending.
pub(crate) async fn wait_settled(http: &reqwest::Client, url: &str, id: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let item: Value = http
            .get(format!("{url}/v1/items/{id}"))
            .bearer_auth(MODERATOR_TOKEN)
            .send()
            .await?
            .json()
            .await?;
        if item["status"] != "pending_scan" && item["needs_eval_since"].is_null() {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < deadline, "item {id} never settled");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Creates `n` items through the batch API, 1,000 per request; their ids.
/// `item(tag, i)` is the `i`th submission, `tag` a fresh id of this call
/// that keeps its texts apart from any earlier call's.
pub(crate) async fn seed_items(
    http: &reqwest::Client,
    url: &str,
    n: usize,
    item: impl Fn(&str, usize) -> Value,
) -> anyhow::Result<Vec<String>> {
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let mut ids = Vec::with_capacity(n);
    for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
        let items: Vec<Value> = chunk.iter().map(|i| item(&tag, *i)).collect();
        let body: Value = http
            .post(format!("{url}/v1/items/batch"))
            .bearer_auth(CLIENT_TOKEN)
            .json(&json!({ "items": items }))
            .send()
            .await?
            .json()
            .await?;
        for r in body["results"].as_array().into_iter().flatten() {
            anyhow::ensure!(r["status"] == 202, "seeding answered {r}");
            ids.push(r["body"]["id"].as_str().unwrap_or_default().to_string());
        }
    }
    Ok(ids)
}

/// Sends `n` votes and flags spread over `items` from 64 concurrent clients,
/// one per request or `per_request` per `POST /v1/events/batch`; events
/// accepted (durable: counted, the item scheduled) per second.
async fn events_accepted(url: &str, items: &[String], n: usize, per_request: usize) -> anyhow::Result<f64> {
    let http = reqwest::Client::builder().pool_max_idle_per_host(128).build()?;
    let items = Arc::new(items.to_vec());
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let started = Instant::now();
    let mut lanes = tokio::task::JoinSet::new();
    for _ in 0..64 {
        let (http, url, next, tag, items) = (http.clone(), url.to_string(), next.clone(), tag.clone(), items.clone());
        lanes.spawn(async move {
            let kind = |i: usize| if i.is_multiple_of(10) { "flag" } else { "upvote" };
            loop {
                let first = next.fetch_add(per_request, std::sync::atomic::Ordering::Relaxed);
                if first >= n {
                    return anyhow::Ok(());
                }
                let last = (first + per_request).min(n);
                if per_request == 1 {
                    let r = http
                        .post(format!("{url}/v1/items/{}/events", items[first % items.len()]))
                        .bearer_auth(CLIENT_TOKEN)
                        .json(&json!({"kind": kind(first), "actor": format!("v{tag}-{first}")}))
                        .send()
                        .await?;
                    anyhow::ensure!(r.status().is_success(), "an event answered {}", r.status());
                } else {
                    let events: Vec<Value> = (first..last)
                        .map(|i| json!({"item": items[i % items.len()], "kind": kind(i), "actor": format!("v{tag}-{i}")}))
                        .collect();
                    let body: Value = http
                        .post(format!("{url}/v1/events/batch"))
                        .bearer_auth(CLIENT_TOKEN)
                        .json(&json!({ "events": events }))
                        .send()
                        .await?
                        .json()
                        .await?;
                    let refused = body["results"].as_array().into_iter().flatten().filter(|e| e["status"] != 202).count();
                    anyhow::ensure!(refused == 0, "{refused} batch events were refused");
                }
            }
        });
    }
    while let Some(r) = lanes.join_next().await {
        r??;
    }
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

/// B9: events accepted per second, single and batched (1,000 per request),
/// embedded and PostgreSQL + Redis.
pub async fn b9(gavel_bin: &Path, sizes: Sizes) -> anyhow::Result<Vec<Figure>> {
    let dir = tempfile::tempdir()?;
    let http = reqwest::Client::new();
    let n = sizes.items * 4;
    let measure = async |g: &Gavel| -> anyhow::Result<(Spread, Spread)> {
        let items = seed_items(&http, &g.url, 1_000, |tag, i| {
            json!({
                "kind": "post",
                "author": format!("s{tag}-{i}"),
                "text": format!("voted on {tag} {i}")
            })
        })
        .await?;
        let (mut single, mut batched) = (Vec::new(), Vec::new());
        for _ in 0..sizes.runs {
            single.push(events_accepted(&g.url, &items, n, 1).await?);
            batched.push(events_accepted(&g.url, &items, n * 5, 1_000).await?);
        }
        Ok((median(&mut single), median(&mut batched)))
    };
    let embedded = Gavel::start(gavel_bin, &dir.path().join("embedded"), &rust_plugins(), "").await?;
    let ((e, e_lo, e_hi), (eb, eb_lo, eb_hi)) = measure(&embedded).await?;
    drop(embedded);
    let pg = gavel_tests::servers::postgres();
    let database = pg.database().await;
    let redis = gavel_tests::servers::Redis::start();
    let distributed = Gavel::start(
        gavel_bin,
        &dir.path().join("pg"),
        &rust_plugins(),
        &distributed_config(&database, &redis),
    )
    .await?;
    let ((d, d_lo, d_hi), (db, db_lo, db_hi)) = measure(&distributed).await?;
    drop(distributed);
    let note = format!(
        "{n} events per single run, {} per batched run, over 1,000 items, 64 concurrent clients",
        n * 5
    );
    Ok(vec![
        Figure::new("B9", "events accepted, embedded, one per request", e, "events/s")
            .spread(e_lo, e_hi)
            .against("PostgreSQL + Redis", d)
            .goal("≥ 20,000 events/s", e >= 20_000.0)
            .note(note),
        Figure::new(
            "B9",
            "events accepted, embedded, 1,000 per batch request",
            eb,
            "events/s",
        )
        .spread(eb_lo, eb_hi)
        .against("one per request", e)
        .goal("≥ 100,000 events/s", eb >= 100_000.0),
        Figure::new(
            "B9",
            "events accepted, PostgreSQL + Redis, one per request",
            d,
            "events/s",
        )
        .spread(d_lo, d_hi),
        Figure::new(
            "B9",
            "events accepted, PostgreSQL + Redis, 1,000 per batch request",
            db,
            "events/s",
        )
        .spread(db_lo, db_hi)
        .against("one per request", d),
    ])
}

/// B5: 1,000 flags on one item within 2 s, fixed 250 ms window.
pub async fn b5(gavel_bin: &Path) -> anyhow::Result<Vec<Figure>> {
    let dir = tempfile::tempdir()?;
    let gavel = Gavel::start(
        gavel_bin,
        dir.path(),
        &rust_plugins(),
        "[evaluation.debounce]\nwindow_ms = 250\nmax_wait_ms = 250\n",
    )
    .await?;
    let http = reqwest::Client::new();
    let item: Value = http
        .post(format!("{}/v1/items", gavel.url))
        .bearer_auth(CLIENT_TOKEN)
        .json(&json!({"kind": "post", "author": "sloan", "text": "an ordinary post"}))
        .send()
        .await?
        .json()
        .await?;
    let id = item["id"].as_str().unwrap_or_default().to_string();
    let get = || async {
        let v: Value = http
            .get(format!("{}/v1/items/{id}", gavel.url))
            .bearer_auth(MODERATOR_TOKEN)
            .send()
            .await?
            .json()
            .await?;
        anyhow::Ok(v)
    };
    let flag_ratio_evaluations = |v: &Value| {
        v["decisions"]
            .as_array()
            .map(|d| {
                d.iter()
                    .filter(|d| d["plugin"] == "flag-ratio" && d["phase"] == "async")
                    .count()
            })
            .unwrap_or(0)
    };
    while get().await?["needs_eval_since"] != Value::Null {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let before = flag_ratio_evaluations(&get().await?);
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..1000u64 {
        let req = http
            .post(format!("{}/v1/items/{id}/events", gavel.url))
            .bearer_auth(CLIENT_TOKEN)
            .json(&json!({"kind": "flag", "actor": format!("user-{i}")}));
        tasks.spawn(async move {
            tokio::time::sleep(Duration::from_millis(i * 19 / 10)).await;
            req.send().await.map(|r| r.status().is_success())
        });
    }
    while let Some(r) = tasks.join_next().await {
        anyhow::ensure!(r??, "an event was refused");
    }
    let burst = started.elapsed();
    let item = loop {
        let v = get().await?;
        if v["needs_eval_since"].is_null() && v["counters"]["flag"] == 1000 {
            break v;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let during = (flag_ratio_evaluations(&item) - before) as f64;
    let ideal = (burst.as_millis() as f64 / 250.0).ceil() + 1.0;
    let last_sees_all = item["decisions"]
        .as_array()
        .and_then(|d| d.iter().rev().find(|d| d["plugin"] == "flag-ratio"))
        .and_then(|d| d["reason"].as_str())
        .is_some_and(|r| r.starts_with("1000 flags"));
    Ok(vec![
        Figure::new("B5", "evaluations for a 1,000-event burst", during, "evals")
            .against("ceil(burst / window) + 1", ideal)
            .goal("≤ ideal, last sees all 1,000", during <= ideal && last_sees_all)
            .note(format!(
                "burst of {:.2} s, fixed window 250 ms; final decision saw all 1,000 flags: {last_sees_all}",
                burst.as_secs_f64()
            )),
    ])
}

/// B6: debounce upserts per second, embedded vs Redis.
pub async fn b6(sizes: Sizes) -> anyhow::Result<Vec<Figure>> {
    use gavel::coordinator::{DebounceMode, Schedule};
    async fn run(c: gavel::coordinator::SharedCoordinator, n: usize) -> anyhow::Result<f64> {
        let started = Instant::now();
        let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut lanes = tokio::task::JoinSet::new();
        for _ in 0..64 {
            let (c, next) = (c.clone(), next.clone());
            lanes.spawn(async move {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if i >= n {
                        return anyhow::Ok(());
                    }
                    let how = Schedule::Debounced {
                        mode: DebounceMode::Sliding,
                        window_ms: 60_000,
                        max_wait_ms: 600_000,
                    };
                    c.schedule(&format!("item-{}", i % 10_000), gavel::clock::now_ms(), how)
                        .await
                        .map_err(|e| anyhow::anyhow!("{e}"))?;
                }
            });
        }
        while let Some(r) = lanes.join_next().await {
            r??;
        }
        Ok(n as f64 / started.elapsed().as_secs_f64())
    }
    let embedded = run(gavel::coordinator::open(None, "bench", 64).await?, sizes.upserts).await?;
    let redis = gavel_tests::servers::Redis::start();
    let prefix = format!("bench-{}", uuid::Uuid::new_v4().simple());
    let remote = run(
        gavel::coordinator::open(Some(&redis.url()), &prefix, 64).await?,
        sizes.upserts / 4,
    )
    .await?;
    Ok(vec![
        Figure::new("B6", "coordinator upserts, Redis", remote, "ops/s")
            .goal("≥ 50,000 upserts/s with pipelining", remote >= 50_000.0)
            .note("one Lua EVALSHA per upsert over one multiplexed connection; 64 concurrent callers"),
        Figure::new("B6", "coordinator upserts, embedded", embedded, "ops/s")
            .against("Redis", remote)
            .goal("≥ 10 × Redis", embedded >= 10.0 * remote),
    ])
}

/// B7: atomic rename of a new `.wasm` → first decision stamped with its digest.
pub async fn b7(gavel_bin: &Path, sizes: Sizes) -> anyhow::Result<Vec<Figure>> {
    let dir = tempfile::tempdir()?;
    let gavel = Gavel::start(gavel_bin, dir.path(), &rust_plugins(), "").await?;
    let engine = gavel::rules::RuleEngine::new(gavel::rules::RuntimeLimits::default())?;
    let original = std::fs::read(gavel_tests::guests::BANNED_TERMS)?;
    let http = reqwest::Client::new();
    let (mut latencies, mut compiles) = (Vec::new(), Vec::new());
    for k in 0..sizes.reloads {
        let variant = gavel_tests::component_variant(&original, 1_000 + k as u32);
        let digest = gavel::domain::Digest::of(&variant).to_hex();
        let compile_started = Instant::now();
        engine
            .load_bytes(Path::new("variant.wasm"), &variant)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        compiles.push(compile_started.elapsed().as_secs_f64() * 1000.0);
        let tmp = gavel.dir.join("plugins/.banned-terms.wasm.tmp");
        std::fs::write(&tmp, &variant)?;
        let renamed = Instant::now();
        std::fs::rename(&tmp, gavel.dir.join("plugins/banned-terms.wasm"))?;
        // banned-terms runs in the sync phase: each submission is judged inline.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let item: Value = http
                .post(format!("{}/v1/items", gavel.url))
                .bearer_auth(CLIENT_TOKEN)
                .json(&json!({"kind": "post", "author": format!("r{k}-{}", uuid::Uuid::new_v4().simple()), "text": format!("reload probe {}", uuid::Uuid::new_v4())}))
                .send()
                .await?
                .json()
                .await?;
            let id = item["id"].as_str().unwrap_or_default();
            let details: Value = http
                .get(format!("{}/v1/items/{id}", gavel.url))
                .bearer_auth(MODERATOR_TOKEN)
                .send()
                .await?
                .json()
                .await?;
            let stamped = details["decisions"]
                .as_array()
                .is_some_and(|d| d.iter().any(|d| d["plugin_digest"] == digest.as_str()));
            if stamped {
                latencies.push(renamed.elapsed().as_secs_f64() * 1000.0);
                break;
            }
            anyhow::ensure!(Instant::now() < deadline, "the new version never decided");
        }
    }
    let (lat, lo, hi) = median(&mut latencies);
    let (compile, ..) = median(&mut compiles);
    Ok(vec![
        Figure::new("B7", "hot reload: rename → first stamped decision", lat, "ms")
            .spread(lo, hi)
            .against("compile time of the same file", compile)
            .goal("p50 ≤ compile + 250 ms", lat <= compile + 250.0)
            .note(format!(
                "{} reloads of banned-terms variants (sync phase, judged inline)",
                sizes.reloads
            )),
    ])
}

fn rss_kib(pid: u32) -> anyhow::Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .ok_or_else(|| anyhow::anyhow!("no VmRSS for {pid}"))
}

/// B8: RSS idle, per loaded plugin, per in-flight evaluation.
pub async fn b8(gavel_bin: &Path) -> anyhow::Result<Vec<Figure>> {
    let dir = tempfile::tempdir()?;
    let in_flight = 32usize;
    let gavel = Gavel::start(
        gavel_bin,
        dir.path(),
        &[],
        &format!(
            "[limits]\nasync_deadline_ms = 10000\nmax_concurrent_evaluations = {}\n\
             [evaluation]\nconcurrency = {in_flight}\nthreads = {in_flight}\nbatches_in_flight = 0\n",
            in_flight * 2
        ),
    )
    .await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let idle = rss_kib(gavel.pid())?;
    // Load the four Rust examples.
    let plugins = rust_plugins();
    for (name, path) in &plugins {
        std::fs::copy(path, gavel.dir.join("plugins").join(format!("{name}.wasm")))?;
    }
    gavel.wait_ready(plugins.len()).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let loaded = rss_kib(gavel.pid())?;
    let per_plugin = (loaded - idle) / plugins.len() as f64 / 1024.0;
    // A rule that spins for 3 s (small memory): `in_flight` evaluations at once.
    std::fs::write(
        gavel.dir.join("plugins/spin.toml"),
        "[config]\nmode = \"spin\"\nspin_ms = 3000\n",
    )?;
    std::fs::copy(gavel_tests::guests::MISBEHAVE, gavel.dir.join("plugins/spin.wasm"))?;
    gavel.wait_ready(plugins.len() + 1).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = rss_kib(gavel.pid())?;
    let http = reqwest::Client::new();
    for i in 0..in_flight {
        http.post(format!("{}/v1/items", gavel.url))
            .bearer_auth(CLIENT_TOKEN)
            .json(&json!({"kind": "post", "author": format!("m{i}"), "text": format!("memory probe {i}")}))
            .send()
            .await?;
    }
    // Sample while they run.
    let mut peak = before;
    let mut running = 0.0;
    let until = Instant::now() + Duration::from_millis(2_500);
    while Instant::now() < until {
        peak = peak.max(rss_kib(gavel.pid())?);
        let metrics = http.get(format!("{}/metrics", gavel.url)).send().await?.text().await?;
        let now = metrics
            .lines()
            .find_map(|l| l.strip_prefix("gavel_evaluations_in_flight "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0);
        running = f64::max(running, now);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let per_eval = if running > 0.0 {
        (peak - before) / running / 1024.0
    } else {
        f64::NAN
    };
    drop(gavel);
    let languages = language_memory(gavel_bin).await?;
    let mut figures = vec![
        Figure::new("B8", "RSS idle (no plugins)", idle / 1024.0, "MiB"),
        Figure::new("B8", "RSS per loaded Rust plugin", per_plugin, "MiB").note(format!(
            "{} plugins: {:.1} MiB → {:.1} MiB",
            plugins.len(),
            idle / 1024.0,
            loaded / 1024.0
        )),
        Figure::new("B8", "RSS per in-flight evaluation", per_eval, "MiB")
            .goal("≤ 1 MiB (small Rust rule)", per_eval <= 1.0)
            .note(format!(
                "{running:.0} evaluations in flight (spinning rule): {:.1} MiB → peak {:.1} MiB",
                before / 1024.0,
                peak / 1024.0
            )),
    ];
    figures.extend(languages);
    Ok(figures)
}

/// Fresh evaluations of a language example after which B8 reads RSS again.
const LANGUAGE_EVALUATIONS: usize = 10_000;

/// One rule alone in a `gavel serve` (fresh instances, no sidecar), fed
/// `LANGUAGE_EVALUATIONS` items: RSS idle, once the rule is loaded (a first
/// load: compiled, not read from the compilation cache), and after 1,000
/// and after all the items settled, with the pages of the database files
/// mapped at that point.
struct MemoryRun {
    idle: f64,
    loaded: f64,
    /// RSS after 1,000 and after `LANGUAGE_EVALUATIONS` items, KiB.
    after: [f64; 2],
    /// Of the last, pages of the database files (SQLite reads through mmap), KiB.
    database: f64,
}

impl MemoryRun {
    /// RSS added beyond the loaded idle process after 1,000 and after all items, MiB.
    fn added(&self) -> [f64; 2] {
        self.after.map(|a| (a - self.loaded) / 1024.0)
    }
}

async fn memory_run(gavel_bin: &Path, name: &str, wasm: &str) -> anyhow::Result<MemoryRun> {
    let dir = tempfile::tempdir()?;
    let gavel = Gavel::start(gavel_bin, dir.path(), &[], "").await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let idle = rss_kib(gavel.pid())?;
    std::fs::copy(wasm, gavel.dir.join("plugins").join(format!("{name}.wasm")))?;
    gavel.wait_ready(1).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let loaded = rss_kib(gavel.pid())?;
    let http = reqwest::Client::new();
    let mut after = [0.0; 2];
    for (i, n) in [1_000, LANGUAGE_EVALUATIONS - 1_000].into_iter().enumerate() {
        let before = committed(&http, &gavel.url).await?;
        seed_items(&http, &gavel.url, n, |tag, i| {
            let text = if i.is_multiple_of(2) {
                format!("THIS IS THE BEST OFFER YOU WILL EVER SEE, BUY NOW {tag} {i}")
            } else {
                format!("an ordinary post about gardening, number {i} of {tag}")
            };
            json!({"kind": "post", "author": format!("{tag}-{}", i % 100), "text": text})
        })
        .await?;
        settle(&http, &gavel, before + n as u64).await?;
        tokio::time::sleep(Duration::from_millis(500)).await;
        after[i] = rss_kib(gavel.pid())?;
    }
    let database = mapped_kib(gavel.pid(), &gavel.dir.join("data"))?;
    Ok(MemoryRun {
        idle,
        loaded,
        after,
        database,
    })
}

/// RSS of `pid`'s mappings of files under `dir`, KiB.
fn mapped_kib(pid: u32, dir: &Path) -> anyhow::Result<f64> {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps"))?;
    let dir = dir.to_string_lossy();
    let (mut inside, mut kib) = (false, 0.0);
    for line in smaps.lines() {
        if let Some(rss) = line.strip_prefix("Rss:") {
            if inside {
                kib += rss.trim().trim_end_matches("kB").trim().parse::<f64>().unwrap_or(0.0);
            }
        } else if line
            .split_whitespace()
            .next()
            .is_some_and(|f| f.contains('-') && !f.ends_with(':'))
        {
            inside = line
                .split_whitespace()
                .nth(5)
                .is_some_and(|p| p.starts_with(dir.as_ref()));
        }
    }
    Ok(kib)
}

/// B8 for the Python and JavaScript examples, each alone in a `gavel
/// serve`: the RSS loading it adds, and the RSS its runtime adds over
/// `LANGUAGE_EVALUATIONS` fresh evaluations. The process's RSS also grows
/// with what the store holds after that many items (SQLite's page caches,
/// the database file's pages read through mmap); the same items with the
/// Rust twin of the rule (`plugins/shouting-twin`, the same decisions) show
/// that share, measured in the same run, and the runtime's figure is what
/// the language adds beyond it.
async fn language_memory(gavel_bin: &Path) -> anyhow::Result<Vec<Figure>> {
    eprintln!("B8: the Rust twin, loaded and after {LANGUAGE_EVALUATIONS} fresh evaluations (the store's share)…");
    let twin = memory_run(gavel_bin, "shouting-twin", gavel_tests::guests::SHOUTING_TWIN).await?;
    let [twin_first, twin_last] = twin.added();
    let mib = |kib: f64| kib / 1024.0;
    let mut figures = vec![
        Figure::new(
            "B8",
            format!("RSS added after {LANGUAGE_EVALUATIONS} fresh evaluations of the Rust twin (the store's share)"),
            twin_last,
            "MiB",
        )
        .note(format!(
            "beyond the loaded idle process: {twin_first:.1} MiB after 1,000; of the last, {:.1} MiB are pages of the database files (read through mmap)",
            mib(twin.database)
        )),
    ];
    for (language, name, wasm) in [
        ("Python", "shouting", gavel_tests::guests::SHOUTING),
        ("JavaScript", "shouting-js", gavel_tests::guests::SHOUTING_JS),
    ] {
        eprintln!("B8: the {language} example, loaded and after {LANGUAGE_EVALUATIONS} fresh evaluations…");
        let run = memory_run(gavel_bin, name, wasm).await?;
        let [first, last] = run.added();
        let (runtime, runtime_first) = (last - twin_last, first - twin_first);
        let flat = (runtime - runtime_first) <= 4.0;
        figures.push(
            Figure::new(
                "B8",
                format!("RSS added by loading the {language} example"),
                mib(run.loaded - run.idle),
                "MiB",
            )
            .goal("≤ 48 MiB", mib(run.loaded - run.idle) <= 48.0)
            .note(format!(
                "{name} alone, first load (compiled in a child process): idle {:.1} MiB → {:.1} MiB",
                mib(run.idle),
                mib(run.loaded)
            )),
        );
        figures.push(
            Figure::new(
                "B8",
                format!("RSS the {language} runtime adds over {LANGUAGE_EVALUATIONS} fresh evaluations"),
                runtime,
                "MiB",
            )
            .goal("≤ 32 MiB, flat", runtime <= 32.0 && flat)
            .note(format!(
                "beyond the loaded idle process {first:.1} MiB after 1,000 and {last:.1} MiB after {LANGUAGE_EVALUATIONS} \
                 ({:.1} MiB of them database pages), the Rust twin {twin_first:.1} and {twin_last:.1} MiB: the runtime's share \
                 {runtime_first:.1} then {runtime:.1} MiB (flat: ≤ 4 MiB more)",
                mib(run.database)
            )),
        );
    }
    Ok(figures)
}

/// Waits until `target` evaluations are committed, at most ten minutes.
async fn settle(http: &reqwest::Client, gavel: &Gavel, target: u64) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(600);
    while committed(http, &gavel.url).await? < target {
        anyhow::ensure!(
            Instant::now() < deadline,
            "B8: the evaluations did not finish in 10 minutes; see {}",
            gavel.dir.join("gavel.log").display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}
