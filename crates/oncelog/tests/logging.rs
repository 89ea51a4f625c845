//! The operator's log: `--log-format json` writes one JSON object per line, with an info line for
//! recovery, each compaction, each retention pass that dropped something and each backup, with
//! sizes and durations; `--log-level` hides what is below it, and `RUST_LOG` wins over it. The
//! real `oncelog` binary, on loopback.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{bin, run};
use serde_json::Value;

const LIMIT: Duration = Duration::from_secs(20);

/// `oncelog serve` as a child whose stderr is collected line by line.
struct Serve {
    child: Child,
    /// `http://127.0.0.1:PORT/v1/stream`
    base: String,
    stderr: Arc<Mutex<Vec<String>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Serve {
    /// Starts `oncelog serve` on `data_dir` with `args`, and `env` (the log settings of the
    /// environment removed first, so the test's own do not leak in).
    fn start(data_dir: &std::path::Path, args: &[&str], env: &[(&str, &str)]) -> Serve {
        let mut cmd = bin();
        cmd.env_remove("RUST_LOG").env_remove("ONCELOG_LOG_LEVEL").env_remove("ONCELOG_LOG_FORMAT");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd
            .args(["serve", "--addr", "127.0.0.1:0", "--data-dir"])
            .arg(data_dir)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn oncelog serve");
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let lines = stderr.clone();
        let err = child.stderr.take().expect("stderr");
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                lines.lock().expect("lines").push(line);
            }
        });
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("the address line");
        let url = line
            .trim()
            .strip_prefix("oncelog listening on ")
            .unwrap_or_else(|| panic!("unexpected line {line:?}"))
            .to_owned();
        Serve { child, base: format!("{url}/v1/stream"), stderr, reader: Some(reader) }
    }

    /// Runs the client subcommand `args` against this server with `stdin`.
    fn client(&self, args: &[&str], stdin: &[u8]) {
        let mut c = bin();
        c.args(args).args(["--url", &self.base]);
        let out = run(c, stdin, LIMIT);
        assert!(out.ok, "{args:?}: {}", out.stderr);
    }

    /// Waits until a line of stderr satisfies `found`.
    fn wait_for(&self, what: &str, found: impl Fn(&str) -> bool) {
        let deadline = Instant::now() + LIMIT;
        while Instant::now() < deadline {
            if self.stderr.lock().expect("lines").iter().any(|l| found(l)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("no {what} line within {LIMIT:?}: {:#?}", self.stderr.lock().expect("lines"));
    }

    /// SIGTERM, then everything it wrote on stderr.
    fn stop(mut self) -> Vec<String> {
        let status =
            std::process::Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status().expect("kill");
        assert!(status.success());
        let exit = self.child.wait().expect("wait");
        assert!(exit.success(), "{exit:?}");
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        let lines = self.stderr.lock().expect("lines").clone();
        lines
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every line as JSON (each must parse), with the fields every event has.
fn json_lines(lines: &[String]) -> Vec<Value> {
    lines
        .iter()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"));
            for key in ["timestamp", "level", "message", "target"] {
                assert!(v.get(key).is_some(), "no {key}: {l}");
            }
            v
        })
        .collect()
}

/// The first event with this message.
fn event<'a>(events: &'a [Value], message: &str) -> &'a Value {
    events.iter().find(|v| v["message"] == message).unwrap_or_else(|| panic!("no {message:?} event in {events:#?}"))
}

fn number(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or_else(|| panic!("{key} is not a number in {v}"))
}

#[test]
fn serve_and_backup_log_json_lines_with_sizes_and_durations() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let args = [
        "--log-format",
        "json",
        "--sweep-interval-ms",
        "100",
        "--compaction-min-bytes",
        "1K",
        "--retention-max-bytes",
        "1K",
    ];
    let server = Serve::start(&data, &args, &[]);
    // A State Protocol stream past the compaction threshold: 40 changes to two entities.
    server.client(&["create", "todos", "--json", "--compaction", "state"], b"");
    let changes: String = (0..40)
        .map(|i| {
            format!(
                "{{\"type\":\"todo\",\"key\":\"{}\",\"value\":\"v{i}\",\"headers\":{{\"operation\":\"upsert\"}}}}\n",
                i % 2
            )
        })
        .collect();
    server.client(&["append", "todos"], changes.as_bytes());
    // A stream with the default retention (keep 1 KiB): three appends of 1000 bytes (one line
    // each, so one append each).
    server.client(&["create", "logs"], b"");
    for i in 0..3 {
        server.client(&["append", "logs"], format!("{i:0999}\n").as_bytes());
    }
    server.wait_for("compaction", |l| l.contains("\"compacted\""));
    server.wait_for("retention", |l| l.contains("\"retention pass\""));
    let events = json_lines(&server.stop());

    let recovered = event(&events, "recovered");
    assert_eq!(recovered["level"], "INFO");
    for key in ["streams", "segments_replayed", "frames_replayed", "torn_bytes_cut", "elapsed_ms"] {
        number(recovered, key);
    }
    let compacted = event(&events, "compacted");
    assert_eq!(
        (compacted["stream"].as_str(), compacted["trigger"].as_str()),
        (Some("todos"), Some("background")),
        "{compacted}"
    );
    assert!(number(compacted, "history_bytes") > number(compacted, "snapshot_bytes"), "{compacted}");
    assert_eq!(number(compacted, "entities"), 2, "{compacted}");
    number(compacted, "elapsed_ms");
    let retained = event(&events, "retention pass");
    assert_eq!(number(retained, "streams"), 1, "{retained}");
    // 3000 bytes, keep at least 1024: only the first append can go.
    assert_eq!(number(retained, "bytes_dropped"), 1000, "{retained}");
    number(retained, "elapsed_ms");
    event(&events, "all writes synced; bye");
    // One line per recovery: the engine's own report is debug, not a second info line.
    assert_eq!(
        events.iter().filter(|v| v["message"].as_str().is_some_and(|m| m.contains("recovered"))).count(),
        1,
        "{events:#?}"
    );

    let mut backup = bin();
    backup
        .env_remove("RUST_LOG")
        .args(["backup", "--log-format", "json", "--data-dir"])
        .arg(&data)
        .arg("--to")
        .arg(dir.path().join("copy"));
    let out = run(backup, b"", LIMIT);
    assert!(out.ok && out.stdout.starts_with("backed up"), "{} {}", out.stdout, out.stderr);
    let events = json_lines(&out.stderr.lines().map(str::to_owned).collect::<Vec<_>>());
    let done = event(&events, "backup done");
    assert!(number(done, "bytes") > 0 && number(done, "files") >= 1, "{done}");
    number(done, "elapsed_ms");
}

#[test]
fn log_level_hides_what_is_below_it_and_rust_log_wins() {
    let dir = tempfile::tempdir().expect("tempdir");
    let info_lines = |lines: &[String]| {
        lines.iter().filter(|l| l.contains(" INFO ") || l.contains("\"INFO\"")).cloned().collect::<Vec<_>>()
    };
    // Default: info, as text (not JSON).
    let lines = Serve::start(&dir.path().join("a"), &[], &[]).stop();
    assert!(lines.iter().any(|l| l.contains(" INFO ") && l.contains("recovered")), "{lines:#?}");
    assert!(lines.iter().all(|l| serde_json::from_str::<Value>(l).is_err()), "{lines:#?}");
    // --log-level warn, and the same from the environment: no info line.
    let lines = Serve::start(&dir.path().join("b"), &["--log-level", "warn"], &[]).stop();
    assert_eq!(info_lines(&lines), Vec::<String>::new());
    let lines = Serve::start(&dir.path().join("c"), &["--log-format", "json"], &[("ONCELOG_LOG_LEVEL", "warn")]).stop();
    assert_eq!(info_lines(&lines), Vec::<String>::new());
    // RUST_LOG, when set, wins over --log-level.
    let lines = Serve::start(&dir.path().join("d"), &["--log-level", "warn"], &[("RUST_LOG", "info")]).stop();
    assert!(lines.iter().any(|l| l.contains(" INFO ") && l.contains("recovered")), "{lines:#?}");
    // A RUST_LOG that does not parse is set aside, with a warning; --log-level applies.
    let lines = Serve::start(&dir.path().join("e"), &["--log-level", "warn"], &[("RUST_LOG", "oncelog=loud")]).stop();
    assert!(lines.iter().any(|l| l.contains("WARN") && l.contains("RUST_LOG ignored")), "{lines:#?}");
    assert_eq!(info_lines(&lines), Vec::<String>::new());
    // A clean stop warns about nothing (the subscription dispatcher's pass that met the engine
    // shutting down used to).
    let lines = Serve::start(&dir.path().join("f"), &["--log-level", "warn"], &[]).stop();
    assert_eq!(lines, Vec::<String>::new());
    // The sink takes the same flags.
    let mut help = bin();
    help.args(["sink", "postgres", "--help"]);
    let out = run(help, b"", LIMIT);
    assert!(out.stdout.contains("--log-level") && out.stdout.contains("--log-format"), "{}", out.stdout);
}

#[test]
fn postgres_logs_its_schema_version_and_migrations_at_start() {
    let url = std::env::var("ONCELOG_TEST_POSTGRES_URL").expect("ONCELOG_TEST_POSTGRES_URL (./scripts/test sets it)");
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    let schema = format!("logging_{}_{nanos}", std::process::id());
    let dir = tempfile::tempdir().expect("tempdir");
    let args = ["--storage", url.as_str(), "--pg-schema", schema.as_str(), "--log-format", "json"];
    // A new schema: every migration applied, each timed, then one line with the versions.
    let events = json_lines(&Serve::start(dir.path(), &args, &[]).stop());
    let ready = event(&events, "PostgreSQL schema ready");
    assert_eq!(
        (number(ready, "found_version"), number(ready, "migrations_applied")),
        (0, number(ready, "version")),
        "{ready}"
    );
    number(ready, "elapsed_ms");
    let migrations: Vec<&Value> = events.iter().filter(|v| v["message"] == "applied PostgreSQL migration").collect();
    assert_eq!(migrations.len() as u64, number(ready, "version"));
    assert!(migrations.iter().all(|m| m["elapsed_ms"].is_u64()), "{migrations:?}");
    number(event(&events, "PostgreSQL engine open"), "elapsed_ms");
    // Started again: found at the current version, nothing applied.
    let events = json_lines(&Serve::start(dir.path(), &args, &[]).stop());
    let ready = event(&events, "PostgreSQL schema ready");
    assert_eq!(
        (number(ready, "found_version"), number(ready, "migrations_applied")),
        (number(ready, "version"), 0),
        "{ready}"
    );
    assert!(events.iter().all(|v| v["message"] != "applied PostgreSQL migration"));
}

/// The request log: with `--access-log`, one line per stream request at info when its answer
/// ends (a live read's when it ends), with method, path, status, bytes, duration, the producer's
/// id / epoch / seq and a refusal's reason; never a signature or a token. Without the flag the
/// lines are at debug: none at info.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_request_log_has_a_line_per_request_and_no_secret() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = Serve::start(&dir.path().join("data"), &["--log-format", "json", "--access-log"], &[]);
    let http = reqwest::Client::new();
    let url = format!("{}/logged", s.base);
    let r = http.put(&url).header("content-type", "text/plain").send().await.expect("create");
    assert_eq!(r.status(), 201);
    let r = http
        .post(&url)
        .header("content-type", "text/plain")
        .header("producer-id", "writer-7")
        .header("producer-epoch", "3")
        .header("producer-seq", "0")
        .header("authorization", "Bearer secret-token-value")
        .body("hello")
        .send()
        .await
        .expect("append");
    assert_eq!(r.status(), 200);
    let r = http.post(&url).header("content-type", "application/json").body("[1]").send().await.expect("append");
    assert_eq!(r.status(), 409);
    let r = http.get(format!("{url}?offset=-1&sig=c2lnbmF0dXJl&expires=9")).send().await.expect("read");
    assert_eq!(r.text().await.expect("body"), "hello");
    // A long-poll that ends by its timeout... without waiting 20 s: one that finds data at once.
    let r = http.get(format!("{url}?offset=-1&live=long-poll")).send().await.expect("long-poll");
    assert_eq!(r.text().await.expect("body"), "hello");
    s.wait_for("long-poll request", |l| l.contains("live=long-poll") && l.contains("\"request\""));
    let lines = s.stop();
    assert!(lines.iter().all(|l| !l.contains("secret-token-value") && !l.contains("c2lnbmF0dXJl")), "{lines:#?}");
    let events = json_lines(&lines);
    let requests: Vec<&Value> = events.iter().filter(|v| v["message"] == "request").collect();
    assert_eq!(requests.len(), 5, "{requests:#?}");
    for r in &requests {
        assert_eq!(r["level"], "INFO", "{r}");
        for key in ["method", "path", "status", "bytes", "duration_ms"] {
            assert!(r.get(key).is_some(), "no {key} in {r}");
        }
    }
    let append = requests.iter().find(|r| r["producer_id"] == "writer-7").expect("the producer's append");
    assert_eq!((append["method"].as_str(), append["status"].as_u64()), (Some("POST"), Some(200)));
    assert_eq!((append["producer_epoch"].as_str(), append["producer_seq"].as_str()), (Some("3"), Some("0")));
    let refused = requests.iter().find(|r| r["status"] == 409).expect("the 409");
    assert!(refused["reason"].as_str().is_some_and(|r| r.contains("content type")), "{refused}");
    let read = requests.iter().find(|r| r["path"].as_str().is_some_and(|p| p.contains("sig="))).expect("the read");
    assert!(read["path"].as_str().is_some_and(|p| p.contains("sig=***")), "{read}");
    assert_eq!(number(read, "bytes"), 5, "{read}");

    // Without --access-log: nothing per request at info.
    let dir = tempfile::tempdir().expect("tempdir");
    let s = Serve::start(&dir.path().join("data"), &["--log-format", "json"], &[]);
    let r = http.put(format!("{}/quiet", s.base)).send().await.expect("create");
    assert_eq!(r.status(), 201);
    let lines = s.stop();
    assert!(json_lines(&lines).iter().all(|v| v["message"] != "request"), "{lines:#?}");
}
