//! A producer that reuses a sequence number for different bytes is refused, not deduplicated.

mod common;

use oncelog_server::ServerConfig;
use reqwest::{Client, StatusCode};

#[tokio::test]
async fn a_retry_with_another_body_is_409_body_mismatch_and_writes_nothing() {
    let s = common::TestServer::start(ServerConfig::default(), None).await;
    let http = Client::new();
    let r = http.put(s.url("s")).header("content-type", "text/plain").send().await.expect("put");
    assert_eq!(r.status(), StatusCode::CREATED);
    let send = |body: &'static str| {
        http.post(s.url("s"))
            .header("content-type", "text/plain")
            .header("producer-id", "p")
            .header("producer-epoch", "4")
            .header("producer-seq", "0")
            .body(body)
            .send()
    };
    assert_eq!(send("first").await.expect("post").status(), StatusCode::OK);
    assert_eq!(send("first").await.expect("post").status(), StatusCode::NO_CONTENT, "a true retry is a duplicate");
    let r = send("other").await.expect("post");
    assert_eq!(r.status(), StatusCode::CONFLICT);
    let h = |name: &str| r.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
    assert_eq!(h("producer-conflict").as_deref(), Some("body-mismatch"));
    assert_eq!((h("producer-epoch").as_deref(), h("producer-seq").as_deref()), (Some("4"), Some("0")));
    assert!(r.text().await.expect("body").contains("different body"));
    let body = http.get(s.url("s")).send().await.expect("get").text().await.expect("text");
    assert_eq!(body, "first");
}
