//! gavel's developer commands, run as `cargo xtask <command>`:
//!
//! - `run`: install what is missing, build the example plugins into
//!   `plugins/`, show their verdicts on sample cases, then `gavel serve`.
//! - `test`: install what is missing, then run every test (the console's
//!   browser test included: it installs `tests/console`'s npm packages with
//!   `npm ci` when they are missing or older than the lock file).
//! - `bench [--quick]`: build in release mode and run every benchmark of
//!   docs/BENCHMARKS.md (B1–B18); prints the table and writes `bench-results.json`
//!   (`--quick`: small counts, `bench-results-quick.json`). `test` runs the
//!   quick benchmarks on its own (dev) build to prove they still run,
//!   asserting no times.
//! - `build-plugins [DIR]`: build the example plugins and copy them, named
//!   after the plugin (`link-spam.wasm`, ...), into DIR (default `plugins/`,
//!   the directory `gavel serve` loads by default).
//!
//! Each command installs what a fresh machine lacks or says exactly what is
//! missing: the wasm32-wasip2 target and componentize-py (every command);
//! Node.js and npm (all but `bench`); schemathesis, DuckDB's Python client,
//! the Python `standardwebhooks` library and Chromium (`test`);
//! PostgreSQL, redis-server and wrk (`test`, `bench`). Node.js, PostgreSQL,
//! redis-server, Chromium and wrk are Debian's packages, installed when
//! running as root.

include!("guests.rs");

use anyhow::{Context, bail};

fn main() -> std::process::ExitCode {
    // Said in one line, without a backtrace even under RUST_BACKTRACE: what
    // failed is the command named here, whose own output is just above.
    match xtask() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn xtask() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf();
    std::env::set_current_dir(&root)?;
    match args.first().map(String::as_str) {
        Some("run") => run(&root),
        Some("test") => test(&root),
        Some("bench") => bench(args.iter().any(|a| a == "--quick"), Profile::Release),
        Some("build-plugins") => {
            let dir = args.get(1).map(PathBuf::from).unwrap_or_else(|| root.join("plugins"));
            build_plugins(&root, &dir).map(|_| ())
        }
        _ => {
            eprintln!("usage: cargo xtask run | test | bench [--quick] | build-plugins [DIR]");
            std::process::exit(2)
        }
    }
}

fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

fn sh(cmd: &mut Command) -> anyhow::Result<()> {
    eprintln!("$ {}", describe(cmd));
    let status = cmd.status().with_context(|| format!("running {}", describe(cmd)))?;
    if !status.success() {
        bail!("{} failed ({status})", describe(cmd));
    }
    Ok(())
}

/// Runs a `cargo test` command like [`sh`], passing its output through as
/// it comes, and when it fails says again, last, what each failed test
/// said before its backtrace: a log that keeps only its tail (as CI's
/// does) then still holds why the tests failed, not only which.
fn tests(cmd: &mut Command) -> anyhow::Result<()> {
    use std::io::{BufRead, Write};
    eprintln!("$ {}", describe(cmd));
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .spawn()
        .with_context(|| format!("running {}", describe(cmd)))?;
    let mut failures = Failures::default();
    let mut out = std::io::stdout().lock();
    let mut reader = std::io::BufReader::new(child.stdout.take().expect("piped stdout"));
    let mut line = Vec::new();
    while reader.read_until(b'\n', &mut line)? > 0 {
        out.write_all(&line)?;
        out.flush()?;
        failures.read(&String::from_utf8_lossy(&line));
        line.clear();
    }
    drop(out);
    let status = child.wait()?;
    if !status.success() {
        let report = failures.report();
        if !report.is_empty() {
            eprintln!("\nwhat the failed tests said (their output above, in full):\n{report}");
        }
        bail!("{} failed ({status})", describe(cmd));
    }
    Ok(())
}

/// The failed tests of libtest's output, each with what it printed up to
/// its backtrace: the last [`Failures::LINES`] lines of it, where the panic
/// message is (a test's own log comes before it).
#[derive(Default)]
struct Failures {
    /// Each failed test, the lines kept and how many were cut before them.
    tests: Vec<(String, Vec<String>, usize)>,
    /// Inside a test's block, before its backtrace.
    open: bool,
}

impl Failures {
    const LINES: usize = 40;

    fn read(&mut self, line: &str) {
        let line = line.trim_end();
        if let Some(name) = line.strip_prefix("---- ").and_then(|l| l.strip_suffix(" stdout ----")) {
            self.tests.push((name.to_string(), Vec::new(), 0));
            self.open = true;
        } else if line == "failures:" || line.starts_with("test result:") || line.starts_with("stack backtrace:") {
            self.open = false;
        } else if self.open
            && !line.is_empty()
            && let Some((_, said, cut)) = self.tests.last_mut()
        {
            said.push(line.to_string());
            if said.len() > Self::LINES {
                said.remove(0);
                *cut += 1;
            }
        }
    }

    fn report(&self) -> String {
        let mut report = String::new();
        for (name, said, cut) in &self.tests {
            report.push_str(&format!("---- {name} ----\n"));
            if *cut > 0 {
                report.push_str(&format!("({cut} lines before these)\n"));
            }
            for line in said {
                report.push_str(line);
                report.push('\n');
            }
        }
        report
    }
}

fn describe(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

fn output(cmd: &mut Command) -> Option<String> {
    let out = cmd.output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The wasm32-wasip2 target, via rustup.
fn ensure_wasm_target() -> anyhow::Result<()> {
    let installed = output(Command::new("rustup").args(["target", "list", "--installed"]))
        .context("rustup is needed to install the wasm32-wasip2 target")?;
    if !installed.lines().any(|l| l.trim() == WASM_TARGET) {
        sh(Command::new("rustup").args(["target", "add", WASM_TARGET]))?;
    }
    Ok(())
}

/// componentize-py, which builds the Python guests, at the pinned version.
fn ensure_componentize_py() -> anyhow::Result<()> {
    ensure_pip_tool("componentize-py", COMPONENTIZE_PY)
}

/// schemathesis, which the suite runs against the OpenAPI document
/// (tests/tests/suite/schema.rs), at the version its settings were written for.
const SCHEMATHESIS: &str = "schemathesis==4.32.5";

fn ensure_schemathesis() -> anyhow::Result<()> {
    ensure_pip_tool("schemathesis", SCHEMATHESIS)
}

/// DuckDB's Python client, which the export tests load every format into
/// (tests/tests/suite/exports.rs): a reader no one here wrote.
const DUCKDB: &str = "duckdb==1.4.2";

/// The Standard Webhooks library the suite's receiver and provider are
/// built on (tests/standard_webhooks/peer.py).
const STANDARDWEBHOOKS: &str = "standardwebhooks==1.1.0";

/// Installs `spec` (`name==version`), a Python library, with pip unless
/// python3 already imports that version.
fn ensure_python_library(spec: &str) -> anyhow::Result<()> {
    let (name, wanted) = spec.split_once("==").expect("a pinned `name==version`");
    let check = format!("import importlib.metadata as m, {name}; print(m.version('{name}'))");
    let has = || output(Command::new("python3").args(["-c", &check])).is_some_and(|v| v.trim() == wanted);
    if !has() {
        sh(Command::new("python3").args(["-m", "pip", "install", "--quiet", spec]))?;
    }
    anyhow::ensure!(has(), "python3 cannot import {name} {wanted} after installing it");
    Ok(())
}

/// Installs `spec` (`name==version`) with pip unless `command --version`
/// already reports that version.
fn ensure_pip_tool(command: &str, spec: &str) -> anyhow::Result<()> {
    let wanted = spec.split("==").nth(1).expect("a pinned `name==version`");
    let runs = || output(Command::new(command).arg("--version")).is_some_and(|v| v.contains(wanted));
    if !runs() {
        let python = ["python3", "python"]
            .into_iter()
            .find(|p| output(Command::new(p).arg("--version")).is_some())
            .with_context(|| format!("python3 with pip is needed to install {command}"))?;
        sh(Command::new(python).args(["-m", "pip", "install", "--quiet", spec]))?;
    }
    anyhow::ensure!(
        runs(),
        "{command} {wanted} still not runnable after installing it (is pip's bin directory on PATH?)"
    );
    Ok(())
}

/// Builds the example plugins (Rust, Python and JavaScript) and copies them into `dir`
/// as `NAME.wasm`; returns (plugin path, cases.json path) pairs.
fn build_plugins(root: &Path, dir: &Path) -> anyhow::Result<Vec<(PathBuf, PathBuf)>> {
    ensure_wasm_target()?;
    ensure_componentize_py()?;
    ensure_node()?;
    let target = root.join("target/guests");
    let mut built = build_rust_guests(&cargo(), &root.join("plugins/Cargo.toml"), &target)
        .map_err(anyhow::Error::msg)?
        .into_iter()
        .map(|g| (g.clone(), root.join("plugins").join(&g.name)))
        .collect::<Vec<_>>();
    let py = root.join("plugins/python/shouting");
    let guest =
        build_python_guest(&py, &root.join("wit"), &target.join("python/shouting.wasm")).map_err(anyhow::Error::msg)?;
    built.push((guest, py));
    let js = root.join("plugins/js/shouting-js");
    let guest =
        build_js_guest(&js, &root.join("wit"), &target.join("js/shouting-js.wasm")).map_err(anyhow::Error::msg)?;
    built.push((guest, js));

    std::fs::create_dir_all(dir)?;
    let mut deployed = Vec::new();
    for (guest, src) in built {
        let dest = dir.join(format!("{}.wasm", guest.name));
        // Copy then rename: the plugin directory never holds a half-written file.
        let tmp = dir.join(format!(".{}.wasm.tmp", guest.name));
        std::fs::copy(&guest.wasm, &tmp).with_context(|| format!("copying {}", guest.wasm.display()))?;
        std::fs::rename(&tmp, &dest)?;
        deployed.push((dest, src.join("cases.json")));
    }
    eprintln!("built {} plugins into {}", deployed.len(), dir.display());
    Ok(deployed)
}

fn gavel_binary(root: &Path) -> anyhow::Result<PathBuf> {
    sh(Command::new(cargo()).args(["build", "--quiet", "--release", "-p", "gavel"]))?;
    Ok(root.join("target/release/gavel"))
}

fn run(root: &Path) -> anyhow::Result<()> {
    let plugins = build_plugins(root, &root.join("plugins"))?;
    let gavel = gavel_binary(root)?;
    // Show each example rule on its sample cases, then serve.
    for (wasm, cases) in &plugins {
        sh(Command::new(&gavel)
            .args(["plugin", "test"])
            .arg(wasm)
            .arg("--cases")
            .arg(cases))?;
    }
    eprintln!("\nstarting gavel serve on http://127.0.0.1:8080 (Ctrl-C to stop)");
    sh(Command::new(&gavel).arg("serve"))
}

/// PostgreSQL's server binaries (`initdb`, `postgres`), which the tests
/// start themselves: on PATH, in Debian's versioned directory, or installed
/// from Debian's packages when running as root.
fn ensure_postgres() -> anyhow::Result<()> {
    let on_path = || output(Command::new("initdb").arg("--version")).is_some();
    if on_path() {
        return Ok(());
    }
    let debian_bin = || {
        let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path().join("bin"))
            .filter(|b| b.join("initdb").is_file())
            .collect();
        dirs.sort();
        dirs.pop()
    };
    if debian_bin().is_none() {
        let is_root = output(Command::new("id").arg("-u")).is_some_and(|u| u.trim() == "0");
        anyhow::ensure!(
            is_root,
            "PostgreSQL (initdb, postgres) is not installed: install Debian's `postgresql` package"
        );
        sh(Command::new("apt-get").arg("update").arg("-qq"))?;
        sh(Command::new("apt-get").args(["install", "-y", "-qq", "postgresql"]))?;
    }
    let bin = debian_bin().context("PostgreSQL installed, but no /usr/lib/postgresql/*/bin/initdb")?;
    let path = std::env::var("PATH").unwrap_or_default();
    // SAFETY: xtask has one thread; the children it spawns inherit this PATH.
    unsafe { std::env::set_var("PATH", format!("{}:{path}", bin.display())) };
    anyhow::ensure!(on_path(), "initdb still not runnable from {}", bin.display());
    Ok(())
}

/// Where Debian's `chromium` package puts the browser the console's browser
/// test drives (tests/tests/suite/console.rs looks for it there).
const CHROMIUM: &str = "/usr/bin/chromium";

/// Chromium, from Debian's packages when missing (as root): playwright-core
/// drives this one and never downloads a browser of its own.
fn ensure_chromium() -> anyhow::Result<()> {
    if Path::new(CHROMIUM).is_file() {
        return Ok(());
    }
    let is_root = output(Command::new("id").arg("-u")).is_some_and(|u| u.trim() == "0");
    anyhow::ensure!(is_root, "{CHROMIUM} is missing: install Debian's `chromium` package");
    sh(Command::new("apt-get").arg("update").arg("-qq"))?;
    sh(Command::new("apt-get").args(["install", "-y", "-qq", "chromium"]))?;
    anyhow::ensure!(
        Path::new(CHROMIUM).is_file(),
        "{CHROMIUM} still missing after installing Debian's `chromium` package"
    );
    Ok(())
}

/// redis-server, from Debian's packages when missing (as root).
fn ensure_redis() -> anyhow::Result<()> {
    if output(Command::new("redis-server").arg("--version")).is_some() {
        return Ok(());
    }
    let is_root = output(Command::new("id").arg("-u")).is_some_and(|u| u.trim() == "0");
    anyhow::ensure!(
        is_root,
        "redis-server is not installed: install Debian's `redis-server` package"
    );
    sh(Command::new("apt-get").arg("update").arg("-qq"))?;
    sh(Command::new("apt-get").args(["install", "-y", "-qq", "redis-server"]))?;
    Ok(())
}

fn test(root: &Path) -> anyhow::Result<()> {
    ensure_wasm_target()?;
    ensure_componentize_py()?;
    ensure_node()?;
    ensure_schemathesis()?;
    ensure_python_library(DUCKDB)?;
    ensure_python_library(STANDARDWEBHOOKS)?;
    ensure_postgres()?;
    ensure_redis()?;
    // The console's browser test drives it (and runs `npm ci` for
    // playwright-core itself when its packages are missing or stale).
    ensure_chromium()?;
    // The kill tests run the real binary.
    sh(Command::new(cargo()).args(["build", "-p", "gavel"]))?;
    // Host crates and integration tests (the tests' build script builds every guest).
    tests(Command::new(cargo()).args(["test", "--workspace"]))?;
    // The example plugins' unit tests, natively through the SDK harness.
    sh(Command::new(cargo())
        .args(["test", "--manifest-path"])
        .arg(root.join("plugins/Cargo.toml")))?;
    // The benchmarks still run (small counts; no time is asserted), on the
    // build the tests just used: a second, optimised build of the whole tree
    // would cost a quarter of the command's time to prove what this proves.
    bench(true, Profile::Dev)
}

/// The cargo profile the benchmarks are built with.
#[derive(Clone, Copy)]
enum Profile {
    /// What `cargo xtask bench` measures: the figures of docs/BENCHMARKS.md.
    Release,
    /// The test build's: `cargo xtask test` proves every benchmark still runs.
    Dev,
}

impl Profile {
    fn name(self) -> &'static str {
        match self {
            Profile::Release => "release",
            Profile::Dev => "dev",
        }
    }

    /// The directory under `target/` cargo writes this profile's binaries to.
    fn dir(self) -> &'static str {
        match self {
            Profile::Release => "release",
            Profile::Dev => "debug",
        }
    }
}

/// The build, the criterion benchmarks (B1, B2), then `gavel-bench run`
/// (B3–B18, the table and the JSON file, which records the build's profile).
fn bench(quick: bool, profile: Profile) -> anyhow::Result<()> {
    ensure_wasm_target()?;
    ensure_componentize_py()?;
    ensure_postgres()?;
    ensure_redis()?;
    ensure_wrk()?;
    sh(Command::new(cargo()).args(["build", "--profile", profile.name(), "-p", "gavel", "-p", "gavel-bench"]))?;
    let mut criterion = Command::new(cargo());
    criterion.args([
        "bench",
        "--profile",
        profile.name(),
        "-p",
        "gavel-bench",
        "--bench",
        "rules",
    ]);
    if quick {
        criterion.env("GAVEL_BENCH_QUICK", "1");
    }
    sh(&mut criterion)?;
    let out = if quick {
        "bench-results-quick.json"
    } else {
        "bench-results.json"
    };
    let bin = Path::new("target").join(profile.dir());
    let mut run = Command::new(bin.join("gavel-bench"));
    run.arg("run")
        .arg("--gavel")
        .arg(bin.join("gavel"))
        .args(["--criterion", "target/criterion", "--out", out]);
    if quick {
        run.arg("--quick");
    }
    sh(&mut run)
}

/// Node.js and npm, which build JavaScript rules (jco and componentize-js
/// come from the npm registry, pinned in each rule's package-lock.json).
fn ensure_node() -> anyhow::Result<()> {
    // jco 1.35 and componentize-js 0.23 need Node.js 20 or later.
    let major = || {
        output(Command::new("node").arg("--version"))
            .and_then(|v| v.trim().trim_start_matches('v').split('.').next()?.parse::<u32>().ok())
    };
    let ready = || major().is_some_and(|m| m >= 20) && output(Command::new("npm").arg("--version")).is_some();
    if ready() {
        return Ok(());
    }
    let is_root = output(Command::new("id").arg("-u")).is_some_and(|u| u.trim() == "0");
    anyhow::ensure!(
        is_root && major().is_none(),
        "JavaScript rules need Node.js 20 or later with npm (found: {})",
        major().map_or("no node".into(), |m| format!("Node.js {m}"))
    );
    sh(Command::new("apt-get").arg("update").arg("-qq"))?;
    sh(Command::new("apt-get").args(["install", "-y", "-qq", "nodejs", "npm"]))?;
    anyhow::ensure!(
        ready(),
        "JavaScript rules need Node.js 20 or later with npm; Debian's package gave {}",
        major().map_or("no node".into(), |m| format!("Node.js {m}"))
    );
    Ok(())
}

/// wrk, the HTTP load generator of B3 (Debian's package).
fn ensure_wrk() -> anyhow::Result<()> {
    let present = || Command::new("wrk").arg("-v").output().is_ok();
    if present() {
        return Ok(());
    }
    let is_root = output(Command::new("id").arg("-u")).is_some_and(|u| u.trim() == "0");
    anyhow::ensure!(is_root, "wrk is not installed: install Debian's `wrk` package");
    sh(Command::new("apt-get").arg("update").arg("-qq"))?;
    sh(Command::new("apt-get").args(["install", "-y", "-qq", "wrk"]))?;
    anyhow::ensure!(present(), "wrk still not runnable after installing it");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::Failures;

    #[test]
    fn failures_keep_what_each_failed_test_said_before_its_backtrace() {
        let output = "\
running 3 tests
test a::passes ... ok
test a::fails ... FAILED
test b::fails ... FAILED

failures:

---- a::fails stdout ----

thread 'a::fails' panicked at tests/a.rs:3:5:
assertion `left == right` failed: the feed lacks item-1
stack backtrace:
   0: rust_begin_unwind
   1: core::panicking::panic_fmt
---- b::fails stdout ----
a line the test printed

thread 'b::fails' panicked at tests/b.rs:9:1:
timed out

failures:
    a::fails
    b::fails

test result: FAILED. 1 passed; 2 failed; 0 ignored
";
        let mut failures = Failures::default();
        for line in output.split_inclusive('\n') {
            failures.read(line);
        }
        assert_eq!(
            failures.report(),
            "\
---- a::fails ----
thread 'a::fails' panicked at tests/a.rs:3:5:
assertion `left == right` failed: the feed lacks item-1
---- b::fails ----
a line the test printed
thread 'b::fails' panicked at tests/b.rs:9:1:
timed out
"
        );
    }

    #[test]
    fn a_long_failure_keeps_its_last_lines_where_the_panic_is() {
        let mut failures = Failures::default();
        failures.read("---- t stdout ----\n");
        for i in 0..100 {
            failures.read(&format!("log line {i}\n"));
        }
        failures.read("thread 't' panicked at tests/t.rs:1:1:\n");
        failures.read("stack backtrace:\n");
        failures.read("   0: rust_begin_unwind\n");
        let report = failures.report();
        let lines: Vec<&str> = report.lines().collect();
        assert_eq!(lines.len(), 2 + Failures::LINES, "{report}");
        assert_eq!(lines[1], format!("({} lines before these)", 101 - Failures::LINES));
        assert_eq!(lines[2], format!("log line {}", 101 - Failures::LINES));
        assert_eq!(lines.last(), Some(&"thread 't' panicked at tests/t.rs:1:1:"));
    }
}
