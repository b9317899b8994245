//! B14 (docs/BENCHMARKS.md): lists of 100,000 entries of each kind, in
//! this process (no server): checking and compiling a version (what an
//! edit costs before it is written, and what every other process pays when
//! its poll picks the edit up), and one lookup in the compiled matcher
//! (`host/src/lists/matcher.rs`), hits and misses alike. Rules cannot
//! consult lists yet, so a lookup is timed as the host makes it, without
//! the call across the sandbox.

use crate::report::Figure;
use gavel::lists::{CompiledList, Entry, ListKind, ListsConfig, Matcher, canonical, digest};
use std::hint::black_box;
use std::net::IpAddr;
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
    let compiled = canonical(kind, raw, &limits).and_then(|entries| {
        Ok(CompiledList {
            name: kind.to_string(),
            version: 1,
            digest: digest(kind, &entries),
            entries: entries.len(),
            matcher: Matcher::compile(kind, &entries, &limits)?,
        })
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
        words[75] = "SCAM4242, Offer73!".into();
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

pub fn b14(quick: bool) -> Vec<Figure> {
    let rounds = if quick { 20_000 } else { 200_000 };
    let mut figures = Vec::new();
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
        let bound = if kind == ListKind::Terms { 5.0 } else { 2.0 };
        figures.push(
            Figure::new("B14", format!("{kind}: {what}, 100,000 entries"), us, "µs")
                .goal(format!("≤ {bound} µs"), us <= bound)
                .note(format!("{hits} hits (half or more of the probes are misses)")),
        );
    }
    figures
}
