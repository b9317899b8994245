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
        let id = submit_until_acknowledged(&http, &gavel.url(), &client, i).await.id;
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
