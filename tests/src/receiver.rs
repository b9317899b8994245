//! A webhook receiver for the delivery tests: verifies gavel's signature
//! (the Standard Webhooks headers, with gavel's own verifier),
//! and can fail, hang, answer a fixed status, or be slow, on demand.
//! It records what it accepted (answered 2xx), in arrival order.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use gavel::store::Change;
use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How the receiver behaves; change it while it runs.
#[derive(Default)]
pub struct Behaviour {
    /// Per mille of requests answered 500.
    pub fail_per_mille: AtomicU32,
    /// Per mille of requests that hang (never answered in time).
    pub hang_per_mille: AtomicU32,
    /// When non-zero, every request is answered with this status.
    pub status: AtomicU16,
    /// Delay before answering, in ms.
    pub delay_ms: AtomicU64,
    /// When set, every request is answered `307 Temporary Redirect` there.
    pub redirect_to: Mutex<Option<String>>,
}

struct Shared {
    secret: String,
    behaviour: Arc<Behaviour>,
    accepted: Mutex<Vec<Change>>,
    requests: AtomicU64,
    bad_signatures: AtomicU64,
    rng: Mutex<crate::Rng>,
}

/// A running receiver.
pub struct Receiver {
    pub url: String,
    pub behaviour: Arc<Behaviour>,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Receiver {
    pub async fn start(secret: &str, seed: u64) -> Receiver {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        let behaviour = Arc::new(Behaviour::default());
        let shared = Arc::new(Shared {
            secret: secret.to_string(),
            behaviour: behaviour.clone(),
            accepted: Mutex::new(Vec::new()),
            requests: AtomicU64::new(0),
            bad_signatures: AtomicU64::new(0),
            rng: Mutex::new(crate::Rng(seed | 1)),
        });
        let app = axum::Router::new()
            .route("/hook", axum::routing::post(hook))
            .with_state(shared.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Receiver {
            url,
            behaviour,
            shared,
            task,
        }
    }

    /// Events answered 2xx, in arrival order (duplicates included).
    pub fn accepted(&self) -> Vec<Change> {
        self.shared.accepted.lock().unwrap().clone()
    }

    /// Every request received, whatever the answer.
    pub fn requests(&self) -> u64 {
        self.shared.requests.load(Ordering::Relaxed)
    }

    pub fn bad_signatures(&self) -> u64 {
        self.shared.bad_signatures.load(Ordering::Relaxed)
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn hook(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> axum::response::Response {
    use axum::response::IntoResponse;
    shared.requests.fetch_add(1, Ordering::Relaxed);
    if let Some(to) = shared.behaviour.redirect_to.lock().unwrap().clone() {
        return (StatusCode::TEMPORARY_REDIRECT, [(axum::http::header::LOCATION, to)]).into_response();
    }
    answer(&shared, &headers, &body).await.into_response()
}

async fn answer(shared: &Shared, headers: &HeaderMap, body: &Bytes) -> StatusCode {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let secret = gavel::signing::Secret::parse(&shared.secret).expect("a valid secret");
    if gavel::signing::verify(
        std::slice::from_ref(&secret),
        false,
        header,
        body,
        gavel::signing::now_secs(),
    )
    .is_err()
    {
        shared.bad_signatures.fetch_add(1, Ordering::Relaxed);
        return StatusCode::UNAUTHORIZED;
    }
    let b = &shared.behaviour;
    let roll = shared.rng.lock().unwrap().below(1000) as u32;
    let delay = b.delay_ms.load(Ordering::Relaxed);
    if delay > 0 {
        tokio::time::sleep(Duration::from_millis(delay)).await;
    }
    if roll < b.hang_per_mille.load(Ordering::Relaxed) {
        // Longer than any delivery timeout in the tests.
        tokio::time::sleep(Duration::from_secs(30)).await;
        return StatusCode::GATEWAY_TIMEOUT;
    }
    if roll >= 500 && roll - 500 < b.fail_per_mille.load(Ordering::Relaxed) {
        return StatusCode::INTERNAL_SERVER_ERROR;
    }
    let status = b.status.load(Ordering::Relaxed);
    if status != 0 {
        return StatusCode::from_u16(status).unwrap();
    }
    let Ok(change) = serde_json::from_slice::<Change>(body) else {
        return StatusCode::BAD_REQUEST;
    };
    if header(gavel::signing::ID_HEADER) != Some(gavel::signing::message_id(&change.event_id).as_str()) {
        return StatusCode::BAD_REQUEST;
    }
    shared.accepted.lock().unwrap().push(change);
    StatusCode::NO_CONTENT
}
