//! A real scrape of `/metrics`: the append counters move by exactly the appends made, by outcome
//! and bytes; every metric has `# HELP`; subscription lag and per-stream counters. In their own
//! test binary, because the Prometheus recorder is process-wide, and one at a time ([`SERIAL`]):
//! the gauges a scrape sets (streams, subscriptions) are shared by every server in the process.

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use oncelog_server::{ManualClock, ServerConfig};
use serde_json::{json, Value};

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

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
    let _serial = SERIAL.lock().await;
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
            rb = rb
                .header("producer-id", "p")
                .header("producer-epoch", epoch.to_string())
                .header("producer-seq", seq.to_string());
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
    http.put(s.url("__ds/subscriptions/m"))
        .header("content-type", "application/json")
        .body(cfg)
        .send()
        .await
        .expect("sub");
    http.post(s.url("jobs/a")).header("content-type", "application/json").body("1").send().await.expect("append");
    let claim = http.post(s.url("__ds/subscriptions/m/claim")).body(r#"{"worker":"w"}"#).send().await.expect("claim");
    let claim: serde_json::Value = serde_json::from_slice(&claim.bytes().await.expect("body")).expect("json");
    let ack = |generation: u64| {
        let body =
            serde_json::json!({ "wake_id": claim["wake_id"], "generation": generation, "done": true }).to_string();
        http.post(s.url("__ds/subscriptions/m/ack"))
            .bearer_auth(claim["token"].as_str().unwrap_or(""))
            .body(body)
            .send()
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

/// The metric families of a scrape: the names on `# TYPE` lines and on `# HELP` lines.
fn families(scrape: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let names = |prefix: &str| {
        scrape
            .lines()
            .filter_map(|l| l.strip_prefix(prefix))
            .filter_map(|l| l.split(' ').next())
            .map(str::to_owned)
            .collect()
    };
    (names("# TYPE "), names("# HELP "))
}

/// The metric names in README's metric table (its rows start with a backquoted name).
fn readme_metrics() -> BTreeSet<String> {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).expect("README.md");
    readme
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .filter(|n| n.starts_with("oncelog_") || n.starts_with("process_"))
        .map(str::to_owned)
        .collect()
}

async fn scrape(http: &reqwest::Client, s: &common::TestServer) -> String {
    let r = http.get(format!("{}/metrics", s.origin)).send().await.expect("scrape");
    assert_eq!(r.status(), reqwest::StatusCode::OK);
    r.text().await.expect("text")
}

async fn post(http: &reqwest::Client, url: String, body: &'static str) -> String {
    let r = http.post(url).header("content-type", "text/plain").body(body).send().await.expect("append");
    assert!(r.status().is_success(), "{}", r.status());
    r.headers().get("stream-next-offset").and_then(|v| v.to_str().ok()).expect("offset").to_owned()
}

#[tokio::test]
async fn every_metric_has_help_lag_follows_acks_and_the_dashboard_queries_documented_metrics() {
    let _serial = SERIAL.lock().await;
    let config = ServerConfig { metrics_streams: Some("dash/*".into()), ..ServerConfig::default() };
    // Lag is computed at most every LAG_REFRESH_MS: the clock moves past it between scrapes.
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let s = common::TestServer::start(config, Some(clock.clone())).await;
    let refresh = || clock.advance_ms(oncelog_server::metrics::LAG_REFRESH_MS);
    let http = reqwest::Client::new();
    // Something of every kind: appends, a live reader, a subscription with work pending.
    for (p, ct) in [("dash/a", "text/plain"), ("wake", "application/json"), ("jobs/a", "text/plain")] {
        http.put(s.url(p)).header("content-type", ct).send().await.expect("put");
    }
    post(&http, s.url("dash/a"), "x").await;
    http.get(s.url("dash/a") + "?offset=-1").send().await.expect("read");
    let sse = http.get(s.url("dash/a") + "?offset=-1&live=sse").send().await.expect("sse");
    let cfg = r#"{"type":"pull-wake","pattern":"jobs/*","wake_stream":"wake"}"#;
    let r = http
        .put(s.url("__ds/subscriptions/lagging"))
        .header("content-type", "application/json")
        .body(cfg)
        .send()
        .await
        .expect("sub");
    assert!(r.status().is_success(), "{}", r.status());
    let tail = post(&http, s.url("jobs/a"), "hello").await;

    let pending = scrape(&http, &s).await;
    drop(sse);
    let (types, helps) = families(&pending);
    let missing: Vec<&String> = types.difference(&helps).collect();
    assert!(missing.is_empty(), "# TYPE without # HELP: {missing:?}\n{pending}");
    for name in [
        "oncelog_appends_total",
        "oncelog_commit_to_ack_seconds",
        "oncelog_live_readers",
        "oncelog_subscription_lag_bytes",
        "oncelog_stream_appends_total",
    ] {
        assert!(types.contains(name), "{name} in the scrape:\n{pending}");
    }
    let documented = readme_metrics();
    let undocumented: Vec<&String> = types.difference(&documented).collect();
    assert!(undocumented.is_empty(), "in the scrape but not in README's table: {undocumented:?}");

    // The lag: 5 bytes in one stream, until the subscription acknowledges them.
    assert_eq!(sample(&pending, "oncelog_subscription_lag_bytes{subscription=\"lagging\"}"), 5.0, "{pending}");
    assert_eq!(sample(&pending, "oncelog_subscription_pending_streams{subscription=\"lagging\"}"), 1.0, "{pending}");
    let claim =
        http.post(s.url("__ds/subscriptions/lagging/claim")).body(r#"{"worker":"w"}"#).send().await.expect("claim");
    let claim: Value = serde_json::from_slice(&claim.bytes().await.expect("body")).expect("json");
    let ack = json!({ "wake_id": claim["wake_id"], "generation": claim["generation"], "acks": [{ "stream": "jobs/a", "offset": tail }], "done": true });
    let r = http
        .post(s.url("__ds/subscriptions/lagging/ack"))
        .bearer_auth(claim["token"].as_str().unwrap_or(""))
        .body(ack.to_string())
        .send()
        .await
        .expect("ack");
    assert_eq!(r.status().as_u16(), 200);
    refresh();
    let acked = scrape(&http, &s).await;
    assert!(acked.contains("oncelog_subscription_lag_bytes{subscription=\"lagging\"} 0\n"), "{acked}");
    assert!(acked.contains("oncelog_subscription_pending_streams{subscription=\"lagging\"} 0\n"), "{acked}");
    // Gone with the subscription, not frozen at its last value.
    http.delete(s.url("__ds/subscriptions/lagging")).send().await.expect("delete");
    refresh();
    assert!(!scrape(&http, &s).await.contains("subscription=\"lagging\""));

    // The dashboard is JSON, and every metric it queries is one the README documents.
    let dashboard = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/grafana/oncelog.json"))
        .expect("dashboard");
    let dashboard: Value = serde_json::from_str(&dashboard).expect("docs/grafana/oncelog.json is JSON");
    let mut queried = BTreeSet::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().expect("expr");
            for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
                if word.starts_with("oncelog_") || word.starts_with("process_") {
                    let family = ["_bucket", "_sum", "_count"]
                        .iter()
                        .fold(word, |w, suffix| w.strip_suffix(suffix).unwrap_or(w));
                    queried.insert(family.to_owned());
                }
            }
        }
    }
    // The sink's own metrics are documented in docs/SINKS.md's table, in the same form.
    let sinks = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/SINKS.md")).expect("SINKS.md");
    let sink_metrics: BTreeSet<String> = sinks
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .filter(|n| n.starts_with("oncelog_sink_"))
        .map(str::to_owned)
        .collect();
    let documented: BTreeSet<String> = documented.union(&sink_metrics).cloned().collect();
    let unknown: Vec<&String> = queried.difference(&documented).collect();
    assert!(unknown.is_empty(), "the dashboard queries metrics neither the README nor SINKS.md lists: {unknown:?}");
    for name in [
        "oncelog_appends_total",
        "oncelog_commit_to_ack_seconds",
        "oncelog_fsync_seconds",
        "oncelog_live_readers",
        "oncelog_connections_accepted_total",
        "oncelog_subscription_lag_bytes",
        "oncelog_stream_appends_total",
        "process_resident_memory_bytes",
    ] {
        assert!(queried.contains(name), "the dashboard shows {name}");
    }
}

#[tokio::test]
async fn per_stream_counters_only_for_matching_streams_and_up_to_the_cap() {
    let _serial = SERIAL.lock().await;
    let config =
        ServerConfig { metrics_streams: Some("per/*".into()), metrics_streams_max: 2, ..ServerConfig::default() };
    let s = common::TestServer::start(config, None).await;
    let http = reqwest::Client::new();
    for p in ["per/a", "per/b", "per/c", "other/x", "per/deep/x"] {
        http.put(s.url(p)).header("content-type", "text/plain").send().await.expect("put");
    }
    // per/a: three new appends and a producer's retry (not new data).
    for (seq, body) in [(0, "1"), (1, "1"), (2, "1"), (2, "1")] {
        let r = http
            .post(s.url("per/a"))
            .header("content-type", "text/plain")
            .header("producer-id", "p")
            .header("producer-epoch", "0")
            .header("producer-seq", seq.to_string())
            .body(body)
            .send()
            .await
            .expect("post");
        assert!(r.status().is_success());
    }
    post(&http, s.url("per/b"), "22").await;
    // The cap (2) is reached: per/c is counted only in the overflow; the others match nothing.
    post(&http, s.url("per/c"), "333").await;
    post(&http, s.url("other/x"), "4444").await;
    post(&http, s.url("per/deep/x"), "55555").await;
    // Reads: catch-up of per/a and per/c, an SSE data event of per/b.
    for p in ["per/a", "per/c", "other/x"] {
        http.get(s.url(p) + "?offset=-1").send().await.expect("read").bytes().await.expect("body");
    }
    let mut sse = http.get(s.url("per/b") + "?offset=-1&live=sse").send().await.expect("sse");
    let mut seen = String::new();
    while !seen.contains("22") {
        let chunk = tokio::time::timeout(Duration::from_secs(5), sse.chunk())
            .await
            .expect("an SSE event in time")
            .expect("chunk")
            .expect("more");
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    drop(sse);

    let m = scrape(&http, &s).await;
    let series = |name: &str, stream: &str| sample(&m, &format!("{name}{{stream=\"{stream}\"}}"));
    assert_eq!(
        (series("oncelog_stream_appends_total", "per/a"), series("oncelog_stream_append_bytes_total", "per/a")),
        (3.0, 3.0),
        "{m}"
    );
    assert_eq!(
        (series("oncelog_stream_appends_total", "per/b"), series("oncelog_stream_append_bytes_total", "per/b")),
        (1.0, 2.0),
        "{m}"
    );
    assert_eq!(
        (series("oncelog_stream_reads_total", "per/a"), series("oncelog_stream_read_bytes_total", "per/a")),
        (1.0, 3.0),
        "{m}"
    );
    assert_eq!(
        (series("oncelog_stream_reads_total", "per/b"), series("oncelog_stream_read_bytes_total", "per/b")),
        (1.0, 2.0),
        "{m}"
    );
    for other in ["per/c", "other/x", "per/deep/x"] {
        assert!(!m.contains(&format!("stream=\"{other}\"")), "{other} has no series of its own:\n{m}");
    }
    let overflow = |c: &str| sample(&m, &format!("oncelog_stream_overflow_total{{counter=\"{c}\"}}"));
    assert_eq!(
        [overflow("appends"), overflow("append_bytes"), overflow("reads"), overflow("read_bytes")],
        [1.0, 3.0, 1.0, 3.0],
        "per/c only:\n{m}"
    );
}

/// A catch-up response of large appends is sent from the segment file with `sendfile(2)` on a
/// plain connection: the counter moves by the bytes so sent (all but what went out with the
/// response head), and the body is the stream's bytes.
#[tokio::test]
async fn a_catch_up_of_large_appends_is_sent_with_sendfile() {
    let _serial = SERIAL.lock().await;
    let s = common::TestServer::start(ServerConfig::default(), None).await;
    let http = reqwest::Client::new();
    let url = s.url("sendfile");
    http.put(&url).header("content-type", "application/octet-stream").send().await.expect("put");
    let mut all = Vec::new();
    for i in 0..4u32 {
        let part: Vec<u8> = (0..(1u32 << 20)).map(|k| ((k * 3 + i) % 253) as u8).collect();
        let r = http
            .post(&url)
            .header("content-type", "application/octet-stream")
            .body(part.clone())
            .send()
            .await
            .expect("post");
        assert!(r.status().is_success());
        all.extend_from_slice(&part);
    }
    let before = sample(&scrape(&http, &s).await, "oncelog_sendfile_bytes_total");
    let body = http.get(format!("{url}?offset=-1")).send().await.expect("get").bytes().await.expect("body");
    assert!(body[..] == all[..], "the body is the stream");
    let sent = sample(&scrape(&http, &s).await, "oncelog_sendfile_bytes_total") - before;
    // Four mapped pieces of 1 MiB; a piece may start in the same write as the head (written from
    // memory up to the first full page of the socket buffer), so allow one piece's worth less.
    assert!(sent >= (3u64 << 20) as f64, "sent with sendfile: {sent} of {} bytes", all.len());
    assert!(sent <= all.len() as f64, "never more than the body: {sent}");
}

/// A server over a log engine in `dir`, whose state the test keeps (to count what its
/// subscriptions look up, or to learn where the metrics listener went).
async fn start_kept(
    dir: &tempfile::TempDir,
    config: ServerConfig,
    clock: Arc<ManualClock>,
) -> (oncelog_server::AppState<oncelog_log::LogEngine>, String) {
    let engine = oncelog_log::LogEngine::open(oncelog_log::LogOptions::new(dir.path())).expect("engine");
    let state = oncelog_server::AppState::new(Arc::new(engine), config).with_clock(clock);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let origin = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(oncelog_server::serve(listener, state.clone(), std::future::pending()));
    (state, origin)
}

/// Scrapes cost what they print: the lag of every subscription (a listing of its pattern's
/// streams, a lookup of each named stream) is computed at most once per `LAG_REFRESH_MS`, for
/// all scrapes in between and all concurrent ones; and subscriptions of one pattern share its
/// listing. Counted in the service's engine lookups, not timed. Before, every scrape made every
/// subscription's lookups: four anonymous scrapers took the machine at 128 subscriptions.
#[tokio::test]
async fn a_scrape_costs_what_it_prints_not_a_look_at_every_subscription() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let (state, origin) = start_kept(&dir, ServerConfig::default(), clock.clone()).await;
    let http = reqwest::Client::new();
    let url = |p: &str| format!("{origin}/v1/stream/{p}");
    http.put(url("wake")).header("content-type", "application/json").send().await.expect("put");
    for i in 0..50 {
        http.put(url(&format!("m/{i}"))).header("content-type", "text/plain").body("x").send().await.expect("put");
    }
    const SUBS: u64 = 20;
    for i in 0..SUBS {
        let cfg =
            json!({ "type": "pull-wake", "pattern": "m/*", "streams": [format!("named/{i}")], "wake_stream": "wake" });
        let r = http.put(url(&format!("__ds/subscriptions/s{i}"))).body(cfg.to_string()).send().await.expect("sub");
        assert!(r.status().is_success(), "{}", r.status());
    }
    let scrape = || async {
        let r = http.get(format!("{origin}/metrics")).send().await.expect("scrape");
        assert_eq!(r.status(), reqwest::StatusCode::OK);
        r.text().await.expect("text")
    };
    let lookups = || state.subs.lookups();

    let start = lookups();
    let first = scrape().await;
    assert_eq!(sample(&first, "oncelog_subscription_lag_bytes{subscription=\"s3\"}"), 0.0, "{first}");
    let one_pass = lookups() - start;
    // One listing of `m/` for all twenty, and one lookup of each named stream.
    assert_eq!(one_pass, 1 + SUBS, "one computation's lookups");
    for _ in 0..10 {
        scrape().await;
    }
    futures_util::future::join_all((0..4).map(|_| scrape())).await;
    assert_eq!(lookups() - start, one_pass, "scrapes within the refresh interval look nothing up");

    // New data shows after the interval, computed once for four concurrent scrapers.
    // (The append wakes the subscriptions, which looks at their streams: counted apart.)
    http.post(url("m/3")).header("content-type", "text/plain").body("hello").send().await.expect("append");
    clock.advance_ms(oncelog_server::metrics::LAG_REFRESH_MS);
    let start = lookups();
    let scrapes = futures_util::future::join_all((0..4).map(|_| scrape())).await;
    assert_eq!(lookups() - start, one_pass, "one computation for concurrent scrapers");
    for s in &scrapes {
        assert_eq!(sample(s, "oncelog_subscription_lag_bytes{subscription=\"s3\"}"), 5.0, "{s}");
    }
}

/// `--metrics-addr`: the scrape is served on a listener of its own (nothing else is), and no
/// longer on the public one.
#[tokio::test]
async fn metrics_can_be_served_on_a_listener_of_their_own_only() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let config = ServerConfig { metrics_addr: Some(([127, 0, 0, 1], 0).into()), ..ServerConfig::default() };
    let (state, origin) = start_kept(&dir, config, clock).await;
    let http = reqwest::Client::new();
    let mut metrics = None;
    for _ in 0..200 {
        if let Some(a) = state.metrics_addr.get() {
            metrics = Some(format!("http://{a}"));
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let metrics = metrics.expect("the metrics listener is bound");
    let r = http.get(format!("{metrics}/metrics")).send().await.expect("scrape");
    assert_eq!(r.status(), reqwest::StatusCode::OK);
    assert!(r.text().await.expect("text").contains("oncelog_streams"));
    let public = http.get(format!("{origin}/metrics")).send().await.expect("public scrape");
    assert_eq!(public.status(), reqwest::StatusCode::NOT_FOUND, "not on the public listener");
    assert_eq!(http.get(format!("{origin}/healthz")).send().await.expect("healthz").status(), reqwest::StatusCode::OK);
    // The metrics listener serves nothing else: no streams, no probes.
    let put = http.put(format!("{metrics}/v1/stream/x")).send().await.expect("put");
    assert_eq!(put.status(), reqwest::StatusCode::NOT_FOUND);
    let probe = http.get(format!("{metrics}/healthz")).send().await.expect("healthz");
    assert_eq!(probe.status(), reqwest::StatusCode::NOT_FOUND);
}
