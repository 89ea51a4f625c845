//! Two `oncelog serve` processes over one PostgreSQL database: exactly-once across nodes while
//! one node is SIGKILLed and restarted, and while the database itself crashes and comes back.
//!
//! Load in both scenarios: [`PRODUCERS`] idempotent producers on one stream, each with
//! [`IN_FLIGHT`] requests in flight; request `seq` of producer `i` goes to node `(i + seq) % 2`
//! and every retry of it (same epoch, seq and body) to the other node in turn, until it is
//! acknowledged (200, or 204 for a duplicate). Readers (SSE and long-poll, through the client
//! library with unlimited retries) tail the stream through one node. At the end the stream is
//! closed and:
//! - every acknowledged `(producer, seq)` is in the stream exactly once, and nothing else is
//!   (no record twice), in sequence order per producer;
//! - every reader saw exactly the final stream's bytes.
//!
//! Needs `ONCELOG_TEST_POSTGRES_URL` (see crates/postgres/tests/common); the database-restart
//! scenario starts its own cluster with `scripts/postgres`, so the shared one is never crashed.
//! Unix only (signals). The two scenarios hold one lock: the machine has two cores.

#![cfg(unix)]

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use oncelog_client::{LiveMode, ReadFrom, ReadOptions, RetryPolicy};
use reqwest::StatusCode;

const STREAM: &str = "two-nodes";
const PRODUCERS: usize = 8;
const IN_FLIGHT: usize = 4;
const STARTUP: Duration = Duration::from_secs(60);

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn database_url() -> String {
    std::env::var("ONCELOG_TEST_POSTGRES_URL").unwrap_or_else(|_| {
        panic!("the two-node tests need PostgreSQL: ONCELOG_TEST_POSTGRES_URL (./scripts/test starts a private cluster and sets it)")
    })
}

fn scripts_postgres() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/postgres")
}

/// A schema of its own per run.
fn schema(tag: &str) -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    format!("two_nodes_{tag}_{}_{nanos}", std::process::id())
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

/// One `oncelog serve` child on a fixed port (kept across restarts, so clients keep its URL).
/// Dropping it kills the child.
struct Node {
    child: Option<Child>,
    port: u16,
    db: String,
    schema: String,
    log: PathBuf,
    starts: usize,
}

impl Node {
    fn start(db: &str, schema: &str, log: PathBuf) -> Node {
        let mut n = Node { child: None, port: free_port(), db: db.to_owned(), schema: schema.to_owned(), log, starts: 0 };
        n.launch();
        n
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn launch(&mut self) {
        self.starts += 1;
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log).expect("log file");
        let mut child = Command::new(env!("CARGO_BIN_EXE_oncelog"))
            .args(["serve", "--addr", &format!("127.0.0.1:{}", self.port), "--long-poll-timeout-ms", "1000"])
            .args(["--storage", &self.db, "--pg-schema", &self.schema, "--pg-pool-size", "8"])
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("spawn oncelog");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(stdout);
            let mut line = String::new();
            if r.read_line(&mut line).unwrap_or(0) > 0 {
                let _ = tx.send(line);
            }
            let _ = std::io::copy(&mut r, &mut std::io::sink());
        });
        self.child = Some(child);
        match rx.recv_timeout(STARTUP) {
            Ok(line) => assert!(line.starts_with("oncelog listening on"), "{line}"),
            Err(_) => panic!("node start #{} did not come up; log:\n{}", self.starts, std::fs::read_to_string(&self.log).unwrap_or_default()),
        }
    }

    fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill(); // SIGKILL
            let _ = c.wait();
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A private cluster for the database-restart scenario, stopped on drop.
struct Cluster {
    dir: tempfile::TempDir,
    url: String,
}

impl Cluster {
    fn start() -> Cluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let url = Cluster::run(dir.path(), "start");
        Cluster { dir, url }
    }

    fn run(dir: &Path, cmd: &str) -> String {
        let out = Command::new("bash").arg(scripts_postgres()).arg(cmd).arg(dir).output().expect("scripts/postgres");
        assert!(out.status.success(), "scripts/postgres {cmd}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new("bash").arg(scripts_postgres()).arg("stop").arg(self.dir.path()).output();
    }
}

/// What the load saw.
#[derive(Default)]
struct Tally {
    /// `(producer, seq)` acknowledged.
    acked: BTreeSet<(usize, u64)>,
    retries: u64,
    gaps: u64,
    unavailable: u64,
    /// Answers that must never happen (a 500, a 4xx other than a gap): status and body.
    wrong: Vec<String>,
}

fn record(i: usize, seq: u64) -> String {
    format!("p{i}:{seq};")
}

/// Sends request `seq` of producer `i` until it is acknowledged (or `give_up` passes).
async fn send_until_acked(http: reqwest::Client, urls: Arc<Vec<String>>, i: usize, seq: u64, tally: Arc<Mutex<Tally>>, give_up: Instant) {
    let mut attempt = 0usize;
    while Instant::now() < give_up {
        let url = &urls[(i + seq as usize + attempt) % urls.len()];
        let req = http
            .post(format!("{url}/v1/stream/{STREAM}"))
            .header("content-type", "text/plain")
            .header("producer-id", format!("p{i}"))
            .header("producer-epoch", "0")
            .header("producer-seq", seq.to_string())
            .body(record(i, seq))
            .timeout(Duration::from_secs(10));
        let retry_after = match req.send().await {
            Ok(r) if r.status() == StatusCode::OK || r.status() == StatusCode::NO_CONTENT => {
                tally.lock().expect("tally").acked.insert((i, seq));
                return;
            }
            // Its predecessor was lost with a node, or is still on its way: retried below.
            Ok(r) if r.status() == StatusCode::CONFLICT => {
                tally.lock().expect("tally").gaps += 1;
                Duration::from_millis(30)
            }
            Ok(r) if r.status() == StatusCode::SERVICE_UNAVAILABLE => {
                tally.lock().expect("tally").unavailable += 1;
                Duration::from_millis(100)
            }
            Ok(r) => {
                let status = r.status();
                let body = r.text().await.unwrap_or_default();
                tally.lock().expect("tally").wrong.push(format!("{status} {body}"));
                Duration::from_millis(100)
            }
            // The node is down (killed, restarting): the other one takes the retry.
            Err(_) => Duration::from_millis(50),
        };
        tally.lock().expect("tally").retries += 1;
        attempt += 1;
        tokio::time::sleep(retry_after).await;
    }
}

/// Producer `i`: sequence numbers in order, [`IN_FLIGHT`] at a time, until `stop`.
async fn producer(i: usize, urls: Arc<Vec<String>>, stop: Arc<AtomicBool>, tally: Arc<Mutex<Tally>>, give_up: Instant) {
    let http = reqwest::Client::new();
    let window = Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT));
    let mut tasks = tokio::task::JoinSet::new();
    let mut seq = 0u64;
    // Ends at `stop`, or at `give_up` (then unacknowledged requests fail the test).
    while !stop.load(Ordering::Relaxed) && Instant::now() < give_up {
        while tasks.try_join_next().is_some() {}
        let permit = window.clone().acquire_owned().await.expect("semaphore");
        let (http, urls, tally) = (http.clone(), urls.clone(), tally.clone());
        tasks.spawn(async move {
            send_until_acked(http, urls, i, seq, tally, give_up).await;
            drop(permit);
        });
        seq += 1;
    }
    while tasks.join_next().await.is_some() {}
}

/// A reader tailing the stream through `base` until EOF; returns every byte it got.
async fn reader(base: String, live: LiveMode) -> Vec<u8> {
    let client = oncelog_client::Client::new(format!("{base}/v1/stream")).expect("client");
    let retry = RetryPolicy::default().with_max_attempts(None).expect("policy");
    let opts = ReadOptions { retry: Some(retry), ..ReadOptions::new(ReadFrom::Beginning, live) };
    let mut chunks = Box::pin(client.stream(STREAM).read(opts));
    let mut out = Vec::new();
    while let Some(c) = chunks.next().await {
        let c = c.expect("reader error");
        out.extend_from_slice(&c.data);
        if c.closed {
            break;
        }
    }
    out
}

/// Checks the final stream against what was acknowledged; returns how many records it holds.
fn check_stream(bytes: &[u8], tally: &Tally) -> usize {
    let text = std::str::from_utf8(bytes).expect("utf-8 records");
    let mut seen: BTreeMap<(usize, u64), usize> = BTreeMap::new();
    let mut last: BTreeMap<usize, u64> = BTreeMap::new();
    for rec in text.split_terminator(';') {
        let (p, seq) = rec.strip_prefix('p').and_then(|r| r.split_once(':')).expect("a record");
        let (p, seq): (usize, u64) = (p.parse().expect("producer"), seq.parse().expect("seq"));
        *seen.entry((p, seq)).or_default() += 1;
        if let Some(prev) = last.insert(p, seq) {
            assert!(seq > prev, "producer {p}: seq {seq} after {prev}: out of order");
        }
    }
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "records written more than once: {twice:?}");
    let missing: Vec<_> = tally.acked.iter().filter(|k| !seen.contains_key(k)).collect();
    assert!(missing.is_empty(), "acknowledged but not in the stream: {missing:?}");
    seen.len()
}

async fn create_stream(base: &str) {
    let r = reqwest::Client::new()
        .put(format!("{base}/v1/stream/{STREAM}"))
        .header("content-type", "text/plain")
        .send()
        .await
        .expect("create");
    assert!(r.status().is_success(), "create: {}", r.status());
}

/// Closes the stream (retrying through an outage), then reads it whole through `base`.
async fn close_and_read(base: &str) -> Vec<u8> {
    let http = reqwest::Client::new();
    for _ in 0..100 {
        let r = http.post(format!("{base}/v1/stream/{STREAM}")).header("stream-closed", "true").send().await;
        if r.is_ok_and(|r| r.status().is_success()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    reader(base.to_owned(), LiveMode::CatchUp).await
}

async fn readyz(base: &str) -> Option<StatusCode> {
    reqwest::Client::new().get(format!("{base}/readyz")).timeout(Duration::from_secs(2)).send().await.ok().map(|r| r.status())
}

/// Runs the load for `run`, calling `disturb` meanwhile; then drains, closes, and checks.
async fn scenario<F, Fut>(urls: Vec<String>, reader_base: String, run: Duration, disturb: F) -> (Tally, usize)
where
    F: FnOnce(Arc<AtomicBool>) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    create_stream(&urls[0]).await;
    let urls = Arc::new(urls);
    let tally = Arc::new(Mutex::new(Tally::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let give_up = Instant::now() + run + Duration::from_secs(90);
    let readers: Vec<_> = [LiveMode::Sse, LiveMode::Sse, LiveMode::Sse, LiveMode::LongPoll, LiveMode::LongPoll]
        .into_iter()
        .map(|m| tokio::spawn(reader(reader_base.clone(), m)))
        .collect();
    let producers: Vec<_> = (0..PRODUCERS).map(|i| tokio::spawn(producer(i, urls.clone(), stop.clone(), tally.clone(), give_up))).collect();
    let disturbing = disturb(stop.clone());
    let timer = async {
        tokio::time::sleep(run).await;
    };
    tokio::join!(disturbing, timer);
    stop.store(true, Ordering::Relaxed);
    for p in producers {
        p.await.expect("producer");
    }
    let tally = Arc::try_unwrap(tally).ok().expect("producers done").into_inner().expect("tally");
    let unacked = Instant::now() >= give_up;
    assert!(!unacked, "some requests were never acknowledged");
    assert!(tally.wrong.is_empty(), "answers that must not happen: {:?}", &tally.wrong[..tally.wrong.len().min(5)]);
    let whole = close_and_read(&reader_base).await;
    let records = check_stream(&whole, &tally);
    for (k, r) in readers.into_iter().enumerate() {
        let got = tokio::time::timeout(Duration::from_secs(60), r).await.expect("reader ends at EOF").expect("reader");
        assert!(got == whole, "reader {k} saw {} bytes, the stream holds {}", got.len(), whole.len());
    }
    (tally, records)
}

#[test]
fn a_node_killed_mid_run_loses_and_duplicates_nothing() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let db = database_url();
    let schema = schema("kill");
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let a = Arc::new(Mutex::new(Node::start(&db, &schema, dir.path().join("a.log"))));
    let b = Node::start(&db, &schema, dir.path().join("b.log"));
    let (urls, b_url) = (vec![a.lock().expect("a").url(), b.url()], b.url());
    let kills = Arc::new(AtomicU64::new(0));
    let b_not_ready = Arc::new(AtomicU64::new(0));
    let (tally, records) = rt.block_on(async {
        let (a2, kills2, b_url2, not_ready) = (a.clone(), kills.clone(), b_url.clone(), b_not_ready.clone());
        scenario(urls, b_url.clone(), Duration::from_secs(16), move |_stop| async move {
            let killing = AtomicBool::new(true);
            let watch_b = async {
                while killing.load(Ordering::Relaxed) {
                    if readyz(&b_url2).await != Some(StatusCode::OK) {
                        not_ready.fetch_add(1, Ordering::Relaxed);
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            };
            let killer = async {
                // Varied moments: right after a start, mid-load, after longer runs.
                for pause_ms in [700u64, 150, 1300, 40, 900, 2100, 300, 1000] {
                    tokio::time::sleep(Duration::from_millis(pause_ms)).await;
                    let a = a2.clone();
                    tokio::task::spawn_blocking(move || {
                        let mut a = a.lock().expect("a");
                        a.kill9();
                        std::thread::sleep(Duration::from_millis(200));
                        a.launch();
                    })
                    .await
                    .expect("restart");
                    kills2.fetch_add(1, Ordering::Relaxed);
                }
                killing.store(false, Ordering::Relaxed);
            };
            tokio::join!(watch_b, killer);
        })
        .await
    });
    eprintln!(
        "two nodes, node A SIGKILLed {}x: {} acknowledged, {records} records, {} retries, {} gap answers, {} 503s",
        kills.load(Ordering::Relaxed),
        tally.acked.len(),
        tally.retries,
        tally.gaps,
        tally.unavailable
    );
    assert_eq!(kills.load(Ordering::Relaxed), 8);
    assert!(tally.acked.len() > 100, "the load ran ({} acknowledged)", tally.acked.len());
    assert_eq!(b_not_ready.load(Ordering::Relaxed), 0, "node B stayed ready while A was killed");
}

#[test]
fn a_database_crash_mid_run_loses_and_duplicates_nothing() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let cluster = Cluster::start();
    let schema = schema("dbcrash");
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let a = Node::start(&cluster.url, &schema, dir.path().join("a.log"));
    let b = Node::start(&cluster.url, &schema, dir.path().join("b.log"));
    let urls = vec![a.url(), b.url()];
    let pg_dir = cluster.dir.path().to_owned();
    let outage_ready = Arc::new(Mutex::new(Vec::new()));
    let recovered_in = Arc::new(Mutex::new(None));
    let (tally, records) = rt.block_on(async {
        let (urls2, outage2, recovered2) = (urls.clone(), outage_ready.clone(), recovered_in.clone());
        scenario(urls.clone(), b.url(), Duration::from_secs(14), move |_stop| async move {
            tokio::time::sleep(Duration::from_secs(4)).await;
            let dir = pg_dir.clone();
            tokio::task::spawn_blocking(move || Cluster::run(&dir, "crash")).await.expect("crash");
            tokio::time::sleep(Duration::from_millis(1500)).await;
            for u in urls2.iter() {
                outage2.lock().expect("outage").push(readyz(u).await);
            }
            tokio::time::sleep(Duration::from_millis(1500)).await;
            let dir = pg_dir.clone();
            tokio::task::spawn_blocking(move || Cluster::run(&dir, "start")).await.expect("restart");
            let back = Instant::now();
            'wait: loop {
                let mut all = true;
                for u in urls2.iter() {
                    all &= readyz(u).await == Some(StatusCode::OK);
                }
                if all {
                    *recovered2.lock().expect("recovered") = Some(back.elapsed());
                    break 'wait;
                }
                if back.elapsed() > Duration::from_secs(30) {
                    break 'wait;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await
    });
    let outage = outage_ready.lock().expect("outage").clone();
    let recovered = *recovered_in.lock().expect("recovered");
    eprintln!(
        "two nodes, database crashed for 3 s: {} acknowledged, {records} records, {} retries, {} 503s, readyz during the outage {outage:?}, both ready {recovered:?} after the restart",
        tally.acked.len(),
        tally.retries,
        tally.unavailable
    );
    assert_eq!(outage, vec![Some(StatusCode::SERVICE_UNAVAILABLE); 2], "both nodes report the outage on /readyz");
    assert!(recovered.is_some_and(|t| t < Duration::from_secs(10)), "both nodes ready again without a restart: {recovered:?}");
    assert!(tally.unavailable > 0, "the outage was seen as 503s");
    assert!(tally.acked.len() > 100, "the load ran ({} acknowledged)", tally.acked.len());
    drop((a, b));
}

