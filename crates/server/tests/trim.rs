//! Explicit trim over HTTP: `POST` with `Stream-Trim-To` moves the earliest offset; reads from
//! before it are `410` with `Stream-Earliest-Offset`; `offset=-1` starts there.

mod common;

use oncelog_protocol::Offset;
use oncelog_server::ServerConfig;
use reqwest::{Client, StatusCode};

/// A server with one new stream of content type `ct`: (server, client, the stream's URL).
async fn with_stream(name: &str, ct: &str) -> (common::TestServer, Client, String) {
    let s = common::TestServer::start(ServerConfig::default(), None).await;
    let http = Client::new();
    let url = s.url(name);
    let r = http.put(&url).header("content-type", ct).send().await.expect("put");
    assert_eq!(r.status(), StatusCode::CREATED);
    (s, http, url)
}

fn header(r: &reqwest::Response, name: &str) -> Option<String> {
    r.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned)
}

#[tokio::test]
async fn trimmed_offsets_are_gone_and_the_beginning_moves() {
    let (s, http, url) = with_stream("s", "text/plain").await;
    for part in ["abc", "def"] {
        http.post(&url).header("content-type", "text/plain").body(part).send().await.expect("post");
    }
    let trim = |to: String| http.post(&url).header("stream-trim-to", to).send();
    let r = trim(Offset(3).to_string()).await.expect("trim");
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    assert_eq!(header(&r, "stream-earliest-offset"), Some(Offset(3).to_string()));
    assert_eq!(header(&r, "stream-next-offset"), Some(Offset(6).to_string()));
    // A lower trim changes nothing; beyond the tail or malformed is 400.
    let r = trim(Offset(1).to_string()).await.expect("trim");
    assert_eq!(
        (r.status(), header(&r, "stream-earliest-offset")),
        (StatusCode::NO_CONTENT, Some(Offset(3).to_string()))
    );
    assert_eq!(trim(Offset(7).to_string()).await.expect("trim").status(), StatusCode::BAD_REQUEST);
    assert_eq!(trim("now".into()).await.expect("trim").status(), StatusCode::BAD_REQUEST);
    // A trim writes nothing: with a body or write headers it is refused.
    let with_body = http
        .post(&url)
        .header("stream-trim-to", Offset(4).to_string())
        .header("content-type", "text/plain")
        .body("x")
        .send()
        .await
        .expect("post");
    assert_eq!(with_body.status(), StatusCode::BAD_REQUEST);
    let with_close = http
        .post(&url)
        .header("stream-trim-to", Offset(4).to_string())
        .header("stream-closed", "true")
        .send()
        .await
        .expect("post");
    assert_eq!(with_close.status(), StatusCode::BAD_REQUEST);
    // HEAD shows it; -1 starts there; anything before it is 410 in every read mode.
    let head = http.head(&url).send().await.expect("head");
    assert_eq!(header(&head, "stream-earliest-offset"), Some(Offset(3).to_string()));
    assert_eq!(http.get(format!("{url}?offset=-1")).send().await.expect("get").text().await.expect("text"), "def");
    for q in ["", "&live=long-poll", "&live=sse"] {
        let r = http.get(format!("{url}?offset={}{q}", Offset(1))).send().await.expect("get");
        assert_eq!(r.status(), StatusCode::GONE, "{q}");
        assert_eq!(header(&r, "stream-earliest-offset"), Some(Offset(3).to_string()), "{q}");
        assert_eq!(header(&r, "cache-control").as_deref(), Some("no-store"), "{q}");
    }
    // Forking from before the earliest offset: 410 too.
    let fork = http
        .put(s.url("f"))
        .header("content-type", "text/plain")
        .header("stream-forked-from", "/v1/stream/s")
        .header("stream-fork-offset", Offset(2).to_string())
        .send()
        .await
        .expect("fork");
    assert_eq!(fork.status(), StatusCode::GONE);
}

#[tokio::test]
async fn a_json_stream_is_trimmed_only_at_a_message_boundary() {
    let (_server, http, url) = with_stream("j", "application/json").await;
    let first =
        http.post(&url).header("content-type", "application/json").body(r#"{"a":1}"#).send().await.expect("post");
    let boundary = header(&first, "stream-next-offset").expect("offset");
    http.post(&url).header("content-type", "application/json").body(r#"{"b":2}"#).send().await.expect("post");
    let inside = http.post(&url).header("stream-trim-to", Offset(2).to_string()).send().await.expect("trim");
    assert_eq!(inside.status(), StatusCode::BAD_REQUEST);
    let at = http.post(&url).header("stream-trim-to", &boundary).send().await.expect("trim");
    assert_eq!(at.status(), StatusCode::NO_CONTENT);
    let body = http.get(format!("{url}?offset=-1")).send().await.expect("get").text().await.expect("text");
    assert_eq!(body, r#"[{"b":2}]"#);
}

/// An SSE reader that lags behind a trim is told so: its response ends with a control event
/// whose `endReason` is `trimmed` (and its reconnect gets the 410).
#[tokio::test]
async fn an_sse_reader_overtaken_by_a_trim_is_told_why_its_response_ends() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (s, http, url) = with_stream("t", "application/octet-stream").await;
    // More than the socket buffers of a reader that does not read yet can hold (~4-6 MB on
    // loopback): the server's SSE state is still behind when the trim comes.
    let piece = vec![7u8; 1 << 20];
    for _ in 0..12 {
        http.post(&url)
            .header("content-type", "application/octet-stream")
            .body(piece.clone())
            .send()
            .await
            .expect("post");
    }
    let mut conn = tokio::net::TcpStream::connect(s.addr).await.expect("connect");
    conn.write_all(format!("GET /v1/stream/t?offset={}&live=sse HTTP/1.1\r\nHost: t\r\n\r\n", Offset(0)).as_bytes())
        .await
        .expect("request");
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let r = http.post(&url).header("stream-trim-to", Offset(12 << 20).to_string()).send().await.expect("trim");
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    // Drain the rest: it ends with the explanation.
    let mut rest = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    let found = tokio::time::timeout(std::time::Duration::from_secs(20), async {
        loop {
            let n = conn.read(&mut buf).await.expect("read");
            if n == 0 {
                return false;
            }
            rest.extend_from_slice(&buf[..n]);
            let needle = br#""endReason":"trimmed""#;
            if rest.windows(needle.len()).any(|w| w == needle) {
                return true;
            }
        }
    })
    .await
    .expect("the response went on without ending");
    assert!(found, "the response ended without saying it was trimmed");
}
