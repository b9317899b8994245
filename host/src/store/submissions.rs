//! Submissions: each item's status is decided inside its write
//! transaction, where neither the author's duplicates nor their standing can
//! change under it; the item, its creation audit row (and outbox event), its
//! sync decisions and its idempotent response commit together. A batch
//! (group commit, `POST /v1/items/batch`) is one transaction with
//! multi-row statements, every write still decided and keyed on its own.

use super::{Item, KeyCompletion, NewDecision, StoreResult};
use crate::clock::Millis;
use crate::domain::policy::{Cause, SubmissionDecision};
use crate::domain::{Actor, ItemStatus, Verdict};

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

impl NewItem {
    /// The item as its submission stores it, in the status `decision` gave.
    pub fn stored(&self, decision: &SubmissionDecision) -> Item {
        Item {
            id: self.id.clone(),
            client: self.client.clone(),
            external_id: self.external_id.clone(),
            kind: self.kind.clone(),
            author: self.author.clone(),
            body: self.body.clone(),
            context: self.context.clone(),
            fingerprint: self.fingerprint.clone(),
            status: decision.status,
            version: 1,
            decided_by: (decision.status != ItemStatus::PendingScan).then_some(Actor::System),
            sync_verdict: decision.sync_verdict,
            needs_eval_since: decision.needs_eval.then_some(self.now),
            event_seq: 0,
            evaluated_seq: 0,
            eval_round: 0,
            content_version: 1,
            created_at: self.now,
            updated_at: self.now,
        }
    }
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
    /// What the author's account state does to the submission (the state
    /// is read under the author's row lock, in the write).
    pub standing: std::sync::Arc<crate::domain::standing::StandingPolicy>,
    pub key: Option<KeyCompletion>,
    /// The body of the stored response for `key`, built from the stored item.
    pub respond: fn(&Item) -> String,
}

/// What storing a submission did.
#[derive(Debug, Clone, PartialEq)]
// Nearly every answer is `Created`: boxing its item would add an allocation
// per submission to make the rare outcomes smaller.
#[allow(clippy::large_enum_variant)]
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

/// Storing submissions.
#[async_trait::async_trait]
pub trait Submissions: Send + Sync {
    /// Stores each submission in one transaction (group commit): its status
    /// decided there, its creation transition, its sync decisions, and the
    /// response of its key. A duplicate `external_id` or a lost key is an
    /// outcome; any error rolls the whole batch back.
    async fn create_items(&self, batch: &[ItemWrite]) -> StoreResult<Vec<CreateOutcome>>;
}

/// Instantiates [`Submissions`] for one backend.
macro_rules! impl_submissions {
    ($store:ty, $db:ty, $row:ty) => {
        const _: () = {
            use std::collections::{HashMap, HashSet};
            use $crate::clock::Millis;
            use $crate::domain::policy::{Cause, SubmissionInputs, submission};
            use $crate::domain::{Actor, ItemStatus};
            use $crate::store::dialect::retry_conflicts;
            use $crate::store::shared::NewTransition;
            use $crate::store::*;

            /// Earlier items by the same author with the same text in the
            /// window, per write (`writes` indexes into `batch`).
            async fn duplicate_counts(
                tx: &mut txn::Tx<'_>,
                batch: &[ItemWrite],
                writes: &[usize],
            ) -> StoreResult<HashMap<usize, i64>> {
                if writes.is_empty() {
                    return Ok(HashMap::new());
                }
                // A count per row (a correlated subquery), not a join: its
                // plan is an index scan whatever the statistics, so a plan
                // cached while `items` was small (a join that reads the
                // whole table) cannot outlive its growth. At most
                // `HISTORY_CAP` entries (`duplicate_hold_at` is at most
                // that): a flood of one text reads no more. The rows bound
                // as arrays: one text whatever the batch's length.
                static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
                    format!(
                        "SELECT v.n, (SELECT COUNT(*) FROM (SELECT 1 FROM items i WHERE i.client = v.client \
                         AND i.author = v.author AND i.fingerprint = v.fingerprint AND i.created_at >= v.since \
                         LIMIT {HISTORY_CAP}) c) \
                         FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::bigint[]) \
                         AS v (n, client, author, fingerprint, since)"
                    )
                });
                let column = |f: fn(&NewItem) -> &str| writes.iter().map(|&w| f(&batch[w].item)).collect::<Vec<_>>();
                let counts = sqlx::query_as::<_, (i64, i64)>(SQL.as_str())
                    .bind(writes.iter().map(|&w| w as i64).collect::<Vec<_>>())
                    .bind(column(|i| &i.client))
                    .bind(column(|i| &i.author))
                    .bind(column(|i| &i.fingerprint))
                    .bind(writes.iter().map(|&w| batch[w].item.now - batch[w].duplicates.window_ms).collect::<Vec<_>>())
                    .fetch_all(&mut **tx)
                    .await?
                    .into_iter()
                    .map(|(n, count)| (n as usize, count))
                    .collect();
                Ok(counts)
            }


            /// Upserts the authors' rows (first and last seen), taking their
            /// row locks in the order given; returns each author's account
            /// state. One statement over the rows bound as arrays (see
            /// `store/bulk.rs`).
            async fn lock_authors(
                tx: &mut txn::Tx<'_>,
                authors: &[(&str, &str, Millis)],
                initial: &str,
            ) -> StoreResult<HashMap<(String, String), String>> {
                if authors.is_empty() {
                    return Ok(HashMap::new());
                }
                let rows = sqlx::query_as::<_, (String, String, String)>(
                    "INSERT INTO authors (client, author, first_seen, last_seen, status) \
                     SELECT c, a, t, t, $4 FROM unnest($1::text[], $2::text[], $3::bigint[]) AS v (c, a, t) \
                     ON CONFLICT (client, author) DO UPDATE SET last_seen = excluded.last_seen \
                     RETURNING client, author, status",
                )
                .bind(authors.iter().map(|(client, ..)| *client).collect::<Vec<_>>())
                .bind(authors.iter().map(|(_, author, _)| *author).collect::<Vec<_>>())
                .bind(authors.iter().map(|(.., now)| *now).collect::<Vec<_>>())
                .bind(initial)
                .fetch_all(&mut **tx)
                .await?;
                Ok(rows.into_iter().map(|(client, author, status)| ((client, author), status)).collect())
            }


            /// Items the clients already have under these external ids.
            async fn existing_external_ids(
                tx: &mut txn::Tx<'_>,
                pairs: &[(&str, &str)],
            ) -> StoreResult<HashMap<(String, String), String>> {
                if pairs.is_empty() {
                    return Ok(HashMap::new());
                }
                let found = sqlx::query_as::<_, (String, String, String)>(
                    "SELECT i.client, i.external_id, i.id FROM unnest($1::text[], $2::text[]) AS v (client, external_id) \
                     JOIN items i ON i.client = v.client AND i.external_id = v.external_id",
                )
                .bind(pairs.iter().map(|(client, _)| *client).collect::<Vec<_>>())
                .bind(pairs.iter().map(|(_, ext)| *ext).collect::<Vec<_>>())
                .fetch_all(&mut **tx)
                .await?
                .into_iter()
                .map(|(client, ext, id)| ((client, ext), id))
                .collect();
                Ok(found)
            }


            /// Inserts items; returns the ids actually inserted (a
            /// concurrent insert of the same external id makes one skip).
            /// One statement over the rows bound as arrays.
            async fn insert_items(tx: &mut txn::Tx<'_>, items: &[&Item]) -> StoreResult<HashSet<String>> {
                if items.is_empty() {
                    return Ok(HashSet::new());
                }
                let column = |f: for<'r> fn(&'r Item) -> &'r str| items.iter().map(|i| f(i)).collect::<Vec<_>>();
                let inserted = sqlx::query_scalar::<_, String>(
                    "INSERT INTO items (id, client, external_id, kind, author, body, context, fingerprint, \
                     status, version, decided_by, sync_verdict, needs_eval_since, created_at, updated_at) \
                     SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], \
                     $7::text[], $8::text[], $9::text[], $10::bigint[], $11::text[], $12::text[], $13::bigint[], \
                     $14::bigint[], $15::bigint[]) ON CONFLICT (client, external_id) DO NOTHING RETURNING id",
                )
                .bind(column(|i| &i.id))
                .bind(column(|i| &i.client))
                .bind(items.iter().map(|i| i.external_id.as_deref()).collect::<Vec<_>>())
                .bind(column(|i| &i.kind))
                .bind(column(|i| &i.author))
                .bind(column(|i| &i.body))
                .bind(column(|i| &i.context))
                .bind(column(|i| &i.fingerprint))
                .bind(column(|i| i.status.as_str()))
                .bind(items.iter().map(|i| i.version).collect::<Vec<_>>())
                .bind(items.iter().map(|i| i.decided_by.map(|a| a.as_str())).collect::<Vec<_>>())
                .bind(items.iter().map(|i| i.sync_verdict.map(|v| v.as_str())).collect::<Vec<_>>())
                .bind(items.iter().map(|i| i.needs_eval_since).collect::<Vec<_>>())
                .bind(items.iter().map(|i| i.created_at).collect::<Vec<_>>())
                .bind(items.iter().map(|i| i.updated_at).collect::<Vec<_>>())
                .fetch_all(&mut **tx)
                .await?;
                Ok(inserted.into_iter().collect())
            }


            /// Settles what a write's key and external id say before any
            /// decision: a lost key, or an external id the client already
            /// has (in the store, or earlier in this batch).
            async fn refusals(
                tx: &mut txn::Tx<'_>,
                batch: &[ItemWrite],
            ) -> StoreResult<(Vec<Option<CreateOutcome>>, Vec<usize>)> {
                let claims: Vec<&KeyCompletion> = batch.iter().filter_map(|w| w.key.as_ref()).collect();
                let sealed = txn::seal_keys(tx, &claims).await?;
                let mut outcomes: Vec<Option<CreateOutcome>> = batch
                    .iter()
                    .map(|w| {
                        let lost = w
                            .key
                            .as_ref()
                            .is_some_and(|k| !sealed.contains(&(k.scope.clone(), k.key.clone(), k.token.clone())));
                        lost.then_some(CreateOutcome::KeyLost)
                    })
                    .collect();
                let pairs: Vec<(&str, &str)> = batch
                    .iter()
                    .zip(&outcomes)
                    .filter(|(_, o)| o.is_none())
                    .filter_map(|(w, _)| w.item.external_id.as_deref().map(|e| (w.item.client.as_str(), e)))
                    .collect();
                let mut taken = existing_external_ids(tx, &pairs).await?;
                let mut refused = Vec::new();
                for (i, (w, outcome)) in batch.iter().zip(outcomes.iter_mut()).enumerate() {
                    let Some(ext) = w.item.external_id.as_ref().filter(|_| outcome.is_none()) else {
                        continue;
                    };
                    let pair = (w.item.client.clone(), ext.clone());
                    match taken.get(&pair) {
                        Some(existing) => {
                            *outcome = Some(CreateOutcome::DuplicateExternalId {
                                existing_id: existing.clone(),
                            });
                            refused.push(i);
                        }
                        None => {
                            taken.insert(pair, w.item.id.clone());
                        }
                    }
                }
                Ok((outcomes, refused))
            }

            /// Decides each remaining write (`writes` index into `batch`),
            /// counting earlier copies of its text in the store and earlier
            /// in this batch, with its author's row locked.
            async fn decide(
                tx: &mut txn::Tx<'_>,
                batch: &[ItemWrite],
                writes: &[usize],
            ) -> StoreResult<Vec<(usize, Item, Cause, String)>> {
                // In one order, so concurrent batches never deadlock.
                let mut authors: Vec<(&str, &str, Millis)> = writes
                    .iter()
                    .map(|&i| (batch[i].item.client.as_str(), batch[i].item.author.as_str(), batch[i].item.now))
                    .collect();
                authors.sort_unstable();
                authors.dedup_by(|a, b| a.0 == b.0 && a.1 == b.1);
                // A new author starts in the first tier (one policy per process).
                let initial = writes.first().map_or("good", |&i| batch[i].standing.initial());
                let states = lock_authors(tx, &authors, initial).await?;
                let stored = duplicate_counts(tx, batch, writes).await?;
                let mut in_batch: HashMap<(&str, &str, &str), i64> = HashMap::new();
                let mut decided = Vec::with_capacity(writes.len());
                for &i in writes {
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
                        standing: states
                            .get(&(it.client.clone(), it.author.clone()))
                            .and_then(|state| w.standing.effect(state)),
                    });
                    *earlier += 1;
                    let item = it.stored(&decision);
                    decided.push((i, item, decision.cause, decision.reason));
                }
                Ok(decided)
            }

            /// The audit rows, decisions and stored responses of the created items.
            async fn record(tx: &mut txn::Tx<'_>, batch: &[ItemWrite], created: &[(usize, Item, Cause, String)]) -> StoreResult<()> {
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
                        policy: None,
                        ends_at: None,
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
                txn::store_responses(tx, &responses).await
            }

            async fn create_in(tx: &mut txn::Tx<'_>, batch: &[ItemWrite]) -> StoreResult<Vec<CreateOutcome>> {
                let (mut outcomes, mut released) = refusals(tx, batch).await?;
                let writes: Vec<usize> = (0..batch.len()).filter(|&i| outcomes[i].is_none()).collect();
                let mut created = decide(tx, batch, &writes).await?;
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
                    released.push(*i);
                }
                created.retain(|(_, item, ..)| inserted.contains(&item.id));
                record(tx, batch, &created).await?;
                let keys: Vec<&KeyCompletion> = released.iter().filter_map(|&i| batch[i].key.as_ref()).collect();
                txn::release_keys(tx, &keys).await?;
                for (i, item, cause, _) in created {
                    outcomes[i] = Some(CreateOutcome::Created { item, cause });
                }
                Ok(outcomes.into_iter().map(|o| o.expect("every write has an outcome")).collect())
            }

            #[async_trait::async_trait]
            impl Submissions for $store {
                async fn create_items(&self, batch: &[ItemWrite]) -> StoreResult<Vec<CreateOutcome>> {
                    retry_conflicts!(async {
                        let mut tx = self.begin_batch().await?;
                        let outcomes = create_in(&mut tx, batch).await?;
                        tx.commit().await?;
                        Ok(outcomes)
                    })
                }
            }
        };
    };
}
pub(super) use impl_submissions;
