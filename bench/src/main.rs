//! `gavel-bench`: runs B3–B16 (docs/BENCHMARKS.md), reads B1/B2 from
//! criterion's results, prints one table and writes `bench-results.json`. Run
//! it with `cargo xtask bench` (which builds everything in release mode and
//! runs the criterion benchmarks first).

// The allocator gavel's binary uses (host/src/main.rs), so B3's bare
// baseline, served by this binary, is compared on the same one.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

mod backlog;
mod baseline;
mod console;
mod exports;
mod history;
mod lists;
mod micro;
mod replay;
mod report;
mod signals;
mod standing;
mod system;
mod webhooks;

use clap::{Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser)]
#[command(about = "gavel's benchmark harness")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Runs every figure and reports.
    Run {
        /// Small counts: proves the harness runs; the figures mean nothing.
        #[arg(long)]
        quick: bool,
        /// The `gavel` binary to measure.
        #[arg(long, default_value = "target/release/gavel")]
        gavel: PathBuf,
        /// Where criterion wrote B1/B2.
        #[arg(long, default_value = "target/criterion")]
        criterion: PathBuf,
        #[arg(long, default_value = "bench-results.json")]
        out: PathBuf,
        /// Only these figures, e.g. `--only B3,B7`.
        #[arg(long, value_delimiter = ',')]
        only: Vec<String>,
    },
    /// The bare-axum baseline of B3 (started by `run`).
    #[command(hide = true)]
    BaselineServer {
        #[arg(long)]
        db: PathBuf,
        #[arg(long)]
        port: u16,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    match cli.command {
        Cmd::BaselineServer { db, port } => runtime.block_on(baseline::serve(&db, port)),
        Cmd::Run {
            quick,
            gavel,
            criterion,
            out,
            only,
        } => runtime.block_on(async move {
            let wants = |id: &str| only.is_empty() || only.iter().any(|o| o.eq_ignore_ascii_case(id));
            // B1/B2 read criterion's files and B6 runs the coordinator in
            // this process; the rest measure a server (B14 its list matchers
            // in this process too).
            let servers = [
                "B3", "B4", "B5", "B7", "B8", "B9", "B10", "B11", "B12", "B13", "B14", "B16", "B17", "B18",
            ];
            anyhow::ensure!(
                gavel.is_file() || !servers.iter().any(|id| wants(id)),
                "{} not found: build it (cargo build --release -p gavel)",
                gavel.display()
            );
            let sizes = system::Sizes::new(quick);
            let machine = report::Machine::describe(quick);
            let mut figures = Vec::new();
            if wants("B1") || wants("B2") {
                figures.extend(micro::figures(&criterion)?);
            }
            if wants("B3") {
                eprintln!("B3: POST /v1/items against the bare baseline (wrk)…");
                figures.extend(system::b3(&gavel, sizes).await?);
            }
            if wants("B4") {
                eprintln!("B4: submitted → settled, embedded and PostgreSQL + Redis…");
                figures.extend(system::b4(&gavel, sizes).await?);
            }
            if wants("B9") {
                eprintln!("B9: events accepted, single and batched…");
                figures.extend(system::b9(&gavel, sizes).await?);
            }
            if wants("B10") {
                eprintln!("B10: draining a backlog, embedded and PostgreSQL + Redis…");
                figures.extend(backlog::b10(&gavel, sizes).await?);
            }
            if wants("B18") {
                eprintln!("B18: a webhook backlog after an outage, embedded and PostgreSQL + Redis…");
                figures.extend(webhooks::b18(&gavel, sizes).await?);
            }
            if wants("B5") {
                eprintln!("B5: a 1,000-event burst…");
                figures.extend(system::b5(&gavel).await?);
            }
            if wants("B6") {
                eprintln!("B6: coordinator upserts…");
                figures.extend(system::b6(sizes).await?);
            }
            if wants("B7") {
                eprintln!("B7: hot-reload latency…");
                figures.extend(system::b7(&gavel, sizes).await?);
            }
            if wants("B8") {
                eprintln!("B8: memory…");
                figures.extend(system::b8(&gavel).await?);
            }
            if wants("B11") {
                eprintln!("B11: storing snapshots, and backtest throughput…");
                figures.extend(history::b11(&gavel, sizes).await?);
            }
            if wants("B13") {
                eprintln!("B13: author standing, off and on…");
                figures.extend(standing::b13(&gavel, sizes).await?);
            }
            if wants("B17") {
                eprintln!("B17: entity signals, three declared and none…");
                figures.extend(signals::b17(&gavel, sizes).await?);
            }
            if wants("B14") {
                eprintln!("B14: lists of 100,000 entries: compiling, and one lookup…");
                figures.extend(lists::b14(quick));
                eprintln!("B14: B4 with the examples on lists, against sidecar config…");
                figures.extend(lists::b4_on_lists(&gavel, sizes).await?);
            }
            if wants("B16") {
                eprintln!("B16: one item's replay over a long history…");
                figures.extend(replay::b16(&gavel, sizes).await?);
            }
            if wants("B15") {
                eprintln!("B15: exports of 1,000,000 decisions…");
                figures.extend(exports::b15(&gavel, sizes).await?);
            }
            if wants("B12") {
                eprintln!("B12: console pages over {} stored items…", sizes.console_items);
                figures.extend(console::b12(&gavel, sizes).await?);
            }
            report::print_table(&machine, &figures);
            let json = serde_json::to_string_pretty(&report::Results {
                machine: &machine,
                figures: &figures,
            })?;
            std::fs::write(&out, json + "\n")?;
            eprintln!("\nwrote {}", out.display());
            Ok(())
        }),
    }
}
