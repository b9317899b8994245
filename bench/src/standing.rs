//! B13: what author standing costs end to end: B4's embedded run with
//! `[standing]` off and on, side by side in one run, on B4's traffic with
//! every tenth item link spam from one of ten spammers (so strikes are
//! marked in the decisions' transactions and authors recomputed while the
//! items settle). The tiers have no effects, so every item is still judged
//! by the rules and the two runs settle the same work.

use crate::report::Figure;
use crate::system::{Gavel, Sizes, rust_plugins, settle_runs_with};
use std::path::Path;

pub async fn b13(gavel_bin: &Path, sizes: Sizes) -> anyhow::Result<Vec<Figure>> {
    let dir = tempfile::tempdir()?;
    let tuning = crate::system::B4_TUNING;
    let tiers = "[[standing.tiers]]\nname = \"good\"\nstrikes = 0\n[[standing.tiers]]\nname = \"watch\"\nstrikes = 2\n\
                 [[standing.tiers]]\nname = \"flagged\"\nstrikes = 8\n";
    let off = Gavel::start(gavel_bin, &dir.path().join("off"), &rust_plugins(), tuning).await?;
    let ((o, o_lo, o_hi), o_cpu) = settle_runs_with(&[&off], sizes.runs, sizes.items, 1, 10).await?;
    drop(off);
    let on = Gavel::start(
        gavel_bin,
        &dir.path().join("on"),
        &rust_plugins(),
        &format!("{tuning}[standing]\nenabled = true\n{tiers}"),
    )
    .await?;
    let ((n, n_lo, n_hi), n_cpu) = settle_runs_with(&[&on], sizes.runs, sizes.items, 1, 10).await?;
    let metrics = reqwest::get(format!("{}/metrics", on.url)).await?.text().await?;
    drop(on);
    let counter = |name: &str| {
        metrics
            .lines()
            .filter(|l| l.starts_with(name))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
    };
    let recomputations = counter("gavel_author_recomputations_total");
    let transitions = counter("gavel_author_transitions_total");
    Ok(vec![
        Figure::new("B13", "submitted → settled, embedded, standing on", n, "items/s")
            .spread(n_lo, n_hi)
            .against("standing off", o)
            .goal("≥ 0.9 × off", n >= 0.9 * o)
            .note(format!(
                "{} items per run, a tenth link spam from 10 authors; off: {o_lo:.0}–{o_hi:.0}; \
                 {recomputations:.0} recomputations, {transitions:.0} account transitions in all runs",
                sizes.items
            )),
        Figure::new("B13", "CPU per settled item, standing on", n_cpu, "µs")
            .against("standing off", o_cpu)
            .note("the gavel process, user + system (/proc), ÷ items"),
    ])
}
