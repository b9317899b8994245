//! The embedded default (one process, SQLite) under SIGKILL. The
//! multi-process suite on PostgreSQL and Redis is `faults.rs`.

use gavel_tests::servers::{GavelProcess, submit_until_acknowledged};
use serde_json::json;
use std::time::{Duration, Instant};

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
    for i in 0..50u64 {
        let id = submit_until_acknowledged(&http, &[gavel.url()], &client, i).await.id;
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

/// Transitions committed but not yet delivered when gavel is SIGKILLed
/// (the receiver was refusing them) are delivered after the restart: the
/// outbox is in the store, not in memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn transitions_committed_before_a_kill_are_delivered_after_restart() {
    let receiver = gavel_tests::receiver::Receiver::start("kill-webhook-secret-0123", 11).await;
    receiver
        .behaviour
        .status
        .store(503, std::sync::atomic::Ordering::Relaxed);
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
[evaluation.debounce]
window_ms = 50
max_wait_ms = 200
[delivery]
retry_base_ms = 50
retry_max_ms = 200
max_attempts = 1000
poll_interval_ms = 20
[webhooks.platform]
url = "{url}"
secret = "kill-webhook-secret-0123"
"#,
        data = dir.path().join("data").display(),
        plugins = plugins.display(),
        url = receiver.url,
    );
    let mut gavel = GavelProcess::start(dir.path(), "gavel", &config);
    let http = reqwest::Client::new();
    let mut ids = Vec::new();
    for i in 0..30u64 {
        ids.push(submit_until_acknowledged(&http, &[gavel.url()], &client, i).await.id);
    }
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
            if item["needs_eval_since"].is_null() && item["status"] != "pending_scan" {
                break;
            }
            assert!(Instant::now() < deadline, "item never judged: {item}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    // Every delivery so far was refused; the receiver keeps trying to get them.
    assert!(receiver.requests() > 0, "deliveries were attempted before the kill");
    assert!(receiver.accepted().is_empty());
    gavel.kill();
    receiver.behaviour.status.store(0, std::sync::atomic::Ordering::Relaxed);
    gavel.restart();
    let expected: std::collections::BTreeSet<String> = ids
        .iter()
        .flat_map(|id| [format!("{id}:1"), format!("{id}:2")])
        .collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let got: std::collections::BTreeSet<String> = receiver.accepted().into_iter().map(|c| c.event_id).collect();
        if got == expected {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {} events delivered after the restart",
            got.intersection(&expected).count(),
            expected.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// S2: the embedded writer SIGKILLed while its transactions commit. 32
/// clients submit without pause (each with its own external id) and the
/// process is killed at a random moment, eight times over. A transaction
/// spends most of its life in `COMMIT` (the fsync), so kills land between a
/// batch's `COMMIT` being issued and its writes being answered. After each
/// restart: every acknowledged submission is stored, with its audit row and
/// outbox event; every stored item, acknowledged or not, has both (nothing
/// half-written is visible); and across the rounds some submissions were
/// stored without their client hearing of it, so the window was hit.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_kill_between_commit_and_answer_loses_no_acknowledged_write() {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};
    let dir = tempfile::tempdir().unwrap();
    let plugins = dir.path().join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    let client = gavel::config::new_token();
    let config = format!(
        r#"data_dir = "{data}"
plugin_dir = "{plugins}"
[[tokens]]
name = "web"
token = "{client}"
role = "client"
[ingest]
client_rate_per_second = 1000000
client_burst = 1000000
author_rate_per_second = 1000000
author_burst = 1000000
"#,
        data = dir.path().join("data").display(),
        plugins = plugins.display(),
    );
    let mut gavel = GavelProcess::start(dir.path(), "gavel", &config);
    let http = reqwest::Client::new();
    // external id → the id of its 202, `None` for a request that got no answer.
    let sent: Arc<Mutex<HashMap<String, Option<String>>>> = Arc::default();
    let mut unanswered_but_stored = 0;
    for round in 0..8 {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut lanes = tokio::task::JoinSet::new();
        for lane in 0..32 {
            let (http, url, client, sent, stop) =
                (http.clone(), gavel.url(), client.clone(), sent.clone(), stop.clone());
            lanes.spawn(async move {
                let mut n = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let external = format!("r{round}-l{lane}-{n}");
                    n += 1;
                    let r = http
                        .post(format!("{url}/v1/items"))
                        .bearer_auth(&client)
                        .json(
                            &json!({"external_id": external, "kind": "post", "author": format!("a{lane}"),
                            "text": format!("round {round} lane {lane} post {n}")}),
                        )
                        .timeout(Duration::from_secs(10))
                        .send()
                        .await;
                    let answered = match r {
                        Ok(r) => {
                            assert_eq!(r.status(), 202, "{external}: {}", r.text().await.unwrap_or_default());
                            Some(
                                r.json::<serde_json::Value>().await.unwrap()["id"]
                                    .as_str()
                                    .unwrap()
                                    .to_string(),
                            )
                        }
                        // The process was killed under the request.
                        Err(_) => None,
                    };
                    let stopped = answered.is_none();
                    sent.lock().unwrap().insert(external, answered);
                    if stopped {
                        break;
                    }
                }
            });
        }
        let wait = 100 + (round * 37) % 200;
        tokio::time::sleep(Duration::from_millis(wait)).await;
        gavel.kill();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        while let Some(r) = lanes.join_next().await {
            r.unwrap();
        }
        gavel.restart();
        // The store as the restarted process sees it (read through SQLite
        // itself, not gavel): each item with its creation audit row and event.
        let url = format!("sqlite://{}?mode=ro", dir.path().join("data/gavel.db").display());
        let db = sqlx::SqlitePool::connect(&url).await.unwrap();
        let stored: Vec<(String, String, i64, i64)> = sqlx::query_as(
            "SELECT i.external_id, i.id, \
             (SELECT COUNT(*) FROM transitions t WHERE t.item_id = i.id AND t.version = 1), \
             (SELECT COUNT(*) FROM outbox o WHERE o.event_id = i.id || ':1') FROM items i",
        )
        .fetch_all(&db)
        .await
        .unwrap();
        db.close().await;
        let stored: HashMap<String, (String, i64, i64)> = stored
            .into_iter()
            .map(|(e, id, audit, event)| (e, (id, audit, event)))
            .collect();
        for (external, (id, audit, event)) in &stored {
            assert_eq!(
                (*audit, *event),
                (1, 1),
                "{external} ({id}) is stored without its audit row and event"
            );
        }
        unanswered_but_stored = 0;
        for (external, answered) in sent.lock().unwrap().iter() {
            match (answered, stored.get(external)) {
                (Some(id), Some((stored_id, ..))) => assert_eq!(id, stored_id, "{external}"),
                (Some(id), None) => panic!("{external} was acknowledged as {id} and is lost"),
                (None, Some(_)) => unanswered_but_stored += 1,
                (None, None) => {}
            }
        }
    }
    assert!(
        unanswered_but_stored > 0,
        "no kill landed between a COMMIT and its answers in 8 rounds"
    );
}
