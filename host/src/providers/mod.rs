//! Hand-offs to external classifiers.
//!
//! A rule's `defer` verdict moves the item to `awaiting_provider`; the same
//! transaction stores a `provider_requests` row whose key
//! (`ITEM:VERSION:PROVIDER`) is stable for that logical operation and
//! supersedes the item's outstanding request. [`Requester`] (in every
//! `worker`/`all` process) claims new requests, POSTs them to the provider
//! with the key as `Idempotency-Key` (retries reuse it), and times out
//! requests past their deadline: the item goes to `held_for_review` with
//! cause `provider_timeout`. Callbacks arrive at
//! `POST /v1/provider-callbacks/{provider}` (see `api::providers`): verified,
//! stored, and applied only while their request is the item's active one.

pub mod fake;

use crate::clock::now_ms;
use crate::config::ProviderConfig;
use crate::metrics::{Metrics, ResultLabel};
use crate::outbound::{Message, SignedClient, Signing};
use crate::secrets::Keyring;
use crate::store::{ClaimedProviderRequest, Providers};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// What gavel POSTs to a provider.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProviderRequest {
    /// Also sent as `Idempotency-Key`; the callback names it.
    pub request_key: String,
    pub item_id: String,
    pub item_version: i64,
    pub kind: String,
    pub text: String,
    pub context: serde_json::Value,
    /// Where to POST the answer (signed with the shared secret, Standard
    /// Webhooks headers).
    pub callback_url: String,
    /// After this (ms since the epoch) the answer is no longer applied.
    pub deadline_at: i64,
    /// 1 for the first send; retries reuse `request_key`.
    pub attempt: i64,
}

/// What a provider POSTs back to `callback_url`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Callback {
    /// Unique per callback event at the provider: a repeat of it has no effect.
    pub event_id: String,
    pub request_key: String,
    pub item_id: String,
    /// `allow`, `flag`, `hold` or `reject`.
    pub verdict: String,
    #[serde(default)]
    pub score: f64,
    /// One label, or several in `labels`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub labels: Vec<String>,
    #[serde(default)]
    pub reason: String,
}

/// Sends provider requests and times out the unanswered ones.
pub struct Requester {
    store: Arc<dyn Providers>,
    providers: BTreeMap<String, ProviderConfig>,
    public_url: String,
    keyring: Arc<Keyring>,
    /// Also send the `X-Gavel-*` signature headers (the migration window).
    legacy_headers: bool,
    http: SignedClient,
    metrics: Arc<Metrics>,
    poll: Duration,
}

/// The parts a [`Requester`] is made of.
pub struct RequesterParts {
    pub store: Arc<dyn Providers>,
    pub providers: BTreeMap<String, ProviderConfig>,
    pub public_url: String,
    pub keyring: Arc<Keyring>,
    pub legacy_headers: bool,
    pub metrics: Arc<Metrics>,
    /// How often an idle requester looks for work.
    pub poll: Duration,
}

/// Requests sent concurrently per round.
const SEND_BATCH: i64 = 32;

impl Requester {
    pub fn new(parts: RequesterParts) -> anyhow::Result<Self> {
        let RequesterParts {
            store,
            providers,
            public_url,
            keyring,
            legacy_headers,
            metrics,
            poll,
        } = parts;
        let longest = providers.values().map(|p| p.request_timeout_ms).max().unwrap_or(5_000);
        let http = SignedClient::new(Duration::from_millis(longest))?;
        Ok(Requester {
            store,
            providers,
            public_url,
            keyring,
            legacy_headers,
            http,
            metrics,
            poll,
        })
    }

    /// Runs until `cancel`.
    pub async fn run(self: Arc<Self>, cancel: CancellationToken) {
        let longest = self
            .providers
            .values()
            .map(|p| p.request_timeout_ms)
            .max()
            .unwrap_or(5_000) as i64;
        while !cancel.is_cancelled() {
            let now = now_ms();
            let expired = self.expire(now).await;
            // Only providers this process is configured for: another
            // process sends the rest.
            let known: Vec<&str> = self.providers.keys().map(String::as_str).collect();
            let claimed = match self
                .store
                .claim_provider_requests(&known, now, now + longest * 2 + 5_000, SEND_BATCH)
                .await
            {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "provider: cannot claim requests");
                    Vec::new()
                }
            };
            let busy = expired || !claimed.is_empty();
            let mut sends = tokio::task::JoinSet::new();
            for request in claimed {
                let this = self.clone();
                let span = tracing::info_span!(
                    "provider.request",
                    item = %request.item_id,
                    request_key = %request.key,
                    attempt = request.attempts,
                    provider = %request.provider
                );
                sends.spawn(async move { this.send(request).await }.instrument(span));
            }
            while sends.join_next().await.is_some() {}
            if !busy {
                tokio::select! {
                    _ = cancel.cancelled() => break,
                    _ = tokio::time::sleep(self.poll) => {}
                }
            }
        }
    }

    /// Times out requests past their deadline; `true` if there were any.
    async fn expire(&self, now: i64) -> bool {
        match self.store.expire_provider_requests(now, 100).await {
            Ok(expired) => {
                for e in &expired {
                    if let Some(version) = e.version {
                        self.metrics.provider_timeouts.inc();
                        tracing::warn!(
                            item = %e.item_id, request_key = %e.key, version,
                            "provider never answered; item held for review (provider_timeout)"
                        );
                    }
                }
                !expired.is_empty()
            }
            Err(e) => {
                tracing::warn!(error = %e, "provider: cannot expire requests");
                false
            }
        }
    }

    async fn send(&self, r: ClaimedProviderRequest) {
        let Some(provider) = self.providers.get(&r.provider) else {
            // Claimed only for known providers; the configuration is fixed
            // for the life of the process.
            return;
        };
        let body = ProviderRequest {
            request_key: r.key.clone(),
            item_id: r.item_id.clone(),
            item_version: r.item_version,
            kind: r.kind.clone(),
            text: r.text.clone(),
            context: serde_json::from_str(&r.context).unwrap_or_else(|_| serde_json::json!({})),
            callback_url: format!("{}/v1/provider-callbacks/{}", self.public_url, r.provider),
            deadline_at: r.deadline_at,
            attempt: r.attempts,
        };
        let body = serde_json::to_vec(&body).expect("a request serializes");
        let secrets = self
            .keyring
            .provider(&r.provider)
            .expect("every configured provider has its secrets");
        let id = crate::signing::message_id(&r.key);
        let signing = Signing {
            secrets: &secrets,
            legacy: self.legacy_headers,
        };
        let message = Message {
            id: &id,
            body,
            headers: &[("idempotency-key", r.key.as_str())],
            timeout: Some(Duration::from_millis(provider.request_timeout_ms)),
        };
        let result = self
            .http
            .post(&provider.url, signing, message)
            .await
            .map_err(|failure| failure.reason);
        let now = now_ms();
        let stored = match result {
            Ok(()) => {
                self.metrics
                    .provider_requests
                    .get_or_create(&ResultLabel { result: "accepted" })
                    .inc();
                tracing::info!("provider accepted the request; waiting for its callback");
                self.store.provider_request_sent(&r.key, now).await
            }
            Err(error) => {
                self.metrics
                    .provider_requests
                    .get_or_create(&ResultLabel { result: "retry" })
                    .inc();
                let retry_at = now
                    + crate::retry::backoff_ms(
                        r.attempts as u32,
                        provider.retry_base_ms as i64,
                        provider.retry_max_ms as i64,
                    );
                tracing::warn!(%error, retry_in_ms = retry_at - now, "provider request failed; retrying with the same key");
                self.store.provider_request_failed(&r.key, &error, retry_at, now).await
            }
        };
        if let Err(e) = stored {
            tracing::warn!(error = %e, "provider: cannot record the result; the lease runs out and it is sent again");
        }
    }
}
