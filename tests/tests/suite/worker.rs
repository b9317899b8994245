//! Debounced evaluation end to end: the Sloan burst (Q5), chains under
//! concurrency (Q6), two workers racing past a lost lease (R2/Q2), a host
//! failure dead-lettered and replayed (Q4), Redis killed mid-run (R1), a
//! failing plugin quarantined and recovering (Q3), overload never
//! quarantining a healthy plugin (H7), items due while batches are in
//! flight claimed together (Q16).

use gavel::config::Config;
use gavel_tests::server::{Setup, TestServer, uuid_ish};
use gavel_tests::servers::Redis;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

fn async_decisions_of<'a>(item: &'a Value, plugin: &str) -> Vec<&'a Value> {
    item["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["plugin"] == plugin && d["phase"] == "async")
        .collect()
}

/// Transitions form one chain: versions 1, 2, 3, ... and each starts where
/// the previous ended.
fn assert_one_chain(item: &Value) {
    let t = item["transitions"].as_array().unwrap();
    for (i, tr) in t.iter().enumerate() {
        assert_eq!(tr["version"], i as i64 + 1, "versions strictly increasing: {t:#?}");
        if i > 0 {
            assert_eq!(tr["from_status"], t[i - 1]["to_status"], "fork in the chain: {t:#?}");
        }
    }
    assert_eq!(item["version"], t.len() as i64);
}

/// Q5: 1,000 events on one item within 2 s, window 250 ms: at most
/// ceil(2 s / window) + 1 evaluations, the last one on all 1,000 events.
async fn sloan_burst_is_judged_a_few_times_on_complete_counts(setup: Setup) {
    let s = TestServer::start_with(setup, |c| {
        c.evaluation.debounce.window_ms = 250;
    })
    .await;
    let id = s.submit("sloan", "an ordinary post").await;
    let before = async_decisions_of(&s.settled(&id).await, "flag-ratio").len();
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..1000u64 {
        let req = s
            .post(&format!("/v1/items/{id}/events"), &s.client)
            .json(&json!({"kind": "flag", "actor": format!("user-{i}")}));
        tasks.spawn(async move {
            tokio::time::sleep(Duration::from_millis(i * 19 / 10)).await;
            assert_eq!(req.send().await.unwrap().status(), 202);
        });
    }
    tasks.join_all().await;
    let burst = started.elapsed();
    let item = s
        .wait_for(&id, |i| {
            i["needs_eval_since"].is_null() && i["counters"]["flag"] == 1000
        })
        .await;
    let evaluations = async_decisions_of(&item, "flag-ratio");
    let during = evaluations.len() - before;
    let bound = (burst.as_millis() as usize).div_ceil(250) + 1;
    assert!(
        during >= 1 && during <= bound,
        "{during} evaluations for a {burst:?} burst (bound {bound})"
    );
    let last = evaluations.last().unwrap();
    assert!(
        last["reason"].as_str().unwrap().starts_with("1000 flags"),
        "final decision on every event: {last}"
    );
    assert_eq!(item["status"], "held_for_review");
    assert_one_chain(&item);
    s.stop().await.unwrap();
}

/// Q6: 100 items × 20 concurrent events, 4 evaluations at a time: each
/// item's transitions form one chain.
async fn concurrent_events_on_many_items_form_one_chain_each(setup: Setup) {
    let s = TestServer::start_with(setup, |c| {
        c.evaluation.concurrency = 4;
        c.evaluation.debounce.window_ms = 20;
    })
    .await;
    let mut ids = Vec::new();
    for i in 0..100 {
        ids.push(s.submit(&format!("author-{i}"), &format!("post number {i}")).await);
    }
    let mut tasks = tokio::task::JoinSet::new();
    for (n, id) in ids.iter().enumerate() {
        for e in 0..20 {
            // Items alternate between mostly flagged and mostly liked.
            let kind = if (e + n) % 3 == 0 { "upvote" } else { "flag" };
            let req = s
                .post(&format!("/v1/items/{id}/events"), &s.client)
                .json(&json!({"kind": kind, "actor": format!("u{e}")}));
            tasks.spawn(async move { assert_eq!(req.send().await.unwrap().status(), 202) });
        }
    }
    tasks.join_all().await;
    for id in &ids {
        let item = s
            .wait_for(id, |i| {
                i["needs_eval_since"].is_null()
                    && i["counters"]["flag"].as_i64().unwrap_or(0) + i["counters"]["upvote"].as_i64().unwrap_or(0) == 20
            })
            .await;
        assert_one_chain(&item);
    }
    s.stop().await.unwrap();
}

/// R2 / Q2: a lease lost while two workers evaluate one item (the first is
/// slower than its lease): exactly one commit, the other refused by the
/// store's version check and counted.
async fn a_lost_lease_never_applies_twice(setup: Setup) {
    let slow = |c: &mut Config| {
        c.evaluation.lease_ttl_ms = 300;
        c.evaluation.reconcile_interval_ms = 100;
        c.evaluation.reconcile_grace_ms = 0;
        c.evaluation.debounce.window_ms = 10;
        c.evaluation.debounce.max_wait_ms = 10;
        c.limits.async_deadline = Duration::from_secs(5);
        gavel_tests::servers::add_slow_rule(&c.plugin_dir, 1200);
    };
    let a = TestServer::start_with(setup, slow).await;
    // With the embedded coordinator, both workers must share one process's
    // queue to race; with Redis, a second server shares the queue and the store.
    let b = if setup == Setup::Embedded {
        None
    } else {
        let shared = a.config.clone();
        Some(
            TestServer::start_with(setup, |c| {
                slow(c);
                c.database_url = shared.database_url.clone();
                c.redis_url = shared.redis_url.clone();
                c.redis_prefix = shared.redis_prefix.clone();
            })
            .await,
        )
    };
    let id = a.submit("racer", "a post judged by a slow rule").await;
    let item = a
        .wait_for(&id, |i| {
            i["needs_eval_since"].is_null() && i["status"] != "pending_scan"
        })
        .await;
    // Give the second (late) evaluation time to try its commit.
    let stale = || a.metrics.stale_commits.get() + b.as_ref().map_or(0, |b| b.metrics.stale_commits.get());
    let deadline = Instant::now() + Duration::from_secs(10);
    while stale() == 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(stale() >= 1, "the late commit was not refused (or never raced)");
    let lost = a.metrics.leases_lost.get() + b.as_ref().map_or(0, |b| b.metrics.leases_lost.get());
    assert!(lost >= 1, "a lease should have expired under the slow rule");
    let item = a.wait_for(&id, |i| i["version"] == item["version"]).await;
    let transitions = item["transitions"].as_array().unwrap();
    assert_eq!(
        transitions.len(),
        2,
        "creation + exactly one automated transition: {transitions:#?}"
    );
    let slow_decisions = async_decisions_of(&item, "misbehave");
    assert_eq!(slow_decisions.len(), 1, "the refused commit wrote nothing");
    assert_one_chain(&item);
    // Exactly one outbox event for the winning transition (and one for the
    // creation): the refused commit has none, so nothing is notified twice.
    let store = a.open_store().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let events = loop {
        let events: Vec<(String, i64)> = store
            .changes(None, gavel::store::ChangeCursor::default(), 10_000)
            .await
            .unwrap()
            .into_iter()
            .filter(|c| c.item_id.as_ref() == Some(&id))
            .map(|c| (c.event_id, c.item_version))
            .collect();
        if events.len() >= 2 || Instant::now() > deadline {
            break events;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(events, vec![(format!("{id}:1"), 1), (format!("{id}:2"), 2)]);
    if let Some(b) = b {
        b.stop().await.unwrap();
    }
    a.stop().await.unwrap();
}

/// Q4: an evaluation that fails in the host every time is retried a bounded
/// number of times, dead-lettered once, other items keep flowing, and the
/// dead letter can be replayed.
async fn host_failures_are_retried_then_dead_lettered_and_replayable(setup: Setup) {
    assert_eq!(setup, Setup::Embedded, "corrupts a row through SQLite's PRAGMA");
    let s = TestServer::start_with(setup, |c| {
        c.evaluation.max_attempts = 3;
        c.evaluation.retry_base_ms = 20;
    })
    .await;
    let id = s.submit("victim", "fine text").await;
    s.settled(&id).await;
    // Corrupt the row behind gavel's back so every snapshot read fails.
    let url = s.config.database_url.clone().unwrap();
    let corrupt = |status: &'static str| {
        let (url, id) = (url.clone(), id.clone());
        async move {
            use sqlx::Connection;
            let mut conn = sqlx::SqliteConnection::connect(&url).await.unwrap();
            sqlx::query("PRAGMA ignore_check_constraints = ON")
                .execute(&mut conn)
                .await
                .unwrap();
            sqlx::query("UPDATE items SET status = ?1, needs_eval_since = 1 WHERE id = ?2")
                .bind(status)
                .bind(&id)
                .execute(&mut conn)
                .await
                .unwrap();
        }
    };
    corrupt("bogus").await;
    s.post(&format!("/v1/items/{id}/evaluate"), &s.moderator)
        .send()
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    let letters = loop {
        let letters: Vec<Value> = s
            .get("/v1/dead-letters", &s.moderator)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if !letters.is_empty() {
            break letters;
        }
        assert!(Instant::now() < deadline, "never dead-lettered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0]["item_id"], id);
    assert_eq!(letters[0]["attempts"], 3);
    assert!(letters[0]["last_error"].as_str().unwrap().contains("bogus"));
    assert_eq!(s.metrics.dead_letters.get(), 1);
    assert_eq!(s.metrics.retries.get(), 2);
    // Other items keep flowing.
    let other = s.submit("bystander", "another fine text").await;
    s.settled(&other).await;
    // Fix the row, replay: the item is judged again.
    corrupt("visible").await;
    let letter_id = letters[0]["id"].as_i64().unwrap();
    let r = s
        .post(&format!("/v1/dead-letters/{letter_id}/replay"), &s.moderator)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    s.settled(&id).await;
    let r = s
        .post(&format!("/v1/dead-letters/{letter_id}/replay"), &s.moderator)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404, "a dead letter replays once");
    s.stop().await.unwrap();
}

/// R1: Redis SIGKILLed (no persistence) with items scheduled, submissions
/// during the outage, Redis restarted empty: the reconciler rebuilds the
/// queue from the store; every item settles; no 5xx.
async fn redis_killed_loses_nothing(setup: Setup) {
    assert_eq!(setup, Setup::Distributed);
    let redis = Redis::start();
    let s = TestServer::start_with(setup, |c| {
        c.redis_url = Some(redis.url());
        c.evaluation.debounce.window_ms = 1_500;
        c.evaluation.debounce.max_wait_ms = 1_500;
        c.evaluation.reconcile_grace_ms = 200;
    })
    .await;
    let mut ids = Vec::new();
    for i in 0..100 {
        ids.push(s.submit(&format!("r1-{i}"), &format!("text {i}")).await);
    }
    for id in &ids {
        s.settled(id).await;
        // Queue a debounced evaluation that is still waiting when Redis dies.
        let r = s
            .post(&format!("/v1/items/{id}/events"), &s.client)
            .json(&json!({"kind": "flag", "actor": "x"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 202);
    }
    redis.kill();
    for i in 0..20 {
        let r = s
            .post("/v1/items", &s.client)
            .json(&json!({"kind": "post", "author": format!("outage-{i}"), "text": "during the outage"}))
            .send()
            .await
            .unwrap();
        assert!(
            r.status() == 202 || r.status() == 503,
            "got {} during the outage",
            r.status()
        );
        if r.status() == 202 {
            ids.push(r.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_string());
        } else {
            assert!(r.headers().contains_key("retry-after"));
        }
    }
    redis.restart();
    for id in &ids {
        let item = s
            .wait_for(id, |i| i["needs_eval_since"].is_null() && i["status"] != "pending_scan")
            .await;
        assert_one_chain(&item);
    }
    s.stop().await.unwrap();
}

/// Q3 / H7: a plugin that traps on some items: those items are decided by
/// the other plugins and the failure is recorded with outcome `trap`; when
/// most of its evaluations fail its circuit breaker opens (quarantined, not
/// evaluated), and after the cool-down a probe on a healthy item closes it
/// again, with both logged in the plugin history.
async fn a_failing_plugin_is_quarantined_then_recovers(setup: Setup) {
    let s = TestServer::start_with(setup, |c| {
        c.limits.breaker = gavel::rules::BreakerConfig {
            window_ms: 60_000,
            min_evaluations: 3,
            failure_rate: 0.6,
            open_ms: 1_000,
            max_open_ms: 4_000,
        };
        std::fs::copy(gavel_tests::guests::MISBEHAVE, c.plugin_dir.join("trapper.wasm")).unwrap();
        std::fs::write(
            c.plugin_dir.join("trapper.toml"),
            "[config]\nmode = \"trap-on\"\ntrap_on = \"poison\"\n",
        )
        .unwrap();
    })
    .await;
    let spam = "poison http://a.example http://b.example http://c.example http://d.example";
    let first = s.submit("q3-0", spam).await;
    let item = s.settled(&first).await;
    assert_eq!(item["status"], "held_for_review", "decided by the other plugins");
    let trapped = async_decisions_of(&item, "misbehave");
    assert_eq!(trapped.len(), 1);
    assert_eq!(trapped[0]["outcome"], "trap");
    assert_eq!(trapped[0]["applied"], false);
    assert!(trapped[0]["verdict"].is_null());
    // One healthy item in between: the rate, not a run of failures, decides.
    let healthy = s.submit("q3-ok", "a healthy post").await;
    s.settled(&healthy).await;
    for i in 1..4 {
        let id = s.submit(&format!("q3-{i}"), &format!("poison number {i}")).await;
        s.settled(&id).await;
    }
    let trapper = |plugins: &Value| {
        plugins["plugins"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "misbehave")
            .unwrap()
            .clone()
    };
    assert_eq!(
        trapper(&s.get_json("/v1/plugins", &s.moderator).await)["quarantined"],
        true
    );
    let during = s.submit("q3-9", "poison while quarantined").await;
    let item = s.settled(&during).await;
    assert!(
        async_decisions_of(&item, "misbehave").is_empty(),
        "a quarantined plugin is not evaluated"
    );
    assert_eq!(item["status"], "visible");
    // After the cool-down, the next evaluation is the probe; a healthy item closes the breaker.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let probe = s.submit("q3-probe", "a healthy post after the cool-down").await;
    let item = s.settled(&probe).await;
    assert_eq!(async_decisions_of(&item, "misbehave").len(), 1, "the probe ran");
    assert_eq!(
        trapper(&s.get_json("/v1/plugins", &s.moderator).await)["quarantined"],
        false
    );
    let history = s.get_json("/v1/plugins/history", &s.moderator).await;
    let row = history
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "misbehave")
        .unwrap()
        .clone();
    assert_eq!(row["quarantines"], 1, "{row}");
    assert!(
        row["breaker_detail"].as_str().unwrap().contains("evaluations failed"),
        "{row}"
    );
    assert!(
        row["recovered_at"].as_i64().unwrap() >= row["quarantined_at"].as_i64().unwrap(),
        "{row}"
    );
    assert_eq!(row["status"], "active");
    assert_eq!(s.metrics.plugin_quarantines.get(), 1);
    s.stop().await.unwrap();
}

/// H7: under sustained CPU overload a healthy plugin that needs a few
/// milliseconds of CPU keeps deciding: its deadline counts the CPU it used,
/// not time spent waiting for a core, so it never times out, never counts
/// against its breaker, and is never quarantined.
async fn overload_never_quarantines_a_healthy_plugin(setup: Setup) {
    let s = TestServer::start_with(setup, |c| {
        c.limits.async_deadline = Duration::from_millis(40);
        c.limits.breaker.min_evaluations = 5;
        std::fs::copy(gavel_tests::guests::MISBEHAVE, c.plugin_dir.join("worker.wasm")).unwrap();
        // About 10 ms of CPU per evaluation on this machine kind.
        std::fs::write(
            c.plugin_dir.join("worker.toml"),
            "[config]\nmode = \"work\"\niterations = 8000000\n",
        )
        .unwrap();
    })
    .await;
    // Saturate every core several times over for the whole run.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let hogs: Vec<_> = (0..cores * 4)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut x = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    x = std::hint::black_box(x.wrapping_add(1));
                }
            })
        })
        .collect();
    let mut ids = Vec::new();
    for i in 0..20 {
        ids.push(s.submit(&format!("h7-{i}"), "an ordinary post under load").await);
    }
    for id in &ids {
        let item = s.settled(id).await;
        let worked = async_decisions_of(&item, "misbehave");
        assert_eq!(worked.len(), 1, "{item:#}");
        assert_eq!(
            worked[0]["outcome"], "ok",
            "overload is not the plugin's failure: {:#}",
            worked[0]
        );
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for h in hogs {
        h.join().unwrap();
    }
    let plugins = s.get_json("/v1/plugins", &s.moderator).await;
    assert!(
        plugins["plugins"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["quarantined"] == false),
        "{plugins:#}"
    );
    assert_eq!(s.metrics.plugin_quarantines.get(), 0);
    s.stop().await.unwrap();
}

/// Backpressure: when evaluation falls behind (here: an api-only process,
/// nothing evaluates), new submissions are held for review at once
/// (degraded mode) instead of appearing unjudged.
async fn a_lagging_queue_holds_new_submissions(setup: Setup) {
    let s = TestServer::start_with(setup, |c| {
        c.role = gavel::config::ServeRole::Api;
        c.evaluation.degraded_lag_ms = 300;
    })
    .await;
    let first = s.submit("early", "judged some day").await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r: Value = s
            .post("/v1/items", &s.client)
            .json(&json!({"kind": "post", "author": "late", "text": format!("while behind {}", uuid_ish())}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if r["status"] == "held_for_review" {
            let item: Value = s
                .get(&format!("/v1/items/{}", r["id"].as_str().unwrap()), &s.moderator)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            assert_eq!(item["transitions"][0]["cause"], "degraded");
            assert!(
                !item["needs_eval_since"].is_null(),
                "still judged when the queue catches up"
            );
            break;
        }
        assert_eq!(r["status"], "pending_scan");
        assert!(Instant::now() < deadline, "never entered degraded mode");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let item: Value = s
        .get(&format!("/v1/items/{first}"), &s.moderator)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(item["status"], "pending_scan", "an api-only process evaluates nothing");
    s.stop().await.unwrap();
}

/// A backlog longer than one page of the reconciler's listing is queued
/// whole when a worker starts: an `api` process stores 2,100 items that
/// nothing evaluates, and an `all` process on the same store, whose periodic
/// pass is an hour away, settles every one from its start-up pass.
async fn a_backlog_longer_than_a_page_is_queued_at_start(setup: Setup) {
    const ITEMS: usize = 2_100;
    let s = TestServer::start_with(setup, |c| {
        c.role = gavel::config::ServeRole::Api;
        c.evaluation.reconcile_interval_ms = 3_600_000;
        // One author per item, and no author limit in the way of the seeding.
        c.ingest.author_rate_per_second = 100_000;
        c.ingest.author_burst = 100_000;
    })
    .await;
    let tag = uuid_ish();
    for chunk in (0..ITEMS).collect::<Vec<_>>().chunks(1_000) {
        let items: Vec<Value> = chunk
            .iter()
            .map(|i| json!({"kind": "post", "author": format!("backlog-{i}"), "text": format!("backlog {tag} {i}")}))
            .collect();
        let r: Value = s
            .post("/v1/items/batch", &s.client)
            .json(&json!({ "items": items }))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let refused: Vec<&Value> = r["results"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["status"] != 202)
            .collect();
        assert!(refused.is_empty(), "{} refused, e.g. {}", refused.len(), refused[0]);
    }
    let (mut config, dir) = s.stop_keeping_dir().await;
    config.role = gavel::config::ServeRole::All;
    let s = TestServer::serve(dir, setup, config, |_| {}).await;
    let store = s.open_store().await;
    assert!(
        store.pending_evaluations(i64::MAX, None, 1).await.unwrap().len() == 1,
        "the backlog is there"
    );
    gavel_tests::server::eventually("the whole backlog settled", Duration::from_secs(120), async || {
        store.pending_evaluations(i64::MAX, None, 1).await.unwrap().is_empty()
    })
    .await;
    // The worker counts a batch's commits once the writer has answered,
    // a moment after the store shows them.
    gavel_tests::server::eventually("the last batch counted", Duration::from_secs(10), async || {
        s.metrics.evaluations_committed.get() as usize >= ITEMS
    })
    .await;
    assert_eq!(
        s.metrics.evaluations_committed.get() as usize,
        ITEMS,
        "each item judged once"
    );
    s.stop().await.unwrap();
}

/// Q16: while `evaluation.batches_in_flight` claimed batches are being
/// evaluated the worker claims nothing more; the items that came due
/// meanwhile, one by one, are claimed together when one ends. Without the
/// limit each would be a claim of its own (they come further apart than
/// the poll interval).
async fn items_due_while_batches_are_in_flight_are_claimed_together(setup: Setup) {
    let s = TestServer::start_with(setup, |c| {
        c.evaluation.batches_in_flight = 1;
        c.limits.async_deadline = Duration::from_secs(10);
        // The first item's evaluation spins for 2 s, as long as the suite's
        // lease: on a slow machine the lease ran out first, the reconciler
        // queued the item again and it was claimed a second time, in the
        // second batch. The lease covers the wall deadline here, as the
        // default (30 s) does.
        c.evaluation.lease_ttl_ms = 10_000;
        std::fs::copy(gavel_tests::guests::MISBEHAVE, c.plugin_dir.join("slow.wasm")).unwrap();
        std::fs::write(
            c.plugin_dir.join("slow.toml"),
            "[config]\nmode = \"spin\"\nspin_on = \"slow first\"\nspin_ms = 2000\n",
        )
        .unwrap();
    })
    .await;
    let first = s.submit("q16-first", "slow first, judged alone").await;
    let claimed = Instant::now() + Duration::from_secs(10);
    while s.metrics.evaluations_in_flight.get() != 1 {
        assert!(Instant::now() < claimed, "the first item was never claimed");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let mut later = Vec::new();
    for i in 0..10 {
        later.push(s.submit(&format!("q16-{i}"), "due while the first is judged").await);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let m = crate::metrics::scrape(&s).await;
    assert_eq!(
        crate::metrics::get(&m, "gavel_claimed_batch_items_count{}"),
        1.0,
        "claimed while the one batch allowed was in flight"
    );
    for id in later.iter().chain([&first]) {
        s.settled(id).await;
    }
    let m = crate::metrics::scrape(&s).await;
    assert_eq!(
        crate::metrics::get(&m, "gavel_claimed_batch_items_count{}"),
        2.0,
        "{m:#?}"
    );
    assert_eq!(
        crate::metrics::get(&m, "gavel_claimed_batch_items_sum{}"),
        11.0,
        "{m:#?}"
    );
    s.stop().await.unwrap();
}

gavel_tests::both!(
    items_due_while_batches_are_in_flight_are_claimed_together,
    a_backlog_longer_than_a_page_is_queued_at_start,
    sloan_burst_is_judged_a_few_times_on_complete_counts,
    concurrent_events_on_many_items_form_one_chain_each,
    a_lost_lease_never_applies_twice,
    a_failing_plugin_is_quarantined_then_recovers,
    a_lagging_queue_holds_new_submissions,
);
gavel_tests::matrix!([embedded_only: Embedded]
    host_failures_are_retried_then_dead_lettered_and_replayable,
    overload_never_quarantines_a_healthy_plugin,
);
gavel_tests::matrix!([distributed_only: Distributed] redis_killed_loses_nothing);
