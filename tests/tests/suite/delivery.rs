//! Decision delivery end to end (issue: outbox, signed webhooks, changes
//! feed): every transition reaches a flaky receiver exactly once after
//! dedup and in version order per item; broken endpoints dead-letter
//! without disturbing anything else and replay; the changes feed pages
//! through commits made while it is read, without gaps or repeats.
//! Redirects are never followed; a process that does not know an endpoint
//! leaves its deliveries to one that does.

use gavel::config::WebhookConfig;
use gavel::domain::DeliveryStatus;
use gavel::store::Change;
use gavel_tests::Rng;
use gavel_tests::receiver::Receiver;
use gavel_tests::server::{Setup, TestServer};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

const SECRET: &str = "webhook-secret-0123456789";

fn webhook(url: &str) -> WebhookConfig {
    WebhookConfig {
        url: url.to_string(),
        secret: SECRET.into(),
        secrets_file: None,
        statuses: vec![],
        kinds: vec![],
        start: Default::default(),
    }
}

/// Every change in the feed, read as the moderator from the start, once it
/// shows every transition of the items `ids`.
async fn all_changes(s: &TestServer, ids: &[String]) -> Vec<Change> {
    let feed = s.changes_covering(&s.moderator, ids).await;
    serde_json::from_value(Value::Array(feed)).unwrap()
}

/// Submits `n` items over 16 lanes; every third one carries a link, so
/// items settle in different statuses.
async fn submit_many(s: &Arc<TestServer>, n: usize) -> Vec<String> {
    let mut lanes = tokio::task::JoinSet::new();
    for lane in 0..16 {
        let s = s.clone();
        lanes.spawn(async move {
            let mut ids = Vec::new();
            for i in (lane..n).step_by(16) {
                let text = if i % 3 == 0 {
                    format!("post {i}: cheap pills at http://spam.example/{i} http://b.example http://c.example")
                } else {
                    format!("post {i}: an ordinary message")
                };
                ids.push(s.submit(&format!("author-{}", i % 50), &text).await);
            }
            ids
        });
    }
    lanes.join_all().await.into_iter().flatten().collect()
}

/// 1,000 items settle while the receiver fails 30 % of requests and hangs
/// on 5 %: every transition arrives, exactly once after dedup by
/// `event_id`, never an older version after a newer one for the same item,
/// and no delivery used more attempts than configured.
async fn every_transition_is_delivered_once_in_order(setup: Setup) {
    let seed = Rng::from_clock().next_u64();
    eprintln!("receiver seed {seed}");
    let receiver = Receiver::start(SECRET, seed).await;
    receiver.behaviour.fail_per_mille.store(300, Ordering::Relaxed);
    receiver.behaviour.hang_per_mille.store(50, Ordering::Relaxed);
    let max_attempts = 40;
    let s = Arc::new(
        TestServer::start_with(setup, |c| {
            c.webhooks.insert("platform".into(), webhook(&receiver.url));
            c.delivery.timeout_ms = 300;
            c.delivery.retry_base_ms = 20;
            c.delivery.retry_max_ms = 300;
            c.delivery.max_attempts = max_attempts;
            c.delivery.concurrency = 64;
            c.delivery.poll_interval_ms = 20;
        })
        .await,
    );
    let ids = submit_many(&s, 1_000).await;
    for id in &ids {
        s.wait_for(id, |i| i["needs_eval_since"].is_null() && i["status"] != "pending_scan")
            .await;
    }
    let expected: HashMap<String, Change> = all_changes(&s, &ids)
        .await
        .into_iter()
        .map(|c| (c.event_id.clone(), c))
        .collect();
    let ids: HashSet<&String> = ids.iter().collect();
    assert!(
        expected
            .values()
            .filter(|c| c.item_id.as_ref().is_some_and(|i| ids.contains(i)))
            .count()
            >= 2 * ids.len(),
        "each item has its creation and its evaluation transition"
    );

    let deadline = Instant::now() + Duration::from_secs(120);
    let accepted = loop {
        let accepted = receiver.accepted();
        let distinct: HashSet<&str> = accepted.iter().map(|c| c.event_id.as_str()).collect();
        if distinct.len() >= expected.len() {
            break accepted;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {} events delivered",
            distinct.len(),
            expected.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };

    // After dedup by event_id: exactly the transitions, each as committed.
    let mut seen: HashMap<&str, &Change> = HashMap::new();
    for c in &accepted {
        let first = seen.entry(c.event_id.as_str()).or_insert(c);
        assert_eq!(*first, c, "a redelivery carries the same event");
    }
    assert_eq!(seen.len(), expected.len());
    for (id, c) in &seen {
        assert_eq!(expected.get(*id), Some(*c), "delivered what was committed");
    }
    // Per item, versions arrive in order (a redelivery repeats, never goes back).
    let mut last: HashMap<&str, i64> = HashMap::new();
    for c in &accepted {
        let prev = last.entry(c.item_id.as_deref().unwrap()).or_insert(0);
        assert!(
            c.item_version >= *prev,
            "item {:?} got version {} after {}",
            c.item_id,
            c.item_version,
            prev
        );
        *prev = c.item_version;
    }
    // Retries were needed and bounded; nothing went dead.
    let store = s.open_store().await;
    let deliveries = store.deliveries(true, 100_000).await.unwrap();
    assert_eq!(deliveries.len(), expected.len(), "one delivery per event and endpoint");
    assert!(
        deliveries.iter().all(|d| d.status == DeliveryStatus::Delivered),
        "none dead"
    );
    assert!(deliveries.iter().all(|d| d.attempts <= i64::from(max_attempts)));
    let retried = deliveries.iter().filter(|d| d.attempts > 1).count();
    assert!(retried > expected.len() / 10, "only {retried} deliveries retried");
    assert_eq!(receiver.bad_signatures(), 0);
    eprintln!(
        "{} events, {} requests to the receiver, {} accepted, {retried} deliveries retried",
        expected.len(),
        receiver.requests(),
        accepted.len()
    );
    stop(s).await;
}

/// An unreachable endpoint and one answering 500 forever: their deliveries
/// go dead after the configured attempts and are listed; a healthy endpoint
/// and evaluation carry on; replaying after the fix delivers.
async fn broken_endpoints_dead_letter_and_replay(setup: Setup) {
    let healthy = Receiver::start(SECRET, 7).await;
    let failing = Receiver::start(SECRET, 8).await;
    failing.behaviour.status.store(500, Ordering::Relaxed);
    // Port 1: nothing listens there (a "free" port could be taken by another
    // test's server meanwhile).
    let unreachable = "http://127.0.0.1:1/hook".to_string();
    let s = Arc::new(
        TestServer::start_with(setup, |c| {
            c.webhooks.insert("healthy".into(), webhook(&healthy.url));
            c.webhooks.insert("failing".into(), webhook(&failing.url));
            c.webhooks.insert("unreachable".into(), webhook(&unreachable));
            c.delivery.timeout_ms = 500;
            c.delivery.retry_base_ms = 10;
            c.delivery.retry_max_ms = 50;
            c.delivery.max_attempts = 3;
            c.delivery.poll_interval_ms = 20;
        })
        .await,
    );
    let ids = submit_many(&s, 20).await;
    for id in &ids {
        s.wait_for(id, |i| i["needs_eval_since"].is_null() && i["status"] != "pending_scan")
            .await;
    }
    let events = all_changes(&s, &ids).await.len();
    let deadline = Instant::now() + Duration::from_secs(60);
    let dead = loop {
        let dead: Vec<Value> = serde_json::from_value(s.get_json("/v1/deliveries", &s.moderator).await).unwrap();
        let delivered = healthy
            .accepted()
            .iter()
            .map(|c| c.event_id.clone())
            .collect::<HashSet<_>>()
            .len();
        if dead.len() == 2 * events && delivered == events {
            break dead;
        }
        assert!(
            Instant::now() < deadline,
            "{} dead of {}, {delivered} delivered of {events}",
            dead.len(),
            2 * events
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for d in &dead {
        assert_eq!(d["attempts"], 3, "{d}");
        let error = d["last_error"].as_str().unwrap();
        match d["endpoint"].as_str().unwrap() {
            "failing" => assert!(error.contains("500"), "{error}"),
            "unreachable" => assert!(error.contains("connect"), "{error}"),
            other => panic!("unexpected dead delivery to {other}: {d}"),
        }
    }
    // A client token may not see or replay deliveries.
    let forbidden = s.get("/v1/deliveries", &s.client).send().await.unwrap();
    assert_eq!(forbidden.status(), 403);
    // The endpoint is fixed; its dead deliveries are replayed and arrive.
    failing.behaviour.status.store(0, Ordering::Relaxed);
    for d in dead.iter().filter(|d| d["endpoint"] == "failing") {
        let r = s
            .post(&format!("/v1/deliveries/{}/replay", d["id"]), &s.moderator)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 202);
    }
    let again = s
        .post("/v1/deliveries/999999/replay", &s.moderator)
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 404);
    let deadline = Instant::now() + Duration::from_secs(30);
    while failing
        .accepted()
        .iter()
        .map(|c| &c.event_id)
        .collect::<HashSet<_>>()
        .len()
        < events
    {
        assert!(Instant::now() < deadline, "replayed deliveries did not arrive");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Items kept being judged throughout.
    let late = s.submit("late-author", "a late ordinary post").await;
    s.wait_for(&late, |i| i["status"] == "visible").await;
    stop(s).await;
}

/// `GET /v1/changes` paged with a small limit while items are submitted and
/// moderated: every transition exactly once, in per-item version order; a
/// client token sees only its own items.
async fn changes_feed_pages_without_gaps_while_committing(setup: Setup) {
    let s = Arc::new(TestServer::start(setup).await);
    let writing = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let mut writers = tokio::task::JoinSet::new();
    for lane in 0..6 {
        let (s, writing) = (s.clone(), writing.clone());
        writers.spawn(async move {
            let mut n = 0;
            let mut ids = Vec::new();
            while writing.load(Ordering::Relaxed) {
                let id = s
                    .submit(&format!("w{lane}-{n}"), &format!("lane {lane} post {n}"))
                    .await;
                ids.push(id.clone());
                if n % 4 == 0 {
                    let r = s
                        .post(&format!("/v1/items/{id}/moderation"), &s.moderator)
                        .json(&json!({"status": "rejected", "reason": "test"}))
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(r.status(), 200);
                }
                n += 1;
            }
            ids
        });
    }
    // A client of another scope submits too.
    let other: Value = s
        .post("/v1/items", &s.client2)
        .json(&json!({"kind": "post", "author": "x", "text": "from the app"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let mut ids = vec![other["id"].as_str().unwrap().to_string()];

    let mut seen: Vec<Change> = Vec::new();
    let mut cursor = String::new();
    let started = Instant::now();
    let mut pages = 0;
    loop {
        let writing_now = started.elapsed() < Duration::from_secs(3);
        if !writing_now {
            writing.store(false, Ordering::Relaxed);
        }
        let page: Value = s
            .get_json(&format!("/v1/changes?after={cursor}&limit=7"), &s.moderator)
            .await;
        let changes: Vec<Change> = serde_json::from_value(page["changes"].clone()).unwrap();
        cursor = page["next_cursor"].as_str().unwrap().to_string();
        pages += 1;
        let empty = changes.is_empty();
        seen.extend(changes);
        if empty && !writing_now && writers.is_empty() {
            // Settled: one more read after everything committed.
            break;
        }
        if !writing_now {
            while let Some(done) = writers.try_join_next() {
                ids.extend(done.expect("a writer failed"));
            }
        }
        if empty {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    // Every transition that exists, from each item's audit trail once it has
    // settled (not from the feed, whose PostgreSQL horizon may lag).
    let mut everything = HashSet::new();
    for id in &ids {
        let item = s
            .wait_for(id, |i| i["needs_eval_since"].is_null() && i["status"] != "pending_scan")
            .await;
        for t in item["transitions"].as_array().unwrap() {
            everything.insert(format!("{id}:{}", t["version"]));
        }
    }
    // The reader catches up from its cursor. (An empty page means "nothing
    // visible yet", not "done": on PostgreSQL the feed waits for older
    // transactions anywhere in the cluster.)
    let deadline = Instant::now() + Duration::from_secs(30);
    while !everything.iter().all(|id| seen.iter().any(|c| &c.event_id == id)) {
        assert!(Instant::now() < deadline, "the feed never caught up");
        let page: Value = s
            .get_json(&format!("/v1/changes?after={cursor}&limit=7"), &s.moderator)
            .await;
        let changes: Vec<Change> = serde_json::from_value(page["changes"].clone()).unwrap();
        cursor = page["next_cursor"].as_str().unwrap().to_string();
        if changes.is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        seen.extend(changes);
    }
    let ids: Vec<&str> = seen.iter().map(|c| c.event_id.as_str()).collect();
    let distinct: HashSet<&str> = ids.iter().copied().collect();
    assert_eq!(distinct.len(), ids.len(), "no event twice across pages");
    let all: HashSet<&str> = everything.iter().map(String::as_str).collect();
    assert_eq!(distinct, all, "every committed transition, none missing");
    let mut versions: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
    for c in &seen {
        versions
            .entry(c.item_id.as_deref().unwrap())
            .or_default()
            .push(c.item_version);
    }
    for (item, v) in &versions {
        assert_eq!(*v, (1..=v.len() as i64).collect::<Vec<_>>(), "item {item}");
    }
    // Every transition in the audit trail has its event.
    for (item, v) in versions.iter().take(50) {
        let details = s.get_json(&format!("/v1/items/{item}"), &s.moderator).await;
        assert_eq!(details["transitions"].as_array().unwrap().len(), v.len(), "{item}");
    }
    // A client sees only its own items.
    let page: Value = s.get_json("/v1/changes?limit=1000", &s.client2).await;
    let mine = page["changes"].as_array().unwrap();
    assert!(!mine.is_empty());
    assert!(mine.iter().all(|c| c["client"] == "app"));
    // Bad cursors and limits are 400s.
    for q in ["after=nonsense", "after=1.x", "limit=0", "limit=5000"] {
        let r = s.get(&format!("/v1/changes?{q}"), &s.moderator).send().await.unwrap();
        assert_eq!(r.status(), 400, "{q}");
    }
    eprintln!("{} events over {pages} pages", seen.len());
    stop(s).await;
}

/// Stops a shared server once the test's tasks are done with it.
async fn stop(s: Arc<TestServer>) {
    Arc::try_unwrap(s)
        .unwrap_or_else(|_| panic!("the server is still shared"))
        .stop()
        .await
        .unwrap();
}

/// A webhook endpoint answering with a redirect: the signed body never
/// follows it to the other host; the attempt fails and says why.
async fn redirects_are_never_followed(setup: Setup) {
    let target = Receiver::start(SECRET, 21).await;
    let redirecting = Receiver::start(SECRET, 22).await;
    *redirecting.behaviour.redirect_to.lock().unwrap() = Some(target.url.clone());
    let s = Arc::new(
        TestServer::start_with(setup, |c| {
            c.webhooks.insert("platform".into(), webhook(&redirecting.url));
            c.delivery.retry_base_ms = 10;
            c.delivery.retry_max_ms = 20;
            c.delivery.max_attempts = 2;
            c.delivery.poll_interval_ms = 20;
        })
        .await,
    );
    let id = s.submit("redirected", "an ordinary post").await;
    s.settled(&id).await;
    let store = s.open_store().await;
    gavel_tests::server::eventually("the deliveries to go dead", Duration::from_secs(20), async || {
        let d = store.deliveries(true, 100).await.unwrap();
        !d.is_empty() && d.iter().all(|d| d.status == DeliveryStatus::Dead)
    })
    .await;
    let dead = store.deliveries(false, 100).await.unwrap();
    assert!(
        dead.iter().all(|d| d
            .last_error
            .as_deref()
            .unwrap_or("")
            .contains("redirects are not followed")),
        "{dead:?}"
    );
    assert!(redirecting.requests() >= 2);
    assert_eq!(target.requests(), 0, "the redirect was followed with the signed body");
    stop(s).await;
}

/// During a rolling configuration change, a process that does not know an
/// endpoint never claims that endpoint's deliveries (before, it claimed
/// them and marked them dead): they wait for a process that knows it.
async fn a_process_without_the_endpoint_leaves_its_deliveries(setup: Setup) {
    let receiver = Receiver::start(SECRET, 31).await;
    receiver.behaviour.status.store(503, Ordering::Relaxed);
    let a = TestServer::start_with(setup, |c| {
        c.webhooks.insert("platform".into(), webhook(&receiver.url));
        c.delivery.retry_base_ms = 50;
        c.delivery.retry_max_ms = 200;
        c.delivery.max_attempts = 1_000;
        c.delivery.poll_interval_ms = 20;
    })
    .await;
    let mut ids = Vec::new();
    for i in 0..10 {
        ids.push(a.submit(&format!("rolling-{i}"), "an ordinary post").await);
    }
    for id in &ids {
        a.settled(id).await;
    }
    let store = a.open_store().await;
    gavel_tests::server::eventually("deliveries to exist", Duration::from_secs(10), async || {
        store.deliveries(true, 1000).await.unwrap().len() >= 20
    })
    .await;
    // A second process on the same store and queue, without the endpoint.
    let shared = a.config.clone();
    let b = TestServer::start_with(setup, |c| {
        c.database_url = shared.database_url.clone();
        c.redis_url = shared.redis_url.clone();
        c.redis_prefix = shared.redis_prefix.clone();
        c.delivery.poll_interval_ms = 20;
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let deliveries = store.deliveries(true, 1000).await.unwrap();
    assert!(
        deliveries.iter().all(|d| d.status == DeliveryStatus::Pending),
        "{deliveries:#?}"
    );
    // The endpoint recovers: the process that knows it delivers everything.
    receiver.behaviour.status.store(0, Ordering::Relaxed);
    gavel_tests::server::eventually("every delivery delivered", Duration::from_secs(20), async || {
        store
            .deliveries(true, 1000)
            .await
            .unwrap()
            .iter()
            .all(|d| d.status == DeliveryStatus::Delivered)
    })
    .await;
    b.stop().await.unwrap();
    a.stop().await.unwrap();
}

gavel_tests::both!(
    every_transition_is_delivered_once_in_order,
    broken_endpoints_dead_letter_and_replay,
    changes_feed_pages_without_gaps_while_committing,
    a_process_without_the_endpoint_leaves_its_deliveries,
);
gavel_tests::matrix!([embedded_only: Embedded] redirects_are_never_followed);
