//! Configuration, layered: built-in defaults, then a TOML file
//! (`--config PATH` or `GAVEL_CONFIG`), then the environment variables of
//! the configuration's keys (`GAVEL_LISTEN`; nested keys joined by `__`,
//! e.g. `GAVEL_INGEST__MAX_BODY_BYTES`; any other `GAVEL_*` variable is not
//! gavel's and is left alone, see `env.rs`), then command-line flags.

use crate::coordinator::{DebounceMode, Schedule};
use crate::rules::RuntimeLimits;
use figment::Figment;
use figment::providers::{Format, Serialized, Toml};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

mod env;
mod tokens;
pub use env::{SettingKeys, Variable};
pub use tokens::*;

/// Everything `gavel serve` can be told.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// What this process does: `all` (default), `api` or `worker`.
    pub role: ServeRole,
    /// Address the HTTP API listens on.
    pub listen: SocketAddr,
    /// Holds the SQLite database, generated tokens and caches.
    pub data_dir: PathBuf,
    /// The watched plugin directory: `*.wasm` components and `NAME.toml` sidecars.
    pub plugin_dir: PathBuf,
    /// `sqlite://PATH` or `postgres://…`; default `sqlite://DATA_DIR/gavel.db`.
    pub database_url: Option<String>,
    /// Database connections (readers for SQLite, which has one writer).
    pub database_max_connections: u32,
    /// SQLite durability: `full` (default; an acknowledged write survives
    /// power loss) or `normal` (survives a crash of gavel, not of the OS).
    pub sqlite_synchronous: crate::store::Synchronous,
    /// `redis://HOST:PORT` (or `redis+cluster://HOST:PORT,HOST:PORT` for a
    /// Redis Cluster) to coordinate several gavel processes; unset, the
    /// embedded coordinator serves one process.
    pub redis_url: Option<String>,
    /// Prefix of every Redis key's hash tag (`{gavel:p7}:queue`, ...);
    /// processes sharing a queue must use the same one.
    pub redis_prefix: String,
    /// Partitions the Redis queue is sharded into (each its own hash tag,
    /// so a Redis Cluster spreads them over its masters). Fixed for a
    /// deployment: every process sharing the queue uses the same number.
    pub redis_partitions: u32,
    /// API tokens. When empty, tokens are read from (or generated into)
    /// `DATA_DIR/tokens.toml`.
    pub tokens: Vec<TokenConfig>,
    /// Rule runtime limits (docs/ARCHITECTURE.md, "Limits").
    pub limits: RuntimeLimits,
    /// The program that compiles components in a child process (`gavel
    /// serve` sets it to its own binary); unset, they are compiled in this
    /// process. Not read from the file.
    #[serde(skip)]
    pub compiler_process: Option<PathBuf>,
    pub ingest: IngestConfig,
    pub evaluation: EvaluationConfig,
    /// External classifiers rules may defer to (`[providers.NAME]`).
    pub providers: BTreeMap<String, ProviderConfig>,
    /// Endpoints every transition is delivered to (`[webhooks.NAME]`).
    pub webhooks: BTreeMap<String, WebhookConfig>,
    /// Retries and timeouts of webhook deliveries.
    pub delivery: DeliveryConfig,
    /// The migration window of the signature headers: also send gavel's
    /// former `X-Gavel-*` headers on webhooks and provider requests, and
    /// accept them on provider callbacks (README, "Migrating to Standard
    /// Webhooks"). `false` sends and accepts only the `webhook-*` headers.
    pub legacy_headers: bool,
    /// The URL providers reach this deployment at (for `callback_url` in
    /// provider requests); default `http://LISTEN`.
    pub public_url: Option<String>,
    /// How long shutdown waits for in-flight requests and evaluations.
    pub shutdown_grace_ms: u64,
    /// What is deleted when (expired idempotency keys, delivered outbox
    /// rows, evaluated events, provider callbacks).
    pub retention: crate::store::RetentionPolicy,
    /// The moderator console at `/console`.
    pub console: ConsoleConfig,
    /// Author standing: strikes, account tiers and their effects.
    pub standing: crate::domain::standing::StandingPolicy,
    /// Lists moderators edit (`/v1/lists`): their limits and propagation.
    pub lists: crate::domain::lists::ListsConfig,
    /// Entity signals rules declare: their bounds.
    pub signals: crate::domain::signals::SignalsConfig,
    /// `[[policies]]`: the rules of the platform decisions are stated under.
    pub policies: Vec<crate::domain::statements::PolicyConfig>,
    /// `[statements]`: statements of reasons and appeals.
    pub statements: crate::domain::statements::StatementsConfig,
}

/// An external (often AI) classifier answering by signed callback.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderConfig {
    /// Where requests are POSTed.
    pub url: String,
    /// Shared secret (`whsec_…`, or a legacy raw secret of at least 16
    /// bytes): signs requests to the provider and verifies its callbacks
    /// (Standard Webhooks, see `signing.rs`). Leave it out to use
    /// `secrets_file`, which can hold several and is rotated without a restart.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub secret: String,
    /// A file of secrets, one per line, read again when it changes
    /// (default `DATA_DIR/secrets/providers.NAME`, generated on first start).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secrets_file: Option<PathBuf>,
    /// Per HTTP request.
    #[serde(default = "ProviderConfig::default_request_timeout_ms")]
    pub request_timeout_ms: u64,
    /// An item still waiting this long after the hand-off goes to
    /// `held_for_review` with cause `provider_timeout`.
    #[serde(default = "ProviderConfig::default_deadline_ms")]
    pub deadline_ms: i64,
    /// First retry delay of a request that failed (doubling, jittered, capped).
    #[serde(default = "ProviderConfig::default_retry_base_ms")]
    pub retry_base_ms: u64,
    #[serde(default = "ProviderConfig::default_retry_max_ms")]
    pub retry_max_ms: u64,
}

impl ProviderConfig {
    fn default_request_timeout_ms() -> u64 {
        5_000
    }
    fn default_deadline_ms() -> i64 {
        15 * 60_000
    }
    fn default_retry_base_ms() -> u64 {
        500
    }
    fn default_retry_max_ms() -> u64 {
        30_000
    }
}

/// A platform endpoint receiving signed transition events.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookConfig {
    pub url: String,
    /// Signs every delivery (`whsec_…`, or a legacy raw secret of at
    /// least 16 bytes; Standard Webhooks, see `signing.rs`). Leave it out
    /// to use `secrets_file`, which can hold several and is rotated without
    /// a restart.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub secret: String,
    /// A file of secrets, one per line, every one signing, read again when
    /// it changes (default `DATA_DIR/secrets/webhooks.NAME`, generated on
    /// first start).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secrets_file: Option<PathBuf>,
    /// Only transitions into these statuses (empty: all).
    #[serde(default)]
    pub statuses: Vec<crate::domain::ItemStatus>,
    /// Only items of these kinds (empty: all).
    #[serde(default)]
    pub kinds: Vec<String>,
    /// Where a new endpoint starts: `latest` (events from its first start
    /// on) or `earliest` (every event still retained). An endpoint keeps its
    /// position across restarts.
    #[serde(default)]
    pub start: crate::store::FeedStart,
}

/// The moderator console (`/console`, served by `all` and `api` processes).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ConsoleConfig {
    pub enabled: bool,
    /// How long a sign-in lasts.
    pub session_ttl_ms: i64,
    /// How long a review claim lasts; an open item page renews it every minute.
    pub claim_ttl_ms: i64,
    /// Mark cookies `Secure`: `true` or `false`; unset, they are `Secure`
    /// when the request came through a TLS proxy (`X-Forwarded-Proto: https`).
    pub secure_cookies: Option<bool>,
}

impl Default for ConsoleConfig {
    fn default() -> Self {
        ConsoleConfig {
            enabled: true,
            session_ttl_ms: 12 * 3_600_000,
            claim_ttl_ms: 10 * 60_000,
            secure_cookies: None,
        }
    }
}

/// Webhook delivery: at least once, per item in version order, bounded retries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DeliveryConfig {
    /// Per HTTP request.
    pub timeout_ms: u64,
    /// Attempts before a delivery is dead-lettered (replayable).
    pub max_attempts: u32,
    /// First retry delay (doubling, jittered, capped at `retry_max_ms`).
    pub retry_base_ms: u64,
    pub retry_max_ms: u64,
    /// Deliveries in flight per process.
    pub concurrency: usize,
    /// How often the dispatcher looks for new events when idle.
    pub poll_interval_ms: u64,
}

impl Default for DeliveryConfig {
    fn default() -> Self {
        DeliveryConfig {
            timeout_ms: 5_000,
            max_attempts: 10,
            retry_base_ms: 1_000,
            retry_max_ms: 5 * 60_000,
            concurrency: 32,
            poll_interval_ms: 200,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            role: ServeRole::All,
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            data_dir: PathBuf::from("data"),
            plugin_dir: PathBuf::from("plugins"),
            database_url: None,
            database_max_connections: 8,
            sqlite_synchronous: crate::store::Synchronous::Full,
            redis_url: None,
            redis_prefix: "gavel".into(),
            redis_partitions: 64,
            tokens: Vec::new(),
            limits: RuntimeLimits::default(),
            compiler_process: None,
            ingest: IngestConfig::default(),
            evaluation: EvaluationConfig::default(),
            providers: BTreeMap::new(),
            webhooks: BTreeMap::new(),
            delivery: DeliveryConfig::default(),
            legacy_headers: true,
            public_url: None,
            shutdown_grace_ms: 30_000,
            retention: crate::store::RetentionPolicy::default(),
            console: ConsoleConfig::default(),
            standing: crate::domain::standing::StandingPolicy::default(),
            lists: crate::domain::lists::ListsConfig::default(),
            signals: crate::domain::signals::SignalsConfig::default(),
            policies: Vec::new(),
            statements: crate::domain::statements::StatementsConfig::default(),
        }
    }
}

/// The jobs of one gavel process; run any number of each on one PostgreSQL
/// and one Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum ServeRole {
    /// The HTTP API and the evaluation loop.
    #[default]
    All,
    /// The HTTP API only (submissions, events, reads, moderation).
    Api,
    /// The evaluation loop and reconciler; HTTP serves only `/healthz`, `/readyz` and `/metrics`.
    Worker,
}

impl ServeRole {
    pub fn evaluates(self) -> bool {
        matches!(self, ServeRole::All | ServeRole::Worker)
    }

    pub fn serves_api(self) -> bool {
        matches!(self, ServeRole::All | ServeRole::Api)
    }
}

/// The submission path.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IngestConfig {
    /// Request bodies over this are refused with 413.
    pub max_body_bytes: usize,
    /// `text` longer than this many characters is refused with 400 (the
    /// body limit applies too). `max_text_bytes`, its name before characters
    /// were counted, is still read.
    #[serde(alias = "max_text_bytes")]
    pub max_text_chars: usize,
    /// How long an idempotency key (and its stored response) is kept.
    pub idempotency_ttl_ms: i64,
    /// A request holding its key longer than this is taken to have died,
    /// and a retry with the same key and body takes over.
    pub idempotency_lock_ms: i64,
    /// Per client token: sustained submissions + events per second, and burst.
    pub client_rate_per_second: u32,
    pub client_burst: u32,
    /// Per author: sustained submissions per second, and burst.
    pub author_rate_per_second: u32,
    pub author_burst: u32,
    /// Authors the per-author limiter tracks at most; the idle ones are
    /// forgotten first (memory stays bounded however many authors post).
    pub author_limiter_max_keys: usize,
    /// The same normalised text from one author this many times within
    /// `duplicate_window_ms` is held for review at submission.
    pub duplicate_hold_at: u32,
    pub duplicate_window_ms: i64,
    /// Window of `author.recent-items` in snapshots.
    pub author_window_ms: i64,
}

impl Default for IngestConfig {
    fn default() -> Self {
        IngestConfig {
            max_body_bytes: 256 << 10,
            max_text_chars: 64 << 10,
            idempotency_ttl_ms: 24 * 3600 * 1000,
            idempotency_lock_ms: 30_000,
            client_rate_per_second: 1000,
            client_burst: 2000,
            author_rate_per_second: 10,
            author_burst: 30,
            author_limiter_max_keys: 100_000,
            duplicate_hold_at: 5,
            duplicate_window_ms: 3600 * 1000,
            author_window_ms: 24 * 3600 * 1000,
        }
    }
}

/// Evaluation of submitted items: debounce, leases, retries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EvaluationConfig {
    /// Items being evaluated at once in this process (claimed, judged,
    /// committing).
    pub concurrency: usize,
    /// Items claimed together: their snapshots are read with a handful of
    /// queries and their commits share one transaction.
    pub batch: usize,
    /// Claimed batches being evaluated at once in this process (0: no
    /// limit but `concurrency`). While this many are in flight the worker
    /// claims nothing, so what comes due meanwhile is claimed as one batch
    /// when one ends: under load batches grow and their store round trips
    /// are shared; with little traffic each item is claimed as it comes.
    pub batches_in_flight: usize,
    /// Evaluation threads (0: one per core).
    pub threads: usize,
    /// When a plugin fails (trap, timeout, ...), count it as `hold`
    /// (fail-closed) instead of ignoring it (fail-open, the default).
    pub fail_closed: bool,
    /// The debounce applied to events (and submissions, unless overridden).
    pub debounce: Debounce,
    /// Per-kind overrides of `debounce`: keys are event kinds (`flag`,
    /// `upvote`, ...) and `submit` for new items.
    pub kinds: BTreeMap<String, DebounceOverride>,
    /// A claimed item is leased this long; a worker that dies loses its
    /// lease after it and the item is evaluated again (fencing keeps that safe).
    pub lease_ttl_ms: i64,
    /// How often the reconciler looks in the store for items that still need
    /// an evaluation but are not queued (after a crash, a Redis flush, ...).
    pub reconcile_interval_ms: u64,
    /// An item is re-queued by the reconciler once it has waited this long
    /// past its debounce window.
    pub reconcile_grace_ms: i64,
    /// How long a worker whose last claim found fewer items than it asked
    /// for waits before the next: on Redis it then claims again (a poll);
    /// the embedded queue, which sees every schedule, then waits until an
    /// item is due.
    pub poll_interval_ms: u64,
    /// Attempts of an evaluation that fails in the host (a store error or a
    /// host-side rule failure) before it is dead-lettered.
    pub max_attempts: u32,
    /// Retry backoff: `retry_base_ms · 2^(attempt-1)`, at most `retry_max_ms`, ±50 % jitter.
    pub retry_base_ms: i64,
    pub retry_max_ms: i64,
    /// When the oldest due item has waited longer than this, new submissions
    /// are held for review at once (degraded mode) instead of waiting.
    pub degraded_lag_ms: i64,
    /// Store the snapshot every evaluation judged (compressed, deduplicated,
    /// kept `retention.snapshots_ms`) with its decisions, so backtests and
    /// `gavel replay` can judge it again.
    pub store_snapshots: bool,
    /// The most evaluations a backtest with `all` replays: a window holding
    /// more is refused (422) and wants a `sample` or a narrower window.
    pub backtest_max_all: u64,
}

/// Debounce settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Debounce {
    /// `sliding` (each event pushes the evaluation, capped by max_wait) or `fixed`.
    pub mode: DebounceMode,
    /// Quiet time before an evaluation.
    pub window_ms: i64,
    /// Under a continuous stream, an item is still evaluated at least this often.
    pub max_wait_ms: i64,
}

impl Default for Debounce {
    fn default() -> Self {
        Debounce {
            mode: DebounceMode::Sliding,
            window_ms: 1_000,
            max_wait_ms: 10_000,
        }
    }
}

/// A per-kind debounce override; unset fields keep the default. `priority
/// = true` skips the window (the item is evaluated as soon as a worker is free).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DebounceOverride {
    pub mode: Option<DebounceMode>,
    pub window_ms: Option<i64>,
    pub max_wait_ms: Option<i64>,
    pub priority: bool,
}

impl Default for EvaluationConfig {
    fn default() -> Self {
        let mut kinds = BTreeMap::new();
        // A new item gets its first judgement at once; events are debounced.
        kinds.insert(
            "submit".to_string(),
            DebounceOverride {
                priority: true,
                ..DebounceOverride::default()
            },
        );
        EvaluationConfig {
            concurrency: 512,
            batch: 256,
            batches_in_flight: 2,
            threads: 0,
            fail_closed: false,
            debounce: Debounce::default(),
            kinds,
            lease_ttl_ms: 30_000,
            reconcile_interval_ms: 5_000,
            reconcile_grace_ms: 5_000,
            poll_interval_ms: 10,
            max_attempts: 5,
            retry_base_ms: 500,
            retry_max_ms: 60_000,
            degraded_lag_ms: 60_000,
            store_snapshots: true,
            backtest_max_all: crate::backtest::DEFAULT_MAX_ALL,
        }
    }
}

impl EvaluationConfig {
    /// The schedule a request of `kind` (`submit` or an event kind) asks for at `now`.
    pub fn schedule_for(&self, kind: &str, now: i64) -> Schedule {
        let o = self.kinds.get(kind).copied().unwrap_or_default();
        if o.priority {
            return Schedule::At(now);
        }
        Schedule::Debounced {
            mode: o.mode.unwrap_or(self.debounce.mode),
            window_ms: o.window_ms.unwrap_or(self.debounce.window_ms),
            max_wait_ms: o.max_wait_ms.unwrap_or(self.debounce.max_wait_ms),
        }
    }

    /// The longest an item may wait in the queue by design: the reconciler
    /// re-queues items pending longer than this plus the grace.
    pub fn longest_wait_ms(&self) -> i64 {
        let kinds = self.kinds.values().filter_map(|o| o.max_wait_ms.or(o.window_ms));
        kinds
            .chain([self.debounce.max_wait_ms, self.debounce.window_ms])
            .max()
            .unwrap_or(0)
    }
}

/// Flags that override everything else.
#[derive(Debug, Clone, Default, Serialize, clap::Args)]
pub struct ServeFlags {
    /// A TOML config file.
    #[arg(long, env = "GAVEL_CONFIG")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// What this process does: all (default), api or worker.
    #[arg(long, value_enum)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<ServeRole>,
    /// Address to listen on (default 127.0.0.1:8080).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<SocketAddr>,
    /// Data directory (default ./data).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_dir: Option<PathBuf>,
    /// Plugin directory (default ./plugins).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plugin_dir: Option<PathBuf>,
    /// Database URL: sqlite://PATH or postgres://… (default sqlite://DATA_DIR/gavel.db).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub database_url: Option<String>,
    /// Redis URL (redis://…) to coordinate several processes; default: embedded.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redis_url: Option<String>,
}

impl Config {
    /// Merges defaults, the config file, the environment and `flags`.
    pub fn load(flags: &ServeFlags) -> anyhow::Result<Config> {
        let mut figment = Figment::from(Serialized::defaults(Config::default()));
        if let Some(path) = &flags.config {
            anyhow::ensure!(path.exists(), "config file {} does not exist", path.display());
            figment = figment.merge(Toml::file(path));
        }
        let settings = SettingKeys::of(&Config::default());
        settings.warn_about_near_misses(std::env::vars_os().filter_map(|(k, _)| k.into_string().ok()));
        let config: Config = figment
            .merge(settings.environment())
            .merge(Serialized::defaults(flags))
            .extract()
            .map_err(|e| anyhow::anyhow!("configuration: {e}"))?;
        config.validate()?;
        Ok(config)
    }

    /// Refuses settings that would only fail later, at the first hand-off
    /// or delivery, and tokens that are empty, short or given twice.
    pub fn validate(&self) -> anyhow::Result<()> {
        validate_tokens(&self.tokens)?;
        self.standing
            .validate()
            .map_err(|e| anyhow::anyhow!("configuration: {e}"))?;
        crate::domain::statements::Policies::validate(&self.policies, &self.statements)
            .map_err(|e| anyhow::anyhow!("configuration: {e}"))?;
        let endpoints = self
            .providers
            .iter()
            .map(|(n, p)| (format!("providers.{n}"), &p.url, &p.secret, &p.secrets_file))
            .chain(
                self.webhooks
                    .iter()
                    .map(|(n, w)| (format!("webhooks.{n}"), &w.url, &w.secret, &w.secrets_file)),
            );
        anyhow::ensure!(
            i64::from(self.ingest.duplicate_hold_at) <= crate::store::HISTORY_CAP,
            "configuration: ingest.duplicate_hold_at must be at most {} (duplicates are counted up to that many)",
            crate::store::HISTORY_CAP
        );
        anyhow::ensure!(
            self.console.claim_ttl_ms >= 120_000,
            "configuration: console.claim_ttl_ms must be at least 120000 (an open item page renews its claim every minute)"
        );
        anyhow::ensure!(
            self.console.session_ttl_ms >= 60_000,
            "configuration: console.session_ttl_ms must be at least 60000"
        );
        for (what, url, secret, secrets_file) in endpoints {
            anyhow::ensure!(
                url.starts_with("http://") || url.starts_with("https://"),
                "configuration: {what}.url must be an http:// or https:// URL, got {url:?}"
            );
            anyhow::ensure!(
                secret.is_empty() || secrets_file.is_none(),
                "configuration: {what} gives both secret and secrets_file; keep one"
            );
            if !secret.is_empty() {
                crate::signing::Secret::parse(secret)
                    .map_err(|e| anyhow::anyhow!("configuration: {what}.secret: {e}"))?;
            }
        }
        Ok(())
    }

    /// Where providers send callbacks: `public_url`, else `http://LISTEN`.
    pub fn public_url(&self) -> String {
        self.public_url
            .clone()
            .unwrap_or_else(|| format!("http://{}", self.listen))
            .trim_end_matches('/')
            .to_string()
    }

    /// The database URL, defaulting to SQLite in the data directory.
    pub fn database_url(&self) -> String {
        self.database_url
            .clone()
            .unwrap_or_else(|| format!("sqlite://{}", self.data_dir.join("gavel.db").display()))
    }

    /// How to open the store.
    pub fn store_options(&self) -> crate::store::StoreOptions {
        crate::store::StoreOptions {
            url: self.database_url(),
            max_connections: self.database_max_connections,
            synchronous: self.sqlite_synchronous,
        }
    }

    pub fn shutdown_grace(&self) -> Duration {
        Duration::from_millis(self.shutdown_grace_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layers_apply_in_order() {
        let dir = tempfile_dir();
        let file = dir.join("gavel.toml");
        std::fs::write(
            &file,
            "listen = \"127.0.0.1:9000\"\nplugin_dir = \"from-file\"\n[ingest]\nmax_body_bytes = 1000\n",
        )
        .unwrap();
        let flags = ServeFlags {
            config: Some(file),
            plugin_dir: Some(PathBuf::from("from-flag")),
            ..ServeFlags::default()
        };
        let c = Config::load(&flags).unwrap();
        assert_eq!(c.listen.port(), 9000);
        assert_eq!(c.plugin_dir, PathBuf::from("from-flag"));
        assert_eq!(c.ingest.max_body_bytes, 1000);
        assert_eq!(c.ingest.max_text_chars, IngestConfig::default().max_text_chars);
        assert_eq!(c.database_url(), "sqlite://data/gavel.db");
    }

    #[test]
    fn a_duplicate_hold_beyond_what_is_counted_is_refused() {
        let dir = tempfile_dir();
        let load = |hold_at: i64| {
            let file = dir.join(format!("hold-{hold_at}.toml"));
            std::fs::write(&file, format!("[ingest]\nduplicate_hold_at = {hold_at}\n")).unwrap();
            Config::load(&ServeFlags {
                config: Some(file),
                ..ServeFlags::default()
            })
        };
        assert_eq!(load(crate::store::HISTORY_CAP).unwrap().ingest.duplicate_hold_at, 1000);
        let refused = load(crate::store::HISTORY_CAP + 1).unwrap_err().to_string();
        assert!(
            refused.contains("ingest.duplicate_hold_at must be at most 1000"),
            "{refused}"
        );
    }

    #[test]
    fn the_shipped_demo_configuration_loads_with_standing_tables() {
        let demo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/demo.toml");
        let flags = ServeFlags {
            config: Some(demo),
            ..ServeFlags::default()
        };
        let c = Config::load(&flags).unwrap();
        assert!(c.standing.enabled);
        assert_eq!(
            c.standing.tiers,
            crate::domain::standing::StandingPolicy::default().tiers
        );
        // A standing table as the README shows it, and a bad one.
        let dir = tempfile_dir();
        let file = dir.join("standing.toml");
        std::fs::write(
            &file,
            "[standing]\nenabled = true\n[standing.weights]\nreject = 1.0\n[standing.labels]\nscam = 3.0\n\
             [[standing.tiers]]\nname = \"good\"\nstrikes = 0\n[[standing.tiers]]\nname = \"out\"\nstrikes = 3\neffect = \"reject\"\n",
        )
        .unwrap();
        let flags = ServeFlags {
            config: Some(file.clone()),
            ..ServeFlags::default()
        };
        let c = Config::load(&flags).unwrap();
        assert_eq!(c.standing.labels["scam"], 3.0);
        assert_eq!(c.standing.tier_for(3.0).name, "out");
        std::fs::write(&file, "[[standing.tiers]]\nname = \"good\"\nstrikes = 1\n").unwrap();
        let err = Config::load(&flags).unwrap_err().to_string();
        assert!(err.contains("starts at 0"), "{err}");
    }

    #[test]
    fn debounce_overrides_per_kind() {
        let mut e = EvaluationConfig::default();
        assert_eq!(e.schedule_for("submit", 7), Schedule::At(7));
        e.kinds.insert(
            "flag".into(),
            DebounceOverride {
                window_ms: Some(50),
                ..Default::default()
            },
        );
        assert_eq!(
            e.schedule_for("flag", 0),
            Schedule::Debounced {
                mode: DebounceMode::Sliding,
                window_ms: 50,
                max_wait_ms: 10_000
            }
        );
        assert_eq!(
            e.schedule_for("upvote", 0),
            Schedule::Debounced {
                mode: DebounceMode::Sliding,
                window_ms: 1_000,
                max_wait_ms: 10_000
            }
        );
        assert_eq!(e.longest_wait_ms(), 10_000);
    }

    #[test]
    fn unknown_keys_are_refused() {
        let dir = tempfile_dir();
        let file = dir.join("gavel.toml");
        std::fs::write(&file, "lisen = \"127.0.0.1:9000\"\n").unwrap();
        let err = Config::load(&ServeFlags {
            config: Some(file),
            ..ServeFlags::default()
        })
        .unwrap_err();
        assert!(err.to_string().contains("lisen"), "{err}");
    }

    fn tempfile_dir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!("gavel-config-test-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}
