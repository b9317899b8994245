//! Policies, statements of reasons and appeals (`host/src/statements.rs`,
//! `host/src/store/appeals.rs`, `host/src/api/appeals.rs`): who decided, as
//! each statement says it; every statement passing the Transparency
//! Database's own rules (`gavel_tests::transparency`); the appeal window,
//! one open appeal per decision, retries, only a moderator closing an
//! appeal (the store refuses anyone else), an overturn undoing the strike
//! and counting against the plugin version once, and the export for the
//! database's batch endpoint.

use gavel::clock::now_ms;
use gavel::config::WebhookConfig;
use gavel::domain::policy::Cause;
use gavel::domain::statements::{DecisionGround, PolicyConfig, StatementsConfig};
use gavel::domain::{Actor, ItemStatus};
use gavel::store::{AppealClose, AppealStatus, Transition, TransitionRequest};
use gavel_tests::receiver::Receiver;
use gavel_tests::server::{Setup, TestServer};
use gavel_tests::transparency::{batch_errors, export_statements, statement_errors, with};
use serde_json::{Value, json};

const SECRET: &str = "webhook-secret-0123456789";

/// banned-terms rejects it at submission (sync phase), for anyone.
const SPAM: &str = "buy scamcoin now";

fn policies() -> Vec<PolicyConfig> {
    vec![
        PolicyConfig {
            id: "scams".into(),
            title: "Scams and fraud".into(),
            category: "STATEMENT_CATEGORY_SCAMS_AND_FRAUD".into(),
            decision_ground: DecisionGround::IncompatibleContent,
            ground: "Terms of service, section 4.2: no scams".into(),
            explanation: Some("Content that lures people into scams is not allowed.".into()),
            url: Some("https://example.com/terms#scams".into()),
            labels: vec!["banned-term".into()],
        },
        PolicyConfig {
            id: "hate".into(),
            title: "Illegal hate speech".into(),
            category: "STATEMENT_CATEGORY_ILLEGAL_OR_HARMFUL_SPEECH".into(),
            decision_ground: DecisionGround::IllegalContent,
            ground: "§130 StGB (Volksverhetzung)".into(),
            explanation: None,
            url: None,
            labels: vec![],
        },
    ]
}

async fn server(setup: Setup, standing: bool) -> TestServer {
    server_with(setup, standing, None).await
}

/// [`server`], delivering webhooks to `receiver` if one is given.
async fn server_with(setup: Setup, standing: bool, receiver: Option<&Receiver>) -> TestServer {
    let url = receiver.map(|r| r.url.clone());
    TestServer::start_with(setup, move |c| {
        if let Some(url) = url {
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
        }
        c.policies = policies();
        c.statements = StatementsConfig {
            territorial_scope: vec!["DE".into(), "AT".into()],
            trusted_flaggers: vec!["hotline".into()],
            ..StatementsConfig::default()
        };
        c.standing.enabled = standing;
    })
    .await
}

async fn statements(s: &TestServer, id: &str) -> Vec<Value> {
    let r = s.get_json(&format!("/v1/items/{id}/statements"), &s.client).await;
    let list = r.as_array().unwrap_or_else(|| panic!("{r:#}")).clone();
    for st in &list {
        let errors = statement_errors(&st["statement"]);
        assert!(errors.is_empty(), "{errors:?} in {st:#}");
    }
    list
}

async fn moderate(s: &TestServer, id: &str, body: Value) -> (u16, Value) {
    let r = s
        .post(&format!("/v1/items/{id}/moderation"), &s.moderator)
        .json(&body)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

async fn appeal(s: &TestServer, id: &str, body: Value, key: Option<&str>) -> (u16, Value) {
    let mut req = s.post(&format!("/v1/items/{id}/appeals"), &s.client).json(&body);
    if let Some(k) = key {
        req = req.header("Idempotency-Key", k);
    }
    let r = req.send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

async fn decide(s: &TestServer, token: &str, appeal: &str, body: Value) -> (u16, Value) {
    let r = s
        .post(&format!("/v1/appeals/{appeal}/decision"), token)
        .json(&body)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

/// A rule's rejection is fully automated and names the rule's version; a
/// moderator confirming it is partially automated; a moderator's own
/// decision is not automated. Each is stated under its policy, every
/// statement passes the database's rules, and each decision's webhook
/// event carries its statement.
async fn statements_say_who_decided(setup: Setup) {
    let receiver = Receiver::start(SECRET, 31).await;
    let s = server_with(setup, false, Some(&receiver)).await;
    let plugins = s.get_json("/v1/plugins", &s.moderator).await;
    let banned = plugins["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "banned-terms")
        .unwrap()
        .clone();
    let version = banned["version"].as_str().unwrap().to_string();

    let spam = s.submit("ann", SPAM).await;
    let item = s.settled(&spam).await;
    assert_eq!(item["status"], "rejected", "{item:#}");
    let list = statements(&s, &spam).await;
    assert_eq!(list.len(), 1, "one decision, one statement: {list:#?}");
    let rule = &list[0];
    let st = &rule["statement"];
    assert_eq!(st["automated_decision"], "AUTOMATED_DECISION_FULLY", "{rule:#}");
    assert_eq!(st["automated_detection"], "Yes");
    assert_eq!(st["source_type"], "SOURCE_VOLUNTARY");
    assert_eq!(
        st["category"], "STATEMENT_CATEGORY_SCAMS_AND_FRAUD",
        "banned-term maps to scams"
    );
    assert_eq!(st["decision_ground"], "DECISION_GROUND_INCOMPATIBLE_CONTENT");
    assert_eq!(st["territorial_scope"], json!(["DE", "AT"]));
    assert_eq!(
        st["decision_visibility"],
        json!(["DECISION_VISIBILITY_CONTENT_REMOVED"])
    );
    assert_eq!(st["puid"], format!("{spam}-{}", rule["item_version"]));
    let facts = st["decision_facts"].as_str().unwrap();
    assert!(facts.contains("banned-terms") && facts.contains(&version), "{facts}");
    assert_eq!(rule["policy"], "scams");
    assert_eq!(rule["rules"][0]["plugin"], "banned-terms");
    assert!(rule["appealable_until"].as_i64().unwrap() > now_ms() + 182 * 86_400_000);

    // A moderator confirms the rejection.
    let (status, body) = moderate(&s, &spam, json!({"status": "rejected", "reason": "confirmed scam"})).await;
    assert_eq!(status, 200, "{body:#}");
    let list = statements(&s, &spam).await;
    assert_eq!(list.len(), 2, "{list:#?}");
    assert_eq!(
        list[1]["statement"]["automated_decision"],
        "AUTOMATED_DECISION_PARTIALLY"
    );
    assert_eq!(list[1]["policy"], "scams", "the rule's labels still state the policy");
    assert_eq!(list[1]["actor"], "moderator");

    // A moderator's own decision on a clean, reported item, under the
    // illegal-content policy; the reporter is a trusted flagger.
    let clean = s.submit("bob", "a perfectly ordinary post").await;
    assert_eq!(s.settled(&clean).await["status"], "visible");
    assert_eq!(s.event(&clean, "report", "hotline").await, 202);
    let (status, body) = moderate(
        &s,
        &clean,
        json!({"status": "rejected", "reason": "incites hatred", "policy": "hate"}),
    )
    .await;
    assert_eq!(status, 200, "{body:#}");
    let list = statements(&s, &clean).await;
    assert_eq!(list.len(), 1, "{list:#?}");
    let st = &list[0]["statement"];
    assert_eq!(st["automated_decision"], "AUTOMATED_DECISION_NOT_AUTOMATED", "{st:#}");
    assert_eq!(st["automated_detection"], "No");
    assert_eq!(st["source_type"], "SOURCE_TRUSTED_FLAGGER");
    assert_eq!(st["decision_ground"], "DECISION_GROUND_ILLEGAL_CONTENT");
    assert_eq!(st["illegal_content_legal_ground"], "§130 StGB (Volksverhetzung)");
    assert!(st.get("incompatible_content_ground").is_none(), "{st:#}");
    assert_eq!(list[0]["policy"], "hate");

    // Each restrictive decision's webhook event carries its statement;
    // other events carry none.
    let want = [
        (spam.clone(), "AUTOMATED_DECISION_FULLY"),
        (spam.clone(), "AUTOMATED_DECISION_PARTIALLY"),
        (clean.clone(), "AUTOMATED_DECISION_NOT_AUTOMATED"),
    ];
    gavel_tests::server::eventually(
        "the statements delivered",
        std::time::Duration::from_secs(20),
        async || {
            let got = receiver.accepted();
            want.iter().all(|(item, automated)| {
                got.iter().any(|c| {
                    c.item_id.as_deref() == Some(item.as_str())
                        && c.statement
                            .as_ref()
                            .is_some_and(|st| serde_json::to_value(st.automated_decision).unwrap() == json!(automated))
                })
            })
        },
    )
    .await;
    for c in receiver.accepted() {
        let restrictive = ["rejected", "held_for_review", "deleted"].contains(&c.to_status.as_str());
        assert_eq!(c.statement.is_some(), restrictive && c.item_id.is_some(), "{c:?}");
        if let Some(st) = &c.statement {
            let list = statements(&s, c.item_id.as_deref().unwrap()).await;
            let same = list
                .iter()
                .find(|l| l["item_version"] == json!(c.item_version))
                .unwrap();
            assert_eq!(
                same["statement"],
                serde_json::to_value(st).unwrap(),
                "the event's statement is the API's"
            );
        }
    }

    // An unknown policy is refused, and nothing changes.
    let (status, body) = moderate(
        &s,
        &clean,
        json!({"status": "visible", "reason": "x", "policy": "nope"}),
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (422, Some("unknown_policy")),
        "{body:#}"
    );
    // The author's own deletion has no statement; another client sees none.
    let r = s
        .http
        .delete(format!("{}/v1/items/{clean}", s.url))
        .bearer_auth(&s.client)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        statements(&s, &clean).await.len(),
        1,
        "the author's deletion is no decision of the platform"
    );
    let r = s
        .get(&format!("/v1/items/{clean}/statements"), &s.client2)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    stop(s).await;
}

/// The validator is not a rubber stamp: each rule it restates refuses a
/// statement that breaks it.
async fn the_validator_refuses_what_the_database_refuses(setup: Setup) {
    let s = server(setup, false).await;
    let spam = s.submit("ann", SPAM).await;
    s.settled(&spam).await;
    let good = statements(&s, &spam).await[0]["statement"].clone();
    assert!(statement_errors(&good).is_empty());
    let broken = [
        with(&good, "decision_visibility", Value::Null),
        with(&good, "decision_visibility", json!(["DECISION_VISIBILITY_HIDDEN"])),
        with(&good, "category", json!("STATEMENT_CATEGORY_SPAM")),
        with(&good, "incompatible_content_ground", Value::Null),
        with(&good, "decision_ground", json!("DECISION_GROUND_ILLEGAL_CONTENT")),
        with(&good, "automated_decision", json!("Fully automated")),
        with(&good, "application_date", json!("2019-12-31")),
        with(&good, "content_date", json!("2025-13-01")),
        with(&good, "puid", json!("item 1")),
        with(&good, "decision_facts", json!("x".repeat(5001))),
        with(&good, "territorial_scope", json!(["US"])),
        with(&good, "source_type", Value::Null),
        with(&good, "content_type", json!("CONTENT_TYPE_TEXT")),
    ];
    for b in &broken {
        assert!(!statement_errors(b).is_empty(), "accepted {b:#}");
    }
    let twice = json!({"statements": [good.clone(), good.clone()]});
    assert!(!batch_errors(&twice).is_empty(), "one puid twice");
    assert!(!batch_errors(&json!({"statements": []})).is_empty());
    stop(s).await;
}

/// Opening appeals: retries with one key make one appeal; a second open
/// appeal on the decision is 409; a decision past its window is 422, as is
/// an item with nothing to appeal or a decision no longer in force.
async fn appeals_are_opened_once_within_their_window(setup: Setup) {
    let s = server(setup, false).await;
    let spam = s.submit("ann", SPAM).await;
    s.settled(&spam).await;
    let body = json!({"appellant": "author", "text": "It was a joke about a scam, not a scam."});
    let (first, a) = appeal(&s, &spam, body.clone(), Some("appeal-1")).await;
    assert_eq!(first, 201, "{a:#}");
    let (again, b) = appeal(&s, &spam, body.clone(), Some("appeal-1")).await;
    assert_eq!(
        (again, &b["id"]),
        (201, &a["id"]),
        "a retry answers the same appeal: {b:#}"
    );
    let (second, c) = appeal(&s, &spam, body.clone(), Some("appeal-2")).await;
    assert_eq!(
        (second, c["error"]["code"].as_str()),
        (409, Some("appeal_open")),
        "{c:#}"
    );
    let listed = s.get_json(&format!("/v1/items/{spam}/appeals"), &s.client).await;
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed:#}");
    assert_eq!(listed[0]["status"], "open");
    assert_eq!(listed[0]["plugin"], "banned-terms");
    assert_eq!(listed[0]["policy"], "scams");
    // Another client cannot appeal (or see) the item.
    let r = s
        .post(&format!("/v1/items/{spam}/appeals"), &s.client2)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);

    // Nothing to appeal on a visible item.
    let clean = s.submit("bob", "hello there").await;
    s.settled(&clean).await;
    let (status, r) = appeal(&s, &clean, body.clone(), None).await;
    assert_eq!(
        (status, r["error"]["code"].as_str()),
        (422, Some("no_decision")),
        "{r:#}"
    );

    // A moderator's rejection of 200 days ago: past the 183-day window.
    let store = s.open_store().await;
    let item = store.item(&clean).await.unwrap().unwrap();
    let old = TransitionRequest {
        item_id: clean.clone(),
        expected_version: item.version,
        from: item.status,
        to: ItemStatus::Rejected,
        actor: Actor::Moderator,
        actor_name: Some("mod".into()),
        actor_note: None,
        cause: Cause::Moderation,
        reason: "spam".into(),
        correlation_id: "old".into(),
        now: now_ms() - 200 * 86_400_000,
        policy: Some("scams".into()),
        until: None,
        appeal: None,
    };
    assert!(matches!(
        store.transition(&old).await.unwrap(),
        Transition::Applied { .. }
    ));
    let (status, r) = appeal(&s, &clean, body.clone(), None).await;
    assert_eq!(
        (status, r["error"]["code"].as_str()),
        (422, Some("appeal_window_closed")),
        "{r:#}"
    );
    let st = statements(&s, &clean).await;
    assert_eq!(st.len(), 1);
    assert_eq!(
        st[0]["statement"]["automated_decision"],
        "AUTOMATED_DECISION_NOT_AUTOMATED"
    );

    // A decision no longer in force: the spam item's first statement after a
    // moderator confirmed it (version moved on).
    let (status, _) = moderate(&s, &spam, json!({"status": "rejected", "reason": "still spam"})).await;
    assert_eq!(status, 200);
    let first_version = a["decision_version"].as_i64().unwrap();
    let (status, r) = appeal(
        &s,
        &spam,
        json!({"appellant": "author", "text": "again", "item_version": first_version}),
        None,
    )
    .await;
    assert_eq!(
        (status, r["error"]["code"].as_str()),
        (422, Some("decision_superseded")),
        "{r:#}"
    );
    // The first request's retry is still answered as it was.
    let (again, b) = appeal(&s, &spam, body.clone(), Some("appeal-1")).await;
    assert_eq!(
        (again, &b["id"]),
        (201, &a["id"]),
        "a replay after the decision moved on: {b:#}"
    );
    stop(s).await;
}

/// Only a moderator closes an appeal: a client token is refused by the API,
/// and the store itself refuses an automated closing (the CHECK on
/// `closed_by_actor`), leaving item and appeal as they were.
async fn only_a_moderator_closes_an_appeal(setup: Setup) {
    let s = server(setup, false).await;
    let spam = s.submit("ann", SPAM).await;
    s.settled(&spam).await;
    let (status, a) = appeal(&s, &spam, json!({"appellant": "author", "text": "please"}), None).await;
    assert_eq!(status, 201, "{a:#}");
    let id = a["id"].as_str().unwrap().to_string();
    let (status, _) = decide(&s, &s.client, &id, json!({"outcome": "overturn", "reason": "ok"})).await;
    assert_eq!(status, 403);

    let store = s.open_store().await;
    let item = store.item(&spam).await.unwrap().unwrap();
    let automated = TransitionRequest {
        item_id: spam.clone(),
        expected_version: item.version,
        from: item.status,
        to: ItemStatus::Visible,
        actor: Actor::Rules,
        actor_name: None,
        actor_note: None,
        cause: Cause::Evaluation,
        reason: "the rules changed their mind".into(),
        correlation_id: "eval".into(),
        now: now_ms(),
        policy: None,
        until: None,
        appeal: Some(AppealClose {
            id: id.clone(),
            status: AppealStatus::Overturned,
        }),
    };
    assert!(
        store.transition(&automated).await.is_err(),
        "the store refuses an automated closing"
    );
    assert_eq!(
        store.item(&spam).await.unwrap().unwrap().version,
        item.version,
        "nothing written"
    );
    assert_eq!(store.appeal(&id).await.unwrap().unwrap().status, AppealStatus::Open);
    stop(s).await;
}

/// An overturned appeal reverses the decision: the item visible, the strike
/// gone, the reversal counted against the plugin version exactly once (a
/// second decision on the closed appeal is 409 and counts nothing), the
/// outcome on the changes feed with cause `appeal`. An upheld one confirms
/// the decision, stated as partially automated.
async fn appeal_outcomes_reach_the_item_the_author_and_the_plugin(setup: Setup) {
    let s = server(setup, true).await;
    let spam = s.submit("ann", SPAM).await;
    s.settled(&spam).await;
    gavel_tests::server::eventually("the strike", std::time::Duration::from_secs(20), async || {
        strikes(&s, "ann").await == Some(1.0)
    })
    .await;
    let (_, a) = appeal(&s, &spam, json!({"appellant": "author", "text": "not spam"}), None).await;
    let id = a["id"].as_str().unwrap().to_string();
    let queue = s.get_json("/v1/appeals", &s.moderator).await;
    assert!(
        queue["appeals"]
            .as_array()
            .unwrap()
            .iter()
            .any(|q| q["id"] == id.as_str()),
        "{queue:#}"
    );

    let (status, closed) = decide(
        &s,
        &s.moderator,
        &id,
        json!({"outcome": "overturn", "reason": "satire"}),
    )
    .await;
    assert_eq!(status, 200, "{closed:#}");
    assert_eq!(closed["status"], "overturned");
    assert_eq!(closed["closed_by"], "mod");
    let item = s.get_json(&format!("/v1/items/{spam}"), &s.moderator).await;
    assert_eq!(item["status"], "visible");
    assert_eq!(closed["outcome_version"], item["version"]);
    let last = item["transitions"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(
        (last["cause"].as_str(), last["actor"].as_str()),
        (Some("appeal"), Some("moderator"))
    );
    gavel_tests::server::eventually("the strike undone", std::time::Duration::from_secs(20), async || {
        strikes(&s, "ann").await == Some(0.0)
    })
    .await;
    assert_eq!(reversals(&s).await, json!(1));
    let (status, again) = decide(&s, &s.moderator, &id, json!({"outcome": "overturn", "reason": "twice"})).await;
    assert_eq!(
        (status, again["error"]["code"].as_str()),
        (409, Some("appeal_closed")),
        "{again:#}"
    );
    let (status, _) = decide(
        &s,
        &s.moderator,
        &id,
        json!({"outcome": "uphold", "reason": "changed my mind"}),
    )
    .await;
    assert_eq!(status, 409);
    assert_eq!(reversals(&s).await, json!(1), "counted once");
    let by_appeal = |c: &&Value| c["item_id"] == spam.as_str() && c["cause"] == "appeal";
    let changes = s
        .changes_showing(&s.client, |changes| changes.iter().any(|c| by_appeal(&c)))
        .await;
    let appeal_events: Vec<&Value> = changes.iter().filter(by_appeal).collect();
    assert_eq!(appeal_events.len(), 1, "{changes:#?}");
    assert_eq!(appeal_events[0]["to_status"], "visible");
    assert_eq!(appeal_events[0]["reason"], "satire");

    // Upheld: the rejection stands, confirmed by a moderator.
    let other = s.submit("cat", SPAM).await;
    s.settled(&other).await;
    let (_, a) = appeal(&s, &other, json!({"appellant": "author", "text": "please"}), None).await;
    let id = a["id"].as_str().unwrap().to_string();
    let (status, closed) = decide(
        &s,
        &s.moderator,
        &id,
        json!({"outcome": "uphold", "reason": "it is a scam"}),
    )
    .await;
    assert_eq!((status, closed["status"].as_str()), (200, Some("upheld")), "{closed:#}");
    let list = statements(&s, &other).await;
    let last = list.last().unwrap();
    assert_eq!(
        last["statement"]["automated_decision"], "AUTOMATED_DECISION_PARTIALLY",
        "{last:#}"
    );
    assert_eq!(last["item_version"], closed["outcome_version"]);
    assert_eq!(reversals(&s).await, json!(1), "upholding reverses nothing");

    let figures = s.get_json("/v1/appeals/figures", &s.moderator).await;
    let banned: Vec<&Value> = figures
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["plugin"] == "banned-terms" && f["policy"] == "scams")
        .collect();
    assert_eq!(banned.len(), 1, "{figures:#}");
    assert_eq!(
        (banned[0]["upheld"].as_i64(), banned[0]["overturned"].as_i64()),
        (Some(1), Some(1))
    );
    assert_eq!(banned[0]["overturn_rate"], json!(0.5));
    let metrics = crate::metrics::metrics_text(&s).await;
    assert!(
        metrics.contains("gavel_appeals_closed_total{policy=\"scams\",plugin=\"banned-terms\""),
        "{metrics}"
    );
    stop(s).await;
}

/// `gavel export statements`: NDJSON bodies of at most 100 statements for
/// the database's batch endpoint, every one valid, every decision once,
/// continued from the cursor without repeats.
async fn statements_export_in_batches_of_a_hundred(setup: Setup) {
    let s = server(setup, false).await;
    let mut ids = Vec::new();
    for i in 0..130 {
        ids.push(s.submit(&format!("spammer{i}"), SPAM).await);
    }
    for id in &ids {
        s.settled(id).await;
    }
    let (bodies, cursor) = export_statements(&s.config.database_url(), None).unwrap();
    let mut puids = std::collections::BTreeSet::new();
    let mut lines = 0;
    for body in &bodies {
        let errors = batch_errors(body);
        assert!(errors.is_empty(), "{errors:?}");
        for st in body["statements"].as_array().unwrap() {
            assert!(
                puids.insert(st["puid"].as_str().unwrap().to_string()),
                "a statement twice"
            );
        }
        lines += 1;
    }
    assert_eq!(lines, 2, "130 statements: 100 and 30");
    for id in &ids {
        assert!(
            puids.iter().any(|p| p.starts_with(id.as_str())),
            "no statement for {id}"
        );
    }
    // One more decision; the export continued from the cursor has it alone.
    let (status, _) = moderate(&s, &ids[0], json!({"status": "rejected", "reason": "confirmed"})).await;
    assert_eq!(status, 200);
    let (more, _) = export_statements(&s.config.database_url(), Some(&cursor)).unwrap();
    let body = &more[0];
    assert_eq!(body["statements"].as_array().unwrap().len(), 1, "{body:#}");
    assert_eq!(
        body["statements"][0]["automated_decision"],
        "AUTOMATED_DECISION_PARTIALLY"
    );
    stop(s).await;
}

/// A moderator's restriction of an item and suspension of an account, each
/// `until` a time: the statement gives the end date; the server is stopped
/// before that time and started again after it, beside a second server on
/// the same store; each restriction is lifted exactly once (one audited
/// transition, one event on the changes feed), the item visible again and
/// the account handed back to automation. Account decisions have their
/// statements: the moderator's suspension, the rules' restriction.
async fn timed_restrictions_end_once_at_their_time_across_a_restart(setup: Setup) {
    let s = server(setup, true).await;
    let item = s.submit("bob", "a post that is fine after all").await;
    assert_eq!(s.settled(&item).await["status"], "visible");
    let until = now_ms() + 2_500;
    // Refused: an end in the past, an end on a decision that restricts nothing.
    let (status, r) = moderate(
        &s,
        &item,
        json!({"status": "rejected", "reason": "x", "until": now_ms() - 1}),
    )
    .await;
    assert_eq!(
        (status, r["error"]["code"].as_str()),
        (422, Some("invalid_until")),
        "{r:#}"
    );
    let (status, r) = moderate(&s, &item, json!({"status": "visible", "reason": "x", "until": until})).await;
    assert_eq!(
        (status, r["error"]["code"].as_str()),
        (422, Some("invalid_until")),
        "{r:#}"
    );

    let (status, r) = moderate(
        &s,
        &item,
        json!({"status": "rejected", "reason": "cooling off", "policy": "scams", "until": until}),
    )
    .await;
    assert_eq!(status, 200, "{r:#}");
    let list = statements(&s, &item).await;
    assert_eq!(
        list[0]["statement"]["end_date_visibility_restriction"],
        gavel::domain::statements::date(until),
        "{list:#?}"
    );
    let r = s
        .post("/v1/authors/bob/moderation", &s.moderator)
        .query(&[("client", "web")])
        .json(&json!({"status": "suspended", "reason": "a week off", "until": until}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let bob = s.get_json("/v1/authors/bob", &s.client).await;
    assert_eq!(
        (bob["status"].as_str(), bob["manual"].as_bool()),
        (Some("suspended"), Some(true))
    );
    assert_eq!(bob["until"], json!(until));

    let account = s.get_json("/v1/authors/bob/statements", &s.client).await;
    assert_eq!(account.as_array().map(Vec::len), Some(1), "{account:#}");
    let st = &account[0]["statement"];
    assert!(statement_errors(st).is_empty(), "{:?}", statement_errors(st));
    assert_eq!(st["decision_account"], "DECISION_ACCOUNT_SUSPENDED");
    assert_eq!(
        st["automated_decision"], "AUTOMATED_DECISION_NOT_AUTOMATED",
        "no strikes behind it"
    );
    assert_eq!(
        st["end_date_account_restriction"],
        gavel::domain::statements::date(until)
    );
    assert!(st["puid"].as_str().unwrap().starts_with("acct-"));

    // Stopped before the end, started again after it, with a second server.
    let (config, dir) = s.stop_keeping_dir().await;
    tokio::time::sleep(std::time::Duration::from_millis((until - now_ms()).max(0) as u64 + 200)).await;
    let s = TestServer::serve(dir, setup, config, |_| {}).await;
    let t = s.second().await;
    let lifted = s.wait_for(&item, |i| i["status"] == "visible").await;
    let ended: Vec<&Value> = lifted["transitions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["cause"] == "restriction_ended")
        .collect();
    assert_eq!(ended.len(), 1, "{lifted:#}");
    assert_eq!(
        (ended[0]["actor"].as_str(), ended[0]["from_status"].as_str()),
        (Some("system"), Some("rejected"))
    );
    gavel_tests::server::eventually("the suspension ended", std::time::Duration::from_secs(20), async || {
        s.get_json("/v1/authors/bob", &s.client).await["manual"] == json!(false)
    })
    .await;
    // Both servers have passed over both ends more than once by now.
    tokio::time::sleep(std::time::Duration::from_millis(1_000)).await;
    let bob = s.get_json("/v1/authors/bob", &s.client).await;
    assert_eq!(
        (bob["status"].as_str(), bob["until"].as_i64()),
        (Some("good"), None),
        "{bob:#}"
    );
    let expiries: Vec<&Value> = bob["transitions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["cause"] == "expiry")
        .collect();
    assert_eq!(expiries.len(), 1, "{bob:#}");
    assert_eq!(expiries[0]["actor"], "rules");
    let events = |changes: &[Value], cause: &str| changes.iter().filter(|c| c["cause"] == cause).count();
    let changes = s
        .changes_showing(&s.moderator, |c| {
            events(c, "restriction_ended") > 0 && events(c, "expiry") > 0
        })
        .await;
    assert_eq!(
        (events(&changes, "restriction_ended"), events(&changes, "expiry")),
        (1, 1),
        "{changes:#?}"
    );
    assert_eq!(
        s.get_json(&format!("/v1/items/{item}"), &s.moderator).await["transitions"],
        lifted["transitions"]
    );
    // The transitions export names the policy and the end.
    let exported = s
        .get("/v1/exports/transitions", &s.moderator)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let row = exported
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|r| r["item_id"] == item.as_str() && r["to_status"] == "rejected")
        .unwrap_or_else(|| panic!("{exported}"));
    assert_eq!(
        (row["policy"].as_str(), row["ends_at_ms"].as_i64()),
        (Some("scams"), Some(until)),
        "{row}"
    );
    // The end of the suspension is no new restriction: still one statement.
    let account = s.get_json("/v1/authors/bob/statements", &s.client).await;
    assert_eq!(account.as_array().map(Vec::len), Some(1), "{account:#}");

    // Four rejections restrict carl (the default tiers: restricted at 4
    // strikes): an account decision of the rules alone.
    for n in 0..4 {
        let id = s.submit("carl", &format!("{SPAM} {n}")).await;
        s.settled(&id).await;
    }
    gavel_tests::server::eventually("carl restricted", std::time::Duration::from_secs(20), async || {
        s.get_json("/v1/authors/carl", &s.client).await["status"] == "restricted"
    })
    .await;
    let account = s.get_json("/v1/authors/carl/statements", &s.client).await;
    assert_eq!(
        account.as_array().map(Vec::len),
        Some(1),
        "only the restriction: {account:#}"
    );
    let st = &account[0]["statement"];
    assert!(statement_errors(st).is_empty(), "{:?}", statement_errors(st));
    assert_eq!(
        (
            st["decision_provision"].as_str(),
            st["automated_decision"].as_str(),
            st["automated_detection"].as_str()
        ),
        (
            Some("DECISION_PROVISION_PARTIAL_SUSPENSION"),
            Some("AUTOMATED_DECISION_FULLY"),
            Some("Yes")
        )
    );
    // The export holds the account decisions after the items', every body valid.
    let (bodies, _) = export_statements(&s.config.database_url(), None).unwrap();
    let mut accounts = 0;
    for body in &bodies {
        assert!(batch_errors(body).is_empty(), "{:?}", batch_errors(body));
        for st in body["statements"].as_array().unwrap() {
            accounts += usize::from(st["puid"].as_str().unwrap().starts_with("acct-"));
        }
    }
    assert_eq!(accounts, 2, "bob's suspension and carl's restriction");
    t.stop().await.unwrap();
    stop(s).await;
}

/// The author's strikes as the API derives them now.
async fn strikes(s: &TestServer, author: &str) -> Option<f64> {
    s.get_json(&format!("/v1/authors/{author}"), &s.client).await["strikes"].as_f64()
}

/// banned-terms' reversal count (`GET /v1/plugins`).
async fn reversals(s: &TestServer) -> Value {
    let plugins = s.get_json("/v1/plugins", &s.moderator).await;
    plugins["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "banned-terms")
        .unwrap()["figures"]["reversals"]
        .clone()
}

async fn stop(s: TestServer) {
    s.stop().await.unwrap();
}

gavel_tests::both!(
    statements_say_who_decided,
    the_validator_refuses_what_the_database_refuses,
    appeals_are_opened_once_within_their_window,
    only_a_moderator_closes_an_appeal,
    appeal_outcomes_reach_the_item_the_author_and_the_plugin,
    statements_export_in_batches_of_a_hundred,
    timed_restrictions_end_once_at_their_time_across_a_restart,
);
