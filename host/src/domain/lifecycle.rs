//! The states of everything gavel tracks besides items, and the kinds of
//! interaction. Each is stored as its string; the migrations' CHECK
//! constraints list the same strings.

super::string_enum! {
    /// A webhook delivery of one outbox event to one endpoint.
    pub enum DeliveryStatus("delivery status") {
        /// Waiting for its (next) attempt.
        Pending = "pending",
        /// The endpoint answered 2xx.
        Delivered = "delivered",
        /// Attempts exhausted; listed and replayable.
        Dead = "dead",
    }
}

super::string_enum! {
    /// A request to an external classifier.
    pub enum ProviderRequestStatus("provider request status") {
        /// Stored with the hand-off; not yet accepted by the provider.
        Pending = "pending",
        /// The provider accepted it; waiting for its callback.
        Sent = "sent",
        /// A callback was applied.
        Answered = "answered",
        /// A newer hand-off of the same item replaced it.
        Superseded = "superseded",
        /// Its deadline passed: the item went to human review.
        TimedOut = "timed_out",
        /// The item moved on (a moderator decided, or the rules settled it).
        Cancelled = "cancelled",
    }
}

impl ProviderRequestStatus {
    /// Whether the request still waits for an answer.
    pub fn is_active(self) -> bool {
        matches!(self, ProviderRequestStatus::Pending | ProviderRequestStatus::Sent)
    }
}

super::string_enum! {
    /// What a provider callback did.
    pub enum CallbackResult("callback outcome") {
        /// Its answer moved the item.
        Applied = "applied",
        /// A repeat, or its request was already answered: no effect.
        Duplicate = "duplicate",
        /// Its request is no longer the item's active one: recorded, no effect.
        Stale = "stale",
        /// No such request for this provider and item.
        Unknown = "unknown",
    }
}

super::string_enum! {
    /// A load of a plugin file in one process.
    pub enum PluginVersionStatus("plugin version status") {
        /// Serving.
        Active = "active",
        /// Replaced, deleted or unloaded at shutdown.
        Retired = "retired",
        /// The file did not load; whatever served before kept serving.
        Failed = "failed",
        /// Its circuit breaker is open: not evaluated until a probe succeeds.
        Quarantined = "quarantined",
    }
}

super::string_enum! {
    /// An idempotency key's state.
    pub enum IdempotencyState("idempotency state") {
        /// Claimed by a request that has not committed its effect yet.
        InFlight = "in_flight",
        /// The effect committed; its response is stored for replays.
        Done = "done",
    }
}

super::string_enum! {
    /// Interaction kinds.
    pub enum EventKind("event kind") {
        Upvote = "upvote",
        Downvote = "downvote",
        Flag = "flag",
        Report = "report",
        /// New text for the item (the content changed).
        Edit = "edit",
    }
}

/// A change in which plugin code runs, recorded in the plugin history.
#[derive(Debug, Clone, PartialEq)]
pub enum PluginEvent {
    /// A file was loaded and now serves `name`.
    Loaded {
        name: String,
        version: String,
        digest: String,
        path: String,
        mode: super::Mode,
        at: i64,
    },
    /// `name` at `digest` stopped serving (replaced, deleted, or the process stopped).
    Unloaded { name: String, digest: String, at: i64 },
    /// `name` at `digest` failed too often: its circuit breaker opened.
    Quarantined {
        name: String,
        digest: String,
        /// What the breaker saw, e.g. `12 of 20 evaluations failed in 60 s`.
        detail: String,
        at: i64,
    },
    /// A probe of a quarantined `name` at `digest` succeeded: serving again.
    Recovered { name: String, digest: String, at: i64 },
    /// A file could not be loaded; whatever served before keeps serving.
    Failed {
        path: String,
        digest: Option<String>,
        error: String,
        at: i64,
    },
}

super::string_enum! {
    /// A backtest started through the API.
    pub enum BacktestStatus("backtest status") {
        /// Replaying (or waiting for the process's backtest slot).
        Running = "running",
        /// Finished; the report is stored.
        Done = "done",
        /// Stopped by an error, or its process went away.
        Failed = "failed",
        /// Cancelled by a moderator.
        Cancelled = "cancelled",
    }
}

super::string_enum! {
    /// What a stored evaluation input holds.
    pub enum InputKind("input document kind") {
        /// A snapshot as the rules judged it, without config.
        Snapshot = "snapshot",
        /// One plugin's config.
        Config = "config",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::check_constraints::assert_mirrors;

    fn strings<T: Copy>(all: &[T], f: fn(T) -> &'static str) -> Vec<&'static str> {
        all.iter().map(|v| f(*v)).collect()
    }

    #[test]
    fn check_constraints_mirror_the_enums() {
        assert_mirrors(
            "deliveries",
            "status",
            &strings(DeliveryStatus::ALL, DeliveryStatus::as_str),
        );
        assert_mirrors(
            "provider_requests",
            "status",
            &strings(ProviderRequestStatus::ALL, ProviderRequestStatus::as_str),
        );
        assert_mirrors(
            "provider_callbacks",
            "outcome",
            &strings(CallbackResult::ALL, CallbackResult::as_str),
        );
        assert_mirrors(
            "plugin_versions",
            "status",
            &strings(PluginVersionStatus::ALL, PluginVersionStatus::as_str),
        );
        assert_mirrors(
            "idempotency_keys",
            "state",
            &strings(IdempotencyState::ALL, IdempotencyState::as_str),
        );
        assert_mirrors("events", "kind", &strings(EventKind::ALL, EventKind::as_str));
        assert_mirrors(
            "backtests",
            "status",
            &strings(BacktestStatus::ALL, BacktestStatus::as_str),
        );
        assert_mirrors("snapshots", "kind", &strings(InputKind::ALL, InputKind::as_str));
    }
}
