//! Standard Webhooks, out and in, against a peer built on the PyPI
//! `standardwebhooks` library (tests/standard_webhooks/peer.py), not on
//! gavel's own verifier: the receiver verifies every delivery across retries
//! and a secret rotation (a removed secret no longer verifies); `410 Gone`
//! disables an endpoint until it is enabled again; `Retry-After` is
//! honoured; provider callbacks signed by the library are applied, and
//! tampered, stale, wrongly signed or removed-secret ones are refused.

use gavel::config::{ProviderConfig, WebhookConfig};
use gavel::domain::DeliveryStatus;
use gavel::signing::Secret;
use gavel_tests::guests;
use gavel_tests::peer::Peer;
use gavel_tests::server::{Setup, TestServer, eventually};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::time::Duration;

/// Longer than a secrets file's recheck interval.
const RELOAD: Duration = Duration::from_millis(600);

fn write_secrets(path: &Path, secrets: &[&str]) {
    std::fs::write(path, secrets.join("\n") + "\n").unwrap();
}

fn endpoint(url: &str, secrets_file: &Path) -> WebhookConfig {
    WebhookConfig {
        url: format!("{url}/hook"),
        secret: String::new(),
        secrets_file: Some(secrets_file.to_path_buf()),
        statuses: vec![],
        kinds: vec![],
        start: Default::default(),
    }
}

/// Event ids of every transition in the changes feed, read once it shows
/// every transition of the items `ids`.
async fn event_ids(s: &TestServer, ids: &[String]) -> HashSet<String> {
    s.changes_covering(&s.moderator, ids)
        .await
        .iter()
        .map(|c| c["event_id"].as_str().unwrap().to_string())
        .collect()
}

/// Event ids the receiver verified and acknowledged (2xx).
fn acknowledged(log: &[Value]) -> HashSet<String> {
    log.iter()
        .filter(|r| r["verified"] == true && r["status"].as_u64().unwrap() < 300)
        .map(|r| r["event_id"].as_str().unwrap().to_string())
        .collect()
}

/// Submits `n` items, waits until each has settled and adds their ids to
/// `ids`.
async fn submit_settled(s: &TestServer, ids: &mut Vec<String>, prefix: &str, n: usize) {
    for i in 0..n {
        let id = s.submit(&format!("{prefix}-{i}"), &format!("{prefix} post {i}")).await;
        s.settled(&id).await;
        ids.push(id);
    }
}

/// Waits until the receiver acknowledged every event of the feed (which
/// has every transition of the items `ids`).
async fn all_acknowledged(s: &TestServer, ids: &[String], receiver: &Peer) {
    eventually(
        "every event verified and acknowledged",
        Duration::from_secs(30),
        async || {
            let expected = event_ids(s, ids).await;
            acknowledged(&receiver.log().await).is_superset(&expected)
        },
    )
    .await;
}

/// Every delivery verifies with the stock library across a retry of each
/// (the first attempt of each message is answered 500), with one opaque
/// `webhook-id` per event on every attempt; a rotation (add B, receiver
/// switches, remove A) never fails a delivery; once A is removed, a
/// receiver still on A refuses, then accepts the retry after switching.
async fn a_stock_receiver_verifies_every_delivery_across_retries_and_rotation(setup: Setup) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("platform.secrets");
    let (a, b) = (Secret::generate(), Secret::generate());
    write_secrets(&file, &[&a]);
    let receiver = Peer::start("receiver", &a).await;
    receiver.control(json!({"fail_first": 1})).await;
    let s = TestServer::start_with(setup, |c| {
        c.webhooks.insert("platform".into(), endpoint(&receiver.url, &file));
        c.legacy_headers = false;
        c.delivery.retry_base_ms = 20;
        c.delivery.retry_max_ms = 100;
        c.delivery.poll_interval_ms = 20;
    })
    .await;
    let mut ids = Vec::new();
    submit_settled(&s, &mut ids, "before", 4).await;
    all_acknowledged(&s, &ids, &receiver).await;

    // Rotation: B is added; the receiver switches to it; nothing fails.
    write_secrets(&file, &[&a, &b]);
    tokio::time::sleep(RELOAD).await;
    receiver.control(json!({"secret": b})).await;
    submit_settled(&s, &mut ids, "during", 4).await;
    all_acknowledged(&s, &ids, &receiver).await;

    // A is removed: a receiver still on A refuses; switched to B, the retry verifies.
    let removed_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    write_secrets(&file, &[&b]);
    tokio::time::sleep(RELOAD).await;
    receiver.control(json!({"secret": a, "fail_first": 0})).await;
    let id = s.submit("after", "after the rotation").await;
    s.settled(&id).await;
    ids.push(id);
    eventually(
        "a delivery signed without A is refused by A",
        Duration::from_secs(10),
        async || receiver.log().await.iter().any(|r| r["verified"] == false),
    )
    .await;
    receiver.control(json!({"secret": b})).await;
    all_acknowledged(&s, &ids, &receiver).await;

    let log = receiver.log().await;
    let mut attempts: BTreeMap<String, Vec<&Value>> = BTreeMap::new();
    for r in &log {
        attempts
            .entry(r["webhook_id"].as_str().unwrap().to_string())
            .or_default()
            .push(r);
    }
    let expected = event_ids(&s, &ids).await;
    assert_eq!(attempts.len(), expected.len(), "one webhook-id per event");
    for (id, tries) in &attempts {
        assert!(id.starts_with("msg_") && !id.contains('.') && !id.contains(':'), "{id}");
        let events: HashSet<&str> = tries.iter().filter_map(|r| r["event_id"].as_str()).collect();
        assert!(events.len() <= 1, "{id} carried {events:?}");
        // Before the removal every first attempt was answered 500.
        if tries[0]["at"].as_f64().unwrap() < removed_at {
            assert!(tries.len() >= 2, "every message was retried: {tries:?}");
        }
        assert!(
            tries.iter().all(|r| r["legacy"] != true),
            "no X-Gavel-* headers when the switch is off"
        );
    }
    let refused: Vec<&Value> = log.iter().filter(|r| r["verified"] == false).collect();
    assert!(!refused.is_empty());
    assert!(
        refused.iter().all(|r| r["at"].as_f64().unwrap() >= removed_at),
        "nothing was refused before A was removed: {refused:?}"
    );
    // While both secrets were in the file, deliveries carried two signatures.
    assert!(log.iter().any(|r| r["signatures"] == 2), "{log:?}");
    let store = s.open_store().await;
    let deliveries = store.deliveries(true, 1000).await.unwrap();
    assert!(
        deliveries.iter().all(|d| d.status == DeliveryStatus::Delivered),
        "{deliveries:?}"
    );
    s.stop().await.unwrap();
}

/// A receiver answering `410 Gone` disables its endpoint: no more requests,
/// its deliveries wait, the state is stored (another process on the same
/// store sees it), counted and logged; re-enabling delivers everything.
async fn gone_disables_the_endpoint_until_it_is_enabled(setup: Setup) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("platform.secrets");
    let secret = Secret::generate();
    write_secrets(&file, &[&secret]);
    let receiver = Peer::start("receiver", &secret).await;
    receiver.control(json!({"status": 410})).await;
    let s = TestServer::start_with(setup, |c| {
        c.webhooks.insert("platform".into(), endpoint(&receiver.url, &file));
        c.delivery.retry_base_ms = 10;
        c.delivery.retry_max_ms = 20;
        c.delivery.max_attempts = 3;
        c.delivery.poll_interval_ms = 20;
        // One request at a time, so exactly one is answered 410 (with more,
        // requests already in flight when it comes are answered 410 too).
        c.delivery.concurrency = 1;
    })
    .await;
    let mut ids = Vec::new();
    submit_settled(&s, &mut ids, "gone", 3).await;
    eventually("the endpoint to be disabled", Duration::from_secs(10), async || {
        let endpoints = s.get_json("/v1/webhooks", &s.moderator).await;
        endpoints[0]["disabled_at"].is_i64()
    })
    .await;
    let endpoints = s.get_json("/v1/webhooks", &s.moderator).await;
    assert_eq!(endpoints[0]["endpoint"], "platform");
    assert!(
        endpoints[0]["disabled_reason"].as_str().unwrap().contains("410"),
        "{endpoints}"
    );
    // No more requests while disabled; nothing is dead-lettered.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let requests = receiver.log().await.len();
    assert_eq!(requests, 1, "one 410 and nothing after");
    let store = s.open_store().await;
    let deliveries = store.deliveries(true, 1000).await.unwrap();
    assert!(
        deliveries.iter().all(|d| d.status == DeliveryStatus::Pending),
        "{deliveries:?}"
    );
    // The state read now, after the items' events have all been fanned out.
    let now = s.get_json("/v1/webhooks", &s.moderator).await;
    assert_eq!(now[0]["pending"].as_u64().unwrap() as usize, deliveries.len(), "{now}");
    assert!(
        s.metrics.encode().contains("gavel_webhook_endpoints_disabled_total 1"),
        "the metric counts it"
    );
    // Another process on the same store and queue sees the state and sends nothing.
    let shared = s.config.clone();
    let other = TestServer::start_with(setup, |c| {
        c.database_url = shared.database_url.clone();
        c.redis_url = shared.redis_url.clone();
        c.redis_prefix = shared.redis_prefix.clone();
        c.webhooks = shared.webhooks.clone();
        c.delivery = shared.delivery.clone();
    })
    .await;
    let seen = other.get_json("/v1/webhooks", &other.moderator).await;
    assert!(seen[0]["disabled_at"].is_i64(), "{seen}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(receiver.log().await.len(), 1);
    // Only a moderator may enable; an unknown or enabled endpoint is 404.
    let r = s.post("/v1/webhooks/platform/enable", &s.client).send().await.unwrap();
    assert_eq!(r.status(), 403);
    let r = s.post("/v1/webhooks/nobody/enable", &s.moderator).send().await.unwrap();
    assert_eq!(r.status(), 404);
    receiver.control(json!({"status": 0})).await;
    let r = s
        .post("/v1/webhooks/platform/enable", &s.moderator)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let enabled: Value = r.json().await.unwrap();
    assert!(enabled["disabled_at"].is_null(), "{enabled}");
    let again = s
        .post("/v1/webhooks/platform/enable", &s.moderator)
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 404, "already enabled");
    all_acknowledged(&s, &ids, &receiver).await;
    eventually("every delivery delivered", Duration::from_secs(10), async || {
        store
            .deliveries(true, 1000)
            .await
            .unwrap()
            .iter()
            .all(|d| d.status == DeliveryStatus::Delivered)
    })
    .await;
    other.stop().await.unwrap();
    s.stop().await.unwrap();
}

/// `429` and `503` with `Retry-After: 2` are retried no earlier than two
/// seconds later, though the configured backoff is tens of milliseconds.
async fn retry_after_is_honoured(setup: Setup) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("secrets");
    let secret = Secret::generate();
    write_secrets(&file, &[&secret]);
    let throttled = Peer::start("receiver", &secret).await;
    throttled
        .control(json!({"fail_first": 1, "fail_status": 429, "retry_after": 2}))
        .await;
    let unavailable = Peer::start("receiver", &secret).await;
    unavailable
        .control(json!({"fail_first": 1, "fail_status": 503, "retry_after": 2}))
        .await;
    let s = TestServer::start_with(setup, |c| {
        c.webhooks.insert("throttled".into(), endpoint(&throttled.url, &file));
        c.webhooks
            .insert("unavailable".into(), endpoint(&unavailable.url, &file));
        c.delivery.retry_base_ms = 10;
        c.delivery.retry_max_ms = 50;
        c.delivery.poll_interval_ms = 20;
    })
    .await;
    let mut ids = Vec::new();
    submit_settled(&s, &mut ids, "throttled", 2).await;
    for receiver in [&throttled, &unavailable] {
        all_acknowledged(&s, &ids, receiver).await;
        let log = receiver.log().await;
        let mut first: BTreeMap<&str, f64> = BTreeMap::new();
        for r in &log {
            let (id, at) = (r["webhook_id"].as_str().unwrap(), r["at"].as_f64().unwrap());
            match first.get(id) {
                None => {
                    assert!(r["status"] == 429 || r["status"] == 503, "{r}");
                    first.insert(id, at);
                }
                Some(&before) => assert!(at - before >= 1.95, "{id} retried after {:.3} s", at - before),
            }
        }
        assert!(!first.is_empty());
    }
    s.stop().await.unwrap();
}

/// A provider signing with the stock library: gavel's requests verify
/// with it, and its callbacks are applied. Callbacks with a tampered body,
/// a stale timestamp, a wrong secret, or a secret removed from the file
/// are refused (401); one signed with a secret added to the file is
/// accepted; the legacy headers verify against the same set.
async fn stock_library_provider_callbacks_apply_and_bad_ones_are_refused(setup: Setup) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("classifier.secrets");
    let (p, q) = (Secret::generate(), Secret::generate());
    write_secrets(&file, &[&p]);
    let provider = Peer::start("provider", &p).await;
    let s = TestServer::start_with(setup, |c| {
        std::fs::copy(guests::MEDIA_HANDOFF, c.plugin_dir.join("media-handoff.wasm")).unwrap();
        c.providers.insert(
            "classifier".into(),
            ProviderConfig {
                url: format!("{}/classify", provider.url),
                secret: String::new(),
                secrets_file: Some(file.clone()),
                request_timeout_ms: 2_000,
                deadline_ms: 60_000,
                retry_base_ms: 20,
                retry_max_ms: 200,
            },
        );
    })
    .await;
    let media = |n: u32| json!({"media": format!("https://cdn.example/{n}.jpg")});
    let id = s.submit_with("pictures", "look at this picture", media(1)).await;
    let item = s.wait_for(&id, |i| i["status"] == "rejected").await;
    assert_eq!(item["provider_callbacks"][0]["outcome"], "applied", "{item}");
    let log = provider.log().await;
    assert!(
        log.iter()
            .any(|r| r["request_key"].is_string() && r["verified"] == true),
        "{log:?}"
    );

    // An item waiting on a provider that now answers nothing by itself.
    provider
        .control(json!({"secret": p, "sign_secret": "whsec_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"}))
        .await;
    let id = s.submit_with("pictures", "another picture", media(2)).await;
    let item = s
        .wait_for(&id, |i| {
            i["status"] == "awaiting_provider" && i["provider_requests"][0]["status"] == "sent"
        })
        .await;
    let key = item["provider_requests"][0]["key"].as_str().unwrap().to_string();
    let url = format!("{}/v1/provider-callbacks/classifier", s.url);
    let body = |event: &str| {
        json!({"event_id": event, "request_key": key, "item_id": id, "verdict": "reject", "score": 0.9, "reason": "x"})
            .to_string()
    };
    let http = reqwest::Client::new();
    let send = async |secret: &str, timestamp: i64, signed: &str, sent: &str| {
        let signature = provider.sign(secret, "msg_cb", timestamp, signed).await;
        http.post(&url)
            .header("webhook-id", "msg_cb")
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", signature)
            .body(sent.to_string())
            .send()
            .await
            .unwrap()
    };
    let now = gavel::signing::now_secs();
    // The provider's own answer, signed with a secret gavel does not have, was refused.
    eventually(
        "the wrongly signed callback to be refused",
        Duration::from_secs(10),
        async || {
            provider
                .log()
                .await
                .iter()
                .any(|r| r["callback_for"] == key.as_str() && r["status"] == 401)
        },
    )
    .await;
    let tampered = body("tampered").replace("\"reject\"", "\"allow\"");
    assert_eq!(
        send(&p, now, &body("tampered"), &tampered).await.status(),
        401,
        "tampered body"
    );
    assert_eq!(
        send(&p, now - 600, &body("stale"), &body("stale")).await.status(),
        401,
        "stale timestamp"
    );
    assert_eq!(
        send(&q, now, &body("wrong"), &body("wrong")).await.status(),
        401,
        "wrong secret"
    );
    let refused = send(&q, now, &body("wrong"), &body("wrong")).await;
    let error: Value = refused.json().await.unwrap();
    assert_eq!(error["error"]["code"], "bad_signature");
    // Rotation: Q is added, then P removed.
    write_secrets(&file, &[&p, &q]);
    tokio::time::sleep(RELOAD).await;
    write_secrets(&file, &[&q]);
    tokio::time::sleep(RELOAD).await;
    assert_eq!(
        send(&p, now, &body("removed"), &body("removed")).await.status(),
        401,
        "removed secret"
    );
    // The legacy headers, signed with a removed secret, are refused too.
    let legacy = |secret: &str, event: &str| {
        let key = Secret::parse(secret).unwrap();
        let b = body(event);
        let sig = gavel::signing::sign_legacy(&key, now, b.as_bytes());
        http.post(&url)
            .header("x-gavel-timestamp", now.to_string())
            .header("x-gavel-signature", sig)
            .body(b)
            .send()
    };
    assert_eq!(legacy(&p, "legacy-removed").await.unwrap().status(), 401);
    let r = send(&q, gavel::signing::now_secs(), &body("rotated"), &body("rotated")).await;
    assert_eq!(r.status(), 200, "signed with the new secret");
    let item = s.wait_for(&id, |i| i["status"] == "rejected").await;
    let outcomes: Vec<&str> = item["provider_callbacks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(outcomes, ["applied"], "only the good callback was stored");
    // The legacy headers with the secret in force: verified (a duplicate of nothing: 404 is not 401).
    let r = legacy(&q, "legacy-current").await.unwrap();
    assert_ne!(r.status(), 401);
    s.stop().await.unwrap();
}

gavel_tests::both!(
    a_stock_receiver_verifies_every_delivery_across_retries_and_rotation,
    gone_disables_the_endpoint_until_it_is_enabled,
    retry_after_is_honoured,
    stock_library_provider_callbacks_apply_and_bad_ones_are_refused,
);
