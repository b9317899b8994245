//! A loop of fresh-instance evaluations of one rule, for a profiler:
//! `perf record -g target/release/examples/fresh_loop [PLUGIN.wasm] [N]`.

use gavel::rules::{RuleEngine, RuntimeLimits, snapshot_from_spec};

fn main() {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .unwrap_or_else(|| gavel_tests::guests::LINK_SPAM.to_string());
    let n: u32 = args.next().and_then(|n| n.parse().ok()).unwrap_or(200_000);
    let engine = RuleEngine::new(RuntimeLimits::default()).expect("engine");
    let bytes = std::fs::read(&path).expect("plugin file");
    let plugin = engine.load_bytes(std::path::Path::new(&path), &bytes).expect("loads");
    let spec = serde_json::from_value(serde_json::json!({"item": {"text": "Check out https://example.com/post"}}))
        .expect("spec");
    let snapshot = snapshot_from_spec(&spec);
    let started = std::time::Instant::now();
    for _ in 0..n {
        let _ = std::hint::black_box(engine.evaluate(&plugin, &snapshot));
    }
    eprintln!(
        "{:.2} µs per fresh evaluation",
        started.elapsed().as_secs_f64() * 1e6 / f64::from(n)
    );
}
