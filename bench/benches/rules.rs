//! B1 and B2 (docs/BENCHMARKS.md): one rule evaluation through the host runtime
//! with a fresh instance and production limits, next to the same rule code
//! compiled natively (the SDK's native harness) and to a reused instance
//! (`reuse_instances = true`),
//! so the wasm/native and fresh/reused ratios come out of one run.
//!
//! `GAVEL_BENCH_QUICK=1` shrinks sample counts (CI proves it runs; no times
//! are asserted anywhere).

use criterion::{Criterion, criterion_group, criterion_main};
use gavel::rules::{InstancePool, LoadedPlugin, RuleEngine, RuntimeLimits, Snapshot, snapshot_from_spec};
use gavel_plugin_sdk::Rule;
use gavel_plugin_sdk::spec::SnapshotSpec;
use gavel_plugin_sdk::testing::SnapshotBuilder;
use gavel_tests::guests;
use std::hint::black_box;
use std::time::Duration;

const POST: &str = "Check out my new blog post at https://example.com/post, thoughts welcome!";
const SHOUT: &str = "THIS IS THE BEST OFFER YOU WILL EVER SEE, BUY NOW";

fn host_snapshot(text: &str) -> Snapshot {
    let spec: SnapshotSpec = serde_json::from_value(serde_json::json!({
        "item": {"text": text},
        "counters": {"upvote": 12, "flag": 1},
    }))
    .expect("a valid spec");
    snapshot_from_spec(&spec)
}

fn native_snapshot(text: &str) -> gavel_plugin_sdk::Snapshot {
    SnapshotBuilder::new()
        .text(text)
        .counter("upvote", 12)
        .counter("flag", 1)
        .build()
}

/// An evaluation on a reused instance, as `reuse_instances = true` runs it.
fn reusing(engine: &RuleEngine, plugin: &LoadedPlugin, pool: &InstancePool, snapshot: &Snapshot) {
    let limits = engine.limits();
    let e = engine
        .evaluate_reusing(
            plugin,
            pool,
            black_box(snapshot),
            limits.async_deadline,
            limits.memory_bytes,
        )
        .expect("the host runs it");
    assert!(e.decision.is_some(), "{e:?}");
}

fn load(engine: &RuleEngine, path: &str) -> LoadedPlugin {
    let bytes = std::fs::read(path).expect("the guest was built");
    engine
        .load_bytes(std::path::Path::new(path), &bytes)
        .expect("the guest loads")
}

/// Benchmarks one rule three ways (four with a Python twin): native, wasm
/// with a fresh instance, wasm with a reused instance.
fn compare<R: Rule>(c: &mut Criterion, engine: &RuleEngine, group: &str, wasm: &str, text: &str) {
    let plugin = load(engine, wasm);
    let snapshot = host_snapshot(text);
    let native = native_snapshot(text);
    // The verdicts agree, or the comparison means nothing.
    let fresh = engine.evaluate(&plugin, &snapshot).expect("the host runs it");
    let expected = R::evaluate(&native).expect("the rule decides").verdict;
    assert_eq!(
        fresh.decision.as_ref().map(|d| d.verdict.as_str()),
        Some(expected.as_str()),
        "{group}: {fresh:?}"
    );
    let pool = InstancePool::new(1);
    let mut g = c.benchmark_group(group);
    g.bench_function("native", |b| b.iter(|| R::evaluate(black_box(&native))));
    g.bench_function("wasm_fresh", |b| {
        b.iter(|| engine.evaluate(&plugin, black_box(&snapshot)))
    });
    g.bench_function("wasm_reused", |b| b.iter(|| reusing(engine, &plugin, &pool, &snapshot)));
    g.finish();
}

fn rules(c: &mut Criterion) {
    // Production limits: the deadline and memory cap are on for every call.
    let engine = RuleEngine::new(RuntimeLimits::default()).expect("engine");
    compare::<link_spam::LinkSpam>(c, &engine, "b1/link-spam", guests::LINK_SPAM, POST);
    compare::<duplicate_burst::DuplicateBurst>(c, &engine, "b1/duplicate-burst", guests::DUPLICATE_BURST, POST);
    compare::<flag_ratio::FlagRatio>(c, &engine, "b1/flag-ratio", guests::FLAG_RATIO, POST);
    compare::<banned_terms::BannedTerms>(c, &engine, "b1/banned-terms", guests::BANNED_TERMS, POST);

    // B2: the Python example next to its Rust twin (same logic), both through the runtime.
    compare::<shouting_twin::ShoutingTwin>(c, &engine, "b2/shouting-rust", guests::SHOUTING_TWIN, SHOUT);
    // ... and its JavaScript twin.
    for (group, wasm) in [
        ("b2/shouting-python", guests::SHOUTING),
        ("b2/shouting-js", guests::SHOUTING_JS),
    ] {
        let plugin = load(&engine, wasm);
        let snapshot = host_snapshot(SHOUT);
        let first = engine.evaluate(&plugin, &snapshot).expect("the host runs it");
        assert_eq!(
            first.decision.as_ref().map(|d| d.verdict.as_str()),
            Some("hold"),
            "{group}: {first:?}"
        );
        let pool = InstancePool::new(1);
        let mut g = c.benchmark_group(group);
        g.bench_function("wasm_fresh", |b| {
            b.iter(|| engine.evaluate(&plugin, black_box(&snapshot)))
        });
        g.bench_function("wasm_reused", |b| {
            b.iter(|| reusing(&engine, &plugin, &pool, &snapshot))
        });
        g.finish();
    }
}

fn config() -> Criterion {
    let quick = std::env::var_os("GAVEL_BENCH_QUICK").is_some();
    let c = Criterion::default().without_plots();
    if quick {
        c.sample_size(10)
            .warm_up_time(Duration::from_millis(200))
            .measurement_time(Duration::from_millis(500))
    } else {
        c.sample_size(50)
            .warm_up_time(Duration::from_secs(1))
            .measurement_time(Duration::from_secs(3))
    }
}

criterion_group! {
    name = benches;
    config = config();
    targets = rules
}
criterion_main!(benches);
