//! Counts of one signal in Redis, shared by every gavel process: per key,
//! one Redis key per bucket of its window (`INCR` for items, `PFADD`, Redis's
//! own HyperLogLog, for distinct values), expiring with the window. Every
//! bucket of one (client, key) carries one hash tag, so a reading is one
//! `MGET` or `PFCOUNT` on one slot, and the keys spread over the masters
//! of a Redis Cluster as the queue's partitions do.

use crate::coordinator::RedisConn;
use crate::domain::signals::{BUCKETS_PER_WINDOW, Count, SignalSpec, Window};
use redis::AsyncCommands;
use sha2::{Digest, Sha256};

/// One signal's counts in Redis (public for the tests).
pub struct RedisCounts {
    spec: SignalSpec,
    window: Window,
    conn: RedisConn,
    /// `PREFIX:sig:DEFINITION`: a changed definition counts afresh.
    base: String,
}

impl RedisCounts {
    /// Connects to `url` for one signal's counts under `prefix`.
    pub async fn open(spec: SignalSpec, url: &str, prefix: &str) -> anyhow::Result<Self> {
        Ok(Self::new(spec, RedisConn::open(url).await?, prefix))
    }

    pub(super) fn new(spec: SignalSpec, conn: RedisConn, prefix: &str) -> Self {
        let definition = serde_json::to_vec(&spec).expect("a signal serializes");
        let digest = hex::encode(&Sha256::digest(&definition)[..8]);
        RedisCounts {
            window: spec.window(),
            base: format!("{prefix}:sig:{}:{digest}", spec.name),
            spec,
            conn,
        }
    }

    pub(super) fn spec(&self) -> &SignalSpec {
        &self.spec
    }

    /// The key holding when counting began (the rebuild counted the stored
    /// items created before it). Its absence means Redis lost the counts.
    pub(super) fn since_key(&self) -> String {
        format!("{{{}}}:since", self.base)
    }

    /// Set once the rebuild from the store is done.
    pub(super) fn ready_key(&self) -> String {
        format!("{{{}}}:ready", self.base)
    }

    /// The hash-tagged prefix of one (client, key)'s buckets.
    fn tag(&self, client: &str, key: &str) -> String {
        let mut h = Sha256::new();
        h.update(client.as_bytes());
        h.update([0]);
        h.update(key.as_bytes());
        format!("{}:{{{}}}", self.base, hex::encode(&h.finalize()[..12]))
    }

    /// Adds an item's observations made at `at_ms`: one pipeline per key
    /// (its buckets share a slot), side by side.
    pub async fn add(
        &self,
        client: &str,
        at_ms: i64,
        observations: &[(String, Option<String>)],
    ) -> redis::RedisResult<()> {
        let bucket = self.window.bucket(at_ms);
        // A bucket lives until it has left every window that sums it.
        let ttl_ms = self.window.bucket_ms * (BUCKETS_PER_WINDOW + 1);
        let mut by_key: Vec<(&str, Vec<&str>)> = Vec::new();
        for (key, value) in observations {
            match by_key.iter_mut().find(|(k, _)| k == key) {
                Some((_, values)) => values.extend(value.as_deref()),
                None => by_key.push((key, value.as_deref().into_iter().collect())),
            }
        }
        let writes = by_key.into_iter().map(|(key, values)| {
            let mut conn = self.conn.clone();
            let name = format!("{}:{bucket}", self.tag(client, key));
            let mut pipe = redis::pipe();
            match self.spec.count {
                Count::Items => pipe.incr(&name, 1).ignore(),
                Count::Distinct(_) => pipe.pfadd(&name, values).ignore(),
            };
            pipe.pexpire(&name, ttl_ms).ignore();
            async move { pipe.query_async::<()>(&mut conn).await }
        });
        for r in futures::future::join_all(writes).await {
            r?;
        }
        Ok(())
    }

    /// The value of each of `keys` (of `client`) at `now_ms`.
    pub async fn values(&self, client: &str, keys: &[String], now_ms: i64) -> redis::RedisResult<Vec<u64>> {
        let range = self.window.range(now_ms);
        let reads = keys.iter().map(|key| {
            let tag = self.tag(client, key);
            let names: Vec<String> = range.clone().map(|b| format!("{tag}:{b}")).collect();
            let count = &self.spec.count;
            read(move || {
                let mut conn = self.conn.clone();
                let names = names.clone();
                async move {
                    match count {
                        Count::Items => {
                            let counts: Vec<Option<u64>> = conn.mget(&names).await?;
                            Ok(counts.into_iter().flatten().sum())
                        }
                        Count::Distinct(_) => redis::cmd("PFCOUNT").arg(&names).query_async::<u64>(&mut conn).await,
                    }
                }
            })
        });
        futures::future::join_all(reads).await.into_iter().collect()
    }

    /// Starts counting at `now` unless counting has begun already (another
    /// process, or before Redis lost its data): `Ok(Some(since))` when it
    /// did begin now (the caller rebuilds), `Ok(None)` when it had begun.
    pub(super) async fn begin(&self, now: i64) -> redis::RedisResult<Option<i64>> {
        let mut conn = self.conn.clone();
        let set: bool = redis::cmd("SET")
            .arg(self.since_key())
            .arg(now)
            .arg("NX")
            .query_async::<Option<String>>(&mut conn)
            .await?
            .is_some();
        if set {
            // Counting begins afresh: no rebuild is done yet, even if the
            // marker of an earlier one survived the loss of the counts.
            let _: () = conn.del(self.ready_key()).await?;
        }
        Ok(set.then_some(now))
    }

    /// When counting began, if it has (`None`: Redis lost it).
    pub(super) async fn since(&self) -> redis::RedisResult<Option<i64>> {
        read(|| {
            let mut conn = self.conn.clone();
            async move { conn.get(self.since_key()).await }
        })
        .await
    }

    /// Whether the rebuild of the current counting is done.
    pub(super) async fn ready(&self) -> redis::RedisResult<bool> {
        read(|| {
            let mut conn = self.conn.clone();
            async move { conn.exists(self.ready_key()).await }
        })
        .await
    }

    /// Marks the rebuild done.
    pub(super) async fn set_ready(&self) -> redis::RedisResult<()> {
        let mut conn = self.conn.clone();
        conn.set(self.ready_key(), 1).await
    }
}

/// Runs a read, and once more if its connection had to be replaced (Redis
/// restarted, or the network dropped the connection): the connection
/// manager reconnects on such an error, so the first read after Redis came
/// back finds the new connection instead of failing. Only reads are
/// repeated: a write may have been applied before its connection dropped.
async fn read<T, F, Fut>(mut run: F) -> redis::RedisResult<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = redis::RedisResult<T>>,
{
    match run().await {
        Err(e) if e.is_unrecoverable_error() => {
            tracing::debug!(error = %e, "a Redis read lost its connection; reading again on the new one");
            run().await
        }
        other => other,
    }
}
