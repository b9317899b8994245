//! The Redis coordinator, for many gavel processes. The queue is sharded
//! into P fixed partitions; partition k holds its debounce queue (ZSET,
//! member = item, score = fire time), its first-pending times (hash) and
//! its leases (`SET NX PX` keys with a random token, released by a
//! compare-and-delete script), all under the hash tag `{PREFIX:pK}`: every
//! per-item operation touches one slot (atomic Lua scripts work on a Redis
//! Cluster), and the partitions spread over every master of a cluster.
//! An item's partition is a fixed hash of its id, so every process agrees.
//! Claims ask the partitions in turn (a rotating start), concurrently.

use super::{Coordinator, CoordinatorError, DebounceMode, Lease, QueueStats, Schedule};
use crate::clock::Millis;
use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Script, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// Mirrors `fire_time` in `coordinator/mod.rs`.
const SCHEDULE: &str = r#"
local item, now, window, maxw, mode, at = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5], tonumber(ARGV[6])
local cur = redis.call('ZSCORE', KEYS[1], item)
if cur then cur = tonumber(cur) end
local first = redis.call('HGET', KEYS[2], item)
if first then first = tonumber(first) else first = now; redis.call('HSET', KEYS[2], item, now) end
local fire
if mode == 'at' then fire = at
elseif mode == 'fixed' then if cur then fire = cur else fire = now + window end
else fire = math.min(now + window, first + maxw) end
if cur and (cur <= now or mode == 'at') then fire = math.min(fire, cur) end
redis.call('ZADD', KEYS[1], fire, item)
return tostring(fire)
"#;

/// Claims up to ARGV[2] due items of one partition whose lease is free.
/// The lease keys are built inside the script (ARGV[5] is the partition's
/// lease prefix), since the due items are only known there; they carry the
/// partition's hash tag, so they live in KEYS[1]'s slot as Redis Cluster
/// requires of every key a script touches.
const CLAIM: &str = r#"
local limit = tonumber(ARGV[2])
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, limit * 8)
local out = {}
for _, item in ipairs(due) do
  if #out >= limit then break end
  if redis.call('SET', ARGV[5] .. item, ARGV[4], 'NX', 'PX', ARGV[3]) then
    redis.call('ZREM', KEYS[1], item)
    redis.call('HDEL', KEYS[2], item)
    table.insert(out, item)
  end
end
return out
"#;

const RELEASE: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end
"#;

/// Releases several leases of one partition (their keys share its slot):
/// KEYS are the lease keys, ARGV their tokens; one 0/1 per lease.
const RELEASE_MANY: &str = r#"
local out = {}
for i, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[i] then out[i] = redis.call('DEL', key) else out[i] = 0 end
end
return out
"#;

/// One Redis server, or a Redis Cluster.
#[derive(Clone)]
pub(crate) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Conn {
    /// Connects (with automatic reconnection and backoff) to `url`:
    /// `redis://…` for one server, `redis+cluster://a:1,b:2` for a cluster.
    pub(crate) async fn open(url: &str) -> anyhow::Result<Conn> {
        Ok(match url.strip_prefix("redis+cluster://") {
            Some(nodes) => {
                let nodes: Vec<String> = nodes.split(',').map(|n| format!("redis://{}", n.trim())).collect();
                let client = redis::cluster::ClusterClientBuilder::new(nodes)
                    .connection_timeout(Duration::from_secs(2))
                    .response_timeout(Duration::from_secs(2))
                    .build()?;
                Conn::Cluster(client.get_async_connection().await?)
            }
            None => {
                let client = redis::Client::open(url)?;
                let config = redis::aio::ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(Duration::from_secs(2)))
                    .set_response_timeout(Some(Duration::from_secs(2)))
                    .set_number_of_retries(3)
                    .set_max_delay(Duration::from_secs(2));
                Conn::Single(ConnectionManager::new_with_config(client, config).await?)
            }
        })
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// The keys of one partition.
struct Partition {
    queue: String,
    first: String,
    lease_prefix: String,
}

/// The Redis coordinator.
pub struct RedisCoordinator {
    conn: Conn,
    partitions: Vec<Partition>,
    /// Where the next claim starts, so every partition gets its turn.
    cursor: AtomicUsize,
    schedule: Script,
    claim: Script,
    release: Script,
    release_many: Script,
}

fn unavailable(e: redis::RedisError) -> CoordinatorError {
    CoordinatorError(e.to_string())
}

/// An item's partition: FNV-1a of its id (fixed, so every process and
/// every version agrees), modulo the partition count.
pub fn partition_of(item: &str, partitions: usize) -> usize {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in item.bytes() {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    (hash % partitions.max(1) as u64) as usize
}

impl RedisCoordinator {
    /// Connects (with automatic reconnection and backoff) to `url`:
    /// `redis://…` for one server, `redis+cluster://a:1,b:2` for a cluster.
    pub async fn open(url: &str, prefix: &str, partitions: u32) -> anyhow::Result<Self> {
        let conn = Conn::open(url).await?;
        let partitions = (0..partitions.max(1))
            .map(|k| {
                let tag = format!("{{{prefix}:p{k}}}");
                Partition {
                    queue: format!("{tag}:queue"),
                    first: format!("{tag}:first"),
                    lease_prefix: format!("{tag}:lease:"),
                }
            })
            .collect();
        Ok(RedisCoordinator {
            conn,
            partitions,
            cursor: AtomicUsize::new(0),
            schedule: Script::new(SCHEDULE),
            claim: Script::new(CLAIM),
            release: Script::new(RELEASE),
            release_many: Script::new(RELEASE_MANY),
        })
    }

    fn partition(&self, item: &str) -> &Partition {
        &self.partitions[partition_of(item, self.partitions.len())]
    }

    /// The queue key of each partition (for tests and tools).
    pub fn queue_keys(&self) -> Vec<String> {
        self.partitions.iter().map(|p| p.queue.clone()).collect()
    }

    async fn claim_from(
        &self,
        p: &Partition,
        now: Millis,
        limit: usize,
        ttl_ms: i64,
    ) -> Result<Vec<Lease>, CoordinatorError> {
        let token = uuid::Uuid::new_v4().simple().to_string();
        let items: Vec<String> = self
            .claim
            .key(&p.queue)
            .key(&p.first)
            .arg(now)
            .arg(limit)
            .arg(ttl_ms.max(1))
            .arg(&token)
            .arg(&p.lease_prefix)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)?;
        Ok(items
            .into_iter()
            .map(|item| Lease {
                item,
                token: token.clone(),
            })
            .collect())
    }

    /// How many items each partition holds that are due at `now` (leased
    /// ones included: a claim skips those). Only a hint of where to claim:
    /// the claim script decides.
    async fn due_counts(&self, now: Millis) -> Result<Vec<u64>, CoordinatorError> {
        let counts: Vec<(u64,)> = self
            .each_partition(|pipe, p| {
                pipe.zcount(&p.queue, "-inf", now);
            })
            .await?;
        Ok(counts.into_iter().map(|(n,)| n).collect())
    }

    /// The replies of `commands(pipe, partition)`, per partition, in
    /// partition order: one pipeline for all of them on one server (one
    /// round trip, one message each way); on a Cluster one pipeline per
    /// partition, since a cluster pipeline must stay within one slot.
    /// Plain reads only: nothing here is atomic across partitions.
    async fn each_partition<T: redis::FromRedisValue>(
        &self,
        commands: impl Fn(&mut Pipeline, &Partition),
    ) -> Result<Vec<T>, CoordinatorError> {
        match &self.conn {
            Conn::Single(conn) => {
                let mut pipe = redis::pipe();
                let mut per = 0;
                for p in &self.partitions {
                    let before = pipe.len();
                    commands(&mut pipe, p);
                    per = pipe.len() - before;
                }
                let replies: Vec<Value> = pipe.query_async(&mut conn.clone()).await.map_err(unavailable)?;
                replies
                    .chunks(per.max(1))
                    .map(|one| {
                        redis::from_redis_value(Value::Array(one.to_vec()))
                            .map_err(|e| CoordinatorError(format!("unexpected reply: {e}")))
                    })
                    .collect()
            }
            Conn::Cluster(conn) => {
                let per_partition = self.partitions.iter().map(|p| async {
                    let mut pipe = redis::pipe();
                    commands(&mut pipe, p);
                    pipe.query_async::<T>(&mut conn.clone()).await.map_err(unavailable)
                });
                futures::future::try_join_all(per_partition).await
            }
        }
    }
}

/// How a claim of `wanted` items is spread over up to `waiting` partitions:
/// one share per partition asked, each at least 1, together exactly
/// `wanted` (so a claim never takes more than its limit, which is the
/// worker's free evaluation slots).
fn wave_shares(wanted: usize, waiting: usize) -> Vec<usize> {
    let n = wanted.min(waiting);
    (0..n).map(|i| wanted / n + usize::from(i < wanted % n)).collect()
}

#[async_trait::async_trait]
impl Coordinator for RedisCoordinator {
    fn backend(&self) -> &'static str {
        match self.conn {
            Conn::Single(_) => "redis",
            Conn::Cluster(_) => "redis-cluster",
        }
    }

    async fn schedule(&self, item: &str, now: Millis, how: Schedule) -> Result<Millis, CoordinatorError> {
        let (mode, window, max_wait, at) = match how {
            Schedule::At(at) => ("at", 0, 0, at),
            Schedule::Debounced {
                mode,
                window_ms,
                max_wait_ms,
            } => (
                match mode {
                    DebounceMode::Sliding => "sliding",
                    DebounceMode::Fixed => "fixed",
                },
                window_ms,
                max_wait_ms,
                0,
            ),
        };
        let p = self.partition(item);
        let fire: String = self
            .schedule
            .key(&p.queue)
            .key(&p.first)
            .arg(item)
            .arg(now)
            .arg(window)
            .arg(max_wait)
            .arg(mode)
            .arg(at)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)?;
        fire.parse::<f64>()
            .map(|f| f as Millis)
            .map_err(|_| CoordinatorError(format!("bad fire time {fire:?}")))
    }

    async fn claim_due(&self, now: Millis, limit: usize, ttl_ms: i64) -> Result<Vec<Lease>, CoordinatorError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        // Waves of concurrent claims, from a rotating start so every
        // partition gets its turn: each wave spreads what is still wanted
        // over as many partitions (never more in total, so a claim never
        // takes more than `limit`); a partition that gave less than its
        // share is empty for now, one that gave all of it is asked again.
        // Only partitions holding something due are asked: a claim is a
        // script call, an idle partition's answer costs Redis and this
        // process as much as a busy one's, and most of the partitions are
        // idle whenever the queue is short.
        let total = self.partitions.len();
        let due = self.due_counts(now).await?;
        let start = self.cursor.fetch_add(limit.min(total), Ordering::Relaxed) % total;
        let mut waiting: std::collections::VecDeque<usize> = (0..total)
            .map(|i| (start + i) % total)
            .filter(|&p| due[p] > 0)
            .collect();
        let mut leases = Vec::with_capacity(limit);
        let mut failure = None;
        while leases.len() < limit && !waiting.is_empty() {
            let shares = wave_shares(limit - leases.len(), waiting.len());
            let wave: Vec<(usize, usize)> = shares
                .into_iter()
                .map(|share| (waiting.pop_front().expect("one share per waiting partition"), share))
                .collect();
            let claims = wave
                .iter()
                .map(|&(p, share)| self.claim_from(&self.partitions[p], now, share, ttl_ms));
            for ((p, share), result) in wave.iter().zip(futures::future::join_all(claims).await) {
                match result {
                    Ok(mut got) => {
                        if got.len() == *share {
                            waiting.push_back(*p);
                        }
                        leases.append(&mut got);
                    }
                    Err(e) => failure = Some(e),
                }
            }
            if failure.is_some() {
                break;
            }
        }
        match failure {
            // Leases already taken are returned: their items are off their
            // queues, so they must be evaluated now.
            Some(e) if leases.is_empty() => Err(e),
            _ => Ok(leases),
        }
    }

    async fn release(&self, lease: &Lease) -> Result<bool, CoordinatorError> {
        let p = self.partition(&lease.item);
        let deleted: i64 = self
            .release
            .key(format!("{}{}", p.lease_prefix, lease.item))
            .arg(&lease.token)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)?;
        Ok(deleted == 1)
    }

    async fn release_many(&self, leases: &[Lease]) -> Result<Vec<bool>, CoordinatorError> {
        // One script call per partition touched, the partitions in parallel.
        let mut by_partition: std::collections::BTreeMap<usize, Vec<usize>> = std::collections::BTreeMap::new();
        for (i, lease) in leases.iter().enumerate() {
            by_partition
                .entry(partition_of(&lease.item, self.partitions.len()))
                .or_default()
                .push(i);
        }
        let calls = by_partition.into_iter().map(|(p, at)| async move {
            let p = &self.partitions[p];
            let mut call = self.release_many.prepare_invoke();
            for &i in &at {
                call.key(format!("{}{}", p.lease_prefix, leases[i].item))
                    .arg(&leases[i].token);
            }
            let released: Vec<i64> = call.invoke_async(&mut self.conn.clone()).await.map_err(unavailable)?;
            Ok::<_, CoordinatorError>(at.into_iter().zip(released).collect::<Vec<_>>())
        });
        let mut out = vec![false; leases.len()];
        for answers in futures::future::try_join_all(calls).await? {
            for (i, deleted) in answers {
                out[i] = deleted == 1;
            }
        }
        Ok(out)
    }

    async fn is_leased(&self, item: &str, _now: Millis) -> Result<bool, CoordinatorError> {
        let p = self.partition(item);
        redis::cmd("EXISTS")
            .arg(format!("{}{item}", p.lease_prefix))
            .query_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)
    }

    async fn stats(&self, now: Millis) -> Result<QueueStats, CoordinatorError> {
        let per_partition: Vec<(u64, Vec<(String, f64)>)> = self
            .each_partition(|pipe, p| {
                pipe.zcard(&p.queue)
                    .zrangebyscore_limit_withscores(&p.queue, "-inf", now, 0, 1);
            })
            .await?;
        let mut stats = QueueStats::default();
        for (depth, oldest) in per_partition {
            stats.depth += depth;
            if let Some((_, score)) = oldest.first() {
                let due = *score as Millis;
                stats.oldest_due = Some(stats.oldest_due.map_or(due, |o: Millis| o.min(due)));
            }
        }
        Ok(stats)
    }
}

#[cfg(test)]
mod tests {
    use super::{partition_of, wave_shares};

    #[test]
    fn a_wave_asks_for_exactly_what_is_wanted() {
        for wanted in 0..80 {
            for waiting in 0..80 {
                let shares = wave_shares(wanted, waiting);
                assert_eq!(shares.len(), wanted.min(waiting));
                assert!(shares.iter().all(|s| *s >= 1));
                if waiting > 0 {
                    assert_eq!(shares.iter().sum::<usize>(), wanted, "{wanted} over {waiting}");
                }
            }
        }
    }

    #[test]
    fn partitions_are_fixed_and_spread() {
        assert_eq!(partition_of("item-1", 64), partition_of("item-1", 64));
        let mut counts = [0u32; 64];
        for i in 0..64_000 {
            counts[partition_of(&uuid_like(i), 64)] += 1;
        }
        assert!(counts.iter().all(|&c| (700..1300).contains(&c)), "{counts:?}");
    }

    fn uuid_like(i: u32) -> String {
        format!("0190b2c4-{i:04x}-7000-8000-{:012x}", u64::from(i) * 7919)
    }
}
