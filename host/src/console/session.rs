//! Signing in: a moderator token is exchanged for a session cookie, and
//! every state change of the session carries its CSRF token.
//!
//! The cookie holds 32 random bytes (hex); the store keeps only their
//! sha256, so a database read does not yield a usable session. A session is
//! bound to the secret of the moderator token it was signed in with, not
//! only to its name: giving a leaked token a new secret ends every session
//! made with the old one (see [`token_binding`]). The sign-in
//! form itself is protected by a double-submitted token (`gavel_login`
//! cookie = form field), so another site cannot sign a browser in to an
//! attacker's session. Cookie values are always our own hex strings, which
//! is why they are written and read here directly.

use super::layout::{self, PageError, page_shell};
use crate::api::AppState;
use crate::config::Role;
use crate::store::ConsoleSession;
use axum::extract::{FromRequest, FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use hmac::{Hmac, Mac};
use maud::html;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

const SESSION_COOKIE: &str = "gavel_session";
const LOGIN_COOKIE: &str = "gavel_login";

/// A signed-in moderator, for every page but the sign-in page.
pub struct SignedIn {
    /// The moderator token's name.
    pub moderator: String,
    pub csrf: String,
    id_hash: String,
}

impl SignedIn {
    /// Refuses a state change whose CSRF token is missing or wrong.
    pub fn check_csrf(&self, presented: Option<&str>) -> Result<(), PageError> {
        let ok = presented.is_some_and(|p| bool::from(p.as_bytes().ct_eq(self.csrf.as_bytes())));
        if ok {
            Ok(())
        } else {
            Err(PageError::new(
                StatusCode::FORBIDDEN,
                "The CSRF token of this request is missing or wrong: reload the page and try again.",
            ))
        }
    }
}

impl FromRequestParts<AppState> for SignedIn {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        let not_signed_in = || {
            if parts.method == axum::http::Method::GET {
                // Back to this page after signing in (a link from chat
                // arrives without the SameSite=Strict cookie).
                // Inside the router nested at /console, the URI lacks the prefix.
                let here = format!(
                    "/console{}",
                    parts.uri.path_and_query().map_or("/queue", |p| p.as_str())
                );
                let next = serde_urlencoded::to_string([("next", here)]).unwrap_or_default();
                layout::see_other(&format!("/console/login?{next}"))
            } else {
                PageError::new(StatusCode::UNAUTHORIZED, "Not signed in, or the session expired.").into_response()
            }
        };
        let Some(value) = cookie(&parts.headers, SESSION_COOKIE) else {
            return Err(not_signed_in());
        };
        let id_hash = digest(value);
        match state.store.session(&id_hash).await {
            Ok(Some(s)) if still_valid(state, value, &s) => Ok(SignedIn {
                moderator: s.moderator,
                csrf: s.csrf,
                id_hash,
            }),
            Ok(_) => Err(not_signed_in()),
            Err(e) => Err(PageError::from(e).into_response()),
        }
    }
}

/// A session lasts only while a moderator token of its name is configured
/// with the very secret it was signed in with.
fn still_valid(state: &AppState, cookie_value: &str, session: &ConsoleSession) -> bool {
    state.tokens.moderator_digest(&session.moderator).is_some_and(|token| {
        let expected = token_binding(cookie_value, &token);
        bool::from(expected.as_bytes().ct_eq(session.token_binding.as_bytes()))
    })
}

/// What ties a session to its token's secret: HMAC-SHA256 keyed by the
/// session's cookie value over the token's sha256, hex. The cookie value is
/// never stored, so the stored binding gives a reader of the database
/// nothing to test guessed tokens against.
fn token_binding(cookie_value: &str, token_digest: &[u8; 32]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(cookie_value.as_bytes()).expect("HMAC takes a key of any length");
    mac.update(token_digest);
    hex::encode(mac.finalize().into_bytes())
}

/// A form body; a malformed one is a 400 page, not a bare text answer.
pub struct ConsoleForm<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for ConsoleForm<T> {
    type Rejection = PageError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        axum::Form::<T>::from_request(req, state)
            .await
            .map(|axum::Form(t)| ConsoleForm(t))
            .map_err(|e| PageError::new(StatusCode::BAD_REQUEST, &e.body_text()))
    }
}

/// 32 random bytes, hex.
pub fn random_token() -> String {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).expect("the operating system's random source");
    hex::encode(bytes)
}

fn digest(value: &str) -> String {
    hex::encode(Sha256::digest(value.as_bytes()))
}

/// The value of cookie `name` in the request's `Cookie` headers.
fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(n, _)| *n == name)
        .map(|(_, v)| v)
}

/// A `Set-Cookie` value for the console's path; `max_age` 0 deletes it.
fn set_cookie(state: &AppState, headers: &HeaderMap, name: &str, value: &str, max_age_s: i64) -> HeaderValue {
    let behind_tls = headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|p| p.eq_ignore_ascii_case("https"));
    let secure = state.config.console.secure_cookies.unwrap_or(behind_tls);
    let cookie = format!(
        "{name}={value}; Path=/console; HttpOnly; SameSite=Strict; Max-Age={max_age_s}{}",
        if secure { "; Secure" } else { "" }
    );
    HeaderValue::from_str(&cookie).expect("cookie values are hex")
}

/// Where to go after signing in: a console page, or the queue. Only a path
/// of this console is followed, never another site.
fn destination(next: &str) -> &str {
    let safe = next.starts_with("/console/")
        && !next.contains("//")
        && !next.contains('\\')
        && next.bytes().all(|b| b.is_ascii_graphic());
    if safe { next } else { "/console/queue" }
}

#[derive(Deserialize)]
pub struct LoginQuery {
    #[serde(default)]
    next: String,
}

/// `GET /console/login`.
pub async fn login_page(
    State(state): State<AppState>,
    headers: HeaderMap,
    axum::extract::Query(q): axum::extract::Query<LoginQuery>,
) -> Response {
    // A second tab's sign-in page keeps the first one's token valid.
    let csrf = cookie(&headers, LOGIN_COOKIE)
        .filter(|c| c.len() == 64 && c.bytes().all(|b| b.is_ascii_hexdigit()))
        .map_or_else(random_token, str::to_string);
    let mut response = login_form(&csrf, destination(&q.next), None, StatusCode::OK);
    response.headers_mut().append(
        header::SET_COOKIE,
        set_cookie(&state, &headers, LOGIN_COOKIE, &csrf, 3600),
    );
    response
}

fn login_form(csrf: &str, next: &str, error: Option<&str>, status: StatusCode) -> Response {
    let body = html! {
        main.login {
            h1 { "gavel · moderator console" }
            @if let Some(e) = error { p #error.error { (e) } }
            form #login method="post" action="/console/login" {
                input type="hidden" name="csrf" value=(csrf);
                input type="hidden" name="next" value=(next);
                label for="token" { "Moderator token" }
                input #token type="password" name="token" autocomplete="current-password" required autofocus;
                button type="submit" { "Sign in" }
            }
            p.hint { "Use a token with the moderator role (" code { "tokens.toml" } " in the data directory)." }
        }
    };
    (status, page_shell("Sign in", None, body)).into_response()
}

#[derive(Deserialize)]
pub struct LoginForm {
    #[serde(default)]
    token: String,
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    next: String,
}

/// `POST /console/login`: a moderator token for a session cookie.
pub async fn login(
    State(state): State<AppState>,
    headers: HeaderMap,
    ConsoleForm(form): ConsoleForm<LoginForm>,
) -> Result<Response, PageError> {
    let expected = cookie(&headers, LOGIN_COOKIE).unwrap_or_default();
    if expected.is_empty() || !bool::from(expected.as_bytes().ct_eq(form.csrf.as_bytes())) {
        return Err(PageError::new(
            StatusCode::FORBIDDEN,
            "The sign-in form's CSRF token is missing or wrong: open the sign-in page again.",
        ));
    }
    let caller = state
        .tokens
        .verify(form.token.trim())
        .filter(|c| c.role == Role::Moderator);
    let Some(caller) = caller else {
        tracing::warn!("console sign-in refused: not a moderator token");
        return Ok(login_form(
            expected,
            destination(&form.next),
            Some("That is not a moderator token."),
            StatusCode::UNAUTHORIZED,
        ));
    };
    let token = state
        .tokens
        .moderator_digest(&caller.name)
        .expect("a verified moderator's token is configured");
    let session = random_token();
    let ttl = state.config.console.session_ttl_ms;
    let stored = ConsoleSession {
        token_binding: token_binding(&session, &token),
        moderator: caller.name.clone(),
        csrf: random_token(),
    };
    state.store.create_session(&digest(&session), &stored, ttl).await?;
    tracing::info!(moderator = %caller.name, "console sign-in");
    let mut response = layout::see_other(destination(&form.next));
    let h = response.headers_mut();
    h.append(
        header::SET_COOKIE,
        set_cookie(&state, &headers, SESSION_COOKIE, &session, ttl / 1000),
    );
    h.append(header::SET_COOKIE, set_cookie(&state, &headers, LOGIN_COOKIE, "", 0));
    Ok(response)
}

/// A form whose only field is the CSRF token (sign-out, replay buttons).
#[derive(Deserialize)]
pub struct CsrfForm {
    csrf: Option<String>,
}

impl CsrfForm {
    pub fn csrf(&self) -> Option<&str> {
        self.csrf.as_deref()
    }
}

/// `POST /console/logout`: ends the session here and in the store.
pub async fn logout(
    State(state): State<AppState>,
    session: SignedIn,
    headers: HeaderMap,
    ConsoleForm(form): ConsoleForm<CsrfForm>,
) -> Result<Response, PageError> {
    session.check_csrf(form.csrf())?;
    state.store.end_session(&session.id_hash).await?;
    let mut response = layout::see_other("/console/login");
    response
        .headers_mut()
        .append(header::SET_COOKIE, set_cookie(&state, &headers, SESSION_COOKIE, "", 0));
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookies_are_found_by_exact_name() {
        let mut headers = HeaderMap::new();
        headers.append(header::COOKIE, HeaderValue::from_static("a=1; gavel_session=abc"));
        headers.append(header::COOKIE, HeaderValue::from_static("gavel_session_x=zzz"));
        assert_eq!(cookie(&headers, "gavel_session"), Some("abc"));
        assert_eq!(cookie(&headers, "a"), Some("1"));
        assert_eq!(cookie(&headers, "gavel"), None);
    }

    #[test]
    fn only_console_paths_are_followed_after_sign_in() {
        assert_eq!(destination("/console/items/a?kind=post"), "/console/items/a?kind=post");
        for bad in [
            "https://evil.example/",
            "//evil.example",
            "/console//evil",
            "/console\\x",
            "/v1/items",
            "",
        ] {
            assert_eq!(destination(bad), "/console/queue", "{bad}");
        }
    }

    #[test]
    fn a_binding_depends_on_the_session_and_the_secret() {
        let secret: [u8; 32] = Sha256::digest(b"old secret").into();
        let rotated: [u8; 32] = Sha256::digest(b"new secret").into();
        let binding = token_binding("cookie-a", &secret);
        assert_eq!(binding, token_binding("cookie-a", &secret));
        assert_ne!(binding, token_binding("cookie-a", &rotated));
        assert_ne!(binding, token_binding("cookie-b", &secret));
        assert_eq!(binding.len(), 64);
    }

    #[test]
    fn tokens_are_random_hex() {
        let (a, b) = (random_token(), random_token());
        assert_eq!(a.len(), 64);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}
