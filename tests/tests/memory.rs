//! A rule growing its memory toward 4 GiB (docs/RELIABILITY.md W2), and what
//! the Python and JavaScript examples cost in resident memory. In its own
//! test binary so that no other test moves this process's RSS; the tests
//! take turns for the same reason.

use gavel::domain::Outcome;
use gavel_tests::{engine, guests, load, private_rss_bytes, rss_bytes, snapshot};
use std::sync::Mutex;

/// Held by each test: one at a time moves this process's RSS.
static ALONE: Mutex<()> = Mutex::new(());

fn mib(bytes: u64) -> u64 {
    bytes >> 20
}

#[test]
fn memory_growth_stops_at_the_cap_and_host_rss_stays_flat() {
    let _alone = ALONE.lock().unwrap_or_else(|p| p.into_inner());
    let engine = engine();
    let plugin = load(&engine, guests::MISBEHAVE);
    let healthy = load(&engine, guests::FLAG_RATIO);
    // Warm up: the first evaluation maps the pool slot.
    engine.evaluate(&healthy, &snapshot("x", &[])).unwrap();
    let before = rss_bytes();
    for _ in 0..20 {
        let e = engine.evaluate(&plugin, &snapshot("x", &[("mode", "grow")])).unwrap();
        assert_eq!(e.outcome, Outcome::Memory, "{:?}", e.error);
        assert!(e.error.unwrap().contains("memory cap"));
    }
    let grown = rss_bytes().saturating_sub(before);
    assert!(grown < 80 << 20, "host RSS grew by {} MiB", grown >> 20);
    // And the host still evaluates normally afterwards.
    assert_eq!(
        engine.evaluate(&healthy, &snapshot("x", &[])).unwrap().outcome,
        Outcome::Ok
    );
}

/// A language example loaded as `gavel serve` loads it (compiled through the
/// compilation cache) adds little memory of the process's own (counted
/// without file pages, which the page cache shares: the code of a debug
/// build, the mapped cache file), and fresh evaluations of it do not pile
/// up resident memory of any kind, file pages of its memory image included:
/// B8's figures (docs/BENCHMARKS.md).
#[test]
fn language_examples_load_small_and_fresh_evaluations_leave_memory_flat() {
    let _alone = ALONE.lock().unwrap_or_else(|p| p.into_inner());
    for (example, wasm) in [("Python", guests::SHOUTING), ("JavaScript", guests::SHOUTING_JS)] {
        let cache = tempfile::tempdir().unwrap();
        let engine = engine().with_cache(cache.path()).unwrap();
        let idle = private_rss_bytes();
        let plugin = load(&engine, wasm);
        let loaded = private_rss_bytes();
        // Compiling once added ~320 MiB here; what the compiler's threads
        // leave in glibc's arenas now varies between runs (18-56 MiB in a
        // debug build). B8 holds the release figure to its 48 MiB goal.
        assert!(
            loaded.saturating_sub(idle) <= 96 << 20,
            "loading the {example} example added {} MiB",
            mib(loaded.saturating_sub(idle))
        );
        let resident = rss_bytes();
        let shout = snapshot("THIS IS THE BEST OFFER YOU WILL EVER SEE, BUY NOW", &[]);
        for i in 0..200 {
            let e = engine.evaluate(&plugin, &shout).unwrap();
            assert_eq!(e.outcome, Outcome::Ok, "{example} evaluation {i}: {:?}", e.error);
            assert_eq!(e.decision.unwrap().verdict.as_str(), "hold");
        }
        let added = rss_bytes().saturating_sub(resident);
        assert!(
            added <= 32 << 20,
            "200 fresh {example} evaluations added {} MiB of RSS beyond the loaded plugin",
            mib(added)
        );
    }
}
