//! Author standing (`host/src/store/authors.rs`, `host/src/domain/standing.rs`):
//! strikes derived from the decision log in a window, account states changed
//! by one fenced write each. The double penalty (a burst of rejections judged
//! by two servers and by recomputations holding no lease at all), a
//! reversal, a moderator who agrees with a rule, any path of moderator
//! decisions (a property, on both stores), labels, the window moving, a
//! moderator's manual state, shadow decisions, the submission effect, paged
//! lists, and each account transition reaching the platform exactly once.

use gavel::clock::now_ms;
use gavel::config::WebhookConfig;
use gavel::domain::standing::{StandingPolicy, Tier, TierEffect};
use gavel::domain::{ItemStatus, Mode, Outcome, Phase, Verdict};
use gavel::store::{
    AuthorPage, CreateOutcome, DuplicateRule, ItemWrite, ManualActor, Moderation, ModerationOutcome, NewDecision,
    NewItem, SharedStore,
};
use gavel_tests::receiver::Receiver;
use gavel_tests::server::{Setup, TestServer, eventually};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

const SECRET: &str = "webhook-secret-0123456789";
/// banned-terms rejects it at submission (sync phase), for anyone.
const SPAM: &str = "buy scamcoin now";

fn tiers(watch: f64, restricted: f64, suspended: f64) -> Vec<Tier> {
    let tier = |name: &str, strikes, effect| Tier {
        name: name.into(),
        strikes,
        effect,
    };
    vec![
        tier("good", 0.0, TierEffect::None),
        tier("watch", watch, TierEffect::None),
        tier("restricted", restricted, TierEffect::Hold),
        tier("suspended", suspended, TierEffect::Reject),
    ]
}

/// A server with standing on (`policy` tweaks it) and a webhook receiver.
async fn server(setup: Setup, receiver: &Receiver, policy: impl FnOnce(&mut StandingPolicy)) -> TestServer {
    let url = receiver.url.clone();
    TestServer::start_with(setup, move |c| {
        c.standing.enabled = true;
        policy(&mut c.standing);
        c.webhooks.insert(
            "platform".into(),
            WebhookConfig {
                url,
                secret: SECRET.into(),
                secrets_file: None,
                statuses: vec![],
                kinds: vec![],
                start: Default::default(),
            },
        );
        c.delivery.poll_interval_ms = 20;
    })
    .await
}

async fn author(s: &TestServer, name: &str) -> Value {
    let r = s.get(&format!("/v1/authors/{name}"), &s.client).send().await.unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    r.json().await.unwrap()
}

/// Waits until the author's state and the strikes derived now from the
/// decision log are as expected.
async fn wait_author(s: &TestServer, name: &str, status: &str, strikes: f64) -> Value {
    let mut last = Value::Null;
    eventually(
        &format!("author {name} {status} with {strikes} strikes"),
        Duration::from_secs(20),
        async || {
            last = author(s, name).await;
            last["status"] == status && last["strikes"].as_f64() == Some(strikes)
        },
    )
    .await;
    last
}

/// The state names of `policy` in order, for checking a chain of transitions.
fn rank(policy: &StandingPolicy, state: &str) -> usize {
    policy.tiers.iter().position(|t| t.name == state).unwrap()
}

/// One chain: versions 1..=n, each transition leaving the state the last
/// one reached, the first leaving the first tier, `first`.
fn assert_one_chain(transitions: &[Value], first: &str) {
    let mut at = first.to_string();
    for (k, t) in transitions.iter().enumerate() {
        assert_eq!(t["version"], json!(k as i64 + 1), "{transitions:#?}");
        assert_eq!(t["from_status"], json!(at), "{transitions:#?}");
        at = t["to_status"].as_str().unwrap().to_string();
    }
}

/// A post by `author` that banned-terms rejects (each text its own, so the
/// duplicate-text check never holds one).
async fn spam(s: &TestServer, author: &str) -> String {
    let text = format!("{SPAM} {}", gavel_tests::server::uuid_ish());
    let (status, r) = s
        .submit_as(
            &s.client,
            &json!({"kind": "post", "author": author, "text": text}),
            None,
        )
        .await;
    assert_eq!(status, 202, "{r}");
    r["id"].as_str().unwrap().to_string()
}

/// Submits "other" as `author` and waits until the item is rejected by
/// banned-terms. The rule runs in both phases: inline when the host starts
/// the sync phase within its deadline, else (a loaded host stores the item
/// without its sync rules) by the workers.
async fn rejected(s: &TestServer, author: &str) {
    let (status, r) = s
        .submit_as(
            &s.client,
            &json!({"kind": "post", "author": author, "text": "other"}),
            None,
        )
        .await;
    assert_eq!(status, 202, "{r}");
    let item = s.settled(r["id"].as_str().unwrap()).await;
    assert_eq!(item["status"], "rejected", "{item:#}");
}

/// The account transitions the receiver got for `author`, by event id.
fn author_events(receiver: &Receiver, author: &str) -> Vec<gavel::store::Change> {
    receiver
        .accepted()
        .into_iter()
        .filter(|c| c.kind == "author" && c.author.as_deref() == Some(author))
        .collect()
}

/// The double penalty: a burst of rejections of one author's items, judged
/// by two servers and recomputed all the while by two more store handles
/// holding no lease at all (what a worker whose lease expired mid-way
/// is), ends in one chain with each tier crossed once, and each
/// transition delivered once.
async fn a_burst_of_rejections_moves_the_author_once(setup: Setup) {
    let receiver = Receiver::start(SECRET, 7).await;
    let a = server(setup, &receiver, |p| p.tiers = tiers(2.0, 4.0, 8.0)).await;
    let b = a.second().await;
    let policy = a.config.standing.clone();
    let stop = Arc::new(AtomicBool::new(false));
    let mut leaseless = tokio::task::JoinSet::new();
    for _ in 0..2 {
        let (store, policy, stop) = (a.open_store().await, policy.clone(), stop.clone());
        leaseless.spawn(async move {
            let mut moved = 0;
            while !stop.load(Ordering::Relaxed) {
                let r = store
                    .recompute_author("web", "spammer", &policy, "leaseless", gavel::clock::now_ms())
                    .await
                    .unwrap();
                moved += usize::from(r.is_some_and(|r| r.transitioned.is_some()));
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
            moved
        });
    }
    let burst = (0..20).map(|k| {
        let s = if k % 2 == 0 { &a } else { &b };
        spam(s, "spammer")
    });
    let ids = futures::future::join_all(burst).await;
    for id in &ids {
        let item = a.settled(id).await;
        assert_eq!(item["status"], "rejected", "{item:#}");
    }
    let settled = wait_author(&a, "spammer", "suspended", 20.0).await;
    stop.store(true, Ordering::Relaxed);
    let mut leaseless_moves = 0;
    while let Some(moved) = leaseless.join_next().await {
        leaseless_moves += moved.unwrap();
    }

    let transitions = settled["transitions"].as_array().unwrap().clone();
    let chain: Vec<&str> = transitions.iter().map(|t| t["to_status"].as_str().unwrap()).collect();
    eprintln!(
        "{setup:?}: good -> {} ({leaseless_moves} of them by the lease-less recomputations)",
        chain.join(" -> ")
    );
    assert_one_chain(&transitions, "good");
    // Up only, each tier reached once: never two transitions for one crossing.
    let ranks: Vec<usize> = transitions
        .iter()
        .map(|t| rank(&policy, t["to_status"].as_str().unwrap()))
        .collect();
    assert!(ranks.windows(2).all(|w| w[0] < w[1]), "{transitions:#?}");
    assert_eq!(settled["version"], json!(transitions.len()));
    assert!(
        transitions
            .iter()
            .all(|t| t["cause"] == "strikes" && t["actor"] == "rules")
    );
    // Each transition reaches the tier its own recorded strikes reach: no
    // transition was made from a score another recomputation had moved past.
    for t in &transitions {
        let at = policy.tier_for(t["strikes"].as_f64().unwrap()).name.as_str();
        assert_eq!(t["to_status"].as_str(), Some(at), "{transitions:#?}");
    }
    // 20 items, one strike each, counted from 20 decisions.
    assert_eq!(settled["decisions"].as_array().unwrap().len(), 20);
    assert_eq!(settled["counted"], json!(20));

    // Recomputing again, from either server's store, changes nothing.
    let again = a
        .open_store()
        .await
        .recompute_author("web", "spammer", &policy, "again", gavel::clock::now_ms())
        .await
        .unwrap()
        .unwrap();
    assert_eq!((again.transitioned, again.status.as_str()), (None, "suspended"));
    // Each crossing was made by exactly one recomputation: the moves every
    // recomputer reports (both servers' workers and the lease-less loops)
    // add up to the transitions stored. Two that both believed they moved
    // the author (a fence that let both through, a write reported but not
    // made) would count one crossing twice.
    let worker_moves: u64 = [&a, &b]
        .iter()
        .flat_map(|s| policy.tiers.iter().map(move |t| (s, t)))
        .map(|(s, t)| {
            s.metrics
                .author_transitions
                .get_or_create(&gavel::metrics::AuthorTransitionLabel { to: t.name.clone() })
                .get()
        })
        .sum();
    assert_eq!(
        worker_moves as usize + leaseless_moves,
        transitions.len(),
        "{transitions:#?}"
    );

    // Each account transition reaches the platform exactly once.
    let expected: HashSet<String> = (1..=transitions.len()).map(|v| format!("web:spammer:{v}")).collect();
    eventually("author events delivered", Duration::from_secs(20), async || {
        author_events(&receiver, "spammer").len() >= expected.len()
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let delivered = author_events(&receiver, "spammer");
    let ids_seen: HashSet<String> = delivered.iter().map(|c| c.event_id.clone()).collect();
    assert_eq!(ids_seen, expected);
    // What the platform got is what the audit rows say, state for state.
    for c in &delivered {
        let t = &transitions[c.item_version as usize - 1];
        assert_eq!(
            (c.from_status.as_str(), c.to_status.as_str()),
            (t["from_status"].as_str().unwrap(), t["to_status"].as_str().unwrap()),
            "{c:?}"
        );
    }
    let last = delivered.iter().max_by_key(|c| c.item_version).unwrap();
    assert_eq!(
        (last.to_status.as_str(), last.item_id.as_deref(), last.client.as_str()),
        ("suspended", None, "web")
    );
    // ... and is in the changes feed, once.
    let author_ids = |feed: &[Value]| -> Vec<String> {
        feed.iter()
            .filter(|c| c["kind"] == "author")
            .map(|c| c["event_id"].as_str().unwrap().to_string())
            .collect()
    };
    let feed = a
        .changes_showing(&a.client, |feed| author_ids(feed).len() >= expected.len())
        .await;
    let in_feed = author_ids(&feed);
    assert_eq!(in_feed.len(), expected.len(), "{in_feed:?}");
    assert_eq!(in_feed.into_iter().collect::<HashSet<_>>(), expected);

    // Suspended: a new submission is rejected at once, in the 202.
    let (status, r) = a
        .submit_as(
            &a.client,
            &json!({"kind": "post", "author": "spammer", "text": "hello"}),
            None,
        )
        .await;
    assert_eq!((status, r["status"].as_str()), (202, Some("rejected")), "{r}");
    let item = a
        .get_json(&format!("/v1/items/{}", r["id"].as_str().unwrap()), &a.moderator)
        .await;
    assert_eq!(item["transitions"][0]["cause"], "author_standing", "{item:#}");
    // Another author of the same client, and the same name under another client, are not touched.
    let (_, r) = a
        .submit_as(
            &a.client,
            &json!({"kind": "post", "author": "neighbour", "text": "hello"}),
            None,
        )
        .await;
    assert_eq!(r["status"], "pending_scan", "{r}");
    let (_, r) = a
        .submit_as(
            &a.client2,
            &json!({"kind": "post", "author": "spammer", "text": "hello"}),
            None,
        )
        .await;
    assert_eq!(r["status"], "pending_scan", "{r}");
    b.stop().await.unwrap();
}

/// Recomputed through the debounced queue: a burst of 20 rejections within
/// the author's debounce window is one recomputation and one transition,
/// straight to the tier the full count reaches.
async fn a_burst_is_counted_once_after_it_goes_quiet(setup: Setup) {
    let s = TestServer::start_with(setup, |c| {
        c.standing.enabled = true;
        c.standing.tiers = tiers(2.0, 4.0, 8.0);
        c.evaluation.kinds.insert(
            "author".into(),
            gavel::config::DebounceOverride {
                window_ms: Some(1_500),
                max_wait_ms: Some(10_000),
                ..Default::default()
            },
        );
    })
    .await;
    let burst = (0..20).map(|_| spam(&s, "burst"));
    futures::future::join_all(burst).await;
    let settled = wait_author(&s, "burst", "suspended", 20.0).await;
    let transitions = settled["transitions"].as_array().unwrap();
    assert_eq!(transitions.len(), 1, "{settled:#}");
    assert_eq!(
        (
            transitions[0]["from_status"].as_str(),
            transitions[0]["to_status"].as_str()
        ),
        (Some("good"), Some("suspended"))
    );
    assert_eq!(
        s.metrics.author_recomputations.get(),
        1,
        "one recomputation for the burst"
    );
}

/// A moderator's reversal removes its strike by itself: the author moves
/// down once when the score falls under a threshold.
async fn a_reversal_moves_the_author_down_once(setup: Setup) {
    let receiver = Receiver::start(SECRET, 8).await;
    let s = server(setup, &receiver, |p| p.tiers = tiers(2.0, 3.0, 10.0)).await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(spam(&s, "mallory").await);
    }
    let restricted = wait_author(&s, "mallory", "restricted", 3.0).await;
    // Restricted holds new content at once.
    let (_, r) = s
        .submit_as(
            &s.client,
            &json!({"kind": "post", "author": "mallory", "text": "hi"}),
            None,
        )
        .await;
    assert_eq!(r["status"], "held_for_review", "{r}");

    let reverse = async |id: &str| {
        let r = s
            .post(&format!("/v1/items/{id}/moderation"), &s.moderator)
            .json(&json!({"status": "visible", "reason": "not spam after all"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    };
    reverse(&ids[0]).await;
    let watch = wait_author(&s, "mallory", "watch", 2.0).await;
    let n = restricted["transitions"].as_array().unwrap().len();
    let down = &watch["transitions"].as_array().unwrap()[n..];
    assert_eq!(down.len(), 1, "{watch:#}");
    assert_eq!(
        (down[0]["from_status"].as_str(), down[0]["to_status"].as_str()),
        (Some("restricted"), Some("watch"))
    );
    // The reversed decision no longer counts.
    assert_eq!(watch["decisions"].as_array().unwrap().len(), 2);
    reverse(&ids[1]).await;
    let good = wait_author(&s, "mallory", "good", 1.0).await;
    assert_one_chain(good["transitions"].as_array().unwrap(), "good");
    assert_eq!(good["transitions"].as_array().unwrap().len(), n + 2, "{good:#}");
}

/// Strikes expire by the window moving: the author moves down once, with
/// nothing else happening.
async fn the_window_moving_moves_the_author_down(setup: Setup) {
    let receiver = Receiver::start(SECRET, 9).await;
    // The first tier named otherwise: new authors start there.
    let s = server(setup, &receiver, |p| {
        p.window_ms = 2_500;
        p.tiers = tiers(2.0, 5.0, 10.0);
        p.tiers[0].name = "clean".into();
    })
    .await;
    spam(&s, "eve").await;
    assert_eq!(author(&s, "eve").await["status"], "clean");
    spam(&s, "eve").await;
    let watch = wait_author(&s, "eve", "watch", 2.0).await;
    assert!(watch["next_expiry"].as_i64().is_some(), "{watch:#}");
    let good = wait_author(&s, "eve", "clean", 0.0).await;
    let transitions = good["transitions"].as_array().unwrap();
    assert_one_chain(transitions, "clean");
    let last = transitions.last().unwrap();
    assert_eq!(
        (last["from_status"].as_str(), last["to_status"].as_str()),
        (Some("watch"), Some("clean"))
    );
    assert_eq!(last["cause"], "strikes");
    assert_eq!(good["next_expiry"], Value::Null);
}

/// A moderator's state wins over automation until a moderator clears it;
/// `If-Match` guards it; the API refuses what it must.
async fn a_moderators_state_survives_recomputation(setup: Setup) {
    let receiver = Receiver::start(SECRET, 10).await;
    let s = server(setup, &receiver, |p| p.tiers = tiers(2.0, 4.0, 8.0)).await;
    let first = s.submit("trudy", "hello").await;
    let fresh = author(&s, "trudy").await;
    assert_eq!(
        (fresh["status"].as_str(), fresh["version"].as_i64()),
        (Some("good"), Some(0))
    );
    let moderate = async |body: Value, if_match: Option<i64>| {
        let mut req = s
            .post("/v1/authors/trudy/moderation?client=web", &s.moderator)
            .json(&body);
        if let Some(v) = if_match {
            req = req.header("If-Match", v.to_string());
        }
        let r = req.send().await.unwrap();
        (r.status().as_u16(), r.json::<Value>().await.unwrap())
    };
    let (status, body) = moderate(json!({"status": "restricted", "reason": "ring leader"}), Some(3)).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("version_mismatch")),
        "{body}"
    );
    let (status, body) = moderate(json!({"status": "banished", "reason": "x"}), None).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (422, Some("unknown_state")),
        "{body}"
    );
    let r = s
        .post("/v1/authors/trudy/moderation?client=web", &s.client)
        .json(&json!({"status": "good", "reason": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let r = s.get("/v1/authors/trudy", &s.moderator).send().await.unwrap();
    assert_eq!(r.status(), 422, "a moderator names the client");
    let r = s.get("/v1/authors/trudy?client=web", &s.client2).send().await.unwrap();
    assert_eq!(r.status(), 404, "another client's author is not found");
    // Account events are the outbox's `author` kind: no item takes it.
    let (status, body) = s
        .submit_as(
            &s.client,
            &json!({"kind": "author", "author": "trudy", "text": "hi"}),
            None,
        )
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (422, Some("reserved_kind")),
        "{body}"
    );
    let (status, set) = moderate(json!({"status": "restricted", "reason": "ring leader"}), Some(0)).await;
    assert_eq!(
        (status, set["status"].as_str(), set["manual"].as_bool()),
        (200, Some("restricted"), Some(true)),
        "{set}"
    );

    // Strikes that reach another tier leave the manual state alone.
    for _ in 0..2 {
        spam(&s, "trudy").await;
    }
    eventually("strikes recomputed", Duration::from_secs(20), async || {
        let a = author(&s, "trudy").await;
        let stored = s
            .open_store()
            .await
            .author(
                "web",
                "trudy",
                &s.config.standing,
                gavel::clock::now_ms(),
                gavel::store::AuthorPage::first(0),
            )
            .await
            .unwrap()
            .unwrap();
        a["strikes"] == json!(2.0) && stored.record.strikes == 2.0
    })
    .await;
    // Let every queued recomputation run: the state is still the moderator's.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let still = author(&s, "trudy").await;
    assert_eq!(
        (still["status"].as_str(), still["manual"].as_bool()),
        (Some("restricted"), Some(true)),
        "{still:#}"
    );
    assert_eq!(still["transitions"].as_array().unwrap().len(), 1, "{still:#}");

    // Cleared: automation sets the tier the strikes reach, at once.
    let (status, cleared) = moderate(json!({"status": null, "reason": "served their time"}), Some(1)).await;
    assert_eq!(status, 200, "{cleared}");
    assert_eq!(
        (cleared["status"].as_str(), cleared["manual"].as_bool()),
        (Some("watch"), Some(false)),
        "{cleared:#}"
    );
    let transitions = cleared["transitions"].as_array().unwrap();
    assert_one_chain(transitions, "good");
    assert_eq!(transitions.len(), 2);
    assert_eq!(transitions[1]["actor_name"], "mod");
    assert_eq!(transitions[1]["actor"], "moderator", "who cleared it");
    assert_eq!(cleared["decided_by"], "rules", "who decides from now on");
    assert_eq!(transitions[1]["cause"], "moderation");

    // The console's item page shows the author's account.
    let html = crate::console::page_html(&s, &format!("/console/items/{first}")).await;
    assert!(html.contains(r#"id="standing" data-status="watch""#), "{html}");
    assert!(html.contains("2 strikes"), "{html}");
}

/// Shadow decisions never count: a rule in shadow rejecting everything an
/// author posts leaves them in good standing, and once an enforced
/// rejection of theirs makes the workers recompute them, the recomputation
/// counts that one alone.
async fn shadow_decisions_never_count(setup: Setup) {
    let receiver = Receiver::start(SECRET, 11).await;
    let s = server(setup, &receiver, |p| p.tiers = tiers(1.0, 2.0, 3.0)).await;
    let sidecar = s.config.plugin_dir.join("banned-terms.toml");
    std::fs::write(
        &sidecar,
        "mode = \"shadow\"\n[config]\nterms = [\"scamcoin\"]\nverdict = \"reject\"\n",
    )
    .unwrap();
    eventually("banned-terms in shadow", Duration::from_secs(20), async || {
        let plugins = s.get_json("/v1/plugins", &s.moderator).await;
        plugins["plugins"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|p| p["name"] == "banned-terms" && p["mode"] == "shadow")
    })
    .await;
    let mut ids = Vec::new();
    for _ in 0..4 {
        ids.push(spam(&s, "shade").await);
    }
    for id in &ids {
        let item = s.settled(id).await;
        assert_eq!(item["status"], "visible", "{item:#}");
        assert!(
            item["decisions"]
                .as_array()
                .unwrap()
                .iter()
                .any(|d| d["mode"] == "shadow" && d["verdict"] == "reject"),
            "{item:#}"
        );
    }
    // An enforced rejection of another author is counted meanwhile, so the
    // recomputations ran.
    std::fs::write(
        &sidecar,
        "mode = \"enforce\"\n[config]\nterms = [\"other\"]\nverdict = \"reject\"\n",
    )
    .unwrap();
    eventually("banned-terms enforcing", Duration::from_secs(20), async || {
        let plugins = s.get_json("/v1/plugins", &s.moderator).await;
        plugins["plugins"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|p| p["name"] == "banned-terms" && p["mode"] == "enforce")
    })
    .await;
    rejected(&s, "probe").await;
    wait_author(&s, "probe", "watch", 1.0).await;
    let shade = author(&s, "shade").await;
    assert_eq!(
        (shade["status"].as_str(), shade["strikes"].as_f64()),
        (Some("good"), Some(0.0)),
        "{shade:#}"
    );
    assert_eq!(shade["transitions"], json!([]));
    // One enforced rejection of shade's own: the recomputation it queues
    // counts it, and not the four shadow ones (5 strikes: suspended).
    rejected(&s, "shade").await;
    let recomputed = wait_author(&s, "shade", "watch", 1.0).await;
    let transitions = recomputed["transitions"].as_array().unwrap();
    assert_eq!(transitions.len(), 1, "{recomputed:#}");
    assert_eq!(
        (transitions[0]["to_status"].as_str(), transitions[0]["strikes"].as_f64()),
        (Some("watch"), Some(1.0)),
        "{recomputed:#}"
    );
    assert_eq!(recomputed["counted"], json!(1));
}

/// Item 1 as a platform meets it: a moderator who holds a rejected item for
/// a second look and then rejects it agrees with the rule, so the strike
/// stays and the rule's decision is not counted as overturned.
async fn a_moderator_who_agrees_keeps_the_strike(setup: Setup) {
    let receiver = Receiver::start(SECRET, 12).await;
    let s = server(setup, &receiver, |p| p.tiers = tiers(2.0, 4.0, 8.0)).await;
    let id = spam(&s, "ann").await;
    assert_eq!(author(&s, "ann").await["strikes"], json!(1.0));
    let decide = async |status: &str| {
        let r = s
            .post(&format!("/v1/items/{id}/moderation"), &s.moderator)
            .json(&json!({"status": status, "reason": "second look"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
        r.json::<Value>().await.unwrap()
    };
    // Held: a hold overturns the rejection for now...
    let held = decide("held_for_review").await;
    assert!(!held["decisions"][0]["reversed_at"].is_null(), "{held:#}");
    assert_eq!(author(&s, "ann").await["strikes"], json!(0.0));
    // ...and rejecting it confirms the rule: the strike is back, and the
    // decision is no longer overturned (the reversal rate agrees).
    let rejected = decide("rejected").await;
    let actions: Vec<&Value> = rejected["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["verdict"] == "reject")
        .collect();
    assert!(!actions.is_empty(), "{rejected:#}");
    assert!(actions.iter().all(|d| d["reversed_at"].is_null()), "{rejected:#}");
    let ann = author(&s, "ann").await;
    assert_eq!(
        (ann["strikes"].as_f64(), ann["counted"].as_i64()),
        (Some(1.0), Some(1)),
        "{ann:#}"
    );
    let plugins = s.get_json("/v1/plugins", &s.moderator).await;
    let banned = plugins["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "banned-terms")
        .unwrap()
        .clone();
    assert_eq!(banned["figures"]["reversals"], json!(0), "{banned:#}");
}

/// Item 2: an author whose only strike was overturned has 0.0 strikes in
/// the API's JSON, never `-0.0` (a sum over nothing that starts at -0.0).
async fn zero_strikes_read_as_zero_not_minus_zero(setup: Setup) {
    let receiver = Receiver::start(SECRET, 13).await;
    let s = server(setup, &receiver, |_| {}).await;
    let id = spam(&s, "zed").await;
    let r = s
        .post(&format!("/v1/items/{id}/moderation"), &s.moderator)
        .json(&json!({"status": "visible", "reason": "fine"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    eventually(
        "the recomputation stored 0 strikes",
        Duration::from_secs(20),
        async || {
            let stored = s
                .open_store()
                .await
                .author("web", "zed", &s.config.standing, now_ms(), AuthorPage::first(0))
                .await
                .unwrap()
                .unwrap();
            stored.record.strikes == 0.0 && stored.record.recheck_at.is_none()
        },
    )
    .await;
    let text = s
        .get("/v1/authors/zed", &s.client)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(text.contains(r#""strikes":0.0"#), "{text}");
    assert!(!text.contains("-0"), "{text}");
}

/// Item 3: an author's decisions and transitions come in pages, each page
/// a bounded read, and following the cursors reads each entry once.
async fn an_authors_lists_come_in_pages(setup: Setup) {
    let receiver = Receiver::start(SECRET, 14).await;
    let s = server(setup, &receiver, |p| p.tiers = tiers(1.0, 2.0, 3.0)).await;
    // One tier at a time: three transitions.
    spam(&s, "pager").await;
    wait_author(&s, "pager", "watch", 1.0).await;
    spam(&s, "pager").await;
    wait_author(&s, "pager", "restricted", 2.0).await;
    for _ in 0..3 {
        spam(&s, "pager").await;
    }
    let full = wait_author(&s, "pager", "suspended", 5.0).await;
    assert_eq!(full["counted"], json!(5));
    let get = async |query: &str| {
        let r = s
            .get(&format!("/v1/authors/pager?{query}"), &s.client)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json::<Value>().await.unwrap())
    };
    let mut decisions = Vec::new();
    let mut after = 0;
    loop {
        let (status, page) = get(&format!("limit=2&decisions_after={after}")).await;
        assert_eq!(status, 200, "{page}");
        let ids = page["decisions"].as_array().unwrap();
        assert!(ids.len() <= 2, "{page}");
        decisions.extend(ids.iter().map(|d| d.as_i64().unwrap()));
        match page["next_decisions_after"].as_i64() {
            Some(next) => after = next,
            None => break,
        }
    }
    let all: Vec<i64> = full["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_i64().unwrap())
        .collect();
    assert_eq!(decisions, all);
    assert_eq!(decisions.len(), 5);
    let mut versions = Vec::new();
    let mut after = 0;
    loop {
        let (status, page) = get(&format!("limit=1&transitions_after={after}")).await;
        assert_eq!(status, 200, "{page}");
        let t = page["transitions"].as_array().unwrap();
        assert_eq!(t.len(), 1, "{page}");
        versions.push(t[0]["version"].as_i64().unwrap());
        match page["next_transitions_after"].as_i64() {
            Some(next) => after = next,
            None => break,
        }
    }
    assert_eq!(versions, vec![1, 2, 3]);
    for bad in ["limit=0", "limit=501", "decisions_after=-1", "transitions_after=x"] {
        let (status, body) = get(bad).await;
        assert_eq!(status, 400, "{bad}: {body}");
    }
}

/// The weights the store-level checks count with: exact binary fractions,
/// so every order of summing gives one score.
fn weighted() -> StandingPolicy {
    let mut p = StandingPolicy {
        enabled: true,
        ..Default::default()
    };
    p.weights = BTreeMap::from([(Verdict::Flag, 0.25), (Verdict::Hold, 0.5), (Verdict::Reject, 1.0)]);
    p.labels.insert("scam".into(), 3.0);
    p
}

/// An applied, enforced sync decision of `verdict`.
fn action(verdict: Verdict, labels_of: &[&str]) -> NewDecision {
    let labels = |l: &[&str]| l.iter().map(|l| l.to_string()).collect::<Vec<_>>();
    NewDecision {
        plugin: "rule".into(),
        plugin_version: "1.0.0".into(),
        plugin_digest: "cd".repeat(32),
        phase: Phase::Sync.into(),
        verdict: Some(verdict),
        score: 1.0,
        labels: labels(labels_of),
        reason: "r".into(),
        mode: Mode::Enforce,
        applied: true,
        duration_us: 1,
        outcome: Outcome::Ok,
        error: None,
        decided_at: now_ms(),
        inputs: None,
        weighs: weighted().weighs(Mode::Enforce, true, Outcome::Ok, Some(verdict), &labels(labels_of)),
        lists: Vec::new(),
    }
}

/// Stores an item of `author` judged by `actions` at submission, in the
/// status the most severe of them settles it in.
async fn item_with(store: &SharedStore, author: &str, actions: Vec<NewDecision>) -> String {
    let id = gavel_tests::server::uuid_ish();
    let write = ItemWrite {
        item: NewItem {
            id: id.clone(),
            client: "web".into(),
            external_id: None,
            kind: "post".into(),
            author: author.into(),
            body: "b".into(),
            context: "{}".into(),
            fingerprint: gavel::fingerprint::fingerprint(&id),
            correlation_id: "c".into(),
            now: now_ms(),
        },
        sync_verdict: Verdict::most_severe(actions.iter().filter_map(|d| d.verdict)),
        sync_reason: "rules".into(),
        decisions: actions,
        degraded: false,
        duplicates: DuplicateRule {
            window_ms: 1,
            hold_at: 1_000,
        },
        standing: Default::default(),
        key: None,
        respond: |_| String::new(),
    };
    match store.create_items(&[write]).await.unwrap().remove(0) {
        CreateOutcome::Created { item, .. } => item.id,
        other => panic!("{other:?}"),
    }
}

/// A moderator's decision, through the same function the API and the
/// console use (the store's tests take one too).
pub(crate) async fn moderate(store: &SharedStore, id: &str, to: ItemStatus) {
    let outcome = gavel::store::moderate(
        store.as_ref(),
        &Moderation {
            id,
            to,
            if_match: None,
            by: ManualActor::Moderator,
            name: "mod",
            note: None,
            reason: "r",
            correlation_id: "c",
            policy: None,
            until: None,
            appeal: None,
        },
    )
    .await
    .unwrap();
    assert!(matches!(outcome, ModerationOutcome::Applied { .. }), "{outcome:?}");
}

/// An author's strikes now, and how many of the item's decisions are overturned.
async fn standing_of(store: &SharedStore, author: &str, item: &str, policy: &StandingPolicy) -> (f64, usize) {
    let a = store
        .author("web", author, policy, now_ms(), AuthorPage::first(10))
        .await
        .unwrap()
        .unwrap();
    let details = store.item_details(item).await.unwrap().unwrap();
    let overturned = details.decisions.iter().filter(|d| d.reversed_at.is_some()).count();
    (a.strikes.score, overturned)
}

/// Item 1's property, on the store itself: any sequence of moderator
/// decisions that ends in one status leaves the same strikes and the same
/// overturned decisions as that last decision alone, and both are what the
/// last decision says of each automated verdict (visible overturns flag,
/// hold and reject; held_for_review overturns reject; rejected and deleted
/// confirm them all).
async fn moderator_paths_ending_in_one_status_count_the_same(setup: Setup) {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};
    let dir = tempfile::tempdir().unwrap();
    let store = setup.store(dir.path()).await;
    let policy = weighted();
    let verdicts = [Verdict::Flag, Verdict::Hold, Verdict::Reject];
    let statuses = [
        ItemStatus::Visible,
        ItemStatus::HeldForReview,
        ItemStatus::Rejected,
        ItemStatus::Deleted,
    ];
    let actions = prop::collection::vec((0..3usize, any::<bool>()), 1..4);
    let path = prop::collection::vec(0..3usize, 0..5);
    let last = 0..4usize;
    let handle = tokio::runtime::Handle::current();
    let cases = tokio::task::spawn_blocking(move || {
        let mut runner = TestRunner::new(Config {
            cases: 24,
            failure_persistence: None,
            ..Config::default()
        });
        let cases = std::sync::atomic::AtomicUsize::new(0);
        let result = runner.run(&(actions, path, last), |(actions, path, last)| {
            cases.fetch_add(1, Ordering::Relaxed);
            handle.block_on(async {
                let made: Vec<(Verdict, bool)> = actions.iter().map(|(v, scam)| (verdicts[*v], *scam)).collect();
                let decisions = || {
                    made.iter()
                        .map(|(v, scam)| action(*v, if *scam { &["scam"] } else { &[] }))
                        .collect()
                };
                let last = statuses[last];
                let case = gavel_tests::server::uuid_ish();
                let (walked, direct) = (format!("walked-{case}"), format!("direct-{case}"));
                let walked_item = item_with(&store, &walked, decisions()).await;
                let direct_item = item_with(&store, &direct, decisions()).await;
                for step in &path {
                    moderate(&store, &walked_item, statuses[*step]).await;
                }
                moderate(&store, &walked_item, last).await;
                moderate(&store, &direct_item, last).await;
                // The definition, written out: what the last decision overturns.
                let overturns = |v: Verdict| match last {
                    ItemStatus::Visible => true,
                    ItemStatus::HeldForReview => v == Verdict::Reject,
                    _ => false,
                };
                let expected_overturned = made.iter().filter(|(v, _)| overturns(*v)).count();
                let expected_strikes = made
                    .iter()
                    .filter(|(v, _)| !overturns(*v))
                    .map(|(v, scam)| if *scam { 3.0 } else { policy.weights[v] })
                    .fold(0.0, f64::max);
                let walked_standing = standing_of(&store, &walked, &walked_item, &policy).await;
                let direct_standing = standing_of(&store, &direct, &direct_item, &policy).await;
                prop_assert_eq!(walked_standing, direct_standing, "{:?} then {:?}", path, last);
                prop_assert_eq!(walked_standing, (expected_strikes, expected_overturned), "{:?}", made);
                Ok(())
            })
        });
        result.map(|_| cases.into_inner())
    })
    .await
    .unwrap();
    let cases = cases.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(cases, 24, "every generated case ran");
}

/// A label weighs more than its verdict, and a moderator who agrees with a
/// labelled hold (rejects the item) keeps its weight: `scam = 3.0` on a
/// `hold` that a moderator turns into `rejected` is 3 strikes, and the
/// rule's decision is not overturned.
async fn labels_weigh_more_than_their_verdict(setup: Setup) {
    let dir = tempfile::tempdir().unwrap();
    let store = setup.store(dir.path()).await;
    let policy = weighted();
    let scam = item_with(&store, "labelled", vec![action(Verdict::Hold, &["scam"])]).await;
    let plain = item_with(&store, "labelled", vec![action(Verdict::Hold, &[])]).await;
    assert_eq!(standing_of(&store, "labelled", &scam, &policy).await, (3.5, 0));
    moderate(&store, &scam, ItemStatus::Rejected).await;
    assert_eq!(standing_of(&store, "labelled", &scam, &policy).await, (3.5, 0));
    moderate(&store, &plain, ItemStatus::Visible).await;
    assert_eq!(standing_of(&store, "labelled", &plain, &policy).await, (3.0, 1));
    // Without the label's weight the hold weighs what its verdict does.
    let mut unlabelled = policy.clone();
    unlabelled.labels.clear();
    assert_eq!(standing_of(&store, "labelled", &scam, &unlabelled).await.0, 0.5);
}

/// Item 3: a verdict whose weight is 0 cannot change the score, so it
/// neither marks its author for recomputation in its transaction nor
/// queues one; a verdict that weighs does both.
async fn a_verdict_that_weighs_nothing_queues_no_recomputation(setup: Setup) {
    let receiver = Receiver::start(SECRET, 17).await;
    // Only rejections weigh: link-spam's hold of four links weighs 0.
    let s = server(setup, &receiver, |p| {
        p.weights = BTreeMap::from([(Verdict::Reject, 1.0)])
    })
    .await;
    let recomputations =
        async || crate::metrics::get(&crate::metrics::scrape(&s).await, "gavel_author_recomputations_total{}");
    let before = recomputations().await;
    let (status, r) = s
        .submit_as(
            &s.client,
            &json!({"kind": "post", "author": "quiet",
                    "text": "http://a.example http://b.example http://c.example http://d.example"}),
            None,
        )
        .await;
    assert_eq!(status, 202, "{r}");
    let id = r["id"].as_str().unwrap().to_string();
    let item = s.settled(&id).await;
    assert_eq!(item["status"], "held_for_review", "{item:#}");
    let stored = s
        .open_store()
        .await
        .author("web", "quiet", &s.config.standing, now_ms(), AuthorPage::first(0))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.record.recheck_at, None, "{:?}", stored.record);
    // Long enough for the reconciler to pick up a marked author.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(
        recomputations().await,
        before,
        "a weightless hold recomputed its author"
    );
    // A rejection weighs: its author is recomputed, once.
    spam(&s, "quiet").await;
    wait_author(&s, "quiet", "good", 1.0).await;
    eventually("one recomputation", Duration::from_secs(20), async || {
        recomputations().await == before + 1.0
    })
    .await;
    s.stop().await.unwrap();
}

gavel_tests::both!(
    a_verdict_that_weighs_nothing_queues_no_recomputation,
    a_burst_of_rejections_moves_the_author_once,
    a_burst_is_counted_once_after_it_goes_quiet,
    a_reversal_moves_the_author_down_once,
    the_window_moving_moves_the_author_down,
    a_moderators_state_survives_recomputation,
    shadow_decisions_never_count,
    a_moderator_who_agrees_keeps_the_strike,
    zero_strikes_read_as_zero_not_minus_zero,
    an_authors_lists_come_in_pages,
    moderator_paths_ending_in_one_status_count_the_same,
    labels_weigh_more_than_their_verdict,
);
