//! Taking a bucket prefix over, through the real binary: a new node on the prefix of a writer
//! under continuous appends in `--ack-mode bucket` starts (the writer yields to its claim) with
//! every append the old node acknowledged; and a data directory started on another prefix says
//! which one it leaves. Against a real S3 API server (moto, `ONCELOG_TEST_S3_ENDPOINT`) and a
//! local directory. Unix only (the log's stderr is read from a file).

#![cfg(unix)]

mod common;

use std::io::BufRead;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::Server;
use reqwest::{Client, StatusCode};

/// Concurrent producers on the old node: enough that a publish is always under way.
const PRODUCERS: u64 = 4;

/// The `--object-store` URL (a fresh prefix named `name`) and the environment it needs.
fn store(kind: &str, dir: &std::path::Path, name: &str) -> (String, Vec<(&'static str, String)>) {
    if kind == "dir" {
        return (format!("file://{}/{name}", dir.display()), Vec::new());
    }
    (oncelog_bucket::test_support::s3_location(name).to_string(), oncelog_bucket::test_support::s3_env())
}

fn args<'a>(url: &'a str, mode: &'a str) -> [&'a str; 6] {
    // `--ack-mode bucket` ships when writes wait; the timed rounds are then far apart.
    let interval = if mode == "bucket" { "1m" } else { "100ms" };
    ["--object-store", url, "--ship-interval", interval, "--ack-mode", mode]
}

fn start(data: &std::path::Path, url: &str, env: &[(&'static str, String)], mode: &str) -> Server {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    Server::start_env(data, "127.0.0.1:0", &args(url, mode), &env)
}

fn body(producer: u64, i: u64) -> String {
    format!("p{producer}-{i:05}|")
}

/// Appends producer `producer`'s bodies to `url` one after another until `stop`; returns how
/// many were acknowledged (200), which are its first ones: after the first other answer it stops.
async fn produce_until(http: Client, url: String, producer: u64, stop: Arc<AtomicBool>) -> u64 {
    let id = format!("p{producer}");
    let mut acked = 0;
    while !stop.load(Ordering::Relaxed) {
        let seq = acked.to_string();
        let sent = http
            .post(&url)
            .header("content-type", "text/plain")
            .header("producer-id", id.as_str())
            .header("producer-epoch", "0")
            .header("producer-seq", seq.as_str())
            .body(body(producer, acked))
            .send()
            .await;
        match sent {
            Ok(r) if r.status() == StatusCode::OK => acked += 1,
            _ => break,
        }
    }
    acked
}

async fn text(http: &Client, url: &str) -> String {
    http.get(format!("{url}?offset=-1")).send().await.expect("get").text().await.expect("text")
}

/// Issue 45 item 5: the new node used to exit after 5-20 s ("the prefix's manifests kept
/// changing (64 tries)"): the busy writer took every manifest name it was about to create.
async fn a_new_node_takes_over_from_a_busy_writer(kind: &str) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (url, env) = store(kind, tmp.path(), "busy");
    let http = Client::new();
    let old = start(&tmp.path().join("old"), &url, &env, "bucket");
    let old_url = format!("{}/v1/stream/s", old.url);
    let r = http.put(&old_url).header("content-type", "text/plain").send().await.expect("put");
    assert_eq!(r.status(), StatusCode::CREATED);
    let stop = Arc::new(AtomicBool::new(false));
    let producers: Vec<_> =
        (0..PRODUCERS).map(|p| tokio::spawn(produce_until(http.clone(), old_url.clone(), p, stop.clone()))).collect();
    // The old node is publishing round after round before the new one starts.
    let deadline = Instant::now() + Duration::from_secs(30);
    while text(&http, &old_url).await.matches('|').count() < 50 {
        assert!(Instant::now() < deadline, "the old node acknowledged too little");
        tokio::task::yield_now().await;
    }
    let new = start(&tmp.path().join("new"), &url, &env, "bucket");
    stop.store(true, Ordering::Relaxed);
    let mut acked = Vec::new();
    for p in producers {
        acked.push(p.await.expect("producer"));
    }
    // Every append the old node acknowledged is on the new one, once, in its producer's order.
    let new_url = format!("{}/v1/stream/s", new.url);
    let there = text(&http, &new_url).await;
    for (p, n) in acked.iter().enumerate() {
        let mine: String = there.split_inclusive('|').filter(|b| b.starts_with(&format!("p{p}-"))).collect();
        let want: String = (0..*n).map(|i| body(p as u64, i)).collect();
        assert!(mine.starts_with(&want), "producer {p}: acknowledged {n}, the new node holds {mine:?}");
    }
    println!("{kind}: the old node acknowledged {acked:?} before the takeover");
    // The old node stopped taking writes, and says why.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match common::load::readyz(&old.url).await {
            Some((StatusCode::SERVICE_UNAVAILABLE, reason)) => {
                assert!(reason.contains("yielded") || reason.contains("fenced"), "{reason}");
                break;
            }
            other => assert!(Instant::now() < deadline, "the old node is still ready: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `oncelog serve` with its stderr (the log) going to `log`; returns once it listens.
fn start_logging(data: &std::path::Path, url: &str, env: &[(&'static str, String)], log: &std::path::Path) -> Node {
    let mut cmd = common::bin();
    cmd.env_remove("RUST_LOG").env_remove("ONCELOG_LOG_LEVEL").env_remove("ONCELOG_LOG_FORMAT");
    let mut child = cmd
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .args(["serve", "--addr", "127.0.0.1:0", "--data-dir"])
        .arg(data)
        .args(args(url, "local"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(log).expect("log file"))
        .spawn()
        .expect("spawn oncelog serve");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("the address line");
    let url = line
        .trim()
        .strip_prefix("oncelog listening on ")
        .unwrap_or_else(|| panic!("unexpected line {line:?}"))
        .to_owned();
    Node { child, url }
}

/// A server [`start_logging`] started, killed when dropped.
struct Node {
    child: std::process::Child,
    url: String,
}

impl Node {
    fn kill9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Issue 45 item 12(c): a fenced node's data directory, started with a new `--object-store`,
/// takes the new prefix over with its log; it says so, naming the prefix it leaves.
async fn a_directory_on_a_new_prefix_names_the_old_one(kind: &str) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (first, env) = store(kind, tmp.path(), "first");
    let (second, _) = store(kind, tmp.path(), "second");
    let http = Client::new();
    let data = tmp.path().join("data");
    let log = tmp.path().join("log");
    let node = start_logging(&data, &first, &env, &log);
    let s = format!("{}/v1/stream/s", node.url);
    let r = http.put(&s).header("content-type", "text/plain").send().await.expect("put");
    assert_eq!(r.status(), StatusCode::CREATED);
    let r = http.post(&s).header("content-type", "text/plain").body("a|").send().await.expect("post");
    assert!(r.status().is_success(), "{}", r.status());
    node.kill9();
    let first_log = std::fs::read_to_string(&log).expect("log");
    assert!(!first_log.contains("last wrote to bucket prefix"), "{first_log}");
    // Restarted on the same prefix: nothing to say.
    let node = start_logging(&data, &first, &env, &log);
    node.kill9();
    assert!(!std::fs::read_to_string(&log).expect("log").contains("last wrote to bucket prefix"));
    let node = start_logging(&data, &second, &env, &log);
    let s = format!("{}/v1/stream/s", node.url);
    assert_eq!(text(&http, &s).await, "a|", "the directory's log, now on the new prefix");
    let said = std::fs::read_to_string(&log).expect("log");
    let warn = said
        .lines()
        .find(|l| l.contains("last wrote to bucket prefix"))
        .unwrap_or_else(|| panic!("no warning naming the old prefix:\n{said}"));
    assert!(warn.contains("WARN") && warn.contains(&first) && warn.contains(&second), "{warn}");
}

macro_rules! on_both {
    ($($case:ident),* $(,)?) => {
        mod s3 {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    super::$case("s3").await;
                }
            )*
        }
        mod dir {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    super::$case("dir").await;
                }
            )*
        }
    };
}

on_both!(a_new_node_takes_over_from_a_busy_writer, a_directory_on_a_new_prefix_names_the_old_one);
