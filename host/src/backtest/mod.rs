//! Backtests: what a candidate plugin version, or candidate list contents,
//! would have decided on stored history, and how that compares with what
//! was decided then and with what moderators concluded. Nothing here
//! writes a decision, a transition, an outbox row or a provider request: a
//! backtest only reads the store and runs the candidate in the sandbox,
//! under its own limits.
//!
//! The unit is an *evaluation*: one stored snapshot judged by every plugin
//! of a phase. A backtest selects the evaluations the replaced plugin
//! judged in a window (every stored evaluation, for a new plugin), draws a
//! sample, and for each one judges the stored snapshot with the candidate
//! and recombines the verdict with the other enforcing plugins' stored
//! decisions of the same evaluation, held fixed (`replay.rs`). A rule's
//! list calls are answered from the versions of the time, or from the
//! candidate lists (`lists.rs`); a backtest of candidate lists alone
//! replays the deployed version of every plugin whose decisions in the
//! window consulted them, each in place of its own decisions. The report
//! (`report.rs`) is the same object from `gavel backtest` and
//! `GET /v1/backtests/{id}`; `html.rs` renders it as one self-contained page.

pub mod html;
mod lists;
mod replay;
pub mod report;
mod signals;

pub use lists::{CandidateList, CandidateListError, GivenList, ListRef, MAX_CANDIDATE_LISTS, candidate_lists};
pub use replay::{ItemReplay, MAX_REPLAYED_EVALUATIONS, ReplayPage, ReplayedDecision, ReplayedEvaluation, replay_item};
pub use report::Report;

use crate::clock::{Millis, now_ms};
use crate::domain::{Digest, Phase};
use crate::rules::{RegisteredPlugin, Registry, RuleEngine};
use crate::store::{BacktestStore, History, ReplayUnit, StoreError, UnitCursor};
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

/// What a backtest judges with: candidate plugins, each in place of one
/// plugin's stored decisions, and candidate lists in place of stored ones.
#[derive(Clone)]
pub struct Candidates {
    /// One for a plugin backtest (it replaces `Request::replaces`, by
    /// default its own name); for candidate lists alone, the deployed
    /// version of each plugin that consulted them, each replacing itself.
    pub plugins: Vec<Candidate>,
    /// By name.
    pub lists: BTreeMap<String, CandidateList>,
}

impl Candidates {
    /// One candidate plugin.
    pub fn plugin(candidate: Candidate, lists: BTreeMap<String, CandidateList>) -> Candidates {
        Candidates {
            plugins: vec![candidate],
            lists,
        }
    }

    /// The loaded plugins of `registry` whose decisions in `req`'s window
    /// consulted one of `lists`, each a candidate with its deployed code
    /// and config: what a backtest of candidate lists alone replays.
    /// Blocking work (detaching a plugin) is small; the reads are bounded
    /// by the window.
    pub async fn deployed_consulting(
        store: &dyn History,
        registry: &Registry,
        lists: BTreeMap<String, CandidateList>,
        req: &Request,
    ) -> Result<Candidates, StoreError> {
        let names: Vec<String> = lists.keys().cloned().collect();
        let mut plugins = Vec::new();
        for p in registry.plugins().iter() {
            let name = &p.plugin.info.name;
            if store.consulted_lists(name, &names, req.since_ms, req.until_ms).await? {
                plugins.push(Candidate {
                    plugin: Arc::new(registry.detached(p)),
                    config: Some(p.config.clone()),
                });
            }
        }
        Ok(Candidates { plugins, lists })
    }

    /// `NAME VERSION (sha256:PREFIX)` of each plugin, and the candidate
    /// lists `NAME (sha256:PREFIX)`, for records and logs.
    pub fn label(&self) -> String {
        let plugins: Vec<String> = self.plugins.iter().map(Candidate::label).collect();
        let lists: Vec<String> = self
            .lists
            .values()
            .map(|l| format!("{} (sha256:{})", l.compiled.name, &l.compiled.digest[..12]))
            .collect();
        if lists.is_empty() {
            return plugins.join(", ");
        }
        let s = if lists.len() > 1 { "s" } else { "" };
        format!("{} with list{s} {}", plugins.join(", "), lists.join(", "))
    }

    /// The plugin each candidate replaces, in order: `replaces` (or its
    /// own name) for one candidate, each one's own name for several.
    fn replaced(&self, req: &Request) -> Vec<String> {
        match &self.plugins[..] {
            [one] => vec![
                req.replaces
                    .clone()
                    .unwrap_or_else(|| one.plugin.plugin.stamp.name.clone()),
            ],
            many => many.iter().map(|c| c.plugin.plugin.stamp.name.clone()).collect(),
        }
    }

    /// Whether a window with none of the replaced plugins' decisions is
    /// judged as a new plugin's: every stored evaluation (one candidate
    /// under its own name).
    fn may_be_new(&self, req: &Request) -> bool {
        self.plugins.len() == 1 && req.replaces.is_none()
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
    /// `Some(names)`: the replaced plugins' decisions (one per evaluation);
    /// `None`: one per evaluation, for a new plugin.
    plugins: Option<Vec<String>>,
    available: u64,
    /// The drawn sample, by id, when sampling.
    drawn: Option<Vec<ReplayUnit>>,
}

const PAGE: i64 = 10_000;

/// The first page's cursor.
const START: UnitCursor = (Millis::MIN, 0);

async fn select(
    store: &dyn History,
    req: &Request,
    replaced: Vec<String>,
    may_be_new: bool,
    cancel: &Cancel,
) -> Result<Selection, BacktestError> {
    let mut plugins = Some(replaced);
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
                .replay_units(plugins.as_deref(), req.since_ms, req.until_ms, after, PAGE)
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
        if available == 0 && may_be_new && plugins.is_some() {
            plugins = None;
            continue;
        }
        let drawn = req.sample.map(|_| {
            reservoir.sort_by_key(|u| u.decision_id);
            reservoir
        });
        return Ok(Selection {
            plugins,
            available,
            drawn,
        });
    }
}

/// Runs a backtest: selects, replays in chunks (the candidates'
/// evaluations on one blocking thread at a time, so a backtest takes at
/// most one core from live traffic), and reports. Memory is bounded: `all`
/// streams the window in `(created_at, id)` pages of [`CHUNK`] and refuses a
/// window of more than `max_all`; a sample holds at most its size. List
/// versions are read and compiled once per run, under `limits`.
pub async fn run(
    store: &dyn BacktestStore,
    engine: Arc<RuleEngine>,
    candidates: &Candidates,
    limits: &crate::lists::ListsConfig,
    req: &Request,
    progress: &mut dyn Progress,
) -> Result<Report, BacktestError> {
    if candidates.plugins.is_empty() {
        return Err(BacktestError::Failed("no plugin to replay".into()));
    }
    let started_at = now_ms();
    let clock = std::time::Instant::now();
    let replaced = candidates.replaced(req);
    let cancel = Cancel(progress.cancel_flag());
    let selection = select(store, req, replaced.clone(), candidates.may_be_new(req), &cancel).await?;
    let total = match &selection.drawn {
        Some(d) => d.len() as u64,
        None => selection.available,
    };
    let lists = lists::RunLists::new(limits.clone(), &candidates.lists);
    let mut tally = replay::Tally::new(candidates, &replaced, lists, req, selection.plugins.is_some(), cancel);
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
                        selection.plugins.as_deref(),
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
        report::Sample {
            available: selection.available,
            requested: req.sample,
            ..Default::default()
        },
        started_at,
        clock.elapsed().as_millis() as u64,
    ))
}

/// How many evaluations a backtest of `req` with `candidates` would
/// select, counting no further than `cap`: what the API checks `all`
/// against before accepting it (the same selection as [`run`]: the
/// replaced plugins' decisions, else, for a new plugin, one per evaluation).
pub async fn count_selection(
    store: &dyn History,
    candidates: &Candidates,
    req: &Request,
    cap: u64,
) -> Result<u64, StoreError> {
    let cap = i64::try_from(cap).unwrap_or(i64::MAX);
    let replaced = candidates.replaced(req);
    let mut n = store
        .count_units(Some(&replaced), req.since_ms, req.until_ms, cap)
        .await?;
    if n == 0 && candidates.may_be_new(req) {
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
