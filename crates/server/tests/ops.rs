//! Health and readiness endpoints, configurable ops paths, and `serve`'s graceful stop.

mod common;

use std::sync::Arc;
use std::time::Duration;

use oncelog_log::{LogEngine, LogOptions};
use oncelog_server::{serve, AppState, ServerConfig};
use oncelog_storage::{Engine, StorageError};
use reqwest::StatusCode;

#[tokio::test]
async fn readyz_turns_503_with_the_reason_after_a_fail_stop_while_healthz_and_reads_go_on() {
    let s = common::TestServer::start(ServerConfig::default(), None).await;
    let http = reqwest::Client::new();
    let get = |path: &str| http.get(format!("{}{path}", s.origin)).send();
    let r = get("/healthz").await.expect("healthz");
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers().get("access-control-allow-origin").and_then(|v| v.to_str().ok()), Some("*"));
    assert_eq!(get("/readyz").await.expect("readyz").status(), StatusCode::OK);

    http.put(s.url("x")).header("content-type", "text/plain").send().await.expect("put");
    http.post(s.url("x")).header("content-type", "text/plain").body("kept").send().await.expect("post");
    s.failpoints.fail_sync(true);
    let r = http.post(s.url("x")).header("content-type", "text/plain").body("lost").send().await.expect("post");
    // The failed group's outcome is unknown: 503 with Retry-After, like the refusals after it
    // (it was 500 until the fault suite filled a disk), never a 500.
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(r.headers().contains_key("retry-after"));
    let said = r.text().await.expect("text");
    assert!(said.contains("writes stopped after a storage failure"), "{said}");
    s.failpoints.fail_sync(false);
    // Fail-stop: writes stay refused even though the disk "recovered".
    let r = http.post(s.url("x")).header("content-type", "text/plain").body("again").send().await.expect("post");
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);

    let r = get("/readyz").await.expect("readyz");
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    let reason = r.text().await.expect("text");
    assert!(reason.contains("not ready") && reason.contains("fdatasync"), "{reason}");
    assert_eq!(get("/healthz").await.expect("healthz").status(), StatusCode::OK);
    assert_eq!(http.get(s.url("x")).send().await.expect("get").text().await.expect("text"), "kept");
}

#[tokio::test]
async fn ops_paths_are_configurable_and_metrics_can_be_switched_off() {
    let config = ServerConfig {
        healthz_path: "/ops/live".into(),
        readyz_path: "/ops/ready".into(),
        metrics_path: None,
        ..ServerConfig::default()
    };
    let s = common::TestServer::start(config, None).await;
    let http = reqwest::Client::new();
    let status = |path: &'static str| {
        let url = format!("{}{path}", s.origin);
        let http = http.clone();
        async move { http.get(url).send().await.expect("get").status() }
    };
    assert_eq!(status("/ops/live").await, StatusCode::OK);
    assert_eq!(status("/ops/ready").await, StatusCode::OK);
    for gone in ["/healthz", "/readyz", "/metrics"] {
        assert_eq!(status(gone).await, StatusCode::NOT_FOUND, "{gone}");
    }
}

#[tokio::test]
async fn serve_refuses_a_bad_config_and_stops_cleanly_when_told() {
    let dir = tempfile::tempdir().expect("tempdir");
    let engine = Arc::new(LogEngine::open(LogOptions::new(dir.path())).expect("engine"));
    let bad = ServerConfig { readyz_path: "/v1/stream/ready".into(), ..ServerConfig::default() };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let r = serve(listener, AppState::new(engine.clone(), bad), std::future::pending()).await;
    assert!(matches!(r, Err(oncelog_server::ServeError::Config(_))), "{r:?}");

    let config = ServerConfig { long_poll_timeout: Duration::from_secs(30), ..ServerConfig::default() };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let base = format!("http://{}/v1/stream", listener.local_addr().expect("addr"));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve(listener, AppState::new(engine.clone(), config), async {
        let _ = stopped.await;
    }));
    let http = reqwest::Client::new();
    http.put(format!("{base}/s")).header("content-type", "text/plain").send().await.expect("put");
    http.post(format!("{base}/s")).header("content-type", "text/plain").body("a").send().await.expect("post");
    let _ = stop.send(());
    let done = tokio::time::timeout(Duration::from_secs(10), server).await.expect("serve returns within the grace");
    assert!(matches!(done, Ok(Ok(()))), "{done:?}");
    // The engine was shut down with everything durable; nothing more is written.
    assert!(matches!(engine.head("s", 0).await, Ok(i) if i.tail.0 == 1));
    assert!(matches!(
        engine
            .create(oncelog_storage::CreateRequest {
                path: "t".into(),
                content_type: None,
                expiry: None,
                fork: None,
                retention: Default::default(),
                compaction: false,
                closed: false,
                initial: bytes::Bytes::new(),
                json_framed: false,
                now_ms: 0,
            })
            .await,
        Err(oncelog_storage::CreateError::Storage(StorageError::ShuttingDown))
    ));
}

#[tokio::test]
async fn cors_origins_are_explicit_when_configured() {
    let config = ServerConfig {
        cors_origins: oncelog_server::headers::CorsOrigins::parse("https://app.example, https://admin.example/"),
        ..ServerConfig::default()
    };
    let s = common::TestServer::start(config, None).await;
    let http = reqwest::Client::new();
    let allow = |origin: &'static str| {
        let req = http.get(format!("{}/healthz", s.origin)).header("origin", origin);
        async move {
            let r = req.send().await.expect("get");
            assert!(r.headers().get_all("vary").iter().any(|v| v == "origin"));
            r.headers().get("access-control-allow-origin").map(|v| v.to_str().unwrap_or_default().to_owned())
        }
    };
    assert_eq!(allow("https://app.example").await.as_deref(), Some("https://app.example"));
    assert_eq!(allow("https://admin.example").await.as_deref(), Some("https://admin.example"));
    assert_eq!(allow("https://evil.example").await, None);
    // The default is any origin, never with credentials.
    let open = common::TestServer::start(ServerConfig::default(), None).await;
    let r =
        http.get(format!("{}/healthz", open.origin)).header("origin", "https://x.example").send().await.expect("get");
    assert_eq!(r.headers()["access-control-allow-origin"], "*");
    assert!(r.headers().get("access-control-allow-credentials").is_none());
}
