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

/// What `gavel export` writes: a table, or the statements of reasons.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExportWhat {
    Table(ExportTable),
    /// Statements of reasons, for the DSA Transparency Database's batch
    /// endpoint: NDJSON, one `{"statements": [...]}` body of at most 100
    /// per line.
    Statements,
}

impl std::str::FromStr for ExportWhat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s == "statements" {
            return Ok(ExportWhat::Statements);
        }
        s.parse()
            .map(ExportWhat::Table)
            .map_err(|_| format!("unknown table {s:?}: decisions, transitions, items, authors or statements"))
    }
}

#[derive(Debug, clap::Args)]
pub struct ExportArgs {
    /// decisions, transitions, items, authors or statements.
    pub table: ExportWhat,
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
    let table = match args.table {
        ExportWhat::Table(t) => t,
        ExportWhat::Statements => return export_statements(args).await,
    };
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

/// Statements per line of `gavel export statements`: the Transparency
/// Database's batch endpoint takes at most 100 per request.
pub const STATEMENTS_PER_BATCH: usize = 100;

/// `gavel export statements`: every restrictive decision's statement of
/// reasons, oldest first, as NDJSON lines of `{"statements": [...]}` (at
/// most [`STATEMENTS_PER_BATCH`] each), ready to send to the DSA
/// Transparency Database's batch endpoint. The cursor is the last
/// decision's transition id.
async fn export_statements(args: ExportArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        args.format == Format::Ndjson,
        "statements are exported as NDJSON only (the Transparency Database's batch bodies)"
    );
    let (mut items_after, mut accounts_after) = parse_statements_cursor(args.after.as_deref().unwrap_or(""))?;
    let since = args.since.unwrap_or(Millis::MIN);
    let until = args.until.unwrap_or(Millis::MAX);
    anyhow::ensure!(since < until, "--since must be before --until");
    let (config, store) = open_store(&args.store).await?;
    let policies = crate::domain::statements::Policies::new(&config.policies, &config.statements);
    let mut out: Box<dyn Write + Send> = if args.out.as_os_str() == "-" {
        Box::new(std::io::BufWriter::new(std::io::stdout()))
    } else {
        Box::new(std::io::BufWriter::new(
            std::fs::File::create(&args.out).with_context(|| format!("creating {}", args.out.display()))?,
        ))
    };
    let mut written = 0u64;
    let mut emit = |out: &mut Box<dyn Write + Send>, batch: Vec<crate::domain::statements::Statement>| {
        written += batch.len() as u64;
        if batch.is_empty() {
            return Ok::<_, anyhow::Error>(());
        }
        serde_json::to_writer(&mut *out, &serde_json::json!({ "statements": batch }))?;
        out.write_all(b"\n")?;
        Ok(())
    };
    // The items' decisions, then the accounts', each in id order.
    loop {
        let page = store
            .restrictive_transitions(
                items_after,
                since,
                until,
                args.client.as_deref(),
                STATEMENTS_PER_BATCH as i64,
            )
            .await?;
        let Some((last, _)) = page.last() else {
            break;
        };
        let mut batch = Vec::with_capacity(page.len());
        let mut details = std::collections::HashMap::new();
        for (id, item) in &page {
            if !details.contains_key(item) {
                details.insert(item.clone(), store.item_details(item).await?);
            }
            let Some(Some(d)) = details.get(item) else {
                continue;
            };
            if let Some(t) = d.transitions.iter().find(|t| t.id == *id) {
                batch.push(crate::statements::derive(d, t, &policies).statement);
            }
        }
        items_after = *last;
        emit(&mut out, batch)?;
    }
    loop {
        let page = store
            .author_transitions_after(
                accounts_after,
                since,
                until,
                args.client.as_deref(),
                STATEMENTS_PER_BATCH as i64,
            )
            .await?;
        let Some((_, last)) = page.last() else {
            break;
        };
        accounts_after = last.id;
        let batch = page
            .iter()
            .filter(|(_, t)| crate::statements::account_has_statement(t, &config.standing))
            .map(|(record, t)| crate::statements::derive_account(record, t, &config.standing, &policies).statement)
            .collect();
        emit(&mut out, batch)?;
    }
    out.flush()?;
    let cursor = format!("{items_after}.{accounts_after}");
    if let Some(path) = &args.cursor_out {
        std::fs::write(path, format!("{cursor}\n")).with_context(|| format!("writing {}", path.display()))?;
    }
    eprintln!("exported {written} statements; continue with --after '{cursor}'");
    Ok(ExitCode::SUCCESS)
}

/// The cursor `gavel export statements` ends with: the last item
/// transition and the last account transition it read, `ITEMS.ACCOUNTS`.
fn parse_statements_cursor(text: &str) -> anyhow::Result<(i64, i64)> {
    if text.is_empty() {
        return Ok((0, 0));
    }
    let bad = || anyhow::anyhow!("--after {text:?} is not a cursor of statements (ITEMS.ACCOUNTS)");
    let (items, accounts) = text.split_once('.').ok_or_else(bad)?;
    let n = |s| crate::domain::parse_decimal(s).ok_or_else(bad);
    Ok((n(items)?, n(accounts)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statement_cursors_name_both_logs() {
        assert_eq!(parse_statements_cursor("").unwrap(), (0, 0));
        assert_eq!(parse_statements_cursor("12.7").unwrap(), (12, 7));
        assert!(parse_statements_cursor("12").is_err());
        assert!(parse_statements_cursor("a.1").is_err());
    }
}
