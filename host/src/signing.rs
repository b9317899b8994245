//! The signatures gavel uses both ways: on the webhooks and provider
//! requests it sends, and on the provider callbacks it verifies.
//!
//! The scheme is Standard Webhooks (<https://www.standardwebhooks.com/>):
//! `webhook-id` (opaque, the same on every retry), `webhook-timestamp`
//! (Unix seconds) and `webhook-signature: v1,BASE64(HMAC-SHA256(key,
//! "ID.TIMESTAMP.BODY"))`, one `v1,…` entry per active secret, separated by
//! spaces, so a secret is rotated without a moment where receivers fail.
//! A secret is `whsec_` + base64 of the key (what gavel generates); any
//! other string is a legacy raw secret whose UTF-8 bytes are the key.
//!
//! During the migration window (`legacy_headers`), gavel also sends and
//! accepts its former headers: `X-Gavel-Timestamp: UNIX_SECONDS` and
//! `X-Gavel-Signature: sha256=HEX(HMAC-SHA256(key, "TIMESTAMP.BODY"))`,
//! with the same keys.
//!
//! A verifier recomputes the HMAC over the raw body bytes, compares in
//! constant time, and refuses timestamps more than five minutes away from
//! its clock (which bounds replays of a captured request).

use base64::Engine as _;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

pub const ID_HEADER: &str = "webhook-id";
pub const TIMESTAMP_HEADER: &str = "webhook-timestamp";
pub const SIGNATURE_HEADER: &str = "webhook-signature";
pub const LEGACY_TIMESTAMP_HEADER: &str = "x-gavel-timestamp";
pub const LEGACY_SIGNATURE_HEADER: &str = "x-gavel-signature";
/// Signatures older (or further in the future) than this are refused.
pub const MAX_AGE_SECS: i64 = 300;
/// What a generated secret starts with (the Standard Webhooks form).
pub const SECRET_PREFIX: &str = "whsec_";

type HmacSha256 = Hmac<Sha256>;

/// Base64 that takes keys with or without their `=` padding, as the
/// Standard Webhooks libraries do.
const BASE64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// One signing key. `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret {
    key: Vec<u8>,
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secret({} bytes)", self.key.len())
    }
}

/// Why a configured secret is unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error("a whsec_ secret must be base64 after the prefix")]
    NotBase64,
    #[error("a secret must be at least 16 bytes")]
    TooShort,
}

impl Secret {
    /// `whsec_BASE64` (the key is the decoded bytes) or a legacy raw secret
    /// (the key is its bytes); either at least 16 bytes of key.
    pub fn parse(text: &str) -> Result<Secret, SecretError> {
        let text = text.trim();
        let key = match text.strip_prefix(SECRET_PREFIX) {
            Some(encoded) => BASE64.decode(encoded).map_err(|_| SecretError::NotBase64)?,
            None => text.as_bytes().to_vec(),
        };
        if key.len() < 16 {
            return Err(SecretError::TooShort);
        }
        Ok(Secret { key })
    }

    /// A new `whsec_` secret: 32 random bytes from the OS generator.
    pub fn generate() -> String {
        let mut key = [0u8; 32];
        getrandom::fill(&mut key).expect("the operating system's random source");
        format!("{SECRET_PREFIX}{}", BASE64.encode(key))
    }

    fn mac(&self, parts: &[&[u8]]) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(&self.key).expect("HMAC takes a key of any length");
        for part in parts {
            mac.update(part);
        }
        mac
    }

    fn standard_mac(&self, id: &str, timestamp: &str, body: &[u8]) -> HmacSha256 {
        self.mac(&[id.as_bytes(), b".", timestamp.as_bytes(), b".", body])
    }

    fn legacy_mac(&self, timestamp: &str, body: &[u8]) -> HmacSha256 {
        self.mac(&[timestamp.as_bytes(), b".", body])
    }
}

/// The opaque `webhook-id` of a message: `msg_` + 32 hex digits of the
/// SHA-256 of `seed` (an event id, a request key). Stable for the same
/// seed, so every retry carries the same id; free of the user-chosen text
/// (and of the `.` the specification forbids) in gavel's event ids.
pub fn message_id(seed: &str) -> String {
    let digest = Sha256::digest(seed.as_bytes());
    format!("msg_{}", hex::encode(&digest[..16]))
}

/// The `webhook-signature` value: one `v1,BASE64` per secret, space-separated.
pub fn sign(secrets: &[Secret], id: &str, timestamp: i64, body: &[u8]) -> String {
    let timestamp = timestamp.to_string();
    secrets
        .iter()
        .map(|s| {
            format!(
                "v1,{}",
                BASE64.encode(s.standard_mac(id, &timestamp, body).finalize().into_bytes())
            )
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The legacy `X-Gavel-Signature` value (one secret: the form had no list).
pub fn sign_legacy(secret: &Secret, timestamp: i64, body: &[u8]) -> String {
    let tag = secret.legacy_mac(&timestamp.to_string(), body).finalize().into_bytes();
    format!("sha256={}", hex::encode(tag))
}

/// Why a signed request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("missing webhook-id, webhook-timestamp or webhook-signature header")]
    Missing,
    #[error("the signature timestamp is not a number of seconds")]
    BadTimestamp,
    #[error("signature timestamp is more than {MAX_AGE_SECS} s away from the server's clock")]
    Expired,
    #[error("signature does not match")]
    Mismatch,
    #[error("X-Gavel-* signatures are no longer accepted: sign with the webhook-* headers")]
    LegacyRefused,
}

/// Which headers a verified request was signed with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    Standard,
    Legacy,
}

/// Checks a request's signature headers (read through `header`, by
/// lower-case name) against `body` at `now` (seconds): the Standard
/// Webhooks headers when any of them is present, else, if `accept_legacy`,
/// the X-Gavel-* ones. Any of `secrets` may have signed.
pub fn verify<'h>(
    secrets: &[Secret],
    accept_legacy: bool,
    header: impl Fn(&str) -> Option<&'h str>,
    body: &[u8],
    now: i64,
) -> Result<Scheme, SignatureError> {
    let standard = [ID_HEADER, TIMESTAMP_HEADER, SIGNATURE_HEADER].map(&header);
    if standard.iter().any(Option::is_some) {
        let [Some(id), Some(timestamp), Some(signatures)] = standard else {
            return Err(SignatureError::Missing);
        };
        check_age(timestamp, now)?;
        let (id, timestamp) = (id.trim(), timestamp.trim());
        // Entries of another version (`v1a,…`) are skipped, as the specification says.
        let tags: Vec<Vec<u8>> = signatures
            .split_whitespace()
            .filter_map(|entry| entry.strip_prefix("v1,"))
            .filter_map(|b64| BASE64.decode(b64).ok())
            .collect();
        return matches(secrets, &tags, |s| s.standard_mac(id, timestamp, body)).map(|()| Scheme::Standard);
    }
    let (Some(timestamp), Some(signature)) = (header(LEGACY_TIMESTAMP_HEADER), header(LEGACY_SIGNATURE_HEADER)) else {
        return Err(SignatureError::Missing);
    };
    if !accept_legacy {
        return Err(SignatureError::LegacyRefused);
    }
    check_age(timestamp, now)?;
    let tag = signature
        .trim()
        .strip_prefix("sha256=")
        .and_then(|h| hex::decode(h).ok())
        .ok_or(SignatureError::Mismatch)?;
    matches(secrets, &[tag], |s| s.legacy_mac(timestamp.trim(), body)).map(|()| Scheme::Legacy)
}

/// Refuses a timestamp that is not a number or too far from `now`.
fn check_age(timestamp: &str, now: i64) -> Result<(), SignatureError> {
    let at: i64 = timestamp.trim().parse().map_err(|_| SignatureError::BadTimestamp)?;
    // `abs_diff`: a hostile timestamp (i64::MIN) cannot overflow the check.
    if now.abs_diff(at) > MAX_AGE_SECS as u64 {
        return Err(SignatureError::Expired);
    }
    Ok(())
}

/// `Ok` when some secret's MAC equals some tag (compared in constant time).
fn matches(secrets: &[Secret], tags: &[Vec<u8>], mac: impl Fn(&Secret) -> HmacSha256) -> Result<(), SignatureError> {
    let found = secrets
        .iter()
        .any(|secret| tags.iter().any(|tag| mac(secret).verify_slice(tag).is_ok()));
    if found { Ok(()) } else { Err(SignatureError::Mismatch) }
}

/// The wall clock in Unix seconds.
pub fn now_secs() -> i64 {
    crate::clock::now_ms() / 1000
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn secret(text: &str) -> Secret {
        Secret::parse(text).unwrap()
    }

    fn headers(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn check(
        secrets: &[Secret],
        legacy: bool,
        h: &HashMap<String, String>,
        body: &[u8],
        now: i64,
    ) -> Result<Scheme, SignatureError> {
        verify(secrets, legacy, |n| h.get(n).map(String::as_str), body, now)
    }

    /// The specification's example (the test vector of its reference libraries).
    #[test]
    fn the_specification_example_verifies() {
        let key = secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");
        let body = br#"{"test": 2432232314}"#;
        let sig = sign(
            std::slice::from_ref(&key),
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1614265330,
            body,
        );
        assert_eq!(sig, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    }

    #[test]
    fn a_signature_verifies_and_any_change_breaks_it() {
        let keys = [secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")];
        let body = br#"{"event_id":"e1"}"#;
        let sig = sign(&keys, "msg_1", 1_700_000_000, body);
        let h = |id: &str, ts: &str, sig: &str| {
            headers(&[(ID_HEADER, id), (TIMESTAMP_HEADER, ts), (SIGNATURE_HEADER, sig)])
        };
        let now = 1_700_000_010;
        assert_eq!(
            check(&keys, false, &h("msg_1", "1700000000", &sig), body, now),
            Ok(Scheme::Standard)
        );
        for (what, headers, body) in [
            ("body", h("msg_1", "1700000000", &sig), &br#"{"event_id":"e2"}"#[..]),
            ("id", h("msg_2", "1700000000", &sig), &body[..]),
            ("timestamp", h("msg_1", "1700000001", &sig), &body[..]),
            ("garbage", h("msg_1", "1700000000", "v1,zz"), &body[..]),
            (
                "other version",
                h("msg_1", "1700000000", &sig.replace("v1,", "v2,")),
                &body[..],
            ),
        ] {
            assert_eq!(
                check(&keys, false, &headers, body, now),
                Err(SignatureError::Mismatch),
                "{what}"
            );
        }
        let wrong = [secret("whsec_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA")];
        assert_eq!(
            check(&wrong, false, &h("msg_1", "1700000000", &sig), body, now),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            check(
                &keys,
                false,
                &headers(&[(ID_HEADER, "msg_1"), (SIGNATURE_HEADER, &sig)]),
                body,
                now
            ),
            Err(SignatureError::Missing)
        );
    }

    #[test]
    fn every_secret_signs_and_any_one_verifies() {
        let (old, new) = (secret(&Secret::generate()), secret(&Secret::generate()));
        let body = b"{}";
        let both = sign(&[old.clone(), new.clone()], "msg_1", 1_000, body);
        assert_eq!(both.split(' ').count(), 2);
        let h = headers(&[
            (ID_HEADER, "msg_1"),
            (TIMESTAMP_HEADER, "1000"),
            (SIGNATURE_HEADER, &both),
        ]);
        assert_eq!(
            check(std::slice::from_ref(&old), false, &h, body, 1_000),
            Ok(Scheme::Standard)
        );
        assert_eq!(
            check(std::slice::from_ref(&new), false, &h, body, 1_000),
            Ok(Scheme::Standard)
        );
        let only_new = sign(std::slice::from_ref(&new), "msg_1", 1_000, body);
        let h = headers(&[
            (ID_HEADER, "msg_1"),
            (TIMESTAMP_HEADER, "1000"),
            (SIGNATURE_HEADER, &only_new),
        ]);
        assert_eq!(check(&[old], false, &h, body, 1_000), Err(SignatureError::Mismatch));
    }

    #[test]
    fn legacy_headers_verify_only_when_accepted() {
        let key = secret("webhook-secret-0123456789");
        let body = br#"{"event_id":"e1"}"#;
        let sig = sign_legacy(&key, 1_700_000_000, body);
        assert!(sig.starts_with("sha256=") && sig.len() == 7 + 64);
        let h = headers(&[(LEGACY_TIMESTAMP_HEADER, "1700000000"), (LEGACY_SIGNATURE_HEADER, &sig)]);
        let keys = [key];
        assert_eq!(check(&keys, true, &h, body, 1_700_000_010), Ok(Scheme::Legacy));
        assert_eq!(
            check(&keys, false, &h, body, 1_700_000_010),
            Err(SignatureError::LegacyRefused)
        );
        assert_eq!(
            check(&keys, true, &h, b"{}", 1_700_000_010),
            Err(SignatureError::Mismatch)
        );
    }

    #[test]
    fn old_future_and_missing_timestamps_are_refused() {
        let keys = [secret(&Secret::generate())];
        let body = b"{}";
        let sig = sign(&keys, "msg_1", 1_000, body);
        let at = |ts: &str, now| {
            let h = headers(&[(ID_HEADER, "msg_1"), (TIMESTAMP_HEADER, ts), (SIGNATURE_HEADER, &sig)]);
            check(&keys, true, &h, body, now)
        };
        assert_eq!(at("1000", 1_000 + MAX_AGE_SECS + 1), Err(SignatureError::Expired));
        assert_eq!(at("1000", 1_000 - MAX_AGE_SECS - 1), Err(SignatureError::Expired));
        assert_eq!(at("yesterday", 1_000), Err(SignatureError::BadTimestamp));
        for hostile in [i64::MIN, i64::MAX, -1] {
            assert_eq!(
                at(&hostile.to_string(), 1_700_000_000),
                Err(SignatureError::Expired),
                "{hostile}"
            );
        }
        assert_eq!(at("1000", i64::MIN), Err(SignatureError::Expired));
        assert_eq!(
            check(&keys, true, &headers(&[]), body, 1_000),
            Err(SignatureError::Missing)
        );
    }

    #[test]
    fn secrets_parse_in_both_forms() {
        let generated = Secret::generate();
        assert!(generated.starts_with(SECRET_PREFIX));
        assert_eq!(secret(&generated).key.len(), 32);
        // Unpadded base64, as some libraries write it.
        assert_eq!(secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").key.len(), 24);
        assert_eq!(secret("a-legacy-raw-secret").key, b"a-legacy-raw-secret");
        assert_eq!(Secret::parse("whsec_not base64!"), Err(SecretError::NotBase64));
        assert_eq!(Secret::parse("whsec_AAAA"), Err(SecretError::TooShort));
        assert_eq!(Secret::parse("short"), Err(SecretError::TooShort));
        assert!(!format!("{:?}", secret(&generated)).contains(&generated[6..]));
    }

    #[test]
    fn message_ids_are_opaque_and_stable() {
        let id = message_id("item:with.dots:3");
        assert_eq!(id, message_id("item:with.dots:3"));
        assert_ne!(id, message_id("item:with.dots:4"));
        assert!(id.starts_with("msg_") && id.len() == 4 + 32);
        assert!(id[4..].bytes().all(|b| b.is_ascii_hexdigit()));
    }
}
