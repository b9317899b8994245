//! How decisions reach the platform: the outbox (one row per transition,
//! written by a trigger in the transition's own transaction), the gap-free
//! changes feed over it, and webhook deliveries of each row to each
//! endpoint, claimed per item in version order.

use super::StoreResult;
use crate::clock::Millis;
use crate::domain::{Actor, DeliveryStatus, ItemStatus};
use serde::Serialize;

/// The `kind` of an author's account transition in the outbox (an item's
/// event carries the item's own kind: `post`, `comment`, ...).
pub const AUTHOR_KIND: &str = "author";

/// One transition as delivered to the platform: the webhook payload and
/// one entry of `GET /v1/changes`. An item's transition, or (with `kind`
/// `author`) an author's account transition.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct Change {
    /// `ITEM_ID:VERSION`, or `CLIENT:AUTHOR:VERSION` for an author: the
    /// same transition always has the same id, so a receiver deduplicates on it.
    pub event_id: String,
    /// The item; `null` for an author's transition.
    pub item_id: Option<String>,
    /// The author, for an author's transition (`kind` `author`).
    pub author: Option<String>,
    pub external_id: Option<String>,
    /// The client token that submitted the item (whose author it is).
    pub client: String,
    /// The item's kind, or `author`.
    pub kind: String,
    /// The item's (or author's) version after this transition; a receiver
    /// ignores an event whose version is not above the last one it applied.
    pub item_version: i64,
    /// An item status, or an author's account state for `kind` `author`.
    pub from_status: String,
    pub to_status: String,
    pub cause: String,
    pub actor: Actor,
    pub reason: String,
    pub correlation_id: String,
    pub occurred_at: Millis,
    /// Position in the changes feed (`after=` resumes behind it).
    pub cursor: String,
    /// In a webhook delivery of a restrictive decision (an item rejected,
    /// held or deleted by anyone but its author): the decision's statement
    /// of reasons, as `GET /v1/items/{id}/statements` gives it, so the
    /// platform can inform the user. Absent from the changes feed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub statement: Option<crate::domain::statements::Statement>,
}

/// The event id of a transition: the item and the version it created.
pub fn event_id(item_id: &str, version: i64) -> String {
    format!("{item_id}:{version}")
}

/// A position in the changes feed: (writing transaction, sequence).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ChangeCursor {
    pub txid: i64,
    pub seq: i64,
}

impl ChangeCursor {
    pub fn encode(self) -> String {
        format!("{}.{}", self.txid, self.seq)
    }

    pub fn parse(s: &str) -> Option<ChangeCursor> {
        let (txid, seq) = s.split_once('.')?;
        Some(ChangeCursor {
            txid: crate::domain::parse_decimal(txid)?,
            seq: crate::domain::parse_decimal(seq)?,
        })
    }
}

/// Where a webhook endpoint seen for the first time starts reading the
/// outbox: events from then on (the default), or every event still retained.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FeedStart {
    #[default]
    Latest,
    Earliest,
}

/// Which outbox events a webhook endpoint receives.
#[derive(Debug, Clone, PartialEq)]
pub struct EndpointFilter {
    pub name: String,
    /// Empty: every status.
    pub statuses: Vec<ItemStatus>,
    /// Empty: every kind.
    pub kinds: Vec<String>,
}

impl EndpointFilter {
    /// Whether the endpoint takes an event; `statuses` filters item events only.
    pub fn accepts(&self, to: &str, kind: &str) -> bool {
        (kind == AUTHOR_KIND || self.statuses.is_empty() || self.statuses.iter().any(|s| s.as_str() == to))
            && (self.kinds.is_empty() || self.kinds.iter().any(|k| k == kind))
    }
}

/// A delivery claimed for sending.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimedDelivery {
    pub id: i64,
    pub endpoint: String,
    /// Including this one.
    pub attempts: i64,
    pub change: Change,
}

/// The result of one attempt of a claimed delivery.
#[derive(Debug, Clone, PartialEq)]
pub struct DeliveryResult {
    pub id: i64,
    /// The claim's count (`ClaimedDelivery::attempts`).
    pub attempts: i64,
    pub outcome: DeliveryOutcome,
}

#[derive(Debug, Clone, PartialEq)]
pub enum DeliveryOutcome {
    Delivered {
        at: Millis,
    },
    /// Attempted again at `at`.
    Retry {
        at: Millis,
        error: String,
    },
    /// Out of attempts: listed as dead, replayable.
    Dead {
        error: String,
    },
}

/// A delivery as stored.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct DeliveryRecord {
    pub id: i64,
    pub event_id: String,
    pub endpoint: String,
    pub item_id: String,
    pub item_version: i64,
    pub status: DeliveryStatus,
    pub attempts: i64,
    pub next_attempt_at: Millis,
    pub last_error: Option<String>,
    pub created_at: Millis,
    pub delivered_at: Option<Millis>,
}

/// A webhook endpoint as the store knows it (every endpoint any process
/// registered).
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct EndpointState {
    pub endpoint: String,
    /// When its receiver answered `410 Gone`; `null` while it is enabled.
    pub disabled_at: Option<Millis>,
    pub disabled_reason: Option<String>,
    /// Its deliveries not yet delivered nor dead.
    pub pending: i64,
}

/// The outbox, its feed and its deliveries.
#[async_trait::async_trait]
pub trait Outbox: Send + Sync {
    /// Gives each endpoint its cursor over the outbox if it has none yet,
    /// at `start`; an endpoint keeps its cursor across restarts and
    /// configuration changes, so no event is skipped or fanned out twice.
    async fn register_endpoints(&self, endpoints: &[(&str, FeedStart)], now: Millis) -> StoreResult<()>;

    /// Advances each endpoint's cursor over up to `limit` outbox events
    /// (in feed order), creating a delivery for each event the endpoint
    /// accepts, in one transaction per endpoint; an endpoint another
    /// process is fanning out right now is skipped. Returns the most events
    /// any endpoint advanced over. An endpoint without a cursor (never
    /// registered) is skipped.
    async fn fan_out(&self, endpoints: &[EndpointFilter], now: Millis, limit: i64) -> StoreResult<usize>;

    /// Claims due deliveries to `endpoints` (the ones this process can send
    /// to; others are left for a process that knows them) until
    /// `lease_until`. A delivery is due only when no earlier version of its
    /// item is still pending for the same endpoint.
    async fn claim_deliveries(
        &self,
        endpoints: &[&str],
        now: Millis,
        lease_until: Millis,
        limit: i64,
    ) -> StoreResult<Vec<ClaimedDelivery>>;

    /// Records the results of attempts, all in one transaction; for each,
    /// whether it changed the delivery. A success marks it delivered
    /// unless it is no longer pending. A failure changes nothing when the
    /// delivery is no longer pending or was claimed again since its attempt
    /// began (its `attempts` differ): a dispatcher that resumes after its
    /// claim ran out cannot move the newer claim's retry, nor kill the
    /// delivery under it.
    async fn record_deliveries(&self, results: &[DeliveryResult]) -> StoreResult<Vec<bool>>;

    /// Disables `endpoint` after its receiver answered `410 Gone` to
    /// delivery `delivery`, which waits (pending) with the others until the
    /// endpoint is enabled again. `false` if it was already disabled.
    async fn disable_endpoint(&self, endpoint: &str, delivery: i64, reason: &str, now: Millis) -> StoreResult<bool>;

    /// Enables a disabled endpoint (its waiting deliveries are sent);
    /// `false` if it is unknown or not disabled.
    async fn enable_endpoint(&self, endpoint: &str, actor: &str, now: Millis) -> StoreResult<bool>;

    /// Every registered endpoint, by name.
    async fn webhook_endpoints(&self) -> StoreResult<Vec<EndpointState>>;

    /// Deliveries, newest first: dead ones only unless `all`.
    async fn deliveries(&self, all: bool, limit: i64) -> StoreResult<Vec<DeliveryRecord>>;

    /// Deliveries of one item, oldest first.
    async fn item_deliveries(&self, item_id: &str) -> StoreResult<Vec<DeliveryRecord>>;

    /// Makes a dead delivery pending again; `false` if unknown or not dead.
    async fn replay_delivery(&self, id: i64, now: Millis) -> StoreResult<bool>;

    /// Transitions in commit order after `after`, for every client or one.
    async fn changes(&self, client: Option<&str>, after: ChangeCursor, limit: i64) -> StoreResult<Vec<Change>>;
}

/// The fan-out's first, cheap read, run on every dispatcher round: whether
/// any of `endpoints` cursors has outbox events after it. Its plan is a
/// range search from each cursor, whatever the outbox's size.
pub(super) fn fan_out_check<S: super::dialect::Dialect>(endpoints: usize) -> String {
    format!(
        "SELECT 1 FROM webhook_cursors c WHERE c.endpoint IN ({}) \
         AND EXISTS (SELECT 1 FROM outbox o WHERE {}) LIMIT 1",
        super::dialect::placeholders(1, endpoints),
        S::FEED_AFTER_CURSOR
    )
}

/// [`fan_out_check`]'s statement on PostgreSQL or SQLite, for the tests
/// that read its plan.
#[doc(hidden)]
pub fn fan_out_check_sql(postgres: bool, endpoints: usize) -> String {
    if postgres {
        fan_out_check::<super::PgStore>(endpoints)
    } else {
        fan_out_check::<super::SqliteStore>(endpoints)
    }
}

/// Instantiates [`Outbox`] for one backend.
macro_rules! impl_outbox {
    ($store:ty, $db:ty, $row:ty) => {
        const _: () = {
            use sqlx::Row as _;
            use std::sync::LazyLock;
            use $crate::clock::Millis;
            use $crate::store::dialect::{Dialect, placeholders, retry_conflicts};
            use $crate::store::rows;
            use $crate::store::*;

            const CHANGE_COLUMNS: &str = "seq, txid, event_id, item_id, external_id, client, kind, item_version, \
                from_status, to_status, cause, actor, reason, correlation_id, created_at, author";
            const DELIVERY_COLUMNS: &str = "id, event_id, endpoint, item_id, item_version, status, attempts, \
                next_attempt_at, last_error, created_at, delivered_at";

            /// After a cursor: `(txid, seq) > ($1, $2)`.
            const AFTER_CURSOR: &str = <$store as Dialect>::FEED_AFTER;
            const ORDER: &str = <$store as Dialect>::FEED_ORDER;
            static CURSOR: LazyLock<String> = LazyLock::new(|| {
                format!(
                    "SELECT txid, seq FROM webhook_cursors WHERE endpoint = $1{}",
                    <$store as Dialect>::SKIP_LOCKED
                )
            });
            static FAN_OUT: LazyLock<String> = LazyLock::new(|| {
                format!(
                    "SELECT txid, seq, event_id, item_id, item_version, to_status, kind FROM outbox \
                     WHERE {AFTER_CURSOR}{} ORDER BY {ORDER} LIMIT $3",
                    <$store as Dialect>::FEED_HORIZON
                )
            });
            static FEED_HEAD: LazyLock<String> = LazyLock::new(|| {
                format!(
                    "SELECT txid, seq FROM outbox WHERE TRUE{} ORDER BY {} LIMIT 1",
                    <$store as Dialect>::FEED_HORIZON,
                    <$store as Dialect>::FEED_ORDER_DESC
                )
            });
            static STATEMENTS: $crate::store::dialect::Statements =
                $crate::store::dialect::Statements::new(<$store as Dialect>::ANONYMOUS_PARAMETERS);

            type FeedRow = (i64, i64, String, String, i64, String, String);

            /// One endpoint's round: its cursor (skipped when another
            /// process holds it), the events after it, the deliveries of
            /// those it accepts, the cursor moved past them.
            async fn fan_out_endpoint(
                tx: &mut txn::Tx<'_>,
                e: &EndpointFilter,
                now: Millis,
                limit: i64,
            ) -> StoreResult<usize> {
                let Some((txid, seq)) = sqlx::query_as::<_, (i64, i64)>(CURSOR.as_str())
                    .bind(&e.name)
                    .fetch_optional(&mut **tx)
                    .await?
                else {
                    return Ok(0);
                };
                let events = sqlx::query_as::<_, FeedRow>(FAN_OUT.as_str())
                    .bind(txid)
                    .bind(seq)
                    .bind(limit)
                    .fetch_all(&mut **tx)
                    .await?;
                let Some(&(last_txid, last_seq, ..)) = events.last() else {
                    return Ok(0);
                };
                let mut accepted = Vec::with_capacity(events.len());
                for event in &events {
                    if e.accepts(&event.5, &event.6) {
                        accepted.push(event);
                    }
                }
                let mut rest = &accepted[..];
                for size in $crate::store::dialect::chunk_sizes(accepted.len()) {
                    let (chunk, tail) = rest.split_at(size);
                    rest = tail;
                    let sql = STATEMENTS.get("deliveries", size, |n| {
                        format!(
                            "INSERT INTO deliveries (event_id, endpoint, item_id, item_version, status, \
                             next_attempt_at, created_at) VALUES {} ON CONFLICT (event_id, endpoint) DO NOTHING",
                            $crate::store::dialect::values(n, 7)
                        )
                    });
                    let mut q = sqlx::query(sql);
                    for (_, _, event_id, item_id, version, ..) in chunk {
                        q = q
                            .bind(event_id)
                            .bind(&e.name)
                            .bind(item_id)
                            .bind(*version)
                            .bind("pending")
                            .bind(now)
                            .bind(now);
                    }
                    q.execute(&mut **tx).await?;
                }
                sqlx::query("UPDATE webhook_cursors SET txid = $2, seq = $3, updated_at = $4 WHERE endpoint = $1")
                    .bind(&e.name)
                    .bind(last_txid)
                    .bind(last_seq)
                    .bind(now)
                    .execute(&mut **tx)
                    .await?;
                Ok(events.len())
            }

            /// The audit row of an endpoint's state change.
            async fn record_endpoint_event(
                tx: &mut txn::Tx<'_>,
                endpoint: &str,
                action: &str,
                actor: &str,
                reason: &str,
                now: Millis,
            ) -> StoreResult<()> {
                sqlx::query(
                    "INSERT INTO webhook_endpoint_events (endpoint, action, actor, reason, created_at) \
                     VALUES ($1, $2, $3, $4, $5)",
                )
                .bind(endpoint)
                .bind(action)
                .bind(actor)
                .bind(reason)
                .bind(now)
                .execute(&mut **tx)
                .await?;
                Ok(())
            }

            static CHANGES_ALL: LazyLock<String> = LazyLock::new(|| {
                format!(
                    "SELECT {CHANGE_COLUMNS} FROM outbox WHERE {AFTER_CURSOR}{} ORDER BY {ORDER} LIMIT $3",
                    <$store as Dialect>::FEED_HORIZON
                )
            });
            static CHANGES_CLIENT: LazyLock<String> = LazyLock::new(|| {
                format!(
                    "SELECT {CHANGE_COLUMNS} FROM outbox WHERE client = $4 AND {AFTER_CURSOR}{} ORDER BY {ORDER} LIMIT $3",
                    <$store as Dialect>::FEED_HORIZON
                )
            });

            /// Events read per statement when claimed deliveries are filled
            /// in (a claim is at most the dispatcher's free slots).
            const MAX_EVENTS_PER_READ: usize = 500;

            /// Of the listed endpoints, the enabled ones with a delivery due
            /// (a cheap read before the write transaction).
            fn due_endpoints_sql(endpoints: usize) -> String {
                format!(
                    "SELECT c.endpoint FROM webhook_cursors c WHERE c.endpoint IN ({}) \
                     AND NOT EXISTS (SELECT 1 FROM webhook_endpoints_disabled w WHERE w.endpoint = c.endpoint) \
                     AND EXISTS (SELECT 1 FROM deliveries d{} WHERE d.endpoint = c.endpoint \
                     AND d.status = 'pending' AND d.next_attempt_at <= $1)",
                    placeholders(2, endpoints),
                    <$store as Dialect>::DUE_ORDER,
                )
            }

            /// Claims, for the endpoint `$4`, up to `$3` due deliveries in due
            /// order whose item has no earlier version pending for the
            /// endpoint, nor an earlier event the endpoint's cursor has not
            /// passed yet.
            ///
            /// Each part can use one index only, so a claim costs the same
            /// with a backlog of millions whatever the planner's statistics
            /// say: the candidates walk `deliveries_due` (endpoint, due time)
            /// in order and stop at the limit; "no earlier version pending"
            /// is the item's lowest pending version for the endpoint, read
            /// from `deliveries_order` (item first), where the endpoint is a
            /// filter (`IS NOT DISTINCT FROM`, which no B-tree serves, so
            /// that `deliveries_due` cannot be chosen for it). On a table
            /// PostgreSQL had not analysed yet, every index looked alike:
            /// the claim used to read every pending delivery of the
            /// endpoint per candidate (7.6 s for a claim of 32 with 20,000
            /// pending), so a backlog slowed its own drain.
            static CLAIM: LazyLock<String> = LazyLock::new(|| {
                format!(
                    "UPDATE deliveries SET next_attempt_at = $2, attempts = attempts + 1 WHERE id IN (\
                     SELECT d.id FROM deliveries d{} WHERE d.endpoint = $4 AND d.status = 'pending' \
                     AND d.next_attempt_at <= $1 \
                     AND NOT EXISTS (SELECT 1 FROM webhook_endpoints_disabled w WHERE w.endpoint = $4) \
                     AND d.item_version = (SELECT MIN(e.item_version) FROM deliveries e{} \
                     WHERE e.item_id = d.item_id AND e.status = 'pending' AND e.endpoint IS NOT DISTINCT FROM $4) \
                     AND NOT EXISTS (SELECT 1 FROM outbox o JOIN webhook_cursors c ON c.endpoint = $4 \
                     WHERE o.item_id = d.item_id AND o.item_version < d.item_version \
                     AND {}) \
                     ORDER BY d.next_attempt_at, d.id LIMIT $3{}) RETURNING id, event_id, endpoint, attempts",
                    <$store as Dialect>::DUE_ORDER,
                    <$store as Dialect>::ITEM_ORDER,
                    <$store as Dialect>::FEED_AFTER_CURSOR,
                    <$store as Dialect>::SKIP_LOCKED
                )
            });

            fn change_from_row(row: &$row) -> StoreResult<Change> {
                let kind: String = row.try_get("kind")?;
                Ok(Change {
                    event_id: row.try_get("event_id")?,
                    item_id: (kind != AUTHOR_KIND).then(|| row.try_get("item_id")).transpose()?,
                    author: row.try_get("author")?,
                    external_id: row.try_get("external_id")?,
                    client: row.try_get("client")?,
                    item_version: row.try_get("item_version")?,
                    from_status: row.try_get("from_status")?,
                    to_status: row.try_get("to_status")?,
                    kind,
                    cause: row.try_get("cause")?,
                    actor: rows::parse(row.try_get::<&str, _>("actor")?)?,
                    reason: row.try_get("reason")?,
                    correlation_id: row.try_get("correlation_id")?,
                    occurred_at: row.try_get("created_at")?,
                    cursor: ChangeCursor {
                        txid: row.try_get("txid")?,
                        seq: row.try_get("seq")?,
                    }
                    .encode(),
                    statement: None,
                })
            }

            fn delivery_from_row(row: &$row) -> StoreResult<DeliveryRecord> {
                Ok(DeliveryRecord {
                    id: row.try_get("id")?,
                    event_id: row.try_get("event_id")?,
                    endpoint: row.try_get("endpoint")?,
                    item_id: row.try_get("item_id")?,
                    item_version: row.try_get("item_version")?,
                    status: rows::parse(row.try_get::<&str, _>("status")?)?,
                    attempts: row.try_get::<i32, _>("attempts")?.into(),
                    next_attempt_at: row.try_get("next_attempt_at")?,
                    last_error: row.try_get("last_error")?,
                    created_at: row.try_get("created_at")?,
                    delivered_at: row.try_get("delivered_at")?,
                })
            }

            #[async_trait::async_trait]
            impl Outbox for $store {
                async fn register_endpoints(&self, endpoints: &[(&str, FeedStart)], now: Millis) -> StoreResult<()> {
                    retry_conflicts!(async {
                        let mut tx = self.begin_write().await?;
                        let head = sqlx::query_as::<_, (i64, i64)>(FEED_HEAD.as_str())
                            .fetch_optional(&mut *tx)
                            .await?
                            .unwrap_or((0, 0));
                        for (name, start) in endpoints {
                            let (txid, seq) = match start {
                                FeedStart::Latest => head,
                                FeedStart::Earliest => (0, 0),
                            };
                            sqlx::query(
                                "INSERT INTO webhook_cursors (endpoint, txid, seq, updated_at) VALUES ($1, $2, $3, $4) \
                                 ON CONFLICT (endpoint) DO NOTHING",
                            )
                            .bind(*name)
                            .bind(txid)
                            .bind(seq)
                            .bind(now)
                            .execute(&mut *tx)
                            .await?;
                        }
                        tx.commit().await?;
                        Ok(())
                    })
                }

                async fn fan_out(&self, endpoints: &[EndpointFilter], now: Millis, limit: i64) -> StoreResult<usize> {
                    if endpoints.is_empty() {
                        return Ok(0);
                    }
                    // A cheap read first: the write transaction (on SQLite, the
                    // one write lock) only when some cursor has events after it.
                    let pending = $crate::store::outbox::fan_out_check::<$store>(endpoints.len());
                    let mut q = sqlx::query(&pending);
                    for e in endpoints {
                        q = q.bind(&e.name);
                    }
                    if q.fetch_optional(self.read_pool()).await?.is_none() {
                        return Ok(0);
                    }
                    let mut most = 0;
                    for e in endpoints {
                        let advanced = retry_conflicts!(async {
                            let mut tx = self.begin_write().await?;
                            let n = fan_out_endpoint(&mut tx, e, now, limit).await?;
                            tx.commit().await?;
                            Ok(n)
                        })?;
                        most = most.max(advanced);
                    }
                    Ok(most)
                }

                async fn claim_deliveries(
                    &self,
                    endpoints: &[&str],
                    now: Millis,
                    lease_until: Millis,
                    limit: i64,
                ) -> StoreResult<Vec<ClaimedDelivery>> {
                    if endpoints.is_empty() {
                        return Ok(Vec::new());
                    }
                    let sql = due_endpoints_sql(endpoints.len());
                    let mut q = sqlx::query_scalar::<_, String>(&sql).bind(now);
                    for e in endpoints {
                        q = q.bind(*e);
                    }
                    let due = q.fetch_all(self.read_pool()).await?;
                    if due.is_empty() {
                        return Ok(Vec::new());
                    }
                    // One statement per endpoint, each given what the ones
                    // before left of the limit, starting from a different
                    // endpoint each millisecond: one endpoint's backlog does
                    // not hold the others back.
                    let first = now.rem_euclid(due.len() as i64) as usize;
                    let claimed = retry_conflicts!(async {
                        let mut tx = self.begin_write().await?;
                        let mut claimed = Vec::new();
                        for endpoint in due.iter().cycle().skip(first).take(due.len()) {
                            let left = limit - claimed.len() as i64;
                            if left <= 0 {
                                break;
                            }
                            claimed.extend(
                                sqlx::query_as::<_, (i64, String, String, i32)>(CLAIM.as_str())
                                    .bind(now)
                                    .bind(lease_until)
                                    .bind(left)
                                    .bind(endpoint)
                                    .fetch_all(&mut *tx)
                                    .await?,
                            );
                        }
                        tx.commit().await?;
                        Ok(claimed)
                    })?;
                    if claimed.is_empty() {
                        return Ok(Vec::new());
                    }
                    // The claimed deliveries' events, in one read after the
                    // claim committed (an outbox row never changes): the
                    // write transaction holds only the claim.
                    let mut events: std::collections::HashMap<String, Change> = std::collections::HashMap::new();
                    for chunk in claimed.chunks(MAX_EVENTS_PER_READ) {
                        let sql = format!(
                            "SELECT {CHANGE_COLUMNS} FROM outbox WHERE event_id IN ({})",
                            placeholders(1, chunk.len())
                        );
                        let mut q = sqlx::query(&sql);
                        for (_, event_id, _, _) in chunk {
                            q = q.bind(event_id);
                        }
                        for row in q.fetch_all(self.read_pool()).await? {
                            let change = change_from_row(&row)?;
                            events.insert(change.event_id.clone(), change);
                        }
                    }
                    claimed
                        .into_iter()
                        .map(|(id, event_id, endpoint, attempts)| {
                            // A delivery's event outlives it (the foreign key
                            // and retention keep it while it is pending).
                            let change = events.get(&event_id).cloned().ok_or_else(|| {
                                StoreError::Corrupt(format!("delivery {id}: its event {event_id} is not in the outbox"))
                            })?;
                            Ok(ClaimedDelivery {
                                id,
                                endpoint,
                                attempts: attempts.into(),
                                change,
                            })
                        })
                        .collect()
                }

                async fn record_deliveries(&self, results: &[DeliveryResult]) -> StoreResult<Vec<bool>> {
                    if results.is_empty() {
                        return Ok(Vec::new());
                    }
                    retry_conflicts!(async {
                        let mut tx = self.begin_write().await?;
                        let mut changed = Vec::with_capacity(results.len());
                        for r in results {
                            let q = match &r.outcome {
                                DeliveryOutcome::Delivered { at } => sqlx::query(
                                    "UPDATE deliveries SET status = 'delivered', delivered_at = $2, last_error = NULL \
                                     WHERE id = $1 AND status = 'pending'",
                                )
                                .bind(r.id)
                                .bind(*at),
                                DeliveryOutcome::Retry { at, error } => sqlx::query(
                                    "UPDATE deliveries SET next_attempt_at = $3, last_error = $4 \
                                     WHERE id = $1 AND attempts = $2 AND status = 'pending'",
                                )
                                .bind(r.id)
                                .bind(r.attempts)
                                .bind(*at)
                                .bind(error.as_str()),
                                DeliveryOutcome::Dead { error } => sqlx::query(
                                    "UPDATE deliveries SET status = 'dead', last_error = $3 \
                                     WHERE id = $1 AND attempts = $2 AND status = 'pending'",
                                )
                                .bind(r.id)
                                .bind(r.attempts)
                                .bind(error.as_str()),
                            };
                            changed.push(q.execute(&mut *tx).await?.rows_affected() == 1);
                        }
                        tx.commit().await?;
                        Ok(changed)
                    })
                }

                async fn disable_endpoint(&self, endpoint: &str, delivery: i64, reason: &str, now: Millis) -> StoreResult<bool> {
                    retry_conflicts!(async {
                        let mut tx = self.begin_write().await?;
                        let disabled = sqlx::query(
                            "INSERT INTO webhook_endpoints_disabled (endpoint, disabled_at, reason) VALUES ($1, $2, $3) \
                             ON CONFLICT (endpoint) DO NOTHING",
                        )
                        .bind(endpoint)
                        .bind(now)
                        .bind(reason)
                        .execute(&mut *tx)
                        .await?
                        .rows_affected()
                            == 1;
                        if disabled {
                            record_endpoint_event(&mut tx, endpoint, "disabled", "receiver", reason, now).await?;
                        }
                        // The attempt that was answered 410 waits with the rest.
                        sqlx::query(
                            "UPDATE deliveries SET next_attempt_at = $2, last_error = $3 WHERE id = $1 AND status = 'pending'",
                        )
                        .bind(delivery)
                        .bind(now)
                        .bind(reason)
                        .execute(&mut *tx)
                        .await?;
                        tx.commit().await?;
                        Ok(disabled)
                    })
                }

                async fn enable_endpoint(&self, endpoint: &str, actor: &str, now: Millis) -> StoreResult<bool> {
                    retry_conflicts!(async {
                        let mut tx = self.begin_write().await?;
                        let enabled = sqlx::query("DELETE FROM webhook_endpoints_disabled WHERE endpoint = $1")
                        .bind(endpoint)
                        .execute(&mut *tx)
                        .await?
                        .rows_affected()
                            == 1;
                        if enabled {
                            record_endpoint_event(&mut tx, endpoint, "enabled", actor, "", now).await?;
                        }
                        tx.commit().await?;
                        Ok(enabled)
                    })
                }

                async fn webhook_endpoints(&self) -> StoreResult<Vec<EndpointState>> {
                    let rows = sqlx::query_as::<_, (String, Option<i64>, Option<String>, i64)>(
                        "SELECT c.endpoint, w.disabled_at, w.reason, \
                         (SELECT COUNT(*) FROM deliveries d WHERE d.endpoint = c.endpoint AND d.status = 'pending') \
                         FROM webhook_cursors c LEFT JOIN webhook_endpoints_disabled w ON w.endpoint = c.endpoint \
                         ORDER BY c.endpoint",
                    )
                    .fetch_all(self.read_pool())
                    .await?;
                    Ok(rows
                        .into_iter()
                        .map(|(endpoint, disabled_at, disabled_reason, pending)| EndpointState {
                            endpoint,
                            disabled_at,
                            disabled_reason,
                            pending,
                        })
                        .collect())
                }

                async fn deliveries(&self, all: bool, limit: i64) -> StoreResult<Vec<DeliveryRecord>> {
                    let filter = if all { "" } else { "WHERE status = 'dead' " };
                    sqlx::query(&format!("SELECT {DELIVERY_COLUMNS} FROM deliveries {filter}ORDER BY id DESC LIMIT $1"))
                        .bind(limit)
                        .fetch_all(self.read_pool())
                        .await?
                        .iter()
                        .map(delivery_from_row)
                        .collect()
                }

                async fn item_deliveries(&self, item_id: &str) -> StoreResult<Vec<DeliveryRecord>> {
                    sqlx::query(&format!("SELECT {DELIVERY_COLUMNS} FROM deliveries WHERE item_id = $1 ORDER BY id"))
                        .bind(item_id)
                        .fetch_all(self.read_pool())
                        .await?
                        .iter()
                        .map(delivery_from_row)
                        .collect()
                }

                async fn replay_delivery(&self, id: i64, now: Millis) -> StoreResult<bool> {
                    retry_conflicts!(async {
                        let mut tx = self.begin_write().await?;
                        let n = sqlx::query(
                            "UPDATE deliveries SET status = 'pending', attempts = 0, next_attempt_at = $2 \
                             WHERE id = $1 AND status = 'dead'",
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

                async fn changes(&self, client: Option<&str>, after: ChangeCursor, limit: i64) -> StoreResult<Vec<Change>> {
                    let query = match client {
                        None => sqlx::query(CHANGES_ALL.as_str()).bind(after.txid).bind(after.seq).bind(limit),
                        Some(c) => sqlx::query(CHANGES_CLIENT.as_str())
                            .bind(after.txid)
                            .bind(after.seq)
                            .bind(limit)
                            .bind(c),
                    };
                    query.fetch_all(self.read_pool()).await?.iter().map(change_from_row).collect()
                }
            }
        };
    };
}
pub(super) use impl_outbox;

#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn change_cursors_round_trip(txid in 0i64..1_000_000_000_000_000_000, seq in 0i64..1_000_000_000_000_000_000) {
            let c = ChangeCursor { txid, seq };
            prop_assert_eq!(ChangeCursor::parse(&c.encode()), Some(c));
        }

        #[test]
        fn any_string_parses_to_a_cursor_or_none(s in any::<String>()) {
            if let Some(c) = ChangeCursor::parse(&s) {
                prop_assert!(c.txid >= 0 && c.seq >= 0);
            }
        }
    }
}
