//! Entity signals: counts across items by a key the items share (a link
//! domain, an IP, a device, the author) over a sliding window, declared in
//! the rule's sidecar and counted by the host when items are created.
//!
//! ```toml
//! # NAME.toml, next to NAME.wasm
//! [[signals]]
//! name = "domain-authors"    # what the rule asks for
//! key = "link-domain"        # `author`, `link-domain` or `context.NAME`
//! count = "distinct author"  # `items` (default) or `distinct FIELD`
//! window = "10m"             # 1m to 7d
//! ```
//!
//! ```
//! use gavel_plugin_sdk::{Snapshot, signals};
//!
//! /// The most authors any of the item's link domains saw lately.
//! fn wave(_snapshot: &Snapshot) -> Result<u64, signals::SignalError> {
//!     signals::max("domain-authors")
//! }
//! ```
//!
//! Natively (unit tests) the values come from the test:
//! [`crate::testing::SnapshotBuilder::signal`], or a case's
//! `snapshot.signals`. A signal the test gives none of is
//! [`SignalError::Undeclared`], as it is in the host for a signal the
//! sidecar does not declare.

pub use crate::bindings::gavel::rules::signals::SignalError;

#[cfg(target_arch = "wasm32")]
use crate::bindings::gavel::rules::signals as host;

/// The values of the declared signal `name` for this item, one per key
/// the item has, as `(key, value)` sorted by key. A value counts this
/// item too.
pub fn values(name: &str) -> Result<Vec<(String, u64)>, SignalError> {
    #[cfg(target_arch = "wasm32")]
    return host::values(name);
    #[cfg(not(target_arch = "wasm32"))]
    return native::values(name);
}

/// The largest value of signal `name` across the item's keys, and the key
/// that has it (`None` when the item has no key for the signal).
pub fn top(name: &str) -> Result<Option<(String, u64)>, SignalError> {
    Ok(values(name)?.into_iter().max_by_key(|(_, v)| *v))
}

/// The largest value of signal `name` across the item's keys (0 when the
/// item has none).
pub fn max(name: &str) -> Result<u64, SignalError> {
    Ok(top(name)?.map_or(0, |(_, v)| v))
}

#[cfg(not(target_arch = "wasm32"))]
pub(crate) mod native {
    use super::SignalError;
    use std::cell::RefCell;
    use std::collections::BTreeMap;

    /// Signal values by name, then key.
    pub(crate) type Values = BTreeMap<String, BTreeMap<String, u64>>;

    thread_local! {
        static VALUES: RefCell<Values> = const { RefCell::new(BTreeMap::new()) };
    }

    /// What `values` answers on this thread from now on.
    pub(crate) fn set(values: Values) {
        VALUES.with(|v| *v.borrow_mut() = values);
    }

    pub(super) fn values(name: &str) -> Result<Vec<(String, u64)>, SignalError> {
        VALUES.with(|v| {
            v.borrow()
                .get(name)
                .map(|keys| keys.iter().map(|(k, n)| (k.clone(), *n)).collect())
                .ok_or(SignalError::Undeclared)
        })
    }
}
