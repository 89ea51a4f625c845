//! Both plain HTTP/1 engines (`--http1-engine hyper|oncelog`, issue 47) against the same raw
//! requests: requests whose framing two parties could read differently are refused and their
//! connection closed, so the request hidden behind them is never answered; pipelined requests
//! are answered in order; a body left unread ends the connection. The rest of the server's
//! suites run on the default engine.

mod common;

use std::time::Duration;

use oncelog_server::listen::Http1Engine;
use oncelog_server::ServerConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const ENGINES: [Http1Engine; 2] = [Http1Engine::Hyper, Http1Engine::Oncelog];

async fn server(engine: Http1Engine) -> common::TestServer {
    let s = common::TestServer::start(ServerConfig { http1_engine: engine, ..ServerConfig::default() }, None).await;
    let r = reqwest::Client::new().put(s.url("s")).header("content-type", "text/plain").send().await.expect("put");
    assert!(r.status().is_success());
    s
}

/// Writes `bytes` and reads until the server closes the connection (at most 5 s).
async fn exchange(s: &common::TestServer, bytes: &[u8]) -> (String, bool) {
    let mut conn = TcpStream::connect(s.addr).await.expect("connect");
    conn.write_all(bytes).await.expect("write");
    let mut got = Vec::new();
    let mut buf = vec![0u8; 16 << 10];
    let closed = loop {
        match tokio::time::timeout(Duration::from_secs(5), conn.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break true,
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Err(_) => break false,
        }
    };
    (String::from_utf8_lossy(&got).into_owned(), closed)
}

/// The statuses of the answers in `text` (a status line may follow a body without a break).
fn statuses(text: &str) -> Vec<&str> {
    text.match_indices("HTTP/1.1 ").filter_map(|(i, m)| text.get(i + m.len()..i + m.len() + 3)).collect()
}

/// Each case: a request whose framing is ambiguous, with a second request after it that a
/// server reading the framing the other way would answer.
const SMUGGLED: [(&str, &str); 6] = [
    (
        "Content-Length with Transfer-Encoding",
        "POST /v1/stream/s HTTP/1.1\r\nHost: t\r\nContent-Type: text/plain\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /v1/stream/s?offset=-1 HTTP/1.1\r\nHost: t\r\n\r\n",
    ),
    (
        "two Content-Lengths",
        "POST /v1/stream/s HTTP/1.1\r\nHost: t\r\nContent-Type: text/plain\r\nContent-Length: 2\r\nContent-Length: 50\r\n\r\nokGET /v1/stream/s?offset=-1 HTTP/1.1\r\nHost: t\r\n\r\n",
    ),
    (
        "a signed Content-Length",
        "POST /v1/stream/s HTTP/1.1\r\nHost: t\r\nContent-Type: text/plain\r\nContent-Length: +2\r\n\r\nokGET /v1/stream/s?offset=-1 HTTP/1.1\r\nHost: t\r\n\r\n",
    ),
    (
        "an obs-fold",
        "POST /v1/stream/s HTTP/1.1\r\nHost: t\r\nContent-Type: text/plain\r\nX-Folded: a\r\n Content-Length: 2\r\n\r\nokGET /v1/stream/s?offset=-1 HTTP/1.1\r\nHost: t\r\n\r\n",
    ),
    (
        "chunked not last",
        "POST /v1/stream/s HTTP/1.1\r\nHost: t\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked, identity\r\n\r\n2\r\nok\r\n0\r\n\r\nGET /v1/stream/s?offset=-1 HTTP/1.1\r\nHost: t\r\n\r\n",
    ),
    (
        "a chunk size that is not hex",
        "POST /v1/stream/s HTTP/1.1\r\nHost: t\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n0x2\r\nok\r\n0\r\n\r\nGET /v1/stream/s?offset=-1 HTTP/1.1\r\nHost: t\r\n\r\n",
    ),
];

#[tokio::test]
async fn ambiguous_framing_is_refused_and_what_hides_behind_it_never_answered() {
    for engine in ENGINES {
        let s = server(engine).await;
        for (name, text) in SMUGGLED {
            let (answer, closed) = exchange(&s, text.as_bytes()).await;
            let seen = statuses(&answer);
            assert_eq!(seen.len(), 1, "{engine:?}, {name}: one answer, not {seen:?}: {answer:?}");
            assert!(seen[0].starts_with('4') || seen[0].starts_with('5'), "{engine:?}, {name}: refused: {answer:?}");
            assert!(closed, "{engine:?}, {name}: the connection is closed");
        }
        // Nothing above was appended.
        let r = reqwest::get(format!("{}?offset=-1", s.url("s"))).await.expect("get");
        assert_eq!(r.text().await.expect("body"), "", "{engine:?}: no refused request wrote");
    }
}

#[tokio::test]
async fn pipelined_requests_are_answered_in_order_on_both_engines() {
    for engine in ENGINES {
        let s = server(engine).await;
        let text = "POST /v1/stream/s HTTP/1.1\r\nHost: t\r\nContent-Type: text/plain\r\nContent-Length: 3\r\n\r\nab,\
POST /v1/stream/s HTTP/1.1\r\nHost: t\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n2\r\ncd\r\n0\r\n\r\n\
GET /v1/stream/s?offset=-1 HTTP/1.1\r\nHost: t\r\n\r\n\
HEAD /v1/stream/s HTTP/1.1\r\nHost: t\r\n\r\n\
GET /v1/stream/missing HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n";
        let (answer, closed) = exchange(&s, text.as_bytes()).await;
        assert_eq!(statuses(&answer), ["204", "204", "200", "200", "404"], "{engine:?}: {answer:?}");
        assert!(answer.contains("\r\n\r\nab,cd"), "{engine:?}: the read holds both appends: {answer:?}");
        assert!(closed, "{engine:?}");
    }
}

#[tokio::test]
async fn expect_continue_gets_its_interim_answer_on_both_engines() {
    for engine in ENGINES {
        let s = server(engine).await;
        let mut conn = TcpStream::connect(s.addr).await.expect("connect");
        let head = "POST /v1/stream/s HTTP/1.1\r\nHost: t\r\nContent-Type: text/plain\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n";
        conn.write_all(head.as_bytes()).await.expect("head");
        let mut buf = vec![0u8; 4096];
        let n =
            tokio::time::timeout(Duration::from_secs(5), conn.read(&mut buf)).await.expect("interim").expect("read");
        assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 100 Continue\r\n"), "{engine:?}");
        conn.write_all(b"ok").await.expect("body");
        let n = tokio::time::timeout(Duration::from_secs(5), conn.read(&mut buf)).await.expect("answer").expect("read");
        assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 204"), "{engine:?}");
    }
}
