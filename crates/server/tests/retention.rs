//! Retention policies over HTTP: set at creation (or by the server's defaults), shown on `HEAD`,
//! compared by a re-create, applied by the background sweep.

mod common;

use std::sync::Arc;
use std::time::Duration;

use oncelog_protocol::Offset;
use oncelog_server::ServerConfig;
use oncelog_storage::{ManualClock, RetentionPolicy};
use reqwest::{Client, StatusCode};

fn header(r: &reqwest::Response, name: &str) -> Option<String> {
    r.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned)
}

async fn earliest_within(http: &Client, url: &str, want: Offset) -> Option<String> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let head = http.head(url).send().await.expect("head");
        let got = header(&head, "stream-earliest-offset");
        if got == Some(want.to_string()) || tokio::time::Instant::now() > deadline {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn policies_are_set_at_creation_shown_compared_and_applied_by_the_sweep() {
    let clock = Arc::new(ManualClock::new(1_000_000));
    let config = ServerConfig {
        sweep_interval: Duration::from_millis(20),
        default_retention: RetentionPolicy { max_age_s: Some(3600), max_bytes: None },
        ..ServerConfig::default()
    };
    let s = common::TestServer::start(config, Some(clock.clone())).await;
    let http = Client::new();
    let url = s.url("s");
    let put = |bytes: &'static str| {
        http.put(&url).header("content-type", "text/plain").header("stream-retention-max-bytes", bytes).send()
    };
    let r = put("8").await.expect("put");
    assert_eq!(r.status(), StatusCode::CREATED);
    // The unnamed limit comes from the server's default; both are shown.
    assert_eq!(header(&r, "stream-retention-max-bytes").as_deref(), Some("8"));
    assert_eq!(header(&r, "stream-retention-max-age").as_deref(), Some("3600"));
    assert_eq!(put("8").await.expect("put").status(), StatusCode::OK);
    assert_eq!(put("9").await.expect("put").status(), StatusCode::CONFLICT);
    for bad in ["0", "-1", "8 bytes", "1.5"] {
        assert_eq!(put(bad).await.expect("put").status(), StatusCode::BAD_REQUEST, "{bad}");
    }
    // `none` opts out of the default.
    let plain = http
        .put(s.url("plain"))
        .header("content-type", "text/plain")
        .header("stream-retention-max-age", "none")
        .send()
        .await
        .expect("put");
    assert_eq!(plain.status(), StatusCode::CREATED);
    assert_eq!(header(&plain, "stream-retention-max-age"), None);

    for part in ["aaaa", "bbbb", "cccc", "dddd"] {
        let r = http.post(&url).header("content-type", "text/plain").body(part).send().await.expect("post");
        assert_eq!(r.status(), StatusCode::NO_CONTENT);
    }
    // Keep at least 8 bytes: the sweep drops the first two appends.
    assert_eq!(earliest_within(&http, &url, Offset(8)).await, Some(Offset(8).to_string()));
    assert_eq!(http.get(format!("{url}?offset=-1")).send().await.expect("get").text().await.expect("text"), "ccccdddd");
    let gone = http.get(format!("{url}?offset={}", Offset(4))).send().await.expect("get");
    assert_eq!(gone.status(), StatusCode::GONE);

    // By age: an hour later, everything written before is old.
    clock.advance_ms(3_601_000);
    assert_eq!(earliest_within(&http, &url, Offset(16)).await, Some(Offset(16).to_string()));
}
