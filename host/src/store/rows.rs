//! Row conversions: the one place where stored strings become enums.

use super::{StoreError, StoreResult};
use crate::domain::UnknownVariant;
use std::str::FromStr;

/// A stored enum string.
pub(super) fn parse<T: FromStr<Err = UnknownVariant>>(s: &str) -> StoreResult<T> {
    s.parse().map_err(StoreError::from)
}

/// An optional stored enum string.
pub(super) fn parse_opt<T: FromStr<Err = UnknownVariant>>(s: Option<&str>) -> StoreResult<Option<T>> {
    s.map(parse).transpose()
}

/// The lists a decision consulted, from their JSON column (`NULL`: none).
pub(super) fn lists(json: Option<&str>) -> StoreResult<Vec<crate::rules::ListUse>> {
    json.map_or(Ok(Vec::new()), |json| {
        serde_json::from_str(json).map_err(|e| StoreError::Corrupt(format!("lists {json:?}: {e}")))
    })
}

/// The JSON column of the lists a decision consulted; `NULL` for none.
pub(super) fn lists_json(lists: &[crate::rules::ListUse]) -> Option<String> {
    (!lists.is_empty()).then(|| serde_json::to_string(lists).expect("list uses serialize"))
}

/// A JSON list of labels.
pub(super) fn labels(json: &str) -> StoreResult<Vec<String>> {
    serde_json::from_str(json).map_err(|e| StoreError::Corrupt(format!("labels {json:?}: {e}")))
}

/// Labels as stored.
pub(super) fn labels_json(labels: &[String]) -> String {
    serde_json::to_string(labels).expect("a list of strings serializes")
}
