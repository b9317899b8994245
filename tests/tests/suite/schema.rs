//! The HTTP API against its own OpenAPI document (docs/RELIABILITY.md H3):
//! schemathesis generates schema-valid and schema-violating requests for
//! every operation (examples, boundary coverage, random fuzzing, stateful
//! sequences through the document's links) and runs all of its checks:
//! never a 5xx, every status and body as documented, valid data accepted,
//! invalid data refused. Its settings, and why each expected status is
//! there, are in `tests/schemathesis/schemathesis.toml`.

use gavel_tests::server::{Setup, TestServer};
use serde_json::json;

const CONFIG: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/schemathesis/schemathesis.toml");

/// Runs schemathesis against the server with `token`; panics with its
/// report unless it exits 0.
async fn schemathesis(s: &TestServer, token: &str) {
    // Its example database and reports go to a directory of this run only.
    let work = tempfile::tempdir().unwrap();
    let out = tokio::process::Command::new("schemathesis")
        .current_dir(work.path())
        .env("NO_COLOR", "1")
        .args(["--config-file", CONFIG, "run"])
        .arg(format!("{}/openapi.json", s.url))
        .arg("-H")
        .arg(format!("Authorization: Bearer {token}"))
        .args(["--checks", "all", "--max-examples", "30"])
        .output()
        .await
        .expect("schemathesis runs (`cargo xtask test` installs it)");
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "schemathesis with the {} token on {:?} failed ({}):\n{report}\n{}",
        if token == s.moderator { "moderator" } else { "client" },
        s.setup,
        out.status,
        String::from_utf8_lossy(&out.stderr),
    );
    let summary = report.lines().last().unwrap_or_default();
    assert!(!summary.contains("failure") && !summary.contains("error"), "{report}");
}

/// Seeds the store, so item routes reach more than their 404 path.
async fn seed(s: &TestServer) {
    for i in 0..3 {
        let r = s
            .post("/v1/items", &s.client)
            .json(&json!({"kind": "post", "author": format!("seed-{i}"), "text": "seeded before the run"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 202);
    }
}

async fn the_api_conforms_to_its_openapi_document(setup: Setup) {
    // Standing on, so the author routes reach more than their refusal.
    let s = TestServer::start_with(setup, |c| c.standing.enabled = true).await;
    seed(&s).await;
    schemathesis(&s, &s.moderator).await;
    if setup == Setup::Embedded {
        // A client token: moderator routes are 403, other clients' items 404.
        schemathesis(&s, &s.client).await;
    }
    s.stop().await.unwrap();
}

gavel_tests::both!(the_api_conforms_to_its_openapi_document);
