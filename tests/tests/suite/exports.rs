//! Exports (`gavel export`, `GET /v1/exports/{table}`): every format loads
//! into DuckDB (a reader no one here wrote) with the documented columns and
//! types and gavel's own figures, and exports continued from each other's
//! cursors miss and repeat nothing while gavel writes.

use gavel_tests::server::{Setup, TestServer};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

const TABLES: [&str; 4] = ["decisions", "transitions", "items", "authors"];

/// `gavel export` against the running server's store; returns the cursor
/// it printed.
fn cli_export(s: &TestServer, table: &str, format: &str, out: &Path, after: Option<&str>) -> String {
    let mut cmd = std::process::Command::new(gavel_tests::servers::gavel_binary());
    cmd.args(["export", table, "--format", format, "--database-url"])
        .arg(s.config.database_url())
        .arg("--out")
        .arg(out);
    if let Some(after) = after {
        cmd.args(["--after", after]);
    }
    let run = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr).to_string();
    assert!(run.status.success(), "gavel export {table} --format {format}: {stderr}");
    stderr
        .split("--after '")
        .nth(1)
        .and_then(|rest| rest.split('\'').next())
        .unwrap_or_else(|| panic!("no cursor in {stderr:?}"))
        .to_string()
}

/// `GET /v1/exports/{table}`: the body and the cursor header.
async fn api_export(s: &TestServer, query: &str) -> (String, Option<String>) {
    let r = s
        .get(&format!("/v1/exports/{query}"), &s.moderator)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{query}");
    let cursor = r
        .headers()
        .get("gavel-export-cursor")
        .map(|v| v.to_str().unwrap().to_string());
    (r.text().await.unwrap(), cursor)
}

/// Runs `script` in Python with DuckDB; its last line of output, as JSON.
fn duckdb(script: &str) -> Value {
    let run = std::process::Command::new("python3")
        .args(["-c", &format!("import duckdb, json\n{script}")])
        .output()
        .unwrap();
    assert!(run.status.success(), "DuckDB: {}", String::from_utf8_lossy(&run.stderr));
    let out = String::from_utf8_lossy(&run.stdout);
    serde_json::from_str(out.lines().last().unwrap_or("null")).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// The reader DuckDB takes for a file of `format`.
fn reader(format: &str, path: &Path) -> String {
    let path = path.display();
    match format {
        "ndjson" => format!("read_json('{path}', format = 'newline_delimited')"),
        "csv" => format!("read_csv('{path}', header = true)"),
        _ => format!("read_parquet('{path}')"),
    }
}

async fn every_format_loads_into_duckdb(setup: Setup) {
    let s = TestServer::start(setup).await;
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(s.submit(&format!("calm-{i}"), &format!("a calm message {i}")).await);
        ids.push(s.submit(&format!("spam-{i}"), &format!("buy scamcoin now {i}")).await);
    }
    for id in &ids {
        s.settled(id).await;
    }
    let r = s
        .post(&format!("/v1/items/{}/moderation", ids[1]), &s.moderator)
        .json(&json!({"status": "visible", "reason": "a false positive"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let dir = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    for table in TABLES {
        for format in ["ndjson", "csv", "parquet"] {
            let path = dir.path().join(format!("{table}.{format}"));
            cli_export(&s, table, format, &path, None);
            files.push((table, format, path));
        }
        for format in ["ndjson", "csv"] {
            let (body, _) = api_export(&s, &format!("{table}?format={format}")).await;
            let path = dir.path().join(format!("api-{table}.{format}"));
            std::fs::write(&path, body).unwrap();
            files.push((table, format, path));
        }
    }
    // Row counts: what the store holds (every decision is one of a loaded
    // version's evaluations, which gavel's figures count).
    let plugins = s.get_json("/v1/plugins", &s.moderator).await;
    let evaluations: i64 = plugins["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["figures"]["evaluations"].as_i64().unwrap())
        .sum();
    let expected = BTreeMap::from([
        ("decisions", evaluations as u64),
        ("items", ids.len() as u64),
        ("authors", ids.len() as u64),
    ]);
    let mut transition_counts = BTreeSet::new();
    for (table, format, path) in &files {
        let from = reader(format, path);
        let described = duckdb(&format!(
            "rel = duckdb.sql(\"SELECT * FROM {from}\")\n\
             rows = duckdb.sql(\"SELECT count(*) FROM {from}\").fetchone()[0]\n\
             print(json.dumps({{'rows': rows, 'types': dict(zip(rel.columns, map(str, rel.types)))}}))"
        ));
        let rows = described["rows"].as_u64().unwrap();
        match expected.get(table) {
            Some(n) => assert_eq!(rows, *n, "{table} as {format}: {described:#}"),
            None => {
                transition_counts.insert(rows);
            }
        }
        let types = &described["types"];
        // The documented types: times are timestamps and epoch ms, labels a list.
        assert!(
            types["created_at_ms"]
                .as_str()
                .unwrap_or_default()
                .starts_with("BIGINT")
                || *table == "authors"
        );
        if *table == "decisions" {
            // CSV has no lists: labels are a JSON array in text there.
            let list = if *format == "csv" { "VARCHAR" } else { "VARCHAR[]" };
            assert_eq!(types["labels"], list, "{table} as {format}: {types:#}");
            assert_eq!(types["applied"], "BOOLEAN", "{table} as {format}: {types:#}");
            assert_eq!(types["score"], "DOUBLE", "{table} as {format}: {types:#}");
            assert!(
                types["created_at"].as_str().unwrap().starts_with("TIMESTAMP"),
                "{table} as {format}: {types:#}"
            );
        }
        if *table == "authors" {
            assert!(
                types["last_seen"].as_str().unwrap().starts_with("TIMESTAMP"),
                "{types:#}"
            );
        }
    }
    assert_eq!(
        transition_counts.len(),
        1,
        "every format holds the same transitions: {transition_counts:?}"
    );
    assert!(transition_counts.first().unwrap() >= &(ids.len() as u64 + 1));

    // Per version, the export counts what gavel's own figures count.
    let parquet = dir.path().join("decisions.parquet");
    let grouped = duckdb(&format!(
        "rows = duckdb.sql(\"SELECT plugin_digest, count(*), count(*) FILTER (verdict = 'reject') \
         FROM read_parquet('{}') GROUP BY ALL\").fetchall()\n\
         print(json.dumps({{d: [n, r] for d, n, r in rows}}))",
        parquet.display()
    ));
    let mut compared = 0;
    for p in plugins["plugins"].as_array().unwrap() {
        let figures = &p["figures"];
        if figures["evaluations"].as_i64().unwrap() == 0 {
            continue;
        }
        let digest = p["digest"].as_str().unwrap();
        let counted = &grouped[digest];
        assert_eq!(
            counted[0], figures["evaluations"],
            "{} {}: {grouped:#}",
            p["name"], p["version"]
        );
        assert_eq!(
            counted[1],
            figures["verdicts"].get("reject").cloned().unwrap_or(json!(0)),
            "{}: {figures:#}",
            p["name"]
        );
        compared += 1;
    }
    assert!(compared >= 3, "{plugins:#}");

    // A moderator's reversal is in the export; so is the shadow flag.
    let reversed = duckdb(&format!(
        "print(json.dumps(duckdb.sql(\"SELECT count(*) FROM read_parquet('{}') \
         WHERE reversed AND item_id = '{}'\").fetchone()[0]))",
        parquet.display(),
        ids[1]
    ));
    assert!(
        reversed.as_u64().unwrap() >= 1,
        "the overturned rejection is marked reversed"
    );
    s.stop().await.unwrap();
}

/// Exports continued from each other's cursors, taken while items are
/// submitted and judged, hold every decision and transition exactly once.
async fn exports_continued_by_cursor_miss_and_repeat_nothing(setup: Setup) {
    let s = std::sync::Arc::new(TestServer::start(setup).await);
    let writing = {
        let s = s.clone();
        tokio::spawn(async move {
            let mut ids = Vec::new();
            for i in 0..60 {
                ids.push(
                    s.submit(&format!("w{}", i % 7), &format!("message {i}, buy scamcoin? {}", i % 3))
                        .await,
                );
            }
            ids
        })
    };
    let mut seen: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
    let mut cursors: BTreeMap<&str, Option<String>> = BTreeMap::new();
    let export_round = async |seen: &mut BTreeMap<&str, Vec<i64>>, cursors: &mut BTreeMap<&str, Option<String>>| {
        for table in ["decisions", "transitions"] {
            let after = cursors.get(table).cloned().flatten();
            let query = match &after {
                Some(c) => format!("{table}?after={c}"),
                None => table.to_string(),
            };
            let (body, cursor) = api_export(&s, &query).await;
            for line in body.lines() {
                let row: Value = serde_json::from_str(line).unwrap();
                seen.entry(table).or_default().push(row["id"].as_i64().unwrap());
            }
            cursors.insert(table, Some(cursor.expect("a log's export names its cursor")));
        }
    };
    while !writing.is_finished() {
        export_round(&mut seen, &mut cursors).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let ids = writing.await.unwrap();
    for id in &ids {
        s.settled(id).await;
    }
    export_round(&mut seen, &mut cursors).await;
    for table in ["decisions", "transitions"] {
        let (all, _) = api_export(&s, table).await;
        let all: Vec<i64> = all
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap()["id"].as_i64().unwrap())
            .collect();
        let got = &seen[table];
        let unique: BTreeSet<i64> = got.iter().copied().collect();
        assert_eq!(unique.len(), got.len(), "{table}: a row exported twice");
        assert_eq!(
            unique,
            all.iter().copied().collect::<BTreeSet<_>>(),
            "{table}: a row missed"
        );
        assert!(
            all.len() >= ids.len(),
            "{table}: {} rows for {} items",
            all.len(),
            ids.len()
        );
    }
    // Bad requests are refused with the one error format.
    for (query, status) in [
        ("decisions?after=x", 400),
        ("nothing", 404),
        ("decisions?format=parquet", 400),
        ("decisions?since=5&until=5", 400),
        ("authors?after=web", 400),
    ] {
        let r = s
            .get(&format!("/v1/exports/{query}"), &s.moderator)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), status, "{query}");
        let e: Value = r.json().await.unwrap();
        assert!(e["error"]["code"].is_string(), "{query}: {e}");
    }
    let r = s.get("/v1/exports/decisions", &s.client).send().await.unwrap();
    assert_eq!(r.status(), 403, "a client token cannot export");
    std::sync::Arc::into_inner(s).unwrap().stop().await.unwrap();
}

gavel_tests::both!(
    every_format_loads_into_duckdb,
    exports_continued_by_cursor_miss_and_repeat_nothing
);
