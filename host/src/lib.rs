//! gavel: a moderation and anti-spam rule host.
//!
//! Moderation rules are sandboxed WebAssembly components written against one
//! WIT contract (`wit/`); the host evaluates them under deadlines and memory
//! caps and stamps every decision with the plugin's name, declared version
//! and content digest.
//!
//! # Layout
//!
//! - [`api`]: the HTTP API (axum): routes, auth, the one error format, OpenAPI.
//! - [`store`]: the source of truth (SQLite or PostgreSQL), conditional writes.
//! - [`status`]: the item state machine's transition table.
//! - [`worker`]: evaluation of pending items, retries, dead letters, the reconciler.
//! - [`coordinator`]: the debounce queue and leases (embedded or Redis).
//! - [`judge`]: running one phase's plugins on a snapshot and combining verdicts.
//! - [`rules`]: the rule runtime — engine, loading, registry, sandboxed evaluation.
//! - [`fingerprint`]: normalised-content fingerprints (duplicate text).
//! - [`verdict`]: verdicts and their severity order.
//! - [`config`]: layered configuration and API tokens.
//! - [`cli`]: the `gavel` command line.
//! - [`metrics`]: what `/metrics` exports.
//! - [`telemetry`]: tracing subscriber set-up.

pub mod api;
pub mod cli;
pub mod config;
pub mod coordinator;
pub mod delivery;
pub mod fingerprint;
pub mod judge;
pub mod metrics;
pub mod providers;
pub mod rules;
pub mod signing;
pub mod status;
pub mod store;
pub mod telemetry;
pub mod verdict;
pub mod worker;

use std::future::Future;
use std::sync::Arc;

/// Runs gavel on `listener` until `shutdown` resolves: opens the store
/// (migrating it), loads the plugin directory, starts the evaluation loop and
/// serves the API. On shutdown it stops accepting, lets in-flight requests
/// and evaluations finish (up to `shutdown_grace_ms`), then returns.
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
    let config = Arc::new(config);
    let tokens = config::resolve_tokens(&config)?;
    let store = store::open(&config.database_url(), config.database_max_connections).await?;
    let engine = Arc::new(rules::RuleEngine::new(config.limits.clone())?.with_cache(&config.data_dir.join("cache"))?);
    // Plugin loads, unloads and failures go to `plugin_versions`, in order.
    let (events_tx, mut events_rx) = tokio::sync::mpsc::unbounded_channel();
    let node = format!(
        "{}:{}",
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map_or_else(|_| "localhost".into(), |h| h.trim().to_string()),
        std::process::id()
    );
    let history = {
        let (store, metrics) = (store.clone(), metrics.clone());
        tokio::spawn(async move {
            while let Some(event) = events_rx.recv().await {
                let result = match &event {
                    store::PluginEvent::Loaded { .. } => Some("loaded"),
                    store::PluginEvent::Unloaded { .. } => Some("unloaded"),
                    store::PluginEvent::Failed { .. } => Some("failed"),
                    store::PluginEvent::Quarantined { .. } => None,
                };
                match result {
                    Some(result) => metrics
                        .plugin_reloads
                        .get_or_create(&metrics::ResultLabel { result })
                        .inc(),
                    None => metrics.plugin_quarantines.inc(),
                };
                if let Err(e) = store.record_plugin_event(&node, &event).await {
                    tracing::warn!(error = %e, ?event, "cannot record plugin history");
                }
            }
        })
    };
    let registry = Arc::new(rules::Registry::new(engine).with_events(events_tx));
    let plugin_dir = config.plugin_dir.clone();
    {
        let registry = registry.clone();
        tokio::task::spawn_blocking(move || {
            if let Err(e) = registry.load_dir(&plugin_dir) {
                tracing::error!(dir = %plugin_dir.display(), error = %e, "cannot read the plugin directory; running with no plugins");
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
    let coordinator = coordinator::open(config.redis_url.as_deref(), &config.redis_prefix).await?;
    // Submissions and evaluation commits share transactions (group commit).
    let writes = store::Writes::start(store.clone(), &metrics);
    let (scheduler, worker) = worker::start(
        &config,
        store.clone(),
        writes.clone(),
        coordinator.clone(),
        registry.clone(),
        metrics.clone(),
        config.role.evaluates(),
    );
    let state = api::AppState::new(
        config.clone(),
        store.clone(),
        writes,
        registry.clone(),
        scheduler,
        metrics.clone(),
        api::Tokens::new(&tokens),
    );
    let app = if config.role.serves_api() {
        api::router(state)
    } else {
        api::health_router(state)
    };
    tracing::info!(
        addr = %listener.local_addr()?, store = store.backend(), coordinator = coordinator.backend(),
        role = ?config.role, plugins = registry.plugins().len(), "gavel is serving"
    );
    axum::serve(listener, app).with_graceful_shutdown(shutdown).await?;
    tracing::info!("HTTP server stopped; finishing evaluations in flight");
    worker.shutdown(config.shutdown_grace()).await;
    drop(watcher);
    registry.unload_all();
    drop(registry);
    // The registry (and its event sender) is gone once every clone is dropped;
    // wait a little for the last history rows.
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), history).await;
    Ok(())
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
