//! The moderator console (/console) in a real browser, on both setups:
//! `tests/console/e2e.mjs` drives Debian's Chromium through playwright-core
//! as two moderators (sign-in, CSRF, concurrent claims, an item carrying
//! markup, a decision by keyboard, a stale page, submit & next, skip, the
//! plugins, operations and search pages, sign-out). This test fills the
//! review queue, runs it, and checks through the JSON API that what the
//! browser did is what the store holds. Screenshots are kept in
//! `target/console-screenshots/<setup>/`.

use gavel::config::{Role, TokenConfig};
use gavel_tests::server::{Setup, TestServer};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

/// Debian's package; the test never downloads a browser.
const CHROMIUM: &str = "/usr/bin/chromium";

/// Four links: the link-spam example rule holds the item for review.
const LINKS: &str = "see http://a.example http://b.example http://c.example http://d.example";

/// What the console must show as text and never run.
const XSS: &str = "<img src=x onerror=alert(1)> <script>alert(2)</script>";

/// The Node project of the browser test.
fn project() -> PathBuf {
    gavel_tests::repo_root().join("tests/console")
}

/// `npm ci` in `tests/console`, once per test binary, unless its
/// node_modules is at least as new as the lock file (npm ci writes
/// `node_modules/.package-lock.json` last, so its age is the install's).
pub(crate) fn npm_ci() -> &'static Result<(), String> {
    static INSTALLED: OnceLock<Result<(), String>> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        let dir = project();
        let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
        let installed = modified(&dir.join("node_modules/.package-lock.json"));
        if matches!((installed, modified(&dir.join("package-lock.json"))), (Some(i), Some(l)) if i >= l) {
            return Ok(());
        }
        let out = std::process::Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund", "--loglevel=error"])
            .current_dir(&dir)
            .output()
            .map_err(|e| format!("running npm (Node.js 20 or later with npm; `cargo xtask test` installs it): {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "npm ci in {} failed ({}):\n{}",
                dir.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(())
    })
}

/// Submits `text` by `author` and waits until the rules have held it.
async fn held(s: &TestServer, author: &str, text: &str) -> String {
    let id = s.submit(author, text).await;
    let item = s.settled(&id).await;
    assert_eq!(item["status"], "held_for_review", "{item:#}");
    id
}

/// The item's transitions made by moderators.
fn moderator_transitions(item: &Value) -> Vec<&Value> {
    item["transitions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["actor"] == "moderator")
        .collect()
}

/// Runs `e2e.mjs` against `s` and returns the JSON line it ends with.
async fn run_browser(s: &TestServer, mod2: &str, xss: &str, appeal: &str) -> Value {
    let setup = s.setup;
    let shots = gavel_tests::repo_root()
        .join("target/console-screenshots")
        .join(format!("{setup:?}").to_lowercase());
    // Screenshots of an earlier run must not pass for this one's.
    let _ = std::fs::remove_dir_all(&shots);
    let mut node = tokio::process::Command::new("node");
    node.arg(project().join("e2e.mjs"))
        .env("GAVEL_URL", &s.url)
        .env("MOD_TOKEN", &s.moderator)
        .env("MOD2_TOKEN", mod2)
        .env("CLIENT_TOKEN", &s.client)
        .env("XSS_ITEM", xss)
        .env("APPEAL_ITEM", appeal)
        .env("SHOTS", &shots)
        .env("CHROMIUM", CHROMIUM)
        // On the timeout node is killed (and the browser with it), not left behind.
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(300), node.output())
        .await
        .expect("the browser test finishes within 5 minutes")
        .expect("node runs (`cargo xtask test` installs Node.js)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the browser test failed on {setup:?} ({}); screenshots in {}\n{}{stdout}",
        out.status,
        shots.display(),
        String::from_utf8_lossy(&out.stderr),
    );
    let line = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(line).unwrap_or_else(|e| panic!("the last line is not JSON ({e}): {stdout}"))
}

/// A test server with a second moderator token, `mod2`; returns that token.
async fn with_second_moderator(setup: Setup) -> (TestServer, String) {
    let token = gavel::config::new_token();
    let mod2 = token.clone();
    let s = TestServer::start_with(setup, |c| {
        c.tokens.push(TokenConfig {
            name: "mod2".into(),
            token,
            role: Role::Moderator,
        });
    })
    .await;
    (s, mod2)
}

async fn moderators_work_the_queue_in_a_browser(setup: Setup) {
    assert!(
        Path::new(CHROMIUM).is_file(),
        "{CHROMIUM} is missing: install Debian's `chromium` package, or run `cargo xtask test`, which installs it"
    );
    if let Err(e) = npm_ci() {
        panic!("{e}");
    }
    let (s, mod2) = with_second_moderator(setup).await;
    // Claims take the oldest held item first, and each item is held before
    // the next is submitted: the XSS item, held last, is never claimed
    // (which would decide it), only opened.
    for n in 0..7 {
        held(&s, &format!("reviewer-{n}"), &format!("{LINKS} number {n}")).await;
    }
    let xss = held(&s, "reviewer-xss", &format!("{LINKS} {XSS}")).await;
    // A rejection by banned-terms, appealed by its author.
    let appealed = s.submit("appellant", "buy scamcoin now").await;
    assert_eq!(s.settled(&appealed).await["status"], "rejected");
    let r = s
        .post(&format!("/v1/items/{appealed}/appeals"), &s.client)
        .json(&json!({"appellant": "author", "text": "I was warning people about scamcoin"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());

    let report = run_browser(&s, &mod2, &xss, &appealed).await;
    let id = |v: &Value| v.as_str().unwrap_or_else(|| panic!("{report}")).to_string();
    let (keyboard, stale) = (id(&report["keyboard_decided"]), id(&report["stale_item"]));
    let claimed = [id(&report["claimed"][0]), id(&report["claimed"][1])];
    assert_ne!(claimed[0], claimed[1], "two moderators were given one item");
    assert_eq!(claimed, [keyboard.clone(), stale.clone()], "{report}");
    assert!(report["skipped"].is_string(), "{report}");

    // The decision by keyboard: mod made the item visible, which overturned link-spam's hold.
    let item = s.get_json(&format!("/v1/items/{keyboard}"), &s.moderator).await;
    let last = item["transitions"].as_array().unwrap().last().unwrap();
    assert_eq!(last["to_status"], "visible", "{item:#}");
    assert_eq!(last["actor"], "moderator");
    assert_eq!(last["actor_name"], "mod");
    let hold = item["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["plugin"] == "link-spam" && d["verdict"] == "hold")
        .unwrap_or_else(|| panic!("no hold by link-spam: {item:#}"));
    assert!(!hold["reversed_at"].is_null(), "the reversal is not counted: {item:#}");

    // The stale page: mod's rejection is the one moderator transition; mod2's submit wrote nothing.
    let item = s.get_json(&format!("/v1/items/{stale}"), &s.moderator).await;
    let by_moderators = moderator_transitions(&item);
    assert_eq!(by_moderators.len(), 1, "{item:#}");
    assert_eq!(by_moderators[0]["to_status"], "rejected");
    assert_eq!(by_moderators[0]["actor_name"], "mod");
    assert_eq!(item["transitions"].as_array().unwrap().last(), Some(by_moderators[0]));

    // The appeal mod2 overturned by keyboard: closed by mod2, in one
    // transaction with the item's transition.
    assert_eq!(report["appeal_overturned"], json!(appealed), "{report}");
    let appeals = s.get_json(&format!("/v1/items/{appealed}/appeals"), &s.moderator).await;
    assert_eq!(
        (appeals[0]["status"].as_str(), appeals[0]["closed_by"].as_str()),
        (Some("overturned"), Some("mod2")),
        "{appeals:#}"
    );
    let item = s.get_json(&format!("/v1/items/{appealed}"), &s.moderator).await;
    assert_eq!(item["status"], "visible");
    assert_eq!(appeals[0]["outcome_version"], item["version"]);

    // Shown, refused without CSRF, searched: never decided.
    let item = s.get_json(&format!("/v1/items/{xss}"), &s.moderator).await;
    assert_eq!(item["status"], "held_for_review", "{item:#}");
    assert!(moderator_transitions(&item).is_empty(), "{item:#}");
    s.stop().await.unwrap();
}

/// The value of cookie `name` a response sets.
fn set_cookie(r: &reqwest::Response, name: &str) -> Option<String> {
    r.headers()
        .get_all(reqwest::header::SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .filter_map(|v| v.split(';').next()?.split_once('='))
        .find(|(n, _)| *n == name)
        .map(|(_, v)| v.to_string())
}

/// The HTML of console `page`, fetched over plain HTTP after signing in as
/// `s`'s moderator.
pub(crate) async fn page_html(s: &TestServer, page: &str) -> String {
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let (session, _) = sign_in(&http, &s.url, page, &s.moderator).await;
    http.get(format!("{}{page}", s.url))
        .header("cookie", format!("gavel_session={}", session.unwrap()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// Signs in as `token` over plain HTTP, starting from `page`; returns the
/// session cookie and where the sign-in sent the browser.
pub(crate) async fn sign_in(http: &reqwest::Client, url: &str, page: &str, token: &str) -> (Option<String>, String) {
    let r = http.get(format!("{url}{page}")).send().await.unwrap();
    assert_eq!(r.status(), 303, "{page} without a session goes to sign-in");
    let login = r.headers()["location"].to_str().unwrap().to_string();
    let r = http.get(format!("{url}{login}")).send().await.unwrap();
    let csrf = set_cookie(&r, "gavel_login").unwrap();
    let html = r.text().await.unwrap();
    let next = html
        .split("name=\"next\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap()
        .replace("&amp;", "&");
    let r = http
        .post(format!("{url}/console/login"))
        .header("cookie", format!("gavel_login={csrf}"))
        .form(&[("token", token), ("csrf", &csrf), ("next", &next)])
        .send()
        .await
        .unwrap();
    let to = r
        .headers()
        .get("location")
        .map_or(String::new(), |l| l.to_str().unwrap().into());
    (set_cookie(&r, "gavel_session"), to)
}

/// Sign-in without a browser: a link opened signed out comes back to its
/// page after sign-in; the sign-in form needs its CSRF cookie; a session
/// ends when its moderator's token is removed from the configuration.
async fn sessions_follow_their_token(setup: Setup) {
    let (s, mod2) = with_second_moderator(setup).await;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let (session, to) = sign_in(&http, &s.url, "/console/plugins?x=1", &mod2).await;
    let session = session.expect("a session cookie");
    assert_eq!(to, "/console/plugins?x=1", "back to the page the link named");
    let page = |cookie: String| {
        http.get(format!("{}/console/queue", s.url))
            .header("cookie", cookie)
            .send()
    };
    assert_eq!(page(format!("gavel_session={session}")).await.unwrap().status(), 200);
    // Without the sign-in page's cookie the form is refused.
    let r = http
        .post(format!("{}/console/login", s.url))
        .form(&[("token", mod2.as_str()), ("csrf", "0".repeat(64).as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    assert!(set_cookie(&r, "gavel_session").is_none());
    // A client token is not a moderator's.
    let (none, _) = sign_in(&http, &s.url, "/console/queue", &s.client).await;
    assert!(none.is_none());
    // mod2's token is removed: the session it signed in ends with it.
    let (mut config, dir) = s.stop_keeping_dir().await;
    config.tokens.retain(|t| t.name != "mod2");
    let s = TestServer::serve(dir, setup, config, |_| {}).await;
    let r = http
        .get(format!("{}/console/queue", s.url))
        .header("cookie", format!("gavel_session={session}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303, "a revoked moderator's session still works");
    s.stop().await.unwrap();
}

/// `GET path` with the session cookie `session`, redirects not followed.
async fn console_get(http: &reqwest::Client, url: &str, path: &str, session: &str) -> reqwest::Response {
    http.get(format!("{url}{path}"))
        .header("cookie", format!("gavel_session={session}"))
        .send()
        .await
        .unwrap()
}

fn without_redirects() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// A leaked moderator token is given a new secret under the same name and
/// gavel restarts: the session signed in with the old secret is sent to
/// sign-in, the old secret signs in no more, and the new one does.
async fn a_rotated_secret_ends_the_sessions_of_the_old_one(setup: Setup) {
    let (s, leaked) = with_second_moderator(setup).await;
    let http = without_redirects();
    let (session, _) = sign_in(&http, &s.url, "/console/queue", &leaked).await;
    let session = session.expect("a session cookie");
    assert_eq!(
        console_get(&http, &s.url, "/console/queue", &session).await.status(),
        200
    );

    let (mut config, dir) = s.stop_keeping_dir().await;
    let rotated = gavel::config::new_token();
    let mod2 = config.tokens.iter_mut().find(|t| t.name == "mod2").unwrap();
    mod2.token = rotated.clone();
    let s = TestServer::serve(dir, setup, config, |_| {}).await;

    let r = console_get(&http, &s.url, "/console/queue", &session).await;
    assert_eq!(r.status(), 303, "the old secret's session still works after rotation");
    let to = r.headers()["location"].to_str().unwrap();
    assert!(to.starts_with("/console/login"), "{to}");
    let (none, _) = sign_in(&http, &s.url, "/console/queue", &leaked).await;
    assert!(none.is_none(), "the old secret still signs in");
    let (fresh, _) = sign_in(&http, &s.url, "/console/queue", &rotated).await;
    let fresh = fresh.expect("the new secret signs in");
    assert_eq!(console_get(&http, &s.url, "/console/queue", &fresh).await.status(), 200);
    s.stop().await.unwrap();
}

/// The quick start's setup: no tokens in the configuration, so gavel reads
/// them from `DATA_DIR/tokens.toml`. Search by author and by external id
/// finds the client's items there too (the search spans every client token
/// gavel accepts, wherever the tokens come from).
async fn search_spans_the_clients_of_tokens_in_the_data_directory(setup: Setup) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let mut file = String::new();
    for (name, role) in [("web", "client"), ("app", "client"), ("mod", "moderator")] {
        let token = gavel::config::new_token();
        file.push_str(&format!(
            "[[tokens]]\nname = \"{name}\"\ntoken = \"{token}\"\nrole = \"{role}\"\n"
        ));
    }
    std::fs::write(data.join("tokens.toml"), file).unwrap();
    let s = TestServer::start_in(dir, setup, |c| c.tokens.clear()).await;
    assert!(s.config.tokens.is_empty(), "no token is configured");

    let body = serde_json::json!({
        "kind": "post", "author": "quick-start-author", "text": "hello", "external_id": "quick-start-ext"
    });
    let (status, item) = s.submit_as(&s.client, &body, None).await;
    assert_eq!(status, 202, "{item}");
    let id = item["id"].as_str().unwrap().to_string();

    let http = without_redirects();
    let (session, _) = sign_in(&http, &s.url, "/console/queue", &s.moderator).await;
    let session = session.expect("the moderator of tokens.toml signs in");
    for q in ["quick-start-author", "quick-start-ext", id.as_str()] {
        let r = console_get(&http, &s.url, &format!("/console/search?q={q}"), &session).await;
        assert_eq!(r.status(), 200);
        let html = r.text().await.unwrap();
        assert!(
            html.contains(&format!("data-item=\"{id}\"")),
            "searching {q:?} does not find the item:\n{html}"
        );
    }
    s.stop().await.unwrap();
}

gavel_tests::both!(
    moderators_work_the_queue_in_a_browser,
    sessions_follow_their_token,
    a_rotated_secret_ends_the_sessions_of_the_old_one,
    search_spans_the_clients_of_tokens_in_the_data_directory
);
