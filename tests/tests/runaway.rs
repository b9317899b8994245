//! A rule that never returns (docs/RELIABILITY.md W1), in its own test
//! binary so that no other test moves this process's thread count.
//!
//! Deadlines are CPU time the rule used: the bound checked is on the CPU
//! the runaway got (robust on a loaded machine), and on the wall-clock cap
//! that ends it anyway when the machine is too busy to give it that CPU.

use gavel::domain::Outcome;
use gavel::rules::{HostError, RuleEngine, RuntimeLimits, thread_cpu_time};
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
    let limits = engine.limits();
    let deadline = limits.async_deadline;
    let wall_cap = deadline * limits.wall_cap_factor;
    // Healthy traffic keeps a deadline of its own, as a rule's sidecar sets
    // it: the short one is the runaway's, and a debug build's healthy call
    // on a shared 2-core machine is not what this test measures.
    let healthy_deadline = Duration::from_secs(1);
    let threads_before = thread_count();
    // Alone, each call finds the epoch ticker parked (nothing was armed
    // for a while): the call must wake it, and is still stopped at its
    // deadline.
    for _ in 0..5 {
        std::thread::sleep(Duration::from_millis(30));
        let started = Instant::now();
        match engine.evaluate(&looping, &snapshot("x", &[("mode", "loop")])) {
            Ok(e) => assert_eq!(e.outcome, Outcome::Timeout, "{:?}", e.error),
            Err(e) => assert!(matches!(e, HostError::Overloaded(_)), "{e:?}"),
        }
        let took = started.elapsed();
        assert!(
            took < wall_cap + Duration::from_millis(50),
            "took {took:?} of wall time after the ticker parked"
        );
    }
    std::thread::scope(|s| {
        let healthy_runs = s.spawn(|| {
            let mut ok = 0;
            let stop = Instant::now() + Duration::from_millis(1500);
            while Instant::now() < stop {
                let e = engine
                    .evaluate_with(&healthy, &snapshot("hello", &[]), healthy_deadline, limits.memory_bytes)
                    .expect("a healthy rule runs");
                assert_eq!(e.outcome, Outcome::Ok, "healthy evaluation failed: {:?}", e.error);
                ok += 1;
            }
            ok
        });
        let mut timeouts = 0;
        for _ in 0..100 {
            let (started, cpu) = (Instant::now(), thread_cpu_time());
            let result = engine.evaluate(&looping, &snapshot("x", &[("mode", "loop")]));
            let (took, used) = (started.elapsed(), thread_cpu_time() - cpu);
            match result {
                Ok(e) => {
                    assert_eq!(e.outcome, Outcome::Timeout, "{:?}", e.error);
                    assert!(
                        used >= deadline.saturating_sub(Duration::from_millis(2)),
                        "stopped early: {used:?} of CPU"
                    );
                    assert!(used < deadline + Duration::from_millis(25), "ran on: {used:?} of CPU");
                    timeouts += 1;
                }
                // The machine too busy to give it its CPU: ended by the wall cap.
                Err(e) => assert!(matches!(e, HostError::Overloaded(_)), "{e:?}"),
            }
            assert!(
                took < wall_cap + Duration::from_millis(50),
                "took {took:?} of wall time"
            );
        }
        assert!(timeouts > 0, "no runaway ever got its CPU budget");
        assert!(healthy_runs.join().unwrap() > 10);
    });
    assert_eq!(
        thread_count(),
        threads_before,
        "evaluations must not leave threads behind"
    );
}
