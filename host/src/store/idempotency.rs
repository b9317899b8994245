//! Idempotency keys (IETF `Idempotency-Key`, Stripe's semantics). A request
//! claims its key with a random token; the effect's own transaction
//! completes the key only while that token still holds it (see
//! `txn::seal_keys`), so when a retry takes over a key whose lock expired,
//! at most one of the two requests' effects ever commits. Lock and expiry
//! times come from the database's clock, which every API node shares.

use super::StoreResult;

/// An idempotency key to claim: scope (client), key, hash of the request.
#[derive(Debug, Clone)]
pub struct IdempotencyClaim {
    pub scope: String,
    pub key: String,
    pub request_hash: String,
    /// A request in flight longer than this is taken to have died, and a
    /// retry with the same request takes the key over.
    pub lock_ms: i64,
    pub ttl_ms: i64,
}

/// Starting an idempotent request.
#[derive(Debug, Clone, PartialEq)]
pub enum IdempotencyStart {
    /// The key is new (or expired, or abandoned): go ahead, holding `token`.
    Started { token: String },
    /// The first request finished: replay its response byte for byte.
    Replay { status: u16, body: String },
    /// The first request is still running.
    InFlight,
    /// The key was used with a different request.
    Mismatch,
}

/// Completes a claimed key with the response of its effect, in the
/// effect's transaction, if `token` still holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyCompletion {
    pub scope: String,
    pub key: String,
    pub token: String,
    /// The status of the stored response.
    pub status: u16,
}

/// Claiming and releasing keys. (Completing happens in the effect's
/// transaction; expiry is [`super::Retention`]'s.)
#[async_trait::async_trait]
pub trait Idempotency: Send + Sync {
    /// Claims a key: the unique constraint decides, never a read-then-write.
    async fn idempotency_start(&self, claim: &IdempotencyClaim) -> StoreResult<IdempotencyStart>;

    /// Releases a key whose request failed before its effect, so a retry
    /// can go ahead at once; only while `token` holds it.
    async fn idempotency_release(&self, scope: &str, key: &str, token: &str) -> StoreResult<()>;
}

/// Instantiates [`Idempotency`] for one backend.
macro_rules! impl_idempotency {
    ($store:ty, $db:ty, $row:ty) => {
        const _: () = {
            use sqlx::Row as _;
            use std::sync::LazyLock;
            use $crate::domain::IdempotencyState;
            use $crate::store::dialect::{Dialect, retry_conflicts};
            use $crate::store::*;

            const NOW: &str = <$store as Dialect>::NOW_MS;
            static INSERT: LazyLock<String> = LazyLock::new(|| {
                format!(
                    "INSERT INTO idempotency_keys (scope, key, request_hash, state, claim, locked_until, \
                     created_at, expires_at) VALUES ($1, $2, $3, 'in_flight', $4, {NOW} + $5, {NOW}, {NOW} + $6) \
                     ON CONFLICT (scope, key) DO NOTHING"
                )
            });
            /// Takes over a key that expired, or whose first request died in
            /// flight (same request, lock passed).
            static TAKE_OVER: LazyLock<String> = LazyLock::new(|| {
                format!(
                    "UPDATE idempotency_keys SET request_hash = $3, state = 'in_flight', claim = $4, \
                     locked_until = {NOW} + $5, created_at = {NOW}, expires_at = {NOW} + $6, \
                     response_status = NULL, response_body = NULL WHERE scope = $1 AND key = $2 \
                     AND (expires_at <= {NOW} OR (state = 'in_flight' AND locked_until <= {NOW} \
                     AND request_hash = $3))"
                )
            });

            #[async_trait::async_trait]
            impl Idempotency for $store {
                async fn idempotency_start(&self, c: &IdempotencyClaim) -> StoreResult<IdempotencyStart> {
                    let token = uuid::Uuid::new_v4().simple().to_string();
                    retry_conflicts!(async {
                        let mut tx = self.begin_write().await?;
                        let claimed = |sql: &'static str| {
                            sqlx::query(sql)
                                .bind(&c.scope)
                                .bind(&c.key)
                                .bind(&c.request_hash)
                                .bind(&token)
                                .bind(c.lock_ms)
                                .bind(c.ttl_ms)
                        };
                        let started = claimed(INSERT.as_str()).execute(&mut *tx).await?.rows_affected() == 1
                            || claimed(TAKE_OVER.as_str()).execute(&mut *tx).await?.rows_affected() == 1;
                        if started {
                            tx.commit().await?;
                            return Ok(IdempotencyStart::Started { token: token.clone() });
                        }
                        let row = sqlx::query(
                            "SELECT request_hash, state, response_status, response_body \
                             FROM idempotency_keys WHERE scope = $1 AND key = $2",
                        )
                        .bind(&c.scope)
                        .bind(&c.key)
                        .fetch_optional(&mut *tx)
                        .await?;
                        tx.commit().await?;
                        let Some(row) = row else {
                            // Deleted between the two statements: a retry starts afresh.
                            return Ok(IdempotencyStart::InFlight);
                        };
                        if row.try_get::<&str, _>("request_hash")? != c.request_hash {
                            return Ok(IdempotencyStart::Mismatch);
                        }
                        let state: IdempotencyState = $crate::store::rows::parse(row.try_get::<&str, _>("state")?)?;
                        let status: Option<i32> = row.try_get("response_status")?;
                        let body: Option<String> = row.try_get("response_body")?;
                        match (state, status, body) {
                            (IdempotencyState::Done, Some(status), Some(body)) => Ok(IdempotencyStart::Replay {
                                status: u16::try_from(status)
                                    .map_err(|_| StoreError::Corrupt(format!("response status {status}")))?,
                                body,
                            }),
                            _ => Ok(IdempotencyStart::InFlight),
                        }
                    })
                }

                async fn idempotency_release(&self, scope: &str, key: &str, token: &str) -> StoreResult<()> {
                    retry_conflicts!(async {
                        let mut tx = self.begin_write().await?;
                        sqlx::query(
                            "DELETE FROM idempotency_keys WHERE scope = $1 AND key = $2 AND claim = $3 \
                             AND state = 'in_flight'",
                        )
                        .bind(scope)
                        .bind(key)
                        .bind(token)
                        .execute(&mut *tx)
                        .await?;
                        tx.commit().await?;
                        Ok(())
                    })
                }
            }
        };
    };
}
pub(super) use impl_idempotency;
