//! Authors' account standing: the state on the author's row, changed only
//! by a conditional write fenced by the row's `version` with its audit row
//! (`author_transitions`, whose outbox event a trigger writes) in the same
//! transaction; the strike score derived from the decision log in that same
//! transaction ([`crate::domain::standing`]).
//!
//! A recomputation locks the author's row, reads the decisions, and moves
//! the state to the tier the score reaches, so two recomputations of one
//! author (two workers, a lost lease) run one after the other and the
//! second finds nothing to do. Every transaction that records a decision
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
}

/// An author with their live strikes and their audit trail.
#[derive(Debug, Clone, PartialEq)]
pub struct AuthorDetails {
    pub record: AuthorRecord,
    /// Derived now from the decision log.
    pub strikes: Strikes,
    pub transitions: Vec<AuthorTransitionRecord>,
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
    /// An author's row, their strikes derived now, and their transitions.
    async fn author(
        &self,
        client: &str,
        author: &str,
        policy: &StandingPolicy,
        now: Millis,
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
            use $crate::domain::Verdict;
            use $crate::domain::standing::{
                AuthorActor, AuthorCause, CountedDecision, StandingPolicy, Strikes, automated_target,
            };
            use $crate::store::dialect::{Dialect, retry_conflicts};
            use $crate::store::*;

            const AUTHOR_COLUMNS: &str =
                "client, author, status, version, decided_by, strikes, first_seen, last_seen, recheck_at, updated_at";

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

            /// The author's strikes at `now`, derived from the decision log.
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
                let decisions = counted_decisions(exec, client, author, now - policy.window_ms).await?;
                Ok(policy.strikes(&decisions, now))
            }

            /// The author's enforced, applied, not reversed decisions of a
            /// verdict that can weigh, inside the window.
            async fn counted_decisions<'e, E>(
                exec: E,
                client: &str,
                author: &str,
                since: Millis,
            ) -> StoreResult<Vec<CountedDecision>>
            where
                E: sqlx::Executor<'e, Database = $db>,
            {
                let rows = sqlx::query(
                    "SELECT d.id, d.item_id, d.verdict, d.labels, d.created_at, \
                     CASE WHEN i.decided_by = 'moderator' THEN i.status END AS manual_status FROM items i \
                     JOIN decisions d ON d.item_id = i.id WHERE i.client = $1 AND i.author = $2 \
                     AND d.created_at > $3 AND d.mode = 'enforce' AND d.applied AND d.outcome = 'ok' \
                     AND d.reversed_at IS NULL AND d.verdict IN ('flag', 'hold', 'reject')",
                )
                .bind(client)
                .bind(author)
                .bind(since)
                .fetch_all(exec)
                .await?;
                rows.iter()
                    .map(|r| {
                        Ok(CountedDecision {
                            id: r.try_get("id")?,
                            item_id: r.try_get("item_id")?,
                            verdict: rows::parse::<Verdict>(r.try_get::<&str, _>("verdict")?)?,
                            labels: rows::labels(r.try_get::<&str, _>("labels")?)?,
                            created_at: r.try_get("created_at")?,
                            manual_status: rows::parse_opt(r.try_get::<Option<&str>, _>("manual_status")?)?,
                        })
                    })
                    .collect()
            }

            async fn transitions_of<'e, E>(exec: E, client: &str, author: &str) -> StoreResult<Vec<AuthorTransitionRecord>>
            where
                E: sqlx::Executor<'e, Database = $db>,
            {
                let rows = sqlx::query(
                    "SELECT id, from_status, to_status, version, cause, actor, actor_name, reason, strikes, \
                     correlation_id, created_at FROM author_transitions WHERE client = $1 AND author = $2 ORDER BY version",
                )
                .bind(client)
                .bind(author)
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
            }

            /// The conditional write of a change of state and its audit
            /// row; `None` when the row moved on (the fence refused it).
            async fn apply(tx: &mut txn::Tx<'_>, c: &Change<'_>) -> StoreResult<Option<i64>> {
                let version: Option<i64> = sqlx::query_scalar(
                    "UPDATE authors SET status = $1, version = version + 1, decided_by = $2, strikes = $3, \
                     recheck_at = $4, updated_at = $5 WHERE client = $6 AND author = $7 AND version = $8 RETURNING version",
                )
                .bind(c.to)
                .bind(c.decided_by.as_str())
                .bind(c.strikes)
                .bind(c.recheck_at)
                .bind(c.now)
                .bind(&c.from.client)
                .bind(&c.from.author)
                .bind(c.from.version)
                .fetch_optional(&mut **tx)
                .await?;
                let Some(version) = version else { return Ok(None) };
                sqlx::query(
                    "INSERT INTO author_transitions (client, author, from_status, to_status, version, cause, actor, \
                     actor_name, reason, strikes, correlation_id, created_at) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
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
                ) -> StoreResult<Option<AuthorDetails>> {
                    let mut tx = self.begin_snapshot().await?;
                    let Some(record) = read_author(&mut *tx, AUTHOR_ROW.as_str(), client, author).await? else {
                        return Ok(None);
                    };
                    let strikes = strikes_now(&mut *tx, client, author, policy, now).await?;
                    let transitions = transitions_of(&mut *tx, client, author).await?;
                    tx.commit().await?;
                    Ok(Some(AuthorDetails {
                        record,
                        strikes,
                        transitions,
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
                        let changes = to != current.status || manual != (decided_by == AuthorActor::Moderator);
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
                        };
                        let version = apply(&mut tx, &change).await?.ok_or_else(|| {
                            StoreError::Corrupt(format!("author {}/{} moved under its row lock", m.client, m.author))
                        })?;
                        tx.commit().await?;
                        Ok(AuthorModerationOutcome::Applied { version })
                    })
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
