//! Backtests: what a candidate plugin version would have decided on stored
//! history, and how that compares with what was decided then and with what
//! moderators concluded. Nothing here writes a decision, a transition, an
//! outbox row or a provider request: a backtest only reads the store and
//! runs the candidate in the sandbox, under its own limits.
//!
//! The unit is an *evaluation*: one stored snapshot judged by every plugin
//! of a phase. A backtest selects the evaluations the replaced plugin
//! judged in a window (every stored evaluation, for a new plugin), draws a
//! sample, and for each one judges the stored snapshot with the candidate
//! and recombines the verdict with the other enforcing plugins' stored
//! decisions of the same evaluation, held fixed (`replay.rs`). The report
//! (`report.rs`) is the same object from `gavel backtest` and
//! `GET /v1/backtests/{id}`; `html.rs` renders it as one self-contained page.

pub mod html;
mod replay;
pub mod report;

pub use replay::{ItemReplay, MAX_REPLAYED_EVALUATIONS, ReplayPage, ReplayedDecision, ReplayedEvaluation, replay_item};
pub use report::Report;

use crate::clock::{Millis, now_ms};
use crate::domain::{Digest, Phase};
use crate::rules::{RegisteredPlugin, Registry, RuleEngine};
use crate::store::{History, ReplayUnit, StoreError, UnitCursor};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The default sample: evaluations judged when neither `sample` nor `all` is given.
pub const DEFAULT_SAMPLE: u64 = 10_000;

/// The most evaluations `all` replays unless `evaluation.backtest_max_all` says.
pub const DEFAULT_MAX_ALL: u64 = 1_000_000;

/// A running backtest whose heartbeat (every 2 s) is older than this has
/// lost its process; the retention task marks it failed.
pub const STALE_AFTER_MS: Millis = 60_000;

/// The sample a request asks for: `None` (all) with `all`, else `sample`
/// or [`DEFAULT_SAMPLE`].
pub fn sample_size(all: bool, sample: Option<u64>) -> Option<u64> {
    (!all).then(|| sample.unwrap_or(DEFAULT_SAMPLE))
}

/// Evaluations per store round trip and per blocking batch of the candidate.
const CHUNK: usize = 256;

/// The plugin a backtest judges with.
#[derive(Clone)]
pub struct Candidate {
    pub plugin: Arc<RegisteredPlugin>,
    /// Its own config (a sidecar, or a loaded plugin's); `None`: each
    /// evaluation runs with the config stored with the replaced decision.
    pub config: Option<Vec<(String, String)>>,
}

impl Candidate {
    /// `NAME VERSION (sha256:PREFIX)`, for lists and logs.
    pub fn label(&self) -> String {
        let s = &self.plugin.plugin.stamp;
        format!("{} {} (sha256:{})", s.name, s.version, &s.digest.to_hex()[..12])
    }

    /// A component file, prepared as it would be deployed (its sidecar's
    /// config and limits). Blocking: compiles.
    pub fn from_file(registry: &Registry, path: &std::path::Path) -> Result<Candidate, String> {
        let plugin = registry.prepare_file(path)?;
        let has_sidecar = path.with_extension("toml").is_file();
        let config = has_sidecar.then(|| plugin.config.clone());
        Ok(Candidate {
            plugin: Arc::new(plugin),
            config,
        })
    }

    /// A plugin of this process by name or digest, else a component of the
    /// compilation cache by digest. Blocking: may link a cached component.
    pub fn find(registry: &Registry, name_or_digest: &str) -> Option<Result<Candidate, String>> {
        let digest = Digest::from_hex(name_or_digest.strip_prefix("sha256:").unwrap_or(name_or_digest));
        let plugins = registry.plugins();
        let loaded = plugins.iter().find(|p| match digest {
            Some(d) => p.plugin.stamp.digest == d,
            None => p.plugin.info.name == name_or_digest,
        });
        if let Some(p) = loaded {
            return Some(Ok(Candidate {
                plugin: Arc::new(registry.detached(p)),
                config: Some(p.config.clone()),
            }));
        }
        let cached = registry.engine().load_cached(&digest?)?;
        Some(
            cached
                .map(|plugin| Candidate {
                    plugin: Arc::new(registry.prepare_loaded(plugin)),
                    config: None,
                })
                .map_err(|e| e.to_string()),
        )
    }
}

/// What to replay.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The plugin whose decisions the candidate replaces (default: the
    /// candidate's own name).
    pub replaces: Option<String>,
    /// Config pairs on top of the candidate's config.
    pub overrides: Vec<(String, String)>,
    pub since_ms: Millis,
    pub until_ms: Millis,
    /// How many evaluations to draw (uniformly, reproducibly); `None`: all.
    pub sample: Option<u64>,
    /// With `sample: None`, the most evaluations the window may hold: a
    /// larger one is refused ([`BacktestError::TooLarge`]) before anything
    /// is replayed.
    pub max_all: u64,
    /// Count failed evaluations as `hold`, as `evaluation.fail_closed` does.
    pub fail_closed: bool,
}

/// Why a backtest stopped early.
#[derive(Debug, thiserror::Error)]
pub enum BacktestError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cancelled")]
    Cancelled,
    #[error("the window holds more than {max} evaluations, the most `all` replays: narrow the window or draw a sample")]
    TooLarge { max: u64 },
    #[error("{0}")]
    Failed(String),
}

/// Told how far a backtest is; answers whether to go on.
#[async_trait::async_trait]
pub trait Progress: Send {
    async fn advance(&mut self, done: u64, total: u64) -> bool;

    /// A flag that, once set, stops the backtest between two evaluations.
    fn cancel_flag(&self) -> Option<Arc<std::sync::atomic::AtomicBool>> {
        None
    }
}

/// The cancel flag of a run, if it has one.
#[derive(Clone)]
struct Cancel(Option<Arc<std::sync::atomic::AtomicBool>>);

impl Cancel {
    fn is_set(&self) -> bool {
        self.0
            .as_ref()
            .is_some_and(|c| c.load(std::sync::atomic::Ordering::Relaxed))
    }
}

/// Progress nobody watches.
pub struct Quiet;

#[async_trait::async_trait]
impl Progress for Quiet {
    async fn advance(&mut self, _: u64, _: u64) -> bool {
        true
    }
}

/// A small, seeded generator for drawing the sample (SplitMix64): the same
/// evaluations in the window and sample size draw the same sample, so two
/// candidates compare on one sample (give `until` to fix the window).
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        ((self.next() as u128 * n as u128) >> 64) as u64
    }
}

/// The selection: every unit of the window (paged; at most
/// `Request::max_all`), or a uniform sample.
struct Selection {
    /// `Some(name)`: the replaced plugin's decisions; `None`: one per evaluation.
    plugin: Option<String>,
    available: u64,
    /// The drawn sample, by id, when sampling.
    drawn: Option<Vec<ReplayUnit>>,
}

const PAGE: i64 = 10_000;

/// The first page's cursor.
const START: UnitCursor = (Millis::MIN, 0);

async fn select(store: &dyn History, req: &Request, name: &str, cancel: &Cancel) -> Result<Selection, BacktestError> {
    let mut plugin = Some(name.to_string());
    // A fixed seed: the same population and size draw the same evaluations.
    let mut rng = SplitMix(0x6761_7665_6c00);
    loop {
        let (mut available, mut after) = (0u64, START);
        let mut reservoir: Vec<ReplayUnit> = Vec::new();
        loop {
            if cancel.is_set() {
                return Err(BacktestError::Cancelled);
            }
            let page = store
                .replay_units(plugin.as_deref(), req.since_ms, req.until_ms, after, PAGE)
                .await?;
            let Some(last) = page.last() else { break };
            after = (last.created_at, last.decision_id);
            for unit in page {
                available += 1;
                if req.sample.is_none() && available > req.max_all {
                    return Err(BacktestError::TooLarge { max: req.max_all });
                }
                match req.sample {
                    Some(n) if reservoir.len() as u64 >= n => {
                        let j = rng.below(available);
                        if j < n {
                            reservoir[j as usize] = unit;
                        }
                    }
                    Some(_) => reservoir.push(unit),
                    None => {}
                }
            }
        }
        // A candidate with a new name and nothing named to replace: judge
        // every stored evaluation, as a new plugin would have.
        if available == 0 && req.replaces.is_none() && plugin.is_some() {
            plugin = None;
            continue;
        }
        let drawn = req.sample.map(|_| {
            reservoir.sort_by_key(|u| u.decision_id);
            reservoir
        });
        return Ok(Selection {
            plugin,
            available,
            drawn,
        });
    }
}

/// Runs a backtest: selects, replays in chunks (the candidate's
/// evaluations on one blocking thread at a time, so a backtest takes at
/// most one core from live traffic), and reports. Memory is bounded: `all`
/// streams the window in `(created_at, id)` pages of [`CHUNK`] and refuses a
/// window of more than `max_all`; a sample holds at most its size.
pub async fn run(
    store: &dyn History,
    engine: Arc<RuleEngine>,
    candidate: &Candidate,
    req: &Request,
    progress: &mut dyn Progress,
) -> Result<Report, BacktestError> {
    let started_at = now_ms();
    let clock = std::time::Instant::now();
    let stamp = candidate.plugin.plugin.stamp.clone();
    let replaces = req.replaces.clone().unwrap_or_else(|| stamp.name.clone());
    let cancel = Cancel(progress.cancel_flag());
    let selection = select(store, req, &replaces, &cancel).await?;
    let total = match &selection.drawn {
        Some(d) => d.len() as u64,
        None => selection.available,
    };
    let mut tally = replay::Tally::new(candidate, req, selection.plugin.is_some(), cancel);
    if !progress.advance(0, total).await {
        return Err(BacktestError::Cancelled);
    }
    let mut done = 0u64;
    match &selection.drawn {
        Some(drawn) => {
            for chunk in drawn.chunks(CHUNK) {
                tally.replay_chunk(store, &engine, chunk).await?;
                done += chunk.len() as u64;
                if !progress.advance(done, total).await {
                    return Err(BacktestError::Cancelled);
                }
            }
        }
        None => {
            let mut after = START;
            loop {
                let page = store
                    .replay_units(
                        selection.plugin.as_deref(),
                        req.since_ms,
                        req.until_ms,
                        after,
                        CHUNK as i64,
                    )
                    .await?;
                let Some(last) = page.last() else { break };
                after = (last.created_at, last.decision_id);
                // Stored since the selection counted (a window ending now).
                if done + page.len() as u64 > req.max_all {
                    return Err(BacktestError::TooLarge { max: req.max_all });
                }
                tally.replay_chunk(store, &engine, &page).await?;
                done += page.len() as u64;
                if !progress.advance(done, total.max(done)).await {
                    return Err(BacktestError::Cancelled);
                }
            }
        }
    }
    Ok(tally.report(
        replaces,
        report::Sample {
            available: selection.available,
            requested: req.sample,
            ..Default::default()
        },
        started_at,
        clock.elapsed().as_millis() as u64,
    ))
}

/// How many evaluations a backtest of `req` with `candidate` would select,
/// counting no further than `cap`: what the API checks `all` against
/// before accepting it (the same selection as [`run`]: the replaced
/// plugin's decisions, else, for a new plugin, one per evaluation).
pub async fn count_selection(
    store: &dyn History,
    candidate: &Candidate,
    req: &Request,
    cap: u64,
) -> Result<u64, StoreError> {
    let cap = i64::try_from(cap).unwrap_or(i64::MAX);
    let name = req
        .replaces
        .clone()
        .unwrap_or_else(|| candidate.plugin.plugin.stamp.name.clone());
    let mut n = store.count_units(Some(&name), req.since_ms, req.until_ms, cap).await?;
    if n == 0 && req.replaces.is_none() {
        n = store.count_units(None, req.since_ms, req.until_ms, cap).await?;
    }
    Ok(n.max(0) as u64)
}

/// The config pairs as a sorted map.
fn config_map(pairs: &[(String, String)]) -> BTreeMap<String, String> {
    pairs.iter().cloned().collect()
}

/// Which phase a stored decision ran in (`None`: a provider's answer).
fn phase_of(d: &crate::store::DecisionRecord) -> Option<Phase> {
    match d.phase {
        crate::domain::DecisionPhase::Sync => Some(Phase::Sync),
        crate::domain::DecisionPhase::Async => Some(Phase::Async),
        crate::domain::DecisionPhase::Provider => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sampler_is_uniform_enough_and_reproducible() {
        let mut a = SplitMix(7);
        let mut b = SplitMix(7);
        let draws: Vec<u64> = (0..1000).map(|_| a.below(10)).collect();
        assert_eq!(draws, (0..1000).map(|_| b.below(10)).collect::<Vec<_>>());
        for bucket in 0..10 {
            let n = draws.iter().filter(|d| **d == bucket).count();
            assert!((50..=150).contains(&n), "bucket {bucket}: {n}");
        }
    }
}
