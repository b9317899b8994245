//! `Idempotency-Key` on the API side: the header's rules (IETF draft: 1-255
//! printable ASCII; an empty or malformed key is refused, never ignored),
//! claiming a key with its token, and the answers a claim can give instead
//! of running the request (replay, in flight, reused).

use super::AppState;
use super::error::ApiError;
use crate::store::{IdempotencyClaim, IdempotencyStart, KeyCompletion};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use sha2::{Digest, Sha256};

/// A key this request holds.
#[derive(Debug, Clone)]
pub struct ClaimedKey {
    pub scope: String,
    pub key: String,
    pub token: String,
}

impl ClaimedKey {
    /// Completes the key with a response of `status`, in the effect's transaction.
    pub fn completion(&self, status: StatusCode) -> KeyCompletion {
        KeyCompletion {
            scope: self.scope.clone(),
            key: self.key.clone(),
            token: self.token.clone(),
            status: status.as_u16(),
        }
    }

    /// Releases the key when the request failed before its effect.
    pub async fn release(&self, state: &AppState) {
        if let Err(e) = state
            .store
            .idempotency_release(&self.scope, &self.key, &self.token)
            .await
        {
            tracing::warn!(error = %e, "releasing an idempotency key failed; it frees itself after the lock time");
        }
    }
}

/// A key's rules: 1-255 printable ASCII characters.
pub fn validate_key(key: &str) -> Result<String, ApiError> {
    let bad = |why: &str| ApiError::bad_request("invalid_idempotency_key", format!("Idempotency-Key {why}"));
    if key.is_empty() {
        return Err(bad("must not be empty"));
    }
    if key.len() > 255 {
        return Err(bad("must be at most 255 characters"));
    }
    if !key.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        return Err(bad("must be printable ASCII"));
    }
    if key.trim().is_empty() {
        return Err(bad("must not be blank"));
    }
    Ok(key.to_string())
}

/// The `Idempotency-Key` header, validated. Present but empty (or given
/// twice) is a malformed key, not "no key".
pub fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let mut values = headers.get_all("idempotency-key").iter();
    let Some(raw) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(ApiError::bad_request(
            "invalid_idempotency_key",
            "Idempotency-Key must be sent once",
        ));
    }
    let key = raw
        .to_str()
        .map_err(|_| ApiError::bad_request("invalid_idempotency_key", "Idempotency-Key must be printable ASCII"))?;
    validate_key(key).map(Some)
}

/// What a key was used for: the route and the request, hashed.
pub fn request_hash(route: &str, body: &impl Serialize) -> String {
    let mut h = Sha256::new();
    h.update(route.as_bytes());
    h.update([0]);
    h.update(serde_json::to_vec(body).expect("request bodies serialize"));
    hex::encode(h.finalize())
}

/// The stored response of the first request, replayed byte for byte.
fn replay(status: u16, body: String) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
    let mut r = super::json_response(status, body);
    r.headers_mut()
        .insert("idempotent-replayed", axum::http::HeaderValue::from_static("true"));
    r
}

/// Claims an idempotency key; `Err` carries the response to send instead.
pub async fn claim_key(
    state: &AppState,
    route: &'static str,
    scope: &str,
    key: &str,
    hash: String,
) -> Result<ClaimedKey, Response> {
    let ingest = &state.config.ingest;
    let claim = IdempotencyClaim {
        scope: scope.to_string(),
        key: key.to_string(),
        request_hash: hash,
        lock_ms: ingest.idempotency_lock_ms,
        ttl_ms: ingest.idempotency_ttl_ms,
    };
    match state.store.idempotency_start(&claim).await {
        Ok(IdempotencyStart::Started { token }) => Ok(ClaimedKey {
            scope: scope.to_string(),
            key: key.to_string(),
            token,
        }),
        Ok(IdempotencyStart::Replay { status, body }) => {
            state
                .metrics
                .idempotency_replays
                .get_or_create(&crate::metrics::RouteLabel { route })
                .inc();
            Err(replay(status, body))
        }
        Ok(IdempotencyStart::InFlight) => Err(ApiError::conflict(
            "idempotency_key_in_flight",
            "a request with this Idempotency-Key is still being processed",
        )
        .retry_after(1)
        .into_response()),
        Ok(IdempotencyStart::Mismatch) => Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "idempotency_key_reused",
            "this Idempotency-Key was used with a different request",
        )
        .into_response()),
        Err(e) => Err(ApiError::from(e).into_response()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn idempotency_keys_are_validated() {
        let with = |v: &[u8]| {
            let mut h = HeaderMap::new();
            h.insert("idempotency-key", HeaderValue::from_bytes(v).unwrap());
            idempotency_key(&h)
        };
        assert_eq!(with(b"abc-123").unwrap().as_deref(), Some("abc-123"));
        assert!(with(b"").is_err(), "present but empty is malformed");
        assert!(with(b"   ").is_err());
        assert!(with(&[b'a'; 256]).is_err());
        assert!(with(&[b'a'; 255]).is_ok());
        assert!(with(b"tab\there").is_err());
        assert!(with("é".as_bytes()).is_err());
        assert_eq!(idempotency_key(&HeaderMap::new()).unwrap(), None);
        let mut twice = HeaderMap::new();
        twice.append("idempotency-key", HeaderValue::from_static("a"));
        twice.append("idempotency-key", HeaderValue::from_static("b"));
        assert!(idempotency_key(&twice).is_err());
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn keys_are_one_to_255_printable_ascii_not_blank(key in "[\\x00-\\x7f]{0,8}|[ -~]{0,300}|\\PC{0,4}") {
            let expected = !key.is_empty()
                && key.len() <= 255
                && key.bytes().all(|b| (0x20..0x7f).contains(&b))
                && !key.trim().is_empty();
            match validate_key(&key) {
                Ok(k) => {
                    prop_assert!(expected, "{:?} accepted", key);
                    prop_assert_eq!(k, key);
                }
                Err(e) => {
                    prop_assert!(!expected, "{:?} refused", key);
                    prop_assert_eq!(e.status, 400);
                }
            }
        }
    }
}
