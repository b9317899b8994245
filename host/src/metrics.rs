//! The figures an operator watches, exported at `GET /metrics` in the
//! OpenMetrics text format. One [`Metrics`] per gavel instance (not a global
//! recorder), so several instances in one process keep apart.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

/// `outcome` label.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    pub outcome: &'static str,
}

/// `route` label.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabel {
    pub route: &'static str,
}

/// `verdict` label.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VerdictLabel {
    pub verdict: &'static str,
}

/// `to` label: the account state an author reached.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AuthorTransitionLabel {
    pub to: String,
}

/// A plugin version.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PluginLabels {
    pub plugin: String,
    pub version: String,
}

/// A plugin version and an evaluation outcome.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PluginOutcomeLabels {
    pub plugin: String,
    pub version: String,
    pub outcome: &'static str,
}

/// `result` label.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: &'static str,
}

/// `kind` label (group commit: submissions, evaluations).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: &'static str,
}

/// `list` label: a list's name.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ListLabel {
    pub list: String,
}

/// `signal` label: an entity signal's name.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SignalLabel {
    pub signal: String,
}

/// An appealed decision: its policy and the plugin version behind it
/// (empty for a moderator's own decision).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AppealLabels {
    pub policy: String,
    pub plugin: String,
    pub version: String,
}

/// [`AppealLabels`] and how the appeal ended (`upheld`, `overturned`).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AppealOutcomeLabels {
    pub policy: String,
    pub plugin: String,
    pub version: String,
    pub outcome: &'static str,
}

fn appeal_seconds() -> Histogram {
    // One minute to about half a year.
    Histogram::new(exponential_buckets(60.0, 4.0, 10))
}

/// `table` label (retention).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TableLabel {
    pub table: &'static str,
}

/// An HTTP request: its method, its route in axum's path syntax
/// (`/v1/items/{id}`; `unmatched` when no route matched) and the status
/// code it was answered with.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpLabels {
    pub method: &'static str,
    pub route: &'static str,
    pub status: u16,
}

fn http_seconds() -> Histogram {
    // 100 µs .. ~6.6 s.
    Histogram::new(exponential_buckets(0.0001, 2.0, 17))
}

fn batch_items() -> Histogram {
    // 1 .. 256 items.
    Histogram::new(exponential_buckets(1.0, 2.0, 9))
}

fn evaluation_seconds() -> Histogram {
    // 10 µs .. ~5 s.
    Histogram::new(exponential_buckets(0.00001, 3.0, 13))
}

/// Declares [`Metrics`]: each field with its doc, its type, its exposition
/// name (`gavel_` + name) and help text, registered in one place.
macro_rules! metrics {
    ($($(#[$doc:meta])* $field:ident: $ty:ty $(= $init:expr)? => $name:literal, $help:literal;)+) => {
        /// Every metric gavel exports. Cheap to share (`Arc<Metrics>`); each
        /// field is itself a shared handle.
        #[derive(Debug)]
        pub struct Metrics {
            registry: Registry,
            /// Every family's exposition name (`gavel_…`), for docs and checks.
            names: Vec<String>,
            $($(#[$doc])* pub $field: $ty,)+
        }

        impl Metrics {
            pub fn new() -> Metrics {
                let mut registry = Registry::with_prefix("gavel");
                let mut names = Vec::new();
                $(
                    let $field: $ty = metrics!(@init $ty $(, $init)?);
                    names.push(concat!("gavel_", $name).to_string());
                    registry.register($name, $help, $field.clone());
                )+
                Metrics { registry, names, $($field,)+ }
            }
        }
    };
    (@init $ty:ty) => { <$ty>::default() };
    (@init $ty:ty, $init:expr) => { $init };
}

metrics! {
    /// Seconds from a request's arrival to its response's head, by method,
    /// route and status (a streamed body, as an export's, is not counted).
    http_request_duration_seconds: Family<HttpLabels, Histogram>
        = Family::<HttpLabels, Histogram>::new_with_constructor(http_seconds as fn() -> Histogram)
        => "http_request_duration_seconds", "HTTP requests: seconds to the response's head, by method, route and status";
    /// Submissions by outcome: accepted, held_sync, rejected_sync, replayed,
    /// conflict, key_mismatch, key_lost, rate_limited, invalid, unavailable.
    submissions: Family<OutcomeLabel, Counter> => "submissions", "Submissions by outcome";
    /// Requests answered from a stored idempotent response.
    idempotency_replays: Family<RouteLabel, Counter> => "idempotency_replays", "Requests answered with a stored idempotent response";
    /// Submissions held because the same text came from one author too often.
    fingerprint_duplicates: Counter => "fingerprint_duplicates", "Submissions held as duplicate text from one author";
    /// Seconds the oldest due item has waited in the queue.
    queue_lag_seconds: Gauge<f64, AtomicU64> => "queue_lag_seconds", "Seconds the oldest due item has waited";
    /// Items in the queue.
    queue_depth: Gauge => "queue_depth", "Items in the evaluation queue";
    /// Evaluations running now in this process.
    evaluations_in_flight: Gauge => "evaluations_in_flight", "Evaluations running in this process";
    /// Items per claimed evaluation batch (`evaluation.batch` at most):
    /// under load they grow while `evaluation.batches_in_flight` are busy.
    claimed_batch_items: Histogram = batch_items()
        => "claimed_batch_items", "Items per claimed evaluation batch";
    /// Leases that expired while their evaluation ran (lease contention).
    leases_lost: Counter => "leases_lost", "Leases that expired during their evaluation";
    /// Claims that answered with more items than asked (a coordinator
    /// defect; the worker queues the excess again).
    claims_over_limit: Counter => "claims_over_limit", "Claims that took more items than asked";
    /// Commits refused by the fence (an older snapshot, or the item moved on).
    stale_commits: Counter => "stale_commits", "Commits refused by the fence";
    /// Evaluations committed.
    evaluations_committed: Counter => "evaluations_committed", "Evaluations committed";
    /// Rule evaluations by plugin version and outcome.
    rule_evaluations: Family<PluginOutcomeLabels, Counter> => "rule_evaluations", "Rule evaluations by plugin version and outcome";
    /// Rule evaluation durations by plugin version.
    rule_evaluation_seconds: Family<PluginLabels, Histogram>
        = Family::<PluginLabels, Histogram>::new_with_constructor(evaluation_seconds as fn() -> Histogram)
        => "rule_evaluation_seconds", "Rule evaluation duration";
    /// Combined verdicts of committed evaluations.
    decisions: Family<VerdictLabel, Counter> => "decisions", "Combined verdicts of committed evaluations";
    /// Author standing recomputations committed.
    author_recomputations: Counter => "author_recomputations", "Author standing recomputations";
    /// Changes of authors' account states, automated, by the state reached.
    author_transitions: Family<AuthorTransitionLabel, Counter> => "author_transitions", "Automated changes of authors' account states, by state reached";
    /// Automated decisions a moderator overturned, by plugin version.
    reversals: Family<PluginLabels, Counter> => "reversals", "Automated decisions a moderator overturned";
    /// Shadow decisions that disagreed with the enforced outcome.
    shadow_disagreements: Family<PluginLabels, Counter> => "shadow_disagreements", "Shadow verdicts that would have set another status";
    /// Host-side evaluation failures retried.
    retries: Counter => "retries", "Evaluations retried after a host-side failure";
    /// Evaluations that could not run for the host's reasons (overload, pool), by kind.
    host_errors: Family<KindLabel, Counter> => "host_errors", "Evaluations the host could not run (overload, pool exhausted)";
    /// Evaluations dead-lettered.
    dead_letters: Counter => "dead_letters", "Evaluations dead-lettered";
    /// Items the reconciler queued again.
    reconciled: Counter => "reconciled", "Items re-queued by the reconciler";
    /// Plugin file loads by result: loaded, failed, unloaded.
    plugin_reloads: Family<ResultLabel, Counter> => "plugin_reloads", "Plugin loads by result";
    /// Plugins quarantined by their circuit breaker.
    plugin_quarantines: Counter => "plugin_quarantines", "Plugins quarantined by their circuit breaker";
    /// Quarantined plugins a probe found healthy again.
    plugin_recoveries: Counter => "plugin_recoveries", "Quarantined plugins that recovered";
    /// Webhook delivery attempts by result: delivered, retry, dead, gone.
    deliveries: Family<ResultLabel, Counter> => "deliveries", "Webhook delivery attempts by result";
    /// Webhook endpoints disabled because their receiver answered `410 Gone`.
    webhook_endpoints_disabled: Counter => "webhook_endpoints_disabled", "Webhook endpoints disabled by a 410 Gone answer";
    /// Deliveries claimed in the last round.
    deliveries_pending: Gauge => "deliveries_pending", "Deliveries claimed in the last round";
    /// Provider requests sent, by result: accepted, retry.
    provider_requests: Family<ResultLabel, Counter> => "provider_requests", "Provider requests sent, by result";
    /// Provider callbacks by outcome: applied, duplicate, stale, unknown, bad_signature.
    provider_callbacks: Family<OutcomeLabel, Counter> => "provider_callbacks", "Provider callbacks by outcome";
    /// Items sent to review because a provider never answered.
    provider_timeouts: Counter => "provider_timeouts", "Items sent to review because a provider never answered";
    /// Stored evaluation snapshots, compressed bytes (measured by the retention task).
    snapshot_bytes: Gauge => "snapshot_bytes", "Bytes of stored evaluation snapshots (compressed)";
    /// Stored evaluation snapshots (measured by the retention task).
    snapshots_stored: Gauge => "snapshots_stored", "Stored evaluation snapshots";
    /// Backtests by how they ended: done, failed, cancelled.
    backtests: Family<OutcomeLabel, Counter> => "backtests", "Backtests by how they ended";
    /// Snapshots replayed by backtests in this process.
    backtest_replays: Counter => "backtest_replays", "Snapshots replayed by backtests";
    /// Store transactions taken by group commit, by kind of write.
    store_batches: Family<KindLabel, Counter> => "store_batches", "Store transactions taken by group commit";
    /// Writes committed through group commit, by kind (divided by
    /// `store_batches`: the mean batch size).
    store_batched_writes: Family<KindLabel, Counter> => "store_batched_writes", "Writes committed through group commit";
    /// Rows deleted by retention, by table.
    retention_removed: Family<TableLabel, Counter> => "retention_removed_rows", "Rows deleted by retention, by table";
    /// The version of each list this process serves (`/v1/lists` shows it too).
    list_version: Family<ListLabel, Gauge> => "list_version", "Version of each list this process serves";
    /// Keys each entity signal holds counts for in this process (embedded counts).
    signal_keys: Family<SignalLabel, Gauge> => "signal_keys", "Keys each entity signal holds counts for";
    /// Estimated bytes the counts of all entity signals take in this process.
    signal_memory_bytes: Gauge => "signal_memory_bytes", "Estimated bytes of entity signal counts";
    /// Keys dropped before their window ended because a bound was reached.
    signal_evictions: Family<SignalLabel, Counter> => "signal_evictions", "Signal keys dropped early at a bound";
    /// Appeals opened, by the appealed decision's policy and plugin version.
    appeals_opened: Family<AppealLabels, Counter> => "appeals_opened", "Appeals opened, by policy and plugin version";
    /// Appeals decided, by policy, plugin version and outcome.
    appeals_closed: Family<AppealOutcomeLabels, Counter> => "appeals_closed", "Appeals decided, by policy, plugin version and outcome";
    /// Seconds from an appeal's opening to its decision.
    appeal_decision_seconds: Family<AppealLabels, Histogram>
        = Family::<AppealLabels, Histogram>::new_with_constructor(appeal_seconds as fn() -> Histogram)
        => "appeal_decision_seconds", "Seconds from an appeal to its decision";
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// The name of every metric family this exports (`gavel_queue_depth`, ...).
    pub fn family_names(&self) -> &[String] {
        &self.names
    }

    /// The OpenMetrics text.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }

    /// Counts a submission outcome.
    pub fn submission(&self, outcome: &'static str) {
        self.submissions.get_or_create(&OutcomeLabel { outcome }).inc();
    }

    pub fn plugin(plugin: &str, version: &str) -> PluginLabels {
        PluginLabels {
            plugin: plugin.to_string(),
            version: version.to_string(),
        }
    }
}
