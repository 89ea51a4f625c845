//! The server over PostgreSQL, where a write is framed for the stream as this node last saw it
//! (`Engine::last_seen`, no `head` round trip first): a refusal the server makes itself (a bad
//! header) is answered only after a fresh lookup, so a stream another node deleted meanwhile is
//! `404`, as it is everywhere else, whatever else is wrong with the request. Needs
//! `ONCELOG_TEST_POSTGRES_URL` (./scripts/test starts a private cluster and sets it).
//!
//! Mutant: `handlers::dispatch` without that lookup answers the stale stream's `400`.

mod common;

use std::sync::Arc;

use oncelog_postgres::PgEngine;
use oncelog_server::{serve, AppState, ServerConfig};
use oncelog_storage::Engine;
use reqwest::StatusCode;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_write_to_a_stream_deleted_by_another_node_is_404() {
    let schema = format!("t_rehead_{}", std::process::id());
    let served = PgEngine::open(common::postgres_options(&schema)).await.expect("open the served node");
    let other = PgEngine::open(common::postgres_options(&schema)).await.expect("open the other node");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let base = format!("http://{}/v1/stream", listener.local_addr().expect("addr"));
    tokio::spawn(serve(listener, AppState::new(Arc::new(served), ServerConfig::default()), std::future::pending()));
    let http = reqwest::Client::new();
    let s = format!("{base}/s");
    let r = http.put(&s).header("content-type", "text/plain").send().await.expect("put");
    assert_eq!(r.status(), StatusCode::CREATED);
    // The served node now frames appends to `s` without asking the database first.
    let r = http.post(&s).header("content-type", "text/plain").body("a").send().await.expect("post");
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let bad = || {
        http.post(&s)
            .header("content-type", "text/plain")
            .header("producer-id", "p")
            .header("producer-epoch", "not a number")
            .header("producer-seq", "0")
            .body("b")
    };
    assert_eq!(bad().send().await.expect("bad post").status(), StatusCode::BAD_REQUEST, "the stream exists: 400");
    other.delete("s", 0).await.expect("deleted by the other node");
    let r = bad().send().await.expect("bad post after the delete");
    assert_eq!(r.status(), StatusCode::NOT_FOUND, "{}", r.text().await.unwrap_or_default());
}
