//! The rule runtime against real components: the example plugins' cases,
//! misbehaving plugins (docs/RELIABILITY.md W1, W3, W4, W8) and bad files
//! (W5); what a reused instance starts each call with; host-side failures
//! (an exhausted pool) that are never the plugin's outcome (H7).

use gavel::domain::{Digest, Outcome};
use gavel::rules::{Evaluation, HostError, InstancePool, LoadErrorKind, LoadedPlugin, RuleEngine, Snapshot};
use gavel_plugin_sdk::spec::parse_cases;
use gavel_tests::{engine, evaluate_case, example_plugins, guests, load, snapshot};
use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

/// One engine for the whole file, like a host process has.
fn shared_engine() -> &'static RuleEngine {
    static ENGINE: OnceLock<RuleEngine> = OnceLock::new();
    ENGINE.get_or_init(engine)
}

/// A fresh-instance evaluation the host had no trouble running.
fn run(engine: &RuleEngine, plugin: &LoadedPlugin, snapshot: &Snapshot) -> Evaluation {
    engine.evaluate(plugin, snapshot).expect("the host runs the evaluation")
}

/// A reused-instance evaluation under the engine's async limits.
fn reuse(engine: &RuleEngine, plugin: &LoadedPlugin, pool: &InstancePool, snapshot: &Snapshot) -> Evaluation {
    let (deadline, memory) = (engine.limits().async_deadline, engine.limits().memory_bytes);
    engine
        .evaluate_reusing(plugin, pool, snapshot, deadline, memory)
        .expect("the host runs the evaluation")
}

/// The example plugins, loaded once for the file: the Python and JavaScript
/// ones are big components, each compiled in seconds.
fn loaded_examples() -> &'static [(&'static str, LoadedPlugin, std::path::PathBuf)] {
    static LOADED: OnceLock<Vec<(&'static str, LoadedPlugin, std::path::PathBuf)>> = OnceLock::new();
    LOADED.get_or_init(|| {
        example_plugins()
            .into_iter()
            .map(|(wasm, cases)| (wasm, load(shared_engine(), wasm), cases))
            .collect()
    })
}

#[test]
fn example_plugins_pass_their_cases_through_the_runtime() {
    let engine = shared_engine();
    for (_, plugin, cases) in loaded_examples() {
        let cases = parse_cases(&std::fs::read_to_string(cases).unwrap()).unwrap();
        assert!(cases.len() >= 5, "{}: too few cases", plugin.info.name);
        for case in cases {
            let e = evaluate_case(engine, plugin, &case);
            let d = e
                .decision
                .as_ref()
                .unwrap_or_else(|| panic!("{} / {}: {:?} {:?}", plugin.info.name, case.name, e.outcome, e.error));
            if let Err(why) = case.expect.check(d.verdict.as_str(), &d.labels, d.provider.as_deref()) {
                panic!("{} / {}: {why}", plugin.info.name, case.name);
            }
        }
    }
}

/// The shouting rule in three languages decides alike, case for case, on
/// the Python example's cases: B2 compares like with like.
#[test]
fn the_shouting_twins_agree_case_for_case() {
    let engine = shared_engine();
    let cases = gavel_tests::repo_root().join("plugins/python/shouting/cases.json");
    let cases = parse_cases(&std::fs::read_to_string(cases).unwrap()).unwrap();
    let rust = load(engine, guests::SHOUTING_TWIN);
    let js = &loaded_examples()
        .iter()
        .find(|(wasm, ..)| *wasm == guests::SHOUTING_JS)
        .unwrap()
        .1;
    for twin in [&rust, js] {
        for case in &cases {
            let e = evaluate_case(engine, twin, case);
            let d = e
                .decision
                .as_ref()
                .unwrap_or_else(|| panic!("{}: {:?}", case.name, e.error));
            if let Err(why) = case.expect.check(d.verdict.as_str(), &d.labels, d.provider.as_deref()) {
                panic!("{} / {}: {why}", twin.info.name, case.name);
            }
        }
    }
}

#[test]
fn every_evaluation_is_stamped_with_name_version_and_file_digest() {
    let engine = shared_engine();
    // link-wave reads the signal its sidecar declares: given here, empty.
    let signals = std::sync::Arc::new(gavel::rules::SignalValues::from([(
        "domain-new-authors".to_string(),
        Default::default(),
    )]));
    for (wasm, plugin, _) in loaded_examples() {
        let inputs = gavel::rules::CallInputs {
            lists: None,
            signals: Some(&signals),
        };
        let e = engine
            .evaluate_from(plugin, &snapshot("hello", &[]), inputs)
            .expect("the host runs the evaluation");
        assert_eq!(e.outcome, Outcome::Ok, "{}: {:?}", plugin.info.name, e.error);
        assert_eq!(e.plugin.name, plugin.info.name);
        // The versions the examples declare: link-spam and shouting changed
        // when they began to read the author's standing, banned-terms,
        // link-spam and shouting again when they began to consult lists;
        // link-spam 1.2.1 decides as 1.2.0, allocating less per word.
        let declared = match plugin.info.name.as_str() {
            "shouting" | "shouting-js" => "1.2.0",
            "link-spam" => "1.2.1",
            "banned-terms" => "1.1.0",
            _ => "1.0.0",
        };
        assert_eq!(e.plugin.version, declared, "{}", plugin.info.name);
        assert_eq!(e.plugin.digest, Digest::of(&std::fs::read(wasm).unwrap()));
        assert!(e.duration > Duration::ZERO);
    }
}

#[test]
fn traps_are_outcomes_never_host_panics() {
    let engine = shared_engine();
    let plugin = load(engine, guests::MISBEHAVE);
    for mode in ["recurse", "unreachable", "divide", "panic"] {
        for _ in 0..1000 {
            let e = run(engine, &plugin, &snapshot("x", &[("mode", mode)]));
            assert_eq!(e.outcome, Outcome::Trap, "{mode}: {:?}", e.error);
            assert!(e.decision.is_none());
            assert!(e.error.as_deref().is_some_and(|m| !m.is_empty()));
        }
    }
}

/// W8: a rule that reads a file and opens a socket is refused at load, and
/// the refusal names every import outside the contract; what a loaded rule
/// can see of its host's environment is nothing.
#[test]
fn a_rule_importing_files_or_sockets_is_refused_and_the_environment_is_empty() {
    let engine = shared_engine();
    let (msg, kind) = load_error(engine, Path::new(guests::REACHES_OUT));
    assert!(matches!(kind, LoadErrorKind::OutsideContract(_)), "{msg}");
    assert!(msg.contains("reaches_out.wasm"), "{msg}");
    for import in ["wasi:filesystem/types@", "wasi:sockets/tcp@"] {
        assert!(msg.contains(import), "the refusal names {import}: {msg}");
    }
    assert!(
        !msg.contains("gavel:rules/"),
        "the contract's own imports are not refused: {msg}"
    );

    let plugin = load(engine, guests::MISBEHAVE);
    let e = run(engine, &plugin, &snapshot("x", &[("mode", "probe")]));
    assert_eq!(e.outcome, Outcome::Ok, "{:?}", e.error);
    assert_eq!(e.decision.unwrap().reason, "env=empty args=none");
}

/// A component compiled through the compilation cache runs from its cache
/// file: the code is mapped from the file (pages shared with the page cache,
/// read in as they run), not copied into memory the process holds.
#[test]
fn a_compiled_component_runs_mapped_from_its_cache_file() {
    let cache = tempfile::tempdir().unwrap();
    let engine = engine().with_cache(cache.path()).unwrap();
    let plugin = load(&engine, guests::LINK_SPAM);
    assert!(!plugin.from_cache, "a new cache cannot hold it yet");
    let file = cache.path().join(format!("{}.cwasm", plugin.stamp.digest.to_hex()));
    assert!(file.is_file(), "the artifact is stored at {}", file.display());
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let file = file.display().to_string();
    let mapped: Vec<&str> = maps.lines().filter(|l| l.ends_with(&file)).collect();
    assert!(
        mapped
            .iter()
            .any(|l| l.split_whitespace().nth(1).is_some_and(|perms| perms.contains('x'))),
        "the compiled code is an executable mapping of {file}; mappings of it: {mapped:?}"
    );
    let e = run(&engine, &plugin, &snapshot("see https://a.example", &[]));
    assert_eq!(e.outcome, Outcome::Ok, "{:?}", e.error);
}

/// An engine told to compile in a child process compiles with the real
/// `gavel` binary, and in this process when the child cannot be started
/// (the program is gone): the component loads and runs either way, its
/// artifact in the cache, with no temporary file left.
#[test]
fn a_child_compiler_that_cannot_start_leaves_the_compilation_to_this_process() {
    for program in [
        gavel_tests::servers::gavel_binary(),
        std::path::PathBuf::from("/nonexistent/gavel"),
    ] {
        let cache = tempfile::tempdir().unwrap();
        let engine = engine()
            .with_cache(cache.path())
            .unwrap()
            .with_compiler_process(Some(program.clone()));
        let plugin = load(&engine, guests::LINK_SPAM);
        assert!(!plugin.from_cache, "{}", program.display());
        let files: Vec<String> = std::fs::read_dir(cache.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            files,
            vec![format!("{}.cwasm", plugin.stamp.digest.to_hex())],
            "{}",
            program.display()
        );
        let e = run(&engine, &plugin, &snapshot("see https://a.example", &[]));
        assert_eq!(e.outcome, Outcome::Ok, "{}: {:?}", program.display(), e.error);
    }
}

#[test]
fn a_secret_left_in_memory_is_not_visible_to_the_next_evaluation() {
    let engine = shared_engine();
    let plugin = load(engine, guests::MISBEHAVE);
    for i in 0..50 {
        let secret = format!("hunter{i}");
        let e = run(
            engine,
            &plugin,
            &snapshot("x", &[("mode", "secret"), ("secret", &secret)]),
        );
        assert_eq!(
            e.decision.unwrap().reason,
            "saw nothing",
            "evaluation {i} saw a previous secret"
        );
    }
}

/// The opt-in trade-off (`reuse_instances = true`): a reused instance keeps
/// what the previous evaluation left in memory; one that trapped is
/// discarded, so the next evaluation starts clean.
#[test]
fn reused_instances_keep_state_and_a_trap_discards_the_instance() {
    let engine = shared_engine();
    let plugin = load(engine, guests::MISBEHAVE);
    let pool = InstancePool::new(1);
    let secret = |s: &str| {
        let e = reuse(
            engine,
            &plugin,
            &pool,
            &snapshot("x", &[("mode", "secret"), ("secret", s)]),
        );
        assert_eq!(e.outcome, Outcome::Ok, "{:?}", e.error);
        e.decision.unwrap().reason
    };
    assert_eq!(secret("first"), "saw nothing");
    assert_eq!(secret("second"), "saw first", "the same instance served both");
    let trapped = reuse(engine, &plugin, &pool, &snapshot("x", &[("mode", "panic")]));
    assert_eq!(trapped.outcome, Outcome::Trap);
    assert_eq!(secret("third"), "saw nothing", "the trapped instance was discarded");
    let manifest: gavel::rules::Manifest = toml::from_str("reuse_instances = true").unwrap();
    assert!(manifest.reuse_instances);
}

/// A reused instance whose memory only grows (a language runtime's heap
/// that is never collected between calls) is retired once it holds more
/// than half its cap, before a call can fail on the cap: reuse never turns
/// into `memory` outcomes.
#[test]
fn a_reused_instance_is_retired_before_its_memory_reaches_the_cap() {
    let engine = shared_engine();
    let plugin = load(engine, guests::MISBEHAVE);
    let pool = InstancePool::new(1);
    let cap_mib = engine.limits().memory_bytes >> 20;
    let mut served = Vec::new();
    for _ in 0..3 * cap_mib / 4 {
        let e = reuse(
            engine,
            &plugin,
            &pool,
            &snapshot("x", &[("mode", "hoard"), ("mib", "4")]),
        );
        assert_eq!(e.outcome, Outcome::Ok, "call {}: {:?}", served.len() + 1, e.error);
        let calls: usize = e.decision.unwrap().reason.trim_start_matches("calls=").parse().unwrap();
        served.push(calls);
    }
    assert!(served.iter().all(|&c| c * 4 <= cap_mib / 2 + 4), "{served:?}");
    assert!(
        served.windows(2).any(|w| w[1] == 1 && w[0] > 1),
        "an instance was retired and replaced: {served:?}"
    );
    assert!(
        served.windows(2).any(|w| w[1] == w[0] + 1),
        "instances were reused: {served:?}"
    );
}

#[test]
fn out_of_contract_results_are_invalid_or_error() {
    let engine = shared_engine();
    let plugin = load(engine, guests::MISBEHAVE);
    let invalid = run(engine, &plugin, &snapshot("x", &[("mode", "invalid")]));
    assert_eq!(invalid.outcome, Outcome::Invalid);
    assert!(invalid.error.unwrap().contains("100 labels"));
    let error = run(engine, &plugin, &snapshot("x", &[("mode", "error")]));
    assert_eq!(error.outcome, Outcome::Error);
    assert_eq!(error.error.as_deref(), Some("cannot decide"));
    // A rule logging 10,000 lines is cut off by the log budget and still succeeds.
    let flood = run(engine, &plugin, &snapshot("x", &[("mode", "log-flood")]));
    assert_eq!(flood.outcome, Outcome::Ok, "{:?}", flood.error);
}

#[test]
fn a_thousand_healthy_evaluations_interleaved_with_failing_ones_all_succeed() {
    let engine = shared_engine();
    let healthy = load(engine, guests::LINK_SPAM);
    let failing = load(engine, guests::MISBEHAVE);
    let modes = ["unreachable", "recurse", "invalid", "error", "divide"];
    let held = snapshot(
        "http://a.example http://b.example http://c.example http://d.example",
        &[],
    );
    for i in 0..1000 {
        let e = run(engine, &healthy, &held);
        assert_eq!(e.outcome, Outcome::Ok, "healthy evaluation {i}: {:?}", e.error);
        assert_eq!(e.decision.unwrap().verdict, gavel::domain::Verdict::Hold);
        let bad = run(engine, &failing, &snapshot("x", &[("mode", modes[i % modes.len()])]));
        assert_ne!(bad.outcome, Outcome::Ok);
    }
}

fn load_error(engine: &RuleEngine, path: &Path) -> (String, LoadErrorKind) {
    let err = engine.load_file(path).expect_err("a bad file must not load");
    (err.to_string(), err.kind)
}

#[test]
fn bad_plugin_files_get_a_clear_error_naming_file_and_reason() {
    let engine = shared_engine();
    let dir = tempfile::tempdir().unwrap();
    let good = std::fs::read(guests::LINK_SPAM).unwrap();

    let random = dir.path().join("random.wasm");
    let noise: Vec<u8> = (0..4096u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    std::fs::write(&random, &noise).unwrap();
    let (msg, kind) = load_error(engine, &random);
    assert!(matches!(kind, LoadErrorKind::NotWasm), "{msg}");
    assert!(
        msg.contains("random.wasm") && msg.contains("not a WebAssembly file"),
        "{msg}"
    );

    let truncated = dir.path().join("truncated.wasm");
    std::fs::write(&truncated, &good[..good.len() / 2]).unwrap();
    let (msg, kind) = load_error(engine, &truncated);
    assert!(matches!(kind, LoadErrorKind::Compile(_)), "{msg}");
    assert!(
        msg.contains("truncated.wasm") && msg.contains("does not compile"),
        "{msg}"
    );

    let (msg, kind) = load_error(engine, Path::new(guests::WRONG_WORLD));
    assert!(matches!(kind, LoadErrorKind::WrongWorld(_)), "{msg}");
    assert!(
        msg.contains("wrong_world.wasm") && msg.contains("gavel:rules/rule"),
        "{msg}"
    );

    let core = dir.path().join("core.wasm");
    std::fs::write(&core, b"\0asm\x01\0\0\0").unwrap();
    let (msg, kind) = load_error(engine, &core);
    assert!(matches!(kind, LoadErrorKind::CoreModule), "{msg}");
    assert!(msg.contains("core.wasm") && msg.contains("not a component"), "{msg}");

    let oversized = dir.path().join("oversized.wasm");
    let mut big = good.clone();
    big.resize((engine.limits().max_file_bytes + 1) as usize, 0);
    std::fs::write(&oversized, &big).unwrap();
    let (msg, kind) = load_error(engine, &oversized);
    assert!(matches!(kind, LoadErrorKind::TooLarge { .. }), "{msg}");
    assert!(
        msg.contains("oversized.wasm") && msg.contains("over the limit"),
        "{msg}"
    );

    // Real native code for this very engine: valid, and still never loaded.
    let cwasm = dir.path().join("link-spam.cwasm");
    std::fs::write(&cwasm, engine.engine().precompile_component(&good).unwrap()).unwrap();
    let (msg, kind) = load_error(engine, &cwasm);
    assert!(matches!(kind, LoadErrorKind::Precompiled), "{msg}");
    let disguised = dir.path().join("disguised.wasm");
    std::fs::copy(&cwasm, &disguised).unwrap();
    let (msg, kind) = load_error(engine, &disguised);
    assert!(matches!(kind, LoadErrorKind::Precompiled), "{msg}");

    let (msg, kind) = load_error(engine, &dir.path().join("missing.wasm"));
    assert!(matches!(kind, LoadErrorKind::Io(_)), "{msg}");
}

/// A reused instance starts every call with a full log budget and an empty
/// output capture: output never accumulates into a trap, and a chatty rule
/// (past the 4 KiB capture) is cut, not failed, fresh or reused.
#[test]
fn reused_instances_start_each_call_with_a_fresh_budget_and_capture() {
    let engine = shared_engine();
    let plugin = load(engine, guests::MISBEHAVE);
    let pool = InstancePool::new(1);
    for call in 0..5 {
        let printed = reuse(
            engine,
            &plugin,
            &pool,
            &snapshot("x", &[("mode", "print"), ("bytes", "3072")]),
        );
        assert_eq!(printed.outcome, Outcome::Ok, "call {call}: {:?}", printed.error);
        let flood = reuse(engine, &plugin, &pool, &snapshot("x", &[("mode", "log-flood")]));
        assert_eq!(flood.outcome, Outcome::Ok, "call {call}: {:?}", flood.error);
    }
    let loud = run(
        engine,
        &plugin,
        &snapshot("x", &[("mode", "print"), ("bytes", "65536")]),
    );
    assert_eq!(loud.outcome, Outcome::Ok, "{:?}", loud.error);
}

/// The instance pool out of slots is the host's failure (a `HostError`),
/// never a plugin outcome that would count against its breaker.
#[test]
fn an_exhausted_instance_pool_is_a_host_error() {
    let engine = std::sync::Arc::new(
        RuleEngine::new(gavel::rules::RuntimeLimits {
            max_concurrent_evaluations: 1,
            async_deadline: Duration::from_secs(5),
            ..gavel_tests::test_limits()
        })
        .unwrap(),
    );
    let plugin = std::sync::Arc::new(load(&engine, guests::MISBEHAVE));
    let busy = {
        let (engine, plugin) = (engine.clone(), plugin.clone());
        // It retries while a probe below holds the slot, so it gets the slot
        // whichever thread the machine runs first.
        std::thread::spawn(move || {
            loop {
                match engine.evaluate(&plugin, &snapshot("x", &[("mode", "spin"), ("spin_ms", "1500")])) {
                    Err(HostError::PoolExhausted(_)) => std::thread::yield_now(),
                    other => break other,
                }
            }
        })
    };
    // While the one slot is taken, another evaluation cannot start.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let refused = loop {
        match engine.evaluate(&plugin, &snapshot("x", &[("mode", "ok")])) {
            Err(e) => break e,
            Ok(_) => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the busy evaluation never held the slot"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    };
    assert!(matches!(refused, HostError::PoolExhausted(_)), "{refused:?}");
    let done = busy.join().unwrap().unwrap();
    assert_eq!(done.outcome, Outcome::Ok, "{:?}", done.error);
    assert_eq!(
        run(&engine, &plugin, &snapshot("x", &[("mode", "ok")])).outcome,
        Outcome::Ok
    );
}
