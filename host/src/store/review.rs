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
    /// Ties the session to the secret it was signed in with (hex HMAC keyed
    /// by the cookie value over the token's sha256; `console/session.rs`).
    pub token_binding: String,
    /// The token every state-changing request of the session must carry.
    pub csrf: String,
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

/// An author's record, for the item page: the figures cover the author's
/// latest [`AUTHOR_WINDOW`] items, so a prolific spammer's page costs the
/// same as anyone's.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AuthorSummary {
    /// The latest items, newest first.
    pub recent: Vec<Item>,
    /// Items in the window (at most [`AUTHOR_WINDOW`]).
    pub items: i64,
    pub rejected: i64,
    /// Decisions on those items that a moderator overturned.
    pub reversals: i64,
}

/// Items of one author the item page's figures cover: the latest.
pub const AUTHOR_WINDOW: i64 = 1_000;

/// Most rows the queue page, search and an author's list read at once.
pub const PAGE_ROWS: i64 = 50;

/// The console's sessions, claims and reads.
#[async_trait::async_trait]
pub trait Review: Send + Sync {
    /// Stores `session` under `id_hash` for `ttl_ms` (expired ones go with
    /// retention).
    async fn create_session(&self, id_hash: &str, session: &ConsoleSession, ttl_ms: i64) -> StoreResult<()>;

    /// The unexpired session known by `id_hash`.
    async fn session(&self, id_hash: &str) -> StoreResult<Option<ConsoleSession>>;

    async fn end_session(&self, id_hash: &str) -> StoreResult<()>;

    /// Claims the next held item matching `filter` for `moderator` for
    /// `ttl_ms`: the moderator's own live claim on a matching item first,
    /// else the first held item nobody else has a live claim on and the
    /// moderator has not skipped. One conditional write decides, so two
    /// moderators never hold one item.
    /// In `sort` order. Fails with [`super::StoreError::Conflict`] only if
    /// claimable items remain but every attempt lost its pick to a
    /// concurrent claim.
    async fn claim_next(
        &self,
        moderator: &str,
        filter: &QueueFilter,
        sort: QueueSort,
        ttl_ms: i64,
    ) -> StoreResult<Option<String>>;

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

/// What a label looks like inside a decision's JSON label list: the
/// quoted JSON string, so `spam` never matches `spammy`.
pub(crate) fn label_needle(label: &str) -> String {
    serde_json::to_string(label).expect("a string serializes")
}

/// The `AND ...` conditions of `filter` on `items i`, numbering parameters
/// from `$first`, and the values to bind in order; `position` is the
/// dialect's substring function.
pub(crate) fn filter_sql(filter: &QueueFilter, first: usize, position: &str) -> (String, Vec<String>) {
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
            &format!(
                " AND EXISTS (SELECT 1 FROM decisions d WHERE d.item_id = i.id AND d.mode = 'enforce' \
                 AND {position}(d.labels, $?) > 0)"
            ),
            label_needle(label),
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

            const POSITION: &str = <$store as Dialect>::POSITION;

            /// Drops moderator `$2`'s claim on item `$1` (a decision, a skip).
            const RELEASE: &str = "DELETE FROM review_claims WHERE item_id = $1 AND moderator = $2";

            /// Flag and report events on `items i`.
            const FLAGS: &str = "(SELECT COALESCE(SUM(c.value), 0) FROM counters c WHERE c.item_id = i.id \
                                 AND c.name IN ('flag', 'report'))";

            fn order_by(sort: QueueSort) -> String {
                match sort {
                    QueueSort::Oldest => "i.updated_at, i.id".to_string(),
                    QueueSort::Flags => format!("{FLAGS} DESC, i.updated_at, i.id"),
                }
            }

            /// The condition on `items i` of an item moderator `$1` may
            /// claim: held, matching `filter` (parameters from `$first`), no
            /// one else's live claim, not skipped by `$1`.
            fn claimable(filter: &QueueFilter, first: usize) -> (String, Vec<String>) {
                let (conditions, binds) = filter_sql(filter, first, POSITION);
                let sql = format!(
                    "i.status = 'held_for_review'{conditions} \
                     AND NOT EXISTS (SELECT 1 FROM review_claims c WHERE c.item_id = i.id AND c.expires_at > {NOW} \
                     AND c.moderator <> $1) \
                     AND NOT EXISTS (SELECT 1 FROM review_skips s WHERE s.item_id = i.id AND s.moderator = $1)"
                );
                (sql, binds)
            }

            /// The moderator's own live claim on a still-held item matching `filter`.
            async fn own_claim(store: &$store, moderator: &str, filter: &QueueFilter) -> StoreResult<Option<String>> {
                let (conditions, binds) = filter_sql(filter, 2, POSITION);
                let sql = format!(
                    "SELECT c.item_id FROM review_claims c JOIN items i ON i.id = c.item_id \
                     WHERE c.moderator = $1 AND c.expires_at > {NOW} AND i.status = 'held_for_review'{conditions} \
                     ORDER BY c.claimed_at LIMIT 1"
                );
                let mut q = sqlx::query_scalar(&sql).bind(moderator);
                for b in &binds {
                    q = q.bind(b.as_str());
                }
                Ok(q.fetch_optional(store.read_pool()).await?)
            }

            /// Whether any item is claimable by `moderator` under `filter`.
            async fn any_claimable(store: &$store, moderator: &str, filter: &QueueFilter) -> StoreResult<bool> {
                let (condition, binds) = claimable(filter, 2);
                let sql = format!("SELECT i.id FROM items i WHERE {condition} LIMIT 1");
                let mut q = sqlx::query_scalar::<_, String>(&sql).bind(moderator);
                for b in &binds {
                    q = q.bind(b.as_str());
                }
                Ok(q.fetch_optional(store.read_pool()).await?.is_some())
            }

            /// One attempt at claiming the first free item: `None` when there
            /// is none, or when a concurrent claim won the row this attempt
            /// picked. On PostgreSQL the pick skips rows another claim has
            /// locked, so concurrent claimers spread over the queue instead of
            /// queueing behind one row.
            async fn claim_once(
                store: &$store,
                moderator: &str,
                filter: &QueueFilter,
                sort: QueueSort,
                ttl_ms: i64,
            ) -> StoreResult<Option<String>> {
                let (condition, binds) = claimable(filter, 3);
                let sql = format!(
                    "INSERT INTO review_claims (item_id, moderator, claimed_at, expires_at) \
                     SELECT i.id, $1, {NOW}, {NOW} + $2 FROM items i WHERE {condition} \
                     ORDER BY {order} LIMIT 1{skip_locked} \
                     ON CONFLICT (item_id) DO UPDATE SET moderator = excluded.moderator, \
                     claimed_at = excluded.claimed_at, expires_at = excluded.expires_at \
                     WHERE review_claims.expires_at <= excluded.claimed_at \
                     OR review_claims.moderator = excluded.moderator \
                     RETURNING item_id",
                    order = order_by(sort),
                    skip_locked = <$store as Dialect>::SKIP_LOCKED,
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
                    session: &ConsoleSession,
                    ttl_ms: i64,
                ) -> StoreResult<()> {
                    let insert = format!(
                        "INSERT INTO console_sessions (id_hash, moderator, token_binding, csrf, created_at, expires_at) \
                         VALUES ($1, $2, $3, $4, {NOW}, {NOW} + $5)"
                    );
                    retry_conflicts!(async {
                        let mut tx = self.begin_write().await?;
                        sqlx::query(&insert)
                            .bind(id_hash)
                            .bind(&session.moderator)
                            .bind(&session.token_binding)
                            .bind(&session.csrf)
                            .bind(ttl_ms)
                            .execute(&mut *tx)
                            .await?;
                        tx.commit().await?;
                        Ok(())
                    })
                }

                async fn session(&self, id_hash: &str) -> StoreResult<Option<ConsoleSession>> {
                    let sql = format!(
                        "SELECT moderator, token_binding, csrf FROM console_sessions \
                         WHERE id_hash = $1 AND expires_at > {NOW}"
                    );
                    let row = sqlx::query_as::<_, (String, String, String)>(&sql)
                        .bind(id_hash)
                        .fetch_optional(self.read_pool())
                        .await?;
                    Ok(row.map(|(moderator, token_binding, csrf)| ConsoleSession {
                        moderator,
                        token_binding,
                        csrf,
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
                    sort: QueueSort,
                    ttl_ms: i64,
                ) -> StoreResult<Option<String>> {
                    if let Some(own) = own_claim(self, moderator, filter).await?
                        && self.renew_claim(&own, moderator, ttl_ms).await?
                    {
                        return Ok(Some(own));
                    }
                    for _ in 0..16 {
                        if let Some(item) = claim_once(self, moderator, filter, sort, ttl_ms).await? {
                            return Ok(Some(item));
                        }
                        if !any_claimable(self, moderator, filter).await? {
                            return Ok(None);
                        }
                    }
                    Err(StoreError::Conflict(
                        "every claim attempt lost its item to a concurrent claim".into(),
                    ))
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
                        sqlx::query(RELEASE)
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
                        sqlx::query(RELEASE)
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
                    let (conditions, binds) = filter_sql(filter, 3, POSITION);
                    let sql = format!(
                        "SELECT {items}, CAST({FLAGS} AS BIGINT) AS flags, \
                         (SELECT d.plugin || ': ' || d.reason FROM decisions d WHERE d.item_id = i.id AND d.applied \
                         AND d.verdict = 'hold' ORDER BY d.id DESC LIMIT 1) AS held_by, \
                         (SELECT c.moderator FROM review_claims c WHERE c.item_id = i.id \
                         AND c.expires_at > {NOW}) AS claimed_by \
                         FROM items i WHERE i.status = 'held_for_review'{conditions} \
                         ORDER BY {order} LIMIT $1 OFFSET $2",
                        items = ITEM_I.as_str(),
                        order = order_by(sort),
                    );
                    let mut q = sqlx::query(&sql).bind(PAGE_ROWS).bind(page.max(0) * PAGE_ROWS);
                    for b in &binds {
                        q = q.bind(b.as_str());
                    }
                    q.fetch_all(self.read_pool()).await?.iter().map(queue_row).collect()
                }

                async fn search_items(&self, q: &str, clients: &[&str]) -> StoreResult<Vec<Item>> {
                    // Each branch uses its own index and is bounded on its own.
                    let branch = |condition: &str| {
                        format!(
                            "SELECT * FROM (SELECT {items} FROM items i WHERE {condition} \
                             ORDER BY i.created_at DESC LIMIT $2) b",
                            items = ITEM_I.as_str()
                        )
                    };
                    let mut sql = branch("i.id = $1");
                    if !clients.is_empty() {
                        let list = placeholders(3, clients.len());
                        for column in ["external_id", "author"] {
                            sql.push_str(" UNION ");
                            sql.push_str(&branch(&format!("i.client IN ({list}) AND i.{column} = $1")));
                        }
                    }
                    let sql = format!("SELECT * FROM ({sql}) found ORDER BY created_at DESC LIMIT $2");
                    let mut query = sqlx::query(&sql).bind(q).bind(PAGE_ROWS);
                    for c in clients {
                        query = query.bind(*c);
                    }
                    query.fetch_all(self.read_pool()).await?.iter().map(txn::item_from_row).collect()
                }

                async fn author_summary(&self, client: &str, author: &str) -> StoreResult<AuthorSummary> {
                    const LATEST: &str = "(SELECT id, status FROM items WHERE client = $1 AND author = $2 \
                                          ORDER BY created_at DESC LIMIT $3) latest";
                    let recent = self.author_items(client, author, 10).await?;
                    let (items, rejected) = sqlx::query_as::<_, (i64, i64)>(&format!(
                        "SELECT COUNT(*), CAST(COALESCE(SUM(CASE WHEN status = 'rejected' THEN 1 ELSE 0 END), 0) \
                         AS BIGINT) FROM {LATEST}"
                    ))
                    .bind(client)
                    .bind(author)
                    .bind(AUTHOR_WINDOW)
                    .fetch_one(self.read_pool())
                    .await?;
                    let reversals = sqlx::query_scalar::<_, i64>(&format!(
                        "SELECT COUNT(*) FROM decisions d JOIN {LATEST} ON latest.id = d.item_id \
                         WHERE d.reversed_at IS NOT NULL"
                    ))
                    .bind(client)
                    .bind(author)
                    .bind(AUTHOR_WINDOW)
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
    fn labels_are_matched_as_whole_json_strings() {
        assert_eq!(label_needle("spam"), "\"spam\"");
        assert_eq!(label_needle("a\"b"), "\"a\\\"b\"");
    }

    #[test]
    fn filters_number_their_parameters_in_order() {
        let filter = QueueFilter {
            kind: Some("post".into()),
            plugin: Some("link-spam".into()),
            ..QueueFilter::default()
        };
        let (sql, binds) = filter_sql(&filter, 3, "instr");
        assert!(sql.contains("i.kind = $3") && sql.contains("d.plugin = $4"), "{sql}");
        assert_eq!(binds, vec!["post".to_string(), "link-spam".to_string()]);
        assert_eq!(
            filter_sql(&QueueFilter::default(), 1, "instr"),
            (String::new(), Vec::new())
        );
    }
}
