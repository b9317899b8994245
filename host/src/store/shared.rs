//! Transaction helpers every capability uses, instantiated per backend:
//! audit rows, decision rows, idempotency key completion, provider
//! requests settled by a transition, and the row decoders. Each writes many
//! rows with one statement per batch or per chunk (`store/bulk.rs`).

use crate::clock::Millis;
use crate::domain::policy::Cause;
use crate::domain::{Actor, ItemStatus};
use crate::store::NewDecision;

/// An audit row to insert, with its outbox row (see `store/bulk.rs`).
#[derive(Debug, Clone)]
pub(super) struct NewTransition<'a> {
    pub item_id: &'a str,
    pub from: ItemStatus,
    pub to: ItemStatus,
    pub version: i64,
    pub cause: Cause,
    pub actor: Actor,
    pub actor_name: Option<&'a str>,
    pub actor_note: Option<&'a str>,
    pub reason: &'a str,
    pub correlation_id: &'a str,
    pub now: Millis,
    /// The policy a moderator named (`None` for automation).
    pub policy: Option<&'a str>,
    /// When a moderator's restriction ends, if it does.
    pub ends_at: Option<Millis>,
}

/// A decision row to insert, its code and snapshot references resolved.
pub(super) struct DecisionRow<'a> {
    pub item_id: &'a str,
    pub item_version: i64,
    pub decision: &'a NewDecision,
    pub plugin_ref: i64,
    pub snapshot_id: Option<i64>,
}

pub(super) const ITEM_COLUMNS: &str = "id, client, external_id, kind, author, body, context, fingerprint, status, \
     version, decided_by, sync_verdict, needs_eval_since, event_seq, evaluated_seq, eval_round, content_version, created_at, \
     updated_at";

/// A decision's columns, over [`DECISIONS_FROM`].
pub(super) const DECISION_COLUMNS: &str = "d.id, d.item_id, d.item_version, d.plugin, p.version AS plugin_version, \
     p.digest AS plugin_digest, d.phase, d.verdict, d.score, d.labels, d.reason, d.mode, d.applied, d.duration_us, \
     d.outcome, d.error, d.created_at, d.reversed_at, d.snapshot_digest, d.snapshot_id, d.config_digest, d.lists";

/// Decisions with the code that made them (`d`, `p`).
pub(super) const DECISIONS_FROM: &str = "decisions d JOIN plugin_refs p ON p.id = d.plugin_ref";

pub(super) const TRANSITION_COLUMNS: &str = "id, item_id, from_status, to_status, version, cause, actor, actor_name, \
     actor_note, reason, correlation_id, created_at, policy, ends_at";

/// Instantiates the helpers as `mod txn` for one backend. `$store`
/// implements `Dialect`; `$db` and `$row` are its sqlx types.
macro_rules! impl_shared {
    ($store:ty, $db:ty, $row:ty) => {
        mod txn {
            #![allow(dead_code)]
            use super::*;
            use sqlx::Row as _;
            use $crate::clock::Millis;
            use $crate::domain::ItemStatus;
            use $crate::store::dialect::{Statements, chunk_sizes, values};
            use $crate::store::rows;
            use $crate::store::shared::{DECISION_COLUMNS, DECISIONS_FROM, DecisionRow, ITEM_COLUMNS, NewTransition, TRANSITION_COLUMNS};
            use $crate::store::*;

            pub(crate) type Tx<'a> = $crate::store::dialect::Tx<'a, $db>;

            static STATEMENTS: Statements = Statements::new(<$store as $crate::store::dialect::Dialect>::ANONYMOUS_PARAMETERS);

            /// Inserts audit rows, each with its outbox event.
            pub(crate) async fn insert_transitions(tx: &mut Tx<'_>, rows: &[NewTransition<'_>]) -> StoreResult<()> {
                <$store as $crate::store::bulk::BulkInsert>::insert_transitions(tx, rows).await
            }

            /// Inserts decision rows `(item, item version, decision)`, with
            /// the code and documents they name.
            pub(crate) async fn insert_decisions(
                tx: &mut Tx<'_>,
                rows: &[(&str, i64, &NewDecision)],
            ) -> StoreResult<()> {
                let refs = plugin_refs(tx, rows.iter().map(|(_, _, d)| *d)).await?;
                let now = rows.iter().map(|(_, _, d)| d.decided_at).max().unwrap_or(0);
                let docs = rows.iter().filter_map(|(_, _, d)| d.inputs.as_ref());
                let snapshot_ids = insert_input_docs(tx, docs, now).await?;
                let mut decisions = Vec::with_capacity(rows.len());
                for (item, version, d) in rows {
                    let code = (d.plugin_digest.as_str(), d.plugin.as_str(), d.plugin_version.as_str());
                    let plugin_ref = refs
                        .get(&code)
                        .copied()
                        .ok_or_else(|| StoreError::Database(format!("no plugin_refs row for {code:?}")))?;
                    decisions.push(DecisionRow {
                        item_id: item,
                        item_version: *version,
                        decision: d,
                        plugin_ref,
                        snapshot_id: d.inputs.as_ref().and_then(|i| snapshot_ids.get(i.snapshot.digest.as_str()).copied()),
                    });
                }
                <$store as $crate::store::bulk::BulkInsert>::insert_decisions(tx, &decisions).await?;
                let mut striking: Vec<&str> = rows
                    .iter()
                    .filter(|(_, _, d)| d.weighs)
                    .map(|(item, ..)| *item)
                    .collect();
                striking.sort_unstable();
                striking.dedup();
                mark_authors(tx, &striking, now).await
            }

            /// The `plugin_refs` ids of the decisions' code, each
            /// (digest, name, version) stored once: one insert that leaves
            /// the rows already there as they are, and one read, for the batch.
            pub(crate) async fn plugin_refs<'d>(
                tx: &mut Tx<'_>,
                decisions: impl Iterator<Item = &'d NewDecision>,
            ) -> StoreResult<std::collections::HashMap<(&'d str, &'d str, &'d str), i64>> {
                let mut codes: Vec<(&str, &str, &str)> = decisions
                    .map(|d| (d.plugin_digest.as_str(), d.plugin.as_str(), d.plugin_version.as_str()))
                    .collect();
                codes.sort_unstable();
                codes.dedup();
                let mut ids = std::collections::HashMap::with_capacity(codes.len());
                for chunk in codes.chunks(256) {
                    let insert = STATEMENTS.get("plugin_refs", chunk.len(), |n| {
                        format!(
                            "INSERT INTO plugin_refs (digest, name, version) VALUES {} \
                             ON CONFLICT (digest, name, version) DO NOTHING",
                            values(n, 3)
                        )
                    });
                    let read = STATEMENTS.get("plugin_ref_ids", chunk.len(), |n| {
                        format!(
                            "WITH v (digest, name, version) AS (VALUES {}) \
                             SELECT p.id, p.digest, p.name, p.version FROM plugin_refs p \
                             JOIN v ON p.digest = v.digest AND p.name = v.name AND p.version = v.version",
                            values(n, 3)
                        )
                    });
                    let bind = |sql| {
                        chunk
                            .iter()
                            .fold(sqlx::query(sql), |q, (digest, name, version)| q.bind(*digest).bind(*name).bind(*version))
                    };
                    bind(insert).execute(&mut **tx).await?;
                    for r in bind(read).fetch_all(&mut **tx).await? {
                        let (digest, name, version): (&str, &str, &str) =
                            (r.try_get("digest")?, r.try_get("name")?, r.try_get("version")?);
                        if let Some(code) = chunk.iter().find(|c| **c == (digest, name, version)) {
                            ids.insert(*code, r.try_get("id")?);
                        }
                    }
                }
                Ok(ids)
            }

            /// Marks the authors of these items due for recomputation at
            /// `now` (unless due sooner already): called in the transaction
            /// that records a decision that may count, or reverses one, so
            /// no change to an author's strikes can go unrecomputed, even if
            /// the process dies before it queues the author. The authors'
            /// rows are locked in one order across the whole batch
            /// (PostgreSQL), as submissions lock them, so concurrent writers
            /// queue instead of deadlocking.
            pub(crate) async fn mark_authors(tx: &mut Tx<'_>, item_ids: &[&str], now: Millis) -> StoreResult<()> {
                let mut authors = std::collections::BTreeSet::new();
                let mut rest = item_ids;
                for size in chunk_sizes(item_ids.len()) {
                    let (chunk, tail) = rest.split_at(size);
                    rest = tail;
                    let sql = STATEMENTS.get("authors_of_items", size, |n| {
                        format!(
                            "SELECT DISTINCT client, author FROM items WHERE id IN ({})",
                            $crate::store::dialect::placeholders(1, n)
                        )
                    });
                    let mut q = sqlx::query_as::<_, (String, String)>(sql);
                    for id in chunk {
                        q = q.bind(*id);
                    }
                    authors.extend(q.fetch_all(&mut **tx).await?);
                }
                let authors: Vec<(String, String)> = authors.into_iter().collect();
                let for_update = <$store as $crate::store::dialect::Dialect>::FOR_UPDATE;
                let bytes = <$store as $crate::store::dialect::Dialect>::BYTE_ORDER;
                let mut rest = authors.as_slice();
                for size in chunk_sizes(authors.len()) {
                    let (chunk, tail) = rest.split_at(size);
                    rest = tail;
                    let sql = STATEMENTS.get("mark_authors", size, |n| {
                        let pairs: Vec<String> = (0..n).map(|k| format!("(${}, ${})", 2 + 2 * k, 3 + 2 * k)).collect();
                        format!(
                            "UPDATE authors SET recheck_at = $1 WHERE (recheck_at IS NULL OR recheck_at > $1) \
                             AND (client, author) IN (SELECT client, author FROM authors \
                             WHERE (client, author) IN (VALUES {}) ORDER BY client{bytes}, author{bytes}{for_update})",
                            pairs.join(", ")
                        )
                    });
                    let mut q = sqlx::query(sql).bind(now);
                    for (client, author) in chunk {
                        q = q.bind(client).bind(author);
                    }
                    q.execute(&mut **tx).await?;
                }
                Ok(())
            }

            /// Stores the documents the decisions name: each snapshot
            /// appended once (an evaluation's decisions share it), each
            /// config once ever (one already stored is left as it is: `DO
            /// NOTHING` takes no lock on a committed row, so concurrent
            /// batches sharing a config never wait on each other; only two
            /// inserting the same new config do, once). Returns the `id` of
            /// each snapshot, by digest.
            pub(crate) async fn insert_input_docs<'d>(
                tx: &mut Tx<'_>,
                inputs: impl Iterator<Item = &'d DecisionInputs>,
                now: Millis,
            ) -> StoreResult<std::collections::HashMap<String, i64>> {
                let (mut snapshots, mut configs): (Vec<&InputDoc>, Vec<&InputDoc>) =
                    inputs.map(|i| (&*i.snapshot, &*i.config)).unzip();
                snapshots.sort_unstable_by(|a, b| a.digest.cmp(&b.digest));
                snapshots.dedup_by(|a, b| a.digest == b.digest);
                // Sorted, so concurrent inserts of the same new configs lock in one order.
                configs.sort_unstable_by(|a, b| a.digest.cmp(&b.digest));
                configs.dedup_by(|a, b| a.digest == b.digest);
                let ids = <$store as $crate::store::bulk::BulkInsert>::insert_docs(tx, &snapshots, false, now)
                    .await?
                    .into_iter()
                    .collect();
                // A config already stored returns no row; a new one's id is not needed.
                <$store as $crate::store::bulk::BulkInsert>::insert_docs(tx, &configs, true, now).await?;
                Ok(ids)
            }

            /// Marks the keys of `claims` done, but only those still held by
            /// their claim token (a retry that took a key over after its
            /// lock expired owns it now); returns which did, as (scope, key,
            /// token). The caller
            /// applies the effect of exactly those writes, in the same
            /// transaction, so at most one request's effect ever commits.
            pub(crate) async fn seal_keys(
                tx: &mut Tx<'_>,
                claims: &[&KeyCompletion],
            ) -> StoreResult<std::collections::HashSet<(String, String, String)>> {
                let mut sealed = std::collections::HashSet::new();
                let mut rest = claims;
                for size in chunk_sizes(claims.len()) {
                    let (chunk, tail) = rest.split_at(size);
                    rest = tail;
                    let sql = STATEMENTS.get("seal_keys", size, |n| {
                        format!(
                            "WITH v (scope, key, claim) AS (VALUES {}) UPDATE idempotency_keys SET state = 'done' \
                             FROM v WHERE idempotency_keys.scope = v.scope AND idempotency_keys.key = v.key \
                             AND idempotency_keys.claim = v.claim AND idempotency_keys.state = 'in_flight' \
                             RETURNING idempotency_keys.scope, idempotency_keys.key, idempotency_keys.claim",
                            values(n, 3)
                        )
                    });
                    let mut q = sqlx::query_as::<_, (String, String, String)>(sql);
                    for c in chunk {
                        q = q.bind(&c.scope).bind(&c.key).bind(&c.token);
                    }
                    sealed.extend(q.fetch_all(&mut **tx).await?);
                }
                Ok(sealed)
            }

            /// Deletes the keys of requests that failed inside the
            /// transaction, so a retry can go ahead at once.
            pub(crate) async fn release_keys(tx: &mut Tx<'_>, keys: &[&KeyCompletion]) -> StoreResult<()> {
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

            /// Stores the responses of sealed keys `(scope, key, status, body)`.
            pub(crate) async fn store_responses(
                tx: &mut Tx<'_>,
                responses: &[(&str, &str, u16, String)],
            ) -> StoreResult<()> {
                let mut rest = responses;
                for size in chunk_sizes(responses.len()) {
                    let (chunk, tail) = rest.split_at(size);
                    rest = tail;
                    let sql = STATEMENTS.get("responses", size, |n| {
                        format!(
                            "WITH v (scope, key, status, body) AS (VALUES {}) UPDATE idempotency_keys \
                             SET response_status = v.status, response_body = v.body FROM v \
                             WHERE idempotency_keys.scope = v.scope AND idempotency_keys.key = v.key",
                            values(n, 4)
                        )
                    });
                    let mut q = sqlx::query(sql);
                    for (scope, key, status, body) in chunk {
                        q = q.bind(*scope).bind(*key).bind(i32::from(*status)).bind(body);
                    }
                    q.execute(&mut **tx).await?;
                }
                Ok(())
            }

            /// After a transition of `item_id` to `version`: a hand-off
            /// stores its request (superseding the outstanding one); leaving
            /// `awaiting_provider` otherwise cancels the outstanding one.
            pub(crate) async fn settle_provider_requests(
                tx: &mut Tx<'_>,
                item_id: &str,
                from: ItemStatus,
                version: i64,
                handoff: Option<&Handoff>,
                now: Millis,
            ) -> StoreResult<()> {
                match handoff {
                    Some(h) => {
                        let key = provider_request_key(item_id, version, &h.provider);
                        sqlx::query(
                            "UPDATE provider_requests SET status = 'superseded', superseded_by = $2, \
                             updated_at = $3 WHERE item_id = $1 AND status IN ('pending', 'sent')",
                        )
                        .bind(item_id)
                        .bind(&key)
                        .bind(now)
                        .execute(&mut **tx)
                        .await?;
                        sqlx::query(
                            "INSERT INTO provider_requests (key, provider, item_id, item_version, status, \
                             next_attempt_at, deadline_at, created_at, updated_at, content_version) \
                             SELECT $1, $2, $3, $4, 'pending', $5, $6, $5, $5, content_version FROM items WHERE id = $3",
                        )
                        .bind(&key)
                        .bind(&h.provider)
                        .bind(item_id)
                        .bind(version)
                        .bind(now)
                        .bind(h.deadline_at)
                        .execute(&mut **tx)
                        .await?;
                    }
                    None if from == ItemStatus::AwaitingProvider => {
                        sqlx::query(
                            "UPDATE provider_requests SET status = 'cancelled', updated_at = $2 \
                             WHERE item_id = $1 AND status IN ('pending', 'sent')",
                        )
                        .bind(item_id)
                        .bind(now)
                        .execute(&mut **tx)
                        .await?;
                    }
                    None => {}
                }
                Ok(())
            }

            /// Items by id, in any order.
            pub(crate) async fn read_items<'e, E>(executor: E, ids: &[&str]) -> StoreResult<Vec<Item>>
            where
                E: sqlx::Executor<'e, Database = $db>,
            {
                if ids.is_empty() {
                    return Ok(Vec::new());
                }
                let sql = format!(
                    "SELECT {ITEM_COLUMNS} FROM items WHERE id IN ({})",
                    $crate::store::dialect::placeholders(1, ids.len())
                );
                let mut q = sqlx::query(&sql);
                for id in ids {
                    q = q.bind(*id);
                }
                q.fetch_all(executor).await?.iter().map(item_from_row).collect()
            }

            pub(crate) fn item_from_row(row: &$row) -> StoreResult<Item> {
                Ok(Item {
                    id: row.try_get("id")?,
                    client: row.try_get("client")?,
                    external_id: row.try_get("external_id")?,
                    kind: row.try_get("kind")?,
                    author: row.try_get("author")?,
                    body: row.try_get("body")?,
                    context: row.try_get("context")?,
                    fingerprint: row.try_get("fingerprint")?,
                    status: rows::parse(row.try_get::<&str, _>("status")?)?,
                    version: row.try_get("version")?,
                    decided_by: rows::parse_opt(row.try_get::<Option<&str>, _>("decided_by")?)?,
                    sync_verdict: rows::parse_opt(row.try_get::<Option<&str>, _>("sync_verdict")?)?,
                    needs_eval_since: row.try_get("needs_eval_since")?,
                    event_seq: row.try_get("event_seq")?,
                    evaluated_seq: row.try_get("evaluated_seq")?,
                    eval_round: row.try_get("eval_round")?,
                    content_version: row.try_get("content_version")?,
                    created_at: row.try_get("created_at")?,
                    updated_at: row.try_get("updated_at")?,
                })
            }

            pub(crate) fn decision_from_row(row: &$row) -> StoreResult<DecisionRecord> {
                Ok(DecisionRecord {
                    id: row.try_get("id")?,
                    item_version: row.try_get("item_version")?,
                    plugin: row.try_get("plugin")?,
                    plugin_version: row.try_get("plugin_version")?,
                    plugin_digest: row.try_get("plugin_digest")?,
                    phase: rows::parse(row.try_get::<&str, _>("phase")?)?,
                    verdict: rows::parse_opt(row.try_get::<Option<&str>, _>("verdict")?)?,
                    score: row.try_get("score")?,
                    labels: rows::labels(row.try_get::<&str, _>("labels")?)?,
                    reason: row.try_get("reason")?,
                    mode: rows::parse(row.try_get::<&str, _>("mode")?)?,
                    applied: row.try_get("applied")?,
                    duration_us: row.try_get("duration_us")?,
                    outcome: rows::parse(row.try_get::<&str, _>("outcome")?)?,
                    error: row.try_get("error")?,
                    created_at: row.try_get("created_at")?,
                    reversed_at: row.try_get("reversed_at")?,
                    snapshot_digest: row.try_get("snapshot_digest")?,
                    snapshot_id: row.try_get("snapshot_id")?,
                    config_digest: row.try_get("config_digest")?,
                    lists: rows::lists(row.try_get::<Option<&str>, _>("lists")?)?,
                })
            }

            pub(crate) fn transition_from_row(row: &$row) -> StoreResult<TransitionRecord> {
                Ok(TransitionRecord {
                    id: row.try_get("id")?,
                    item_id: row.try_get("item_id")?,
                    from_status: rows::parse(row.try_get::<&str, _>("from_status")?)?,
                    to_status: rows::parse(row.try_get::<&str, _>("to_status")?)?,
                    version: row.try_get("version")?,
                    cause: row.try_get("cause")?,
                    actor: rows::parse(row.try_get::<&str, _>("actor")?)?,
                    actor_name: row.try_get("actor_name")?,
                    actor_note: row.try_get("actor_note")?,
                    reason: row.try_get("reason")?,
                    correlation_id: row.try_get("correlation_id")?,
                    created_at: row.try_get("created_at")?,
                    policy: row.try_get("policy")?,
                    ends_at: row.try_get("ends_at")?,
                })
            }

            /// The columns of [`decision_from_row`].
            pub(crate) const DECISIONS: &str = DECISION_COLUMNS;
            /// The table expression of [`DECISIONS`].
            pub(crate) const DECISIONS_TABLE: &str = DECISIONS_FROM;
            /// The columns of [`transition_from_row`].
            pub(crate) const TRANSITIONS: &str = TRANSITION_COLUMNS;
        }
    };
}
pub(super) use impl_shared;
