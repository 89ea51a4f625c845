//! The bucket misbehaving (issue 35): the real binary with `--object-store` on the test S3 API
//! server (moto) behind a fault proxy (`oncelog_bucket::fault_proxy`), under a producer and a
//! keyed writer that retry until answered. In turn: throttling (`503 SlowDown` to every third
//! request), slow answers, PUTs stored whose answers are lost, the bucket unreachable for 30 s,
//! then PUTs of the log's ranges failing while the node is SIGKILLed and its data directory
//! deleted. A node restored from the bucket then holds every acknowledged append exactly once
//! (`--ack-mode bucket`) or a prefix that a wait for the shipper makes whole (`local`), and every
//! retry is recognised. While the bucket is away, `bucket` mode answers `503` with `Retry-After`
//! and acknowledges nothing; `local` mode keeps acknowledging and ships it all once the bucket
//! is back. Unix only (signals).

#![cfg(unix)]

mod common;

use std::time::{Duration, Instant};

use common::Server;
use oncelog_bucket::fault_proxy::{Fault, FaultProxy};
use reqwest::{Client, StatusCode};

/// How long the bucket is unreachable (the 30 s).
const DOWN: Duration = Duration::from_secs(30);

fn body(kind: char, i: u64) -> String {
    format!("{kind}{i:04}|")
}

/// One writer: a producer (`p`, seq `i`) or a keyed writer (`k`, key `i`).
struct Writer {
    kind: char,
    url: String,
    /// Appends acknowledged so far (0..next).
    next: u64,
}

/// What became of one append's attempts.
#[derive(Debug, Default)]
struct Attempts {
    /// The final answer (200 or 204); `None`: the deadline came first.
    acked: Option<StatusCode>,
    unavailable: u32,
    /// 503s without a `Retry-After`.
    unavailable_without_retry_after: u32,
}

impl Writer {
    async fn send(&self, http: &Client, i: u64) -> reqwest::Result<reqwest::Response> {
        let req = http.post(&self.url).header("content-type", "text/plain").body(body(self.kind, i));
        let req = match self.kind {
            'p' => req.header("producer-id", "p").header("producer-epoch", "0").header("producer-seq", i.to_string()),
            _ => req.header("idempotency-key", format!("key-{i}")),
        };
        req.timeout(Duration::from_secs(20)).send().await
    }

    /// Sends append `i` until it is acknowledged or `until` passes.
    async fn append(&self, http: &Client, i: u64, until: Instant) -> Attempts {
        let mut a = Attempts::default();
        while Instant::now() < until {
            match self.send(http, i).await.map(|r| (r.status(), r.headers().contains_key("retry-after"))) {
                Ok((s, _)) if s == StatusCode::OK || s == StatusCode::NO_CONTENT => {
                    a.acked = Some(s);
                    return a;
                }
                Ok((StatusCode::SERVICE_UNAVAILABLE, retry_after)) => {
                    a.unavailable += 1;
                    a.unavailable_without_retry_after += u32::from(!retry_after);
                }
                Ok((s, _)) => panic!("{} append {i}: unexpected {s}", self.kind),
                Err(e) => panic!("{} append {i}: {e}", self.kind),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        a
    }

    /// `n` more appends, each until acknowledged (within a minute).
    async fn more(&mut self, http: &Client, n: u64) {
        self.more_for(http, n, Duration::ZERO).await;
    }

    /// At least `n` more appends and for at least `span` (so that shipping rounds run under
    /// the fault even when the local disk acknowledges at once), each until acknowledged.
    async fn more_for(&mut self, http: &Client, n: u64, span: Duration) {
        let (started, mut done) = (Instant::now(), 0);
        while done < n || started.elapsed() < span {
            let a = self.append(http, self.next, Instant::now() + Duration::from_secs(60)).await;
            assert_eq!(a.unavailable_without_retry_after, 0, "every 503 says when to retry");
            assert!(a.acked.is_some(), "{} append {} never acknowledged: {a:?}", self.kind, self.next);
            self.next += 1;
            done += 1;
            if !span.is_zero() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }

    fn all(&self) -> String {
        (0..self.next).map(|i| body(self.kind, i)).collect()
    }
}

async fn text(http: &Client, url: &str) -> String {
    http.get(format!("{url}?offset=-1")).send().await.expect("get").text().await.expect("text")
}

/// A gauge of `/metrics` (0 when absent).
async fn gauge(http: &Client, base: &str, name: &str) -> f64 {
    let m = http.get(format!("{base}/metrics")).send().await.expect("metrics").text().await.expect("text");
    m.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

fn start(data: &std::path::Path, url: &str, env: &[(&'static str, String)], mode: &str) -> Server {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let interval = if mode == "bucket" { "1m" } else { "200ms" };
    Server::start_env(
        data,
        "127.0.0.1:0",
        &["--object-store", url, "--ship-interval", interval, "--ack-mode", mode, "--bucket-ack-timeout", "2s"],
        &env,
    )
}

/// `n` more appends of each writer: sequential per writer, both at once.
async fn both(http: &Client, p: &mut Writer, k: &mut Writer, n: u64) {
    both_for(http, p, k, n, Duration::ZERO).await;
}

/// [`both`] for at least `span`.
async fn both_for(http: &Client, p: &mut Writer, k: &mut Writer, n: u64, span: Duration) {
    tokio::join!(p.more_for(http, n, span), k.more_for(http, n, span));
}

async fn faults(mode: &str) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let proxy = FaultProxy::start(&oncelog_bucket::test_support::s3_endpoint());
    let env = oncelog_bucket::test_support::s3_env_via(&proxy.url);
    let url = oncelog_bucket::test_support::s3_location("faults").to_string();
    let data = tmp.path().join("data");
    let http = Client::new();
    let server = start(&data, &url, &env, mode);
    let mut p = Writer { kind: 'p', url: format!("{}/v1/stream/p", server.url), next: 0 };
    let mut k = Writer { kind: 'k', url: format!("{}/v1/stream/k", server.url), next: 0 };
    for w in [&p, &k] {
        let r = http.put(&w.url).header("content-type", "text/plain").send().await.expect("put");
        assert_eq!(r.status(), StatusCode::CREATED);
    }
    both(&http, &mut p, &mut k, 10).await;
    for (fault, n) in
        [(Fault::Throttle(3), 15), (Fault::Slow(Duration::from_millis(300)), 10), (Fault::LosePutAnswers, 15)]
    {
        proxy.set(fault.clone());
        both_for(&http, &mut p, &mut k, n, Duration::from_secs(3)).await;
        println!("{mode}: after {fault:?}: {:?}", proxy.counts());
    }
    proxy.set(Fault::Pass);

    // The bucket unreachable for 30 s while both writers keep trying.
    proxy.set(Fault::Down);
    if mode == "bucket" {
        let down_until = Instant::now() + DOWN;
        let (pa, ka) = tokio::join!(p.append(&http, p.next, down_until), k.append(&http, k.next, down_until));
        println!("{mode}: while the bucket was away: producer {pa:?}, keyed {ka:?}");
        for a in [&pa, &ka] {
            assert_eq!(a.unavailable_without_retry_after, 0, "every 503 says when to retry");
            assert!(a.acked.is_none(), "--ack-mode bucket acknowledges nothing while the bucket is away: {a:?}");
            assert!(a.unavailable > 0, "the writes were answered 503 while the bucket was away");
        }
    } else {
        // Local acknowledgements go on (each append asserts it is acknowledged).
        let before = p.next;
        both_for(&http, &mut p, &mut k, 1, DOWN).await;
        println!("{mode}: {} appends each acknowledged while the bucket was away", p.next - before);
        assert!(gauge(&http, &server.url, "oncelog_bucket_unshipped_seconds").await >= 10.0, "the lag is reported");
    }
    println!("{mode}: after 30 s away: {:?}", proxy.counts());
    assert!(proxy.counts().refused > 0, "the node tried the bucket while it was away");
    proxy.set(Fault::Pass);
    let back = Instant::now();
    both(&http, &mut p, &mut k, 10).await;
    println!("{mode}: 10 more appends each {:?} after the bucket came back", back.elapsed());
    if mode == "local" {
        // Everything acknowledged reaches the bucket once it is back.
        let deadline = Instant::now() + Duration::from_secs(60);
        while gauge(&http, &server.url, "oncelog_bucket_unshipped_bytes").await > 0.0 {
            assert!(Instant::now() < deadline, "the shipper did not catch up after the bucket came back");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        println!("{mode}: the bucket held everything {:?} after it came back", back.elapsed());
    }
    assert_eq!(text(&http, &p.url).await, p.all(), "each producer append once on the node");
    assert_eq!(text(&http, &k.url).await, k.all(), "each keyed append once on the node");

    // The log's range objects cannot be stored; the machine is lost meanwhile.
    proxy.set(Fault::FailPuts("/seg-".into()));
    let (pa, ka) = tokio::join!(
        p.append(&http, p.next, Instant::now() + Duration::from_secs(3)),
        k.append(&http, k.next, Instant::now() + Duration::from_secs(3))
    );
    // Shipping rounds fail meanwhile (`local` acknowledged at once: give them time).
    let failed_before = proxy.counts().failed_puts;
    let deadline = Instant::now() + Duration::from_secs(20);
    while proxy.counts().failed_puts == failed_before {
        assert!(Instant::now() < deadline, "no range PUT was tried while they failed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!("{mode}: while range PUTs failed: producer {pa:?}, keyed {ka:?}; {:?}", proxy.counts());
    if mode == "bucket" {
        assert!(pa.acked.is_none() && ka.acked.is_none(), "nothing acknowledged before its log is in the bucket");
    }
    server.kill9();
    std::fs::remove_dir_all(&data).expect("delete the data directory");
    proxy.set(Fault::Pass);

    let server = start(&data, &url, &env, mode);
    p.url = format!("{}/v1/stream/p", server.url);
    k.url = format!("{}/v1/stream/k", server.url);
    let (restored_p, restored_k) = (text(&http, &p.url).await, text(&http, &k.url).await);
    // Acknowledged: 0..next. The append in flight when the node died may be there (`local`
    // acknowledged it; `bucket` did not, and it was not published).
    for (w, restored, a) in [(&p, &restored_p, &pa), (&k, &restored_k, &ka)] {
        let all = w.all();
        if a.acked.is_some() {
            let with_last = format!("{all}{}", body(w.kind, w.next));
            assert!(restored == &all || restored == &with_last, "{}: {restored:?}", w.kind);
        } else {
            assert_eq!(restored, &all, "{}: every acknowledged append, once", w.kind);
        }
    }
    // Every retry is recognised: acknowledged appends are duplicates, each at most once.
    for w in [&p, &k] {
        for i in 0..w.next {
            let r = w.send(&http, i).await.expect("retry");
            assert_eq!(r.status(), StatusCode::NO_CONTENT, "{} retry of {i}", w.kind);
        }
    }
    p.more(&http, 5).await;
    k.more(&http, 5).await;
    assert_eq!(text(&http, &p.url).await, p.all());
    assert_eq!(text(&http, &k.url).await, k.all());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bucket_faults_in_bucket_mode_lose_and_double_nothing() {
    faults("bucket").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bucket_faults_in_local_mode_lose_and_double_nothing() {
    faults("local").await;
}
