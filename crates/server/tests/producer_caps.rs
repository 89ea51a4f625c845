//! `--max-producers-per-stream` and `--max-producers` over HTTP: a new producer beyond a cap is
//! answered 429 with Retry-After and a reason naming the cap, and writes nothing; a known
//! producer goes on; a slot freed by the producer TTL admits the refused request, once.

use std::sync::Arc;

use oncelog_log::{LogEngine, LogOptions};
use oncelog_server::{serve, AppState, ManualClock, ServerConfig};
use oncelog_storage::rules::Retention;
use reqwest::{Client, StatusCode};

const TTL_MS: i64 = 60_000;

/// A log-engine server with 2 producers per stream and 4 in all, on a manual clock.
async fn start(dir: &std::path::Path, clock: Arc<ManualClock>) -> String {
    let mut opts = LogOptions::new(dir);
    opts.retention =
        Retention { producer_ttl_ms: TTL_MS, max_producers_per_stream: 2, max_producers: 4, ..Retention::default() };
    let engine = LogEngine::open(opts).expect("engine");
    let state = AppState::new(Arc::new(engine), ServerConfig::default()).with_clock(clock);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(serve(listener, state, std::future::pending()));
    format!("http://{addr}/v1/stream")
}

async fn produce(http: &Client, url: &str, id: &str, seq: u64, body: &'static str) -> reqwest::Response {
    http.post(url)
        .header("content-type", "text/plain")
        .header("producer-id", id)
        .header("producer-epoch", "0")
        .header("producer-seq", seq.to_string())
        .body(body)
        .send()
        .await
        .expect("post")
}

async fn assert_refused(r: reqwest::Response, flag: &str) {
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry_after = r.headers().get("retry-after").and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    assert!(retry_after.is_some_and(|s| s > 0), "Retry-After in seconds: {retry_after:?}");
    let reason = r.text().await.expect("body");
    assert!(reason.contains(flag) && reason.contains("too many producers"), "reason: {reason}");
}

#[tokio::test]
async fn a_new_producer_beyond_a_cap_is_429_and_a_known_one_goes_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(1_000_000));
    let base = start(dir.path(), clock.clone()).await;
    let http = Client::new();
    let (a, b) = (format!("{base}/a"), format!("{base}/b"));
    for url in [&a, &b] {
        let r = http.put(url).header("content-type", "text/plain").send().await.expect("put");
        assert_eq!(r.status(), StatusCode::CREATED);
    }
    assert_eq!(produce(&http, &a, "p1", 0, "1").await.status(), StatusCode::OK);
    assert_eq!(produce(&http, &a, "p2", 0, "2").await.status(), StatusCode::OK);
    // The stream's cap: a third producer is refused, and nothing was written.
    assert_refused(produce(&http, &a, "p3", 0, "3").await, "--max-producers-per-stream 2").await;
    assert_eq!(http.get(&a).send().await.expect("get").text().await.expect("text"), "12");
    // Known producers go on: a next append, and a retry answered as a duplicate.
    clock.advance_ms(TTL_MS / 2);
    assert_eq!(produce(&http, &a, "p1", 1, "4").await.status(), StatusCode::OK);
    assert_eq!(produce(&http, &a, "p1", 1, "4").await.status(), StatusCode::NO_CONTENT);
    assert_eq!(produce(&http, &b, "q1", 0, "x").await.status(), StatusCode::OK);
    // p2's state expires (p1 and q1 were active later): its slot on the stream frees at once,
    // and the refused request, sent again unchanged, is written once.
    clock.advance_ms(TTL_MS / 2 + 1);
    assert_eq!(produce(&http, &a, "p3", 0, "3").await.status(), StatusCode::OK, "a slot freed by the TTL");
    assert_eq!(produce(&http, &a, "p3", 0, "3").await.status(), StatusCode::NO_CONTENT);
    assert_eq!(http.get(&a).send().await.expect("get").text().await.expect("text"), "1243");
    // The server's cap: four states are held (p2's until the prune drops it), so a new
    // producer is refused on a stream with room of its own.
    assert_refused(produce(&http, &b, "q2", 0, "y").await, "--max-producers 4").await;
    assert_eq!(http.get(&b).send().await.expect("get").text().await.expect("text"), "x");
}
