//! `gavel serve` configured through its environment, with the real binary:
//! only the variables of the configuration's keys are read; any other
//! `GAVEL_*` variable is someone else's and never stops gavel.

use gavel_tests::servers::{GavelProcess, free_port};

/// What a shell with a client script's profile exports: `GAVEL_URL` (not
/// gavel's), a mistyped `GAVEL_LISTN`, and two of gavel's own settings.
/// `gavel serve` starts; it reads its own (the console is off, the body
/// limit is 1000 bytes); it warns about `GAVEL_LISTN`, naming
/// `GAVEL_LISTEN`; it says nothing about `GAVEL_URL`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_gavel_variable_does_not_stop_serve() {
    let dir = tempfile::tempdir().unwrap();
    let plugins = dir.path().join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    let client = gavel::config::new_token();
    let config = format!(
        "data_dir = \"{data}\"\nplugin_dir = \"{plugins}\"\n\
         [[tokens]]\nname = \"web\"\ntoken = \"{client}\"\nrole = \"client\"\n",
        data = dir.path().join("data").display(),
        plugins = plugins.display(),
    );
    let gavel = GavelProcess::start_with_env(
        dir.path(),
        "gavel",
        free_port(),
        &config,
        &[
            ("GAVEL_URL", "http://127.0.0.1:9/"),
            ("GAVEL_LISTN", "127.0.0.1:1"),
            ("GAVEL_CONSOLE__ENABLED", "false"),
            ("GAVEL_INGEST__MAX_BODY_BYTES", "1000"),
        ],
    );
    let http = reqwest::Client::new();
    let console = http.get(format!("{}/console/login", gavel.url())).send().await.unwrap();
    assert_eq!(console.status(), 404, "GAVEL_CONSOLE__ENABLED=false was not read");
    let long = serde_json::json!({"kind": "post", "author": "a", "text": "x".repeat(2000)});
    let r = http
        .post(format!("{}/v1/items", gavel.url()))
        .bearer_auth(&client)
        .json(&long)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413, "GAVEL_INGEST__MAX_BODY_BYTES=1000 was not read");

    let log = gavel.log();
    assert!(
        log.contains("GAVEL_LISTN is not a setting of gavel and is ignored: did you mean GAVEL_LISTEN?"),
        "{log}"
    );
    assert!(!log.contains("GAVEL_URL"), "{log}");
}
