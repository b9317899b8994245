//! AI provider hand-off end to end (docs/RELIABILITY.md C1, C2): a rule defers
//! items with media to a provider; gavel sends signed requests with a stable
//! idempotency key; callbacks arrive duplicated, shuffled and stale, and
//! exactly one is applied per request; a moderator's decision while waiting
//! always wins (also when both race: no deadlock, no 5xx); silence ends in
//! `held_for_review` (`provider_timeout`); an answer for unchanged content
//! stands (C3): later votes never send the item back to the provider.

use gavel::config::{Config, ProviderConfig};
use gavel::providers::Callback;
use gavel::providers::fake::{FakeOptions, FakeProvider, send_callback};
use gavel::signing::Secret;
use gavel_tests::Rng;
use gavel_tests::guests;
use gavel_tests::server::{Setup, TestServer};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

const SECRET: &str = "provider-secret-0123456789";

/// [`SECRET`] as a key.
fn secret_key() -> Secret {
    Secret::parse(SECRET).unwrap()
}

/// POSTs `body` signed with `secret` (Standard Webhooks headers) at `timestamp`.
async fn send_signed(
    http: &reqwest::Client,
    url: &str,
    secret: &[u8],
    timestamp: i64,
    body: Vec<u8>,
) -> reqwest::Result<reqwest::StatusCode> {
    let secret = Secret::parse(std::str::from_utf8(secret).unwrap()).unwrap();
    gavel::providers::fake::send_signed(http, url, &secret, "msg_test", timestamp, body).await
}

fn silent() -> FakeOptions {
    FakeOptions {
        secret: SECRET.into(),
        verdict: "allow".into(),
        reason: "fake".into(),
        delay: Duration::ZERO,
        copies: 1,
        silent: true,
        fail_first: 0,
    }
}

/// A fake provider, and gavel with the media hand-off rule deferring to it
/// as `classifier`.
async fn start(setup: Setup, options: FakeOptions, tweak: impl FnOnce(&mut Config)) -> (Arc<TestServer>, FakeProvider) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let fake = FakeProvider::start(listener, options).unwrap();
    let url = fake.url.clone();
    let s = TestServer::start_with(setup, |c| {
        std::fs::copy(guests::MEDIA_HANDOFF, c.plugin_dir.join("media-handoff.wasm")).unwrap();
        c.providers.insert(
            "classifier".into(),
            ProviderConfig {
                url,
                secret: SECRET.into(),
                secrets_file: None,
                request_timeout_ms: 1_000,
                deadline_ms: 60_000,
                retry_base_ms: 20,
                retry_max_ms: 200,
            },
        );
        tweak(c);
    })
    .await;
    (Arc::new(s), fake)
}

async fn submit_media(s: &TestServer, n: usize) -> String {
    s.submit_with(
        &format!("author-{n}"),
        &format!("look at this picture {n}"),
        json!({"media": format!("https://cdn.example/{n}.jpg")}),
    )
    .await
}

/// Waits until the item waits on a request the fake provider has received;
/// returns the item and that request's key.
async fn awaiting(s: &TestServer, fake: &FakeProvider, id: &str, requests: usize) -> (Value, String) {
    let item = s
        .wait_for(id, |i| {
            i["status"] == "awaiting_provider"
                && i["provider_requests"].as_array().unwrap().len() == requests
                && i["provider_requests"][requests - 1]["status"] == "sent"
        })
        .await;
    let key = item["provider_requests"][requests - 1]["key"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(fake.received().iter().any(|r| r.request_key == key));
    (item, key)
}

fn callback(event_id: &str, key: &str, item: &str, verdict: &str) -> Callback {
    Callback {
        event_id: event_id.into(),
        request_key: key.into(),
        item_id: item.into(),
        verdict: verdict.into(),
        score: 0.8,
        label: Some("ai".into()),
        labels: vec![],
        reason: format!("{verdict} by the model"),
    }
}

fn callback_url(s: &TestServer) -> String {
    format!("{}/v1/provider-callbacks/classifier", s.url)
}

const VERDICTS: [(&str, &str); 4] = [
    ("allow", "visible"),
    ("flag", "visible"),
    ("hold", "held_for_review"),
    ("reject", "rejected"),
];

/// C1: each callback delivered 2-5 times, shuffled; 10 % of the requests
/// superseded by a newer one before their callbacks arrive; a quarter of the
/// requests answered by two distinct events (the provider processed a
/// retry twice). Exactly one callback applied per live request, the stale
/// ones recorded and never applied, the final state follows the latest request.
async fn each_request_is_applied_once_and_stale_callbacks_are_recorded(setup: Setup) {
    let seed = Rng::from_clock().next_u64();
    eprintln!("seed {seed}");
    let mut rng = Rng(seed);
    let (s, fake) = start(setup, silent(), |_| {}).await;
    let n = 40;
    let mut ids = Vec::new();
    for i in 0..n {
        ids.push(submit_media(&s, i).await);
    }
    let mut requests: Vec<(String, String)> = Vec::new(); // (item, key), oldest first
    for id in &ids {
        let (_, key) = awaiting(&s, &fake, id, 1).await;
        requests.push((id.clone(), key));
    }
    // 10 %: the content is edited, the rule defers again, and the new
    // request supersedes the outstanding one (the provider judged the old text).
    let superseded: Vec<String> = ids.iter().step_by(10).cloned().collect();
    for id in &superseded {
        let r = s
            .post(&format!("/v1/items/{id}/events"), &s.client)
            .json(&json!({"kind": "edit", "actor": "someone", "text": "look at this picture, edited"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 202);
    }
    for id in &superseded {
        let (item, key) = awaiting(&s, &fake, id, 2).await;
        assert_eq!(item["provider_requests"][0]["status"], "superseded");
        assert_eq!(item["provider_requests"][0]["superseded_by"], key.as_str());
        requests.push((id.clone(), key));
    }

    // The callbacks: one event per request (two for a quarter of them),
    // each sent 2-5 times, all shuffled.
    let mut sends: Vec<Callback> = Vec::new();
    let mut verdict_of: HashMap<String, Vec<&str>> = HashMap::new(); // key -> verdicts of its events
    for (i, (item, key)) in requests.iter().enumerate() {
        let events = if i % 4 == 0 { 2 } else { 1 };
        for e in 0..events {
            let verdict = VERDICTS[rng.below(4) as usize].0;
            verdict_of.entry(key.clone()).or_default().push(verdict);
            let cb = callback(&format!("{key}/event-{e}"), key, item, verdict);
            for _ in 0..2 + rng.below(4) {
                sends.push(cb.clone());
            }
        }
    }
    rng.shuffle(&mut sends);
    let total = sends.len();
    let url = callback_url(&s);
    let http = reqwest::Client::new();
    let mut statuses: BTreeMap<u16, usize> = BTreeMap::new();
    for chunk in sends.chunks(8) {
        let mut tasks = tokio::task::JoinSet::new();
        for cb in chunk {
            let (http, url, cb) = (http.clone(), url.clone(), cb.clone());
            tasks.spawn(async move { send_callback(&http, &url, &secret_key(), &cb).await.unwrap() });
        }
        for status in tasks.join_all().await {
            *statuses.entry(status.as_u16()).or_default() += 1;
        }
    }
    assert!(
        statuses.keys().all(|s| [200, 202].contains(s)),
        "only 200 and 202: {statuses:?}"
    );

    let latest: HashMap<&str, &str> = requests.iter().map(|(i, k)| (i.as_str(), k.as_str())).collect();
    let mut applied_total = 0;
    let mut stale_total = 0;
    for id in &ids {
        let item = s.get_json(&format!("/v1/items/{id}"), &s.moderator).await;
        let callbacks = item["provider_callbacks"].as_array().unwrap();
        let latest_key = latest[id.as_str()];
        for (_, key) in requests.iter().filter(|(i, _)| i == id) {
            let of_key: Vec<&Value> = callbacks.iter().filter(|c| c["request_key"] == key.as_str()).collect();
            let distinct_events = verdict_of[key].len();
            assert_eq!(of_key.len(), distinct_events, "one row per event id, repeats add none");
            let applied: Vec<&&Value> = of_key.iter().filter(|c| c["outcome"] == "applied").collect();
            if key == latest_key {
                assert_eq!(applied.len(), 1, "exactly one applied for {key}: {of_key:?}");
                assert!(
                    of_key
                        .iter()
                        .all(|c| c["outcome"] == "applied" || c["outcome"] == "duplicate")
                );
            } else {
                assert!(applied.is_empty(), "a superseded request is never applied");
                assert!(of_key.iter().all(|c| c["outcome"] == "stale"), "{of_key:?}");
                stale_total += of_key.len();
            }
            applied_total += applied.len();
        }
        // The final state follows the latest request's applied answer.
        let applied = callbacks
            .iter()
            .find(|c| c["request_key"] == latest_key && c["outcome"] == "applied")
            .unwrap();
        let event = applied["event_id"].as_str().unwrap();
        let e: usize = event.rsplit("event-").next().unwrap().parse().unwrap();
        let verdict = verdict_of[latest_key][e];
        let status = VERDICTS.iter().find(|(v, _)| *v == verdict).unwrap().1;
        assert_eq!(item["status"], status, "{id}: {item:#}");
        assert_eq!(item["decided_by"], "provider");
        let provider_transitions = item["transitions"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|t| t["cause"] == "provider_callback")
            .count();
        assert_eq!(provider_transitions, 1, "one applied callback, one transition");
        let provider_decisions: Vec<&Value> = item["decisions"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|d| d["phase"] == "provider")
            .collect();
        assert_eq!(provider_decisions.len(), 1);
        assert_eq!(provider_decisions[0]["plugin"], "classifier");
        assert_eq!(provider_decisions[0]["verdict"], verdict);
        assert_eq!(
            item["provider_requests"].as_array().unwrap().last().unwrap()["status"],
            "answered"
        );
    }
    assert_eq!(applied_total, ids.len());
    assert!(stale_total >= superseded.len());
    eprintln!("{total} callback deliveries: {statuses:?}; {applied_total} applied, {stale_total} stale recorded");
}

/// A moderator decides while the item waits: the provider's later answer is
/// recorded as stale and changes nothing.
async fn a_moderator_decision_while_waiting_always_wins(setup: Setup) {
    let (s, fake) = start(setup, silent(), |_| {}).await;
    let id = submit_media(&s, 1).await;
    let (_, key) = awaiting(&s, &fake, &id, 1).await;
    let r = s
        .post(&format!("/v1/items/{id}/moderation"), &s.moderator)
        .json(&json!({"status": "visible", "reason": "checked by hand"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let http = reqwest::Client::new();
    let status = send_callback(
        &http,
        &callback_url(&s),
        &secret_key(),
        &callback("late-1", &key, &id, "reject"),
    )
    .await
    .unwrap();
    assert_eq!(status, 202);
    let item = s.get_json(&format!("/v1/items/{id}"), &s.moderator).await;
    assert_eq!(item["status"], "visible");
    assert_eq!(item["decided_by"], "moderator");
    assert_eq!(item["provider_requests"][0]["status"], "cancelled");
    assert_eq!(item["provider_callbacks"][0]["outcome"], "stale");
    assert!(
        item["transitions"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["actor"] != "provider")
    );
}

/// A provider that never answers: past the deadline the item goes to
/// review with cause `provider_timeout`; a late answer is stale.
async fn an_unanswered_request_times_out_to_review(setup: Setup) {
    let (s, fake) = start(setup, silent(), |c| {
        c.providers.get_mut("classifier").unwrap().deadline_ms = 1_500;
    })
    .await;
    let id = submit_media(&s, 2).await;
    let (_, key) = awaiting(&s, &fake, &id, 1).await;
    let item = s.wait_for(&id, |i| i["status"] == "held_for_review").await;
    let last = item["transitions"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["cause"], "provider_timeout");
    assert_eq!(last["actor"], "system");
    assert_eq!(last["from_status"], "awaiting_provider");
    assert!(last["correlation_id"].as_str().unwrap().contains(&key));
    assert_eq!(item["provider_requests"][0]["status"], "timed_out");
    let status = send_callback(
        &reqwest::Client::new(),
        &callback_url(&s),
        &secret_key(),
        &callback("too-late", &key, &id, "allow"),
    )
    .await
    .unwrap();
    assert_eq!(status, 202);
    let after = s.get_json(&format!("/v1/items/{id}"), &s.moderator).await;
    assert_eq!(after["status"], "held_for_review");
    assert_eq!(after["version"], item["version"]);
}

/// A provider failing the first sends: gavel retries with the same
/// idempotency key, then the provider answers (three times: one applied,
/// two duplicates).
async fn retries_reuse_the_key_and_the_answer_applies_once(setup: Setup) {
    let options = FakeOptions {
        silent: false,
        fail_first: 2,
        copies: 3,
        verdict: "reject".into(),
        delay: Duration::from_millis(50),
        ..silent()
    };
    let (s, fake) = start(setup, options, |_| {}).await;
    let id = submit_media(&s, 3).await;
    let item = s.wait_for(&id, |i| i["status"] == "rejected").await;
    let key = item["provider_requests"][0]["key"].as_str().unwrap();
    let sends: Vec<_> = fake.received().into_iter().filter(|r| r.request_key == key).collect();
    assert_eq!(sends.len(), 3, "two failures, then accepted");
    assert_eq!(sends.iter().map(|r| r.attempt).collect::<Vec<_>>(), vec![1, 2, 3]);
    assert!(sends.iter().all(|r| r.item_id == id && r.text.contains("picture")));
    assert_eq!(item["provider_requests"][0]["attempts"], 3);
    // The three copies of the answer: one applied, the repeats recorded once.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let metrics = s.metrics.encode();
        if metrics.contains("gavel_provider_callbacks_total{outcome=\"duplicate\"} 2") {
            break;
        }
        assert!(Instant::now() < deadline, "{metrics}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let item = s.get_json(&format!("/v1/items/{id}"), &s.moderator).await;
    let callbacks = item["provider_callbacks"].as_array().unwrap();
    assert_eq!(callbacks.len(), 1);
    assert_eq!(callbacks[0]["outcome"], "applied");
    assert_eq!(item["status"], "rejected");
}

/// C2: bad HMAC, missing or old signatures are 401; unknown provider, item
/// or request 404; malformed bodies 400. Nothing is applied.
async fn bad_callbacks_are_refused_and_apply_nothing(setup: Setup) {
    let (s, fake) = start(setup, silent(), |_| {}).await;
    let id = submit_media(&s, 4).await;
    let (before, key) = awaiting(&s, &fake, &id, 1).await;
    let http = reqwest::Client::new();
    let url = callback_url(&s);
    let good = serde_json::to_vec(&callback("c2", &key, &id, "reject")).unwrap();
    let now = gavel::signing::now_secs();
    // Wrong secret.
    let r = send_signed(&http, &url, b"not-the-secret-at-all", now, good.clone())
        .await
        .unwrap();
    assert_eq!(r, 401);
    // Correctly signed, but six minutes old.
    let r = send_signed(&http, &url, SECRET.as_bytes(), now - 360, good.clone())
        .await
        .unwrap();
    assert_eq!(r, 401);
    // Body changed after signing.
    let sig = gavel::signing::sign(&[secret_key()], "msg_test", now, &good);
    let mut tampered = good.clone();
    tampered.extend_from_slice(b" ");
    let r = http
        .post(&url)
        .header(gavel::signing::ID_HEADER, "msg_test")
        .header(gavel::signing::TIMESTAMP_HEADER, now.to_string())
        .header(gavel::signing::SIGNATURE_HEADER, sig)
        .body(tampered)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "bad_signature");
    // No signature at all.
    let r = http.post(&url).body(good.clone()).send().await.unwrap();
    assert_eq!(r.status(), 401);
    // Unknown item, unknown request key, unknown provider.
    let unknown_item = serde_json::to_vec(&callback("c2-item", &key, "no-such-item", "reject")).unwrap();
    assert_eq!(
        send_signed(&http, &url, SECRET.as_bytes(), now, unknown_item)
            .await
            .unwrap(),
        404
    );
    let unknown_key = serde_json::to_vec(&callback("c2-key", "no-such-key", &id, "reject")).unwrap();
    assert_eq!(
        send_signed(&http, &url, SECRET.as_bytes(), now, unknown_key.clone())
            .await
            .unwrap(),
        404
    );
    assert_eq!(
        send_signed(&http, &url, SECRET.as_bytes(), now, unknown_key)
            .await
            .unwrap(),
        404,
        "a repeat of an unknown callback is still unknown"
    );
    let other_provider = format!("{}/v1/provider-callbacks/nobody", s.url);
    assert_eq!(
        send_signed(&http, &other_provider, SECRET.as_bytes(), now, good.clone())
            .await
            .unwrap(),
        404
    );
    // Malformed, and a verdict a provider may not give.
    assert_eq!(
        send_signed(&http, &url, SECRET.as_bytes(), now, b"{not json".to_vec())
            .await
            .unwrap(),
        400
    );
    let defer = serde_json::to_vec(&callback("c2-defer", &key, &id, "defer")).unwrap();
    assert_eq!(
        send_signed(&http, &url, SECRET.as_bytes(), now, defer).await.unwrap(),
        400
    );
    // Nothing applied.
    let after = s.get_json(&format!("/v1/items/{id}"), &s.moderator).await;
    assert_eq!(after["status"], "awaiting_provider");
    assert_eq!(after["version"], before["version"]);
    assert_eq!(after["provider_requests"][0]["status"], "sent");
    assert!(
        after["provider_callbacks"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["outcome"] == "unknown")
    );
    // The genuine answer still applies.
    assert_eq!(
        send_signed(&http, &url, SECRET.as_bytes(), now, good).await.unwrap(),
        200
    );
    let done = s.get_json(&format!("/v1/items/{id}"), &s.moderator).await;
    assert_eq!(done["status"], "rejected");
}

/// A rule deferring to a provider this deployment does not configure: the
/// item is held for a human instead of waiting forever.
async fn a_defer_to_an_unknown_provider_is_held(setup: Setup) {
    let (s, _fake) = start(setup, silent(), |c| {
        std::fs::write(
            c.plugin_dir.join("media-handoff.toml"),
            "[config]\nprovider = \"video-ai\"\n",
        )
        .unwrap();
    })
    .await;
    let id = submit_media(&s, 5).await;
    let item = s.wait_for(&id, |i| i["status"] == "held_for_review").await;
    let last = item["transitions"].as_array().unwrap().last().unwrap().clone();
    assert!(last["reason"].as_str().unwrap().contains("not configured"), "{last}");
    assert!(item["provider_requests"].as_array().unwrap().is_empty());
}

/// C3: a provider answered; later votes (no edit) re-evaluate the item and
/// the rule defers again: the answer stands (no new request, the item stays
/// visible, the provider is not paid twice). An edit does ask again.
async fn a_provider_answer_stands_until_the_content_changes(setup: Setup) {
    let (s, fake) = start(setup, silent(), |_| {}).await;
    let id = submit_media(&s, 6).await;
    let (_, key) = awaiting(&s, &fake, &id, 1).await;
    let http = reqwest::Client::new();
    let status = send_callback(
        &http,
        &callback_url(&s),
        &secret_key(),
        &callback("c3-1", &key, &id, "allow"),
    )
    .await
    .unwrap();
    assert_eq!(status, 200);
    let answered = s.wait_for(&id, |i| i["status"] == "visible").await;
    for n in 0..3 {
        assert_eq!(s.event(&id, "upvote", &format!("voter-{n}")).await, 202);
    }
    let item = s
        .wait_for(&id, |i| i["needs_eval_since"].is_null() && i["counters"]["upvote"] == 3)
        .await;
    assert_eq!(item["status"], "visible", "the provider's answer stands: {item:#}");
    assert_eq!(item["version"], answered["version"], "no transition at all");
    assert_eq!(item["provider_requests"].as_array().unwrap().len(), 1, "no new request");
    assert_eq!(fake.received().len(), 1, "the provider was asked once");
    let last = item["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|d| d["plugin"] == "media-handoff")
        .unwrap();
    assert_eq!(
        last["verdict"], "defer",
        "the rule still defers; the host keeps the answer"
    );
    // An edit changes what the provider judged: it is asked again.
    let r = s
        .post(&format!("/v1/items/{id}/events"), &s.client)
        .json(&json!({"kind": "edit", "actor": "author-6", "text": "a different picture now"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    let (item, _) = awaiting(&s, &fake, &id, 2).await;
    assert_eq!(item["content_version"], 2);
    assert_eq!(fake.received().len(), 2);
}

/// A moderator and a provider's callback deciding the same waiting item at
/// once: both paths lock the item first, so they never deadlock; one wins,
/// the other is refused, never a 5xx. Many rounds.
async fn a_moderator_racing_a_callback_never_deadlocks(setup: Setup) {
    let (s, fake) = start(setup, silent(), |_| {}).await;
    let http = reqwest::Client::new();
    for round in 0..20 {
        let id = submit_media(&s, 100 + round).await;
        let (_, key) = awaiting(&s, &fake, &id, 1).await;
        let moderation = s
            .post(&format!("/v1/items/{id}/moderation"), &s.moderator)
            .json(&json!({"status": "rejected", "reason": "race"}))
            .send();
        let cb = callback(&format!("race-{round}"), &key, &id, "allow");
        let url = callback_url(&s);
        let signing_key = secret_key();
        let callback = send_callback(&http, &url, &signing_key, &cb);
        let (m, c) = tokio::join!(moderation, callback);
        let (m, c) = (m.unwrap().status().as_u16(), c.unwrap().as_u16());
        assert_eq!(m, 200, "round {round}: a manual decision always applies");
        assert!(c == 200 || c == 202, "round {round}: callback answered {c}");
        let item = s.get_json(&format!("/v1/items/{id}"), &s.moderator).await;
        assert_eq!(
            item["status"], "rejected",
            "round {round}: the moderator wins: {item:#}"
        );
        assert_eq!(item["decided_by"], "moderator");
    }
}

gavel_tests::both!(
    each_request_is_applied_once_and_stale_callbacks_are_recorded,
    a_moderator_decision_while_waiting_always_wins,
    an_unanswered_request_times_out_to_review,
    retries_reuse_the_key_and_the_answer_applies_once,
    bad_callbacks_are_refused_and_apply_nothing,
    a_defer_to_an_unknown_provider_is_held,
    a_provider_answer_stands_until_the_content_changes,
    a_moderator_racing_a_callback_never_deadlocks,
);
