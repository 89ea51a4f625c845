//! A writer over its append rate limit gets `429` with `Retry-After`; the producer waits and
//! retries with the same sequence numbers, so every item lands exactly once.

mod common;

use std::time::Duration;

use common::TestServer;
use futures_util::StreamExt;
use oncelog_client::{Client, CreateOptions, ReadOptions, StreamHandle};
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
        let r = http
            .post(format!("{}/limited", srv.base))
            .header("content-type", "text/plain")
            .body("")
            .header("stream-closed", "false")
            .send()
            .await
            .expect("post");
        if r.status() == reqwest::StatusCode::TOO_MANY_REQUESTS {
            limited = Some(r.headers().get("retry-after").and_then(|v| v.to_str().ok()).map(str::to_owned));
            break;
        }
    }
    assert_eq!(limited, Some(Some("1".to_owned())), "a burst gets 429 with Retry-After");

    // A producer sending 60 single-item requests takes about three seconds and loses nothing.
    produce_sixty(&s).await;
    assert_sixty_exactly_once(&s).await;
}

/// Sends 60 single-item appends through a producer (4 in flight) and waits for every receipt.
async fn produce_sixty(s: &StreamHandle) {
    let producer = s.producer("p").max_batch_items(1).max_in_flight(4).start().await.expect("producer");
    let mut receipts = Vec::new();
    for i in 0..60 {
        receipts.push(producer.append(format!("{i:02};")).await.expect("append"));
    }
    tokio::time::timeout(Duration::from_secs(30), producer.flush()).await.expect("flush in time").expect("flush");
    for r in receipts {
        r.await.expect("receipt");
    }
}

/// The stream holds the 60 items of [`produce_sixty`], each once, in order.
async fn assert_sixty_exactly_once(s: &StreamHandle) {
    let mut all = String::new();
    let mut chunks = s.read(ReadOptions::default());
    while let Some(c) = chunks.next().await {
        all.push_str(&String::from_utf8_lossy(&c.expect("chunk").data));
    }
    let expected: String = (0..60).map(|i| format!("{i:02};")).collect();
    assert_eq!(all, expected);
}

/// With tokens, the limit is per token: a producer whose token is over its limit still writes
/// everything exactly once, while another token's writer from the same address is not held back.
#[tokio::test]
async fn a_producer_over_its_tokens_limit_writes_everything_exactly_once_and_others_go_on() {
    use oncelog_server::auth::scope::{GrantClaim, ScopeClaim};
    use oncelog_server::auth::token::{issue, TokenAuth, TokenConfig};

    let secret = b"client-test-secret-of-some-length";
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("secret"), secret).expect("secret");
    let auth = TokenAuth::load(TokenConfig { secret_file: Some(dir.path().join("secret")), ..TokenConfig::default() })
        .expect("keys");
    let srv =
        TestServer::start_with_auth(ServerConfig { append_rate_limit: 20, ..ServerConfig::default() }, Some(auth))
            .await;
    let now_s = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs() as i64;
    let token = |sub: &str| {
        let claim = ScopeClaim {
            grants: vec![GrantClaim { stream: None, prefix: Some(String::new()), ops: vec!["all".into()] }],
        };
        issue(secret, claim, now_s + 600, None, None, Some(sub.into())).expect("sign")
    };
    let (busy, other) = (token("busy"), token("other"));
    let client = Client::builder(&srv.base)
        .default_header("authorization", &format!("Bearer {busy}"))
        .expect("header")
        .build()
        .expect("client");
    let s = client.stream("per-token");
    s.create(CreateOptions::content_type("text/plain")).await.expect("create");

    let writing = produce_sixty(&s);
    // Meanwhile the other token's plain appends to its own stream are all accepted.
    let http = reqwest::Client::new();
    let others = async {
        http.put(format!("{}/per-token-other", srv.base))
            .bearer_auth(&other)
            .header("content-type", "text/plain")
            .send()
            .await
            .expect("put");
        // Once the producer has spent its token's allowance, a burst from the same address.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut statuses = Vec::new();
        for _ in 0..10 {
            let r = http
                .post(format!("{}/per-token-other", srv.base))
                .bearer_auth(&other)
                .header("content-type", "text/plain")
                .body("o")
                .send()
                .await
                .expect("post");
            statuses.push(r.status());
        }
        statuses
    };
    let ((), statuses) = tokio::join!(writing, others);
    assert!(statuses.iter().all(|s| s.is_success()), "another token is not limited by this one: {statuses:?}");
    assert_sixty_exactly_once(&s).await;
}
