//! Historical analysis: every evaluation's snapshot is stored with its
//! decisions, and backtests judge stored history again through the real
//! sandbox (`host/src/backtest/`). Fidelity (a version reproduces its own
//! decisions), known answers for flips and moderator agreement, expired
//! snapshots, a backtest that writes nothing, cancellation, one item's
//! replay, the CLI, and the HTML report in a real browser.

use gavel::config::WebhookConfig;
use gavel_tests::receiver::Receiver;
use gavel_tests::server::{Setup, TestServer, eventually};
use serde_json::{Value, json};
use std::collections::{BTreeSet, HashSet};
use std::path::Path;
use std::time::Duration;

const SECRET: &str = "webhook-secret-0123456789";

/// A server with the Rust example rules, optionally the Python and
/// JavaScript examples (their sidecars as shipped) and a disabled slow rule
/// (a candidate only). Compiled components are shared between tests
/// through one compilation cache, as a deployment's restarts share it.
async fn server(setup: Setup, all_examples: bool, tweak: impl FnOnce(&mut gavel::config::Config)) -> TestServer {
    let dir = tempfile::tempdir().unwrap();
    let cache = std::env::temp_dir().join("gavel-test-compile-cache");
    std::fs::create_dir_all(&cache).unwrap();
    std::fs::create_dir_all(dir.path().join("data")).unwrap();
    std::os::unix::fs::symlink(&cache, dir.path().join("data/cache")).unwrap();
    let plugins = dir.path().join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    let root = gavel_tests::repo_root();
    if all_examples {
        std::fs::copy(gavel_tests::guests::SHOUTING, plugins.join("shouting.wasm")).unwrap();
        std::fs::copy(root.join("plugins/shouting.toml"), plugins.join("shouting.toml")).unwrap();
        std::fs::copy(gavel_tests::guests::SHOUTING_JS, plugins.join("shouting-js.wasm")).unwrap();
        std::fs::copy(root.join("plugins/shouting-js.toml"), plugins.join("shouting-js.toml")).unwrap();
    }
    std::fs::copy(gavel_tests::guests::MISBEHAVE, plugins.join("slow.wasm")).unwrap();
    std::fs::write(
        plugins.join("slow.toml"),
        "enabled = false\n[limits]\nasync_deadline_ms = 5000\n[config]\nmode = \"spin\"\nspin_ms = 40\n",
    )
    .unwrap();
    TestServer::start_in(dir, setup, tweak).await
}

async fn settle_all(s: &TestServer, ids: &[String]) {
    for id in ids {
        s.settled(id).await;
    }
}

/// Flags `id` from `n` distinct actors.
async fn flag(s: &TestServer, id: &str, n: usize) {
    for k in 0..n {
        assert_eq!(s.event(id, "flag", &format!("flagger-{k}")).await, 202);
    }
}

/// Backtesting each example plugin against its own history reproduces
/// every stored decision exactly, and changes no combined status.
async fn fidelity_is_exact_for_every_example_plugin(setup: Setup) {
    let s = server(setup, true, |_| {}).await;
    let mut ids = Vec::new();
    for i in 0..6 {
        ids.push(
            s.submit(&format!("author-{i}"), &format!("hello world, a friendly post {i}"))
                .await,
        );
        ids.push(
            s.submit(&format!("author-{i}"), &format!("BUY NOW THIS IS AMAZING {i}"))
                .await,
        );
        ids.push(
            s.submit(&format!("author-{i}"), &format!("scamcoin to the moon {i}"))
                .await,
        );
        ids.push(
            s.submit(
                &format!("author-{i}"),
                &format!("deal {i}: http://a.example http://b.example http://c.example http://d.example"),
            )
            .await,
        );
        ids.push(s.submit("repeater", "the very same text, again and again").await);
    }
    settle_all(&s, &ids).await;
    for id in ids.iter().step_by(5).take(3) {
        flag(&s, id, 6).await;
    }
    // An edit takes the banned term out: the async phase judges the new
    // text, the submission's sync verdict (banned-terms') still stands.
    let edited = s
        .post(&format!("/v1/items/{}/events", ids[2]), &s.client)
        .json(&json!({"kind": "edit", "actor": "author-0", "text": "an edited, harmless text"}))
        .send()
        .await
        .unwrap();
    assert_eq!(edited.status(), 202);
    tokio::time::sleep(Duration::from_millis(300)).await;
    settle_all(&s, &ids).await;

    let mut views = Vec::new();
    for id in &ids {
        views.push(s.get_json(&format!("/v1/items/{id}"), &s.moderator).await);
    }
    for name in [
        "link-spam",
        "duplicate-burst",
        "flag-ratio",
        "banned-terms",
        "shouting",
        "shouting-js",
    ] {
        let record = s.backtest(json!({"candidate": name, "all": true})).await;
        let report = &record["report"];
        let replayed = report["sample"]["replayed"].as_u64().unwrap();
        // Every stored decision of the plugin was replayed, none skipped.
        let stored = views
            .iter()
            .flat_map(|v| v["decisions"].as_array().unwrap())
            .filter(|d| d["plugin"] == name)
            .count() as u64;
        assert!(stored >= 20, "{name}: {stored} decisions");
        assert_eq!(replayed, stored, "{name}: {report:#}");
        assert_eq!(report["sample"]["not_replayable"], json!({}), "{name}");
        assert_eq!(
            report["fidelity"],
            json!({"checked": replayed, "identical": replayed}),
            "{name}: {report:#}"
        );
        assert_eq!(report["flips"]["unchanged"], replayed, "{name}: {report:#}");
        assert_eq!(report["incumbent"][0]["name"], name);
        assert_eq!(report["candidate"]["digest"], report["incumbent"][0]["digest"]);
        assert_eq!(record["progress"], json!({"done": replayed, "total": replayed}));
    }
    s.stop().await.unwrap();
}

/// A stricter config (one more banned term) actions exactly the items that
/// carry it, and nothing else changes; the backtest writes no status,
/// transition or webhook. Its HTML report opens in a real browser.
async fn a_stricter_config_actions_only_the_expected_items(setup: Setup) {
    let receiver = Receiver::start(SECRET, 11).await;
    let s = server(setup, false, |c| {
        c.webhooks.insert(
            "platform".into(),
            WebhookConfig {
                url: receiver.url.clone(),
                secret: SECRET.into(),
                secrets_file: None,
                statuses: vec![],
                kinds: vec![],
                start: Default::default(),
            },
        );
        c.delivery.poll_interval_ms = 20;
    })
    .await;
    let mut crypto = HashSet::new();
    let mut ids = Vec::new();
    for i in 0..8 {
        ids.push(
            s.submit(&format!("a{i}"), &format!("an ordinary message number {i}"))
                .await,
        );
        ids.push(
            s.submit(&format!("b{i}"), &format!("free money for everyone {i}"))
                .await,
        );
    }
    for i in 0..3 {
        let id = s.submit(&format!("c{i}"), &format!("crypto giveaway number {i}")).await;
        crypto.insert(id.clone());
        ids.push(id);
    }
    settle_all(&s, &ids).await;
    // Every transition so far delivered, then nothing more may arrive.
    let changes = s.changes_covering(&s.moderator, &ids).await.len();
    eventually("webhooks delivered", Duration::from_secs(20), async || {
        receiver.accepted().len() >= changes
    })
    .await;
    let before = statuses(&s, &ids).await;
    let delivered = receiver.accepted().len();

    let record = s.backtest(
        json!({"candidate": "banned-terms", "config": {"terms": "scamcoin,free money,miracle cure,crypto"}, "all": true}),
    )
    .await;
    let report = &record["report"];
    let flips = &report["flips"];
    let replayed = report["sample"]["replayed"].as_u64().unwrap();
    assert_eq!(flips["newly_cleared"], 0, "{report:#}");
    assert_eq!(flips["changed"], 0, "{report:#}");
    let newly: BTreeSet<&str> = flips["examples"]["newly_actioned"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["item_id"].as_str().unwrap())
        .collect();
    assert_eq!(newly, crypto.iter().map(String::as_str).collect(), "{report:#}");
    let n = flips["newly_actioned"].as_u64().unwrap();
    assert!(n >= 3, "{report:#}");
    assert_eq!(flips["unchanged"].as_u64().unwrap() + n, replayed);
    assert_eq!(report["overrides"]["terms"], "scamcoin,free money,miracle cure,crypto");
    assert!(report["fidelity"].is_null(), "another config is not a fidelity check");
    assert_eq!(report["verdicts"]["allow"]["reject"], n, "{report:#}");

    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(statuses(&s, &ids).await, before, "a backtest changed an item");
    assert_eq!(receiver.accepted().len(), delivered, "a backtest sent a webhook");
    let after = s.get_json("/v1/changes?limit=1000", &s.moderator).await["changes"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(after, changes, "a backtest wrote a transition");

    // The HTML report: self-contained, opens in headless Chromium.
    let id = record["id"].as_str().unwrap();
    let r = s
        .get(&format!("/v1/backtests/{id}/report.html"), &s.moderator)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers()["content-type"].to_str().unwrap().starts_with("text/html"));
    let html = r.text().await.unwrap();
    let page = s.dir().join("report.html");
    std::fs::write(&page, &html).unwrap();
    let shots = gavel_tests::repo_root().join("target/console-screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let shot = shots.join(format!("backtest-report-{setup:?}.png").to_lowercase());
    open_in_browser(&page, &shot);
    s.stop().await.unwrap();
}

/// Each item's status, version and transition trail.
async fn statuses(s: &TestServer, ids: &[String]) -> Vec<(Value, Value, Value)> {
    let mut out = Vec::new();
    for id in ids {
        let item = s.get_json(&format!("/v1/items/{id}"), &s.moderator).await;
        out.push((
            item["status"].clone(),
            item["version"].clone(),
            item["transitions"].clone(),
        ));
    }
    out
}

/// Runs `tests/console/report.mjs` on a report page: it fails on any
/// console error, failed or external request, or a missing chart.
fn open_in_browser(page: &Path, screenshot: &Path) {
    let dir = gavel_tests::repo_root().join("tests/console");
    if let Err(e) = crate::console::npm_ci() {
        panic!("{e}");
    }
    let out = std::process::Command::new("node")
        .arg(dir.join("report.mjs"))
        .arg(page)
        .arg(screenshot)
        .output()
        .expect("running node");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the report did not open cleanly: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let result: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(result["ok"], true, "{result:#}");
    assert!(result["svgs"].as_u64().unwrap() >= 3, "{result:#}");
}

/// Moderator agreement, reversals avoided and overturns reintroduced on a
/// fixture whose answers are known (see the comments).
async fn moderator_agreement_is_counted_on_known_answers(setup: Setup) {
    let s = server(setup, false, |_| {}).await;
    let moderate = async |id: &str, status: &str| {
        let r = s
            .post(&format!("/v1/items/{id}/moderation"), &s.moderator)
            .json(&json!({"status": status, "reason": "checked by hand"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    };
    // A: rejected by banned-terms; a moderator reverses two, leaves one.
    let a: Vec<String> = submit_all(&s, (0..3).map(|i| (format!("a{i}"), format!("scamcoin deal {i}")))).await;
    // B: allowed; a moderator rejects it (the rules missed it).
    let b = s.submit("b", "a harmless post about gardening").await;
    // C: held by flag-ratio after six flags; a moderator approves it.
    let c = s.submit("c", "crypto chat for beginners").await;
    settle_all(&s, &[a.clone(), vec![b.clone(), c.clone()]].concat()).await;
    flag(&s, &c, 6).await;
    s.wait_for(&c, |i| {
        i["status"] == "held_for_review" && i["needs_eval_since"].is_null()
    })
    .await;
    for id in &a[..2] {
        moderate(id, "visible").await;
    }
    moderate(&b, "rejected").await;
    moderate(&c, "visible").await;

    // The candidate bans "crypto" instead of the shipped terms.
    let record = s
        .backtest(json!({"candidate": "banned-terms", "config": {"terms": "crypto"}, "all": true}))
        .await;
    let m = &record["report"]["moderators"];
    // Decided: a0, a1, b, c. Old combined status: a0/a1 rejected (the
    // moderator cleared them), b visible (rejected by the moderator), c
    // held (cleared): no agreement. New: a0/a1 visible (agree), b visible
    // (disagree), c rejected (disagree).
    assert_eq!(m["decided"], 4, "{m:#}");
    assert_eq!(m["old_agree"], 0, "{m:#}");
    assert_eq!(m["new_agree"], 2, "{m:#}");
    assert_eq!(m["old_agreement"], 0.0);
    assert_eq!(m["new_agreement"], 0.5);
    // a0 and a1: banned-terms actioned them, a moderator reversed it, the candidate would not.
    assert_eq!(m["reversals_avoided"], 2, "{m:#}");
    // c: cleared by a moderator, not actioned by banned-terms, actioned by the candidate.
    assert_eq!(m["overturns_reintroduced"], 1, "{m:#}");
    s.stop().await.unwrap();
}

/// Submits `(author, text)` pairs; their ids in order.
async fn submit_all(s: &TestServer, items: impl Iterator<Item = (String, String)>) -> Vec<String> {
    let mut ids = Vec::new();
    for (author, text) in items {
        ids.push(s.submit(&author, &text).await);
    }
    ids
}

/// Snapshots past their retention are counted `not_replayable`, and the
/// stored-bytes metric follows what is kept.
async fn expired_snapshots_are_counted_not_skipped(setup: Setup) {
    let s = server(setup, false, |_| {}).await;
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(s.submit(&format!("a{i}"), &format!("an ordinary message {i}")).await);
    }
    settle_all(&s, &ids).await;
    let fresh = s.backtest(json!({"candidate": "link-spam", "all": true})).await;
    let replayed = fresh["report"]["sample"]["replayed"].as_u64().unwrap();
    assert!(replayed >= 5);
    let store = s.open_store().await;
    let (docs, bytes) = store.snapshot_footprint().await.unwrap();
    assert!(docs >= 5 && bytes > 0, "{docs} snapshots, {bytes} bytes");
    let policy = gavel::store::RetentionPolicy {
        snapshots_ms: Some(0),
        ..Default::default()
    };
    let pruned = store.prune(&policy, gavel::clock::now_ms() + 1_000).await.unwrap();
    assert_eq!(pruned.snapshots as i64, docs);
    assert_eq!(store.snapshot_footprint().await.unwrap(), (0, 0));

    let expired = s.backtest(json!({"candidate": "link-spam", "all": true})).await;
    let sample = &expired["report"]["sample"];
    assert_eq!(sample["replayed"], 0, "{sample:#}");
    assert_eq!(
        sample["not_replayable"],
        json!({"snapshot expired": replayed}),
        "{sample:#}"
    );
    assert_eq!(sample["available"], replayed);
    s.stop().await.unwrap();
}

/// A running backtest stops when cancelled, keeps no report, and another
/// cancel is a conflict; unknown and malformed ids are answered cleanly.
async fn a_backtest_can_be_cancelled(setup: Setup) {
    let s = server(setup, false, |_| {}).await;
    let mut ids = Vec::new();
    for i in 0..150 {
        ids.push(
            s.submit(&format!("a{}", i % 10), &format!("an ordinary message {i}"))
                .await,
        );
    }
    settle_all(&s, &ids).await;
    // The disabled slow rule (`misbehave`, spinning) takes 40 ms per evaluation: 150 take 6 s.
    let r = s
        .post("/v1/backtests", &s.moderator)
        .json(&json!({"candidate": "misbehave", "replaces": "link-spam", "all": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    let id = r.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_string();
    tokio::time::sleep(Duration::from_millis(700)).await;
    let r = s
        .http
        .delete(format!("{}/v1/backtests/{id}", s.url))
        .bearer_auth(&s.moderator)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap()["status"], "cancelled");
    // It stops within a heartbeat, and stays cancelled, with no report.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let record = s.get_json(&format!("/v1/backtests/{id}"), &s.moderator).await;
    assert_eq!(record["status"], "cancelled", "{record:#}");
    assert!(record["report"].is_null());
    let done = record["progress"]["done"].as_u64().unwrap();
    assert!(done < 150, "{record:#}");
    let again = s
        .http
        .delete(format!("{}/v1/backtests/{id}", s.url))
        .bearer_auth(&s.moderator)
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 200, "cancelling twice is cancelling once");
    let finished = s.backtest(json!({"candidate": "link-spam", "sample": 5})).await;
    assert_eq!(finished["progress"], json!({"done": 5, "total": 5}));
    let finished = finished["id"].as_str().unwrap();
    let late = s
        .http
        .delete(format!("{}/v1/backtests/{finished}", s.url))
        .bearer_auth(&s.moderator)
        .send()
        .await
        .unwrap();
    assert_eq!(late.status(), 409, "a finished backtest cannot be cancelled");
    let list = s.get_json("/v1/backtests", &s.moderator).await;
    assert_eq!(list["backtests"][1]["id"], id.as_str(), "newest first");
    assert_eq!(list["backtests"][0]["id"], finished);
    assert!(list["backtests"][0]["report"].is_null(), "lists leave the reports out");

    // A process holds at most 8 backtests (running or waiting for its slot).
    let mut held = Vec::new();
    for n in 0..9 {
        let r = s
            .post("/v1/backtests", &s.moderator)
            .json(&json!({"candidate": "misbehave", "replaces": "link-spam", "all": true}))
            .send()
            .await
            .unwrap();
        if n < 8 {
            assert_eq!(r.status(), 202);
            held.push(r.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_string());
        } else {
            assert_eq!(r.status(), 429);
            assert!(r.headers().contains_key("retry-after"));
        }
    }
    for id in &held {
        let r = s
            .http
            .delete(format!("{}/v1/backtests/{id}", s.url))
            .bearer_auth(&s.moderator)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    eventually(
        "cancelled backtests free their places",
        Duration::from_secs(15),
        async || {
            s.post("/v1/backtests", &s.moderator)
                .json(&json!({"candidate": "link-spam", "sample": 1}))
                .send()
                .await
                .unwrap()
                .status()
                == 202
        },
    )
    .await;

    let unknown = s
        .get("/v1/backtests/00000000-0000-7000-8000-000000000000", &s.moderator)
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status(), 404);
    let malformed = s.get("/v1/backtests/not-a-uuid", &s.moderator).send().await.unwrap();
    assert_eq!(malformed.status(), 404);
    let nobody = s
        .post("/v1/backtests", &s.moderator)
        .json(&json!({"candidate": "no-such-plugin"}))
        .send()
        .await
        .unwrap();
    assert_eq!(nobody.status(), 404);
    let client = s
        .post("/v1/backtests", &s.client)
        .json(&json!({"candidate": "link-spam"}))
        .send()
        .await
        .unwrap();
    assert_eq!(client.status(), 403);
    let backwards = s
        .post("/v1/backtests", &s.moderator)
        .json(&json!({"candidate": "link-spam", "since_ms": 10, "until_ms": 5}))
        .send()
        .await
        .unwrap();
    assert_eq!(backwards.status(), 422);
    s.stop().await.unwrap();
}

/// A backtest waiting for the process's run slot gives its place back the
/// moment it is cancelled: with every place held (one running, seven
/// waiting), cancelling a waiting one lets the next POST in at once.
async fn cancelling_a_queued_backtest_frees_its_place(setup: Setup) {
    let s = server(setup, false, |_| {}).await;
    let mut ids = Vec::new();
    for i in 0..150 {
        ids.push(
            s.submit(&format!("a{}", i % 10), &format!("an ordinary message {i}"))
                .await,
        );
    }
    settle_all(&s, &ids).await;
    // The disabled slow rule takes 40 ms per evaluation: the first runs for
    // about 6 s, the others wait behind it.
    let slow = json!({"candidate": "misbehave", "replaces": "link-spam", "all": true});
    let mut held = Vec::new();
    for _ in 0..8 {
        let r = s.post("/v1/backtests", &s.moderator).json(&slow).send().await.unwrap();
        assert_eq!(r.status(), 202);
        held.push(r.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_string());
    }
    let full = s.post("/v1/backtests", &s.moderator).json(&slow).send().await.unwrap();
    assert_eq!(full.status(), 429, "every place is held");
    let waiting = held.last().unwrap();
    let r = s
        .http
        .delete(format!("{}/v1/backtests/{waiting}", s.url))
        .bearer_auth(&s.moderator)
        .send()
        .await
        .unwrap();
    assert_eq!(r.json::<Value>().await.unwrap()["status"], "cancelled");
    // No waiting: the running backtest is still far from its end.
    let next = s
        .post("/v1/backtests", &s.moderator)
        .json(&json!({"candidate": "link-spam", "sample": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(next.status(), 202, "{}", next.text().await.unwrap());
    let running = s.get_json(&format!("/v1/backtests/{}", held[0]), &s.moderator).await;
    assert_eq!(
        running["status"], "running",
        "the place was freed before the running one ended"
    );
    for id in &held[..7] {
        s.http
            .delete(format!("{}/v1/backtests/{id}", s.url))
            .bearer_auth(&s.moderator)
            .send()
            .await
            .unwrap();
    }
    s.stop().await.unwrap();
}

/// One item's history: each stored evaluation with its decisions and the
/// snapshot, and what a candidate decides on it now; clients see their own.
async fn an_items_history_replays_step_by_step(setup: Setup) {
    let s = server(setup, false, |_| {}).await;
    let id = s.submit("alice", "scamcoin offer, act now").await;
    s.settled(&id).await;
    flag(&s, &id, 2).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    s.settled(&id).await;
    let replay = s
        .get_json(&format!("/v1/items/{id}/replay?candidate=banned-terms"), &s.moderator)
        .await;
    let evaluations = replay["evaluations"].as_array().unwrap();
    assert!(evaluations.len() >= 2, "{replay:#}");
    assert_eq!(replay["candidate"]["name"], "banned-terms");
    for e in evaluations {
        assert_eq!(e["snapshot"]["item"]["text"], "scamcoin offer, act now", "{e:#}");
        let stored = e["decisions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["plugin"] == "banned-terms")
            .unwrap();
        assert_eq!(e["candidate"]["decision"]["verdict"], stored["verdict"], "{e:#}");
        assert_eq!(stored["verdict"], "reject");
    }
    // The flags reached the later snapshot.
    assert!(
        evaluations.iter().any(|e| e["snapshot"]["counters"]["flag"] == 2),
        "{replay:#}"
    );
    let own = s.get_json(&format!("/v1/items/{id}/replay"), &s.client).await;
    assert_eq!(own["evaluations"].as_array().unwrap().len(), evaluations.len());
    assert!(own["evaluations"][0]["candidate"].is_null());
    let judging = s
        .get(&format!("/v1/items/{id}/replay?candidate=banned-terms"), &s.client)
        .send()
        .await
        .unwrap();
    assert_eq!(judging.status(), 403, "running a candidate is a moderator's call");
    let other = s
        .get(&format!("/v1/items/{id}/replay"), &s.client2)
        .send()
        .await
        .unwrap();
    assert_eq!(other.status(), 404);
    let unknown = s
        .get(&format!("/v1/items/{id}/replay?candidate=nope"), &s.moderator)
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status(), 404);
    s.stop().await.unwrap();
}

/// Evaluations of the long history below, after the item's own.
const SEEDED: usize = 450;

/// A long history is read a page at a time, at the store: each replay page
/// holds at most `limit` evaluations, newest first chosen, with a cursor to
/// the older ones; walking the cursors visits every stored evaluation
/// exactly once, in order. The console's item page shows the latest 50
/// decisions with a link to older ones.
async fn a_long_history_is_paged_at_the_store(setup: Setup) {
    let s = server(setup, false, |_| {}).await;
    let id = s.submit("alice", "a quiet message").await;
    s.settled(&id).await;
    let own = s.get_json(&format!("/v1/items/{id}/replay"), &s.moderator).await;
    let own = own["evaluations"].as_array().unwrap().len();
    let store = s.open_store().await;
    let plugins = [
        ("alpha", "1.0.0", &"a".repeat(64)[..]),
        ("beta", "1.0.0", &"b".repeat(64)[..]),
    ];
    let start = gavel::clock::now_ms() + 1_000;
    gavel_tests::history::seed_evaluations(&store, &id, "a quiet message", &plugins, SEEDED, start)
        .await
        .unwrap();

    let newest = s
        .get_json(&format!("/v1/items/{id}/replay?limit=200"), &s.moderator)
        .await;
    let evaluations = newest["evaluations"].as_array().unwrap();
    assert_eq!(evaluations.len(), 200, "{:#}", newest["older"]);
    let last = evaluations.last().unwrap();
    assert_eq!(
        last["snapshot"]["counters"]["flag"],
        SEEDED - 1,
        "oldest first, ending with the newest"
    );
    assert_eq!(
        last["decisions"].as_array().unwrap().len(),
        2,
        "one evaluation, both its decisions"
    );
    assert!(
        newest["older"].is_i64(),
        "older evaluations are a cursor away: {:#}",
        newest["older"]
    );

    // Every page back: each older than the one after it, none repeated.
    let mut seen: Vec<i64> = Vec::new();
    let mut before: Option<i64> = None;
    let mut pages = 0;
    loop {
        let path = match before {
            Some(b) => format!("/v1/items/{id}/replay?limit=64&before={b}"),
            None => format!("/v1/items/{id}/replay?limit=64"),
        };
        let page = s.get_json(&path, &s.moderator).await;
        let evaluations = page["evaluations"].as_array().unwrap();
        assert!(!evaluations.is_empty() && evaluations.len() <= 64, "{page:#}");
        let mut times: Vec<i64> = evaluations.iter().map(|e| e["at_ms"].as_i64().unwrap()).collect();
        assert!(times.is_sorted(), "a page is oldest first");
        if let Some(first) = seen.first() {
            assert!(
                times.last().unwrap() <= first,
                "each page is older than the one after it"
            );
        }
        times.extend(seen);
        seen = times;
        pages += 1;
        match page["older"].as_i64() {
            Some(b) => before = Some(b),
            None => break,
        }
    }
    assert_eq!(seen.len(), SEEDED + own, "every evaluation once");
    assert_eq!(pages, (SEEDED + own).div_ceil(64));
    let seeded: Vec<i64> = seen.iter().copied().filter(|t| *t >= start).collect();
    assert_eq!(seeded, (0..SEEDED as i64).map(|k| start + k).collect::<Vec<_>>());

    for bad in ["limit=0", "limit=201", "before=x"] {
        let r = s
            .get(&format!("/v1/items/{id}/replay?{bad}"), &s.moderator)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "{bad}");
    }

    // The console: the latest 50 decisions, and a link to older ones.
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let page = format!("/console/items/{id}");
    let (session, _) = crate::console::sign_in(&http, &s.url, &page, &s.moderator).await;
    let cookie = format!("gavel_session={}", session.unwrap());
    let html = |path: String| {
        let (http, cookie, url) = (&http, &cookie, &s.url);
        async move {
            let r = http
                .get(format!("{url}{path}"))
                .header("cookie", cookie)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            r.text().await.unwrap()
        }
    };
    let latest = html(page.clone()).await;
    assert_eq!(latest.matches(r#"data-kind="decision""#).count(), 50, "{latest}");
    let older = latest
        .split(r#"id="older-decisions" href=""#)
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("a link to older decisions")
        .replace("&amp;", "&");
    let previous = html(older).await;
    assert_eq!(previous.matches(r#"data-kind="decision""#).count(), 50);
    assert!(previous.contains(r#"id="newest-decisions""#));
    s.stop().await.unwrap();
}

/// `all` is bounded: a window holding more evaluations than
/// `evaluation.backtest_max_all` is refused with a clear 422 before
/// anything runs (and `since_ms = 0` is no way around it); a window within
/// the bound runs.
async fn all_is_refused_past_its_bound(setup: Setup) {
    let s = server(setup, false, |c| c.evaluation.backtest_max_all = 5).await;
    let mut ids = Vec::new();
    for i in 0..8 {
        ids.push(s.submit(&format!("a{i}"), &format!("an ordinary message {i}")).await);
    }
    settle_all(&s, &ids).await;
    for body in [
        json!({"candidate": "link-spam", "all": true}),
        json!({"candidate": "link-spam", "all": true, "since_ms": 0}),
        json!({"candidate": "new-one", "replaces": "link-spam", "all": true, "since_ms": 0}),
    ] {
        let r = s.post("/v1/backtests", &s.moderator).json(&body).send().await.unwrap();
        if body["candidate"] == "new-one" {
            assert_eq!(r.status(), 404, "an unknown candidate first");
            continue;
        }
        assert_eq!(r.status(), 422, "{body}");
        let e: Value = r.json().await.unwrap();
        assert_eq!(e["error"]["code"], "backtest_too_large", "{e:#}");
        assert!(e["error"]["message"].as_str().unwrap().contains("more than 5"), "{e:#}");
    }
    let list = s.get_json("/v1/backtests", &s.moderator).await;
    assert_eq!(list["backtests"], json!([]), "nothing was started");
    // A sample of the same window runs, and so does `all` over a window within the bound:
    // one that opens after the first eight settled (an evaluation's time, not its item's,
    // places it in a window, and the first eight may be judged after later ones arrive).
    s.backtest(json!({"candidate": "link-spam", "sample": 3})).await;
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
        + 1;
    tokio::time::sleep(Duration::from_millis(5)).await;
    let later = [s.submit("b0", "an ordinary message, later").await];
    settle_all(&s, &later).await;
    let record = s
        .backtest(json!({"candidate": "link-spam", "all": true, "since_ms": since}))
        .await;
    let total = record["progress"]["total"].as_u64().unwrap();
    assert!((1..=5).contains(&total), "{record:#}");
    assert_eq!(record["progress"]["done"], total, "{record:#}");
    s.stop().await.unwrap();
}

/// `gavel backtest` and `gavel replay` read the store of a stopped server
/// (its config and data directory) and write nothing to it.
async fn the_cli_backtests_and_replays_a_stopped_servers_store(setup: Setup) {
    let s = server(setup, false, |_| {}).await;
    let mut ids = Vec::new();
    for i in 0..4 {
        ids.push(s.submit(&format!("a{i}"), &format!("free money, message {i}")).await);
        ids.push(s.submit(&format!("b{i}"), &format!("a calm message {i}")).await);
    }
    settle_all(&s, &ids).await;
    let (config, dir) = s.stop_keeping_dir().await;
    let candidate = dir.path().join("plugins/banned-terms.wasm");
    let json_out = dir.path().join("report.json");
    let html_out = dir.path().join("report.html");
    let gavel = gavel_tests::servers::gavel_binary();
    let db = config.database_url();
    let out = std::process::Command::new(&gavel)
        .args(["backtest", "--all", "--since", "1d", "--database-url", &db])
        .arg("--candidate")
        .arg(&candidate)
        .arg("--data-dir")
        .arg(&config.data_dir)
        .arg("--json")
        .arg(&json_out)
        .arg("--html")
        .arg(&html_out)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("fidelity"), "{stdout}");
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&json_out).unwrap()).unwrap();
    let replayed = report["sample"]["replayed"].as_u64().unwrap();
    assert!(replayed >= 8, "{report:#}");
    assert_eq!(report["fidelity"], json!({"checked": replayed, "identical": replayed}));
    assert!(std::fs::read_to_string(&html_out).unwrap().contains("<svg"));

    let stricter = std::process::Command::new(&gavel)
        .args(["backtest", "--all", "--database-url", &db, "--config", "terms=calm"])
        .arg("--candidate")
        .arg(&candidate)
        .arg("--data-dir")
        .arg(&config.data_dir)
        .arg("--json")
        .arg("-")
        .output()
        .unwrap();
    assert!(
        stricter.status.success(),
        "{}",
        String::from_utf8_lossy(&stricter.stderr)
    );
    let text = String::from_utf8_lossy(&stricter.stdout);
    let report: Value = serde_json::from_str(&text[text.find("{\n").unwrap()..]).unwrap();
    // "free money" is no longer banned, "calm" is.
    assert!(report["flips"]["newly_cleared"].as_u64().unwrap() >= 4, "{report:#}");
    assert!(report["flips"]["newly_actioned"].as_u64().unwrap() >= 4, "{report:#}");

    let out = std::process::Command::new(&gavel)
        .args(["replay", &ids[0], "--database-url", &db])
        .arg("--candidate")
        .arg(&candidate)
        .arg("--data-dir")
        .arg(&config.data_dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("banned-terms") && stdout.contains("candidate ok reject"),
        "{stdout}"
    );
    drop(dir);
}

gavel_tests::both!(
    fidelity_is_exact_for_every_example_plugin,
    a_stricter_config_actions_only_the_expected_items,
    moderator_agreement_is_counted_on_known_answers,
    expired_snapshots_are_counted_not_skipped,
    a_backtest_can_be_cancelled,
    cancelling_a_queued_backtest_frees_its_place,
    an_items_history_replays_step_by_step,
    a_long_history_is_paged_at_the_store,
    all_is_refused_past_its_bound,
    the_cli_backtests_and_replays_a_stopped_servers_store,
);
