//! The HTTP API against the real server on port 0, on both setups
//! (docs/RELIABILITY.md I1-I4, H1, H2, H4-H6, the batch endpoints and the
//! end-to-end flow).

use gavel_tests::server::{Setup, TestServer};
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Submit, evaluate, read: every decision is stamped with plugin name,
/// version and digest; the audit trail shows each transition.
async fn submitted_items_settle_with_stamped_decisions(setup: Setup) {
    let s = TestServer::start(setup).await;
    let r = s
        .post("/v1/items", &s.client)
        .json(&json!({"kind": "post", "author": "alice", "text": "see http://a.example http://b.example http://c.example http://d.example"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    assert!(r.headers().contains_key("x-request-id"));
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["status"], "pending_scan");
    assert_eq!(body["version"], 1);
    let id = body["id"].as_str().unwrap();
    let item = s.wait_for(id, |i| i["status"] != "pending_scan").await;
    assert_eq!(item["status"], "held_for_review");
    assert_eq!(item["version"], 2);
    let all = item["decisions"].as_array().unwrap();
    let decisions: Vec<&Value> = all.iter().filter(|d| d["phase"] == "async").collect();
    assert_eq!(decisions.len(), 4, "one per async plugin: {all:#?}");
    assert_eq!(all.len(), 5, "and one sync-phase decision (banned-terms): {all:#?}");
    let link_spam = decisions.iter().find(|d| d["plugin"] == "link-spam").unwrap();
    assert_eq!(link_spam["verdict"], "hold");
    assert_eq!(link_spam["plugin_version"], "1.2.1");
    let digest = gavel::domain::Digest::of(&std::fs::read(gavel_tests::guests::LINK_SPAM).unwrap()).to_hex();
    assert_eq!(link_spam["plugin_digest"], digest);
    assert_eq!(link_spam["applied"], true);
    let trail: Vec<(&str, &str)> = item["transitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["from_status"].as_str().unwrap(), t["to_status"].as_str().unwrap()))
        .collect();
    assert_eq!(
        trail,
        vec![("received", "pending_scan"), ("pending_scan", "held_for_review")]
    );

    // A sync-phase rule (banned-terms) rejects inline: the reply is already final.
    let r: Value = s
        .post("/v1/items", &s.client)
        .json(&json!({"kind": "post", "author": "bob", "text": "Buy SCAMCOIN today"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r["status"], "rejected");

    // Events: enough flags against few upvotes hold a visible post.
    let r: Value = s
        .post("/v1/items", &s.client)
        .json(&json!({"kind": "comment", "author": "carol", "text": "a perfectly nice comment"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = r["id"].as_str().unwrap().to_string();
    s.wait_for(&id, |i| i["status"] == "visible").await;
    for n in 0..6 {
        let r = s
            .post(&format!("/v1/items/{id}/events"), &s.client)
            .json(&json!({"kind": "flag", "actor": format!("user-{n}")}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::ACCEPTED);
    }
    let item = s
        .wait_for(&id, |i| {
            i["status"] == "held_for_review" && i["needs_eval_since"].is_null()
        })
        .await;
    assert_eq!(item["counters"]["flag"], 6);

    // A moderator overrides; automation never overturns it.
    let r = s
        .post(&format!("/v1/items/{id}/moderation"), &s.moderator)
        .header("If-Match", item["version"].to_string())
        .json(&json!({"status": "visible", "reason": "satire, not abuse"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let moderated: Value = r.json().await.unwrap();
    assert_eq!(moderated["decided_by"], "moderator");
    let stale = s
        .post(&format!("/v1/items/{id}/moderation"), &s.moderator)
        .header("If-Match", item["version"].to_string())
        .json(&json!({"status": "rejected", "reason": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(stale.status(), StatusCode::CONFLICT);
    for n in 6..12 {
        s.post(&format!("/v1/items/{id}/events"), &s.client)
            .json(&json!({"kind": "flag", "actor": format!("user-{n}")}))
            .send()
            .await
            .unwrap();
    }
    let item = s
        .wait_for(&id, |i| i["needs_eval_since"].is_null() && i["counters"]["flag"] == 12)
        .await;
    assert_eq!(item["status"], "visible", "the manual decision stands");
    let unapplied = item["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["applied"] == false)
        .count();
    assert!(unapplied >= 1, "later evaluations are recorded, not applied");

    // The review queue lists the first (held) item.
    let q: Value = s
        .get("/v1/review-queue?limit=10", &s.moderator)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(q["items"].as_array().unwrap().iter().any(|i| i["author"] == "alice"));
    s.stop().await.unwrap();
}

/// The same normalised text from one author `duplicate_hold_at` times in
/// the window is held at submission (not rejected); other authors are not.
async fn duplicate_text_from_one_author_is_held(setup: Setup) {
    let s = TestServer::start(setup).await;
    let hold_at = s.config.ingest.duplicate_hold_at as usize;
    let variants = [
        "Buy cheap pills NOW",
        "buy cheap pills now!",
        "BUY  cheap pills, now.",
        "buy cheap pills now",
        "Buy cheap pills now!!",
        "buy, cheap, pills now",
    ];
    let mut statuses = Vec::new();
    for text in variants.iter().take(hold_at) {
        let r: Value = s
            .post("/v1/items", &s.client)
            .json(&json!({"kind": "post", "author": "copypaste", "text": text}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        statuses.push(r["status"].as_str().unwrap().to_string());
    }
    assert!(
        statuses[..hold_at - 1].iter().all(|st| st == "pending_scan"),
        "{statuses:?}"
    );
    assert_eq!(statuses[hold_at - 1], "held_for_review", "{statuses:?}");
    let other: Value = s
        .post("/v1/items", &s.client)
        .json(&json!({"kind": "post", "author": "someone-else", "text": "buy cheap pills now"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(other["status"], "pending_scan");
    s.stop().await.unwrap();
}

/// I1: 50 concurrent POSTs with one key and body, 100 rounds: one item per
/// round; every reply is the original 202 (identical body) or 409.
async fn concurrent_retries_with_one_key_create_one_item(setup: Setup) {
    let s = TestServer::start(setup).await;
    for round in 0..100 {
        let key = format!("round-{round}");
        let body = json!({"kind": "post", "author": format!("author-{round}"), "text": format!("hello {round}")});
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..50 {
            let req = s
                .post("/v1/items", &s.client)
                .header("Idempotency-Key", &key)
                .json(&body);
            tasks.spawn(async move {
                let r = req.send().await.unwrap();
                (r.status(), r.text().await.unwrap())
            });
        }
        let replies = tasks.join_all().await;
        let accepted: Vec<&String> = replies
            .iter()
            .filter(|(st, _)| *st == StatusCode::ACCEPTED)
            .map(|(_, b)| b)
            .collect();
        assert!(!accepted.is_empty(), "round {round}: {replies:?}");
        assert!(
            accepted.iter().all(|b| *b == accepted[0]),
            "replays differ: {accepted:?}"
        );
        assert!(
            replies
                .iter()
                .all(|(st, _)| *st == StatusCode::ACCEPTED || *st == StatusCode::CONFLICT),
            "round {round}: {replies:?}"
        );
        // After the dust settles the key replays the original body.
        let again = s
            .post("/v1/items", &s.client)
            .header("Idempotency-Key", &key)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(again.status(), StatusCode::ACCEPTED);
        assert_eq!(&again.text().await.unwrap(), accepted[0]);
    }
    // Exactly one item per round: every round's author has one item.
    let store = s.open_store().await;
    for round in 0..100 {
        let items = store.author_items("web", &format!("author-{round}"), 10).await.unwrap();
        assert_eq!(items.len(), 1, "round {round}: {items:?}");
    }
    s.stop().await.unwrap();
}

/// I2, I3, I4: key reuse with another body, malformed keys, keys per client.
async fn idempotency_key_rules(setup: Setup) {
    let s = TestServer::start(setup).await;
    let body = json!({"kind": "post", "author": "dan", "text": "original"});
    let first = s
        .post("/v1/items", &s.client)
        .header("Idempotency-Key", "k")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), StatusCode::ACCEPTED);
    let first: Value = first.json().await.unwrap();
    let other = s
        .post("/v1/items", &s.client)
        .header("Idempotency-Key", "k")
        .json(&json!({"kind": "post", "author": "dan", "text": "changed"}))
        .send()
        .await
        .unwrap();
    assert_eq!(other.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let err: Value = other.json().await.unwrap();
    assert_eq!(err["error"]["code"], "idempotency_key_reused");
    let stored: Value = s
        .get(&format!("/v1/items/{}", first["id"].as_str().unwrap()), &s.client)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(stored["text"], "original", "the stored item is unchanged");

    for bad in [String::new(), "x".repeat(256), "tab\tkey".to_string()] {
        let r = s
            .post("/v1/items", &s.client)
            .header("Idempotency-Key", bad.as_str())
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "key {bad:?}");
        let err: Value = r.json().await.unwrap();
        assert_eq!(err["error"]["code"], "invalid_idempotency_key");
    }

    let mine: Value = s
        .post("/v1/items", &s.client2)
        .header("Idempotency-Key", "k")
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_ne!(
        mine["id"], first["id"],
        "the same key from another token is another item"
    );
    // And clients only see their own items.
    let r = s
        .get(&format!("/v1/items/{}", first["id"].as_str().unwrap()), &s.client2)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    s.stop().await.unwrap();
}

/// H2 and friends: bad input gets the one error format and a 4xx.
async fn bad_input_gets_a_clear_4xx(setup: Setup) {
    let s = TestServer::start(setup).await;
    let url = format!("{}/v1/items", s.url);
    let send = |body: String, content_type: Option<&str>| {
        let mut r = s.http.post(&url).bearer_auth(&s.client).body(body);
        if let Some(ct) = content_type {
            r = r.header("content-type", ct);
        }
        r.send()
    };
    let cases: Vec<(String, Option<&str>, StatusCode, &str)> = vec![
        (
            "{not json".into(),
            Some("application/json"),
            StatusCode::BAD_REQUEST,
            "invalid_json",
        ),
        (
            r#"{"kind": 5, "author": "a", "text": "t"}"#.into(),
            Some("application/json"),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
        ),
        (
            r#"{"kind": "post", "author": "a"}"#.into(),
            Some("application/json"),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
        ),
        (
            r#"{"kind": "post", "author": "a", "text": "t", "extra": 1}"#.into(),
            Some("application/json"),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
        ),
        (
            r#"{"kind": "post", "author": "a", "text": "t"}"#.into(),
            None,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
        ),
        (
            r#"{"kind": "", "author": "a", "text": "t"}"#.into(),
            Some("application/json"),
            StatusCode::BAD_REQUEST,
            "invalid_body",
        ),
        (
            format!("{}{}", "[".repeat(10_000), "]".repeat(10_000)),
            Some("application/json"),
            StatusCode::BAD_REQUEST,
            "invalid_json",
        ),
        (
            "x".repeat(s.config.ingest.max_body_bytes + 1),
            Some("application/json"),
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
        ),
    ];
    for (body, ct, status, code) in cases {
        let shown = body.chars().take(40).collect::<String>();
        let r = send(body, ct).await.unwrap();
        assert_eq!(r.status(), status, "{shown}");
        let err: Value = r.json().await.unwrap_or_else(|e| panic!("{shown}: not JSON: {e}"));
        assert_eq!(err["error"]["code"], code, "{shown}");
        assert!(err["error"]["message"].as_str().is_some_and(|m| !m.is_empty()));
    }
    let r = s.get("/v1/items/does-not-exist", &s.client).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    let r = s
        .post("/v1/items/does-not-exist/events", &s.client)
        .json(&json!({"kind": "flag", "actor": "u"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    let r = s.get("/no/such/route", &s.client).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    assert_eq!(r.json::<Value>().await.unwrap()["error"]["code"], "not_found");
    let r = s.http.delete(format!("{}/v1/items", s.url)).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::METHOD_NOT_ALLOWED);
    s.stop().await.unwrap();
}

/// H1: a 100 MB chunked body gets 413 without the server reading it all.
async fn huge_chunked_body_is_refused_with_413(setup: Setup) {
    let s = TestServer::start(setup).await;
    let addr = s.url.trim_start_matches("http://").to_string();
    let mut conn = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let head = format!(
        "POST /v1/items HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
        s.client
    );
    conn.write_all(head.as_bytes()).await.unwrap();
    let chunk = vec![b' '; 64 << 10];
    let frame = [format!("{:x}\r\n", chunk.len()).into_bytes(), chunk, b"\r\n".to_vec()].concat();
    let mut sent = 0usize;
    while sent < 100 << 20 {
        // The server answers and stops reading long before 100 MB.
        match tokio::time::timeout(Duration::from_secs(2), conn.write_all(&frame)).await {
            Ok(Ok(())) => sent += frame.len(),
            _ => break,
        }
    }
    assert!(sent < 100 << 20, "the server read all 100 MB");
    let mut response = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), conn.read_to_end(&mut response)).await;
    let text = String::from_utf8_lossy(&response);
    assert!(
        text.starts_with("HTTP/1.1 413"),
        "{}",
        text.chars().take(200).collect::<String>()
    );
    assert!(text.contains("body_too_large"));
    s.stop().await.unwrap();
}

/// H5: every moderator route, enumerated from the router's own table,
/// answers 401 without or with a wrong token and 403 to a client token.
async fn moderator_routes_refuse_other_callers(setup: Setup) {
    let s = TestServer::start(setup).await;
    let mut checked = 0;
    for route in gavel::api::route_table() {
        if route.access != gavel::api::Access::Moderator {
            continue;
        }
        let path = route.path.replace("{id}", "1").replace("{provider}", "p");
        let url = format!("{}{path}", s.url);
        for (token, expected) in [(None, 401), (Some("wrong-token"), 401), (Some(s.client.as_str()), 403)] {
            let mut r = s
                .http
                .request(route.method.clone(), &url)
                .json(&json!({"status": "visible", "reason": "r"}));
            if let Some(t) = token {
                r = r.bearer_auth(t);
            }
            let r = r.send().await.unwrap();
            assert_eq!(
                r.status().as_u16(),
                expected,
                "{} {} with {token:?}",
                route.method,
                route.path
            );
            let err: Value = r.json().await.unwrap();
            assert!(err["error"]["code"].is_string());
        }
        checked += 1;
    }
    assert!(checked >= 8, "only {checked} moderator routes in the table");
    // Client routes need a token too.
    for route in gavel::api::route_table()
        .iter()
        .filter(|r| r.access == gavel::api::Access::Client)
    {
        let url = format!("{}{}", s.url, route.path.replace("{id}", "1"));
        let r = s
            .http
            .request(route.method.clone(), &url)
            .json(&json!({}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{} {}", route.method, route.path);
    }
    s.stop().await.unwrap();
}

/// H6: NUL anywhere and control characters in identifiers are refused with
/// a 400 that names the field, on both stores (PostgreSQL refuses NUL in
/// text: before, that was a 500), and nothing is stored.
async fn control_characters_are_refused_naming_the_field(setup: Setup) {
    let s = TestServer::start(setup).await;
    let ok = json!({"kind": "post", "author": "nul-tester", "text": "fine"});
    let with = |field: &str, value: Value| {
        let mut body = ok.clone();
        body[field] = value;
        body
    };
    let cases = [
        ("author", with("author", json!("al\u{0}ice"))),
        ("author", with("author", json!("al\u{7}ice"))),
        ("kind", with("kind", json!("po\u{0}st"))),
        ("external_id", with("external_id", json!("ext\u{0}1"))),
        ("text", with("text", json!("hello \u{0} world"))),
        ("context.lang", with("context", json!({"lang": "e\u{0}n"}))),
        ("context", with("context", json!({"la\u{0}ng": "en"}))),
    ];
    for (field, body) in cases {
        let (status, answer) = s.submit_as(&s.client, &body, None).await;
        assert_eq!(status, 400, "{field}: {answer}");
        assert_eq!(answer["error"]["code"], "invalid_body");
        assert!(
            answer["error"]["message"]
                .as_str()
                .unwrap()
                .contains(&format!("`{field}")),
            "{answer}"
        );
    }
    let store = s.open_store().await;
    assert!(
        store.author_items("web", "nul-tester", 10).await.unwrap().is_empty(),
        "nothing stored"
    );
    // Tab and newline are fine in identifiers; other text takes any character but NUL.
    let (status, answer) = s
        .submit_as(
            &s.client,
            &json!({"kind": "post", "author": "tab\there", "text": "bell \u{7}\r\n"}),
            None,
        )
        .await;
    assert_eq!(status, 202, "{answer}");
    let id = answer["id"].as_str().unwrap().to_string();
    for (path, body, token) in [
        (
            format!("/v1/items/{id}/events"),
            json!({"kind": "flag", "actor": "u\u{0}"}),
            &s.client,
        ),
        (
            format!("/v1/items/{id}/events"),
            json!({"kind": "edit", "actor": "u", "text": "x\u{0}"}),
            &s.client,
        ),
        (
            format!("/v1/items/{id}/moderation"),
            json!({"status": "visible", "reason": "r\u{0}"}),
            &s.moderator,
        ),
        (
            format!("/v1/items/{id}/moderation"),
            json!({"status": "visible", "reason": "r", "moderator": "m\u{0}"}),
            &s.moderator,
        ),
    ] {
        let r = s.post(&path, token).json(&body).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{path} {body}");
    }
    // A NUL in a path or a query never reaches the database either.
    for path in ["/v1/items/a%00b", "/v1/review-queue?cursor=1_a%00b"] {
        let r = s.get(path, &s.moderator).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{path}");
    }
    s.stop().await.unwrap();
}

/// I3: an `Idempotency-Key` header that is present but empty (or blank)
/// is malformed, sent on the wire exactly so (no client library between).
async fn an_empty_idempotency_key_header_is_malformed(setup: Setup) {
    let s = TestServer::start(setup).await;
    let addr = s.url.trim_start_matches("http://").to_string();
    let body = r#"{"kind": "post", "author": "empty-key", "text": "hello"}"#;
    for header in ["Idempotency-Key:", "Idempotency-Key:    ", "Idempotency-Key: \t "] {
        let mut conn = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let request = format!(
            "POST /v1/items HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\n{header}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            s.client,
            body.len()
        );
        conn.write_all(request.as_bytes()).await.unwrap();
        let mut response = Vec::new();
        conn.read_to_end(&mut response).await.unwrap();
        let text = String::from_utf8_lossy(&response);
        assert!(text.starts_with("HTTP/1.1 400"), "{header:?}: {text}");
        assert!(text.contains("invalid_idempotency_key"), "{text}");
    }
    let store = s.open_store().await;
    assert!(store.author_items("web", "empty-key", 10).await.unwrap().is_empty());
    s.stop().await.unwrap();
}

/// The author deletes an item through the client that submitted it:
/// 200 with the deleted item, again 200 (repeatable), another client gets
/// 404; afterwards no event, rule or moderator changes it.
async fn an_author_deletes_through_its_client(setup: Setup) {
    let s = TestServer::start(setup).await;
    let id = s.submit("leaver", "something I regret").await;
    let delete = |token: &str| {
        s.http
            .delete(format!("{}/v1/items/{id}", s.url))
            .bearer_auth(token.to_string())
            .send()
    };
    let other = delete(&s.client2).await.unwrap();
    assert_eq!(other.status(), StatusCode::NOT_FOUND, "another client's item");
    for _ in 0..2 {
        let r = delete(&s.client).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        let item: Value = r.json().await.unwrap();
        assert_eq!(item["status"], "deleted");
    }
    let item = s.get_json(&format!("/v1/items/{id}"), &s.moderator).await;
    let deletions: Vec<&Value> = item["transitions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["to_status"] == "deleted")
        .collect();
    assert_eq!(deletions.len(), 1, "deleted once: {item:#}");
    assert_eq!(deletions[0]["actor"], "author");
    assert_eq!(deletions[0]["actor_name"], "web");
    assert_eq!(deletions[0]["cause"], "author_deleted");
    assert_eq!(s.event(&id, "flag", "u1").await, 409, "no events on a deleted item");
    let r = s
        .post(&format!("/v1/items/{id}/moderation"), &s.moderator)
        .json(&json!({"status": "visible", "reason": "undo"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CONFLICT, "deleted is terminal");
    s.stop().await.unwrap();
}

/// Who decided comes from the token; a `moderator` name in the body is
/// kept as a display note beside it, never as the identity.
async fn the_audit_trail_names_the_token_not_the_body(setup: Setup) {
    let s = TestServer::start(setup).await;
    let id = s.submit("audited", "an ordinary post").await;
    s.settled(&id).await;
    let r = s
        .post(&format!("/v1/items/{id}/moderation"), &s.moderator)
        .json(&json!({"status": "rejected", "reason": "spam", "moderator": "someone-else"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let item: Value = r.json().await.unwrap();
    let last = item["transitions"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["actor"], "moderator");
    assert_eq!(last["actor_name"], "mod", "the token's name");
    assert_eq!(last["actor_note"], "someone-else");
    s.stop().await.unwrap();
}

/// The batch endpoints: each entry gets what its single request would
/// have, a refused entry fails alone, keys are per entry (a repeated batch
/// replays each entry), and every acknowledged entry is stored.
async fn batch_entries_are_answered_and_keyed_one_by_one(setup: Setup) {
    let s = TestServer::start(setup).await;
    let post = |n: u32| json!({"kind": "post", "author": format!("batcher-{n}"), "text": format!("batch post {n}")});
    let mut entries: Vec<Value> = (0..5).map(post).collect();
    entries[1]["external_id"] = json!("ext-batch-1");
    entries[2]["idempotency_key"] = json!("batch-key-2");
    entries[3]["author"] = json!("bad\u{0}author");
    entries.push(json!({"kind": "post", "author": "batcher-dup", "text": "dup", "external_id": "ext-batch-1"}));
    let send = |entries: &Vec<Value>| {
        s.post("/v1/items/batch", &s.client)
            .json(&json!({"items": entries}))
            .send()
    };
    let r = send(&entries).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let first: Value = r.json().await.unwrap();
    let statuses: Vec<u64> = first["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["status"].as_u64().unwrap())
        .collect();
    assert_eq!(statuses, [202, 202, 202, 400, 202, 409], "{first:#}");
    assert_eq!(first["results"][5]["body"]["error"]["code"], "duplicate_external_id");
    let store = s.open_store().await;
    for (i, result) in first["results"].as_array().unwrap().iter().enumerate() {
        if result["status"] == 202 {
            let id = result["body"]["id"].as_str().unwrap();
            assert!(
                store.item(id).await.unwrap().is_some(),
                "entry {i} acknowledged and stored"
            );
        }
    }
    // The same batch again: the keyed entry replays its first answer, the
    // external id is taken, the unkeyed entries are new items.
    let again: Value = send(&entries).await.unwrap().json().await.unwrap();
    assert_eq!(again["results"][2], first["results"][2], "replayed");
    assert_eq!(again["results"][1]["status"], 409);
    assert_ne!(again["results"][0]["body"]["id"], first["results"][0]["body"]["id"]);
    // The same key with another body is refused for that entry alone.
    let mut changed = entries.clone();
    changed[2]["text"] = json!("another text");
    let mismatch: Value = send(&changed).await.unwrap().json().await.unwrap();
    assert_eq!(mismatch["results"][2]["status"], 422);
    assert_eq!(mismatch["results"][0]["status"], 202);
    // Events: per entry, keyed, an unknown item refused alone.
    let id = first["results"][0]["body"]["id"].as_str().unwrap().to_string();
    let events = json!({"events": [
        {"item": id, "kind": "flag", "actor": "e1", "idempotency_key": "ev-key-1"},
        {"item": "no-such-item", "kind": "flag", "actor": "e2"},
        {"item": id, "kind": "upvote", "actor": "e3"},
        {"item": id, "kind": "flag", "actor": "e1", "idempotency_key": "ev-key-1"},
    ]});
    let r: Value = s
        .post("/v1/events/batch", &s.client)
        .json(&events)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let statuses: Vec<u64> = r["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["status"].as_u64().unwrap())
        .collect();
    assert_eq!(statuses[..3], [202, 404, 202], "{r:#}");
    assert!(
        matches!(statuses[3], 202 | 409),
        "a repeat of a key in the same batch replays or waits: {r:#}"
    );
    let item = s.get_json(&format!("/v1/items/{id}"), &s.moderator).await;
    assert_eq!(item["counters"]["flag"], 1, "the keyed flag counted once: {item:#}");
    assert_eq!(item["counters"]["upvote"], 1);
    // Over the limits: the whole request is refused, nothing stored.
    let too_many: Vec<Value> = (0..1001).map(post).collect();
    let r = send(&too_many).await.unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    s.stop().await.unwrap();
}

/// H4: a client sending at twice its rate limit gets 429 with
/// `Retry-After` for the excess, and the accepted rate is the limit
/// (within 10 %, after the burst).
async fn a_client_over_its_rate_gets_429_and_the_limit_holds(setup: Setup) {
    let rate = 40u32;
    let s = TestServer::start_with(setup, |c| {
        c.ingest.client_rate_per_second = rate;
        // A small burst absorbs the scheduling jitter of the paced sender.
        c.ingest.client_burst = 10;
    })
    .await;
    let secs = 5u64;
    let total = 2 * rate as u64 * secs;
    let interval = Duration::from_micros(1_000_000 / (2 * rate as u64));
    let started = tokio::time::Instant::now();
    let mut sends = tokio::task::JoinSet::new();
    for i in 0..total {
        tokio::time::sleep_until(started + interval * i as u32).await;
        let req = s
            .post("/v1/items", &s.client)
            .json(&json!({"kind": "post", "author": format!("paced-{i}"), "text": format!("paced {i}")}));
        sends.spawn(async move {
            let r = req.send().await.unwrap();
            let retry_after = r
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            (r.status().as_u16(), retry_after)
        });
    }
    let mut accepted = 0u64;
    let mut limited = 0u64;
    while let Some(r) = sends.join_next().await {
        match r.unwrap() {
            (202, _) => accepted += 1,
            (429, retry_after) => {
                limited += 1;
                let secs: u64 = retry_after.expect("429 carries Retry-After").parse().unwrap();
                assert!((1..=2).contains(&secs), "Retry-After {secs}");
            }
            (other, _) => panic!("unexpected status {other}"),
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let expected = 10.0 + f64::from(rate) * elapsed;
    let ratio = accepted as f64 / expected;
    assert!(
        (0.9..=1.1).contains(&ratio),
        "accepted {accepted} of {total} in {elapsed:.2} s; the limit allows {expected:.0} ({ratio:.2}×)"
    );
    assert_eq!(accepted + limited, total);
    s.stop().await.unwrap();
}

gavel_tests::both!(
    submitted_items_settle_with_stamped_decisions,
    concurrent_retries_with_one_key_create_one_item,
    idempotency_key_rules,
    bad_input_gets_a_clear_4xx,
    huge_chunked_body_is_refused_with_413,
    moderator_routes_refuse_other_callers,
    duplicate_text_from_one_author_is_held,
    control_characters_are_refused_naming_the_field,
    an_empty_idempotency_key_header_is_malformed,
    an_author_deletes_through_its_client,
    the_audit_trail_names_the_token_not_the_body,
    batch_entries_are_answered_and_keyed_one_by_one,
    a_client_over_its_rate_gets_429_and_the_limit_holds,
);
