//! What `oncelog sink postgres` does when it starts (a real server, the sink binary, the shared
//! test database, a schema per test):
//!
//! - streams that had data before the sink started are applied from their first byte with no
//!   further append; so are data that arrived while it was down, a stream created while it was
//!   down and one created while it runs; `--from-now` skips what a stream held before and applies
//!   what comes after;
//! - `--mode state` materialises a plain `application/json` stream of State Protocol changes
//!   into `state` (with `updated_at` moving on update only) and sets a byte stream aside;
//!   `--mode chunks` and `--mode messages` put every stream in their tables;
//! - a sink SIGKILLed while it holds the claim and restarted without `--worker` takes its claim
//!   back at once (well within the 30 s lease), and a worker that waits for another's claim says
//!   whom it waits for;
//! - a target that refuses the sink's login (no such database, no such role, a wrong password)
//!   stops it within seconds naming the cause; a target that is away is waited for, the cause in
//!   every line;
//! - the grants docs/SINKS.md lists for a sink's token are enough, and each is needed.

mod common;
mod sink_support;

use std::io::{Read, Write};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::pg::database_url;
use common::Harness;
use oncelog_client::{AppendOptions, Client, CreateOptions};
use serde_json::json;
use sink_support::{query, wait_applied, wait_exit, Reaped};

/// `oncelog sink postgres` on `h`'s server into `target`, stderr appended to `log`. No
/// `--worker` unless `args` has one: the default name is part of what is tested.
fn sink(h: &Harness, pattern: &str, target: &str, schema: &str, args: &[&str], log: &Path) -> Reaped {
    let log = std::fs::OpenOptions::new().create(true).append(true).open(log).expect("log");
    common::bin()
        .args(["sink", "postgres", "--url", &h.base, "--pattern", pattern, "--target", target, "--schema", schema])
        .args(args)
        .env("NO_COLOR", "1")
        .env("RUST_LOG", "info")
        // The default worker name's lock file goes with the test's directory.
        .env("TMPDIR", h.dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .map(Reaped)
        .expect("start oncelog sink")
}

fn text(log: &Path) -> String {
    std::fs::read_to_string(log).unwrap_or_default()
}

/// Waits (up to `limit`) until `log` contains `needle`; panics with the log otherwise.
fn wait_log(log: &Path, needle: &str, limit: Duration) {
    let deadline = Instant::now() + limit;
    while !text(log).contains(needle) {
        assert!(Instant::now() < deadline, "no {needle:?} within {limit:?} in:\n{}", text(log));
        std::thread::sleep(Duration::from_millis(50));
    }
}

async fn create(client: &Client, path: &str, content_type: &str) {
    client.stream(path).create(CreateOptions::content_type(content_type)).await.expect("create");
}

async fn append(client: &Client, path: &str, body: String) {
    client.stream(path).append(body, AppendOptions::default()).await.expect("append");
}

/// The messages rows of `stream`: (stream_offset, value) as text.
async fn messages(url: &str, schema: &str, stream: &str) -> Vec<String> {
    let rows = query(
        url,
        &format!(
            "SELECT stream_offset, value::text FROM {schema}.messages WHERE stream = '{stream}' ORDER BY stream_offset"
        ),
    )
    .await
    .expect("messages");
    rows.into_iter().map(|r| format!("{} {}", r[0], r[1])).collect()
}

fn paths(p: &[&str]) -> Vec<String> {
    p.iter().map(|s| (*s).to_owned()).collect()
}

#[test]
fn streams_written_before_the_sink_starts_are_applied_without_another_append() {
    let started = Instant::now();
    let h = Harness::start();
    let client = h.client();
    let url = database_url();
    let schema = common::pg::schema("sinkstart", "backfill");
    let log = h.dir.path().join("sink.log");
    h.rt.block_on(async {
        create(&client, "b/json", "application/json").await;
        create(&client, "b/raw", "text/plain").await;
        let state = CreateOptions { state_compaction: true, ..CreateOptions::content_type("application/json") };
        client.stream("b/state").create(state).await.expect("create state");
        append(&client, "b/json", json!([{ "n": 1 }, { "n": 2 }]).to_string()).await;
        append(&client, "b/json", json!({ "n": 3 }).to_string()).await;
        append(&client, "b/raw", "one\ntwo\n".to_owned()).await;
        append(
            &client,
            "b/state",
            json!({ "type": "u", "key": "a", "value": 1, "headers": { "operation": "insert" } }).to_string(),
        )
        .await;
    });
    let mut child = sink(&h, "b/*", &url, &schema, &["--worker", "w"], &log);
    // Nothing is appended once the sink runs: what the streams held is applied all the same.
    h.rt.block_on(wait_applied(
        &client,
        &url,
        &schema,
        &paths(&["b/json", "b/raw", "b/state"]),
        Duration::from_secs(20),
    ));
    let caught = text(&log);
    assert!(
        caught.contains("catching up on what the streams held at start") && caught.contains("streams=3"),
        "the start says what it catches up:\n{caught}"
    );
    h.rt.block_on(async {
        assert_eq!(messages(&url, &schema, "b/json").await, ["0 {\"n\": 1}", "8 {\"n\": 2}", "16 {\"n\": 3}"]);
        let chunks = query(&url, &format!("SELECT stream_offset, next_offset, convert_from(data, 'UTF8') FROM {schema}.chunks WHERE stream = 'b/raw'")).await.expect("chunks");
        assert_eq!(chunks, vec![vec!["0".to_owned(), "8".to_owned(), "one\ntwo\n".to_owned()]]);
        let state = query(&url, &format!("SELECT key, value::text FROM {schema}.state WHERE stream = 'b/state'")).await.expect("state");
        assert_eq!(state, vec![vec!["a".to_owned(), "1".to_owned()]]);
    });

    // Down: data arrives for a stream it applied and a stream is created; both are applied after
    // a restart, and so is a stream created while it runs.
    let _ = child.kill();
    let _ = child.wait();
    h.rt.block_on(async {
        append(&client, "b/json", json!({ "n": 4 }).to_string()).await;
        create(&client, "b/late", "application/json").await;
        append(&client, "b/late", json!({ "late": true }).to_string()).await;
    });
    let _child = sink(&h, "b/*", &url, &schema, &["--worker", "w"], &log);
    h.rt.block_on(async {
        wait_applied(&client, &url, &schema, &paths(&["b/json", "b/late"]), Duration::from_secs(20)).await;
        create(&client, "b/new", "application/json").await;
        append(&client, "b/new", json!({ "new": true }).to_string()).await;
        wait_applied(&client, &url, &schema, &paths(&["b/new"]), Duration::from_secs(20)).await;
        assert_eq!(messages(&url, &schema, "b/json").await.len(), 4, "each message once");
        assert_eq!(messages(&url, &schema, "b/late").await, ["0 {\"late\": true}"]);
        assert_eq!(messages(&url, &schema, "b/new").await, ["0 {\"new\": true}"]);
    });
    eprintln!("backfill, restart and new streams in {:?}", started.elapsed());
}

#[test]
fn from_now_skips_what_the_streams_held_and_applies_what_comes_after() {
    let h = Harness::start();
    let client = h.client();
    let url = database_url();
    let schema = common::pg::schema("sinkstart", "fromnow");
    let log = h.dir.path().join("sink.log");
    h.rt.block_on(async {
        create(&client, "f/x", "application/json").await;
        append(&client, "f/x", json!([{ "old": 1 }, { "old": 2 }]).to_string()).await;
    });
    let _child = sink(&h, "f/*", &url, &schema, &["--worker", "w", "--from-now"], &log);
    h.rt.block_on(async {
        // The tail is recorded as the position, nothing of the history applied.
        wait_applied(&client, &url, &schema, &paths(&["f/x"]), Duration::from_secs(20)).await;
        assert_eq!(messages(&url, &schema, "f/x").await, Vec::<String>::new(), "history skipped");
        wait_log(&log, "--from-now: streams the sink never applied start at their tails", Duration::from_secs(5));
        assert!(text(&log).contains("streams=1 skipped_bytes=20"), "what was skipped is logged:\n{}", text(&log));
        append(&client, "f/x", json!({ "new": 3 }).to_string()).await;
        // A stream created after the start is applied whole.
        create(&client, "f/y", "application/json").await;
        append(&client, "f/y", json!({ "y": 1 }).to_string()).await;
        wait_applied(&client, &url, &schema, &paths(&["f/x", "f/y"]), Duration::from_secs(20)).await;
        assert_eq!(messages(&url, &schema, "f/x").await, ["20 {\"new\": 3}"]);
        assert_eq!(messages(&url, &schema, "f/y").await, ["0 {\"y\": 1}"]);
    });
}

/// One State Protocol change as `@durable-streams/state` writes it.
fn change(op: &str, key: &str, value: i64) -> serde_json::Value {
    json!({ "type": "item", "key": key, "value": { "v": value }, "headers": { "operation": op } })
}

#[test]
fn mode_state_materialises_a_plain_json_stream_of_state_changes() {
    let h = Harness::start();
    let client = h.client();
    let url = database_url();
    let schema = common::pg::schema("sinkstart", "mode");
    let log = h.dir.path().join("sink.log");
    h.rt.block_on(async {
        // A plain JSON stream: no Stream-Compaction: state, nothing marks it a State Protocol one.
        create(&client, "m/changes", "application/json").await;
        create(&client, "m/raw", "text/plain").await;
        append(&client, "m/changes", json!([change("insert", "k1", 1), change("insert", "k2", 2)]).to_string()).await;
        append(&client, "m/raw", "not json\n".to_owned()).await;
    });
    let _child =
        sink(&h, "m/*", &url, &schema, &["--worker", "w", "--mode", "state", "--on-refused", "skip-stream"], &log);
    let rows = |url: String, schema: String| async move {
        query(&url, &format!("SELECT key, value::text, stream_offset, extract(epoch FROM updated_at)::text FROM {schema}.state WHERE stream = 'm/changes' ORDER BY key"))
            .await
            .expect("state rows")
    };
    h.rt.block_on(async {
        wait_applied(&client, &url, &schema, &paths(&["m/changes"]), Duration::from_secs(20)).await;
        let before = rows(url.clone(), schema.clone()).await;
        assert_eq!(
            before.iter().map(|r| (r[0].as_str(), r[1].as_str())).collect::<Vec<_>>(),
            [("k1", "{\"v\": 1}"), ("k2", "{\"v\": 2}")]
        );
        assert!(before.iter().all(|r| !r[3].is_empty()), "updated_at is set on insert: {before:?}");
        assert_eq!(messages(&url, &schema, "m/changes").await, Vec::<String>::new(), "not in messages");
        // The byte stream is set aside, with the reason, and the JSON one goes on.
        let aside = query(&url, &format!("SELECT set_aside_reason FROM {schema}.positions WHERE stream = 'm/raw'"))
            .await
            .expect("positions");
        assert_eq!(aside, vec![vec!["--mode state applies JSON streams only; this one is text/plain".to_owned()]]);

        tokio::time::sleep(Duration::from_millis(20)).await;
        append(&client, "m/changes", json!([change("update", "k1", 3), change("insert", "k3", 4)]).to_string()).await;
        wait_applied(&client, &url, &schema, &paths(&["m/changes"]), Duration::from_secs(20)).await;
        let after = rows(url.clone(), schema.clone()).await;
        assert_eq!(
            after.iter().map(|r| (r[0].as_str(), r[1].as_str())).collect::<Vec<_>>(),
            [("k1", "{\"v\": 3}"), ("k2", "{\"v\": 2}"), ("k3", "{\"v\": 4}")]
        );
        let epoch = |r: &Vec<String>| r[3].parse::<f64>().expect("epoch");
        assert!(epoch(&after[0]) > epoch(&before[0]), "updated_at moves on update: {before:?} {after:?}");
        assert_eq!(after[1][3], before[1][3], "and only then");
        assert_ne!(after[0][2], before[0][2], "stream_offset names the change that set the row");
    });
}

#[test]
fn mode_chunks_and_mode_messages_force_their_tables() {
    let h = Harness::start();
    let client = h.client();
    let url = database_url();
    h.rt.block_on(async {
        create(&client, "c/json", "application/json").await;
        let state = CreateOptions { state_compaction: true, ..CreateOptions::content_type("application/json") };
        client.stream("c/state").create(state).await.expect("create state");
        append(&client, "c/json", json!([{ "a": 1 }, { "a": 2 }]).to_string()).await;
        append(&client, "c/state", change("insert", "k", 1).to_string()).await;
    });
    let streams = paths(&["c/json", "c/state"]);
    // Chunks: a JSON stream's read as a reader gets it, its offsets the stored form's span.
    let chunks = common::pg::schema("sinkstart", "chunks");
    let log = h.dir.path().join("chunks.log");
    let child = sink(&h, "c/*", &url, &chunks, &["--worker", "w", "--mode", "chunks"], &log);
    h.rt.block_on(async {
        wait_applied(&client, &url, &chunks, &streams, Duration::from_secs(20)).await;
        let rows = query(&url, &format!("SELECT stream, stream_offset, next_offset, convert_from(data, 'UTF8') FROM {chunks}.chunks ORDER BY stream")).await.expect("chunks");
        assert_eq!(rows[0], ["c/json", "0", "16", r#"[{"a":1},{"a":2}]"#]);
        assert_eq!((rows[1][0].as_str(), rows[1][1].as_str()), ("c/state", "0"));
        let others = query(&url, &format!("SELECT (SELECT count(*) FROM {chunks}.messages) + (SELECT count(*) FROM {chunks}.state)")).await.expect("count");
        assert_eq!(others, vec![vec!["0".to_owned()]], "nothing elsewhere");
    });
    drop(child);
    // Messages: a State Protocol stream's changes are rows of their own.
    let msgs = common::pg::schema("sinkstart", "msgs");
    let _child =
        sink(&h, "c/*", &url, &msgs, &["--worker", "w", "--mode", "messages"], &h.dir.path().join("messages.log"));
    h.rt.block_on(async {
        wait_applied(&client, &url, &msgs, &streams, Duration::from_secs(20)).await;
        assert_eq!(messages(&url, &msgs, "c/json").await, ["0 {\"a\": 1}", "8 {\"a\": 2}"]);
        let state = messages(&url, &msgs, "c/state").await;
        assert!(state.len() == 1 && state[0].starts_with("0 {") && state[0].contains("\"insert\""), "{state:?}");
        let rows = query(&url, &format!("SELECT count(*) FROM {msgs}.state")).await.expect("count");
        assert_eq!(rows, vec![vec!["0".to_owned()]], "nothing in state");
    });
}

/// The `worker=` a sink's `sink started` line names.
fn worker_of(log: &Path) -> String {
    let t = text(log);
    let line = t.lines().find(|l| l.contains("sink started")).unwrap_or_else(|| panic!("no start line in:\n{t}"));
    line.split(' ').find_map(|f| f.strip_prefix("worker=")).unwrap_or_else(|| panic!("no worker in {line}")).to_owned()
}

#[test]
fn a_sink_restarted_without_worker_takes_its_claim_back_at_once_and_a_waiting_one_says_for_whom() {
    let h = Harness::start();
    let client = h.client();
    let url = database_url();
    let schema = common::pg::schema("sinkstart", "restart");
    let (log_a, log_b, log_c) = (h.dir.path().join("a.log"), h.dir.path().join("b.log"), h.dir.path().join("c.log"));
    let claims = |log: &Path| text(log).matches(" claimed ").count();
    h.rt.block_on(create(&client, "r/x", "application/json"));
    // The default lease, 30 s: a restart that waited for it would show.
    let mut a = sink(&h, "r/*", &url, &schema, &[], &log_a);
    h.rt.block_on(async {
        append(&client, "r/x", json!({ "m": 1 }).to_string()).await;
        wait_applied(&client, &url, &schema, &paths(&["r/x"]), Duration::from_secs(20)).await;
        // Hold the stream's position row, so the next batch waits inside its claim; then kill
        // the sink there: its claim stays held until its lease ends.
        let (cfg, tls) = oncelog_postgres::driver_config(&url).expect("URL");
        let (mut db, conn) = cfg.connect(tls).await.expect("connect");
        tokio::spawn(conn);
        let held = db.transaction().await.expect("begin");
        held.execute(&format!("SELECT 1 FROM {schema}.positions WHERE stream = 'r/x' FOR UPDATE"), &[])
            .await
            .expect("lock");
        let before = claims(&log_a);
        append(&client, "r/x", json!({ "m": 2 }).to_string()).await;
        let deadline = Instant::now() + Duration::from_secs(10);
        while claims(&log_a) <= before {
            assert!(Instant::now() < deadline, "no claim:\n{}", text(&log_a));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let _ = a.kill();
        let _ = a.wait();

        // Another worker waits for that claim, and says whose it is.
        let b = sink(&h, "r/*", &url, &schema, &["--worker", "other"], &log_b);
        wait_log(&log_b, "waiting for the claim", Duration::from_secs(10));
        let waiting = text(&log_b);
        assert!(waiting.contains(&format!("holder={}", worker_of(&log_a))), "the holder is named:\n{waiting}");
        drop(b);
        held.rollback().await.expect("rollback");
    });

    // Restarted without --worker: the same name, so the same claim, at once.
    let restarted = Instant::now();
    let _c = sink(&h, "r/*", &url, &schema, &[], &log_c);
    h.rt.block_on(async {
        wait_applied(&client, &url, &schema, &paths(&["r/x"]), Duration::from_secs(10)).await;
        // New data is served by a claim: the old wake, still live, is this worker's own.
        append(&client, "r/x", json!({ "m": 3 }).to_string()).await;
        wait_applied(&client, &url, &schema, &paths(&["r/x"]), Duration::from_secs(10)).await;
        assert_eq!(messages(&url, &schema, "r/x").await.len(), 3, "each message once");
    });
    let took = restarted.elapsed();
    assert_eq!(worker_of(&log_c), worker_of(&log_a), "the default name is the same after a restart");
    assert!(took < Duration::from_secs(10), "the restarted sink waited {took:?}");
    assert!(!text(&log_c).contains("waiting for the claim"), "it waited for its own claim:\n{}", text(&log_c));
}

/// `url` (a libpq URL, as the test database's) with another user and database.
fn login_as(url: &str, user: &str, database: &str) -> String {
    let (scheme, rest) = url.split_once("://").expect("a postgres:// URL");
    let (_, host_on) = rest.split_once('@').unwrap_or(("", rest));
    let (host_path, query) = host_on.split_once('?').map_or((host_on, None), |(a, b)| (a, Some(b)));
    let host = host_path.split_once('/').map_or(host_path, |(h, _)| h);
    format!("{scheme}://{user}@{host}/{database}{}", query.map(|q| format!("?{q}")).unwrap_or_default())
}

/// A loopback server that answers every PostgreSQL login with `28P01` (a wrong password), as
/// a server with password authentication does (the test cluster trusts every login).
fn refusing_server() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            loop {
                let mut len = [0u8; 4];
                if conn.read_exact(&mut len).is_err() {
                    break;
                }
                let mut body = vec![0u8; (u32::from_be_bytes(len) as usize).saturating_sub(4)];
                if conn.read_exact(&mut body).is_err() {
                    break;
                }
                // SSLRequest / GSSENCRequest: no.
                if body.len() == 4
                    && matches!(u32::from_be_bytes([body[0], body[1], body[2], body[3]]), 80877103 | 80877104)
                {
                    let _ = conn.write_all(b"N");
                    continue;
                }
                let mut fields = Vec::new();
                for (tag, value) in [
                    (b'S', "FATAL"),
                    (b'V', "FATAL"),
                    (b'C', "28P01"),
                    (b'M', "password authentication failed for user \"app\""),
                ] {
                    fields.push(tag);
                    fields.extend_from_slice(value.as_bytes());
                    fields.push(0);
                }
                fields.push(0);
                let mut msg = vec![b'E'];
                msg.extend_from_slice(&(fields.len() as u32 + 4).to_be_bytes());
                msg.extend_from_slice(&fields);
                let _ = conn.write_all(&msg);
                break;
            }
        }
    });
    port
}

#[test]
fn a_target_that_refuses_the_login_stops_the_sink_naming_why_and_one_that_is_away_is_waited_for() {
    let h = Harness::start();
    let url = database_url();
    let refusing = refusing_server();
    let closed = common::pg::free_port();
    let cases = [
        (
            "database",
            login_as(&url, "oncelog", "sink_no_such_database"),
            vec!["FATAL 3D000", "database \"sink_no_such_database\" does not exist"],
        ),
        (
            "role",
            login_as(&url, "sink_no_such_role", "postgres"),
            vec!["FATAL 28000", "role \"sink_no_such_role\" does not exist"],
        ),
        (
            "password",
            format!("postgres://app:wrong@127.0.0.1:{refusing}/shop?sslmode=disable"),
            vec!["FATAL 28P01", "password authentication failed for user \"app\""],
        ),
    ];
    for (what, target, words) in cases {
        let log = h.dir.path().join(format!("{what}.log"));
        let started = Instant::now();
        let mut child = sink(&h, "e/*", &target, "sinkstart_refused", &["--worker", "w"], &log);
        let code = wait_exit(&mut child, Duration::from_secs(10));
        let out = text(&log);
        assert_eq!(code, Some(1), "{what}: the sink exits with status 1 within seconds:\n{out}");
        assert!(started.elapsed() < Duration::from_secs(5), "{what}: it took {:?}", started.elapsed());
        for w in words {
            assert!(out.contains(w), "{what}: {w:?} is named:\n{out}");
        }
        assert!(out.contains("oncelog stopped"), "{what}:\n{out}");
    }
    // Away (nothing listens): the sink waits, saying why on every line.
    let log = h.dir.path().join("away.log");
    let mut child = sink(
        &h,
        "e/*",
        &format!("postgres://app@127.0.0.1:{closed}/shop?sslmode=disable"),
        "sinkstart_away",
        &["--worker", "w"],
        &log,
    );
    std::thread::sleep(Duration::from_secs(3));
    assert!(matches!(child.try_wait(), Ok(None)), "the sink waits for a target that is away:\n{}", text(&log));
    let out = text(&log);
    let retries: Vec<&str> = out.lines().filter(|l| l.contains("retrying")).collect();
    assert!(retries.len() >= 2, "it retries:\n{out}");
    assert!(retries.iter().all(|l| l.contains("Connection refused")), "every line says why:\n{out}");
}

/// The grants docs/SINKS.md gives a sink's token, for streams under `prefix` and subscription
/// `id`: (exact stream or prefix, path, operations).
fn sink_grants(prefix: &str, id: &str) -> Vec<(bool, String, Vec<&'static str>)> {
    vec![
        (false, prefix.to_owned(), vec!["read"]),
        (true, format!("sinks/{id}/wake"), vec!["create", "append", "read"]),
        (true, format!("__ds/subscriptions/{id}"), vec!["create", "read"]),
        (true, format!("__ds/subscriptions/{id}/claim"), vec!["append"]),
    ]
}

#[test]
fn the_documented_grants_are_all_a_sink_s_token_needs_and_each_is_needed() {
    use oncelog_server::auth::scope::{GrantClaim, ScopeClaim};
    use oncelog_server::auth::token::{issue, TokenAuth, TokenConfig};
    let secret = b"a-long-random-secret-for-the-sink-test".to_vec();
    let secret_file = tempfile::NamedTempFile::new().expect("secret file");
    std::fs::write(secret_file.path(), &secret).expect("secret");
    let auth =
        TokenAuth::load(TokenConfig { secret_file: Some(secret_file.path().to_owned()), ..TokenConfig::default() })
            .expect("keys");
    let h = Harness::start_with(auth);
    let url = database_url();
    let expires =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64) + 3600;
    let token = |grants: &[(bool, String, Vec<&'static str>)]| {
        let grants = grants
            .iter()
            .map(|(exact, path, ops)| GrantClaim {
                stream: exact.then(|| path.clone()),
                prefix: (!exact).then(|| path.clone()),
                ops: ops.iter().map(|o| (*o).to_owned()).collect(),
            })
            .collect();
        format!("Bearer {}", issue(&secret, ScopeClaim { grants }, expires, None, None, None).expect("token"))
    };
    let admin = Client::builder(&h.base)
        .default_header("authorization", &token(&[(false, String::new(), vec!["all"])]))
        .expect("header")
        .build()
        .expect("client");
    h.rt.block_on(async {
        create(&admin, "o/x", "application/json").await;
        append(&admin, "o/x", json!({ "before": 1 }).to_string()).await;
    });

    // Each grant's operations one at a time left out: the sink stops at once, refused (403).
    let all = sink_grants("o/", "sink-sinkstart_grants_less");
    for (i, (_, path, ops)) in all.iter().enumerate() {
        for op in ops {
            let mut less = all.clone();
            less[i].2.retain(|o| o != op);
            let log = h.dir.path().join(format!("less-{i}-{op}.log"));
            let mut child =
                sink(&h, "o/*", &url, "sinkstart_grants_less", &["--worker", "w", "--auth", &token(&less)], &log);
            let code = wait_exit(&mut child, Duration::from_secs(10));
            assert_eq!(code, Some(1), "without {op} on {path} the sink goes on:\n{}", text(&log));
            assert!(text(&log).contains("403"), "without {op} on {path}:\n{}", text(&log));
        }
    }

    // All of them: the sink applies what the stream held and what comes after.
    let schema = common::pg::schema("sinkstart", "grants");
    let log = h.dir.path().join("sink.log");
    let _child = sink(
        &h,
        "o/*",
        &url,
        &schema,
        &["--worker", "w", "--auth", &token(&sink_grants("o/", &format!("sink-{schema}")))],
        &log,
    );
    h.rt.block_on(async {
        wait_applied(&admin, &url, &schema, &paths(&["o/x"]), Duration::from_secs(20)).await;
        append(&admin, "o/x", json!({ "after": 2 }).to_string()).await;
        wait_applied(&admin, &url, &schema, &paths(&["o/x"]), Duration::from_secs(20)).await;
        assert_eq!(messages(&url, &schema, "o/x").await.len(), 2, "{}", text(&log));
    });
}

/// A target reached with `sslmode=prefer` (libpq's default) that offers no TLS gets a plaintext
/// connection: the sink says so, as `oncelog serve` does. Over the cluster's Unix socket no TLS is
/// offered. Needs `ONCELOG_TEST_POSTGRES_SOCKET_DIR` (the README's test command sets it).
#[test]
fn a_target_that_fell_back_to_plaintext_under_sslmode_prefer_is_warned_about() {
    let plaintext = common::pg::plaintext_socket_url();
    let h = Harness::start();
    let schema = common::pg::schema("sinkstart", "prefer");
    let log = h.dir.path().join("sink.log");
    let _child = sink(&h, "p/*", &plaintext, &schema, &["--worker", "w"], &log);
    wait_log(&log, "sslmode=prefer and the server offered no TLS", Duration::from_secs(15));
}
