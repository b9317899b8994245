//! `/metrics` and the per-plugin-version figures move as they must
//! (the observability contract operators and alerts rely on).

use gavel_tests::server::{Setup, TestServer};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Scrapes `/metrics`, parses it with a Prometheus text-format parser, and
/// returns `name{labels} → value`.
pub(crate) async fn scrape(s: &TestServer) -> BTreeMap<String, f64> {
    let r = s.http.get(format!("{}/metrics", s.url)).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(
        r.headers()["content-type"]
            .to_str()
            .unwrap()
            .contains("openmetrics-text")
    );
    let text = r.text().await.unwrap();
    let lines = text.lines().map(|l| Ok(l.to_string()));
    let scrape = prometheus_parse::Scrape::parse(lines).expect("/metrics parses as Prometheus text");
    let mut out = BTreeMap::new();
    for sample in scrape.samples {
        let mut labels: Vec<String> = sample.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        labels.sort();
        let value = match sample.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            prometheus_parse::Value::Histogram(_) | prometheus_parse::Value::Summary(_) => continue,
        };
        out.insert(format!("{}{{{}}}", sample.metric, labels.join(",")), value);
    }
    out
}

/// `/metrics` as text, for series [`scrape`]'s parser cannot read.
pub(crate) async fn metrics_text(s: &TestServer) -> String {
    s.http
        .get(format!("{}/metrics", s.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

pub(crate) fn get(m: &BTreeMap<String, f64>, key: &str) -> f64 {
    m.get(key).copied().unwrap_or(0.0)
}

/// A submission's answer (status), with an optional key.
async fn submit(s: &TestServer, author: &str, text: &str, key: Option<&str>) -> (u16, Value) {
    s.submit_as(&s.client, &json!({"kind": "post", "author": author, "text": text}), key)
        .await
}

async fn metrics_move_with_the_workload(setup: Setup) {
    let s = TestServer::start(setup).await;
    let before = scrape(&s).await;
    for name in [
        "gavel_queue_lag_seconds{}",
        "gavel_queue_depth{}",
        "gavel_evaluations_in_flight{}",
        "gavel_stale_commits_total{}",
        "gavel_leases_lost_total{}",
        "gavel_dead_letters_total{}",
        "gavel_retries_total{}",
        "gavel_plugin_quarantines_total{}",
        "gavel_plugin_reloads_total{result=loaded}",
    ] {
        assert!(before.contains_key(name), "{name} missing from /metrics: {before:#?}");
    }
    assert_eq!(get(&before, "gavel_plugin_reloads_total{result=loaded}"), 4.0);
    // The shipped dashboard and alerts only use metrics gavel exports.
    let exported = gavel::metrics::Metrics::new().family_names().to_vec();
    assert!(exported.len() >= 20);
    for file in ["deploy/prometheus-alerts.yml", "deploy/grafana-dashboard.json"] {
        let body = std::fs::read_to_string(gavel_tests::repo_root().join(file)).unwrap();
        for (i, _) in body.match_indices("gavel_") {
            let name: String = body[i..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            // A histogram's series are its family's name and a suffix.
            let family = ["_bucket", "_count", "_sum", "_total"]
                .iter()
                .find_map(|suffix| name.strip_suffix(suffix).filter(|f| exported.iter().any(|e| e == f)))
                .unwrap_or(&name);
            assert!(
                exported.iter().any(|e| e == family),
                "{file} uses {name}, which /metrics does not export"
            );
        }
    }

    // A replayed idempotent request increments the replay counter exactly once.
    assert_eq!(submit(&s, "m1", "hello metrics", Some("k-1")).await.0, 202);
    assert_eq!(submit(&s, "m1", "hello metrics", Some("k-1")).await.0, 202);
    let after = scrape(&s).await;
    assert_eq!(
        get(&after, "gavel_idempotency_replays_total{route=items}")
            - get(&before, "gavel_idempotency_replays_total{route=items}"),
        1.0
    );
    assert_eq!(get(&after, "gavel_submissions_total{outcome=replayed}"), 1.0);
    assert_eq!(get(&after, "gavel_submissions_total{outcome=accepted}"), 1.0);
    // The accepted one went through group commit (the replay wrote nothing).
    assert_eq!(get(&after, "gavel_store_batched_writes_total{kind=submissions}"), 1.0);
    assert_eq!(get(&after, "gavel_store_batches_total{kind=submissions}"), 1.0);
    // A sync-phase rejection is counted as such.
    assert_eq!(submit(&s, "m2", "scamcoin", None).await.0, 202);
    assert_eq!(
        get(&scrape(&s).await, "gavel_submissions_total{outcome=rejected_sync}"),
        1.0
    );

    // Every request is timed by method, route (axum's syntax) and status;
    // a path no route matches has a label of its own, not its own path.
    let r = s.http.get(format!("{}/v1/nothing-here", s.url)).send().await.unwrap();
    assert_eq!(r.status(), 404);
    let r = s.get("/v1/items/no-such-item", &s.client).send().await.unwrap();
    assert_eq!(r.status(), 404);
    let m = scrape(&s).await;
    let timed = |labels: &str| get(&m, &format!("gavel_http_request_duration_seconds_count{{{labels}}}"));
    assert_eq!(timed("method=POST,route=/v1/items,status=202"), 3.0, "{m:#?}");
    assert_eq!(timed("method=GET,route=unmatched,status=404"), 1.0, "{m:#?}");
    // (The parser `scrape` uses drops a series whose label value holds a
    // brace, so this one is read from the text itself.)
    let text = metrics_text(&s).await;
    let series = r#"gavel_http_request_duration_seconds_count{method="GET",route="/v1/items/{id}",status="404"} "#;
    let line = text.lines().find(|l| l.starts_with(series));
    assert_eq!(line.map(|l| &l[series.len()..]), Some("1"), "{text}");
    assert!(timed("method=GET,route=/metrics,status=200") >= 2.0, "{m:#?}");
    assert!(
        get(
            &m,
            "gavel_http_request_duration_seconds_sum{method=POST,route=/v1/items,status=202}"
        ) > 0.0
    );

    // Rule evaluations by plugin version and outcome, and combined verdicts.
    let (_, r) = submit(
        &s,
        "m3",
        "http://a.example http://b.example http://c.example http://d.example",
        None,
    )
    .await;
    let id = r["id"].as_str().unwrap().to_string();
    let item = s
        .wait_for(&id, |i| {
            i["needs_eval_since"].is_null() && i["status"] == "held_for_review"
        })
        .await;
    let m = scrape(&s).await;
    assert!(
        get(
            &m,
            "gavel_rule_evaluations_total{outcome=ok,plugin=link-spam,version=1.2.1}"
        ) >= 1.0,
        "{m:#?}"
    );
    assert!(get(&m, "gavel_decisions_total{verdict=hold}") >= 1.0);

    // A moderator overturning a rule's decision moves that plugin version's reversal count.
    let r = s
        .post(&format!("/v1/items/{id}/moderation"), &s.moderator)
        .json(&json!({"status": "visible", "reason": "a link roundup, not spam"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let m = scrape(&s).await;
    assert_eq!(
        get(&m, "gavel_reversals_total{plugin=link-spam,version=1.2.1}"),
        1.0,
        "{m:#?}"
    );
    assert_eq!(
        get(&m, "gavel_reversals_total{plugin=flag-ratio,version=1.0.0}"),
        0.0,
        "only the plugin that held it"
    );
    let plugins: Value = s
        .get("/v1/plugins", &s.moderator)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let link_spam = plugins["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "link-spam")
        .unwrap();
    assert_eq!(link_spam["figures"]["reversals"], 1, "{link_spam:#}");
    assert!(link_spam["figures"]["evaluations"].as_i64().unwrap() >= 2);
    assert!(link_spam["figures"]["p50_us"].as_i64().unwrap() > 0);
    assert!(link_spam["figures"]["p99_us"].as_i64().unwrap() >= link_spam["figures"]["p50_us"].as_i64().unwrap());
    assert!(link_spam["figures"]["reversal_rate"].as_f64().unwrap() > 0.0);
    let reversed = s
        .get(&format!("/v1/items/{id}"), &s.moderator)
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap();
    let marked: Vec<&Value> = reversed["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| !d["reversed_at"].is_null())
        .collect();
    assert_eq!(marked.len(), 1);
    assert_eq!(marked[0]["plugin"], "link-spam");
    let _ = item;
    s.stop().await.unwrap();
}

/// A stale commit (lost lease) increments the fencing counter.
async fn a_stale_commit_moves_the_fencing_counter(setup: Setup) {
    let s = TestServer::start_with(setup, |c| {
        c.evaluation.lease_ttl_ms = 300;
        c.evaluation.reconcile_interval_ms = 100;
        c.evaluation.reconcile_grace_ms = 0;
        c.evaluation.debounce.window_ms = 10;
        c.evaluation.debounce.max_wait_ms = 10;
        c.limits.async_deadline = Duration::from_secs(5);
        gavel_tests::servers::add_slow_rule(&c.plugin_dir, 1200);
    })
    .await;
    let before = get(&scrape(&s).await, "gavel_stale_commits_total{}");
    assert_eq!(submit(&s, "fence", "judged slowly", None).await.0, 202);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let m = scrape(&s).await;
        if get(&m, "gavel_stale_commits_total{}") > before {
            assert!(get(&m, "gavel_leases_lost_total{}") >= 1.0);
            break;
        }
        assert!(Instant::now() < deadline, "no stale commit counted: {m:#?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    s.stop().await.unwrap();
}

gavel_tests::matrix!([embedded: Embedded] metrics_move_with_the_workload, a_stale_commit_moves_the_fencing_counter);
