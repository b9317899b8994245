//! The retry policy every background loop shares: exponential backoff with
//! jitter, so retries of many items (or deliveries, or provider requests)
//! do not land together.

/// `base · 2^(attempt-1)`, capped at `max`, with ±50 % jitter.
pub fn backoff_ms(attempt: u32, base: i64, max: i64) -> i64 {
    let exp = base
        .saturating_mul(1i64 << attempt.saturating_sub(1).min(20))
        .min(max)
        .max(1);
    let jitter = (uuid::Uuid::new_v4().as_u128() % 1000) as i64; // 0..999 per mille
    exp / 2 + exp * jitter / 1000
}

#[cfg(test)]
mod tests {
    use super::backoff_ms;

    #[test]
    fn backoff_doubles_with_jitter_and_caps() {
        for _ in 0..100 {
            let b1 = backoff_ms(1, 100, 10_000);
            assert!((50..150).contains(&b1), "{b1}");
            let b3 = backoff_ms(3, 100, 10_000);
            assert!((200..600).contains(&b3), "{b3}");
            let capped = backoff_ms(30, 100, 10_000);
            assert!((5_000..15_000).contains(&capped), "{capped}");
        }
    }
}
