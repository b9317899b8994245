//! Rate limits: per client token (a handful of keys, from the config) and
//! per author (one key per author ever seen, so its memory is bounded: idle
//! authors are forgotten, and past `max_keys` the limiter starts afresh).

use super::error::ApiError;
use axum::http::StatusCode;
use governor::{DefaultKeyedRateLimiter, Quota};
use std::num::NonZeroU32;
use std::time::Duration;

/// 429 with `Retry-After`, rounded up to whole seconds.
pub(super) fn too_many(wait: Duration) -> ApiError {
    ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        "rate_limited",
        "too many requests; slow down",
    )
    .retry_after(wait.as_secs_f64().ceil() as u64)
}

/// Submissions per author (scoped by client), with bounded memory.
pub struct AuthorLimiter {
    /// Replaced by a fresh one when even active authors fill it.
    limiter: std::sync::RwLock<DefaultKeyedRateLimiter<String>>,
    quota: Quota,
    max_keys: usize,
}

impl AuthorLimiter {
    pub fn new(rate_per_second: u32, burst: u32, max_keys: usize) -> Self {
        let quota = Quota::per_second(NonZeroU32::new(rate_per_second.max(1)).expect("max(1) is non-zero"))
            .allow_burst(NonZeroU32::new(burst.max(1)).expect("max(1) is non-zero"));
        AuthorLimiter {
            limiter: std::sync::RwLock::new(DefaultKeyedRateLimiter::keyed(quota)),
            quota,
            max_keys: max_keys.max(1),
        }
    }

    /// Counts one submission by `author` of `client`; 429 when over the rate.
    pub(super) fn check(&self, client: &str, author: &str) -> Result<(), ApiError> {
        if self.len() >= self.max_keys {
            self.forget_idle();
        }
        let key = format!("{client}\u{0}{author}");
        let limiter = self.limiter.read().expect("limiter lock");
        limiter.check_key(&key).map_err(|not_until| {
            too_many(not_until.wait_time_from(governor::clock::Clock::now(&governor::clock::DefaultClock::default())))
        })
    }

    /// Forgets authors whose bucket is full again (indistinguishable from a
    /// new author); if that is not enough, starts afresh. Run periodically.
    pub fn forget_idle(&self) {
        let full = {
            let limiter = self.limiter.read().expect("limiter lock");
            limiter.retain_recent();
            limiter.shrink_to_fit();
            limiter.len() >= self.max_keys
        };
        if full {
            tracing::warn!(
                max = self.max_keys,
                "author rate limiter full of active authors; starting afresh"
            );
            *self.limiter.write().expect("limiter lock") = DefaultKeyedRateLimiter::keyed(self.quota);
        }
    }

    /// Authors tracked now.
    pub fn len(&self) -> usize {
        self.limiter.read().expect("limiter lock").len()
    }

    /// Whether no author is tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_stays_bounded_however_many_authors_post() {
        let limiter = AuthorLimiter::new(1, 1, 100);
        for i in 0..10_000 {
            limiter.check("web", &format!("author-{i}")).unwrap();
            assert!(limiter.len() <= 100, "{} keys at author {i}", limiter.len());
        }
    }

    #[test]
    fn an_author_over_the_rate_gets_429_with_retry_after() {
        let limiter = AuthorLimiter::new(1, 2, 100);
        assert!(limiter.check("web", "a").is_ok());
        assert!(limiter.check("web", "a").is_ok());
        let e = limiter.check("web", "a").unwrap_err();
        assert_eq!(e.status, StatusCode::TOO_MANY_REQUESTS);
        assert!(e.retry_after.is_some());
        assert!(
            limiter.check("other-client", "a").is_ok(),
            "authors are scoped per client"
        );
    }
}
