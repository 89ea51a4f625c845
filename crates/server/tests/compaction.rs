//! Compaction of State Protocol streams over HTTP: `Stream-Compaction: state` at creation,
//! State Protocol messages only, `POST` + `Stream-Compact: true` writes the snapshot at the tail.

mod common;

use oncelog_protocol::state::Materialized;
use oncelog_server::ServerConfig;
use reqwest::{Client, StatusCode};

fn header(r: &reqwest::Response, name: &str) -> Option<String> {
    r.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned)
}

/// The state a JSON read from `offset` materialises (the array form, folded message by message).
async fn state_from(http: &Client, url: &str, offset: &str) -> (StatusCode, Materialized) {
    let r = http.get(format!("{url}?offset={offset}")).send().await.expect("get");
    let status = r.status();
    let body = r.bytes().await.expect("body");
    let mut state = Materialized::default();
    if status == StatusCode::OK {
        let items: Vec<&serde_json::value::RawValue> = serde_json::from_slice(&body).expect("a JSON array");
        for item in items {
            state.apply(oncelog_protocol::state::parse(item.get().as_bytes()).expect("State Protocol"));
        }
    }
    (status, state)
}

#[tokio::test]
async fn a_compacted_stream_reads_from_minus_one_as_its_whole_history_did() {
    let s = common::TestServer::start(ServerConfig::default(), None).await;
    let http = Client::new();
    let url = s.url("doc");
    let put = |ct: &'static str, compaction: &'static str| {
        http.put(&url).header("content-type", ct).header("stream-compaction", compaction).send()
    };
    assert_eq!(put("text/plain", "state").await.expect("put").status(), StatusCode::BAD_REQUEST, "JSON only");
    assert_eq!(put("application/json", "everything").await.expect("put").status(), StatusCode::BAD_REQUEST);
    let created = put("application/json", "state").await.expect("put");
    assert_eq!(created.status(), StatusCode::CREATED);
    assert_eq!(header(&created, "stream-compaction").as_deref(), Some("state"));
    let with_retention = http
        .put(s.url("r"))
        .header("content-type", "application/json")
        .header("stream-compaction", "state")
        .header("stream-retention-max-bytes", "100")
        .send()
        .await
        .expect("put");
    assert_eq!(with_retention.status(), StatusCode::BAD_REQUEST);

    // Only State Protocol messages go in.
    let post = |body: String| http.post(&url).header("content-type", "application/json").body(body).send();
    assert_eq!(post(r#"{"hello":"world"}"#.into()).await.expect("post").status(), StatusCode::BAD_REQUEST);
    for i in 0..40 {
        let op = if i % 9 == 8 { "delete" } else { "upsert" };
        let msg =
            format!(r#"[{{"type":"todo","key":"t{}","value":{{"n":{i}}},"headers":{{"operation":"{op}"}}}}]"#, i % 6);
        assert_eq!(post(msg).await.expect("post").status(), StatusCode::NO_CONTENT);
    }
    let (_, whole) = state_from(&http, &url, "-1").await;
    let before = header(&http.head(&url).send().await.expect("head"), "stream-next-offset").expect("tail");

    let r = http.post(&url).header("stream-compact", "true").send().await.expect("compact");
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    assert_eq!(
        header(&r, "stream-earliest-offset").as_deref(),
        Some(before.as_str()),
        "the snapshot starts at the old tail"
    );
    let (status, compacted) = state_from(&http, &url, "-1").await;
    assert_eq!((status, compacted), (StatusCode::OK, whole));
    let (status, _) = state_from(&http, &url, "0000000000000000_0000000000000000").await;
    assert_eq!(status, StatusCode::GONE, "the history is gone");
    // A compaction with a body, or of a stream not made for it, is refused.
    let with_body = http
        .post(&url)
        .header("stream-compact", "true")
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .expect("post");
    assert_eq!(with_body.status(), StatusCode::BAD_REQUEST);
    http.put(s.url("plain")).header("content-type", "application/json").send().await.expect("put");
    let plain = http.post(s.url("plain")).header("stream-compact", "true").send().await.expect("post");
    assert_eq!(plain.status(), StatusCode::CONFLICT);
}

#[tokio::test]
async fn the_sweeper_compacts_a_stream_whose_history_grew() {
    let config = ServerConfig {
        sweep_interval: std::time::Duration::from_millis(20),
        compaction_min_bytes: 2_000,
        ..ServerConfig::default()
    };
    let s = common::TestServer::start(config, None).await;
    let http = Client::new();
    let url = s.url("doc");
    let r = http
        .put(&url)
        .header("content-type", "application/json")
        .header("stream-compaction", "state")
        .send()
        .await
        .expect("put");
    assert_eq!(r.status(), StatusCode::CREATED);
    for i in 0..60 {
        let msg = format!(r#"{{"type":"counter","key":"c{}","value":{i},"headers":{{"operation":"upsert"}}}}"#, i % 3);
        let r = http.post(&url).header("content-type", "application/json").body(msg).send().await.expect("post");
        assert_eq!(r.status(), StatusCode::NO_CONTENT);
    }
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let head = http.head(&url).send().await.expect("head");
        if header(&head, "stream-earliest-offset").is_some_and(|e| e != "0000000000000000_0000000000000000") {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "no background compaction within 10 s");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let (status, state) = state_from(&http, &url, "-1").await;
    assert_eq!(status, StatusCode::OK);
    let values: Vec<((String, String), String)> =
        state.entities().map(|((t, k), v)| ((t.to_owned(), k.to_owned()), v.to_owned())).collect();
    let want: Vec<((String, String), String)> = [("c0", "57"), ("c1", "58"), ("c2", "59")]
        .iter()
        .map(|(k, v)| (("counter".to_owned(), (*k).to_owned()), (*v).to_owned()))
        .collect();
    assert_eq!(values, want);
}

#[tokio::test]
async fn compaction_streams_and_their_forks_take_no_default_retention() {
    let config = ServerConfig {
        default_retention: oncelog_storage::RetentionPolicy { max_age_s: Some(60), max_bytes: None },
        ..ServerConfig::default()
    };
    let s = common::TestServer::start(config, None).await;
    let http = Client::new();
    let r = http
        .put(s.url("doc"))
        .header("content-type", "application/json")
        .header("stream-compaction", "state")
        .send()
        .await
        .expect("put");
    assert_eq!(r.status(), StatusCode::CREATED);
    assert_eq!(header(&r, "stream-retention-max-age"), None);
    let fork = http.put(s.url("copy")).header("stream-forked-from", "/v1/stream/doc").send().await.expect("fork");
    assert_eq!(fork.status(), StatusCode::CREATED, "{:?}", fork.text().await);
    let fork = http.head(s.url("copy")).send().await.expect("head");
    assert_eq!(
        (header(&fork, "stream-compaction").as_deref(), header(&fork, "stream-retention-max-age")),
        (Some("state"), None)
    );
    // A plain stream keeps the default.
    let plain = http.put(s.url("plain")).header("content-type", "application/json").send().await.expect("put");
    assert_eq!(header(&plain, "stream-retention-max-age").as_deref(), Some("60"));
}

#[tokio::test]
async fn appends_go_on_while_compactions_run_and_nothing_is_lost() {
    let s = common::TestServer::start(ServerConfig { compaction_min_bytes: 0, ..ServerConfig::default() }, None).await;
    let http = Client::new();
    let url = s.url("doc");
    let r = http
        .put(&url)
        .header("content-type", "application/json")
        .header("stream-compaction", "state")
        .send()
        .await
        .expect("put");
    assert_eq!(r.status(), StatusCode::CREATED);
    let writer = {
        let (http, url) = (http.clone(), url.clone());
        tokio::spawn(async move {
            let mut expected = Materialized::default();
            for i in 0..300 {
                let msg =
                    format!(r#"{{"type":"n","key":"k{}","value":{i},"headers":{{"operation":"upsert"}}}}"#, i % 7);
                let r = http
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(msg.clone())
                    .send()
                    .await
                    .expect("post");
                assert_eq!(r.status(), StatusCode::NO_CONTENT, "appends keep working");
                expected.fold(format!("{msg},").as_bytes()).expect("fold");
            }
            expected
        })
    };
    let mut compactions = 0;
    while !writer.is_finished() {
        let r = http.post(&url).header("stream-compact", "true").send().await.expect("compact");
        assert!(matches!(r.status(), StatusCode::NO_CONTENT | StatusCode::SERVICE_UNAVAILABLE), "{}", r.status());
        compactions += usize::from(r.status() == StatusCode::NO_CONTENT);
    }
    let expected = writer.await.expect("writer");
    assert!(compactions > 0);
    let (status, state) = state_from(&http, &url, "-1").await;
    assert_eq!((status, state), (StatusCode::OK, expected), "after {compactions} compactions");
}
