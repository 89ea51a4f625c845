//! A node frames an append for the stream as it last saw it (`Engine::last_seen` on
//! PostgreSQL: no `head` round trip before an append). What it saw may be stale: another node
//! deleted the stream, or deleted it and made a new one with another content type. The answers
//! must be those of a node that looked first: 404 for a missing stream whatever else is wrong
//! with the request, and a write to a replaced stream framed for the stream that is there now.

#![cfg(unix)]

mod common;

use common::pg::{database_url, schema, Node};
use reqwest::StatusCode;

async fn put(http: &reqwest::Client, url: &str, content_type: &str) -> StatusCode {
    http.put(url).header("content-type", content_type).send().await.expect("PUT").status()
}

async fn post(
    http: &reqwest::Client,
    url: &str,
    content_type: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> StatusCode {
    let mut req = http.post(url).header("content-type", content_type).body(body.to_owned());
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.send().await.expect("POST").status()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_through_a_node_that_saw_an_older_incarnation_get_the_answers_of_the_current_one() {
    let db = database_url();
    let schema = schema("stale", "identity");
    let dir = tempfile::tempdir().expect("tempdir");
    let a = Node::start(&db, &schema, dir.path().join("a.log"));
    let b = Node::start(&db, &schema, dir.path().join("b.log"));
    let http = reqwest::Client::new();
    let (on_a, on_b) = (format!("{}/v1/stream/s", a.url()), format!("{}/v1/stream/s", b.url()));

    assert_eq!(put(&http, &on_a, "text/plain").await, StatusCode::CREATED);
    // A sees the stream (and keeps it) by appending to it.
    assert_eq!(post(&http, &on_a, "text/plain", &[], "one").await, StatusCode::NO_CONTENT);

    // B deletes it: through A, every append is 404, even one A would refuse by itself (asked
    // first, while A still holds what it saw).
    assert_eq!(http.delete(&on_b).send().await.expect("DELETE").status(), StatusCode::NO_CONTENT);
    let bad_producer = [("producer-id", "p"), ("producer-epoch", "x"), ("producer-seq", "0")];
    assert_eq!(
        post(&http, &on_a, "text/plain", &bad_producer, "two").await,
        StatusCode::NOT_FOUND,
        "a missing stream is 404 whatever else is wrong"
    );
    assert_eq!(post(&http, &on_a, "text/plain", &[], "two").await, StatusCode::NOT_FOUND);
    // Seen again by A through an append, then deleted by B: the engine's answer is 404 too.
    assert_eq!(put(&http, &on_b, "text/plain").await, StatusCode::CREATED);
    assert_eq!(post(&http, &on_a, "text/plain", &[], "two").await, StatusCode::NO_CONTENT);
    assert_eq!(http.delete(&on_b).send().await.expect("DELETE").status(), StatusCode::NO_CONTENT);
    assert_eq!(post(&http, &on_a, "text/plain", &[], "two").await, StatusCode::NOT_FOUND);

    // A sees it again, then B replaces it with a JSON stream: A's next append is framed as JSON.
    assert_eq!(put(&http, &on_b, "text/plain").await, StatusCode::CREATED);
    assert_eq!(post(&http, &on_a, "text/plain", &[], "three").await, StatusCode::NO_CONTENT);
    assert_eq!(
        post(&http, &on_a, "text/plain", &bad_producer, "x").await,
        StatusCode::BAD_REQUEST,
        "the stream exists: the header is what is wrong"
    );
    assert_eq!(http.delete(&on_b).send().await.expect("DELETE").status(), StatusCode::NO_CONTENT);
    assert_eq!(put(&http, &on_b, "application/json").await, StatusCode::CREATED);
    assert_eq!(post(&http, &on_a, "application/json", &[], r#"{"n":1}"#).await, StatusCode::NO_CONTENT);
    let read = http.get(format!("{on_b}?offset=-1")).send().await.expect("GET");
    assert_eq!(read.status(), StatusCode::OK);
    assert_eq!(
        read.text().await.expect("body"),
        r#"[{"n":1}]"#,
        "the append was framed for the JSON stream that is there now"
    );
    // Bytes for a JSON stream are refused as JSON would refuse them, not as the old text stream took them.
    assert_eq!(post(&http, &on_a, "application/json", &[], "not json").await, StatusCode::BAD_REQUEST);
    drop((a, b));
}
