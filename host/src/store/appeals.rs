//! Appeals of restrictive decisions (docs/ARCHITECTURE.md, "Statements of
//! reasons and appeals"). Opening one is one insert that the unique index
//! `appeals_one_open` decides (one open appeal per decision), its
//! `Idempotency-Key` sealed in the same transaction. Closing one is a
//! moderator's decision on the item: [`super::Items::transition_reversing`]
//! with [`AppealClose`] writes the item's transition, its reversals and the
//! appeal's closing in one transaction, and the table's CHECKs refuse a
//! closing by anyone but a moderator.

use super::{KeyCompletion, StoreResult};
use crate::clock::Millis;
use serde::Serialize;

crate::domain::string_enum! {
    /// Where an appeal is.
    pub enum AppealStatus("appeal status") {
        /// Waiting for a moderator.
        Open = "open",
        /// A moderator confirmed the decision.
        Upheld = "upheld",
        /// A moderator reversed the decision.
        Overturned = "overturned",
    }
}

crate::domain::string_enum! {
    /// On whose behalf the platform appeals.
    pub enum Appellant("appellant") {
        /// The author of the item the decision restricted.
        Author = "author",
        /// Whoever reported the item.
        Notifier = "notifier",
    }
}

/// An appeal as stored.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Appeal {
    pub id: String,
    pub item_id: String,
    /// The client token that submitted the item (and opened the appeal).
    pub client: String,
    /// The item version the appealed decision made: its statement's `puid`
    /// is `ITEM_ID-VERSION`.
    pub decision_version: i64,
    /// The status the appealed decision set.
    pub decision_status: crate::domain::ItemStatus,
    /// The policy the decision was stated under.
    pub policy: String,
    /// The rule behind the decision, if a rule decided it.
    pub plugin: Option<String>,
    pub plugin_version: Option<String>,
    pub appellant: Appellant,
    pub text: String,
    pub status: AppealStatus,
    pub opened_at: Millis,
    pub closed_at: Option<Millis>,
    /// The moderator (token name) who decided it.
    pub closed_by: Option<String>,
    pub close_reason: Option<String>,
    /// The item version the moderator's decision made.
    pub outcome_version: Option<i64>,
    /// The moderator whose claim on it is live (the console's appeal
    /// queue), if any: shown while it lasts.
    pub claimed_by: Option<String>,
    pub claim_expires_at: Option<Millis>,
}

/// An appeal to open.
#[derive(Debug, Clone)]
pub struct NewAppeal {
    pub appeal: Appeal,
    /// The request's `Idempotency-Key`, completed with the response in the
    /// insert's transaction.
    pub key: Option<KeyCompletion>,
    /// The response body a replay of the key answers.
    pub respond: fn(&Appeal) -> String,
}

/// What opening an appeal did.
#[derive(Debug, Clone, PartialEq)]
pub enum AppealOpened {
    Opened(Box<Appeal>),
    /// The decision has an open appeal already (its id).
    AlreadyOpen(String),
    /// The request's idempotency key expired before the write.
    KeyLost,
}

/// A moderator's decision closing an appeal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppealClose {
    pub id: String,
    /// [`AppealStatus::Upheld`] or [`AppealStatus::Overturned`].
    pub status: AppealStatus,
}

/// The figures of closed and open appeals of one plugin version and policy.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct AppealFigures {
    /// The rule behind the appealed decisions; `null` for moderators' own.
    pub plugin: Option<String>,
    pub plugin_version: Option<String>,
    pub policy: String,
    pub open: i64,
    pub upheld: i64,
    pub overturned: i64,
    /// Of the closed ones, the share overturned.
    pub overturn_rate: Option<f64>,
    /// Time from opening to decision, ms.
    pub decision_ms_p50: Option<i64>,
    pub decision_ms_p99: Option<i64>,
}

/// Appeals.
#[async_trait::async_trait]
pub trait Appeals: Send + Sync {
    /// Opens an appeal, unless its decision has an open one.
    async fn open_appeal(&self, new: &NewAppeal) -> StoreResult<AppealOpened>;

    async fn appeal(&self, id: &str) -> StoreResult<Option<Appeal>>;

    /// An item's appeals, oldest first.
    async fn item_appeals(&self, item_id: &str) -> StoreResult<Vec<Appeal>>;

    /// Appeals in `status`, oldest first, opened after `after` (`(opened_at, id)`).
    async fn appeal_queue(
        &self,
        status: AppealStatus,
        after: Option<(Millis, &str)>,
        limit: i64,
    ) -> StoreResult<Vec<Appeal>>;

    /// Claims the next open appeal for `moderator` for `ttl_ms`: their own
    /// live claim first, else the oldest appeal nobody else has a live
    /// claim on. One conditional write decides, so two moderators never
    /// hold one appeal. `None` when none is left.
    async fn claim_next_appeal(&self, moderator: &str, ttl_ms: i64) -> StoreResult<Option<String>>;

    /// Appeals opened since `since`, counted by plugin version and policy.
    async fn appeal_figures(&self, since: Millis) -> StoreResult<Vec<AppealFigures>>;
}

/// Columns of [`Appeal`], in its field order.
pub(super) const APPEAL_COLUMNS: &str = "id, item_id, client, decision_version, decision_status, policy, plugin, \
     plugin_version, appellant, text, status, opened_at, closed_at, closed_by, close_reason, outcome_version, \
     claimed_by, claim_expires_at";

/// The `p`-quantile (0-1) of sorted `values`, nearest rank.
pub(super) fn quantile(sorted: &[i64], p: f64) -> Option<i64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1])
}

/// One appeal for [`figures`]: the appealed decision's plugin, version and
/// policy, the appeal's status, and how long closing it took.
pub(super) type AppealRow = (Option<String>, Option<String>, String, AppealStatus, Option<i64>);

/// Rows of closed and open appeals folded into figures per (plugin,
/// version, policy).
pub(super) fn figures(rows: Vec<AppealRow>) -> Vec<AppealFigures> {
    type Key = (Option<String>, Option<String>, String);
    let mut by: std::collections::BTreeMap<Key, (i64, i64, i64, Vec<i64>)> = std::collections::BTreeMap::new();
    for (plugin, version, policy, status, took) in rows {
        let e = by.entry((plugin, version, policy)).or_default();
        match status {
            AppealStatus::Open => e.0 += 1,
            AppealStatus::Upheld => e.1 += 1,
            AppealStatus::Overturned => e.2 += 1,
        }
        e.3.extend(took);
    }
    by.into_iter()
        .map(
            |((plugin, plugin_version, policy), (open, upheld, overturned, mut took))| {
                took.sort_unstable();
                let closed = upheld + overturned;
                AppealFigures {
                    plugin,
                    plugin_version,
                    policy,
                    open,
                    upheld,
                    overturned,
                    overturn_rate: (closed > 0).then(|| overturned as f64 / closed as f64),
                    decision_ms_p50: quantile(&took, 0.5),
                    decision_ms_p99: quantile(&took, 0.99),
                }
            },
        )
        .collect()
}

/// A page of the appeals in status `$1` after the cursor `(opened_at, id)`
/// = (`$2`, `$3`), at most `$4`, on both stores: a row comparison, read
/// as a range of `appeals_by_status` (see [`super::items::review_page`]).
pub(crate) fn queue_page() -> &'static str {
    static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        format!(
            "SELECT {APPEAL_COLUMNS} FROM appeals WHERE status = $1 AND (opened_at, id) > ($2, $3) \
             ORDER BY opened_at, id LIMIT $4"
        )
    });
    &SQL
}

/// Instantiates [`Appeals`] for one backend.
macro_rules! impl_appeals {
    ($store:ty, $db:ty, $row:ty) => {
        const _: () = {
            use sqlx::Row as _;
            use $crate::clock::Millis;
            use $crate::store::appeals::{APPEAL_COLUMNS, figures};
            use $crate::store::dialect::{Dialect, retry_conflicts};
            use $crate::store::*;

            fn appeal_from_row(r: &$row) -> StoreResult<Appeal> {
                Ok(Appeal {
                    id: r.try_get("id")?,
                    item_id: r.try_get("item_id")?,
                    client: r.try_get("client")?,
                    decision_version: r.try_get("decision_version")?,
                    decision_status: r.try_get::<&str, _>("decision_status")?.parse()?,
                    policy: r.try_get("policy")?,
                    plugin: r.try_get("plugin")?,
                    plugin_version: r.try_get("plugin_version")?,
                    appellant: r.try_get::<&str, _>("appellant")?.parse()?,
                    text: r.try_get("text")?,
                    status: r.try_get::<&str, _>("status")?.parse()?,
                    opened_at: r.try_get("opened_at")?,
                    closed_at: r.try_get("closed_at")?,
                    closed_by: r.try_get("closed_by")?,
                    close_reason: r.try_get("close_reason")?,
                    outcome_version: r.try_get("outcome_version")?,
                    claimed_by: r.try_get("claimed_by")?,
                    claim_expires_at: r.try_get("claim_expires_at")?,
                })
            }

            #[async_trait::async_trait]
            impl Appeals for $store {
                async fn open_appeal(&self, new: &NewAppeal) -> StoreResult<AppealOpened> {
                    let a = &new.appeal;
                    let mut tx = self.begin_write().await?;
                    if let Some(k) = &new.key
                        && txn::seal_keys(&mut tx, &[k]).await?.is_empty()
                    {
                        tx.rollback().await?;
                        return Ok(AppealOpened::KeyLost);
                    }
                    let inserted = sqlx::query(&format!(
                        "INSERT INTO appeals ({APPEAL_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, \
                         $12, NULL, NULL, NULL, NULL, NULL, NULL) ON CONFLICT DO NOTHING"
                    ))
                    .bind(&a.id)
                    .bind(&a.item_id)
                    .bind(&a.client)
                    .bind(a.decision_version)
                    .bind(a.decision_status.as_str())
                    .bind(&a.policy)
                    .bind(&a.plugin)
                    .bind(&a.plugin_version)
                    .bind(a.appellant.as_str())
                    .bind(&a.text)
                    .bind(AppealStatus::Open.as_str())
                    .bind(a.opened_at)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                    if inserted == 0 {
                        tx.rollback().await?;
                        let open: Option<String> = sqlx::query_scalar(
                            "SELECT id FROM appeals WHERE item_id = $1 AND decision_version = $2 AND status = 'open'",
                        )
                        .bind(&a.item_id)
                        .bind(a.decision_version)
                        .fetch_optional(self.read_pool())
                        .await?;
                        return Ok(AppealOpened::AlreadyOpen(open.unwrap_or_default()));
                    }
                    if let Some(k) = &new.key {
                        txn::store_responses(
                            &mut tx,
                            &[(k.scope.as_str(), k.key.as_str(), k.status, (new.respond)(a))],
                        )
                        .await?;
                    }
                    tx.commit().await?;
                    Ok(AppealOpened::Opened(Box::new(a.clone())))
                }

                async fn appeal(&self, id: &str) -> StoreResult<Option<Appeal>> {
                    sqlx::query(&format!("SELECT {APPEAL_COLUMNS} FROM appeals WHERE id = $1"))
                        .bind(id)
                        .fetch_optional(self.read_pool())
                        .await?
                        .as_ref()
                        .map(appeal_from_row)
                        .transpose()
                }

                async fn item_appeals(&self, item_id: &str) -> StoreResult<Vec<Appeal>> {
                    sqlx::query(&format!(
                        "SELECT {APPEAL_COLUMNS} FROM appeals WHERE item_id = $1 ORDER BY opened_at, id"
                    ))
                    .bind(item_id)
                    .fetch_all(self.read_pool())
                    .await?
                    .iter()
                    .map(appeal_from_row)
                    .collect()
                }

                async fn appeal_queue(
                    &self,
                    status: AppealStatus,
                    after: Option<(Millis, &str)>,
                    limit: i64,
                ) -> StoreResult<Vec<Appeal>> {
                    let (at, id) = after.unwrap_or((i64::MIN, ""));
                    sqlx::query($crate::store::appeals::queue_page())
                    .bind(status.as_str())
                    .bind(at)
                    .bind(id)
                    .bind(limit)
                    .fetch_all(self.read_pool())
                    .await?
                    .iter()
                    .map(appeal_from_row)
                    .collect()
                }

                async fn claim_next_appeal(&self, moderator: &str, ttl_ms: i64) -> StoreResult<Option<String>> {
                    const NOW: &str = <$store as Dialect>::NOW_MS;
                    // Claimable by $1: open, and unclaimed, claimed by $1, or lapsed.
                    let free = format!("status = 'open' AND (claimed_by IS NULL OR claimed_by = $1 OR claim_expires_at <= {NOW})");
                    let sql = format!(
                        "UPDATE appeals SET claimed_by = $1, claim_expires_at = {NOW} + $2 WHERE id = \
                         (SELECT id FROM appeals WHERE {free} ORDER BY CASE WHEN claimed_by = $1 THEN 0 ELSE 1 END, \
                         opened_at, id LIMIT 1) AND {free} RETURNING id"
                    );
                    for _ in 0..8 {
                        let claimed = retry_conflicts!(async {
                            let mut tx = self.begin_write().await?;
                            let claimed: Option<String> = sqlx::query_scalar(&sql)
                                .bind(moderator)
                                .bind(ttl_ms)
                                .fetch_optional(&mut *tx)
                                .await?;
                            tx.commit().await?;
                            Ok(claimed)
                        })?;
                        if claimed.is_some() {
                            return Ok(claimed);
                        }
                        // Lost the pick to a concurrent claim, or nothing is left.
                        let left: Option<String> = sqlx::query_scalar(&format!("SELECT id FROM appeals WHERE {free} LIMIT 1"))
                            .bind(moderator)
                            .fetch_optional(self.read_pool())
                            .await?;
                        if left.is_none() {
                            return Ok(None);
                        }
                    }
                    Err(StoreError::Conflict("every pick of an appeal lost to a concurrent claim".into()))
                }

                async fn appeal_figures(&self, since: Millis) -> StoreResult<Vec<AppealFigures>> {
                    let rows: Vec<(Option<String>, Option<String>, String, String, Option<i64>)> = sqlx::query_as(
                        "SELECT plugin, plugin_version, policy, status, closed_at - opened_at FROM appeals \
                         WHERE opened_at >= $1",
                    )
                    .bind(since)
                    .fetch_all(self.read_pool())
                    .await?;
                    let rows = rows
                        .into_iter()
                        .map(|(p, v, policy, s, took)| Ok((p, v, policy, s.parse()?, took)))
                        .collect::<StoreResult<Vec<_>>>()?;
                    Ok(figures(rows))
                }
            }
        };
    };
}
pub(super) use impl_appeals;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_count_per_plugin_version_and_policy() {
        let p = |s: &str| Some(s.to_string());
        let rows = vec![
            (
                p("spam"),
                p("1.0.0"),
                "spam".to_string(),
                AppealStatus::Overturned,
                Some(100),
            ),
            (
                p("spam"),
                p("1.0.0"),
                "spam".to_string(),
                AppealStatus::Upheld,
                Some(300),
            ),
            (p("spam"), p("1.0.0"), "spam".to_string(), AppealStatus::Open, None),
            (None, None, "hate".to_string(), AppealStatus::Upheld, Some(50)),
        ];
        let f = figures(rows);
        assert_eq!(f.len(), 2);
        let spam = f.iter().find(|f| f.policy == "spam").unwrap();
        assert_eq!((spam.open, spam.upheld, spam.overturned), (1, 1, 1));
        assert_eq!(spam.overturn_rate, Some(0.5));
        assert_eq!((spam.decision_ms_p50, spam.decision_ms_p99), (Some(100), Some(300)));
        let hate = f.iter().find(|f| f.policy == "hate").unwrap();
        assert_eq!(hate.overturn_rate, Some(0.0));
    }

    #[test]
    fn quantiles_are_nearest_rank() {
        assert_eq!(quantile(&[], 0.5), None);
        let v: Vec<i64> = (1..=100).collect();
        assert_eq!(quantile(&v, 0.5), Some(50));
        assert_eq!(quantile(&v, 0.99), Some(99));
        assert_eq!(quantile(&[7], 0.99), Some(7));
    }

    #[test]
    fn the_migrations_check_the_appeal_strings() {
        let all = |v: &[AppealStatus]| v.iter().map(|s| s.as_str()).collect::<Vec<_>>();
        crate::domain::check_constraints::assert_mirrors("appeals", "status", &all(AppealStatus::ALL));
        let who: Vec<_> = Appellant::ALL.iter().map(|s| s.as_str()).collect();
        crate::domain::check_constraints::assert_mirrors("appeals", "appellant", &who);
    }
}
