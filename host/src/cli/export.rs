//! `gavel export`: the record, for a warehouse (see `crate::export`).
//! Reads the store `gavel serve` uses, running or stopped; writes nothing
//! to it.

use super::history::{StoreFlags, open_store, parse_time};
use crate::clock::Millis;
use crate::export::{self, Format};
use crate::store::{ExportFilter, ExportTable};
use anyhow::Context;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct ExportArgs {
    /// decisions, transitions, items or authors.
    pub table: ExportTable,
    /// ndjson, csv or parquet.
    #[arg(long, default_value = "ndjson")]
    pub format: Format,
    /// Write to this file (`-`: standard output).
    #[arg(long, default_value = "-")]
    pub out: PathBuf,
    /// Rows from this time on (by `created_at`; authors by `last_seen`):
    /// ms since the epoch, or an age such as `24h`, `7d` (default: all).
    #[arg(long, value_parser = parse_time)]
    pub since: Option<Millis>,
    /// Rows before this time, as `--since` (default: no end).
    #[arg(long, value_parser = parse_time)]
    pub until: Option<Millis>,
    /// Only this client's rows.
    #[arg(long)]
    pub client: Option<String>,
    /// Continue behind the cursor an earlier export ended with.
    #[arg(long)]
    pub after: Option<String>,
    /// Write the cursor this export ends with to this file (it is also
    /// printed on standard error).
    #[arg(long)]
    pub cursor_out: Option<PathBuf>,
    #[command(flatten)]
    pub store: StoreFlags,
}

pub async fn export(args: ExportArgs) -> anyhow::Result<ExitCode> {
    let table = args.table;
    let after = export::parse_cursor(table, args.after.as_deref().unwrap_or("")).map_err(anyhow::Error::msg)?;
    let filter = ExportFilter {
        since: args.since.unwrap_or(Millis::MIN),
        until: args.until.unwrap_or(Millis::MAX),
        client: args.client.clone(),
    };
    anyhow::ensure!(filter.since < filter.until, "--since must be before --until");
    let (_, store) = open_store(&args.store).await?;
    let to_stdout = args.out.as_os_str() == "-";
    anyhow::ensure!(
        !(to_stdout && args.format == Format::Parquet && std::io::IsTerminal::is_terminal(&std::io::stdout())),
        "Parquet is binary: give --out FILE"
    );
    let out: Box<dyn Write + Send> = if to_stdout {
        Box::new(std::io::stdout())
    } else {
        Box::new(std::fs::File::create(&args.out).with_context(|| format!("creating {}", args.out.display()))?)
    };
    let mut writer = export::writer(args.format, table, out)?;
    // A spinner with the count and rate, on a terminal only.
    let bar = indicatif::ProgressBar::new_spinner();
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} {pos} rows of {msg} ({per_sec}, {elapsed})")
            .expect("a valid template"),
    );
    bar.set_message(table.as_str());
    let mut run = export::Export::start(store, table, filter, after).await?;
    while run.next_page(writer.as_mut()).await? {
        bar.set_position(run.rows());
    }
    writer.finish()?;
    bar.finish_and_clear();
    let cursor = export::cursor_text(&run.cursor());
    if let Some(path) = &args.cursor_out {
        std::fs::write(path, format!("{cursor}\n")).with_context(|| format!("writing {}", path.display()))?;
    }
    eprintln!(
        "exported {} {} rows; continue with --after '{cursor}'",
        run.rows(),
        table.as_str()
    );
    Ok(ExitCode::SUCCESS)
}
