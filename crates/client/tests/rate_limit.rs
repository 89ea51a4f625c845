//! A writer over its append rate limit gets `429` with `Retry-After`; the producer waits and
//! retries with the same sequence numbers, so every item lands exactly once.

mod common;

use std::time::Duration;

use common::TestServer;
use futures_util::StreamExt;
use oncelog_client::{Client, CreateOptions, ReadOptions};
use oncelog_server::ServerConfig;

#[tokio::test]
async fn a_rate_limited_producer_still_writes_everything_exactly_once() {
    let srv = TestServer::start_with(ServerConfig { append_rate_limit: 20, ..ServerConfig::default() }).await;
    let client = Client::new(&srv.base).expect("client");
    let s = client.stream("limited");
    s.create(CreateOptions::content_type("text/plain")).await.expect("create");

    // Plain requests show the answer: a burst beyond 20 per second is refused with a wait.
    let http = reqwest::Client::new();
    let mut limited = None;
    for _ in 0..40 {
        let r = http.post(format!("{}/limited", srv.base)).header("content-type", "text/plain").body("").header("stream-closed", "false").send().await.expect("post");
        if r.status() == reqwest::StatusCode::TOO_MANY_REQUESTS {
            limited = Some(r.headers().get("retry-after").and_then(|v| v.to_str().ok()).map(str::to_owned));
            break;
        }
    }
    assert_eq!(limited, Some(Some("1".to_owned())), "a burst gets 429 with Retry-After");

    // A producer sending 60 single-item requests takes about three seconds and loses nothing.
    let producer = s.producer("p").max_batch_items(1).max_in_flight(4).start().await.expect("producer");
    let mut receipts = Vec::new();
    for i in 0..60 {
        receipts.push(producer.append(format!("{i:02};")).await.expect("append"));
    }
    tokio::time::timeout(Duration::from_secs(30), producer.flush()).await.expect("flush in time").expect("flush");
    for r in receipts {
        r.await.expect("receipt");
    }
    let mut all = String::new();
    let mut chunks = s.read(ReadOptions::default());
    while let Some(c) = chunks.next().await {
        all.push_str(&String::from_utf8_lossy(&c.expect("chunk").data));
    }
    let expected: String = (0..60).map(|i| format!("{i:02};")).collect();
    assert_eq!(all, expected);
}
