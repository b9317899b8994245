//! The store: the only source of truth. Two backends behind one trait,
//! SQLite (default, one node) and PostgreSQL (many nodes), sharing their SQL
//! (`sql.rs`); every state change is one conditional write with its audit
//! row in the same transaction.

mod group;
mod postgres;
mod rows;
mod sql;
mod sqlite;

pub use group::{GroupCommit, Writes};
pub use postgres::PgStore;
pub use sqlite::SqliteStore;

use crate::rules::Outcome;
use crate::status::{Actor, ItemStatus};
use crate::verdict::Verdict;
use serde::Serialize;
use std::sync::Arc;

/// A store error. Bad input never gets here: callers validate first.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// The database cannot be reached right now (down, restarting, pool
    /// exhausted). The API answers 503 with `Retry-After`.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// A row the store wrote cannot be read back (a bug, or a hand edit).
    #[error("corrupt row: {0}")]
    Corrupt(String),
    /// Any other database error.
    #[error("database error: {0}")]
    Database(String),
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        use sqlx::Error as E;
        match &e {
            E::PoolTimedOut | E::PoolClosed | E::Io(_) | E::Tls(_) | E::WorkerCrashed => {
                StoreError::Unavailable(e.to_string())
            }
            E::Database(db) => match db.code().as_deref() {
                // PostgreSQL: connection exceptions, shutdown, recovery, too many connections.
                Some(c) if c.starts_with("08") || c.starts_with("57P") || c == "53300" => {
                    StoreError::Unavailable(e.to_string())
                }
                // SQLite: busy/locked (only past the busy timeout), I/O, cannot open.
                Some("5" | "6" | "10" | "14") => StoreError::Unavailable(e.to_string()),
                _ => StoreError::Database(e.to_string()),
            },
            E::ColumnDecode { .. } | E::Decode(_) | E::ColumnNotFound(_) | E::TypeNotFound { .. } => {
                StoreError::Corrupt(e.to_string())
            }
            _ => StoreError::Database(e.to_string()),
        }
    }
}

pub type StoreResult<T> = Result<T, StoreError>;

/// Milliseconds since the Unix epoch.
pub type Millis = i64;

/// The wall clock in [`Millis`].
pub fn now_ms() -> Millis {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Whether a plugin's decisions count (`enforce`) or are only recorded (`shadow`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, serde::Deserialize, Default, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    #[default]
    Enforce,
    Shadow,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Enforce => "enforce",
            Mode::Shadow => "shadow",
        }
    }
}

/// What made a decision: a rule in the submission (`sync`) or evaluation
/// (`async`) phase, or a provider's callback (`provider`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, serde::Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DecisionPhase {
    Sync,
    Async,
    Provider,
}

impl DecisionPhase {
    pub fn as_str(self) -> &'static str {
        match self {
            DecisionPhase::Sync => "sync",
            DecisionPhase::Async => "async",
            DecisionPhase::Provider => "provider",
        }
    }
}

impl From<crate::rules::Phase> for DecisionPhase {
    fn from(p: crate::rules::Phase) -> Self {
        match p {
            crate::rules::Phase::Sync => DecisionPhase::Sync,
            crate::rules::Phase::Async => DecisionPhase::Async,
        }
    }
}

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
    /// duplicate text); later evaluations never settle below it.
    pub sync_verdict: Option<Verdict>,
    /// Set while the item waits for an evaluation; cleared by the commit of
    /// an evaluation that saw every event.
    pub needs_eval_since: Option<Millis>,
    /// Bumped by every event.
    pub event_seq: i64,
    /// `event_seq` as of the last committed evaluation.
    pub evaluated_seq: i64,
    pub created_at: Millis,
    pub updated_at: Millis,
}

/// A new item, as the submission path decided to store it.
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
    /// `pending_scan`, or `held_for_review` / `rejected` when the submission
    /// checks decided at once.
    pub status: ItemStatus,
    pub sync_verdict: Option<Verdict>,
    /// Whether the asynchronous rules still have to judge it.
    pub needs_eval: bool,
    pub cause: String,
    pub reason: String,
    pub correlation_id: String,
    pub now: Millis,
}

/// One submission to store: the item, its sync-phase decisions and (for an
/// idempotent request) the response to keep. See [`ItemStore::create_items`].
#[derive(Debug, Clone)]
pub struct ItemWrite {
    pub item: NewItem,
    pub decisions: Vec<NewDecision>,
    pub response: Option<IdempotencyResponse>,
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
    #[schema(value_type = Option<String>)]
    pub verdict: Option<Verdict>,
    pub score: f64,
    pub labels: Vec<String>,
    pub reason: String,
    pub mode: Mode,
    /// Whether this decision counted towards the item's status.
    pub applied: bool,
    pub duration_us: i64,
    #[schema(value_type = String)]
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
    /// The moderator's name, for manual decisions.
    pub actor_name: Option<String>,
    pub reason: String,
    /// The request id (`X-Request-Id`) or evaluation id that caused it.
    pub correlation_id: String,
    pub created_at: Millis,
}

/// An item with everything `GET /v1/items/{id}` shows.
#[derive(Debug, Clone)]
pub struct ItemDetails {
    pub item: Item,
    pub counters: Vec<(String, i64)>,
    pub decisions: Vec<DecisionRecord>,
    pub transitions: Vec<TransitionRecord>,
    pub provider_requests: Vec<ProviderRequestRecord>,
    pub provider_callbacks: Vec<ProviderCallbackRecord>,
}

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

/// Interaction kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, serde::Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    Upvote,
    Downvote,
    Flag,
    Report,
    Edit,
}

impl EventKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Upvote => "upvote",
            EventKind::Downvote => "downvote",
            EventKind::Flag => "flag",
            EventKind::Report => "report",
            EventKind::Edit => "edit",
        }
    }
}

/// Builds the idempotent response of an event request inside its transaction.
pub type EventResponse = dyn Fn(i64, Millis) -> IdempotencyResponse + Send + Sync;

/// What appending an event did.
#[derive(Debug, Clone, PartialEq)]
pub enum EventOutcome {
    Appended { event_seq: i64, needs_eval_since: Millis },
    NotFound,
    Deleted,
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
    pub actor_name: Option<String>,
    pub cause: String,
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

/// The result of an evaluation, to commit in one transaction.
#[derive(Debug, Clone)]
pub struct EvaluationCommit {
    pub item_id: String,
    /// The item version the snapshot was read at: the fencing token.
    pub snapshot_version: i64,
    /// `event_seq` the snapshot saw; a later event keeps the item scheduled.
    pub snapshot_event_seq: i64,
    pub from: ItemStatus,
    /// The combined verdict's status, `None` to leave the status as it is.
    pub to: Option<ItemStatus>,
    pub decisions: Vec<NewDecision>,
    pub reason: String,
    pub correlation_id: String,
    pub now: Millis,
    /// With `to = awaiting_provider`: the request to store with the
    /// transition (it supersedes the item's outstanding one).
    pub handoff: Option<Handoff>,
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

/// The event id of a transition: the item and the version it created.
pub fn event_id(item_id: &str, version: i64) -> String {
    format!("{item_id}:{version}")
}
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

/// Everything a rule's snapshot is built from, read in one consistent view.
#[derive(Debug, Clone)]
pub struct SnapshotData {
    pub item: Item,
    pub counters: Vec<(String, i64)>,
    pub author_recent_items: i64,
    pub author_rejected_items: i64,
    pub author_held_items: i64,
    pub duplicate_count: i64,
    /// Events since the last evaluation, oldest first, at most 64.
    pub trigger: Vec<(String, String, Millis)>,
}

/// Starting an idempotent request.
#[derive(Debug, Clone, PartialEq)]
pub enum IdempotencyStart {
    /// The key is new (or expired, or abandoned by a crashed request): go ahead.
    Started,
    /// The first request finished: replay its response byte for byte.
    Replay { status: u16, body: String },
    /// The first request is still running.
    InFlight,
    /// The key was used with a different request.
    Mismatch,
}

/// An idempotency key to claim: scope (client), key, hash of the request.
#[derive(Debug, Clone)]
pub struct IdempotencyClaim {
    pub scope: String,
    pub key: String,
    pub request_hash: String,
    pub now: Millis,
    /// A request in flight longer than this is taken to have died.
    pub lock_ms: i64,
    pub ttl_ms: i64,
}

/// The stored response of an idempotent request, written in the same
/// transaction as its effect.
#[derive(Debug, Clone)]
pub struct IdempotencyResponse {
    pub scope: String,
    pub key: String,
    pub status: u16,
    pub body: String,
}

/// What creating an item did.
#[derive(Debug, Clone, PartialEq)]
pub enum CreateOutcome {
    Created(Item),
    /// The client already has an item with this `external_id`.
    DuplicateExternalId {
        existing_id: String,
    },
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

/// A change in which plugin code runs, recorded in `plugin_versions`.
#[derive(Debug, Clone, PartialEq)]
pub enum PluginEvent {
    /// A file was loaded and now serves `name`.
    Loaded {
        name: String,
        version: String,
        digest: String,
        path: String,
        mode: Mode,
        at: Millis,
    },
    /// `name` at `digest` stopped serving (replaced, deleted, or the process stopped).
    Unloaded { name: String, digest: String, at: Millis },
    /// `name` at `digest` was quarantined after repeated failures.
    Quarantined { name: String, digest: String, at: Millis },
    /// A file could not be loaded; whatever served before keeps serving.
    Failed {
        path: String,
        digest: Option<String>,
        error: String,
        at: Millis,
    },
}

/// What one plugin version (digest) has done, over every process.
#[derive(Debug, Clone, Default, PartialEq, Serialize, utoipa::ToSchema)]
pub struct PluginFigures {
    pub evaluations: i64,
    /// Evaluations by outcome (`ok`, `trap`, `timeout`, ...).
    pub outcomes: std::collections::BTreeMap<String, i64>,
    /// Decisions of this version a moderator overturned.
    pub reversals: i64,
    /// `reversals / ok evaluations`, when there were any.
    pub reversal_rate: Option<f64>,
    /// Evaluation duration percentiles over the latest 10,000 evaluations.
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
    pub mode: Option<String>,
    /// `active`, `retired`, `failed` or `quarantined`.
    pub status: String,
    pub error: Option<String>,
    pub loaded_at: Millis,
    pub unloaded_at: Option<Millis>,
}

/// One transition as delivered to the platform: the webhook payload and
/// one entry of `GET /v1/changes`.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct Change {
    /// `ITEM_ID:VERSION`: the same transition always has the same id, so a
    /// receiver deduplicates on it.
    pub event_id: String,
    pub item_id: String,
    pub external_id: Option<String>,
    /// The client token that submitted the item.
    pub client: String,
    pub kind: String,
    /// The item's version after this transition; a receiver ignores an
    /// event whose version is not above the last one it applied.
    pub item_version: i64,
    pub from_status: ItemStatus,
    pub to_status: ItemStatus,
    pub cause: String,
    pub actor: Actor,
    pub reason: String,
    pub correlation_id: String,
    pub occurred_at: Millis,
    /// Position in the changes feed (`after=` resumes behind it).
    pub cursor: String,
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
            txid: txid.parse().ok().filter(|v: &i64| *v >= 0)?,
            seq: seq.parse().ok().filter(|v: &i64| *v >= 0)?,
        })
    }
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
    pub fn accepts(&self, to: ItemStatus, kind: &str) -> bool {
        (self.statuses.is_empty() || self.statuses.contains(&to))
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

/// A delivery as stored.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct DeliveryRecord {
    pub id: i64,
    pub event_id: String,
    pub endpoint: String,
    pub item_id: String,
    pub item_version: i64,
    /// `pending`, `delivered` or `dead`.
    pub status: String,
    pub attempts: i64,
    pub next_attempt_at: Millis,
    pub last_error: Option<String>,
    pub created_at: Millis,
    pub delivered_at: Option<Millis>,
}

/// A provider request claimed for sending, with what the provider is sent.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimedProviderRequest {
    pub key: String,
    pub provider: String,
    pub item_id: String,
    pub item_version: i64,
    /// Including this one.
    pub attempts: i64,
    pub deadline_at: Millis,
    pub kind: String,
    pub text: String,
    /// JSON text.
    pub context: String,
}

/// A provider request as stored.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct ProviderRequestRecord {
    pub key: String,
    pub provider: String,
    pub item_version: i64,
    /// `pending`, `sent`, `answered`, `superseded`, `timed_out` or `cancelled`.
    pub status: String,
    pub attempts: i64,
    pub deadline_at: Millis,
    pub superseded_by: Option<String>,
    pub last_error: Option<String>,
    pub created_at: Millis,
    pub updated_at: Millis,
}

/// A provider callback as stored.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct ProviderCallbackRecord {
    pub id: i64,
    pub provider: String,
    pub event_id: String,
    pub request_key: String,
    /// `applied`, `duplicate`, `stale` or `unknown`.
    pub outcome: String,
    pub detail: String,
    pub received_at: Millis,
}

/// A verified provider callback to store and apply.
#[derive(Debug, Clone)]
pub struct NewCallback {
    pub provider: String,
    pub event_id: String,
    pub request_key: String,
    pub item_id: String,
    /// The raw body, stored as received.
    pub payload: String,
    pub verdict: Verdict,
    pub score: f64,
    pub labels: Vec<String>,
    pub reason: String,
    pub now: Millis,
}

/// What a callback did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallbackOutcome {
    /// Applied: the item moved to `version`.
    Applied { version: i64, attempt: i64 },
    /// This event id was seen before (its first outcome), or its request was
    /// already answered by another event: no effect.
    Duplicate { first: String },
    /// Its request is no longer the item's active one (superseded, timed
    /// out, or the item moved on, e.g. a moderator decided): recorded, no effect.
    Stale { detail: String },
    /// No such request for this provider and item.
    Unknown,
}

/// A provider request that passed its deadline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpiredRequest {
    pub key: String,
    pub item_id: String,
    /// The item moved to `held_for_review` at this version (`None`: it had
    /// moved on already, nothing changed).
    pub version: Option<i64>,
}

/// A position in the review queue: (updated_at, id) of the last item seen.
pub type ReviewCursor = (Millis, String);

/// The store every backend implements. Run the conformance suite in
/// `tests/tests/store.rs` against a new backend.
#[async_trait::async_trait]
pub trait ItemStore: Send + Sync + 'static {
    /// Which backend this is, for logs and `/readyz`.
    fn backend(&self) -> &'static str;

    /// Checks the database answers.
    async fn ping(&self) -> StoreResult<()>;

    /// Claims an idempotency key (unique constraint decides, never a read-then-write).
    async fn idempotency_start(&self, claim: &IdempotencyClaim) -> StoreResult<IdempotencyStart>;

    /// Releases a claimed key whose request failed before doing anything,
    /// so a retry can proceed at once.
    async fn idempotency_release(&self, scope: &str, key: &str) -> StoreResult<()>;

    /// Deletes expired keys; returns how many.
    async fn idempotency_expire(&self, now: Millis) -> StoreResult<u64>;

    /// Items by `author` with `fingerprint` created at or after `since`.
    async fn fingerprint_count(&self, author: &str, fingerprint: &str, since: Millis) -> StoreResult<i64>;

    /// Inserts the item, its creation transition, its sync-phase decisions
    /// and (when given) the idempotent response, in one transaction.
    async fn create_item(
        &self,
        item: &NewItem,
        decisions: &[NewDecision],
        response: Option<&IdempotencyResponse>,
    ) -> StoreResult<CreateOutcome>;

    /// [`create_item`](Self::create_item) for each write, in order, in one
    /// transaction (group commit). A duplicate `external_id` is an outcome,
    /// not an error; any error rolls the whole batch back.
    async fn create_items(&self, batch: &[ItemWrite]) -> StoreResult<Vec<CreateOutcome>>;

    async fn item(&self, id: &str) -> StoreResult<Option<Item>>;

    async fn item_details(&self, id: &str) -> StoreResult<Option<ItemDetails>>;

    /// Appends an event, bumps its counter and marks the item for
    /// evaluation, in one transaction; with `response`, also completes the
    /// idempotency key with the response it builds from (event_seq,
    /// needs_eval_since).
    async fn append_event(&self, event: &NewEvent, response: Option<&EventResponse>) -> StoreResult<EventOutcome>;

    /// A conditional status change with its audit row.
    async fn transition(&self, req: &TransitionRequest) -> StoreResult<Transition>;

    /// Reads what a snapshot needs, in one consistent view.
    async fn snapshot_data(
        &self,
        id: &str,
        author_since: Millis,
        duplicate_since: Millis,
    ) -> StoreResult<Option<SnapshotData>>;

    /// Commits an evaluation (decisions, conditional status change,
    /// transition row, clearing `needs_eval_since`) in one transaction.
    async fn commit_evaluation(&self, commit: &EvaluationCommit) -> StoreResult<CommitOutcome>;

    /// [`commit_evaluation`](Self::commit_evaluation) for each commit, in
    /// order, in one transaction (group commit). A stale commit is an
    /// outcome, not an error; any error rolls the whole batch back.
    async fn commit_evaluations(&self, batch: &[EvaluationCommit]) -> StoreResult<Vec<CommitOutcome>>;

    /// Items waiting for evaluation since before `before`, oldest first.
    async fn pending_evaluations(&self, before: Millis, limit: i64) -> StoreResult<Vec<String>>;

    /// Held items, oldest first, after `cursor`.
    async fn review_queue(&self, after: Option<&ReviewCursor>, limit: i64) -> StoreResult<Vec<Item>>;

    /// Marks an item for evaluation (a moderator's "re-evaluate now");
    /// `false` if it does not exist or is deleted.
    async fn request_evaluation(&self, id: &str, now: Millis) -> StoreResult<bool>;

    /// Records that evaluating `item_id` failed in the host `attempts` times;
    /// `false` if it already has an open dead letter. The item leaves the
    /// reconciler's view until the dead letter is replayed.
    async fn dead_letter(&self, item_id: &str, attempts: i64, last_error: &str, now: Millis) -> StoreResult<bool>;

    /// Dead letters, newest first; open ones only unless `all`.
    async fn dead_letters(&self, all: bool, limit: i64) -> StoreResult<Vec<DeadLetter>>;

    /// Records a plugin load, unload, quarantine or failed load for `node`.
    async fn record_plugin_event(&self, node: &str, event: &PluginEvent) -> StoreResult<()>;

    /// Evaluations, outcomes, reversals and duration percentiles of the
    /// plugin version with `digest`.
    async fn plugin_figures(&self, digest: &str) -> StoreResult<PluginFigures>;

    /// `plugin_versions`, newest first.
    async fn plugin_history(&self, limit: i64) -> StoreResult<Vec<PluginVersionRecord>>;

    /// Marks a dead letter replayed (and its item pending) and returns the
    /// item, which the caller queues; `None` if unknown or already replayed.
    async fn replay_dead_letter(&self, id: i64, now: Millis) -> StoreResult<Option<String>>;

    /// Creates the deliveries of up to `limit` outbox events not fanned out
    /// yet, one per accepting endpoint; returns how many events it handled.
    async fn fan_out(&self, endpoints: &[EndpointFilter], now: Millis, limit: i64) -> StoreResult<usize>;

    /// Claims due deliveries until `lease_until` (a process
    /// that dies mid-send leaves them to be retried then). A delivery is
    /// due only when no earlier version of its item is still pending for
    /// the same endpoint.
    async fn claim_deliveries(&self, now: Millis, lease_until: Millis, limit: i64)
    -> StoreResult<Vec<ClaimedDelivery>>;

    /// Marks a delivery delivered.
    async fn delivery_succeeded(&self, id: i64, now: Millis) -> StoreResult<()>;

    /// Records a failed attempt: retried at `retry_at`, or dead when `None`.
    async fn delivery_failed(&self, id: i64, error: &str, retry_at: Option<Millis>) -> StoreResult<()>;

    /// Deliveries, newest first: dead ones only unless `all`.
    async fn deliveries(&self, all: bool, limit: i64) -> StoreResult<Vec<DeliveryRecord>>;

    /// Makes a dead delivery pending again; `false` if unknown or not dead.
    async fn replay_delivery(&self, id: i64, now: Millis) -> StoreResult<bool>;

    /// Transitions in commit order after `after`, for every client or one.
    async fn changes(&self, client: Option<&str>, after: ChangeCursor, limit: i64) -> StoreResult<Vec<Change>>;

    /// Claims provider requests due to be sent (new, or retrying) until `lease_until`.
    async fn claim_provider_requests(
        &self,
        now: Millis,
        lease_until: Millis,
        limit: i64,
    ) -> StoreResult<Vec<ClaimedProviderRequest>>;

    /// The provider accepted the request: now waiting for its callback.
    async fn provider_request_sent(&self, key: &str, now: Millis) -> StoreResult<()>;

    /// Sending failed: retried at `retry_at` with the same key.
    async fn provider_request_failed(&self, key: &str, error: &str, retry_at: Millis, now: Millis) -> StoreResult<()>;

    /// Stores a verified callback and applies it when its request is the
    /// item's active one, in one transaction.
    async fn apply_callback(&self, cb: &NewCallback) -> StoreResult<CallbackOutcome>;

    /// Times out up to `limit` requests past their deadline: each item still
    /// waiting on one goes to `held_for_review` (cause `provider_timeout`).
    async fn expire_provider_requests(&self, now: Millis, limit: i64) -> StoreResult<Vec<ExpiredRequest>>;
}

/// A shared store handle.
pub type SharedStore = Arc<dyn ItemStore>;

/// Opens the store a URL names (`sqlite://PATH` or `postgres://...`) and
/// runs its migrations.
pub async fn open(url: &str, max_connections: u32) -> anyhow::Result<SharedStore> {
    if url.starts_with("sqlite:") {
        Ok(Arc::new(SqliteStore::open(url, max_connections).await?))
    } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
        Ok(Arc::new(PgStore::open(url, max_connections).await?))
    } else {
        anyhow::bail!("unsupported database URL {url:?}: use sqlite://PATH or postgres://...")
    }
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
        .filter(|d| d.item_version == latest && d.verdict.map(crate::judge::status_for) == Some(item.status))
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

/// A moderator's decision. Reads the item, then applies a conditional
/// transition; a concurrent automated change makes it re-read and retry
/// (a manual decision wins), unless the caller pinned a version with
/// `If-Match`, which then answers `VersionMismatch`.
pub async fn moderate(
    store: &dyn ItemStore,
    id: &str,
    to: ItemStatus,
    if_match: Option<i64>,
    moderator: &str,
    reason: &str,
    correlation_id: &str,
) -> StoreResult<ModerationOutcome> {
    const ATTEMPTS: usize = 8;
    for _ in 0..ATTEMPTS {
        let Some(details) = store.item_details(id).await? else {
            return Ok(ModerationOutcome::NotFound);
        };
        let item = &details.item;
        if let Some(expected) = if_match
            && expected != item.version
        {
            return Ok(ModerationOutcome::VersionMismatch { current: item.version });
        }
        if !crate::status::can_transition(item.status, to, Actor::Moderator) {
            return Ok(ModerationOutcome::Illegal { from: item.status });
        }
        let req = TransitionRequest {
            item_id: id.to_string(),
            expected_version: item.version,
            from: item.status,
            to,
            actor: Actor::Moderator,
            actor_name: Some(moderator.to_string()),
            cause: "moderation".into(),
            reason: reason.to_string(),
            correlation_id: correlation_id.to_string(),
            now: now_ms(),
            reversed_decisions: overturned(&details, to),
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
        if if_match.is_some() {
            let current = store.item(id).await?.map_or(item.version, |i| i.version);
            return Ok(ModerationOutcome::VersionMismatch { current });
        }
    }
    Err(StoreError::Database(format!(
        "item {id} kept changing; moderation not applied after {ATTEMPTS} attempts"
    )))
}
