//! The HTTP API (v1). `router(state)` builds the whole app, so tests can
//! serve it on port 0; every response error uses the one JSON format.

mod auth;
mod delivery;
mod error;
mod items;
mod moderation;
mod providers;
mod system;

pub use auth::{Caller, Tokens};
pub use delivery::ChangesPage;
pub use error::{ApiError, ErrorBody};
pub use items::{EventRequest, EventResponse, ItemView, SubmitRequest, SubmitResponse};
pub use providers::CallbackResponse;

use crate::config::Config;
use crate::metrics::Metrics;
use crate::rules::Registry;
use crate::store::{SharedStore, Writes};
use crate::worker::Scheduler;
use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderName, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use governor::{DefaultKeyedRateLimiter, Quota};
use std::num::NonZeroU32;
use std::sync::Arc;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use utoipa::OpenApi;

/// A keyed token-bucket limiter.
pub type RateLimiter = DefaultKeyedRateLimiter<String>;

/// What every handler can reach.
#[derive(Clone)]
pub struct AppState {
    pub config: Arc<Config>,
    pub store: SharedStore,
    /// The store's group-committed writes (submissions).
    pub writes: Writes,
    pub registry: Arc<Registry>,
    pub scheduler: Scheduler,
    /// Everything `/metrics` exports (the queue lag drives degraded mode).
    pub metrics: Arc<Metrics>,
    pub tokens: Arc<Tokens>,
    pub client_limiter: Arc<RateLimiter>,
    pub author_limiter: Arc<RateLimiter>,
}

impl AppState {
    pub fn new(
        config: Arc<Config>,
        store: SharedStore,
        writes: Writes,
        registry: Arc<Registry>,
        scheduler: Scheduler,
        metrics: Arc<Metrics>,
        tokens: Tokens,
    ) -> Self {
        let quota = |rate: u32, burst: u32| {
            Quota::per_second(NonZeroU32::new(rate.max(1)).expect("max(1) is non-zero"))
                .allow_burst(NonZeroU32::new(burst.max(1)).expect("max(1) is non-zero"))
        };
        let i = &config.ingest;
        AppState {
            client_limiter: Arc::new(RateLimiter::keyed(quota(i.client_rate_per_second, i.client_burst))),
            author_limiter: Arc::new(RateLimiter::keyed(quota(i.author_rate_per_second, i.author_burst))),
            config,
            store,
            writes,
            registry,
            scheduler,
            metrics,
            tokens: Arc::new(tokens),
        }
    }
}

#[derive(OpenApi)]
#[openapi(
    info(title = "gavel", description = "Moderation and anti-spam rule host"),
    paths(
        items::submit, items::append_event, items::get_item,
        moderation::moderate, moderation::review_queue, moderation::evaluate_now,
        moderation::dead_letters, moderation::replay_dead_letter,
        delivery::changes, delivery::deliveries, delivery::replay_delivery, providers::callback,
        system::plugins, system::plugin_history, system::healthz, system::readyz, system::metrics, system::openapi,
    ),
    components(schemas(ErrorBody)),
    modifiers(&BearerAuth),
    tags(
        (name = "items", description = "Client routes: submit content and events, read items"),
        (name = "moderator", description = "Routes that need a moderator token"),
        (name = "providers", description = "Callbacks of external classifiers, signed with HMAC-SHA256"),
        (name = "system", description = "Health and documentation, no token"),
    )
)]
struct ApiDoc;

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The OpenAPI document, generated from the handlers' annotations.
pub fn openapi_json() -> String {
    let mut doc = ApiDoc::openapi();
    doc.openapi = utoipa::openapi::OpenApiVersion::Version31;
    doc.to_pretty_json().expect("the OpenAPI document serializes")
}

/// The whole HTTP app.
pub fn router(state: AppState) -> Router {
    let request_id = HeaderName::from_static("x-request-id");
    Router::new()
        .route("/v1/items", post(items::submit))
        .route("/v1/items/{id}", get(items::get_item))
        .route("/v1/items/{id}/events", post(items::append_event))
        .route("/v1/items/{id}/moderation", post(moderation::moderate))
        .route("/v1/items/{id}/evaluate", post(moderation::evaluate_now))
        .route("/v1/review-queue", get(moderation::review_queue))
        .route("/v1/dead-letters", get(moderation::dead_letters))
        .route("/v1/dead-letters/{id}/replay", post(moderation::replay_dead_letter))
        .route("/v1/changes", get(delivery::changes))
        .route("/v1/deliveries", get(delivery::deliveries))
        .route("/v1/deliveries/{id}/replay", post(delivery::replay_delivery))
        .route("/v1/provider-callbacks/{provider}", post(providers::callback))
        .route("/v1/plugins", get(system::plugins))
        .route("/v1/plugins/history", get(system::plugin_history))
        .route("/healthz", get(system::healthz))
        .route("/readyz", get(system::readyz))
        .route("/metrics", get(system::metrics))
        .route("/openapi.json", get(system::openapi))
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "method not allowed on this route",
            )
        })
        .layer(DefaultBodyLimit::max(state.config.ingest.max_body_bytes))
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(panic_response))
        .layer(PropagateRequestIdLayer::new(request_id.clone()))
        .layer(SetRequestIdLayer::new(request_id, MakeRequestUuid))
        .with_state(state)
}

/// The routes of a `worker` process: health only.
pub fn health_router(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(system::healthz))
        .route("/readyz", get(system::readyz))
        .route("/metrics", get(system::metrics))
        .fallback(|| async {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "not_found",
                "a worker process serves only /healthz and /readyz",
            )
        })
        .with_state(state)
}

/// Turns a panic in a handler into the one error format (500), so even a
/// bug never answers with a dropped connection.
pub fn panic_response(_: Box<dyn std::any::Any + Send + 'static>) -> axum::response::Response {
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal",
        "internal error; it has been logged",
    )
    .into_response()
}
