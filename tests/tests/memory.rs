//! A rule growing its memory toward 4 GiB (docs/RELIABILITY.md W2). In its own
//! test binary so that no other test moves this process's RSS.

use gavel::domain::Outcome;
use gavel_tests::{engine, guests, load, rss_bytes, snapshot};

#[test]
fn memory_growth_stops_at_the_cap_and_host_rss_stays_flat() {
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
