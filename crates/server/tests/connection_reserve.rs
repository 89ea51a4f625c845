//! At `--max-connections`, every kind of slow client together never keeps a writer out (issue 45,
//! item 7: 320 reconnecting clients kept one out for 45 s). Idle keep-alive sockets make room for
//! a new connection; dripped bodies and catch-up readers that stop reading may hold all but a
//! reserve of the connections, beyond which the one slow the longest is closed. The timeouts that
//! would otherwise free a place (10-60 s by default) are far longer than the writer's deadline.

mod common;

use std::time::Duration;

use oncelog_server::ServerConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const CONNECTIONS: usize = 32;

/// What the writer is given to have its append acknowledged: well under every default timeout.
const WRITER_DEADLINE: Duration = Duration::from_secs(5);

async fn server() -> common::TestServer {
    let s =
        common::TestServer::start(ServerConfig { max_connections: CONNECTIONS, ..ServerConfig::default() }, None).await;
    let r = reqwest::Client::new().put(s.url("s")).header("content-type", "text/plain").send().await.expect("put");
    assert_eq!(r.status(), 201);
    s
}

/// A writer on a new connection has its append acknowledged within [`WRITER_DEADLINE`].
async fn writer_gets_in(s: &common::TestServer, what: &str) {
    let http = reqwest::Client::new();
    let wrote = tokio::time::timeout(
        WRITER_DEADLINE,
        http.post(s.url("s")).header("content-type", "text/plain").body("hello").send(),
    )
    .await
    .unwrap_or_else(|_| panic!("{what}: the writer was kept out for {WRITER_DEADLINE:?}"))
    .expect("post");
    assert_eq!(wrote.status(), 204, "{what}");
}

/// Keep-alive connections that each made a request, read its answer and then stay open, idle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_keep_alive_sockets_make_room_for_a_writer() {
    let s = server().await;
    let mut idle = Vec::new();
    for _ in 0..CONNECTIONS {
        let mut conn = TcpStream::connect(s.addr).await.expect("connect");
        conn.write_all(b"GET /v1/stream/s HTTP/1.1\r\nHost: t\r\n\r\n").await.expect("request");
        let mut buf = vec![0u8; 4096];
        let n = tokio::time::timeout(Duration::from_secs(5), conn.read(&mut buf)).await.expect("answer").expect("read");
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&buf[..n]));
        idle.push(conn);
    }
    writer_gets_in(&s, "idle keep-alive sockets").await;
}

/// New connections that never send a byte (each holds its place up to the header timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_sockets_make_room_for_a_writer() {
    let s = server().await;
    let mut silent = Vec::new();
    for _ in 0..CONNECTIONS {
        silent.push(TcpStream::connect(s.addr).await.expect("connect"));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    writer_gets_in(&s, "silent sockets").await;
}

/// Appends whose bodies are dripped a byte at a time, each well inside the pause limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dripped_bodies_leave_a_writer_room() {
    let s = server().await;
    let mut drips = Vec::new();
    for _ in 0..CONNECTIONS {
        let mut conn = TcpStream::connect(s.addr).await.expect("connect");
        conn.write_all(
            b"POST /v1/stream/s HTTP/1.1\r\nHost: t\r\nContent-Type: text/plain\r\nContent-Length: 1000\r\n\r\n",
        )
        .await
        .expect("head");
        drips.push(tokio::spawn(async move {
            for _ in 0..200 {
                if conn.write_all(b"x").await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    writer_gets_in(&s, "dripped bodies").await;
    // Nothing of a dripped body that was cut off was written: the stream holds the one append.
    let body = reqwest::get(s.url("s")).await.expect("get").text().await.expect("text");
    assert_eq!(body, "hello");
    for d in drips {
        d.abort();
    }
}

/// Catch-up reads of a large stream by clients that never read the answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catch_up_readers_that_stop_reading_leave_a_writer_room() {
    let s = server().await;
    let http = reqwest::Client::new();
    for _ in 0..4 {
        let r = http
            .post(s.url("s"))
            .header("content-type", "text/plain")
            .body(vec![b'x'; 4 << 20])
            .send()
            .await
            .expect("post");
        assert_eq!(r.status(), 204);
    }
    drop(http);
    let mut stalled = Vec::new();
    for _ in 0..CONNECTIONS {
        let mut conn = TcpStream::connect(s.addr).await.expect("connect");
        conn.write_all(b"GET /v1/stream/s?offset=-1 HTTP/1.1\r\nHost: t\r\n\r\n").await.expect("request");
        stalled.push(conn);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    writer_gets_in(&s, "catch-up readers that stop reading").await;
}
