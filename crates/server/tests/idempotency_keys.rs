//! Appends with an `Idempotency-Key` over HTTP: written once, repeats answered from the first.

mod common;

use oncelog_server::ServerConfig;
use reqwest::{Client, StatusCode};

async fn post(http: &Client, url: &str, key: &str, body: &'static str) -> reqwest::Response {
    http.post(url)
        .header("content-type", "text/plain")
        .header("idempotency-key", key)
        .body(body)
        .send()
        .await
        .expect("post")
}

fn next_offset(r: &reqwest::Response) -> String {
    r.headers().get("stream-next-offset").and_then(|v| v.to_str().ok()).expect("Stream-Next-Offset").to_owned()
}

#[tokio::test]
async fn a_repeated_key_is_answered_from_the_first_append_and_other_bytes_are_422() {
    let s = common::TestServer::start(ServerConfig::default(), None).await;
    let http = Client::new();
    assert_eq!(
        http.put(s.url("s")).header("content-type", "text/plain").send().await.expect("put").status(),
        StatusCode::CREATED
    );
    let url = s.url("s");
    let first = post(&http, &url, "order-17", "paid").await;
    assert_eq!(first.status(), StatusCode::OK, "new keyed data is 200, like a producer's");
    let end = next_offset(&first);
    assert_eq!(post(&http, &url, "other", "more").await.status(), StatusCode::OK);
    // The repeat (bare or quoted key): 204 with the original's end, nothing written.
    for key in ["order-17", "\"order-17\""] {
        let again = post(&http, &url, key, "paid").await;
        assert_eq!(again.status(), StatusCode::NO_CONTENT);
        assert_eq!(next_offset(&again), end);
    }
    let changed = post(&http, &url, "order-17", "refunded").await;
    assert_eq!(changed.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert!(changed.text().await.expect("body").contains("different body"));
    // Malformed keys, and keys with producer headers, are 400 with a reason.
    let long = "k".repeat(256);
    for bad in ["", "two words", long.as_str()] {
        let r = post(&http, &url, bad, "x").await;
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{bad:?}");
        assert!(r.text().await.expect("body").contains("Idempotency-Key"));
    }
    let both = http
        .post(&url)
        .header("content-type", "text/plain")
        .header("idempotency-key", "k")
        .header("producer-id", "p")
        .header("producer-epoch", "0")
        .header("producer-seq", "0")
        .body("x")
        .send()
        .await
        .expect("post");
    assert_eq!(both.status(), StatusCode::BAD_REQUEST);
    assert!(both.text().await.expect("body").contains("Producer"));
    let body = http.get(&url).send().await.expect("get").text().await.expect("text");
    assert_eq!(body, "paidmore");
}
