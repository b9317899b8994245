//! Lists moderators edit at runtime (`/v1/lists`, the console's Lists
//! page), consulted through the host: each call names a list and is
//! answered by the matcher the host compiled for the list version it
//! serves. Within one evaluation a list answers from one version, and the
//! decision records every list consulted with that version and its digest.
//!
//! ```
//! use gavel_plugin_sdk::{Snapshot, lists};
//!
//! /// The scam phrases in the item's text, as the list stands now.
//! fn scam_phrases(snapshot: &Snapshot) -> Result<Vec<String>, lists::ListError> {
//!     lists::find_terms("scam-phrases", &snapshot.item.text)
//! }
//! ```
//!
//! Natively (unit tests) there is no host: every list is
//! [`ListError::Unknown`]. A rule's `plugin test` cases run in the real
//! runtime.

pub use crate::bindings::gavel::rules::lists::ListError;

#[cfg(target_arch = "wasm32")]
use crate::bindings::gavel::rules::lists as host;

/// The entries of the `terms` list `name` found in `text` as whole words
/// (case, accents and punctuation folded).
pub fn find_terms(name: &str, text: &str) -> Result<Vec<String>, ListError> {
    #[cfg(target_arch = "wasm32")]
    return host::find_terms(name, text);
    #[cfg(not(target_arch = "wasm32"))]
    return native(name, text);
}

/// The entries of the `patterns` list `name` that match somewhere in `text`.
pub fn match_patterns(name: &str, text: &str) -> Result<Vec<String>, ListError> {
    #[cfg(target_arch = "wasm32")]
    return host::match_patterns(name, text);
    #[cfg(not(target_arch = "wasm32"))]
    return native(name, text);
}

/// The longest entry of the `domains` list `name` that `host_name` is, or
/// is a subdomain of.
pub fn match_domain(name: &str, host_name: &str) -> Result<Option<String>, ListError> {
    #[cfg(target_arch = "wasm32")]
    return host::match_domain(name, host_name);
    #[cfg(not(target_arch = "wasm32"))]
    return native(name, host_name);
}

/// Whether the `strings` list `name` holds exactly `value`.
pub fn contains(name: &str, value: &str) -> Result<bool, ListError> {
    #[cfg(target_arch = "wasm32")]
    return host::contains(name, value);
    #[cfg(not(target_arch = "wasm32"))]
    return native(name, value);
}

/// The narrowest range of the `cidrs` list `name` that holds address `ip`.
pub fn in_cidrs(name: &str, ip: &str) -> Result<Option<String>, ListError> {
    #[cfg(target_arch = "wasm32")]
    return host::in_cidrs(name, ip);
    #[cfg(not(target_arch = "wasm32"))]
    return native(name, ip);
}

/// No host, no lists.
#[cfg(not(target_arch = "wasm32"))]
fn native<T>(_name: &str, _arg: &str) -> Result<T, ListError> {
    Err(ListError::Unknown)
}
