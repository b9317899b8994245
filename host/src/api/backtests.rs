//! Backtests over HTTP (`/v1/backtests`) and one item's replay
//! (`/v1/items/{id}/replay`). A backtest runs in the background of the
//! process that accepted it, one at a time per process (the candidate's
//! evaluations on one blocking thread), and keeps its record in the store,
//! so any process answers `GET` and `DELETE`. The runner beats the record's
//! heartbeat; a record whose heartbeat stopped (its process went away) is
//! marked failed by the retention task. A cancel frees the backtest's place
//! in the process's queue at once, whether it runs or waits for the slot.

use super::AppState;
use super::auth::{Caller, Moderator};
use super::error::{ApiError, ErrorBody, Json, Path, Query};
use super::validate;
use crate::backtest::{self, Candidate, CandidateListError, Candidates, GivenList, ItemReplay, Progress, Report};
use crate::clock::now_ms;
use crate::domain::BacktestStatus;
use crate::lists::{Entry, ListKind};
use crate::store::{BacktestRecord, SharedStore};
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use utoipa::{IntoParams, ToSchema};

/// How often a running backtest beats its record (and notices a cancel).
const HEARTBEAT: Duration = Duration::from_secs(2);
/// The default window: the last week.
const DEFAULT_WINDOW_MS: i64 = 7 * 86_400_000;
/// The largest sample one request may ask for.
const MAX_SAMPLE: u64 = 1_000_000;
/// Config pairs one request may set.
const MAX_OVERRIDES: usize = 64;
/// Backtests one process holds at once (running or waiting for its slot).
pub const MAX_QUEUED: usize = 8;

/// This process's backtests: one runs at a time, at most [`MAX_QUEUED`]
/// are held (running or waiting for the slot), and a cancel frees its place
/// at once.
pub struct Runner {
    /// The one run slot.
    slot: Arc<Semaphore>,
    /// The places of the queue.
    places: Arc<Semaphore>,
    /// The backtests this process holds, by id.
    held: Mutex<HashMap<String, Arc<Shared>>>,
}

impl Default for Runner {
    fn default() -> Self {
        Runner {
            slot: Arc::new(Semaphore::new(1)),
            places: Arc::new(Semaphore::new(MAX_QUEUED)),
            held: Mutex::new(HashMap::new()),
        }
    }
}

impl Runner {
    /// Takes a place for backtest `id`; `None` when every place is held.
    fn hold(&self, id: &str) -> Option<Arc<Shared>> {
        let place = self.places.clone().try_acquire_owned().ok()?;
        let shared = Arc::new(Shared {
            place: Mutex::new(Some(place)),
            ..Shared::default()
        });
        self.held_map().insert(id.to_string(), shared.clone());
        Some(shared)
    }

    /// Stops backtest `id` if this process holds it, freeing its place now
    /// (a cancel recorded by another process reaches it by the heartbeat).
    fn cancel(&self, id: &str) {
        if let Some(shared) = self.held_map().get(id) {
            shared.cancel();
        }
    }

    /// Forgets an ended backtest, freeing its place if a cancel has not.
    fn release(&self, id: &str) {
        if let Some(shared) = self.held_map().remove(id) {
            shared.free_place();
        }
    }

    fn held_map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Shared>>> {
        // Nothing panics while holding the lock: the map stays consistent.
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A backtest to start: a candidate plugin, candidate lists, or both.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BacktestRequest {
    /// A plugin loaded in this process, by name or sha256 (hex, optionally
    /// `sha256:`-prefixed), or a component of the compilation cache by
    /// sha256. Without one, `lists` is required: the deployed version of
    /// every loaded plugin whose decisions in the window consulted one of
    /// them is replayed, each in place of its own decisions.
    #[schema(min_length = 1, max_length = 128)]
    pub candidate: Option<String>,
    /// The plugin whose decisions it replaces (default: its own name).
    #[schema(min_length = 1, max_length = 64)]
    pub replaces: Option<String>,
    /// Candidate lists by name (at most 16), answering the rules' calls in
    /// place of the stored list of that name (every other list answers
    /// from the version each replayed decision used). Checked and compiled
    /// as `PUT /v1/lists/{name}` would be: a bad entry is 422 naming it,
    /// too many entries 413.
    #[serde(default)]
    pub lists: BTreeMap<String, CandidateListBody>,
    /// Config pairs on top of the candidate's config.
    #[serde(default)]
    pub config: BTreeMap<String, String>,
    /// Start of the window, ms since the epoch (default: a week ago).
    pub since_ms: Option<i64>,
    /// End of the window, excluded (default: now).
    pub until_ms: Option<i64>,
    /// Evaluations to draw at random (reproducibly) from the window
    /// (default 10,000 unless `all`).
    #[schema(minimum = 1, maximum = 1_000_000)]
    pub sample: Option<u64>,
    /// Replay every evaluation of the window.
    #[serde(default)]
    pub all: bool,
}

/// The content of a candidate list.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CandidateListBody {
    /// The stored list's kind (a different one is refused); required for a
    /// list the store does not have.
    pub kind: Option<ListKind>,
    pub entries: Vec<Entry>,
}

/// A backtest just accepted.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct BacktestAccepted {
    pub id: String,
    pub status: BacktestStatus,
    /// The candidates as found: `NAME VERSION (sha256:…)`, each plugin,
    /// then `with list NAME (sha256:…)` for candidate lists.
    pub candidate: String,
}

/// Backtests, newest first (without their reports).
#[derive(Debug, Serialize, ToSchema)]
pub struct BacktestList {
    pub backtests: Vec<BacktestRecord>,
}

/// Finds a candidate (linking a cached component is blocking work).
async fn find_candidate(state: &AppState, name: &str) -> Result<Candidate, ApiError> {
    let (registry, name) = (state.registry.clone(), name.to_string());
    let found = tokio::task::spawn_blocking(move || Candidate::find(&registry, &name))
        .await
        .map_err(|_| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", "candidate lookup failed"))?;
    match found {
        Some(Ok(c)) => Ok(c),
        Some(Err(e)) => Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "candidate_not_loadable",
            format!("the cached component does not load: {e}"),
        )),
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_candidate",
            "no plugin of that name or digest is loaded or cached",
        )),
    }
}

/// The request's rules beyond its schema (a window that ends after it
/// starts, names that can name a plugin, a candidate or lists): 422 when
/// broken.
fn check(req: &BacktestRequest, now: i64) -> Result<backtest::Request, ApiError> {
    let invalid = |m: String| ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_backtest", m);
    let unprocessable = |e: ApiError| invalid(e.message);
    match &req.candidate {
        Some(candidate) => validate::identifier("candidate", candidate, 128).map_err(unprocessable)?,
        None if req.lists.is_empty() => {
            return Err(invalid("give a `candidate` plugin, candidate `lists`, or both".into()));
        }
        None if req.replaces.is_some() => {
            return Err(invalid(
                "`replaces` names what a `candidate` replaces; with `lists` alone each plugin replaces itself".into(),
            ));
        }
        None => {}
    }
    if let Some(r) = &req.replaces
        && !crate::rules::valid_name(r)
    {
        return Err(invalid(
            "`replaces` must be a plugin name: 1-64 lowercase letters, digits and '-'".into(),
        ));
    }
    if req.config.len() > MAX_OVERRIDES {
        return Err(invalid(format!("at most {MAX_OVERRIDES} config pairs")));
    }
    for (k, v) in &req.config {
        validate::identifier("config key", k, 128).map_err(unprocessable)?;
        validate::text(&format!("config.{k}"), v, 4096).map_err(unprocessable)?;
    }
    let until_ms = req.until_ms.unwrap_or(now);
    let since_ms = req.since_ms.unwrap_or(until_ms.saturating_sub(DEFAULT_WINDOW_MS));
    if since_ms >= until_ms {
        return Err(invalid("`since_ms` must be before `until_ms`".into()));
    }
    if req.all && req.sample.is_some() {
        return Err(invalid("give `sample` or `all`, not both".into()));
    }
    if let Some(n) = req.sample
        && !(1..=MAX_SAMPLE).contains(&n)
    {
        return Err(invalid(format!("`sample` must be 1-{MAX_SAMPLE}")));
    }
    Ok(backtest::Request {
        replaces: req.replaces.clone(),
        overrides: req.config.clone().into_iter().collect(),
        since_ms,
        until_ms,
        sample: backtest::sample_size(req.all, req.sample),
        max_all: backtest::DEFAULT_MAX_ALL,
        fail_closed: false,
    })
}

/// The candidate lists, checked and compiled as `PUT /v1/lists/{name}`
/// checks them: 422 naming a bad entry or a kind that does not fit, 413
/// for too many entries.
async fn candidate_lists(
    state: &AppState,
    lists: &BTreeMap<String, CandidateListBody>,
) -> Result<BTreeMap<String, backtest::CandidateList>, ApiError> {
    let given = lists
        .iter()
        .map(|(name, body)| GivenList {
            name: name.clone(),
            kind: body.kind,
            entries: body.entries.clone(),
        })
        .collect();
    backtest::candidate_lists(state.store.as_ref(), given, &state.config.lists)
        .await
        .map_err(|e| match e {
            CandidateListError::Store(e) => ApiError::from(e),
            // PUT's answer (413 or 422, its code), naming the list too.
            CandidateListError::Entry { ref error, .. } => ApiError {
                message: e.to_string(),
                ..super::lists::entry_error(error.clone())
            },
            other => {
                let code = match &other {
                    CandidateListError::KindRequired(_) => "list_kind_required",
                    CandidateListError::KindMismatch { .. } => "kind_mismatch",
                    _ => "invalid_backtest",
                };
                ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, code, other.to_string())
            }
        })
}

/// What the request judges with: its candidate plugin, else the deployed
/// plugins that consulted its candidate lists in the window (422 when
/// none did).
async fn candidates(
    state: &AppState,
    req: &BacktestRequest,
    request: &backtest::Request,
) -> Result<Candidates, ApiError> {
    let lists = candidate_lists(state, &req.lists).await?;
    if let Some(name) = &req.candidate {
        return Ok(Candidates::plugin(find_candidate(state, name).await?, lists));
    }
    let names: Vec<String> = lists.keys().cloned().collect();
    let found = Candidates::deployed_consulting(state.store.as_ref(), &state.registry, lists, request).await?;
    if found.plugins.is_empty() {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "no_plugin_consulted",
            format!(
                "no loaded plugin's decisions in the window consulted {}: give a `candidate`, or another window",
                names.join(", ")
            ),
        ));
    }
    Ok(found)
}

/// A backtest with `all` whose window holds more than `max_all`
/// evaluations: 422, before anything runs (the count reads at most
/// `max_all + 1` index entries).
async fn refuse_too_large(state: &AppState, candidates: &Candidates, req: &backtest::Request) -> Result<(), ApiError> {
    let n = backtest::count_selection(state.store.as_ref(), candidates, req, req.max_all.saturating_add(1)).await?;
    if n > req.max_all {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "backtest_too_large",
            backtest::BacktestError::TooLarge { max: req.max_all }.to_string(),
        ));
    }
    Ok(())
}

/// Start a backtest: replay stored evaluations with a candidate version,
/// candidate list contents, or both, in the background, never writing a
/// decision, transition or webhook. Every rule's list calls are answered
/// from the list versions each replayed decision used (a list it did not
/// consult: the version in force then), or from a candidate list. Poll
/// `GET /v1/backtests/{id}` for progress and the report.
#[utoipa::path(
    post, path = "/v1/backtests", tag = "moderator",
    request_body = BacktestRequest,
    responses(
        (status = 202, body = BacktestAccepted), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 413, body = ErrorBody, description = "body over `lists.max_body_bytes`, or a candidate list over `lists.max_entries`"),
        (status = 422, body = ErrorBody), (status = 429, body = ErrorBody), (status = 503, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn start(
    State(state): State<AppState>,
    Moderator(caller): Moderator,
    super::lists::ListBody(req): super::lists::ListBody<BacktestRequest>,
) -> Result<Response, ApiError> {
    let now = now_ms();
    let mut request = check(&req, now)?;
    request.fail_closed = state.config.evaluation.fail_closed;
    request.max_all = state.config.evaluation.backtest_max_all;
    let id = uuid::Uuid::now_v7().to_string();
    let Some(shared) = state.backtests.hold(&id) else {
        return Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "too_many_backtests",
            format!("this process already holds {MAX_QUEUED} backtests; wait for one to end or cancel one"),
        )
        .retry_after(30));
    };
    // Any early answer below (or the request dropped) gives the place back.
    let mut unstarted = Unstarted {
        runner: &state.backtests,
        id: &id,
        armed: true,
    };
    let candidates = candidates(&state, &req, &request).await?;
    if request.sample.is_none() {
        refuse_too_large(&state, &candidates, &request).await?;
    }
    let label = candidates.label();
    let mut body = serde_json::to_value(&req).expect("a request serializes");
    // A candidate list is kept as the report names it, not entry by entry:
    // the record is read back with every list of backtests.
    if !candidates.lists.is_empty() {
        let lists: Vec<backtest::ListRef> = candidates.lists.values().map(|l| l.describe()).collect();
        body["lists"] = serde_json::to_value(lists).expect("list refs serialize");
    }
    state
        .store
        .create_backtest(&id, &body, &label, &caller.name, now)
        .await?;
    unstarted.armed = false;
    tracing::info!(backtest = %id, candidate = %label, moderator = %caller.name, "backtest started");
    tokio::spawn(run(state.clone(), id.clone(), candidates, request, shared));
    let mut response = (
        StatusCode::ACCEPTED,
        axum::Json(BacktestAccepted {
            id: id.clone(),
            status: BacktestStatus::Running,
            candidate: label,
        }),
    )
        .into_response();
    if let Ok(location) = HeaderValue::from_str(&format!("/v1/backtests/{id}")) {
        response.headers_mut().insert(header::LOCATION, location);
    }
    Ok(response)
}

/// Releases, while armed, a place taken for a backtest not started.
struct Unstarted<'a> {
    runner: &'a Runner,
    id: &'a str,
    armed: bool,
}

impl Drop for Unstarted<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.runner.release(self.id);
        }
    }
}

/// A held backtest: progress shared between the runner and its heartbeat,
/// and its place in the queue.
#[derive(Default)]
struct Shared {
    done: AtomicU64,
    total: AtomicU64,
    cancelled: Arc<AtomicBool>,
    place: Mutex<Option<OwnedSemaphorePermit>>,
    /// Wakes the runner's wait for the slot on a cancel.
    wake: Notify,
}

impl Shared {
    /// Stops the backtest between two evaluations (or before it starts) and
    /// frees its place now: the next backtest need not wait for this one
    /// to notice.
    fn cancel(&self) {
        self.cancelled.store(true, Ordering::Relaxed);
        self.free_place();
        // Stored when nobody waits yet: the runner's wait then ends at once.
        self.wake.notify_one();
    }

    fn free_place(&self) {
        drop(self.place.lock().unwrap_or_else(|e| e.into_inner()).take());
    }
}

struct Beat(Arc<Shared>);

#[async_trait::async_trait]
impl Progress for Beat {
    async fn advance(&mut self, done: u64, total: u64) -> bool {
        self.0.done.store(done, Ordering::Relaxed);
        self.0.total.store(total, Ordering::Relaxed);
        !self.0.cancelled.load(Ordering::Relaxed)
    }

    fn cancel_flag(&self) -> Option<Arc<AtomicBool>> {
        Some(self.0.cancelled.clone())
    }
}

/// Beats the record every [`HEARTBEAT`] with the progress; notices a cancel.
async fn heartbeat(store: SharedStore, id: String, shared: Arc<Shared>) {
    loop {
        tokio::time::sleep(HEARTBEAT).await;
        let (done, total) = (
            shared.done.load(Ordering::Relaxed),
            shared.total.load(Ordering::Relaxed),
        );
        match store.backtest_progress(&id, done as i64, total as i64, now_ms()).await {
            Ok(true) => {}
            Ok(false) => {
                shared.cancel();
                return;
            }
            Err(e) => tracing::warn!(backtest = %id, error = %e, "cannot record backtest progress"),
        }
    }
}

/// Aborts the heartbeat however the run ends (a panic included: the
/// record's heartbeat then stops and the record is marked failed).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What waiting for the run slot ended with.
enum Turn {
    Slot(OwnedSemaphorePermit),
    Cancelled,
    ShuttingDown,
}

/// Waits for this process's run slot, or for a cancel.
async fn wait_for_slot(runner: &Runner, shared: &Shared) -> Turn {
    tokio::select! {
        biased;
        () = shared.wake.notified() => Turn::Cancelled,
        slot = runner.slot.clone().acquire_owned() => match slot {
            Ok(_) if shared.cancelled.load(Ordering::Relaxed) => Turn::Cancelled,
            Ok(slot) => Turn::Slot(slot),
            Err(_) => Turn::ShuttingDown,
        },
    }
}

/// Runs one backtest to its end (waiting for this process's backtest slot
/// first); its place in the queue is freed when it ends or is cancelled.
async fn run(state: AppState, id: String, candidates: Candidates, request: backtest::Request, shared: Arc<Shared>) {
    let beat = AbortOnDrop(tokio::spawn(heartbeat(state.store.clone(), id.clone(), shared.clone())));
    let result = match wait_for_slot(&state.backtests, &shared).await {
        Turn::Cancelled => Err(backtest::BacktestError::Cancelled),
        Turn::Slot(_slot) => {
            let mut progress = Beat(shared.clone());
            let engine = state.registry.engine().clone();
            backtest::run(
                state.store.as_ref(),
                engine,
                &candidates,
                &state.config.lists,
                &request,
                &mut progress,
            )
            .await
        }
        Turn::ShuttingDown => Err(backtest::BacktestError::Failed("the process is shutting down".into())),
    };
    drop(beat);
    state.backtests.release(&id);
    let now = now_ms();
    let progress = crate::store::BacktestProgress {
        done: shared.done.load(Ordering::Relaxed) as i64,
        total: shared.total.load(Ordering::Relaxed) as i64,
    };
    let (outcome, ended) = match result {
        Ok(report) => {
            let value = serde_json::to_value(&report).expect("a report serializes");
            state.metrics.backtest_replays.inc_by(report.sample.replayed);
            let ended = state
                .store
                .finish_backtest(&id, BacktestStatus::Done, progress, Some(&value), None, now)
                .await;
            ("done", ended)
        }
        Err(backtest::BacktestError::Cancelled) => ("cancelled", Ok(true)),
        Err(e) => {
            let ended = state
                .store
                .finish_backtest(&id, BacktestStatus::Failed, progress, None, Some(&e.to_string()), now)
                .await;
            ("failed", ended)
        }
    };
    // How it ended is what the record says: a cancel (or the stale sweep)
    // may have ended it first.
    let outcome = match ended {
        Ok(true) => outcome,
        Ok(false) => match state.store.backtest(&id).await {
            Ok(Some(r)) if r.status == BacktestStatus::Failed => "failed",
            _ => "cancelled",
        },
        Err(e) => {
            tracing::error!(backtest = %id, error = %e, "cannot record the end of a backtest");
            "failed"
        }
    };
    state
        .metrics
        .backtests
        .get_or_create(&crate::metrics::OutcomeLabel { outcome })
        .inc();
    tracing::info!(backtest = %id, outcome, "backtest ended");
}

/// A backtest id is a UUID: anything else names no backtest.
fn backtest_id(id: &str) -> Result<(), ApiError> {
    validate::path_id("id", id)?;
    uuid::Uuid::parse_str(id)
        .map(|_| ())
        .map_err(|_| ApiError::not_found("backtest"))
}

/// A backtest: its status, progress and, once done, its report.
#[utoipa::path(
    get, path = "/v1/backtests/{id}", tag = "moderator",
    params(("id" = String, Path)),
    responses(
        (status = 200, body = BacktestRecord), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 503, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn get_one(
    State(state): State<AppState>,
    _moderator: Moderator,
    Path(id): Path<String>,
) -> Result<Json<BacktestRecord>, ApiError> {
    backtest_id(&id)?;
    let record = state
        .store
        .backtest(&id)
        .await?
        .ok_or_else(|| ApiError::not_found("backtest"))?;
    Ok(Json(record))
}

/// Backtests, newest first (the latest 100, without their reports).
#[utoipa::path(
    get, path = "/v1/backtests", tag = "moderator",
    responses(
        (status = 200, body = BacktestList), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 503, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn list(State(state): State<AppState>, _moderator: Moderator) -> Result<Json<BacktestList>, ApiError> {
    Ok(Json(BacktestList {
        backtests: state.store.backtests(100).await?,
    }))
}

/// Cancel a running backtest (it stops within seconds, keeping no report).
/// Cancelling a cancelled backtest answers it as it is; one that finished
/// (done or failed) is a conflict.
#[utoipa::path(
    delete, path = "/v1/backtests/{id}", tag = "moderator",
    params(("id" = String, Path)),
    responses(
        (status = 200, body = BacktestRecord), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
        (status = 503, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn cancel(
    State(state): State<AppState>,
    Moderator(caller): Moderator,
    Path(id): Path<String>,
) -> Result<Json<BacktestRecord>, ApiError> {
    backtest_id(&id)?;
    let record = state
        .store
        .cancel_backtest(&id, now_ms())
        .await?
        .ok_or_else(|| ApiError::not_found("backtest"))?;
    match record.status {
        BacktestStatus::Cancelled => {
            state.backtests.cancel(&id);
            tracing::info!(backtest = %id, moderator = %caller.name, "backtest cancelled");
            Ok(Json(record))
        }
        other => Err(ApiError::conflict(
            "not_running",
            format!("the backtest has already ended: {other}"),
        )),
    }
}

/// The report of a finished backtest as one self-contained HTML page.
#[utoipa::path(
    get, path = "/v1/backtests/{id}/report.html", tag = "moderator",
    params(("id" = String, Path)),
    responses(
        (status = 200, content_type = "text/html", body = String), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody), (status = 503, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn report_html(
    State(state): State<AppState>,
    _moderator: Moderator,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    backtest_id(&id)?;
    let record = state
        .store
        .backtest(&id)
        .await?
        .ok_or_else(|| ApiError::not_found("backtest"))?;
    let Some(report) = record.report else {
        return Err(ApiError::conflict(
            "no_report",
            format!("the backtest has no report: it is {}", record.status),
        ));
    };
    let report: Report = serde_json::from_value(report).map_err(|e| {
        tracing::error!(backtest = %id, error = %e, "stored backtest report unreadable");
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "stored report unreadable",
        )
    })?;
    let mut response = backtest::html::render(&report).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("default-src 'none'; style-src 'unsafe-inline'"),
    );
    Ok(response)
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct ReplayQuery {
    /// Also judge each stored snapshot with this plugin (loaded or cached,
    /// by name or sha256).
    pub candidate: Option<String>,
    /// Evaluations in the page, 1-200 (default 50).
    #[param(minimum = 1, maximum = 200)]
    pub limit: Option<usize>,
    /// Only evaluations made before this decision id: the `older` of the
    /// page after (default: the newest).
    pub before: Option<i64>,
}

/// Evaluations a replay page holds unless `limit` says.
const DEFAULT_REPLAY_LIMIT: usize = 50;

/// An item's stored evaluations, a page at a time (the newest 50 unless
/// `limit` says, oldest first; `older` pages back): the snapshot the rules
/// judged, what each plugin decided, and what `candidate` decides on the
/// same snapshot now (moderators only). Client tokens see their own items.
#[utoipa::path(
    get, path = "/v1/items/{id}/replay", tag = "items",
    params(("id" = String, Path), ReplayQuery),
    responses(
        (status = 200, body = ItemReplay), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 422, body = ErrorBody),
        (status = 503, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn replay_item(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    Query(q): Query<ReplayQuery>,
) -> Result<Json<ItemReplay>, ApiError> {
    validate::path_id("id", &id)?;
    let limit = q.limit.unwrap_or(DEFAULT_REPLAY_LIMIT);
    if !(1..=backtest::MAX_REPLAYED_EVALUATIONS).contains(&limit) {
        return Err(ApiError::bad_request(
            "invalid_query",
            format!("limit must be 1-{}", backtest::MAX_REPLAYED_EVALUATIONS),
        ));
    }
    let page = backtest::ReplayPage {
        before: q.before,
        limit,
    };
    if !state.store.item(&id).await?.is_some_and(|i| caller.may_read(&i.client)) {
        return Err(ApiError::not_found("item"));
    }
    // Only compared with plugin names and digests: any other string names
    // no candidate. Running one costs CPU: a moderator's call.
    let candidate = match q.candidate.as_deref().filter(|c| !c.is_empty()) {
        Some(_) if caller.role != crate::config::Role::Moderator => {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                "judging with a candidate needs a moderator token",
            ));
        }
        Some(c) => Some(find_candidate(&state, c).await?),
        None => None,
    };
    let replay = backtest::replay_item(
        state.store.as_ref(),
        state.registry.engine(),
        &id,
        candidate.as_ref(),
        page,
        &state.config.lists,
    )
    .await
    .map_err(|e| match e {
        backtest::BacktestError::Store(e) => ApiError::from(e),
        other => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", other.to_string()),
    })?;
    Ok(Json(replay))
}
