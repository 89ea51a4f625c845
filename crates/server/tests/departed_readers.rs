//! Live readers whose client left are let go at once (issue 46, item 4): an HTTP/1 long-poll or
//! SSE reader does not read from its socket while it waits, so a client that closed was noticed
//! only at the next write (the long-poll timeout or the SSE keep-alive, 15-20 s), holding its
//! place all that time. Alone in its binary: it reads the process-wide live-reader gauge.

mod common;

use std::time::{Duration, Instant};

use oncelog_server::ServerConfig;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// The `oncelog_live_readers` gauge of `mode` (0 when absent).
async fn live_readers(s: &common::TestServer, mode: &str) -> f64 {
    let scrape = reqwest::get(format!("{}/metrics", s.origin)).await.expect("metrics").text().await.expect("text");
    let prefix = format!("oncelog_live_readers{{mode=\"{mode}\"}} ");
    scrape.lines().find_map(|l| l.strip_prefix(prefix.as_str())).and_then(|v| v.parse().ok()).unwrap_or(0.0)
}

/// Polls until the gauges of long-poll and SSE readers are `(long_poll, sse)`, for at most
/// `limit`; returns how long that took, or `None`.
async fn gauges_reach(s: &common::TestServer, want: (f64, f64), limit: Duration) -> Option<Duration> {
    let started = Instant::now();
    while started.elapsed() < limit {
        if (live_readers(s, "long-poll").await, live_readers(s, "sse").await) == want {
            return Some(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

/// A live read of `s` on a connection of its own, past its answer's status line for SSE.
async fn reader(s: &common::TestServer, mode: &str) -> BufReader<TcpStream> {
    let mut conn = TcpStream::connect(s.addr).await.expect("connect");
    let req = format!("GET /v1/stream/s?offset=now&live={mode} HTTP/1.1\r\nHost: t\r\n\r\n");
    conn.write_all(req.as_bytes()).await.expect("request");
    let mut conn = BufReader::new(conn);
    if mode == "sse" {
        let mut status = String::new();
        conn.read_line(&mut status).await.expect("status line");
        assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    }
    conn
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_and_an_sse_reader_that_disconnect_give_their_places_back_at_once() {
    // The defaults: a long-poll waits 20 s, an idle SSE response is written to every 15 s.
    let s = common::TestServer::start(ServerConfig::default(), None).await;
    let http = reqwest::Client::new();
    let r = http.put(s.url("s")).header("content-type", "text/plain").send().await.expect("put");
    assert_eq!(r.status(), 201);

    // One SSE reader stays: it must not be dropped with the others.
    let mut staying = reader(&s, "sse").await;
    let long_poll = reader(&s, "long-poll").await;
    let sse = reader(&s, "sse").await;
    assert!(gauges_reach(&s, (1.0, 2.0), Duration::from_secs(5)).await.is_some(), "three readers wait");

    drop((long_poll, sse));
    let took = gauges_reach(&s, (0.0, 1.0), Duration::from_secs(2)).await;
    assert!(took.is_some(), "the places of readers that left are still held after 2 s");

    // The reader that stayed is still served.
    let r = http.post(s.url("s")).header("content-type", "text/plain").body("hello").send().await.expect("post");
    assert_eq!(r.status(), 204);
    let mut seen = String::new();
    let got = tokio::time::timeout(Duration::from_secs(5), async {
        while !seen.contains("hello") {
            let mut line = String::new();
            if staying.read_line(&mut line).await.expect("event") == 0 {
                break;
            }
            seen.push_str(&line);
        }
    })
    .await;
    assert!(got.is_ok() && seen.contains("hello"), "the reader that stayed got {seen:?}");
}
