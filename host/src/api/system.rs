//! Health, readiness, the plugin list and the OpenAPI document.

use super::AppState;
use super::auth::Moderator;
use super::error::{ApiError, ErrorBody, Json};
use crate::domain::Mode;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

/// Liveness: the process answers.
#[utoipa::path(get, path = "/healthz", tag = "system", responses((status = 200, description = "alive")))]
pub async fn healthz() -> &'static str {
    "ok"
}

/// Readiness: the store answers.
/// What `/readyz` reports.
#[derive(Debug, Serialize, ToSchema)]
pub struct Readiness {
    /// `ready` when the store answers.
    pub status: &'static str,
    /// `ok`, or why the store does not answer.
    pub store: String,
    /// `ok`, or why the coordinator does not answer: the node still takes
    /// submissions then (the store is the truth; reconciliation schedules
    /// them once it is back), so this alone does not fail readiness.
    pub coordinator: String,
}

/// Ready when the store answers (503 otherwise); the coordinator's state is reported beside it.
#[utoipa::path(get, path = "/readyz", tag = "system", responses((status = 200, body = Readiness), (status = 503, body = Readiness)))]
pub async fn readyz(State(state): State<AppState>) -> Response {
    let store = state.store.ping().await;
    let coordinator = state.scheduler.ping().await;
    let describe = |r: Result<(), String>| r.map_or_else(|e| e, |()| "ok".to_string());
    let ready = store.is_ok();
    let body = Readiness {
        status: if ready { "ready" } else { "unavailable" },
        store: describe(store.map_err(|e| e.to_string())),
        coordinator: describe(coordinator),
    };
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let mut response = (status, axum::Json(body)).into_response();
    if !ready {
        response.headers_mut().insert(
            axum::http::header::RETRY_AFTER,
            axum::http::HeaderValue::from_static("1"),
        );
    }
    response
}

/// A loaded plugin.
#[derive(Debug, Serialize, ToSchema)]
pub struct PluginView {
    pub name: String,
    pub version: String,
    /// sha256 of the component file, hex.
    pub digest: String,
    pub description: String,
    pub mode: Mode,
    pub enabled: bool,
    pub phases: Vec<String>,
    pub path: String,
    pub loaded_at: i64,
    /// Its circuit breaker is open: not evaluated until a probe after the
    /// cool-down succeeds (see the plugin history for when and why).
    pub quarantined: bool,
    /// Whether the compiled code came from the compilation cache (a restart
    /// or re-deploy of a known digest) rather than a fresh compilation.
    pub from_cache: bool,
    /// Instances kept between evaluations (`reuse_instances` in the sidecar):
    /// faster, but state one evaluation leaves is visible to the next.
    pub reuse_instances: bool,
    /// Asynchronous evaluations of this version in this process since it loaded.
    pub evaluations: u64,
    /// For shadow plugins: evaluations whose verdict would have set another
    /// status than the enforcing plugins did.
    pub shadow_disagreements: u64,
    /// This version's record over every process, from the store: evaluations,
    /// outcomes, p50/p99 duration, reversals and reversal rate.
    pub figures: crate::store::PluginFigures,
}

/// A plugin file that failed to load.
#[derive(Debug, Serialize, ToSchema)]
pub struct PluginFailureView {
    pub path: String,
    pub error: String,
    pub at: i64,
}

/// Loaded plugins and files that failed to load.
#[derive(Debug, Serialize, ToSchema)]
pub struct PluginsView {
    pub plugins: Vec<PluginView>,
    pub failures: Vec<PluginFailureView>,
}

/// The plugins gavel runs, and why any file in the plugin directory is not running.
#[utoipa::path(
    get, path = "/v1/plugins", tag = "moderator",
    responses((status = 200, body = PluginsView), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)),
    security(("bearer" = []))
)]
pub async fn plugins(
    State(state): State<AppState>,
    Moderator(_moderator): Moderator,
) -> Result<Json<PluginsView>, ApiError> {
    Ok(Json(plugins_view(&state).await?))
}

/// What `GET /v1/plugins` answers (the console's plugins page shows the same).
pub async fn plugins_view(state: &AppState) -> Result<PluginsView, crate::store::StoreError> {
    let loaded = state.registry.plugins();
    let mut figures = Vec::with_capacity(loaded.len());
    for p in loaded.iter() {
        figures.push(state.store.plugin_figures(&p.plugin.stamp.digest.to_hex()).await?);
    }
    let plugins = loaded
        .iter()
        .zip(figures)
        .map(|(p, figures)| PluginView {
            figures,
            name: p.plugin.info.name.clone(),
            version: p.plugin.info.version.clone(),
            digest: p.plugin.stamp.digest.to_hex(),
            description: p.plugin.info.description.clone(),
            mode: p.mode,
            enabled: p.enabled,
            phases: p.phases.iter().map(|p| p.as_str().to_string()).collect(),
            path: p.plugin.path.display().to_string(),
            loaded_at: p.loaded_at_ms,
            quarantined: p.breaker.is_open(),
            from_cache: p.plugin.from_cache,
            reuse_instances: p.instances.is_some(),
            evaluations: p.evaluations.load(std::sync::atomic::Ordering::Relaxed),
            shadow_disagreements: p.disagreements.load(std::sync::atomic::Ordering::Relaxed),
        })
        .collect();
    let failures = state
        .registry
        .failures()
        .into_iter()
        .map(|f| PluginFailureView {
            path: f.path.display().to_string(),
            error: f.error,
            at: f.at_ms,
        })
        .collect();
    Ok(PluginsView { plugins, failures })
}

/// This document.
#[utoipa::path(get, path = "/openapi.json", tag = "system", responses((status = 200, description = "OpenAPI 3.1 document")))]
pub async fn openapi(State(state): State<AppState>) -> Response {
    let mut r = super::openapi_json(state.config.ingest.max_text_chars).into_response();
    r.headers_mut().insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("application/json"),
    );
    r
}

/// Every load, unload, quarantine and failed load of a plugin, newest first:
/// which exact code (name, version, digest) served when.
#[utoipa::path(
    get, path = "/v1/plugins/history", tag = "moderator",
    responses((status = 200, body = Vec<crate::store::PluginVersionRecord>), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)),
    security(("bearer" = []))
)]
pub async fn plugin_history(
    State(state): State<AppState>,
    Moderator(_moderator): Moderator,
) -> Result<Json<Vec<crate::store::PluginVersionRecord>>, ApiError> {
    Ok(Json(state.store.plugin_history(1000).await?))
}

/// Prometheus / OpenMetrics text: queue lag and depth, evaluations by plugin
/// version and outcome, stale commits, reversals, and more (README, "Operating gavel").
#[utoipa::path(get, path = "/metrics", tag = "system", responses((status = 200, description = "OpenMetrics text")))]
pub async fn metrics(State(state): State<AppState>) -> Response {
    let mut r = state.metrics.encode().into_response();
    r.headers_mut().insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
    );
    r
}
