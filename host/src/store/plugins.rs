//! Which plugin code ran when (`plugin_versions`, one row per load per
//! process, with its circuit-breaker history), and what each version (by
//! digest) decided over every process.

use super::StoreResult;
use crate::clock::Millis;
use crate::domain::{Mode, PluginEvent, PluginVersionStatus};
use serde::Serialize;

/// Decisions [`PluginFigures`] covers: a version's latest, so reading its
/// figures costs the same however long it has served.
pub const FIGURES_WINDOW: i64 = 10_000;

/// The verdicts that act on an item, as the partial index
/// `decisions_actions` names them: a query reads that index only when its
/// `WHERE` repeats these terms (SQLite compares them as written; see
/// migrations/sqlite/0070_actions_index_without_in.sql for why not `IN`).
pub const ACTING_VERDICTS: &str = "(verdict = 'flag' OR verdict = 'hold' OR verdict = 'reject')";

/// What one plugin version (digest) has done lately, over every process:
/// its latest [`FIGURES_WINDOW`] decisions (all of them when it has made
/// fewer). Per-process totals since start are in `/metrics`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, utoipa::ToSchema)]
pub struct PluginFigures {
    /// Evaluations these figures cover (at most 10,000, the latest).
    pub evaluations: i64,
    /// Evaluations by outcome (`ok`, `trap`, `timeout`, ...).
    pub outcomes: std::collections::BTreeMap<String, i64>,
    /// Decisions by verdict (`allow`, `hold`, ...), of evaluations that decided.
    pub verdicts: std::collections::BTreeMap<String, i64>,
    /// Its actions (applied `flag`, `hold` and `reject` decisions) of the
    /// last 30 days, whatever the window above.
    pub actions: i64,
    /// Of those actions, how many a moderator has overturned.
    pub reversals: i64,
    /// `reversals / actions`, when there were any.
    pub reversal_rate: Option<f64>,
    /// Evaluation duration percentiles.
    pub p50_us: Option<i64>,
    pub p99_us: Option<i64>,
}

/// One `plugin_versions` row.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct PluginVersionRecord {
    pub id: i64,
    /// The gavel process that loaded it (`host:pid`).
    pub node: String,
    pub name: Option<String>,
    pub version: Option<String>,
    pub digest: Option<String>,
    pub path: String,
    pub mode: Option<Mode>,
    pub status: PluginVersionStatus,
    pub error: Option<String>,
    pub loaded_at: Millis,
    pub unloaded_at: Option<Millis>,
    /// How often its circuit breaker opened, the last time it did and why,
    /// and the last time a probe found it healthy again.
    pub quarantines: i64,
    pub quarantined_at: Option<Millis>,
    pub breaker_detail: Option<String>,
    pub recovered_at: Option<Millis>,
}

/// One day of a version's actions and how many a moderator overturned, for
/// the console's chart.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct ReversalPoint {
    /// Start of the day (ms since the epoch, UTC).
    pub day: Millis,
    /// Applied `flag`, `hold` and `reject` decisions made that day.
    pub actions: i64,
    /// Of those, how many a moderator has overturned since.
    pub reversals: i64,
}

impl PluginFigures {
    /// The figures of `(outcome, verdict, count)` groups, and `(actions,
    /// reversals)`, without the percentiles.
    pub fn of(groups: Vec<(String, Option<String>, i64)>, (actions, reversals): (i64, i64)) -> PluginFigures {
        let mut f = PluginFigures {
            actions,
            reversals,
            reversal_rate: (actions > 0).then(|| reversals as f64 / actions as f64),
            ..PluginFigures::default()
        };
        for (outcome, verdict, count) in groups {
            f.evaluations += count;
            *f.outcomes.entry(outcome).or_default() += count;
            if let Some(v) = verdict {
                *f.verdicts.entry(v).or_default() += count;
            }
        }
        f
    }
}

/// The plugin history.
#[async_trait::async_trait]
pub trait PluginHistory: Send + Sync {
    /// Records a plugin load, unload, quarantine, recovery or failed load for `node`.
    async fn record_plugin_event(&self, node: &str, event: &PluginEvent) -> StoreResult<()>;

    /// Evaluations, outcomes, verdicts, reversals and duration percentiles
    /// of the latest [`FIGURES_WINDOW`] decisions of the version with `digest`.
    async fn plugin_figures(&self, digest: &str) -> StoreResult<PluginFigures>;

    /// Actions (applied `flag`, `hold`, `reject`) of `digest` per day since
    /// `since`, and how many of them were overturned.
    async fn reversal_series(&self, digest: &str, since: Millis) -> StoreResult<Vec<ReversalPoint>>;

    /// `plugin_versions`, newest first.
    async fn plugin_history(&self, limit: i64) -> StoreResult<Vec<PluginVersionRecord>>;
}

/// Instantiates [`PluginHistory`] for one backend.
macro_rules! impl_plugin_history {
    ($store:ty, $db:ty, $row:ty) => {
        const _: () = {
            use sqlx::Row as _;
            use $crate::clock::Millis;
            use $crate::domain::PluginEvent;
            use $crate::store::dialect::{Dialect, retry_conflicts};
            use $crate::store::rows;
            use $crate::store::*;

            const DAY_MS: i64 = 86_400_000;

            #[async_trait::async_trait]
            impl PluginHistory for $store {
                async fn record_plugin_event(&self, node: &str, event: &PluginEvent) -> StoreResult<()> {
                    retry_conflicts!(async {
                        let mut tx = self.begin_write().await?;
                        let q = match event {
                            PluginEvent::Loaded { name, version, digest, path, mode, at } => sqlx::query(
                                "INSERT INTO plugin_versions (node, name, version, digest, path, mode, status, loaded_at) \
                                 VALUES ($1, $2, $3, $4, $5, $6, 'active', $7)",
                            )
                            .bind(node)
                            .bind(name)
                            .bind(version)
                            .bind(digest)
                            .bind(path)
                            .bind(mode.as_str())
                            .bind(*at),
                            PluginEvent::Unloaded { name, digest, at } => sqlx::query(
                                "UPDATE plugin_versions SET status = CASE WHEN status = 'quarantined' THEN status \
                                 ELSE 'retired' END, unloaded_at = $4 WHERE node = $1 AND name = $2 AND digest = $3 \
                                 AND unloaded_at IS NULL AND status <> 'failed'",
                            )
                            .bind(node)
                            .bind(name)
                            .bind(digest)
                            .bind(*at),
                            PluginEvent::Quarantined { name, digest, detail, at } => sqlx::query(
                                "UPDATE plugin_versions SET status = 'quarantined', quarantines = quarantines + 1, \
                                 quarantined_at = $4, breaker_detail = $5 WHERE node = $1 AND name = $2 AND digest = $3 \
                                 AND unloaded_at IS NULL AND status = 'active'",
                            )
                            .bind(node)
                            .bind(name)
                            .bind(digest)
                            .bind(*at)
                            .bind(detail),
                            PluginEvent::Recovered { name, digest, at } => sqlx::query(
                                "UPDATE plugin_versions SET status = 'active', recovered_at = $4 WHERE node = $1 \
                                 AND name = $2 AND digest = $3 AND unloaded_at IS NULL AND status = 'quarantined'",
                            )
                            .bind(node)
                            .bind(name)
                            .bind(digest)
                            .bind(*at),
                            PluginEvent::Failed { path, digest, error, at } => sqlx::query(
                                "INSERT INTO plugin_versions (node, digest, path, status, error, loaded_at, unloaded_at) \
                                 VALUES ($1, $2, $3, 'failed', $4, $5, $5)",
                            )
                            .bind(node)
                            .bind(digest.as_deref())
                            .bind(path)
                            .bind(error)
                            .bind(*at),
                        };
                        q.execute(&mut *tx).await?;
                        tx.commit().await?;
                        Ok(())
                    })
                }

                async fn plugin_figures(&self, digest: &str) -> StoreResult<PluginFigures> {
                    // Aggregated in the database over the window, from the
                    // covering index: a few rows cross to the host, not 10,000.
                    // A digest is one version's code (its info() names it),
                    // so one `plugin_refs` row: compared with `=`, the index
                    // gives the newest decisions in order (`IN` would sort them all).
                    const WINDOW: &str = "(SELECT outcome, verdict, duration_us FROM decisions \
                                          WHERE plugin_ref = (SELECT MIN(id) FROM plugin_refs WHERE digest = $1) \
                                          ORDER BY id DESC LIMIT $2) latest";
                    let groups = sqlx::query_as::<_, (String, Option<String>, i64)>(&format!(
                        "SELECT outcome, verdict, COUNT(*) FROM {WINDOW} GROUP BY outcome, verdict"
                    ))
                    .bind(digest)
                    .bind(FIGURES_WINDOW)
                    .fetch_all(self.read_pool())
                    .await?;
                    // Reversals come hours after the decision: counted over a
                    // month of actions, from the partial index of actions.
                    let actions = sqlx::query_as::<_, (i64, i64)>(&format!(
                        "SELECT COUNT(*), COALESCE(SUM(CASE WHEN reversed_at IS NOT NULL THEN 1 ELSE 0 END), 0) \
                         FROM decisions WHERE plugin_ref = (SELECT MIN(id) FROM plugin_refs WHERE digest = $1) \
                         AND created_at >= {} - $2 AND applied AND {}",
                        <$store as Dialect>::NOW_MS,
                        $crate::store::plugins::ACTING_VERDICTS
                    ))
                    .bind(digest)
                    .bind(30 * DAY_MS)
                    .fetch_one(self.read_pool())
                    .await?;
                    let mut f = PluginFigures::of(groups, actions);
                    if f.evaluations > 0 {
                        let percentile = format!("SELECT duration_us FROM {WINDOW} ORDER BY duration_us LIMIT 1 OFFSET $3");
                        for (p, slot) in [(50, &mut f.p50_us), (99, &mut f.p99_us)] {
                            *slot = sqlx::query_scalar(&percentile)
                                .bind(digest)
                                .bind(FIGURES_WINDOW)
                                .bind((f.evaluations - 1) * p / 100)
                                .fetch_optional(self.read_pool())
                                .await?;
                        }
                    }
                    Ok(f)
                }

                async fn reversal_series(&self, digest: &str, since: Millis) -> StoreResult<Vec<ReversalPoint>> {
                    let rows = sqlx::query_as::<_, (i64, i64, i64)>(&format!(
                        "SELECT (created_at / $3) * $3 AS day, COUNT(*), \
                         COALESCE(SUM(CASE WHEN reversed_at IS NOT NULL THEN 1 ELSE 0 END), 0) FROM decisions \
                         WHERE plugin_ref = (SELECT MIN(id) FROM plugin_refs WHERE digest = $1) \
                         AND created_at >= $2 AND applied AND {} GROUP BY day ORDER BY day",
                        $crate::store::plugins::ACTING_VERDICTS
                    ))
                    .bind(digest)
                    .bind(since)
                    .bind(DAY_MS)
                    .fetch_all(self.read_pool())
                    .await?;
                    Ok(rows
                        .into_iter()
                        .map(|(day, actions, reversals)| ReversalPoint { day, actions, reversals })
                        .collect())
                }

                async fn plugin_history(&self, limit: i64) -> StoreResult<Vec<PluginVersionRecord>> {
                    let rows = sqlx::query(
                        "SELECT id, node, name, version, digest, path, mode, status, error, loaded_at, unloaded_at, \
                         quarantines, quarantined_at, breaker_detail, recovered_at FROM plugin_versions \
                         ORDER BY id DESC LIMIT $1",
                    )
                    .bind(limit)
                    .fetch_all(self.read_pool())
                    .await?;
                    rows.iter()
                        .map(|r| {
                            Ok(PluginVersionRecord {
                                id: r.try_get("id")?,
                                node: r.try_get("node")?,
                                name: r.try_get("name")?,
                                version: r.try_get("version")?,
                                digest: r.try_get("digest")?,
                                path: r.try_get("path")?,
                                mode: rows::parse_opt(r.try_get::<Option<&str>, _>("mode")?)?,
                                status: rows::parse(r.try_get::<&str, _>("status")?)?,
                                error: r.try_get("error")?,
                                loaded_at: r.try_get("loaded_at")?,
                                unloaded_at: r.try_get("unloaded_at")?,
                                quarantines: r.try_get::<i32, _>("quarantines")?.into(),
                                quarantined_at: r.try_get("quarantined_at")?,
                                breaker_detail: r.try_get("breaker_detail")?,
                                recovered_at: r.try_get("recovered_at")?,
                            })
                        })
                        .collect()
                }
            }
        };
    };
}
pub(super) use impl_plugin_history;
