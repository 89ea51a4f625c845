//! Crash safety of exactly-once appends, end to end with `kill -9`.
//!
//! The real `oncelog` binary runs as a child process. A pipelined idempotent producer keeps
//! [`PIPELINE_DEPTH`] appends in flight while a killer loop sends SIGKILL to the server at varied
//! moments (right after a restart, while the pipeline is saturated and group commits are being
//! fsynced, after random delays, and even during recovery) and restarts it on the same data dir.
//! The producer retries whatever was not acknowledged with the same (epoch, seq) and the same
//! body. At the end the stream must hold every record exactly once, in sequence order, with the
//! exact bytes sent: an acknowledged append is durable, and a retried one is never written twice.
//!
//! Unix only: it relies on signals and exit statuses that say which signal ended the process.

#![cfg(unix)]

use std::collections::{BTreeMap, BTreeSet};
use std::fs::OpenOptions;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::{Client, StatusCode};
use tokio::sync::{watch, Notify, Semaphore};
use tokio::task::{block_in_place, JoinSet};

const STREAM: &str = "crash-exactly-once";
const PRODUCER_ID: &str = "crash-producer";
const EPOCH: u64 = 0;
/// Appends in flight at once: enough that most kills land while a group commit is being synced.
const PIPELINE_DEPTH: usize = 8;
/// Server restarts; all but [`SIGTERM_ROUND`] end with SIGKILL.
const ROUNDS: usize = 40;
/// The one round that stops the server gracefully instead, under load.
const SIGTERM_ROUND: usize = 20;
const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);
/// After the last restart: how long the producer keeps going, then how long the stragglers may
/// take to be acknowledged by the final server.
const FINAL_RUN: Duration = Duration::from_millis(300);
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------------------------
// The server as a child process.

/// One `oncelog serve` child on a fixed data dir; restarts pick a new port. Dropping it kills the
/// child, so a panicking test never leaves a server behind.
struct ServerProcess {
    child: Option<Child>,
    data_dir: PathBuf,
    /// Server stderr (all incarnations, appended): kept out of a pipe so it can never fill up,
    /// and quoted in failure messages.
    log_path: PathBuf,
    base_url: String,
    starts: usize,
    startup_times: Vec<Duration>,
}

impl ServerProcess {
    fn start(data_dir: &Path, log_path: &Path) -> Self {
        let mut server = ServerProcess {
            child: None,
            data_dir: data_dir.to_owned(),
            log_path: log_path.to_owned(),
            base_url: String::new(),
            starts: 0,
            startup_times: Vec::new(),
        };
        server.launch();
        server
    }

    /// Spawns a child; the receiver yields its stdout's first line (or nothing if it died first).
    fn spawn(&mut self) -> (Child, mpsc::Receiver<String>) {
        self.starts += 1;
        let mut log =
            OpenOptions::new().create(true).append(true).open(&self.log_path).expect("open the server log file");
        writeln!(log, "===== test: start #{} =====", self.starts).expect("write to the server log");
        let mut child = Command::new(env!("CARGO_BIN_EXE_oncelog"))
            .arg("serve")
            .args(["--addr", "127.0.0.1:0", "--long-poll-timeout-ms", "1000", "--data-dir"])
            .arg(&self.data_dir)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("spawn the oncelog binary");
        let stdout = child.stdout.take().expect("child stdout is piped");
        let (tx, rx) = mpsc::channel();
        // A reader thread per child: hands over the first line, then drains until the child dies.
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) > 0 {
                let _ = tx.send(line);
            }
            let _ = std::io::copy(&mut reader, &mut std::io::sink());
        });
        (child, rx)
    }

    /// Spawns the server and waits until it says it accepts connections.
    fn launch(&mut self) {
        assert!(self.child.is_none(), "launch while a child is still running");
        let t0 = Instant::now();
        let (child, ready) = self.spawn();
        self.child = Some(child);
        let line = match ready.recv_timeout(STARTUP_TIMEOUT) {
            Ok(line) => line,
            Err(e) => panic!(
                "server start #{} did not print its address within {STARTUP_TIMEOUT:?} ({e}); log:\n{}",
                self.starts,
                self.log_tail(40)
            ),
        };
        let url = line
            .trim()
            .strip_prefix("oncelog listening on ")
            .unwrap_or_else(|| panic!("unexpected first stdout line: {line:?}"));
        assert!(url.starts_with("http://127.0.0.1:"), "server must listen on loopback only, got {url}");
        self.base_url = url.to_owned();
        self.startup_times.push(t0.elapsed());
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().expect("server is running").id()
    }

    /// SIGKILL (what `Child::kill` sends on unix), then reap the child.
    fn kill9(&mut self) {
        let mut child = self.child.take().expect("server is running");
        child.kill().expect("send SIGKILL to the server");
        let status = child.wait().expect("reap the killed server");
        // Anything but "killed by signal 9" means the server had died on its own before.
        assert_eq!(status.signal(), Some(9), "server exit was not our SIGKILL: {status}; log:\n{}", self.log_tail(40));
    }

    /// SIGTERM, then wait (bounded) for the graceful exit.
    fn terminate(&mut self) -> ExitStatus {
        let pid = self.pid();
        let sent =
            Command::new("kill").args(["-TERM", &pid.to_string()]).status().expect("run kill(1) to send SIGTERM");
        assert!(sent.success(), "kill -TERM {pid} failed: {sent}");
        let mut child = self.child.take().expect("server is running");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = child.try_wait().expect("poll the terminating server") {
                return status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("server did not exit within 20 s of SIGTERM; log:\n{}", self.log_tail(40));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Starts a server and SIGKILLs it a few milliseconds later, most likely during recovery,
    /// before it ever listens: recovery itself must be crash-safe too.
    fn kill_during_startup(&mut self, after: Duration) {
        assert!(self.child.is_none(), "kill_during_startup while a child is still running");
        let (mut child, _ready) = self.spawn();
        std::thread::sleep(after);
        child.kill().expect("send SIGKILL to the starting server");
        let status = child.wait().expect("reap the killed starting server");
        assert_eq!(
            status.signal(),
            Some(9),
            "starting server exited on its own: {status}; log:\n{}",
            self.log_tail(40)
        );
    }

    fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log_path).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Records: self-describing bodies, so the final stream can be parsed back into seqs.

/// `rec-SSSSSSSS-<padding>\n`, 50..=2000 bytes, padding derived from the seq: any record can be
/// recomputed from its seq and compared byte for byte.
fn record(seq: u64) -> Vec<u8> {
    let total = 50 + (seq.wrapping_mul(7919) % 1951) as usize;
    let mut body = format!("rec-{seq:08}-").into_bytes();
    let padding = total - body.len() - 1;
    body.extend((0..padding as u64).map(|i| b'a' + ((seq + i * 7) % 26) as u8));
    body.push(b'\n');
    debug_assert_eq!(body.len(), total);
    body
}

// ---------------------------------------------------------------------------------------------
// The producer.

#[derive(Debug, Clone, Copy)]
struct Ack {
    status: u16,
    attempts: u32,
    /// Which server start acknowledged it (1 = the first).
    incarnation: usize,
    /// Position in the order acks were received (0 = the first).
    index: u64,
}

#[derive(Default)]
struct Stats {
    attempts: AtomicU64,
    acked_200: AtomicU64,
    acked_204: AtomicU64,
    gaps_409: AtomicU64,
    transport_errors: AtomicU64,
    server_errors_5xx: AtomicU64,
}

/// State shared between the producer tasks and the killer.
struct Shared {
    stats: Stats,
    acks: Mutex<BTreeMap<u64, Ack>>,
    /// Acks received so far; an ack's `index` is taken from it before the ack is recorded.
    acked_total: AtomicU64,
    ack_progress: Notify,
    /// Permits = free pipeline slots; the killer reads it to know how much is in flight.
    slots: Arc<Semaphore>,
    /// Current server start, bumped by the killer once the new server listens.
    incarnation: AtomicUsize,
    stop_producing: AtomicBool,
    /// First invariant violation seen by a producer task; stops everything.
    fatal: Mutex<Option<String>>,
}

impl Shared {
    fn new() -> Self {
        Shared {
            stats: Stats::default(),
            acks: Mutex::new(BTreeMap::new()),
            acked_total: AtomicU64::new(0),
            ack_progress: Notify::new(),
            slots: Arc::new(Semaphore::new(PIPELINE_DEPTH)),
            incarnation: AtomicUsize::new(1),
            stop_producing: AtomicBool::new(false),
            fatal: Mutex::new(None),
        }
    }

    fn in_flight(&self) -> usize {
        PIPELINE_DEPTH - self.slots.available_permits()
    }

    fn fatal(&self) -> Option<String> {
        self.fatal.lock().expect("fatal lock").clone()
    }

    fn fail(&self, msg: String) {
        self.fatal.lock().expect("fatal lock").get_or_insert(msg);
    }
}

/// Keeps [`PIPELINE_DEPTH`] appends in flight, in seq order, until told to stop; then waits until
/// every seq it started is acknowledged. Returns how many seqs it started (0..n).
async fn run_producer(client: Client, url: watch::Receiver<Option<String>>, shared: Arc<Shared>) -> u64 {
    let mut tasks = JoinSet::new();
    let mut next_seq = 0u64;
    loop {
        if shared.stop_producing.load(Ordering::SeqCst) || shared.fatal().is_some() {
            break;
        }
        let permit = shared.slots.clone().acquire_owned().await.expect("semaphore never closed");
        if shared.stop_producing.load(Ordering::SeqCst) {
            break;
        }
        let (client, url, task_shared) = (client.clone(), url.clone(), shared.clone());
        let seq = next_seq;
        tasks.spawn(async move {
            let result = append_until_acked(&client, url, &task_shared, seq).await;
            drop(permit);
            if let Err(msg) = &result {
                task_shared.fail(msg.clone());
            }
        });
        next_seq += 1;
    }
    // Every seq that was started must end up acknowledged (by the final server).
    while let Some(joined) = tasks.join_next().await {
        joined.expect("append task panicked");
    }
    next_seq
}

/// Sends `seq` (always the same body) until the server answers 200 or 204. Transport errors and
/// gaps are retried; anything that contradicts exactly-once is returned as an error.
async fn append_until_acked(
    client: &Client,
    mut url: watch::Receiver<Option<String>>,
    shared: &Shared,
    seq: u64,
) -> Result<(), String> {
    let body = record(seq);
    let mut attempts = 0u32;
    let mut backoff = Duration::from_millis(5);
    loop {
        if let Some(msg) = shared.fatal() {
            return Err(format!("seq {seq} aborted after another failure: {msg}"));
        }
        // While the server is down the URL is None: wait for the next incarnation's address.
        let base = url
            .wait_for(Option::is_some)
            .await
            .map_err(|_| "the URL channel closed".to_owned())?
            .clone()
            .expect("checked is_some");
        attempts += 1;
        shared.stats.attempts.fetch_add(1, Ordering::Relaxed);
        // Acks with an index below this were received before this request was sent, so the
        // server had accepted them before it could see this request.
        let acks_before_send = shared.acked_total.load(Ordering::SeqCst);
        let sent = client
            .post(format!("{base}/v1/stream/{STREAM}"))
            .header("Content-Type", "application/octet-stream")
            .header("Producer-Id", PRODUCER_ID)
            .header("Producer-Epoch", EPOCH.to_string())
            .header("Producer-Seq", seq.to_string())
            .body(body.clone())
            .send()
            .await;
        let resp = match sent {
            Ok(resp) => resp,
            Err(_) => {
                // Connection refused/reset: the server is (being) killed. Same seq, same body.
                shared.stats.transport_errors.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_millis(100));
                continue;
            }
        };
        let incarnation = shared.incarnation.load(Ordering::SeqCst);
        match resp.status() {
            status @ (StatusCode::OK | StatusCode::NO_CONTENT) => {
                if status == StatusCode::NO_CONTENT {
                    if attempts == 1 {
                        return Err(format!(
                            "seq {seq}: 204 (duplicate) on the very first attempt (server start #{incarnation}): \
                             the server claims a seq it never received"
                        ));
                    }
                    shared.stats.acked_204.fetch_add(1, Ordering::Relaxed);
                } else {
                    shared.stats.acked_200.fetch_add(1, Ordering::Relaxed);
                }
                let index = shared.acked_total.fetch_add(1, Ordering::SeqCst);
                let ack = Ack { status: status.as_u16(), attempts, incarnation, index };
                let previous = shared.acks.lock().expect("acks lock").insert(seq, ack);
                assert!(previous.is_none(), "seq {seq} acknowledged twice by the producer");
                shared.ack_progress.notify_waiters();
                return Ok(());
            }
            StatusCode::CONFLICT => {
                let expected = header_u64(&resp, "Producer-Expected-Seq")
                    .ok_or_else(|| format!("seq {seq}: 409 without a Producer-Expected-Seq header"))?;
                if expected >= seq {
                    return Err(format!("seq {seq}: 409 expecting seq {expected}, which is not before it"));
                }
                // A gap at a seq that was acknowledged before this request was even sent means that
                // acknowledged append was lost. (An ack received later proves nothing: the 409 may
                // predate it.)
                let acked_earlier = shared.acks.lock().expect("acks lock").get(&expected).copied();
                if let Some(ack) = acked_earlier.filter(|a| a.index < acks_before_send) {
                    return Err(format!(
                        "LOST ACKNOWLEDGED APPEND: server start #{incarnation} expects seq {expected} next \
                         (409 for seq {seq}), but seq {expected} was acknowledged with {} by server start #{}",
                        ack.status, ack.incarnation
                    ));
                }
                // A predecessor is not in yet (it is in flight or being retried): wait for progress.
                shared.stats.gaps_409.fetch_add(1, Ordering::Relaxed);
                let _ = tokio::time::timeout(Duration::from_millis(5), shared.ack_progress.notified()).await;
            }
            status if status.is_server_error() => {
                // Not expected, but transient by nature (e.g. during shutdown): retry, and report.
                shared.stats.server_errors_5xx.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_millis(100));
            }
            status => {
                let text = resp.text().await.unwrap_or_default();
                return Err(format!("seq {seq}: unexpected {status} from server start #{incarnation}: {text}"));
            }
        }
    }
}

fn header_u64(resp: &reqwest::Response, name: &str) -> Option<u64> {
    resp.headers().get(name)?.to_str().ok()?.parse().ok()
}

// ---------------------------------------------------------------------------------------------
// The verifier.

/// Reads the whole stream from the start, following `Stream-Next-Offset` until up to date.
async fn read_whole_stream(client: &Client, base: &str) -> Vec<u8> {
    let mut data = Vec::new();
    let mut offset = "-1".to_owned();
    for _ in 0..100_000 {
        let resp =
            client.get(format!("{base}/v1/stream/{STREAM}?offset={offset}")).send().await.expect("read the stream");
        assert_eq!(resp.status(), StatusCode::OK, "read at offset {offset}");
        let next = resp
            .headers()
            .get("Stream-Next-Offset")
            .expect("read response has Stream-Next-Offset")
            .to_str()
            .expect("ASCII offset")
            .to_owned();
        let up_to_date = resp.headers().get("Stream-Up-To-Date").is_some_and(|v| v == "true");
        let chunk = resp.bytes().await.expect("read body");
        assert!(up_to_date || !chunk.is_empty() || next != offset, "read made no progress at offset {offset}");
        data.extend_from_slice(&chunk);
        if up_to_date {
            return data;
        }
        offset = next;
    }
    panic!("stream never reported Stream-Up-To-Date");
}

/// Checks the stream holds exactly records 0..started, each once, in order, byte for byte, and
/// that every acknowledged seq is among them.
fn verify_stream(data: &[u8], started: u64, acks: &BTreeMap<u64, Ack>) {
    assert!(data.is_empty() || data.ends_with(b"\n"), "stream ends in the middle of a record");
    let mut seqs = Vec::new();
    for (index, line) in data.split_inclusive(|&b| b == b'\n').enumerate() {
        let seq = std::str::from_utf8(line)
            .ok()
            .and_then(|l| l.strip_prefix("rec-"))
            .and_then(|l| l.get(..8))
            .and_then(|digits| digits.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("record #{index} is not a record: {:?}", String::from_utf8_lossy(line)));
        assert!(line == record(seq).as_slice(), "record #{index} (seq {seq}) differs from the bytes sent");
        seqs.push(seq);
    }

    // Diagnose before the blunt comparison, so a failure names the seqs.
    let mut count: BTreeMap<u64, usize> = BTreeMap::new();
    for &seq in &seqs {
        *count.entry(seq).or_default() += 1;
    }
    let duplicated: Vec<_> = count.iter().filter(|(_, &n)| n > 1).map(|(&s, &n)| (s, n)).collect();
    assert!(duplicated.is_empty(), "DUPLICATES in the stream (seq, times): {duplicated:?}");
    let unknown: Vec<_> = count.keys().filter(|&&s| s >= started).collect();
    assert!(unknown.is_empty(), "seqs in the stream that were never sent: {unknown:?}");
    let lost_acked: Vec<_> = acks.iter().filter(|(s, _)| !count.contains_key(s)).collect();
    assert!(lost_acked.is_empty(), "LOST ACKNOWLEDGED APPENDS (seq, ack): {lost_acked:?}");
    let missing: Vec<_> = (0..started).filter(|s| !count.contains_key(s)).collect();
    assert!(missing.is_empty(), "seqs started but absent from the stream: {missing:?}");
    if let Some(pos) = seqs.iter().enumerate().position(|(i, &s)| s != i as u64) {
        panic!(
            "stream out of order at record #{pos}: seq {} (around: {:?})",
            seqs[pos],
            &seqs[pos.saturating_sub(3)..]
        );
    }
    assert_eq!(seqs.len() as u64, started);
    let expected: Vec<u8> = (0..started).flat_map(record).collect();
    assert!(data == expected.as_slice(), "stream bytes differ from the concatenation of all records");
}

// ---------------------------------------------------------------------------------------------
// The killer.

/// A tiny xorshift: varied kill moments without a dependency; the seed is printed to replay a run
/// (`ONCELOG_CRASH_SEED=<seed>`).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x % n
    }
}

#[derive(Debug, Clone, Copy)]
enum Moment {
    /// As soon as the new server listens: retries from the previous round are just arriving.
    RightAfterRestart,
    /// Once the pipeline is full and acks are flowing, plus a few ms: group commits mid-fsync.
    PipelineSaturated,
    /// A random delay of up to 150 ms after the restart.
    Random,
}

struct KillRecord {
    round: usize,
    moment: Moment,
    waited: Duration,
    in_flight: usize,
    acked_before: u64,
    graceful: bool,
    startup_kill: bool,
}

async fn create_stream(client: &Client, base: &str) {
    let resp = client
        .put(format!("{base}/v1/stream/{STREAM}"))
        .header("Content-Type", "application/octet-stream")
        .send()
        .await
        .expect("create the stream");
    assert_eq!(resp.status(), StatusCode::CREATED, "create the stream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acknowledged_appends_survive_sigkill_exactly_once() {
    let test_start = Instant::now();
    let seed = std::env::var("ONCELOG_CRASH_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock after 1970").as_nanos() as u64
    });
    let mut rng = Rng(seed | 1);

    let dir = tempfile::tempdir().expect("create a temp dir");
    let data_dir = dir.path().join("data");
    let log_path = dir.path().join("server.log");
    // Process management blocks; block_in_place keeps the runtime's other workers producing.
    let mut server = block_in_place(|| ServerProcess::start(&data_dir, &log_path));

    let client = Client::builder()
        .pool_max_idle_per_host(PIPELINE_DEPTH)
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(10))
        .build()
        .expect("build the HTTP client");
    create_stream(&client, &server.base_url).await;

    let (url_tx, url_rx) = watch::channel(Some(server.base_url.clone()));
    let shared = Arc::new(Shared::new());
    let producer = tokio::spawn(run_producer(client.clone(), url_rx, shared.clone()));

    let mut kills = Vec::new();
    for round in 0..ROUNDS {
        if shared.fatal().is_some() {
            break;
        }
        let moment = if round == SIGTERM_ROUND {
            Moment::PipelineSaturated
        } else {
            [Moment::PipelineSaturated, Moment::Random, Moment::RightAfterRestart][round % 3]
        };
        let waited_from = Instant::now();
        match moment {
            Moment::RightAfterRestart => {}
            Moment::PipelineSaturated => {
                // Full pipeline and a few acks from this server: group commits are in progress.
                let acked_at_start = shared.acked_total.load(Ordering::SeqCst);
                let deadline = Instant::now() + Duration::from_secs(3);
                while Instant::now() < deadline
                    && (shared.in_flight() < PIPELINE_DEPTH
                        || shared.acked_total.load(Ordering::SeqCst) < acked_at_start + PIPELINE_DEPTH as u64)
                {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                tokio::time::sleep(Duration::from_millis(rng.below(6))).await;
            }
            Moment::Random => tokio::time::sleep(Duration::from_millis(rng.below(151))).await,
        }
        let waited = waited_from.elapsed();
        let in_flight = shared.in_flight();
        let acked_before = shared.acked_total.load(Ordering::SeqCst);

        // New requests wait for the next address instead of hitting a dead (maybe reused) port.
        url_tx.send_replace(None);
        let graceful = round == SIGTERM_ROUND;
        if graceful {
            let status = block_in_place(|| server.terminate());
            assert!(status.success(), "graceful SIGTERM stop must exit 0, got {status}; log:\n{}", server.log_tail(40));
        } else {
            block_in_place(|| server.kill9());
        }
        // Every fifth round, also crash a server while it recovers, before it listens.
        let startup_kill = round % 5 == 4;
        if startup_kill {
            let after = Duration::from_millis(rng.below(30));
            block_in_place(|| server.kill_during_startup(after));
        }
        block_in_place(|| server.launch());
        shared.incarnation.store(server.starts, Ordering::SeqCst);
        url_tx.send_replace(Some(server.base_url.clone()));
        kills.push(KillRecord { round, moment, waited, in_flight, acked_before, graceful, startup_kill });
    }

    // Let the producer run a little against the final server, then stop starting new seqs and
    // wait until everything already started is acknowledged.
    tokio::time::sleep(FINAL_RUN).await;
    shared.stop_producing.store(true, Ordering::SeqCst);
    let started = match tokio::time::timeout(DRAIN_TIMEOUT, producer).await {
        Ok(joined) => joined.expect("producer task panicked"),
        Err(_) => panic!(
            "in-flight appends not acknowledged within {DRAIN_TIMEOUT:?} after the last restart \
             (fatal: {:?}); log:\n{}",
            shared.fatal(),
            server.log_tail(40)
        ),
    };
    if let Some(msg) = shared.fatal() {
        panic!("exactly-once violated (seed {seed}): {msg}\nserver log tail:\n{}", server.log_tail(40));
    }

    let acks = shared.acks.lock().expect("acks lock").clone();
    assert_eq!(acks.len() as u64, started, "every started seq is acknowledged");
    let data = read_whole_stream(&client, &server.base_url).await;
    verify_stream(&data, started, &acks);

    // Figures for the record.
    let sigkills = kills.iter().filter(|k| !k.graceful).count();
    let startup_kills = kills.iter().filter(|k| k.startup_kill).count();
    let saturated = kills.iter().filter(|k| !k.graceful && k.in_flight == PIPELINE_DEPTH).count();
    // A 204 means an earlier attempt was committed and synced but its answer died with the
    // server: the kill before the incarnation that sent the 204 (or one shortly before it) fell
    // between a group commit and its answers. Distinct incarnations approximate those kills.
    let kills_after_commit: BTreeSet<usize> =
        acks.values().filter(|a| a.status == 204).map(|a| a.incarnation).collect();
    let s = &shared.stats;
    println!("crash test seed: {seed} (replay with ONCELOG_CRASH_SEED={seed})");
    for k in &kills {
        println!(
            "  round {:>2}: {:<9} after {:>4} ms ({:?}), {} in flight, {} acked so far{}",
            k.round,
            if k.graceful { "SIGTERM" } else { "SIGKILL" },
            k.waited.as_millis(),
            k.moment,
            k.in_flight,
            k.acked_before,
            if k.startup_kill { ", + SIGKILL during recovery" } else { "" }
        );
    }
    let max_startup = server.startup_times.iter().max().copied().unwrap_or_default();
    println!(
        "rounds: {} ({} SIGKILL, {} with all {PIPELINE_DEPTH} slots outstanding, ~{} after a commit but before \
         its answers; 1 SIGTERM exit 0; {} extra SIGKILLs during recovery); server starts: {}, slowest {} ms",
        kills.len(),
        sigkills,
        saturated,
        kills_after_commit.len(),
        startup_kills,
        server.starts,
        max_startup.as_millis()
    );
    println!(
        "appends acknowledged: {} ({} bytes) = {} x 200 + {} x 204 (retries whose first try had landed: \
         duplicates suppressed)",
        acks.len(),
        data.len(),
        s.acked_200.load(Ordering::Relaxed),
        s.acked_204.load(Ordering::Relaxed)
    );
    println!(
        "requests: {}; retried after: {} transport errors, {} gaps (409), {} server errors (5xx); \
         acked after >1 attempt: {}",
        s.attempts.load(Ordering::Relaxed),
        s.transport_errors.load(Ordering::Relaxed),
        s.gaps_409.load(Ordering::Relaxed),
        s.server_errors_5xx.load(Ordering::Relaxed),
        acks.values().filter(|a| a.attempts > 1).count()
    );
    println!(
        "verified: seqs 0..{started} each exactly once, in order, byte-exact; elapsed {:.1} s",
        test_start.elapsed().as_secs_f64()
    );

    assert!(sigkills >= 20, "at least 20 SIGKILL rounds, got {sigkills}");
    assert!(saturated > 0, "at least one SIGKILL must hit a full pipeline");
}
