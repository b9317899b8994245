//! The page frame, the error page and the small formatting helpers every
//! console page shares.

use super::session::SignedIn;
use crate::clock::Millis;
use crate::store::StoreError;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use maud::{DOCTYPE, Markup, html};

/// A whole page: head, navigation (when signed in) and `body`.
pub fn page_shell(title: &str, session: Option<&SignedIn>, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                @if let Some(s) = session { meta name="csrf-token" content=(s.csrf); }
                title { (title) " · gavel" }
                link rel="stylesheet" href="/console/assets/console.css";
                link rel="icon" href="/console/assets/favicon.svg" type="image/svg+xml";
                script src="/console/assets/console.js" defer {}
            }
            body {
                @if let Some(s) = session {
                    header.top {
                        nav {
                            a href="/console/queue" { "Queue" }
                            a href="/console/appeals" { "Appeals" }
                            a href="/console/plugins" { "Plugins" }
                            a href="/console/operations" { "Operations" }
                            a href="/console/lists" { "Lists" }
                            form.search method="get" action="/console/search" {
                                input type="search" name="q" placeholder="item id, external id or author"
                                    aria-label="Search";
                            }
                        }
                        span #whoami { (s.moderator) }
                        form #logout method="post" action="/console/logout" {
                            input type="hidden" name="csrf" value=(s.csrf);
                            button type="submit" { "Sign out" }
                        }
                    }
                }
                (body)
            }
        }
    }
}

/// `303 See Other` to `to`: after a form post, the browser GETs the result.
pub fn see_other(to: &str) -> Response {
    (StatusCode::SEE_OTHER, [(header::LOCATION, to.to_string())]).into_response()
}

/// A page that says what went wrong, with its status.
#[derive(Debug)]
pub struct PageError {
    status: StatusCode,
    message: String,
}

impl PageError {
    pub fn new(status: StatusCode, message: &str) -> Self {
        PageError {
            status,
            message: message.to_string(),
        }
    }
}

impl From<StoreError> for PageError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Unavailable(_) | StoreError::Conflict(_) => PageError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "The store is busy or unreachable; try again.",
            ),
            StoreError::Invalid(_) => PageError::new(StatusCode::BAD_REQUEST, "The store refused a value."),
            other => {
                tracing::error!(error = %other, "console: store error");
                PageError::new(StatusCode::INTERNAL_SERVER_ERROR, "Internal error; it has been logged.")
            }
        }
    }
}

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        let body = html! {
            main.narrow {
                h1 { (self.status.as_u16()) " " (self.status.canonical_reason().unwrap_or("")) }
                p #error.error { (self.message) }
                p { a href="/console/queue" { "Back to the queue" } }
            }
        };
        (self.status, page_shell("Error", None, body)).into_response()
    }
}

/// `2026-12-02 07:15:03 UTC` for a time in ms since the epoch.
pub fn time(ms: Millis) -> String {
    crate::clock::format_utc(ms)
}

/// `45 s`, `12 min`, `3 h`, `4 d`.
pub fn age(ms: i64) -> String {
    let s = ms.max(0) / 1000;
    match s {
        0..60 => format!("{s} s"),
        60..3600 => format!("{} min", s / 60),
        3600..86_400 => format!("{} h", s / 3600),
        _ => format!("{} d", s / 86_400),
    }
}

/// The first 12 hex digits of a digest, as people quote it.
pub fn short(digest: &str) -> &str {
    digest.get(..12).unwrap_or(digest)
}

/// A `<time>` element: the absolute time, with the age relative to `now` as its title.
pub fn when(at: Millis, now: Millis) -> Markup {
    html! { time title={ (age(now - at)) " ago" } { (time(at)) } }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_use_one_unit() {
        assert_eq!(age(45_000), "45 s");
        assert_eq!(age(12 * 60_000), "12 min");
        assert_eq!(age(3 * 3_600_000 + 5), "3 h");
        assert_eq!(age(-5), "0 s");
    }
}
