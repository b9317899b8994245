//! A loop of fresh-instance evaluations of one rule, for a profiler:
//! `perf record -g target/release/examples/fresh_loop [PLUGIN.wasm] [N]`.
//!
//! The rule is loaded as `gavel serve` loads it (through a compilation cache,
//! here in a temporary directory), and the process's RSS is printed after
//! loading and after the loop, with the breakdown of /proc/self/status.

use gavel::rules::{RuleEngine, RuntimeLimits, snapshot_from_spec, thread_cpu_time};

fn main() {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .unwrap_or_else(|| gavel_tests::guests::LINK_SPAM.to_string());
    let n: u32 = args.next().and_then(|n| n.parse().ok()).unwrap_or(200_000);
    let cache = tempfile::tempdir().expect("a temporary directory");
    print_rss("started");
    let engine = RuleEngine::new(RuntimeLimits::default())
        .and_then(|e| e.with_cache(cache.path()))
        .expect("engine");
    let bytes = std::fs::read(&path).expect("plugin file");
    let plugin = engine.load_bytes(std::path::Path::new(&path), &bytes).expect("loads");
    drop(bytes);
    print_rss("loaded");
    let spec = serde_json::from_value(
        serde_json::json!({"item": {"text": "CHECK OUT https://example.com/post NOW, FRIENDS"}}),
    )
    .expect("spec");
    let snapshot = snapshot_from_spec(&spec);
    let (started, cpu) = (std::time::Instant::now(), thread_cpu_time());
    for _ in 0..n {
        let _ = std::hint::black_box(engine.evaluate(&plugin, &snapshot));
    }
    // CPU time is the steadier figure on a shared machine.
    eprintln!(
        "{:.2} µs per fresh evaluation ({:.2} µs of CPU)",
        started.elapsed().as_secs_f64() * 1e6 / f64::from(n),
        (thread_cpu_time() - cpu).as_secs_f64() * 1e6 / f64::from(n)
    );
    print_rss(&format!("after {n} fresh evaluations"));
}

/// Prints this process's resident memory: total, anonymous, file-backed, shared.
fn print_rss(when: &str) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map_or(String::from("?"), |v| v.trim().to_string())
    };
    eprintln!(
        "{when}: VmRSS {} (anonymous {}, file {}, shared memory {})",
        field("VmRSS:"),
        field("RssAnon:"),
        field("RssFile:"),
        field("RssShmem:")
    );
}
