//! The real binary under SIGKILL and SIGSTOP (RELIABILITY.md Q1, Q2, I5):
//! one api and two worker processes on one PostgreSQL and one Redis, workers
//! killed and restarted, one paused past its lease, the api killed once while
//! clients retry with their Idempotency-Keys. Invariants are checked with SQL.

use gavel_tests::servers::{GavelProcess, Redis, postgres};
use serde_json::json;
use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const ITEMS: usize = 300;

/// Submits until acknowledged, retrying with the same key on any failure.
async fn submit_until_acknowledged(http: &reqwest::Client, url: &str, token: &str, i: usize) -> String {
    let body = json!({"external_id": format!("ext-{i}"), "kind": "post", "author": format!("author-{i}"), "text": format!("post {i}")});
    loop {
        let r = http
            .post(format!("{url}/v1/items"))
            .bearer_auth(token)
            .header("Idempotency-Key", format!("submit-{i}"))
            .json(&body)
            .timeout(Duration::from_secs(5))
            .send()
            .await;
        match r {
            Ok(r) if r.status() == 202 => {
                return r.json::<serde_json::Value>().await.unwrap()["id"]
                    .as_str()
                    .unwrap()
                    .to_string();
            }
            Ok(r) => {
                let status = r.status().as_u16();
                assert!(
                    status == 409 || status == 503,
                    "submission {i}: unexpected {status}: {}",
                    r.text().await.unwrap_or_default()
                );
            }
            Err(_) => {} // the api process is down: retry
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killed_and_paused_processes_lose_nothing_and_apply_nothing_twice() {
    let dir = tempfile::tempdir().unwrap();
    let plugins = dir.path().join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    for (name, path) in [
        ("link-spam", gavel_tests::guests::LINK_SPAM),
        ("flag-ratio", gavel_tests::guests::FLAG_RATIO),
        ("slow", gavel_tests::guests::MISBEHAVE),
    ] {
        std::fs::copy(path, plugins.join(format!("{name}.wasm"))).unwrap();
    }
    // Every evaluation takes a while, so a pause or kill lands mid-evaluation.
    std::fs::write(plugins.join("slow.toml"), "[config]\nmode = \"spin\"\nspin_ms = 150\n").unwrap();
    let db = postgres().database().await;
    let redis = Redis::start();
    let client = gavel::config::new_token();
    let config = format!(
        r#"database_url = "{db}"
redis_url = "{redis}"
data_dir = "{data}"
plugin_dir = "{plugins}"
shutdown_grace_ms = 2000
[[tokens]]
name = "web"
token = "{client}"
role = "client"
[limits]
async_deadline_ms = 1000
[ingest]
client_rate_per_second = 100000
client_burst = 100000
author_rate_per_second = 1000
author_burst = 1000
idempotency_lock_ms = 1000
[evaluation]
concurrency = 4
lease_ttl_ms = 1000
reconcile_interval_ms = 200
reconcile_grace_ms = 300
poll_interval_ms = 5
[evaluation.debounce]
window_ms = 100
max_wait_ms = 500
"#,
        redis = redis.url(),
        data = dir.path().join("data").display(),
        plugins = plugins.display(),
    );
    let mut api = GavelProcess::start(dir.path(), "api", &format!("role = \"api\"\n{config}"));
    let mut workers = vec![
        GavelProcess::start(dir.path(), "worker-1", &format!("role = \"worker\"\n{config}")),
        GavelProcess::start(dir.path(), "worker-2", &format!("role = \"worker\"\n{config}")),
    ];

    let http = reqwest::Client::new();
    let url = api.url();
    let done = Arc::new(AtomicBool::new(false));
    let clients = {
        let (http, url, client) = (http.clone(), url.clone(), client.clone());
        tokio::spawn(async move {
            let mut tasks = tokio::task::JoinSet::new();
            for lane in 0..8 {
                let (http, url, client) = (http.clone(), url.clone(), client.clone());
                tasks.spawn(async move {
                    let mut ids = Vec::new();
                    for i in (lane..ITEMS).step_by(8) {
                        let id = submit_until_acknowledged(&http, &url, &client, i).await;
                        // Hot items get event bursts.
                        if i % 10 == 0 {
                            for e in 0..5 {
                                let _ = http
                                    .post(format!("{url}/v1/items/{id}/events"))
                                    .bearer_auth(&client)
                                    .json(&json!({"kind": "flag", "actor": format!("u{e}")}))
                                    .send()
                                    .await;
                            }
                        }
                        ids.push(id);
                        tokio::time::sleep(Duration::from_millis(15)).await;
                    }
                    ids
                });
            }
            tasks.join_all().await.into_iter().flatten().collect::<Vec<String>>()
        })
    };

    // Faults while the clients run.
    let mut kills = 0;
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Q2: pause a worker past its lease while it holds evaluations, then
    // resume it; its late commits must be refused by the store (and counted).
    let refused = |w: &GavelProcess| {
        let log = w.log();
        log.matches("stale commit refused").count() + log.matches("lease expired during the evaluation").count()
    };
    let mut pauses = 0;
    while refused(&workers[0]) == 0 && pauses < 8 {
        workers[0].pause();
        pauses += 1;
        tokio::time::sleep(Duration::from_millis(2_000)).await;
        workers[0].resume();
        tokio::time::sleep(Duration::from_millis(1_000)).await;
    }
    // Q1: SIGKILL random workers, restarting each.
    for round in 0..10 {
        let w = (next() % 2) as usize;
        tokio::time::sleep(Duration::from_millis(100 + next() % 300)).await;
        workers[w].kill();
        kills += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
        workers[w].restart();
        // I5: the api process is killed once; clients retry with their keys.
        if round == 4 {
            api.kill();
            tokio::time::sleep(Duration::from_millis(200)).await;
            api.restart();
        }
    }
    let ids = clients.await.unwrap();
    done.store(true, Ordering::Relaxed);
    assert_eq!(ids.len(), ITEMS);

    // Every item settles once the faults stop.
    let pool = sqlx::PgPool::connect(&db).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let pending: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM items WHERE needs_eval_since IS NOT NULL OR status = 'pending_scan'",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        if pending == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{pending} items never settled");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Every acknowledged submission exists exactly once.
    let unique: HashSet<&String> = ids.iter().collect();
    assert_eq!(unique.len(), ITEMS, "an idempotent retry created a second item");
    let count: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM items")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(count as usize, ITEMS, "items in the store");
    // Per item, transitions form one chain with strictly increasing versions.
    let broken: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM (SELECT item_id FROM transitions GROUP BY item_id \
         HAVING MIN(version) <> 1 OR MAX(version) <> COUNT(*)) AS t",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(broken, 0, "items whose versions are not 1..n");
    let forks: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM transitions t JOIN transitions p \
         ON p.item_id = t.item_id AND p.version = t.version - 1 WHERE p.to_status <> t.from_status",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(forks, 0, "a transition that does not start where the previous ended");
    let mismatched: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM items i WHERE i.version <> (SELECT MAX(version) FROM transitions t WHERE t.item_id = i.id)",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(mismatched, 0, "item versions match their audit trail");
    // No transition applied twice: the store refuses a second row for one
    // item version (unique constraint), so equal counts mean none was tried in vain.
    let duplicate_versions: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM (SELECT item_id, version FROM transitions GROUP BY item_id, version HAVING COUNT(*) > 1) AS d",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(duplicate_versions, 0);
    let judged: i64 = sqlx::query_scalar("SELECT COUNT(DISTINCT item_id) FROM transitions WHERE actor = 'rules'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(judged as usize, ITEMS, "every item got its automated transition");

    let refused_count = refused(&workers[0]);
    eprintln!(
        "faults: {kills} worker kills, 1 api kill, {pauses} pause(s); late commits refused or leases expired on the paused worker: {refused_count}"
    );
    assert!(refused_count >= 1, "the paused worker's late work was never refused");
    drop(api);
    drop(workers);
}

/// The embedded default (SQLite, embedded coordinator) SIGKILLed with
/// evaluations still queued in memory: after a restart the reconciler finds
/// them in the store and every item is judged, without a human.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_embedded_default_killed_with_a_full_queue_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let plugins = dir.path().join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    std::fs::copy(gavel_tests::guests::FLAG_RATIO, plugins.join("flag-ratio.wasm")).unwrap();
    let client = gavel::config::new_token();
    let config = format!(
        r#"data_dir = "{data}"
plugin_dir = "{plugins}"
[[tokens]]
name = "web"
token = "{client}"
role = "client"
[ingest]
author_rate_per_second = 1000
author_burst = 1000
[evaluation]
reconcile_interval_ms = 200
reconcile_grace_ms = 200
[evaluation.debounce]
window_ms = 60000
max_wait_ms = 60000
"#,
        data = dir.path().join("data").display(),
        plugins = plugins.display(),
    );
    let mut gavel = GavelProcess::start(dir.path(), "gavel", &config);
    let http = reqwest::Client::new();
    let mut ids = Vec::new();
    for i in 0..50 {
        let id = submit_until_acknowledged(&http, &gavel.url(), &client, i).await;
        // Six flags: judged only after a minute-long window, i.e. never before the kill.
        for e in 0..6 {
            let r = http
                .post(format!("{}/v1/items/{id}/events", gavel.url()))
                .bearer_auth(&client)
                .json(&json!({"kind": "flag", "actor": format!("u{e}")}))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 202);
        }
        ids.push(id);
    }
    gavel.kill();
    gavel.restart();
    let deadline = Instant::now() + Duration::from_secs(30);
    for id in &ids {
        loop {
            let item: serde_json::Value = http
                .get(format!("{}/v1/items/{id}", gavel.url()))
                .bearer_auth(&client)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            if item["needs_eval_since"].is_null() && item["status"] == "held_for_review" {
                break;
            }
            assert!(Instant::now() < deadline, "item never judged after the restart: {item}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    assert!(gavel.log().contains("gavel is serving"));
}
