//! Decision delivery: the dispatcher that turns outbox rows into signed
//! webhook POSTs.
//!
//! Every transition's transaction wrote one outbox row (`event_id` =
//! `ITEM:VERSION`). The dispatcher, in every `worker`/`all` process, moves
//! each endpoint's cursor over the outbox feed, creating one delivery per
//! event the endpoint accepts (one endpoint at a time per cluster), claims due
//! deliveries with a lease (`FOR UPDATE SKIP LOCKED` on PostgreSQL), POSTs
//! them, and records the result: delivered, retried later with jittered
//! exponential backoff, or dead after `delivery.max_attempts` (listed and
//! replayable). Per item and endpoint, a version is claimed only once every
//! earlier version is delivered or dead, so receivers see versions in order.
//! Transport is at least once (a process killed mid-send leaves the
//! delivery to be retried when its lease ends); receivers deduplicate on
//! `event_id`.
//!
//! Every delivery is signed per Standard Webhooks (see `signing.rs`) with
//! every secret of its endpoint, as message `msg_` + a hash of its event id,
//! the same on every retry. A receiver answering `410 Gone` disables its
//! endpoint (stored, so every process stops; deliveries wait until
//! `POST /v1/webhooks/{endpoint}/enable`); `429`/`503` with `Retry-After`
//! are retried no earlier than asked.

use crate::clock::now_ms;
use crate::config::{DeliveryConfig, WebhookConfig};
use crate::metrics::{Metrics, ResultLabel};
use crate::outbound::{Failure, Message, SignedClient, Signing};
use crate::secrets::Keyring;
use crate::store::{Change, ClaimedDelivery, DeliveryOutcome, DeliveryResult, EndpointFilter, Items, Outbox};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// Headers sent besides the signature's while `legacy_headers` is on.
pub const EVENT_ID_HEADER: &str = "x-gavel-event-id";
pub const ATTEMPT_HEADER: &str = "x-gavel-delivery-attempt";

/// Outbox rows fanned out per round.
const FAN_OUT_BATCH: i64 = 500;

/// Attempt results recorded per transaction, at most.
const RECORD_BATCH: usize = 256;

/// An attempt's result on its way to the store, with the slot it holds
/// until it is recorded.
struct Attempted {
    result: DeliveryResult,
    slot: OwnedSemaphorePermit,
}

/// The `gavel_deliveries_total` label of a recorded result.
fn result_label(outcome: &DeliveryOutcome) -> &'static str {
    match outcome {
        DeliveryOutcome::Delivered { .. } => "delivered",
        DeliveryOutcome::Retry { .. } => "retry",
        DeliveryOutcome::Dead { .. } => "dead",
    }
}

/// The webhook dispatcher of one process.
pub struct Dispatcher {
    store: Arc<dyn Outbox>,
    /// Where the statements of restrictive decisions are derived from.
    items: Arc<dyn Items>,
    policies: crate::domain::statements::Policies,
    endpoints: BTreeMap<String, WebhookConfig>,
    filters: Vec<EndpointFilter>,
    config: DeliveryConfig,
    keyring: Arc<Keyring>,
    /// Also send the `X-Gavel-*` headers (the migration window).
    legacy_headers: bool,
    http: SignedClient,
    metrics: Arc<Metrics>,
}

/// The parts a [`Dispatcher`] is made of.
pub struct DispatcherParts {
    pub store: Arc<dyn Outbox>,
    pub items: Arc<dyn Items>,
    pub policies: crate::domain::statements::Policies,
    pub endpoints: BTreeMap<String, WebhookConfig>,
    pub config: DeliveryConfig,
    pub keyring: Arc<Keyring>,
    pub legacy_headers: bool,
    pub metrics: Arc<Metrics>,
}

impl Dispatcher {
    pub fn new(parts: DispatcherParts) -> anyhow::Result<Self> {
        let DispatcherParts {
            store,
            items,
            policies,
            endpoints,
            config,
            keyring,
            legacy_headers,
            metrics,
        } = parts;
        let filters = endpoints
            .iter()
            .map(|(name, w)| EndpointFilter {
                name: name.clone(),
                statuses: w.statuses.clone(),
                kinds: w.kinds.clone(),
            })
            .collect();
        let http = SignedClient::new(Duration::from_millis(config.timeout_ms))?;
        Ok(Dispatcher {
            store,
            items,
            policies,
            endpoints,
            filters,
            config,
            keyring,
            legacy_headers,
            http,
            metrics,
        })
    }

    /// Gives every configured endpoint its position in the outbox feed, if
    /// it has none yet. Awaited by every process, whatever its role, before
    /// it serves, so an endpoint starting at `latest` misses nothing
    /// accepted after the first process of the deployment started.
    pub async fn register(&self) -> anyhow::Result<()> {
        let endpoints: Vec<(&str, crate::store::FeedStart)> = self
            .endpoints
            .iter()
            .map(|(name, w)| (name.as_str(), w.start))
            .collect();
        self.store.register_endpoints(&endpoints, now_ms()).await?;
        Ok(())
    }

    /// Runs until `cancel`; deliveries in flight finish (bounded by the timeout).
    pub async fn run(self: Arc<Self>, cancel: CancellationToken) {
        let slots = Arc::new(Semaphore::new(self.config.concurrency.max(1)));
        let poll = Duration::from_millis(self.config.poll_interval_ms.max(10));
        // Longer than any attempt: a claim outlives its request unless the process died.
        let lease_ms = self.config.timeout_ms as i64 * 2 + 5_000;
        let (attempted, results) = mpsc::unbounded_channel();
        let recorder = tokio::spawn(self.clone().record(results));
        while !cancel.is_cancelled() {
            let now = now_ms();
            let fanned = match self.store.fan_out(&self.filters, now, FAN_OUT_BATCH).await {
                Ok(n) => n,
                Err(e) => {
                    tracing::warn!(error = %e, "delivery: cannot fan out outbox events");
                    0
                }
            };
            let free = slots.available_permits();
            // Only endpoints this process knows: during a rolling config
            // change, another process delivers the rest.
            let known: Vec<&str> = self.endpoints.keys().map(String::as_str).collect();
            let claimed = if free == 0 {
                Vec::new()
            } else {
                match self
                    .store
                    .claim_deliveries(&known, now, now + lease_ms, free as i64)
                    .await
                {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!(error = %e, "delivery: cannot claim deliveries");
                        Vec::new()
                    }
                }
            };
            self.metrics.deliveries_pending.set(claimed.len() as i64);
            // Round again at once only when a batch was full: otherwise the
            // loop would compete with the item transactions for the writer.
            let busy = fanned as i64 == FAN_OUT_BATCH || (free > 0 && claimed.len() == free);
            for delivery in claimed {
                let permit = slots
                    .clone()
                    .acquire_owned()
                    .await
                    .expect("the semaphore is never closed");
                let this = self.clone();
                let attempted = attempted.clone();
                tokio::spawn(async move {
                    if let Some(result) = this.deliver(delivery).await {
                        // The slot is given back once the result is stored.
                        let _ = attempted.send(Attempted { result, slot: permit });
                    }
                });
            }
            if !busy {
                tokio::select! {
                    _ = cancel.cancelled() => break,
                    _ = tokio::time::sleep(poll) => {}
                }
            } else if slots.available_permits() == 0 {
                // Every slot is sending and more is due: go on as soon as
                // half of them are free (claiming one delivery at a time
                // would be a write transaction per delivery), or after the
                // poll interval. Sleeping the interval alone held a backlog
                // to one claim per interval (160 deliveries/s by default).
                let half = (self.config.concurrency.max(1) as u32).div_ceil(2);
                tokio::select! {
                    _ = cancel.cancelled() => break,
                    _ = slots.acquire_many(half) => {}
                    _ = tokio::time::sleep(poll) => {}
                }
            }
        }
        // Let deliveries in flight record their result.
        drop(attempted);
        let _ = tokio::time::timeout(Duration::from_millis(self.config.timeout_ms + 1_000), async {
            let _ = slots.acquire_many(self.config.concurrency.max(1) as u32).await;
            let _ = recorder.await;
        })
        .await;
    }

    /// Stores attempts' results as they come, those that came during the
    /// last write together in the next (one transaction, not one per
    /// delivery: on SQLite every commit is a sync to disk).
    async fn record(self: Arc<Self>, mut results: mpsc::UnboundedReceiver<Attempted>) {
        let mut batch = Vec::new();
        while results.recv_many(&mut batch, RECORD_BATCH).await > 0 {
            // The slots are given back when `_slots` drops, after the write.
            let (rows, _slots): (Vec<DeliveryResult>, Vec<OwnedSemaphorePermit>) =
                batch.drain(..).map(|a| (a.result, a.slot)).unzip();
            match self.store.record_deliveries(&rows).await {
                Ok(changed) => {
                    for (r, changed) in rows.iter().zip(changed) {
                        if !changed && !matches!(r.outcome, DeliveryOutcome::Delivered { .. }) {
                            tracing::info!(
                                delivery = r.id,
                                "delivery claimed again since this attempt began; its failure is not recorded"
                            );
                        }
                    }
                }
                // Their claims run out and they are attempted again: at least once.
                Err(e) => tracing::warn!(deliveries = rows.len(), error = %e, "delivery: cannot record the results"),
            }
            for r in &rows {
                self.metrics
                    .deliveries
                    .get_or_create(&ResultLabel {
                        result: result_label(&r.outcome),
                    })
                    .inc();
            }
        }
    }

    /// Sends one claimed delivery; the result to record, unless there is
    /// nothing to record (an endpoint that answered 410 Gone is disabled
    /// and the delivery waits, in one write of its own).
    async fn deliver(&self, d: ClaimedDelivery) -> Option<DeliveryResult> {
        let span = tracing::info_span!(
            "delivery.send",
            endpoint = %d.endpoint,
            event_id = %d.change.event_id,
            item = d.change.item_id.as_deref().unwrap_or(""),
            author = d.change.author.as_deref().unwrap_or(""),
            attempt = d.attempts
        );
        self.attempt(&d).instrument(span).await
    }

    async fn attempt(&self, d: &ClaimedDelivery) -> Option<DeliveryResult> {
        // Claimed only for known endpoints; the configuration is fixed for
        // the life of the process.
        let endpoint = self.endpoints.get(&d.endpoint)?;
        let result = self.post(endpoint, d).await;
        let now = now_ms();
        let outcome = match result {
            Ok(()) => DeliveryOutcome::Delivered { at: now },
            Err(failure) if failure.gone => {
                if let Err(e) = self.disable(d, &failure, now).await {
                    // The lease runs out and the delivery is attempted again.
                    tracing::warn!(error = %e, "delivery: cannot record the result");
                }
                self.metrics
                    .deliveries
                    .get_or_create(&ResultLabel { result: "gone" })
                    .inc();
                return None;
            }
            Err(failure) => {
                let error = failure.reason.clone();
                if d.attempts >= i64::from(self.config.max_attempts) {
                    tracing::error!(%error, "delivery dead-lettered; replay it once the endpoint works");
                    DeliveryOutcome::Dead { error }
                } else {
                    let wait = self.retry_in_ms(d, &failure);
                    tracing::warn!(%error, retry_in_ms = wait, "delivery failed; retrying");
                    DeliveryOutcome::Retry { at: now + wait, error }
                }
            }
        };
        Some(DeliveryResult {
            id: d.id,
            attempts: d.attempts,
            outcome,
        })
    }

    /// The wait before the next attempt: today's backoff, or the
    /// receiver's `Retry-After` when that is longer.
    fn retry_in_ms(&self, d: &ClaimedDelivery, failure: &Failure) -> i64 {
        let backoff = crate::retry::backoff_ms(
            d.attempts as u32,
            self.config.retry_base_ms as i64,
            self.config.retry_max_ms as i64,
        );
        let asked = failure.retry_after.map_or(0, |wait| wait.as_millis() as i64);
        backoff.max(asked)
    }

    /// A `410 Gone`: the endpoint is disabled for every process; the
    /// delivery waits with the others until it is enabled again.
    async fn disable(&self, d: &ClaimedDelivery, failure: &Failure, now: i64) -> crate::store::StoreResult<()> {
        let reason = format!("{}: the receiver asked for no more deliveries", failure.reason);
        let disabled = self.store.disable_endpoint(&d.endpoint, d.id, &reason, now).await?;
        if disabled {
            self.metrics.webhook_endpoints_disabled.inc();
            tracing::error!(
                endpoint = %d.endpoint,
                "webhook endpoint answered 410 Gone and is disabled; its deliveries wait until \
                 POST /v1/webhooks/{}/enable (or the console's operations page)",
                d.endpoint
            );
        }
        Ok(())
    }

    /// `change` with its statement of reasons, when it is a restrictive
    /// decision of an item. A store that cannot be read fails the attempt
    /// (it is retried): an event never goes out without its statement.
    async fn with_statement(&self, change: &Change) -> crate::store::StoreResult<Option<Change>> {
        let Some(item) = change.item_id.as_deref() else {
            return Ok(None);
        };
        let restrictive = change.to_status.parse().is_ok_and(crate::statements::is_restrictive);
        if !restrictive || change.actor == crate::domain::Actor::Author {
            return Ok(None);
        }
        let Some(details) = self.items.item_details(item).await? else {
            return Ok(None);
        };
        let Some(t) = details.transitions.iter().find(|t| t.version == change.item_version) else {
            return Ok(None);
        };
        let mut with = change.clone();
        with.statement = Some(crate::statements::derive(&details, t, &self.policies).statement);
        Ok(Some(with))
    }

    async fn post(&self, endpoint: &WebhookConfig, d: &ClaimedDelivery) -> Result<(), Failure> {
        let secrets = self
            .keyring
            .webhook(&d.endpoint)
            .expect("every configured endpoint has its secrets");
        let body = match self.with_statement(&d.change).await {
            Ok(Some(change)) => serde_json::to_vec(&change),
            Ok(None) => serde_json::to_vec(&d.change),
            Err(e) => {
                return Err(Failure {
                    reason: format!("cannot read the decision's statement of reasons: {e}"),
                    gone: false,
                    retry_after: None,
                });
            }
        }
        .expect("a change serializes");
        let id = crate::signing::message_id(&d.change.event_id);
        let attempt = d.attempts.to_string();
        let legacy = [
            (EVENT_ID_HEADER, d.change.event_id.as_str()),
            (ATTEMPT_HEADER, attempt.as_str()),
        ];
        let headers: &[(&str, &str)] = if self.legacy_headers { &legacy } else { &[] };
        let signing = Signing {
            secrets: &secrets,
            legacy: self.legacy_headers,
        };
        let message = Message {
            id: &id,
            body,
            headers,
            timeout: None,
        };
        self.http.post(&endpoint.url, signing, message).await
    }
}
