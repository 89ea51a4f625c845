//! HTTP/2 readers that stall a response through flow control (issue 45, item 8). Such a client
//! drains its socket and answers PINGs, so no write to it ever blocks, but it never opens the
//! window of its stream: the answer stops, and before the fix its connection stayed open forever,
//! holding the answer's pieces (mapped segment ranges, so a deleted segment's disk space too).
//! `--write-timeout-ms` now applies to such a stream as it does to an HTTP/1 reader that stops
//! reading: its connection is closed. Live readers waiting for data longer than that are not
//! stalled, and keep theirs. Driven with the `h2` crate, which lets a test choose its windows.

mod common;

use std::time::Duration;

use axum::http;
use bytes::Bytes;
use oncelog_server::ServerConfig;
use reqwest::StatusCode;

const WRITE_TIMEOUT: Duration = Duration::from_millis(500);

/// How long a stalled connection may take to be closed: far above the write timeout (and its
/// timer's granularity on a loaded machine), far below "never".
const CLOSED_WITHIN: Duration = Duration::from_secs(10);

fn config() -> ServerConfig {
    ServerConfig {
        write_timeout: WRITE_TIMEOUT,
        // Catch-up answers of more than this are streamed a read at a time (mapped segment pieces).
        max_read_bytes: 64 << 10,
        long_poll_timeout: Duration::from_secs(5),
        ..ServerConfig::default()
    }
}

/// Creates `path` holding `len` bytes; answers its tail offset.
async fn stream_of(s: &common::TestServer, path: &str, len: usize) -> String {
    let http = reqwest::Client::new();
    let r = http.put(s.url(path)).header("content-type", "text/plain").send().await.expect("put");
    assert_eq!(r.status(), StatusCode::CREATED);
    let r = http.post(s.url(path)).header("content-type", "text/plain").body(body(len)).send().await.expect("post");
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    r.headers().get("stream-next-offset").and_then(|v| v.to_str().ok()).expect("tail").to_owned()
}

fn body(len: usize) -> Vec<u8> {
    (0..len).map(|i| b'a' + (i % 26) as u8).collect()
}

/// An HTTP/2 connection (h2c) with `window` as its streams' initial window, driven by a task of
/// its own (so PINGs are answered) that ends when the connection does.
async fn h2_connect(
    s: &common::TestServer,
    window: u32,
) -> (h2::client::SendRequest<Bytes>, tokio::task::JoinHandle<()>) {
    let io = tokio::net::TcpStream::connect(s.addr).await.expect("connect");
    let (client, conn) =
        h2::client::Builder::new().initial_window_size(window).handshake(io).await.expect("h2 handshake");
    let driven = tokio::spawn(async move {
        let _ = conn.await;
    });
    (client, driven)
}

async fn get(client: &mut h2::client::SendRequest<Bytes>, url: &str) -> http::Response<h2::RecvStream> {
    let req = http::Request::get(url).body(()).expect("request");
    let (resp, _) = client.send_request(req, true).expect("send request");
    tokio::time::timeout(CLOSED_WITHIN, resp).await.expect("answer in time").expect("answer")
}

/// Reads `body` to its end, opening the window for what it read (what a normal reader does).
async fn read_all(body: &mut h2::RecvStream) -> Vec<u8> {
    let mut got = Vec::new();
    while let Some(data) = tokio::time::timeout(CLOSED_WITHIN, body.data()).await.expect("data in time") {
        let data = data.expect("data");
        got.extend_from_slice(&data);
        body.flow_control().release_capacity(data.len()).expect("release");
    }
    got
}

/// Asks for `path` from its start on a connection whose stream window is 16 bytes and never
/// opens it, while the connection is driven; answers whether the server closed it in time.
async fn stalled_reader_is_closed(s: &common::TestServer, path: &str) -> bool {
    let (mut client, driven) = h2_connect(s, 16).await;
    let resp = get(&mut client, &(s.url(path) + "?offset=-1")).await;
    assert_eq!(resp.status(), StatusCode::OK);
    // The body is kept (dropping it would reset the stream) and never read.
    let _body = resp.into_body();
    tokio::time::timeout(CLOSED_WITHIN, driven).await.is_ok()
}

#[tokio::test]
async fn an_http2_reader_that_never_opens_its_window_is_closed_after_the_write_timeout() {
    let s = common::TestServer::start(config(), None).await;
    // A catch-up answer streamed in pieces (1 MiB, read 64 KiB at a time) ...
    stream_of(&s, "big", 1 << 20).await;
    assert!(stalled_reader_is_closed(&s, "big").await, "a stream stalled mid-answer kept its connection");
    // ... and one held whole, smaller than a piece: stalled on its last bytes, which must not be
    // handed to HTTP/2 with the end of the answer while the window does not let them out.
    stream_of(&s, "small", 1000).await;
    assert!(stalled_reader_is_closed(&s, "small").await, "a stream stalled on its last bytes kept its connection");
}

#[tokio::test]
async fn http2_readers_that_read_or_wait_for_data_keep_their_connection() {
    let s = common::TestServer::start(config(), None).await;
    let tail = stream_of(&s, "live", 10).await;
    stream_of(&s, "big", 1 << 20).await;
    stream_of(&s, "small", 1000).await;
    // Default windows (64 KiB): a normal reader, on one connection.
    let (mut client, driven) = h2_connect(&s, 65_535).await;
    // An SSE reader and a long-poll, both waiting for data far longer than the write timeout.
    let mut sse = get(&mut client, &(s.url("live") + &format!("?offset={tail}&live=sse"))).await.into_body();
    let long_poll = {
        let req = http::Request::get(s.url("live") + &format!("?offset={tail}&live=long-poll")).body(()).expect("req");
        client.send_request(req, true).expect("send request").0
    };
    tokio::time::sleep(WRITE_TIMEOUT * 4).await;
    assert!(!driven.is_finished(), "the connection of readers waiting for data was closed");
    let r = reqwest::Client::new()
        .post(s.url("live"))
        .header("content-type", "text/plain")
        .body("hello")
        .send()
        .await
        .expect("post");
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let mut seen = String::new();
    while !seen.contains("hello") {
        let data = tokio::time::timeout(CLOSED_WITHIN, sse.data()).await.expect("event in time");
        let data = data.expect("the SSE answer went on").expect("data");
        sse.flow_control().release_capacity(data.len()).expect("release");
        seen.push_str(&String::from_utf8_lossy(&data));
    }
    let mut long_poll = tokio::time::timeout(CLOSED_WITHIN, long_poll).await.expect("in time").expect("long-poll");
    assert_eq!(long_poll.status(), StatusCode::OK);
    assert_eq!(read_all(long_poll.body_mut()).await, b"hello");
    // Catch-up answers larger than the window arrive whole, with their length, on the same
    // connection.
    for (path, len) in [("big", 1 << 20), ("small", 1000)] {
        let mut resp = get(&mut client, &(s.url(path) + "?offset=-1")).await;
        let length = resp.headers().get("content-length").and_then(|v| v.to_str().ok()).map(str::to_owned);
        assert_eq!(length, Some(len.to_string()), "{path}");
        assert!(read_all(resp.body_mut()).await == body(len), "{path}: the answer arrived altered");
    }
    assert!(!driven.is_finished(), "a reader that reads lost its connection");
}
