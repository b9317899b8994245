//! A rule that never returns (RELIABILITY.md W1), in its own test binary so
//! that no other test moves this process's thread count.

use gavel::rules::{Outcome, RuleEngine, RuntimeLimits};
use gavel_tests::{guests, load, snapshot, thread_count};
use std::time::{Duration, Instant};

#[test]
fn infinite_loop_times_out_within_deadline_while_healthy_traffic_flows() {
    // A short deadline so that 100 runaway evaluations cost the suite 2 s.
    let engine = &RuleEngine::new(RuntimeLimits {
        async_deadline: Duration::from_millis(20),
        ..gavel_tests::test_limits()
    })
    .unwrap();
    let looping = load(engine, guests::MISBEHAVE);
    let healthy = load(engine, guests::FLAG_RATIO);
    let deadline = engine.limits().async_deadline;
    let threads_before = thread_count();
    std::thread::scope(|s| {
        let healthy_runs = s.spawn(|| {
            let mut ok = 0;
            let stop = Instant::now() + Duration::from_millis(1500);
            while Instant::now() < stop {
                let e = engine.evaluate(&healthy, &snapshot("hello", &[]));
                assert_eq!(e.outcome, Outcome::Ok, "healthy evaluation failed: {:?}", e.error);
                ok += 1;
            }
            ok
        });
        for _ in 0..100 {
            let started = Instant::now();
            let e = engine.evaluate(&looping, &snapshot("x", &[("mode", "loop")]));
            let took = started.elapsed();
            assert_eq!(e.outcome, Outcome::Timeout, "{:?}", e.error);
            assert!(took < deadline + Duration::from_millis(50), "took {took:?}");
            assert!(
                took >= deadline.saturating_sub(Duration::from_millis(2)),
                "stopped early: {took:?}"
            );
        }
        assert!(healthy_runs.join().unwrap() > 10);
    });
    assert_eq!(
        thread_count(),
        threads_before,
        "evaluations must not leave threads behind"
    );
}
