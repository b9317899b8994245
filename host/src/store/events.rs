//! Interaction events, the high-volume input: each event row, its counter
//! and its item's evaluation mark commit together, with the idempotent
//! response of its key. A batch is one transaction with multi-row
//! statements; every event keeps its own sequence number and outcome.

use super::{KeyCompletion, StoreResult};
use crate::clock::Millis;
use crate::domain::EventKind;

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
    /// Only an item of this client takes the event (a client token's own
    /// items); `None`: any item (a moderator). Another client's item is
    /// [`EventOutcome::NotFound`], decided in the write itself.
    pub owner: Option<String>,
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

/// Appending events.
#[async_trait::async_trait]
pub trait Events: Send + Sync {
    /// Appends each event in one transaction: the event row, its counter,
    /// the item marked for evaluation, the response of its key. An item
    /// that is not the event's `owner`'s is not found.
    async fn append_events(&self, batch: &[EventWrite]) -> StoreResult<Vec<EventOutcome>>;
}

/// Instantiates [`Events`] for one backend.
macro_rules! impl_events {
    ($store:ty, $db:ty, $row:ty) => {
        const _: () = {
            use std::collections::{HashMap, HashSet};
            use $crate::clock::Millis;
            use $crate::store::dialect::{Statements, chunk_sizes, retry_conflicts, values};
            use $crate::store::*;

            static STATEMENTS: Statements =
                Statements::new(<$store as $crate::store::dialect::Dialect>::ANONYMOUS_PARAMETERS);

            /// Bumps each item's event sequence once per event for it;
            /// returns item → (new sequence, needs_eval_since) for the
            /// items that are not deleted.
            async fn bump_items(
                tx: &mut txn::Tx<'_>,
                counts: &[(&str, i64, Millis, Option<&str>)],
            ) -> StoreResult<HashMap<String, (i64, Millis)>> {
                let mut bumped = HashMap::new();
                let mut rest = counts;
                for size in chunk_sizes(counts.len()) {
                    let (chunk, tail) = rest.split_at(size);
                    rest = tail;
                    let sql = STATEMENTS.get("bump", size, |n| {
                        format!(
                            "WITH v (id, n, now, owner) AS (VALUES {}) UPDATE items SET event_seq = items.event_seq + v.n, \
                             needs_eval_since = COALESCE(items.needs_eval_since, v.now) FROM v \
                             WHERE items.id = v.id AND items.status <> 'deleted' \
                             AND (v.owner IS NULL OR items.client = v.owner) \
                             RETURNING items.id, items.event_seq, items.needs_eval_since",
                            values(n, 4)
                        )
                    });
                    let mut q = sqlx::query_as::<_, (String, i64, Option<i64>)>(sql);
                    for (id, n, now, owner) in chunk {
                        q = q.bind(*id).bind(*n).bind(*now).bind(*owner);
                    }
                    for (id, seq, since) in q.fetch_all(&mut **tx).await? {
                        bumped.insert(id, (seq, since.unwrap_or_default()));
                    }
                }
                Ok(bumped)
            }

            /// Which writes still hold their key (a write without a key always does).
            async fn live_writes(tx: &mut txn::Tx<'_>, batch: &[EventWrite]) -> StoreResult<Vec<bool>> {
                let claims: Vec<&KeyCompletion> = batch.iter().filter_map(|w| w.key.as_ref()).collect();
                let sealed = txn::seal_keys(tx, &claims).await?;
                Ok(batch
                    .iter()
                    .map(|w| {
                        w.key
                            .as_ref()
                            .is_none_or(|k| sealed.contains(&(k.scope.clone(), k.key.clone(), k.token.clone())))
                    })
                    .collect())
            }

            /// Numbers the live events: bumps each item's sequence once per
            /// event for it, and gives each event its number, in batch
            /// order (an item bumped by n to S numbers them S-n+1 ..= S).
            /// Returns each write's outcome and the events to insert.
            async fn sequence<'b>(
                tx: &mut txn::Tx<'_>,
                batch: &'b [EventWrite],
                live: &[bool],
            ) -> StoreResult<(Vec<EventOutcome>, Vec<(&'b NewEvent, i64)>)> {
                let mut per_item: Vec<(&str, i64, Millis, Option<&str>)> = Vec::new();
                let mut index: HashMap<&str, usize> = HashMap::new();
                for (w, _) in batch.iter().zip(live).filter(|(_, l)| **l) {
                    let e = &w.event;
                    match index.get(e.item_id.as_str()) {
                        Some(&at) => per_item[at].1 += 1,
                        None => {
                            index.insert(&e.item_id, per_item.len());
                            per_item.push((&e.item_id, 1, e.now, e.owner.as_deref()));
                        }
                    }
                }
                // One lock order for every transaction (see `PgStore::lock_items`).
                per_item.sort_unstable_by(|a, b| a.0.cmp(b.0));
                let ids: Vec<&str> = per_item.iter().map(|(id, ..)| *id).collect();
                <$store>::lock_items(tx, &ids).await?;
                let bumped = bump_items(tx, &per_item).await?;
                let missing: Vec<&str> = per_item
                    .iter()
                    .map(|(id, ..)| *id)
                    .filter(|id| !bumped.contains_key(*id))
                    .collect();
                // Missing from the bump: deleted, or not there for this owner.
                let owners: HashMap<&str, Option<&str>> = per_item.iter().map(|(id, _, _, o)| (*id, *o)).collect();
                let deleted: HashSet<String> = txn::read_items(&mut **tx, &missing)
                    .await?
                    .into_iter()
                    .filter(|i| owners.get(i.id.as_str()).copied().flatten().is_none_or(|o| o == i.client))
                    .map(|i| i.id)
                    .collect();
                let mut next_seq: HashMap<&str, i64> = per_item
                    .iter()
                    .filter_map(|(id, n, ..)| bumped.get(*id).map(|(s, _)| (*id, s - n + 1)))
                    .collect();
                let mut outcomes = Vec::with_capacity(batch.len());
                let mut events = Vec::with_capacity(batch.len());
                for (w, live) in batch.iter().zip(live) {
                    let e = &w.event;
                    let outcome = match next_seq.get_mut(e.item_id.as_str()) {
                        _ if !live => EventOutcome::KeyLost,
                        None if deleted.contains(&e.item_id) => EventOutcome::Deleted,
                        None => EventOutcome::NotFound,
                        Some(seq) => {
                            events.push((e, *seq));
                            *seq += 1;
                            EventOutcome::Appended(EventAppended {
                                item_id: e.item_id.clone(),
                                event_seq: *seq - 1,
                                needs_eval_since: bumped[&e.item_id].1,
                            })
                        }
                    };
                    outcomes.push(outcome);
                }
                Ok((outcomes, events))
            }

            /// Applies edits: the content changed, so a provider's answer no longer holds.
            async fn apply_edits(tx: &mut txn::Tx<'_>, events: &[(&NewEvent, i64)]) -> StoreResult<()> {
                for (e, _) in events.iter().filter(|(e, _)| e.text.is_some()) {
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
                Ok(())
            }

            async fn insert_events(tx: &mut txn::Tx<'_>, events: &[(&NewEvent, i64)]) -> StoreResult<()> {
                let mut rest = events;
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
                Ok(())
            }

            async fn append_in(tx: &mut txn::Tx<'_>, batch: &[EventWrite]) -> StoreResult<Vec<EventOutcome>> {
                let live = live_writes(tx, batch).await?;
                let (outcomes, events) = sequence(tx, batch, &live).await?;
                apply_edits(tx, &events).await?;
                // Which counts them too (the `events_counted` trigger,
                // migrations/postgres/0014_counters_from_events.sql).
                insert_events(tx, &events).await?;
                let mut responses: Vec<(&str, &str, u16, String)> = Vec::new();
                let mut released = Vec::new();
                for (w, o) in batch.iter().zip(&outcomes) {
                    match (o, &w.key) {
                        (EventOutcome::Appended(a), Some(k)) => {
                            responses.push((k.scope.as_str(), k.key.as_str(), k.status, (w.respond)(a)))
                        }
                        (EventOutcome::NotFound | EventOutcome::Deleted, Some(k)) => released.push(k),
                        _ => {}
                    }
                }
                txn::store_responses(tx, &responses).await?;
                txn::release_keys(tx, &released).await?;
                Ok(outcomes)
            }

            #[async_trait::async_trait]
            impl Events for $store {
                async fn append_events(&self, batch: &[EventWrite]) -> StoreResult<Vec<EventOutcome>> {
                    retry_conflicts!(async {
                        let mut tx = self.begin_batch().await?;
                        let outcomes = append_in(&mut tx, batch).await?;
                        tx.commit().await?;
                        Ok(outcomes)
                    })
                }
            }
        };
    };
}
pub(super) use impl_events;
