//! Random requests, valid and not, against a real server: every answer is a deliberate status
//! (never a 5xx, never a dropped connection), and the server keeps working afterwards.

mod common;

use std::time::Duration;

use oncelog_server::ServerConfig;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

const HEADERS: &[&str] = &[
    "content-type",
    "stream-ttl",
    "stream-expires-at",
    "stream-closed",
    "stream-seq",
    "producer-id",
    "producer-epoch",
    "producer-seq",
    "stream-forked-from",
    "stream-fork-offset",
    "stream-fork-sub-offset",
    "if-none-match",
];
const VALUES: &[&str] = &[
    "",
    "0",
    "1",
    "-1",
    "05",
    "true",
    "TRUE",
    "yes",
    "application/json",
    "text/plain",
    "application/octet-stream",
    "application/json; charset=utf-8",
    "nonsense",
    "9007199254740991",
    "9007199254740992",
    "1e3",
    "0000000000000000_0000000000000000",
    "0000000000000000_0000000000000003",
    "9999999999999999_9999999999999999",
    "/v1/stream/a",
    "a",
    "b/c",
    "2030-01-01T00:00:00Z",
    "yesterday",
    "[]",
    "*",
    "\"1:0:0\"",
];
/// Weighted towards existing streams, so requests reach the engine.
const PATHS: &[&str] = &[
    "a",
    "a",
    "a",
    "a",
    "b",
    "b/c",
    "__ds/x",
    "x%2Fy",
    "..",
    "%00",
    "%C3%A9",
    "a%20b",
    "",
    // The subscription API.
    "__ds/subscriptions/s",
    "__ds/subscriptions/s",
    "__ds/subscriptions/s/claim",
    "__ds/subscriptions/s/ack",
    "__ds/subscriptions/s/commit",
    "__ds/subscriptions/s/release",
    "__ds/subscriptions/s/streams",
    "__ds/subscriptions/s/streams/a",
    "__ds/subscriptions",
    "__ds/jwks.json",
    "__ds/subscriptions/%2F",
];
const QUERIES: &[&str] = &[
    "",
    "offset=-1",
    "offset=now",
    "offset=",
    "offset=-1&offset=-1",
    "live=sse&offset=-1",
    "live=long-poll&offset=now",
    "live=long-poll",
    "live=bogus&offset=-1",
    "offset=0000000000000000_0000000000000002",
    "offset=abc",
    "offset=0000000000000000_9999999999999999",
    "cursor=99999999999&offset=-1&live=long-poll",
];
const BODIES: &[&[u8]] = &[
    b"", b"x", b"[]", b"[1,2]", b"{", b"\"s\"", b"[[1]]", b"null", b"{\"a\":\"[,]\"}", &[0xff, 0, 0xfe],
    br#"{"type":"pull-wake","pattern":"*","wake_stream":"a","lease_ttl_ms":1000}"#,
    br#"{"type":"webhook","streams":["a","b"],"webhook":{"url":"https://10.0.0.1/"}}"#,
    br#"{"worker":"w"}"#,
    br#"{"wake_id":"w_1_1","generation":1,"acks":[{"stream":"a","offset":"0000000000000000_0000000000000000"}],"done":true}"#,
    br#"{"wake_id":"w_1_1","generation":1,"appends":[{"stream":"a","producer":{"id":"p","epoch":1,"seq":0},"data":"x"}]}"#,
    br#"{"streams":["a",""]}"#,
];
const METHODS: &[&str] = &["GET", "HEAD", "PUT", "PUT", "POST", "POST", "POST", "POST", "DELETE", "OPTIONS", "PATCH"];

#[derive(Debug, Clone)]
struct Req {
    method: &'static str,
    path: &'static str,
    query: &'static str,
    headers: Vec<(&'static str, &'static str)>,
    body: &'static [u8],
}

/// The fixed values plus one far beyond every size limit (it once took the writer thread down).
fn values() -> Vec<&'static str> {
    let huge: &'static str = Box::leak("v".repeat(70_000).into_boxed_str());
    VALUES.iter().copied().chain(std::iter::once(huge)).collect()
}

/// Random headers, plus (often) a coherent content type and producer triple, so that requests
/// get past the first checks and reach the engine.
fn request() -> impl Strategy<Value = Req> {
    let numbers = proptest::sample::select(&["0", "1", "2", "-1", "9007199254740992"][..]);
    let huge = *values().last().expect("the huge value");
    let producer =
        proptest::option::weighted(0.5, (proptest::sample::select(vec!["p", "q", "", huge]), numbers.clone(), numbers));
    let content_type = proptest::option::weighted(
        0.8,
        proptest::sample::select(&["text/plain", "text/plain", "application/json", "application/octet-stream"][..]),
    );
    (
        proptest::sample::select(METHODS),
        proptest::sample::select(PATHS),
        proptest::sample::select(QUERIES),
        proptest::collection::vec((proptest::sample::select(HEADERS), proptest::sample::select(values())), 0..4),
        content_type,
        producer,
        proptest::sample::select(BODIES),
    )
        .prop_map(|(method, path, query, mut headers, ct, producer, body)| {
            // The coherent headers replace random ones of the same name.
            let replaced =
                |k: &str| (ct.is_some() && k == "content-type") || (producer.is_some() && k.starts_with("producer-"));
            headers.retain(|(k, _)| !replaced(k));
            if let Some(ct) = ct {
                headers.push(("content-type", ct));
            }
            if let Some((id, epoch, seq)) = producer {
                headers.extend([("producer-id", id), ("producer-epoch", epoch), ("producer-seq", seq)]);
            }
            Req { method, path, query, headers, body }
        })
}

#[test]
fn random_requests_never_get_a_server_error() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let server = rt.block_on(async {
        let config = ServerConfig {
            long_poll_timeout: Duration::from_millis(50),
            sse_max_duration: Duration::from_millis(50),
            ..ServerConfig::default()
        };
        common::TestServer::start(config, None).await
    });
    let base = format!("{}/", server.base);
    let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().expect("client");
    // Streams to hit (the random requests create, close and delete more).
    rt.block_on(async {
        for p in ["a", "b", "b/c"] {
            http.put(format!("{base}{p}")).header("content-type", "text/plain").send().await.expect("put");
        }
    });

    let mut runner = TestRunner::new(Config { cases: 1000, failure_persistence: None, ..Config::default() });
    let result = runner.run(&request(), |req| {
        let url = format!("{base}{}{}{}", req.path, if req.query.is_empty() { "" } else { "?" }, req.query);
        let status = rt.block_on(async {
            let method = reqwest::Method::from_bytes(req.method.as_bytes()).expect("method");
            let mut rb = http.request(method, &url).body(req.body.to_vec());
            for (k, v) in &req.headers {
                rb = rb.header(*k, *v);
            }
            let resp = rb.send().await.map_err(|e| format!("transport error: {e}"))?;
            let status = resp.status();
            resp.bytes().await.map_err(|e| format!("body error: {e}"))?;
            Ok::<_, String>(status)
        });
        let status = status.map_err(TestCaseError::fail)?;
        prop_assert!(!status.is_server_error(), "{:?} answered {}", req, status);
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    // Still healthy: a plain create, append and read work.
    rt.block_on(async {
        let s = format!("{base}after-fuzz");
        assert!(http.put(&s).header("content-type", "text/plain").send().await.expect("put").status().is_success());
        let r = http.post(&s).header("content-type", "text/plain").body("ok").send().await.expect("post");
        assert_eq!(r.status(), reqwest::StatusCode::NO_CONTENT);
        assert_eq!(http.get(&s).send().await.expect("get").text().await.expect("text"), "ok");
    });
}
