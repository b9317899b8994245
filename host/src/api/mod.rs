//! The HTTP API (v1). `router(state)` builds the whole app, so tests can
//! serve it on port 0; every response error uses the one JSON format.
//! [`route_table`] lists every route with who may call it, from the same
//! builder the router is made by.

mod appeals;
mod auth;
mod authors;
mod backtests;
mod delivery;
mod error;
mod events;
mod exports;
mod idempotency;
mod items;
mod limits;
mod lists;
mod moderation;
mod providers;
mod schema;
mod signals;
mod submit;
mod system;
mod validate;

pub(crate) use appeals::{AppealDecision, AppealOutcome, close as close_appeal};
pub use auth::{Caller, Tokens};
pub use delivery::ChangesPage;
pub use error::{ApiError, ErrorBody};
pub use events::{EventRequest, EventResponse};
pub use items::ItemView;
pub use limits::AuthorLimiter;
pub(crate) use lists::edit_entries;
pub use moderation::{decide, may_set};
pub use providers::CallbackResponse;
pub use submit::{SubmitRequest, SubmitResponse};
pub use system::{PluginView, PluginsView, plugins_view};

use crate::config::Config;
use crate::metrics::Metrics;
use crate::rules::{EvaluationPool, Registry};
use crate::store::{SharedStore, Writes};
use crate::worker::Scheduler;
use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, delete, get, patch, post, put};
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
    /// The store's group-committed writes (submissions, events).
    pub writes: Writes,
    pub registry: Arc<Registry>,
    /// The evaluation threads (sync-phase rules run there too).
    pub pool: Arc<EvaluationPool>,
    pub scheduler: Scheduler,
    /// Everything `/metrics` exports (the queue lag drives degraded mode).
    pub metrics: Arc<Metrics>,
    pub tokens: Arc<Tokens>,
    pub client_limiter: Arc<RateLimiter>,
    pub author_limiter: Arc<AuthorLimiter>,
    /// Backtests run one at a time per process, at most
    /// `backtests::MAX_QUEUED` held at once (see `backtests.rs`).
    pub(crate) backtests: Arc<backtests::Runner>,
    /// `config.standing`, shared with every submission's write.
    pub standing: Arc<crate::domain::standing::StandingPolicy>,
    /// `config.policies` and `config.statements`: what statements of
    /// reasons are derived under.
    pub policies: Arc<crate::domain::statements::Policies>,
    /// The providers' secrets that verify their callbacks.
    pub keyring: Arc<crate::secrets::Keyring>,
    /// The compiled version of every list this process serves.
    pub lists: Arc<crate::lists::ServedLists>,
    /// Entity signals: items are added as they are created.
    pub signals: Arc<crate::signals::Signals>,
}

/// The parts an [`AppState`] is made of.
pub struct StateParts {
    pub config: Arc<Config>,
    pub store: SharedStore,
    pub writes: Writes,
    pub registry: Arc<Registry>,
    pub pool: Arc<EvaluationPool>,
    pub scheduler: Scheduler,
    pub metrics: Arc<Metrics>,
    pub tokens: Tokens,
    pub keyring: Arc<crate::secrets::Keyring>,
    pub lists: Arc<crate::lists::ServedLists>,
    pub signals: Arc<crate::signals::Signals>,
}

impl AppState {
    pub fn new(p: StateParts) -> Self {
        let i = &p.config.ingest;
        let client = Quota::per_second(NonZeroU32::new(i.client_rate_per_second.max(1)).expect("max(1) is non-zero"))
            .allow_burst(NonZeroU32::new(i.client_burst.max(1)).expect("max(1) is non-zero"));
        AppState {
            client_limiter: Arc::new(RateLimiter::keyed(client)),
            author_limiter: Arc::new(AuthorLimiter::new(
                i.author_rate_per_second,
                i.author_burst,
                i.author_limiter_max_keys,
            )),
            standing: Arc::new(p.config.standing.clone()),
            policies: Arc::new(crate::domain::statements::Policies::new(
                &p.config.policies,
                &p.config.statements,
            )),
            config: p.config,
            store: p.store,
            writes: p.writes,
            registry: p.registry,
            pool: p.pool,
            scheduler: p.scheduler,
            metrics: p.metrics,
            tokens: Arc::new(p.tokens),
            keyring: p.keyring,
            backtests: Arc::new(backtests::Runner::default()),
            lists: p.lists,
            signals: p.signals,
        }
    }
}

/// Who may call a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// No token (health, metrics, the document).
    Public,
    /// Any token; a client token sees its own items.
    Client,
    /// A moderator token.
    Moderator,
    /// A provider's HMAC signature.
    Provider,
}

/// One route of the API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteInfo {
    pub method: Method,
    /// axum's path syntax (`/v1/items/{id}`).
    pub path: &'static str,
    pub access: Access,
}

/// Builds the router and the table of its routes together.
struct Routes {
    router: Router<AppState>,
    table: Vec<RouteInfo>,
}

impl Routes {
    fn add(mut self, method: Method, path: &'static str, access: Access, handler: MethodRouter<AppState>) -> Self {
        self.table.push(RouteInfo { method, path, access });
        self.router = self.router.route(path, handler);
        self
    }
}

fn routes() -> Routes {
    use Access::*;
    Routes {
        router: Router::new(),
        table: Vec::new(),
    }
    .add(Method::POST, "/v1/items", Client, post(submit::submit))
    .add(Method::POST, "/v1/items/batch", Client, post(submit::submit_batch))
    .add(Method::GET, "/v1/items/{id}", Client, get(items::get_item))
    .add(Method::DELETE, "/v1/items/{id}", Client, delete(items::delete_item))
    .add(
        Method::POST,
        "/v1/items/{id}/events",
        Client,
        post(events::append_event),
    )
    .add(Method::POST, "/v1/events/batch", Client, post(events::append_batch))
    .add(
        Method::POST,
        "/v1/items/{id}/moderation",
        Moderator,
        post(moderation::moderate),
    )
    .add(
        Method::POST,
        "/v1/items/{id}/evaluate",
        Moderator,
        post(moderation::evaluate_now),
    )
    .add(
        Method::GET,
        "/v1/review-queue",
        Moderator,
        get(moderation::review_queue),
    )
    .add(
        Method::GET,
        "/v1/dead-letters",
        Moderator,
        get(moderation::dead_letters),
    )
    .add(
        Method::POST,
        "/v1/dead-letters/{id}/replay",
        Moderator,
        post(moderation::replay_dead_letter),
    )
    .add(
        Method::GET,
        "/v1/items/{id}/statements",
        Client,
        get(appeals::item_statements),
    )
    .add(
        Method::POST,
        "/v1/items/{id}/appeals",
        Client,
        post(appeals::open_appeal),
    )
    .add(
        Method::GET,
        "/v1/items/{id}/appeals",
        Client,
        get(appeals::item_appeals),
    )
    .add(Method::GET, "/v1/appeals", Moderator, get(appeals::appeal_queue))
    .add(
        Method::GET,
        "/v1/appeals/figures",
        Moderator,
        get(appeals::appeal_figures),
    )
    .add(Method::GET, "/v1/appeals/{id}", Client, get(appeals::get_appeal))
    .add(
        Method::POST,
        "/v1/appeals/{id}/decision",
        Moderator,
        post(appeals::decide_appeal),
    )
    .add(Method::GET, "/v1/authors/{author}", Client, get(authors::get_author))
    .add(
        Method::GET,
        "/v1/authors/{author}/statements",
        Client,
        get(authors::author_statements),
    )
    .add(
        Method::POST,
        "/v1/authors/{author}/moderation",
        Moderator,
        post(authors::moderate_author),
    )
    .add(Method::GET, "/v1/changes", Client, get(delivery::changes))
    .add(Method::GET, "/v1/deliveries", Moderator, get(delivery::deliveries))
    .add(
        Method::POST,
        "/v1/deliveries/{id}/replay",
        Moderator,
        post(delivery::replay_delivery),
    )
    .add(Method::GET, "/v1/webhooks", Moderator, get(delivery::webhook_endpoints))
    .add(
        Method::POST,
        "/v1/webhooks/{endpoint}/enable",
        Moderator,
        post(delivery::enable_endpoint),
    )
    .add(
        Method::POST,
        "/v1/provider-callbacks/{provider}",
        Provider,
        post(providers::callback),
    )
    .add(
        Method::GET,
        "/v1/items/{id}/replay",
        Client,
        get(backtests::replay_item),
    )
    // Candidate lists make a backtest's body as big as a list's
    // (`lists.max_body_bytes`, see `lists::ListBody`).
    .add(
        Method::POST,
        "/v1/backtests",
        Moderator,
        post(backtests::start).layer(DefaultBodyLimit::disable()),
    )
    .add(Method::GET, "/v1/backtests", Moderator, get(backtests::list))
    .add(Method::GET, "/v1/backtests/{id}", Moderator, get(backtests::get_one))
    .add(
        Method::DELETE,
        "/v1/backtests/{id}",
        Moderator,
        delete(backtests::cancel),
    )
    .add(
        Method::GET,
        "/v1/backtests/{id}/report.html",
        Moderator,
        get(backtests::report_html),
    )
    .add(Method::GET, "/v1/exports/{table}", Moderator, get(exports::export))
    .add(Method::GET, "/v1/lists", Moderator, get(lists::list_all))
    .add(Method::GET, "/v1/lists/{name}", Moderator, get(lists::get_list))
    // A list is bigger than an item: its body has its own limit
    // (`lists.max_body_bytes`, see `lists::ListBody`).
    .add(
        Method::PUT,
        "/v1/lists/{name}",
        Moderator,
        put(lists::replace).layer(DefaultBodyLimit::disable()),
    )
    .add(
        Method::PATCH,
        "/v1/lists/{name}",
        Moderator,
        patch(lists::patch).layer(DefaultBodyLimit::disable()),
    )
    .add(
        Method::GET,
        "/v1/lists/{name}/versions",
        Moderator,
        get(lists::versions),
    )
    .add(
        Method::GET,
        "/v1/lists/{name}/versions/{version}",
        Moderator,
        get(lists::get_version),
    )
    .add(Method::GET, "/v1/lists/{name}/diff", Moderator, get(lists::compare))
    .add(Method::GET, "/v1/plugins", Moderator, get(system::plugins))
    .add(
        Method::GET,
        "/v1/plugins/history",
        Moderator,
        get(system::plugin_history),
    )
    .add(Method::GET, "/v1/signals", Moderator, get(signals::list))
    .add(Method::GET, "/v1/signals/{name}", Moderator, get(signals::get_one))
    .add(Method::GET, "/healthz", Public, get(system::healthz))
    .add(Method::GET, "/readyz", Public, get(system::readyz))
    .add(Method::GET, "/metrics", Public, get(system::metrics))
    .add(Method::GET, "/openapi.json", Public, get(system::openapi))
}

/// Every route of [`router`], with who may call it.
pub fn route_table() -> Vec<RouteInfo> {
    routes().table
}

#[derive(OpenApi)]
#[openapi(
    info(title = "gavel", description = "Moderation and anti-spam rule host"),
    paths(
        submit::submit, submit::submit_batch, items::get_item, items::delete_item, events::append_event, events::append_batch,
        moderation::moderate, moderation::review_queue, moderation::evaluate_now,
        moderation::dead_letters, moderation::replay_dead_letter, authors::get_author, authors::moderate_author,
        authors::author_statements,        appeals::item_statements, appeals::open_appeal, appeals::item_appeals, appeals::appeal_queue,
        appeals::appeal_figures, appeals::get_appeal, appeals::decide_appeal,
        delivery::changes, delivery::deliveries, delivery::replay_delivery, delivery::webhook_endpoints,
        delivery::enable_endpoint, providers::callback,
        backtests::replay_item, backtests::start, backtests::list, backtests::get_one, backtests::cancel,
        backtests::report_html, exports::export,
        lists::list_all, lists::get_list, lists::replace, lists::patch, lists::versions, lists::get_version, lists::compare,
        signals::list, signals::get_one,
        system::plugins, system::plugin_history, system::healthz, system::readyz, system::metrics, system::openapi,
    ),
    components(schemas(ErrorBody)),
    modifiers(&BearerAuth),
    tags(
        (name = "items", description = "Client routes: submit content and events, read items"),
        (name = "authors", description = "Authors' account standing: a client reads its own authors"),
        (name = "appeals", description = "Statements of reasons of restrictive decisions, and their appeals"),
        (name = "moderator", description = "Routes that need a moderator token"),
        (name = "lists", description = "Lists moderators edit at runtime, versioned (moderator token)"),
        (name = "providers", description = "Callbacks of external classifiers, signed per Standard Webhooks (HMAC-SHA256)"),
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

/// The OpenAPI document, generated from the handlers' annotations, with
/// this deployment's text limit.
pub fn openapi_json(max_text_chars: usize) -> String {
    let mut doc = ApiDoc::openapi();
    schema::complete(&mut doc, max_text_chars);
    doc.openapi = utoipa::openapi::OpenApiVersion::Version31;
    doc.to_pretty_json().expect("the OpenAPI document serializes")
}

/// The whole HTTP app.
pub fn router(state: AppState) -> Router {
    let request_id = HeaderName::from_static("x-request-id");
    let Routes { router, table } = routes();
    let timing = Arc::new(Timing {
        metrics: state.metrics.clone(),
        routes: table.iter().map(|r| r.path).collect(),
    });
    router
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
        .layer(axum::middleware::from_fn_with_state(timing, timed))
        .layer(PropagateRequestIdLayer::new(request_id.clone()))
        .layer(SetRequestIdLayer::new(request_id, MakeRequestUuid))
        .with_state(state)
}

/// What [`timed`] needs: the histogram, and every route's path, so that a
/// request's label is the route's own `&'static str` (no allocation).
struct Timing {
    metrics: Arc<Metrics>,
    routes: std::collections::HashSet<&'static str>,
}

/// Times each request into `gavel_http_request_duration_seconds` by
/// method, route (axum's [`MatchedPath`](axum::extract::MatchedPath), set
/// once the router has matched) and status, including the answers of the
/// layers inside it (a caught panic's 500, a body over the limit's 413).
async fn timed(
    axum::extract::State(timing): axum::extract::State<Arc<Timing>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let started = std::time::Instant::now();
    let route = request
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .and_then(|m| timing.routes.get(m.as_str()).copied())
        .unwrap_or("unmatched");
    let method = match *request.method() {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        _ => "other",
    };
    let response = next.run(request).await;
    let labels = crate::metrics::HttpLabels {
        method,
        route,
        status: response.status().as_u16(),
    };
    timing
        .metrics
        .http_request_duration_seconds
        .get_or_create(&labels)
        .observe(started.elapsed().as_secs_f64());
    response
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
                "a worker process serves only /healthz, /readyz and /metrics",
            )
        })
        .with_state(state)
}

/// Turns a panic in a handler into the one error format (500), so even a
/// bug never answers with a dropped connection.
pub fn panic_response(_: Box<dyn std::any::Any + Send + 'static>) -> Response {
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal",
        "internal error; it has been logged",
    )
    .into_response()
}

/// A JSON body with its content type.
fn json_response(status: StatusCode, body: String) -> Response {
    let mut r = (status, body).into_response();
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// The request id the middleware put on the request (and echoes back).
pub(crate) fn request_id(headers: &HeaderMap) -> String {
    headers
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .map_or_else(|| uuid::Uuid::now_v7().to_string(), str::to_string)
}

/// 429 with `Retry-After` when `key` is over its rate.
fn rate_limited(limiter: &RateLimiter, key: &str) -> Result<(), ApiError> {
    limiter.check_key(&key.to_string()).map_err(|not_until| {
        let wait = not_until.wait_time_from(governor::clock::Clock::now(&governor::clock::DefaultClock::default()));
        limits::too_many(wait)
    })
}
