//! Counts of one signal held in this process: per key, the buckets of its
//! window, each an item count or a distinct-count sketch
//! (`cardinality_estimator`: exact while small, HyperLogLog++ past 128
//! values, about 1.6 % standard error at its precision of 12 bits).

use crate::domain::signals::{BUCKETS_PER_WINDOW, Count, SignalSpec, Window};
use cardinality_estimator::CardinalityEstimator;
use std::collections::HashMap;
use std::sync::Mutex;

/// Keys are spread over this many locks, so concurrent requests rarely wait.
const SHARDS: usize = 16;

/// Estimated bytes a key costs besides its name and buckets: its map
/// entry with the hash table's spare capacity (up to half the table), the
/// allocations of its name and bucket vector, and the allocator's headers.
/// B17 measures the resident memory of 1,000,000 keys against this
/// estimate (docs/BENCHMARKS.md).
const KEY_OVERHEAD_BYTES: usize = 200;

/// What one bucket holds.
enum Cell {
    Items(u64),
    Distinct(Box<CardinalityEstimator<str>>),
}

impl Cell {
    fn bytes(&self) -> usize {
        match self {
            Cell::Items(_) => 24,
            Cell::Distinct(e) => 24 + e.size_of(),
        }
    }
}

/// One key's buckets, oldest first, none older than the window of the newest.
#[derive(Default)]
struct KeyCounts {
    buckets: Vec<(i64, Cell)>,
}

impl KeyCounts {
    fn newest(&self) -> i64 {
        self.buckets.last().map_or(i64::MIN, |(b, _)| *b)
    }

    fn bytes(&self, key: &str) -> usize {
        KEY_OVERHEAD_BYTES + key.len() + self.buckets.iter().map(|(_, c)| c.bytes()).sum::<usize>()
    }
}

/// One signal's counts, in this process (public for the benchmarks).
pub struct MemoryCounts {
    spec: SignalSpec,
    window: Window,
    /// `client \0 key` → counts.
    shards: Vec<Mutex<HashMap<String, KeyCounts>>>,
    max_keys_per_shard: usize,
}

/// What a sweep found and did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Swept {
    pub keys: usize,
    pub bytes: usize,
    pub evicted: usize,
}

impl MemoryCounts {
    pub fn new(spec: SignalSpec, max_keys: usize) -> Self {
        MemoryCounts {
            window: spec.window(),
            spec,
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            max_keys_per_shard: max_keys.div_ceil(SHARDS).max(1),
        }
    }

    pub fn spec(&self) -> &SignalSpec {
        &self.spec
    }

    fn shard(&self, id: &str) -> &Mutex<HashMap<String, KeyCounts>> {
        use std::hash::BuildHasher;
        let h = foldhash::fast::FixedState::with_seed(0).hash_one(id);
        &self.shards[(h as usize) % SHARDS]
    }

    /// Adds an item's observations (from [`SignalSpec::observations`])
    /// made at `at_ms`; returns how many keys were dropped to make room.
    pub fn add(&self, client: &str, at_ms: i64, observations: &[(String, Option<String>)]) -> usize {
        let bucket = self.window.bucket(at_ms);
        let mut evicted = 0;
        for (key, value) in observations {
            let id = format!("{client}\0{key}");
            let mut shard = self.shard(&id).lock().expect("not poisoned");
            if !shard.contains_key(&id) && shard.len() >= self.max_keys_per_shard {
                let n = shard.len() / 8 + 1;
                evicted += evict_oldest(&mut shard, n);
            }
            let counts = shard.entry(id).or_default();
            let newest = counts.newest().max(bucket);
            if bucket <= newest - BUCKETS_PER_WINDOW {
                continue; // older than the key's window: counts for nothing
            }
            counts.buckets.retain(|(b, _)| *b > newest - BUCKETS_PER_WINDOW);
            let at = match counts.buckets.binary_search_by_key(&bucket, |(b, _)| *b) {
                Ok(i) => i,
                Err(i) => {
                    let cell = match self.spec.count {
                        Count::Items => Cell::Items(0),
                        Count::Distinct(_) => Cell::Distinct(Box::default()),
                    };
                    counts.buckets.insert(i, (bucket, cell));
                    i
                }
            };
            match (&mut counts.buckets[at].1, value) {
                (Cell::Items(n), _) => *n += 1,
                (Cell::Distinct(e), Some(v)) => e.insert(v.as_str()),
                (Cell::Distinct(_), None) => {}
            }
        }
        evicted
    }

    /// The value of each of `keys` (of `client`) at `now_ms`.
    pub fn values(&self, client: &str, keys: &[String], now_ms: i64) -> Vec<u64> {
        let range = self.window.range(now_ms);
        keys.iter()
            .map(|key| {
                let id = format!("{client}\0{key}");
                let shard = self.shard(&id).lock().expect("not poisoned");
                let Some(counts) = shard.get(&id) else {
                    return 0;
                };
                let cells = counts.buckets.iter().filter(|(b, _)| range.contains(b)).map(|(_, c)| c);
                match self.spec.count {
                    Count::Items => cells
                        .map(|c| match c {
                            Cell::Items(n) => *n,
                            Cell::Distinct(_) => 0,
                        })
                        .sum(),
                    Count::Distinct(_) => {
                        let mut merged = CardinalityEstimator::<str>::new();
                        for c in cells {
                            if let Cell::Distinct(e) = c {
                                merged.merge(e);
                            }
                        }
                        merged.estimate() as u64
                    }
                }
            })
            .collect()
    }

    /// Drops keys whose window has passed at `now_ms`, and counts what is
    /// left.
    pub fn sweep(&self, now_ms: i64) -> Swept {
        let oldest_live = *self.window.range(now_ms).start();
        let mut swept = Swept::default();
        for shard in &self.shards {
            let mut shard = shard.lock().expect("not poisoned");
            shard.retain(|_, c| c.newest() >= oldest_live);
            swept.keys += shard.len();
            swept.bytes += shard.iter().map(|(k, c)| c.bytes(k)).sum::<usize>();
        }
        swept
    }

    /// Drops about `fraction` of the keys, those updated least recently;
    /// returns how many.
    pub fn shed(&self, fraction: f64) -> usize {
        self.shards
            .iter()
            .map(|shard| {
                let mut shard = shard.lock().expect("not poisoned");
                let n = ((shard.len() as f64) * fraction).ceil() as usize;
                evict_oldest(&mut shard, n)
            })
            .sum()
    }

    /// Keys with counts, all clients'.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().unwrap().len()).sum()
    }
}

/// Removes the `n` keys updated least recently; returns how many it removed.
fn evict_oldest(shard: &mut HashMap<String, KeyCounts>, n: usize) -> usize {
    if n == 0 || shard.is_empty() {
        return 0;
    }
    let mut newest: Vec<i64> = shard.values().map(KeyCounts::newest).collect();
    let n = n.min(newest.len());
    let (_, cutoff, _) = newest.select_nth_unstable(n - 1);
    let cutoff = *cutoff;
    let mut removed = 0;
    shard.retain(|_, c| {
        if removed < n && c.newest() <= cutoff {
            removed += 1;
            false
        } else {
            true
        }
    });
    removed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::signals::{SignalDeclaration, SignalSpec};

    fn spec(count: &str) -> SignalSpec {
        SignalSpec::parse(&SignalDeclaration {
            name: "s".into(),
            key: "link-domain".into(),
            count: count.into(),
            window: "10m".into(),
            when: None,
        })
        .unwrap()
    }

    fn one(key: &str, value: Option<&str>) -> Vec<(String, Option<String>)> {
        vec![(key.into(), value.map(String::from))]
    }

    #[test]
    fn items_are_counted_per_client_and_key_over_the_window() {
        let c = MemoryCounts::new(spec("items"), 1000);
        let minute = 60_000;
        for at in [0, minute, 5 * minute] {
            c.add("app", at, &one("a.example", None));
        }
        c.add("other", 0, &one("a.example", None));
        let keys = vec!["a.example".to_string(), "b.example".to_string()];
        assert_eq!(c.values("app", &keys, 5 * minute), vec![3, 0]);
        assert_eq!(c.values("other", &keys, 5 * minute), vec![1, 0]);
        // Ten one-minute buckets: at 10m the bucket of 0 has left the window.
        assert_eq!(c.values("app", &keys, 10 * minute), vec![2, 0]);
        assert_eq!(c.values("app", &keys, 20 * minute), vec![0, 0]);
        assert_eq!(c.sweep(20 * minute).keys, 0);
    }

    #[test]
    fn distinct_values_are_counted_once_per_window() {
        let c = MemoryCounts::new(spec("distinct author"), 1000);
        for (at, author) in [(0, "u1"), (1, "u1"), (60_000, "u2"), (120_000, "u1")] {
            c.add("app", at, &one("x.example", Some(author)));
        }
        assert_eq!(c.values("app", &["x.example".into()], 120_000), vec![2]);
    }

    #[test]
    fn hyperloglog_stays_within_its_error_on_100000_values() {
        let c = MemoryCounts::new(spec("distinct author"), 1000);
        for i in 0..100_000 {
            c.add("app", (i % 600) * 1000, &one("x.example", Some(&format!("author-{i}"))));
        }
        let got = c.values("app", &["x.example".into()], 599_000)[0] as f64;
        // HyperLogLog++ at precision 12: 1.04 / sqrt(4096) = 1.6 % standard
        // error; three of them bound it with 99.7 % confidence.
        let error = (got - 100_000.0).abs() / 100_000.0;
        assert!(error < 0.05, "estimated {got} for 100000 ({:.2} %)", error * 100.0);
    }

    #[test]
    fn past_the_key_bound_the_least_recent_keys_go_first() {
        let c = MemoryCounts::new(spec("items"), SHARDS * 4);
        for i in 0..1000 {
            c.add("app", i * 10, &one(&format!("k{i}.example"), None));
        }
        assert!(c.len() <= SHARDS * 4, "{} keys kept", c.len());
        let recent = c.values("app", &["k999.example".into()], 9_990)[0];
        assert_eq!(recent, 1, "the newest key is kept");
        assert!(c.shed(0.5) > 0);
    }
}
