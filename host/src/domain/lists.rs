//! The entries of moderators' lists: each kind's canonical form (what is
//! stored, digested and compiled), checked against the limits
//! ([`ListsConfig`]), the digest of a version, and the difference between
//! two versions. The matchers compiled from them are in `host/src/lists/`.

use gavel_plugin_sdk::text::fold_words;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

super::string_enum! {
    /// What a list holds, fixed when it is created.
    pub enum ListKind("list kind") {
        /// Words and phrases, matched as whole words on folded text (case
        /// and accents ignored, punctuation separates words).
        Terms = "terms",
        /// Regular expressions (Rust `regex` syntax, linear-time matching).
        Patterns = "patterns",
        /// Host names: a listed domain matches itself and all its subdomains.
        Domains = "domains",
        /// Exact values (media hashes, fingerprints, account ids).
        Strings = "strings",
        /// IPv4 and IPv6 ranges (`10.0.0.0/8`, `2001:db8::/32`, or one address).
        Cidrs = "cidrs",
    }
}

/// `[lists]`: the limits of lists and how often a process looks for edits
/// made by others.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ListsConfig {
    /// Lists per deployment; creating one more is refused with 422.
    pub max_lists: usize,
    /// Entries per list; more is refused with 413.
    pub max_entries: usize,
    /// Characters per entry value; a longer one is refused with 422.
    pub max_entry_chars: usize,
    /// Characters per entry note.
    pub max_note_chars: usize,
    /// The body of `PUT` and `PATCH /v1/lists/{name}` (a list is bigger
    /// than an item); a bigger body is refused with 413.
    pub max_body_bytes: usize,
    /// Bytes one compiled pattern may take (the `regex` crate's own
    /// default); a pattern over it is refused with 422 naming it.
    pub pattern_size_limit: usize,
    /// Bytes a `patterns` list's shared parts may take, each on its own:
    /// the automaton of its literal prefixes, the `RegexSet` of the
    /// patterns without one (and its lazy DFA's cache per search), and the
    /// patterns kept compiled after their first use (each counted at its
    /// program's size and one lazy DFA cache; past the budget a pattern is
    /// compiled for the call and dropped). A version over the first two is
    /// refused with 422.
    pub pattern_set_size_limit: usize,
    /// How often every process compares the versions it serves with the
    /// store's (an edit is served everywhere within about this long).
    pub poll_interval_ms: u64,
}

impl Default for ListsConfig {
    fn default() -> Self {
        ListsConfig {
            max_lists: 1_000,
            max_entries: 100_000,
            max_entry_chars: 1_024,
            max_note_chars: 256,
            max_body_bytes: 16 << 20,
            pattern_size_limit: 10 << 20,
            pattern_set_size_limit: 64 << 20,
            poll_interval_ms: 250,
        }
    }
}

/// Whether `name` can name a list: 1-64 characters, lowercase letters,
/// digits, `.`, `_` and `-`, starting with a letter or digit (a name is a
/// path segment, and never needs escaping in JSON or SQL text).
pub fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-'))
}

/// One entry: its value and, optionally, why it was added.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    pub value: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl Entry {
    pub fn new(value: impl Into<String>) -> Self {
        Entry {
            value: value.into(),
            note: None,
        }
    }
}

/// Why entries were refused: 413 for too many, 422 for a bad one (named).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EntryError {
    #[error("{count} entries, over the limit of {max} per list")]
    TooMany { count: usize, max: usize },
    #[error("entry {value:?}: {problem}")]
    Invalid { value: String, problem: String },
}

impl EntryError {
    pub fn invalid(value: &str, problem: impl Into<String>) -> Self {
        // A refused entry is quoted in the answer, shortened if it is huge.
        let value = if value.chars().count() > 80 {
            format!("{}…", value.chars().take(80).collect::<String>())
        } else {
            value.to_string()
        };
        EntryError::Invalid {
            value,
            problem: problem.into(),
        }
    }
}

/// `entries` in canonical form: each value normalised for its kind, sorted
/// by value, each value once. Refuses too many entries, an over-long or
/// empty value or note, a value its kind cannot read, and two entries that
/// are the same once normalised (naming both). Patterns are only read here;
/// compiling them (and their size limits) is the matcher's.
pub fn canonical(kind: ListKind, entries: Vec<Entry>, limits: &ListsConfig) -> Result<Vec<Entry>, EntryError> {
    if entries.len() > limits.max_entries {
        return Err(EntryError::TooMany {
            count: entries.len(),
            max: limits.max_entries,
        });
    }
    let mut out: BTreeMap<String, (String, Option<String>)> = BTreeMap::new();
    for entry in entries {
        check_text(&entry.value, limits.max_entry_chars)
            .map_err(|problem| EntryError::invalid(&entry.value, problem))?;
        if let Some(note) = &entry.note {
            check_text(note, limits.max_note_chars)
                .map_err(|problem| EntryError::invalid(&entry.value, format!("its note {problem}")))?;
        }
        let value = normalise(kind, &entry.value).map_err(|problem| EntryError::invalid(&entry.value, problem))?;
        if let Some((first, _)) = out.get(&value) {
            let problem = if *first == entry.value {
                "is listed twice".to_string()
            } else {
                format!("is the same entry as {first:?} ({value:?})")
            };
            return Err(EntryError::invalid(&entry.value, problem));
        }
        out.insert(value, (entry.value, entry.note));
    }
    Ok(out
        .into_iter()
        .map(|(value, (_, note))| Entry { value, note })
        .collect())
}

/// Not blank, at most `max` characters, no control characters.
fn check_text(s: &str, max: usize) -> Result<(), String> {
    if s.trim().is_empty() {
        return Err("is blank".into());
    }
    let chars = s.chars().count();
    if chars > max {
        return Err(format!("is {chars} characters, over the limit of {max}"));
    }
    if let Some(c) = s.chars().find(|c| c.is_control()) {
        return Err(format!("contains the control character U+{:04X}", c as u32));
    }
    Ok(())
}

/// One value in its kind's canonical form.
pub fn normalise(kind: ListKind, value: &str) -> Result<String, String> {
    match kind {
        ListKind::Terms => {
            let words = fold_words(value);
            if words.is_empty() {
                return Err("has no letters or digits".into());
            }
            Ok(words.join(" "))
        }
        ListKind::Patterns | ListKind::Strings => Ok(value.to_string()),
        ListKind::Domains => domain(value),
        ListKind::Cidrs => cidr(value).map(|net| net.to_string()),
    }
}

/// A host name in ASCII (IDNA), lowercase, without a trailing dot: labels
/// of letters, digits, `-` and `_`, at most 63 characters each, 253 in all.
pub fn domain(value: &str) -> Result<String, String> {
    let trimmed = value.trim().trim_end_matches('.');
    if trimmed.parse::<std::net::IpAddr>().is_ok() {
        return Err("is an IP address, not a domain (use a cidrs list)".into());
    }
    let ascii = idna::domain_to_ascii(trimmed).map_err(|_| "is not a valid domain name".to_string())?;
    let ok_label = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    if ascii.is_empty() || ascii.len() > 253 || !ascii.split('.').all(ok_label) {
        return Err("is not a valid domain name".into());
    }
    Ok(ascii)
}

/// A range (`10.0.0.0/8`) or one address (`/32` or `/128`), its host bits
/// cleared: `10.1.2.3/8` is `10.0.0.0/8`.
pub fn cidr(value: &str) -> Result<ipnet::IpNet, String> {
    let value = value.trim();
    if let Ok(net) = value.parse::<ipnet::IpNet>() {
        return Ok(net.trunc());
    }
    value
        .parse::<std::net::IpAddr>()
        .map(ipnet::IpNet::from)
        .map_err(|_| "is not an IP address or a CIDR range".to_string())
}

/// The sha256 of a version's canonical entries (lowercase hex): its kind,
/// then every value and note, each length-prefixed so no two lists share a
/// byte string.
pub fn digest(kind: ListKind, entries: &[Entry]) -> String {
    use sha2::{Digest as _, Sha256};
    let mut h = Sha256::new();
    h.update(b"gavel-list-v1\n");
    h.update(kind.as_str().as_bytes());
    h.update(b"\n");
    for e in entries {
        h.update((e.value.len() as u64).to_be_bytes());
        h.update(e.value.as_bytes());
        match &e.note {
            Some(note) => {
                h.update([1]);
                h.update((note.len() as u64).to_be_bytes());
                h.update(note.as_bytes());
            }
            None => h.update([0]),
        }
    }
    hex::encode(h.finalize())
}

/// An entry whose note changed between two versions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Renote {
    pub value: String,
    pub from_note: Option<String>,
    pub to_note: Option<String>,
}

/// What changed from one version to another.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Diff {
    pub added: Vec<Entry>,
    pub removed: Vec<Entry>,
    pub renoted: Vec<Renote>,
}

/// The difference between two canonical (sorted) versions, in value order.
pub fn diff(from: &[Entry], to: &[Entry]) -> Diff {
    let mut out = Diff::default();
    let (mut a, mut b) = (from.iter().peekable(), to.iter().peekable());
    loop {
        match (a.peek(), b.peek()) {
            (Some(x), Some(y)) if x.value == y.value => {
                if x.note != y.note {
                    out.renoted.push(Renote {
                        value: x.value.clone(),
                        from_note: x.note.clone(),
                        to_note: y.note.clone(),
                    });
                }
                a.next();
                b.next();
            }
            (Some(x), Some(y)) if x.value < y.value => out.removed.push(a.next().cloned().expect("peeked")),
            (Some(_), Some(_)) | (None, Some(_)) => out.added.push(b.next().cloned().expect("peeked")),
            (Some(_), None) => out.removed.push(a.next().cloned().expect("peeked")),
            (None, None) => return out,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> ListsConfig {
        ListsConfig::default()
    }

    fn values(kind: ListKind, raw: &[&str]) -> Result<Vec<String>, EntryError> {
        let entries = raw.iter().map(|v| Entry::new(*v)).collect();
        canonical(kind, entries, &limits()).map(|e| e.into_iter().map(|e| e.value).collect())
    }

    #[test]
    fn the_kind_check_constraint_mirrors_the_enum() {
        let kinds: Vec<&str> = ListKind::ALL.iter().map(|k| k.as_str()).collect();
        crate::domain::check_constraints::assert_mirrors("lists", "kind", &kinds);
    }

    #[test]
    fn each_kind_has_one_canonical_form() {
        assert_eq!(
            values(ListKind::Terms, &["Free  MONEY!", "Café"]).unwrap(),
            ["cafe", "free money"]
        );
        assert_eq!(
            values(ListKind::Domains, &["Bit.LY.", "bücher.example"]).unwrap(),
            ["bit.ly", "xn--bcher-kva.example"]
        );
        assert_eq!(
            values(ListKind::Cidrs, &["10.1.2.3/8", "192.0.2.7", "2001:DB8::1/32"]).unwrap(),
            ["10.0.0.0/8", "192.0.2.7/32", "2001:db8::/32"]
        );
        assert_eq!(values(ListKind::Strings, &["b", "A"]).unwrap(), ["A", "b"]);
    }

    #[test]
    fn bad_entries_are_refused_by_name() {
        let cases = [
            (ListKind::Domains, "exa mple.com"),
            (ListKind::Domains, "-bad.example"),
            (ListKind::Domains, "192.0.2.1"),
            (ListKind::Cidrs, "10.0.0.0/33"),
            (ListKind::Cidrs, "not-an-ip"),
            (ListKind::Terms, "?!"),
            (ListKind::Strings, "  "),
            (ListKind::Strings, "tab\there"),
            (ListKind::Domains, "a..b"),
        ];
        for (kind, bad) in cases {
            match values(kind, &[bad]) {
                Err(EntryError::Invalid { value, .. }) => assert_eq!(value, bad, "{kind}"),
                other => panic!("{kind} {bad:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn duplicates_after_normalising_are_refused_naming_both() {
        let e = values(ListKind::Terms, &["Crypto", "crypto!"]).unwrap_err();
        assert_eq!(
            e.to_string(),
            r#"entry "crypto!": is the same entry as "Crypto" ("crypto")"#
        );
        assert!(
            values(ListKind::Strings, &["a", "a"])
                .unwrap_err()
                .to_string()
                .contains("twice")
        );
    }

    #[test]
    fn limits_give_too_many_or_too_long() {
        let mut l = limits();
        l.max_entries = 2;
        l.max_entry_chars = 5;
        let many = (0..3).map(|i| Entry::new(i.to_string())).collect();
        assert_eq!(
            canonical(ListKind::Strings, many, &l),
            Err(EntryError::TooMany { count: 3, max: 2 })
        );
        let long = canonical(ListKind::Strings, vec![Entry::new("abcdef")], &l).unwrap_err();
        assert!(long.to_string().contains("6 characters, over the limit of 5"), "{long}");
    }

    #[test]
    fn the_digest_covers_kind_values_and_notes_and_nothing_else() {
        let a = canonical(ListKind::Strings, vec![Entry::new("x"), Entry::new("y")], &limits()).unwrap();
        let b = canonical(ListKind::Strings, vec![Entry::new("y"), Entry::new("x")], &limits()).unwrap();
        assert_eq!(
            digest(ListKind::Strings, &a),
            digest(ListKind::Strings, &b),
            "order does not matter"
        );
        assert_ne!(digest(ListKind::Strings, &a), digest(ListKind::Terms, &a));
        let mut noted = a.clone();
        noted[0].note = Some("why".into());
        assert_ne!(digest(ListKind::Strings, &a), digest(ListKind::Strings, &noted));
        let joined = vec![Entry::new("xy")];
        assert_ne!(digest(ListKind::Strings, &joined), digest(ListKind::Strings, &a));
        assert_eq!(digest(ListKind::Strings, &a).len(), 64);
    }

    #[test]
    fn diff_names_added_removed_and_renoted() {
        let from = vec![Entry::new("a"), Entry::new("b"), Entry::new("c")];
        let mut to = vec![Entry::new("b"), Entry::new("c"), Entry::new("d")];
        to[1].note = Some("new note".into());
        let d = diff(&from, &to);
        assert_eq!(d.added, vec![Entry::new("d")]);
        assert_eq!(d.removed, vec![Entry::new("a")]);
        assert_eq!(d.renoted.len(), 1);
        assert_eq!(d.renoted[0].value, "c");
        assert_eq!(diff(&to, &to), Diff::default());
    }
}
