//! The SQL both backends run. Every statement exists once, written with
//! `$N` parameters, which SQLite and PostgreSQL both accept; `impl_store!`
//! instantiates the same method bodies for each backend's sqlx types.

pub(super) const ITEM_COLUMNS: &str = "id, client, external_id, kind, author, body, context, fingerprint, status, \
     version, decided_by, sync_verdict, needs_eval_since, event_seq, evaluated_seq, created_at, updated_at";

pub(super) const INSERT_ITEM: &str = "INSERT INTO items (id, client, external_id, kind, author, body, context, \
     fingerprint, status, version, decided_by, sync_verdict, needs_eval_since, created_at, updated_at) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 1, $10, $11, $12, $13, $13) \
     ON CONFLICT (client, external_id) DO NOTHING";

pub(super) const ITEM_BY_EXTERNAL_ID: &str = "SELECT id FROM items WHERE client = $1 AND external_id = $2";

pub(super) const INSERT_TRANSITION: &str = "INSERT INTO transitions (item_id, from_status, to_status, version, \
     cause, actor, actor_name, reason, correlation_id, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)";

/// `INSERT INTO decisions` of `rows` rows, 16 parameters each.
pub(super) fn insert_decisions_sql(rows: usize) -> String {
    let mut sql = String::from(
        "INSERT INTO decisions (item_id, item_version, plugin, plugin_version, plugin_digest, phase, verdict, \
         score, labels, reason, mode, applied, duration_us, outcome, error, created_at) VALUES ",
    );
    for r in 0..rows {
        let p: Vec<String> = (1..=16).map(|c| format!("${}", r * 16 + c)).collect();
        if r > 0 {
            sql.push_str(", ");
        }
        sql.push('(');
        sql.push_str(&p.join(", "));
        sql.push(')');
    }
    sql
}

pub(super) const IDEMPOTENCY_INSERT: &str = "INSERT INTO idempotency_keys (scope, key, request_hash, state, \
     locked_until, created_at, expires_at) VALUES ($1, $2, $3, 'in_flight', $4, $5, $6) \
     ON CONFLICT (scope, key) DO NOTHING";

/// Takes over a key that expired, or whose first request died in flight
/// (same request, lock passed).
pub(super) const IDEMPOTENCY_TAKE_OVER: &str = "UPDATE idempotency_keys SET request_hash = $3, state = 'in_flight', \
     locked_until = $4, created_at = $5, expires_at = $6, response_status = NULL, response_body = NULL \
     WHERE scope = $1 AND key = $2 \
     AND (expires_at <= $5 OR (state = 'in_flight' AND locked_until <= $5 AND request_hash = $3))";

pub(super) const IDEMPOTENCY_READ: &str = "SELECT request_hash, state, response_status, response_body \
     FROM idempotency_keys WHERE scope = $1 AND key = $2";

pub(super) const IDEMPOTENCY_DONE: &str = "UPDATE idempotency_keys SET state = 'done', response_status = $3, \
     response_body = $4 WHERE scope = $1 AND key = $2";

pub(super) const IDEMPOTENCY_RELEASE: &str =
    "DELETE FROM idempotency_keys WHERE scope = $1 AND key = $2 AND state = 'in_flight'";

pub(super) const IDEMPOTENCY_EXPIRE: &str = "DELETE FROM idempotency_keys WHERE expires_at <= $1";

pub(super) const FINGERPRINT_COUNT: &str =
    "SELECT COUNT(*) FROM items WHERE author = $1 AND fingerprint = $2 AND created_at >= $3";

pub(super) const EVENT_BUMP: &str = "UPDATE items SET event_seq = event_seq + 1, \
     needs_eval_since = COALESCE(needs_eval_since, $2) WHERE id = $1 AND status <> 'deleted' \
     RETURNING event_seq, needs_eval_since";

pub(super) const EVENT_EDIT: &str = "UPDATE items SET body = $2, fingerprint = $3 WHERE id = $1";

pub(super) const ITEM_STATUS: &str = "SELECT status FROM items WHERE id = $1";

pub(super) const INSERT_EVENT: &str =
    "INSERT INTO events (item_id, seq, kind, actor, payload, created_at) VALUES ($1, $2, $3, $4, $5, $6)";

pub(super) const COUNTER_BUMP: &str = "INSERT INTO counters (item_id, name, value) VALUES ($1, $2, 1) \
     ON CONFLICT (item_id, name) DO UPDATE SET value = counters.value + 1";

/// A manual transition: fenced by version and status only.
pub(super) const TRANSITION_MANUAL: &str = "UPDATE items SET status = $1, version = version + 1, decided_by = $2, \
     updated_at = $3 WHERE id = $4 AND version = $5 AND status = $6 RETURNING version";

/// An automated transition: also refused once a moderator decided.
pub(super) const TRANSITION_AUTOMATED: &str = "UPDATE items SET status = $1, version = version + 1, \
     decided_by = $2, updated_at = $3 WHERE id = $4 AND version = $5 AND status = $6 \
     AND (decided_by IS NULL OR decided_by <> 'moderator') RETURNING version";

/// An evaluation that changes the status. `needs_eval_since` is cleared only
/// if no event arrived after the snapshot.
pub(super) const COMMIT_TRANSITION: &str = "UPDATE items SET status = $1, version = version + 1, \
     decided_by = 'rules', updated_at = $2, \
     needs_eval_since = CASE WHEN event_seq = $3 THEN NULL ELSE needs_eval_since END, \
     evaluated_seq = CASE WHEN evaluated_seq > $3 THEN evaluated_seq ELSE $3 END \
     WHERE id = $4 AND version = $5 AND status = $6 \
     AND (decided_by IS NULL OR decided_by <> 'moderator') RETURNING version";

/// An evaluation that leaves the status as it is.
pub(super) const COMMIT_RECORD: &str = "UPDATE items SET \
     needs_eval_since = CASE WHEN event_seq = $1 THEN NULL ELSE needs_eval_since END, \
     evaluated_seq = CASE WHEN evaluated_seq > $1 THEN evaluated_seq ELSE $1 END \
     WHERE id = $2 AND version = $3";

pub(super) const COUNTERS: &str = "SELECT name, value FROM counters WHERE item_id = $1 ORDER BY name";

pub(super) const DECISIONS: &str = "SELECT id, item_version, plugin, plugin_version, plugin_digest, phase, verdict, \
     score, labels, reason, mode, applied, duration_us, outcome, error, created_at, reversed_at \
     FROM decisions WHERE item_id = $1 ORDER BY id";

pub(super) const MARK_REVERSED: &str = "UPDATE decisions SET reversed_at = $2 WHERE id = $1 AND reversed_at IS NULL";

pub(super) const TRANSITIONS: &str = "SELECT id, item_id, from_status, to_status, version, cause, actor, actor_name, \
     reason, correlation_id, created_at FROM transitions WHERE item_id = $1 ORDER BY id";

pub(super) const AUTHOR_RECENT: &str = "SELECT COUNT(*) FROM items WHERE author = $1 AND created_at >= $2 AND id <> $3";

pub(super) const AUTHOR_STANDING: &str = "SELECT \
     COALESCE(SUM(CASE WHEN status = 'rejected' THEN 1 ELSE 0 END), 0), \
     COALESCE(SUM(CASE WHEN status = 'held_for_review' THEN 1 ELSE 0 END), 0) \
     FROM items WHERE author = $1 AND id <> $2";

pub(super) const DUPLICATES: &str = "SELECT COUNT(*) FROM items WHERE author = $1 AND fingerprint = $2 \
     AND created_at >= $3 AND id <> $4";

pub(super) const TRIGGER_EVENTS: &str = "SELECT kind, actor, created_at FROM events \
     WHERE item_id = $1 AND seq > $2 ORDER BY seq DESC LIMIT 64";

pub(super) const PENDING: &str = "SELECT id FROM items WHERE needs_eval_since IS NOT NULL \
     AND needs_eval_since <= $1 AND NOT EXISTS (SELECT 1 FROM dead_letters d \
     WHERE d.item_id = items.id AND d.replayed_at IS NULL) ORDER BY needs_eval_since LIMIT $2";

pub(super) const REQUEST_EVALUATION: &str = "UPDATE items SET needs_eval_since = COALESCE(needs_eval_since, $2) \
     WHERE id = $1 AND status <> 'deleted'";

pub(super) const DEAD_LETTER: &str = "INSERT INTO dead_letters (item_id, attempts, last_error, failed_at) \
     VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING";

pub(super) const DEAD_LETTERS_OPEN: &str = "SELECT id, item_id, attempts, last_error, failed_at, replayed_at \
     FROM dead_letters WHERE replayed_at IS NULL ORDER BY id DESC LIMIT $1";

pub(super) const DEAD_LETTERS_ALL: &str = "SELECT id, item_id, attempts, last_error, failed_at, replayed_at \
     FROM dead_letters ORDER BY id DESC LIMIT $1";

pub(super) const DEAD_LETTER_REPLAY: &str =
    "UPDATE dead_letters SET replayed_at = $2 WHERE id = $1 AND replayed_at IS NULL RETURNING item_id";

pub(super) const PLUGIN_LOADED: &str = "INSERT INTO plugin_versions (node, name, version, digest, path, mode, \
     status, loaded_at) VALUES ($1, $2, $3, $4, $5, $6, 'active', $7)";

pub(super) const PLUGIN_UNLOADED: &str = "UPDATE plugin_versions SET status = CASE WHEN status = 'quarantined' \
     THEN status ELSE 'retired' END, unloaded_at = $4 \
     WHERE node = $1 AND name = $2 AND digest = $3 AND unloaded_at IS NULL AND status <> 'failed'";

pub(super) const PLUGIN_QUARANTINED: &str = "UPDATE plugin_versions SET status = 'quarantined' \
     WHERE node = $1 AND name = $2 AND digest = $3 AND unloaded_at IS NULL AND status = 'active'";

pub(super) const PLUGIN_FAILED: &str = "INSERT INTO plugin_versions (node, digest, path, status, error, loaded_at, \
     unloaded_at) VALUES ($1, $2, $3, 'failed', $4, $5, $5)";

pub(super) const PLUGIN_HISTORY: &str = "SELECT id, node, name, version, digest, path, mode, status, error, \
     loaded_at, unloaded_at FROM plugin_versions ORDER BY id DESC LIMIT $1";

pub(super) const FIGURES_BY_OUTCOME: &str = "SELECT outcome, COUNT(*), \
     COALESCE(SUM(CASE WHEN reversed_at IS NOT NULL THEN 1 ELSE 0 END), 0) \
     FROM decisions WHERE plugin_digest = $1 GROUP BY outcome";

pub(super) const RECENT_DURATIONS: &str =
    "SELECT duration_us FROM decisions WHERE plugin_digest = $1 ORDER BY id DESC LIMIT 10000";

pub(super) const ITEM_BY_ID: &str = "WHERE id = $1";

pub(super) const REVIEW_FIRST: &str = "WHERE status = 'held_for_review' ORDER BY updated_at, id LIMIT $1";

pub(super) const REVIEW_AFTER: &str = "WHERE status = 'held_for_review' \
     AND (updated_at > $1 OR (updated_at = $1 AND id > $2)) ORDER BY updated_at, id LIMIT $3";

/// Cheap reads that tell the background loops whether a write transaction
/// (which on SQLite takes the one write lock) has anything to do.
pub(super) const PEEK_UNFANNED: &str = "SELECT 1 FROM outbox WHERE NOT fanned_out LIMIT 1";
pub(super) const PEEK_DUE_DELIVERY: &str =
    "SELECT 1 FROM deliveries WHERE status = 'pending' AND next_attempt_at <= $1 LIMIT 1";
pub(super) const PEEK_DUE_REQUEST: &str = "SELECT 1 FROM provider_requests WHERE status = 'pending' \
     AND next_attempt_at <= $1 AND deadline_at > $1 LIMIT 1";
pub(super) const PEEK_EXPIRED_REQUEST: &str = "SELECT 1 FROM provider_requests \
     WHERE status IN ('pending', 'sent') AND deadline_at <= $1 LIMIT 1";
/// With no endpoint to deliver to, events are only marked (in one statement).
pub(super) const MARK_ALL_FANNED_OUT: &str = "UPDATE outbox SET fanned_out = TRUE WHERE NOT fanned_out";

pub(super) const CHANGE_COLUMNS: &str = "seq, txid, event_id, item_id, external_id, client, kind, item_version, \
     from_status, to_status, cause, actor, reason, correlation_id, created_at";

pub(super) const INSERT_DELIVERY: &str = "INSERT INTO deliveries (event_id, endpoint, item_id, item_version, status, \
     next_attempt_at, created_at) SELECT event_id, $2, item_id, item_version, 'pending', $3, $3 FROM outbox \
     WHERE event_id = $1 ON CONFLICT (event_id, endpoint) DO NOTHING";

pub(super) const MARK_FANNED_OUT: &str = "UPDATE outbox SET fanned_out = TRUE WHERE seq = $1";

pub(super) const DELIVERY_SUCCEEDED: &str = "UPDATE deliveries SET status = 'delivered', delivered_at = $2, \
     last_error = NULL WHERE id = $1 AND status = 'pending'";

pub(super) const DELIVERY_RETRY: &str =
    "UPDATE deliveries SET next_attempt_at = $2, last_error = $3 WHERE id = $1 AND status = 'pending'";

pub(super) const DELIVERY_DEAD: &str =
    "UPDATE deliveries SET status = 'dead', last_error = $2 WHERE id = $1 AND status = 'pending'";

pub(super) const DELIVERY_COLUMNS: &str = "id, event_id, endpoint, item_id, item_version, status, attempts, \
     next_attempt_at, last_error, created_at, delivered_at";

pub(super) const DELIVERY_REPLAY: &str = "UPDATE deliveries SET status = 'pending', attempts = 0, \
     next_attempt_at = $2 WHERE id = $1 AND status = 'dead'";

pub(super) const SUPERSEDE_REQUESTS: &str = "UPDATE provider_requests SET status = 'superseded', superseded_by = $2, \
     updated_at = $3 WHERE item_id = $1 AND status IN ('pending', 'sent')";

pub(super) const CANCEL_REQUESTS: &str = "UPDATE provider_requests SET status = 'cancelled', updated_at = $2 \
     WHERE item_id = $1 AND status IN ('pending', 'sent')";

pub(super) const INSERT_REQUEST: &str = "INSERT INTO provider_requests (key, provider, item_id, item_version, status, \
     next_attempt_at, deadline_at, created_at, updated_at) VALUES ($1, $2, $3, $4, 'pending', $5, $6, $5, $5)";

pub(super) const REQUEST_ITEM: &str = "SELECT kind, body, context FROM items WHERE id = $1";

pub(super) const REQUEST_SENT: &str = "UPDATE provider_requests SET status = 'sent', last_error = NULL, \
     updated_at = $2 WHERE key = $1 AND status = 'pending'";

pub(super) const REQUEST_FAILED: &str = "UPDATE provider_requests SET next_attempt_at = $2, last_error = $3, \
     updated_at = $4 WHERE key = $1 AND status = 'pending'";

pub(super) const INSERT_CALLBACK: &str = "INSERT INTO provider_callbacks (provider, event_id, request_key, item_id, \
     payload, received_at, outcome) VALUES ($1, $2, $3, $4, $5, $6, 'unknown') \
     ON CONFLICT (provider, event_id) DO NOTHING RETURNING id";

pub(super) const CALLBACK_SEEN: &str =
    "SELECT outcome, detail FROM provider_callbacks WHERE provider = $1 AND event_id = $2";

/// A provider's answer: only while the item still waits at the version the
/// request was made for (anything since bumped the version).
pub(super) const PROVIDER_TRANSITION: &str = "UPDATE items SET status = $1, version = version + 1, \
     decided_by = 'provider', updated_at = $2 WHERE id = $3 AND version = $4 AND status = 'awaiting_provider' \
     AND (decided_by IS NULL OR decided_by <> 'moderator') RETURNING version";

pub(super) const REQUEST_ANSWERED: &str =
    "UPDATE provider_requests SET status = 'answered', updated_at = $2 WHERE key = $1";

pub(super) const CALLBACK_OUTCOME: &str =
    "UPDATE provider_callbacks SET outcome = $2, detail = $3, processed_at = $4 WHERE id = $1";

pub(super) const REQUEST_TIMED_OUT: &str = "UPDATE provider_requests SET status = 'timed_out', updated_at = $2 \
     WHERE key = $1 AND status IN ('pending', 'sent')";

pub(super) const PROVIDER_REQUESTS_OF: &str = "SELECT key, provider, item_version, status, attempts, deadline_at, \
     superseded_by, last_error, created_at, updated_at FROM provider_requests WHERE item_id = $1 \
     ORDER BY created_at, key";

pub(super) const PROVIDER_CALLBACKS_OF: &str = "SELECT id, provider, event_id, request_key, outcome, detail, \
     received_at FROM provider_callbacks WHERE item_id = $1 ORDER BY id";

/// Instantiates `ItemStore` for one backend. `$store` has fields `write`
/// and `read` (pools); `$begin` opens a write transaction.
/// `lock` is appended to the SELECTs that claim work (`FOR UPDATE SKIP
/// LOCKED` on PostgreSQL, nothing on SQLite's single writer), `row_lock` to
/// those that must wait for a row (`FOR UPDATE`); `horizon` is
/// the changes feed's extra condition (see the outbox migration).
macro_rules! impl_store {
    ($store:ty, $db:ty, $row:ty, $backend:literal, lock = $lock:literal, row_lock = $row_lock:literal,
     horizon = $horizon:literal, |$s:ident| $begin:expr) => {
        use sqlx::Row as _;
        use $crate::store::rows;
        use $crate::store::sql::*;
        use $crate::store::*;

        /// The request a callback names, locked: concurrent callbacks of one
        /// request are decided one after the other.
        const CALLBACK_REQUEST: &str = concat!(
            "SELECT status, item_version, attempts FROM provider_requests ",
            "WHERE key = $1 AND provider = $2 AND item_id = $3",
            $row_lock
        );
        const FAN_OUT: &str = concat!(
            "SELECT seq, event_id, to_status, kind FROM outbox WHERE NOT fanned_out ORDER BY seq LIMIT $1",
            $lock
        );
        /// Due deliveries whose item has no earlier version pending for the
        /// same endpoint, nor an earlier event not fanned out yet.
        const CLAIM_DELIVERIES: &str = concat!(
            "UPDATE deliveries SET next_attempt_at = $2, attempts = attempts + 1 WHERE id IN (",
            "SELECT d.id FROM deliveries d WHERE d.status = 'pending' AND d.next_attempt_at <= $1 ",
            "AND NOT EXISTS (SELECT 1 FROM deliveries e WHERE e.endpoint = d.endpoint AND e.item_id = d.item_id ",
            "AND e.status = 'pending' AND e.item_version < d.item_version) ",
            "AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.item_id = d.item_id ",
            "AND o.item_version < d.item_version AND NOT o.fanned_out) ",
            "ORDER BY d.next_attempt_at, d.id LIMIT $3",
            $lock,
            ") RETURNING id, event_id, endpoint, attempts"
        );
        const CLAIM_REQUESTS: &str = concat!(
            "UPDATE provider_requests SET next_attempt_at = $2, attempts = attempts + 1, updated_at = $1 ",
            "WHERE key IN (SELECT key FROM provider_requests WHERE status = 'pending' AND next_attempt_at <= $1 ",
            "AND deadline_at > $1 ORDER BY next_attempt_at LIMIT $3",
            $lock,
            ") RETURNING key, provider, item_id, item_version, attempts, deadline_at"
        );
        const EXPIRED_REQUESTS: &str = concat!(
            "SELECT key, item_id, item_version FROM provider_requests WHERE status IN ('pending', 'sent') ",
            "AND deadline_at <= $1 ORDER BY deadline_at LIMIT $2",
            $lock
        );
        const CHANGES_ALL: &str = concat!(
            "SELECT seq, txid, event_id, item_id, external_id, client, kind, item_version, from_status, to_status, ",
            "cause, actor, reason, correlation_id, created_at FROM outbox ",
            "WHERE (txid > $1 OR (txid = $1 AND seq > $2))",
            $horizon,
            " ORDER BY txid, seq LIMIT $3"
        );
        const CHANGES_CLIENT: &str = concat!(
            "SELECT seq, txid, event_id, item_id, external_id, client, kind, item_version, from_status, to_status, ",
            "cause, actor, reason, correlation_id, created_at FROM outbox ",
            "WHERE client = $4 AND (txid > $1 OR (txid = $1 AND seq > $2))",
            $horizon,
            " ORDER BY txid, seq LIMIT $3"
        );

        fn change_from_row(row: &$row) -> StoreResult<Change> {
            Ok(Change {
                event_id: row.try_get("event_id")?,
                item_id: row.try_get("item_id")?,
                external_id: row.try_get("external_id")?,
                client: row.try_get("client")?,
                kind: row.try_get("kind")?,
                item_version: row.try_get("item_version")?,
                from_status: rows::status(row.try_get::<&str, _>("from_status")?)?,
                to_status: rows::status(row.try_get::<&str, _>("to_status")?)?,
                cause: row.try_get("cause")?,
                actor: rows::actor(row.try_get::<&str, _>("actor")?)?,
                reason: row.try_get("reason")?,
                correlation_id: row.try_get("correlation_id")?,
                occurred_at: row.try_get("created_at")?,
                cursor: ChangeCursor {
                    txid: row.try_get("txid")?,
                    seq: row.try_get("seq")?,
                }
                .encode(),
            })
        }

        fn delivery_from_row(row: &$row) -> StoreResult<DeliveryRecord> {
            Ok(DeliveryRecord {
                id: row.try_get("id")?,
                event_id: row.try_get("event_id")?,
                endpoint: row.try_get("endpoint")?,
                item_id: row.try_get("item_id")?,
                item_version: row.try_get("item_version")?,
                status: row.try_get("status")?,
                attempts: row.try_get::<i32, _>("attempts")?.into(),
                next_attempt_at: row.try_get("next_attempt_at")?,
                last_error: row.try_get("last_error")?,
                created_at: row.try_get("created_at")?,
                delivered_at: row.try_get("delivered_at")?,
            })
        }

        /// Supersedes or cancels the item's outstanding provider request
        /// after a transition to `version`, and stores the new one of a hand-off.
        async fn settle_provider_requests(
            tx: &mut sqlx::Transaction<'_, $db>,
            item_id: &str,
            from: crate::status::ItemStatus,
            version: i64,
            handoff: Option<&Handoff>,
            now: Millis,
        ) -> StoreResult<()> {
            match handoff {
                Some(h) => {
                    let key = provider_request_key(item_id, version, &h.provider);
                    sqlx::query(SUPERSEDE_REQUESTS)
                        .bind(item_id)
                        .bind(&key)
                        .bind(now)
                        .execute(&mut **tx)
                        .await?;
                    sqlx::query(INSERT_REQUEST)
                        .bind(&key)
                        .bind(&h.provider)
                        .bind(item_id)
                        .bind(version)
                        .bind(now)
                        .bind(h.deadline_at)
                        .execute(&mut **tx)
                        .await?;
                }
                None if from == crate::status::ItemStatus::AwaitingProvider => {
                    sqlx::query(CANCEL_REQUESTS)
                        .bind(item_id)
                        .bind(now)
                        .execute(&mut **tx)
                        .await?;
                }
                None => {}
            }
            Ok(())
        }

        fn item_from_row(row: &$row) -> StoreResult<Item> {
            Ok(Item {
                id: row.try_get("id")?,
                client: row.try_get("client")?,
                external_id: row.try_get("external_id")?,
                kind: row.try_get("kind")?,
                author: row.try_get("author")?,
                body: row.try_get("body")?,
                context: row.try_get("context")?,
                fingerprint: row.try_get("fingerprint")?,
                status: rows::status(row.try_get::<&str, _>("status")?)?,
                version: row.try_get("version")?,
                decided_by: rows::opt(row.try_get("decided_by")?, rows::actor)?,
                sync_verdict: rows::opt(row.try_get("sync_verdict")?, rows::verdict)?,
                needs_eval_since: row.try_get("needs_eval_since")?,
                event_seq: row.try_get("event_seq")?,
                evaluated_seq: row.try_get("evaluated_seq")?,
                created_at: row.try_get("created_at")?,
                updated_at: row.try_get("updated_at")?,
            })
        }

        fn decision_from_row(row: &$row) -> StoreResult<DecisionRecord> {
            Ok(DecisionRecord {
                id: row.try_get("id")?,
                item_version: row.try_get("item_version")?,
                plugin: row.try_get("plugin")?,
                plugin_version: row.try_get("plugin_version")?,
                plugin_digest: row.try_get("plugin_digest")?,
                phase: rows::phase(row.try_get::<&str, _>("phase")?)?,
                verdict: rows::opt(row.try_get("verdict")?, rows::verdict)?,
                score: row.try_get("score")?,
                labels: rows::labels(row.try_get::<&str, _>("labels")?)?,
                reason: row.try_get("reason")?,
                mode: rows::mode(row.try_get::<&str, _>("mode")?)?,
                applied: row.try_get("applied")?,
                duration_us: row.try_get("duration_us")?,
                outcome: rows::outcome(row.try_get::<&str, _>("outcome")?)?,
                error: row.try_get("error")?,
                created_at: row.try_get("created_at")?,
                reversed_at: row.try_get("reversed_at")?,
            })
        }

        fn transition_from_row(row: &$row) -> StoreResult<TransitionRecord> {
            Ok(TransitionRecord {
                id: row.try_get("id")?,
                item_id: row.try_get("item_id")?,
                from_status: rows::status(row.try_get::<&str, _>("from_status")?)?,
                to_status: rows::status(row.try_get::<&str, _>("to_status")?)?,
                version: row.try_get("version")?,
                cause: row.try_get("cause")?,
                actor: rows::actor(row.try_get::<&str, _>("actor")?)?,
                actor_name: row.try_get("actor_name")?,
                reason: row.try_get("reason")?,
                correlation_id: row.try_get("correlation_id")?,
                created_at: row.try_get("created_at")?,
            })
        }

        async fn insert_transition(
            tx: &mut sqlx::Transaction<'_, $db>,
            item_id: &str,
            from: crate::status::ItemStatus,
            to: crate::status::ItemStatus,
            version: i64,
            cause: &str,
            actor: crate::status::Actor,
            actor_name: Option<&str>,
            reason: &str,
            correlation_id: &str,
            now: Millis,
        ) -> StoreResult<()> {
            sqlx::query(INSERT_TRANSITION)
                .bind(item_id)
                .bind(from.as_str())
                .bind(to.as_str())
                .bind(version)
                .bind(cause)
                .bind(actor.as_str())
                .bind(actor_name)
                .bind(reason)
                .bind(correlation_id)
                .bind(now)
                .execute(&mut **tx)
                .await?;
            // Its outbox row is written by the `transitions_outbox` trigger.
            Ok(())
        }

        async fn insert_decisions(
            tx: &mut sqlx::Transaction<'_, $db>,
            item_id: &str,
            item_version: i64,
            decisions: &[NewDecision],
        ) -> StoreResult<()> {
            if decisions.is_empty() {
                return Ok(());
            }
            // One statement for all of them: one round trip to the database.
            let sql = insert_decisions_sql(decisions.len());
            let mut query = sqlx::query(&sql);
            for d in decisions {
                let labels = serde_json::to_string(&d.labels).expect("a list of strings serializes");
                query = query
                    .bind(item_id)
                    .bind(item_version)
                    .bind(&d.plugin)
                    .bind(&d.plugin_version)
                    .bind(&d.plugin_digest)
                    .bind(d.phase.as_str())
                    .bind(d.verdict.map(|v| v.as_str()))
                    .bind(d.score)
                    .bind(labels)
                    .bind(&d.reason)
                    .bind(d.mode.as_str())
                    .bind(d.applied)
                    .bind(d.duration_us)
                    .bind(d.outcome.as_str())
                    .bind(d.error.as_deref())
                    .bind(d.decided_at);
            }
            query.execute(&mut **tx).await?;
            Ok(())
        }

        /// The item and its counters, in the caller's transaction.
        async fn read_item(
            tx: &mut sqlx::Transaction<'_, $db>,
            id: &str,
        ) -> StoreResult<Option<(Item, Vec<(String, i64)>)>> {
            let Some(row) = sqlx::query(&format!("SELECT {ITEM_COLUMNS} FROM items {ITEM_BY_ID}"))
                .bind(id)
                .fetch_optional(&mut **tx)
                .await?
            else {
                return Ok(None);
            };
            let item = item_from_row(&row)?;
            let counters = sqlx::query_as::<_, (String, i64)>(COUNTERS)
                .bind(id)
                .fetch_all(&mut **tx)
                .await?;
            Ok(Some((item, counters)))
        }

        /// Inserts one item with its creation transition, sync decisions and
        /// idempotent response in the caller's transaction. A duplicate
        /// `external_id` writes nothing, so a batch can go on past it.
        async fn create_in(
            tx: &mut sqlx::Transaction<'_, $db>,
            item: &NewItem,
            decisions: &[NewDecision],
            response: Option<&IdempotencyResponse>,
        ) -> StoreResult<CreateOutcome> {
            let inserted = sqlx::query(INSERT_ITEM)
                .bind(&item.id)
                .bind(&item.client)
                .bind(item.external_id.as_deref())
                .bind(&item.kind)
                .bind(&item.author)
                .bind(&item.body)
                .bind(&item.context)
                .bind(&item.fingerprint)
                .bind(item.status.as_str())
                .bind((item.status != crate::status::ItemStatus::PendingScan).then_some("system"))
                .bind(item.sync_verdict.map(|v| v.as_str()))
                .bind(item.needs_eval.then_some(item.now))
                .bind(item.now)
                .execute(&mut **tx)
                .await?
                .rows_affected();
            if inserted == 0 {
                let existing_id: String = sqlx::query_scalar(ITEM_BY_EXTERNAL_ID)
                    .bind(&item.client)
                    .bind(item.external_id.as_deref())
                    .fetch_one(&mut **tx)
                    .await?;
                // Nothing was written: the caller's transaction goes on.
                return Ok(CreateOutcome::DuplicateExternalId { existing_id });
            }
            insert_transition(
                tx,
                &item.id,
                crate::status::ItemStatus::Received,
                item.status,
                1,
                &item.cause,
                crate::status::Actor::System,
                None,
                &item.reason,
                &item.correlation_id,
                item.now,
            )
            .await?;
            insert_decisions(tx, &item.id, 1, decisions).await?;
            if let Some(r) = response {
                complete_idempotency(tx, r).await?;
            }
            let created = Item {
                id: item.id.clone(),
                client: item.client.clone(),
                external_id: item.external_id.clone(),
                kind: item.kind.clone(),
                author: item.author.clone(),
                body: item.body.clone(),
                context: item.context.clone(),
                fingerprint: item.fingerprint.clone(),
                status: item.status,
                version: 1,
                decided_by: (item.status != crate::status::ItemStatus::PendingScan)
                    .then_some(crate::status::Actor::System),
                sync_verdict: item.sync_verdict,
                needs_eval_since: item.needs_eval.then_some(item.now),
                event_seq: 0,
                evaluated_seq: 0,
                created_at: item.now,
                updated_at: item.now,
            };
            Ok(CreateOutcome::Created(created))
        }

        /// Commits one evaluation in the caller's transaction: a conditional
        /// write fenced by version (and status), then its decisions. A stale
        /// evaluation writes nothing, so a batch can go on past it.
        async fn commit_in(tx: &mut sqlx::Transaction<'_, $db>, c: &EvaluationCommit) -> StoreResult<CommitOutcome> {
            let outcome = match c.to {
                Some(to) => {
                    let version: Option<i64> = sqlx::query_scalar(COMMIT_TRANSITION)
                        .bind(to.as_str())
                        .bind(c.now)
                        .bind(c.snapshot_event_seq)
                        .bind(&c.item_id)
                        .bind(c.snapshot_version)
                        .bind(c.from.as_str())
                        .fetch_optional(&mut **tx)
                        .await?;
                    match version {
                        Some(version) => {
                            insert_transition(
                                tx,
                                &c.item_id,
                                c.from,
                                to,
                                version,
                                "evaluation",
                                crate::status::Actor::Rules,
                                None,
                                &c.reason,
                                &c.correlation_id,
                                c.now,
                            )
                            .await?;
                            let handoff = c
                                .handoff
                                .as_ref()
                                .filter(|_| to == crate::status::ItemStatus::AwaitingProvider);
                            settle_provider_requests(tx, &c.item_id, c.from, version, handoff, c.now).await?;
                            CommitOutcome::Transitioned { version }
                        }
                        None => CommitOutcome::Stale,
                    }
                }
                None => {
                    let updated = sqlx::query(COMMIT_RECORD)
                        .bind(c.snapshot_event_seq)
                        .bind(&c.item_id)
                        .bind(c.snapshot_version)
                        .execute(&mut **tx)
                        .await?
                        .rows_affected();
                    if updated == 1 {
                        CommitOutcome::Recorded
                    } else {
                        CommitOutcome::Stale
                    }
                }
            };
            if outcome != CommitOutcome::Stale {
                insert_decisions(tx, &c.item_id, c.snapshot_version, &c.decisions).await?;
            }
            Ok(outcome)
        }

        /// Stores an idempotent request's response in its effect's transaction.
        async fn complete_idempotency(tx: &mut sqlx::Transaction<'_, $db>, r: &IdempotencyResponse) -> StoreResult<()> {
            sqlx::query(IDEMPOTENCY_DONE)
                .bind(&r.scope)
                .bind(&r.key)
                .bind(i32::from(r.status))
                .bind(&r.body)
                .execute(&mut **tx)
                .await?;
            Ok(())
        }

        #[async_trait::async_trait]
        impl ItemStore for $store {
            fn backend(&self) -> &'static str {
                $backend
            }

            async fn ping(&self) -> StoreResult<()> {
                sqlx::query("SELECT 1").execute(&self.read).await?;
                Ok(())
            }

            async fn idempotency_start(&self, c: &IdempotencyClaim) -> StoreResult<IdempotencyStart> {
                let $s = self;
                let mut tx = $begin.await?;
                let inserted = sqlx::query(IDEMPOTENCY_INSERT)
                    .bind(&c.scope)
                    .bind(&c.key)
                    .bind(&c.request_hash)
                    .bind(c.now + c.lock_ms)
                    .bind(c.now)
                    .bind(c.now + c.ttl_ms)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                let started = inserted == 1
                    || sqlx::query(IDEMPOTENCY_TAKE_OVER)
                        .bind(&c.scope)
                        .bind(&c.key)
                        .bind(&c.request_hash)
                        .bind(c.now + c.lock_ms)
                        .bind(c.now)
                        .bind(c.now + c.ttl_ms)
                        .execute(&mut *tx)
                        .await?
                        .rows_affected()
                        == 1;
                if started {
                    tx.commit().await?;
                    return Ok(IdempotencyStart::Started);
                }
                let row = sqlx::query(IDEMPOTENCY_READ)
                    .bind(&c.scope)
                    .bind(&c.key)
                    .fetch_optional(&mut *tx)
                    .await?;
                tx.commit().await?;
                let Some(row) = row else {
                    // Deleted by expiry between the two statements: a retry starts afresh.
                    return Ok(IdempotencyStart::InFlight);
                };
                let hash: String = row.try_get("request_hash")?;
                let state: String = row.try_get("state")?;
                if hash != c.request_hash {
                    return Ok(IdempotencyStart::Mismatch);
                }
                if state != "done" {
                    return Ok(IdempotencyStart::InFlight);
                }
                let status: i32 = row.try_get("response_status")?;
                let body: String = row.try_get("response_body")?;
                Ok(IdempotencyStart::Replay {
                    status: u16::try_from(status)
                        .map_err(|_| StoreError::Corrupt(format!("response status {status}")))?,
                    body,
                })
            }

            async fn idempotency_release(&self, scope: &str, key: &str) -> StoreResult<()> {
                sqlx::query(IDEMPOTENCY_RELEASE)
                    .bind(scope)
                    .bind(key)
                    .execute(&self.write)
                    .await?;
                Ok(())
            }

            async fn idempotency_expire(&self, now: Millis) -> StoreResult<u64> {
                Ok(sqlx::query(IDEMPOTENCY_EXPIRE)
                    .bind(now)
                    .execute(&self.write)
                    .await?
                    .rows_affected())
            }

            async fn fingerprint_count(&self, author: &str, fingerprint: &str, since: Millis) -> StoreResult<i64> {
                Ok(sqlx::query_scalar(FINGERPRINT_COUNT)
                    .bind(author)
                    .bind(fingerprint)
                    .bind(since)
                    .fetch_one(&self.read)
                    .await?)
            }

            async fn create_item(
                &self,
                item: &NewItem,
                decisions: &[NewDecision],
                response: Option<&IdempotencyResponse>,
            ) -> StoreResult<CreateOutcome> {
                let $s = self;
                let mut tx = $begin.await?;
                let outcome = create_in(&mut tx, item, decisions, response).await?;
                tx.commit().await?;
                Ok(outcome)
            }

            async fn create_items(&self, batch: &[ItemWrite]) -> StoreResult<Vec<CreateOutcome>> {
                let $s = self;
                let mut tx = $begin.await?;
                let mut outcomes = Vec::with_capacity(batch.len());
                for w in batch {
                    outcomes.push(create_in(&mut tx, &w.item, &w.decisions, w.response.as_ref()).await?);
                }
                tx.commit().await?;
                Ok(outcomes)
            }

            async fn item(&self, id: &str) -> StoreResult<Option<Item>> {
                let row = sqlx::query(&format!("SELECT {ITEM_COLUMNS} FROM items {ITEM_BY_ID}"))
                    .bind(id)
                    .fetch_optional(&self.read)
                    .await?;
                row.as_ref().map(item_from_row).transpose()
            }

            async fn item_details(&self, id: &str) -> StoreResult<Option<ItemDetails>> {
                let mut tx = self.read.begin().await?;
                let Some((item, counters)) = read_item(&mut tx, id).await? else {
                    return Ok(None);
                };
                let decisions = sqlx::query(DECISIONS)
                    .bind(id)
                    .fetch_all(&mut *tx)
                    .await?
                    .iter()
                    .map(decision_from_row)
                    .collect::<StoreResult<Vec<_>>>()?;
                let transitions = sqlx::query(TRANSITIONS)
                    .bind(id)
                    .fetch_all(&mut *tx)
                    .await?
                    .iter()
                    .map(transition_from_row)
                    .collect::<StoreResult<Vec<_>>>()?;
                let provider_requests = sqlx::query(PROVIDER_REQUESTS_OF)
                    .bind(id)
                    .fetch_all(&mut *tx)
                    .await?
                    .iter()
                    .map(|r| {
                        Ok(ProviderRequestRecord {
                            key: r.try_get("key")?,
                            provider: r.try_get("provider")?,
                            item_version: r.try_get("item_version")?,
                            status: r.try_get("status")?,
                            attempts: r.try_get::<i32, _>("attempts")?.into(),
                            deadline_at: r.try_get("deadline_at")?,
                            superseded_by: r.try_get("superseded_by")?,
                            last_error: r.try_get("last_error")?,
                            created_at: r.try_get("created_at")?,
                            updated_at: r.try_get("updated_at")?,
                        })
                    })
                    .collect::<StoreResult<Vec<_>>>()?;
                let provider_callbacks = sqlx::query(PROVIDER_CALLBACKS_OF)
                    .bind(id)
                    .fetch_all(&mut *tx)
                    .await?
                    .iter()
                    .map(|r| {
                        Ok(ProviderCallbackRecord {
                            id: r.try_get("id")?,
                            provider: r.try_get("provider")?,
                            event_id: r.try_get("event_id")?,
                            request_key: r.try_get("request_key")?,
                            outcome: r.try_get("outcome")?,
                            detail: r.try_get("detail")?,
                            received_at: r.try_get("received_at")?,
                        })
                    })
                    .collect::<StoreResult<Vec<_>>>()?;
                tx.commit().await?;
                Ok(Some(ItemDetails {
                    item,
                    counters,
                    decisions,
                    transitions,
                    provider_requests,
                    provider_callbacks,
                }))
            }

            async fn append_event(&self, e: &NewEvent, response: Option<&EventResponse>) -> StoreResult<EventOutcome> {
                let $s = self;
                let mut tx = $begin.await?;
                let bumped = sqlx::query_as::<_, (i64, Option<i64>)>(EVENT_BUMP)
                    .bind(&e.item_id)
                    .bind(e.now)
                    .fetch_optional(&mut *tx)
                    .await?;
                let Some((seq, since)) = bumped else {
                    let status: Option<String> = sqlx::query_scalar(ITEM_STATUS)
                        .bind(&e.item_id)
                        .fetch_optional(&mut *tx)
                        .await?;
                    tx.rollback().await?;
                    return Ok(if status.is_some() {
                        EventOutcome::Deleted
                    } else {
                        EventOutcome::NotFound
                    });
                };
                if let (Some(text), Some(fingerprint)) = (&e.text, &e.fingerprint) {
                    sqlx::query(EVENT_EDIT)
                        .bind(&e.item_id)
                        .bind(text)
                        .bind(fingerprint)
                        .execute(&mut *tx)
                        .await?;
                }
                sqlx::query(INSERT_EVENT)
                    .bind(&e.item_id)
                    .bind(seq)
                    .bind(e.kind.as_str())
                    .bind(&e.actor)
                    .bind(e.text.as_deref())
                    .bind(e.now)
                    .execute(&mut *tx)
                    .await?;
                sqlx::query(COUNTER_BUMP)
                    .bind(&e.item_id)
                    .bind(e.kind.as_str())
                    .execute(&mut *tx)
                    .await?;
                let since = since.unwrap_or(e.now);
                if let Some(respond) = response {
                    complete_idempotency(&mut tx, &respond(seq, since)).await?;
                }
                tx.commit().await?;
                Ok(EventOutcome::Appended {
                    event_seq: seq,
                    needs_eval_since: since,
                })
            }

            async fn transition(&self, r: &TransitionRequest) -> StoreResult<Transition> {
                let $s = self;
                let mut tx = $begin.await?;
                let sql = if r.actor.is_automated() {
                    TRANSITION_AUTOMATED
                } else {
                    TRANSITION_MANUAL
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
                insert_transition(
                    &mut tx,
                    &r.item_id,
                    r.from,
                    r.to,
                    version,
                    &r.cause,
                    r.actor,
                    r.actor_name.as_deref(),
                    &r.reason,
                    &r.correlation_id,
                    r.now,
                )
                .await?;
                for id in &r.reversed_decisions {
                    sqlx::query(MARK_REVERSED)
                        .bind(*id)
                        .bind(r.now)
                        .execute(&mut *tx)
                        .await?;
                }
                settle_provider_requests(&mut tx, &r.item_id, r.from, version, None, r.now).await?;
                tx.commit().await?;
                Ok(Transition::Applied { version })
            }

            async fn snapshot_data(
                &self,
                id: &str,
                author_since: Millis,
                duplicate_since: Millis,
            ) -> StoreResult<Option<SnapshotData>> {
                let mut tx = self.read.begin().await?;
                let Some((item, counters)) = read_item(&mut tx, id).await? else {
                    return Ok(None);
                };
                let author_recent_items: i64 = sqlx::query_scalar(AUTHOR_RECENT)
                    .bind(&item.author)
                    .bind(author_since)
                    .bind(id)
                    .fetch_one(&mut *tx)
                    .await?;
                let (author_rejected_items, author_held_items) = sqlx::query_as::<_, (i64, i64)>(AUTHOR_STANDING)
                    .bind(&item.author)
                    .bind(id)
                    .fetch_one(&mut *tx)
                    .await?;
                let duplicate_count: i64 = sqlx::query_scalar(DUPLICATES)
                    .bind(&item.author)
                    .bind(&item.fingerprint)
                    .bind(duplicate_since)
                    .bind(id)
                    .fetch_one(&mut *tx)
                    .await?;
                let mut trigger = sqlx::query_as::<_, (String, String, i64)>(TRIGGER_EVENTS)
                    .bind(id)
                    .bind(item.evaluated_seq)
                    .fetch_all(&mut *tx)
                    .await?;
                trigger.reverse();
                tx.commit().await?;
                Ok(Some(SnapshotData {
                    item,
                    counters,
                    author_recent_items,
                    author_rejected_items,
                    author_held_items,
                    duplicate_count,
                    trigger,
                }))
            }

            async fn commit_evaluation(&self, c: &EvaluationCommit) -> StoreResult<CommitOutcome> {
                let $s = self;
                let mut tx = $begin.await?;
                let outcome = commit_in(&mut tx, c).await?;
                tx.commit().await?;
                Ok(outcome)
            }

            async fn commit_evaluations(&self, batch: &[EvaluationCommit]) -> StoreResult<Vec<CommitOutcome>> {
                let $s = self;
                let mut tx = $begin.await?;
                let mut outcomes = Vec::with_capacity(batch.len());
                for c in batch {
                    outcomes.push(commit_in(&mut tx, c).await?);
                }
                tx.commit().await?;
                Ok(outcomes)
            }

            async fn pending_evaluations(&self, before: Millis, limit: i64) -> StoreResult<Vec<String>> {
                Ok(sqlx::query_scalar(PENDING)
                    .bind(before)
                    .bind(limit)
                    .fetch_all(&self.read)
                    .await?)
            }

            async fn request_evaluation(&self, id: &str, now: Millis) -> StoreResult<bool> {
                let $s = self;
                let mut tx = $begin.await?;
                let n = sqlx::query(REQUEST_EVALUATION)
                    .bind(id)
                    .bind(now)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                tx.commit().await?;
                Ok(n == 1)
            }

            async fn dead_letter(
                &self,
                item_id: &str,
                attempts: i64,
                last_error: &str,
                now: Millis,
            ) -> StoreResult<bool> {
                let $s = self;
                let mut tx = $begin.await?;
                let n = sqlx::query(DEAD_LETTER)
                    .bind(item_id)
                    .bind(attempts)
                    .bind(last_error)
                    .bind(now)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                tx.commit().await?;
                Ok(n == 1)
            }

            async fn dead_letters(&self, all: bool, limit: i64) -> StoreResult<Vec<DeadLetter>> {
                let sql = if all { DEAD_LETTERS_ALL } else { DEAD_LETTERS_OPEN };
                let rows = sqlx::query_as::<_, (i64, String, i64, String, i64, Option<i64>)>(sql)
                    .bind(limit)
                    .fetch_all(&self.read)
                    .await?;
                Ok(rows
                    .into_iter()
                    .map(
                        |(id, item_id, attempts, last_error, failed_at, replayed_at)| DeadLetter {
                            id,
                            item_id,
                            attempts,
                            last_error,
                            failed_at,
                            replayed_at,
                        },
                    )
                    .collect())
            }

            async fn record_plugin_event(&self, node: &str, event: &PluginEvent) -> StoreResult<()> {
                let $s = self;
                let mut tx = $begin.await?;
                match event {
                    PluginEvent::Loaded {
                        name,
                        version,
                        digest,
                        path,
                        mode,
                        at,
                    } => {
                        sqlx::query(PLUGIN_LOADED)
                            .bind(node)
                            .bind(name)
                            .bind(version)
                            .bind(digest)
                            .bind(path)
                            .bind(mode.as_str())
                            .bind(*at)
                            .execute(&mut *tx)
                            .await?;
                    }
                    PluginEvent::Unloaded { name, digest, at } => {
                        sqlx::query(PLUGIN_UNLOADED)
                            .bind(node)
                            .bind(name)
                            .bind(digest)
                            .bind(*at)
                            .execute(&mut *tx)
                            .await?;
                    }
                    PluginEvent::Quarantined { name, digest, .. } => {
                        sqlx::query(PLUGIN_QUARANTINED)
                            .bind(node)
                            .bind(name)
                            .bind(digest)
                            .execute(&mut *tx)
                            .await?;
                    }
                    PluginEvent::Failed {
                        path,
                        digest,
                        error,
                        at,
                    } => {
                        sqlx::query(PLUGIN_FAILED)
                            .bind(node)
                            .bind(digest.as_deref())
                            .bind(path)
                            .bind(error)
                            .bind(*at)
                            .execute(&mut *tx)
                            .await?;
                    }
                }
                tx.commit().await?;
                Ok(())
            }

            async fn plugin_figures(&self, digest: &str) -> StoreResult<PluginFigures> {
                let rows = sqlx::query_as::<_, (String, i64, i64)>(FIGURES_BY_OUTCOME)
                    .bind(digest)
                    .fetch_all(&self.read)
                    .await?;
                let mut durations: Vec<i64> = sqlx::query_scalar(RECENT_DURATIONS)
                    .bind(digest)
                    .fetch_all(&self.read)
                    .await?;
                durations.sort_unstable();
                let percentile = |p: usize| (!durations.is_empty()).then(|| durations[(durations.len() - 1) * p / 100]);
                let mut f = PluginFigures {
                    p50_us: percentile(50),
                    p99_us: percentile(99),
                    ..PluginFigures::default()
                };
                for (outcome, count, reversed) in rows {
                    f.evaluations += count;
                    f.reversals += reversed;
                    f.outcomes.insert(outcome, count);
                }
                let ok = f.outcomes.get("ok").copied().unwrap_or(0);
                f.reversal_rate = (ok > 0).then(|| f.reversals as f64 / ok as f64);
                Ok(f)
            }

            async fn plugin_history(&self, limit: i64) -> StoreResult<Vec<PluginVersionRecord>> {
                let rows = sqlx::query(PLUGIN_HISTORY)
                    .bind(limit)
                    .fetch_all(&self.read)
                    .await?;
                rows.iter()
                    .map(|r| {
                        Ok(PluginVersionRecord {
                            id: r.try_get("id")?,
                            node: r.try_get("node")?,
                            name: r.try_get("name")?,
                            version: r.try_get("version")?,
                            digest: r.try_get("digest")?,
                            path: r.try_get("path")?,
                            mode: r.try_get("mode")?,
                            status: r.try_get("status")?,
                            error: r.try_get("error")?,
                            loaded_at: r.try_get("loaded_at")?,
                            unloaded_at: r.try_get("unloaded_at")?,
                        })
                    })
                    .collect()
            }

            async fn replay_dead_letter(&self, id: i64, now: Millis) -> StoreResult<Option<String>> {
                let $s = self;
                let mut tx = $begin.await?;
                let item: Option<String> = sqlx::query_scalar(DEAD_LETTER_REPLAY)
                    .bind(id)
                    .bind(now)
                    .fetch_optional(&mut *tx)
                    .await?;
                if let Some(item) = &item {
                    sqlx::query(REQUEST_EVALUATION)
                        .bind(item)
                        .bind(now)
                        .execute(&mut *tx)
                        .await?;
                }
                tx.commit().await?;
                Ok(item)
            }

            async fn review_queue(&self, after: Option<&ReviewCursor>, limit: i64) -> StoreResult<Vec<Item>> {
                let rows = match after {
                    None => {
                        sqlx::query(&format!("SELECT {ITEM_COLUMNS} FROM items {REVIEW_FIRST}"))
                            .bind(limit)
                            .fetch_all(&self.read)
                            .await?
                    }
                    Some((at, id)) => {
                        sqlx::query(&format!("SELECT {ITEM_COLUMNS} FROM items {REVIEW_AFTER}"))
                            .bind(*at)
                            .bind(id)
                            .bind(limit)
                            .fetch_all(&self.read)
                            .await?
                    }
                };
                rows.iter().map(item_from_row).collect()
            }

            async fn fan_out(&self, endpoints: &[EndpointFilter], now: Millis, limit: i64) -> StoreResult<usize> {
                if sqlx::query(PEEK_UNFANNED)
                    .fetch_optional(&self.read)
                    .await?
                    .is_none()
                {
                    return Ok(0);
                }
                let $s = self;
                let mut tx = $begin.await?;
                if endpoints.is_empty() {
                    let n = sqlx::query(MARK_ALL_FANNED_OUT)
                        .execute(&mut *tx)
                        .await?
                        .rows_affected();
                    tx.commit().await?;
                    return Ok(n as usize);
                }
                let events = sqlx::query_as::<_, (i64, String, String, String)>(FAN_OUT)
                    .bind(limit)
                    .fetch_all(&mut *tx)
                    .await?;
                for (seq, event_id, to_status, kind) in &events {
                    let to = rows::status(to_status)?;
                    for e in endpoints.iter().filter(|e| e.accepts(to, kind)) {
                        sqlx::query(INSERT_DELIVERY)
                            .bind(event_id)
                            .bind(&e.name)
                            .bind(now)
                            .execute(&mut *tx)
                            .await?;
                    }
                    sqlx::query(MARK_FANNED_OUT).bind(*seq).execute(&mut *tx).await?;
                }
                tx.commit().await?;
                Ok(events.len())
            }

            async fn claim_deliveries(
                &self,
                now: Millis,
                lease_until: Millis,
                limit: i64,
            ) -> StoreResult<Vec<ClaimedDelivery>> {
                if sqlx::query(PEEK_DUE_DELIVERY)
                    .bind(now)
                    .fetch_optional(&self.read)
                    .await?
                    .is_none()
                {
                    return Ok(Vec::new());
                }
                let $s = self;
                let mut tx = $begin.await?;
                let claimed = sqlx::query_as::<_, (i64, String, String, i32)>(CLAIM_DELIVERIES)
                    .bind(now)
                    .bind(lease_until)
                    .bind(limit)
                    .fetch_all(&mut *tx)
                    .await?;
                let mut out = Vec::with_capacity(claimed.len());
                for (id, event_id, endpoint, attempts) in claimed {
                    let row = sqlx::query(&format!(
                        "SELECT {CHANGE_COLUMNS} FROM outbox WHERE event_id = $1"
                    ))
                    .bind(&event_id)
                    .fetch_one(&mut *tx)
                    .await?;
                    out.push(ClaimedDelivery {
                        id,
                        endpoint,
                        attempts: attempts.into(),
                        change: change_from_row(&row)?,
                    });
                }
                tx.commit().await?;
                Ok(out)
            }

            async fn delivery_succeeded(&self, id: i64, now: Millis) -> StoreResult<()> {
                let $s = self;
                let mut tx = $begin.await?;
                sqlx::query(DELIVERY_SUCCEEDED)
                    .bind(id)
                    .bind(now)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
                Ok(())
            }

            async fn delivery_failed(&self, id: i64, error: &str, retry_at: Option<Millis>) -> StoreResult<()> {
                let $s = self;
                let mut tx = $begin.await?;
                match retry_at {
                    Some(at) => sqlx::query(DELIVERY_RETRY).bind(id).bind(at).bind(error),
                    None => sqlx::query(DELIVERY_DEAD).bind(id).bind(error),
                }
                .execute(&mut *tx)
                .await?;
                tx.commit().await?;
                Ok(())
            }

            async fn deliveries(&self, all: bool, limit: i64) -> StoreResult<Vec<DeliveryRecord>> {
                let filter = if all { "" } else { "WHERE status = 'dead' " };
                sqlx::query(&format!(
                    "SELECT {DELIVERY_COLUMNS} FROM deliveries {filter}ORDER BY id DESC LIMIT $1"
                ))
                .bind(limit)
                .fetch_all(&self.read)
                .await?
                .iter()
                .map(delivery_from_row)
                .collect()
            }

            async fn replay_delivery(&self, id: i64, now: Millis) -> StoreResult<bool> {
                let $s = self;
                let mut tx = $begin.await?;
                let n = sqlx::query(DELIVERY_REPLAY)
                    .bind(id)
                    .bind(now)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                tx.commit().await?;
                Ok(n == 1)
            }

            async fn changes(&self, client: Option<&str>, after: ChangeCursor, limit: i64) -> StoreResult<Vec<Change>> {
                let query = match client {
                    None => sqlx::query(CHANGES_ALL)
                        .bind(after.txid)
                        .bind(after.seq)
                        .bind(limit),
                    Some(c) => sqlx::query(CHANGES_CLIENT)
                        .bind(after.txid)
                        .bind(after.seq)
                        .bind(limit)
                        .bind(c),
                };
                query
                    .fetch_all(&self.read)
                    .await?
                    .iter()
                    .map(change_from_row)
                    .collect()
            }

            async fn claim_provider_requests(
                &self,
                now: Millis,
                lease_until: Millis,
                limit: i64,
            ) -> StoreResult<Vec<ClaimedProviderRequest>> {
                if sqlx::query(PEEK_DUE_REQUEST)
                    .bind(now)
                    .fetch_optional(&self.read)
                    .await?
                    .is_none()
                {
                    return Ok(Vec::new());
                }
                let $s = self;
                let mut tx = $begin.await?;
                let claimed = sqlx::query_as::<_, (String, String, String, i64, i32, i64)>(CLAIM_REQUESTS)
                    .bind(now)
                    .bind(lease_until)
                    .bind(limit)
                    .fetch_all(&mut *tx)
                    .await?;
                let mut out = Vec::with_capacity(claimed.len());
                for (key, provider, item_id, item_version, attempts, deadline_at) in claimed {
                    let (kind, text, context) = sqlx::query_as::<_, (String, String, String)>(REQUEST_ITEM)
                        .bind(&item_id)
                        .fetch_one(&mut *tx)
                        .await?;
                    out.push(ClaimedProviderRequest {
                        key,
                        provider,
                        item_id,
                        item_version,
                        attempts: attempts.into(),
                        deadline_at,
                        kind,
                        text,
                        context,
                    });
                }
                tx.commit().await?;
                Ok(out)
            }

            async fn provider_request_sent(&self, key: &str, now: Millis) -> StoreResult<()> {
                let $s = self;
                let mut tx = $begin.await?;
                sqlx::query(REQUEST_SENT)
                    .bind(key)
                    .bind(now)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
                Ok(())
            }

            async fn provider_request_failed(
                &self,
                key: &str,
                error: &str,
                retry_at: Millis,
                now: Millis,
            ) -> StoreResult<()> {
                let $s = self;
                let mut tx = $begin.await?;
                sqlx::query(REQUEST_FAILED)
                    .bind(key)
                    .bind(retry_at)
                    .bind(error)
                    .bind(now)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
                Ok(())
            }

            async fn apply_callback(&self, cb: &NewCallback) -> StoreResult<CallbackOutcome> {
                let $s = self;
                let mut tx = $begin.await?;
                // The raw payload is stored first; a repeat of the event id stops here.
                let inserted: Option<i64> = sqlx::query_scalar(INSERT_CALLBACK)
                    .bind(&cb.provider)
                    .bind(&cb.event_id)
                    .bind(&cb.request_key)
                    .bind(&cb.item_id)
                    .bind(&cb.payload)
                    .bind(cb.now)
                    .fetch_optional(&mut *tx)
                    .await?;
                let Some(callback_id) = inserted else {
                    let (first, _detail) = sqlx::query_as::<_, (String, String)>(CALLBACK_SEEN)
                        .bind(&cb.provider)
                        .bind(&cb.event_id)
                        .fetch_one(&mut *tx)
                        .await?;
                    tx.commit().await?;
                    return Ok(if first == "unknown" {
                        CallbackOutcome::Unknown
                    } else {
                        CallbackOutcome::Duplicate { first }
                    });
                };
                let request = sqlx::query_as::<_, (String, i64, i32)>(CALLBACK_REQUEST)
                    .bind(&cb.request_key)
                    .bind(&cb.provider)
                    .bind(&cb.item_id)
                    .fetch_optional(&mut *tx)
                    .await?;
                let record = |outcome: &'static str, detail: String| {
                    sqlx::query(CALLBACK_OUTCOME)
                        .bind(callback_id)
                        .bind(outcome)
                        .bind(detail)
                        .bind(cb.now)
                };
                let Some((status, item_version, attempts)) = request else {
                    record("unknown", "no such request for this provider and item".into())
                        .execute(&mut *tx)
                        .await?;
                    tx.commit().await?;
                    return Ok(CallbackOutcome::Unknown);
                };
                let outcome = match status.as_str() {
                    "pending" | "sent" => {
                        let to = crate::judge::status_for(cb.verdict);
                        let version: Option<i64> = sqlx::query_scalar(PROVIDER_TRANSITION)
                            .bind(to.as_str())
                            .bind(cb.now)
                            .bind(&cb.item_id)
                            .bind(item_version)
                            .fetch_optional(&mut *tx)
                            .await?;
                        match version {
                            Some(version) => {
                                let correlation = format!(
                                    "request={} attempt={attempts} event={}",
                                    cb.request_key, cb.event_id
                                );
                                insert_transition(
                                    &mut tx,
                                    &cb.item_id,
                                    crate::status::ItemStatus::AwaitingProvider,
                                    to,
                                    version,
                                    "provider_callback",
                                    crate::status::Actor::Provider,
                                    Some(&cb.provider),
                                    &format!("{} by {}: {}", cb.verdict, cb.provider, cb.reason),
                                    &correlation,
                                    cb.now,
                                )
                                .await?;
                                let decision = NewDecision {
                                    plugin: cb.provider.clone(),
                                    plugin_version: "callback".into(),
                                    plugin_digest: crate::rules::Digest::of(cb.payload.as_bytes()).to_hex(),
                                    phase: DecisionPhase::Provider,
                                    verdict: Some(cb.verdict),
                                    score: cb.score,
                                    labels: cb.labels.clone(),
                                    reason: cb.reason.clone(),
                                    mode: Mode::Enforce,
                                    applied: true,
                                    duration_us: 0,
                                    outcome: crate::rules::Outcome::Ok,
                                    error: None,
                                    decided_at: cb.now,
                                };
                                insert_decisions(
                                    &mut tx,
                                    &cb.item_id,
                                    item_version,
                                    std::slice::from_ref(&decision),
                                )
                                .await?;
                                sqlx::query(REQUEST_ANSWERED)
                                    .bind(&cb.request_key)
                                    .bind(cb.now)
                                    .execute(&mut *tx)
                                    .await?;
                                record("applied", format!("{} -> {to} at version {version}", cb.verdict))
                                    .execute(&mut *tx)
                                    .await?;
                                CallbackOutcome::Applied {
                                    version,
                                    attempt: attempts.into(),
                                }
                            }
                            None => {
                                let detail =
                                    "the item moved on since the request (a moderator or a newer evaluation decided)";
                                record("stale", detail.into()).execute(&mut *tx).await?;
                                CallbackOutcome::Stale {
                                    detail: detail.into(),
                                }
                            }
                        }
                    }
                    "answered" => {
                        record(
                            "duplicate",
                            "the request was already answered by another event".into(),
                        )
                        .execute(&mut *tx)
                        .await?;
                        CallbackOutcome::Duplicate {
                            first: "answered".into(),
                        }
                    }
                    other => {
                        let detail = format!("the request is {other}");
                        record("stale", detail.clone()).execute(&mut *tx).await?;
                        CallbackOutcome::Stale { detail }
                    }
                };
                tx.commit().await?;
                Ok(outcome)
            }

            async fn expire_provider_requests(&self, now: Millis, limit: i64) -> StoreResult<Vec<ExpiredRequest>> {
                if sqlx::query(PEEK_EXPIRED_REQUEST)
                    .bind(now)
                    .fetch_optional(&self.read)
                    .await?
                    .is_none()
                {
                    return Ok(Vec::new());
                }
                let $s = self;
                let mut tx = $begin.await?;
                let due = sqlx::query_as::<_, (String, String, i64)>(EXPIRED_REQUESTS)
                    .bind(now)
                    .bind(limit)
                    .fetch_all(&mut *tx)
                    .await?;
                let mut out = Vec::with_capacity(due.len());
                for (key, item_id, item_version) in due {
                    let timed_out = sqlx::query(REQUEST_TIMED_OUT)
                        .bind(&key)
                        .bind(now)
                        .execute(&mut *tx)
                        .await?
                        .rows_affected();
                    if timed_out == 0 {
                        continue;
                    }
                    let to = crate::status::ItemStatus::HeldForReview;
                    let version: Option<i64> = sqlx::query_scalar(TRANSITION_AUTOMATED)
                        .bind(to.as_str())
                        .bind(crate::status::Actor::System.as_str())
                        .bind(now)
                        .bind(&item_id)
                        .bind(item_version)
                        .bind(crate::status::ItemStatus::AwaitingProvider.as_str())
                        .fetch_optional(&mut *tx)
                        .await?;
                    if let Some(version) = version {
                        insert_transition(
                            &mut tx,
                            &item_id,
                            crate::status::ItemStatus::AwaitingProvider,
                            to,
                            version,
                            "provider_timeout",
                            crate::status::Actor::System,
                            None,
                            &format!("no answer to request {key} before its deadline; a human decides"),
                            &format!("request={key}"),
                            now,
                        )
                        .await?;
                    }
                    out.push(ExpiredRequest {
                        key,
                        item_id,
                        version,
                    });
                }
                tx.commit().await?;
                Ok(out)
            }
        }
    };
}

pub(super) use impl_store;
