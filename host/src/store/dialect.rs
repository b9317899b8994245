//! The few things SQLite and PostgreSQL do differently, behind one trait;
//! everything else is one SQL text. Also the helpers every capability uses
//! to build multi-row statements and to retry conflicting transactions.

use super::StoreResult;
use super::sqlite::Turn;
use sqlx::{Database, Pool, Transaction};

/// A transaction of the sqlx code, which derefs to its connection (the
/// executor of every statement). On SQLite a write transaction also holds
/// the writer thread's [`Turn`]: the writer waits until it ends.
pub(crate) struct Tx<'c, DB: Database> {
    tx: Transaction<'c, DB>,
    _turn: Option<Turn>,
}

impl<'c, DB: Database> Tx<'c, DB> {
    pub(super) fn new(tx: Transaction<'c, DB>, turn: Option<Turn>) -> Self {
        Tx { tx, _turn: turn }
    }

    pub(crate) async fn commit(self) -> StoreResult<()> {
        Ok(self.tx.commit().await?)
    }

    pub(crate) async fn rollback(self) -> StoreResult<()> {
        Ok(self.tx.rollback().await?)
    }
}

impl<DB: Database> std::ops::Deref for Tx<'_, DB> {
    type Target = DB::Connection;

    fn deref(&self) -> &DB::Connection {
        &self.tx
    }
}

impl<DB: Database> std::ops::DerefMut for Tx<'_, DB> {
    fn deref_mut(&mut self) -> &mut DB::Connection {
        &mut self.tx
    }
}

/// A backend's pools, transactions and SQL fragments.
pub(super) trait Dialect: Send + Sync + 'static {
    type DB: Database;
    /// Appended to SELECTs that claim work: `FOR UPDATE SKIP LOCKED` on
    /// PostgreSQL, nothing on SQLite (one writer).
    const SKIP_LOCKED: &'static str;
    /// Appended to SELECTs that must wait for a row: `FOR UPDATE` on
    /// PostgreSQL, nothing on SQLite.
    const FOR_UPDATE: &'static str;
    /// The changes feed's extra condition (see the outbox migration).
    const FEED_HORIZON: &'static str;
    /// After `deliveries d` in the webhook claim's candidates, and after
    /// `deliveries e` in its "earliest pending version" lookup: SQLite,
    /// which keeps no statistics, is told which index each walks
    /// (`deliveries_due`, `deliveries_order`); PostgreSQL needs no hint,
    /// each condition is written so that only one index serves it.
    const DUE_ORDER: &'static str;
    const ITEM_ORDER: &'static str;
    /// Outbox rows after the cursor `($1 txid, $2 seq)`, and the feed's
    /// order. PostgreSQL orders by the writing transaction's id, then
    /// `seq`; on SQLite (one writer) `txid` is always 0 and the order is
    /// `seq` alone, the table's own key, so no index holds it.
    const FEED_AFTER: &'static str;
    /// The outbox row `o` is after the cursor row `c` (a `webhook_cursors`
    /// row): a range search from the cursor on both stores (a row
    /// comparison on PostgreSQL's `outbox_feed`, `seq` on SQLite), where
    /// the `OR` of its definition read the whole outbox.
    const FEED_AFTER_CURSOR: &'static str;
    const FEED_ORDER: &'static str;
    const FEED_ORDER_DESC: &'static str;
    /// The database's own clock, in milliseconds since the epoch: leases
    /// that several API nodes compare are taken from one clock.
    const NOW_MS: &'static str;
    /// The function giving the 1-based position of a substring, 0 when
    /// absent (`instr` on SQLite, `strpos` on PostgreSQL): a case-sensitive
    /// search on both, unlike `LIKE`.
    const POSITION: &'static str;
    /// Appended to a text column in `ORDER BY` for byte order (the order
    /// Rust sorts `String`s in): ` COLLATE "C"` on PostgreSQL, whose
    /// default collation may follow a locale; nothing on SQLite (`BINARY`).
    const BYTE_ORDER: &'static str;
    /// Whether a decision `d` carries a label: `{}` is the label's
    /// parameter (`labels` is a JSON array of strings on both).
    const HAS_LABEL: &'static str;
    /// Whether statements built by [`Statements`] go out with anonymous
    /// `?` parameters instead of `$N`. SQLite looks a numbered parameter
    /// up in a list (binding one costs O(parameters)), so binding a
    /// multi-row statement of thousands of `$N` would be quadratic.
    const ANONYMOUS_PARAMETERS: bool;

    fn read_pool(&self) -> &Pool<Self::DB>;

    /// A write transaction (SQLite: `BEGIN IMMEDIATE`, taking the one write
    /// lock at once instead of failing on upgrade).
    async fn begin_write(&self) -> StoreResult<Tx<'_, Self::DB>>;

    /// A read-only transaction that sees one consistent view (PostgreSQL:
    /// `REPEATABLE READ READ ONLY`; SQLite: a WAL read transaction).
    async fn begin_snapshot(&self) -> StoreResult<Tx<'_, Self::DB>>;
}

/// Re-runs `$body` (an async block returning `StoreResult`) while it fails
/// with a serialization failure or a deadlock, a few times with a short
/// jittered pause: the database rolled the whole transaction back, so
/// running it again is safe.
macro_rules! retry_conflicts {
    ($body:expr) => {{
        let mut attempt = 0u32;
        loop {
            let result: $crate::store::StoreResult<_> = $body.await;
            match result {
                Err(e) if e.is_conflict() && attempt < 8 => {
                    attempt += 1;
                    let wait = $crate::retry::backoff_ms(attempt, 5, 200) as u64;
                    tracing::debug!(error = %e, attempt, "transaction conflict; retrying");
                    tokio::time::sleep(std::time::Duration::from_millis(wait)).await;
                }
                other => break other,
            }
        }
    }};
}
pub(super) use retry_conflicts;

/// The row counts a multi-row statement is issued with: a batch of `n`
/// rows goes out as chunks of 256, 64, 16, 4 and 1 rows (largest first),
/// so each table needs at most five statement texts in the prepared
/// statement cache, whatever the batch size, and no chunk passes either
/// database's parameter limit.
pub(super) fn chunk_sizes(mut n: usize) -> Vec<usize> {
    let mut out = Vec::new();
    for size in [256, 64, 16, 4, 1] {
        while n >= size {
            out.push(size);
            n -= size;
        }
    }
    out
}

/// `(rows)` tuples of `columns` placeholders each, numbered from `$1`:
/// `($1, $2), ($3, $4)` for 2 × 2.
pub(super) fn values(rows: usize, columns: usize) -> String {
    let mut sql = String::with_capacity(rows * columns * 5);
    for r in 0..rows {
        if r > 0 {
            sql.push_str(", ");
        }
        sql.push('(');
        for c in 0..columns {
            if c > 0 {
                sql.push_str(", ");
            }
            sql.push('$');
            sql.push_str(&(r * columns + c + 1).to_string());
        }
        sql.push(')');
    }
    sql
}

/// `$from, $from+1, ... ` for `n` placeholders (an `IN (...)` list).
pub(super) fn placeholders(from: usize, n: usize) -> String {
    (from..from + n).map(|i| format!("${i}")).collect::<Vec<_>>().join(", ")
}

/// `sql` with its `$N` parameters made anonymous (`?`), when they appear
/// exactly in the order `$1, $2, …` (then binding by position is the
/// same); otherwise `sql` unchanged.
pub(super) fn anonymize(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut expected = 1usize;
    let mut rest = sql;
    while let Some(at) = rest.find('$') {
        let digits = rest[at + 1..].bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return sql.to_string();
        }
        if rest[at + 1..at + 1 + digits].parse::<usize>().ok() != Some(expected) {
            return sql.to_string();
        }
        out.push_str(&rest[..at]);
        out.push('?');
        rest = &rest[at + 1 + digits..];
        expected += 1;
    }
    out.push_str(rest);
    out
}

/// A cache of multi-row statement texts, one per (name, chunk size), in
/// the parameter style of one backend.
pub(super) struct Statements {
    anonymous: bool,
    texts: std::sync::Mutex<std::collections::BTreeMap<(&'static str, usize), &'static str>>,
}

impl Statements {
    pub(super) const fn new(anonymous: bool) -> Self {
        Statements {
            anonymous,
            texts: std::sync::Mutex::new(std::collections::BTreeMap::new()),
        }
    }

    /// The text `build(rows)` for statement `name`, built once and kept for
    /// the life of the process (at most five sizes per statement).
    pub(super) fn get(&self, name: &'static str, rows: usize, build: impl FnOnce(usize) -> String) -> &'static str {
        let mut texts = self.texts.lock().expect("statement cache lock");
        texts.entry((name, rows)).or_insert_with(|| {
            let sql = build(rows);
            let sql = if self.anonymous { anonymize(&sql) } else { sql };
            Box::leak(sql.into_boxed_str())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_the_batch_with_few_sizes() {
        assert_eq!(chunk_sizes(0), Vec::<usize>::new());
        assert_eq!(chunk_sizes(1), vec![1]);
        assert_eq!(chunk_sizes(21), vec![16, 4, 1]);
        assert_eq!(chunk_sizes(300), vec![256, 16, 16, 4, 4, 4]);
        for n in 0..1000 {
            assert_eq!(chunk_sizes(n).iter().sum::<usize>(), n);
        }
    }

    #[test]
    fn values_and_placeholders_number_from_one() {
        assert_eq!(values(2, 2), "($1, $2), ($3, $4)");
        assert_eq!(placeholders(3, 3), "$3, $4, $5");
    }

    #[test]
    fn parameters_in_order_become_anonymous_and_others_stay() {
        assert_eq!(
            anonymize("VALUES ($1, $2), ($3, $4) LIMIT $5"),
            "VALUES (?, ?), (?, ?) LIMIT ?"
        );
        assert_eq!(anonymize("WHERE a = $1 AND b = $1"), "WHERE a = $1 AND b = $1");
        assert_eq!(anonymize("WHERE a = $2 AND b = $1"), "WHERE a = $2 AND b = $1");
        assert_eq!(anonymize("SELECT 1"), "SELECT 1");
        assert_eq!(anonymize("a $ b"), "a $ b");
    }
}
