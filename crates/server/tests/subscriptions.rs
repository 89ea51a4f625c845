//! Subscriptions over HTTP: signed webhook delivery (verified with `ring`, an Ed25519
//! implementation independent of the one that signs), retries on a stored schedule, pull-wake
//! workers fenced by generation, and transactional commits.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine as _;
use oncelog_server::{ManualClock, ServerConfig};
use reqwest::{Client, StatusCode};
use serde_json::{json, Value};

/// What a webhook receiver got: the signature header and the raw body.
type Received = Arc<Mutex<Vec<(String, String)>>>;

/// A webhook receiver on the loopback answering the statuses in `answers` in turn (the last one
/// from then on), each with `{"done": true}`.
async fn receiver(answers: Vec<u16>) -> (String, Received) {
    let got: Received = Arc::default();
    let (g, answers) = (got.clone(), Arc::new(answers));
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |headers: axum::http::HeaderMap, body: String| {
            let (g, answers) = (g.clone(), answers.clone());
            async move {
                let sig = headers.get("webhook-signature").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
                let n = {
                    let mut v = g.lock().expect("lock");
                    v.push((sig, body));
                    v.len()
                };
                let status = answers.get(n - 1).or(answers.last()).copied().unwrap_or(200);
                (axum::http::StatusCode::from_u16(status).unwrap_or(axum::http::StatusCode::OK), r#"{"done":true}"#)
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}/hook"), got)
}

async fn wait_for(got: &Received, n: usize, within: Duration) -> Vec<(String, String)> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let v = got.lock().expect("lock").clone();
        if v.len() >= n || tokio::time::Instant::now() >= deadline {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn json_of(r: reqwest::Response) -> (StatusCode, Value) {
    let status = r.status();
    (status, serde_json::from_slice(&r.bytes().await.unwrap_or_default()).unwrap_or(Value::Null))
}

/// A JSON request body (the workspace's reqwest is built without its `json` feature).
trait JsonBody {
    fn js(self, v: &Value) -> Self;
}

impl JsonBody for reqwest::RequestBuilder {
    fn js(self, v: &Value) -> Self {
        self.header("content-type", "application/json").body(v.to_string())
    }
}

fn dev() -> ServerConfig {
    ServerConfig { dev_webhooks: true, ..ServerConfig::default() }
}

/// Verifies a `webhook-signature` over `body` with the key the JWKS publishes for its kid.
fn verify(jwks: &Value, header: &str, body: &str) -> bool {
    let fields: Vec<&str> = header.split(',').collect();
    let (Some(t), Some(kid), Some(sig)) = (
        fields.iter().find_map(|f| f.strip_prefix("t=")),
        fields.iter().find_map(|f| f.strip_prefix("kid=")),
        fields.iter().find_map(|f| f.strip_prefix("ed25519=")),
    ) else {
        return false;
    };
    let Some(key) = jwks["keys"].as_array().and_then(|ks| ks.iter().find(|k| k["kid"] == kid)) else { return false };
    let (Ok(x), Ok(sig)) = (B64.decode(key["x"].as_str().unwrap_or("")), B64.decode(sig)) else { return false };
    let msg = format!("{t}.{body}");
    ring::signature::UnparsedPublicKey::new(&ring::signature::ED25519, x).verify(msg.as_bytes(), &sig).is_ok()
}

#[tokio::test]
async fn a_webhook_is_signed_delivered_and_acked_by_its_done_answer() {
    let s = common::TestServer::start(dev(), None).await;
    let http = Client::new();
    let (hook, got) = receiver(vec![200]).await;
    let sub = s.url("__ds/subscriptions/hooked");
    let cfg = json!({ "type": "webhook", "pattern": "events/*", "webhook": { "url": hook }, "lease_ttl_ms": 5000 });
    let (status, created) = json_of(http.put(&sub).js(&cfg).send().await.expect("put")).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let jwks_url = created["webhook"]["signing"]["jwks_url"].as_str().expect("jwks_url").to_owned();
    assert_eq!(jwks_url, s.url("__ds/jwks.json"));
    let (_, jwks) = json_of(http.get(&jwks_url).send().await.expect("jwks")).await;

    http.put(s.url("events/a"))
        .header("content-type", "application/json")
        .body(r#"{"n":1}"#)
        .send()
        .await
        .expect("create");
    let seen = wait_for(&got, 1, Duration::from_secs(5)).await;
    assert_eq!(seen.len(), 1, "one delivery");
    let (sig, body) = &seen[0];
    assert!(verify(&jwks, sig, body), "signature verifies with ring: {sig}");
    // The same signature does not fit another body: the check can fail.
    assert!(!verify(&jwks, sig, &body.replace("events/a", "events/b")));
    let wake: Value = serde_json::from_str(body).expect("JSON body");
    assert_eq!(wake["subscription_id"], "hooked");
    assert_eq!(wake["callback_url"], s.url("__ds/subscriptions/hooked/callback"));
    let tail = wake["streams"][0]["tail_offset"].as_str().expect("tail").to_owned();

    // The receiver answered {"done": true}: the snapshot is acked.
    let mut acked = String::new();
    for _ in 0..100 {
        let (_, v) = json_of(http.get(&sub).send().await.expect("get")).await;
        acked = v["streams"][0]["acked_offset"].as_str().unwrap_or("").to_owned();
        if acked == tail {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(acked, tail);
    // Its callback token is spent: the wake ended.
    let r = http
        .post(wake["callback_url"].as_str().expect("url"))
        .bearer_auth(wake["callback_token"].as_str().expect("token"))
        .js(&json!({ "wake_id": wake["wake_id"], "generation": wake["generation"], "done": true }))
        .send()
        .await
        .expect("callback");
    let (status, v) = json_of(r).await;
    assert_eq!((status, v["error"]["code"].as_str()), (StatusCode::CONFLICT, Some("FENCED")));
}

#[tokio::test]
async fn failed_deliveries_wait_for_their_retry_time() {
    let clock = Arc::new(ManualClock::new(1_000_000));
    let s = common::TestServer::start(dev(), Some(clock.clone())).await;
    let http = Client::new();
    let (hook, got) = receiver(vec![500, 200]).await;
    let sub = s.url("__ds/subscriptions/retry");
    let cfg = json!({ "type": "webhook", "streams": ["jobs/a"], "webhook": { "url": hook }, "lease_ttl_ms": 60000 });
    assert_eq!(http.put(&sub).js(&cfg).send().await.expect("put").status(), StatusCode::CREATED);
    http.put(s.url("jobs/a")).header("content-type", "text/plain").body("x").send().await.expect("create");
    assert_eq!(wait_for(&got, 1, Duration::from_secs(5)).await.len(), 1);
    let mut view = Value::Null;
    for _ in 0..100 {
        view = json_of(http.get(&sub).send().await.expect("get")).await.1;
        if view["status"] == "failed" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(view["status"], "failed", "{view}");
    assert!(view["next_attempt_at"].is_string());
    // Time stands still: no second attempt, however long we wait (the first waits 0.8-1.2 s).
    assert_eq!(wait_for(&got, 2, Duration::from_millis(2_500)).await.len(), 1);
    clock.advance_ms(1_300);
    assert_eq!(wait_for(&got, 2, Duration::from_secs(5)).await.len(), 2, "retried once the time came");
    for _ in 0..100 {
        view = json_of(http.get(&sub).send().await.expect("get")).await.1;
        if view["status"] == "active" && view["streams"][0]["acked_offset"] == view["streams"][0]["tail_offset"] {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(view["status"], "active", "{view}");
    assert_eq!(view["streams"][0]["acked_offset"], view["streams"][0]["tail_offset"]);
}

async fn post_json(http: &Client, url: &str, token: Option<&str>, body: Value) -> (StatusCode, Value) {
    let mut r = http.post(url).js(&body);
    if let Some(t) = token {
        r = r.bearer_auth(t);
    }
    json_of(r.send().await.expect("post")).await
}

#[tokio::test]
async fn a_zombie_worker_is_fenced_on_every_call_and_its_commit_writes_nothing() {
    let clock = Arc::new(ManualClock::new(1_000_000));
    let s = common::TestServer::start(ServerConfig::default(), Some(clock.clone())).await;
    let http = Client::new();
    for (path, ct) in [("wake", "application/json"), ("orders/eu", "application/json"), ("totals", "application/json")]
    {
        http.put(s.url(path)).header("content-type", ct).send().await.expect("create");
    }
    let sub = s.url("__ds/subscriptions/totals");
    let cfg = json!({ "type": "pull-wake", "pattern": "orders/*", "wake_stream": "wake", "lease_ttl_ms": 1000 });
    assert_eq!(http.put(&sub).js(&cfg).send().await.expect("put").status(), StatusCode::CREATED);
    let r = http
        .post(s.url("orders/eu"))
        .header("content-type", "application/json")
        .body(r#"{"order":1,"total":5}"#)
        .send()
        .await
        .expect("append");
    let tail = r.headers().get("stream-next-offset").and_then(|v| v.to_str().ok()).expect("offset").to_owned();

    let (status, a) = post_json(&http, &format!("{sub}/claim"), None, json!({ "worker": "A" })).await;
    assert_eq!(status, StatusCode::OK, "{a}");
    assert_eq!(a["generation"], 1);
    // A stalls past its lease; B takes over with generation 2.
    clock.advance_ms(1_500);
    let (status, b) = post_json(&http, &format!("{sub}/claim"), None, json!({ "worker": "B" })).await;
    assert_eq!((status, b["generation"].as_u64()), (StatusCode::OK, Some(2)), "{b}");
    let commit = |w: &Value, total: u64| {
        json!({
            "wake_id": w["wake_id"], "generation": w["generation"],
            "acks": [{ "stream": "orders/eu", "offset": tail }],
            "appends": [{ "stream": "totals", "producer": { "id": "sub:totals", "epoch": w["generation"], "seq": 0 }, "data": { "total": total } }],
            "done": true,
        })
    };
    let (status, done) = post_json(&http, &format!("{sub}/commit"), b["token"].as_str(), commit(&b, 5)).await;
    assert_eq!(status, StatusCode::OK, "{done}");
    assert_eq!((done["duplicate"].as_bool(), done["next_wake"].as_bool()), (Some(false), Some(false)));
    // B's retry of the same commit (its answer was lost) is recognised; nothing is written twice.
    let (status, again) = post_json(&http, &format!("{sub}/commit"), b["token"].as_str(), commit(&b, 5)).await;
    assert_eq!((status, again["duplicate"].as_bool()), (StatusCode::OK, Some(true)), "{again}");

    let totals_before =
        http.get(format!("{}?offset=-1", s.url("totals"))).send().await.expect("read").text().await.expect("body");
    let view_before = json_of(http.get(&sub).send().await.expect("get")).await.1;
    let token_a = a["token"].as_str();
    let fence = json!({ "wake_id": a["wake_id"], "generation": a["generation"] });
    let ack = json!({ "wake_id": a["wake_id"], "generation": a["generation"], "acks": [{ "stream": "orders/eu", "offset": tail }], "done": true });
    for (op, body) in [("ack", ack), ("release", fence), ("commit", commit(&a, 99))] {
        let (status, v) = post_json(&http, &format!("{sub}/{op}"), token_a, body).await;
        assert_eq!((status, v["error"]["code"].as_str()), (StatusCode::CONFLICT, Some("FENCED")), "{op}: {v}");
    }
    // A's token with B's generation in the body is still A's token.
    let forged = json!({ "wake_id": b["wake_id"], "generation": b["generation"], "done": true });
    assert_eq!(post_json(&http, &format!("{sub}/ack"), token_a, forged).await.0, StatusCode::CONFLICT);
    let totals =
        http.get(format!("{}?offset=-1", s.url("totals"))).send().await.expect("read").text().await.expect("body");
    assert_eq!(totals, totals_before);
    assert_eq!(serde_json::from_str::<Value>(&totals).expect("json"), json!([{ "total": 5 }]));
    assert_eq!(json_of(http.get(&sub).send().await.expect("get")).await.1, view_before, "nothing changed");
    // Even a plain append by A, with its generation as producer epoch, is fenced by the epoch.
    let plain = http
        .post(s.url("totals"))
        .header("content-type", "application/json")
        .header("producer-id", "sub:totals")
        .header("producer-epoch", "1")
        .header("producer-seq", "0")
        .body(r#"{"total":99}"#)
        .send()
        .await
        .expect("append");
    assert_eq!(plain.status(), StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn bad_subscription_requests_get_json_errors() {
    let s = common::TestServer::start(ServerConfig::default(), None).await;
    let http = Client::new();
    let sub = s.url("__ds/subscriptions/x");
    let cases = [
        (http.put(&sub).body("not json"), StatusCode::BAD_REQUEST, "INVALID_REQUEST"),
        (
            http.put(&sub).js(&json!({ "type": "pull-wake", "wake_stream": "w" })),
            StatusCode::BAD_REQUEST,
            "INVALID_REQUEST",
        ),
        (
            http.put(&sub)
                .js(&json!({ "type": "pull-wake", "pattern": "a/*", "wake_stream": "w", "lease_ttl_ms": 10 })),
            StatusCode::BAD_REQUEST,
            "INVALID_REQUEST",
        ),
        // Loopback over http needs --dev-webhooks, off here.
        (
            http.put(&sub)
                .js(&json!({ "type": "webhook", "pattern": "a/*", "webhook": { "url": "http://127.0.0.1:9/x" } })),
            StatusCode::BAD_REQUEST,
            "WEBHOOK_URL_REJECTED",
        ),
        // Names that can only be this machine are refused when given, not only at delivery.
        (
            http.put(&sub)
                .js(&json!({ "type": "webhook", "pattern": "a/*", "webhook": { "url": "https://localhost./x" } })),
            StatusCode::BAD_REQUEST,
            "WEBHOOK_URL_REJECTED",
        ),
        (
            http.put(&sub)
                .js(&json!({ "type": "webhook", "pattern": "a/*", "webhook": { "url": "https://hooks.localhost/x" } })),
            StatusCode::BAD_REQUEST,
            "WEBHOOK_URL_REJECTED",
        ),
        (http.get(&sub), StatusCode::NOT_FOUND, "SUBSCRIPTION_NOT_FOUND"),
        (http.get(s.url("__ds/nothing/here")), StatusCode::NOT_FOUND, "SUBSCRIPTION_NOT_FOUND"),
        (
            http.post(format!("{sub}/ack")).js(&json!({ "wake_id": "w", "generation": 1 })),
            StatusCode::UNAUTHORIZED,
            "TOKEN_INVALID",
        ),
        (http.post(format!("{sub}/claim")).js(&json!({})), StatusCode::BAD_REQUEST, "INVALID_REQUEST"),
        (http.patch(&sub), StatusCode::METHOD_NOT_ALLOWED, "METHOD_NOT_ALLOWED"),
    ];
    for (req, want, code) in cases {
        let (status, v) = json_of(req.send().await.expect("send")).await;
        assert_eq!((status, v["error"]["code"].as_str()), (want, Some(code)), "{v}");
    }
    // A token for one subscription does not open another.
    http.put(s.url("w")).header("content-type", "application/json").send().await.expect("create");
    http.put(s.url("a/1")).header("content-type", "application/json").send().await.expect("create");
    for id in ["one", "two"] {
        let cfg = json!({ "type": "pull-wake", "pattern": "a/*", "wake_stream": "w" });
        assert_eq!(
            http.put(s.url(&format!("__ds/subscriptions/{id}"))).js(&cfg).send().await.expect("put").status(),
            StatusCode::CREATED
        );
    }
    http.post(s.url("a/1")).header("content-type", "application/json").body("1").send().await.expect("append");
    let (_, one) = post_json(&http, &s.url("__ds/subscriptions/one/claim"), None, json!({ "worker": "w" })).await;
    let (_, two) = post_json(&http, &s.url("__ds/subscriptions/two/claim"), None, json!({ "worker": "w" })).await;
    let body = json!({ "wake_id": two["wake_id"], "generation": two["generation"] });
    let (status, v) = post_json(&http, &s.url("__ds/subscriptions/two/release"), one["token"].as_str(), body).await;
    assert_eq!((status, v["error"]["code"].as_str()), (StatusCode::UNAUTHORIZED, Some("TOKEN_INVALID")), "{v}");
}

#[tokio::test]
async fn the_signing_key_rotates_and_the_old_one_stays_published_for_a_while() {
    let clock = Arc::new(ManualClock::new(1_000_000));
    let config = ServerConfig { webhook_key_max_age: Duration::from_secs(7200), ..dev() };
    let s = common::TestServer::start(config, Some(clock.clone())).await;
    let http = Client::new();
    let (hook, got) = receiver(vec![200]).await;
    let sub = s.url("__ds/subscriptions/rot");
    let cfg = json!({ "type": "webhook", "streams": ["r/a"], "webhook": { "url": hook } });
    let (_, v) = json_of(http.put(&sub).js(&cfg).send().await.expect("put")).await;
    let first = v["webhook"]["signing"]["kid"].as_str().expect("kid").to_owned();
    let kids = |jwks: &Value| {
        jwks["keys"]
            .as_array()
            .map(|ks| ks.iter().filter_map(|k| k["kid"].as_str().map(str::to_owned)).collect::<Vec<_>>())
            .unwrap_or_default()
    };
    let jwks_url = s.url("__ds/jwks.json");
    assert_eq!(kids(&json_of(http.get(&jwks_url).send().await.expect("jwks")).await.1), std::slice::from_ref(&first));

    // Older than the maximum age: the next dispatcher pass (at most a second) rotates.
    clock.advance_ms(7_200_001);
    let mut jwks = Value::Null;
    for _ in 0..100 {
        jwks = json_of(http.get(&jwks_url).send().await.expect("jwks")).await.1;
        if kids(&jwks).len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let now = kids(&jwks);
    assert_eq!(now.len(), 2, "{jwks}");
    assert!(now.contains(&first));
    let (_, v) = json_of(http.get(&sub).send().await.expect("get")).await;
    let second = v["webhook"]["signing"]["kid"].as_str().expect("kid").to_owned();
    assert_ne!(second, first);
    // Deliveries are signed with the new key, and verify with the published set.
    http.put(s.url("r/a")).header("content-type", "text/plain").body("x").send().await.expect("create");
    let seen = wait_for(&got, 1, Duration::from_secs(5)).await;
    let (sig, body) = seen.first().expect("a delivery");
    assert!(sig.contains(&format!("kid={second}")), "{sig}");
    assert!(verify(&jwks, sig, body));
    // An hour after its successor arrived (and before the successor's own rotation), the old
    // key is gone from the set.
    clock.advance_ms(3_600_000);
    for _ in 0..100 {
        jwks = json_of(http.get(&jwks_url).send().await.expect("jwks")).await.1;
        if kids(&jwks).len() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(kids(&jwks), [second]);
}
