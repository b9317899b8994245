//! Items and their events: submissions (decided inside their transaction),
//! interaction events, reads, and manual (moderator, author) transitions.

use super::{KeyCompletion, ProviderCallbackRecord, ProviderRequestRecord, StoreError, StoreResult};
use crate::clock::{Millis, now_ms};
use crate::domain::policy::Cause;
use crate::domain::{Actor, DecisionPhase, EventKind, ItemStatus, Mode, Outcome, Verdict, can_transition};
use serde::Serialize;

/// An item as stored.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Item {
    pub id: String,
    /// Name of the client token that submitted it (scope of client reads).
    pub client: String,
    pub external_id: Option<String>,
    pub kind: String,
    pub author: String,
    pub body: String,
    /// The `context` object as submitted, JSON text.
    pub context: String,
    pub fingerprint: String,
    pub status: ItemStatus,
    /// Bumped by every status change; the fencing token of every commit.
    pub version: i64,
    pub decided_by: Option<Actor>,
    /// The verdict of the submission-time checks (sync-phase rules,
    /// duplicate text, the author's standing); later evaluations never
    /// settle below it.
    pub sync_verdict: Option<Verdict>,
    /// Set while the item waits for an evaluation; cleared by the commit of
    /// an evaluation that saw every event.
    pub needs_eval_since: Option<Millis>,
    /// Bumped by every event.
    pub event_seq: i64,
    /// `event_seq` of the newest committed evaluation: a commit from an
    /// older snapshot is refused.
    pub evaluated_seq: i64,
    /// Bumped by every `edit`: a provider's answer holds for one content version.
    pub content_version: i64,
    pub created_at: Millis,
    pub updated_at: Millis,
}

/// A new item, before the submission checks decide its status.
#[derive(Debug, Clone)]
pub struct NewItem {
    pub id: String,
    pub client: String,
    pub external_id: Option<String>,
    pub kind: String,
    pub author: String,
    pub body: String,
    pub context: String,
    pub fingerprint: String,
    pub correlation_id: String,
    pub now: Millis,
}

/// The duplicate-text check of a submission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DuplicateRule {
    /// Earlier items by the same author with the same normalised text count
    /// when created within this window.
    pub window_ms: i64,
    /// This many copies (including the new one) hold the item.
    pub hold_at: u32,
}

/// One submission to store: the item, what its sync-phase rules said, and
/// (for an idempotent request) the key to complete with the response.
/// Its status is decided inside the write transaction
/// ([`crate::domain::policy::submission`]), where the duplicate count and
/// the author's standing cannot change under it.
#[derive(Debug, Clone)]
pub struct ItemWrite {
    pub item: NewItem,
    /// The most severe verdict of the enforcing sync rules, and why.
    pub sync_verdict: Option<Verdict>,
    pub sync_reason: String,
    /// The sync rules' decision rows.
    pub decisions: Vec<NewDecision>,
    /// Evaluation lags far behind (degraded mode).
    pub degraded: bool,
    pub duplicates: DuplicateRule,
    pub key: Option<KeyCompletion>,
    /// The body of the stored response for `key`, built from the stored item.
    pub respond: fn(&Item) -> String,
}

/// What storing a submission did.
#[derive(Debug, Clone, PartialEq)]
pub enum CreateOutcome {
    /// Stored in `item.status`, for `cause`.
    Created { item: Item, cause: Cause },
    /// The client already has an item with this `external_id`: nothing was
    /// stored, and the key (if any) was released.
    DuplicateExternalId { existing_id: String },
    /// The request's idempotency key was taken over by a retry after its
    /// lock expired: this request's effect was not applied (the retry's is).
    KeyLost,
}

/// A decision row to insert.
#[derive(Debug, Clone, PartialEq)]
pub struct NewDecision {
    pub plugin: String,
    pub plugin_version: String,
    pub plugin_digest: String,
    pub phase: DecisionPhase,
    pub verdict: Option<Verdict>,
    pub score: f64,
    pub labels: Vec<String>,
    pub reason: String,
    pub mode: Mode,
    pub applied: bool,
    pub duration_us: i64,
    pub outcome: Outcome,
    pub error: Option<String>,
    /// When the rule decided (stored as the decision's `created_at`).
    pub decided_at: Millis,
    /// sha256 of the stored snapshot this decision judged, if kept.
    pub snapshot_digest: Option<String>,
}

/// A stored decision.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct DecisionRecord {
    pub id: i64,
    pub item_version: i64,
    pub plugin: String,
    pub plugin_version: String,
    /// sha256 of the component file, hex.
    pub plugin_digest: String,
    pub phase: DecisionPhase,
    pub verdict: Option<Verdict>,
    pub score: f64,
    pub labels: Vec<String>,
    pub reason: String,
    pub mode: Mode,
    /// Whether this decision counted towards the item's status.
    pub applied: bool,
    pub duration_us: i64,
    pub outcome: Outcome,
    pub error: Option<String>,
    pub created_at: Millis,
    /// When a moderator overturned the status this decision drove.
    pub reversed_at: Option<Millis>,
}

/// A stored transition: the audit trail.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct TransitionRecord {
    pub id: i64,
    pub item_id: String,
    pub from_status: ItemStatus,
    pub to_status: ItemStatus,
    /// The item's version after this transition.
    pub version: i64,
    pub cause: String,
    pub actor: Actor,
    /// Who decided: the moderator's token name, the provider's name.
    pub actor_name: Option<String>,
    /// A display note the moderator gave (never an identity).
    pub actor_note: Option<String>,
    pub reason: String,
    /// The request id (`X-Request-Id`) or evaluation id that caused it.
    pub correlation_id: String,
    pub created_at: Millis,
}

/// A stored interaction event.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct EventRecord {
    pub seq: i64,
    pub kind: EventKind,
    pub actor: String,
    pub created_at: Millis,
}

/// An item with everything `GET /v1/items/{id}` shows.
#[derive(Debug, Clone)]
pub struct ItemDetails {
    pub item: Item,
    pub counters: Vec<(String, i64)>,
    /// The latest events, newest last (at most [`DETAIL_EVENTS`]).
    pub events: Vec<EventRecord>,
    pub decisions: Vec<DecisionRecord>,
    pub transitions: Vec<TransitionRecord>,
    pub provider_requests: Vec<ProviderRequestRecord>,
    pub provider_callbacks: Vec<ProviderCallbackRecord>,
}

/// Events an item's details show.
pub const DETAIL_EVENTS: i64 = 200;

/// One interaction event to append.
#[derive(Debug, Clone)]
pub struct NewEvent {
    pub item_id: String,
    pub kind: EventKind,
    pub actor: String,
    /// New text, for `edit`.
    pub text: Option<String>,
    /// New fingerprint, for `edit`.
    pub fingerprint: Option<String>,
    pub now: Millis,
}

/// One event to store, with the key to complete for an idempotent request.
#[derive(Debug, Clone)]
pub struct EventWrite {
    pub event: NewEvent,
    pub key: Option<KeyCompletion>,
    /// The body of the stored response for `key`.
    pub respond: fn(&EventAppended) -> String,
}

/// An appended event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventAppended {
    pub item_id: String,
    /// The item's event sequence number after this event.
    pub event_seq: i64,
    /// Since when the item waits for an evaluation.
    pub needs_eval_since: Millis,
}

/// What appending an event did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventOutcome {
    Appended(EventAppended),
    NotFound,
    /// The item is deleted: no more events.
    Deleted,
    /// The key was taken over by a retry; nothing was applied.
    KeyLost,
}

/// A requested status change, applied only if the item is still at
/// `expected_version` in `from` (and, for automated actors, not decided by
/// a moderator).
#[derive(Debug, Clone)]
pub struct TransitionRequest {
    pub item_id: String,
    pub expected_version: i64,
    pub from: ItemStatus,
    pub to: ItemStatus,
    pub actor: Actor,
    /// Who: the moderator's token name.
    pub actor_name: Option<String>,
    /// A display note (the moderation body's `moderator` field).
    pub actor_note: Option<String>,
    pub cause: Cause,
    pub reason: String,
    pub correlation_id: String,
    pub now: Millis,
    /// Decisions this (manual) transition overturns; marked in the same transaction.
    pub reversed_decisions: Vec<i64>,
}

/// The result of a conditional write. Losing a race is a value, not an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// Applied; the item is now at `version`.
    Applied { version: i64 },
    /// The item changed since it was read (or a moderator decided): nothing written.
    Stale,
}

/// A position in the review queue: (updated_at, id) of the last item seen.
pub type ReviewCursor = (Millis, String);

/// Items and their events.
#[async_trait::async_trait]
pub trait Items: Send + Sync {
    /// Stores each submission in one transaction (group commit): its status
    /// decided there, its creation transition, its sync decisions, and the
    /// response of its key. A duplicate `external_id` or a lost key is an
    /// outcome; any error rolls the whole batch back.
    async fn create_items(&self, batch: &[ItemWrite]) -> StoreResult<Vec<CreateOutcome>>;

    async fn item(&self, id: &str) -> StoreResult<Option<Item>>;

    /// Items by id, in any order (unknown ids are left out).
    async fn items(&self, ids: &[&str]) -> StoreResult<Vec<Item>>;

    async fn item_details(&self, id: &str) -> StoreResult<Option<ItemDetails>>;

    /// Appends each event in one transaction: the event row, its counter,
    /// the item marked for evaluation, the response of its key.
    async fn append_events(&self, batch: &[EventWrite]) -> StoreResult<Vec<EventOutcome>>;

    /// A conditional status change with its audit row.
    async fn transition(&self, req: &TransitionRequest) -> StoreResult<Transition>;

    /// Held items, oldest first, after `cursor`.
    async fn review_queue(&self, after: Option<&ReviewCursor>, limit: i64) -> StoreResult<Vec<Item>>;

    /// The latest items of `author` (of `client`), newest first.
    async fn author_items(&self, client: &str, author: &str, limit: i64) -> StoreResult<Vec<Item>>;

    /// Marks an item for evaluation (a moderator's "re-evaluate now");
    /// `false` if it does not exist or is deleted.
    async fn request_evaluation(&self, id: &str, now: Millis) -> StoreResult<bool>;
}

/// The applied decisions whose verdict set the item's current (automated)
/// status, when a moderator moves it to `to`: the reversals that count
/// against those plugin versions.
pub fn overturned(details: &ItemDetails, to: ItemStatus) -> Vec<i64> {
    let item = &details.item;
    if to == item.status || item.decided_by == Some(Actor::Moderator) || to == ItemStatus::Deleted {
        return Vec::new();
    }
    let applied = details
        .decisions
        .iter()
        .filter(|d| d.applied && d.mode == Mode::Enforce);
    let Some(latest) = applied.clone().map(|d| d.item_version).max() else {
        return Vec::new();
    };
    applied
        .filter(|d| d.item_version == latest && d.verdict.map(ItemStatus::for_verdict) == Some(item.status))
        .map(|d| d.id)
        .collect()
}

/// Why a moderator's change was not applied.
#[derive(Debug, Clone, PartialEq)]
pub enum ModerationOutcome {
    /// Applied; `reversed` are the automated decisions it overturned.
    Applied {
        reversed: Vec<DecisionRecord>,
    },
    NotFound,
    /// `If-Match` named another version.
    VersionMismatch {
        current: i64,
    },
    /// The table forbids it (e.g. the item is deleted).
    Illegal {
        from: ItemStatus,
    },
}

/// A moderator's decision, as the API and the console make it.
#[derive(Debug, Clone)]
pub struct Moderation<'a> {
    pub id: &'a str,
    pub to: ItemStatus,
    /// The version the moderator looked at (`If-Match`).
    pub if_match: Option<i64>,
    /// The moderator's token name: the identity in the audit trail.
    pub moderator: &'a str,
    /// A display note from the request, kept beside the identity.
    pub note: Option<&'a str>,
    pub reason: &'a str,
    pub correlation_id: &'a str,
}

/// A moderator's decision. Reads the item, then applies a conditional
/// transition; a concurrent automated change makes it re-read and retry
/// (a manual decision wins), unless the caller pinned a version with
/// `If-Match`, which then answers `VersionMismatch`.
pub async fn moderate(store: &dyn Items, m: &Moderation<'_>) -> StoreResult<ModerationOutcome> {
    const ATTEMPTS: usize = 8;
    for _ in 0..ATTEMPTS {
        let Some(details) = store.item_details(m.id).await? else {
            return Ok(ModerationOutcome::NotFound);
        };
        let item = &details.item;
        if let Some(expected) = m.if_match
            && expected != item.version
        {
            return Ok(ModerationOutcome::VersionMismatch { current: item.version });
        }
        if !can_transition(item.status, m.to, Actor::Moderator) {
            return Ok(ModerationOutcome::Illegal { from: item.status });
        }
        let req = TransitionRequest {
            item_id: m.id.to_string(),
            expected_version: item.version,
            from: item.status,
            to: m.to,
            actor: Actor::Moderator,
            actor_name: Some(m.moderator.to_string()),
            actor_note: m.note.map(str::to_string),
            cause: Cause::Moderation,
            reason: m.reason.to_string(),
            correlation_id: m.correlation_id.to_string(),
            now: now_ms(),
            reversed_decisions: overturned(&details, m.to),
        };
        if let Transition::Applied { .. } = store.transition(&req).await? {
            let reversed = details
                .decisions
                .iter()
                .filter(|d| req.reversed_decisions.contains(&d.id))
                .cloned()
                .collect();
            return Ok(ModerationOutcome::Applied { reversed });
        }
        if m.if_match.is_some() {
            let current = store.item(m.id).await?.map_or(item.version, |i| i.version);
            return Ok(ModerationOutcome::VersionMismatch { current });
        }
    }
    Err(StoreError::Conflict(format!(
        "item {} kept changing; moderation not applied after {ATTEMPTS} attempts",
        m.id
    )))
}

/// Instantiates [`Items`] for one backend (see `sqlite.rs`).
macro_rules! impl_items {
    ($store:ty, $db:ty, $row:ty) => {
        const _: () = {
            use sqlx::Row as _;
            use std::collections::{HashMap, HashSet};
            use $crate::clock::Millis;
            use $crate::domain::policy::{Cause, SubmissionInputs, submission};
            use $crate::domain::{Actor, ItemStatus};
            use $crate::store::dialect::{Dialect, Statements, chunk_sizes, placeholders, retry_conflicts, values};
            use $crate::store::shared::NewTransition;
            use $crate::store::*;

            static STATEMENTS: Statements = Statements::new();

            /// Earlier items by the same author with the same text in the
            /// window, per write (`writes` indexes into `batch`).
            async fn duplicate_counts(
                tx: &mut txn::Tx<'_>,
                batch: &[ItemWrite],
                writes: &[usize],
            ) -> StoreResult<HashMap<usize, i64>> {
                let mut counts = HashMap::new();
                for chunk in writes.chunks(256) {
                    let sql = STATEMENTS.get("duplicates", chunk.len(), |n| {
                        format!(
                            "WITH v (n, client, author, fingerprint, since) AS (VALUES {}) \
                             SELECT v.n, COUNT(i.id) FROM v LEFT JOIN items i ON i.client = v.client \
                             AND i.author = v.author AND i.fingerprint = v.fingerprint AND i.created_at >= v.since \
                             GROUP BY v.n",
                            values(n, 5)
                        )
                    });
                    let mut q = sqlx::query_as::<_, (i64, i64)>(sql);
                    for &w in chunk {
                        let it = &batch[w].item;
                        q = q
                            .bind(w as i64)
                            .bind(&it.client)
                            .bind(&it.author)
                            .bind(&it.fingerprint)
                            .bind(it.now - batch[w].duplicates.window_ms);
                    }
                    for (n, count) in q.fetch_all(&mut **tx).await? {
                        counts.insert(n as usize, count);
                    }
                }
                Ok(counts)
            }

            /// Upserts the authors' rows (first and last seen), taking their row locks.
            async fn lock_authors(tx: &mut txn::Tx<'_>, authors: &[(&str, &str, Millis)]) -> StoreResult<()> {
                let mut rest = authors;
                for size in chunk_sizes(authors.len()) {
                    let (chunk, tail) = rest.split_at(size);
                    rest = tail;
                    let sql = STATEMENTS.get("authors", size, |n| {
                        format!(
                            "INSERT INTO authors (client, author, first_seen, last_seen) VALUES {} \
                             ON CONFLICT (client, author) DO UPDATE SET last_seen = excluded.last_seen",
                            $crate::store::dialect::values(n, 4)
                        )
                    });
                    let mut q = sqlx::query(sql);
                    for (client, author, now) in chunk {
                        q = q.bind(*client).bind(*author).bind(*now).bind(*now);
                    }
                    q.execute(&mut **tx).await?;
                }
                Ok(())
            }

            /// Items the clients already have under these external ids.
            async fn existing_external_ids(
                tx: &mut txn::Tx<'_>,
                pairs: &[(&str, &str)],
            ) -> StoreResult<HashMap<(String, String), String>> {
                let mut found = HashMap::new();
                for chunk in pairs.chunks(256) {
                    let sql = STATEMENTS.get("external_ids", chunk.len(), |n| {
                        format!(
                            "WITH v (client, external_id) AS (VALUES {}) SELECT i.client, i.external_id, i.id \
                             FROM items i JOIN v ON i.client = v.client AND i.external_id = v.external_id",
                            values(n, 2)
                        )
                    });
                    let mut q = sqlx::query_as::<_, (String, String, String)>(sql);
                    for (client, ext) in chunk {
                        q = q.bind(*client).bind(*ext);
                    }
                    for (client, ext, id) in q.fetch_all(&mut **tx).await? {
                        found.insert((client, ext), id);
                    }
                }
                Ok(found)
            }

            /// Inserts items; returns the ids actually inserted (a
            /// concurrent insert of the same external id makes one skip).
            async fn insert_items(tx: &mut txn::Tx<'_>, items: &[&Item]) -> StoreResult<HashSet<String>> {
                let mut inserted = HashSet::new();
                let mut rest = items;
                for size in chunk_sizes(items.len()) {
                    let (chunk, tail) = rest.split_at(size);
                    rest = tail;
                    let sql = STATEMENTS.get("insert_items", size, |n| {
                        format!(
                            "INSERT INTO items (id, client, external_id, kind, author, body, context, fingerprint, \
                             status, version, decided_by, sync_verdict, needs_eval_since, created_at, updated_at) \
                             VALUES {} ON CONFLICT (client, external_id) DO NOTHING RETURNING id",
                            values(n, 15)
                        )
                    });
                    let mut q = sqlx::query_scalar::<_, String>(sql);
                    for it in chunk {
                        q = q
                            .bind(&it.id)
                            .bind(&it.client)
                            .bind(it.external_id.as_deref())
                            .bind(&it.kind)
                            .bind(&it.author)
                            .bind(&it.body)
                            .bind(&it.context)
                            .bind(&it.fingerprint)
                            .bind(it.status.as_str())
                            .bind(it.version)
                            .bind(it.decided_by.map(|a| a.as_str()))
                            .bind(it.sync_verdict.map(|v| v.as_str()))
                            .bind(it.needs_eval_since)
                            .bind(it.created_at)
                            .bind(it.updated_at);
                    }
                    inserted.extend(q.fetch_all(&mut **tx).await?);
                }
                Ok(inserted)
            }

            /// Deletes the keys of requests that failed inside the
            /// transaction (a retry can go ahead at once).
            async fn release_keys(tx: &mut txn::Tx<'_>, keys: &[&KeyCompletion]) -> StoreResult<()> {
                for k in keys {
                    sqlx::query("DELETE FROM idempotency_keys WHERE scope = $1 AND key = $2 AND claim = $3")
                        .bind(&k.scope)
                        .bind(&k.key)
                        .bind(&k.token)
                        .execute(&mut **tx)
                        .await?;
                }
                Ok(())
            }

            async fn create_in(tx: &mut txn::Tx<'_>, batch: &[ItemWrite]) -> StoreResult<Vec<CreateOutcome>> {
                let claims: Vec<&KeyCompletion> = batch.iter().filter_map(|w| w.key.as_ref()).collect();
                let sealed = txn::seal_keys(tx, &claims).await?;
                let live = |w: &ItemWrite| {
                    w.key
                        .as_ref()
                        .is_none_or(|k| sealed.contains(&(k.scope.clone(), k.key.clone(), k.token.clone())))
                };
                let mut outcomes: Vec<Option<CreateOutcome>> = batch
                    .iter()
                    .map(|w| (!live(w)).then_some(CreateOutcome::KeyLost))
                    .collect();

                // External ids the client already has, or that an earlier
                // write of this batch takes.
                let pairs: Vec<(&str, &str)> = batch
                    .iter()
                    .zip(&outcomes)
                    .filter(|(_, o)| o.is_none())
                    .filter_map(|(w, _)| w.item.external_id.as_deref().map(|e| (w.item.client.as_str(), e)))
                    .collect();
                let mut taken = existing_external_ids(tx, &pairs).await?;
                let mut released = Vec::new();
                for (w, outcome) in batch.iter().zip(outcomes.iter_mut()) {
                    if outcome.is_some() {
                        continue;
                    }
                    if let Some(ext) = &w.item.external_id {
                        let pair = (w.item.client.clone(), ext.clone());
                        match taken.get(&pair) {
                            Some(existing) => {
                                *outcome = Some(CreateOutcome::DuplicateExternalId {
                                    existing_id: existing.clone(),
                                });
                                released.extend(w.key.as_ref());
                            }
                            None => {
                                taken.insert(pair, w.item.id.clone());
                            }
                        }
                    }
                }

                // Lock the authors' rows first (in one order, so batches never
                // deadlock): concurrent submissions by one author are decided
                // one after the other, each seeing the other's copies.
                let writes: Vec<usize> = (0..batch.len()).filter(|&i| outcomes[i].is_none()).collect();
                let mut authors: Vec<(&str, &str, Millis)> =
                    writes.iter().map(|&i| (batch[i].item.client.as_str(), batch[i].item.author.as_str(), batch[i].item.now)).collect();
                authors.sort_unstable();
                authors.dedup_by(|a, b| a.0 == b.0 && a.1 == b.1);
                lock_authors(tx, &authors).await?;
                let stored = duplicate_counts(tx, batch, &writes).await?;
                let mut in_batch: HashMap<(&str, &str, &str), i64> = HashMap::new();
                let mut created: Vec<(usize, Item, Cause, String)> = Vec::with_capacity(writes.len());
                for &i in &writes {
                    let w = &batch[i];
                    let it = &w.item;
                    let earlier = in_batch
                        .entry((it.client.as_str(), it.author.as_str(), it.fingerprint.as_str()))
                        .or_insert(0);
                    let decision = submission(&SubmissionInputs {
                        sync_verdict: w.sync_verdict,
                        sync_reason: w.sync_reason.clone(),
                        duplicates: stored.get(&i).copied().unwrap_or(0) + *earlier,
                        duplicate_hold_at: w.duplicates.hold_at,
                        degraded: w.degraded,
                        standing: None,
                    });
                    *earlier += 1;
                    let item = Item {
                        id: it.id.clone(),
                        client: it.client.clone(),
                        external_id: it.external_id.clone(),
                        kind: it.kind.clone(),
                        author: it.author.clone(),
                        body: it.body.clone(),
                        context: it.context.clone(),
                        fingerprint: it.fingerprint.clone(),
                        status: decision.status,
                        version: 1,
                        decided_by: (decision.status != ItemStatus::PendingScan).then_some(Actor::System),
                        sync_verdict: decision.sync_verdict,
                        needs_eval_since: decision.needs_eval.then_some(it.now),
                        event_seq: 0,
                        evaluated_seq: 0,
                        content_version: 1,
                        created_at: it.now,
                        updated_at: it.now,
                    };
                    created.push((i, item, decision.cause, decision.reason));
                }

                let rows: Vec<&Item> = created.iter().map(|(_, item, ..)| item).collect();
                let inserted = insert_items(tx, &rows).await?;
                // A concurrent transaction took an external id between our
                // look-up and our insert (PostgreSQL only): report it.
                for (i, item, ..) in created.iter().filter(|(_, item, ..)| !inserted.contains(&item.id)) {
                    let existing: Option<String> =
                        sqlx::query_scalar("SELECT id FROM items WHERE client = $1 AND external_id = $2")
                            .bind(&item.client)
                            .bind(item.external_id.as_deref())
                            .fetch_optional(&mut **tx)
                            .await?;
                    outcomes[*i] = Some(CreateOutcome::DuplicateExternalId {
                        existing_id: existing.unwrap_or_default(),
                    });
                    released.extend(batch[*i].key.as_ref());
                }
                created.retain(|(_, item, ..)| inserted.contains(&item.id));

                let transitions: Vec<NewTransition<'_>> = created
                    .iter()
                    .map(|(i, item, cause, reason)| NewTransition {
                        item_id: &item.id,
                        from: ItemStatus::Received,
                        to: item.status,
                        version: 1,
                        cause: *cause,
                        actor: Actor::System,
                        actor_name: None,
                        actor_note: None,
                        reason,
                        correlation_id: &batch[*i].item.correlation_id,
                        now: item.created_at,
                    })
                    .collect();
                txn::insert_transitions(tx, &transitions).await?;
                let decisions: Vec<(&str, i64, &NewDecision)> = created
                    .iter()
                    .flat_map(|(i, item, ..)| batch[*i].decisions.iter().map(move |d| (item.id.as_str(), 1, d)))
                    .collect();
                txn::insert_decisions(tx, &decisions).await?;
                let responses: Vec<(&str, &str, u16, String)> = created
                    .iter()
                    .filter_map(|(i, item, ..)| {
                        let w = &batch[*i];
                        w.key.as_ref().map(|k| (k.scope.as_str(), k.key.as_str(), k.status, (w.respond)(item)))
                    })
                    .collect();
                txn::store_responses(tx, &responses).await?;
                release_keys(tx, &released).await?;
                for (i, item, cause, _) in created {
                    outcomes[i] = Some(CreateOutcome::Created { item, cause });
                }
                Ok(outcomes.into_iter().map(|o| o.expect("every write has an outcome")).collect())
            }

            /// Bumps each item's event sequence once per event for it;
            /// returns item → (new sequence, needs_eval_since) for the
            /// items that are not deleted.
            async fn bump_items(
                tx: &mut txn::Tx<'_>,
                counts: &[(&str, i64, Millis)],
            ) -> StoreResult<HashMap<String, (i64, Millis)>> {
                let mut bumped = HashMap::new();
                let mut rest = counts;
                for size in chunk_sizes(counts.len()) {
                    let (chunk, tail) = rest.split_at(size);
                    rest = tail;
                    let sql = STATEMENTS.get("bump", size, |n| {
                        format!(
                            "WITH v (id, n, now) AS (VALUES {}) UPDATE items SET event_seq = items.event_seq + v.n, \
                             needs_eval_since = COALESCE(items.needs_eval_since, v.now) FROM v \
                             WHERE items.id = v.id AND items.status <> 'deleted' \
                             RETURNING items.id, items.event_seq, items.needs_eval_since",
                            values(n, 3)
                        )
                    });
                    let mut q = sqlx::query_as::<_, (String, i64, Option<i64>)>(sql);
                    for (id, n, now) in chunk {
                        q = q.bind(*id).bind(*n).bind(*now);
                    }
                    for (id, seq, since) in q.fetch_all(&mut **tx).await? {
                        bumped.insert(id, (seq, since.unwrap_or_default()));
                    }
                }
                Ok(bumped)
            }

            async fn append_in(tx: &mut txn::Tx<'_>, batch: &[EventWrite]) -> StoreResult<Vec<EventOutcome>> {
                let claims: Vec<&KeyCompletion> = batch.iter().filter_map(|w| w.key.as_ref()).collect();
                let sealed = txn::seal_keys(tx, &claims).await?;
                let live: Vec<bool> = batch
                    .iter()
                    .map(|w| {
                        w.key
                            .as_ref()
                            .is_none_or(|k| sealed.contains(&(k.scope.clone(), k.key.clone(), k.token.clone())))
                    })
                    .collect();
                // Events per item, in batch order.
                let mut per_item: Vec<(&str, i64, Millis)> = Vec::new();
                let mut index: HashMap<&str, usize> = HashMap::new();
                for (w, _) in batch.iter().zip(&live).filter(|(_, l)| **l) {
                    let e = &w.event;
                    match index.get(e.item_id.as_str()) {
                        Some(&at) => per_item[at].1 += 1,
                        None => {
                            index.insert(&e.item_id, per_item.len());
                            per_item.push((&e.item_id, 1, e.now));
                        }
                    }
                }
                let bumped = bump_items(tx, &per_item).await?;
                let missing: Vec<&str> =
                    per_item.iter().map(|(id, ..)| *id).filter(|id| !bumped.contains_key(*id)).collect();
                let deleted: HashSet<String> = txn::read_items(&mut **tx, &missing)
                    .await?
                    .into_iter()
                    .map(|i| i.id)
                    .collect();

                // Sequence numbers: an item bumped by n ends at S, so its
                // events in this batch are S-n+1 ..= S, in order.
                let mut next_seq: HashMap<&str, i64> = per_item
                    .iter()
                    .filter_map(|(id, n, _)| bumped.get(*id).map(|(s, _)| (*id, s - n + 1)))
                    .collect();
                let mut outcomes = Vec::with_capacity(batch.len());
                let mut events: Vec<(&NewEvent, i64)> = Vec::new();
                let mut released = Vec::new();
                for (w, live) in batch.iter().zip(&live) {
                    let e = &w.event;
                    if !live {
                        outcomes.push(EventOutcome::KeyLost);
                        continue;
                    }
                    let Some(seq) = next_seq.get_mut(e.item_id.as_str()) else {
                        released.extend(w.key.as_ref());
                        outcomes.push(if deleted.contains(&e.item_id) {
                            EventOutcome::Deleted
                        } else {
                            EventOutcome::NotFound
                        });
                        continue;
                    };
                    events.push((e, *seq));
                    outcomes.push(EventOutcome::Appended(EventAppended {
                        item_id: e.item_id.clone(),
                        event_seq: *seq,
                        needs_eval_since: bumped[&e.item_id].1,
                    }));
                    *seq += 1;
                }
                for (e, _) in events.iter().filter(|(e, _)| e.text.is_some()) {
                    // The content changed: a provider's answer no longer holds.
                    sqlx::query(
                        "UPDATE items SET body = $2, fingerprint = $3, content_version = content_version + 1 \
                         WHERE id = $1",
                    )
                    .bind(&e.item_id)
                    .bind(e.text.as_deref())
                    .bind(e.fingerprint.as_deref().unwrap_or_default())
                    .execute(&mut **tx)
                    .await?;
                }
                let mut rest = &events[..];
                for size in chunk_sizes(events.len()) {
                    let (chunk, tail) = rest.split_at(size);
                    rest = tail;
                    let sql = STATEMENTS.get("events", size, |n| {
                        format!(
                            "INSERT INTO events (item_id, seq, kind, actor, payload, created_at) VALUES {}",
                            values(n, 6)
                        )
                    });
                    let mut q = sqlx::query(sql);
                    for (e, seq) in chunk {
                        q = q
                            .bind(&e.item_id)
                            .bind(*seq)
                            .bind(e.kind.as_str())
                            .bind(&e.actor)
                            .bind(e.text.as_deref())
                            .bind(e.now);
                    }
                    q.execute(&mut **tx).await?;
                }
                // Counters, summed per (item, kind): one row each per statement.
                let mut sums: Vec<((&str, &str), i64)> = Vec::new();
                for (e, _) in &events {
                    let k = (e.item_id.as_str(), e.kind.as_str());
                    match sums.iter_mut().find(|(key, _)| *key == k) {
                        Some((_, n)) => *n += 1,
                        None => sums.push((k, 1)),
                    }
                }
                let mut rest = &sums[..];
                for size in chunk_sizes(sums.len()) {
                    let (chunk, tail) = rest.split_at(size);
                    rest = tail;
                    let sql = STATEMENTS.get("counters", size, |n| {
                        format!(
                            "INSERT INTO counters (item_id, name, value) VALUES {} ON CONFLICT (item_id, name) \
                             DO UPDATE SET value = counters.value + excluded.value",
                            values(n, 3)
                        )
                    });
                    let mut q = sqlx::query(sql);
                    for ((item, name), n) in chunk {
                        q = q.bind(*item).bind(*name).bind(*n);
                    }
                    q.execute(&mut **tx).await?;
                }
                let responses: Vec<(&str, &str, u16, String)> = batch
                    .iter()
                    .zip(&outcomes)
                    .filter_map(|(w, o)| match (o, &w.key) {
                        (EventOutcome::Appended(a), Some(k)) => {
                            Some((k.scope.as_str(), k.key.as_str(), k.status, (w.respond)(a)))
                        }
                        _ => None,
                    })
                    .collect();
                txn::store_responses(tx, &responses).await?;
                release_keys(tx, &released).await?;
                Ok(outcomes)
            }

            #[async_trait::async_trait]
            impl Items for $store {
                async fn create_items(&self, batch: &[ItemWrite]) -> StoreResult<Vec<CreateOutcome>> {
                    retry_conflicts!(async {
                        let mut tx = self.begin_write().await?;
                        let outcomes = create_in(&mut tx, batch).await?;
                        tx.commit().await?;
                        Ok(outcomes)
                    })
                }

                async fn item(&self, id: &str) -> StoreResult<Option<Item>> {
                    Ok(txn::read_items(self.read_pool(), &[id]).await?.pop())
                }

                async fn items(&self, ids: &[&str]) -> StoreResult<Vec<Item>> {
                    let mut out = Vec::with_capacity(ids.len());
                    for chunk in ids.chunks(500) {
                        out.extend(txn::read_items(self.read_pool(), chunk).await?);
                    }
                    Ok(out)
                }

                async fn item_details(&self, id: &str) -> StoreResult<Option<ItemDetails>> {
                    let mut tx = self.begin_snapshot().await?;
                    let Some(item) = txn::read_items(&mut *tx, &[id]).await?.pop() else {
                        return Ok(None);
                    };
                    let counters = sqlx::query_as::<_, (String, i64)>(
                        "SELECT name, value FROM counters WHERE item_id = $1 ORDER BY name",
                    )
                    .bind(id)
                    .fetch_all(&mut *tx)
                    .await?;
                    let mut events = sqlx::query(
                        "SELECT seq, kind, actor, created_at FROM events WHERE item_id = $1 ORDER BY seq DESC LIMIT $2",
                    )
                    .bind(id)
                    .bind(DETAIL_EVENTS)
                    .fetch_all(&mut *tx)
                    .await?
                    .iter()
                    .map(|r| {
                        Ok(EventRecord {
                            seq: r.try_get("seq")?,
                            kind: $crate::store::rows::parse(r.try_get::<&str, _>("kind")?)?,
                            actor: r.try_get("actor")?,
                            created_at: r.try_get("created_at")?,
                        })
                    })
                    .collect::<StoreResult<Vec<_>>>()?;
                    events.reverse();
                    let decisions = sqlx::query(&format!(
                        "SELECT {} FROM decisions WHERE item_id = $1 ORDER BY id",
                        txn::DECISIONS
                    ))
                    .bind(id)
                    .fetch_all(&mut *tx)
                    .await?
                    .iter()
                    .map(txn::decision_from_row)
                    .collect::<StoreResult<Vec<_>>>()?;
                    let transitions = sqlx::query(&format!(
                        "SELECT {} FROM transitions WHERE item_id = $1 ORDER BY id",
                        txn::TRANSITIONS
                    ))
                    .bind(id)
                    .fetch_all(&mut *tx)
                    .await?
                    .iter()
                    .map(txn::transition_from_row)
                    .collect::<StoreResult<Vec<_>>>()?;
                    let provider_requests = providers_of(&mut tx, id).await?;
                    let provider_callbacks = callbacks_of(&mut tx, id).await?;
                    tx.commit().await?;
                    Ok(Some(ItemDetails {
                        item,
                        counters,
                        events,
                        decisions,
                        transitions,
                        provider_requests,
                        provider_callbacks,
                    }))
                }

                async fn append_events(&self, batch: &[EventWrite]) -> StoreResult<Vec<EventOutcome>> {
                    retry_conflicts!(async {
                        let mut tx = self.begin_write().await?;
                        let outcomes = append_in(&mut tx, batch).await?;
                        tx.commit().await?;
                        Ok(outcomes)
                    })
                }

                async fn transition(&self, r: &TransitionRequest) -> StoreResult<Transition> {
                    retry_conflicts!(async {
                        let mut tx = self.begin_write().await?;
                        let sql = if r.actor.is_automated() {
                            "UPDATE items SET status = $1, version = version + 1, decided_by = $2, updated_at = $3 \
                             WHERE id = $4 AND version = $5 AND status = $6 \
                             AND (decided_by IS NULL OR decided_by <> 'moderator') RETURNING version"
                        } else {
                            "UPDATE items SET status = $1, version = version + 1, decided_by = $2, updated_at = $3 \
                             WHERE id = $4 AND version = $5 AND status = $6 RETURNING version"
                        };
                        let version: Option<i64> = sqlx::query_scalar(sql)
                            .bind(r.to.as_str())
                            .bind(r.actor.as_str())
                            .bind(r.now)
                            .bind(&r.item_id)
                            .bind(r.expected_version)
                            .bind(r.from.as_str())
                            .fetch_optional(&mut *tx)
                            .await?;
                        let Some(version) = version else {
                            tx.rollback().await?;
                            return Ok(Transition::Stale);
                        };
                        txn::insert_transitions(
                            &mut tx,
                            &[NewTransition {
                                item_id: &r.item_id,
                                from: r.from,
                                to: r.to,
                                version,
                                cause: r.cause,
                                actor: r.actor,
                                actor_name: r.actor_name.as_deref(),
                                actor_note: r.actor_note.as_deref(),
                                reason: &r.reason,
                                correlation_id: &r.correlation_id,
                                now: r.now,
                            }],
                        )
                        .await?;
                        if !r.reversed_decisions.is_empty() {
                            let sql = format!(
                                "UPDATE decisions SET reversed_at = $1 WHERE reversed_at IS NULL AND id IN ({})",
                                placeholders(2, r.reversed_decisions.len())
                            );
                            let mut q = sqlx::query(&sql).bind(r.now);
                            for id in &r.reversed_decisions {
                                q = q.bind(*id);
                            }
                            q.execute(&mut *tx).await?;
                        }
                        txn::settle_provider_requests(&mut tx, &r.item_id, r.from, version, None, r.now).await?;
                        tx.commit().await?;
                        Ok(Transition::Applied { version })
                    })
                }

                async fn review_queue(&self, after: Option<&ReviewCursor>, limit: i64) -> StoreResult<Vec<Item>> {
                    let columns = $crate::store::shared::ITEM_COLUMNS;
                    let rows = match after {
                        None => {
                            sqlx::query(&format!(
                                "SELECT {columns} FROM items WHERE status = 'held_for_review' \
                                 ORDER BY updated_at, id LIMIT $1"
                            ))
                            .bind(limit)
                            .fetch_all(self.read_pool())
                            .await?
                        }
                        Some((at, id)) => {
                            sqlx::query(&format!(
                                "SELECT {columns} FROM items WHERE status = 'held_for_review' \
                                 AND (updated_at > $1 OR (updated_at = $1 AND id > $2)) ORDER BY updated_at, id LIMIT $3"
                            ))
                            .bind(*at)
                            .bind(id)
                            .bind(limit)
                            .fetch_all(self.read_pool())
                            .await?
                        }
                    };
                    rows.iter().map(txn::item_from_row).collect()
                }

                async fn author_items(&self, client: &str, author: &str, limit: i64) -> StoreResult<Vec<Item>> {
                    sqlx::query(&format!(
                        "SELECT {} FROM items WHERE client = $1 AND author = $2 ORDER BY created_at DESC, id DESC LIMIT $3",
                        $crate::store::shared::ITEM_COLUMNS
                    ))
                    .bind(client)
                    .bind(author)
                    .bind(limit)
                    .fetch_all(self.read_pool())
                    .await?
                    .iter()
                    .map(txn::item_from_row)
                    .collect()
                }

                async fn request_evaluation(&self, id: &str, now: Millis) -> StoreResult<bool> {
                    retry_conflicts!(async {
                        let mut tx = self.begin_write().await?;
                        let n = sqlx::query(
                            "UPDATE items SET needs_eval_since = COALESCE(needs_eval_since, $2) \
                             WHERE id = $1 AND status <> 'deleted'",
                        )
                        .bind(id)
                        .bind(now)
                        .execute(&mut *tx)
                        .await?
                        .rows_affected();
                        tx.commit().await?;
                        Ok(n == 1)
                    })
                }
            }

            async fn providers_of(tx: &mut txn::Tx<'_>, id: &str) -> StoreResult<Vec<ProviderRequestRecord>> {
                sqlx::query(
                    "SELECT key, provider, item_version, status, attempts, deadline_at, superseded_by, last_error, \
                     created_at, updated_at, answer_verdict FROM provider_requests WHERE item_id = $1 \
                     ORDER BY created_at, key",
                )
                .bind(id)
                .fetch_all(&mut **tx)
                .await?
                .iter()
                .map(|r| {
                    Ok(ProviderRequestRecord {
                        key: r.try_get("key")?,
                        provider: r.try_get("provider")?,
                        item_version: r.try_get("item_version")?,
                        status: $crate::store::rows::parse(r.try_get::<&str, _>("status")?)?,
                        attempts: r.try_get::<i32, _>("attempts")?.into(),
                        deadline_at: r.try_get("deadline_at")?,
                        superseded_by: r.try_get("superseded_by")?,
                        last_error: r.try_get("last_error")?,
                        created_at: r.try_get("created_at")?,
                        updated_at: r.try_get("updated_at")?,
                        answer: $crate::store::rows::parse_opt(r.try_get::<Option<&str>, _>("answer_verdict")?)?,
                    })
                })
                .collect()
            }

            async fn callbacks_of(tx: &mut txn::Tx<'_>, id: &str) -> StoreResult<Vec<ProviderCallbackRecord>> {
                sqlx::query(
                    "SELECT id, provider, event_id, request_key, outcome, detail, received_at \
                     FROM provider_callbacks WHERE item_id = $1 ORDER BY id",
                )
                .bind(id)
                .fetch_all(&mut **tx)
                .await?
                .iter()
                .map(|r| {
                    Ok(ProviderCallbackRecord {
                        id: r.try_get("id")?,
                        provider: r.try_get("provider")?,
                        event_id: r.try_get("event_id")?,
                        request_key: r.try_get("request_key")?,
                        outcome: $crate::store::rows::parse(r.try_get::<&str, _>("outcome")?)?,
                        detail: r.try_get("detail")?,
                        received_at: r.try_get("received_at")?,
                    })
                })
                .collect()
            }
        };
    };
}
pub(super) use impl_items;
