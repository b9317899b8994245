//! B3's baseline: a bare axum handler doing the same durable insert as
//! `POST /v1/items` on the same SQLite settings as gavel's default (WAL,
//! `synchronous = FULL`, one writer connection taking `BEGIN IMMEDIATE`, the
//! same schema) and the same group commit (concurrent inserts share one
//! transaction, up to 256, each answered after it commits), with none of
//! gavel's work (auth, validation, rate limits, idempotency, sync rules,
//! audit and outbox rows). It lives here, not in the product.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde_json::{Value, json};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

#[derive(serde::Deserialize)]
struct Submit {
    kind: String,
    author: String,
    text: String,
}

type Job = (String, Submit, oneshot::Sender<bool>);

async fn insert(State(queue): State<mpsc::Sender<Job>>, Json(req): Json<Submit>) -> (StatusCode, Json<Value>) {
    let id = uuid::Uuid::now_v7().to_string();
    let (reply, committed) = oneshot::channel();
    let sent = queue.send((id.clone(), req, reply)).await.is_ok();
    if sent && committed.await.unwrap_or(false) {
        (
            StatusCode::ACCEPTED,
            Json(json!({"id": id, "status": "pending_scan", "version": 1})),
        )
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"error": "not committed"})))
    }
}

/// The writer: takes whatever queued while the previous transaction
/// committed (up to 256) and commits it in one transaction.
async fn writer(pool: sqlx::SqlitePool, mut jobs: mpsc::Receiver<Job>) {
    while let Some(first) = jobs.recv().await {
        let mut batch = vec![first];
        while batch.len() < 256 {
            match jobs.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        let now = gavel::clock::now_ms();
        let result = async {
            let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
            for (id, req, _) in &batch {
                sqlx::query(
                    "INSERT INTO items (id, client, kind, author, body, context, fingerprint, status, version, \
                     created_at, updated_at) VALUES (?, 'bench', ?, ?, ?, '{}', '', 'pending_scan', 1, ?, ?)",
                )
                .bind(id)
                .bind(&req.kind)
                .bind(&req.author)
                .bind(&req.text)
                .bind(now)
                .bind(now)
                .execute(&mut *tx)
                .await?;
            }
            tx.commit().await
        }
        .await;
        let ok = result.is_ok();
        for (_, _, reply) in batch {
            let _ = reply.send(ok);
        }
    }
}

/// Serves the baseline on `port` with its database at `db` (the
/// `baseline-server` subcommand).
pub async fn serve(db: &Path, port: u16) -> anyhow::Result<()> {
    let url = format!("sqlite://{}", db.display());
    // gavel's own migrations: the same schema and indexes.
    drop(gavel::store::open_url(&url, 1).await?);
    let options = SqliteConnectOptions::from_str(&url)?
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full)
        .statement_cache_capacity(512)
        .pragma("cache_size", "-65536")
        .pragma("mmap_size", "268435456")
        .pragma("temp_store", "memory")
        .busy_timeout(Duration::from_secs(10))
        .foreign_keys(true);
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await?;
    let (queue, jobs) = mpsc::channel(1024);
    tokio::spawn(writer(pool, jobs));
    let app = axum::Router::new()
        .route("/v1/items", axum::routing::post(insert))
        .with_state(queue);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    axum::serve(listener, app).await?;
    Ok(())
}

/// The baseline in its own process (like gavel, so neither shares a
/// runtime with the load generator).
pub struct Process {
    pub url: String,
    child: std::process::Child,
}

impl Process {
    pub async fn start(dir: &Path) -> anyhow::Result<Process> {
        std::fs::create_dir_all(dir)?;
        let port = gavel_tests::servers::free_port();
        let child = std::process::Command::new(std::env::current_exe()?)
            .args(["baseline-server", "--port", &port.to_string(), "--db"])
            .arg(dir.join("baseline.db"))
            .spawn()?;
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_err() {
            anyhow::ensure!(std::time::Instant::now() < deadline, "the baseline did not start");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(Process {
            url: format!("http://127.0.0.1:{port}"),
            child,
        })
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
