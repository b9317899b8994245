//! Exports: the stored record, read in key order in pages for `gavel
//! export` and `GET /v1/exports/{table}` (the formats are in
//! `crate::export`).
//!
//! Decisions and item transitions are logs: rows are only ever appended,
//! each with a growing id, so an export pages by id and its cursor is the
//! last id it covered. A cursor must never pass a row that is not visible
//! yet but will be: on SQLite one writer commits in id order, so what a
//! reader sees is always a prefix of the ids; on PostgreSQL a transaction
//! may commit after a later id was committed, so the export stops at a
//! **horizon**, an id below which every writing transaction has ended (see
//! `PgStore::log_horizon`). Continuing from a cursor therefore misses and
//! repeats nothing, whatever was being written meanwhile.
//!
//! Items and authors are current state: an export pages them by key
//! (`id`; `client`, `author`) and shows each as it is when its page is read.

use super::StoreResult;
use crate::clock::Millis;

/// What can be exported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ExportTable {
    Decisions,
    Transitions,
    Items,
    Authors,
}

impl ExportTable {
    pub const ALL: [ExportTable; 4] = [
        ExportTable::Decisions,
        ExportTable::Transitions,
        ExportTable::Items,
        ExportTable::Authors,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ExportTable::Decisions => "decisions",
            ExportTable::Transitions => "transitions",
            ExportTable::Items => "items",
            ExportTable::Authors => "authors",
        }
    }

    /// Whether rows are only appended (paged by id, with a horizon).
    pub fn is_log(self) -> bool {
        self.log_table().is_some()
    }

    /// A log's table, whose ids its horizon bounds (`None`: current state).
    pub fn log_table(self) -> Option<&'static str> {
        match self {
            ExportTable::Decisions => Some("decisions"),
            ExportTable::Transitions => Some("transitions"),
            ExportTable::Items | ExportTable::Authors => None,
        }
    }

    /// The table's columns, in order: what every format writes.
    pub fn columns(self) -> &'static [Column] {
        match self {
            ExportTable::Decisions => DECISIONS,
            ExportTable::Transitions => TRANSITIONS,
            ExportTable::Items => ITEMS,
            ExportTable::Authors => AUTHORS,
        }
    }
}

impl std::str::FromStr for ExportTable {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        ExportTable::ALL
            .into_iter()
            .find(|t| t.as_str() == s)
            .ok_or_else(|| format!("unknown table {s:?}: decisions, transitions, items or authors"))
    }
}

/// A column's type. A [`ColumnKind::Time`] column is written twice: as
/// RFC 3339 text to the second (a Parquet timestamp in milliseconds) under
/// its name, and as epoch milliseconds under `NAME_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnKind {
    Int,
    Float,
    Bool,
    Text,
    Time,
    /// A list of strings.
    Labels,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Column {
    pub name: &'static str,
    pub kind: ColumnKind,
    pub nullable: bool,
}

const fn c(name: &'static str, kind: ColumnKind, nullable: bool) -> Column {
    Column { name, kind, nullable }
}

use ColumnKind::{Bool, Float, Int, Labels, Text, Time};

const DECISIONS: &[Column] = &[
    c("id", Int, false),
    c("item_id", Text, false),
    c("item_version", Int, false),
    c("client", Text, false),
    c("author", Text, false),
    c("kind", Text, false),
    c("plugin", Text, false),
    c("plugin_version", Text, false),
    c("plugin_digest", Text, false),
    c("phase", Text, false),
    c("verdict", Text, true),
    c("score", Float, false),
    c("labels", Labels, false),
    c("reason", Text, false),
    c("mode", Text, false),
    c("shadow", Bool, false),
    c("applied", Bool, false),
    c("duration_us", Int, false),
    c("outcome", Text, false),
    c("error", Text, true),
    c("snapshot_digest", Text, true),
    c("config_digest", Text, true),
    c("lists", Labels, false),
    c("reversed", Bool, false),
    c("reversed_at", Time, true),
    c("created_at", Time, false),
];

const TRANSITIONS: &[Column] = &[
    c("id", Int, false),
    c("item_id", Text, false),
    c("client", Text, false),
    c("author", Text, false),
    c("kind", Text, false),
    c("version", Int, false),
    c("from_status", Text, false),
    c("to_status", Text, false),
    c("cause", Text, false),
    c("actor", Text, false),
    c("actor_name", Text, true),
    c("reason", Text, false),
    c("correlation_id", Text, false),
    c("created_at", Time, false),
    c("policy", Text, true),
    c("ends_at", Time, true),
];

const ITEMS: &[Column] = &[
    c("id", Text, false),
    c("client", Text, false),
    c("external_id", Text, true),
    c("kind", Text, false),
    c("author", Text, false),
    c("status", Text, false),
    c("version", Int, false),
    c("decided_by", Text, true),
    c("sync_verdict", Text, true),
    c("created_at", Time, false),
    c("updated_at", Time, false),
];

const AUTHORS: &[Column] = &[
    c("client", Text, false),
    c("author", Text, false),
    c("status", Text, false),
    c("version", Int, false),
    c("decided_by", Text, true),
    c("strikes", Float, false),
    c("first_seen", Time, false),
    c("last_seen", Time, false),
    c("updated_at", Time, false),
];

/// One value of a row.
#[derive(Debug, Clone, PartialEq)]
pub enum Cell {
    Null,
    Int(i64),
    Float(f64),
    Bool(bool),
    Text(String),
    Time(Millis),
    Labels(Vec<String>),
}

/// Where a page starts: behind this key.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ExportKey {
    /// From the first row.
    #[default]
    Start,
    /// A log's id.
    Id(i64),
    /// An item's id.
    Item(String),
    /// An author's (client, author).
    Author(String, String),
}

/// Which rows: `since <= time < until` (decisions, transitions and items
/// by `created_at`, authors by `last_seen`), of one client or all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportFilter {
    pub since: Millis,
    pub until: Millis,
    pub client: Option<String>,
}

/// A page's row with its key.
#[derive(Debug, Clone, PartialEq)]
pub struct ExportRow {
    pub key: ExportKey,
    pub cells: Vec<Cell>,
}

/// Reading the record for export.
#[async_trait::async_trait]
pub trait Exports: Send + Sync {
    /// A log's horizon: the highest id at or below which every row is
    /// committed and visible for good (no writing transaction that could
    /// still add one is open). 0 for an empty log. Items and authors have none.
    async fn export_horizon(&self, table: ExportTable) -> StoreResult<i64>;

    /// Up to `limit` rows of `table` behind `after`, in key order; a log's
    /// rows stop at `upto` (its horizon).
    async fn export_page(
        &self,
        table: ExportTable,
        filter: &ExportFilter,
        after: &ExportKey,
        upto: i64,
        limit: i64,
    ) -> StoreResult<Vec<ExportRow>>;
}

/// A row's values by position, whatever the driver read it.
pub(crate) trait Fields {
    fn int(&self, i: usize) -> StoreResult<i64>;
    fn opt_int(&self, i: usize) -> StoreResult<Option<i64>>;
    fn float(&self, i: usize) -> StoreResult<f64>;
    fn boolean(&self, i: usize) -> StoreResult<bool>;
    fn text(&self, i: usize) -> StoreResult<String>;
    fn opt_text(&self, i: usize) -> StoreResult<Option<String>>;
}

/// The SELECT of a table's page (one text for both dialects): its columns
/// in the order [`row_of`] reads them; `$1`, `$2` the window, `$3` the
/// limit, then the client (if any) and the key's values. Parameters are
/// bound by name on SQLite, so their order of appearance does not matter.
pub(crate) fn page_sql(table: ExportTable, client: bool) -> String {
    let k = if client { 5 } else { 4 };
    let (select, key, time, order) = match table {
        ExportTable::Decisions => (
            "SELECT d.id, d.item_id, d.item_version, i.client, i.author, i.kind, d.plugin, r.version, r.digest, \
             d.phase, d.verdict, d.score, d.labels, d.reason, d.mode, d.applied, d.duration_us, d.outcome, \
             d.error, d.snapshot_digest, d.config_digest, d.reversed_at, d.created_at, d.lists \
             FROM decisions d JOIN items i ON i.id = d.item_id JOIN plugin_refs r ON r.id = d.plugin_ref",
            format!("d.id > ${k} AND d.id <= ${}", k + 1),
            "d.created_at",
            "d.id",
        ),
        ExportTable::Transitions => (
            "SELECT t.id, t.item_id, i.client, i.author, i.kind, t.version, t.from_status, t.to_status, t.cause, \
             t.actor, t.actor_name, t.reason, t.correlation_id, t.created_at, t.policy, t.ends_at \
             FROM transitions t JOIN items i ON i.id = t.item_id",
            format!("t.id > ${k} AND t.id <= ${}", k + 1),
            "t.created_at",
            "t.id",
        ),
        ExportTable::Items => (
            "SELECT i.id, i.client, i.external_id, i.kind, i.author, i.status, i.version, i.decided_by, \
             i.sync_verdict, i.created_at, i.updated_at FROM items i",
            format!("i.id > ${k}"),
            "i.created_at",
            "i.id",
        ),
        ExportTable::Authors => (
            "SELECT i.client, i.author, i.status, i.version, i.decided_by, i.strikes, i.first_seen, i.last_seen, \
             i.updated_at FROM authors i",
            // A row comparison: a range of the primary key on both stores.
            format!("(i.client, i.author) > (${k}, ${})", k + 1),
            "i.last_seen",
            "i.client, i.author",
        ),
    };
    let client = if client { " AND i.client = $4" } else { "" };
    format!("{select} WHERE {time} >= $1 AND {time} < $2{client} AND {key} ORDER BY {order} LIMIT $3")
}

/// [`page_sql`] of each table, with and without a client, built once.
pub(crate) fn sql_for(table: ExportTable, client: bool) -> &'static str {
    static SQL: std::sync::LazyLock<Vec<String>> = std::sync::LazyLock::new(|| {
        ExportTable::ALL
            .into_iter()
            .flat_map(|t| [page_sql(t, false), page_sql(t, true)])
            .collect()
    });
    let index = ExportTable::ALL.iter().position(|t| *t == table).expect("a table") * 2 + usize::from(client);
    SQL[index].as_str()
}

/// The key's values a page starts behind, as [`page_sql`] numbers them:
/// a log's id and horizon, an item's id, an author's client and name.
pub(crate) enum KeyValues<'a> {
    Log(i64, i64),
    Item(&'a str),
    Author(&'a str, &'a str),
}

pub(crate) fn key_values<'a>(table: ExportTable, after: &'a ExportKey, upto: i64) -> KeyValues<'a> {
    match (table, after) {
        (ExportTable::Decisions | ExportTable::Transitions, ExportKey::Id(id)) => KeyValues::Log(*id, upto),
        (ExportTable::Decisions | ExportTable::Transitions, _) => KeyValues::Log(0, upto),
        (ExportTable::Items, ExportKey::Item(id)) => KeyValues::Item(id),
        // Every id sorts after the empty string.
        (ExportTable::Items, _) => KeyValues::Item(""),
        (ExportTable::Authors, ExportKey::Author(client, author)) => KeyValues::Author(client, author),
        // An author's name is never empty: ("", "") is before every author.
        (ExportTable::Authors, _) => KeyValues::Author("", ""),
    }
}

/// A row of [`page_sql`]'s SELECT as the export's cells.
pub(crate) fn row_of(table: ExportTable, f: &dyn Fields) -> StoreResult<ExportRow> {
    let text = |i| f.text(i).map(Cell::Text);
    let opt_text = |i| f.opt_text(i).map(|v| v.map_or(Cell::Null, Cell::Text));
    let int = |i| f.int(i).map(Cell::Int);
    let time = |i| f.int(i).map(Cell::Time);
    Ok(match table {
        ExportTable::Decisions => {
            let id = f.int(0)?;
            let mode = f.text(14)?;
            let shadow = mode == "shadow";
            let reversed_at = f.opt_int(21)?;
            ExportRow {
                key: ExportKey::Id(id),
                cells: vec![
                    Cell::Int(id),
                    text(1)?,
                    int(2)?,
                    text(3)?,
                    text(4)?,
                    text(5)?,
                    text(6)?,
                    text(7)?,
                    text(8)?,
                    text(9)?,
                    opt_text(10)?,
                    Cell::Float(f.float(11)?),
                    Cell::Labels(super::rows::labels(&f.text(12)?)?),
                    text(13)?,
                    Cell::Text(mode),
                    Cell::Bool(shadow),
                    Cell::Bool(f.boolean(15)?),
                    int(16)?,
                    text(17)?,
                    opt_text(18)?,
                    opt_text(19)?,
                    opt_text(20)?,
                    // `NAME@VERSION:DIGEST` for each list the rule consulted.
                    Cell::Labels(
                        super::rows::lists(f.opt_text(23)?.as_deref())?
                            .into_iter()
                            .map(|l| format!("{}@{}:{}", l.name, l.version, l.digest))
                            .collect(),
                    ),
                    Cell::Bool(reversed_at.is_some()),
                    reversed_at.map_or(Cell::Null, Cell::Time),
                    time(22)?,
                ],
            }
        }
        ExportTable::Transitions => {
            let id = f.int(0)?;
            ExportRow {
                key: ExportKey::Id(id),
                cells: vec![
                    Cell::Int(id),
                    text(1)?,
                    text(2)?,
                    text(3)?,
                    text(4)?,
                    int(5)?,
                    text(6)?,
                    text(7)?,
                    text(8)?,
                    text(9)?,
                    opt_text(10)?,
                    text(11)?,
                    text(12)?,
                    time(13)?,
                    opt_text(14)?,
                    f.opt_int(15)?.map_or(Cell::Null, Cell::Time),
                ],
            }
        }
        ExportTable::Items => {
            let id = f.text(0)?;
            ExportRow {
                key: ExportKey::Item(id.clone()),
                cells: vec![
                    Cell::Text(id),
                    text(1)?,
                    opt_text(2)?,
                    text(3)?,
                    text(4)?,
                    text(5)?,
                    int(6)?,
                    opt_text(7)?,
                    opt_text(8)?,
                    time(9)?,
                    time(10)?,
                ],
            }
        }
        ExportTable::Authors => {
            let (client, author) = (f.text(0)?, f.text(1)?);
            ExportRow {
                key: ExportKey::Author(client.clone(), author.clone()),
                cells: vec![
                    Cell::Text(client),
                    Cell::Text(author),
                    text(2)?,
                    int(3)?,
                    opt_text(4)?,
                    // A sum of non-negative weights; never -0.0.
                    Cell::Float(f.float(5)?.max(0.0)),
                    time(6)?,
                    time(7)?,
                    time(8)?,
                ],
            }
        }
    })
}
