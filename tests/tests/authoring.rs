//! The rule author's path, end to end with the real `gavel` binary: `gavel
//! plugin new` in each language writes a project into a temp dir, which is
//! built the way its README says, then checked, tested and timed through
//! the real sandbox. A component importing files and sockets is refused at
//! `plugin check`, naming the imports.
//!
//! Its own test binary: the builds are heavy, and the `suite` binary's
//! load-sensitive tests should not share the cores with them.

use gavel_tests::{guests, servers::gavel_binary};
use std::collections::{BTreeMap, BTreeSet};
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
    // A keyword: its type was once `pub struct Self;`.
    let dir = scaffold(tmp.path(), "self", "rust");
    // As its README says, from nothing but the new project.
    let native = run(Command::new("cargo").arg("test").current_dir(&dir));
    assert!(native.contains("test result: ok. 3 passed"), "{native}");
    run(Command::new("cargo")
        .args(["build", "--release", "--target", "wasm32-wasip2"])
        .current_dir(&dir));
    let wasm = dir.join("target/wasm32-wasip2/release/self.wasm");
    check_test_and_bench(&dir, &wasm, "self");
}

#[test]
fn a_new_python_rule_builds_and_passes_its_cases_in_the_sandbox() {
    let tmp = tempfile::tempdir().unwrap();
    // A Python keyword.
    let dir = scaffold(tmp.path(), "import", "python");
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
            "import.wasm",
        ])
        .current_dir(&dir));
    check_test_and_bench(&dir, &dir.join("import.wasm"), "import");
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
    // A JavaScript keyword.
    js_rule("js", "class");
}

#[test]
fn a_new_typescript_rule_type_checks_builds_and_passes_its_cases_in_the_sandbox() {
    // The name of one of the project's own dependencies.
    js_rule("ts", "typescript");
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

/// Rust's keywords: strict, reserved and weak (the Rust Reference,
/// "Keywords"); `Self` is `self` in a plugin name.
const RUST_KEYWORDS: &[&str] = &[
    "as", "async", "await", "break", "const", "continue", "crate", "dyn", "else", "enum", "extern", "false", "fn",
    "for", "if", "impl", "in", "let", "loop", "match", "mod", "move", "mut", "pub", "ref", "return", "self", "static",
    "struct", "super", "trait", "true", "type", "unsafe", "use", "where", "while", "abstract", "become", "box", "do",
    "final", "gen", "macro", "override", "priv", "try", "typeof", "unsized", "virtual", "yield", "union", "raw",
    "safe",
];

/// JavaScript's reserved words, strict-mode and contextual keywords
/// (ECMAScript 2025, "Keywords and Reserved Words"), and the global
/// names a module cannot rebind.
const JAVASCRIPT_KEYWORDS: &[&str] = &[
    "await",
    "break",
    "case",
    "catch",
    "class",
    "const",
    "continue",
    "debugger",
    "default",
    "delete",
    "do",
    "else",
    "enum",
    "export",
    "extends",
    "false",
    "finally",
    "for",
    "function",
    "if",
    "import",
    "in",
    "instanceof",
    "new",
    "null",
    "return",
    "super",
    "switch",
    "this",
    "throw",
    "true",
    "try",
    "typeof",
    "var",
    "void",
    "while",
    "with",
    "yield",
    "let",
    "static",
    "implements",
    "interface",
    "package",
    "private",
    "protected",
    "public",
    "as",
    "async",
    "from",
    "get",
    "of",
    "set",
    "target",
    "meta",
    "arguments",
    "eval",
    "undefined",
    "nan",
    "infinity",
];

/// Names that were once identifiers of the templates or their bindings:
/// what the Rust template imports and the prelude (`rule`, `ok`, `string`),
/// the Python bindings' names (`wit-world`, `types`), the project's own
/// dependencies, and Cargo's artifact directories.
const TEMPLATE_NAMES: &[&str] = &[
    "rule",
    "decision",
    "snapshot",
    "phase",
    "plugin-info",
    "verdict",
    "export-rule",
    "snapshot-builder",
    "run-cases",
    "testing",
    "ok",
    "err",
    "some",
    "none",
    "option",
    "result",
    "string",
    "vec",
    "to-string",
    "to-owned",
    "clone",
    "copy",
    "default",
    "send",
    "sync",
    "sized",
    "drop",
    "into",
    "iterator",
    "default-words",
    "tests",
    "info",
    "evaluate",
    "bindings",
    "gavel-rule-export",
    "wit-world",
    "imports",
    "host",
    "types",
    "level",
    "log",
    "app",
    "config",
    "main",
    "typescript",
    "jco",
    "build",
    "deps",
    "examples",
    "incremental",
    "std",
    "core",
    "alloc",
    "proc-macro",
    "test",
    "gavel-plugin-sdk",
    "wit-bindgen",
    "serde",
    "serde-json",
];

/// The names a Rust rule may not have, each refused with a reason
/// (`plugin new` names the crate it would shadow).
const REFUSED_FOR_RUST: &[&str] = &["std", "core", "alloc", "proc-macro", "test", "gavel-plugin-sdk"];

/// Every reserved word of Rust, Python (asked of the Python that builds the
/// rules: `keyword.kwlist` and `softkwlist`) and JavaScript, and the
/// templates' own names, as plugin names (lowercase; `_` is not allowed).
fn reserved_names() -> BTreeSet<String> {
    let python = run(Command::new("python3").args([
        "-c",
        "import keyword; print(' '.join(keyword.kwlist + keyword.softkwlist))",
    ]));
    let python: Vec<&str> = python.split_whitespace().collect();
    assert!(python.contains(&"lambda") && python.contains(&"None"), "{python:?}");
    RUST_KEYWORDS
        .iter()
        .chain(JAVASCRIPT_KEYWORDS)
        .chain(TEMPLATE_NAMES)
        .chain(&python)
        .map(|w| w.to_ascii_lowercase())
        .filter(|w| gavel::rules::valid_name(w))
        .collect()
}

/// `gavel plugin new` for every name in `lang`, into `root/NAME`; returns
/// the names it refused, with what it said.
fn scaffold_all(tmp: &Path, root: &Path, names: &BTreeSet<String>, lang: &str) -> BTreeMap<String, String> {
    let mut refused = BTreeMap::new();
    for name in names {
        let out = output(
            gavel(tmp)
                .args(["plugin", "new", name, "--lang", lang, "--dir"])
                .arg(root.join(name)),
        );
        if !out.status.success() {
            refused.insert(name.clone(), String::from_utf8_lossy(&out.stderr).into_owned());
        }
    }
    refused
}

/// Every reserved word of Rust, Python and JavaScript (and every name the
/// templates once used as an identifier) as the name of a new rule in each
/// language: the project is made and compiles, or the name is refused with
/// a reason (only the names of Rust's standard crates and of the SDK, for
/// a Rust rule). Checked cheaply but for real:
/// - Rust: one Cargo workspace with a member per name (each the generated
///   project, only its `[workspace]` line dropped), checked against the
///   real SDK by one `cargo check --workspace --lib --target wasm32-wasip2`
///   (the component and its export) and one `cargo check --workspace
///   --tests` (the rules' tests, native like the SDK's harness);
/// - Python: every generated `app.py` imported by one Python against the
///   bindings `componentize-py bindings` generates from the project's WIT,
///   its `WitWorld` instantiated and its `info()` called;
/// - JavaScript: every generated `rule.js` parsed by `node --check` (as an
///   ES module, by its `package.json`), and every `package.json` read.
///
/// The full builds (component, sandbox, cases) run once per language for a
/// nasty name in the tests above: `self`, `import`, `class`, `typescript`.
#[test]
fn every_reserved_word_is_a_rule_name_whose_project_compiles_or_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let names = reserved_names();
    assert!(names.len() > 150, "{}", names.len());

    // Rust.
    let rust = tmp.path().join("rust");
    let refused = scaffold_all(tmp.path(), &rust, &names, "rust");
    let expected: BTreeSet<&str> = REFUSED_FOR_RUST.iter().copied().collect();
    assert_eq!(
        refused.keys().map(String::as_str).collect::<BTreeSet<_>>(),
        expected,
        "{refused:#?}"
    );
    for (name, said) in &refused {
        assert!(said.contains("choose another name"), "{name}: {said}");
    }
    let members: Vec<&String> = names.iter().filter(|n| !refused.contains_key(*n)).collect();
    for name in &members {
        let manifest = rust.join(name).join("Cargo.toml");
        let text = std::fs::read_to_string(&manifest).unwrap();
        let member = text
            .strip_suffix("[workspace]\n")
            .unwrap_or_else(|| panic!("{name}: the manifest no longer ends in its own [workspace]:\n{text}"));
        std::fs::write(&manifest, member).unwrap();
    }
    let list: Vec<String> = members.iter().map(|n| format!("{n:?}")).collect();
    std::fs::write(
        rust.join("Cargo.toml"),
        format!("[workspace]\nresolver = \"3\"\nmembers = [{}]\n", list.join(", ")),
    )
    .unwrap();
    // The component (its export only exists on wasm32), then the rules'
    // tests, natively as `cargo test` runs them (the SDK's harness is native).
    run(Command::new("cargo")
        .args(["check", "--workspace", "--lib", "--target", "wasm32-wasip2", "--quiet"])
        .current_dir(&rust));
    run(Command::new("cargo")
        .args(["check", "--workspace", "--tests", "--quiet"])
        .current_dir(&rust));

    // Python.
    let python = tmp.path().join("python");
    let refused = scaffold_all(tmp.path(), &python, &names, "python");
    assert!(refused.is_empty(), "{refused:#?}");
    let bindings = tmp.path().join("python-bindings");
    let any = python.join(names.first().unwrap());
    run(Command::new("componentize-py")
        .args(["-d", "wit", "-w", "rule", "bindings"])
        .arg(&bindings)
        .current_dir(&any));
    let checked = run(Command::new("python3")
        .arg("-c")
        .arg(PYTHON_IMPORTS_EVERY_RULE)
        .arg(&bindings)
        .args(names.iter().map(|n| python.join(n).join("app.py"))));
    assert_eq!(checked.trim(), format!("{} rules imported", names.len()), "{checked}");

    // JavaScript.
    let js = tmp.path().join("js");
    let refused = scaffold_all(tmp.path(), &js, &names, "js");
    assert!(refused.is_empty(), "{refused:#?}");
    for name in &names {
        let dir = js.join(name);
        run(Command::new("node").args(["--check", "rule.js"]).current_dir(&dir));
        let package: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("package.json")).unwrap()).unwrap();
        assert_eq!(package["name"], name.as_str());
        assert_eq!(package["type"], "module", "node --check read rule.js as a module");
    }
}

/// Imports each `app.py` given after the bindings directory as a module of
/// its own, and checks its `WitWorld` implements the bindings' world and
/// names the rule as its directory does.
const PYTHON_IMPORTS_EVERY_RULE: &str = r#"
import importlib.util, pathlib, sys
sys.path.insert(0, sys.argv[1])
import wit_world
for i, path in enumerate(sys.argv[2:]):
    spec = importlib.util.spec_from_file_location(f"rule_{i}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # The world is a Protocol: the rule class names it among its bases.
    assert wit_world.WitWorld in module.WitWorld.__mro__, path
    world = module.WitWorld()
    name = world.info().name
    assert name == pathlib.Path(path).parent.name, (path, name)
print(f"{len(sys.argv) - 2} rules imported")
"#;
