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

/// Registers `metric` as `gavel_NAME` and remembers the name.
fn reg(
    registry: &mut Registry,
    names: &mut Vec<String>,
    name: &str,
    help: &str,
    metric: impl prometheus_client::registry::Metric,
) {
    names.push(format!("gavel_{name}"));
    registry.register(name, help, metric);
}

fn evaluation_seconds() -> Histogram {
    // 10 µs .. ~5 s.
    Histogram::new(exponential_buckets(0.00001, 3.0, 13))
}

/// Every metric gavel exports. Cheap to share (`Arc<Metrics>`); each field
/// is itself a shared handle.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// Every family's exposition name (`gavel_…`), for docs and checks.
    names: Vec<String>,
    /// Submissions by outcome: accepted, held_sync, rejected_sync, replayed,
    /// conflict, key_mismatch, rate_limited, invalid.
    pub submissions: Family<OutcomeLabel, Counter>,
    /// Requests answered from a stored idempotent response.
    pub idempotency_replays: Family<RouteLabel, Counter>,
    /// Submissions held because the same text came from one author too often.
    pub fingerprint_duplicates: Counter,
    /// Seconds the oldest due item has waited in the queue.
    pub queue_lag_seconds: Gauge<f64, AtomicU64>,
    /// Items in the queue.
    pub queue_depth: Gauge,
    /// Evaluations running now in this process.
    pub evaluations_in_flight: Gauge,
    /// Leases that expired while their evaluation ran (lease contention).
    pub leases_lost: Counter,
    /// Commits refused by the version check (the fencing token).
    pub stale_commits: Counter,
    /// Evaluations committed.
    pub evaluations_committed: Counter,
    /// Rule evaluations by plugin version and outcome.
    pub rule_evaluations: Family<PluginOutcomeLabels, Counter>,
    /// Rule evaluation durations by plugin version.
    pub rule_evaluation_seconds: Family<PluginLabels, Histogram>,
    /// Combined verdicts of committed evaluations.
    pub decisions: Family<VerdictLabel, Counter>,
    /// Automated decisions a moderator overturned, by plugin version.
    pub reversals: Family<PluginLabels, Counter>,
    /// Shadow decisions that disagreed with the enforced outcome.
    pub shadow_disagreements: Family<PluginLabels, Counter>,
    /// Host-side evaluation failures retried.
    pub retries: Counter,
    /// Evaluations dead-lettered.
    pub dead_letters: Counter,
    /// Items the reconciler queued again.
    pub reconciled: Counter,
    /// Plugin file loads by result: loaded, failed, unloaded.
    pub plugin_reloads: Family<ResultLabel, Counter>,
    /// Plugins quarantined after repeated failures.
    pub plugin_quarantines: Counter,
    /// Webhook delivery attempts by result: delivered, retry, dead.
    pub deliveries: Family<ResultLabel, Counter>,
    /// Outbox events not yet fanned out or deliveries pending, sampled.
    pub deliveries_pending: Gauge,
    /// Provider requests sent, by result: accepted, retry.
    pub provider_requests: Family<ResultLabel, Counter>,
    /// Provider callbacks by outcome: applied, duplicate, stale, unknown, bad_signature.
    pub provider_callbacks: Family<OutcomeLabel, Counter>,
    /// Items sent to review because a provider never answered.
    pub provider_timeouts: Counter,
    /// Store transactions taken by group commit, by kind of write.
    pub store_batches: Family<KindLabel, Counter>,
    /// Writes committed through group commit, by kind (divided by
    /// `store_batches`: the mean batch size).
    pub store_batched_writes: Family<KindLabel, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("gavel");
        let mut names = Vec::new();
        let submissions = Family::<OutcomeLabel, Counter>::default();
        reg(
            &mut registry,
            &mut names,
            "submissions",
            "Submissions by outcome",
            submissions.clone(),
        );
        let idempotency_replays = Family::<RouteLabel, Counter>::default();
        reg(
            &mut registry,
            &mut names,
            "idempotency_replays",
            "Requests answered with a stored idempotent response",
            idempotency_replays.clone(),
        );
        let fingerprint_duplicates = Counter::default();
        reg(
            &mut registry,
            &mut names,
            "fingerprint_duplicates",
            "Submissions held as duplicate text from one author",
            fingerprint_duplicates.clone(),
        );
        let queue_lag_seconds = Gauge::<f64, AtomicU64>::default();
        reg(
            &mut registry,
            &mut names,
            "queue_lag_seconds",
            "Seconds the oldest due item has waited",
            queue_lag_seconds.clone(),
        );
        let queue_depth = Gauge::default();
        reg(
            &mut registry,
            &mut names,
            "queue_depth",
            "Items in the evaluation queue",
            queue_depth.clone(),
        );
        let evaluations_in_flight = Gauge::default();
        reg(
            &mut registry,
            &mut names,
            "evaluations_in_flight",
            "Evaluations running in this process",
            evaluations_in_flight.clone(),
        );
        let leases_lost = Counter::default();
        reg(
            &mut registry,
            &mut names,
            "leases_lost",
            "Leases that expired during their evaluation",
            leases_lost.clone(),
        );
        let stale_commits = Counter::default();
        reg(
            &mut registry,
            &mut names,
            "stale_commits",
            "Commits refused by the version check",
            stale_commits.clone(),
        );
        let evaluations_committed = Counter::default();
        reg(
            &mut registry,
            &mut names,
            "evaluations_committed",
            "Evaluations committed",
            evaluations_committed.clone(),
        );
        let rule_evaluations = Family::<PluginOutcomeLabels, Counter>::default();
        reg(
            &mut registry,
            &mut names,
            "rule_evaluations",
            "Rule evaluations by plugin version and outcome",
            rule_evaluations.clone(),
        );
        let rule_evaluation_seconds =
            Family::<PluginLabels, Histogram>::new_with_constructor(evaluation_seconds as fn() -> Histogram);
        reg(
            &mut registry,
            &mut names,
            "rule_evaluation_seconds",
            "Rule evaluation durations by plugin version",
            rule_evaluation_seconds.clone(),
        );
        let decisions = Family::<VerdictLabel, Counter>::default();
        reg(
            &mut registry,
            &mut names,
            "decisions",
            "Combined verdicts of committed evaluations",
            decisions.clone(),
        );
        let reversals = Family::<PluginLabels, Counter>::default();
        reg(
            &mut registry,
            &mut names,
            "reversals",
            "Automated decisions overturned by a moderator",
            reversals.clone(),
        );
        let shadow_disagreements = Family::<PluginLabels, Counter>::default();
        reg(
            &mut registry,
            &mut names,
            "shadow_disagreements",
            "Shadow decisions that disagreed with the enforced outcome",
            shadow_disagreements.clone(),
        );
        let retries = Counter::default();
        reg(
            &mut registry,
            &mut names,
            "retries",
            "Host-side evaluation failures retried",
            retries.clone(),
        );
        let dead_letters = Counter::default();
        reg(
            &mut registry,
            &mut names,
            "dead_letters",
            "Evaluations dead-lettered",
            dead_letters.clone(),
        );
        let reconciled = Counter::default();
        reg(
            &mut registry,
            &mut names,
            "reconciled",
            "Items the reconciler queued again",
            reconciled.clone(),
        );
        let plugin_reloads = Family::<ResultLabel, Counter>::default();
        reg(
            &mut registry,
            &mut names,
            "plugin_reloads",
            "Plugin file loads by result",
            plugin_reloads.clone(),
        );
        let plugin_quarantines = Counter::default();
        reg(
            &mut registry,
            &mut names,
            "plugin_quarantines",
            "Plugins quarantined",
            plugin_quarantines.clone(),
        );
        let deliveries = Family::<ResultLabel, Counter>::default();
        reg(
            &mut registry,
            &mut names,
            "deliveries",
            "Webhook delivery attempts by result",
            deliveries.clone(),
        );
        let deliveries_pending = Gauge::default();
        reg(
            &mut registry,
            &mut names,
            "deliveries_pending",
            "Webhook deliveries claimed last round (a busy dispatcher claims a full batch)",
            deliveries_pending.clone(),
        );
        let provider_requests = Family::<ResultLabel, Counter>::default();
        reg(
            &mut registry,
            &mut names,
            "provider_requests",
            "Provider requests sent, by result",
            provider_requests.clone(),
        );
        let provider_callbacks = Family::<OutcomeLabel, Counter>::default();
        reg(
            &mut registry,
            &mut names,
            "provider_callbacks",
            "Provider callbacks by outcome",
            provider_callbacks.clone(),
        );
        let provider_timeouts = Counter::default();
        reg(
            &mut registry,
            &mut names,
            "provider_timeouts",
            "Items held for review because a provider never answered",
            provider_timeouts.clone(),
        );
        let store_batches = Family::<KindLabel, Counter>::default();
        reg(
            &mut registry,
            &mut names,
            "store_batches",
            "Store transactions taken by group commit, by kind of write",
            store_batches.clone(),
        );
        let store_batched_writes = Family::<KindLabel, Counter>::default();
        reg(
            &mut registry,
            &mut names,
            "store_batched_writes",
            "Writes committed through group commit, by kind",
            store_batched_writes.clone(),
        );
        Metrics {
            registry,
            names,
            deliveries,
            deliveries_pending,
            provider_requests,
            provider_callbacks,
            provider_timeouts,
            store_batches,
            store_batched_writes,
            submissions,
            idempotency_replays,
            fingerprint_duplicates,
            queue_lag_seconds,
            queue_depth,
            evaluations_in_flight,
            leases_lost,
            stale_commits,
            evaluations_committed,
            rule_evaluations,
            rule_evaluation_seconds,
            decisions,
            reversals,
            shadow_disagreements,
            retries,
            dead_letters,
            reconciled,
            plugin_reloads,
            plugin_quarantines,
        }
    }

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
