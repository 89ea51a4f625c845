//! The engine metrics the README lists, on the PostgreSQL engine: parked appends and group
//! commits are recorded with the same meaning as on the log engine. Alone in its binary: the
//! metrics recorder is process-wide. Needs `ONCELOG_TEST_POSTGRES_URL`.

use std::sync::Arc;
use std::time::Duration;

use oncelog_postgres::{PgEngine, PgOptions};
use oncelog_server::{serve, AppState, ServerConfig};

fn sample(scrape: &str, name: &str) -> f64 {
    scrape
        .lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')))
        .map_or(0.0, |v| v.parse().unwrap_or(0.0))
}

#[tokio::test]
async fn postgres_counts_parked_appends_and_records_group_commits() {
    let url = std::env::var("ONCELOG_TEST_POSTGRES_URL").expect("ONCELOG_TEST_POSTGRES_URL (./scripts/test sets it)");
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    let schema = format!("metrics_{}_{nanos}", std::process::id());
    let engine =
        PgEngine::open(PgOptions { schema, pool_size: 4, committers: 2, ..PgOptions::new(url) }).await.expect("open");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(serve(listener, AppState::new(Arc::new(engine), ServerConfig::default()), std::future::pending()));
    let http = reqwest::Client::new();
    let scrape =
        || async { http.get(format!("{base}/metrics")).send().await.expect("scrape").text().await.expect("text") };
    let before = scrape().await;
    let stream = format!("{base}/v1/stream/m");
    assert!(http.put(&stream).header("content-type", "text/plain").send().await.expect("put").status().is_success());
    let post = |body: &'static str, seq: u64| {
        http.post(&stream)
            .header("content-type", "text/plain")
            .header("producer-id", "p")
            .header("producer-epoch", "0")
            .header("producer-seq", seq.to_string())
            .body(body)
            .send()
    };
    assert_eq!(post("a", 0).await.expect("post").status().as_u16(), 200);
    // seq 2 overtakes seq 1: it waits, then lands.
    let (late, early) = tokio::join!(post("c", 2), async {
        tokio::time::sleep(Duration::from_millis(60)).await;
        post("b", 1).await
    });
    assert_eq!((late.expect("seq 2").status().as_u16(), early.expect("seq 1").status().as_u16()), (200, 200));
    let after = scrape().await;
    let delta = |name: &str| sample(&after, name) - sample(&before, name);
    assert_eq!(delta("oncelog_parked_appends_total"), 1.0, "{after}");
    assert!(delta("oncelog_group_commit_commands_count") >= 2.0, "{after}");
    assert!(delta("oncelog_group_commit_seconds_count") >= 2.0, "{after}");
    assert!(delta("oncelog_group_commit_commands_sum") >= 3.0, "every append went through a group: {after}");
}
