//! Evaluations: the snapshots rules judge (read together for a claimed
//! batch, in one consistent view), the fenced commit of what they decided,
//! and the dead letters of evaluations that failed in the host.
//!
//! The fence: a commit names the snapshot it judged (item version and
//! evaluation round). It applies only while the item is still at that
//! version and no other evaluation has committed since the snapshot
//! (`eval_round` unchanged, then bumped), whether it changes the status or
//! only records decisions; anything else is `Stale`, writes nothing, and
//! the worker judges the item again. So two workers that judged the same
//! snapshot (a lease lost) never both record decisions.

use super::{Item, NewDecision, StoreResult};
use crate::clock::Millis;
use crate::domain::{ItemStatus, Verdict};
use serde::Serialize;

/// What a provider already said about an item's current content.
#[derive(Debug, Clone, PartialEq)]
pub struct ProviderAnswerRecord {
    pub provider: String,
    pub verdict: Verdict,
    pub score: f64,
    pub labels: Vec<String>,
    pub reason: String,
    pub answered_at: Millis,
}

/// Everything a rule's snapshot is built from, read in one consistent view.
#[derive(Debug, Clone, PartialEq)]
pub struct SnapshotData {
    pub item: Item,
    pub counters: Vec<(String, i64)>,
    /// Other items by this author (same client) created within the author window.
    pub author_recent_items: i64,
    /// Other items by this author currently rejected / held.
    pub author_rejected_items: i64,
    pub author_held_items: i64,
    /// Other items by this author with the same normalised text in the window.
    pub duplicate_count: i64,
    /// The author's account standing.
    pub standing: StandingData,
    /// Events since the last evaluation: (kind, actor, at), oldest first, at most 64.
    pub trigger: Vec<(String, String, Millis)>,
    /// Answers providers gave for the current content.
    pub provider_answers: Vec<ProviderAnswerRecord>,
    /// The provider of the outstanding request for the current content.
    pub waiting_on: Option<String>,
    /// The item's entity signal values (not read by the store: the worker
    /// fills them from the counts).
    pub signals: crate::domain::signals::SignalValues,
}

/// An author's standing as a snapshot carries it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StandingData {
    /// The account state.
    pub state: String,
    /// The strike score at the author's last recomputation.
    pub strikes: f64,
    /// Other items by this author created within the standing window.
    pub items: i64,
    /// Of those, the ones currently rejected.
    pub rejected_items: i64,
    /// When the author was first seen (0: unknown).
    pub first_seen: Millis,
}

/// The most items a snapshot's history figure counts (`author-stats`, the
/// standing's counts, `duplicate-count` in wit/rules.wit): a figure of
/// `HISTORY_CAP` means this many or more. Each figure is a read of at most
/// `HISTORY_CAP + 1` entries of one index however long the author's
/// history (`migrations/*/007x_author_figures_by_status.sql`), so a flood
/// from one author costs each of its evaluations no more than the first.
pub const HISTORY_CAP: i64 = 1_000;

/// A figure of the *other* items, out of `count` items read with `LIMIT
/// HISTORY_CAP + 1` that include the snapshot's own item when `own`: exact
/// below the cap, the cap at or above it.
pub fn others(count: i64, own: bool) -> i64 {
    (count - i64::from(own)).min(HISTORY_CAP)
}

/// The windows a snapshot counts in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotWindows {
    /// `author.recent-items` counts items created since.
    pub author_since: Millis,
    /// `duplicate-count` counts items created since.
    pub duplicate_since: Millis,
    /// The standing's `items` count items created since.
    pub standing_since: Millis,
}

/// A hand-off to a provider, stored with the transition that starts the wait.
#[derive(Debug, Clone, PartialEq)]
pub struct Handoff {
    pub provider: String,
    /// When the item goes to `held_for_review` if the provider never answers.
    pub deadline_at: Millis,
}

/// The idempotency key of a provider request: stable for one logical
/// operation (the item at the version its wait started, and the provider).
pub fn provider_request_key(item_id: &str, version: i64, provider: &str) -> String {
    format!("{item_id}:{version}:{provider}")
}

/// The result of an evaluation, to commit in one transaction.
#[derive(Debug, Clone)]
pub struct EvaluationCommit {
    pub item_id: String,
    /// The item version the snapshot was read at.
    pub snapshot_version: i64,
    /// `event_seq` the snapshot saw; a later event keeps the item scheduled.
    pub snapshot_event_seq: i64,
    /// `eval_round` the snapshot saw: the commit applies only if it is unchanged.
    pub snapshot_round: i64,
    pub from: ItemStatus,
    /// The status to move to, `None` to leave the status as it is.
    pub to: Option<ItemStatus>,
    pub decisions: Vec<NewDecision>,
    pub reason: String,
    pub correlation_id: String,
    pub now: Millis,
    /// With `to = awaiting_provider`: the request to store with the
    /// transition (it supersedes the item's outstanding one).
    pub handoff: Option<Handoff>,
}

/// What committing an evaluation did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitOutcome {
    /// Decisions recorded and the status changed to the new version.
    Transitioned { version: i64 },
    /// Decisions recorded; the status stays (same verdict, or a moderator
    /// decided: then the decisions are recorded with `applied = false`).
    Recorded,
    /// The item moved on since the snapshot: nothing written; evaluate again.
    Stale,
}

/// An evaluation that failed in the host past its retry budget.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct DeadLetter {
    pub id: i64,
    pub item_id: String,
    pub attempts: i64,
    pub last_error: String,
    pub failed_at: Millis,
    pub replayed_at: Option<Millis>,
}

/// Snapshots and fenced commits.
#[async_trait::async_trait]
pub trait Evaluations: Send + Sync {
    /// The snapshots of `ids` (unknown ids are left out), read together in
    /// one consistent view: a handful of queries for the whole batch.
    async fn snapshots(&self, ids: &[&str], windows: SnapshotWindows) -> StoreResult<Vec<SnapshotData>>;

    /// Commits each evaluation in one transaction, each fenced on its own
    /// (see the module doc). A stale commit is an outcome; any error rolls
    /// the whole batch back.
    async fn commit_evaluations(&self, batch: &[EvaluationCommit]) -> StoreResult<Vec<CommitOutcome>>;
}

/// The backlog the reconciler walks, and the dead letters of evaluations
/// that failed in the host.
#[async_trait::async_trait]
pub trait DeadLetters: Send + Sync {
    /// Items waiting for evaluation since before `before` (dead-lettered
    /// ones left out), as `(needs_eval_since, id)` in that order, after
    /// `after` in it: one keyset page of a pass over the whole backlog.
    async fn pending_evaluations(
        &self,
        before: Millis,
        after: Option<(Millis, &str)>,
        limit: i64,
    ) -> StoreResult<Vec<(Millis, String)>>;

    /// Records that evaluating `item_id` failed in the host `attempts` times;
    /// `false` if it already has an open dead letter. The item leaves the
    /// reconciler's view until the dead letter is replayed.
    async fn dead_letter(&self, item_id: &str, attempts: i64, last_error: &str, now: Millis) -> StoreResult<bool>;

    /// Dead letters, newest first; open ones only unless `all`.
    async fn dead_letters(&self, all: bool, limit: i64) -> StoreResult<Vec<DeadLetter>>;

    /// Marks a dead letter replayed (and its item pending) and returns the
    /// item, which the caller queues; `None` if unknown or already replayed.
    async fn replay_dead_letter(&self, id: i64, now: Millis) -> StoreResult<Option<String>>;
}

/// Splits a batch into rounds in which each item appears at most once (a
/// multi-row `UPDATE ... FROM` updates a row at most once), keeping order.
pub(super) fn rounds(items: &[&str]) -> Vec<Vec<usize>> {
    let mut rounds: Vec<Vec<usize>> = Vec::new();
    let mut seen: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for (i, item) in items.iter().enumerate() {
        let round = seen.entry(item).and_modify(|r| *r += 1).or_insert(0);
        if rounds.len() <= *round {
            rounds.push(Vec::new());
        }
        rounds[*round].push(i);
    }
    rounds
}

/// Instantiates [`Evaluations`] for PostgreSQL (SQLite's, read and
/// written on its own threads, is in `sqlite/evaluations.rs`). Every read
/// of a batch binds its rows as arrays (`= ANY($1)`, `unnest`): one text
/// per statement whatever the batch's length, so each connection prepares
/// and plans it once, in a transaction that keeps the planner to index
/// lookups (`PgStore::begin_batch_snapshot`), and no other code runs these
/// texts.
macro_rules! impl_evaluations {
    ($store:ty, $db:ty, $row:ty) => {
        const _: () = {
            use sqlx::Row as _;
            use std::collections::HashMap;
            use $crate::clock::Millis;
            use $crate::domain::policy::Cause;
            use $crate::domain::{Actor, ItemStatus, ProviderRequestStatus};
            use $crate::store::dialect::retry_conflicts;
            use $crate::store::evaluations::rounds;
            use $crate::store::rows;
            use $crate::store::shared::NewTransition;
            use $crate::store::*;

            type ByItem<T> = HashMap<String, T>;
            /// One author's figures: items in the author window, rejected,
            /// held, and their standing.
            #[derive(Clone, Default)]
            struct AuthorFigure {
                recent: i64,
                rejected: i64,
                held: i64,
                standing: StandingData,
            }
            type AuthorFigures = HashMap<(String, String), AuthorFigure>;

            /// The items of a batch (`txn::read_items` has a text per
            /// length, and serves reads outside this transaction).
            async fn read_items(tx: &mut txn::Tx<'_>, ids: &[&str]) -> StoreResult<Vec<Item>> {
                static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
                    format!("SELECT {} FROM items WHERE id = ANY($1)", $crate::store::shared::ITEM_COLUMNS)
                });
                sqlx::query(SQL.as_str())
                    .bind(ids)
                    .fetch_all(&mut **tx)
                    .await?
                    .iter()
                    .map(txn::item_from_row)
                    .collect()
            }

            async fn read_counters(tx: &mut txn::Tx<'_>, ids: &[&str]) -> StoreResult<ByItem<Vec<(String, i64)>>> {
                let mut counters: ByItem<Vec<(String, i64)>> = HashMap::new();
                let sql = "SELECT item_id, name, value FROM counters WHERE item_id = ANY($1) ORDER BY item_id, name";
                for r in sqlx::query(sql).bind(ids).fetch_all(&mut **tx).await? {
                    counters.entry(r.try_get("item_id")?).or_default().push((r.try_get("name")?, r.try_get("value")?));
                }
                Ok(counters)
            }

            /// The events since each item's last evaluation (the newest 64).
            async fn read_triggers(tx: &mut txn::Tx<'_>, ids: &[&str]) -> StoreResult<ByItem<Vec<(String, String, Millis)>>> {
                let sql = "SELECT item_id, kind, actor, created_at FROM (SELECT e.item_id, e.kind, e.actor, e.created_at, \
                     e.seq, ROW_NUMBER() OVER (PARTITION BY e.item_id ORDER BY e.seq DESC) AS r FROM events e \
                     JOIN items i ON i.id = e.item_id WHERE e.item_id = ANY($1) AND e.seq > i.evaluated_seq) t \
                     WHERE r <= 64 ORDER BY item_id, seq";
                let mut trigger: ByItem<Vec<(String, String, Millis)>> = HashMap::new();
                for r in sqlx::query(sql).bind(ids).fetch_all(&mut **tx).await? {
                    trigger.entry(r.try_get("item_id")?).or_default().push((
                        r.try_get("kind")?,
                        r.try_get("actor")?,
                        r.try_get("created_at")?,
                    ));
                }
                Ok(trigger)
            }

            /// For the items' current content: the providers' answers, and
            /// which provider an item still waits on.
            async fn read_provider_state(
                tx: &mut txn::Tx<'_>,
                ids: &[&str],
            ) -> StoreResult<(ByItem<Vec<ProviderAnswerRecord>>, ByItem<String>)> {
                let sql = "SELECT r.item_id, r.provider, r.status, r.answer_verdict, r.answer_score, r.answer_labels, \
                     r.answer_reason, r.answered_at FROM provider_requests r JOIN items i ON i.id = r.item_id \
                     AND r.content_version = i.content_version WHERE r.item_id = ANY($1) \
                     AND r.status IN ('answered', 'pending', 'sent') ORDER BY r.created_at";
                let mut answers: ByItem<Vec<ProviderAnswerRecord>> = HashMap::new();
                let mut waiting: ByItem<String> = HashMap::new();
                for r in sqlx::query(sql).bind(ids).fetch_all(&mut **tx).await? {
                    let item: String = r.try_get("item_id")?;
                    let status: ProviderRequestStatus = rows::parse(r.try_get::<&str, _>("status")?)?;
                    if status.is_active() {
                        waiting.insert(item, r.try_get("provider")?);
                    } else if let Some(verdict) = rows::parse_opt(r.try_get::<Option<&str>, _>("answer_verdict")?)? {
                        answers.entry(item).or_default().push(ProviderAnswerRecord {
                            provider: r.try_get("provider")?,
                            verdict,
                            score: r.try_get::<Option<f64>, _>("answer_score")?.unwrap_or(0.0),
                            labels: rows::labels(r.try_get::<Option<&str>, _>("answer_labels")?.unwrap_or("[]"))?,
                            reason: r.try_get::<Option<String>, _>("answer_reason")?.unwrap_or_default(),
                            answered_at: r.try_get::<Option<i64>, _>("answered_at")?.unwrap_or(0),
                        });
                    }
                }
                Ok((answers, waiting))
            }

            /// Per (client, author): items since `since`, rejected, held.
            async fn read_author_figures(tx: &mut txn::Tx<'_>, items: &[Item], w: SnapshotWindows) -> StoreResult<AuthorFigures> {
                let mut authors: Vec<(&str, &str)> = items.iter().map(|i| (i.client.as_str(), i.author.as_str())).collect();
                authors.sort_unstable();
                authors.dedup();
                // Each author's row is looked up per author (`LATERAL`;
                // `LIMIT 1` keeps the key lookup from being merged into a
                // join), and the figures come from three reads of at most
                // `HISTORY_CAP + 1` entries of one index each, as on SQLite
                // (`store/sqlite/evaluations.rs`, `snapshot`): index scans
                // whatever the statistics, as in `Submissions`' duplicate
                // check, bounded however long the author's history.
                static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
                    let limit = HISTORY_CAP + 1;
                    format!(
                        "SELECT v.client, v.author, w.recent, r.rejected, \
                         (SELECT COUNT(*) FROM (SELECT 1 FROM items i WHERE i.client = v.client \
                         AND i.author = v.author AND i.status = 'held_for_review' LIMIT {limit}) c) AS held, \
                         w.standing AS standing_items, r.standing AS standing_rejected, \
                         a.status, a.strikes, a.first_seen \
                         FROM unnest($1::text[], $2::text[]) AS v (client, author) \
                         LEFT JOIN LATERAL (SELECT a.status, a.strikes, a.first_seen FROM authors a \
                         WHERE a.client = v.client AND a.author = v.author LIMIT 1) a ON true \
                         CROSS JOIN LATERAL (SELECT \
                         COALESCE(SUM(CASE WHEN c.created_at >= $3 THEN 1 ELSE 0 END), 0) AS recent, \
                         COALESCE(SUM(CASE WHEN c.created_at >= $4 THEN 1 ELSE 0 END), 0) AS standing \
                         FROM (SELECT i.created_at FROM items i WHERE i.client = v.client AND i.author = v.author \
                         AND i.created_at >= LEAST($3::bigint, $4::bigint) \
                         ORDER BY i.created_at DESC LIMIT {limit}) c) w \
                         CROSS JOIN LATERAL (SELECT COUNT(*) AS rejected, \
                         COALESCE(SUM(CASE WHEN c.created_at >= $4 THEN 1 ELSE 0 END), 0) AS standing \
                         FROM (SELECT i.created_at FROM items i WHERE i.client = v.client AND i.author = v.author \
                         AND i.status = 'rejected' ORDER BY i.created_at DESC LIMIT {limit}) c) r"
                    )
                });
                let mut by_author = HashMap::new();
                let rows = sqlx::query(SQL.as_str())
                    .bind(authors.iter().map(|a| a.0).collect::<Vec<_>>())
                    .bind(authors.iter().map(|a| a.1).collect::<Vec<_>>())
                    .bind(w.author_since)
                    .bind(w.standing_since)
                    .fetch_all(&mut **tx)
                    .await?;
                for r in rows {
                    let standing = StandingData {
                        state: r.try_get::<Option<String>, _>("status")?.unwrap_or_default(),
                        strikes: r.try_get::<Option<f64>, _>("strikes")?.unwrap_or(0.0),
                        items: r.try_get("standing_items")?,
                        rejected_items: r.try_get("standing_rejected")?,
                        first_seen: r.try_get::<Option<i64>, _>("first_seen")?.unwrap_or(0),
                    };
                    by_author.insert(
                        (r.try_get("client")?, r.try_get("author")?),
                        AuthorFigure {
                            recent: r.try_get("recent")?,
                            rejected: r.try_get("rejected")?,
                            held: r.try_get("held")?,
                            standing,
                        },
                    );
                }
                Ok(by_author)
            }

            /// Per item: other items by its author with the same text since `since`.
            async fn read_duplicates(tx: &mut txn::Tx<'_>, items: &[Item], since: Millis) -> StoreResult<ByItem<i64>> {
                // A count per row, as in `Submissions`' duplicate check.
                static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
                    format!(
                        "SELECT v.id, (SELECT COUNT(*) FROM (SELECT 1 FROM items i WHERE i.client = v.client \
                         AND i.author = v.author AND i.fingerprint = v.fingerprint AND i.created_at >= $5 \
                         AND i.id <> v.id LIMIT {HISTORY_CAP}) c) \
                         FROM unnest($1::text[], $2::text[], $3::text[], $4::text[]) AS v (id, client, author, fingerprint)"
                    )
                });
                let column = |f: fn(&Item) -> &str| items.iter().map(f).collect::<Vec<_>>();
                let duplicates: HashMap<String, i64> = sqlx::query_as::<_, (String, i64)>(SQL.as_str())
                    .bind(column(|i| &i.id))
                    .bind(column(|i| &i.client))
                    .bind(column(|i| &i.author))
                    .bind(column(|i| &i.fingerprint))
                    .bind(since)
                    .fetch_all(&mut **tx)
                    .await?
                    .into_iter()
                    .collect();
                Ok(duplicates)
            }

            /// The snapshots of `ids`, read in the caller's (snapshot) transaction.
            async fn read_batch(tx: &mut txn::Tx<'_>, ids: &[&str], w: SnapshotWindows) -> StoreResult<Vec<SnapshotData>> {
                let items = read_items(tx, ids).await?;
                if items.is_empty() {
                    return Ok(Vec::new());
                }
                let ids: Vec<&str> = items.iter().map(|i| i.id.as_str()).collect();
                let mut counters = read_counters(tx, &ids).await?;
                let mut trigger = read_triggers(tx, &ids).await?;
                let (mut answers, mut waiting) = read_provider_state(tx, &ids).await?;
                let by_author = read_author_figures(tx, &items, w).await?;
                let duplicates = read_duplicates(tx, &items, w.duplicate_since).await?;
                Ok(items
                    .into_iter()
                    .map(|item| {
                        // The author's figures, without this item's own contribution.
                        let f = by_author
                            .get(&(item.client.clone(), item.author.clone()))
                            .cloned()
                            .unwrap_or_default();
                        let in_standing = item.created_at >= w.standing_since;
                        SnapshotData {
                            counters: counters.remove(&item.id).unwrap_or_default(),
                            author_recent_items: others(f.recent, item.created_at >= w.author_since),
                            author_rejected_items: others(f.rejected, item.status == ItemStatus::Rejected),
                            author_held_items: others(f.held, item.status == ItemStatus::HeldForReview),
                            standing: StandingData {
                                items: others(f.standing.items, in_standing),
                                rejected_items: others(
                                    f.standing.rejected_items,
                                    in_standing && item.status == ItemStatus::Rejected,
                                ),
                                ..f.standing
                            },
                            duplicate_count: duplicates.get(&item.id).copied().unwrap_or(0),
                            trigger: trigger.remove(&item.id).unwrap_or_default(),
                            provider_answers: answers.remove(&item.id).unwrap_or_default(),
                            waiting_on: waiting.remove(&item.id),
                            signals: Default::default(),
                            item,
                        }
                    })
                    .collect())
            }

            /// The fenced status changes of one round; returns item → new
            /// version. One statement over the rows bound as arrays (see
            /// `store/bulk.rs`).
            async fn fenced_transitions(tx: &mut txn::Tx<'_>, commits: &[&EvaluationCommit]) -> StoreResult<HashMap<String, i64>> {
                if commits.is_empty() {
                    return Ok(HashMap::new());
                }
                let rows = sqlx::query_as::<_, (String, i64)>(
                    "UPDATE items SET status = v.to_status, version = items.version + 1, decided_by = 'rules', \
                     updated_at = v.now, \
                     needs_eval_since = CASE WHEN items.event_seq = v.seq THEN NULL ELSE items.needs_eval_since END, \
                     evaluated_seq = v.seq, eval_round = items.eval_round + 1 \
                     FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::bigint[], $5::text[], $6::text[], \
                     $7::bigint[]) AS v (id, version, seq, round, from_status, to_status, now) \
                     WHERE items.id = v.id AND items.version = v.version \
                     AND items.status = v.from_status AND items.eval_round = v.round \
                     AND (items.decided_by IS NULL OR items.decided_by <> 'moderator') \
                     RETURNING items.id, items.version",
                )
                .bind(commits.iter().map(|c| c.item_id.as_str()).collect::<Vec<_>>())
                .bind(commits.iter().map(|c| c.snapshot_version).collect::<Vec<_>>())
                .bind(commits.iter().map(|c| c.snapshot_event_seq).collect::<Vec<_>>())
                .bind(commits.iter().map(|c| c.snapshot_round).collect::<Vec<_>>())
                .bind(commits.iter().map(|c| c.from.as_str()).collect::<Vec<_>>())
                .bind(commits.iter().map(|c| c.to.expect("a transition has a target").as_str()).collect::<Vec<_>>())
                .bind(commits.iter().map(|c| c.now).collect::<Vec<_>>())
                .fetch_all(&mut **tx)
                .await?;
                Ok(rows.into_iter().collect())
            }

            /// The fenced record-only commits of one round; returns the items that applied.
            async fn fenced_records(tx: &mut txn::Tx<'_>, commits: &[&EvaluationCommit]) -> StoreResult<Vec<String>> {
                if commits.is_empty() {
                    return Ok(Vec::new());
                }
                Ok(sqlx::query_scalar::<_, String>(
                    "UPDATE items SET \
                     needs_eval_since = CASE WHEN items.event_seq = v.seq THEN NULL ELSE items.needs_eval_since END, \
                     evaluated_seq = v.seq, eval_round = items.eval_round + 1 \
                     FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::bigint[]) AS v (id, version, seq, round) \
                     WHERE items.id = v.id AND items.version = v.version AND items.eval_round = v.round \
                     RETURNING items.id",
                )
                .bind(commits.iter().map(|c| c.item_id.as_str()).collect::<Vec<_>>())
                .bind(commits.iter().map(|c| c.snapshot_version).collect::<Vec<_>>())
                .bind(commits.iter().map(|c| c.snapshot_event_seq).collect::<Vec<_>>())
                .bind(commits.iter().map(|c| c.snapshot_round).collect::<Vec<_>>())
                .fetch_all(&mut **tx)
                .await?)
            }

            async fn commit_in(tx: &mut txn::Tx<'_>, batch: &[EvaluationCommit]) -> StoreResult<Vec<CommitOutcome>> {
                let mut outcomes = vec![CommitOutcome::Stale; batch.len()];
                let ids: Vec<&str> = batch.iter().map(|c| c.item_id.as_str()).collect();
                <$store>::lock_items(tx, &ids).await?;
                for round in rounds(&ids) {
                    let (moves, records): (Vec<usize>, Vec<usize>) =
                        round.into_iter().partition(|&i| batch[i].to.is_some());
                    let moved = fenced_transitions(tx, &moves.iter().map(|&i| &batch[i]).collect::<Vec<_>>()).await?;
                    let recorded = fenced_records(tx, &records.iter().map(|&i| &batch[i]).collect::<Vec<_>>()).await?;
                    let mut transitions = Vec::new();
                    for &i in &moves {
                        let c = &batch[i];
                        if let Some(&version) = moved.get(&c.item_id) {
                            outcomes[i] = CommitOutcome::Transitioned { version };
                            transitions.push(NewTransition {
                                item_id: &c.item_id,
                                from: c.from,
                                to: c.to.expect("a transition has a target"),
                                version,
                                cause: Cause::Evaluation,
                                actor: Actor::Rules,
                                actor_name: None,
                                actor_note: None,
                                reason: &c.reason,
                                correlation_id: &c.correlation_id,
                                now: c.now,
                                policy: None,
                                ends_at: None,
                            });
                        }
                    }
                    txn::insert_transitions(tx, &transitions).await?;
                    for &i in &moves {
                        let c = &batch[i];
                        if let CommitOutcome::Transitioned { version } = outcomes[i]
                            && (c.handoff.is_some() || c.from == ItemStatus::AwaitingProvider)
                        {
                            let handoff = c.handoff.as_ref().filter(|_| c.to == Some(ItemStatus::AwaitingProvider));
                            txn::settle_provider_requests(tx, &c.item_id, c.from, version, handoff, c.now).await?;
                        }
                    }
                    for &i in &records {
                        if recorded.contains(&batch[i].item_id) {
                            outcomes[i] = CommitOutcome::Recorded;
                        }
                    }
                }
                let decisions: Vec<(&str, i64, &NewDecision)> = batch
                    .iter()
                    .zip(&outcomes)
                    .filter(|(_, o)| **o != CommitOutcome::Stale)
                    .flat_map(|(c, _)| c.decisions.iter().map(move |d| (c.item_id.as_str(), c.snapshot_version, d)))
                    .collect();
                txn::insert_decisions(tx, &decisions).await?;
                Ok(outcomes)
            }

            #[async_trait::async_trait]
            impl Evaluations for $store {
                async fn snapshots(&self, ids: &[&str], windows: SnapshotWindows) -> StoreResult<Vec<SnapshotData>> {
                    let mut tx = self.begin_batch_snapshot().await?;
                    let mut out = Vec::with_capacity(ids.len());
                    for chunk in ids.chunks(256) {
                        out.extend(read_batch(&mut tx, chunk, windows).await?);
                    }
                    tx.commit().await?;
                    Ok(out)
                }

                async fn commit_evaluations(&self, batch: &[EvaluationCommit]) -> StoreResult<Vec<CommitOutcome>> {
                    retry_conflicts!(async {
                        let mut tx = self.begin_batch().await?;
                        let outcomes = commit_in(&mut tx, batch).await?;
                        tx.commit().await?;
                        Ok(outcomes)
                    })
                }

            }
        };
    };
}
pub(super) use impl_evaluations;

/// Instantiates [`DeadLetters`] for one backend.
macro_rules! impl_dead_letters {
    ($store:ty, $db:ty, $row:ty) => {
        const _: () = {
            use $crate::clock::Millis;
            use $crate::store::dialect::{Dialect, retry_conflicts};
            use $crate::store::*;

            #[async_trait::async_trait]
            impl DeadLetters for $store {
                async fn pending_evaluations(
                    &self,
                    before: Millis,
                    after: Option<(Millis, &str)>,
                    limit: i64,
                ) -> StoreResult<Vec<(Millis, String)>> {
                    let (since, id) = after.unwrap_or((Millis::MIN, ""));
                    Ok(sqlx::query_as(
                        "SELECT needs_eval_since, id FROM items WHERE needs_eval_since IS NOT NULL \
                         AND needs_eval_since <= $1 AND (needs_eval_since, id) > ($2, $3) \
                         AND NOT EXISTS (SELECT 1 FROM dead_letters d WHERE d.item_id = items.id \
                         AND d.replayed_at IS NULL) ORDER BY needs_eval_since, id LIMIT $4",
                    )
                    .bind(before)
                    .bind(since)
                    .bind(id)
                    .bind(limit)
                    .fetch_all(self.read_pool())
                    .await?)
                }

                async fn dead_letter(&self, item_id: &str, attempts: i64, last_error: &str, now: Millis) -> StoreResult<bool> {
                    retry_conflicts!(async {
                        let mut tx = self.begin_write().await?;
                        let n = sqlx::query(
                            "INSERT INTO dead_letters (item_id, attempts, last_error, failed_at) \
                             VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
                        )
                        .bind(item_id)
                        .bind(attempts)
                        .bind(last_error)
                        .bind(now)
                        .execute(&mut *tx)
                        .await?
                        .rows_affected();
                        tx.commit().await?;
                        Ok(n == 1)
                    })
                }

                async fn dead_letters(&self, all: bool, limit: i64) -> StoreResult<Vec<DeadLetter>> {
                    let filter = if all { "" } else { "WHERE replayed_at IS NULL " };
                    let rows = sqlx::query_as::<_, (i64, String, i64, String, i64, Option<i64>)>(&format!(
                        "SELECT id, item_id, attempts, last_error, failed_at, replayed_at FROM dead_letters \
                         {filter}ORDER BY id DESC LIMIT $1"
                    ))
                    .bind(limit)
                    .fetch_all(self.read_pool())
                    .await?;
                    Ok(rows
                        .into_iter()
                        .map(|(id, item_id, attempts, last_error, failed_at, replayed_at)| DeadLetter {
                            id,
                            item_id,
                            attempts,
                            last_error,
                            failed_at,
                            replayed_at,
                        })
                        .collect())
                }

                async fn replay_dead_letter(&self, id: i64, now: Millis) -> StoreResult<Option<String>> {
                    retry_conflicts!(async {
                        let mut tx = self.begin_write().await?;
                        let item: Option<String> = sqlx::query_scalar(
                            "UPDATE dead_letters SET replayed_at = $2 WHERE id = $1 AND replayed_at IS NULL RETURNING item_id",
                        )
                        .bind(id)
                        .bind(now)
                        .fetch_optional(&mut *tx)
                        .await?;
                        if let Some(item) = &item {
                            sqlx::query(
                                "UPDATE items SET needs_eval_since = COALESCE(needs_eval_since, $2) \
                                 WHERE id = $1 AND status <> 'deleted'",
                            )
                            .bind(item)
                            .bind(now)
                            .execute(&mut *tx)
                            .await?;
                        }
                        tx.commit().await?;
                        Ok(item)
                    })
                }
            }
        };
    };
}
pub(super) use impl_dead_letters;

#[cfg(test)]
mod tests {
    use super::rounds;

    #[test]
    fn rounds_hold_each_item_once_in_order() {
        assert_eq!(
            rounds(&["a", "b", "a", "c", "a"]),
            vec![vec![0, 1, 3], vec![2], vec![4]]
        );
        assert!(rounds(&[]).is_empty());
    }
}
