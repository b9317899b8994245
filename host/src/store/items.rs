//! Items: reads (an item with everything that happened to it), the review
//! queue, an author's items, and manual (moderator, author) transitions.
//! Creating items is [`super::submissions`]'s, events [`super::events`]'.

use super::{ProviderCallbackRecord, ProviderRequestRecord, StoreError, StoreResult};
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
    /// `event_seq` of the newest committed evaluation.
    pub evaluated_seq: i64,
    /// Evaluations committed so far: an evaluation commits only while no
    /// other has since its snapshot (the fencing token of evaluations).
    pub eval_round: i64,
    /// Bumped by every `edit`: a provider's answer holds for one content version.
    pub content_version: i64,
    pub created_at: Millis,
    pub updated_at: Millis,
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
    /// What the rule judged, stored with the decision when
    /// `evaluation.store_snapshots` is on (see [`super::history`]).
    pub inputs: Option<super::DecisionInputs>,
    /// Whether it weighs against its item's author under the standing
    /// policy ([`crate::domain::standing::StandingPolicy::weighs`]; false
    /// when standing is off). The store marks the author for recomputation
    /// in the decision's transaction only then: a decision that cannot
    /// change the score queues nothing.
    pub weighs: bool,
    /// The lists the rule consulted, at the versions it used.
    pub lists: Vec<crate::rules::ListUse>,
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
    /// When a moderator overturned this automated action: set while the
    /// item's latest moderator decision overturns its verdict
    /// ([`ItemStatus::overturned_verdicts`]), cleared by one that confirms it.
    pub reversed_at: Option<Millis>,
    /// sha256 (hex) of the stored snapshot the rule judged (`null` when
    /// none was stored); `gavel replay` judges it again.
    pub snapshot_digest: Option<String>,
    /// The stored snapshot's row (`snapshots.id`): how it is read.
    #[serde(skip)]
    pub snapshot_id: Option<i64>,
    /// sha256 (hex) of the plugin config the rule ran with.
    pub config_digest: Option<String>,
    /// The lists the rule consulted, each at the version it answered from.
    pub lists: Vec<crate::rules::ListUse>,
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
    /// The policy a moderator named for the decision (a rule's decision is
    /// stated under the policy its labels map to: see `statements.rs`).
    pub policy: Option<String>,
    /// When a moderator's restriction ends: the reconciler makes the item
    /// visible then, unless a later decision replaced this one.
    pub ends_at: Option<Millis>,
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
    /// The policy a moderator names for the decision.
    pub policy: Option<String>,
    /// A moderator's restriction (`held_for_review`, `rejected`) ends then:
    /// [`Items::lift_restrictions`] makes the item visible. Every manual or
    /// automated transition through here replaces it (`None` clears it).
    pub until: Option<Millis>,
    /// The appeal this decision closes, in the same transaction; if it is
    /// no longer open, nothing is written ([`Transition::Stale`]).
    pub appeal: Option<super::AppealClose>,
}

/// The result of a conditional write. Losing a race is a value, not an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// Applied; the item is now at `version`.
    Applied { version: i64 },
    /// The item changed since it was read (or a moderator decided): nothing written.
    Stale,
}

/// What a moderator's decision did to the item's automated actions
/// (applied, enforced `flag`, `hold`, `reject` decisions), by the plugin
/// name and version that made them, with how many.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Reversals {
    /// Actions it overturned that were not overturned before.
    pub overturned: std::collections::BTreeMap<(String, String), u64>,
    /// Actions an earlier moderator decision overturned that it confirms.
    pub reinstated: std::collections::BTreeMap<(String, String), u64>,
}

impl Reversals {
    /// Whether it changed what counts against the author.
    pub fn is_empty(&self) -> bool {
        self.overturned.is_empty() && self.reinstated.is_empty()
    }
}

/// A position in the review queue: (updated_at, id) of the last item seen.
pub type ReviewCursor = (Millis, String);

/// The review queue's page cursor as the API hands it out: `AT_ID`.
pub fn encode_review_cursor((at, id): &ReviewCursor) -> String {
    format!("{at}_{id}")
}

/// Reads a cursor [`encode_review_cursor`] wrote; `None` for anything else
/// (a time that is not 1-18 digits, an id of more than 256 characters or
/// with a control character). The OpenAPI document states the same rule.
pub fn parse_review_cursor(s: &str) -> Option<ReviewCursor> {
    let (at, id) = s.split_once('_')?;
    let at: Millis = crate::domain::parse_decimal(at)?;
    let plausible_id = (1..=256).contains(&id.chars().count()) && !id.chars().any(char::is_control);
    plausible_id.then(|| (at, id.to_string()))
}

/// Reading items, and changing their status by hand.
#[async_trait::async_trait]
pub trait Items: Send + Sync {
    async fn item(&self, id: &str) -> StoreResult<Option<Item>>;

    /// Items by id, in any order (unknown ids are left out).
    async fn items(&self, ids: &[&str]) -> StoreResult<Vec<Item>>;

    /// The item with every decision.
    async fn item_details(&self, id: &str) -> StoreResult<Option<ItemDetails>> {
        self.item_details_page(id, None, i64::MAX).await
    }

    /// The item with its newest `decisions` decisions made before decision
    /// `before` (the newest when `None`), oldest first: a bounded read of
    /// an item with a long history.
    async fn item_details_page(
        &self,
        id: &str,
        before: Option<i64>,
        decisions: i64,
    ) -> StoreResult<Option<ItemDetails>>;

    /// A conditional status change with its audit row.
    async fn transition(&self, req: &TransitionRequest) -> StoreResult<Transition> {
        Ok(self.transition_reversing(req).await?.0)
    }

    /// [`Items::transition`], and what a moderator's change did to the
    /// item's automated actions: in the same transaction, every action the
    /// new status overturns is marked `reversed_at` and every one it
    /// confirms is cleared, whatever earlier moderator decisions said.
    async fn transition_reversing(&self, req: &TransitionRequest) -> StoreResult<(Transition, Reversals)>;

    /// Held items, oldest first, after `cursor`.
    async fn review_queue(&self, after: Option<&ReviewCursor>, limit: i64) -> StoreResult<Vec<Item>>;

    /// The latest items of `author` (of `client`), newest first.
    async fn author_items(&self, client: &str, author: &str, limit: i64) -> StoreResult<Vec<Item>>;

    /// Items created from `since` to before `until`, in id order after
    /// `after` (ids are UUIDv7, ordered by creation time, so the primary
    /// key serves the range): one keyset page of a scan, for rebuilding
    /// entity signals from the record.
    async fn items_created(
        &self,
        since: Millis,
        until: Millis,
        after: Option<&str>,
        limit: i64,
    ) -> StoreResult<Vec<Item>>;

    /// Makes visible the items whose moderator's restriction has ended by
    /// `now` (at most `limit`), each by one conditional write with its
    /// audit row (actor `system`, cause `restriction_ended`), fenced by the
    /// version and the end time: of two processes lifting one item, one
    /// writes. Returns the items lifted, with their new versions.
    async fn lift_restrictions(&self, now: Millis, limit: i64) -> StoreResult<Vec<(String, i64)>>;

    /// Transitions that have a statement of reasons (to `rejected`,
    /// `held_for_review` or `deleted`, by anyone but the author), as
    /// `(transition id, item id)`, in id order after `after`, made in
    /// `[since, until)` on items of `client` (any when `None`): one keyset
    /// page of `gavel export statements`.
    async fn restrictive_transitions(
        &self,
        after: i64,
        since: Millis,
        until: Millis,
        client: Option<&str>,
        limit: i64,
    ) -> StoreResult<Vec<(i64, String)>>;

    /// Marks an item for evaluation (a moderator's "re-evaluate now");
    /// `false` if it does not exist or is deleted.
    async fn request_evaluation(&self, id: &str, now: Millis) -> StoreResult<bool>;
}

/// The smallest text a UUIDv7 made at `at_ms` or later sorts after (its
/// 48-bit millisecond timestamp, the rest zero).
pub fn uuid_floor(at_ms: Millis) -> String {
    let ms = at_ms.clamp(0, (1 << 48) - 1) as u64;
    let hex = format!("{ms:012x}");
    format!("{}-{}-0000-0000-000000000000", &hex[..8], &hex[8..])
}

/// Why a moderator's change was not applied.
#[derive(Debug, Clone, PartialEq)]
pub enum ModerationOutcome {
    /// Applied; what it did to the item's automated actions.
    Applied {
        reversals: Reversals,
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
    /// Nothing was written: the item changed, or the appeal the decision
    /// was to close was closed, meanwhile. The caller re-reads the appeal.
    AppealStale,
}

/// Who changes an item by hand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ManualActor<'a> {
    /// A moderator: any manual target, on any item.
    Moderator,
    /// The item's author, through the client that submitted it: deletion
    /// only, and only of that client's items (another client's item is
    /// `NotFound`).
    Author { client: &'a str },
}

/// A decision by hand, as the API and the console make it.
#[derive(Debug, Clone)]
pub struct Moderation<'a> {
    pub id: &'a str,
    pub to: ItemStatus,
    /// The version the person looked at (`If-Match`).
    pub if_match: Option<i64>,
    pub by: ManualActor<'a>,
    /// The token's name: the identity in the audit trail.
    pub name: &'a str,
    /// A display note from the request, kept beside the identity.
    pub note: Option<&'a str>,
    pub reason: &'a str,
    pub correlation_id: &'a str,
    /// The policy the moderator decides under.
    pub policy: Option<&'a str>,
    /// When the restriction ends, for a timed one.
    pub until: Option<Millis>,
    /// The appeal the decision closes (in the same transaction).
    pub appeal: Option<super::AppealClose>,
}

/// A decision by hand. Reads the item, then applies a conditional
/// transition; a concurrent automated change makes it re-read and retry
/// (a manual decision wins), unless the caller pinned a version with
/// `If-Match`, which then answers `VersionMismatch`.
pub async fn moderate(store: &dyn Items, m: &Moderation<'_>) -> StoreResult<ModerationOutcome> {
    const ATTEMPTS: usize = 8;
    let (actor, cause) = match m.by {
        ManualActor::Moderator if m.appeal.is_some() => (Actor::Moderator, Cause::Appeal),
        ManualActor::Moderator => (Actor::Moderator, Cause::Moderation),
        ManualActor::Author { .. } => (Actor::Author, Cause::AuthorDeleted),
    };
    for _ in 0..ATTEMPTS {
        let Some(item) = store.item(m.id).await? else {
            return Ok(ModerationOutcome::NotFound);
        };
        if let ManualActor::Author { client } = m.by
            && client != item.client
        {
            return Ok(ModerationOutcome::NotFound);
        }
        if let Some(expected) = m.if_match
            && expected != item.version
        {
            return Ok(ModerationOutcome::VersionMismatch { current: item.version });
        }
        if !can_transition(item.status, m.to, actor) {
            return Ok(ModerationOutcome::Illegal { from: item.status });
        }
        let req = TransitionRequest {
            item_id: m.id.to_string(),
            expected_version: item.version,
            from: item.status,
            to: m.to,
            actor,
            actor_name: Some(m.name.to_string()),
            actor_note: m.note.map(str::to_string),
            cause,
            reason: m.reason.to_string(),
            correlation_id: m.correlation_id.to_string(),
            now: now_ms(),
            policy: m.policy.map(str::to_string),
            until: m.until,
            appeal: m.appeal.clone(),
        };
        if let (Transition::Applied { .. }, reversals) = store.transition_reversing(&req).await? {
            return Ok(ModerationOutcome::Applied { reversals });
        }
        if m.appeal.is_some() {
            return Ok(ModerationOutcome::AppealStale);
        }
        if m.if_match.is_some() {
            let current = store.item(m.id).await?.map_or(item.version, |i| i.version);
            return Ok(ModerationOutcome::VersionMismatch { current });
        }
    }
    Err(StoreError::Conflict(format!(
        "item {} kept changing; not applied after {ATTEMPTS} attempts",
        m.id
    )))
}

/// The review queue's page after the cursor `(updated_at, id)` = (`$1`,
/// `$2`), at most `$3` items, on both stores (the first page is the one
/// after `(i64::MIN, "")`). The cursor is a row
/// comparison, which both planners read as a range of `items_review`:
/// written `updated_at > $1 OR (updated_at = $1 AND id > $2)`,
/// PostgreSQL filters every held item before the cursor, so a page deep in
/// a long queue cost a read of all of the queue before it.
pub(crate) fn review_page() -> &'static str {
    static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        format!(
            "SELECT {} FROM items WHERE status = 'held_for_review' AND (updated_at, id) > ($1, $2) \
             ORDER BY updated_at, id LIMIT $3",
            super::shared::ITEM_COLUMNS
        )
    });
    &SQL
}

/// Instantiates [`Items`] for one backend (see `sqlite.rs`).
macro_rules! impl_items {
    ($store:ty, $db:ty, $row:ty) => {
        const _: () = {
            use sqlx::Row as _;
            use $crate::clock::Millis;
            use $crate::store::dialect::{Dialect, placeholders, retry_conflicts};
            use $crate::store::shared::NewTransition;
            use $crate::store::*;

            #[async_trait::async_trait]
            impl Items for $store {
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

                async fn item_details_page(
                    &self,
                    id: &str,
                    before: Option<i64>,
                    decisions: i64,
                ) -> StoreResult<Option<ItemDetails>> {
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
                    let mut decisions = sqlx::query(&format!(
                        "SELECT {} FROM {} WHERE d.item_id = $1 AND d.id < $2 ORDER BY d.id DESC LIMIT $3",
                        txn::DECISIONS,
                        txn::DECISIONS_TABLE
                    ))
                    .bind(id)
                    .bind(before.unwrap_or(i64::MAX))
                    .bind(decisions)
                    .fetch_all(&mut *tx)
                    .await?
                    .iter()
                    .map(txn::decision_from_row)
                    .collect::<StoreResult<Vec<_>>>()?;
                    decisions.reverse();
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

                async fn transition_reversing(&self, r: &TransitionRequest) -> StoreResult<(Transition, Reversals)> {
                    retry_conflicts!(async {
                        let mut tx = self.begin_write().await?;
                        let sql = if r.actor.is_automated() {
                            "UPDATE items SET status = $1, version = version + 1, decided_by = $2, updated_at = $3, \
                             restricted_until = $7 WHERE id = $4 AND version = $5 AND status = $6 \
                             AND (decided_by IS NULL OR decided_by <> 'moderator') RETURNING version"
                        } else {
                            "UPDATE items SET status = $1, version = version + 1, decided_by = $2, updated_at = $3, \
                             restricted_until = $7 WHERE id = $4 AND version = $5 AND status = $6 RETURNING version"
                        };
                        let version: Option<i64> = sqlx::query_scalar(sql)
                            .bind(r.to.as_str())
                            .bind(r.actor.as_str())
                            .bind(r.now)
                            .bind(&r.item_id)
                            .bind(r.expected_version)
                            .bind(r.from.as_str())
                            .bind(r.until)
                            .fetch_optional(&mut *tx)
                            .await?;
                        let Some(version) = version else {
                            tx.rollback().await?;
                            return Ok((Transition::Stale, Reversals::default()));
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
                                policy: r.policy.as_deref(),
                                ends_at: r.until,
                            }],
                        )
                        .await?;
                        if let Some(a) = &r.appeal {
                            // The appeal closes with the decision or not at all;
                            // the table's CHECKs refuse anyone but a moderator.
                            let closed = sqlx::query(
                                "UPDATE appeals SET status = $1, closed_at = $2, closed_by = $3, closed_by_actor = $4, \
                                 close_reason = $5, outcome_version = $6 WHERE id = $7 AND item_id = $8 AND status = 'open'",
                            )
                            .bind(a.status.as_str())
                            .bind(r.now)
                            .bind(r.actor_name.as_deref())
                            .bind(r.actor.as_str())
                            .bind(&r.reason)
                            .bind(version)
                            .bind(&a.id)
                            .bind(&r.item_id)
                            .execute(&mut *tx)
                            .await?
                            .rows_affected();
                            if closed == 0 {
                                tx.rollback().await?;
                                return Ok((Transition::Stale, Reversals::default()));
                            }
                        }
                        let reversals = if r.actor == $crate::domain::Actor::Moderator {
                            settle_reversals(&mut tx, &r.item_id, r.to, r.now).await?
                        } else {
                            Reversals::default()
                        };
                        if !reversals.is_empty() {
                            // What counts against the author changed.
                            txn::mark_authors(&mut tx, &[r.item_id.as_str()], r.now).await?;
                        }
                        txn::settle_provider_requests(&mut tx, &r.item_id, r.from, version, None, r.now).await?;
                        tx.commit().await?;
                        Ok((Transition::Applied { version }, reversals))
                    })
                }

                async fn lift_restrictions(&self, now: Millis, limit: i64) -> StoreResult<Vec<(String, i64)>> {
                    let due: Vec<(String, i64, String, i64)> = sqlx::query_as(
                        "SELECT id, version, status, restricted_until FROM items WHERE restricted_until <= $1 \
                         ORDER BY restricted_until LIMIT $2",
                    )
                    .bind(now)
                    .bind(limit)
                    .fetch_all(self.read_pool())
                    .await?;
                    let mut lifted = Vec::new();
                    for (id, version, status, until) in due {
                        let from: $crate::domain::ItemStatus = status.parse()?;
                        let done = retry_conflicts!(async {
                            let mut tx = self.begin_write().await?;
                            let new: Option<i64> = sqlx::query_scalar(
                                "UPDATE items SET status = 'visible', version = version + 1, restricted_until = NULL, \
                                 updated_at = $1 WHERE id = $2 AND version = $3 AND restricted_until IS NOT NULL \
                                 AND restricted_until <= $1 AND status IN ('held_for_review', 'rejected') RETURNING version",
                            )
                            .bind(now)
                            .bind(&id)
                            .bind(version)
                            .fetch_optional(&mut *tx)
                            .await?;
                            let Some(new) = new else {
                                tx.rollback().await?;
                                return Ok(None);
                            };
                            let reason = format!(
                                "the restriction a moderator set until {} ended",
                                $crate::domain::statements::date_time(until)
                            );
                            txn::insert_transitions(
                                &mut tx,
                                &[NewTransition {
                                    item_id: &id,
                                    from,
                                    to: $crate::domain::ItemStatus::Visible,
                                    version: new,
                                    cause: $crate::domain::policy::Cause::RestrictionEnded,
                                    actor: $crate::domain::Actor::System,
                                    actor_name: None,
                                    actor_note: None,
                                    reason: &reason,
                                    correlation_id: "restriction-ended",
                                    now,
                                    policy: None,
                                    ends_at: None,
                                }],
                            )
                            .await?;
                            tx.commit().await?;
                            Ok(Some(new))
                        })?;
                        if let Some(new) = done {
                            lifted.push((id, new));
                        }
                    }
                    Ok(lifted)
                }

                async fn restrictive_transitions(
                    &self,
                    after: i64,
                    since: Millis,
                    until: Millis,
                    client: Option<&str>,
                    limit: i64,
                ) -> StoreResult<Vec<(i64, String)>> {
                    Ok(sqlx::query_as(
                        "SELECT t.id, t.item_id FROM transitions t JOIN items i ON i.id = t.item_id \
                         WHERE t.id > $1 AND t.to_status IN ('rejected', 'held_for_review', 'deleted') \
                         AND t.actor <> 'author' AND t.created_at >= $2 AND t.created_at < $3 \
                         AND ($4 = '' OR i.client = $4) ORDER BY t.id LIMIT $5",
                    )
                    .bind(after)
                    .bind(since)
                    .bind(until)
                    .bind(client.unwrap_or(""))
                    .bind(limit)
                    .fetch_all(self.read_pool())
                    .await?)
                }

                async fn review_queue(&self, after: Option<&ReviewCursor>, limit: i64) -> StoreResult<Vec<Item>> {
                    // The first page is the page after a cursor before every item.
                    let (at, id) = after.map_or((i64::MIN, ""), |(at, id)| (*at, id.as_str()));
                    sqlx::query($crate::store::items::review_page())
                        .bind(at)
                        .bind(id)
                        .bind(limit)
                        .fetch_all(self.read_pool())
                        .await?
                        .iter()
                        .map(txn::item_from_row)
                        .collect()
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

                async fn items_created(
                    &self,
                    since: Millis,
                    until: Millis,
                    after: Option<&str>,
                    limit: i64,
                ) -> StoreResult<Vec<Item>> {
                    // An id made a second before `since` bounds the scan from
                    // below (an id and its `created_at` are read from two
                    // clock reads); `created_at` decides.
                    let floor = $crate::store::items::uuid_floor(since - 1000);
                    let from = after.map_or(floor.as_str(), |a| a.max(floor.as_str()));
                    sqlx::query(&format!(
                        "SELECT {} FROM items WHERE id > $1 AND created_at >= $2 AND created_at < $3 \
                         ORDER BY id LIMIT $4",
                        $crate::store::shared::ITEM_COLUMNS
                    ))
                    .bind(from)
                    .bind(since)
                    .bind(until)
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

            /// The item's automated actions as a moderator's decision `to`
            /// leaves them: those it overturns marked (keeping the time of
            /// an earlier overturn), those it confirms cleared. Two
            /// conditional updates; what each changed is what it returns.
            async fn settle_reversals(
                tx: &mut txn::Tx<'_>,
                item_id: &str,
                to: $crate::domain::ItemStatus,
                now: Millis,
            ) -> StoreResult<Reversals> {
                const ACTIONS: &str = "applied AND mode = 'enforce' AND outcome = 'ok'";
                let acting = $crate::store::plugins::ACTING_VERDICTS;
                let verdicts: Vec<String> = to.overturned_verdicts().iter().map(|v| format!("'{}'", v.as_str())).collect();
                let mut out = Reversals::default();
                if !verdicts.is_empty() {
                    let overturned: Vec<(String, i64)> = sqlx::query_as(&format!(
                        "UPDATE decisions SET reversed_at = $1 WHERE item_id = $2 AND reversed_at IS NULL \
                         AND {ACTIONS} AND {acting} AND verdict IN ({}) RETURNING plugin, plugin_ref",
                        verdicts.join(", ")
                    ))
                    .bind(now)
                    .bind(item_id)
                    .fetch_all(&mut **tx)
                    .await?;
                    out.overturned = by_plugin_version(tx, overturned).await?;
                }
                let confirmed = match verdicts.is_empty() {
                    true => String::new(),
                    false => format!(" AND verdict NOT IN ({})", verdicts.join(", ")),
                };
                let reinstated: Vec<(String, i64)> = sqlx::query_as(&format!(
                    "UPDATE decisions SET reversed_at = NULL WHERE item_id = $1 AND reversed_at IS NOT NULL{confirmed} \
                     RETURNING plugin, plugin_ref"
                ))
                .bind(item_id)
                .fetch_all(&mut **tx)
                .await?;
                out.reinstated = by_plugin_version(tx, reinstated).await?;
                Ok(out)
            }

            /// Decisions as `(plugin, plugin_ref)` counted by plugin name and
            /// version (one read of the few distinct refs).
            async fn by_plugin_version(
                tx: &mut txn::Tx<'_>,
                decisions: Vec<(String, i64)>,
            ) -> StoreResult<std::collections::BTreeMap<(String, String), u64>> {
                let mut refs: Vec<i64> = decisions.iter().map(|(_, r)| *r).collect();
                refs.sort_unstable();
                refs.dedup();
                let mut versions = std::collections::HashMap::new();
                for chunk in refs.chunks(500) {
                    let sql = format!(
                        "SELECT id, version FROM plugin_refs WHERE id IN ({})",
                        placeholders(1, chunk.len())
                    );
                    let q = chunk.iter().fold(sqlx::query_as::<_, (i64, String)>(&sql), |q, id| q.bind(*id));
                    versions.extend(q.fetch_all(&mut **tx).await?);
                }
                let mut out = std::collections::BTreeMap::new();
                for (plugin, r) in decisions {
                    let version = versions.get(&r).cloned().unwrap_or_default();
                    *out.entry((plugin, version)).or_insert(0) += 1;
                }
                Ok(out)
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

#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn review_cursors_round_trip(at in 0i64..1_000_000_000_000_000_000, id in "[0-9a-zA-Z_-]{1,64}") {
            let c = (at, id);
            prop_assert_eq!(parse_review_cursor(&encode_review_cursor(&c)), Some(c));
        }

        #[test]
        fn any_string_parses_to_a_plausible_cursor_or_none(s in any::<String>()) {
            if let Some((at, id)) = parse_review_cursor(&s) {
                prop_assert!(at >= 0);
                prop_assert!((1..=256).contains(&id.chars().count()) && !id.chars().any(char::is_control));
            }
        }
    }
}
