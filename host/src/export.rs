//! Exports of the record for analysts: `gavel export` and
//! `GET /v1/exports/{table}` page through the store ([`crate::store::exports`])
//! and write each row as NDJSON, CSV or Parquet, in constant memory.
//!
//! The columns are [`ExportTable::columns`], the same in every format: one
//! column per field; labels as a list (a JSON array in CSV); a time twice,
//! as RFC 3339 text to the second (in Parquet a `TIMESTAMP(MILLIS, UTC)`)
//! under its name and as epoch milliseconds under `NAME_ms`.
//!
//! An export ends with a cursor; one started after it continues exactly
//! there. For decisions and transitions (logs) the cursor is an id, and an
//! export covers the log up to its horizon, so exports continued from each
//! other's cursors miss and repeat nothing, even while gavel writes.

use crate::clock::Millis;
use crate::store::{Cell, Column, ColumnKind, ExportFilter, ExportKey, ExportTable, Exports, StoreError};
use parquet::basic::Compression;
use parquet::data_type::ByteArray;
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use std::io::{self, Write};
use std::sync::Arc;

/// Rows read from the store at a time.
pub const PAGE: i64 = 5_000;

/// Rows per Parquet row group: the Parquet writer's memory bound.
const ROW_GROUP: usize = 50_000;

/// An export's format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    Ndjson,
    Csv,
    Parquet,
}

impl Format {
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Ndjson => "application/x-ndjson",
            Format::Csv => "text/csv; charset=utf-8",
            Format::Parquet => "application/vnd.apache.parquet",
        }
    }
}

impl std::str::FromStr for Format {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "ndjson" => Ok(Format::Ndjson),
            "csv" => Ok(Format::Csv),
            "parquet" => Ok(Format::Parquet),
            _ => Err(format!("unknown format {s:?}: ndjson, csv or parquet")),
        }
    }
}

/// A cursor as the user sees it: a log's id, an item's id, or an author
/// as the JSON array `["CLIENT","AUTHOR"]`.
pub fn cursor_text(key: &ExportKey) -> String {
    match key {
        ExportKey::Start => String::new(),
        ExportKey::Id(id) => id.to_string(),
        ExportKey::Item(id) => id.clone(),
        ExportKey::Author(client, author) => serde_json::json!([client, author]).to_string(),
    }
}

/// Reads a cursor of `table` given by the user.
pub fn parse_cursor(table: ExportTable, text: &str) -> Result<ExportKey, String> {
    if text.is_empty() {
        return Ok(ExportKey::Start);
    }
    match table {
        ExportTable::Decisions | ExportTable::Transitions => crate::domain::parse_decimal(text)
            .map(ExportKey::Id)
            .ok_or_else(|| format!("a {} cursor is an id (a whole number), not {text:?}", table.as_str())),
        ExportTable::Items => Ok(ExportKey::Item(text.to_string())),
        ExportTable::Authors => serde_json::from_str::<(String, String)>(text)
            .map(|(c, a)| ExportKey::Author(c, a))
            .map_err(|_| format!("an authors cursor is [\"CLIENT\",\"AUTHOR\"], not {text:?}")),
    }
}

/// What went wrong in an export.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("writing the export: {0}")]
    Io(#[from] io::Error),
    #[error("writing Parquet: {0}")]
    Parquet(#[from] parquet::errors::ParquetError),
    #[error("writing CSV: {0}")]
    Csv(#[from] csv::Error),
}

/// An export under way: page after page, each behind the last.
pub struct Export {
    store: Arc<dyn Exports>,
    table: ExportTable,
    filter: ExportFilter,
    key: ExportKey,
    /// A log's horizon, read once at the start: the export stops there.
    upto: i64,
    rows: u64,
    done: bool,
}

impl Export {
    /// Starts an export of `table` behind `after`.
    pub async fn start(
        store: Arc<dyn Exports>,
        table: ExportTable,
        filter: ExportFilter,
        after: ExportKey,
    ) -> Result<Export, StoreError> {
        let upto = if table.is_log() {
            store.export_horizon(table).await?
        } else {
            0
        };
        Ok(Export {
            store,
            table,
            filter,
            key: after,
            upto,
            rows: 0,
            done: false,
        })
    }

    /// Writes the next page into `out`; `false` once the export is done.
    pub async fn next_page(&mut self, out: &mut dyn RowWriter) -> Result<bool, ExportError> {
        if self.done {
            return Ok(false);
        }
        let page = self
            .store
            .export_page(self.table, &self.filter, &self.key, self.upto, PAGE)
            .await?;
        self.done = (page.len() as i64) < PAGE;
        self.rows += page.len() as u64;
        for row in &page {
            out.row(&row.cells)?;
        }
        if let Some(last) = page.into_iter().last() {
            self.key = last.key;
        }
        Ok(!self.done)
    }

    /// The cursor a log's export ends with, known from the start: its
    /// horizon (or the cursor it started behind, if that is later).
    pub fn final_cursor(&self) -> ExportKey {
        match &self.key {
            ExportKey::Id(id) => ExportKey::Id((*id).max(self.upto)),
            _ => ExportKey::Id(self.upto),
        }
    }

    /// Rows written so far.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Where the next export continues. Once this one is done, a log's
    /// cursor is its horizon: every id up to it was covered, whatever the
    /// window or client let through.
    pub fn cursor(&self) -> ExportKey {
        if self.table.is_log() && self.done {
            self.final_cursor()
        } else {
            self.key.clone()
        }
    }
}

/// Writes rows in one format.
pub trait RowWriter: Send {
    fn row(&mut self, cells: &[Cell]) -> io::Result<()>;
    /// Pushes what is buffered on to the output (a row group stays
    /// buffered in Parquet until it is full).
    fn flush(&mut self) -> io::Result<()>;
    /// Ends the output (a Parquet file's footer).
    fn finish(self: Box<Self>) -> Result<(), ExportError>;
}

/// A writer of `format` for `table`'s columns into `out`.
pub fn writer<W: Write + Send + 'static>(
    format: Format,
    table: ExportTable,
    out: W,
) -> Result<Box<dyn RowWriter>, ExportError> {
    Ok(match format {
        Format::Ndjson => Box::new(Ndjson {
            out: io::BufWriter::with_capacity(1 << 16, out),
            columns: table.columns(),
            line: Vec::with_capacity(1024),
        }),
        Format::Csv => {
            let mut csv = csv::Writer::from_writer(out);
            csv.write_record(header(table.columns()))?;
            Box::new(Csv {
                out: csv,
                columns: table.columns(),
            })
        }
        Format::Parquet => Box::new(Parquet::new(table, out)?),
    })
}

/// The output columns' names (a time is two).
pub fn header(columns: &[Column]) -> Vec<String> {
    columns
        .iter()
        .flat_map(|c| match c.kind {
            ColumnKind::Time => vec![c.name.to_string(), format!("{}_ms", c.name)],
            _ => vec![c.name.to_string()],
        })
        .collect()
}

/// RFC 3339 in UTC to the second, `2026-12-03T19:31:53Z`: the form
/// readers that infer types (DuckDB's JSON and CSV readers among them) take
/// for a timestamp. The `_ms` column beside it keeps the milliseconds.
pub fn rfc3339(ms: Millis) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
        .unwrap_or_default()
}

struct Ndjson<W: Write> {
    out: io::BufWriter<W>,
    columns: &'static [Column],
    line: Vec<u8>,
}

impl<W: Write + Send> RowWriter for Ndjson<W> {
    fn row(&mut self, cells: &[Cell]) -> io::Result<()> {
        let line = &mut self.line;
        line.clear();
        line.push(b'{');
        for (i, (c, cell)) in self.columns.iter().zip(cells).enumerate() {
            if i > 0 {
                line.push(b',');
            }
            serde_json::to_writer(&mut *line, c.name)?;
            line.push(b':');
            match cell {
                Cell::Null if c.kind == ColumnKind::Time => {
                    write!(line, "null,\"{}_ms\":null", c.name)?;
                }
                Cell::Null => line.extend_from_slice(b"null"),
                Cell::Int(v) => write!(line, "{v}")?,
                Cell::Float(v) => serde_json::to_writer(&mut *line, v)?,
                Cell::Bool(v) => write!(line, "{v}")?,
                Cell::Text(v) => serde_json::to_writer(&mut *line, v)?,
                Cell::Labels(v) => serde_json::to_writer(&mut *line, v)?,
                Cell::Time(ms) => write!(line, "\"{}\",\"{}_ms\":{ms}", rfc3339(*ms), c.name)?,
            }
        }
        line.extend_from_slice(b"}\n");
        self.out.write_all(line)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    fn finish(mut self: Box<Self>) -> Result<(), ExportError> {
        Ok(self.out.flush()?)
    }
}

struct Csv<W: Write> {
    out: csv::Writer<W>,
    columns: &'static [Column],
}

impl<W: Write + Send> RowWriter for Csv<W> {
    fn row(&mut self, cells: &[Cell]) -> io::Result<()> {
        for (c, cell) in self.columns.iter().zip(cells) {
            match cell {
                Cell::Null if c.kind == ColumnKind::Time => {
                    self.out.write_field("")?;
                    self.out.write_field("")?;
                }
                Cell::Null => self.out.write_field("")?,
                Cell::Int(v) => self.out.write_field(v.to_string())?,
                // Always with a point or exponent (`1.0`), so a reader
                // that infers types reads a float column as one.
                Cell::Float(v) => self.out.write_field(format!("{v:?}"))?,
                Cell::Bool(v) => self.out.write_field(if *v { "true" } else { "false" })?,
                Cell::Text(v) => self.out.write_field(v)?,
                Cell::Labels(v) => self.out.write_field(serde_json::to_string(v)?)?,
                Cell::Time(ms) => {
                    self.out.write_field(rfc3339(*ms))?;
                    self.out.write_field(ms.to_string())?;
                }
            }
        }
        self.out.write_record(None::<&[u8]>)?;
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    fn finish(mut self: Box<Self>) -> Result<(), ExportError> {
        Ok(self.out.flush()?)
    }
}

/// One Parquet column's values for the row group being built.
enum Values {
    Int(Vec<i64>),
    Float(Vec<f64>),
    Bool(Vec<bool>),
    Text(Vec<ByteArray>),
}

/// An output column of the row group being built: values (nulls left
/// out) with their definition levels, and repetition levels for a list.
struct Built {
    values: Values,
    defs: Vec<i16>,
    reps: Vec<i16>,
}

impl Built {
    fn new(values: Values) -> Built {
        Built {
            values,
            defs: Vec::new(),
            reps: Vec::new(),
        }
    }
}

struct Parquet<W: Write + Send> {
    file: SerializedFileWriter<W>,
    columns: &'static [Column],
    built: Vec<Built>,
    rows: usize,
}

impl<W: Write + Send> Parquet<W> {
    fn new(table: ExportTable, out: W) -> Result<Self, ExportError> {
        let schema = Arc::new(parquet::schema::parser::parse_message_type(&parquet_schema(table))?);
        let props = Arc::new(
            WriterProperties::builder()
                .set_compression(Compression::SNAPPY)
                .set_created_by(format!("gavel {}", env!("CARGO_PKG_VERSION")))
                .build(),
        );
        let columns = table.columns();
        let built = columns
            .iter()
            .flat_map(|c| match c.kind {
                ColumnKind::Int => vec![Built::new(Values::Int(Vec::new()))],
                ColumnKind::Float => vec![Built::new(Values::Float(Vec::new()))],
                ColumnKind::Bool => vec![Built::new(Values::Bool(Vec::new()))],
                ColumnKind::Text | ColumnKind::Labels => vec![Built::new(Values::Text(Vec::new()))],
                ColumnKind::Time => vec![Built::new(Values::Int(Vec::new())), Built::new(Values::Int(Vec::new()))],
            })
            .collect();
        Ok(Parquet {
            file: SerializedFileWriter::new(out, schema, props)?,
            columns,
            built,
            rows: 0,
        })
    }

    fn write_group(&mut self) -> Result<(), ExportError> {
        use parquet::column::writer::ColumnWriter as W;
        if self.rows == 0 {
            return Ok(());
        }
        let mut group = self.file.next_row_group()?;
        for b in &mut self.built {
            let mut column = group.next_column()?.expect("one writer per schema column");
            let defs = Some(b.defs.as_slice());
            let reps = (!b.reps.is_empty()).then_some(b.reps.as_slice());
            match (column.untyped(), &b.values) {
                (W::Int64ColumnWriter(w), Values::Int(v)) => w.write_batch(v, defs, reps)?,
                (W::DoubleColumnWriter(w), Values::Float(v)) => w.write_batch(v, defs, reps)?,
                (W::BoolColumnWriter(w), Values::Bool(v)) => w.write_batch(v, defs, reps)?,
                (W::ByteArrayColumnWriter(w), Values::Text(v)) => w.write_batch(v, defs, reps)?,
                _ => unreachable!("the schema and the builders come from one column list"),
            };
            column.close()?;
            b.defs.clear();
            b.reps.clear();
            match &mut b.values {
                Values::Int(v) => v.clear(),
                Values::Float(v) => v.clear(),
                Values::Bool(v) => v.clear(),
                Values::Text(v) => v.clear(),
            }
        }
        group.close()?;
        self.rows = 0;
        Ok(())
    }
}

impl<W: Write + Send> RowWriter for Parquet<W> {
    fn row(&mut self, cells: &[Cell]) -> io::Result<()> {
        let mut out = self.built.iter_mut();
        for (c, cell) in self.columns.iter().zip(cells) {
            let b = out.next().expect("a builder per column");
            // Nullable columns are OPTIONAL (definition level 1 when set);
            // a label list is REQUIRED with REPEATED elements.
            let set = i16::from(c.nullable);
            match (cell, &mut b.values) {
                (Cell::Null, _) => {
                    b.defs.push(0);
                    if c.kind == ColumnKind::Time {
                        out.next().expect("a time's _ms builder").defs.push(0);
                    }
                }
                (Cell::Int(v), Values::Int(vals)) => {
                    vals.push(*v);
                    b.defs.push(set);
                }
                (Cell::Float(v), Values::Float(vals)) => {
                    vals.push(*v);
                    b.defs.push(set);
                }
                (Cell::Bool(v), Values::Bool(vals)) => {
                    vals.push(*v);
                    b.defs.push(set);
                }
                (Cell::Text(v), Values::Text(vals)) => {
                    vals.push(ByteArray::from(v.as_bytes().to_vec()));
                    b.defs.push(set);
                }
                (Cell::Time(ms), Values::Int(vals)) => {
                    vals.push(*ms);
                    b.defs.push(set);
                    let b = out.next().expect("a time's _ms builder");
                    if let Values::Int(vals) = &mut b.values {
                        vals.push(*ms);
                    }
                    b.defs.push(set);
                }
                (Cell::Labels(labels), Values::Text(vals)) => {
                    if labels.is_empty() {
                        b.defs.push(0);
                        b.reps.push(0);
                    }
                    for (i, l) in labels.iter().enumerate() {
                        vals.push(ByteArray::from(l.as_bytes().to_vec()));
                        b.defs.push(1);
                        b.reps.push(i16::from(i > 0));
                    }
                }
                (cell, _) => {
                    return Err(io::Error::other(format!(
                        "column {} cannot hold {cell:?} (a bug in the export's columns)",
                        c.name
                    )));
                }
            }
        }
        self.rows += 1;
        if self.rows >= ROW_GROUP {
            self.write_group().map_err(io::Error::other)?;
        }
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }

    fn finish(mut self: Box<Self>) -> Result<(), ExportError> {
        self.write_group()?;
        self.file.close()?;
        Ok(())
    }
}

/// The Parquet schema of a table's columns.
fn parquet_schema(table: ExportTable) -> String {
    let mut fields = String::new();
    for c in table.columns() {
        let rep = if c.nullable { "OPTIONAL" } else { "REQUIRED" };
        let name = c.name;
        let field = match c.kind {
            ColumnKind::Int => format!("{rep} INT64 {name};"),
            ColumnKind::Float => format!("{rep} DOUBLE {name};"),
            ColumnKind::Bool => format!("{rep} BOOLEAN {name};"),
            ColumnKind::Text => format!("{rep} BYTE_ARRAY {name} (STRING);"),
            ColumnKind::Time => {
                format!("{rep} INT64 {name} (TIMESTAMP(MILLIS,true)); {rep} INT64 {name}_ms;")
            }
            ColumnKind::Labels => format!(
                "REQUIRED group {name} (LIST) {{ REPEATED group list {{ REQUIRED BYTE_ARRAY element (STRING); }} }}"
            ),
        };
        fields.push_str(&field);
        fields.push(' ');
    }
    format!("message {} {{ {fields}}}", table.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc3339_with_milliseconds() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_796_195_703_120), "2026-12-02T07:15:03Z");
    }

    #[test]
    fn cursors_read_back_what_they_print() {
        for (table, key) in [
            (ExportTable::Decisions, ExportKey::Id(42)),
            (ExportTable::Items, ExportKey::Item("0190-a".into())),
            (
                ExportTable::Authors,
                ExportKey::Author("web".into(), "ann \"x\"".into()),
            ),
        ] {
            assert_eq!(parse_cursor(table, &cursor_text(&key)), Ok(key));
        }
        assert!(parse_cursor(ExportTable::Transitions, "x").is_err());
        assert!(parse_cursor(ExportTable::Authors, "web").is_err());
    }

    #[test]
    fn every_tables_parquet_schema_parses() {
        for table in ExportTable::ALL {
            let schema = parquet::schema::parser::parse_message_type(&parquet_schema(table)).unwrap();
            assert_eq!(
                schema.get_fields().len(),
                header(table.columns()).len(),
                "{}",
                table.as_str()
            );
        }
    }
}
