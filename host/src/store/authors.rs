//! Authors' account standing: the state on the author's row, changed only
//! by a conditional write fenced by the row's `version` with its audit row
//! (`author_transitions`, whose outbox event a trigger writes) in the same
//! transaction; the strike score derived from the decision log in that same
//! transaction ([`crate::domain::standing`]) by one aggregate query, so
//! neither the lock nor the memory it takes grows with the author's history.
//!
//! A recomputation locks the author's row, sums the decisions, and moves
//! the state to the tier the score reaches, so two recomputations of one
//! author (two workers, a lost lease) run one after the other and the
//! second finds nothing to do. The lists a reader pages through (the
//! decisions that count, the transitions) are read in a snapshot, never
//! under the lock. Every transaction that records a decision
//! that may count, or reverses one, sets the author's `recheck_at` (see
//! `txn::mark_authors`), so the reconciler finds every author whose
//! recomputation a crash lost.

use super::StoreResult;
use crate::clock::Millis;
use crate::domain::standing::{AuthorActor, AuthorCause, StandingPolicy, Strikes};
use serde::Serialize;

/// An author's row.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct AuthorRecord {
    /// The client token the author's items came through.
    pub client: String,
    pub author: String,
    /// The account state (a tier name of `[standing]`).
    pub status: String,
    /// Bumped by every change of state; the `If-Match` of moderation.
    pub version: i64,
    /// `moderator` when a moderator set the state (automation leaves it
    /// alone until a moderator clears it), `rules` when automation did,
    /// `null` before the first change.
    pub decided_by: Option<AuthorActor>,
    /// The strike score at the last recomputation.
    pub strikes: f64,
    pub first_seen: Millis,
    pub last_seen: Millis,
    /// When the author is due for recomputation (a new decision, or the
    /// next strike expiring), if ever.
    pub recheck_at: Option<Millis>,
    pub updated_at: Millis,
    /// When the state a moderator set ends (automation decides again), for
    /// a timed one.
    pub state_until: Option<Millis>,
}

/// One change of an author's state: the audit trail.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct AuthorTransitionRecord {
    pub id: i64,
    pub from_status: String,
    pub to_status: String,
    /// The author's version after this transition.
    pub version: i64,
    pub cause: AuthorCause,
    pub actor: AuthorActor,
    /// The moderator's token name, for a manual change.
    pub actor_name: Option<String>,
    pub reason: String,
    /// The strike score when it happened.
    pub strikes: f64,
    pub correlation_id: String,
    pub created_at: Millis,
    /// When the state a moderator set here ends, for a timed one.
    pub ends_at: Option<Millis>,
}

/// An author with their live strikes and a page of their decisions that
/// count and of their audit trail.
#[derive(Debug, Clone, PartialEq)]
pub struct AuthorDetails {
    pub record: AuthorRecord,
    /// Derived now from the decision log.
    pub strikes: Strikes,
    /// The decisions that count (one per item), by id, after the page's cursor.
    pub decisions: Vec<i64>,
    /// The cursor of the next page of `decisions`, when there is one.
    pub next_decisions_after: Option<i64>,
    /// Changes of state by version, after the page's cursor.
    pub transitions: Vec<AuthorTransitionRecord>,
    /// The cursor (a version) of the next page of `transitions`, when there is one.
    pub next_transitions_after: Option<i64>,
}

/// Which part of an author's lists to read: those after each cursor (a
/// decision id, a version), at most `limit` of each (0: neither list).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuthorPage {
    pub decisions_after: i64,
    pub transitions_after: i64,
    pub limit: i64,
}

impl AuthorPage {
    /// The first page of both lists.
    pub fn first(limit: i64) -> AuthorPage {
        AuthorPage {
            decisions_after: 0,
            transitions_after: 0,
            limit,
        }
    }
}

/// What a recomputation did.
#[derive(Debug, Clone, PartialEq)]
pub struct Recomputed {
    pub strikes: f64,
    pub status: String,
    /// The state it left and the version it made, when it moved.
    pub transitioned: Option<(String, i64)>,
    /// When the author is next due (the oldest strike expiring).
    pub recheck_at: Option<Millis>,
}

/// A moderator setting an author's state, or clearing it (`status: None`:
/// automation decides again, from the strikes as they are now).
#[derive(Debug, Clone)]
pub struct AuthorModeration<'a> {
    pub client: &'a str,
    pub author: &'a str,
    pub status: Option<&'a str>,
    /// The version the moderator looked at.
    pub if_match: Option<i64>,
    pub actor_name: &'a str,
    pub reason: &'a str,
    pub correlation_id: &'a str,
    pub now: Millis,
    /// When a state set (`status: Some`) ends: automation decides again then.
    pub until: Option<Millis>,
}

/// What a moderator's change of an author's state did.
#[derive(Debug, Clone, PartialEq)]
pub enum AuthorModerationOutcome {
    /// Applied: the author's version now (unchanged when there was nothing to change).
    Applied {
        version: i64,
    },
    NotFound,
    /// `If-Match` named another version.
    VersionMismatch {
        current: i64,
    },
}

/// Authors' standing.
#[async_trait::async_trait]
pub trait Authors: Send + Sync {
    /// An author's row, their strikes derived now, and one page of the
    /// decisions that count and of their transitions: one snapshot, no lock.
    async fn author(
        &self,
        client: &str,
        author: &str,
        policy: &StandingPolicy,
        now: Millis,
        page: AuthorPage,
    ) -> StoreResult<Option<AuthorDetails>>;

    /// Derives the author's strikes and, unless a moderator decided the
    /// state, moves it to the tier they reach: one conditional write with
    /// its audit row. `None` for an author never seen.
    async fn recompute_author(
        &self,
        client: &str,
        author: &str,
        policy: &StandingPolicy,
        correlation_id: &str,
        now: Millis,
    ) -> StoreResult<Option<Recomputed>>;

    /// A moderator sets or clears an author's state (validated by the caller
    /// against the tiers).
    async fn moderate_author(
        &self,
        m: &AuthorModeration<'_>,
        policy: &StandingPolicy,
    ) -> StoreResult<AuthorModerationOutcome>;

    /// Hands back to automation the accounts whose timed manual state has
    /// ended by `now` (at most `limit`): each a conditional write under the
    /// author's row lock with its audit row (actor `rules`, cause `expiry`),
    /// to the tier the strikes reach then. Of two processes ending one
    /// state, one writes. Returns `(client, author, version)` of each.
    async fn end_timed_states(
        &self,
        policy: &StandingPolicy,
        now: Millis,
        limit: i64,
    ) -> StoreResult<Vec<(String, String, i64)>>;

    /// Author transitions in id order after `after`, made in `[since,
    /// until)` for `client` (any when `None`), each with its author's row:
    /// one keyset page of `gavel export statements`.
    async fn author_transitions_after(
        &self,
        after: i64,
        since: Millis,
        until: Millis,
        client: Option<&str>,
        limit: i64,
    ) -> StoreResult<Vec<(AuthorRecord, AuthorTransitionRecord)>>;

    /// Authors due for recomputation since before `before`, as
    /// `(recheck_at, client, author)` in that order, after `after` in it:
    /// one keyset page of a pass over all of them.
    async fn authors_due(
        &self,
        before: Millis,
        after: Option<(Millis, &str, &str)>,
        limit: i64,
    ) -> StoreResult<Vec<(Millis, String, String)>>;
}

/// The SQL of the decisions that count for `policy` (one per item, its
/// heaviest, the latest of equals) as `heaviest (id, created_at, w)`, over
/// an author's items: `$1` client, `$2` author, `$3` the window's start,
/// then the parameters [`bind_weights`] binds. `has_label` is the dialect's
/// test of a label (`{}` is its parameter). `None` when no verdict weighs.
pub(super) fn heaviest_sql(policy: &StandingPolicy, has_label: &str) -> Option<String> {
    let verdicts = policy.counted_verdicts();
    if verdicts.is_empty() {
        return None;
    }
    let listed: Vec<String> = verdicts.iter().map(|v| format!("'{}'", v.as_str())).collect();
    let by_verdict = "CASE d.verdict WHEN 'flag' THEN $4 WHEN 'hold' THEN $5 ELSE $6 END";
    // The heaviest of the verdict's and the labels' weights: the labels in
    // decreasing order of weight, the first one carried that outweighs the
    // verdict wins.
    let labels = weighing_labels(policy);
    let weight = if labels.is_empty() {
        by_verdict.to_string()
    } else {
        let mut weight = String::from("CASE");
        for k in 0..labels.len() {
            let (label, w) = (7 + 2 * k, 8 + 2 * k);
            let has = has_label.replace("{}", &format!("${label}"));
            weight.push_str(&format!(" WHEN {has} AND ${w} > {by_verdict} THEN ${w}"));
        }
        weight.push_str(&format!(" ELSE {by_verdict} END"));
        weight
    };
    Some(format!(
        "WITH counted AS (SELECT d.id, d.item_id, d.created_at, {weight} AS w FROM items i \
         JOIN decisions d ON d.item_id = i.id WHERE i.client = $1 AND i.author = $2 AND d.created_at > $3 \
         AND d.mode = 'enforce' AND d.applied AND d.outcome = 'ok' AND d.reversed_at IS NULL \
         AND d.verdict IN ({})), \
         heaviest AS (SELECT id, created_at, w, ROW_NUMBER() OVER (PARTITION BY item_id \
         ORDER BY w DESC, created_at DESC, id DESC) AS r FROM counted WHERE w > 0)",
        listed.join(", ")
    ))
}

/// The labels that weigh anything, heaviest first.
fn weighing_labels(policy: &StandingPolicy) -> Vec<(&str, f64)> {
    let mut labels: Vec<(&str, f64)> = policy
        .labels
        .iter()
        .filter(|(_, w)| **w > 0.0)
        .map(|(l, w)| (l.as_str(), *w))
        .collect();
    labels.sort_by(|a, b| b.1.total_cmp(&a.1));
    labels
}

/// The parameters of [`heaviest_sql`] after `$1`-`$3`: the weights of
/// `flag`, `hold` and `reject`, then each weighing label with its weight.
pub(super) fn weight_parameters(policy: &StandingPolicy) -> ([f64; 3], Vec<(&str, f64)>) {
    use crate::domain::Verdict;
    let of = |v| policy.weights.get(&v).copied().unwrap_or(0.0);
    (
        [of(Verdict::Flag), of(Verdict::Hold), of(Verdict::Reject)],
        weighing_labels(policy),
    )
}

/// Reason text of an automated transition.
pub(super) fn strikes_reason(policy: &StandingPolicy, score: f64, to: &str) -> String {
    let window = match policy.window_ms {
        ms if ms % 86_400_000 == 0 => format!("{} days", ms / 86_400_000),
        ms if ms % 3_600_000 == 0 => format!("{} hours", ms / 3_600_000),
        ms => format!("{} s", ms as f64 / 1000.0),
    };
    format!("{score} strikes in the last {window}: {to}")
}

/// Instantiates [`Authors`] for one backend.
macro_rules! impl_authors {
    ($store:ty, $db:ty, $row:ty) => {
        const _: () = {
            use sqlx::Row as _;
            use std::sync::LazyLock;
            use $crate::clock::Millis;
            use $crate::domain::standing::{AuthorActor, AuthorCause, StandingPolicy, Strikes, automated_target};
            use $crate::store::authors::{heaviest_sql, weight_parameters};

            type Query<'q> = sqlx::query::Query<'q, $db, <$db as sqlx::Database>::Arguments<'q>>;

            /// Binds the weights [`heaviest_sql`] names.
            fn bind_weights<'q>(mut q: Query<'q>, policy: &'q StandingPolicy) -> Query<'q> {
                let (verdicts, labels) = weight_parameters(policy);
                for w in verdicts {
                    q = q.bind(w);
                }
                for (label, w) in labels {
                    q = q.bind(label).bind(w);
                }
                q
            }
            use $crate::store::dialect::{Dialect, retry_conflicts};
            use $crate::store::*;

            const AUTHOR_COLUMNS: &str =
                "client, author, status, version, decided_by, strikes, first_seen, last_seen, recheck_at, updated_at, \
                 state_until";

            static AUTHOR_ROW: LazyLock<String> =
                LazyLock::new(|| format!("SELECT {AUTHOR_COLUMNS} FROM authors WHERE client = $1 AND author = $2"));
            static LOCK_AUTHOR: LazyLock<String> = LazyLock::new(|| {
                format!(
                    "SELECT {AUTHOR_COLUMNS} FROM authors WHERE client = $1 AND author = $2{}",
                    <$store as Dialect>::FOR_UPDATE
                )
            });

            fn author_from_row(row: &$row) -> StoreResult<AuthorRecord> {
                Ok(AuthorRecord {
                    client: row.try_get("client")?,
                    author: row.try_get("author")?,
                    status: row.try_get("status")?,
                    version: row.try_get("version")?,
                    decided_by: rows::parse_opt(row.try_get::<Option<&str>, _>("decided_by")?)?,
                    strikes: row.try_get("strikes")?,
                    first_seen: row.try_get("first_seen")?,
                    last_seen: row.try_get("last_seen")?,
                    recheck_at: row.try_get("recheck_at")?,
                    updated_at: row.try_get("updated_at")?,
                    state_until: row.try_get("state_until")?,
                })
            }

            /// An author's row, read with `sql` (`AUTHOR_ROW`, or `LOCK_AUTHOR`
            /// to lock it).
            async fn read_author<'e, E>(exec: E, sql: &str, client: &str, author: &str) -> StoreResult<Option<AuthorRecord>>
            where
                E: sqlx::Executor<'e, Database = $db>,
            {
                let row = sqlx::query(sql).bind(client).bind(author).fetch_optional(exec).await?;
                row.as_ref().map(author_from_row).transpose()
            }

            /// The author's strikes at `now`, derived from the decision log
            /// by one aggregate query: the sum over the author's items of
            /// the heaviest enforced, applied, not overturned decision in
            /// the window (0.0, not `-0.0`, when none counts).
            async fn strikes_now<'e, E>(
                exec: E,
                client: &str,
                author: &str,
                policy: &StandingPolicy,
                now: Millis,
            ) -> StoreResult<Strikes>
            where
                E: sqlx::Executor<'e, Database = $db>,
            {
                let Some(heaviest) = heaviest_sql(policy, <$store as Dialect>::HAS_LABEL) else {
                    return Ok(Strikes::default());
                };
                let sql = format!(
                    "{heaviest} SELECT COALESCE(SUM(w), 0.0) AS score, COUNT(*) AS counted, \
                     MIN(created_at) AS oldest FROM heaviest WHERE r = 1"
                );
                let q = sqlx::query(&sql).bind(client).bind(author).bind(now - policy.window_ms);
                let row = bind_weights(q, policy).fetch_one(exec).await?;
                let oldest: Option<Millis> = row.try_get("oldest")?;
                Ok(Strikes {
                    score: row.try_get("score")?,
                    counted: row.try_get("counted")?,
                    next_expiry: oldest.map(|at| at + policy.window_ms),
                })
            }

            /// A page of the decisions that count, by id, after `after`.
            async fn counted_decisions<'e, E>(
                exec: E,
                client: &str,
                author: &str,
                policy: &StandingPolicy,
                now: Millis,
                after: i64,
                limit: i64,
            ) -> StoreResult<Vec<i64>>
            where
                E: sqlx::Executor<'e, Database = $db>,
            {
                let Some(heaviest) = heaviest_sql(policy, <$store as Dialect>::HAS_LABEL) else {
                    return Ok(Vec::new());
                };
                let n = 7 + 2 * policy.labels.values().filter(|w| **w > 0.0).count();
                let sql = format!(
                    "{heaviest} SELECT id FROM heaviest WHERE r = 1 AND id > ${n} ORDER BY id LIMIT ${}",
                    n + 1
                );
                let q = sqlx::query(&sql).bind(client).bind(author).bind(now - policy.window_ms);
                let rows = bind_weights(q, policy).bind(after).bind(limit).fetch_all(exec).await?;
                rows.iter().map(|r| Ok(r.try_get("id")?)).collect()
            }

            /// A page of the author's transitions, by version, after `after`.
            async fn transitions_of<'e, E>(
                exec: E,
                client: &str,
                author: &str,
                after: i64,
                limit: i64,
            ) -> StoreResult<Vec<AuthorTransitionRecord>>
            where
                E: sqlx::Executor<'e, Database = $db>,
            {
                let rows = sqlx::query(
                    "SELECT id, from_status, to_status, version, cause, actor, actor_name, reason, strikes, \
                     correlation_id, created_at, ends_at FROM author_transitions WHERE client = $1 AND author = $2 \
                     AND version > $3 ORDER BY version LIMIT $4",
                )
                .bind(client)
                .bind(author)
                .bind(after)
                .bind(limit)
                .fetch_all(exec)
                .await?;
                rows.iter()
                    .map(|r| {
                        Ok(AuthorTransitionRecord {
                            id: r.try_get("id")?,
                            from_status: r.try_get("from_status")?,
                            to_status: r.try_get("to_status")?,
                            version: r.try_get("version")?,
                            cause: rows::parse(r.try_get::<&str, _>("cause")?)?,
                            actor: rows::parse(r.try_get::<&str, _>("actor")?)?,
                            actor_name: r.try_get("actor_name")?,
                            reason: r.try_get("reason")?,
                            strikes: r.try_get("strikes")?,
                            correlation_id: r.try_get("correlation_id")?,
                            created_at: r.try_get("created_at")?,
                            ends_at: r.try_get("ends_at")?,
                        })
                    })
                    .collect()
            }

            /// A change of state: who made it (`actor`), and who decides
            /// the state from now on (`decided_by`: a moderator clearing a
            /// manual state hands it back to the rules).
            struct Change<'a> {
                from: &'a AuthorRecord,
                to: &'a str,
                actor: AuthorActor,
                decided_by: AuthorActor,
                cause: AuthorCause,
                actor_name: Option<&'a str>,
                reason: &'a str,
                strikes: f64,
                recheck_at: Option<Millis>,
                correlation_id: &'a str,
                now: Millis,
                /// When a manual state set here ends (`None` clears any).
                until: Option<Millis>,
            }

            /// The conditional write of a change of state and its audit
            /// row; `None` when the row moved on (the fence refused it).
            async fn apply(tx: &mut txn::Tx<'_>, c: &Change<'_>) -> StoreResult<Option<i64>> {
                let version: Option<i64> = sqlx::query_scalar(
                    "UPDATE authors SET status = $1, version = version + 1, decided_by = $2, strikes = $3, \
                     recheck_at = $4, updated_at = $5, state_until = $9 WHERE client = $6 AND author = $7 \
                     AND version = $8 RETURNING version",
                )
                .bind(c.to)
                .bind(c.decided_by.as_str())
                .bind(c.strikes)
                .bind(c.recheck_at)
                .bind(c.now)
                .bind(&c.from.client)
                .bind(&c.from.author)
                .bind(c.from.version)
                .bind(c.until)
                .fetch_optional(&mut **tx)
                .await?;
                let Some(version) = version else { return Ok(None) };
                sqlx::query(
                    "INSERT INTO author_transitions (client, author, from_status, to_status, version, cause, actor, \
                     actor_name, reason, strikes, correlation_id, created_at, ends_at) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)",
                )
                .bind(&c.from.client)
                .bind(&c.from.author)
                .bind(&c.from.status)
                .bind(c.to)
                .bind(version)
                .bind(c.cause.as_str())
                .bind(c.actor.as_str())
                .bind(c.actor_name)
                .bind(c.reason)
                .bind(c.strikes)
                .bind(c.correlation_id)
                .bind(c.now)
                .bind(c.until)
                .execute(&mut **tx)
                .await?;
                Ok(Some(version))
            }

            #[async_trait::async_trait]
            impl Authors for $store {
                async fn author(
                    &self,
                    client: &str,
                    author: &str,
                    policy: &StandingPolicy,
                    now: Millis,
                    page: AuthorPage,
                ) -> StoreResult<Option<AuthorDetails>> {
                    let mut tx = self.begin_snapshot().await?;
                    let Some(record) = read_author(&mut *tx, AUTHOR_ROW.as_str(), client, author).await? else {
                        return Ok(None);
                    };
                    let strikes = strikes_now(&mut *tx, client, author, policy, now).await?;
                    let (mut decisions, mut transitions) = (Vec::new(), Vec::new());
                    if page.limit > 0 {
                        // One more than the page: whether there is a next one.
                        let (after, n) = (page.decisions_after, page.limit + 1);
                        decisions = counted_decisions(&mut *tx, client, author, policy, now, after, n).await?;
                        transitions = transitions_of(&mut *tx, client, author, page.transitions_after, n).await?;
                    }
                    tx.commit().await?;
                    let more = |n: usize| n as i64 > page.limit && page.limit > 0;
                    let next_decisions_after = more(decisions.len()).then(|| decisions[page.limit as usize - 1]);
                    let next_transitions_after =
                        more(transitions.len()).then(|| transitions[page.limit as usize - 1].version);
                    decisions.truncate(page.limit as usize);
                    transitions.truncate(page.limit as usize);
                    Ok(Some(AuthorDetails {
                        record,
                        strikes,
                        decisions,
                        next_decisions_after,
                        transitions,
                        next_transitions_after,
                    }))
                }

                async fn recompute_author(
                    &self,
                    client: &str,
                    author: &str,
                    policy: &StandingPolicy,
                    correlation_id: &str,
                    now: Millis,
                ) -> StoreResult<Option<Recomputed>> {
                    retry_conflicts!(async {
                        let mut tx = self.begin_write().await?;
                        let Some(current) = read_author(&mut *tx, LOCK_AUTHOR.as_str(), client, author).await? else {
                            tx.rollback().await?;
                            return Ok(None);
                        };
                        let strikes = strikes_now(&mut *tx, client, author, policy, now).await?;
                        let manual = current.decided_by == Some(AuthorActor::Moderator);
                        let target = policy
                            .enabled
                            .then(|| automated_target(policy, &current.status, manual, strikes.score))
                            .flatten();
                        let mut out = Recomputed {
                            strikes: strikes.score,
                            status: current.status.clone(),
                            transitioned: None,
                            recheck_at: strikes.next_expiry,
                        };
                        match target {
                            Some(to) => {
                                let reason = strikes_reason(policy, strikes.score, to);
                                let change = Change {
                                    from: &current,
                                    to,
                                    actor: AuthorActor::Rules,
                                    decided_by: AuthorActor::Rules,
                                    cause: AuthorCause::Strikes,
                                    actor_name: None,
                                    reason: &reason,
                                    strikes: strikes.score,
                                    recheck_at: strikes.next_expiry,
                                    correlation_id,
                                    now,
                                    until: None,
                                };
                                // The row is locked (PostgreSQL) or the one
                                // writer is ours (SQLite): the fence holds.
                                let version = apply(&mut tx, &change).await?.ok_or_else(|| {
                                    StoreError::Corrupt(format!("author {client}/{author} moved under its row lock"))
                                })?;
                                out.transitioned = Some((current.status.clone(), version));
                                out.status = to.to_string();
                            }
                            None => {
                                sqlx::query(
                                    "UPDATE authors SET strikes = $1, recheck_at = $2 WHERE client = $3 AND author = $4",
                                )
                                .bind(strikes.score)
                                .bind(strikes.next_expiry)
                                .bind(client)
                                .bind(author)
                                .execute(&mut *tx)
                                .await?;
                            }
                        }
                        tx.commit().await?;
                        Ok(Some(out))
                    })
                }

                async fn moderate_author(
                    &self,
                    m: &AuthorModeration<'_>,
                    policy: &StandingPolicy,
                ) -> StoreResult<AuthorModerationOutcome> {
                    retry_conflicts!(async {
                        let mut tx = self.begin_write().await?;
                        let Some(current) = read_author(&mut *tx, LOCK_AUTHOR.as_str(), m.client, m.author).await?
                        else {
                            tx.rollback().await?;
                            return Ok(AuthorModerationOutcome::NotFound);
                        };
                        if let Some(expected) = m.if_match
                            && expected != current.version
                        {
                            tx.rollback().await?;
                            return Ok(AuthorModerationOutcome::VersionMismatch {
                                current: current.version,
                            });
                        }
                        let strikes = strikes_now(&mut *tx, m.client, m.author, policy, m.now).await?;
                        let manual = current.decided_by == Some(AuthorActor::Moderator);
                        let (to, decided_by) = match m.status {
                            Some(s) => (s.to_string(), AuthorActor::Moderator),
                            None if policy.enabled => (policy.tier_for(strikes.score).name.clone(), AuthorActor::Rules),
                            None => (policy.initial().to_string(), AuthorActor::Rules),
                        };
                        let until = m.status.and(m.until);
                        let changes = to != current.status
                            || manual != (decided_by == AuthorActor::Moderator)
                            || until != current.state_until;
                        if !changes {
                            tx.rollback().await?;
                            return Ok(AuthorModerationOutcome::Applied {
                                version: current.version,
                            });
                        }
                        let change = Change {
                            from: &current,
                            to: &to,
                            actor: AuthorActor::Moderator,
                            decided_by,
                            cause: AuthorCause::Moderation,
                            actor_name: Some(m.actor_name),
                            reason: m.reason,
                            strikes: strikes.score,
                            recheck_at: strikes.next_expiry,
                            correlation_id: m.correlation_id,
                            now: m.now,
                            until,
                        };
                        let version = apply(&mut tx, &change).await?.ok_or_else(|| {
                            StoreError::Corrupt(format!("author {}/{} moved under its row lock", m.client, m.author))
                        })?;
                        tx.commit().await?;
                        Ok(AuthorModerationOutcome::Applied { version })
                    })
                }

                async fn author_transitions_after(
                    &self,
                    after: i64,
                    since: Millis,
                    until: Millis,
                    client: Option<&str>,
                    limit: i64,
                ) -> StoreResult<Vec<(AuthorRecord, AuthorTransitionRecord)>> {
                    let authors: String = AUTHOR_COLUMNS
                        .split(',')
                        .map(|c| format!("a.{}", c.trim()))
                        .collect::<Vec<_>>()
                        .join(", ");
                    let rows = sqlx::query(&format!(
                        "SELECT {authors}, t.id AS t_id, t.from_status AS t_from, t.to_status AS t_to, \
                         t.version AS t_version, t.cause AS t_cause, t.actor AS t_actor, t.actor_name AS t_actor_name, \
                         t.reason AS t_reason, t.strikes AS t_strikes, t.correlation_id AS t_correlation, \
                         t.created_at AS t_created_at, t.ends_at AS t_ends_at \
                         FROM author_transitions t JOIN authors a ON a.client = t.client AND a.author = t.author \
                         WHERE t.id > $1 AND t.created_at >= $2 AND t.created_at < $3 AND ($4 = '' OR t.client = $4) \
                         ORDER BY t.id LIMIT $5"
                    ))
                    .bind(after)
                    .bind(since)
                    .bind(until)
                    .bind(client.unwrap_or(""))
                    .bind(limit)
                    .fetch_all(self.read_pool())
                    .await?;
                    rows.iter()
                        .map(|r| {
                            Ok((
                                author_from_row(r)?,
                                AuthorTransitionRecord {
                                    id: r.try_get("t_id")?,
                                    from_status: r.try_get("t_from")?,
                                    to_status: r.try_get("t_to")?,
                                    version: r.try_get("t_version")?,
                                    cause: rows::parse(r.try_get::<&str, _>("t_cause")?)?,
                                    actor: rows::parse(r.try_get::<&str, _>("t_actor")?)?,
                                    actor_name: r.try_get("t_actor_name")?,
                                    reason: r.try_get("t_reason")?,
                                    strikes: r.try_get("t_strikes")?,
                                    correlation_id: r.try_get("t_correlation")?,
                                    created_at: r.try_get("t_created_at")?,
                                    ends_at: r.try_get("t_ends_at")?,
                                },
                            ))
                        })
                        .collect()
                }

                async fn end_timed_states(
                    &self,
                    policy: &StandingPolicy,
                    now: Millis,
                    limit: i64,
                ) -> StoreResult<Vec<(String, String, i64)>> {
                    let due: Vec<(String, String)> = sqlx::query_as(
                        "SELECT client, author FROM authors WHERE state_until <= $1 ORDER BY state_until LIMIT $2",
                    )
                    .bind(now)
                    .bind(limit)
                    .fetch_all(self.read_pool())
                    .await?;
                    let mut ended = Vec::new();
                    for (client, author) in due {
                        let done = retry_conflicts!(async {
                            let mut tx = self.begin_write().await?;
                            let current = read_author(&mut *tx, LOCK_AUTHOR.as_str(), &client, &author).await?;
                            // Under the lock: still manual, still timed, still due.
                            let Some(current) = current.filter(|c| {
                                c.decided_by == Some(AuthorActor::Moderator) && c.state_until.is_some_and(|u| u <= now)
                            }) else {
                                tx.rollback().await?;
                                return Ok(None);
                            };
                            let strikes = strikes_now(&mut *tx, &client, &author, policy, now).await?;
                            let to = match policy.enabled {
                                true => policy.tier_for(strikes.score).name.clone(),
                                false => policy.initial().to_string(),
                            };
                            let reason = format!(
                                "the state {} a moderator set until {} ended; {} strikes: {to}",
                                current.status,
                                $crate::domain::statements::date_time(current.state_until.unwrap_or(now)),
                                strikes.score
                            );
                            let change = Change {
                                from: &current,
                                to: &to,
                                actor: AuthorActor::Rules,
                                decided_by: AuthorActor::Rules,
                                cause: AuthorCause::Expiry,
                                actor_name: None,
                                reason: &reason,
                                strikes: strikes.score,
                                recheck_at: strikes.next_expiry,
                                correlation_id: "state-ended",
                                now,
                                until: None,
                            };
                            let version = apply(&mut tx, &change).await?.ok_or_else(|| {
                                StoreError::Corrupt(format!("author {client}/{author} moved under its row lock"))
                            })?;
                            tx.commit().await?;
                            Ok(Some(version))
                        })?;
                        if let Some(version) = done {
                            ended.push((client, author, version));
                        }
                    }
                    Ok(ended)
                }

                async fn authors_due(
                    &self,
                    before: Millis,
                    after: Option<(Millis, &str, &str)>,
                    limit: i64,
                ) -> StoreResult<Vec<(Millis, String, String)>> {
                    let (at, client, author) = after.unwrap_or((Millis::MIN, "", ""));
                    Ok(sqlx::query_as(
                        "SELECT recheck_at, client, author FROM authors WHERE recheck_at IS NOT NULL \
                         AND recheck_at <= $1 AND (recheck_at, client, author) > ($2, $3, $4) \
                         ORDER BY recheck_at, client, author LIMIT $5",
                    )
                    .bind(before)
                    .bind(at)
                    .bind(client)
                    .bind(author)
                    .bind(limit)
                    .fetch_all(self.read_pool())
                    .await?)
                }
            }
        };
    };
}
pub(super) use impl_authors;
