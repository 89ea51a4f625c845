//! End-to-end scenarios through a real server on a loopback port 0, for behaviour the official
//! conformance suite does not reach: our extensions, limits, and the quality of error answers.

mod common;

use std::sync::Arc;
use std::time::Duration;

use oncelog_server::{ManualClock, ServerConfig};
use reqwest::{Client, StatusCode};

struct TestServer {
    base: String,
    clock: Arc<ManualClock>,
    http: Client,
    _server: common::TestServer,
}

impl TestServer {
    async fn start() -> Self {
        let clock = Arc::new(ManualClock::new(1_700_000_000_000));
        let config = ServerConfig {
            long_poll_timeout: Duration::from_millis(300),
            max_append_bytes: 64 * 1024,
            ..ServerConfig::default()
        };
        let server = common::TestServer::start(config, Some(clock.clone())).await;
        TestServer { base: server.base.clone(), clock, http: Client::new(), _server: server }
    }

    fn url(&self, path: &str) -> String {
        format!("{}/{path}", self.base)
    }

    async fn put(&self, path: &str, headers: &[(&str, &str)]) -> reqwest::Response {
        let mut req = self.http.put(self.url(path)).header("content-type", "text/plain");
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        req.send().await.expect("put")
    }

    async fn post(&self, path: &str, body: &'static str, headers: &[(&str, &str)]) -> reqwest::Response {
        let mut req = self.http.post(self.url(path)).header("content-type", "text/plain").body(body);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        req.send().await.expect("post")
    }
}

fn header(r: &reqwest::Response, name: &str) -> Option<String> {
    r.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned)
}

#[tokio::test]
async fn duplicate_retry_learns_where_its_append_landed() {
    let s = TestServer::start().await;
    s.put("d", &[]).await;
    let p = |seq: &'static str| [("producer-id", "p"), ("producer-epoch", "0"), ("producer-seq", seq)];
    let first = s.post("d", "aaaa", &p("0")).await;
    assert_eq!(first.status(), StatusCode::OK);
    let first_end = header(&first, "stream-next-offset").expect("offset");
    // Another writer appends in between, so the tail moves past the first append.
    s.post("d", "bb", &[]).await;
    let retry = s.post("d", "aaaa", &p("0")).await;
    assert_eq!(retry.status(), StatusCode::NO_CONTENT);
    assert_eq!(header(&retry, "stream-next-offset"), Some(first_end), "the original append's end, not the tail");
    assert_eq!(header(&retry, "producer-seq").as_deref(), Some("0"));
    let body = s.http.get(s.url("d")).send().await.expect("get").text().await.expect("text");
    assert_eq!(body, "aaaabb");
}

#[tokio::test]
async fn oversize_body_is_refused_with_413_and_nothing_is_written() {
    let s = TestServer::start().await;
    s.put("big", &[]).await;
    let big = vec![b'x'; 64 * 1024 + 1];
    let r = s.http.post(s.url("big")).header("content-type", "text/plain").body(big).send().await.expect("post");
    assert_eq!(r.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let head = s.http.head(s.url("big")).send().await.expect("head");
    assert_eq!(header(&head, "stream-next-offset").as_deref(), Some("0000000000000000_0000000000000000"));
}

#[tokio::test]
async fn malformed_input_gets_400_with_a_one_line_reason() {
    let s = TestServer::start().await;
    s.put("m", &[]).await;
    let cases: Vec<(reqwest::RequestBuilder, &str)> = vec![
        (s.http.put(s.url("m2")).header("stream-ttl", "01"), "Stream-TTL"),
        (s.http.put(s.url("m2")).header("stream-expires-at", "soon"), "Stream-Expires-At"),
        (s.http.put(s.url("m2")).header("content-type", "nonsense"), "Content-Type"),
        (s.http.get(s.url("m") + "?offset=12"), "offset"),
        (s.http.get(s.url("m") + "?offset=-1&live=forever"), "live"),
        (s.http.post(s.url("m")).header("content-type", "text/plain").header("producer-id", "p").body("x"), "together"),
        (s.http.post(s.url("m")).header("content-type", "text/plain"), "empty body"),
        (s.http.post(s.url("m")).body("x"), "Content-Type is required"),
    ];
    for (req, reason) in cases {
        let r = req.send().await.expect("send");
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{reason}");
        let text = r.text().await.expect("text");
        assert!(text.contains(reason) && text.trim_end().lines().count() == 1, "{reason}: {text:?}");
    }
    // Invalid JSON on a JSON stream, and an empty array append.
    s.http.put(s.url("j")).header("content-type", "application/json").send().await.expect("put");
    for body in ["{nope", "[]"] {
        let r =
            s.http.post(s.url("j")).header("content-type", "application/json").body(body).send().await.expect("post");
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{body}");
    }
}

#[tokio::test]
async fn unknown_methods_and_paths_are_refused_clearly() {
    let s = TestServer::start().await;
    let r = s.http.patch(s.url("x")).send().await.expect("patch");
    assert_eq!(r.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert!(header(&r, "allow").is_some_and(|a| a.contains("POST")));
    let r = s.http.get(s.base.replace("/v1/stream", "/nope")).send().await.expect("get");
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    assert_eq!(header(&r, "x-content-type-options").as_deref(), Some("nosniff"));
    let r = s.http.get(s.url("__ds/subscriptions/a")).send().await.expect("get");
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn ttl_slides_on_reads_but_not_on_head() {
    let s = TestServer::start().await;
    assert_eq!(s.put("t", &[("stream-ttl", "10")]).await.status(), StatusCode::CREATED);
    s.clock.advance_ms(6_000);
    assert_eq!(s.http.head(s.url("t")).send().await.expect("head").status(), StatusCode::OK);
    s.clock.advance_ms(6_000);
    assert_eq!(
        s.http.head(s.url("t")).send().await.expect("head").status(),
        StatusCode::NOT_FOUND,
        "HEAD did not slide it"
    );

    s.put("u", &[("stream-ttl", "10")]).await;
    s.clock.advance_ms(6_000);
    assert_eq!(s.http.get(s.url("u")).send().await.expect("get").status(), StatusCode::OK);
    s.clock.advance_ms(6_000);
    assert_eq!(s.http.head(s.url("u")).send().await.expect("head").status(), StatusCode::OK, "GET slid the window");
}

#[tokio::test]
async fn long_poll_wakes_on_append_and_sse_ends_at_closure() {
    let s = TestServer::start().await;
    s.put("l", &[]).await;
    let tail = header(&s.http.head(s.url("l")).send().await.expect("head"), "stream-next-offset").expect("tail");
    let waiter = {
        let (http, url) = (s.http.clone(), format!("{}?offset={tail}&live=long-poll", s.url("l")));
        tokio::spawn(async move { http.get(url).send().await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    s.post("l", "wake", &[]).await;
    let r = waiter.await.expect("join").expect("get");
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.text().await.expect("text"), "wake");

    let r = s.http.post(s.url("l")).header("stream-closed", "true").send().await.expect("close");
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    // SSE from the start delivers the data, then a closing control event, then ends by itself.
    let text = tokio::time::timeout(
        Duration::from_secs(5),
        s.http.get(format!("{}?offset=-1&live=sse", s.url("l"))).send().await.expect("sse").text(),
    )
    .await
    .expect("SSE response ended")
    .expect("text");
    assert!(text.starts_with("event: data\ndata:wake\n\nevent: control\n"), "{text}");
    assert!(text.contains("\"streamClosed\":true") && !text.contains("streamCursor"), "{text}");
}

#[tokio::test]
async fn oversized_identifiers_are_refused_and_writes_keep_working() {
    let s = TestServer::start().await;
    s.put("o", &[]).await;
    let long_path = "p".repeat(5000);
    assert_eq!(s.put(&long_path, &[]).await.status(), StatusCode::BAD_REQUEST);
    let long_id = "i".repeat(70_000);
    let r = s.post("o", "x", &[("producer-id", &long_id), ("producer-epoch", "0"), ("producer-seq", "0")]).await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let long_seq = "s".repeat(2000);
    assert_eq!(s.post("o", "x", &[("stream-seq", &long_seq)]).await.status(), StatusCode::BAD_REQUEST);
    // Nothing above reached storage or hurt the writer.
    let ok = s.post("o", "fine", &[("producer-id", "p"), ("producer-epoch", "0"), ("producer-seq", "0")]).await;
    assert_eq!(ok.status(), StatusCode::OK);
}

#[tokio::test]
async fn an_open_sse_connection_keeps_a_short_ttl_stream_alive() {
    let s = TestServer::start().await;
    assert_eq!(s.put("sse-ttl", &[("stream-ttl", "2")]).await.status(), StatusCode::CREATED);
    let mut sse = s.http.get(format!("{}?offset=-1&live=sse", s.url("sse-ttl"))).send().await.expect("sse");
    assert_eq!(sse.status(), StatusCode::OK);
    let first = sse.chunk().await.expect("read").expect("initial control event");
    assert!(String::from_utf8_lossy(&first).contains("upToDate"));
    // Time passes beyond the TTL while the reader stays connected: its waits renew the window.
    for _ in 0..2 {
        s.clock.advance_ms(1_500);
        tokio::time::sleep(Duration::from_millis(1_300)).await;
    }
    assert_eq!(s.http.head(s.url("sse-ttl")).send().await.expect("head").status(), StatusCode::OK);
    drop(sse);
}

#[tokio::test]
async fn chained_long_polls_keep_a_short_ttl_stream_alive() {
    let s = TestServer::start().await;
    s.put("lp-ttl", &[("stream-ttl", "2")]).await;
    let tail = header(&s.http.head(s.url("lp-ttl")).send().await.expect("head"), "stream-next-offset").expect("tail");
    // This server's long-poll lasts 300 ms; chain polls the way a client does while the clock
    // runs past the TTL; each poll's wait renews the window.
    let url = format!("{}?offset={tail}&live=long-poll", s.url("lp-ttl"));
    for _ in 0..4 {
        s.clock.advance_ms(900);
        let r = s.http.get(&url).send().await.expect("poll");
        assert_eq!(r.status(), StatusCode::NO_CONTENT);
    }
    assert_eq!(s.http.head(s.url("lp-ttl")).send().await.expect("head").status(), StatusCode::OK);
}
