//! The moderator console: server-rendered pages at `/console`, served by
//! `all` and `api` processes, with every asset compiled into the binary.
//!
//! It is a second front end on the same store functions as the HTTP API:
//! a decision goes through [`crate::api::decide`] (the same conditional
//! transition, audit row, reversal count and outbox event as
//! `POST /v1/items/{id}/moderation`), with the version the page showed as
//! `If-Match`; a list edit goes through the code of `PATCH /v1/lists/{name}`,
//! based on the version the page showed. What the console adds is its own state: sign-in sessions and
//! exclusive review claims ([`crate::store::Review`]).
//!
//! Security, page by page:
//! - item text and every stored string are attacker-controlled: maud
//!   escapes every splice, and nothing is ever spliced unescaped;
//! - `Content-Security-Policy` allows only the console's own script and
//!   style files (no inline script, no inline style, nothing from elsewhere);
//! - the session cookie is `HttpOnly`, `SameSite=Strict`, scoped to
//!   `/console`, and `Secure` behind TLS; every state change also needs the
//!   session's CSRF token (`session.rs`);
//! - the identity in the audit trail is the moderator token's name, stored
//!   with the session, never a form field.

mod appeals;
mod item;
mod layout;
mod lists;
mod pages;
mod queue;
mod session;

use crate::api::AppState;
use axum::Router;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

/// Every page and action of the console, nested under `/console`.
pub fn router(state: AppState) -> Router {
    let pages = Router::new()
        .route("/", get(|| async { layout::see_other("/console/queue") }))
        .route("/login", get(session::login_page).post(session::login))
        .route("/logout", post(session::logout))
        .route("/queue", get(queue::queue_page))
        .route("/review/start", post(queue::start_review))
        .route("/items/{id}", get(item::item_page))
        .route("/items/{id}/decide", post(item::decide))
        .route("/items/{id}/skip", post(item::skip))
        .route("/items/{id}/claim", post(item::renew_claim))
        .route("/appeals", get(appeals::appeals_page))
        .route("/appeals/next", post(appeals::take_next))
        .route("/appeals/{id}", get(appeals::appeal_page))
        .route("/appeals/{id}/decide", post(appeals::decide))
        .route("/plugins", get(pages::plugins_page))
        .route("/operations", get(pages::operations_page))
        .route("/dead-letters/{id}/replay", post(pages::replay_dead_letter))
        .route("/deliveries/{id}/replay", post(pages::replay_delivery))
        .route("/webhooks/{endpoint}/enable", post(pages::enable_endpoint))
        .route("/lists", get(lists::lists_page))
        .route("/lists/{name}", get(lists::list_page))
        .route("/lists/{name}/diff", get(lists::diff_page))
        .route("/lists/{name}/add", post(lists::add_entry))
        .route("/lists/{name}/remove", post(lists::remove_entry))
        .route("/search", get(pages::search_page))
        .route("/assets/console.css", get(stylesheet))
        .route("/assets/console.js", get(script))
        .route("/assets/favicon.svg", get(favicon))
        .fallback(|| async { layout::PageError::new(StatusCode::NOT_FOUND, "No such page.") })
        .layer(axum::extract::DefaultBodyLimit::max(64 * 1024))
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(|_| {
            layout::PageError::new(StatusCode::INTERNAL_SERVER_ERROR, "Internal error; it has been logged.")
                .into_response()
        }))
        .layer(axum::middleware::map_response(security_headers))
        .with_state(state);
    Router::new().nest("/console", pages)
}

/// Headers on every console response: the content security policy, no
/// framing, no sniffing, no referrer, no caching of pages with item text.
async fn security_headers(mut response: Response) -> Response {
    const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
                       connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";
    let h = response.headers_mut();
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    h.entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
    response
}

async fn stylesheet() -> Response {
    asset(include_str!("assets/console.css"), "text/css; charset=utf-8")
}

async fn script() -> Response {
    asset(include_str!("assets/console.js"), "text/javascript; charset=utf-8")
}

async fn favicon() -> Response {
    asset(include_str!("assets/favicon.svg"), "image/svg+xml")
}

fn asset(body: &'static str, content_type: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "public, max-age=300"),
        ],
        body,
    )
        .into_response()
}
