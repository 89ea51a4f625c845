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
        let r = http.post(&url).header("content-type", "application/json").body(message.clone()).send().await.expect("post");
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
