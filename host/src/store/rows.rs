//! Row conversions: the one place where stored strings become enums.

use super::{DecisionPhase, Mode, StoreError, StoreResult};
use crate::rules::Outcome;
use crate::status::{Actor, ItemStatus};
use crate::verdict::Verdict;

fn corrupt(what: &str, value: &str) -> StoreError {
    StoreError::Corrupt(format!("unknown {what} {value:?}"))
}

pub(super) fn status(s: &str) -> StoreResult<ItemStatus> {
    s.parse().map_err(|_| corrupt("status", s))
}

pub(super) fn actor(s: &str) -> StoreResult<Actor> {
    s.parse().map_err(|_| corrupt("actor", s))
}

pub(super) fn verdict(s: &str) -> StoreResult<Verdict> {
    s.parse().map_err(|_| corrupt("verdict", s))
}

pub(super) fn mode(s: &str) -> StoreResult<Mode> {
    match s {
        "enforce" => Ok(Mode::Enforce),
        "shadow" => Ok(Mode::Shadow),
        _ => Err(corrupt("mode", s)),
    }
}

pub(super) fn phase(s: &str) -> StoreResult<DecisionPhase> {
    match s {
        "sync" => Ok(DecisionPhase::Sync),
        "async" => Ok(DecisionPhase::Async),
        "provider" => Ok(DecisionPhase::Provider),
        _ => Err(corrupt("phase", s)),
    }
}

pub(super) fn outcome(s: &str) -> StoreResult<Outcome> {
    Outcome::ALL
        .into_iter()
        .find(|o| o.as_str() == s)
        .ok_or_else(|| corrupt("outcome", s))
}

pub(super) fn labels(json: &str) -> StoreResult<Vec<String>> {
    serde_json::from_str(json).map_err(|e| StoreError::Corrupt(format!("labels {json:?}: {e}")))
}

pub(super) fn opt<T>(s: Option<String>, f: fn(&str) -> StoreResult<T>) -> StoreResult<Option<T>> {
    s.as_deref().map(f).transpose()
}

#[cfg(test)]
mod tests {
    use crate::status::ItemStatus;

    /// The migrations' CHECK constraints list exactly the statuses the code knows.
    #[test]
    fn status_check_constraints_mirror_the_enum() {
        for sql in [
            include_str!("../../migrations/sqlite/0001_init.sql"),
            include_str!("../../migrations/postgres/0001_init.sql"),
        ] {
            let items_check = sql
                .split("status           TEXT NOT NULL CHECK (status IN (")
                .nth(1)
                .and_then(|s| s.split("))").next())
                .expect("items.status CHECK");
            let stored: Vec<&str> = ItemStatus::ALL
                .iter()
                .filter(|s| **s != ItemStatus::Received)
                .map(|s| s.as_str())
                .collect();
            let listed: Vec<&str> = items_check.split(',').map(|s| s.trim().trim_matches('\'')).collect();
            assert_eq!(listed, stored);
        }
    }
}
