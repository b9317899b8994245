//! The rule author's path, end to end with the real `gavel` binary: `gavel
//! plugin new` in each language writes a project into a temp dir, which is
//! built the way its README says, then checked, tested and timed through
//! the real sandbox. A component importing files and sockets is refused at
//! `plugin check`, naming the imports.
//!
//! Its own test binary: the builds are heavy, and the `suite` binary's
//! load-sensitive tests should not share the cores with them.

use gavel_tests::{guests, servers::gavel_binary};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Runs `cmd`, panicking with its output unless it succeeds.
fn run(cmd: &mut Command) -> String {
    let out = output(cmd);
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn output(cmd: &mut Command) -> Output {
    // The outer `cargo test`'s variables must not leak into a rule's build.
    for var in [
        "CARGO_TARGET_DIR",
        "CARGO_MANIFEST_DIR",
        "CARGO_PRIMARY_PACKAGE",
        "CARGO_ENCODED_RUSTFLAGS",
        "RUSTFLAGS",
    ] {
        cmd.env_remove(var);
    }
    cmd.output().unwrap_or_else(|e| panic!("running {cmd:?}: {e}"))
}

/// `gavel`, compiling into a cache in `tmp` (a test's own temp dir): the
/// commands of one test share it, as an author's do, not the user's cache.
fn gavel(tmp: &Path) -> Command {
    let mut cmd = Command::new(gavel_binary());
    cmd.env("GAVEL_CACHE_DIR", tmp.join("gavel-cache"));
    cmd
}

/// `gavel plugin new NAME --lang LANG --dir TMP/NAME`; returns the project dir.
fn scaffold(tmp: &Path, name: &str, lang: &str) -> PathBuf {
    let dir = tmp.join(name);
    let out = run(gavel(tmp)
        .args(["plugin", "new", name, "--lang", lang, "--dir"])
        .arg(&dir));
    assert!(out.contains(&format!("rule `{name}`")), "{out}");
    for file in ["cases.json", "README.md"] {
        assert!(dir.join(file).is_file(), "{lang}: no {file}");
    }
    dir
}

/// `plugin check`, `plugin test` and `plugin bench` on a built rule, each
/// through the real sandbox; the template's four cases all pass.
fn check_test_and_bench(dir: &Path, wasm: &Path, name: &str) {
    let host = gavel::rules::contract::host_version();
    let gavel = || gavel(dir);
    let check = run(gavel().args(["plugin", "check"]).arg(wasm));
    assert!(check.contains(&format!("name:        {name}")), "{check}");
    assert!(
        check.contains(&format!("contract:    gavel:rules@{host} (this host: {host})")),
        "{check}"
    );
    assert!(check.contains("sample:      ok allow"), "{check}");

    let test = run(gavel()
        .args(["plugin", "test"])
        .arg(wasm)
        .arg("--cases")
        .arg(dir.join("cases.json")));
    assert!(test.contains("4 passed, 0 failed"), "{test}");

    let bench = run(gavel()
        .args(["plugin", "bench"])
        .arg(wasm)
        .arg("--cases")
        .arg(dir.join("cases.json"))
        .args(["--iterations", "10"]));
    assert!(bench.contains("a watched phrase is held"), "{bench}");
    assert!(bench.contains("reused instance p50"), "{bench}");
}

#[test]
fn a_new_rust_rule_builds_tests_natively_and_passes_its_cases_in_the_sandbox() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = scaffold(tmp.path(), "watch-rust", "rust");
    // As its README says, from nothing but the new project.
    let native = run(Command::new("cargo").arg("test").current_dir(&dir));
    assert!(native.contains("test result: ok. 3 passed"), "{native}");
    run(Command::new("cargo")
        .args(["build", "--release", "--target", "wasm32-wasip2"])
        .current_dir(&dir));
    let wasm = dir.join("target/wasm32-wasip2/release/watch_rust.wasm");
    check_test_and_bench(&dir, &wasm, "watch-rust");
}

#[test]
fn a_new_python_rule_builds_and_passes_its_cases_in_the_sandbox() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = scaffold(tmp.path(), "watch-py", "python");
    let wit = std::fs::read_to_string(dir.join("wit/rules.wit")).unwrap();
    assert_eq!(wit, gavel::rules::contract::WIT, "the WIT comes from the binary");
    run(Command::new("componentize-py")
        .args([
            "-d",
            "wit",
            "-w",
            "rule",
            "componentize",
            "--stub-wasi",
            "app",
            "-o",
            "watch-py.wasm",
        ])
        .current_dir(&dir));
    check_test_and_bench(&dir, &dir.join("watch-py.wasm"), "watch-py");
}

/// JavaScript and TypeScript: `npm ci` (the lock file is the template's),
/// the type check against types generated from the WIT, then the build.
fn js_rule(lang: &str, name: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = scaffold(tmp.path(), name, lang);
    run(Command::new("npm")
        .args(["ci", "--no-audit", "--no-fund"])
        .current_dir(&dir));
    run(Command::new("npm").args(["run", "check"]).current_dir(&dir));
    run(Command::new("npm").args(["run", "build"]).current_dir(&dir));
    check_test_and_bench(&dir, &dir.join(format!("{name}.wasm")), name);
}

#[test]
fn a_new_javascript_rule_type_checks_builds_and_passes_its_cases_in_the_sandbox() {
    js_rule("js", "watch-js");
}

#[test]
fn a_new_typescript_rule_type_checks_builds_and_passes_its_cases_in_the_sandbox() {
    js_rule("ts", "watch-ts");
}

/// The type check is real: a verdict outside the contract fails it.
#[test]
fn the_javascript_type_check_catches_a_verdict_outside_the_contract() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = scaffold(tmp.path(), "typo-js", "js");
    let source = dir.join("rule.js");
    let text = std::fs::read_to_string(&source)
        .unwrap()
        .replace("verdict: \"hold\"", "verdict: \"hide\"");
    std::fs::write(&source, text).unwrap();
    run(Command::new("npm")
        .args(["ci", "--no-audit", "--no-fund"])
        .current_dir(&dir));
    let out = output(Command::new("npm").args(["run", "check"]).current_dir(&dir));
    assert!(
        !out.status.success(),
        "the type check passed a verdict outside the contract"
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("\"hide\"") && said.contains("Verdict"), "{said}");
}

#[test]
fn plugin_check_refuses_a_rule_that_imports_files_or_sockets_naming_the_imports() {
    let tmp = tempfile::tempdir().unwrap();
    let out = output(gavel(tmp.path()).args(["plugin", "check", guests::REACHES_OUT]));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("imports outside the gavel:rules contract"), "{err}");
    assert!(
        err.contains("wasi:filesystem/types@") && err.contains("(files)"),
        "{err}"
    );
    assert!(
        err.contains("wasi:sockets/tcp@") && err.contains("(network sockets)"),
        "{err}"
    );
}

#[test]
fn plugin_new_refuses_a_bad_name_and_a_directory_in_use() {
    let tmp = tempfile::tempdir().unwrap();
    let gavel = || gavel(tmp.path());
    let out = output(
        gavel()
            .args(["plugin", "new", "Bad_Name", "--lang", "js", "--dir"])
            .arg(tmp.path().join("x")),
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a plugin name"));
    std::fs::write(tmp.path().join("keep.txt"), "mine").unwrap();
    let out = output(
        gavel()
            .args(["plugin", "new", "ok", "--lang", "python", "--dir"])
            .arg(tmp.path()),
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not empty"));
    assert_eq!(std::fs::read_to_string(tmp.path().join("keep.txt")).unwrap(), "mine");
}
