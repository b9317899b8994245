//! gavel itself, served in the test process on port 0, on one of the
//! setups every integration test runs on; and the one way tests submit.

use crate::servers::{postgres, shared_cluster, shared_redis};
use gavel::config::{Config, Role, TokenConfig};
use serde_json::{Value, json};
use std::path::Path;
use std::time::{Duration, Instant};

/// What a test runs on: the store and the coordinator together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setup {
    /// SQLite and the embedded coordinator: the single-node default.
    Embedded,
    /// PostgreSQL and one redis-server: many nodes.
    Distributed,
    /// PostgreSQL and a three-master Redis Cluster.
    Cluster,
}

impl Setup {
    /// A fresh database URL: a SQLite file in `dir`, or a new PostgreSQL database.
    pub async fn database_url(self, dir: &Path) -> String {
        match self {
            Setup::Embedded => format!("sqlite://{}", dir.join("gavel.db").display()),
            Setup::Distributed | Setup::Cluster => postgres().database().await,
        }
    }

    /// A store on a fresh database.
    pub async fn store(self, dir: &Path) -> gavel::store::SharedStore {
        gavel::store::open_url(&self.database_url(dir).await, 16).await.unwrap()
    }

    /// The Redis URL of this setup, if it has one.
    pub fn redis_url(self) -> Option<String> {
        match self {
            Setup::Embedded => None,
            Setup::Distributed => Some(shared_redis().url()),
            Setup::Cluster => Some(shared_cluster().url()),
        }
    }

    /// A coordinator of this setup; `prefix` keeps tests apart on a shared Redis.
    pub async fn coordinator(self, prefix: &str) -> gavel::coordinator::SharedCoordinator {
        gavel::coordinator::open(self.redis_url().as_deref(), prefix, 16)
            .await
            .unwrap()
    }

    /// Points `config` at this setup: its database (in `dir` for SQLite)
    /// and its coordinator, under a key prefix of its own.
    pub async fn configure(self, config: &mut Config, dir: &Path) {
        config.database_url = Some(self.database_url(dir).await);
        config.redis_url = self.redis_url();
        config.redis_prefix = format!("t{}", uuid_ish());
    }
}

/// A short unique string (key prefixes, names).
pub fn uuid_ish() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    format!(
        "{:x}{:x}{}",
        std::process::id(),
        nanos & 0xffff_ffff,
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Instantiates `async fn test(setup: Setup)` functions as `#[tokio::test]`s
/// on the listed setups: `matrix!([embedded: Embedded, cluster: Cluster] test_a, test_b)`.
#[macro_export]
macro_rules! matrix {
    ([] $($test:ident),* $(,)?) => {};
    ([$module:ident: $setup:ident $(, $more:ident: $more_setup:ident)* $(,)?] $($test:ident),* $(,)?) => {
        $crate::matrix!(@one $module $setup [$($test),*]);
        $crate::matrix!([$($more: $more_setup),*] $($test),*);
    };
    (@one $module:ident $setup:ident [$($test:ident),*]) => {
        mod $module {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $test() {
                    super::$test($crate::server::Setup::$setup).await
                }
            )*
        }
    };
}

/// [`matrix!`] on the two deployments: embedded (SQLite) and distributed
/// (PostgreSQL + Redis).
#[macro_export]
macro_rules! both {
    ($($test:ident),* $(,)?) => {
        $crate::matrix!([embedded: Embedded, distributed: Distributed] $($test),*);
    };
}

/// gavel serving on 127.0.0.1:0 in this process, with the four Rust example
/// plugins (and the banned-terms sidecar) in its plugin directory.
pub struct TestServer {
    pub url: String,
    pub setup: Setup,
    /// Token of client `web`.
    pub client: String,
    /// Token of client `app` (another scope).
    pub client2: String,
    /// Token of moderator `mod`.
    pub moderator: String,
    pub config: Config,
    pub http: reqwest::Client,
    /// What `/metrics` exports, read directly (stale commits, lost leases, ...).
    pub metrics: std::sync::Arc<gavel::metrics::Metrics>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    dir: Option<tempfile::TempDir>,
}

impl TestServer {
    pub async fn start(setup: Setup) -> TestServer {
        Self::start_with(setup, |_| {}).await
    }

    pub async fn start_with(setup: Setup, tweak: impl FnOnce(&mut Config)) -> TestServer {
        Self::start_in(tempfile::tempdir().unwrap(), setup, tweak).await
    }

    /// The configuration every test server starts from: shrunk timers
    /// (docs/RELIABILITY.md), generous client rate limits, test limits.
    pub fn base_config(dir: &Path) -> Config {
        let token = |name: &str, role| TokenConfig {
            name: name.into(),
            token: gavel::config::new_token(),
            role,
        };
        let mut config = Config {
            data_dir: dir.join("data"),
            plugin_dir: dir.join("plugins"),
            // Through config, not test-only code paths: the debounce is short
            // and the reconciler quick.
            evaluation: gavel::config::EvaluationConfig {
                debounce: gavel::config::Debounce {
                    window_ms: 100,
                    max_wait_ms: 1_000,
                    ..Default::default()
                },
                lease_ttl_ms: 2_000,
                reconcile_interval_ms: 200,
                reconcile_grace_ms: 500,
                poll_interval_ms: 5,
                retry_base_ms: 50,
                ..Default::default()
            },
            tokens: vec![
                token("web", Role::Client),
                token("app", Role::Client),
                token("mod", Role::Moderator),
            ],
            limits: crate::test_limits(),
            ..Config::default()
        };
        // The suites send thousands of requests from one token in seconds.
        config.ingest.client_rate_per_second = 100_000;
        config.ingest.client_burst = 100_000;
        config
    }

    /// Starts in `dir` (its `plugins/` and, with SQLite, its database are reused).
    pub async fn start_in(dir: tempfile::TempDir, setup: Setup, tweak: impl FnOnce(&mut Config)) -> TestServer {
        let plugins = dir.path().join("plugins");
        std::fs::create_dir_all(&plugins).unwrap();
        for (name, path) in crate::example_rust_plugins() {
            std::fs::copy(path, plugins.join(format!("{name}.wasm"))).unwrap();
        }
        std::fs::copy(
            crate::repo_root().join("plugins/banned-terms.toml"),
            plugins.join("banned-terms.toml"),
        )
        .unwrap();
        let mut config = Self::base_config(dir.path());
        setup.configure(&mut config, dir.path()).await;
        Self::serve(dir, setup, config, tweak).await
    }

    /// Serves `config` (its database and plugins as they are) from `dir`.
    pub async fn serve(
        dir: tempfile::TempDir,
        setup: Setup,
        mut config: Config,
        tweak: impl FnOnce(&mut Config),
    ) -> TestServer {
        // Bound first, so `config.listen` (and the callback URL built from
        // it) is the real address.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        config.listen = listener.local_addr().unwrap();
        tweak(&mut config);
        let url = format!("http://{}", listener.local_addr().unwrap());
        // Configured tokens, else those of `DATA_DIR/tokens.toml` (as gavel reads them).
        let tokens = gavel::config::resolve_tokens(&config.tokens, &config.data_dir).unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let metrics = std::sync::Arc::new(gavel::metrics::Metrics::new());
        let task = tokio::spawn(gavel::serve_with_metrics(
            config.clone(),
            listener,
            async {
                let _ = rx.await;
            },
            metrics.clone(),
        ));
        let token_of = |name: &str| tokens.iter().find(|t| t.name == name).unwrap().token.clone();
        let server = TestServer {
            url,
            setup,
            client: token_of("web"),
            client2: token_of("app"),
            moderator: token_of("mod"),
            config,
            http: reqwest::Client::new(),
            metrics,
            shutdown: Some(tx),
            task: Some(task),
            dir: Some(dir),
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(r) = server.http.get(format!("{}/readyz", server.url)).send().await
                && r.status().is_success()
            {
                break;
            }
            assert!(Instant::now() < deadline, "gavel did not become ready");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        server
    }

    /// Stops gracefully and returns what `serve` returned.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        let _ = self.shutdown.take().unwrap().send(());
        self.task.take().unwrap().await.unwrap()
    }

    /// Stops gracefully, handing back the config and directory for a restart
    /// ([`TestServer::serve`]).
    pub async fn stop_keeping_dir(mut self) -> (Config, tempfile::TempDir) {
        let _ = self.shutdown.take().unwrap().send(());
        self.task.take().unwrap().await.unwrap().unwrap();
        (self.config.clone(), self.dir.take().unwrap())
    }

    /// A second server on this one's store (and Redis, if any), with a
    /// data directory and (embedded) a coordinator of its own, and a copy of
    /// this one's plugin directory: a second process of the deployment.
    pub async fn second(&self) -> TestServer {
        let dir = tempfile::tempdir().unwrap();
        let plugins = dir.path().join("plugins");
        std::fs::create_dir_all(&plugins).unwrap();
        for entry in std::fs::read_dir(&self.config.plugin_dir).unwrap() {
            let path = entry.unwrap().path();
            std::fs::copy(&path, plugins.join(path.file_name().unwrap())).unwrap();
        }
        let mut config = self.config.clone();
        config.plugin_dir = plugins;
        config.data_dir = dir.path().join("data");
        TestServer::serve(dir, self.setup, config, |_| {}).await
    }

    /// The server's directory (plugins in `plugins/`).
    pub fn dir(&self) -> &Path {
        self.dir.as_ref().unwrap().path()
    }

    /// `POST path` with a bearer token.
    pub fn post(&self, path: &str, token: &str) -> reqwest::RequestBuilder {
        self.http.post(format!("{}{path}", self.url)).bearer_auth(token)
    }

    pub fn get(&self, path: &str, token: &str) -> reqwest::RequestBuilder {
        self.http.get(format!("{}{path}", self.url)).bearer_auth(token)
    }

    /// `GET path` as JSON (any status).
    pub async fn get_json(&self, path: &str, token: &str) -> Value {
        self.get(path, token).send().await.unwrap().json().await.unwrap()
    }

    /// Another handle on the server's database, for checks in store terms.
    pub async fn open_store(&self) -> gavel::store::SharedStore {
        gavel::store::open(&gavel::store::StoreOptions {
            max_connections: 2,
            ..self.config.store_options()
        })
        .await
        .unwrap()
    }

    /// `POST /v1/items` with `body` as `token`, with an optional key; the
    /// status and the JSON answer.
    pub async fn submit_as(&self, token: &str, body: &Value, key: Option<&str>) -> (u16, Value) {
        let mut req = self.post("/v1/items", token).json(body);
        if let Some(key) = key {
            req = req.header("Idempotency-Key", key);
        }
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// Submits `text` by `author` as client `web`; returns the item id.
    pub async fn submit(&self, author: &str, text: &str) -> String {
        self.submit_with(author, text, json!({})).await
    }

    /// [`TestServer::submit`] with a `context`.
    pub async fn submit_with(&self, author: &str, text: &str, context: Value) -> String {
        let (status, r) = self
            .submit_as(
                &self.client,
                &json!({"kind": "post", "author": author, "text": text, "context": context}),
                None,
            )
            .await;
        assert_eq!(status, 202, "{r}");
        r["id"].as_str().unwrap_or_else(|| panic!("{r}")).to_string()
    }

    /// `POST /v1/items/{id}/events` of `kind` by `actor` as client `web`.
    pub async fn event(&self, id: &str, kind: &str, actor: &str) -> u16 {
        self.post(&format!("/v1/items/{id}/events"), &self.client)
            .json(&json!({"kind": kind, "actor": actor}))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    }

    /// Polls `GET /v1/items/{id}` until `done` holds (or 20 s pass).
    pub async fn wait_for(&self, id: &str, done: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let item = self.get_json(&format!("/v1/items/{id}"), &self.moderator).await;
            if done(&item) {
                return item;
            }
            assert!(
                Instant::now() < deadline,
                "item never reached the expected state: {item:#}"
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Starts a backtest (`POST /v1/backtests` with `body`, as the
    /// moderator) and waits for it to end (120 s at most); returns its
    /// record, after checking it ended `done`.
    pub async fn backtest(&self, body: Value) -> Value {
        let r = self
            .post("/v1/backtests", &self.moderator)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 202, "{}", r.text().await.unwrap());
        let id = r.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_string();
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let record = self.get_json(&format!("/v1/backtests/{id}"), &self.moderator).await;
            if record["status"] != "running" {
                assert_eq!(record["status"], "done", "{record:#}");
                return record;
            }
            assert!(Instant::now() < deadline, "backtest never ended: {record:#}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until the item has no evaluation pending and returns it.
    pub async fn settled(&self, id: &str) -> Value {
        self.wait_for(id, |i| i["needs_eval_since"].is_null() && i["status"] != "pending_scan")
            .await
    }

    /// The whole changes feed as `token` reads it (`GET /v1/changes`, every
    /// page), once `shows` holds of it (within 20 s). On PostgreSQL a
    /// committed change joins the feed when every transaction that was
    /// running at its commit has ended, in any database of the server
    /// (`docs/ARCHITECTURE.md`, "A webhook delivery and the changes feed"),
    /// so a read right after a write may not show it yet; the tests share
    /// one server.
    pub async fn changes_showing(&self, token: &str, shows: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let mut changes = Vec::new();
        eventually(
            "the changes feed to show what was expected",
            Duration::from_secs(20),
            async || {
                changes = self.all_changes(token).await;
                shows(&changes)
            },
        )
        .await;
        changes
    }

    /// Every page of `GET /v1/changes` as `token` reads it now.
    async fn all_changes(&self, token: &str) -> Vec<Value> {
        let mut changes = Vec::new();
        let mut cursor = String::new();
        loop {
            let page = self
                .get_json(&format!("/v1/changes?after={cursor}&limit=1000"), token)
                .await;
            let list = page["changes"].as_array().unwrap_or_else(|| panic!("{page:#}"));
            if list.is_empty() {
                return changes;
            }
            changes.extend(list.iter().cloned());
            cursor = page["next_cursor"].as_str().unwrap().to_string();
        }
    }

    /// [`TestServer::changes_showing`] every transition the items `ids`
    /// have now (`GET /v1/items/{id}`), by event id `ITEM:VERSION`.
    pub async fn changes_covering(&self, token: &str, ids: &[String]) -> Vec<Value> {
        let mut events = std::collections::HashSet::new();
        for id in ids {
            let item = self.get_json(&format!("/v1/items/{id}"), &self.moderator).await;
            for t in item["transitions"].as_array().unwrap_or_else(|| panic!("{item:#}")) {
                events.insert(format!("{id}:{}", t["version"]));
            }
        }
        self.changes_showing(token, |changes| {
            let shown: std::collections::HashSet<&str> =
                changes.iter().filter_map(|c| c["event_id"].as_str()).collect();
            events.iter().all(|e| shown.contains(e.as_str()))
        })
        .await
    }
}

/// Polls `check` every 25 ms until it holds, or panics naming `what` after `within`.
pub async fn eventually(what: &str, within: Duration, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}
