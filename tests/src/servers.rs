//! Real servers for the tests: a PostgreSQL started from `initdb` into a
//! temp dir on a free port, redis-servers (alone, or three masters of a
//! Redis Cluster), and real `gavel serve` processes.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// A free TCP port on 127.0.0.1.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|dir| Path::new(dir).join(program))
        .find(|p| p.is_file())
}

/// One PostgreSQL server per test binary; each caller gets its own database.
pub struct Postgres {
    port: u16,
    next_db: AtomicU32,
    pid: std::sync::Mutex<Option<u32>>,
    _dir: tempfile::TempDir,
}

fn is_root() -> bool {
    unsafe_geteuid() == 0
}

/// The user PostgreSQL runs as when the tests run as root.
fn pg_user() -> &'static str {
    ["postgres", "nobody"]
        .into_iter()
        .find(|u| {
            Command::new("id")
                .arg(u)
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
        .expect("a non-root user to run PostgreSQL as")
}

fn as_pg_user(program: &Path) -> Command {
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", pg_user(), "--"]).arg(program);
        c
    } else {
        Command::new(program)
    }
}

/// The shared PostgreSQL server, started on first use. It stops by itself
/// when the test process exits (a watchdog shell follows this process).
pub fn postgres() -> &'static Postgres {
    static PG: OnceLock<Postgres> = OnceLock::new();
    PG.get_or_init(Postgres::start)
}

impl Postgres {
    fn start() -> Postgres {
        let initdb = which("initdb").expect("initdb (PostgreSQL 15) is not on PATH; `cargo xtask test` checks for it");
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        // PostgreSQL refuses to run as root: drop to the `postgres` (or `nobody`) user.
        if is_root() {
            let uid = Command::new("id").args(["-u", pg_user()]).output().unwrap();
            let uid: u32 = String::from_utf8_lossy(&uid.stdout).trim().parse().unwrap();
            std::os::unix::fs::chown(dir.path(), Some(uid), None).unwrap();
        }
        let status = as_pg_user(&initdb)
            .args(["-A", "trust", "-U", "gavel", "--no-sync", "-E", "UTF8", "-D"])
            .arg(&data)
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "initdb failed");
        let pg = Postgres {
            port: free_port(),
            next_db: AtomicU32::new(0),
            pid: std::sync::Mutex::new(None),
            _dir: dir,
        };
        pg.launch();
        pg
    }

    fn launch(&self) {
        let postgres = which("postgres").expect("postgres is not on PATH");
        let dir = self._dir.path();
        let mut server = as_pg_user(&postgres);
        server
            .arg("-D")
            .arg(dir.join("data"))
            .args(["-p", &self.port.to_string(), "-k"])
            .arg(dir)
            .args([
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "fsync=off",
                "-c",
                "max_connections=300",
            ]);
        let cmdline: Vec<String> = std::iter::once(server.get_program())
            .chain(server.get_args())
            .map(|a| format!("'{}'", a.to_string_lossy()))
            .collect();
        let pidfile = dir.join("server.pid");
        let _ = std::fs::remove_file(&pidfile);
        let script = format!(
            "{cmd} >>{dir}/pg.log 2>&1 & pg=$!; echo $pg > '{pidfile}'; \
             while kill -0 {me} 2>/dev/null && kill -0 $pg 2>/dev/null; do sleep 0.5; done; \
             if ! kill -0 {me} 2>/dev/null; then \
             kill -QUIT $(head -1 '{dir}/data/postmaster.pid' 2>/dev/null) $pg 2>/dev/null; \
             sleep 1; rm -rf '{dir}'; fi",
            cmd = cmdline.join(" "),
            dir = dir.display(),
            pidfile = pidfile.display(),
            me = std::process::id(),
        );
        // The watchdog stops the postmaster itself (`runuser` does not pass
        // signals on) and, the static server never being dropped, removes
        // its directory once the test process is gone. When its own server
        // stopped first (`restart_immediate`) it only exits: the pid file
        // then names the next server, which its own watchdog follows. It
        // holds none of the test's output pipes, so it never keeps a runner
        // waiting.
        let pid = spawn_watched(&script, &pidfile, self.port, Duration::from_secs(30))
            .unwrap_or_else(|| panic!("PostgreSQL did not start; see {}/pg.log", dir.display()));
        *self.pid.lock().unwrap() = Some(pid);
    }

    /// Restarts the server in immediate mode (SIGQUIT: no checkpoint, crash
    /// recovery on start), as an operator's `pg_ctl restart -m immediate`.
    pub fn restart_immediate(&self) {
        if let Some(pid) = self.postmaster().map(|p| p.to_string()) {
            let _ = Command::new("kill").args(["-QUIT", &pid]).status();
            let deadline = Instant::now() + Duration::from_secs(30);
            while Command::new("kill")
                .args(["-0", &pid])
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
            {
                assert!(Instant::now() < deadline, "PostgreSQL did not stop");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        self.pid.lock().unwrap().take();
        self.launch();
    }

    /// The postmaster's own pid (the watchdog knows only its wrapper's).
    fn postmaster(&self) -> Option<u32> {
        let pidfile = self._dir.path().join("data/postmaster.pid");
        std::fs::read_to_string(pidfile)
            .ok()?
            .lines()
            .next()?
            .trim()
            .parse()
            .ok()
    }

    /// CPU time the whole server used so far, in seconds: the postmaster
    /// and every process it runs (backends, WAL writer, checkpointer,
    /// autovacuum), those that ended counted through the postmaster.
    pub fn cpu_seconds(&self) -> Option<f64> {
        let postmaster = self.postmaster()?;
        let own = proc_stat(postmaster)?.cpu;
        let children: f64 = std::fs::read_dir("/proc")
            .ok()?
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .filter_map(proc_stat)
            .filter(|p| p.parent == postmaster)
            .map(|p| p.cpu)
            .sum();
        Some(own + children)
    }

    /// A new empty database; returns its URL.
    pub async fn database(&self) -> String {
        use sqlx::Connection;
        let n = self.next_db.fetch_add(1, Ordering::Relaxed);
        let name = format!("gavel_test_{}_{n}", std::process::id());
        let admin = format!("postgres://gavel@127.0.0.1:{}/postgres", self.port);
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut conn = loop {
            match sqlx::PgConnection::connect(&admin).await {
                Ok(c) => break c,
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("connecting to the test PostgreSQL: {e}"),
            }
        };
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut conn)
            .await
            .unwrap();
        format!("postgres://gavel@127.0.0.1:{}/{name}", self.port)
    }
}

/// CPU time (user + system) process `pid` used so far, in seconds, with
/// that of its children it has reaped; `None` once it has gone.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    Some(proc_stat(pid)?.cpu)
}

/// What `/proc/PID/stat` says of a process: its parent, and its CPU time
/// (user + system, its own and its reaped children's) in seconds.
struct ProcStat {
    parent: u32,
    cpu: f64,
}

fn proc_stat(pid: u32) -> Option<ProcStat> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command name, which is in parentheses; proc(5)
    // numbers them from 1 (pid), so field n is at n - 3 here.
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3)?.parse::<f64>().ok();
    // utime, stime, cutime, cstime: fields 14 to 17, in USER_HZ (100) ticks.
    let ticks = field(14)? + field(15)? + field(16)? + field(17)?;
    Some(ProcStat {
        parent: field(4)? as u32,
        cpu: ticks / 100.0,
    })
}

fn unsafe_geteuid() -> u32 {
    // `id -u` rather than libc, to keep the harness free of unsafe code.
    let out = Command::new("id").arg("-u").output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

/// A real redis-server on a free port with a temp dir and no persistence.
/// `kill` (SIGKILL) and `restart` it to test outages; it stops by itself
/// when the test process exits.
pub struct Redis {
    pub port: u16,
    dir: tempfile::TempDir,
    pid: std::sync::Mutex<Option<u32>>,
}

impl Redis {
    pub fn start() -> Redis {
        let r = Redis {
            port: free_port(),
            dir: tempfile::tempdir().unwrap(),
            pid: std::sync::Mutex::new(None),
        };
        r.restart();
        r
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Starts the server (again) on the same port, empty.
    pub fn restart(&self) {
        let server = which("redis-server").expect("redis-server is not on PATH; `cargo xtask test` installs it");
        let pidfile = self.dir.path().join("watchdog.pid");
        let script = format!(
            "'{}' --port {} --bind 127.0.0.1 --save '' --appendonly no --dir '{}' >>'{}/redis.log' 2>&1 & rs=$!; echo $rs > '{}'; \
             while kill -0 {} 2>/dev/null && kill -0 $rs 2>/dev/null; do sleep 0.5; done; kill -9 $rs 2>/dev/null",
            server.display(),
            self.port,
            self.dir.path().display(),
            self.dir.path().display(),
            pidfile.display(),
            std::process::id()
        );
        let _ = std::fs::remove_file(&pidfile);
        let pid =
            spawn_watched(&script, &pidfile, self.port, Duration::from_secs(10)).expect("redis-server did not start");
        *self.pid.lock().unwrap() = Some(pid);
    }

    /// CPU time the server used so far, in seconds (`None` if it is down).
    pub fn cpu_seconds(&self) -> Option<f64> {
        cpu_seconds((*self.pid.lock().unwrap())?)
    }

    /// How many times the server ran `command` (lowercase, as `INFO
    /// commandstats` names it: `evalsha`, `zcount`).
    pub fn calls(&self, command: &str) -> u64 {
        let cli = which("redis-cli").expect("redis-cli is not on PATH; it comes with redis-server");
        let out = Command::new(cli)
            .args(["-p", &self.port.to_string(), "info", "commandstats"])
            .output()
            .unwrap();
        let stats = String::from_utf8_lossy(&out.stdout);
        let prefix = format!("cmdstat_{command}:calls=");
        stats
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .map_or(0, |rest| rest.split(',').next().unwrap_or("0").parse().unwrap())
    }

    /// SIGKILLs the server: everything it held is gone.
    pub fn kill(&self) {
        if let Some(pid) = self.pid.lock().unwrap().take() {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            let deadline = Instant::now() + Duration::from_secs(5);
            while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                assert!(Instant::now() < deadline, "redis-server did not die");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A Redis shared by one test binary (tests keep apart by key prefix).
pub fn shared_redis() -> &'static Redis {
    static REDIS: OnceLock<Redis> = OnceLock::new();
    REDIS.get_or_init(Redis::start)
}

/// A free port `p` whose cluster bus port `p + 10000` is free too.
fn free_cluster_port() -> u16 {
    loop {
        let p = free_port();
        if p < 55_000
            && std::net::TcpListener::bind(("127.0.0.1", p)).is_ok()
            && std::net::TcpListener::bind(("127.0.0.1", p + 10_000)).is_ok()
        {
            return p;
        }
    }
}

/// A real Redis Cluster: three masters (`redis-server --cluster-enabled
/// yes`) joined by `redis-cli --cluster create`, each in its own temp dir.
/// It stops by itself when the test process exits.
pub struct RedisCluster {
    pub ports: Vec<u16>,
    _dirs: Vec<tempfile::TempDir>,
}

impl RedisCluster {
    fn start() -> RedisCluster {
        let server = which("redis-server").expect("redis-server is not on PATH; `cargo xtask test` installs it");
        let cli = which("redis-cli").expect("redis-cli is not on PATH; it comes with redis-server");
        let (mut ports, mut dirs) = (Vec::new(), Vec::new());
        for _ in 0..3 {
            let port = free_cluster_port();
            let dir = tempfile::tempdir().unwrap();
            let pidfile = dir.path().join("watchdog.pid");
            let script = format!(
                "'{}' --port {port} --bind 127.0.0.1 --cluster-enabled yes --cluster-config-file nodes.conf \
                 --save '' --appendonly no --dir '{dir}' >>'{dir}/redis.log' 2>&1 & rs=$!; echo $rs > '{pid}'; \
                 while kill -0 {me} 2>/dev/null && kill -0 $rs 2>/dev/null; do sleep 0.5; done; kill -9 $rs 2>/dev/null",
                server.display(),
                dir = dir.path().display(),
                pid = pidfile.display(),
                me = std::process::id(),
            );
            spawn_watched(&script, &pidfile, port, Duration::from_secs(10))
                .expect("a cluster redis-server did not start");
            ports.push(port);
            dirs.push(dir);
        }
        let nodes: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let status = Command::new(&cli)
            .args(["--cluster", "create"])
            .args(&nodes)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "redis-cli --cluster create failed");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ok = ports.iter().all(|p| {
                Command::new(&cli)
                    .args(["-p", &p.to_string(), "cluster", "info"])
                    .output()
                    .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("cluster_state:ok"))
            });
            if ok {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the Redis Cluster never reached cluster_state:ok"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        RedisCluster { ports, _dirs: dirs }
    }

    /// `redis+cluster://` with every node, as gavel's `redis_url`.
    pub fn url(&self) -> String {
        let nodes: Vec<String> = self.ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        format!("redis+cluster://{}", nodes.join(","))
    }

    /// How many keys each master holds (`DBSIZE`), in port order.
    pub fn keys_per_master(&self) -> Vec<u64> {
        let cli = which("redis-cli").expect("redis-cli");
        self.ports
            .iter()
            .map(|p| {
                let out = Command::new(&cli)
                    .args(["-p", &p.to_string(), "dbsize"])
                    .output()
                    .unwrap();
                String::from_utf8_lossy(&out.stdout).trim().parse().unwrap_or(0)
            })
            .collect()
    }
}

/// The Redis Cluster shared by one test binary (tests keep apart by key prefix).
pub fn shared_cluster() -> &'static RedisCluster {
    static CLUSTER: OnceLock<RedisCluster> = OnceLock::new();
    CLUSTER.get_or_init(RedisCluster::start)
}

/// The `gavel` binary the kill tests run: built by `cargo xtask test`
/// before the tests (`cargo build -p gavel`).
pub fn gavel_binary() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::repo_root().join("target"));
    let bin = target.join("debug").join("gavel");
    assert!(
        bin.is_file(),
        "{} is missing: run `cargo build -p gavel` (cargo xtask test does)",
        bin.display()
    );
    bin
}

/// Whether a process on `port` answers `GET /healthz` with 200.
fn healthy(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    if stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).is_ok() && &head == b"HTTP/1.1 200"
}

/// A real `gavel serve` process, for SIGKILL / SIGSTOP tests.
pub struct GavelProcess {
    pub name: String,
    pub port: u16,
    config: PathBuf,
    log: PathBuf,
    /// Set in the process's environment, over the test's own.
    env: Vec<(String, String)>,
    child: Option<std::process::Child>,
}

impl GavelProcess {
    /// Starts `gavel serve --config CONFIG` with `listen` set to a free port
    /// and waits until it answers `/healthz`.
    pub fn start(dir: &Path, name: &str, config_toml: &str) -> GavelProcess {
        Self::start_at(dir, name, free_port(), config_toml)
    }

    /// [`GavelProcess::start`] listening on `port`.
    pub fn start_at(dir: &Path, name: &str, port: u16, config_toml: &str) -> GavelProcess {
        Self::start_with_env(dir, name, port, config_toml, &[])
    }

    /// [`GavelProcess::start_at`] with `env` set in the process's environment.
    pub fn start_with_env(dir: &Path, name: &str, port: u16, config_toml: &str, env: &[(&str, &str)]) -> GavelProcess {
        let config = dir.join(format!("{name}.toml"));
        std::fs::write(&config, format!("listen = \"127.0.0.1:{port}\"\n{config_toml}")).unwrap();
        let mut p = GavelProcess {
            name: name.into(),
            port,
            config,
            log: dir.join(format!("{name}.log")),
            env: env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            child: None,
        };
        p.restart();
        p
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// (Re)starts the process and waits for `/healthz`.
    pub fn restart(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = Command::new(gavel_binary())
            .args(["serve", "--config"])
            .arg(&self.config)
            .env("RUST_LOG", "info")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        // The port is bound before the store is open and the plugins are
        // loaded; only an answer from `/healthz` means the process serves.
        while !healthy(self.port) {
            assert!(
                Instant::now() < deadline,
                "{} did not start; see {}",
                self.name,
                self.log.display()
            );
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                panic!("{} exited ({status}) instead of serving:\n{}", self.name, self.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn signal(&self, sig: &str) {
        if let Some(c) = &self.child {
            let _ = Command::new("kill").args([sig, &c.id().to_string()]).status();
        }
    }

    /// SIGKILL, and reap.
    pub fn kill(&mut self) {
        self.signal("-KILL");
        if let Some(mut c) = self.child.take() {
            let _ = c.wait();
        }
    }

    pub fn pause(&self) {
        self.signal("-STOP");
    }

    pub fn resume(&self) {
        self.signal("-CONT");
    }

    /// What the process logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for GavelProcess {
    fn drop(&mut self) {
        self.resume();
        self.kill();
    }
}

/// What it took to get one idempotent submission acknowledged.
pub struct Acknowledged {
    pub id: String,
    /// Requests sent (1 when nothing failed).
    pub attempts: u64,
    /// Answers that were 503 (each with Retry-After).
    pub unavailable: u64,
}

/// Submits item `i` (author `author-i`, text `post number i`, no external
/// id: only the Idempotency-Key `submit-i` keeps retries from making a
/// second item) until it is acknowledged, retrying with the same key after
/// connection errors, 409 (in flight, or taken over by an earlier retry)
/// and 503; any other answer is a test failure (in particular any other
/// 5xx). Each attempt goes to the next of `urls` (several api processes).
pub async fn submit_until_acknowledged(http: &reqwest::Client, urls: &[String], token: &str, i: u64) -> Acknowledged {
    let body = serde_json::json!({"kind": "post", "author": format!("author-{i}"), "text": format!("post number {i}")});
    let (mut attempts, mut unavailable) = (0, 0);
    loop {
        let url = &urls[attempts as usize % urls.len()];
        attempts += 1;
        let r = http
            .post(format!("{url}/v1/items"))
            .bearer_auth(token)
            .header("Idempotency-Key", format!("submit-{i}"))
            .json(&body)
            .timeout(Duration::from_secs(5))
            .send()
            .await;
        match r {
            Ok(r) if r.status() == 202 => {
                let id = r.json::<serde_json::Value>().await.unwrap()["id"]
                    .as_str()
                    .unwrap()
                    .to_string();
                return Acknowledged {
                    id,
                    attempts,
                    unavailable,
                };
            }
            Ok(r) if r.status() == 503 => {
                assert!(r.headers().contains_key("retry-after"), "503 without Retry-After");
                unavailable += 1;
            }
            Ok(r) => {
                let status = r.status().as_u16();
                assert_eq!(
                    status,
                    409,
                    "submission {i}: unexpected {status}: {}",
                    r.text().await.unwrap_or_default()
                );
            }
            Err(_) => {} // the api process is down: retry
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Adds a deliberately slow rule (`slow.wasm`, the misbehave fixture
/// spinning `spin_ms` per evaluation, deadline 5 s) to `plugin_dir`.
pub fn add_slow_rule(plugin_dir: &Path, spin_ms: u64) {
    std::fs::copy(crate::guests::MISBEHAVE, plugin_dir.join("slow.wasm")).unwrap();
    std::fs::write(
        plugin_dir.join("slow.toml"),
        format!("[limits]\nasync_deadline_ms = 5000\n[config]\nmode = \"spin\"\nspin_ms = {spin_ms}\n"),
    )
    .unwrap();
}

/// Runs `script` (a server plus its watchdog) detached from the test's
/// output pipes, and waits until the server's pid is in `pidfile` and `port`
/// accepts connections; `None` if that takes longer than `within`.
fn spawn_watched(script: &str, pidfile: &std::path::Path, port: u16, within: Duration) -> Option<u32> {
    // The watchdog shell outlives this call by design (it stops the server
    // once the test process is gone): nothing waits for it.
    #[allow(clippy::zombie_processes)]
    Command::new("sh")
        .args(["-c", script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + within;
    loop {
        if let Ok(text) = std::fs::read_to_string(pidfile)
            && let Ok(pid) = text.trim().parse::<u32>()
            && std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        {
            return Some(pid);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
