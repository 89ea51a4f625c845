//! The consumer helpers against a real server: a webhook receiver that verifies deliveries and
//! commits through the callback, and a pull-wake worker that waits for work, heartbeats and
//! commits; zombies get `FENCED`.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use oncelog_client::webhook::{verify, WebhookError, WebhookKeys};
use oncelog_client::{AppendOptions, Client, CreateOptions, ReadFrom, ReadOptions, StreamOffset, SubscriptionConfig};
use oncelog_server::ServerConfig;
use serde_json::{json, Value};

async fn read_json(client: &Client, path: &str) -> Vec<Value> {
    use futures_util::StreamExt;
    let mut r = client.stream(path).read(ReadOptions::new(ReadFrom::Beginning, oncelog_client::LiveMode::CatchUp));
    let mut out = Vec::new();
    while let Some(c) = r.next().await {
        out.extend(c.expect("read").json_items::<Value>().expect("json"));
    }
    out
}

#[tokio::test]
async fn a_webhook_receiver_verifies_and_commits_through_the_callback() {
    let server = common::TestServer::start_with(ServerConfig { dev_webhooks: true, ..ServerConfig::default() }).await;
    let client = Client::new(server.base.as_str()).expect("client");
    // The receiver keeps what it got and answers 200 without `done`: the work is done after.
    let got: Arc<Mutex<Vec<(String, Vec<u8>)>>> = Arc::default();
    let g = got.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
            let g = g.clone();
            async move {
                let sig = headers.get("webhook-signature").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
                g.lock().expect("lock").push((sig, body.to_vec()));
                "{}"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let hook = format!("http://{}/hook", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await });

    for p in ["in/a", "out"] {
        client.stream(p).create(CreateOptions::content_type("application/json")).await.expect("create");
    }
    let subs = client.subscriptions();
    let (created, _) = subs
        .put("hook", &SubscriptionConfig::webhook(&hook).pattern("in/*").lease_ttl(Duration::from_secs(10)))
        .await
        .expect("put");
    assert!(created);
    client.stream("in/a").append(r#"{"n":1}"#, AppendOptions::default()).await.expect("append");
    let mut delivery = None;
    for _ in 0..250 {
        if let Some(d) = got.lock().expect("lock").first().cloned() {
            delivery = Some(d);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (sig, body) = delivery.expect("a delivery within 5 s");
    let keys = WebhookKeys::fetch(&client).await.expect("jwks");
    let now_s =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
    verify(&keys, &sig, &body, now_s, 300).expect("the delivery verifies");
    let mut tampered = body.clone();
    tampered.push(b' ');
    assert_eq!(verify(&keys, &sig, &tampered, now_s, 300), Err(WebhookError::BadSignature));
    assert_eq!(verify(&keys, &sig, &body, now_s + 301, 300), Err(WebhookError::Stale));
    assert!(matches!(verify(&WebhookKeys::default(), &sig, &body, now_s, 300), Err(WebhookError::UnknownKey(_))));

    let claim = subs.claim_from_webhook(&body).expect("wake");
    let link = claim.streams[0].clone();
    assert_eq!((link.path.as_str(), link.has_pending), ("in/a", true));
    let done = claim
        .commit()
        .append_json("out", json!({ "seen": 1 }))
        .ack("in/a", &link.tail_offset)
        .send(true)
        .await
        .expect("commit");
    assert!(!done.duplicate);
    assert_eq!(read_json(&client, "out").await, vec![json!({ "seen": 1 })]);
    assert_eq!(
        subs.get("hook").await.expect("get").link("in/a").map(|l| l.acked_offset.clone()),
        Some(link.tail_offset.clone())
    );
    // The callback token is spent with the wake.
    let again = claim.ack(&[], true).await.expect_err("fenced");
    assert!(again.is_fenced(), "{again}");
}

#[tokio::test]
async fn a_pull_worker_waits_heartbeats_and_commits_and_its_zombie_is_fenced() {
    let server = common::TestServer::start().await;
    let client = Client::new(server.base.as_str()).expect("client");
    for p in ["wake", "jobs/a", "done"] {
        client.stream(p).create(CreateOptions::content_type("application/json")).await.expect("create");
    }
    let subs = client.subscriptions();
    subs.put("jobs", &SubscriptionConfig::pull_wake("wake").pattern("jobs/*").lease_ttl(Duration::from_millis(2_000)))
        .await
        .expect("put");

    // Nothing to do yet: the wait ends empty-handed; an append during a wait is picked up.
    assert!(subs
        .wait_for_claim("jobs", "w1", "wake", Duration::from_millis(100), Duration::from_millis(300))
        .await
        .expect("wait")
        .is_none());
    let (c2, s2) = (client.clone(), subs.clone());
    let waiter = tokio::spawn(async move {
        s2.wait_for_claim("jobs", "w1", "wake", Duration::from_millis(500), Duration::from_secs(5)).await
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    c2.stream("jobs/a").append(r#"{"job":1}"#, AppendOptions::default()).await.expect("append");
    let a = waiter.await.expect("task").expect("wait").expect("a claim");
    assert_eq!(a.generation, 1);
    let tail: StreamOffset = a.streams[0].tail_offset.clone();

    // Heartbeats keep the lease beyond its 2 s (with 1.5 s to spare each time on a busy machine).
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        a.ack(&[], false).await.expect("heartbeat");
    }
    assert!(matches!(subs.claim("jobs", "w2").await.expect("claim"), Err(oncelog_client::NoClaim::Claimed { .. })));
    // Then a stall: the lease passes to w2, and everything w1 does is fenced.
    tokio::time::sleep(Duration::from_millis(2_200)).await;
    let b = subs.claim("jobs", "w2").await.expect("claim").expect("w2 gets the work");
    assert_eq!(b.generation, 2);
    let zombie = a
        .commit()
        .append_json("done", json!({ "by": "w1" }))
        .ack("jobs/a", &tail)
        .send(true)
        .await
        .expect_err("fenced");
    assert!(zombie.is_fenced(), "{zombie}");
    assert!(a.ack(&[("jobs/a", &tail)], true).await.expect_err("fenced").is_fenced());
    let commit = b.commit().append_json("done", json!({ "by": "w2" })).ack("jobs/a", &tail);
    let ok = commit.clone().send(true).await.expect("commit");
    assert!(!ok.next_wake && !ok.duplicate);
    // Sending the same commit again (its outcome was unknown) is answered as a duplicate.
    assert!(commit.send(true).await.expect("again").duplicate);
    assert_eq!(read_json(&client, "done").await, vec![json!({ "by": "w2" })]);
}
