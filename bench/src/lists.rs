//! B14 (docs/BENCHMARKS.md): lists of 100,000 entries of each kind, in
//! this process: checking and compiling a version (what an
//! edit costs before it is written, and what every other process pays when
//! its poll picks the edit up), and one lookup in the compiled matcher
//! (`host/src/lists/matcher.rs`), hits and misses alike: as the host makes
//! it, and from inside a rule (the `list-probe` fixture asking through
//! `gavel:rules/lists`, the call across the sandbox included). And end
//! to end: B4's embedded run with the example rules reading their terms and
//! shorteners from lists, against the same content in their sidecar config.

use crate::report::Figure;
use crate::system::{CLIENT_TOKEN, Gavel, MODERATOR_TOKEN, Sizes, rust_plugins, settle_runs_with, wait_settled};
use gavel::lists::{self, CompiledList, Entry, ListKind, ListsConfig, ServedLists};
use gavel::rules::{InstancePool, RuleEngine, RuntimeLimits, snapshot_from_spec};
use gavel_plugin_sdk::spec::SnapshotSpec;
use serde_json::{Value, json};
use std::hint::black_box;
use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

/// Entries per list.
const ENTRIES: usize = 100_000;

/// `n` distinct entries of `kind`, shaped like real ones.
fn entries(kind: ListKind, n: usize) -> Vec<Entry> {
    (0..n)
        .map(|i| {
            Entry::new(match kind {
                ListKind::Terms => format!("scam{i} offer{}", i % 97),
                ListKind::Patterns => format!(r"promo{i}[a-z]{{2}}"),
                ListKind::Domains => format!("h{i}.shortener{}.example", i % 1000),
                ListKind::Strings => format!("sha256:{i:064x}"),
                // 50,000 distinct /24s: 10.0.0.0/24 to 10.195.79.0/24.
                ListKind::Cidrs if i % 2 == 0 => format!("10.{}.{}.0/24", (i / 2) / 256, (i / 2) % 256),
                // And 50,000 distinct /48s: 2001:db8:0::/48 to 2001:db8:c34f::/48.
                ListKind::Cidrs => format!("2001:db8:{:x}::/48", i / 2),
            })
        })
        .collect()
}

/// Checks and compiles `n` entries: the version, and the time it took.
fn compile(kind: ListKind, n: usize) -> (Result<CompiledList, String>, f64) {
    let raw = entries(kind, n);
    let limits = ListsConfig::default();
    let start = Instant::now();
    // What `PUT /v1/lists/{name}` does before it writes: canonical form,
    // digest, matcher.
    let compiled = lists::check(&kind.to_string(), kind, raw, &limits).map(|checked| CompiledList {
        version: 1,
        ..checked.compiled
    });
    (
        compiled.map_err(|e| e.to_string()),
        start.elapsed().as_secs_f64() * 1000.0,
    )
}

/// Mean µs of `lookup` over `probes`, cycled `rounds` times.
fn time_lookups<T>(probes: &[T], rounds: usize, mut lookup: impl FnMut(&T) -> bool) -> (f64, usize) {
    let mut hits = 0;
    let start = Instant::now();
    for _ in 0..rounds {
        for p in probes {
            hits += usize::from(black_box(lookup(black_box(p))));
        }
    }
    let per = start.elapsed().as_secs_f64() * 1e6 / (rounds * probes.len()) as f64;
    (per, hits)
}

/// A ~1 KB post; `hit` puts a listed term in its middle.
fn post(hit: bool) -> String {
    let mut words: Vec<String> = (0..150).map(|i| format!("word{i}")).collect();
    if hit {
        // Entry 4242 of `entries`, as a writer would type it.
        words[75] = format!("SCAM4242, Offer{}!", 4242 % 97);
    }
    words.join(" ")
}

fn lookup(list: &CompiledList, kind: ListKind, rounds: usize) -> (f64, usize, &'static str) {
    match kind {
        ListKind::Terms => {
            let texts = [post(true), post(false)];
            let (us, hits) = time_lookups(&texts, rounds / 50, |t| !list.find_terms(t).unwrap().is_empty());
            (us, hits, "find_terms over a 1 KB text")
        }
        ListKind::Patterns => {
            let texts = [
                "buy promo4242zz now".to_string(),
                "a calm sentence about gardening".to_string(),
            ];
            let (us, hits) = time_lookups(&texts, rounds / 50, |t| !list.match_patterns(t).unwrap().is_empty());
            (us, hits, "match_patterns over a short text")
        }
        ListKind::Domains => {
            let hosts = [
                "www.h4242.shortener242.example",
                "example.org",
                "a.b.c.h99.shortener99.example",
            ];
            let (us, hits) = time_lookups(&hosts, rounds, |h| list.match_domain(h).unwrap().is_some());
            (us, hits, "match_domain")
        }
        ListKind::Strings => {
            let values = [format!("sha256:{:064x}", 4242), format!("sha256:{:064x}", ENTRIES + 1)];
            let (us, hits) = time_lookups(&values, rounds, |v| list.contains(v).unwrap());
            (us, hits, "contains")
        }
        ListKind::Cidrs => {
            let ips: Vec<IpAddr> = ["10.16.146.7", "192.0.2.1", "2001:db8:1093::1", "2001:db9::1"]
                .iter()
                .map(|s| s.parse().unwrap())
                .collect();
            let (us, hits) = time_lookups(&ips, rounds, |ip| list.in_cidrs(*ip).unwrap().is_some());
            (us, hits, "in_cidrs")
        }
    }
}

/// Lookups per evaluation when timing them from inside a rule.
const IN_RULE_REPEAT: usize = 100;

/// What the rule asks about for `kind`, one hit and one miss: the context
/// of its snapshot besides the list's name and the repeat count.
fn in_rule_probes(kind: ListKind) -> [(String, Vec<(&'static str, String)>); 2] {
    match kind {
        ListKind::Terms => [(post(true), vec![]), (post(false), vec![])],
        ListKind::Patterns => [
            ("buy promo4242zz now".into(), vec![]),
            ("a calm sentence about gardening".into(), vec![]),
        ],
        ListKind::Domains => [
            (String::new(), vec![("host", "www.h4242.shortener242.example".into())]),
            (String::new(), vec![("host", "example.org".into())]),
        ],
        ListKind::Strings => [
            (String::new(), vec![("value", format!("sha256:{:064x}", 4242))]),
            (String::new(), vec![("value", format!("sha256:{:064x}", ENTRIES + 1))]),
        ],
        ListKind::Cidrs => [
            (String::new(), vec![("ip", "10.16.146.7".into())]),
            (String::new(), vec![("ip", "2001:db9::1".into())]),
        ],
    }
}

/// Mean µs of one lookup of `kind` from inside a rule: evaluations asking
/// [`IN_RULE_REPEAT`] times against the same evaluations asking nothing
/// (reused instances, so instantiation does not blur the difference).
fn in_rule(engine: &RuleEngine, probe: &gavel::rules::LoadedPlugin, kind: ListKind, evaluations: usize) -> f64 {
    let pool = InstancePool::new(1);
    let limits = engine.limits();
    let snapshot = |text: &str, extra: &[(&str, String)], repeat: usize| {
        let mut context: serde_json::Map<String, serde_json::Value> =
            extra.iter().map(|(k, v)| (k.to_string(), v.clone().into())).collect();
        context.insert(kind.to_string(), kind.to_string().into());
        context.insert("repeat".into(), repeat.to_string().into());
        let spec: SnapshotSpec =
            serde_json::from_value(serde_json::json!({"item": {"text": text, "context": context}})).expect("a spec");
        snapshot_from_spec(&spec)
    };
    let time = |repeat: usize| {
        let snapshots: Vec<_> = in_rule_probes(kind)
            .iter()
            .map(|(text, extra)| snapshot(text, extra, repeat))
            .collect();
        let start = Instant::now();
        for i in 0..evaluations {
            let e = engine
                .evaluate_reusing(
                    probe,
                    &pool,
                    black_box(&snapshots[i % 2]),
                    limits.async_deadline,
                    limits.memory_bytes,
                )
                .expect("the host runs it");
            assert!(e.decision.is_some(), "{kind}: {e:?}");
        }
        start.elapsed().as_secs_f64() * 1e6 / evaluations as f64
    };
    let (asking, idle) = (time(IN_RULE_REPEAT), time(0));
    (asking - idle) / IN_RULE_REPEAT as f64
}

/// The goal for one lookup of `kind`, in µs: terms scan a 1 KB text.
fn bound(kind: ListKind) -> f64 {
    if kind == ListKind::Terms { 5.0 } else { 2.0 }
}

pub fn b14(quick: bool) -> Vec<Figure> {
    let rounds = if quick { 20_000 } else { 200_000 };
    let evaluations = if quick { 50 } else { 400 };
    let mut figures = Vec::new();
    let served = Arc::new(ServedLists::new(ListsConfig::default(), Arc::default()));
    for kind in ListKind::ALL.iter().copied() {
        let (compiled, ms) = compile(kind, ENTRIES);
        let list = match compiled {
            Ok(list) => list,
            Err(e) => {
                figures.push(
                    Figure::new("B14", format!("{kind}: compile 100,000 entries"), ms, "ms")
                        .goal("≤ 1000 ms", false)
                        .note(format!("refused: {e}")),
                );
                continue;
            }
        };
        figures.push(
            Figure::new("B14", format!("{kind}: check and compile 100,000 entries"), ms, "ms")
                .goal("≤ 1000 ms", ms <= 1000.0),
        );
        let (us, hits, what) = lookup(&list, kind, rounds);
        let bound = bound(kind);
        figures.push(
            Figure::new("B14", format!("{kind}: {what}, 100,000 entries"), us, "µs")
                .goal(format!("≤ {bound} µs"), us <= bound)
                .note(format!("{hits} hits (half or more of the probes are misses)")),
        );
        served.install(Arc::new(list));
    }
    let engine = RuleEngine::new(RuntimeLimits::default())
        .expect("an engine")
        .with_lists(served.clone());
    let bytes = std::fs::read(gavel_tests::guests::LIST_PROBE).expect("the list-probe fixture was built");
    let probe = engine
        .load_bytes(std::path::Path::new("list-probe.wasm"), &bytes)
        .expect("list-probe loads");
    for kind in ListKind::ALL.iter().copied() {
        if served.get(&kind.to_string()).is_none() {
            continue;
        }
        let us = in_rule(&engine, &probe, kind, evaluations);
        let bound = bound(kind);
        let text = if matches!(kind, ListKind::Terms | ListKind::Patterns) {
            " (the text crosses the sandbox with each call)"
        } else {
            ""
        };
        figures.push(
            Figure::new(
                "B14",
                format!("{kind}: one lookup from inside a rule, 100,000 entries"),
                us,
                "µs",
            )
            .goal(format!("≤ {bound} µs"), us <= bound)
            .note(format!(
                "list-probe asking {IN_RULE_REPEAT} times per evaluation against asking none, reused instance, \
                     a hit and a miss alternating{text}"
            )),
        );
    }
    figures
}

/// The example rules' shipped content (plugins/banned-terms.toml and
/// link-spam's built-in shorteners), as a sidecar or as lists.
const TERMS: [&str; 3] = ["scamcoin", "free money", "miracle cure"];
const SHORTENERS: &[&str] = link_spam::DEFAULT_SHORTENERS;

/// B14's end-to-end figure: B4's embedded run (a tenth of the items link
/// spam through shorteners) with the examples reading their terms and
/// shorteners from the sidecar config, then from lists `banned-terms` and
/// `url-shorteners` holding the same entries: every decision of the second
/// run records the list versions it consulted.
pub async fn b4_on_lists(gavel_bin: &Path, sizes: Sizes) -> anyhow::Result<Vec<Figure>> {
    let dir = tempfile::tempdir()?;
    let tuning = crate::system::B4_TUNING;
    let sidecar_dir = dir.path().join("sidecar");
    std::fs::create_dir_all(sidecar_dir.join("plugins"))?;
    std::fs::write(
        sidecar_dir.join("plugins/banned-terms.toml"),
        format!("mode = \"enforce\"\n[config]\nterms = {TERMS:?}\n"),
    )?;
    std::fs::write(
        sidecar_dir.join("plugins/link-spam.toml"),
        format!("mode = \"enforce\"\n[config]\nshorteners = {SHORTENERS:?}\n"),
    )?;
    let sidecar = Gavel::start(gavel_bin, &sidecar_dir, &rust_plugins(), tuning).await?;
    let ((s, s_lo, s_hi), s_cpu) = settle_runs_with(&[&sidecar], sizes.runs, sizes.items, 1, 10).await?;
    drop(sidecar);

    let on_lists = Gavel::start(gavel_bin, &dir.path().join("lists"), &rust_plugins(), tuning).await?;
    let http = reqwest::Client::new();
    for (name, kind, entries) in [
        ("banned-terms", "terms", &TERMS[..]),
        ("url-shorteners", "domains", SHORTENERS),
    ] {
        let entries: Vec<_> = entries.iter().map(|e| json!({"value": e})).collect();
        let r = http
            .put(format!("{}/v1/lists/{name}", on_lists.url))
            .bearer_auth(MODERATOR_TOKEN)
            .json(&json!({"kind": kind, "reason": "B14", "entries": entries}))
            .send()
            .await?;
        anyhow::ensure!(r.status().is_success(), "PUT /v1/lists/{name}: {}", r.text().await?);
    }
    let ((l, l_lo, l_hi), l_cpu) = settle_runs_with(&[&on_lists], sizes.runs, sizes.items, 1, 10).await?;
    // The lists were consulted: a listed phrase is rejected, the decision
    // naming the list's version.
    let posted: Value = http
        .post(format!("{}/v1/items", on_lists.url))
        .bearer_auth(CLIENT_TOKEN)
        .json(&json!({"kind": "post", "author": "b14", "text": "Free money for everyone"}))
        .send()
        .await?
        .json()
        .await?;
    let id = posted["id"].as_str().unwrap_or_default().to_string();
    wait_settled(&http, &on_lists.url, &id).await?;
    let item: Value = http
        .get(format!("{}/v1/items/{id}", on_lists.url))
        .bearer_auth(CLIENT_TOKEN)
        .send()
        .await?
        .json()
        .await?;
    drop(on_lists);
    let stamped = item["decisions"].as_array().is_some_and(|ds| {
        ds.iter().any(|d| {
            d["plugin"] == "banned-terms" && d["verdict"] == "reject" && d["lists"][0]["name"] == "banned-terms"
        })
    });
    anyhow::ensure!(stamped, "banned-terms did not decide from its list: {item}");
    Ok(vec![
        Figure::new("B14", "submitted → settled, embedded, examples on lists", l, "items/s")
            .spread(l_lo, l_hi)
            .against("on sidecar config", s)
            .goal("≥ 0.95 × sidecar config", l >= 0.95 * s)
            .note(format!(
                "B4's embedded run, {} items per run, a tenth link spam; banned-terms and link-spam read \
                 {} terms and {} shorteners from lists (sidecar: {s_lo:.0}–{s_hi:.0})",
                sizes.items,
                TERMS.len(),
                SHORTENERS.len()
            )),
        Figure::new("B14", "CPU per settled item, examples on lists", l_cpu, "µs")
            .against("on sidecar config", s_cpu)
            .note("the gavel process, user + system (/proc), ÷ items"),
    ])
}
