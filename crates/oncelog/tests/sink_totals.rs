//! The sink guarantee with a side effect that is **not idempotent**: a custom sink adds each
//! message's `n` to its stream's total (`UPDATE totals SET sum = sum + n`), so any batch applied
//! twice shows as a total too high, any batch lost as one too low.
//!
//! - `totals_stay_exact_…`: the sink process is SIGKILLed 50 times at random moments while
//!   writers append, and its PostgreSQL (a private cluster) is crashed and restarted once; at the
//!   end every total is exactly the sum of its stream.
//! - `a_paused_worker_…`: two workers; the one holding the claim is frozen (SIGSTOP) past its
//!   lease until the other has taken its streams over, then thawed (SIGCONT), four times;
//!   nothing is applied twice.
//!
//! The sink runs in a child process so it can be killed and frozen: this test binary itself,
//! started again with `totals_sink_child` as the only test to run and the child's settings in
//! the environment (`ONCELOG_SINK_CHILD`). A test binary of its own would need a `[[bin]]` in the
//! package; the `oncelog` binary has only the built-in PostgreSQL sink, and the point here is a
//! custom one. In a normal run `totals_sink_child` finds no settings and returns at once.

mod common;
mod sink_support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::pg::{database_url, Cluster};
use common::Harness;
use oncelog_client::{CreateOptions, StreamOffset};
use oncelog_sink::{ApplyError, Batch, Sink, SinkOptions, StreamRef, Target, Worker};
use sink_support::{wait_applied, Lcg, Reaped, Writers};
use tokio_postgres::Transaction;

/// The custom sink: the batch's `n`s added to its stream's total; `delay` spent inside the
/// transaction first (the zombie test's workers take long enough over each batch that a freeze
/// often catches one mid-batch, where a zombie could do harm).
struct Totals {
    delay: Duration,
}

impl Sink for Totals {
    async fn prepare(&self, tx: &Transaction<'_>, schema: &str) -> Result<(), ApplyError> {
        tx.batch_execute(&format!("CREATE TABLE IF NOT EXISTS {schema}.totals (stream text PRIMARY KEY, sum bigint NOT NULL, messages bigint NOT NULL)")).await?;
        Ok(())
    }

    async fn apply(
        &self,
        tx: &Transaction<'_>,
        stream: &StreamRef,
        batch: &Batch<'_>,
        _next: &StreamOffset,
    ) -> Result<u64, ApplyError> {
        let Batch::Messages(messages) = batch else { return Ok(0) };
        tokio::time::sleep(self.delay).await;
        let mut n = 0i64;
        for m in messages {
            let v: serde_json::Value = serde_json::from_str(m.json.get()).map_err(|e| ApplyError::Other(e.into()))?;
            n += v["n"].as_i64().unwrap_or(0);
        }
        let count = messages.len() as i64;
        tx.execute("INSERT INTO totals VALUES ($1, 0, 0) ON CONFLICT DO NOTHING", &[&stream.path]).await?;
        tx.execute(
            "UPDATE totals SET sum = sum + $2, messages = messages + $3 WHERE stream = $1",
            &[&stream.path, &n, &count],
        )
        .await?;
        Ok(messages.len() as u64)
    }
}

/// The child: runs a `Totals` worker with the settings in `ONCELOG_SINK_CHILD` (base URL, target
/// URL, schema, worker name, lease in ms, delay per batch in ms; tab-separated) until killed.
#[test]
fn totals_sink_child() {
    let Ok(settings) = std::env::var("ONCELOG_SINK_CHILD") else { return };
    let parts: Vec<&str> = settings.split('\t').collect();
    let [base, target, schema, worker, lease_ms, delay_ms] = parts[..] else { panic!("bad settings {settings:?}") };
    tracing_subscriber::fmt()
        .with_env_filter("oncelog_sink=debug")
        .with_ansi(false)
        .with_writer(std::io::stderr)
        .init();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let client = oncelog_client::Client::new(base).expect("client");
    let target = Target::new(target, schema, Duration::from_secs(10)).expect("target");
    let mut opts = SinkOptions::new(format!("totals-{schema}"), "totals/*", format!("wake-{schema}"), worker);
    opts.lease_ttl = Duration::from_millis(lease_ms.parse().expect("lease"));
    let err = rt.block_on(
        Worker::new(client, target, Totals { delay: Duration::from_millis(delay_ms.parse().expect("delay")) }, opts)
            .run(),
    );
    eprintln!("sink child stopped: {err:?}");
    std::process::exit(1);
}

fn spawn_child(
    base: &str,
    target: &str,
    schema: &str,
    worker: &str,
    lease_ms: u64,
    delay_ms: u64,
    log: &Path,
) -> Reaped {
    let log = std::fs::OpenOptions::new().create(true).append(true).open(log).expect("child log");
    Command::new(std::env::current_exe().expect("test binary"))
        .args(["totals_sink_child", "--exact", "--nocapture", "--test-threads", "1"])
        .env(
            "ONCELOG_SINK_CHILD",
            [base, target, schema, worker, &lease_ms.to_string(), &delay_ms.to_string()].join("\t"),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .map(Reaped)
        .expect("start the sink child")
}

/// SIGSTOP / SIGCONT to a child this test started (by its PID).
fn signal(child: &Child, signal: &str) {
    let status = Command::new("kill").args([&format!("-{signal}"), &child.id().to_string()]).status().expect("kill");
    assert!(status.success(), "kill -{signal}");
}

/// Every stream's (messages, sum) in the target against what the writers sent.
async fn check_totals(url: &str, schema: &str, sent: &[(String, u64, u64)]) {
    let rows = sink_support::query(url, &format!("SELECT stream, messages, sum FROM {schema}.totals ORDER BY stream"))
        .await
        .expect("totals");
    let got: Vec<(String, u64, u64)> =
        rows.iter().map(|r| (r[0].clone(), r[1].parse().unwrap_or(0), r[2].parse().unwrap_or(0))).collect();
    let mut want = sent.to_vec();
    want.sort();
    let wrong: Vec<String> = got
        .iter()
        .zip(&want)
        .filter(|(g, w)| g != w)
        .map(|(g, w)| format!("{}: {} messages applied, {} sent (sum {} vs {})", g.0, g.1, w.1, g.2, w.2))
        .collect();
    assert!(
        got.len() == want.len() && wrong.is_empty(),
        "totals differ from what was sent: {wrong:?} (all: {got:?} vs {want:?})"
    );
}

fn streams(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}/{i}")).collect()
}

#[test]
fn totals_stay_exact_while_the_sink_is_killed_50_times_and_the_database_restarts() {
    let started = std::time::Instant::now();
    // A cluster of this test's own: it is crashed and restarted below.
    let cluster = Cluster::start();
    let h = Harness::start();
    let client = h.client();
    let names = streams("totals", 4);
    let schema = "sink_kill";
    let log = h.dir.path().join("sink.log");
    h.rt.block_on(async {
        for s in &names {
            client.stream(s).create(CreateOptions::content_type("application/json")).await.expect("create");
        }
    });
    let writers = h.rt.block_on(async { Writers::start(&client, &names, Duration::from_millis(5)) });
    let mut rng = Lcg(0x51_4b);
    for i in 0..50 {
        // One worker name throughout: a restarted worker takes its claim back at once, as a
        // restarted process would.
        let mut child = spawn_child(&h.base, &cluster.url, schema, "w", 2_000, 0, &log);
        std::thread::sleep(Duration::from_millis(150 + rng.next(550)));
        if i == 25 {
            // The database goes down like a power cut under the running sink, and comes back.
            cluster.crash();
            cluster.restart();
            std::thread::sleep(Duration::from_millis(300 + rng.next(400)));
        }
        let _ = child.kill(); // SIGKILL, by PID
        let _ = child.wait();
    }
    let sent = h.rt.block_on(writers.stop());
    let mut child = spawn_child(&h.base, &cluster.url, schema, "w", 2_000, 0, &log);
    let drained = h.rt.block_on(wait_applied(&client, &cluster.url, schema, &names, Duration::from_secs(60)));
    let _ = child.kill();
    let _ = child.wait();
    h.rt.block_on(check_totals(&cluster.url, schema, &sent));
    let messages: u64 = sent.iter().map(|s| s.1).sum();
    eprintln!("{messages} messages over {} streams exact after 50 kills and a database restart; drained in {drained:?}; {:?} in all", names.len(), started.elapsed());
}

/// The generation and worker of the last claim any worker logged.
fn last_claim(logs: &[(&str, &Path)]) -> Option<(u64, String)> {
    let mut best: Option<(u64, String)> = None;
    for (name, log) in logs {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        for line in text.lines().filter(|l| l.contains(" claimed ")) {
            let g =
                line.split("generation=").nth(1).and_then(|r| r.split_whitespace().next()).and_then(|g| g.parse().ok());
            if let Some(g) = g {
                if best.as_ref().is_none_or(|(b, _)| g > *b) {
                    best = Some((g, name.to_string()));
                }
            }
        }
    }
    best
}

#[test]
fn a_paused_worker_whose_claim_passed_on_applies_nothing_twice() {
    let started = std::time::Instant::now();
    let url = database_url();
    let h = Harness::start();
    let client = h.client();
    let names = streams("totals", 3);
    let schema = common::pg::schema("sink", "zombie");
    h.rt.block_on(async {
        for s in &names {
            client.stream(s).create(CreateOptions::content_type("application/json")).await.expect("create");
        }
    });
    let writers = h.rt.block_on(async { Writers::start(&client, &names, Duration::from_millis(2)) });
    let (log_a, log_b) = (h.dir.path().join("a.log"), h.dir.path().join("b.log"));
    let mut workers = [
        spawn_child(&h.base, &url, &schema, "a", 1_000, 20, &log_a),
        spawn_child(&h.base, &url, &schema, "b", 1_000, 20, &log_b),
    ];
    let logs = [("a", log_a.as_path()), ("b", log_b.as_path())];
    let mut takeovers = 0;
    for _ in 0..4 {
        std::thread::sleep(Duration::from_millis(1_000));
        let Some((generation, holder)) = last_claim(&logs) else { continue };
        let i = usize::from(holder == "b");
        // Frozen past its 1 s lease until the other worker has claimed (and worked a little),
        // so the frozen one comes back a zombie, often with a batch read from a position that
        // has moved on. (Frozen inside a transaction, it holds its stream's position row: the
        // other's batch of that stream waits until the zombie commits after the thaw, then finds
        // the position moved — or until PostgreSQL ends the idle transaction, after 6 s here.)
        signal(&workers[i], "STOP");
        let frozen = std::time::Instant::now();
        while frozen.elapsed() < Duration::from_secs(10) {
            if last_claim(&logs).is_some_and(|(g, w)| g > generation && w != holder) {
                takeovers += 1;
                std::thread::sleep(Duration::from_millis(500));
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        signal(&workers[i], "CONT");
    }
    std::thread::sleep(Duration::from_millis(1_000));
    let sent = h.rt.block_on(writers.stop());
    let drained = h.rt.block_on(wait_applied(&client, &url, &schema, &names, Duration::from_secs(60)));
    for w in &mut workers {
        let _ = w.kill();
        let _ = w.wait();
    }
    h.rt.block_on(check_totals(&url, &schema, &sent));
    let claims = |p: &Path| {
        std::fs::read_to_string(p)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("claim"))
            .map(|l| l.chars().take(140).collect::<String>())
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert!(
        takeovers >= 3,
        "the other worker took over in only {takeovers} of 4 freezes\na:\n{}\nb:\n{}",
        claims(&log_a),
        claims(&log_b)
    );
    let text = format!(
        "{}{}",
        std::fs::read_to_string(&log_a).unwrap_or_default(),
        std::fs::read_to_string(&log_b).unwrap_or_default()
    );
    let (fenced, moved) = (text.matches("passed to another worker").count(), text.matches("position moved").count());
    eprintln!("{takeovers} takeovers, {fenced} zombies fenced at their ack, {moved} batches refused by the compare-and-set; drained in {drained:?}; {:?} in all", started.elapsed());
}
