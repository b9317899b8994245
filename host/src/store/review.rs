//! The moderator console's store: sign-in sessions, exclusive review claims
//! and skips, and the reads of its queue, search and author pages. A claim
//! only shares out work; the item's version (`If-Match` on the decision)
//! still decides which decision lands. Every time here is the database's
//! clock, so several API nodes compare claims against one clock.

use super::{Item, StoreResult};
use crate::clock::Millis;

/// A signed-in console session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsoleSession {
    /// The moderator token's name: the identity of everything the session does.
    pub moderator: String,
    /// The token every state-changing request of the session must carry.
    pub csrf: String,
    pub expires_at: Millis,
}

/// Who is reviewing an item, until when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReviewClaim {
    pub moderator: String,
    pub expires_at: Millis,
}

/// The queue page's filters; `None` matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueFilter {
    pub kind: Option<String>,
    /// A label of an enforcing decision on the item.
    pub label: Option<String>,
    /// The plugin whose applied `hold` decision holds the item.
    pub plugin: Option<String>,
    pub author: Option<String>,
}

/// The queue page's order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum QueueSort {
    /// Held longest first.
    #[default]
    Oldest,
    /// Most flags and reports first, then held longest.
    Flags,
}

/// A held item as the queue lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueRow {
    pub item: Item,
    /// Flag and report events on it.
    pub flags: i64,
    /// `plugin: reason` of the newest applied hold, if a rule held it.
    pub held_by: Option<String>,
    /// The moderator with a live claim on it.
    pub claimed_by: Option<String>,
}

/// The figures at the top of the queue page.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueOverview {
    pub held: i64,
    pub awaiting_provider: i64,
    /// When the item held longest was held.
    pub oldest_held_at: Option<Millis>,
    /// Moderator decisions since `now - 1 h` and `now - 24 h`.
    pub decided_hour: i64,
    pub decided_day: i64,
}

/// An author's record, for the item page.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AuthorSummary {
    /// The latest items, newest first.
    pub recent: Vec<Item>,
    pub items: i64,
    pub rejected: i64,
    /// Decisions on the author's items that a moderator overturned.
    pub reversals: i64,
}

/// Most rows the queue page, search and an author's list read at once.
pub const PAGE_ROWS: i64 = 50;

/// The console's sessions, claims and reads.
#[async_trait::async_trait]
pub trait Review: Send + Sync {
    /// Stores a session for `ttl_ms` and deletes expired ones.
    async fn create_session(&self, id_hash: &str, moderator: &str, csrf: &str, ttl_ms: i64) -> StoreResult<()>;

    /// The unexpired session known by `id_hash`.
    async fn session(&self, id_hash: &str) -> StoreResult<Option<ConsoleSession>>;

    async fn end_session(&self, id_hash: &str) -> StoreResult<()>;

    /// Claims the next held item matching `filter` for `moderator` for
    /// `ttl_ms`: the moderator's own live claim first, else the oldest held
    /// item nobody else has a live claim on and the moderator has not
    /// skipped. One conditional write decides, so two moderators never hold
    /// one item.
    async fn claim_next(&self, moderator: &str, filter: &QueueFilter, ttl_ms: i64) -> StoreResult<Option<String>>;

    /// Extends `moderator`'s live claim on `item`; `false` if it is not theirs
    /// (expired and taken, or never claimed).
    async fn renew_claim(&self, item: &str, moderator: &str, ttl_ms: i64) -> StoreResult<bool>;

    /// Drops `moderator`'s claim on `item` (after a decision).
    async fn release_claim(&self, item: &str, moderator: &str) -> StoreResult<()>;

    /// Records that `moderator` skipped `item` and drops their claim on it.
    async fn skip(&self, item: &str, moderator: &str) -> StoreResult<()>;

    /// The live claim on `item`.
    async fn claim_of(&self, item: &str) -> StoreResult<Option<ReviewClaim>>;

    async fn queue_overview(&self, now: Millis) -> StoreResult<QueueOverview>;

    /// Page `page` (from 0) of held items, [`PAGE_ROWS`] at most.
    async fn queue_page(&self, filter: &QueueFilter, sort: QueueSort, page: i64) -> StoreResult<Vec<QueueRow>>;

    /// Items whose id is `q`, or whose external id or author is `q` for one
    /// of `clients`; newest first, [`PAGE_ROWS`] at most.
    async fn search_items(&self, q: &str, clients: &[&str]) -> StoreResult<Vec<Item>>;

    async fn author_summary(&self, client: &str, author: &str) -> StoreResult<AuthorSummary>;
}

/// A `LIKE` pattern matching `label` inside a decision's JSON label list.
pub(crate) fn label_pattern(label: &str) -> String {
    let quoted = serde_json::to_string(label).expect("a string serializes");
    let escaped = quoted.replace('\\', "\\\\").replace('%', "\\%").replace('_', "\\_");
    format!("%{escaped}%")
}

/// The `AND ...` conditions of `filter` on `items i`, numbering parameters
/// from `$first`, and the values to bind in order.
pub(crate) fn filter_sql(filter: &QueueFilter, first: usize) -> (String, Vec<String>) {
    let mut sql = String::new();
    let mut binds = Vec::new();
    let mut next = |sql: &mut String, clause: &str, value: String| {
        let n = first + binds.len();
        sql.push_str(&clause.replace("$?", &format!("${n}")));
        binds.push(value);
    };
    if let Some(kind) = &filter.kind {
        next(&mut sql, " AND i.kind = $?", kind.clone());
    }
    if let Some(author) = &filter.author {
        next(&mut sql, " AND i.author = $?", author.clone());
    }
    if let Some(plugin) = &filter.plugin {
        next(
            &mut sql,
            " AND EXISTS (SELECT 1 FROM decisions d WHERE d.item_id = i.id AND d.plugin = $? AND d.applied \
             AND d.verdict = 'hold')",
            plugin.clone(),
        );
    }
    if let Some(label) = &filter.label {
        next(
            &mut sql,
            " AND EXISTS (SELECT 1 FROM decisions d WHERE d.item_id = i.id AND d.mode = 'enforce' \
             AND d.labels LIKE $? ESCAPE '\\')",
            label_pattern(label),
        );
    }
    (sql, binds)
}

/// Instantiates [`Review`] for one backend.
macro_rules! impl_review {
    ($store:ty, $db:ty, $row:ty) => {
        const _: () = {
            use sqlx::Row as _;
            use std::sync::LazyLock;
            use $crate::clock::Millis;
            use $crate::store::dialect::{Dialect, placeholders, retry_conflicts};
            use $crate::store::review::filter_sql;
            use $crate::store::shared::ITEM_COLUMNS;
            use $crate::store::*;

            const NOW: &str = <$store as Dialect>::NOW_MS;

            /// Columns of `items i` for [`txn::item_from_row`].
            static ITEM_I: LazyLock<String> = LazyLock::new(|| {
                ITEM_COLUMNS
                    .split(',')
                    .map(|c| format!("i.{}", c.trim()))
                    .collect::<Vec<_>>()
                    .join(", ")
            });

            static RENEW_OWN: LazyLock<String> = LazyLock::new(|| {
                format!(
                    "UPDATE review_claims SET expires_at = {NOW} + $3 WHERE item_id = $1 AND moderator = $2 \
                     AND expires_at > {NOW} AND EXISTS (SELECT 1 FROM items i WHERE i.id = $1 \
                     AND i.status = 'held_for_review')"
                )
            });

            /// The moderator's own live claim on a still-held item.
            async fn own_claim(store: &$store, moderator: &str) -> StoreResult<Option<String>> {
                let sql = format!(
                    "SELECT c.item_id FROM review_claims c JOIN items i ON i.id = c.item_id \
                     WHERE c.moderator = $1 AND c.expires_at > {NOW} AND i.status = 'held_for_review' \
                     ORDER BY c.claimed_at LIMIT 1"
                );
                Ok(sqlx::query_scalar(&sql).bind(moderator).fetch_optional(store.read_pool()).await?)
            }

            /// One attempt at claiming the oldest free item: `None` when
            /// there is none, or when another moderator's concurrent claim won
            /// the row this attempt picked (the caller tries again).
            async fn claim_once(
                store: &$store,
                moderator: &str,
                filter: &QueueFilter,
                ttl_ms: i64,
            ) -> StoreResult<Option<String>> {
                let (conditions, binds) = filter_sql(filter, 3);
                let sql = format!(
                    "INSERT INTO review_claims (item_id, moderator, claimed_at, expires_at) \
                     SELECT i.id, $1, {NOW}, {NOW} + $2 FROM items i WHERE i.status = 'held_for_review'{conditions} \
                     AND NOT EXISTS (SELECT 1 FROM review_claims c WHERE c.item_id = i.id AND c.expires_at > {NOW}) \
                     AND NOT EXISTS (SELECT 1 FROM review_skips s WHERE s.item_id = i.id AND s.moderator = $1) \
                     ORDER BY i.updated_at, i.id LIMIT 1 \
                     ON CONFLICT (item_id) DO UPDATE SET moderator = excluded.moderator, \
                     claimed_at = excluded.claimed_at, expires_at = excluded.expires_at \
                     WHERE review_claims.expires_at <= excluded.claimed_at \
                     OR review_claims.moderator = excluded.moderator \
                     RETURNING item_id"
                );
                retry_conflicts!(async {
                    let mut tx = store.begin_write().await?;
                    let mut q = sqlx::query_scalar::<_, String>(&sql).bind(moderator).bind(ttl_ms);
                    for b in &binds {
                        q = q.bind(b.as_str());
                    }
                    let claimed = q.fetch_optional(&mut *tx).await?;
                    tx.commit().await?;
                    Ok(claimed)
                })
            }

            fn queue_row(row: &$row) -> StoreResult<QueueRow> {
                Ok(QueueRow {
                    item: txn::item_from_row(row)?,
                    flags: row.try_get("flags")?,
                    held_by: row.try_get("held_by")?,
                    claimed_by: row.try_get("claimed_by")?,
                })
            }

            #[async_trait::async_trait]
            impl Review for $store {
                async fn create_session(
                    &self,
                    id_hash: &str,
                    moderator: &str,
                    csrf: &str,
                    ttl_ms: i64,
                ) -> StoreResult<()> {
                    let insert = format!(
                        "INSERT INTO console_sessions (id_hash, moderator, csrf, created_at, expires_at) \
                         VALUES ($1, $2, $3, {NOW}, {NOW} + $4)"
                    );
                    let expired = format!(
                        "DELETE FROM console_sessions WHERE id_hash IN (SELECT id_hash FROM console_sessions \
                         WHERE expires_at <= {NOW} LIMIT 100)"
                    );
                    retry_conflicts!(async {
                        let mut tx = self.begin_write().await?;
                        sqlx::query(&expired).execute(&mut *tx).await?;
                        sqlx::query(&insert)
                            .bind(id_hash)
                            .bind(moderator)
                            .bind(csrf)
                            .bind(ttl_ms)
                            .execute(&mut *tx)
                            .await?;
                        tx.commit().await?;
                        Ok(())
                    })
                }

                async fn session(&self, id_hash: &str) -> StoreResult<Option<ConsoleSession>> {
                    let sql = format!(
                        "SELECT moderator, csrf, expires_at FROM console_sessions \
                         WHERE id_hash = $1 AND expires_at > {NOW}"
                    );
                    let row = sqlx::query_as::<_, (String, String, i64)>(&sql)
                        .bind(id_hash)
                        .fetch_optional(self.read_pool())
                        .await?;
                    Ok(row.map(|(moderator, csrf, expires_at)| ConsoleSession {
                        moderator,
                        csrf,
                        expires_at,
                    }))
                }

                async fn end_session(&self, id_hash: &str) -> StoreResult<()> {
                    retry_conflicts!(async {
                        let mut tx = self.begin_write().await?;
                        sqlx::query("DELETE FROM console_sessions WHERE id_hash = $1")
                            .bind(id_hash)
                            .execute(&mut *tx)
                            .await?;
                        tx.commit().await?;
                        Ok(())
                    })
                }

                async fn claim_next(
                    &self,
                    moderator: &str,
                    filter: &QueueFilter,
                    ttl_ms: i64,
                ) -> StoreResult<Option<String>> {
                    if let Some(own) = own_claim(self, moderator).await?
                        && self.renew_claim(&own, moderator, ttl_ms).await?
                    {
                        return Ok(Some(own));
                    }
                    // A concurrent claim can win the row an attempt picked
                    // (PostgreSQL); the next attempt sees it and moves on.
                    for _ in 0..8 {
                        if let Some(item) = claim_once(self, moderator, filter, ttl_ms).await? {
                            return Ok(Some(item));
                        }
                        let (conditions, binds) = filter_sql(filter, 2);
                        let sql = format!(
                            "SELECT COUNT(*) FROM items i WHERE i.status = 'held_for_review'{conditions} \
                             AND NOT EXISTS (SELECT 1 FROM review_claims c WHERE c.item_id = i.id \
                             AND c.expires_at > {NOW}) AND NOT EXISTS (SELECT 1 FROM review_skips s \
                             WHERE s.item_id = i.id AND s.moderator = $1)"
                        );
                        let mut q = sqlx::query_scalar::<_, i64>(&sql).bind(moderator);
                        for b in &binds {
                            q = q.bind(b.as_str());
                        }
                        if q.fetch_one(self.read_pool()).await? == 0 {
                            return Ok(None);
                        }
                    }
                    Ok(None)
                }

                async fn renew_claim(&self, item: &str, moderator: &str, ttl_ms: i64) -> StoreResult<bool> {
                    retry_conflicts!(async {
                        let mut tx = self.begin_write().await?;
                        let n = sqlx::query(RENEW_OWN.as_str())
                            .bind(item)
                            .bind(moderator)
                            .bind(ttl_ms)
                            .execute(&mut *tx)
                            .await?
                            .rows_affected();
                        tx.commit().await?;
                        Ok(n == 1)
                    })
                }

                async fn release_claim(&self, item: &str, moderator: &str) -> StoreResult<()> {
                    retry_conflicts!(async {
                        let mut tx = self.begin_write().await?;
                        sqlx::query("DELETE FROM review_claims WHERE item_id = $1 AND moderator = $2")
                            .bind(item)
                            .bind(moderator)
                            .execute(&mut *tx)
                            .await?;
                        tx.commit().await?;
                        Ok(())
                    })
                }

                async fn skip(&self, item: &str, moderator: &str) -> StoreResult<()> {
                    let insert = format!(
                        "INSERT INTO review_skips (item_id, moderator, skipped_at) \
                         SELECT i.id, $2, {NOW} FROM items i WHERE i.id = $1 \
                         ON CONFLICT (item_id, moderator) DO NOTHING"
                    );
                    retry_conflicts!(async {
                        let mut tx = self.begin_write().await?;
                        sqlx::query(&insert).bind(item).bind(moderator).execute(&mut *tx).await?;
                        sqlx::query("DELETE FROM review_claims WHERE item_id = $1 AND moderator = $2")
                            .bind(item)
                            .bind(moderator)
                            .execute(&mut *tx)
                            .await?;
                        tx.commit().await?;
                        Ok(())
                    })
                }

                async fn claim_of(&self, item: &str) -> StoreResult<Option<ReviewClaim>> {
                    let sql = format!(
                        "SELECT moderator, expires_at FROM review_claims WHERE item_id = $1 AND expires_at > {NOW}"
                    );
                    let row = sqlx::query_as::<_, (String, i64)>(&sql)
                        .bind(item)
                        .fetch_optional(self.read_pool())
                        .await?;
                    Ok(row.map(|(moderator, expires_at)| ReviewClaim { moderator, expires_at }))
                }

                async fn queue_overview(&self, now: Millis) -> StoreResult<QueueOverview> {
                    const HOUR: i64 = 3_600_000;
                    let row = sqlx::query(
                        "SELECT (SELECT COUNT(*) FROM items WHERE status = 'held_for_review') AS held, \
                         (SELECT COUNT(*) FROM items WHERE status = 'awaiting_provider') AS awaiting, \
                         (SELECT MIN(updated_at) FROM items WHERE status = 'held_for_review') AS oldest, \
                         (SELECT COUNT(*) FROM transitions WHERE actor = 'moderator' AND created_at >= $1) AS hour, \
                         (SELECT COUNT(*) FROM transitions WHERE actor = 'moderator' AND created_at >= $2) AS day",
                    )
                    .bind(now - HOUR)
                    .bind(now - 24 * HOUR)
                    .fetch_one(self.read_pool())
                    .await?;
                    Ok(QueueOverview {
                        held: row.try_get("held")?,
                        awaiting_provider: row.try_get("awaiting")?,
                        oldest_held_at: row.try_get("oldest")?,
                        decided_hour: row.try_get("hour")?,
                        decided_day: row.try_get("day")?,
                    })
                }

                async fn queue_page(
                    &self,
                    filter: &QueueFilter,
                    sort: QueueSort,
                    page: i64,
                ) -> StoreResult<Vec<QueueRow>> {
                    let (conditions, binds) = filter_sql(filter, 3);
                    let flags = "(SELECT COALESCE(SUM(c.value), 0) FROM counters c WHERE c.item_id = i.id \
                                 AND c.name IN ('flag', 'report'))";
                    let order = match sort {
                        QueueSort::Oldest => "i.updated_at, i.id".to_string(),
                        QueueSort::Flags => format!("{flags} DESC, i.updated_at, i.id"),
                    };
                    let sql = format!(
                        "SELECT {items}, CAST({flags} AS BIGINT) AS flags, \
                         (SELECT d.plugin || ': ' || d.reason FROM decisions d WHERE d.item_id = i.id AND d.applied \
                         AND d.verdict = 'hold' ORDER BY d.id DESC LIMIT 1) AS held_by, \
                         (SELECT c.moderator FROM review_claims c WHERE c.item_id = i.id \
                         AND c.expires_at > {NOW}) AS claimed_by \
                         FROM items i WHERE i.status = 'held_for_review'{conditions} \
                         ORDER BY {order} LIMIT $1 OFFSET $2",
                        items = ITEM_I.as_str(),
                    );
                    let mut q = sqlx::query(&sql).bind(PAGE_ROWS).bind(page.max(0) * PAGE_ROWS);
                    for b in &binds {
                        q = q.bind(b.as_str());
                    }
                    q.fetch_all(self.read_pool()).await?.iter().map(queue_row).collect()
                }

                async fn search_items(&self, q: &str, clients: &[&str]) -> StoreResult<Vec<Item>> {
                    let by_client = if clients.is_empty() {
                        String::new()
                    } else {
                        let list = placeholders(3, clients.len());
                        format!(
                            " UNION SELECT {items} FROM items i WHERE i.client IN ({list}) AND i.external_id = $1 \
                             UNION SELECT {items} FROM items i WHERE i.client IN ({list}) AND i.author = $1",
                            items = ITEM_I.as_str()
                        )
                    };
                    let sql = format!(
                        "SELECT * FROM (SELECT {items} FROM items i WHERE i.id = $1{by_client}) found \
                         ORDER BY created_at DESC LIMIT $2",
                        items = ITEM_I.as_str()
                    );
                    let mut query = sqlx::query(&sql).bind(q).bind(PAGE_ROWS);
                    for c in clients {
                        query = query.bind(*c);
                    }
                    query.fetch_all(self.read_pool()).await?.iter().map(txn::item_from_row).collect()
                }

                async fn author_summary(&self, client: &str, author: &str) -> StoreResult<AuthorSummary> {
                    let recent = self.author_items(client, author, 10).await?;
                    let (items, rejected) = sqlx::query_as::<_, (i64, i64)>(
                        "SELECT COUNT(*), CAST(COALESCE(SUM(CASE WHEN status = 'rejected' THEN 1 ELSE 0 END), 0) \
                         AS BIGINT) FROM items WHERE client = $1 AND author = $2",
                    )
                    .bind(client)
                    .bind(author)
                    .fetch_one(self.read_pool())
                    .await?;
                    let reversals = sqlx::query_scalar::<_, i64>(
                        "SELECT COUNT(*) FROM decisions d JOIN items i ON i.id = d.item_id \
                         WHERE i.client = $1 AND i.author = $2 AND d.reversed_at IS NOT NULL",
                    )
                    .bind(client)
                    .bind(author)
                    .fetch_one(self.read_pool())
                    .await?;
                    Ok(AuthorSummary {
                        recent,
                        items,
                        rejected,
                        reversals,
                    })
                }
            }
        };
    };
}
pub(super) use impl_review;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_patterns_match_the_quoted_label_only() {
        assert_eq!(label_pattern("spam"), "%\"spam\"%");
        assert_eq!(label_pattern("50%_off"), "%\"50\\%\\_off\"%");
    }

    #[test]
    fn filters_number_their_parameters_in_order() {
        let filter = QueueFilter {
            kind: Some("post".into()),
            plugin: Some("link-spam".into()),
            ..QueueFilter::default()
        };
        let (sql, binds) = filter_sql(&filter, 3);
        assert!(sql.contains("i.kind = $3") && sql.contains("d.plugin = $4"), "{sql}");
        assert_eq!(binds, vec!["post".to_string(), "link-spam".to_string()]);
        assert_eq!(filter_sql(&QueueFilter::default(), 1), (String::new(), Vec::new()));
    }
}
