//! Lists moderators edit (`/v1/lists`, `host/src/lists/`,
//! `host/src/store/lists.rs`): versions fenced by `If-Match` (two
//! moderators racing, one wins, the other gets 409 and nothing is written),
//! entries checked and refused by name, hostile input refused or bounded,
//! and an edit served by a second process within a second; backtests
//! that replay each decision with the list versions it used, or with a
//! candidate list (API and CLI). Each kind's matching semantics are unit
//! tests of `host/src/lists/matcher.rs`.

use gavel::config::{Role, TokenConfig};
use gavel::lists::{Entry, ListKind};
use gavel::metrics::ListLabel;
use gavel_tests::server::{Setup, TestServer};
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// A server with a second moderator token, `mod2`; returns that token.
async fn with_two_moderators(setup: Setup, tweak: impl FnOnce(&mut gavel::config::Config)) -> (TestServer, String) {
    let token = gavel::config::new_token();
    let mod2 = token.clone();
    let s = TestServer::start_with(setup, |c| {
        c.tokens.push(TokenConfig {
            name: "mod2".into(),
            token,
            role: Role::Moderator,
        });
        tweak(c);
    })
    .await;
    (s, mod2)
}

/// `PUT /v1/lists/{name}` with `If-Match` when given: status and body.
async fn put(s: &TestServer, token: &str, name: &str, if_match: Option<i64>, body: &Value) -> (StatusCode, Value) {
    let mut r = s
        .http
        .put(format!("{}/v1/lists/{name}", s.url))
        .bearer_auth(token)
        .json(body);
    if let Some(v) = if_match {
        r = r.header("If-Match", format!("\"{v}\""));
    }
    let r = r.send().await.unwrap();
    (r.status(), r.json().await.unwrap())
}

async fn patch(s: &TestServer, token: &str, name: &str, if_match: Option<i64>, body: &Value) -> (StatusCode, Value) {
    let mut r = s
        .http
        .patch(format!("{}/v1/lists/{name}", s.url))
        .bearer_auth(token)
        .json(body);
    if let Some(v) = if_match {
        r = r.header("If-Match", v.to_string());
    }
    let r = r.send().await.unwrap();
    (r.status(), r.json().await.unwrap())
}

async fn get(s: &TestServer, path: &str) -> (StatusCode, Value) {
    let r = s.get(path, &s.moderator).send().await.unwrap();
    (r.status(), r.json().await.unwrap())
}

fn values(list: &Value) -> Vec<&str> {
    list["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["value"].as_str().unwrap())
        .collect()
}

fn entries(list: &Value) -> Vec<Entry> {
    serde_json::from_value(list["entries"].clone()).unwrap()
}

/// L1: a list's life: created at version 1, replaced and patched only at
/// the version the editor names, every version kept with who, why, when
/// and the digest of its canonical entries; a refused edit writes nothing.
async fn edits_are_versioned_and_fenced_by_if_match(setup: Setup) {
    let s = TestServer::start(setup).await;
    let (status, created) = put(
        &s,
        &s.moderator,
        "scam-phrases",
        None,
        &json!({"kind": "terms", "reason": "first wave", "entries": [
            {"value": "Free  MONEY!", "note": "seen in the March wave"}, {"value": "Crypto"}]}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_eq!(created["version"], 1);
    assert_eq!(created["updated_by"], "mod");
    assert_eq!(created["served"]["version"], 1, "served here before the answer");

    let r = s.get("/v1/lists/scam-phrases", &s.moderator).send().await.unwrap();
    assert_eq!(r.headers()["etag"], "\"1\"");
    let v1: Value = r.json().await.unwrap();
    assert_eq!(values(&v1), ["crypto", "free money"], "folded and sorted");
    assert_eq!(v1["entries"][1]["note"], "seen in the March wave");
    assert_eq!(v1["digest"], gavel::lists::digest(ListKind::Terms, &entries(&v1)));
    assert_eq!(v1["digest"], created["digest"]);

    // Creating it again, or replacing it without naming the version: 409.
    let body = json!({"kind": "terms", "reason": "second wave", "entries": [{"value": "scamcoin"}]});
    let (status, err) = put(&s, &s.moderator, "scam-phrases", None, &body).await;
    assert_eq!(status, StatusCode::CONFLICT, "{err}");
    assert_eq!(err["error"]["code"], "version_mismatch");
    let (status, _) = put(&s, &s.moderator, "scam-phrases", Some(7), &body).await;
    assert_eq!(status, StatusCode::CONFLICT);
    // Another kind: 409, a blank reason: 422, an unknown list: 404.
    let (status, err) = put(
        &s,
        &s.moderator,
        "scam-phrases",
        Some(1),
        &json!({"kind": "strings", "reason": "r", "entries": []}),
    )
    .await;
    assert_eq!(
        (status, err["error"]["code"].as_str()),
        (StatusCode::CONFLICT, Some("kind_mismatch"))
    );
    let (status, err) = put(
        &s,
        &s.moderator,
        "scam-phrases",
        Some(1),
        &json!({"kind": "terms", "reason": "  ", "entries": []}),
    )
    .await;
    assert_eq!(
        (status, err["error"]["code"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("invalid_reason"))
    );
    let (status, _) = put(&s, &s.moderator, "nothing-here", Some(1), &body).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(
        get(&s, "/v1/lists/scam-phrases").await.1["version"],
        1,
        "nothing written"
    );

    let (status, v2) = put(&s, &s.moderator, "scam-phrases", Some(1), &body).await;
    assert_eq!((status, v2["version"].as_i64()), (StatusCode::OK, Some(2)), "{v2}");

    // PATCH: If-Match required; add (and re-note), remove by any spelling.
    let edit = json!({"reason": "third wave", "add": [{"value": "miracle cure"}, {"value": "Crypto"}], "remove": ["SCAMCOIN"]});
    let (status, err) = patch(&s, &s.moderator, "scam-phrases", None, &edit).await;
    assert_eq!(
        (status, err["error"]["code"].as_str()),
        (StatusCode::PRECONDITION_REQUIRED, Some("if_match_required"))
    );
    let (status, _) = patch(&s, &s.moderator, "scam-phrases", Some(1), &edit).await;
    assert_eq!(status, StatusCode::CONFLICT);
    let (status, v3) = patch(&s, &s.moderator, "scam-phrases", Some(2), &edit).await;
    assert_eq!((status, v3["version"].as_i64()), (StatusCode::OK, Some(3)), "{v3}");
    let (_, now) = get(&s, "/v1/lists/scam-phrases").await;
    assert_eq!(values(&now), ["crypto", "miracle cure"]);
    let (status, err) = patch(
        &s,
        &s.moderator,
        "scam-phrases",
        Some(3),
        &json!({"reason": "r", "remove": ["absent"]}),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("\"absent\": is not in the list"),
        "{err}"
    );

    // The history, paged, newest first; any version and any two compared.
    let (_, page) = get(&s, "/v1/lists/scam-phrases/versions?limit=2").await;
    let versions: Vec<i64> = page["versions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["version"].as_i64().unwrap())
        .collect();
    assert_eq!(versions, [3, 2]);
    assert_eq!(page["versions"][0]["reason"], "third wave");
    assert_eq!(page["next_before"], 2);
    let (_, rest) = get(&s, "/v1/lists/scam-phrases/versions?limit=2&before=2").await;
    assert_eq!(rest["versions"][0]["version"], 1);
    assert_eq!(rest["versions"][0]["digest"], v1["digest"]);
    assert!(rest["next_before"].is_null());
    let (_, old) = get(&s, "/v1/lists/scam-phrases/versions/1").await;
    assert_eq!(values(&old), ["crypto", "free money"]);
    let (status, diff) = get(&s, "/v1/lists/scam-phrases/diff?from=1&to=3").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(diff["added"], json!([{"value": "miracle cure"}]));
    assert_eq!(
        diff["removed"],
        json!([{"value": "free money", "note": "seen in the March wave"}])
    );
    assert_eq!(diff["renoted"], json!([]));
    assert_eq!(diff["from"]["digest"], v1["digest"]);
    assert_eq!(
        get(&s, "/v1/lists/scam-phrases/diff?from=1&to=9").await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        get(&s, "/v1/lists/nothing-here/versions").await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(get(&s, "/v1/lists/Not%20A%20Name").await.0, StatusCode::BAD_REQUEST);

    let (_, all) = get(&s, "/v1/lists").await;
    assert_eq!(all["lists"][0]["name"], "scam-phrases");
    assert_eq!(all["lists"][0]["version"], 3);
    assert_eq!(all["lists"][0]["served"]["version"], 3);
    assert_eq!(all["lists"][0]["entry_count"], 2);
    s.stop().await.unwrap();
}

/// L2: two moderators edit one list from the same version at once, again
/// and again (replace and patch): exactly one wins each round, the other
/// gets 409, and the list holds the winner's content, one version per round.
async fn two_moderators_race_and_one_wins(setup: Setup) {
    let (s, mod2) = with_two_moderators(setup, |_| {}).await;
    let body = |v: &str| json!({"kind": "strings", "reason": format!("by {v}"), "entries": [{"value": v}]});
    assert_eq!(
        put(&s, &s.moderator, "hashes", None, &body("start")).await.0,
        StatusCode::CREATED
    );
    for round in 1..=8i64 {
        let (a, b) = if round % 2 == 0 {
            let (a, b) = (body(&format!("a{round}")), body(&format!("b{round}")));
            tokio::join!(
                put(&s, &s.moderator, "hashes", Some(round), &a),
                put(&s, &mod2, "hashes", Some(round), &b)
            )
        } else {
            let edit = |v: String| json!({"reason": "add", "add": [{"value": v}]});
            let (a, b) = (edit(format!("a{round}")), edit(format!("b{round}")));
            tokio::join!(
                patch(&s, &s.moderator, "hashes", Some(round), &a),
                patch(&s, &mod2, "hashes", Some(round), &b)
            )
        };
        let statuses = [a.0, b.0];
        assert!(
            statuses.contains(&StatusCode::OK) && statuses.contains(&StatusCode::CONFLICT),
            "round {round}: {statuses:?} {a:?} {b:?}"
        );
        let (winner, loser_value) = if a.0 == StatusCode::OK { ("a", "b") } else { ("b", "a") };
        let (_, now) = get(&s, "/v1/lists/hashes").await;
        assert_eq!(now["version"], round + 1, "one version per round");
        let listed = values(&now);
        assert!(
            listed.contains(&format!("{winner}{round}").as_str()),
            "round {round}: {listed:?}"
        );
        assert!(
            !listed.contains(&format!("{loser_value}{round}").as_str()),
            "round {round}: the loser wrote nothing: {listed:?}"
        );
        assert_eq!(now["updated_by"], if winner == "a" { "mod" } else { "mod2" });
    }
    let (_, page) = get(&s, "/v1/lists/hashes/versions?limit=100").await;
    assert_eq!(page["versions"].as_array().unwrap().len(), 9);
    s.stop().await.unwrap();
}

/// L3: every kind refuses what it cannot read with 422 naming the entry;
/// hostile input (a 1 MB regex, a pattern whose program explodes, 10^6
/// entries, one entry over the limit, one list too many) gets a clear
/// 413/422 and writes nothing; the largest list allowed is accepted.
async fn bad_and_hostile_entries_are_refused_by_name(setup: Setup) {
    let s = TestServer::start_with(setup, |c| {
        c.lists.max_lists = 3;
        c.lists.max_body_bytes = 32 << 20;
    })
    .await;
    let refuse = async |kind: &str, value: &str, code: &str| {
        // A good entry first: the bad one is named, not the first.
        let good = if kind == "cidrs" { "192.0.2.0/24" } else { "ok" };
        let body = json!({"kind": kind, "reason": "r", "entries": [{"value": good}, {"value": value}]});
        let (status, err) = put(&s, &s.moderator, &format!("bad-{kind}"), None, &body).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{kind} {value:.40}: {err}");
        assert_eq!(err["error"]["code"], code);
        let message = err["error"]["message"].as_str().unwrap();
        // Named as a JSON-ish quoted string (escapes and all).
        let shown = format!("{:?}", value.chars().take(20).collect::<String>());
        let shown = &shown[..shown.len() - 1];
        assert!(message.contains(shown), "{message} names {shown}");
        message.to_string()
    };
    refuse("patterns", "(unclosed", "invalid_entry").await;
    let huge = refuse("patterns", r"\w{1000}\w{1000}\w{1000}", "invalid_entry").await;
    assert!(huge.contains("compiles to more than the limit"), "{huge}");
    let long = refuse("patterns", &"a".repeat(1 << 20), "invalid_entry").await;
    assert!(long.contains("1048576 characters, over the limit of 1024"), "{long}");
    refuse("cidrs", "10.0.0.0/33", "invalid_entry").await;
    refuse("domains", "exa mple.com", "invalid_entry").await;
    refuse("domains", "192.0.2.1", "invalid_entry").await;
    refuse("terms", "?!", "invalid_entry").await;
    refuse("strings", "nul\u{0}inside", "invalid_entry").await;
    assert!(
        get(&s, "/v1/lists").await.1["lists"].as_array().unwrap().is_empty(),
        "nothing written"
    );

    // 10^6 entries (19 MB, under this server's body limit): parsed, then
    // refused by count before anything is compiled or written.
    let million: Vec<Value> = (0..1_000_000).map(|i| json!({"value": format!("{i}")})).collect();
    let (status, err) = put(
        &s,
        &s.moderator,
        "big",
        None,
        &json!({"kind": "strings", "reason": "r", "entries": million}),
    )
    .await;
    assert_eq!(
        (status, err["error"]["code"].as_str()),
        (StatusCode::PAYLOAD_TOO_LARGE, Some("list_too_large"))
    );
    assert!(
        err["error"]["message"].as_str().unwrap().contains("1000000 entries"),
        "{err}"
    );
    // A body over `lists.max_body_bytes`: 413 before it is all read.
    let answer = oversized_put(&s, "big", 64 << 20).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer:.200}");
    assert!(answer.contains("body_too_large"), "{answer:.400}");
    // One over the limit of entries (in a body that fits): 413 naming the limit.
    let over: Vec<Value> = (0..100_001).map(|i| json!({"value": format!("{i}")})).collect();
    let (status, err) = put(
        &s,
        &s.moderator,
        "big",
        None,
        &json!({"kind": "strings", "reason": "r", "entries": over}),
    )
    .await;
    assert_eq!(
        (status, err["error"]["code"].as_str()),
        (StatusCode::PAYLOAD_TOO_LARGE, Some("list_too_large"))
    );
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("over the limit of 100000")
    );
    // The limit itself is fine, for every kind that compiles something.
    let domains: Vec<Value> = (0..100_000)
        .map(|i| json!({"value": format!("h{i}.example")}))
        .collect();
    let (status, big) = put(
        &s,
        &s.moderator,
        "big",
        None,
        &json!({"kind": "domains", "reason": "r", "entries": domains}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{big}");
    assert_eq!(big["entry_count"], 100_000);
    let terms: Vec<Value> = (0..100_000).map(|i| json!({"value": format!("w{i} x")})).collect();
    let (status, _) = put(
        &s,
        &s.moderator,
        "big-terms",
        None,
        &json!({"kind": "terms", "reason": "r", "entries": terms}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    // Canonical forms through the API.
    let (status, _) = put(
        &s,
        &s.moderator,
        "hosts",
        None,
        &json!({"kind": "domains", "reason": "r", "entries": [{"value": "Bit.LY."}, {"value": "bücher.example"}]}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(
        values(&get(&s, "/v1/lists/hosts").await.1),
        ["bit.ly", "xn--bcher-kva.example"]
    );
    // One list too many.
    let (status, err) = put(
        &s,
        &s.moderator,
        "fourth",
        None,
        &json!({"kind": "strings", "reason": "r", "entries": []}),
    )
    .await;
    assert_eq!(
        (status, err["error"]["code"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("too_many_lists"))
    );
    assert_eq!(get(&s, "/v1/lists").await.1["lists"].as_array().unwrap().len(), 3);
    s.stop().await.unwrap();
}

/// A `PUT` announcing `length` bytes of body, written until the server
/// stops reading: the raw answer (a client library may see the connection
/// close under its write instead).
async fn oversized_put(s: &TestServer, name: &str, length: usize) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = s.url.trim_start_matches("http://").to_string();
    let mut conn = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let head = format!(
        "PUT /v1/lists/{name} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {}\r\n\
         Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n",
        s.moderator
    );
    conn.write_all(head.as_bytes()).await.unwrap();
    let chunk = vec![b' '; 64 << 10];
    let mut sent = 0;
    while sent < length {
        match tokio::time::timeout(Duration::from_secs(2), conn.write_all(&chunk)).await {
            Ok(Ok(())) => sent += chunk.len(),
            _ => break,
        }
    }
    assert!(sent < length, "the server read all {length} bytes");
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), conn.read_to_end(&mut answer)).await;
    String::from_utf8_lossy(&answer).into_owned()
}

/// A second server on the first one's store (and Redis, if any), with its
/// own data directory.
async fn second_server(first: &TestServer) -> TestServer {
    let dir = tempfile::tempdir().unwrap();
    let plugins = dir.path().join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    let mut config = first.config.clone();
    config.plugin_dir = plugins;
    config.data_dir = dir.path().join("data");
    TestServer::serve(dir, first.setup, config, |_| {}).await
}

/// The version of `list` a server serves, as `/v1/lists` says.
async fn served(s: &TestServer, list: &str) -> Option<i64> {
    let (_, all) = get(s, "/v1/lists").await;
    all["lists"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["name"] == list)
        .and_then(|l| l["served"]["version"].as_i64())
}

/// L4: an edit is served by the process that made it before it answers,
/// and by a second process on the same store within a second (its
/// `/v1/lists` and its `gavel_list_version` metric say which version).
async fn an_edit_reaches_a_second_process_within_a_second(setup: Setup) {
    let first = TestServer::start(setup).await;
    let body = |v: &str| json!({"kind": "cidrs", "reason": "r", "entries": [{"value": v}]});
    assert_eq!(
        put(&first, &first.moderator, "bad-nets", None, &body("10.0.0.0/8"))
            .await
            .0,
        StatusCode::CREATED
    );
    let second = second_server(&first).await;
    assert_eq!(served(&second, "bad-nets").await, Some(1), "compiled at start");
    for version in 2..=4i64 {
        let (status, _) = put(
            &first,
            &first.moderator,
            "bad-nets",
            Some(version - 1),
            &body(&format!("10.{version}.0.0/16")),
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        let written = Instant::now();
        assert_eq!(
            served(&first, "bad-nets").await,
            Some(version),
            "the editing process serves it at once"
        );
        loop {
            if served(&second, "bad-nets").await == Some(version) {
                break;
            }
            assert!(
                written.elapsed() < Duration::from_secs(1),
                "version {version} not served by the second process within 1 s"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let label = ListLabel {
            list: "bad-nets".into(),
        };
        assert_eq!(second.metrics.list_version.get_or_create(&label).get(), version);
    }
    second.stop().await.unwrap();
    first.stop().await.unwrap();
}

/// An item and list-probe's decision on it, once it settled.
async fn probe(s: &TestServer, text: &str, context: Value) -> (String, Value) {
    let id = s.submit_with("reader", text, context).await;
    let item = s.settled(&id).await;
    let decision = item["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["plugin"] == "list-probe")
        .unwrap_or_else(|| panic!("no list-probe decision on {item}"))
        .clone();
    (id, decision)
}

/// list-probe's decision on an item, once it settled.
async fn probe_decision(s: &TestServer, text: &str, context: Value) -> Value {
    probe(s, text, context).await.1
}

fn labels(decision: &Value) -> Vec<&str> {
    let mut l: Vec<&str> = decision["labels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap())
        .collect();
    l.sort();
    l
}

/// The (name, version, digest) of each list a decision consulted, by name.
fn consulted(decision: &Value) -> Vec<(String, i64, String)> {
    let mut l: Vec<(String, i64, String)> = decision["lists"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            (
                l["name"].as_str().unwrap().to_string(),
                l["version"].as_i64().unwrap(),
                l["digest"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    l.sort();
    l
}

/// Rules consult lists through `gavel:rules/lists` (docs/RELIABILITY.md
/// L7): each kind answers from the matcher of the version served, an edit
/// is answered from its new version at once, a wrong kind, an unknown list
/// and a bad address are refused by name, and every decision names the
/// lists it consulted with the version and digest each answered from.
async fn rules_consult_lists_and_decisions_name_their_versions(setup: Setup) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("plugins")).unwrap();
    std::fs::copy(
        gavel_tests::guests::LIST_PROBE,
        dir.path().join("plugins/list-probe.wasm"),
    )
    .unwrap();
    let s = TestServer::start_in(dir, setup, |_| {}).await;
    let mut digests = std::collections::BTreeMap::new();
    for (name, kind, entries) in [
        ("scam", "terms", vec!["purple giraffe"]),
        ("shady", "patterns", vec!["w[i1]n big"]),
        ("blocked", "domains", vec!["bit.ly", "x.bit.ly"]),
        ("hashes", "strings", vec!["abc123"]),
        ("nets", "cidrs", vec!["10.0.0.0/8", "10.1.0.0/16", "2001:db8::/32"]),
    ] {
        let entries: Vec<Value> = entries.iter().map(|v| json!({"value": v})).collect();
        let (status, body) = put(
            &s,
            &s.moderator,
            name,
            None,
            &json!({"kind": kind, "reason": "test", "entries": entries}),
        )
        .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        digests.insert(name.to_string(), body["digest"].as_str().unwrap().to_string());
    }
    let all = json!({
        "terms": "scam", "patterns": "shady", "domains": "blocked", "host": "a.x.bit.ly",
        "strings": "hashes", "value": "abc123", "cidrs": "nets", "ip": "10.1.2.3",
    });
    let (probed, d) = probe(&s, "PURPLE Giraffe!! w1n big today", all).await;
    assert_eq!(d["verdict"], "reject", "{d}");
    assert_eq!(
        labels(&d),
        [
            "cidrs:10.1.0.0/16",
            "domains:x.bit.ly",
            "patterns:w[i1]n big",
            "strings:abc123",
            "terms:purple giraffe"
        ],
        "{d}"
    );
    let expected: Vec<(String, i64, String)> = digests.iter().map(|(n, g)| (n.clone(), 1, g.clone())).collect();
    assert_eq!(consulted(&d), expected);

    // The console's timeline names them too, each linking to its list.
    let html = crate::console::page_html(&s, &format!("/console/items/{probed}")).await;
    for (name, digest) in &digests {
        assert!(
            html.contains(&format!(
                "href=\"/console/lists/{name}\">{name}</a> v1 <code title=\"{digest}\">"
            )),
            "the timeline does not name list {name}: {html}"
        );
    }

    // An edit is answered from its version at once (this process serves it
    // before the API answers), and the decision names the new digest.
    let (status, body) = patch(
        &s,
        &s.moderator,
        "scam",
        Some(1),
        &json!({"reason": "new", "add": [{"value": "green lemur"}]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let d = probe_decision(&s, "a Green-Lemur, and nothing else", json!({"terms": "scam"})).await;
    assert_eq!(labels(&d), ["terms:green lemur"], "{d}");
    assert_eq!(
        consulted(&d),
        [("scam".to_string(), 2, body["digest"].as_str().unwrap().to_string())]
    );
    assert_ne!(body["digest"].as_str().unwrap(), digests["scam"]);

    // Refusals by name; an unknown list is not recorded, a consulted one is.
    let d = probe_decision(
        &s,
        "nothing here",
        json!({"terms": "nets", "strings": "nope", "cidrs": "nets", "ip": "not-an-ip", "domains": "blocked", "host": "example.org"}),
    )
    .await;
    assert_eq!(d["verdict"], "allow", "{d}");
    let l = labels(&d);
    assert_eq!(l.len(), 3, "{d}");
    assert!(l[0].starts_with("cidrs!invalid=") && l[0].contains("not-an-ip"), "{d}");
    assert_eq!(l[1..], ["strings!unknown", "terms!wrong-kind=cidrs"], "{d}");
    let names: Vec<String> = consulted(&d).into_iter().map(|(n, ..)| n).collect();
    assert_eq!(names, ["blocked", "nets"], "{d}");

    // A decision that consulted none carries an empty list.
    let d = probe_decision(&s, "plain", json!({})).await;
    assert_eq!(d["lists"], json!([]), "{d}");

    // Exports carry them as `NAME@VERSION:DIGEST`.
    let r = s
        .get("/v1/exports/decisions?format=ndjson", &s.moderator)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let body = r.text().await.unwrap();
    let row: Value = body
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|r| r["item_id"] == probed.as_str() && r["plugin"] == "list-probe")
        .unwrap_or_else(|| panic!("no list-probe row for {probed} in the export"));
    let exported: Vec<String> = digests.iter().map(|(n, g)| format!("{n}@1:{g}")).collect();
    assert_eq!(row["lists"], json!(exported), "{row}");
    s.stop().await.unwrap();
}

/// The items of [`edited_history`], by name: `a*` judged under version 1
/// of list `scam` (`purple giraffe`), `b*` under version 2 (`green lemur`
/// added), `c*` under version 3 (only `orange panda`); list `shady`
/// (patterns, `w[i1]n big`) created between the `a*` and the `b*` items,
/// consulted by none of them.
struct History {
    server: TestServer,
    items: Items,
    /// `scam`'s digest at each version (index 0: version 1).
    digests: Vec<String>,
}

/// Item ids by name.
#[derive(Default)]
struct Items(std::collections::BTreeMap<&'static str, String>);

impl Items {
    fn id(&self, name: &str) -> &str {
        &self.0[name]
    }

    /// The names of `ids`, in name order.
    fn named(&self, ids: &std::collections::BTreeSet<String>) -> Vec<&'static str> {
        self.0
            .iter()
            .filter(|(_, id)| ids.contains(*id))
            .map(|(name, _)| *name)
            .collect()
    }
}

/// A server with list-probe deployed, asked about list `scam` on every
/// item while a moderator edits it between items (see [`History`]).
async fn edited_history(setup: Setup) -> History {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("plugins")).unwrap();
    std::fs::copy(
        gavel_tests::guests::LIST_PROBE,
        dir.path().join("plugins/list-probe.wasm"),
    )
    .unwrap();
    let s = TestServer::start_in(dir, setup, |_| {}).await;
    let mut items = Items::default();
    let mut digests = Vec::new();
    let terms = |values: &[&str]| -> Vec<Value> { values.iter().map(|v| json!({"value": v})).collect() };
    let mut judge = async |s: &TestServer, texts: [(&'static str, &str); 2], version: i64| {
        for (name, text) in texts {
            let (id, d) = probe(s, text, json!({"terms": "scam"})).await;
            let used: Vec<(String, i64)> = consulted(&d).into_iter().map(|(n, v, _)| (n, v)).collect();
            assert_eq!(used, [("scam".to_string(), version)], "{name}: {d}");
            items.0.insert(name, id);
        }
    };
    let (status, v1) = put(
        &s,
        &s.moderator,
        "scam",
        None,
        &json!({"kind": "terms", "reason": "v1", "entries": terms(&["purple giraffe"])}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{v1}");
    digests.push(v1["digest"].as_str().unwrap().to_string());
    judge(
        &s,
        [("a1", "a purple giraffe today"), ("a2", "a green lemur, w1n big")],
        1,
    )
    .await;

    let (status, v2) = patch(
        &s,
        &s.moderator,
        "scam",
        Some(1),
        &json!({"reason": "v2", "add": terms(&["green lemur"])}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v2}");
    digests.push(v2["digest"].as_str().unwrap().to_string());
    let (status, shady) = put(
        &s,
        &s.moderator,
        "shady",
        None,
        &json!({"kind": "patterns", "reason": "new", "entries": [{"value": "w[i1]n big"}]}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{shady}");
    judge(
        &s,
        [("b1", "the green lemur again"), ("b2", "an orange panda, win big")],
        2,
    )
    .await;

    let (status, v3) = put(
        &s,
        &s.moderator,
        "scam",
        Some(2),
        &json!({"kind": "terms", "reason": "v3", "entries": terms(&["orange panda"])}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v3}");
    digests.push(v3["digest"].as_str().unwrap().to_string());
    judge(&s, [("c1", "one orange panda"), ("c2", "purple giraffe again")], 3).await;
    History {
        server: s,
        items,
        digests,
    }
}

/// Starts a backtest and waits for it to end; returns its report.
async fn backtest(s: &TestServer, body: Value) -> Value {
    s.backtest(body).await["report"].clone()
}

/// The items of one flip bucket of a report.
fn flipped(report: &Value, bucket: &str) -> std::collections::BTreeSet<String> {
    report["flips"]["examples"][bucket]
        .as_array()
        .map(|examples| {
            examples
                .iter()
                .map(|e| e["item_id"].as_str().unwrap().to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// L8: a backtest replays each decision with the list versions it used: a
/// deployed rule reproduces all its decisions across three versions of a
/// list (answering with the current version would flip three of them), and
/// a list the stored decisions did not consult answers from the version in
/// force at each one's time (`unknown` before it existed).
async fn backtests_replay_the_list_versions_of_their_time(setup: Setup) {
    let h = edited_history(setup).await;
    let s = &h.server;
    let report = backtest(s, json!({"candidate": "list-probe", "all": true})).await;
    assert_eq!(report["sample"]["replayed"], 6, "{report:#}");
    assert_eq!(
        report["fidelity"],
        json!({"checked": 6, "identical": 6}),
        "every decision replayed with its own version: {report:#}"
    );
    assert_eq!(report["flips"]["unchanged"], 6);
    assert_eq!(report["lists"], json!([]));

    // What answering from the lists as they are now would do: version 3's
    // content in place of every version clears what versions 1 and 2
    // caught, and catches what version 2 let through.
    let now = backtest(
        s,
        json!({"candidate": "list-probe", "all": true, "lists": {"scam": {"entries": [{"value": "orange panda"}]}}}),
    )
    .await;
    assert_eq!(h.items.named(&flipped(&now, "newly_cleared")), ["a1", "b1"], "{now:#}");
    assert_eq!(h.items.named(&flipped(&now, "newly_actioned")), ["b2"], "{now:#}");
    assert_eq!(now["flips"]["unchanged"], 3);
    assert_eq!(
        now["lists"],
        json!([{"name": "scam", "kind": "terms", "entries": 1, "digest": h.digests[2]}]),
        "the same content as version 3 has its digest"
    );
    assert!(
        now["fidelity"].is_null(),
        "replays that consulted a candidate list are not fidelity checks"
    );

    // A config that makes the rule ask for `shady` too, which no stored
    // decision consulted: the `b*` and `c*` items answer from its version 1,
    // the `a*` items (judged before it existed) from nothing. So only the
    // `b2` text is caught, not the same words in `a2`.
    let shady = backtest(
        s,
        json!({"candidate": "list-probe", "all": true, "config": {"patterns": "shady"}}),
    )
    .await;
    assert_eq!(h.items.named(&flipped(&shady, "newly_actioned")), ["b2"], "{shady:#}");
    assert_eq!(shady["flips"]["unchanged"], 5, "{shady:#}");
    assert_eq!(shady["sample"]["replayed"], 6);
    h.server.stop().await.unwrap();
}

/// L9: candidate lists, through the API and the CLI: a backtest of a list
/// alone replays the deployed plugin that consulted it and flips exactly
/// the items the new content catches or lets go (moderator agreement
/// counted); bad candidate lists are refused as `PUT` refuses them, and a
/// new list needs its kind.
async fn a_candidate_list_flips_exactly_the_expected_items(setup: Setup) {
    let h = edited_history(setup).await;
    let s = &h.server;
    // A moderator approves a1 (rejected under version 1).
    let r = s
        .post(&format!("/v1/items/{}/moderation", h.items.id("a1")), &s.moderator)
        .json(&json!({"status": "visible", "reason": "a toy, not a scam"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());

    let candidate =
        json!({"scam": {"entries": [{"value": "Orange Panda"}, {"value": "green lemur", "note": "seen again"}]}});
    let report = backtest(s, json!({"lists": candidate, "all": true})).await;
    assert_eq!(report["candidates"][0]["name"], "list-probe", "{report:#}");
    assert_eq!(report["candidates"].as_array().unwrap().len(), 1);
    assert_eq!(report["replaces"], "list-probe");
    let entries = vec![
        Entry {
            value: "green lemur".into(),
            note: Some("seen again".into()),
        },
        Entry::new("orange panda"),
    ];
    assert_eq!(
        report["lists"],
        json!([{"name": "scam", "kind": "terms", "entries": 2,
                "digest": gavel::lists::digest(ListKind::Terms, &entries)}])
    );
    assert_eq!(
        h.items.named(&flipped(&report, "newly_actioned")),
        ["a2", "b2"],
        "{report:#}"
    );
    assert_eq!(h.items.named(&flipped(&report, "newly_cleared")), ["a1"], "{report:#}");
    assert_eq!(
        (
            report["flips"]["unchanged"].as_u64(),
            report["flips"]["changed"].as_u64()
        ),
        (Some(3), Some(0))
    );
    let m = &report["moderators"];
    assert_eq!(
        (m["decided"].as_u64(), m["old_agree"].as_u64(), m["new_agree"].as_u64()),
        (Some(1), Some(0), Some(1)),
        "{m}"
    );
    assert_eq!(m["reversals_avoided"], 1);

    // Refusals, in the one error format, before anything runs.
    let refused = async |body: Value| -> (StatusCode, Value) {
        let r = s.post("/v1/backtests", &s.moderator).json(&body).send().await.unwrap();
        (r.status(), r.json().await.unwrap())
    };
    let (status, err) = refused(json!({"lists": {"scam": {"entries": [{"value": "ok"}, {"value": "?!"}]}}})).await;
    assert_eq!(
        (status, err["error"]["code"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("invalid_entry"))
    );
    assert!(err["error"]["message"].as_str().unwrap().contains("\"?!\""), "{err}");
    let (status, err) = refused(json!({"lists": {"scam": {"kind": "strings", "entries": []}}})).await;
    assert_eq!(
        (status, err["error"]["code"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("kind_mismatch")),
        "{err}"
    );
    let (status, err) = refused(json!({"lists": {"fresh": {"entries": [{"value": "x"}]}}})).await;
    assert_eq!(
        (status, err["error"]["code"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("list_kind_required")),
        "{err}"
    );
    let (status, err) = refused(json!({"lists": {"fresh": {"kind": "terms", "entries": [{"value": "x"}]}}})).await;
    assert_eq!(
        (status, err["error"]["code"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("no_plugin_consulted")),
        "no stored decision consulted `fresh`: {err}"
    );
    let (status, err) =
        refused(json!({"lists": {"shady": {"entries": [{"value": "(unclosed"}]}}, "candidate": "list-probe"})).await;
    assert_eq!(
        (status, err["error"]["code"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("invalid_entry")),
        "{err}"
    );
    let (status, err) = refused(json!({"all": true})).await;
    assert_eq!(
        (status, err["error"]["code"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("invalid_backtest"))
    );
    let too_many: Vec<Value> = (0..100_001).map(|i| json!({"value": format!("w{i}")})).collect();
    let (status, err) = refused(json!({"lists": {"scam": {"entries": too_many}}})).await;
    assert_eq!(
        (status, err["error"]["code"].as_str()),
        (StatusCode::PAYLOAD_TOO_LARGE, Some("list_too_large"))
    );

    // The CLI, on the stopped server's store and plugin directory.
    let (config, dir) = h.server.stop_keeping_dir().await;
    let names = |ids: &std::collections::BTreeSet<String>| h.items.named(ids);
    let phrases = dir.path().join("phrases.txt");
    std::fs::write(&phrases, "# what moderators want to try\norange panda\n\ngreen lemur\n").unwrap();
    let gavel = gavel_tests::servers::gavel_binary();
    let db = config.database_url();
    let cli = |args: &[&str]| {
        std::process::Command::new(&gavel)
            .args(["backtest", "--all", "--database-url", &db])
            .arg("--data-dir")
            .arg(&config.data_dir)
            .args(args)
            .output()
            .unwrap()
    };
    let plugins = dir.path().join("plugins");
    let out = cli(&[
        "--plugin-dir",
        plugins.to_str().unwrap(),
        "--list",
        &format!("scam={}", phrases.display()),
        "--json",
        "-",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("list        scam (terms, 2 entries, sha256:"),
        "{stdout}"
    );
    let report: Value = serde_json::from_str(&stdout[stdout.find("{\n").unwrap()..]).unwrap();
    assert_eq!(names(&flipped(&report, "newly_actioned")), ["a2", "b2"], "{report:#}");
    assert_eq!(names(&flipped(&report, "newly_cleared")), ["a1"], "{report:#}");

    // A list the store does not have, for a candidate told to consult it.
    let fresh = dir.path().join("fresh.json");
    std::fs::write(&fresh, r#"{"kind": "patterns", "entries": [{"value": "w[i1]n big"}]}"#).unwrap();
    let out = cli(&[
        "--candidate",
        plugins.join("list-probe.wasm").to_str().unwrap(),
        "--config",
        "patterns=fresh",
        "--list",
        &format!("fresh={}", fresh.display()),
        "--json",
        "-",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_str(&stdout[stdout.find("{\n").unwrap()..]).unwrap();
    assert_eq!(names(&flipped(&report, "newly_actioned")), ["a2", "b2"], "{report:#}");
    assert_eq!(report["flips"]["newly_cleared"], 0);

    // A bad entry is named; a new list without its kind is refused.
    std::fs::write(&phrases, "orange panda\n?!\n").unwrap();
    let out = cli(&[
        "--plugin-dir",
        plugins.to_str().unwrap(),
        "--list",
        &format!("scam={}", phrases.display()),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("candidate list scam: entry \"?!\""), "{stderr}");
    let out = cli(&[
        "--plugin-dir",
        plugins.to_str().unwrap(),
        "--list",
        &format!("other={}", phrases.display()),
    ]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("list other does not exist"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    drop(dir);
}

/// The example rules read their lists and fall back to their sidecar
/// config while the host has none (docs/RELIABILITY.md L10): banned-terms
/// judges by its sidecar `terms` until list `banned-terms` exists, then by
/// the list alone; link-spam by its built-in shorteners until
/// `url-shorteners` exists; each decision names the list it consulted.
async fn the_examples_read_their_lists_and_fall_back_to_their_sidecar(setup: Setup) {
    let dir = tempfile::tempdir().unwrap();
    let plugins = dir.path().join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    std::fs::copy(gavel_tests::guests::BANNED_TERMS, plugins.join("banned-terms.wasm")).unwrap();
    std::fs::copy(gavel_tests::guests::LINK_SPAM, plugins.join("link-spam.wasm")).unwrap();
    std::fs::write(
        plugins.join("banned-terms.toml"),
        "mode = \"enforce\"\n[config]\nterms = [\"scamcoin\"]\n",
    )
    .unwrap();
    let s = TestServer::start_in(dir, setup, |_| {}).await;
    let decision = async |text: &str, plugin: &str| -> Value {
        let id = s.submit("reader", text).await;
        let item = s.settled(&id).await;
        item["decisions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["plugin"] == plugin)
            .unwrap_or_else(|| panic!("no {plugin} decision on {item}"))
            .clone()
    };

    // No lists yet: the sidecar and the built-in shorteners decide, and no
    // decision names a list.
    let d = decision("Buy SCAMCOIN now", "banned-terms").await;
    assert_eq!((d["verdict"].as_str(), consulted(&d)), (Some("reject"), vec![]), "{d}");
    let d = decision("look https://m.bit.ly/x", "link-spam").await;
    assert!(labels(&d).contains(&"shortener"), "{d}");
    assert_eq!(consulted(&d), vec![], "{d}");

    let mut digests = std::collections::BTreeMap::new();
    for (name, kind, value) in [
        ("banned-terms", "terms", "double your crypto"),
        ("url-shorteners", "domains", "sho.rt"),
    ] {
        let body = json!({"kind": kind, "reason": "test", "entries": [{"value": value}]});
        let (status, body) = put(&s, &s.moderator, name, None, &body).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        digests.insert(
            name,
            (name.to_string(), 1, body["digest"].as_str().unwrap().to_string()),
        );
    }

    // Now the lists alone decide: the sidecar's term and the built-in
    // shortener no longer count, the listed ones do.
    let d = decision("Buy SCAMCOIN now", "banned-terms").await;
    assert_eq!(d["verdict"], "allow", "{d}");
    assert_eq!(consulted(&d), vec![digests["banned-terms"].clone()], "{d}");
    let d = decision("DOUBLE your Crypto!", "banned-terms").await;
    assert_eq!(d["verdict"], "reject", "{d}");
    assert_eq!(d["reason"], "banned terms: double your crypto", "{d}");
    assert_eq!(consulted(&d), vec![digests["banned-terms"].clone()], "{d}");
    let d = decision("look https://m.bit.ly/x", "link-spam").await;
    assert!(!labels(&d).contains(&"shortener"), "{d}");
    assert_eq!(consulted(&d), vec![digests["url-shorteners"].clone()], "{d}");
    let d = decision("look https://go.sho.rt/x", "link-spam").await;
    assert!(labels(&d).contains(&"shortener"), "{d}");
    assert_eq!(consulted(&d), vec![digests["url-shorteners"].clone()], "{d}");
    s.stop().await.unwrap();
}

gavel_tests::both!(
    the_examples_read_their_lists_and_fall_back_to_their_sidecar,
    rules_consult_lists_and_decisions_name_their_versions,
    backtests_replay_the_list_versions_of_their_time,
    a_candidate_list_flips_exactly_the_expected_items,
    edits_are_versioned_and_fenced_by_if_match,
    two_moderators_race_and_one_wins,
    bad_and_hostile_entries_are_refused_by_name,
    an_edit_reaches_a_second_process_within_a_second,
);
