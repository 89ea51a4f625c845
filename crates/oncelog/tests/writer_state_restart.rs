//! What lets a retry be recognised survives `kill -9`: idempotency keys, producers' body digests.
//!
//! The real binary, acknowledged writes (fsync on), SIGKILL, restart on the same directory;
//! then the retries a client would send. Unix only (SIGKILL).

#![cfg(unix)]

mod common;

use common::Server;
use reqwest::{Client, StatusCode};

async fn post(http: &Client, url: &str, headers: &[(&str, &str)], body: &'static str) -> reqwest::Response {
    let mut r = http.post(url).header("content-type", "text/plain").body(body);
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    r.send().await.expect("post")
}

fn next_offset(r: &reqwest::Response) -> String {
    r.headers().get("stream-next-offset").and_then(|v| v.to_str().ok()).expect("Stream-Next-Offset").to_owned()
}

#[tokio::test]
async fn keys_and_body_digests_are_recognised_after_a_kill_and_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let http = Client::new();
    let producer = [("producer-id", "p"), ("producer-epoch", "0"), ("producer-seq", "0")];
    let key = [("idempotency-key", "k-1")];
    let (keyed_end, produced_end) = {
        let server = Server::start(&data, &[]);
        let url = format!("{}/v1/stream/s", server.url);
        assert_eq!(
            http.put(&url).header("content-type", "text/plain").send().await.expect("put").status(),
            StatusCode::CREATED
        );
        let keyed = post(&http, &url, &key, "keyed").await;
        assert_eq!(keyed.status(), StatusCode::OK);
        let produced = post(&http, &url, &producer, "produced").await;
        assert_eq!(produced.status(), StatusCode::OK);
        let ends = (next_offset(&keyed), next_offset(&produced));
        server.kill9();
        ends
    };
    let server = Server::start(&data, &[]);
    let url = format!("{}/v1/stream/s", server.url);
    let again = post(&http, &url, &key, "keyed").await;
    assert_eq!((again.status(), next_offset(&again)), (StatusCode::NO_CONTENT, keyed_end));
    assert_eq!(post(&http, &url, &key, "other").await.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let dup = post(&http, &url, &producer, "produced").await;
    assert_eq!((dup.status(), next_offset(&dup)), (StatusCode::NO_CONTENT, produced_end));
    let changed = post(&http, &url, &producer, "changed").await;
    assert_eq!(changed.status(), StatusCode::CONFLICT);
    assert_eq!(changed.headers().get("producer-conflict").and_then(|v| v.to_str().ok()), Some("body-mismatch"));
    let body = http.get(&url).send().await.expect("get").text().await.expect("text");
    assert_eq!(body, "keyedproduced");
}
