//! The Redis coordinator, for many gavel processes: the debounce queue is a
//! ZSET (member = item id, score = fire time), the first-pending times a
//! hash, leases `SET NX PX` keys with a random token released by a
//! compare-and-delete script. Scheduling and claiming are Lua scripts, so
//! each is one atomic step. Every key carries the `{prefix}` hash tag, so
//! they share one Redis Cluster slot and the scripts stay atomic there.

use super::{Coordinator, CoordinatorError, DebounceMode, Lease, QueueStats, Schedule};
use crate::store::Millis;
use redis::aio::ConnectionManager;
use redis::{AsyncCommands, Script};
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

/// The Redis coordinator.
pub struct RedisCoordinator {
    conn: ConnectionManager,
    queue: String,
    first: String,
    lease_prefix: String,
    schedule: Script,
    claim: Script,
    release: Script,
}

fn unavailable(e: redis::RedisError) -> CoordinatorError {
    CoordinatorError(e.to_string())
}

impl RedisCoordinator {
    /// Connects (with automatic reconnection and backoff) to `url`.
    pub async fn open(url: &str, prefix: &str) -> anyhow::Result<Self> {
        let client = redis::Client::open(url)?;
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(2)))
            .set_response_timeout(Some(Duration::from_secs(2)))
            .set_number_of_retries(3)
            .set_max_delay(Duration::from_secs(2));
        let conn = ConnectionManager::new_with_config(client, config).await?;
        let tag = format!("{{{prefix}}}");
        Ok(RedisCoordinator {
            conn,
            queue: format!("{tag}:queue"),
            first: format!("{tag}:first"),
            lease_prefix: format!("{tag}:lease:"),
            schedule: Script::new(SCHEDULE),
            claim: Script::new(CLAIM),
            release: Script::new(RELEASE),
        })
    }
}

#[async_trait::async_trait]
impl Coordinator for RedisCoordinator {
    fn backend(&self) -> &'static str {
        "redis"
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
        let fire: String = self
            .schedule
            .key(&self.queue)
            .key(&self.first)
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
        let token = uuid::Uuid::new_v4().simple().to_string();
        let items: Vec<String> = self
            .claim
            .key(&self.queue)
            .key(&self.first)
            .arg(now)
            .arg(limit)
            .arg(ttl_ms.max(1))
            .arg(&token)
            .arg(&self.lease_prefix)
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

    async fn release(&self, lease: &Lease) -> Result<bool, CoordinatorError> {
        let deleted: i64 = self
            .release
            .key(format!("{}{}", self.lease_prefix, lease.item))
            .arg(&lease.token)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)?;
        Ok(deleted == 1)
    }

    async fn is_leased(&self, item: &str, _now: Millis) -> Result<bool, CoordinatorError> {
        self.conn
            .clone()
            .exists(format!("{}{item}", self.lease_prefix))
            .await
            .map_err(unavailable)
    }

    async fn stats(&self, now: Millis) -> Result<QueueStats, CoordinatorError> {
        let mut conn = self.conn.clone();
        let (depth, oldest): (u64, Vec<(String, f64)>) = redis::pipe()
            .zcard(&self.queue)
            .zrangebyscore_limit_withscores(&self.queue, "-inf", now, 0, 1)
            .query_async(&mut conn)
            .await
            .map_err(unavailable)?;
        Ok(QueueStats {
            depth,
            oldest_due: oldest.first().map(|(_, score)| *score as Millis),
        })
    }
}
