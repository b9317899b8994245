//! B12 (docs/BENCHMARKS.md): the moderator console's pages, signed in as a
//! browser is, against one `gavel serve` on the embedded default (SQLite)
//! holding `Sizes::console_items` items, a tenth of them held for review.

use crate::report::Figure;
use crate::system::{self, Gavel, Sizes};
use reqwest::StatusCode;
use reqwest::header::{COOKIE, SET_COOKIE};
use serde_json::{Value, json};
use std::path::Path;
use std::time::{Duration, Instant};

/// The most rows one queue page may render (the console's page size).
const QUEUE_PAGE_ROWS: usize = 50;

/// Items cycle over this many authors, so that an author has a history for
/// the item page's author panel and the search by author finds several rows.
const AUTHORS: usize = 1_000;

/// B4's tuning, so that the seeded backlog drains quickly; and degraded mode
/// off, so that seeding faster than the rules judge does not hold plain
/// items for review and every status is the rules' own.
const CONFIG: &str = "[evaluation]\nconcurrency = 512\nbatch = 256\npoll_interval_ms = 1\ndegraded_lag_ms = 86400000\n";

/// What a page's answer must be, besides 200.
#[derive(Clone, Copy)]
enum Expect {
    /// The page, whatever rows it shows.
    Page,
    /// At least one `data-item=` row (a search that found nothing measures nothing).
    Rows,
    /// One page of the queue: 1 to `QUEUE_PAGE_ROWS` rows, however many are held.
    QueuePage,
}

/// B12: p50 and p99 of sequential GETs of each console page.
pub async fn b12(gavel_bin: &Path, sizes: Sizes) -> anyhow::Result<Vec<Figure>> {
    let dir = tempfile::tempdir()?;
    let gavel = Gavel::start(gavel_bin, dir.path(), &system::rust_plugins(), CONFIG).await?;
    let n = sizes.console_items;
    let held = seed(&gavel, n).await?;
    // Redirects are not followed: a page answering 303 to the login page
    // (a lost session) must count as a failure, not as the login page's 200.
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()?;
    let session = sign_in(&http, &gavel.url).await?;
    let pages = [
        ("queue (oldest first)", "/console/queue".to_string(), Expect::QueuePage),
        (
            "queue sorted by flags",
            "/console/queue?sort=flags".into(),
            Expect::QueuePage,
        ),
        (
            "queue of plugin link-spam",
            "/console/queue?plugin=link-spam".into(),
            Expect::QueuePage,
        ),
        (
            "item page (a held item)",
            format!("/console/items/{}", held.id),
            Expect::Page,
        ),
        ("plugins", "/console/plugins".into(), Expect::Page),
        ("operations", "/console/operations".into(), Expect::Page),
        (
            "search by author",
            format!("/console/search?q={}", held.author),
            Expect::Rows,
        ),
    ];
    let mut figures = Vec::new();
    for (name, path, expect) in pages {
        let timed = time_page(&http, &gavel.url, &session, &path, expect, sizes.console_gets).await;
        let mut note = format!(
            "p50 {:.2} ms over {} sequential GETs of {path}; largest answer {:.1} KiB",
            timed.p50,
            sizes.console_gets,
            timed.largest as f64 / 1024.0
        );
        if figures.is_empty() {
            note = format!("{n} items stored (SQLite), {} held for review; {note}", held.count);
        }
        if let Some(first) = &timed.first_failure {
            eprintln!("B12: GET {path}: {} wrong answers, first: {first}", timed.failures);
            note = format!("FAILED: {} wrong answers, first: {first}; {note}", timed.failures);
        }
        figures.push(
            Figure::new("B12", format!("console {name}, p99"), timed.p99, "ms")
                .goal("≤ 100 ms p99", timed.failures == 0 && timed.p99 <= 100.0)
                .note(note),
        );
    }
    Ok(figures)
}

/// The oldest item held for review, and how many are held.
struct Held {
    id: String,
    author: String,
    count: usize,
}

/// Stores `n` items through the batch API, every 10th with four links so
/// that link-spam holds it, and waits until the rules have judged them all.
async fn seed(gavel: &Gavel, n: usize) -> anyhow::Result<Held> {
    let http = reqwest::Client::new();
    let before = system::committed(&http, &gavel.url).await?;
    let ids = system::seed_items(&http, &gavel.url, n, |tag, i| {
        let links = if i.is_multiple_of(10) {
            ": see http://a.example http://b.example http://c.example http://d.example"
        } else {
            ""
        };
        // A fixed-width number: no author is a prefix of another.
        json!({
            "kind": "post",
            "author": format!("{tag}-author-{:04}", i % AUTHORS),
            "text": format!("console post {tag} {i}{links}")
        })
    })
    .await?;
    anyhow::ensure!(ids.len() == n, "B12: seeding stored {} of {n} items", ids.len());
    settle(&http, gavel, before + n as u64).await?;
    let held = held(&http, &gavel.url).await?;
    anyhow::ensure!(
        held.count >= n.div_ceil(10),
        "B12: only {} of {n} items are held for review; every 10th (four links) should be, by link-spam",
        held.count
    );
    Ok(held)
}

/// Waits until `target` evaluations are committed (B4's sign that the
/// items settled), at most ten minutes.
async fn settle(http: &reqwest::Client, gavel: &Gavel, target: u64) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let done = system::committed(http, &gavel.url).await?;
        if done >= target {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "B12: the queue did not drain in 10 minutes: {done} of {target} evaluations committed; see {}",
            gavel.dir.join("gavel.log").display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Reads the whole review queue through the API, 500 items a page.
async fn held(http: &reqwest::Client, url: &str) -> anyhow::Result<Held> {
    let (mut count, mut oldest, mut cursor) = (0, None, None::<String>);
    loop {
        let mut request = http
            .get(format!("{url}/v1/review-queue"))
            .bearer_auth(system::MODERATOR_TOKEN)
            .query(&[("limit", "500")]);
        if let Some(c) = &cursor {
            request = request.query(&[("cursor", c)]);
        }
        let page: Value = request.send().await?.error_for_status()?.json().await?;
        let items = page["items"].as_array().cloned().unwrap_or_default();
        count += items.len();
        oldest = oldest.or_else(|| items.first().cloned());
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_string()),
            None => break,
        }
    }
    let oldest = oldest.ok_or_else(|| anyhow::anyhow!("B12: no item is held for review"))?;
    let field = |name: &str| oldest[name].as_str().unwrap_or_default().to_string();
    Ok(Held {
        id: field("id"),
        author: field("author"),
        count,
    })
}

/// Signs in as the moderator the way a browser does: the login page's
/// `gavel_login` cookie and the form's csrf field, then the `gavel_session`
/// cookie of the 303 that answers the form. The session cookie's value.
async fn sign_in(http: &reqwest::Client, url: &str) -> anyhow::Result<String> {
    let page = http.get(format!("{url}/console/login")).send().await?;
    anyhow::ensure!(
        page.status() == StatusCode::OK,
        "GET /console/login answered {}",
        page.status()
    );
    let login = cookie(&page, "gavel_login")?;
    let html = page.text().await?;
    let csrf =
        login_form_csrf(&html).ok_or_else(|| anyhow::anyhow!("GET /console/login: no csrf field in form#login"))?;
    anyhow::ensure!(
        csrf == login,
        "the login form's csrf field is not the gavel_login cookie"
    );
    let answer = http
        .post(format!("{url}/console/login"))
        .header(COOKIE, format!("gavel_login={login}"))
        .form(&[("token", system::MODERATOR_TOKEN), ("csrf", csrf.as_str())])
        .send()
        .await?;
    anyhow::ensure!(
        answer.status() == StatusCode::SEE_OTHER,
        "POST /console/login answered {}",
        answer.status()
    );
    cookie(&answer, "gavel_session")
}

/// The value of the cookie `name` that `answer` sets.
fn cookie(answer: &reqwest::Response, name: &str) -> anyhow::Result<String> {
    answer
        .headers()
        .get_all(SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(|v| {
            let pair = v.split(';').next()?.trim();
            pair.strip_prefix(name)?.strip_prefix('=').map(str::to_string)
        })
        .ok_or_else(|| anyhow::anyhow!("{} set no {name} cookie", answer.url().path()))
}

/// The `value` of the `csrf` input of `form#login`, its attributes in any
/// order (the page may carry other csrf fields, such as a logout form's).
fn login_form_csrf(html: &str) -> Option<String> {
    let form = &html[html.find(r#"id="login""#)?..];
    let at = form.find(r#"name="csrf""#)?;
    let tag = &form[form[..at].rfind('<')?..at + form[at..].find('>')?];
    let value = &tag[tag.find(r#"value=""#)? + r#"value=""#.len()..];
    Some(value[..value.find('"')?].to_string())
}

/// What `gets` sequential GETs of one page measured: latency percentiles
/// (ms), the largest answer (bytes), and the answers that were not what the
/// page must be (a transport error, a status other than 200, wrong rows).
struct Timed {
    p50: f64,
    p99: f64,
    largest: usize,
    failures: usize,
    first_failure: Option<String>,
}

/// Times `gets` sequential GETs of `path` with the session cookie, from
/// sending the request to the last byte of the answer.
async fn time_page(http: &reqwest::Client, url: &str, session: &str, path: &str, expect: Expect, gets: usize) -> Timed {
    let mut latencies = Vec::with_capacity(gets);
    let (mut largest, mut failures, mut first_failure) = (0, 0, None);
    for _ in 0..gets {
        let started = Instant::now();
        let answer = get(http, &format!("{url}{path}"), session).await;
        latencies.push(started.elapsed().as_secs_f64() * 1000.0);
        let checked = match answer {
            Ok((status, body)) => {
                largest = largest.max(body.len());
                check(status, &body, expect)
            }
            Err(e) => Err(format!("{e:?}")),
        };
        if let Err(e) = checked {
            failures += 1;
            first_failure.get_or_insert(e);
        }
    }
    latencies.sort_by(f64::total_cmp);
    let p = |q: f64| latencies[((latencies.len() - 1) as f64 * q) as usize];
    Timed {
        p50: p(0.50),
        p99: p(0.99),
        largest,
        failures,
        first_failure,
    }
}

/// One GET with the session cookie: the status and the whole body.
async fn get(http: &reqwest::Client, url: &str, session: &str) -> reqwest::Result<(StatusCode, String)> {
    let answer = http
        .get(url)
        .header(COOKIE, format!("gavel_session={session}"))
        .send()
        .await?;
    let status = answer.status();
    Ok((status, answer.text().await?))
}

/// Whether an answer is what the page must be.
fn check(status: StatusCode, body: &str, expect: Expect) -> Result<(), String> {
    if status != StatusCode::OK {
        return Err(format!("answered {status}"));
    }
    let rows = body.matches("data-item=").count();
    match expect {
        Expect::Rows if rows == 0 => Err("no data-item= row".into()),
        Expect::QueuePage if !(1..=QUEUE_PAGE_ROWS).contains(&rows) => Err(format!(
            "{rows} data-item= rows; a queue page must show 1 to {QUEUE_PAGE_ROWS}"
        )),
        _ => Ok(()),
    }
}
