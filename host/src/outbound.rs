//! Signed HTTP POSTs to the platform's webhook endpoints and to providers:
//! written once, used by both. Redirects are never followed (a redirect
//! would carry the signed body to a host nobody configured); a 3xx is a
//! failed attempt like any other non-2xx.

use std::time::Duration;

/// A client for signed POSTs.
#[derive(Clone)]
pub struct SignedClient {
    http: reqwest::Client,
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

    /// POSTs `body` (JSON) to `url`, signed with `secret` (see
    /// [`crate::signing`]), with `headers` besides; `Ok` on a 2xx answer,
    /// otherwise a short reason.
    pub async fn post(
        &self,
        url: &str,
        secret: &[u8],
        body: Vec<u8>,
        headers: &[(&str, &str)],
        timeout: Option<Duration>,
    ) -> Result<(), String> {
        let timestamp = crate::signing::now_secs();
        let signature = crate::signing::sign(secret, timestamp, &body);
        let mut request = self
            .http
            .post(url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(crate::signing::TIMESTAMP_HEADER, timestamp.to_string())
            .header(crate::signing::SIGNATURE_HEADER, signature);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        if let Some(t) = timeout {
            request = request.timeout(t);
        }
        let response = request.body(body).send().await.map_err(|e| describe(&e))?;
        let status = response.status();
        if status.is_success() {
            Ok(())
        } else if status.is_redirection() {
            Err(format!("HTTP {status}: redirects are not followed"))
        } else {
            Err(format!("HTTP {status}"))
        }
    }
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
