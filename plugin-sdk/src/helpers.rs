//! Typed accessors and builders on the generated WIT types, so rules read
//! like moderation logic rather than list plumbing.

use crate::{Decision, Phase, PluginInfo, Snapshot, Verdict};
use std::str::FromStr;

impl Snapshot {
    /// The value of an interaction counter (`"flag"`, `"upvote"`, ...); zero when absent.
    pub fn counter(&self, name: &str) -> u64 {
        self.counters.iter().find(|(n, _)| n == name).map_or(0, |(_, v)| *v)
    }

    /// A raw value from the plugin's sidecar `config` table.
    pub fn config(&self, key: &str) -> Option<&str> {
        self.config.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    /// A config value parsed as `T`, or `default` when the key is absent.
    /// A value that does not parse is an error naming the key, so a typo in a
    /// sidecar file surfaces as an `error` outcome instead of a silent default.
    pub fn config_or<T: FromStr>(&self, key: &str, default: T) -> Result<T, String> {
        match self.config(key) {
            None => Ok(default),
            Some(raw) => raw
                .trim()
                .parse()
                .map_err(|_| format!("config `{key}`: cannot parse {raw:?}")),
        }
    }

    /// A comma-separated config value as trimmed, non-empty entries, or
    /// `default` when the key is absent.
    pub fn config_list(&self, key: &str, default: &[&str]) -> Vec<String> {
        match self.config(key) {
            None => default.iter().map(|s| s.to_string()).collect(),
            Some(raw) => raw
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect(),
        }
    }

    /// A value from the item's `context` pairs.
    pub fn context(&self, key: &str) -> Option<&str> {
        self.item
            .context
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// How many trigger events of `kind` led to this evaluation.
    pub fn triggered_by(&self, kind: &str) -> usize {
        self.trigger.iter().filter(|e| e.kind == kind).count()
    }

    /// How long gavel has known the author: `now_ms` minus the standing's
    /// `first_seen_ms` (0 when the first sighting is ahead of the clock), or
    /// `None` when the snapshot carries no first-seen time (0).
    ///
    /// ```
    /// use gavel_plugin_sdk::testing::SnapshotBuilder;
    /// let s = SnapshotBuilder::new().standing("good", 0.0, 1, 0, 1_000).now_ms(61_000).build();
    /// assert_eq!(s.author_age_ms(), Some(60_000));
    /// assert!(s.is_new_author(3_600_000));
    /// assert!(!s.is_new_author(60_000));
    /// assert_eq!(SnapshotBuilder::new().build().author_age_ms(), None);
    /// ```
    pub fn author_age_ms(&self) -> Option<u64> {
        let first_seen = self.author.standing.first_seen_ms;
        (first_seen > 0).then(|| self.now_ms.saturating_sub(first_seen))
    }

    /// Whether gavel first saw the author less than `max_age_ms` ago; `false`
    /// when the first-seen time is unknown (see [`Snapshot::author_age_ms`]).
    pub fn is_new_author(&self, max_age_ms: u64) -> bool {
        self.author_age_ms().is_some_and(|age| age < max_age_ms)
    }
}

impl Decision {
    /// A decision with `verdict`, score 0, no labels and `reason`.
    pub fn new(verdict: Verdict, reason: impl Into<String>) -> Self {
        Decision {
            verdict,
            score: 0.0,
            labels: Vec::new(),
            reason: reason.into(),
            provider: None,
        }
    }

    /// Hands the item to the external classifier `provider` (a name from
    /// the host's `[providers]` configuration); the item waits in
    /// `awaiting_provider` until it calls back.
    pub fn defer(provider: impl Into<String>, reason: impl Into<String>) -> Self {
        Decision {
            provider: Some(provider.into()),
            ..Self::new(Verdict::Defer, reason)
        }
    }

    /// Nothing wrong.
    pub fn allow() -> Self {
        Self::new(Verdict::Allow, "")
    }

    /// Visible, but labelled for moderators.
    pub fn flag(reason: impl Into<String>) -> Self {
        Self::new(Verdict::Flag, reason)
    }

    /// Hidden until a human decides.
    pub fn hold(reason: impl Into<String>) -> Self {
        Self::new(Verdict::Hold, reason)
    }

    /// Rejected.
    pub fn reject(reason: impl Into<String>) -> Self {
        Self::new(Verdict::Reject, reason)
    }

    /// Sets the score, clamped to [0, 1].
    pub fn score(mut self, score: f32) -> Self {
        self.score = score.clamp(0.0, 1.0);
        self
    }

    /// Adds a label.
    pub fn label(mut self, label: impl Into<String>) -> Self {
        self.labels.push(label.into());
        self
    }
}

impl PluginInfo {
    /// Info for a rule running in the `async` phase; change with [`PluginInfo::phases`].
    pub fn new(name: &str, version: &str, description: &str) -> Self {
        PluginInfo {
            name: name.to_string(),
            version: version.to_string(),
            description: description.to_string(),
            phases: vec![Phase::Async],
        }
    }

    /// Sets the phases the rule runs in.
    pub fn phases(mut self, phases: &[Phase]) -> Self {
        self.phases = phases.to_vec();
        self
    }
}

impl Verdict {
    /// The verdict's name as used in JSON and the store: `allow`, `flag`, `hold`, `reject`.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Allow => "allow",
            Verdict::Flag => "flag",
            Verdict::Defer => "defer",
            Verdict::Hold => "hold",
            Verdict::Reject => "reject",
        }
    }
}

impl FromStr for Verdict {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "allow" => Ok(Verdict::Allow),
            "flag" => Ok(Verdict::Flag),
            "defer" => Ok(Verdict::Defer),
            "hold" => Ok(Verdict::Hold),
            "reject" => Ok(Verdict::Reject),
            other => Err(format!("unknown verdict {other:?}")),
        }
    }
}
