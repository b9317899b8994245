//! Entity signals (`host/src/signals/`, `host/src/domain/signals.rs`):
//! counts across items by a key they share, declared in sidecars, each
//! item counted once when it is created (never again on a retried
//! request), scoped per client, rebuilt from the stored items after a
//! restart and when a plugin declaring a new signal loads; the example
//! `link-wave` holds a wave of new accounts posting one link domain that
//! no per-item rule catches, and a backtest replays it exactly. The
//! counting itself (buckets, windows, HyperLogLog's error on 100,000
//! values, the key bound) is unit-tested in `host/src/signals/memory.rs`.

use gavel_tests::guests;
use gavel_tests::server::{Setup, TestServer, eventually};
use gavel_tests::servers::Redis;
use serde_json::{Value, json};
use std::path::Path;
use std::time::{Duration, Instant};

/// A sidecar for flag-ratio declaring signals it does not read: the
/// counts are the host's, whoever declares them.
const IP_ITEMS: &str = "[[signals]]\nname = \"ip-items\"\nkey = \"context.ip\"\ncount = \"items\"\nwindow = \"1h\"\n";

/// Puts link-wave (and its sidecar) and flag-ratio's sidecar declaring
/// `ip-items` into `plugins`.
fn add_plugins(plugins: &Path) {
    std::fs::create_dir_all(plugins).unwrap();
    std::fs::copy(guests::LINK_WAVE, plugins.join("link-wave.wasm")).unwrap();
    std::fs::copy(
        gavel_tests::repo_root().join("plugins/link-wave.toml"),
        plugins.join("link-wave.toml"),
    )
    .unwrap();
    std::fs::write(plugins.join("flag-ratio.toml"), IP_ITEMS).unwrap();
}

/// A server with link-wave besides the examples, and flag-ratio declaring
/// `ip-items`.
async fn start(setup: Setup) -> TestServer {
    start_with(setup, |_| {}).await
}

async fn start_with(setup: Setup, tweak: impl FnOnce(&mut gavel::config::Config)) -> TestServer {
    let dir = tempfile::tempdir().unwrap();
    add_plugins(&dir.path().join("plugins"));
    TestServer::start_in(dir, setup, tweak).await
}

/// A second process on the first one's store and Redis, with its own data
/// directory and the same plugins.
async fn second_server(first: &TestServer) -> TestServer {
    let dir = tempfile::tempdir().unwrap();
    let plugins = dir.path().join("plugins");
    for (name, path) in gavel_tests::example_rust_plugins() {
        std::fs::create_dir_all(&plugins).unwrap();
        std::fs::copy(path, plugins.join(format!("{name}.wasm"))).unwrap();
    }
    add_plugins(&plugins);
    let mut config = first.config.clone();
    config.plugin_dir = plugins;
    config.data_dir = dir.path().join("data");
    TestServer::serve(dir, first.setup, config, |_| {}).await
}

/// `GET /v1/signals/{name}?client=&key=`.
async fn reading(s: &TestServer, name: &str, client: &str, key: &str) -> Value {
    let r = s
        .get(&format!("/v1/signals/{name}"), &s.moderator)
        .query(&[("client", client), ("key", key)])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{name} {client} {key}");
    r.json().await.unwrap()
}

async fn value(s: &TestServer, name: &str, client: &str, key: &str) -> u64 {
    reading(s, name, client, key).await["value"].as_u64().unwrap()
}

/// Waits until every signal is rebuilt (`GET /v1/signals`).
async fn complete(s: &TestServer) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let list = s.get_json("/v1/signals", &s.moderator).await;
        if list["complete"] == true {
            return list;
        }
        assert!(Instant::now() < deadline, "signals never rebuilt: {list:#}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn item(author: &str, ip: &str) -> Value {
    json!({"kind": "post", "author": author, "text": "hello there", "context": {"ip": ip}})
}

/// E1, E2: every created item is counted once, by key and per client: a
/// retried request (same Idempotency-Key) and a replayed batch entry are
/// not counted again; a restart rebuilds the same counts from the stored
/// items; a plugin declaring a new signal, loaded later, starts it with
/// the stored items of its window.
async fn each_item_is_counted_once_and_rebuilt_from_the_record(setup: Setup) {
    let s = start(setup).await;
    let list = complete(&s).await;
    let names: Vec<&str> = list["signals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["domain-new-authors", "ip-items"], "{list:#}");

    for (i, ip) in ["10.0.0.1", "10.0.0.1", "10.0.0.2"].iter().enumerate() {
        let (status, r) = s.submit_as(&s.client, &item(&format!("u{i}"), ip), None).await;
        assert_eq!(status, 202, "{r}");
    }
    // A retried request: one item, counted once.
    for _ in 0..3 {
        let (status, r) = s.submit_as(&s.client, &item("u9", "10.0.0.1"), Some("retry-1")).await;
        assert_eq!(status, 202, "{r}");
    }
    // A batch, sent twice with its keys: two items, counted once each.
    let batch = json!({"items": [
        {"idempotency_key": "b1", "kind": "post", "author": "u7", "text": "a", "context": {"ip": "10.0.0.1"}},
        {"idempotency_key": "b2", "kind": "post", "author": "u8", "text": "b", "context": {"ip": "10.0.0.1"}},
    ]});
    for _ in 0..2 {
        let r = s.post("/v1/items/batch", &s.client).json(&batch).send().await.unwrap();
        assert_eq!(r.status(), 200);
    }
    // Another client's item: another scope.
    let (status, _) = s.submit_as(&s.client2, &item("u1", "10.0.0.1"), None).await;
    assert_eq!(status, 202);

    let expected = [
        ("web", "10.0.0.1", 5),
        ("web", "10.0.0.2", 1),
        ("app", "10.0.0.1", 1),
        ("web", "10.9.9.9", 0),
    ];
    for (client, ip, n) in expected {
        assert_eq!(value(&s, "ip-items", client, ip).await, n, "{client} {ip}");
    }
    let r = reading(&s, "ip-items", "web", "10.0.0.1").await;
    assert_eq!(r["key_field"], "context.ip");
    assert_eq!(r["count"], "items");
    assert_eq!(r["window_ms"], 3_600_000);
    let missing = s
        .get("/v1/signals/no-such-signal", &s.moderator)
        .query(&[("client", "web"), ("key", "x")])
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
    let as_client = s
        .get("/v1/signals/ip-items", &s.client)
        .query(&[("client", "web"), ("key", "x")])
        .send()
        .await
        .unwrap();
    assert_eq!(as_client.status(), 403, "signals are for moderators");

    // A restart: counts derived from the stored items again.
    let (config, dir) = s.stop_keeping_dir().await;
    let s = TestServer::serve(dir, setup, config, |_| {}).await;
    complete(&s).await;
    for (client, ip, n) in expected {
        assert_eq!(
            value(&s, "ip-items", client, ip).await,
            n,
            "after a restart: {client} {ip}"
        );
    }

    // A new signal, declared by a plugin loaded now: its window's stored
    // items are in it.
    std::fs::write(
        s.dir().join("plugins/duplicate-burst.toml"),
        "[[signals]]\nname = \"ip-authors\"\nkey = \"context.ip\"\ncount = \"distinct author\"\nwindow = \"1h\"\n",
    )
    .unwrap();
    eventually("the new signal is counted", Duration::from_secs(20), async || {
        let list = s.get_json("/v1/signals", &s.moderator).await;
        list["complete"] == true
            && list["signals"]
                .as_array()
                .unwrap()
                .iter()
                .any(|x| x["name"] == "ip-authors")
    })
    .await;
    // u0, u1, u9, u7, u8 posted from 10.0.0.1.
    assert_eq!(value(&s, "ip-authors", "web", "10.0.0.1").await, 5);
    s.submit_with("u0", "again", json!({"ip": "10.0.0.1"})).await;
    s.submit_with("u5", "new one", json!({"ip": "10.0.0.1"})).await;
    assert_eq!(value(&s, "ip-authors", "web", "10.0.0.1").await, 6);
    assert_eq!(value(&s, "ip-items", "web", "10.0.0.1").await, 7);

    // One name, one definition: a sidecar redefining it is refused, and
    // the plugin it belongs to keeps serving as it was.
    std::fs::write(
        s.dir().join("plugins/banned-terms.toml"),
        format!(
            "{}\n[[signals]]\nname = \"ip-items\"\nkey = \"author\"\ncount = \"items\"\nwindow = \"1h\"\n",
            std::fs::read_to_string(gavel_tests::repo_root().join("plugins/banned-terms.toml")).unwrap()
        ),
    )
    .unwrap();
    eventually(
        "the conflicting sidecar is refused",
        Duration::from_secs(20),
        async || {
            let plugins = s.get_json("/v1/plugins", &s.moderator).await;
            plugins
                .to_string()
                .contains("signal ip-items is declared differently by plugin flag-ratio")
        },
    )
    .await;
    assert_eq!(
        reading(&s, "ip-items", "web", "10.0.0.1").await["key_field"],
        "context.ip"
    );
    s.stop().await.unwrap();
}

/// E4: the README's walk-through. Eight fresh accounts post links to one
/// shop within minutes, each post unremarkable on its own (one link, no
/// shortener: link-spam allows every one); link-wave holds those posted
/// once more than five new accounts had linked the domain. An old
/// account's post is not counted, and another domain is its own key. A
/// backtest of link-wave on that history replays every decision exactly,
/// from the signal values stored with each snapshot.
async fn a_link_wave_is_held_and_its_backtest_is_faithful(setup: Setup) {
    let s = start(setup).await;
    complete(&s).await;
    let post = async |author: &str, text: &str, age: u32| {
        let id = s.submit_with(author, text, json!({"account_age_days": age})).await;
        s.settled(&id).await;
        let decisions = s.get_json(&format!("/v1/items/{id}"), &s.moderator).await["decisions"].clone();
        let of = |plugin: &str| {
            decisions
                .as_array()
                .unwrap()
                .iter()
                .rev()
                .find(|d| d["plugin"] == plugin)
                .unwrap_or_else(|| panic!("no {plugin} decision: {decisions:#}"))
                .clone()
        };
        (of("link-wave"), of("link-spam"), id)
    };
    let mut held = Vec::new();
    let mut last = String::new();
    for i in 1..=8 {
        let (wave, spam, id) = post(
            &format!("fresh{i}"),
            &format!("great deal https://www.shop.example/p/{i}"),
            1,
        )
        .await;
        assert_eq!(spam["verdict"], "allow", "no per-item rule catches it: {spam}");
        last = id;
        if wave["verdict"] == "hold" {
            held.push(i);
            assert!(
                wave["reason"].as_str().unwrap().contains(&format!(
                    "{i} accounts (signal domain-new-authors) posted links to shop.example"
                )),
                "{wave}"
            );
        }
        if i == 3 {
            // An old account linking the same shop: allowed, and not counted.
            let (wave, _, _) = post("veteran", "I like https://shop.example too", 400).await;
            assert_eq!(wave["verdict"], "allow", "{wave}");
            // Another domain is another key.
            let (wave, _, _) = post("fresh1", "and https://other.example", 1).await;
            assert_eq!(wave["verdict"], "allow", "{wave}");
        }
    }
    assert_eq!(held, [6, 7, 8], "more than five new authors: held");
    assert_eq!(value(&s, "domain-new-authors", "web", "shop.example").await, 8);
    assert_eq!(value(&s, "domain-new-authors", "web", "other.example").await, 1);
    // The console's item page shows what the evaluation read.
    let html = super::console::page_html(&s, &format!("/console/items/{last}")).await;
    assert!(
        html.contains(r#"<li data-signal="domain-new-authors"><strong>domain-new-authors</strong>: <code>shop.example</code> <span class="value">8</span></li>"#),
        "{html}"
    );

    let record = s.backtest(json!({"candidate": "link-wave", "all": true})).await;
    let report = &record["report"];
    assert_eq!(report["sample"]["replayed"], 10, "{report:#}");
    assert_eq!(
        report["fidelity"],
        json!({"checked": 10, "identical": 10}),
        "every decision replayed from the signal values it saw: {report:#}"
    );
    assert_eq!(report["recomputed_signals"], json!({}), "{report:#}");

    // A version counting every author, old accounts too: a signal the
    // stored snapshots never carried, so its values are recomputed from
    // the stored items at each snapshot's time. The old account's post
    // makes the fifth fresh one the sixth author: it is held too.
    std::fs::write(
        s.dir().join("plugins/link-wave.toml"),
        "[[signals]]\nname = \"domain-new-authors\"\nkey = \"link-domain\"\ncount = \"distinct author\"\n\
         window = \"10m\"\nwhen = { context = \"account_age_days\", below = 7 }\n\
         [[signals]]\nname = \"domain-authors\"\nkey = \"link-domain\"\ncount = \"distinct author\"\nwindow = \"10m\"\n\
         [config]\nsignal = \"domain-authors\"\n",
    )
    .unwrap();
    eventually("link-wave reads domain-authors", Duration::from_secs(20), async || {
        let list = s.get_json("/v1/signals", &s.moderator).await;
        list["signals"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x["name"] == "domain-authors")
    })
    .await;
    let record = s.backtest(json!({"candidate": "link-wave", "all": true})).await;
    let report = &record["report"];
    assert_eq!(
        report["recomputed_signals"],
        json!({"domain-authors": 10}),
        "{report:#}"
    );
    assert_eq!(report["flips"]["newly_actioned"], 1, "{report:#}");
    let flipped = &report["flips"]["examples"]["newly_actioned"][0];
    assert!(
        flipped["new_reason"]
            .as_str()
            .unwrap()
            .starts_with("6 accounts (signal domain-authors) posted links to shop.example"),
        "{flipped:#}"
    );
    assert_eq!(
        flipped["excerpt"], "great deal https://www.shop.example/p/5",
        "{flipped:#}"
    );
    s.stop().await.unwrap();
}

/// E3: many processes share one count in Redis: items created through
/// two processes add up in both; Redis killed and restarted empty, the
/// counts are rebuilt from PostgreSQL (by one process), and counting goes
/// on from there.
async fn processes_share_counts_and_rebuild_them_when_redis_loses_them(setup: Setup) {
    assert_eq!(setup, Setup::Distributed);
    let redis = Redis::start();
    let a = start_with(setup, |c| c.redis_url = Some(redis.url())).await;
    let b = second_server(&a).await;
    complete(&a).await;
    complete(&b).await;
    for (i, s) in [&a, &b, &a, &b, &b].into_iter().enumerate() {
        let (status, r) = s.submit_as(&s.client, &item(&format!("p{i}"), "10.0.0.1"), None).await;
        assert_eq!(status, 202, "{r}");
    }
    // One config, one set of tokens: both processes' `web` is one client.
    assert_eq!(value(&a, "ip-items", "web", "10.0.0.1").await, 5);
    assert_eq!(value(&b, "ip-items", "web", "10.0.0.1").await, 5);

    redis.kill();
    redis.restart();
    eventually(
        "the counts are rebuilt after Redis lost them",
        Duration::from_secs(30),
        async || {
            let r = a
                .get("/v1/signals/ip-items", &a.moderator)
                .query(&[("client", "web"), ("key", "10.0.0.1")])
                .send()
                .await
                .unwrap();
            if r.status() != 200 {
                return false;
            }
            let r: Value = r.json().await.unwrap();
            r["complete"] == true && r["value"] == 5
        },
    )
    .await;
    assert_eq!(value(&b, "ip-items", "web", "10.0.0.1").await, 5);
    let (status, _) = b.submit_as(&b.client, &item("p9", "10.0.0.1"), None).await;
    assert_eq!(status, 202);
    assert_eq!(value(&a, "ip-items", "web", "10.0.0.1").await, 6);
    b.stop().await.unwrap();
    a.stop().await.unwrap();
}

/// E5 in Redis: 100,000 distinct values in one key's buckets, counted by
/// Redis's own HyperLogLog (0.81 % standard error), read back within three
/// of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_distinct_counts_hold_100000_values_within_their_error() {
    let spec = gavel::domain::signals::SignalSpec::parse(&gavel::domain::signals::SignalDeclaration {
        name: "ip-authors".into(),
        key: "context.ip".into(),
        count: "distinct author".into(),
        window: "10m".into(),
        when: None,
    })
    .unwrap();
    let prefix = format!("t{}", gavel_tests::server::uuid_ish());
    let url = gavel_tests::servers::shared_redis().url();
    let counts = gavel::signals::RedisCounts::open(spec, &url, &prefix).await.unwrap();
    let now = gavel::clock::now_ms();
    for chunk in 0..100 {
        let observations: Vec<(String, Option<String>)> = (0..1000)
            .map(|i| ("10.0.0.1".to_string(), Some(format!("author-{chunk}-{i}"))))
            .collect();
        // Spread over the window's buckets, as a burst over ten minutes is.
        counts
            .add("web", now - (chunk % 10) * 55_000, &observations)
            .await
            .unwrap();
    }
    let got = counts
        .values("web", &["10.0.0.1".into(), "10.0.0.2".into()], now)
        .await
        .unwrap();
    let error = (got[0] as f64 - 100_000.0).abs() / 100_000.0;
    assert!(
        error < 0.025,
        "estimated {} for 100000 ({:.2} %)",
        got[0],
        error * 100.0
    );
    assert_eq!(got[1], 0);
}

/// E3, one process: a read right after Redis restarted answers from the new connection:
/// the read that finds its connection dropped is made again once the
/// connection manager has reconnected, instead of failing (here the
/// restarted Redis is empty, so the count reads 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_after_redis_restarted_answers_from_the_new_connection() {
    let spec = gavel::domain::signals::SignalSpec::parse(&gavel::domain::signals::SignalDeclaration {
        name: "ip-items".into(),
        key: "context.ip".into(),
        count: "items".into(),
        window: "1h".into(),
        when: None,
    })
    .unwrap();
    let redis = Redis::start();
    let counts = gavel::signals::RedisCounts::open(spec, &redis.url(), "t")
        .await
        .unwrap();
    let now = gavel::clock::now_ms();
    let key = ["10.0.0.1".to_string()];
    counts.add("web", now, &[("10.0.0.1".into(), None)]).await.unwrap();
    assert_eq!(counts.values("web", &key, now).await.unwrap(), vec![1]);
    redis.kill();
    redis.restart();
    assert_eq!(counts.values("web", &key, now).await.unwrap(), vec![0]);
}

gavel_tests::both!(
    each_item_is_counted_once_and_rebuilt_from_the_record,
    a_link_wave_is_held_and_its_backtest_is_faithful,
);
gavel_tests::matrix!([cluster: Cluster] a_link_wave_is_held_and_its_backtest_is_faithful);
gavel_tests::matrix!([two_processes: Distributed] processes_share_counts_and_rebuild_them_when_redis_loses_them);
