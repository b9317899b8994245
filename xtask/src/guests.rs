// Building the WebAssembly guests (example plugins and test fixtures).
//
// Shared by `cargo xtask` and by `tests/build.rs` (which `include!`s this
// file), so the commands that build a plugin exist once.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The wasm target every guest is built for.
pub const WASM_TARGET: &str = "wasm32-wasip2";
/// A 64 KiB shadow stack instead of the linker's 1 MiB default: a rule's
/// stack then sits in the first pages of its linear memory, which the host
/// keeps resident between fresh instances, so an evaluation does not
/// page-fault its stack in (about 24 → 11 µs per fresh evaluation). The
/// same setting is in `plugins/.cargo/config.toml` for builds run by hand.
pub const GUEST_RUSTFLAGS: &str = r#"target.wasm32-wasip2.rustflags=["-C", "link-arg=-zstack-size=65536"]"#;

/// The componentize-py release the Python example is built and tested with.
pub const COMPONENTIZE_PY: &str = "componentize-py==0.25.1";

/// Whether `out` exists and is newer than every file in `sources`.
fn up_to_date(out: &Path, sources: &[PathBuf]) -> bool {
    let newest_source = sources
        .iter()
        .filter_map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
        .max();
    let built = std::fs::metadata(out).and_then(|m| m.modified()).ok();
    matches!((newest_source, built), (Some(src), Some(built)) if built > src)
}

/// A built guest: its crate or module name and the path of its component.
#[derive(Debug, Clone)]
pub struct Guest {
    pub name: String,
    pub wasm: PathBuf,
}

/// `cargo build --release --target wasm32-wasip2` of the workspace at
/// `manifest` into `target_dir`; returns one guest per cdylib member.
pub fn build_rust_guests(cargo: &str, manifest: &Path, target_dir: &Path) -> Result<Vec<Guest>, String> {
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--release", "--quiet", "--target", WASM_TARGET])
        .args(["--config", GUEST_RUSTFLAGS, "--manifest-path"])
        .arg(manifest)
        .arg("--target-dir")
        .arg(target_dir);
    // Flags meant for the outer (host) build must not leak into the guest build.
    for var in [
        "CARGO_ENCODED_RUSTFLAGS",
        "RUSTFLAGS",
        "CARGO_BUILD_RUSTFLAGS",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "CARGO_MANIFEST_DIR",
        "CARGO_PRIMARY_PACKAGE",
    ] {
        cmd.env_remove(var);
    }
    let status = cmd.status().map_err(|e| format!("running {cargo}: {e}"))?;
    if !status.success() {
        return Err(format!(
            "building the guests of {} failed ({status}); is the {WASM_TARGET} target installed? \
             (`rustup target add {WASM_TARGET}`)",
            manifest.display()
        ));
    }
    let out = target_dir.join(WASM_TARGET).join("release");
    let members = workspace_members(manifest)?;
    Ok(members
        .into_iter()
        .map(|name| Guest {
            wasm: out.join(format!("{}.wasm", name.replace('-', "_"))),
            name,
        })
        .collect())
}

/// The member directory names of a workspace manifest (`members = [...]`).
fn workspace_members(manifest: &Path) -> Result<Vec<String>, String> {
    let text = std::fs::read_to_string(manifest).map_err(|e| format!("{}: {e}", manifest.display()))?;
    let list = text
        .split_once("members = [")
        .and_then(|(_, rest)| rest.split_once(']'))
        .map(|(list, _)| list)
        .ok_or_else(|| format!("{}: no `members = [...]`", manifest.display()))?;
    Ok(list
        .split(',')
        .map(|m| m.trim().trim_matches('"').to_string())
        .filter(|m| !m.is_empty())
        .collect())
}

/// Builds a Python rule (`app.py` in `dir`) with componentize-py into
/// `out`, unless `out` is newer than every source it depends on.
pub fn build_python_guest(dir: &Path, wit: &Path, out: &Path) -> Result<Guest, String> {
    let name = dir.file_name().unwrap_or_default().to_string_lossy().to_string();
    let guest = Guest {
        name: name.clone(),
        wasm: out.to_path_buf(),
    };
    if up_to_date(out, &[dir.join("app.py"), wit.join("rules.wit")]) {
        return Ok(guest);
    }
    if let Some(parent) = out.parent() {
        std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    }
    let status = Command::new("componentize-py")
        .arg("-d")
        .arg(wit)
        // --stub-wasi: CPython's WASI imports (files, sockets) become trapping
        // stubs, so the component imports only the contract.
        .args(["-w", "rule", "componentize", "--stub-wasi", "-p"])
        .arg(dir)
        .args(["app", "-o"])
        .arg(out)
        .stdout(std::process::Stdio::null())
        .status()
        .map_err(|e| {
            format!(
                "running componentize-py: {e}. Install it with `pip install {COMPONENTIZE_PY}` \
                 (`cargo xtask test` does this for you)"
            )
        })?;
    if !status.success() {
        return Err(format!("componentize-py failed on {} ({status})", dir.display()));
    }
    Ok(guest)
}

/// Builds a JavaScript rule (`rule.js` in `dir`, with its package.json and
/// package-lock.json) into `out`: `npm ci` when its node_modules is missing
/// or older than the lock file, then `jco componentize` with every WASI
/// feature disabled, so the component imports only the contract.
pub fn build_js_guest(dir: &Path, wit: &Path, out: &Path) -> Result<Guest, String> {
    let name = dir.file_name().unwrap_or_default().to_string_lossy().to_string();
    let guest = Guest {
        name,
        wasm: out.to_path_buf(),
    };
    let lock = dir.join("package-lock.json");
    let installed = dir.join("node_modules/.package-lock.json");
    if !up_to_date(&installed, &[lock.clone(), dir.join("package.json")]) {
        let status = Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund", "--loglevel=error"])
            .current_dir(dir)
            .stdout(std::process::Stdio::null())
            .status()
            .map_err(|e| format!("running npm (Node.js 20 or later is needed for JavaScript rules): {e}"))?;
        if !status.success() {
            return Err(format!("npm ci failed in {} ({status})", dir.display()));
        }
    }
    if up_to_date(out, &[dir.join("rule.js"), dir.join("package.json"), wit.join("rules.wit"), lock]) {
        return Ok(guest);
    }
    if let Some(parent) = out.parent() {
        std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    }
    let status = Command::new(dir.join("node_modules/.bin/jco"))
        .args(["componentize", "rule.js", "--world-name", "rule", "--disable", "all", "--wit"])
        .arg(wit)
        .arg("-o")
        .arg(out)
        .current_dir(dir)
        .stdout(std::process::Stdio::null())
        .status()
        .map_err(|e| format!("running jco in {}: {e}", dir.display()))?;
    if !status.success() {
        return Err(format!("jco componentize failed on {} ({status})", dir.display()));
    }
    Ok(guest)
}
