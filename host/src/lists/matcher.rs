//! A list version compiled into the matcher of its kind, once, and shared
//! (`Arc`) by everything that consults the list until the next edit. The
//! calls are the ones rules will make: [`CompiledList::find_terms`],
//! [`CompiledList::match_patterns`], [`CompiledList::match_domain`],
//! [`CompiledList::contains`], [`CompiledList::in_cidrs`]; each answers
//! [`WrongKind`] on a list of another kind.

use crate::domain::lists::{self as entries, Entry, EntryError, ListKind, ListsConfig};
use aho_corasick::AhoCorasick;
use gavel_plugin_sdk::text::fold_words;
use ipnet::IpNet;
use regex::{RegexBuilder, RegexSet, RegexSetBuilder};
use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;

/// A call made on a list of another kind.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("list {list} holds {kind}, not {wanted}")]
pub struct WrongKind {
    pub list: String,
    pub kind: ListKind,
    pub wanted: ListKind,
}

/// One version of one list, compiled.
#[derive(Debug)]
pub struct CompiledList {
    pub name: String,
    pub version: i64,
    pub digest: String,
    pub entries: usize,
    pub matcher: Matcher,
}

/// The compiled form of each kind.
#[derive(Debug)]
pub enum Matcher {
    Terms(Terms),
    Patterns(Patterns),
    Domains(Domains),
    Strings(HashSet<String>),
    Cidrs(Cidrs),
}

impl Matcher {
    /// Compiles canonical entries of `kind`. Only patterns can fail here:
    /// one over `pattern_size_limit` (or not a regex) is refused by name,
    /// a set over `pattern_set_size_limit` as a whole.
    pub fn compile(kind: ListKind, entries: &[Entry], limits: &ListsConfig) -> Result<Matcher, EntryError> {
        let values = entries.iter().map(|e| e.value.as_str());
        Ok(match kind {
            ListKind::Terms => Matcher::Terms(Terms::new(values)),
            ListKind::Patterns => Matcher::Patterns(Patterns::new(values, limits)?),
            ListKind::Domains => Matcher::Domains(Domains(values.map(str::to_string).collect())),
            ListKind::Strings => Matcher::Strings(values.map(str::to_string).collect()),
            ListKind::Cidrs => Matcher::Cidrs(Cidrs::new(entries)?),
        })
    }

    pub fn kind(&self) -> ListKind {
        match self {
            Matcher::Terms(_) => ListKind::Terms,
            Matcher::Patterns(_) => ListKind::Patterns,
            Matcher::Domains(_) => ListKind::Domains,
            Matcher::Strings(_) => ListKind::Strings,
            Matcher::Cidrs(_) => ListKind::Cidrs,
        }
    }
}

impl CompiledList {
    fn wrong(&self, wanted: ListKind) -> WrongKind {
        WrongKind {
            list: self.name.clone(),
            kind: self.matcher.kind(),
            wanted,
        }
    }

    /// The listed terms `text` contains as whole words, in list order.
    pub fn find_terms(&self, text: &str) -> Result<Vec<String>, WrongKind> {
        match &self.matcher {
            Matcher::Terms(t) => Ok(t.find(text)),
            _ => Err(self.wrong(ListKind::Terms)),
        }
    }

    /// The listed patterns that match somewhere in `text`, in list order.
    pub fn match_patterns(&self, text: &str) -> Result<Vec<String>, WrongKind> {
        match &self.matcher {
            Matcher::Patterns(p) => Ok(p.matching(text)),
            _ => Err(self.wrong(ListKind::Patterns)),
        }
    }

    /// The longest listed domain that is `host` or one of its parents.
    pub fn match_domain(&self, host: &str) -> Result<Option<String>, WrongKind> {
        match &self.matcher {
            Matcher::Domains(d) => Ok(d.longest(host)),
            _ => Err(self.wrong(ListKind::Domains)),
        }
    }

    /// Whether `value` is listed, exactly.
    pub fn contains(&self, value: &str) -> Result<bool, WrongKind> {
        match &self.matcher {
            Matcher::Strings(s) => Ok(s.contains(value)),
            _ => Err(self.wrong(ListKind::Strings)),
        }
    }

    /// The narrowest listed range holding `ip`.
    pub fn in_cidrs(&self, ip: IpAddr) -> Result<Option<IpNet>, WrongKind> {
        match &self.matcher {
            Matcher::Cidrs(c) => Ok(c.narrowest(ip)),
            _ => Err(self.wrong(ListKind::Cidrs)),
        }
    }
}

/// Terms as one Aho-Corasick automaton over folded text: the text's folded
/// words joined by single spaces, with a space at each end, and each term
/// (already folded) padded the same way, so a match starts and ends on
/// word boundaries. Overlapping search finds terms sharing words.
#[derive(Debug)]
pub struct Terms {
    terms: Vec<String>,
    automaton: AhoCorasick,
}

impl Terms {
    fn new<'a>(folded: impl Iterator<Item = &'a str>) -> Self {
        let terms: Vec<String> = folded.map(str::to_string).collect();
        let automaton = AhoCorasick::new(terms.iter().map(|t| format!(" {t} ")))
            .expect("an automaton of bounded entries (the list limits) builds");
        Terms { terms, automaton }
    }

    fn find(&self, text: &str) -> Vec<String> {
        let words = fold_words(text);
        let mut haystack = String::with_capacity(text.len() + 2);
        haystack.push(' ');
        for w in &words {
            haystack.push_str(w);
            haystack.push(' ');
        }
        let mut hits: Vec<usize> = self
            .automaton
            .find_overlapping_iter(&haystack)
            .map(|m| m.pattern().as_usize())
            .collect();
        hits.sort_unstable();
        hits.dedup();
        hits.into_iter().map(|i| self.terms[i].clone()).collect()
    }
}

/// Patterns as one `RegexSet`, every pattern and the set bounded in size.
#[derive(Debug)]
pub struct Patterns {
    patterns: Vec<String>,
    set: RegexSet,
}

impl Patterns {
    fn new<'a>(values: impl Iterator<Item = &'a str>, limits: &ListsConfig) -> Result<Self, EntryError> {
        let patterns: Vec<String> = values.map(str::to_string).collect();
        // Each alone first, so a bad or huge one is refused by name.
        for p in &patterns {
            RegexBuilder::new(p)
                .size_limit(limits.pattern_size_limit)
                .dfa_size_limit(limits.pattern_size_limit)
                .build()
                .map_err(|e| EntryError::invalid(p, regex_problem(e)))?;
        }
        let set = RegexSetBuilder::new(&patterns)
            .size_limit(limits.pattern_set_size_limit)
            .dfa_size_limit(limits.pattern_set_size_limit)
            .build()
            .map_err(|e| EntryError::Invalid {
                value: format!("{} patterns", patterns.len()),
                problem: format!("together, {}", regex_problem(e)),
            })?;
        Ok(Patterns { patterns, set })
    }

    fn matching(&self, text: &str) -> Vec<String> {
        self.set
            .matches(text)
            .into_iter()
            .map(|i| self.patterns[i].clone())
            .collect()
    }
}

fn regex_problem(e: regex::Error) -> String {
    match e {
        regex::Error::CompiledTooBig(limit) => {
            format!("compiles to more than the limit of {limit} bytes")
        }
        other => format!("is not a valid pattern: {other}"),
    }
}

/// Domains as a set of names: a host is looked up as itself, then each
/// parent in turn, so the first hit is the longest listed match (at most
/// one lookup per label).
#[derive(Debug)]
pub struct Domains(HashSet<String>);

impl Domains {
    fn longest(&self, host: &str) -> Option<String> {
        let host = host.trim().trim_end_matches('.');
        // Most hosts are ASCII already; only others pay for IDNA.
        let host = if host.bytes().all(|b| b.is_ascii() && !b.is_ascii_uppercase()) {
            std::borrow::Cow::Borrowed(host)
        } else {
            std::borrow::Cow::Owned(entries::domain(host).ok()?)
        };
        let mut rest: &str = &host;
        loop {
            if self.0.contains(rest) {
                return Some(rest.to_string());
            }
            rest = &rest[rest.find('.')? + 1..];
        }
    }
}

/// Ranges by prefix length, for each address family: an address is
/// masked to each length present (longest first) and looked up, so the
/// first hit is the narrowest range (at most 33 or 129 lookups, in
/// practice the few lengths a list uses).
#[derive(Debug, Default)]
pub struct Cidrs {
    v4: BTreeMap<u8, HashSet<u32>>,
    v6: BTreeMap<u8, HashSet<u128>>,
}

impl Cidrs {
    fn new(entries: &[Entry]) -> Result<Self, EntryError> {
        let mut c = Cidrs::default();
        for e in entries {
            match entries::cidr(&e.value).map_err(|p| EntryError::invalid(&e.value, p))? {
                IpNet::V4(n) => {
                    c.v4.entry(n.prefix_len()).or_default().insert(n.network().to_bits());
                }
                IpNet::V6(n) => {
                    c.v6.entry(n.prefix_len()).or_default().insert(n.network().to_bits());
                }
            }
        }
        Ok(c)
    }

    fn narrowest(&self, ip: IpAddr) -> Option<IpNet> {
        // An IPv4 address written as IPv6 (`::ffff:192.0.2.1`) is IPv4.
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match ip {
            IpAddr::V4(a) => self.v4.iter().rev().find_map(|(len, nets)| {
                let net = ipnet::Ipv4Net::new(a, *len).ok()?.trunc();
                nets.contains(&net.network().to_bits()).then_some(IpNet::V4(net))
            }),
            IpAddr::V6(a) => self.v6.iter().rev().find_map(|(len, nets)| {
                let net = ipnet::Ipv6Net::new(a, *len).ok()?.trunc();
                nets.contains(&net.network().to_bits()).then_some(IpNet::V6(net))
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compile(kind: ListKind, raw: &[&str]) -> CompiledList {
        compile_with(kind, raw, &ListsConfig::default()).expect("compiles")
    }

    fn compile_with(kind: ListKind, raw: &[&str], limits: &ListsConfig) -> Result<CompiledList, EntryError> {
        let entries = entries::canonical(kind, raw.iter().map(|v| Entry::new(*v)).collect(), limits)?;
        Ok(CompiledList {
            name: "l".into(),
            version: 1,
            digest: entries::digest(kind, &entries),
            entries: entries.len(),
            matcher: Matcher::compile(kind, &entries, limits)?,
        })
    }

    #[test]
    fn terms_match_whole_words_across_punctuation_case_and_accents() {
        let l = compile(ListKind::Terms, &["free money", "Café", "crypto", "money now"]);
        assert_eq!(
            l.find_terms("FREE... money, NOW! at the cafe").unwrap(),
            ["cafe", "free money", "money now"],
            "overlapping terms both found; list (sorted) order"
        );
        assert_eq!(l.find_terms("Crÿpto").unwrap(), ["crypto"], "ÿ folds to y");
        assert_eq!(l.find_terms("café-crypto").unwrap(), ["cafe", "crypto"]);
        assert!(
            l.find_terms("cryptocurrency freemoney").unwrap().is_empty(),
            "not inside words"
        );
        assert!(l.find_terms("").unwrap().is_empty());
        assert_eq!(l.find_terms("ＣＲＹＰＴＯ").unwrap(), ["crypto"], "full width folds");
    }

    /// The automaton finds exactly what the banned-terms example finds
    /// (whole-word windows over the same folded words).
    #[test]
    fn terms_agree_with_word_windows() {
        let terms = ["a b", "b", "b c a", "c", "x y z", "ab"];
        let l = compile(ListKind::Terms, &terms);
        let texts = [
            "a b c a b",
            "A, B! c",
            "ab ba",
            "x y x y z",
            "c",
            "b c",
            "zzz",
            "a  b",
            "ab b",
        ];
        for text in texts {
            let words = fold_words(text);
            let mut windows: Vec<String> = terms
                .iter()
                .map(|t| fold_words(t))
                .filter(|t| words.windows(t.len()).any(|w| w == t.as_slice()))
                .map(|t| t.join(" "))
                .collect();
            windows.sort();
            assert_eq!(l.find_terms(text).unwrap(), windows, "{text:?}");
        }
    }

    #[test]
    fn patterns_match_as_a_set() {
        let l = compile(
            ListKind::Patterns,
            &[r"(?i)whats?app\s*\+?\d{6,}", r"t\.me/\w+", r"^never$"],
        );
        assert_eq!(
            l.match_patterns("call WhatsApp +4915112345678 or t.me/scam").unwrap(),
            [r"(?i)whats?app\s*\+?\d{6,}", r"t\.me/\w+"]
        );
        assert!(l.match_patterns("a calm sentence").unwrap().is_empty());
    }

    #[test]
    fn bad_and_oversized_patterns_are_refused_by_name() {
        let err = compile_with(ListKind::Patterns, &["ok", "(unclosed"], &ListsConfig::default()).unwrap_err();
        assert!(
            matches!(&err, EntryError::Invalid { value, problem } if value == "(unclosed" && problem.contains("not a valid pattern")),
            "{err:?}"
        );
        // Small text, huge program: refused by the size limit, not compiled.
        let huge = r"\w{1000}\w{1000}\w{1000}";
        let err = compile_with(ListKind::Patterns, &[huge], &ListsConfig::default()).unwrap_err();
        assert!(
            matches!(&err, EntryError::Invalid { value, problem } if value == huge && problem.contains("more than the limit")),
            "{err:?}"
        );
        // Each small enough alone, too big together.
        let limits = ListsConfig {
            pattern_set_size_limit: 100_000,
            ..ListsConfig::default()
        };
        let many: Vec<String> = (0..40).map(|i| format!(r"[a-z]{{{}}}x", 20 + i)).collect();
        for p in &many {
            compile_with(ListKind::Patterns, &[p.as_str()], &limits).expect("one alone compiles");
        }
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        let err = compile_with(ListKind::Patterns, &many, &limits).unwrap_err();
        assert!(
            matches!(&err, EntryError::Invalid { value, problem } if value == "40 patterns" && problem.starts_with("together")),
            "{err:?}"
        );
    }

    #[test]
    fn domains_match_subdomains_and_the_longest_wins() {
        let l = compile(
            ListKind::Domains,
            &["example.com", "ads.example.com", "bit.ly", "bücher.example"],
        );
        assert_eq!(l.match_domain("example.com").unwrap().as_deref(), Some("example.com"));
        assert_eq!(
            l.match_domain("www.Example.COM.").unwrap().as_deref(),
            Some("example.com")
        );
        assert_eq!(
            l.match_domain("x.ads.example.com").unwrap().as_deref(),
            Some("ads.example.com")
        );
        assert_eq!(
            l.match_domain("ads.example.com").unwrap().as_deref(),
            Some("ads.example.com")
        );
        assert_eq!(
            l.match_domain("notexample.com").unwrap(),
            None,
            "not a suffix match on characters"
        );
        assert_eq!(l.match_domain("example.com.evil.net").unwrap(), None);
        assert_eq!(l.match_domain("com").unwrap(), None);
        assert_eq!(
            l.match_domain("shop.BÜCHER.example").unwrap().as_deref(),
            Some("xn--bcher-kva.example")
        );
        assert_eq!(l.match_domain("").unwrap(), None);
    }

    #[test]
    fn strings_are_exact() {
        let l = compile(ListKind::Strings, &["sha256:abc", "Account-1"]);
        assert!(l.contains("sha256:abc").unwrap());
        assert!(!l.contains("sha256:ABC").unwrap());
        assert!(!l.contains("account-1").unwrap());
        assert!(!l.contains("sha256:ab").unwrap());
    }

    #[test]
    fn cidrs_match_v4_and_v6_narrowest_first() {
        let l = compile(
            ListKind::Cidrs,
            &[
                "10.0.0.0/8",
                "10.1.0.0/16",
                "192.0.2.7",
                "2001:db8::/32",
                "2001:db8:1::/48",
            ],
        );
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let hit = |s: &str| l.in_cidrs(ip(s)).unwrap().map(|n| n.to_string());
        assert_eq!(hit("10.200.0.1").as_deref(), Some("10.0.0.0/8"));
        assert_eq!(hit("10.1.2.3").as_deref(), Some("10.1.0.0/16"));
        assert_eq!(hit("192.0.2.7").as_deref(), Some("192.0.2.7/32"));
        assert_eq!(hit("192.0.2.8"), None);
        assert_eq!(hit("11.0.0.1"), None);
        assert_eq!(hit("2001:db8:1:2::5").as_deref(), Some("2001:db8:1::/48"));
        assert_eq!(hit("2001:db8:ffff::1").as_deref(), Some("2001:db8::/32"));
        assert_eq!(hit("2001:db9::1"), None);
        assert_eq!(
            hit("::ffff:10.1.0.9").as_deref(),
            Some("10.1.0.0/16"),
            "v4-mapped v6 is v4"
        );
    }

    #[test]
    fn a_call_on_another_kind_says_so() {
        let l = compile(ListKind::Strings, &["x"]);
        let e = l.find_terms("x").unwrap_err();
        assert_eq!(e.to_string(), "list l holds strings, not terms");
        assert!(l.in_cidrs("10.0.0.1".parse().unwrap()).is_err());
        assert!(l.match_domain("x").is_err());
        assert!(l.match_patterns("x").is_err());
    }
}
