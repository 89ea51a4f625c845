//! What a browser needs of the server, found by running it under Chromium: a native
//! `EventSource` resumes where it stopped (`id:` on control events, `Last-Event-ID`), a page can
//! read `Retry-After` and `WWW-Authenticate`, and `Location` names the URL the client used.

mod common;

use std::time::Duration;

use oncelog_server::ServerConfig;
use reqwest::StatusCode;

fn header(r: &reqwest::Response, name: &str) -> Option<String> {
    r.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned)
}

/// Reads an SSE response until it ends (bounded), as text.
async fn sse_text(r: reqwest::Response) -> String {
    tokio::time::timeout(Duration::from_secs(10), r.text()).await.expect("the SSE response ends").expect("body")
}

#[tokio::test]
async fn an_event_source_reconnecting_with_last_event_id_resumes_instead_of_replaying() {
    let config = ServerConfig { sse_max_duration: Duration::from_millis(300), ..ServerConfig::default() };
    let s = common::TestServer::start(config, None).await;
    let http = reqwest::Client::new();
    http.put(s.url("t")).header("content-type", "text/plain").send().await.expect("put");
    let a = http.post(s.url("t")).header("content-type", "text/plain").body("first").send().await.expect("post");
    let after_a = header(&a, "stream-next-offset").expect("offset");

    // Every control event carries the next offset as its id.
    let url = format!("{}?offset=-1&live=sse", s.url("t"));
    let text = sse_text(http.get(&url).send().await.expect("sse")).await;
    assert!(text.contains("event: control\ndata:{") && text.contains(&format!("\nid:{after_a}\n\n")), "{text}");

    // The browser reconnects to the URL it was opened with (offset=-1), saying where it was.
    http.post(s.url("t")).header("content-type", "text/plain").body("second").send().await.expect("post");
    let text = sse_text(http.get(&url).header("last-event-id", &after_a).send().await.expect("sse")).await;
    assert!(text.contains("data:second") && !text.contains("first"), "{text}");

    // A Last-Event-ID that is no offset is a 400, like a bad offset; an empty one is absent.
    let r = http.get(&url).header("last-event-id", "nonsense").send().await.expect("sse");
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let text = sse_text(http.get(&url).header("last-event-id", "").send().await.expect("sse")).await;
    assert!(text.contains("data:first"), "{text}");
    // Only SSE reads take it: a catch-up read follows its `offset`.
    let r = http.get(format!("{}?offset=-1", s.url("t"))).header("last-event-id", &after_a).send().await.expect("get");
    assert_eq!(r.text().await.expect("text"), "firstsecond");
}

#[tokio::test]
async fn a_page_may_read_retry_after_and_www_authenticate() {
    let s = common::TestServer::start(ServerConfig::default(), None).await;
    let r = reqwest::get(s.url("nothing")).await.expect("get");
    let exposed = header(&r, "access-control-expose-headers").expect("exposed");
    let names: Vec<&str> = exposed.split(',').map(str::trim).collect();
    for name in ["retry-after", "www-authenticate", "stream-next-offset", "location"] {
        assert!(names.contains(&name), "{name} not in {exposed}");
    }
    // An EventSource's reconnect sends Last-Event-ID: a preflight for it is granted.
    let r = reqwest::Client::new()
        .request(reqwest::Method::OPTIONS, s.url("t"))
        .header("origin", "https://app.example")
        .header("access-control-request-method", "GET")
        .send()
        .await
        .expect("preflight");
    assert!(header(&r, "access-control-allow-headers").is_some_and(|h| h.contains("last-event-id")));
}

#[tokio::test]
async fn location_names_the_authority_the_request_was_sent_to() {
    let s = common::TestServer::start(ServerConfig::default(), None).await;
    let http = reqwest::Client::new();
    let r = http.put(s.url("a/b")).header("content-type", "text/plain").send().await.expect("put");
    assert_eq!(r.status(), StatusCode::CREATED);
    assert_eq!(header(&r, "location"), Some(format!("http://{}/v1/stream/a/b", s.addr)));
    // HTTP/2 without TLS (prior knowledge): the authority comes from the URI, not a Host header.
    let h2 = reqwest::Client::builder().http2_prior_knowledge().build().expect("client");
    let r = h2.put(s.url("h2")).header("content-type", "text/plain").send().await.expect("put");
    assert_eq!((r.version(), r.status()), (reqwest::Version::HTTP_2, StatusCode::CREATED));
    assert_eq!(header(&r, "location"), Some(format!("http://{}/v1/stream/h2", s.addr)));

    // Behind a proxy, --public-url decides.
    let config = ServerConfig { public_url: Some("https://streams.example.com/".into()), ..ServerConfig::default() };
    let s = common::TestServer::start(config, None).await;
    let r = http.put(s.url("c")).header("content-type", "text/plain").send().await.expect("put");
    assert_eq!(header(&r, "location").as_deref(), Some("https://streams.example.com/v1/stream/c"));
}
