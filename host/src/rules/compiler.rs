//! Compiling components in a child process ([`RuleEngine::with_compiler_process`]).
//!
//! The parent hands the component's bytes to `gavel compile-component` on
//! standard input; the child compiles them with the engine's compiler
//! settings ([`super::compiler_config`]) and writes the artifact into the
//! compilation cache's directory, where the parent renames it into place
//! and maps it, as an artifact of its own. The child's allocations end with
//! it: loading the Python example into `gavel serve` left ~47 MiB of
//! compiler heap in the server's malloc arenas when it compiled in process,
//! a cache hit ~3 MiB (README, "Performance", B8).

use super::plugin::LoadErrorKind;
use super::{CompileCache, RuleEngine, compiler_config};
use crate::domain::Digest;
use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};
use wasmtime::component::Component;

/// The (hidden) subcommand a child compiler runs.
pub const SUBCOMMAND: &str = "compile-component";

/// The child's side: reads a component from standard input, compiles it as
/// an engine with a wasm stack limit of `stack_bytes` does, writes the
/// artifact to `output` and prints its own peak memory on standard output
/// (`peak_rss_kib N`), which the parent logs.
pub fn compile_from_stdin(stack_bytes: usize, output: &Path) -> anyhow::Result<()> {
    let mut bytes = Vec::new();
    std::io::stdin().read_to_end(&mut bytes)?;
    let engine =
        wasmtime::Engine::new(&compiler_config(stack_bytes)).map_err(|e| anyhow::anyhow!("wasmtime engine: {e:#}"))?;
    let artifact = engine
        .precompile_component(&bytes)
        .map_err(|e| anyhow::anyhow!("{e:#}"))?;
    std::fs::write(output, &artifact).map_err(|e| anyhow::anyhow!("writing {}: {e}", output.display()))?;
    if let Some(peak) = peak_rss_kib() {
        println!("peak_rss_kib {peak}");
    }
    Ok(())
}

/// This process's peak resident memory (`VmHWM`), in KiB.
fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

impl RuleEngine {
    /// Compiles `bytes` in a child `program compile-component` into `cache`
    /// and maps the artifact. The child is killed once it has run for the
    /// limits' `compile_timeout`; a child that fails, is killed or crashes
    /// is a compile error of this load, and the previous version of the
    /// plugin (if any) stays. `None` when no child could be started (the
    /// caller then compiles in process).
    pub(super) fn compile_in_child(
        &self,
        program: &Path,
        cache: &CompileCache,
        digest: &Digest,
        bytes: &[u8],
    ) -> Option<Result<Component, LoadErrorKind>> {
        let tmp = cache.temp_path(digest);
        let started = Instant::now();
        let peak_kib = match run_child(
            program,
            self.limits.stack_bytes,
            &tmp,
            bytes,
            self.limits.compile_timeout,
        ) {
            Ok(peak) => peak,
            Err(Child::NotStarted(e)) => {
                tracing::warn!(program = %program.display(), error = %e, "cannot start a child compiler; compiling in this process");
                return None;
            }
            Err(Child::Failed(e)) => {
                let _ = std::fs::remove_file(&tmp);
                return Some(Err(LoadErrorKind::Compile(e)));
            }
        };
        let component = match cache.adopt_and_map(&self.engine, digest, &tmp) {
            Ok(component) => component,
            Err(e) => return Some(Err(LoadErrorKind::Compile(e))),
        };
        tracing::info!(
            digest = %digest,
            seconds = started.elapsed().as_secs_f64(),
            peak_rss_mib = peak_kib.map(|k| k / 1024),
            "compiled in a child process"
        );
        Some(Ok(component))
    }
}

/// Why a child compiler did not produce an artifact.
enum Child {
    /// It could not be started (the program is gone, or the system is out
    /// of processes or memory): nothing was compiled.
    NotStarted(String),
    /// It ran and failed, was killed, or timed out.
    Failed(String),
}

/// Runs one child compiler to its end: `Ok` with its reported peak memory
/// when it wrote the artifact, else why not.
fn run_child(
    program: &Path,
    stack_bytes: usize,
    output: &Path,
    bytes: &[u8],
    timeout: Duration,
) -> Result<Option<u64>, Child> {
    let mut child = Command::new(program)
        .arg(SUBCOMMAND)
        .arg("--max-wasm-stack")
        .arg(stack_bytes.to_string())
        .arg("--output")
        .arg(output)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Child::NotStarted(e.to_string()))?;
    // Read on threads of their own, so a child writing more than a pipe
    // holds never blocks on it.
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    // A child that ends early (it cannot fail to read) closes the pipe: the
    // write fails and its exit status says why.
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(bytes);
    }
    let status = wait_until(&mut child, timeout).map_err(Child::Failed)?;
    let (stdout, stderr) = (stdout.join().unwrap_or_default(), stderr.join().unwrap_or_default());
    if status.success() {
        let peak = stdout
            .lines()
            .find_map(|l| l.strip_prefix("peak_rss_kib "))
            .and_then(|v| v.trim().parse().ok());
        return Ok(peak);
    }
    Err(Child::Failed(failure(status, &stderr)))
}

/// Waits for `child` to exit, killing it once it has run for `timeout`.
fn wait_until(child: &mut std::process::Child, timeout: Duration) -> Result<ExitStatus, String> {
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_millis(1);
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Ok(status),
            Ok(None) => {}
            Err(e) => return Err(format!("waiting for the compiler process: {e}")),
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "compilation took longer than {} ms; the compiler process was stopped",
                timeout.as_millis()
            ));
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(25));
    }
}

/// Why a child compiler failed: the error it printed (`error: …`, its last
/// line of that form), else how it ended.
fn failure(status: ExitStatus, stderr: &str) -> String {
    if let Some(error) = stderr.lines().rev().find_map(|l| l.strip_prefix("error: ")) {
        return error.to_string();
    }
    #[cfg(unix)]
    if let Some(signal) = std::os::unix::process::ExitStatusExt::signal(&status) {
        return format!("the compiler process was killed by signal {signal}");
    }
    format!("the compiler process failed ({status})")
}

/// Reads a child's pipe to its end on a thread of its own.
fn drain<R: Read + Send + 'static>(pipe: Option<R>) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(mut pipe) = pipe {
            let mut raw = Vec::new();
            let _ = pipe.read_to_end(&mut raw);
            text = String::from_utf8_lossy(&raw).into_owned();
        }
        text
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_names_the_error_the_child_printed_else_how_it_ended() {
        use std::os::unix::process::ExitStatusExt;
        let exited = ExitStatus::from_raw(2 << 8);
        assert_eq!(
            failure(exited, "INFO something\nerror: failed to parse WebAssembly module\n"),
            "failed to parse WebAssembly module"
        );
        assert_eq!(failure(exited, ""), "the compiler process failed (exit status: 2)");
        assert_eq!(
            failure(ExitStatus::from_raw(9), "half a line"),
            "the compiler process was killed by signal 9"
        );
    }
}
