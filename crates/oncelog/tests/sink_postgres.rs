//! `oncelog sink postgres` against a real database (the shared test cluster, a schema per test):
//!
//! - a State Protocol stream with 100,000 changes over 1,000 keys, compacted in the middle of
//!   the run while the sink is behind (frozen): the `state` table equals the state a reader from
//!   `offset=-1` materialises with the fold the server's compaction uses; beside it a JSON stream
//!   (one row per message, keyed by its offset) and a byte stream (one row per read, contiguous);
//!   progress on `--metrics-addr` (rows applied, lag per stream);
//! - a trimmed stream that is not a State Protocol stream stops the sink with the reason, and
//!   `--on-trimmed skip` goes on and counts the bytes it skipped;
//! - a message the target refuses (`jsonb` takes no `\u0000`) stops the sink naming the stream,
//!   the message's offset and the database's own reason; with `--on-refused skip-stream` the
//!   stream is set aside before that batch (positions, metric, one warning) while another stream
//!   goes on, and is picked up again once its reason is cleared.

mod common;
mod sink_support;

use std::collections::BTreeMap;
use std::process::{Child, Stdio};
use std::time::Duration;

use common::pg::{database_url, free_port};
use common::Harness;
use futures_util::StreamExt;
use oncelog_client::{AppendOptions, Client, CreateOptions, LiveMode, ReadFrom, ReadOptions};
use oncelog_protocol::state::Materialized;
use serde_json::{json, Value};
use sink_support::{query, wait_applied, wait_exit, Lcg, Reaped};

/// `oncelog sink postgres` on `h`'s server, stderr into `log`.
fn sink(h: &Harness, pattern: &str, schema: &str, extra: &[&str], log: &std::path::Path) -> Reaped {
    let log = std::fs::OpenOptions::new().create(true).append(true).open(log).expect("log");
    let mut defaults = vec!["--worker", "w", "--lease-ttl", "5s"];
    // The test's own --worker / --lease-ttl win (clap refuses a flag given twice).
    for flag in ["--worker", "--lease-ttl"] {
        if extra.contains(&flag) {
            let i = defaults.iter().position(|f| *f == flag).unwrap_or(0);
            defaults.drain(i..i + 2);
        }
    }
    common::bin()
        .args([
            "sink",
            "postgres",
            "--url",
            &h.base,
            "--pattern",
            pattern,
            "--target",
            &database_url(),
            "--schema",
            schema,
        ])
        .args(&defaults)
        .args(extra)
        .env("NO_COLOR", "1")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .map(Reaped)
        .expect("start oncelog sink")
}

fn signal(child: &Child, signal: &str) {
    let status = std::process::Command::new("kill")
        .args([&format!("-{signal}"), &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill -{signal}");
}

/// Waits until the sink started with `log` has made its subscription `id` (what a stream held
/// before is applied too, at start: sink_start.rs; the tests here wait so that what they append
/// is met by a wake).
async fn wait_subscription(client: &Client, id: &str, log: &std::path::Path) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while client.subscriptions().get(id).await.is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "the sink made no subscription:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Everything a catch-up reader from `offset=-1` gets.
async fn read_all(client: &Client, path: &str) -> Vec<u8> {
    let mut reader = client.stream(path).read(ReadOptions::new(ReadFrom::Beginning, LiveMode::CatchUp));
    let mut out = Vec::new();
    while let Some(chunk) = reader.next().await {
        out.extend_from_slice(&chunk.expect("read").data);
    }
    out
}

/// The messages of a JSON stream read from `offset=-1`, in stored form (`text,` each).
async fn stored_form(client: &Client, path: &str) -> Vec<u8> {
    let mut reader = client.stream(path).read(ReadOptions::new(ReadFrom::Beginning, LiveMode::CatchUp));
    let mut stored = Vec::new();
    while let Some(chunk) = reader.next().await {
        let chunk = chunk.expect("read");
        if chunk.data.is_empty() {
            continue;
        }
        for m in serde_json::from_slice::<Vec<&serde_json::value::RawValue>>(&chunk.data).expect("JSON array") {
            stored.extend_from_slice(m.get().as_bytes());
            stored.push(b',');
        }
    }
    stored
}

/// 1,000 State Protocol changes over keys `k0`…`k999`: sets (insert / update / upsert) and, one
/// in seven, deletes.
fn changes(rng: &mut Lcg, first: u64) -> Value {
    let ops = ["insert", "update", "upsert"];
    Value::Array(
        (first..first + 1_000)
            .map(|i| {
                let key = format!("k{}", rng.next(1_000));
                if rng.next(7) == 0 {
                    json!({ "type": "item", "key": key, "headers": { "operation": "delete" } })
                } else {
                    json!({ "type": "item", "key": key, "value": { "i": i, "tags": ["a", i % 3] }, "headers": { "operation": ops[(i % 3) as usize] } })
                }
            })
            .collect(),
    )
}

#[test]
fn state_json_and_byte_streams_land_in_their_tables_across_a_compaction() {
    let started = std::time::Instant::now();
    let h = Harness::start();
    let client = h.client();
    let url = database_url();
    let schema = common::pg::schema("sink", "tables");
    let log = h.dir.path().join("sink.log");
    let names: Vec<String> = ["app/state", "app/events", "app/raw"].map(str::to_owned).to_vec();
    h.rt.block_on(async {
        let state = CreateOptions { state_compaction: true, ..CreateOptions::content_type("application/json") };
        client.stream("app/state").create(state).await.expect("create state");
        client
            .stream("app/events")
            .create(CreateOptions::content_type("application/json"))
            .await
            .expect("create events");
        client.stream("app/raw").create(CreateOptions::content_type("text/plain")).await.expect("create raw");
    });
    let port = free_port();
    let child = sink(&h, "app/**", &schema, &["--metrics-addr", &format!("127.0.0.1:{port}")], &log);
    let mut rng = Lcg(0x5_7a7e);
    let append = |path: &'static str, body: String| {
        let client = client.clone();
        async move { client.stream(path).append(body, AppendOptions::default()).await.expect("append") }
    };
    let compacted = h.rt.block_on(async {
        wait_subscription(&client, &format!("sink-{schema}"), &log).await;
        // Entities the sink sees made and never sees deleted: their deletes are compacted away
        // while it is frozen, so only the snapshot's reset can take their rows out.
        let gone = |op: &str| Value::Array((0..50).map(|j| json!({ "type": "item", "key": format!("gone{j}"), "value": j, "headers": { "operation": op } })).collect());
        append("app/state", gone("insert").to_string()).await;
        for i in 0..50u64 {
            append("app/state", changes(&mut rng, i * 1_000).to_string()).await;
            append("app/events", json!([{ "event": i }, { "event": i, "second": true }]).to_string()).await;
            append("app/raw", format!("line {i}\n")).await;
        }
        wait_applied(&client, &url, &schema, &names, Duration::from_secs(60)).await;
        // The sink falls behind (frozen), the history it would read next is compacted away,
        // and it comes back: it must restart from the snapshot.
        signal(&child, "STOP");
        for i in 50..60u64 {
            append("app/state", changes(&mut rng, i * 1_000).to_string()).await;
        }
        let deletes: Vec<Value> = (0..50).map(|j| json!({ "type": "item", "key": format!("gone{j}"), "headers": { "operation": "delete" } })).collect();
        append("app/state", Value::Array(deletes).to_string()).await;
        let compacted = client.stream("app/state").compact().await.expect("compact");
        for i in 60..100u64 {
            append("app/state", changes(&mut rng, i * 1_000).to_string()).await;
            append("app/events", json!({ "event": i }).to_string()).await;
            append("app/raw", format!("line {i}\n")).await;
        }
        signal(&child, "CONT");
        compacted
    });
    let drained = h.rt.block_on(wait_applied(&client, &url, &schema, &names, Duration::from_secs(90)));
    assert!(
        compacted.earliest.to_oncelog().is_some_and(|o| o.0 > 0),
        "the compaction moved the earliest offset: {compacted:?}"
    );

    h.rt.block_on(async {
        // State: the rows are what a reader from offset=-1 folds (the compaction's fold).
        let mut folded = Materialized::default();
        folded.fold(&stored_form(&client, "app/state").await).expect("fold");
        let want: BTreeMap<String, Value> = folded.entities().map(|((_, k), v)| (k.to_owned(), serde_json::from_str(v).expect("value"))).collect();
        let rows = query(&url, &format!("SELECT key, value::text FROM {schema}.state WHERE stream = 'app/state' AND type = 'item'")).await.expect("state rows");
        let got: BTreeMap<String, Value> = rows.into_iter().map(|r| (r[0].clone(), serde_json::from_str(&r[1]).expect("jsonb"))).collect();
        assert!(want.len() > 500, "{} live keys", want.len());
        assert_eq!(got.len(), want.len(), "live entities");
        assert!(got == want, "the state table differs from the folded state");

        // JSON: one row per message, in order, keyed by where each message starts.
        let events: Vec<Value> = serde_json::from_slice(&format!("[{}]", String::from_utf8(stored_form(&client, "app/events").await).expect("utf-8").trim_end_matches(',')).into_bytes()).expect("events");
        let rows = query(&url, &format!("SELECT stream_offset, value::text FROM {schema}.messages WHERE stream = 'app/events' ORDER BY stream_offset")).await.expect("message rows");
        assert_eq!(rows.iter().map(|r| serde_json::from_str::<Value>(&r[1]).expect("jsonb")).collect::<Vec<_>>(), events);
        assert_eq!(rows[0][0], "0");

        // Bytes: one row per read, contiguous, together the whole stream.
        let rows = query(&url, &format!("SELECT stream_offset, next_offset, convert_from(data, 'UTF8') FROM {schema}.chunks WHERE stream = 'app/raw' ORDER BY stream_offset")).await.expect("chunk rows");
        let mut at = 0u64;
        for r in &rows {
            assert_eq!(r[0].parse::<u64>().expect("offset"), at, "chunks are contiguous");
            at = r[1].parse().expect("next offset");
        }
        assert_eq!(rows.iter().map(|r| r[2].as_str()).collect::<String>().into_bytes(), read_all(&client, "app/raw").await);

        // Progress: rows applied and lag per stream, on the metrics endpoint.
        let metrics = reqwest::get(format!("http://127.0.0.1:{port}/metrics")).await.expect("scrape").text().await.expect("metrics text");
        for s in &names {
            assert!(metrics.contains(&format!("oncelog_sink_lag_bytes{{stream=\"{s}\"}} 0")), "lag of {s} in:\n{metrics}");
            assert!(metrics.contains(&format!("oncelog_sink_rows_applied_total{{stream=\"{s}\"}}")), "rows of {s} in:\n{metrics}");
        }
        // Every metric is described.
        let undescribed: Vec<&str> = metrics
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split(' ').next())
            .filter(|name| !metrics.contains(&format!("# HELP {name} ")))
            .collect();
        assert!(undescribed.is_empty(), "# TYPE without # HELP: {undescribed:?}");
    });
    let mut child = child;
    let _ = child.kill();
    let _ = child.wait();
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(text.contains("restarting from the snapshot"), "the sink did not restart from the snapshot:\n{text}");
    assert!(text.contains("stream applied"), "progress is logged:\n{text}");
    eprintln!("100,000 changes over 1,000 keys, compacted mid-run: table equals the fold; drained in {drained:?}; {:?} in all", started.elapsed());
}

#[test]
fn trimmed_history_stops_the_sink_unless_it_is_told_to_skip_and_count() {
    let h = Harness::start();
    let client = h.client();
    let url = database_url();
    let schema = common::pg::schema("sink", "trim");
    let log = h.dir.path().join("sink.log");
    let earliest = h.rt.block_on(async {
        let s = client.stream("t/plain");
        s.create(CreateOptions::content_type("application/json")).await.expect("create");
        let tail =
            s.append(r#"[{"a":1},{"a":2},{"a":3}]"#, AppendOptions::default()).await.expect("append").next_offset;
        s.trim(&tail).await.expect("trim").earliest
    });
    let mut child = sink(&h, "t/*", &schema, &[], &log);
    // The sink meets the trimmed history at start (what the stream held is applied from its
    // first byte), or at the latest when this append wakes it.
    h.rt.block_on(async {
        wait_subscription(&client, &format!("sink-{schema}"), &log).await;
        client.stream("t/plain").append(r#"{"a":4}"#, AppendOptions::default()).await.expect("append");
    });
    let out = wait_exit(&mut child, Duration::from_secs(30));
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(out, Some(1), "the sink exits with status 1:\n{text}");
    assert!(text.contains("t/plain: history from offset 0 was dropped"), "the reason is logged:\n{text}");

    let mut child = sink(&h, "t/*", &schema, &["--on-trimmed", "skip"], &log);
    h.rt.block_on(wait_applied(&client, &url, &schema, &["t/plain".to_owned()], Duration::from_secs(30)));
    let _ = child.kill();
    let _ = child.wait();
    h.rt.block_on(async {
        let lost = query(&url, &format!("SELECT lost_bytes FROM {schema}.positions WHERE stream = 't/plain'"))
            .await
            .expect("positions");
        assert_eq!(lost[0][0], earliest.to_oncelog().expect("offset").0.to_string(), "the skipped bytes are counted");
        let rows = query(&url, &format!("SELECT value::text FROM {schema}.messages WHERE stream = 't/plain'"))
            .await
            .expect("rows");
        assert_eq!(rows, vec![vec![r#"{"a": 4}"#.to_owned()]]);
    });
}

#[test]
fn a_value_the_target_refuses_stops_the_sink_with_nothing_of_its_batch_applied() {
    let h = Harness::start();
    let client = h.client();
    let schema = common::pg::schema("sink", "refused");
    let log = h.dir.path().join("sink.log");
    h.rt.block_on(client.stream("r/x").create(CreateOptions::content_type("application/json"))).expect("create");
    let mut child = sink(&h, "r/*", &schema, &[], &log);
    h.rt.block_on(async {
        wait_subscription(&client, &format!("sink-{schema}"), &log).await;
        // Valid JSON that jsonb refuses (SQLSTATE 22P05), behind a message it takes.
        client.stream("r/x").append(r#"[{"ok":1},{"bad":"\u0000"}]"#, AppendOptions::default()).await.expect("append");
    });
    let out = wait_exit(&mut child, Duration::from_secs(30));
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(out, Some(1), "the sink exits with status 1:\n{text}");
    // `{"ok":1},` takes 9 bytes: the refused message starts at 9. The database's own words, not
    // the driver's "db error".
    assert!(
        text.contains("r/x: the target refused the message at offset 9"),
        "the stream and the offset are named:\n{text}"
    );
    assert!(
        text.contains("ERROR 22P05: unsupported Unicode escape sequence"),
        "the database's reason is shown:\n{text}"
    );
    assert!(!text.contains("db error"), "no bare driver text:\n{text}");
    let rows =
        h.rt.block_on(query(&database_url(), &format!("SELECT count(*) FROM {schema}.messages"))).expect("count");
    assert_eq!(rows, vec![vec!["0".to_owned()]], "nothing of the refused batch is in the target");
}

/// Rows of `stream` in `schema`'s messages table, as (offset, value) text.
async fn message_rows(url: &str, schema: &str, stream: &str) -> Vec<Vec<String>> {
    query(
        url,
        &format!(
            "SELECT stream_offset, value::text FROM {schema}.messages WHERE stream = '{stream}' ORDER BY stream_offset"
        ),
    )
    .await
    .expect("message rows")
}

/// `stream`'s (position, set_aside_reason) once it is set aside; panics with the log after 30 s.
async fn wait_set_aside(url: &str, schema: &str, stream: &str, log: &std::path::Path) -> (String, String) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let sql = format!("SELECT position, set_aside_reason FROM {schema}.positions WHERE stream = '{stream}' AND set_aside_reason IS NOT NULL");
        if let Some(r) = query(url, &sql).await.ok().and_then(|rows| rows.into_iter().next()) {
            return (r[0].clone(), r[1].clone());
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{stream} was not set aside:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[test]
fn with_skip_stream_a_refused_stream_is_set_aside_and_the_others_go_on() {
    let h = Harness::start();
    let client = h.client();
    let url = database_url();
    let schema = common::pg::schema("sink", "aside");
    let log = h.dir.path().join("sink.log");
    let id = format!("sink-{schema}");
    h.rt.block_on(async {
        for s in ["a/good", "a/bad"] {
            client.stream(s).create(CreateOptions::content_type("application/json")).await.expect("create");
        }
    });
    let port = free_port();
    let mut child = sink(
        &h,
        "a/*",
        &schema,
        &["--on-refused", "skip-stream", "--metrics-addr", &format!("127.0.0.1:{port}")],
        &log,
    );
    let append = |path: &'static str, body: &'static str| {
        let client = client.clone();
        async move { client.stream(path).append(body, AppendOptions::default()).await.expect("append") }
    };
    let set_aside_log =
        |log: &std::path::Path| std::fs::read_to_string(log).unwrap_or_default().matches("stream set aside").count();
    h.rt.block_on(async {
        wait_subscription(&client, &id, &log).await;
        // Applied before the refusal: 8 bytes each in stored form.
        append("a/bad", r#"[{"n":1},{"n":2}]"#).await;
        wait_applied(&client, &url, &schema, &["a/bad".to_owned()], Duration::from_secs(30)).await;
        // One append, so one batch, refused whole: `{"n":3}` from 16, the refused one from 24.
        append("a/good", r#"{"g":1}"#).await;
        append("a/bad", r#"[{"n":3},{"bad":"\u0000"},{"n":4}]"#).await;
        let (position, reason) = wait_set_aside(&url, &schema, "a/bad", &log).await;
        assert_eq!(position, "16", "set aside where the refused batch starts");
        assert!(
            reason.starts_with("the message at offset 24: ERROR 22P05: unsupported Unicode escape sequence"),
            "the message and the database's reason are kept: {reason}"
        );
        // The set-aside stream gets more data, the other one too: only the other one is applied,
        // and the set-aside one is neither retried nor woken for again and again.
        append("a/bad", r#"{"n":5}"#).await;
        append("a/good", r#"{"g":2}"#).await;
        wait_applied(&client, &url, &schema, &["a/good".to_owned()], Duration::from_secs(30)).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let woken = client.subscriptions().get(&id).await.expect("subscription").generation;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let later = client.subscriptions().get(&id).await.expect("subscription").generation;
        assert_eq!(woken, later, "woken again and again for a set-aside stream");
        assert_eq!(
            set_aside_log(&log),
            1,
            "set aside once, logged once:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        let values =
            |rows: Vec<Vec<String>>| rows.into_iter().map(|r| format!("{} {}", r[0], r[1])).collect::<Vec<_>>();
        assert_eq!(values(message_rows(&url, &schema, "a/bad").await), ["0 {\"n\": 1}", "8 {\"n\": 2}"]);
        assert_eq!(values(message_rows(&url, &schema, "a/good").await), ["0 {\"g\": 1}", "8 {\"g\": 2}"]);
        let metrics = reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
            .await
            .expect("scrape")
            .text()
            .await
            .expect("metrics text");
        assert!(metrics.contains("oncelog_sink_streams_set_aside_total{stream=\"a/bad\"} 1"), "counted:\n{metrics}");

        // Resuming as SINKS.md says: clear the reason; the stream's next append wakes the sink,
        // which reads it from its position again (and, the cause being still there, sets it
        // aside again at the same message).
        query(
            &url,
            &format!(
                "UPDATE {schema}.positions SET set_aside_reason = NULL, set_aside_at = NULL WHERE stream = 'a/bad'"
            ),
        )
        .await
        .expect("resume");
        append("a/bad", r#"{"n":6}"#).await;
        let (position, _) = wait_set_aside(&url, &schema, "a/bad", &log).await;
        assert_eq!(position, "16");
        // The warning follows the commit that set the stream aside.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while set_aside_log(&log) < 2 && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(set_aside_log(&log), 2, "picked up again after the reason was cleared");
    });
    assert!(
        matches!(child.try_wait(), Ok(None)),
        "the sink goes on:\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
}

#[test]
fn a_position_ahead_of_the_cursor_moves_the_cursor_instead_of_waking_again_and_again() {
    let h = Harness::start();
    let client = h.client();
    let url = database_url();
    let schema = common::pg::schema("sink", "ahead");
    let log = h.dir.path().join("sink.log");
    h.rt.block_on(client.stream("l/x").create(CreateOptions::content_type("application/json"))).expect("create");
    let child = sink(&h, "l/*", &schema, &[], &log);
    let id = format!("sink-{schema}");
    let tail = h.rt.block_on(async {
        wait_subscription(&client, &id, &log).await;
        // While the sink is frozen: data arrives, and the target already holds it, as if a
        // worker had committed it and died before its ack.
        signal(&child, "STOP");
        let tail = client
            .stream("l/x")
            .append(r#"[{"a":1},{"a":2}]"#, AppendOptions::default())
            .await
            .expect("append")
            .next_offset;
        let pos = tail.to_oncelog().expect("offset").0;
        query(
            &url,
            &format!("INSERT INTO {schema}.positions (stream, next_offset, position) VALUES ('l/x', '{tail}', {pos})"),
        )
        .await
        .expect("position");
        signal(&child, "CONT");
        tokio::time::sleep(Duration::from_secs(3)).await;
        tail
    });
    let info = h.rt.block_on(client.subscriptions().get(&id)).expect("subscription");
    let mut child = child;
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(
        info.link("l/x").map(|l| l.acked_offset.clone()),
        Some(tail),
        "the cursor moved to the target's position"
    );
    assert!(info.generation <= 3, "woken {} times for work that was done", info.generation);
    let rows = h.rt.block_on(query(&url, &format!("SELECT count(*) FROM {schema}.messages"))).expect("count");
    assert_eq!(rows, vec![vec!["0".to_owned()]], "nothing applied again");
}

#[test]
fn sigterm_gives_the_claim_back_with_its_batch_rolled_back() {
    let h = Harness::start();
    let client = h.client();
    let url = database_url();
    let schema = common::pg::schema("sink", "term");
    let (log_a, log_b) = (h.dir.path().join("a.log"), h.dir.path().join("b.log"));
    h.rt.block_on(client.stream("g/x").create(CreateOptions::content_type("application/json"))).expect("create");
    let claims = |log: &std::path::Path| std::fs::read_to_string(log).unwrap_or_default().matches(" claimed ").count();
    let mut a = sink(&h, "g/*", &schema, &["--lease-ttl", "30s"], &log_a);
    let mut b = None;
    h.rt.block_on(async {
        wait_subscription(&client, &format!("sink-{schema}"), &log_a).await;
        client.stream("g/x").append(r#"{"m":1}"#, AppendOptions::default()).await.expect("append");
        wait_applied(&client, &url, &schema, &["g/x".to_owned()], Duration::from_secs(30)).await;
        // Hold the stream's position row, so the next batch waits inside its transaction.
        let (cfg, tls) = oncelog_postgres::driver_config(&url).expect("URL");
        let (mut db, conn) = cfg.connect(tls).await.expect("connect");
        tokio::spawn(conn);
        let held = db.transaction().await.expect("begin");
        held.execute(&format!("SELECT 1 FROM {schema}.positions WHERE stream = 'g/x' FOR UPDATE"), &[])
            .await
            .expect("lock");
        client.stream("g/x").append(r#"{"m":2}"#, AppendOptions::default()).await.expect("append");
        while claims(&log_a) < 2 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        signal(&a, "TERM");
        assert_eq!(wait_exit(&mut a, Duration::from_secs(10)), Some(0), "SIGTERM ends the sink cleanly");
        // Another worker gets the claim long before the 30 s lease would have ended.
        b = Some(sink(&h, "g/*", &schema, &["--lease-ttl", "30s", "--worker", "b"], &log_b));
        let started = std::time::Instant::now();
        while claims(&log_b) < 1 {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "the claim was not given back:\n{}",
                std::fs::read_to_string(&log_a).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        held.rollback().await.expect("rollback");
        wait_applied(&client, &url, &schema, &["g/x".to_owned()], Duration::from_secs(30)).await;
    });
    if let Some(mut b) = b {
        let _ = b.kill();
        let _ = b.wait();
    }
    let rows =
        h.rt.block_on(query(&url, &format!("SELECT value::text FROM {schema}.messages ORDER BY stream_offset")))
            .expect("rows");
    assert_eq!(rows, vec![vec![r#"{"m": 1}"#.to_owned()], vec![r#"{"m": 2}"#.to_owned()]], "each message once");
}
