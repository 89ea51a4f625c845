//! A real scrape of `/metrics`: the append counters move by exactly the appends made, by outcome
//! and bytes. Alone in its test binary, because the Prometheus recorder is process-wide.

mod common;

use std::time::Duration;

use oncelog_server::ServerConfig;

/// The value of the sample `name` (with its labels written exactly, e.g. `x{outcome="new"}`),
/// 0 when absent (a counter not incremented yet).
fn sample(scrape: &str, name: &str) -> f64 {
    scrape
        .lines()
        .find(|l| l.strip_prefix(name).is_some_and(|rest| rest.starts_with(' ')))
        .and_then(|l| l.rsplit(' ').next())
        .map_or(0.0, |v| v.parse().expect("a number"))
}

#[tokio::test]
async fn counters_move_by_exactly_the_appends_made() {
    let config = ServerConfig { sse_keepalive: Duration::from_millis(100), ..ServerConfig::default() };
    let s = common::TestServer::start(config, None).await;
    let http = reqwest::Client::new();
    let scrape = || async {
        let r = http.get(format!("{}/metrics", s.origin)).send().await.expect("scrape");
        assert_eq!(r.status(), reqwest::StatusCode::OK);
        r.text().await.expect("text")
    };
    let before = scrape().await;
    http.put(s.url("m")).header("content-type", "text/plain").send().await.expect("put");
    let post = |body: &'static str, producer: Option<(u64, u64)>| {
        let mut rb = http.post(s.url("m")).header("content-type", "text/plain").body(body);
        if let Some((epoch, seq)) = producer {
            rb = rb.header("producer-id", "p").header("producer-epoch", epoch.to_string()).header("producer-seq", seq.to_string());
        }
        async move { rb.send().await.expect("post").status().as_u16() }
    };
    assert_eq!(post("a", Some((0, 0))).await, 200); // new, 1 byte
    assert_eq!(post("bb", Some((0, 1))).await, 200); // new, 2 bytes
    assert_eq!(post("bb", Some((0, 1))).await, 204); // duplicate, 2 bytes
    assert_eq!(post("ccc", Some((0, 1000))).await, 409); // gap (too far ahead to wait), 3 bytes
    // seq 3 overtakes seq 2: it waits (parked) and then lands.
    let (late, early) = tokio::join!(post("dddd", Some((0, 3))), async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        post("eeeee", Some((0, 2))).await
    });
    assert_eq!((late, early), (200, 200)); // new, 4 + 5 bytes
    assert_eq!(post("f", Some((1, 0))).await, 200); // new (epoch bump), 1 byte
    assert_eq!(post("gg", Some((0, 4))).await, 403); // fenced, 2 bytes
    assert_eq!(post("hhh", None).await, 204); // new, 3 bytes
    let close = http.post(s.url("m")).header("stream-closed", "true").send().await.expect("close");
    assert_eq!(close.status().as_u16(), 204); // new (the closure), 0 bytes
    assert_eq!(post("i", None).await, 409); // closed, 1 byte
    let wrong = http.post(s.url("m")).header("content-type", "text/html").body("jj").send().await.expect("post");
    assert_eq!(wrong.status().as_u16(), 409); // closed (closure beats the type), 2 bytes

    let after = scrape().await;
    let delta = |name: &str| sample(&after, name) - sample(&before, name);
    let appends = |o: &str| delta(&format!("oncelog_appends_total{{outcome=\"{o}\"}}"));
    let bytes = |o: &str| delta(&format!("oncelog_append_bytes_total{{outcome=\"{o}\"}}"));
    assert_eq!((appends("new"), bytes("new")), (7.0, 16.0));
    assert_eq!((appends("duplicate"), bytes("duplicate")), (1.0, 2.0));
    assert_eq!((appends("gap"), bytes("gap")), (1.0, 3.0));
    assert_eq!((appends("fenced"), bytes("fenced")), (1.0, 2.0));
    assert_eq!((appends("closed"), bytes("closed")), (2.0, 3.0));
    assert_eq!(appends("rejected"), 0.0);
    assert_eq!(delta("oncelog_parked_appends_total"), 1.0);
    // Every accepted append was acknowledged through a group commit and an fsync.
    // Timed for every success: the 7 new and the duplicate.
    assert_eq!(delta("oncelog_commit_to_ack_seconds_count"), 8.0);
    assert!(delta("oncelog_fsync_seconds_count") >= 1.0);
    assert!(delta("oncelog_group_commit_commands_count") >= 1.0);
    assert_eq!(sample(&after, "oncelog_streams"), 1.0);
    assert_eq!(sample(&after, "oncelog_producers"), 1.0);
    assert!(sample(&after, "process_resident_memory_bytes") > 1e6);
    assert!(after.contains("oncelog_http_requests_total{method=\"POST\",status=\"200\"}"), "{after}");

    // Live readers are counted by mode while they are open, and no longer once they end.
    http.put(s.url("live")).header("content-type", "text/plain").send().await.expect("put");
    let sse = http.get(s.url("live") + "?offset=-1&live=sse").send().await.expect("sse");
    let open = scrape().await;
    assert_eq!(sample(&open, "oncelog_live_readers{mode=\"sse\"}"), 1.0, "{open}");
    drop(sse);
    let mut gone = false;
    for _ in 0..100 {
        // The server notices a reader left when it next writes to it (a keep-alive comment).
        if sample(&scrape().await, "oncelog_live_readers{mode=\"sse\"}") == 0.0 {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(gone, "a closed SSE reader is no longer counted");

    // Subscriptions: the count, and every claim/ack by outcome.
    let before = scrape().await;
    for p in ["wake", "jobs/a"] {
        http.put(s.url(p)).header("content-type", "application/json").send().await.expect("put");
    }
    let cfg = r#"{"type":"pull-wake","pattern":"jobs/*","wake_stream":"wake"}"#;
    http.put(s.url("__ds/subscriptions/m")).header("content-type", "application/json").body(cfg).send().await.expect("sub");
    http.post(s.url("jobs/a")).header("content-type", "application/json").body("1").send().await.expect("append");
    let claim = http.post(s.url("__ds/subscriptions/m/claim")).body(r#"{"worker":"w"}"#).send().await.expect("claim");
    let claim: serde_json::Value = serde_json::from_slice(&claim.bytes().await.expect("body")).expect("json");
    let ack = |generation: u64| {
        let body = serde_json::json!({ "wake_id": claim["wake_id"], "generation": generation, "done": true }).to_string();
        http.post(s.url("__ds/subscriptions/m/ack")).bearer_auth(claim["token"].as_str().unwrap_or("")).body(body).send()
    };
    assert_eq!(ack(7).await.expect("stale ack").status().as_u16(), 409);
    assert_eq!(ack(1).await.expect("ack").status().as_u16(), 200);
    let after = scrape().await;
    let delta = |name: &str| sample(&after, name) - sample(&before, name);
    assert_eq!(sample(&after, "oncelog_subscriptions"), 1.0);
    assert_eq!(delta("oncelog_subscription_calls_total{call=\"claim\",outcome=\"ok\"}"), 1.0, "{after}");
    assert_eq!(delta("oncelog_subscription_calls_total{call=\"ack\",outcome=\"fenced\"}"), 1.0);
    assert_eq!(delta("oncelog_subscription_calls_total{call=\"ack\",outcome=\"ok\"}"), 1.0);
}
