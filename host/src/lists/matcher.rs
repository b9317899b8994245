//! A list version compiled into the matcher of its kind, once, and shared
//! (`Arc`) by everything that consults the list until the next edit. The
//! calls are the ones rules will make: [`CompiledList::find_terms`],
//! [`CompiledList::match_patterns`], [`CompiledList::match_domain`],
//! [`CompiledList::contains`], [`CompiledList::in_cidrs`]; each answers
//! [`WrongKind`] on a list of another kind.

use crate::domain::lists::{self as entries, Entry, EntryError, ListKind, ListsConfig};
use daachorse::DoubleArrayAhoCorasick;
use gavel_plugin_sdk::text::fold_words_into;
use ipnet::IpNet;
use regex::{RegexSet, RegexSetBuilder};
use regex_automata::meta::{self, Regex};
use regex_automata::nfa::thompson;
use regex_syntax::hir::Hir;
use regex_syntax::hir::literal::{ExtractKind, Extractor};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

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
    Patterns(Box<Patterns>),
    Domains(Domains),
    Strings(HashSet<String>),
    Cidrs(Cidrs),
}

impl Matcher {
    /// Compiles canonical entries of `kind`. Only patterns can fail here:
    /// one over `pattern_size_limit` (or not a regex) is refused by name;
    /// their prefixes' automaton, or the set of those without a prefix,
    /// over `pattern_set_size_limit` as a whole.
    pub fn compile(kind: ListKind, entries: &[Entry], limits: &ListsConfig) -> Result<Matcher, EntryError> {
        let values = entries.iter().map(|e| e.value.as_str());
        Ok(match kind {
            ListKind::Terms => Matcher::Terms(Terms::new(values)),
            ListKind::Patterns => Matcher::Patterns(Box::new(Patterns::new(values, limits)?)),
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

/// Terms as a trie of words: a text is folded once into its words, and
/// from each word the trie is followed word by word as far as the text
/// matches, every node reached that ends a term a hit. Each step is one
/// hash lookup of (node, word), so a lookup costs at most (words of the
/// text) × (words of the longest term) steps, and in practice about one
/// per word, whatever the list's size or how many terms share a first word
/// (an automaton over 100,000 terms would walk states scattered over tens
/// of megabytes).
#[derive(Debug)]
pub struct Terms {
    /// The folded terms (words joined by single spaces).
    terms: Vec<String>,
    /// The root's edges: each term's first word, to its node (looked up
    /// by the text's word as it is: most words of a text end here).
    first: foldhash::HashMap<Box<str>, u32>,
    /// The other edges: a node's id (little-endian) followed by a word's
    /// bytes, to the child node.
    edges: foldhash::HashMap<Box<[u8]>, u32>,
    /// For each node, the term ending there (`NO_TERM`: none).
    ends: Vec<u32>,
}

const NO_TERM: u32 = u32::MAX;

/// The key of the edge from `node` over `word`, written into `key`.
fn edge_key<'k>(key: &'k mut Vec<u8>, node: u32, word: &[u8]) -> &'k [u8] {
    key.clear();
    key.extend_from_slice(&node.to_le_bytes());
    key.extend_from_slice(word);
    key
}

impl Terms {
    fn new<'a>(folded: impl Iterator<Item = &'a str>) -> Self {
        let terms: Vec<String> = folded.map(str::to_string).collect();
        let mut first: foldhash::HashMap<Box<str>, u32> = foldhash::HashMap::default();
        let mut edges: foldhash::HashMap<Box<[u8]>, u32> = foldhash::HashMap::default();
        // Node 0 is the root.
        let mut ends = vec![NO_TERM];
        let mut key = Vec::new();
        for (i, term) in terms.iter().enumerate() {
            let mut words = term.split(' ');
            let mut new_node = || {
                ends.push(NO_TERM);
                ends.len() as u32 - 1
            };
            let mut node = *first
                .entry(words.next().unwrap_or_default().into())
                .or_insert_with(&mut new_node);
            for word in words {
                node = *edges
                    .entry(edge_key(&mut key, node, word.as_bytes()).into())
                    .or_insert_with(&mut new_node);
            }
            ends[node as usize] = i as u32;
        }
        Terms {
            terms,
            first,
            edges,
            ends,
        }
    }

    fn find(&self, text: &str) -> Vec<String> {
        let mut words = String::with_capacity(text.len() + 1);
        fold_words_into(text, &mut words);
        let mut key = Vec::with_capacity(64);
        let mut hits: Vec<u32> = Vec::new();
        let mut found = |node: u32| {
            let term = self.ends[node as usize];
            if term != NO_TERM {
                hits.push(term);
            }
        };
        // Every word is followed by one space.
        let next_word = |at: usize| words[at..].find(' ').map(|len| at + len);
        let mut start = 0;
        while let Some(end) = next_word(start) {
            if let Some(&root) = self.first.get(&words[start..end]) {
                found(root);
                let (mut node, mut at) = (root, end + 1);
                while let Some(to) = next_word(at) {
                    let Some(&child) = self.edges.get(edge_key(&mut key, node, &words.as_bytes()[at..to])) else {
                        break;
                    };
                    found(child);
                    node = child;
                    at = to + 1;
                }
            }
            start = end + 1;
        }
        hits.sort_unstable();
        hits.dedup();
        hits.into_iter().map(|i| self.terms[i as usize].clone()).collect()
    }
}

/// Patterns by their literal prefixes. Every match of most patterns starts
/// with one of a few literals (`regex-syntax` extracts them: `t\.me/\w+`
/// starts with `t.me/`); those literals go into one Aho-Corasick
/// automaton (`daachorse`), and a text is checked only against the patterns whose
/// prefixes occur in it, each pattern compiled when first needed. A
/// pattern without such prefixes (one that can start anywhere, like
/// `\d{6,}`, or whose prefixes are shorter than [`MIN_PREFIX`] bytes) goes
/// into one `RegexSet` with the others like it.
///
/// So a version of 100,000 patterns compiles in well under a second (each
/// pattern is parsed and its size checked, not kept compiled) and a lookup
/// costs one pass of the automaton plus the few candidates it names.
#[derive(Debug)]
pub struct Patterns {
    patterns: Vec<String>,
    prefixed: Option<Prefixed>,
    /// The patterns without usable prefixes (their indexes) and their set.
    rest: Option<(Vec<usize>, RegexSet)>,
}

/// Shortest literal prefix worth searching for; shorter ones would make
/// nearly every text a candidate.
const MIN_PREFIX: usize = 3;
/// Longest literal prefix kept: longer ones name no fewer candidates worth
/// the automaton states they take.
const MAX_PREFIX: usize = 16;
/// The lazy DFA cache of one pattern compiled alone.
const HYBRID_CACHE: usize = 256 << 10;
/// Automaton bytes per byte of distinct prefixes, at most, while it is
/// built (the double array's states and the builder's own): what the
/// prefixes of a version may take, checked against
/// `pattern_set_size_limit` before building.
const AUTOMATON_BYTES_PER_PREFIX_BYTE: usize = 16;
/// Most literal prefixes one pattern may contribute (after they are cut
/// to [`MIN_PREFIX`] bytes, if there were more).
const MAX_PREFIXES: usize = 64;

/// The patterns found through their prefixes.
struct Prefixed {
    /// Every distinct prefix; a match's value is the prefix's index in
    /// `owners`. (A double-array automaton: the `aho-corasick` crate's
    /// construction is quadratic in the number of literals when each ends
    /// its own branch, as listed patterns' prefixes do: 3.9 s for 100,000.)
    automaton: DoubleArrayAhoCorasick<u32>,
    /// For each prefix (by automaton pattern id), the patterns it starts.
    owners: Vec<Vec<u32>>,
    /// Each pattern compiled once it is first a candidate, while the
    /// compiled ones take at most `budget` bytes; past that, a candidate
    /// is compiled for the call and dropped, so hostile texts naming every
    /// prefix cost time per call, never unbounded memory.
    compiled: Vec<OnceLock<Regex>>,
    held: AtomicUsize,
    budget: usize,
    size_limit: usize,
}

impl Patterns {
    fn new<'a>(values: impl Iterator<Item = &'a str>, limits: &ListsConfig) -> Result<Self, EntryError> {
        let patterns: Vec<String> = values.map(str::to_string).collect();
        let mut literals: HashMap<Vec<u8>, usize> = HashMap::new();
        let mut owners: Vec<Vec<u32>> = Vec::new();
        let mut rest = Vec::new();
        for (i, p) in patterns.iter().enumerate() {
            // Refused by name: not a pattern, or over the size limit.
            let hir = regex_syntax::Parser::new()
                .parse(p)
                .map_err(|e| EntryError::invalid(p, format!("is not a valid pattern: {e}")))?;
            check_size(p, &hir, limits.pattern_size_limit)?;
            match prefixes(&hir) {
                Some(found) => {
                    for literal in found {
                        let next = owners.len();
                        let id = *literals.entry(literal).or_insert(next);
                        if id == next {
                            owners.push(Vec::new());
                        }
                        owners[id].push(i as u32);
                    }
                }
                None => rest.push(i),
            }
        }
        let too_many = |problem: String| EntryError::Invalid {
            value: format!("{} patterns", patterns.len()),
            problem,
        };
        let prefix_bytes: usize = literals.keys().map(Vec::len).sum();
        if prefix_bytes.saturating_mul(AUTOMATON_BYTES_PER_PREFIX_BYTE) > limits.pattern_set_size_limit {
            return Err(too_many(format!(
                "together, their literal prefixes ({prefix_bytes} bytes) compile to more than the limit of {} bytes",
                limits.pattern_set_size_limit
            )));
        }
        let prefixed = if owners.is_empty() {
            None
        } else {
            let mut by_id: Vec<(usize, Vec<u8>)> = literals.into_iter().map(|(l, id)| (id, l)).collect();
            by_id.sort_unstable_by_key(|(id, _)| *id);
            let automaton = DoubleArrayAhoCorasick::new(by_id.iter().map(|(_, l)| l))
                .map_err(|e| too_many(format!("together, their literal prefixes do not compile: {e}")))?;
            Some(Prefixed {
                automaton,
                owners,
                compiled: std::iter::repeat_with(OnceLock::new).take(patterns.len()).collect(),
                held: AtomicUsize::new(0),
                budget: limits.pattern_set_size_limit,
                size_limit: limits.pattern_size_limit,
            })
        };
        let rest = if rest.is_empty() {
            None
        } else {
            let set = RegexSetBuilder::new(rest.iter().map(|i| &patterns[*i]))
                .size_limit(limits.pattern_set_size_limit)
                .dfa_size_limit(limits.pattern_set_size_limit)
                .build()
                .map_err(|e| EntryError::Invalid {
                    value: format!("{} patterns", rest.len()),
                    problem: format!("together (those without a literal prefix), {}", regex_problem(e)),
                })?;
            Some((rest, set))
        };
        Ok(Patterns {
            patterns,
            prefixed,
            rest,
        })
    }

    fn matching(&self, text: &str) -> Vec<String> {
        let mut hits: Vec<usize> = Vec::new();
        if let Some(p) = &self.prefixed {
            // Distinct prefixes first: a prefix that occurs a thousand
            // times names its patterns once, so the work is bounded by the
            // list, not by how often a text repeats a prefix.
            let mut found: Vec<u32> = p.automaton.find_overlapping_iter(text).map(|m| m.value()).collect();
            found.sort_unstable();
            found.dedup();
            let mut candidates: Vec<u32> = found
                .into_iter()
                .flat_map(|prefix| p.owners[prefix as usize].iter().copied())
                .collect();
            candidates.sort_unstable();
            candidates.dedup();
            hits.extend(
                candidates
                    .into_iter()
                    .map(|i| i as usize)
                    .filter(|i| p.is_match(*i, &self.patterns[*i], text)),
            );
        }
        if let Some((ids, set)) = &self.rest {
            hits.extend(set.matches(text).into_iter().map(|i| ids[i]));
            hits.sort_unstable();
        }
        hits.into_iter().map(|i| self.patterns[i].clone()).collect()
    }
}

impl std::fmt::Debug for Prefixed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prefixed")
            .field("prefixes", &self.owners.len())
            .field("held", &self.held)
            .field("budget", &self.budget)
            .finish_non_exhaustive()
    }
}

impl Prefixed {
    /// As if compiled patterns already held the whole budget.
    #[cfg(test)]
    fn exhaust_budget(&self) {
        self.held.store(self.budget, Ordering::Relaxed);
    }

    /// Whether pattern `i` (`pattern`) matches `text`.
    fn is_match(&self, i: usize, pattern: &str, text: &str) -> bool {
        if let Some(re) = self.compiled[i].get() {
            return re.is_match(text);
        }
        let Some(re) = compile_one(pattern, self.size_limit) else {
            return false;
        };
        let found = re.is_match(text);
        // Its program, and the lazy DFA cache it may grow (one per thread
        // using it at once; counted once: evaluations of one list rarely
        // run the same pattern side by side).
        let bytes = re.memory_usage() + HYBRID_CACHE;
        if self.held.fetch_add(bytes, Ordering::Relaxed) + bytes > self.budget || self.compiled[i].set(re).is_err() {
            // Over the budget, or another call kept the same one meanwhile.
            self.held.fetch_sub(bytes, Ordering::Relaxed);
        }
        found
    }
}

/// The literals every match of `hir` starts with, if there are a few and
/// none is shorter than [`MIN_PREFIX`] bytes.
fn prefixes(hir: &Hir) -> Option<Vec<Vec<u8>>> {
    let mut seq = Extractor::new().kind(ExtractKind::Prefix).extract(hir);
    let cut = if seq.len().is_some_and(|n| n > MAX_PREFIXES) {
        MIN_PREFIX
    } else {
        MAX_PREFIX
    };
    seq.keep_first_bytes(cut);
    seq.dedup();
    let literals = seq.literals()?;
    let usable =
        !literals.is_empty() && literals.len() <= MAX_PREFIXES && literals.iter().all(|l| l.len() >= MIN_PREFIX);
    usable.then(|| literals.iter().map(|l| l.as_bytes().to_vec()).collect())
}

/// Refuses `pattern` by name if its program would exceed `limit` bytes:
/// the size check the `regex` crate makes (its Thompson NFA), without
/// building the rest of a regex.
fn check_size(pattern: &str, hir: &Hir, limit: usize) -> Result<(), EntryError> {
    thompson::Compiler::new()
        .configure(
            thompson::Config::new()
                .nfa_size_limit(Some(limit))
                .shrink(false)
                .which_captures(thompson::WhichCaptures::None),
        )
        .build_from_hir(hir)
        .map(drop)
        .map_err(|e| {
            EntryError::invalid(
                pattern,
                format!("compiles to more than the limit of {limit} bytes ({e})"),
            )
        })
}

/// One pattern compiled for matching, as the `regex` crate builds it.
/// `None` only if it no longer compiles under `limit` (checked when the
/// version was compiled; logged, and the pattern matches nothing).
fn compile_one(pattern: &str, limit: usize) -> Option<Regex> {
    meta::Regex::builder()
        .configure(
            meta::Config::new()
                .nfa_size_limit(Some(limit))
                // Only `is_match` is asked: no capture states, the NFA the
                // size check measured.
                .which_captures(thompson::WhichCaptures::None)
                .hybrid_cache_capacity(HYBRID_CACHE),
        )
        .build(pattern)
        .inspect_err(
            |e| tracing::error!(pattern, error = %e, "a listed pattern no longer compiles; it matches nothing"),
        )
        .ok()
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

    /// The trie finds exactly what the banned-terms example finds
    /// (whole-word windows over the same folded words).
    #[test]
    fn terms_sharing_first_words_are_each_found_once() {
        let mut terms: Vec<String> = (0..5_000).map(|i| format!("free gift{i}")).collect();
        terms.extend(["free".to_string(), "free money".into(), "free money now".into()]);
        let refs: Vec<&str> = terms.iter().map(String::as_str).collect();
        let l = compile(ListKind::Terms, &refs);
        let text = format!("{} free money now, free gift4999", "free ".repeat(10_000));
        let mut got = l.find_terms(&text).unwrap();
        got.sort_unstable();
        assert_eq!(got, ["free", "free gift4999", "free money", "free money now"]);
    }

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
            let words = gavel_plugin_sdk::text::fold_words(text);
            let mut windows: Vec<String> = terms
                .iter()
                .map(|t| gavel_plugin_sdk::text::fold_words(t))
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

    /// Found through prefixes or through the set of the others, a list
    /// matches exactly what one `RegexSet` of all its patterns matches.
    #[test]
    fn patterns_by_prefix_agree_with_one_set() {
        let patterns = [
            r"t\.me/\w+",
            r"(?i)whats?app\s*\+?\d{6,}",
            r"\d{6,}",
            r"^never$",
            r"(?i)kasino|casino",
            r"promo[0-9]{2}[a-z]",
            r"promo4",
            r"ab",
            r"(?m)^free\b",
            r"x*",
            r"(?i)ünïcödé",
            r"bit\.ly/[A-Za-z0-9]+|tinyurl\.com/\S+",
            r"(?:(ca)(s))+ino",
            r"averyveryverylongliteralprefix\d",
        ];
        let texts = [
            "call WhatsApp +4915112345678 or t.me/scam",
            "never",
            "not never",
            "CASINO royale, KASINO",
            "promo42z and promo4",
            "cab",
            "line\nfree money",
            "freedom",
            "ÜNÏCÖDÉ text",
            "see bit.ly/abc or tinyurl.com/x",
            "cascasino",
            "averyveryverylongliteralprefix7, averyveryverylongliteral",
            "",
            "a calm sentence about gardening",
        ];
        let set = RegexSet::new(patterns).unwrap();
        for budget in [64 << 20, 1] {
            let l = compile(ListKind::Patterns, &patterns);
            let Matcher::Patterns(p) = &l.matcher else {
                unreachable!()
            };
            if budget == 1 {
                // Nothing may be kept compiled: every candidate is compiled per call.
                p.prefixed.as_ref().unwrap().exhaust_budget();
            }
            for text in texts {
                let mut want: Vec<&str> = set.matches(text).into_iter().map(|i| patterns[i]).collect();
                want.sort_unstable();
                let mut got = l.match_patterns(text).unwrap();
                got.sort_unstable();
                assert_eq!(got, want, "{text:?} (budget {budget})");
            }
        }
    }

    #[test]
    fn a_text_repeating_a_prefix_names_its_patterns_once() {
        // 2,000 patterns sharing the prefix `buy`, a text of 20,000 `buy`s:
        // each prefix found names its owners once per call.
        let patterns: Vec<String> = (0..2_000).map(|i| format!("buy{i}x")).collect();
        let refs: Vec<&str> = patterns.iter().map(String::as_str).collect();
        let l = compile(ListKind::Patterns, &refs);
        let text = format!("{} buy1999x", "buy".repeat(20_000));
        assert_eq!(l.match_patterns(&text).unwrap(), ["buy1999x"]);
    }

    #[test]
    fn prefixes_too_big_together_are_refused_as_a_whole() {
        let patterns: Vec<String> = (0..100).map(|i| format!("{i:0>16}x")).collect();
        let refs: Vec<&str> = patterns.iter().map(String::as_str).collect();
        let small = ListsConfig {
            pattern_set_size_limit: 10_000,
            ..ListsConfig::default()
        };
        let e = compile_with(ListKind::Patterns, &refs, &small).unwrap_err().to_string();
        assert!(e.contains("100 patterns") && e.contains("literal prefixes"), "{e}");
        // Under the default limit the same version compiles.
        assert!(compile_with(ListKind::Patterns, &refs, &ListsConfig::default()).is_ok());
    }

    #[test]
    fn patterns_split_by_usable_prefixes() {
        let l = compile(ListKind::Patterns, &[r"t\.me/\w+", r"\d{6,}", r"ab", r"(?i)casino"]);
        let Matcher::Patterns(p) = &l.matcher else {
            unreachable!()
        };
        let rest: Vec<&str> = p
            .rest
            .as_ref()
            .unwrap()
            .0
            .iter()
            .map(|i| p.patterns[*i].as_str())
            .collect();
        // Canonical order is sorted; `ab` is too short a prefix, `\d` has none.
        assert_eq!(rest, [r"\d{6,}", "ab"], "casino's case variants are prefixes too");
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
