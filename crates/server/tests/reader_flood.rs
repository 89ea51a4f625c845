//! A flood of live readers at the limits never locks a writer out (issue 33, item 4). Readers on
//! HTTP/1 hold a connection each; they may take all but a reserve of `--max-connections`, so
//! writers (and catch-up readers) always find a connection. A reader beyond the bound is answered
//! `503` with `Retry-After` and `Connection: close` at once, and counted. Alone in its binary: it
//! reads the process-wide metrics.

mod common;

use std::time::Duration;

use oncelog_server::ServerConfig;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// 32 connections: a reserve of 2 (a sixteenth), so 30 readers on HTTP/1 at most.
const CONNECTIONS: usize = 32;
const READERS: usize = 30;

/// Opens an SSE read of `s` on a connection of its own; answers the status line and the
/// connection (still open for a reader that was let in).
async fn reader(addr: std::net::SocketAddr) -> (String, BufReader<TcpStream>) {
    let mut conn = TcpStream::connect(addr).await.expect("connect");
    conn.write_all(b"GET /v1/stream/s?offset=now&live=sse HTTP/1.1\r\nHost: t\r\n\r\n").await.expect("request");
    let mut conn = BufReader::new(conn);
    let mut status = String::new();
    conn.read_line(&mut status).await.expect("status line");
    (status, conn)
}

/// The rest of a refused answer's head, lowercased, and whether the server then closed.
async fn head_and_close(conn: &mut BufReader<TcpStream>) -> (String, bool) {
    let mut head = String::new();
    loop {
        let mut line = String::new();
        if conn.read_line(&mut line).await.expect("header") == 0 || line == "\r\n" {
            break;
        }
        head.push_str(&line.to_ascii_lowercase());
    }
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(5), conn.read_to_end(&mut rest)).await.is_ok();
    (head, closed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_flood_at_the_limits_never_locks_the_writer_out() {
    let config = ServerConfig { max_connections: CONNECTIONS, ..ServerConfig::default() };
    let s = common::TestServer::start(config, None).await;
    let http = reqwest::Client::new();
    let r = http.put(s.url("s")).header("content-type", "text/plain").send().await.expect("put");
    assert_eq!(r.status(), 201);

    // Half again as many readers as may be let in, all at once.
    let flood: Vec<_> = (0..READERS + READERS / 2).map(|_| tokio::spawn(reader(s.addr))).collect();
    let mut served = Vec::new();
    let mut refused = 0;
    for r in flood {
        let (status, mut conn) = tokio::time::timeout(Duration::from_secs(10), r)
            .await
            .expect("every reader is answered, at once")
            .expect("task");
        if status.starts_with("HTTP/1.1 200") {
            served.push(conn);
        } else {
            assert!(status.starts_with("HTTP/1.1 503"), "{status}");
            let (head, closed) = head_and_close(&mut conn).await;
            assert!(head.contains("retry-after: 1") && head.contains("connection: close"), "{head}");
            assert!(closed, "a refused reader's connection is closed, so its place serves another");
            refused += 1;
        }
    }
    assert_eq!((served.len(), refused), (READERS, READERS / 2), "readers let in up to the bound, the rest refused");

    // The writer gets in at once, and every reader let in gets its message.
    let wrote = tokio::time::timeout(
        Duration::from_secs(5),
        http.post(s.url("s")).header("content-type", "text/plain").body("hello").send(),
    )
    .await;
    let wrote = wrote.expect("the writer is not stalled").expect("post");
    assert_eq!(wrote.status(), 204, "the writer is not refused");
    for (i, conn) in served.iter_mut().enumerate() {
        let mut seen = String::new();
        let got = tokio::time::timeout(Duration::from_secs(10), async {
            while !seen.contains("hello") {
                let mut line = String::new();
                if conn.read_line(&mut line).await.expect("event") == 0 {
                    break;
                }
                seen.push_str(&line);
            }
        })
        .await;
        assert!(got.is_ok() && seen.contains("hello"), "reader {i} got {seen:?}");
    }

    // Still full: one more reader is refused, and a catch-up read (no place held) is served.
    let (status, _) = reader(s.addr).await;
    assert!(status.starts_with("HTTP/1.1 503"), "{status}");
    let read = http.get(s.url("s?offset=-1")).send().await.expect("catch-up");
    assert_eq!(read.text().await.expect("text"), "hello");
    let scrape = http.get(format!("{}/metrics", s.origin)).send().await.expect("metrics").text().await.expect("text");
    let counted = scrape
        .lines()
        .find_map(|l| l.strip_prefix("oncelog_live_readers_refused_total{reason=\"connections\"} "))
        .and_then(|v| v.parse::<f64>().ok());
    assert_eq!(counted, Some((READERS / 2 + 1) as f64), "refusals are counted by their reason:\n{scrape}");
}
