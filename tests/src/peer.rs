//! gavel's counterpart built on the PyPI `standardwebhooks` library
//! (`tests/standard_webhooks/peer.py`): a webhook receiver, or a provider
//! that signs its callbacks with the library. Runs as a child process,
//! killed when dropped.

use serde_json::Value;
use tokio::io::AsyncBufReadExt;

/// A running `peer.py`.
pub struct Peer {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    http: reqwest::Client,
    _child: tokio::process::Child,
}

impl Peer {
    /// Starts `peer.py receiver` or `peer.py provider` verifying with `secret`.
    pub async fn start(mode: &str, secret: &str) -> Peer {
        let script = crate::repo_root().join("tests/standard_webhooks/peer.py");
        let mut child = tokio::process::Command::new("python3")
            .arg(script)
            .arg(mode)
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("python3 runs (the standardwebhooks package is installed by `cargo xtask test`)");
        let stdout = child.stdout.take().unwrap();
        let mut first = String::new();
        tokio::io::BufReader::new(stdout).read_line(&mut first).await.unwrap();
        let port: u16 = first
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("peer.py did not start (is `standardwebhooks` installed?): {first:?}"));
        let peer = Peer {
            url: format!("http://127.0.0.1:{port}"),
            http: reqwest::Client::new(),
            _child: child,
        };
        peer.control(serde_json::json!({ "secret": secret })).await;
        peer
    }

    /// Sets fields of the peer's state (`secret`, `status`, `fail_first`, ...).
    pub async fn control(&self, fields: Value) {
        let r = self
            .http
            .post(format!("{}/control", self.url))
            .json(&fields)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 204);
    }

    /// Every request the peer received (and callback it sent), in order.
    pub async fn log(&self) -> Vec<Value> {
        self.http
            .get(format!("{}/log", self.url))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// The library's `webhook-signature` of `body` as message `id` at `timestamp`.
    pub async fn sign(&self, secret: &str, id: &str, timestamp: i64, body: &str) -> String {
        let r: Value = self
            .http
            .post(format!("{}/sign", self.url))
            .json(&serde_json::json!({"secret": secret, "id": id, "timestamp": timestamp, "body": body}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        r["signature"].as_str().unwrap().to_string()
    }
}
