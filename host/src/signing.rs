//! The one signature scheme gavel uses both ways: provider callbacks it
//! verifies, and the requests and webhooks it sends.
//!
//! `X-Gavel-Timestamp: UNIX_SECONDS` and
//! `X-Gavel-Signature: sha256=HEX(HMAC-SHA256(secret, "TIMESTAMP.BODY"))`.
//! A receiver recomputes the HMAC over the raw body bytes, compares in
//! constant time, and refuses timestamps more than five minutes away from
//! its clock (which bounds replays of a captured request).

use hmac::{Hmac, Mac};
use sha2::Sha256;

pub const TIMESTAMP_HEADER: &str = "x-gavel-timestamp";
pub const SIGNATURE_HEADER: &str = "x-gavel-signature";
/// Signatures older (or further in the future) than this are refused.
pub const MAX_AGE_SECS: i64 = 300;

type HmacSha256 = Hmac<Sha256>;

fn mac(secret: &[u8], timestamp: &str, body: &[u8]) -> HmacSha256 {
    let mut mac = HmacSha256::new_from_slice(secret).expect("HMAC takes a key of any length");
    mac.update(timestamp.as_bytes());
    mac.update(b".");
    mac.update(body);
    mac
}

/// The `X-Gavel-Signature` value for `body` sent at `timestamp` (seconds).
pub fn sign(secret: &[u8], timestamp: i64, body: &[u8]) -> String {
    let tag = mac(secret, &timestamp.to_string(), body).finalize().into_bytes();
    format!("sha256={}", hex::encode(tag))
}

/// Why a signed request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("missing X-Gavel-Timestamp or X-Gavel-Signature header")]
    Missing,
    #[error("X-Gavel-Timestamp is not a number of seconds")]
    BadTimestamp,
    #[error("signature timestamp is more than {MAX_AGE_SECS} s away from the server's clock")]
    Expired,
    #[error("signature does not match")]
    Mismatch,
}

/// Checks a request's signature headers against `body` at `now` (seconds).
pub fn verify(
    secret: &[u8],
    timestamp: Option<&str>,
    signature: Option<&str>,
    body: &[u8],
    now: i64,
) -> Result<(), SignatureError> {
    let (Some(timestamp), Some(signature)) = (timestamp, signature) else {
        return Err(SignatureError::Missing);
    };
    let at: i64 = timestamp.trim().parse().map_err(|_| SignatureError::BadTimestamp)?;
    // `abs_diff`: a hostile timestamp (i64::MIN) cannot overflow the check.
    if now.abs_diff(at) > MAX_AGE_SECS as u64 {
        return Err(SignatureError::Expired);
    }
    let tag = signature
        .trim()
        .strip_prefix("sha256=")
        .and_then(|h| hex::decode(h).ok())
        .ok_or(SignatureError::Mismatch)?;
    // `verify_slice` compares in constant time.
    mac(secret, timestamp.trim(), body)
        .verify_slice(&tag)
        .map_err(|_| SignatureError::Mismatch)
}

/// The wall clock in Unix seconds.
pub fn now_secs() -> i64 {
    crate::clock::now_ms() / 1000
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"0123456789abcdef";

    #[test]
    fn a_signature_verifies_and_any_change_breaks_it() {
        let body = br#"{"event_id":"e1"}"#;
        let sig = sign(SECRET, 1_700_000_000, body);
        assert!(sig.starts_with("sha256=") && sig.len() == 7 + 64);
        let ok = |ts: &str, sig: &str, body: &[u8], now| verify(SECRET, Some(ts), Some(sig), body, now);
        assert_eq!(ok("1700000000", &sig, body, 1_700_000_010), Ok(()));
        assert_eq!(
            ok("1700000000", &sig, br#"{"event_id":"e2"}"#, 1_700_000_010),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            ok("1700000001", &sig, body, 1_700_000_010),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            verify(
                b"another-secret-16",
                Some("1700000000"),
                Some(&sig),
                body,
                1_700_000_010
            ),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            ok("1700000000", "sha256=zz", body, 1_700_000_010),
            Err(SignatureError::Mismatch)
        );
    }

    #[test]
    fn old_future_and_missing_timestamps_are_refused() {
        let body = b"{}";
        let sig = sign(SECRET, 1_000, body);
        assert_eq!(
            verify(SECRET, Some("1000"), Some(&sig), body, 1_000 + MAX_AGE_SECS + 1),
            Err(SignatureError::Expired)
        );
        assert_eq!(
            verify(SECRET, Some("1000"), Some(&sig), body, 1_000 - MAX_AGE_SECS - 1),
            Err(SignatureError::Expired)
        );
        assert_eq!(
            verify(SECRET, None, Some(&sig), body, 1_000),
            Err(SignatureError::Missing)
        );
        assert_eq!(
            verify(SECRET, Some("yesterday"), Some(&sig), body, 1_000),
            Err(SignatureError::BadTimestamp)
        );
        for hostile in [i64::MIN, i64::MAX, -1] {
            assert_eq!(
                verify(SECRET, Some(&hostile.to_string()), Some(&sig), body, 1_700_000_000),
                Err(SignatureError::Expired),
                "{hostile}"
            );
        }
        assert_eq!(
            verify(SECRET, Some("1000"), Some(&sig), body, i64::MIN),
            Err(SignatureError::Expired)
        );
    }
}
