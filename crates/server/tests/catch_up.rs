//! Catch-up responses of a byte stream: one response runs from the offset asked to the tail or
//! `catch_up_bytes` further, streamed from storage `max_read_bytes` at a time, with its exact
//! `Content-Length`; JSON streams keep whole-message responses of `max_read_bytes`.

mod common;

use oncelog_protocol::Offset;
use oncelog_server::ServerConfig;
use reqwest::{Client, StatusCode};

fn header(r: &reqwest::Response, name: &str) -> Option<String> {
    r.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned)
}

fn config() -> ServerConfig {
    ServerConfig { max_read_bytes: 64 << 10, catch_up_bytes: 300_000, ..ServerConfig::default() }
}

/// Ten appends of 50,000 bytes, each a different byte value, so a misplaced piece shows.
async fn ten_appends(http: &Client, url: &str, ct: &str) -> Vec<u8> {
    let r = http.put(url).header("content-type", ct).send().await.expect("put");
    assert_eq!(r.status(), StatusCode::CREATED);
    let mut all = Vec::new();
    for i in 0..10u8 {
        let part = vec![b'a' + i; 50_000];
        let r = http.post(url).header("content-type", ct).body(part.clone()).send().await.expect("post");
        assert_eq!(r.status(), StatusCode::NO_CONTENT);
        all.extend_from_slice(&part);
    }
    all
}

#[tokio::test]
async fn a_catch_up_response_runs_to_catch_up_bytes_then_to_the_tail() {
    let s = common::TestServer::start(config(), None).await;
    let http = Client::new();
    let url = s.url("long");
    let all = ten_appends(&http, &url, "application/octet-stream").await;

    // From the start: 300,000 bytes (six appends), read in pieces of 64 KiB, sized in advance.
    let r = http.get(format!("{url}?offset=-1")).send().await.expect("get");
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(header(&r, "content-length").as_deref(), Some("300000"));
    assert_eq!(header(&r, "transfer-encoding"), None);
    assert_eq!(header(&r, "stream-next-offset"), Some(Offset(300_000).to_string()));
    assert_eq!(header(&r, "stream-up-to-date"), None);
    let etag = header(&r, "etag").expect("etag");
    let first = r.bytes().await.expect("body");
    assert!(first[..] == all[..300_000], "the first response holds the stream's first 300,000 bytes");

    // The same request again is the same response, so a cache keyed by offset stays right.
    let r = http.get(format!("{url}?offset=-1")).header("if-none-match", &etag).send().await.expect("get again");
    assert_eq!(r.status(), StatusCode::NOT_MODIFIED);

    // From inside an append (a byte stream can be read from any offset) to the tail.
    let r = http.get(format!("{url}?offset={}", Offset(300_000))).send().await.expect("get rest");
    assert_eq!(header(&r, "content-length").as_deref(), Some("200000"));
    assert_eq!(header(&r, "stream-next-offset"), Some(Offset(500_000).to_string()));
    assert_eq!(header(&r, "stream-up-to-date").as_deref(), Some("true"));
    let rest = r.bytes().await.expect("body");
    assert!(rest[..] == all[300_000..], "the second response holds the rest");

    // A start inside an append, a response ending inside another.
    let r = http.get(format!("{url}?offset={}", Offset(25_000))).send().await.expect("get mid");
    assert_eq!(header(&r, "stream-next-offset"), Some(Offset(325_000).to_string()));
    let mid = r.bytes().await.expect("body");
    assert!(mid[..] == all[25_000..325_000], "a response from inside an append");
}

#[tokio::test]
async fn a_json_stream_keeps_whole_message_responses() {
    let s = common::TestServer::start(config(), None).await;
    let http = Client::new();
    let url = s.url("msgs");
    let r = http.put(&url).header("content-type", "application/json").send().await.expect("put");
    assert_eq!(r.status(), StatusCode::CREATED);
    let message = format!("\"{}\"", "m".repeat(40_000));
    for _ in 0..4 {
        let r = http
            .post(&url)
            .header("content-type", "application/json")
            .body(message.clone())
            .send()
            .await
            .expect("post");
        assert_eq!(r.status(), StatusCode::NO_CONTENT);
    }
    // Whole messages up to max_read_bytes (64 KiB): two of about 40 KB, rendered as one array.
    let r = http.get(format!("{url}?offset=-1")).send().await.expect("get");
    let next = header(&r, "stream-next-offset").expect("next");
    let body: serde_json::Value = serde_json::from_slice(&r.bytes().await.expect("body")).expect("a JSON array");
    assert_eq!(body.as_array().map(Vec::len), Some(2));
    // Each message is stored with its separator: 40,002 bytes of JSON and one more.
    assert_eq!(next, Offset(2 * 40_003).to_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_whose_stream_is_deleted_midway_is_cut_not_padded_or_hung() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let config = ServerConfig { max_read_bytes: 64 << 10, ..ServerConfig::default() };
    let s = common::TestServer::start(config, None).await;
    let http = Client::new();
    let url = s.url("doomed");
    let r = http.put(&url).header("content-type", "application/octet-stream").send().await.expect("put");
    assert_eq!(r.status(), StatusCode::CREATED);
    // 32 MiB: more than the loopback socket buffers hold, so the response is still being read
    // from storage when the stream goes.
    for i in 0..32u8 {
        let r = http
            .post(&url)
            .header("content-type", "application/octet-stream")
            .body(vec![i; 1 << 20])
            .send()
            .await
            .expect("post");
        assert_eq!(r.status(), StatusCode::NO_CONTENT);
    }
    let mut conn = tokio::net::TcpStream::connect(s.addr).await.expect("connect");
    conn.write_all(b"GET /v1/stream/doomed?offset=-1 HTTP/1.1\r\nHost: t\r\n\r\n").await.expect("request");
    let mut got = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    let head_end = loop {
        let n = conn.read(&mut buf).await.expect("head");
        assert!(n > 0, "closed before the head");
        got.extend_from_slice(&buf[..n]);
        if let Some(i) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8_lossy(&got[..head_end]).to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(head.contains(&format!("content-length: {}\r\n", 32 << 20)), "{head}");
    // The reader stops reading; the server fills the socket and waits. The stream goes.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(http.delete(&url).send().await.expect("delete").status(), StatusCode::NO_CONTENT);
    let mut body = got.len() - head_end;
    let read_rest = async {
        loop {
            match conn.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => body += n,
            }
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(10), read_rest)
        .await
        .expect("the connection is closed, not left hanging");
    assert!(body < 32 << 20, "the body is cut short of its Content-Length: {body} bytes");
    assert!(body > 0, "what was sent before the delete arrived");
}

#[tokio::test]
async fn a_streamed_response_counts_as_one_read_of_all_its_bytes() {
    let config = ServerConfig { metrics_streams: Some("long".into()), ..config() };
    let s = common::TestServer::start(config, None).await;
    let http = Client::new();
    let url = s.url("long");
    ten_appends(&http, &url, "application/octet-stream").await;
    let body = http.get(format!("{url}?offset=-1")).send().await.expect("get").bytes().await.expect("body");
    assert_eq!(body.len(), 300_000);
    let m = http.get(format!("{}/metrics", s.origin)).send().await.expect("scrape").text().await.expect("text");
    let sample = |name: &str| {
        let key = format!("{name}{{stream=\"long\"}} ");
        m.lines().find_map(|l| l.strip_prefix(&key)).map(str::to_owned)
    };
    // Five pieces of 64 KiB after the first read: still one read, of 300,000 bytes.
    assert_eq!(sample("oncelog_stream_reads_total").as_deref(), Some("1"), "{m}");
    assert_eq!(sample("oncelog_stream_read_bytes_total").as_deref(), Some("300000"), "{m}");
}

/// Appends of 300,000 bytes read back from their segment: each read of one such append is the
/// segment's mapped range, sent with `sendfile(2)` on a plain connection. The bytes must be the
/// stream's exactly, from every start: an append's start, inside one, across appends.
#[tokio::test]
async fn large_appends_sent_from_their_segment_are_the_stream_bytes() {
    let config = ServerConfig { max_read_bytes: 300_000, catch_up_bytes: 1 << 30, ..ServerConfig::default() };
    let s = common::TestServer::start(config, None).await;
    let http = Client::new();
    let url = s.url("big");
    let r = http.put(&url).header("content-type", "application/octet-stream").send().await.expect("put");
    assert_eq!(r.status(), StatusCode::CREATED);
    let mut all = Vec::new();
    for i in 0..6u32 {
        let part: Vec<u8> = (0..300_000u32).map(|k| ((k * 7 + i * 13) % 251) as u8).collect();
        let r = http
            .post(&url)
            .header("content-type", "application/octet-stream")
            .body(part.clone())
            .send()
            .await
            .expect("post");
        assert_eq!(r.status(), StatusCode::NO_CONTENT);
        all.extend_from_slice(&part);
    }
    // Over HTTP/1 and over h2c (where the slices sent from the file are DATA frames' payloads).
    let h2 = Client::builder().http2_prior_knowledge().build().expect("h2c client");
    for client in [&h2, &http] {
        for from in [0u64, 300_000, 123_457, 899_999, 1_799_999] {
            let r = client.get(format!("{url}?offset={}", Offset(from))).send().await.expect("get");
            assert_eq!(r.status(), StatusCode::OK);
            assert_eq!(header(&r, "stream-next-offset"), Some(Offset(1_800_000).to_string()));
            let version = r.version();
            let body = r.bytes().await.expect("body");
            assert_eq!(body.len(), all.len() - from as usize, "from {from} ({version:?})");
            assert!(body[..] == all[from as usize..], "the bytes from {from} ({version:?})");
        }
    }
}
