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
        matches!(self, ExportTable::Decisions | ExportTable::Transitions)
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

/// Instantiates [`Exports`] for one backend (its `log_horizon` is its own).
macro_rules! impl_exports {
    ($store:ty, $db:ty, $row:ty) => {
        const _: () = {
            use sqlx::Row as _;
            use $crate::store::exports::*;
            use $crate::store::rows;
            use $crate::store::*;

            /// The SELECT of a table's page: its columns in
            /// [`ExportTable::columns`] order; `$1`, `$2` the window, `$3`
            /// the limit, then the client (if any) and the key's values.
            fn page_sql(table: ExportTable, client: bool) -> String {
                let k = if client { 5 } else { 4 };
                let (select, key, time, order) = match table {
                    ExportTable::Decisions => (
                        "SELECT d.id, d.item_id, d.item_version, i.client, i.author, i.kind, d.plugin, \
                         r.version AS plugin_version, r.digest AS plugin_digest, d.phase, d.verdict, d.score, \
                         d.labels, d.reason, d.mode, d.applied, d.duration_us, d.outcome, d.error, \
                         d.snapshot_digest, d.config_digest, d.reversed_at, d.created_at \
                         FROM decisions d JOIN items i ON i.id = d.item_id JOIN plugin_refs r ON r.id = d.plugin_ref",
                        format!("d.id > ${k} AND d.id <= ${}", k + 1),
                        "d.created_at",
                        "d.id",
                    ),
                    ExportTable::Transitions => (
                        "SELECT t.id, t.item_id, i.client, i.author, i.kind, t.version, t.from_status, \
                         t.to_status, t.cause, t.actor, t.actor_name, t.reason, t.correlation_id, t.created_at \
                         FROM transitions t JOIN items i ON i.id = t.item_id",
                        format!("t.id > ${k} AND t.id <= ${}", k + 1),
                        "t.created_at",
                        "t.id",
                    ),
                    ExportTable::Items => (
                        "SELECT i.id, i.client, i.external_id, i.kind, i.author, i.status, i.version, \
                         i.decided_by, i.sync_verdict, i.created_at, i.updated_at FROM items i",
                        format!("i.id > ${k}"),
                        "i.created_at",
                        "i.id",
                    ),
                    ExportTable::Authors => (
                        "SELECT i.client, i.author, i.status, i.version, i.decided_by, i.strikes, \
                         i.first_seen, i.last_seen, i.updated_at FROM authors i",
                        format!("(i.client > ${k} OR (i.client = ${k} AND i.author > ${}))", k + 1),
                        "i.last_seen",
                        "i.client, i.author",
                    ),
                };
                let client = if client { " AND i.client = $4" } else { "" };
                format!("{select} WHERE {time} >= $1 AND {time} < $2{client} AND {key} ORDER BY {order} LIMIT $3")
            }

            /// A row's cells, in [`ExportTable::columns`] order.
            fn cells(table: ExportTable, r: &$row) -> StoreResult<ExportRow> {
                let text = |c: &str| -> StoreResult<Cell> { Ok(Cell::Text(r.try_get::<String, _>(c)?)) };
                let opt_text = |c: &str| -> StoreResult<Cell> {
                    Ok(r.try_get::<Option<String>, _>(c)?.map_or(Cell::Null, Cell::Text))
                };
                let int = |c: &str| -> StoreResult<Cell> { Ok(Cell::Int(r.try_get::<i64, _>(c)?)) };
                let time = |c: &str| -> StoreResult<Cell> { Ok(Cell::Time(r.try_get::<i64, _>(c)?)) };
                Ok(match table {
                    ExportTable::Decisions => {
                        let mode: String = r.try_get("mode")?;
                        let shadow = mode == "shadow";
                        let reversed_at: Option<i64> = r.try_get("reversed_at")?;
                        let id: i64 = r.try_get("id")?;
                        ExportRow {
                            key: ExportKey::Id(id),
                            cells: vec![
                                Cell::Int(id),
                                text("item_id")?,
                                int("item_version")?,
                                text("client")?,
                                text("author")?,
                                text("kind")?,
                                text("plugin")?,
                                text("plugin_version")?,
                                text("plugin_digest")?,
                                text("phase")?,
                                opt_text("verdict")?,
                                Cell::Float(r.try_get("score")?),
                                Cell::Labels(rows::labels(r.try_get("labels")?)?),
                                text("reason")?,
                                Cell::Text(mode),
                                Cell::Bool(shadow),
                                Cell::Bool(r.try_get("applied")?),
                                int("duration_us")?,
                                text("outcome")?,
                                opt_text("error")?,
                                opt_text("snapshot_digest")?,
                                opt_text("config_digest")?,
                                Cell::Bool(reversed_at.is_some()),
                                reversed_at.map_or(Cell::Null, Cell::Time),
                                time("created_at")?,
                            ],
                        }
                    }
                    ExportTable::Transitions => {
                        let id: i64 = r.try_get("id")?;
                        ExportRow {
                            key: ExportKey::Id(id),
                            cells: vec![
                                Cell::Int(id),
                                text("item_id")?,
                                text("client")?,
                                text("author")?,
                                text("kind")?,
                                int("version")?,
                                text("from_status")?,
                                text("to_status")?,
                                text("cause")?,
                                text("actor")?,
                                opt_text("actor_name")?,
                                text("reason")?,
                                text("correlation_id")?,
                                time("created_at")?,
                            ],
                        }
                    }
                    ExportTable::Items => {
                        let id: String = r.try_get("id")?;
                        ExportRow {
                            key: ExportKey::Item(id.clone()),
                            cells: vec![
                                Cell::Text(id),
                                text("client")?,
                                opt_text("external_id")?,
                                text("kind")?,
                                text("author")?,
                                text("status")?,
                                int("version")?,
                                opt_text("decided_by")?,
                                opt_text("sync_verdict")?,
                                time("created_at")?,
                                time("updated_at")?,
                            ],
                        }
                    }
                    ExportTable::Authors => {
                        let (client, author): (String, String) = (r.try_get("client")?, r.try_get("author")?);
                        ExportRow {
                            key: ExportKey::Author(client.clone(), author.clone()),
                            cells: vec![
                                Cell::Text(client),
                                Cell::Text(author),
                                text("status")?,
                                int("version")?,
                                opt_text("decided_by")?,
                                // A sum of non-negative weights; never -0.0.
                                Cell::Float(r.try_get::<f64, _>("strikes")?.max(0.0)),
                                time("first_seen")?,
                                time("last_seen")?,
                                time("updated_at")?,
                            ],
                        }
                    }
                })
            }

            #[async_trait::async_trait]
            impl Exports for $store {
                async fn export_horizon(&self, table: ExportTable) -> StoreResult<i64> {
                    match table {
                        ExportTable::Decisions => self.log_horizon("decisions").await,
                        ExportTable::Transitions => self.log_horizon("transitions").await,
                        ExportTable::Items | ExportTable::Authors => Ok(0),
                    }
                }

                async fn export_page(
                    &self,
                    table: ExportTable,
                    filter: &ExportFilter,
                    after: &ExportKey,
                    upto: i64,
                    limit: i64,
                ) -> StoreResult<Vec<ExportRow>> {
                    static SQL: std::sync::LazyLock<Vec<String>> = std::sync::LazyLock::new(|| {
                        ExportTable::ALL
                            .into_iter()
                            .flat_map(|t| [page_sql(t, false), page_sql(t, true)])
                            .collect()
                    });
                    let index = ExportTable::ALL.iter().position(|t| *t == table).expect("a table") * 2
                        + usize::from(filter.client.is_some());
                    let mut q = sqlx::query(SQL[index].as_str())
                        .bind(filter.since)
                        .bind(filter.until)
                        .bind(limit);
                    if let Some(client) = &filter.client {
                        q = q.bind(client.as_str());
                    }
                    q = match (table, after) {
                        (ExportTable::Decisions | ExportTable::Transitions, key) => {
                            let id = if let ExportKey::Id(id) = key { *id } else { 0 };
                            q.bind(id).bind(upto)
                        }
                        (ExportTable::Items, ExportKey::Item(id)) => q.bind(id.as_str()),
                        // Every id sorts after the empty string.
                        (ExportTable::Items, _) => q.bind(""),
                        (ExportTable::Authors, ExportKey::Author(client, author)) => {
                            q.bind(client.as_str()).bind(author.as_str())
                        }
                        // An author's name is never empty: ("", "") is before every author.
                        (ExportTable::Authors, _) => q.bind("").bind(""),
                    };
                    q.fetch_all(self.read_pool())
                        .await?
                        .iter()
                        .map(|r| cells(table, r))
                        .collect()
                }
            }
        };
    };
}
pub(crate) use impl_exports;
