//! Signed HTTP POSTs to the platform's webhook endpoints and to providers:
//! written once, used by both. Redirects are never followed (a redirect
//! would carry the signed body to a host nobody configured); a 3xx is a
//! failed attempt like any other non-2xx. The answers Standard Webhooks
//! gives a meaning to are told apart: `410 Gone` (the receiver wants no
//! more), and `429`/`503` with `Retry-After` (not before then).

use crate::signing::{self, Secret};
use std::time::{Duration, SystemTime};

/// The longest `Retry-After` honoured: a receiver asking for more is
/// retried after a day (and dead-lettered as usual after its attempts).
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(24 * 3600);

/// A client for signed POSTs.
#[derive(Clone)]
pub struct SignedClient {
    http: reqwest::Client,
}

/// What to send: `body` (JSON) as message `id` (the `webhook-id`, the same
/// on every retry), with `headers` besides the signature's.
pub struct Message<'a> {
    pub id: &'a str,
    pub body: Vec<u8>,
    pub headers: &'a [(&'a str, &'a str)],
    pub timeout: Option<Duration>,
}

/// How to sign: every secret in `secrets` signs `webhook-signature`; with
/// `legacy`, the first also signs the `X-Gavel-*` headers.
#[derive(Clone, Copy)]
pub struct Signing<'a> {
    pub secrets: &'a [Secret],
    pub legacy: bool,
}

/// Why a POST was not acknowledged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// A short reason (`HTTP 500 Internal Server Error`, `timed out`, ...).
    pub reason: String,
    /// The receiver answered `410 Gone`.
    pub gone: bool,
    /// The receiver answered `429` or `503` with a `Retry-After`.
    pub retry_after: Option<Duration>,
}

impl Failure {
    fn other(reason: String) -> Failure {
        Failure {
            reason,
            gone: false,
            retry_after: None,
        }
    }
}

impl SignedClient {
    /// A client whose requests time out after `timeout`.
    pub fn new(timeout: Duration) -> anyhow::Result<Self> {
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(5)))
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("gavel/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(SignedClient { http })
    }

    /// POSTs `message` to `url`, signed now (see [`crate::signing`]); `Ok`
    /// on a 2xx answer.
    pub async fn post(&self, url: &str, signing: Signing<'_>, message: Message<'_>) -> Result<(), Failure> {
        let timestamp = signing::now_secs();
        let mut request = self
            .http
            .post(url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(signing::ID_HEADER, message.id)
            .header(signing::TIMESTAMP_HEADER, timestamp.to_string())
            .header(
                signing::SIGNATURE_HEADER,
                signing::sign(signing.secrets, message.id, timestamp, &message.body),
            );
        if signing.legacy
            && let Some(first) = signing.secrets.first()
        {
            request = request
                .header(signing::LEGACY_TIMESTAMP_HEADER, timestamp.to_string())
                .header(
                    signing::LEGACY_SIGNATURE_HEADER,
                    signing::sign_legacy(first, timestamp, &message.body),
                );
        }
        for (name, value) in message.headers {
            request = request.header(*name, *value);
        }
        if let Some(t) = message.timeout {
            request = request.timeout(t);
        }
        let response = request
            .body(message.body)
            .send()
            .await
            .map_err(|e| Failure::other(describe(&e)))?;
        let status = response.status();
        if status.is_success() {
            return Ok(());
        }
        let throttled = matches!(status.as_u16(), 429 | 503);
        let retry_after = throttled
            .then(|| response.headers().get(reqwest::header::RETRY_AFTER))
            .flatten()
            .and_then(|v| v.to_str().ok())
            .and_then(|v| parse_retry_after(v, SystemTime::now()));
        let reason = if status.is_redirection() {
            format!("HTTP {status}: redirects are not followed")
        } else if let Some(wait) = retry_after {
            format!("HTTP {status}, Retry-After {} s", wait.as_secs())
        } else {
            format!("HTTP {status}")
        };
        Err(Failure {
            reason,
            gone: status == reqwest::StatusCode::GONE,
            retry_after,
        })
    }
}

/// A `Retry-After` value (seconds, or an HTTP date) as a wait from `now`,
/// at most [`MAX_RETRY_AFTER`]; `None` when it is neither.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    let wait = match value.parse::<u64>() {
        Ok(seconds) => Duration::from_secs(seconds),
        Err(_) => httpdate::parse_http_date(value)
            .ok()?
            .duration_since(now)
            .unwrap_or(Duration::ZERO),
    };
    Some(wait.min(MAX_RETRY_AFTER))
}

/// A short reason for a failed request (timeouts and refused connections
/// named as such).
fn describe(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        "timed out".into()
    } else if e.is_connect() {
        format!("cannot connect: {e}")
    } else {
        e.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_reads_seconds_and_dates() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(parse_retry_after("120", now), Some(Duration::from_secs(120)));
        assert_eq!(parse_retry_after(" 0 ", now), Some(Duration::ZERO));
        let later = httpdate::fmt_http_date(now + Duration::from_secs(90));
        assert_eq!(parse_retry_after(&later, now), Some(Duration::from_secs(90)));
        let past = httpdate::fmt_http_date(now - Duration::from_secs(90));
        assert_eq!(parse_retry_after(&past, now), Some(Duration::ZERO));
        assert_eq!(parse_retry_after("99999999", now), Some(MAX_RETRY_AFTER));
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(parse_retry_after("-5", now), None);
    }
}
