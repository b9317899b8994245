//! B1 and B2 from criterion's results (`cargo bench -p gavel-bench --bench
//! rules` writes them under `target/criterion`).

use crate::report::Figure;
use std::path::Path;

/// Per-iteration times (µs) of one criterion benchmark: (median, min, max).
fn times(dir: &Path, group: &str, function: &str) -> anyhow::Result<(f64, f64, f64)> {
    let path = dir
        .join(group.replace('/', "_"))
        .join(function)
        .join("new")
        .join("sample.json");
    let text = std::fs::read_to_string(&path).map_err(|e| {
        anyhow::anyhow!(
            "{}: {e} (run `cargo bench -p gavel-bench --bench rules` first)",
            path.display()
        )
    })?;
    let sample: serde_json::Value = serde_json::from_str(&text)?;
    let iters = sample["iters"].as_array().cloned().unwrap_or_default();
    let totals = sample["times"].as_array().cloned().unwrap_or_default();
    let mut per: Vec<f64> = iters
        .iter()
        .zip(&totals)
        .filter_map(|(i, t)| Some(t.as_f64()? / i.as_f64()? / 1_000.0))
        .collect();
    anyhow::ensure!(!per.is_empty(), "{}: no samples", path.display());
    per.sort_by(f64::total_cmp);
    Ok((per[per.len() / 2], per[0], per[per.len() - 1]))
}

pub fn figures(criterion: &Path) -> anyhow::Result<Vec<Figure>> {
    let mut out = Vec::new();
    for plugin in ["link-spam", "duplicate-burst", "flag-ratio", "banned-terms"] {
        let group = format!("b1/{plugin}");
        let (fresh, lo, hi) = times(criterion, &group, "wasm_fresh")?;
        let (native, ..) = times(criterion, &group, "native")?;
        let (reused, ..) = times(criterion, &group, "wasm_reused")?;
        out.push(
            Figure::new("B1", format!("{plugin}: fresh instance, limits on"), fresh, "µs")
                .spread(lo, hi)
                .against("native (SDK harness)", native)
                .goal("≤ 10 µs median (fresh instance)", fresh <= 10.0),
        );
        out.push(
            Figure::new("B1", format!("{plugin}: fresh vs reused instance"), fresh, "µs")
                .against("reused instance", reused)
                .note(format!(
                    "isolation (a fresh instance per evaluation) costs {:.1} µs per evaluation here",
                    fresh - reused
                )),
        );
    }
    let (python, lo, hi) = times(criterion, "b2/shouting-python", "wasm_fresh")?;
    let (rust, ..) = times(criterion, "b2/shouting-rust", "wasm_fresh")?;
    let (python_reused, ..) = times(criterion, "b2/shouting-python", "wasm_reused")?;
    out.push(
        Figure::new("B2", "shouting (Python): fresh instance", python, "µs")
            .spread(lo, hi)
            .against("same logic in Rust, fresh", rust)
            .goal("≤ 300 µs fresh", python <= 300.0),
    );
    out.push(
        Figure::new("B2", "shouting (Python): reuse_instances = true", python_reused, "µs")
            .against("fresh instance", python)
            .note("opt-in per plugin (sidecar); trade-off: state one evaluation leaves is visible to the next"),
    );
    let (js, lo, hi) = times(criterion, "b2/shouting-js", "wasm_fresh")?;
    let (js_reused, ..) = times(criterion, "b2/shouting-js", "wasm_reused")?;
    let (rust_reused, ..) = times(criterion, "b2/shouting-rust", "wasm_reused")?;
    out.push(
        Figure::new("B2", "shouting (JavaScript): fresh instance", js, "µs")
            .spread(lo, hi)
            .against("same logic in Python, fresh", python)
            .goal("≤ 200 µs fresh", js <= 200.0)
            .note(format!("the same logic in Rust takes {rust:.1} µs fresh")),
    );
    out.push(
        Figure::new("B2", "shouting (JavaScript): reuse_instances = true", js_reused, "µs")
            .against("Python, reused", python_reused)
            .note(format!(
                "a 12 MB component carrying a JavaScript engine; the same logic in Rust takes {rust_reused:.1} µs reused"
            )),
    );
    Ok(out)
}
