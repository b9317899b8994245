//! gavel: a moderation and anti-spam rule host.
//!
//! Moderation rules are sandboxed WebAssembly components written against one
//! WIT contract (`wit/`); the host evaluates them under CPU budgets and
//! memory caps and stamps every decision with the plugin's name, declared
//! version and content digest.
//!
//! # Layout
//!
//! Leaves, which import nothing else of the crate:
//!
//! - [`clock`]: time as stored (milliseconds since the epoch).
//! - [`retry`]: the backoff policy every retry loop shares.
//! - [`domain`]: statuses, verdicts, outcomes and every lifecycle as enums;
//!   the transition table; the submission and evaluation policy as pure
//!   functions.
//! - [`fingerprint`]: normalised-content fingerprints (duplicate text).
//!
//! Rooms, each with one job (arrows only point down this list):
//!
//! - [`signing`]: the signature scheme (Standard Webhooks), both ways.
//! - [`secrets`]: every endpoint's signing secrets, rotated without a restart.
//! - [`outbound`]: signed HTTP POSTs (webhooks, provider requests).
//! - [`metrics`]: what `/metrics` exports.
//! - [`lists`]: lists moderators edit, versioned, compiled into matchers.
//! - [`coordinator`]: the debounce queue and leases (embedded or Redis).
//! - [`rules`]: the rule runtime — engine, loading, registry, breakers,
//!   evaluation threads, sandboxed evaluation.
//! - [`signals`]: entity signals rules declare, counted once per item and
//!   rebuilt from the record.
//! - [`store`]: the source of truth (SQLite or PostgreSQL), one small trait
//!   per capability, conditional writes.
//! - [`config`]: layered configuration and API tokens.
//! - [`statements`]: statements of reasons, derived from the record.
//! - [`judge`]: running one phase's plugins on a snapshot.
//! - [`worker`]: claiming, judging and committing batches of items; the reconciler.
//! - [`delivery`]: the webhook dispatcher.
//! - [`providers`]: hand-offs to external classifiers (and a fake one).
//! - [`api`]: the HTTP API (axum): routes, auth, the one error format, OpenAPI.
//! - [`cli`]: the `gavel` command line.
//! - [`telemetry`]: tracing subscriber set-up.
//!
//! This file is the composition root: [`serve`] builds every long-lived
//! part and starts the background tasks side by side.

pub mod api;
pub mod backtest;
pub mod cli;
pub mod clock;
pub mod config;
pub mod console;
pub mod coordinator;
pub mod delivery;
pub mod domain;
pub mod export;
pub mod fingerprint;
pub mod judge;
pub mod lists;
pub mod metrics;
pub mod outbound;
pub mod providers;
pub mod retry;
pub mod rules;
pub mod secrets;
pub mod signals;
pub mod signing;
pub mod statements;
pub mod store;
pub mod telemetry;
pub mod worker;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Runs gavel on `listener` until `shutdown` resolves: opens the store
/// (migrating it), loads the plugin directory, starts the background tasks
/// and serves the API. On shutdown it stops accepting, lets in-flight
/// requests and evaluations finish (up to `shutdown_grace_ms`), then returns.
pub async fn serve(
    config: config::Config,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    serve_with_metrics(config, listener, shutdown, Arc::default()).await
}

/// [`serve`], recording into `metrics` (what `/metrics` exports; tests and
/// embedders read it directly).
pub async fn serve_with_metrics(
    config: config::Config,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
    metrics: Arc<metrics::Metrics>,
) -> anyhow::Result<()> {
    let mut config = config;
    // One token set from here on: the configured tokens, else those of
    // `DATA_DIR/tokens.toml`. Everything that names tokens (authentication,
    // console sessions, search across clients) reads this set.
    config.tokens = config::resolve_tokens(&config.tokens, &config.data_dir)?;
    let config = Arc::new(config);
    // Every webhook endpoint's and provider's secrets (generated on first start when none is configured).
    let keyring = Arc::new(secrets::Keyring::load(&config)?);
    let store = store::open(&config.store_options()).await?;
    // Every list compiled before the first evaluation or request; then kept
    // current (the poll starts below). Rules consult them through the engine.
    let lists = Arc::new(lists::ServedLists::new(config.lists.clone(), metrics.clone()));
    lists.refresh(store.as_ref()).await?;
    let engine = Arc::new(
        rules::RuleEngine::new(config.limits.clone())?
            .with_cache(&config.data_dir.join("cache"))?
            .with_compiler_process(config.compiler_process.clone())
            .with_lists(lists.clone()),
    );
    let pool = Arc::new(rules::EvaluationPool::new(config.evaluation.threads)?);
    let cancel = CancellationToken::new();
    let mut tasks = tokio::task::JoinSet::new();

    let (registry, watcher, history) = load_plugins(&config, engine, store.clone(), metrics.clone()).await?;
    let coordinator = coordinator::open(
        config.redis_url.as_deref(),
        &config.redis_prefix,
        config.redis_partitions,
    )
    .await?;
    // Submissions, events and evaluation commits share transactions (group commit).
    let writes = store::Writes::start(store.clone(), &metrics);
    let evaluation = Arc::new(config.evaluation.clone());
    let scheduler = worker::Scheduler::new(coordinator.clone(), evaluation.clone());
    // Entity signals the plugins declare, rebuilt from stored items now.
    let signals = signals::Signals::open(
        registry.clone(),
        store.clone(),
        config.signals.clone(),
        metrics.clone(),
        config
            .redis_url
            .as_deref()
            .map(|url| (url, config.redis_prefix.as_str())),
    )
    .await?;
    signals.start();
    tasks.spawn(signals.clone().sweep_loop(cancel.clone()));

    let worker = worker::Worker::new(worker::WorkerParts {
        store: store.clone(),
        writes: writes.clone(),
        coordinator: coordinator.clone(),
        registry: registry.clone(),
        pool: pool.clone(),
        evaluation,
        ingest: config.ingest.clone(),
        providers: config.providers.clone(),
        standing: Arc::new(config.standing.clone()),
        signals: signals.clone(),
        metrics: metrics.clone(),
    });
    tasks.spawn(worker.clone().sample_queue(cancel.clone()));
    let dispatcher = register_webhooks(&config, &store, &keyring, &metrics).await?;
    if config.role.evaluates() {
        let shared = Shared {
            config: &config,
            store: &store,
            keyring: &keyring,
            metrics: &metrics,
        };
        start_evaluating(&mut tasks, shared, &worker, dispatcher, &cancel).await?;
    }

    tasks.spawn(lists.clone().poll(store.clone(), cancel.clone()));

    let state = api::AppState::new(api::StateParts {
        config: config.clone(),
        store: store.clone(),
        writes,
        registry: registry.clone(),
        pool,
        scheduler,
        metrics: metrics.clone(),
        tokens: api::Tokens::new(&config.tokens),
        keyring,
        lists,
        signals,
    });
    let app = if config.role.serves_api() {
        tasks.spawn(forget_idle_authors(state.author_limiter.clone(), cancel.clone()));
        let console = config.console.enabled.then(|| console::router(state.clone()));
        let api = api::router(state);
        match console {
            Some(console) => api.merge(console),
            None => api,
        }
    } else {
        api::health_router(state)
    };
    tracing::info!(
        addr = %listener.local_addr()?, store = store.backend(), coordinator = coordinator.backend(),
        role = ?config.role, plugins = registry.plugins().len(), "gavel is serving"
    );
    axum::serve(listener, app).with_graceful_shutdown(shutdown).await?;
    tracing::info!("HTTP server stopped; finishing evaluations in flight");
    cancel.cancel();
    let _ = tokio::time::timeout(config.shutdown_grace(), async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    drop(watcher);
    registry.unload_all();
    drop(registry);
    // The registry (and its event sender) is gone once every clone is dropped;
    // wait a little for the last history rows.
    let _ = tokio::time::timeout(Duration::from_secs(2), history).await;
    Ok(())
}

type History = tokio::task::JoinHandle<()>;

/// Loads the plugin directory and watches it; plugin events go to the
/// plugin history, in order, through the returned task.
async fn load_plugins(
    config: &config::Config,
    engine: Arc<rules::RuleEngine>,
    store: store::SharedStore,
    metrics: Arc<metrics::Metrics>,
) -> anyhow::Result<(Arc<rules::Registry>, Option<rules::PluginWatcher>, History)> {
    let (events_tx, events_rx) = tokio::sync::mpsc::unbounded_channel();
    let history = tokio::spawn(record_plugin_history(store, metrics, events_rx));
    let registry = Arc::new(rules::Registry::new(engine).with_events(events_tx));
    {
        let (registry, dir) = (registry.clone(), config.plugin_dir.clone());
        tokio::task::spawn_blocking(move || {
            if let Err(e) = registry.load_dir(&dir) {
                tracing::error!(dir = %dir.display(), error = %e, "cannot read the plugin directory; running with no plugins");
            }
        })
        .await?;
    }
    let watcher = match rules::PluginWatcher::start(registry.clone(), config.plugin_dir.clone()) {
        Ok(w) => Some(w),
        Err(e) => {
            tracing::error!(dir = %config.plugin_dir.display(), error = %e, "cannot watch the plugin directory; hot reload is off");
            None
        }
    };
    Ok((registry, watcher, history))
}

/// The webhook dispatcher, with every endpoint's cursor registered. Every
/// role does this before it serves: an API-only process writes transitions
/// too, and an endpoint starting at `latest` registered later by a worker
/// would start past the events this process had already accepted, which
/// would then never be delivered.
async fn register_webhooks(
    config: &config::Config,
    store: &store::SharedStore,
    keyring: &Arc<secrets::Keyring>,
    metrics: &Arc<metrics::Metrics>,
) -> anyhow::Result<delivery::Dispatcher> {
    let dispatcher = delivery::Dispatcher::new(delivery::DispatcherParts {
        store: store.clone(),
        items: store.clone(),
        policies: domain::statements::Policies::new(&config.policies, &config.statements),
        endpoints: config.webhooks.clone(),
        config: config.delivery.clone(),
        keyring: keyring.clone(),
        legacy_headers: config.legacy_headers,
        metrics: metrics.clone(),
    })?;
    dispatcher.register().await?;
    Ok(dispatcher)
}

/// What every background task of a process shares.
struct Shared<'a> {
    config: &'a config::Config,
    store: &'a store::SharedStore,
    keyring: &'a Arc<secrets::Keyring>,
    metrics: &'a Arc<metrics::Metrics>,
}

/// Starts the tasks of a node that evaluates, side by side: claiming and
/// reconciling evaluations, webhook delivery, provider requests, retention.
async fn start_evaluating(
    tasks: &mut tokio::task::JoinSet<()>,
    Shared {
        config,
        store,
        keyring,
        metrics,
    }: Shared<'_>,
    worker: &Arc<worker::Worker>,
    dispatcher: delivery::Dispatcher,
    cancel: &CancellationToken,
) -> anyhow::Result<()> {
    tasks.spawn(worker.clone().claim_loop(cancel.clone()));
    tasks.spawn(worker.clone().reconcile_loop(cancel.clone()));
    tasks.spawn(Arc::new(dispatcher).run(cancel.clone()));
    let requester = providers::Requester::new(providers::RequesterParts {
        store: store.clone(),
        providers: config.providers.clone(),
        public_url: config.public_url(),
        keyring: keyring.clone(),
        legacy_headers: config.legacy_headers,
        metrics: metrics.clone(),
        // Provider deadlines and retries are seconds apart: a tenth of a second is plenty.
        poll: Duration::from_millis(100),
    })?;
    tasks.spawn(Arc::new(requester).run(cancel.clone()));
    tasks.spawn(fail_stale_backtests(store.clone(), cancel.clone()));
    if config.retention.enabled {
        tasks.spawn(prune_loop(
            store.clone(),
            config.retention.clone(),
            metrics.clone(),
            cancel.clone(),
        ));
    }
    Ok(())
}

/// Writes every plugin event to the plugin history (and counts loads).
async fn record_plugin_history(
    store: store::SharedStore,
    metrics: Arc<metrics::Metrics>,
    mut events: tokio::sync::mpsc::UnboundedReceiver<domain::PluginEvent>,
) {
    let node = format!(
        "{}:{}",
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map_or_else(|_| "localhost".into(), |h| h.trim().to_string()),
        std::process::id()
    );
    while let Some(event) = events.recv().await {
        let result = match &event {
            domain::PluginEvent::Loaded { .. } => Some("loaded"),
            domain::PluginEvent::Unloaded { .. } => Some("unloaded"),
            domain::PluginEvent::Failed { .. } => Some("failed"),
            domain::PluginEvent::Recovered { .. } => {
                metrics.plugin_recoveries.inc();
                None
            }
            domain::PluginEvent::Quarantined { .. } => None,
        };
        if let Some(result) = result {
            metrics
                .plugin_reloads
                .get_or_create(&metrics::ResultLabel { result })
                .inc();
        }
        if let Err(e) = store.record_plugin_event(&node, &event).await {
            tracing::warn!(error = %e, ?event, "cannot record plugin history");
        }
    }
}

/// Marks failed, every half minute (and at start), the running backtests
/// whose process went away (their heartbeat stopped).
async fn fail_stale_backtests(store: store::SharedStore, cancel: CancellationToken) {
    loop {
        let now = clock::now_ms();
        match store.fail_stale_backtests(now - backtest::STALE_AFTER_MS, now).await {
            Ok(0) => {}
            Ok(n) => tracing::warn!(backtests = n, "backtests whose process stopped marked failed"),
            Err(e) => tracing::warn!(error = %e, "cannot look for backtests whose process stopped"),
        }
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = tokio::time::sleep(Duration::from_secs(30)) => {}
        }
    }
}

/// Deletes what is past its retention, every interval, until caught up.
async fn prune_loop(
    store: store::SharedStore,
    policy: store::RetentionPolicy,
    metrics: Arc<metrics::Metrics>,
    cancel: CancellationToken,
) {
    let every = Duration::from_millis(policy.interval_ms.max(100));
    loop {
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = tokio::time::sleep(every) => {}
        }
        loop {
            match store.prune(&policy, clock::now_ms()).await {
                Ok(pruned) => {
                    for (table, n) in pruned.tables() {
                        if n > 0 {
                            metrics
                                .retention_removed
                                .get_or_create(&metrics::TableLabel { table })
                                .inc_by(n);
                        }
                    }
                    let caught_up = pruned.tables().iter().all(|(_, n)| (*n as i64) < policy.chunk);
                    if pruned.total() > 0 {
                        tracing::info!(?pruned, "retention: deleted rows past their retention");
                    }
                    if caught_up || cancel.is_cancelled() {
                        break;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "retention: cannot delete old rows; trying again later");
                    break;
                }
            }
        }
        match store.snapshot_footprint().await {
            Ok((docs, bytes)) => {
                metrics.snapshots_stored.set(docs);
                metrics.snapshot_bytes.set(bytes);
            }
            Err(e) => tracing::warn!(error = %e, "retention: cannot measure the stored snapshots"),
        }
    }
}

/// Forgets idle authors in the per-author rate limiter every minute.
async fn forget_idle_authors(limiter: Arc<api::AuthorLimiter>, cancel: CancellationToken) {
    loop {
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = tokio::time::sleep(Duration::from_secs(60)) => limiter.forget_idle(),
        }
    }
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
    tracing::info!("shutdown signal received");
}

/// Serde helper: a `Duration` as whole milliseconds (config files say `*_ms`).
pub(crate) mod duration_ms {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_millis() as u64)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_millis)
    }
}
