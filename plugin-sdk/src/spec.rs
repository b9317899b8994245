//! Snapshots and test cases as JSON.
//!
//! One format serves three readers: `gavel plugin eval FILE --snapshot JSON`,
//! a plugin's `cases.json` run natively by [`crate::testing::run_cases`], and
//! the host's integration tests, which run the same `cases.json` through the
//! real runtime against the built `.wasm`. Every field has a default, so a
//! snapshot can be as small as `{"item": {"text": "hello"}}`.

use serde::{Deserialize, Deserializer, Serialize};
use std::collections::BTreeMap;

/// A snapshot in JSON. Field names mirror the WIT `snapshot` record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SnapshotSpec {
    pub item: ItemSpec,
    pub counters: BTreeMap<String, u64>,
    pub author: AuthorSpec,
    pub duplicate_count: u32,
    pub trigger: Vec<EventSpec>,
    /// Sidecar config; numbers, booleans and lists of strings are accepted
    /// and passed to the rule as strings (lists comma-joined), as the host
    /// does with a sidecar `[config]` table.
    #[serde(deserialize_with = "config_strings")]
    pub config: BTreeMap<String, String>,
    /// `"sync"` or `"async"` (default).
    pub phase: String,
    pub now_ms: u64,
    /// The values of the item's entity signals as of the snapshot, by
    /// signal name, then key (what `signals::values` answers). Stored
    /// snapshots carry the signals their rules declared; left out of the
    /// JSON when empty.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub signals: BTreeMap<String, BTreeMap<String, u64>>,
}

impl Default for SnapshotSpec {
    fn default() -> Self {
        SnapshotSpec {
            item: ItemSpec::default(),
            counters: BTreeMap::new(),
            author: AuthorSpec::default(),
            duplicate_count: 0,
            trigger: Vec::new(),
            config: BTreeMap::new(),
            phase: "async".to_string(),
            now_ms: 0,
            signals: BTreeMap::new(),
        }
    }
}

/// The item part of a [`SnapshotSpec`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ItemSpec {
    pub id: String,
    pub kind: String,
    pub author: String,
    pub text: String,
    pub text_truncated: bool,
    pub context: BTreeMap<String, String>,
    pub created_at_ms: u64,
    pub version: u64,
}

impl Default for ItemSpec {
    fn default() -> Self {
        ItemSpec {
            id: "item-1".to_string(),
            kind: "post".to_string(),
            author: "author-1".to_string(),
            text: String::new(),
            text_truncated: false,
            context: BTreeMap::new(),
            created_at_ms: 0,
            version: 1,
        }
    }
}

/// The author part of a [`SnapshotSpec`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthorSpec {
    pub recent_items: u32,
    pub rejected_items: u32,
    pub held_items: u32,
    /// The author's account standing; absent means a `good` author with no
    /// history ([`StandingSpec::default`]).
    pub standing: StandingSpec,
}

/// The author's account standing in an [`AuthorSpec`]. Field names mirror
/// the WIT `standing` record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StandingSpec {
    /// The account state, e.g. `good`, `watch`, `restricted`, `suspended`
    /// (the names are the host's configuration). Default `good`.
    pub state: String,
    /// The strike score: the weighted sum of the enforced, not reversed
    /// decisions on the author's items inside the standing window, as of
    /// the author's last recomputation.
    pub strikes: f32,
    /// Items by this author received within the standing window.
    pub items: u32,
    /// Of those, the items currently `rejected`.
    pub rejected_items: u32,
    /// When gavel first saw this author, milliseconds since the Unix epoch;
    /// 0 (the default) when not given.
    pub first_seen_ms: u64,
}

impl Default for StandingSpec {
    fn default() -> Self {
        StandingSpec {
            state: "good".to_string(),
            strikes: 0.0,
            items: 0,
            rejected_items: 0,
            first_seen_ms: 0,
        }
    }
}

/// A trigger event in a [`SnapshotSpec`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EventSpec {
    pub kind: String,
    pub actor: String,
    pub at_ms: u64,
}

/// One named case of a plugin's `cases.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Case {
    pub name: String,
    pub snapshot: SnapshotSpec,
    /// The lists the host answers the rule's list calls from, by name;
    /// any other name is `unknown`, as it is for every name in a case
    /// without lists. Only the host answers list calls, so only the host
    /// (`gavel plugin test`) runs a case that gives lists.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub lists: BTreeMap<String, CaseList>,
    pub expect: Expect,
}

/// The contents of one list in a [`Case`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaseList {
    /// `terms`, `patterns`, `domains`, `strings` or `cidrs`.
    pub kind: String,
    /// The entries' values, as `PUT /v1/lists/{name}` takes them.
    pub entries: Vec<String>,
}

/// What a [`Case`] expects of the decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expect {
    /// `allow`, `flag`, `defer`, `hold` or `reject`.
    pub verdict: String,
    /// Labels the decision must carry (others may be present too).
    #[serde(default)]
    pub labels: Vec<String>,
    /// The provider a `defer` must name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
}

impl Expect {
    /// Checks a decision's verdict, labels and provider; the error says what differed.
    pub fn check(&self, verdict: &str, labels: &[String], provider: Option<&str>) -> Result<(), String> {
        if verdict != self.verdict {
            return Err(format!("expected verdict {}, got {verdict}", self.verdict));
        }
        if let Some(expected) = &self.provider
            && provider != Some(expected.as_str())
        {
            return Err(format!("expected provider {expected:?}, got {provider:?}"));
        }
        if let Some(missing) = self.labels.iter().find(|l| !labels.contains(l)) {
            return Err(format!("expected label {missing:?}, got {labels:?}"));
        }
        Ok(())
    }
}

/// Parses a `cases.json` document.
pub fn parse_cases(json: &str) -> Result<Vec<Case>, serde_json::Error> {
    serde_json::from_str(json)
}

fn config_strings<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<String, String>, D::Error> {
    let raw = BTreeMap::<String, serde_json::Value>::deserialize(d)?;
    raw.into_iter()
        .map(|(k, v)| {
            config_value_string(&v)
                .map(|s| (k.clone(), s))
                .ok_or_else(|| serde::de::Error::custom(format!("config `{k}`: unsupported value {v}")))
        })
        .collect()
}

/// Renders a config value as the string a rule receives: strings as they are,
/// numbers and booleans in their usual form, arrays of those comma-joined.
pub fn config_value_string(v: &serde_json::Value) -> Option<String> {
    use serde_json::Value;
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Array(items) => items
            .iter()
            .map(|i| match i {
                Value::Array(_) | Value::Object(_) | Value::Null => None,
                other => config_value_string(other),
            })
            .collect::<Option<Vec<_>>>()
            .map(|parts| parts.join(",")),
        Value::Null | Value::Object(_) => None,
    }
}
