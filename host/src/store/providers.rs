//! Hand-offs to external classifiers: requests (one active per item, keyed
//! per logical operation), their callbacks (stored raw before they are
//! applied, applied only while their request is the item's active one) and
//! their deadlines. Every path that changes an item locks the item first,
//! then its requests, as moderation and evaluation do, so they never
//! deadlock on PostgreSQL.

use super::StoreResult;
use crate::clock::Millis;
use crate::domain::{CallbackResult, ProviderRequestStatus, Verdict};
use serde::Serialize;

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
    pub status: ProviderRequestStatus,
    pub attempts: i64,
    pub deadline_at: Millis,
    pub superseded_by: Option<String>,
    pub last_error: Option<String>,
    pub created_at: Millis,
    pub updated_at: Millis,
    /// The provider's verdict, once answered.
    pub answer: Option<Verdict>,
}

/// A provider callback as stored.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct ProviderCallbackRecord {
    pub id: i64,
    pub provider: String,
    pub event_id: String,
    pub request_key: String,
    pub outcome: CallbackResult,
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
    /// Whether the verdict weighs against the item's author under the
    /// standing policy (see [`NewDecision::weighs`]).
    pub weighs: bool,
    pub now: Millis,
}

/// What a callback did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallbackOutcome {
    /// Applied: the item moved to `version`.
    Applied { version: i64, attempt: i64 },
    /// This event id was seen before (`first` is what it did then), or its
    /// request was already answered by another event: no effect.
    Duplicate { first: CallbackResult },
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

/// Provider requests and callbacks.
#[async_trait::async_trait]
pub trait Providers: Send + Sync {
    /// Claims requests to `providers` (those this process is configured
    /// for) due to be sent (new, or retrying) until `lease_until`.
    async fn claim_provider_requests(
        &self,
        providers: &[&str],
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

/// Instantiates [`Providers`] for one backend.
macro_rules! impl_providers {
    ($store:ty, $db:ty, $row:ty) => {
        const _: () = {
            use std::sync::LazyLock;
            use $crate::clock::Millis;
            use $crate::domain::policy::Cause;
            use $crate::domain::{Actor, CallbackResult, DecisionPhase, Digest, ItemStatus, Mode, Outcome, ProviderRequestStatus};
            use $crate::store::dialect::{Dialect, placeholders, retry_conflicts};
            use $crate::store::rows;
            use $crate::store::shared::NewTransition;
            use $crate::store::*;

            /// Locks the item a callback or a deadline may change, before
            /// anything else (the order every path takes).
            static LOCK_ITEM: LazyLock<String> =
                LazyLock::new(|| format!("SELECT version FROM items WHERE id = $1{}", <$store as Dialect>::FOR_UPDATE));
            static CALLBACK_REQUEST: LazyLock<String> = LazyLock::new(|| {
                format!(
                    "SELECT status, item_version, attempts, deadline_at FROM provider_requests \
                     WHERE key = $1 AND provider = $2 AND item_id = $3{}",
                    <$store as Dialect>::FOR_UPDATE
                )
            });

            fn claim_sql(providers: usize) -> String {
                format!(
                    "UPDATE provider_requests SET next_attempt_at = $2, attempts = attempts + 1, updated_at = $1 \
                     WHERE key IN (SELECT key FROM provider_requests WHERE status = 'pending' \
                     AND next_attempt_at <= $1 AND deadline_at > $1 AND provider IN ({}) \
                     ORDER BY next_attempt_at LIMIT $3{}) \
                     RETURNING key, provider, item_id, item_version, attempts, deadline_at",
                    placeholders(4, providers),
                    <$store as Dialect>::SKIP_LOCKED
                )
            }

            async fn record(tx: &mut txn::Tx<'_>, id: i64, outcome: CallbackResult, detail: &str, now: Millis) -> StoreResult<()> {
                sqlx::query("UPDATE provider_callbacks SET outcome = $2, detail = $3, processed_at = $4 WHERE id = $1")
                    .bind(id)
                    .bind(outcome.as_str())
                    .bind(detail)
                    .bind(now)
                    .execute(&mut **tx)
                    .await?;
                Ok(())
            }

            /// Stores the raw payload first; a repeat of the event id stops
            /// here with the first delivery's outcome.
            async fn store_payload(tx: &mut txn::Tx<'_>, cb: &NewCallback) -> StoreResult<Result<i64, CallbackOutcome>> {
                let inserted: Option<i64> = sqlx::query_scalar(
                    "INSERT INTO provider_callbacks (provider, event_id, request_key, item_id, payload, received_at, \
                     outcome) VALUES ($1, $2, $3, $4, $5, $6, 'unknown') ON CONFLICT (provider, event_id) DO NOTHING \
                     RETURNING id",
                )
                .bind(&cb.provider)
                .bind(&cb.event_id)
                .bind(&cb.request_key)
                .bind(&cb.item_id)
                .bind(&cb.payload)
                .bind(cb.now)
                .fetch_optional(&mut **tx)
                .await?;
                if let Some(id) = inserted {
                    return Ok(Ok(id));
                }
                let first: String =
                    sqlx::query_scalar("SELECT outcome FROM provider_callbacks WHERE provider = $1 AND event_id = $2")
                        .bind(&cb.provider)
                        .bind(&cb.event_id)
                        .fetch_one(&mut **tx)
                        .await?;
                Ok(Err(match rows::parse(&first)? {
                    CallbackResult::Unknown => CallbackOutcome::Unknown,
                    first => CallbackOutcome::Duplicate { first },
                }))
            }

            /// The request the callback answers, if it still waits for an
            /// answer: its item version and attempt count. Otherwise the
            /// callback's outcome, recorded.
            async fn open_request(
                tx: &mut txn::Tx<'_>,
                cb: &NewCallback,
                callback_id: i64,
            ) -> StoreResult<Result<(i64, i32), CallbackOutcome>> {
                let request = sqlx::query_as::<_, (String, i64, i32, i64)>(CALLBACK_REQUEST.as_str())
                    .bind(&cb.request_key)
                    .bind(&cb.provider)
                    .bind(&cb.item_id)
                    .fetch_optional(&mut **tx)
                    .await?;
                let Some((status, item_version, attempts, deadline_at)) = request else {
                    record(tx, callback_id, CallbackResult::Unknown, "no such request for this provider and item", cb.now).await?;
                    return Ok(Err(CallbackOutcome::Unknown));
                };
                let status: ProviderRequestStatus = rows::parse(&status)?;
                if status == ProviderRequestStatus::Answered {
                    let detail = "the request was already answered by another event";
                    record(tx, callback_id, CallbackResult::Duplicate, detail, cb.now).await?;
                    return Ok(Err(CallbackOutcome::Duplicate { first: CallbackResult::Applied }));
                }
                if !status.is_active() {
                    let detail = format!("the request is {status}");
                    record(tx, callback_id, CallbackResult::Stale, &detail, cb.now).await?;
                    return Ok(Err(CallbackOutcome::Stale { detail }));
                }
                // Past its deadline the item belongs to a human, even before
                // the expiry pass has moved it.
                if cb.now >= deadline_at {
                    let detail = "the request's deadline passed".to_string();
                    record(tx, callback_id, CallbackResult::Stale, &detail, cb.now).await?;
                    return Ok(Err(CallbackOutcome::Stale { detail }));
                }
                Ok(Ok((item_version, attempts)))
            }

            /// The audit row and the decision of an applied answer, and the
            /// answer kept on the request: it stands for this content until an edit.
            async fn record_answer(
                tx: &mut txn::Tx<'_>,
                cb: &NewCallback,
                to: ItemStatus,
                (item_version, version, attempts): (i64, i64, i32),
            ) -> StoreResult<()> {
                let correlation = format!("request={} attempt={attempts} event={}", cb.request_key, cb.event_id);
                let reason = format!("{} by {}: {}", cb.verdict, cb.provider, cb.reason);
                let transition = NewTransition {
                    item_id: &cb.item_id,
                    from: ItemStatus::AwaitingProvider,
                    to,
                    version,
                    cause: Cause::ProviderCallback,
                    actor: Actor::Provider,
                    actor_name: Some(&cb.provider),
                    actor_note: None,
                    reason: &reason,
                    correlation_id: &correlation,
                    now: cb.now,
                    policy: None,
                    ends_at: None,
                };
                txn::insert_transitions(tx, &[transition]).await?;
                let decision = NewDecision {
                    plugin: cb.provider.clone(),
                    plugin_version: "callback".into(),
                    plugin_digest: Digest::of(cb.payload.as_bytes()).to_hex(),
                    phase: DecisionPhase::Provider,
                    verdict: Some(cb.verdict),
                    score: cb.score,
                    labels: cb.labels.clone(),
                    reason: cb.reason.clone(),
                    mode: Mode::Enforce,
                    applied: true,
                    duration_us: 0,
                    outcome: Outcome::Ok,
                    error: None,
                    decided_at: cb.now,
                    inputs: None,
                    weighs: cb.weighs,
                    lists: Vec::new(),
                };
                txn::insert_decisions(tx, &[(cb.item_id.as_str(), item_version, &decision)]).await?;
                sqlx::query(
                    "UPDATE provider_requests SET status = 'answered', updated_at = $2, answer_verdict = $3, \
                     answer_score = $4, answer_labels = $5, answer_reason = $6, answered_at = $2 WHERE key = $1",
                )
                .bind(&cb.request_key)
                .bind(cb.now)
                .bind(cb.verdict.as_str())
                .bind(cb.score)
                .bind(rows::labels_json(&cb.labels))
                .bind(&cb.reason)
                .execute(&mut **tx)
                .await?;
                Ok(())
            }

            async fn apply_in(tx: &mut txn::Tx<'_>, cb: &NewCallback) -> StoreResult<CallbackOutcome> {
                sqlx::query(LOCK_ITEM.as_str()).bind(&cb.item_id).fetch_optional(&mut **tx).await?;
                let callback_id = match store_payload(tx, cb).await? {
                    Ok(id) => id,
                    Err(outcome) => return Ok(outcome),
                };
                let (item_version, attempts) = match open_request(tx, cb, callback_id).await? {
                    Ok(open) => open,
                    Err(outcome) => return Ok(outcome),
                };
                // Only while the item still waits at the version the request
                // was made for (anything since bumped the version).
                let to = ItemStatus::for_verdict(cb.verdict);
                let version: Option<i64> = sqlx::query_scalar(
                    "UPDATE items SET status = $1, version = version + 1, decided_by = 'provider', updated_at = $2 \
                     WHERE id = $3 AND version = $4 AND status = 'awaiting_provider' \
                     AND (decided_by IS NULL OR decided_by <> 'moderator') RETURNING version",
                )
                .bind(to.as_str())
                .bind(cb.now)
                .bind(&cb.item_id)
                .bind(item_version)
                .fetch_optional(&mut **tx)
                .await?;
                let Some(version) = version else {
                    let detail = "the item moved on since the request (a moderator or a newer evaluation decided)";
                    record(tx, callback_id, CallbackResult::Stale, detail, cb.now).await?;
                    return Ok(CallbackOutcome::Stale { detail: detail.into() });
                };
                record_answer(tx, cb, to, (item_version, version, attempts)).await?;
                let detail = format!("{} -> {to} at version {version}", cb.verdict);
                record(tx, callback_id, CallbackResult::Applied, &detail, cb.now).await?;
                Ok(CallbackOutcome::Applied {
                    version,
                    attempt: attempts.into(),
                })
            }

            #[async_trait::async_trait]
            impl Providers for $store {
                async fn claim_provider_requests(
                    &self,
                    providers: &[&str],
                    now: Millis,
                    lease_until: Millis,
                    limit: i64,
                ) -> StoreResult<Vec<ClaimedProviderRequest>> {
                    if providers.is_empty()
                        || sqlx::query(
                            "SELECT 1 FROM provider_requests WHERE status = 'pending' AND next_attempt_at <= $1 \
                             AND deadline_at > $1 LIMIT 1",
                        )
                        .bind(now)
                        .fetch_optional(self.read_pool())
                        .await?
                        .is_none()
                    {
                        return Ok(Vec::new());
                    }
                    let sql = claim_sql(providers.len());
                    retry_conflicts!(async {
                        let mut tx = self.begin_write().await?;
                        let mut q = sqlx::query_as::<_, (String, String, String, i64, i32, i64)>(&sql)
                            .bind(now)
                            .bind(lease_until)
                            .bind(limit);
                        for p in providers {
                            q = q.bind(*p);
                        }
                        let claimed = q.fetch_all(&mut *tx).await?;
                        let mut out = Vec::with_capacity(claimed.len());
                        for (key, provider, item_id, item_version, attempts, deadline_at) in claimed {
                            let (kind, text, context) =
                                sqlx::query_as::<_, (String, String, String)>("SELECT kind, body, context FROM items WHERE id = $1")
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
                    })
                }

                async fn provider_request_sent(&self, key: &str, now: Millis) -> StoreResult<()> {
                    retry_conflicts!(async {
                        let mut tx = self.begin_write().await?;
                        sqlx::query(
                            "UPDATE provider_requests SET status = 'sent', last_error = NULL, updated_at = $2 \
                             WHERE key = $1 AND status = 'pending'",
                        )
                        .bind(key)
                        .bind(now)
                        .execute(&mut *tx)
                        .await?;
                        tx.commit().await?;
                        Ok(())
                    })
                }

                async fn provider_request_failed(&self, key: &str, error: &str, retry_at: Millis, now: Millis) -> StoreResult<()> {
                    retry_conflicts!(async {
                        let mut tx = self.begin_write().await?;
                        sqlx::query(
                            "UPDATE provider_requests SET next_attempt_at = $2, last_error = $3, updated_at = $4 \
                             WHERE key = $1 AND status = 'pending'",
                        )
                        .bind(key)
                        .bind(retry_at)
                        .bind(error)
                        .bind(now)
                        .execute(&mut *tx)
                        .await?;
                        tx.commit().await?;
                        Ok(())
                    })
                }

                async fn apply_callback(&self, cb: &NewCallback) -> StoreResult<CallbackOutcome> {
                    retry_conflicts!(async {
                        let mut tx = self.begin_write().await?;
                        let outcome = apply_in(&mut tx, cb).await?;
                        tx.commit().await?;
                        Ok(outcome)
                    })
                }

                async fn expire_provider_requests(&self, now: Millis, limit: i64) -> StoreResult<Vec<ExpiredRequest>> {
                    // Candidates are read without locks; each is then decided
                    // by locking its item first and a conditional update.
                    let due = sqlx::query_as::<_, (String, String, i64)>(
                        "SELECT key, item_id, item_version FROM provider_requests WHERE status IN ('pending', 'sent') \
                         AND deadline_at <= $1 ORDER BY deadline_at LIMIT $2",
                    )
                    .bind(now)
                    .bind(limit)
                    .fetch_all(self.read_pool())
                    .await?;
                    let mut out = Vec::with_capacity(due.len());
                    for (key, item_id, item_version) in due {
                        let expired = retry_conflicts!(async {
                            let mut tx = self.begin_write().await?;
                            sqlx::query(LOCK_ITEM.as_str()).bind(&item_id).fetch_optional(&mut *tx).await?;
                            let timed_out = sqlx::query(
                                "UPDATE provider_requests SET status = 'timed_out', updated_at = $2 \
                                 WHERE key = $1 AND status IN ('pending', 'sent')",
                            )
                            .bind(&key)
                            .bind(now)
                            .execute(&mut *tx)
                            .await?
                            .rows_affected();
                            if timed_out == 0 {
                                tx.rollback().await?;
                                return Ok(None);
                            }
                            let to = ItemStatus::HeldForReview;
                            let version: Option<i64> = sqlx::query_scalar(
                                "UPDATE items SET status = $1, version = version + 1, decided_by = 'system', updated_at = $2 \
                                 WHERE id = $3 AND version = $4 AND status = 'awaiting_provider' \
                                 AND (decided_by IS NULL OR decided_by <> 'moderator') RETURNING version",
                            )
                            .bind(to.as_str())
                            .bind(now)
                            .bind(&item_id)
                            .bind(item_version)
                            .fetch_optional(&mut *tx)
                            .await?;
                            if let Some(version) = version {
                                let reason = format!("no answer to request {key} before its deadline; a human decides");
                                let correlation = format!("request={key}");
                                txn::insert_transitions(
                                    &mut tx,
                                    &[NewTransition {
                                        item_id: &item_id,
                                        from: ItemStatus::AwaitingProvider,
                                        to,
                                        version,
                                        cause: Cause::ProviderTimeout,
                                        actor: Actor::System,
                                        actor_name: None,
                                        actor_note: None,
                                        reason: &reason,
                                        correlation_id: &correlation,
                                        now,
                                        policy: None,
                                        ends_at: None,
                                    }],
                                )
                                .await?;
                            }
                            tx.commit().await?;
                            Ok(Some(version))
                        })?;
                        if let Some(version) = expired {
                            out.push(ExpiredRequest {
                                key,
                                item_id,
                                version,
                            });
                        }
                    }
                    Ok(out)
                }
            }
        };
    };
}
pub(super) use impl_providers;
