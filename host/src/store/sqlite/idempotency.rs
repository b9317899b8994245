//! Idempotency keys on the writer thread (the semantics are
//! `store/idempotency.rs`'s): a claim is one conditional insert or
//! take-over; a key is completed in its effect's savepoint
//! (`txn::seal_key`).

use crate::domain::IdempotencyState;
use crate::store::{IdempotencyClaim, IdempotencyStart, StoreError, StoreResult, rows};
use rusqlite::{Connection, OptionalExtension, params};

/// The database's clock in milliseconds (see `Dialect::NOW_MS`).
const NOW: &str = "CAST(unixepoch('subsec') * 1000 AS INTEGER)";

/// Claims a key with `token`: the primary key decides, never a read-then-write.
pub(super) fn start(conn: &Connection, c: &IdempotencyClaim, token: &str) -> StoreResult<IdempotencyStart> {
    let args = params![c.scope, c.key, c.request_hash, token, c.lock_ms, c.ttl_ms];
    let inserted = conn
        .prepare_cached(&format!(
            "INSERT INTO idempotency_keys (scope, key, request_hash, state, claim, locked_until, created_at, \
             expires_at) VALUES (?1, ?2, ?3, 'in_flight', ?4, {NOW} + ?5, {NOW}, {NOW} + ?6) \
             ON CONFLICT (scope, key) DO NOTHING"
        ))?
        .execute(args)?;
    // Taken over: the key expired, or its first request died in flight
    // (same request, lock passed).
    let started = inserted == 1
        || conn
            .prepare_cached(&format!(
                "UPDATE idempotency_keys SET request_hash = ?3, state = 'in_flight', claim = ?4, \
                 locked_until = {NOW} + ?5, created_at = {NOW}, expires_at = {NOW} + ?6, response_status = NULL, \
                 response_body = NULL WHERE scope = ?1 AND key = ?2 AND (expires_at <= {NOW} \
                 OR (state = 'in_flight' AND locked_until <= {NOW} AND request_hash = ?3))"
            ))?
            .execute(args)?
            == 1;
    if started {
        return Ok(IdempotencyStart::Started {
            token: token.to_string(),
        });
    }
    let row: Option<(String, String, Option<i32>, Option<String>)> = conn
        .prepare_cached(
            "SELECT request_hash, state, response_status, response_body FROM idempotency_keys \
             WHERE scope = ?1 AND key = ?2",
        )?
        .query_row(params![c.scope, c.key], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
        })
        .optional()?;
    let Some((hash, state, status, body)) = row else {
        // Not reachable in one transaction; a retry starts afresh.
        return Ok(IdempotencyStart::InFlight);
    };
    if hash != c.request_hash {
        return Ok(IdempotencyStart::Mismatch);
    }
    let state: IdempotencyState = rows::parse(&state)?;
    match (state, status, body) {
        (IdempotencyState::Done, Some(status), Some(body)) => Ok(IdempotencyStart::Replay {
            status: u16::try_from(status).map_err(|_| StoreError::Corrupt(format!("response status {status}")))?,
            body,
        }),
        _ => Ok(IdempotencyStart::InFlight),
    }
}

/// Releases a key whose request failed before its effect, while `token` holds it.
pub(super) fn release(conn: &Connection, scope: &str, key: &str, token: &str) -> StoreResult<()> {
    conn.prepare_cached(
        "DELETE FROM idempotency_keys WHERE scope = ?1 AND key = ?2 AND claim = ?3 AND state = 'in_flight'",
    )?
    .execute(params![scope, key, token])?;
    Ok(())
}
