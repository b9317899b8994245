//! A stand-in classifier for demos and tests (`gavel dev fake-provider`):
//! accepts gavel's signed requests, records them, and answers each with a
//! signed callback after a delay, as many times as asked (a provider
//! retrying its webhook), or never.

use super::{Callback, ProviderRequest};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How the fake provider answers.
#[derive(Debug, Clone)]
pub struct FakeOptions {
    /// Verifies gavel's requests and signs callbacks.
    pub secret: String,
    /// The verdict of every answer.
    pub verdict: String,
    pub reason: String,
    /// Wait this long before answering.
    pub delay: Duration,
    /// Send each answer this many times (same event id).
    pub copies: u32,
    /// Never answer (requests are still recorded).
    pub silent: bool,
    /// Answer the first this many sends of each request with 503 (gavel retries with the same key).
    pub fail_first: u32,
}

struct Shared {
    options: FakeOptions,
    received: Mutex<Vec<ProviderRequest>>,
    sends: Mutex<std::collections::HashMap<String, u32>>,
    http: reqwest::Client,
}

/// A running fake provider.
pub struct FakeProvider {
    /// POST requests here (configure it as the provider's `url`).
    pub url: String,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl FakeProvider {
    /// Serves on `listener` until dropped.
    pub fn start(listener: tokio::net::TcpListener, options: FakeOptions) -> std::io::Result<FakeProvider> {
        let url = format!("http://{}/classify", listener.local_addr()?);
        let shared = Arc::new(Shared {
            options,
            received: Mutex::new(Vec::new()),
            sends: Mutex::new(std::collections::HashMap::new()),
            http: reqwest::Client::new(),
        });
        let app = axum::Router::new()
            .route("/classify", post(classify))
            .with_state(shared.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(FakeProvider { url, shared, task })
    }

    /// Every request received so far, in arrival order.
    pub fn received(&self) -> Vec<ProviderRequest> {
        self.shared.received.lock().expect("not poisoned").clone()
    }

    /// Serves until the task ends (for the CLI).
    pub async fn wait(&mut self) {
        let _ = (&mut self.task).await;
    }
}

impl Drop for FakeProvider {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn classify(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let Ok(secret) = crate::signing::Secret::parse(&shared.options.secret) else {
        tracing::error!("fake provider: the secret is not valid");
        return StatusCode::INTERNAL_SERVER_ERROR;
    };
    if let Err(e) = crate::signing::verify(
        std::slice::from_ref(&secret),
        true,
        header,
        &body,
        crate::signing::now_secs(),
    ) {
        tracing::warn!(error = %e, "fake provider: request refused");
        return StatusCode::UNAUTHORIZED;
    }
    let Ok(request) = serde_json::from_slice::<ProviderRequest>(&body) else {
        return StatusCode::BAD_REQUEST;
    };
    if header("idempotency-key") != Some(request.request_key.as_str()) {
        return StatusCode::BAD_REQUEST;
    }
    tracing::info!(item = %request.item_id, request_key = %request.request_key, attempt = request.attempt, "fake provider: request");
    shared.received.lock().expect("not poisoned").push(request.clone());
    let sends = {
        let mut sends = shared.sends.lock().expect("not poisoned");
        let n = sends.entry(request.request_key.clone()).or_insert(0);
        *n += 1;
        *n
    };
    if sends <= shared.options.fail_first {
        return StatusCode::SERVICE_UNAVAILABLE;
    }
    // A retry of a request already accepted is answered once only.
    if !shared.options.silent && sends == shared.options.fail_first + 1 {
        let shared = shared.clone();
        tokio::spawn(async move {
            tokio::time::sleep(shared.options.delay).await;
            let answer = Callback {
                event_id: format!("{}/answer", request.request_key),
                request_key: request.request_key.clone(),
                item_id: request.item_id.clone(),
                verdict: shared.options.verdict.clone(),
                score: 0.9,
                label: Some("fake-provider".into()),
                labels: Vec::new(),
                reason: shared.options.reason.clone(),
            };
            for _ in 0..shared.options.copies.max(1) {
                match send_callback(&shared.http, &request.callback_url, &secret, &answer).await {
                    Ok(status) => tracing::info!(event_id = %answer.event_id, %status, "fake provider: callback sent"),
                    Err(e) => tracing::warn!(error = %e, "fake provider: callback failed"),
                }
            }
        });
    }
    StatusCode::ACCEPTED
}

/// POSTs `callback` to `url`, signed now with `secret` (Standard
/// Webhooks, the callback's event id as the message id); returns the status.
pub async fn send_callback(
    http: &reqwest::Client,
    url: &str,
    secret: &crate::signing::Secret,
    callback: &Callback,
) -> reqwest::Result<reqwest::StatusCode> {
    let body = serde_json::to_vec(callback).expect("a callback serializes");
    let id = crate::signing::message_id(&callback.event_id);
    send_signed(http, url, secret, &id, crate::signing::now_secs(), body).await
}

/// POSTs raw `body` as message `id`, signed with `secret` at `timestamp` (seconds).
pub async fn send_signed(
    http: &reqwest::Client,
    url: &str,
    secret: &crate::signing::Secret,
    id: &str,
    timestamp: i64,
    body: Vec<u8>,
) -> reqwest::Result<reqwest::StatusCode> {
    let signature = crate::signing::sign(std::slice::from_ref(secret), id, timestamp, &body);
    Ok(http
        .post(url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .header(crate::signing::ID_HEADER, id)
        .header(crate::signing::TIMESTAMP_HEADER, timestamp.to_string())
        .header(crate::signing::SIGNATURE_HEADER, signature)
        .body(body)
        .send()
        .await?
        .status())
}
