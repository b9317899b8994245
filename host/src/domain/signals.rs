//! Entity signals: counts that span items, by an entity key the items
//! share (a link domain, an IP, a device, the author), over a sliding
//! window. A rule declares the signals it needs in its sidecar
//! (`[[signals]]`); the host counts every item once, when it is created,
//! and hands the rule the values of its item's keys as of the snapshot.
//!
//! This module is the pure part: what a declaration says ([`SignalSpec`]),
//! which keys and values an item contributes ([`SignalSpec::observations`]),
//! and the time buckets a window sums ([`Window`]). Counting lives in
//! `crate::signals`.

use serde::{Deserialize, Serialize};

/// Most signals one plugin may declare.
pub const MAX_SIGNALS_PER_PLUGIN: usize = 8;
/// Most keys one item contributes to one signal (e.g. link domains).
pub const MAX_KEYS_PER_ITEM: usize = 16;
/// Longest key or counted value kept, in bytes; longer ones are cut.
pub const MAX_KEY_BYTES: usize = 256;
/// A window is summed over this many buckets: a value counts the items of
/// the current bucket and the nine before it, so the window it covers is
/// between nine and ten tenths of the declared one.
pub const BUCKETS_PER_WINDOW: i64 = 10;
/// Shortest and longest window a signal may declare.
pub const MIN_WINDOW_MS: i64 = 60_000;
pub const MAX_WINDOW_MS: i64 = 7 * 24 * 3_600_000;

/// Signal values of one item as a rule reads them (`gavel:rules/signals`):
/// by signal name, then key.
pub type SignalValues = std::collections::BTreeMap<String, std::collections::BTreeMap<String, u64>>;

/// `[signals]`: the bounds of the counts kept for entity signals.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SignalsConfig {
    /// Keys kept per signal (each with its window's buckets). Past it the
    /// keys updated least recently are dropped first, counted in
    /// `gavel_signal_evictions_total`: a flood of distinct keys (a million
    /// IPs) degrades counts, never the host.
    pub max_keys: usize,
    /// Bytes the counts of all signals may take, estimated; past it the
    /// keys updated least recently are dropped first, as above.
    pub max_memory_bytes: usize,
}

impl Default for SignalsConfig {
    fn default() -> Self {
        SignalsConfig {
            max_keys: 1_000_000,
            max_memory_bytes: 512 << 20,
        }
    }
}

/// Where a key (or a counted value) comes from in an item.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(into = "String")]
pub enum Field {
    /// The item's author.
    Author,
    /// The registrable domains (Public Suffix List) of the links in the
    /// item's text: `a.bit.ly` and `bit.ly` are one key, `bit.ly`.
    LinkDomain,
    /// A value of the item's `context` object (`context.ip`).
    Context(String),
}

impl Field {
    fn parse(s: &str) -> Result<Field, String> {
        match s {
            "author" => Ok(Field::Author),
            "link-domain" => Ok(Field::LinkDomain),
            _ => match s.strip_prefix("context.") {
                Some(name) if !name.is_empty() && name.len() <= 64 => Ok(Field::Context(name.to_string())),
                _ => Err(format!(
                    "{s:?} is not a field: use `author`, `link-domain` or `context.NAME`"
                )),
            },
        }
    }
}

impl From<Field> for String {
    fn from(f: Field) -> String {
        f.to_string()
    }
}

impl std::fmt::Display for Field {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Field::Author => f.write_str("author"),
            Field::LinkDomain => f.write_str("link-domain"),
            Field::Context(name) => write!(f, "context.{name}"),
        }
    }
}

/// What a signal counts per key.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(into = "String")]
pub enum Count {
    /// Items.
    Items,
    /// Distinct values of a field (authors per link domain, accounts per
    /// IP), estimated: exact while small, HyperLogLog past that.
    Distinct(Field),
}

impl From<Count> for String {
    fn from(c: Count) -> String {
        match c {
            Count::Items => "items".into(),
            Count::Distinct(f) => format!("distinct {f}"),
        }
    }
}

/// Counts only the items whose context value `context` is a number below
/// `below` (e.g. accounts younger than seven days).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct When {
    pub context: String,
    pub below: f64,
}

/// A signal as a sidecar declares it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignalDeclaration {
    pub name: String,
    pub key: String,
    #[serde(default = "items")]
    pub count: String,
    pub window: String,
    #[serde(default)]
    pub when: Option<When>,
}

fn items() -> String {
    "items".into()
}

/// A declared signal, checked.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SignalSpec {
    /// Lowercase letters, digits and `-`, at most 64 bytes; one definition
    /// per name across the loaded plugins.
    pub name: String,
    /// What the signal counts by.
    pub key: Field,
    pub count: Count,
    pub window_ms: i64,
    pub when: Option<When>,
}

impl SignalSpec {
    /// Checks a declaration.
    pub fn parse(d: &SignalDeclaration) -> Result<SignalSpec, String> {
        let name = &d.name;
        let name_ok = !name.is_empty()
            && name.len() <= 64
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if !name_ok {
            return Err(format!(
                "signal name {name:?}: use 1-64 lowercase letters, digits and `-`"
            ));
        }
        let key = Field::parse(&d.key).map_err(|e| format!("signal {name}: key {e}"))?;
        let count = match d.count.as_str() {
            "items" => Count::Items,
            other => match other.strip_prefix("distinct ") {
                Some(field) => {
                    Count::Distinct(Field::parse(field.trim()).map_err(|e| format!("signal {name}: count {e}"))?)
                }
                None => {
                    return Err(format!(
                        "signal {name}: count {other:?}: use `items` or `distinct FIELD`"
                    ));
                }
            },
        };
        let window_ms = parse_duration_ms(&d.window).ok_or_else(|| {
            format!(
                "signal {name}: window {:?}: use a number and a unit, e.g. `10m`, `1h`, `1d`",
                d.window
            )
        })?;
        if !(MIN_WINDOW_MS..=MAX_WINDOW_MS).contains(&window_ms) {
            return Err(format!("signal {name}: window {}: from 1m to 7d", d.window));
        }
        if let Some(w) = &d.when
            && (w.context.is_empty() || !w.below.is_finite())
        {
            return Err(format!("signal {name}: when needs a context name and a finite `below`"));
        }
        Ok(SignalSpec {
            name: name.clone(),
            key,
            count,
            window_ms,
            when: d.when.clone(),
        })
    }

    /// The buckets this signal's window sums.
    pub fn window(&self) -> Window {
        Window {
            bucket_ms: (self.window_ms / BUCKETS_PER_WINDOW).max(1),
        }
    }

    /// What `item` adds to this signal: one observation per key, with the
    /// counted value for a distinct count (each key once, each value once
    /// per key). Nothing when the item fails the `when` filter or has no
    /// key.
    pub fn observations(&self, item: &SignalItem<'_>) -> Vec<(String, Option<String>)> {
        if let Some(w) = &self.when {
            let below = item
                .context(&w.context)
                .and_then(|v| v.trim().parse::<f64>().ok())
                .is_some_and(|v| v < w.below);
            if !below {
                return Vec::new();
            }
        }
        let keys = item.values(&self.key);
        match &self.count {
            Count::Items => keys.into_iter().map(|k| (k, None)).collect(),
            Count::Distinct(field) => {
                let values = item.values(field);
                keys.iter()
                    .flat_map(|k| values.iter().map(move |v| (k.clone(), Some(v.clone()))))
                    .collect()
            }
        }
    }
}

/// The time buckets of a signal's window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub bucket_ms: i64,
}

impl Window {
    /// The bucket a time falls in.
    pub fn bucket(&self, at_ms: i64) -> i64 {
        at_ms.div_euclid(self.bucket_ms)
    }

    /// The buckets a value at `now_ms` sums: the current one and the nine
    /// before it.
    pub fn range(&self, now_ms: i64) -> std::ops::RangeInclusive<i64> {
        let now = self.bucket(now_ms);
        now - (BUCKETS_PER_WINDOW - 1)..=now
    }

    /// The earliest creation time a value at `now_ms` counts.
    pub fn start(&self, now_ms: i64) -> i64 {
        self.range(now_ms).start() * self.bucket_ms
    }
}

/// What signals read of an item.
#[derive(Debug, Clone)]
pub struct SignalItem<'a> {
    author: &'a str,
    text: &'a str,
    /// The item's `context` object.
    context: &'a serde_json::Map<String, serde_json::Value>,
    /// The text's link domains, found once however many signals key by them.
    links: std::sync::OnceLock<Vec<String>>,
}

impl<'a> SignalItem<'a> {
    pub fn new(author: &'a str, text: &'a str, context: &'a serde_json::Map<String, serde_json::Value>) -> Self {
        SignalItem {
            author,
            text,
            context,
            links: std::sync::OnceLock::new(),
        }
    }

    fn context(&self, name: &str) -> Option<String> {
        match self.context.get(name)? {
            serde_json::Value::String(s) => Some(s.clone()),
            serde_json::Value::Null => None,
            other => Some(other.to_string()),
        }
    }

    /// The values of `field` in this item, each once, non-empty, cut to
    /// [`MAX_KEY_BYTES`], at most [`MAX_KEYS_PER_ITEM`].
    pub fn values(&self, field: &Field) -> Vec<String> {
        let mut out = match field {
            Field::Author => vec![self.author.to_string()],
            Field::LinkDomain => self.links.get_or_init(|| link_domains(self.text)).clone(),
            Field::Context(name) => self.context(name).into_iter().collect(),
        };
        for v in &mut out {
            if v.len() > MAX_KEY_BYTES {
                let mut end = MAX_KEY_BYTES;
                while !v.is_char_boundary(end) {
                    end -= 1;
                }
                v.truncate(end);
            }
        }
        out.retain(|v| !v.trim().is_empty());
        out.truncate(MAX_KEYS_PER_ITEM);
        out
    }
}

/// The registrable domains of the links in `text` (`http://`, `https://`
/// and `www.` words), each once, in order of first appearance. A host that
/// is an IP address is its own key; a host under no known public suffix
/// keys by its last two labels.
pub fn link_domains(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let may_be_link = |w: &str| {
        w.get(..4)
            .is_some_and(|p| p.eq_ignore_ascii_case("http") || p.eq_ignore_ascii_case("www."))
    };
    for word in text
        .split(|c: char| c.is_whitespace() || matches!(c, '<' | '>' | '"' | '\'' | '(' | ')' | '[' | ']'))
        .filter(|w| may_be_link(w))
    {
        let lower = word.to_lowercase();
        let Some(rest) = lower
            .strip_prefix("https://")
            .or_else(|| lower.strip_prefix("http://"))
            .or_else(|| lower.starts_with("www.").then_some(lower.as_str()))
        else {
            continue;
        };
        let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
        let host = authority.rsplit('@').next().unwrap_or("");
        let host = match host.strip_prefix('[') {
            Some(v6) => v6.split(']').next().unwrap_or(""),
            None => host.split(':').next().unwrap_or(""),
        };
        if let Some(domain) = registrable(host.trim_end_matches(['.', ',', ';', '!']))
            && out.len() < MAX_KEYS_PER_ITEM
            && !out.contains(&domain)
        {
            out.push(domain);
        }
    }
    out
}

/// The registrable domain of a host name (IDNA to ASCII first).
pub fn registrable(host: &str) -> Option<String> {
    if host.is_empty() {
        return None;
    }
    if let Ok(ip) = host.parse::<std::net::IpAddr>() {
        return Some(ip.to_string());
    }
    let ascii = super::lists::domain(host).ok()?;
    if let Some(d) = psl::domain_str(&ascii) {
        return Some(d.to_string());
    }
    let labels: Vec<&str> = ascii.rsplitn(3, '.').collect();
    match labels.as_slice() {
        [tld, name, ..] => Some(format!("{name}.{tld}")),
        _ => None,
    }
}

/// `30s`, `10m`, `1h`, `1d` (or a bare number of seconds) in milliseconds.
pub fn parse_duration_ms(s: &str) -> Option<i64> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(split);
    let n: i64 = n.parse().ok()?;
    let unit_ms = match unit.trim() {
        "" | "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return None,
    };
    n.checked_mul(unit_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decl(key: &str, count: &str, window: &str) -> SignalDeclaration {
        SignalDeclaration {
            name: "s".into(),
            key: key.into(),
            count: count.into(),
            window: window.into(),
            when: None,
        }
    }

    #[test]
    fn link_domains_are_registrable_domains_each_once() {
        assert_eq!(
            link_domains("see https://a.bit.ly/x and http://BIT.ly/y, www.example.co.uk/z https://user@10.1.2.3:8080/"),
            vec!["bit.ly", "example.co.uk", "10.1.2.3"]
        );
        assert_eq!(link_domains("no links here, http:// alone"), Vec::<String>::new());
        assert_eq!(link_domains("https://bücher.example/"), vec!["xn--bcher-kva.example"]);
    }

    #[test]
    fn declarations_are_checked() {
        let s = SignalSpec::parse(&decl("link-domain", "distinct author", "10m")).unwrap();
        assert_eq!(s.key, Field::LinkDomain);
        assert_eq!(s.count, Count::Distinct(Field::Author));
        assert_eq!(s.window_ms, 600_000);
        assert_eq!(s.window().bucket_ms, 60_000);
        assert!(SignalSpec::parse(&decl("ip", "items", "10m")).is_err());
        assert!(SignalSpec::parse(&decl("context.ip", "every", "10m")).is_err());
        assert!(SignalSpec::parse(&decl("author", "items", "10s")).is_err());
        assert!(SignalSpec::parse(&decl("author", "items", "8d")).is_err());
        assert!(SignalSpec::parse(&decl("author", "items", "ten")).is_err());
        let mut bad = decl("author", "items", "1h");
        bad.name = "Bad Name".into();
        assert!(SignalSpec::parse(&bad).is_err());
    }

    #[test]
    fn observations_follow_the_key_the_count_and_the_filter() {
        let mut s = SignalSpec::parse(&decl("link-domain", "distinct author", "10m")).unwrap();
        let context = serde_json::json!({"account_age_days": 2, "ip": "10.0.0.1"});
        let item = SignalItem::new(
            "u1",
            "https://x.example/a https://y.example https://x.example/b",
            context.as_object().unwrap(),
        );
        assert_eq!(
            s.observations(&item),
            vec![
                ("x.example".into(), Some("u1".into())),
                ("y.example".into(), Some("u1".into()))
            ]
        );
        s.when = Some(When {
            context: "account_age_days".into(),
            below: 1.0,
        });
        assert!(s.observations(&item).is_empty());
        s.when = Some(When {
            context: "account_age_days".into(),
            below: 7.0,
        });
        assert_eq!(s.observations(&item).len(), 2);
        let by_ip = SignalSpec::parse(&decl("context.ip", "items", "1h")).unwrap();
        assert_eq!(by_ip.observations(&item), vec![("10.0.0.1".into(), None)]);
    }

    #[test]
    fn a_window_sums_ten_buckets_ending_at_now() {
        let w = Window { bucket_ms: 60_000 };
        assert_eq!(w.range(600_000), 1..=10);
        assert_eq!(w.start(600_000), 60_000);
        assert_eq!(w.bucket(-1), -1);
        assert_eq!(parse_duration_ms("90s"), Some(90_000));
        assert_eq!(parse_duration_ms("2d"), Some(172_800_000));
        assert_eq!(parse_duration_ms("5w"), None);
    }
}
