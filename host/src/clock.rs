//! Time as gavel stores it: milliseconds since the Unix epoch.

/// Milliseconds since the Unix epoch.
pub type Millis = i64;

/// The wall clock in [`Millis`].
pub fn now_ms() -> Millis {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
