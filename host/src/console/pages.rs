//! The plugins page (what each loaded version did, and how often moderators
//! overturned it), the operations page (dead letters and webhook
//! deliveries, with replay) and search.

use super::layout::{self, PageError, page_shell, short, when};
use super::queue::{encode, excerpt};
use super::session::{ConsoleForm, CsrfForm, SignedIn};
use crate::api::{AppState, PluginView, plugins_view};
use crate::clock::{Millis, now_ms};
use crate::store::{PluginVersionRecord, ReversalPoint};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use maud::{Markup, html};
use serde::Deserialize;

const DAY_MS: i64 = 86_400_000;
/// Days the reversal chart covers.
const CHART_DAYS: i64 = 30;
/// Line colours of the chart, one per version (cycled).
const PALETTE: [&str; 6] = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf"];

/// `GET /console/plugins`.
pub async fn plugins_page(State(state): State<AppState>, session: SignedIn) -> Result<Response, PageError> {
    let now = now_ms();
    let view = plugins_view(&state).await?;
    let since = (now / DAY_MS - CHART_DAYS + 1) * DAY_MS;
    let mut series = Vec::with_capacity(view.plugins.len());
    for p in &view.plugins {
        series.push(state.store.reversal_series(&p.digest, since).await?);
    }
    let history = state.store.plugin_history(200).await?;
    let body = html! {
        main {
            h1 { "Plugins" }
            p.hint {
                "Evaluations, outcomes and p50/p99 are from the store, over every process, for each version's latest "
                (crate::store::FIGURES_WINDOW) " evaluations. The reversal rate is the share of the version's actions "
                "(applied flag, hold, reject) of the last 30 days that moderators overturned. Quarantine and shadow "
                "disagreements are this process's."
            }
            table #plugins {
                thead { tr {
                    th { "plugin" } th { "version" } th { "digest" } th { "mode" } th { "phases" } th { "state" }
                    th { "evaluations" } th { "outcomes" } th { "p50 / p99" } th { "reversal rate" } th { "shadow disagreements" }
                } }
                tbody { @for p in &view.plugins { (plugin_row(p)) } }
            }
            h2 { "Share of each version's actions that moderators overturned, per day, last " (CHART_DAYS) " days" }
            (reversal_chart(&view.plugins, &series, since))
            h2 { "Files that failed to load" }
            table #load-failures {
                @for f in &view.failures { tr { td { code { (f.path) } } td { (f.error) } td { (when(f.at, now)) } } }
            }
            @if view.failures.is_empty() { p { "None." } }
            h2 { "Load history" }
            (load_history(&history, now))
        }
    };
    Ok(page_shell("Plugins", Some(&session), body).into_response())
}

fn plugin_row(p: &PluginView) -> Markup {
    let f = &p.figures;
    let outcomes = f
        .outcomes
        .iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ");
    let micros = |v: Option<i64>| v.map_or("—".to_string(), |v| format!("{v} µs"));
    html! {
        tr data-plugin=(p.name) {
            td { strong { (p.name) } br; small { (p.description) } }
            td { (p.version) }
            td { code title=(p.digest) { (short(&p.digest)) } }
            td { (p.mode) @if p.reuse_instances { br; small { "reuses instances" } } }
            td { (p.phases.join(", ")) }
            td { @if p.quarantined { span.bad { "quarantined" } } @else if !p.enabled { "disabled" } @else { "serving" } }
            td { (f.evaluations) }
            td { (outcomes) }
            td { (micros(f.p50_us)) " / " (micros(f.p99_us)) }
            td { @match f.reversal_rate { Some(r) => { (format!("{:.1} %", r * 100.0)) " (" (f.reversals) " of " (f.actions) ")" }, None => "—" } }
            td { @if p.mode == crate::domain::Mode::Shadow { (p.shadow_disagreements) } @else { "—" } }
        }
    }
}

/// An inline SVG line chart: one line per version, the share of its
/// actions (applied flag, hold, reject) that moderators overturned, per day. Presentation attributes
/// only (the content security policy forbids inline style).
fn reversal_chart(plugins: &[PluginView], series: &[Vec<ReversalPoint>], since: Millis) -> Markup {
    const W: f64 = 720.0;
    const H: f64 = 220.0;
    const PAD: f64 = 36.0;
    let rate = |p: &ReversalPoint| {
        if p.actions > 0 {
            p.reversals as f64 / p.actions as f64
        } else {
            0.0
        }
    };
    let top = series.iter().flatten().map(rate).fold(0.0_f64, f64::max).max(0.05);
    let x = |day: Millis| PAD + (day - since) as f64 / DAY_MS as f64 / (CHART_DAYS - 1) as f64 * (W - 2.0 * PAD);
    let y = |r: f64| H - PAD - r / top * (H - 2.0 * PAD);
    html! {
        svg #reversal-chart xmlns="http://www.w3.org/2000/svg" width=(W) height=(H) viewBox={ "0 0 " (W) " " (H) }
            role="img" aria-label="Share of each plugin version's actions overturned per day" {
            line x1=(PAD) y1=(H - PAD) x2=(W - PAD) y2=(H - PAD) stroke="#888" {}
            line x1=(PAD) y1=(PAD) x2=(PAD) y2=(H - PAD) stroke="#888" {}
            text x="4" y=(PAD) font-size="11" fill="#444" { (format!("{:.0} %", top * 100.0)) }
            text x="4" y=(H - PAD) font-size="11" fill="#444" { "0 %" }
            text x=(PAD) y=(H - 8.0) font-size="11" fill="#444" { (layout::time(since).get(..10).unwrap_or("")) }
            text x=(W - PAD - 60.0) y=(H - 8.0) font-size="11" fill="#444" { "today" }
            @for (i, (p, points)) in plugins.iter().zip(series).enumerate() {
                @let colour = PALETTE[i % PALETTE.len()];
                @let path = points.iter().map(|pt| format!("{:.1},{:.1}", x(pt.day), y(rate(pt)))).collect::<Vec<_>>().join(" ");
                @if !points.is_empty() {
                    polyline points=(path) fill="none" stroke=(colour) stroke-width="2" {}
                    @for pt in points { circle cx=(format!("{:.1}", x(pt.day))) cy=(format!("{:.1}", y(rate(pt)))) r="3" fill=(colour) {
                        title { (p.name) " " (p.version) ": " (pt.reversals) " of " (pt.actions) " actions overturned" }
                    } }
                }
                rect x=(W - PAD - 170.0) y=(PAD + 14.0 * i as f64 - 9.0) width="10" height="10" fill=(colour) {}
                text x=(W - PAD - 155.0) y=(PAD + 14.0 * i as f64) font-size="11" fill="#222" { (p.name) " " (p.version) }
            }
        }
    }
}

fn load_history(history: &[PluginVersionRecord], now: Millis) -> Markup {
    html! {
        table #load-history {
            thead { tr { th { "when" } th { "node" } th { "plugin" } th { "digest" } th { "status" } th { "mode" } th { "detail" } } }
            tbody {
                @for h in history {
                    tr {
                        td { (when(h.loaded_at, now)) }
                        td { (h.node) }
                        td { (h.name.as_deref().unwrap_or("—")) " " (h.version.as_deref().unwrap_or("")) }
                        td { @if let Some(d) = &h.digest { code title=(d) { (short(d)) } } }
                        td { (h.status) @if h.quarantines > 0 { " · quarantined " (h.quarantines) "×" } }
                        td { @if let Some(m) = h.mode { (m) } }
                        td { (h.error.as_deref().or(h.breaker_detail.as_deref()).unwrap_or("")) " " small { code { (h.path) } } }
                    }
                }
            }
        }
    }
}

/// `GET /console/operations`.
pub async fn operations_page(State(state): State<AppState>, session: SignedIn) -> Result<Response, PageError> {
    let now = now_ms();
    let dead_letters = state.store.dead_letters(false, 200).await?;
    let deliveries = state.store.deliveries(false, 200).await?;
    let endpoints = state.store.webhook_endpoints().await?;
    let button = |action: String, label: &str| {
        html! {
            form.inline method="post" action=(action) {
                input type="hidden" name="csrf" value=(session.csrf);
                button type="submit" { (label) }
            }
        }
    };
    let replay = |action: String| button(action, "Replay");
    let body = html! {
        main {
            h1 { "Operations" }
            h2 { "Webhook endpoints" }
            p.hint { "An endpoint whose receiver answered 410 Gone is disabled: its deliveries wait. Enable sends them." }
            table #webhook-endpoints {
                thead { tr { th { "endpoint" } th { "state" } th { "waiting" } th { "reason" } th {} } }
                tbody { @for e in &endpoints { tr {
                    td { (e.endpoint) }
                    @match e.disabled_at {
                        Some(at) => {
                            td.disabled { "disabled " (when(at, now)) }
                            td { (e.pending) } td { (e.disabled_reason.as_deref().unwrap_or("")) }
                            td { (button(format!("/console/webhooks/{}/enable", encode(&e.endpoint)), "Enable")) }
                        }
                        None => { td { "enabled" } td { (e.pending) } td {} td {} }
                    }
                } } }
            }
            h2 { "Dead letters" }
            p.hint { "Evaluations that failed in the host past their retries. Replay judges the item again now." }
            table #dead-letters {
                thead { tr { th { "item" } th { "attempts" } th { "last error" } th { "failed" } th {} } }
                tbody { @for d in &dead_letters { tr {
                    td { a href={ "/console/items/" (encode(&d.item_id)) } { (d.item_id) } }
                    td { (d.attempts) } td { (d.last_error) } td { (when(d.failed_at, now)) }
                    td { (replay(format!("/console/dead-letters/{}/replay", d.id))) }
                } } }
            }
            h2 { "Dead webhook deliveries" }
            p.hint { "Deliveries that used up their attempts. Replay makes one pending again; order per item is kept." }
            table #deliveries {
                thead { tr { th { "endpoint" } th { "item" } th { "version" } th { "attempts" } th { "last error" } th { "created" } th {} } }
                tbody { @for w in &deliveries { tr {
                    td { (w.endpoint) }
                    td { a href={ "/console/items/" (encode(&w.item_id)) } { (w.item_id) } }
                    td { (w.item_version) } td { (w.attempts) } td { (w.last_error.as_deref().unwrap_or("")) }
                    td { (when(w.created_at, now)) }
                    td { (replay(format!("/console/deliveries/{}/replay", w.id))) }
                } } }
            }
        }
    };
    Ok(page_shell("Operations", Some(&session), body).into_response())
}

/// `POST /console/dead-letters/{id}/replay`.
pub async fn replay_dead_letter(
    State(state): State<AppState>,
    session: SignedIn,
    Path(id): Path<i64>,
    ConsoleForm(form): ConsoleForm<CsrfForm>,
) -> Result<Response, PageError> {
    session.check_csrf(form.csrf())?;
    let Some(item) = state.store.replay_dead_letter(id, now_ms()).await? else {
        return Err(PageError::new(
            StatusCode::NOT_FOUND,
            "No open dead letter has this id.",
        ));
    };
    state.scheduler.schedule_now(&item).await;
    Ok(layout::see_other("/console/operations"))
}

/// `POST /console/deliveries/{id}/replay`.
pub async fn replay_delivery(
    State(state): State<AppState>,
    session: SignedIn,
    Path(id): Path<i64>,
    ConsoleForm(form): ConsoleForm<CsrfForm>,
) -> Result<Response, PageError> {
    session.check_csrf(form.csrf())?;
    if !state.store.replay_delivery(id, now_ms()).await? {
        return Err(PageError::new(StatusCode::NOT_FOUND, "No dead delivery has this id."));
    }
    Ok(layout::see_other("/console/operations"))
}

/// `POST /console/webhooks/{endpoint}/enable`.
pub async fn enable_endpoint(
    State(state): State<AppState>,
    session: SignedIn,
    Path(endpoint): Path<String>,
    ConsoleForm(form): ConsoleForm<CsrfForm>,
) -> Result<Response, PageError> {
    session.check_csrf(form.csrf())?;
    let actor = format!("moderator:{}", session.moderator);
    if !state.store.enable_endpoint(&endpoint, &actor, now_ms()).await? {
        return Err(PageError::new(
            StatusCode::NOT_FOUND,
            "No disabled webhook endpoint has this name.",
        ));
    }
    tracing::info!(%endpoint, %actor, "webhook endpoint enabled again");
    Ok(layout::see_other("/console/operations"))
}

#[derive(Debug, Deserialize)]
pub struct SearchQuery {
    #[serde(default)]
    q: String,
}

/// `GET /console/search?q=`: an item id, or an external id or author of any client.
pub async fn search_page(
    State(state): State<AppState>,
    session: SignedIn,
    Query(query): Query<SearchQuery>,
) -> Result<Response, PageError> {
    let now = now_ms();
    let q: String = query.q.trim().chars().take(256).collect();
    // The tokens gavel accepts (configured, or generated into tokens.toml).
    let clients: Vec<&str> = state.tokens.client_names().collect();
    let found = if q.is_empty() {
        Vec::new()
    } else {
        state.store.search_items(&q, &clients).await?
    };
    let body = html! {
        main {
            h1 { "Search" }
            form method="get" action="/console/search" {
                input type="search" name="q" value=(q) aria-label="Search";
                button type="submit" { "Search" }
            }
            @if !q.is_empty() { p { (found.len()) " found for " code { (q) } } }
            table #results {
                tbody { @for i in &found { tr data-item=(i.id) {
                    td { a href={ "/console/items/" (encode(&i.id)) } { (i.id) } }
                    td { (i.status) } td { (i.client) } td { (i.author) }
                    td { (i.external_id.as_deref().unwrap_or("")) }
                    td.text { (excerpt(&i.body, 80)) }
                    td { (when(i.created_at, now)) }
                } } }
            }
        }
    };
    Ok(page_shell("Search", Some(&session), body).into_response())
}
