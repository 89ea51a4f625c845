//! Findings of probing a running server with hostile input, each pinned: ambiguous or malformed
//! requests are refused with 400 and a reason, never half-understood. Every case runs on both
//! front ends (issue 47): plain HTTP/1 on the server's own engine, and TLS with HTTP/2 on hyper;
//! the Host cases, which need raw HTTP/1 bytes, on the first.

mod common;

use oncelog_server::ServerConfig;
use reqwest::StatusCode;

/// Which front end a case goes through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Front {
    /// Plain HTTP/1, the server's own engine.
    Plain,
    /// TLS with HTTP/2 (ALPN), hyper's engine.
    TlsH2,
}

async fn server(front: Front) -> (common::TestServer, reqwest::Client, Option<tempfile::TempDir>) {
    let (s, http, tls) = match front {
        Front::Plain => (common::TestServer::start(ServerConfig::default(), None).await, reqwest::Client::new(), None),
        Front::TlsH2 => {
            let (s, http, dir) = common::TestServer::start_tls(ServerConfig::default()).await;
            (s, http, Some(dir))
        }
    };
    for (path, ct) in [("t", "text/plain"), ("j", "application/json")] {
        let r = http.put(s.url(path)).header("content-type", ct).send().await.expect("put");
        assert_eq!(r.status(), StatusCode::CREATED);
        let version = if front == Front::TlsH2 { reqwest::Version::HTTP_2 } else { reqwest::Version::HTTP_11 };
        assert_eq!(r.version(), version, "the front end asked for");
    }
    (s, http, tls)
}

async fn status_and_reason(r: reqwest::RequestBuilder) -> (StatusCode, String) {
    let r = r.send().await.expect("send");
    (r.status(), r.text().await.expect("text"))
}

async fn a_protocol_header_sent_twice_is_refused(front: Front) {
    let (s, http, _tls) = server(front).await;
    let post = || {
        http.post(s.url("t"))
            .header("content-type", "text/plain")
            .header("producer-id", "p")
            .header("producer-seq", "0")
            .body("x")
    };
    let (status, reason) = status_and_reason(post().header("producer-epoch", "5").header("producer-epoch", "0")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{reason}");
    assert!(reason.contains("producer-epoch") && reason.contains("at most once"), "{reason}");
    let twice_type =
        http.post(s.url("t")).header("content-type", "text/plain").header("content-type", "text/plain").body("x");
    assert_eq!(status_and_reason(twice_type).await.0, StatusCode::BAD_REQUEST);
    let twice_seq = http
        .post(s.url("t"))
        .header("content-type", "text/plain")
        .header("stream-seq", "a")
        .header("stream-seq", "b")
        .body("x");
    assert_eq!(status_and_reason(twice_seq).await.0, StatusCode::BAD_REQUEST);
    // Nothing was written by any of them; a single header works.
    assert_eq!(status_and_reason(post().header("producer-epoch", "0")).await.0, StatusCode::OK);
    assert_eq!(http.get(s.url("t")).send().await.expect("get").text().await.expect("text"), "x");
}

async fn a_malformed_content_type_on_append_is_400_not_a_mismatch(front: Front) {
    let (s, http, _tls) = server(front).await;
    for ct in ["foo", "", "/"] {
        let (status, reason) = status_and_reason(http.post(s.url("t")).header("content-type", ct).body("x")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{ct:?}: {reason}");
        assert!(reason.contains("Content-Type"), "{reason}");
    }
    // A well-formed but different type is still the 409 of a mismatch.
    assert_eq!(
        status_and_reason(http.post(s.url("t")).header("content-type", "text/html").body("x")).await.0,
        StatusCode::CONFLICT
    );
}

async fn a_content_type_mismatch_names_both_types(front: Front) {
    let (s, http, _tls) = server(front).await;
    let (status, reason) =
        status_and_reason(http.post(s.url("j")).header("content-type", "text/plain").body("x")).await;
    assert_eq!(status, StatusCode::CONFLICT, "{reason}");
    assert_eq!(reason.trim_end(), r#"content type "text/plain" does not match the stream's "application/json""#);
    // A fork naming another type than its source's.
    let fork = http.put(s.url("f")).header("stream-forked-from", "/v1/stream/t").header("content-type", "text/html");
    let (status, reason) = status_and_reason(fork).await;
    assert_eq!(status, StatusCode::CONFLICT, "{reason}");
    assert_eq!(reason.trim_end(), r#"content type "text/html" does not match the fork source's "text/plain""#);
}

async fn a_fork_source_on_another_host_is_refused(front: Front) {
    let (s, http, _tls) = server(front).await;
    http.post(s.url("t")).header("content-type", "text/plain").body("abc").send().await.expect("post");
    let fork = |name: &str, from: String| http.put(s.url(name)).header("stream-forked-from", from).send();
    let r = fork("f1", "http://elsewhere.example:4437/v1/stream/t".into()).await.expect("put");
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let r = fork("f2", format!("{}/t", s.base)).await.expect("put");
    assert_eq!(r.status(), StatusCode::CREATED, "a URL of this server is fine");
    let r = fork("f3", "/v1/stream/t".into()).await.expect("put");
    assert_eq!(r.status(), StatusCode::CREATED);
}

async fn json_deeper_than_the_limit_is_refused(front: Front) {
    let (s, http, _tls) = server(front).await;
    let nested = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
    let post = |body: String| http.post(s.url("j")).header("content-type", "application/json").body(body);
    let (status, reason) = status_and_reason(post(format!("[{}]", nested(200)))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(reason.contains("nested"), "{reason}");
    assert_eq!(status_and_reason(post(format!("[{}]", nested(64)))).await.0, StatusCode::NO_CONTENT);
    // What was accepted reads back as JSON with a default reader.
    let text = http.get(s.url("j")).send().await.expect("get").text().await.expect("text");
    assert!(serde_json::from_str::<serde_json::Value>(&text).is_ok());
}

async fn an_empty_body_with_a_stream_closed_value_other_than_true_says_so(front: Front) {
    let (s, http, _tls) = server(front).await;
    let (status, reason) = status_and_reason(http.post(s.url("t")).header("stream-closed", "yes")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(reason.contains("\"yes\"") && reason.contains("not `true`"), "{reason}");
    // The value is ignored, as the protocol says, so the stream is still open.
    let head = http.head(s.url("t")).send().await.expect("head");
    assert!(head.headers().get("stream-closed").is_none());
}

async fn a_made_up_offset_inside_a_json_message_is_refused(front: Front) {
    let (s, http, _tls) = server(front).await;
    let r = http
        .post(s.url("j"))
        .header("content-type", "application/json")
        .body("[{\"k\":1},2]")
        .send()
        .await
        .expect("post");
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let off = |n: u64| format!("0000000000000000_{n:016}");
    for live in ["", "&live=long-poll", "&live=sse"] {
        let (status, reason) = status_and_reason(http.get(format!("{}?offset={}{live}", s.url("j"), off(3)))).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{live}: {reason}");
        assert!(reason.contains("message boundary"), "{reason}");
    }
    // Offsets the server returned still work, and byte streams may be read from anywhere.
    let r = http.get(format!("{}?offset={}", s.url("j"), off(0))).send().await.expect("get");
    assert_eq!(r.text().await.expect("text"), "[{\"k\":1},2]");
    http.post(s.url("t")).header("content-type", "text/plain").body("abcdef").send().await.expect("post");
    let r = http.get(format!("{}?offset={}", s.url("t"), off(3))).send().await.expect("get");
    assert_eq!(r.text().await.expect("text"), "def");
}

/// A lone surrogate escape is no text: refused on append, in a create's body and in a
/// transactional commit's outputs, so a stream never holds a message its readers cannot decode.
async fn json_with_a_lone_surrogate_escape_is_refused_everywhere(front: Front) {
    let (s, http, _tls) = server(front).await;
    let json = |r: reqwest::RequestBuilder| r.header("content-type", "application/json");
    for body in [r#"{"v":"\ud800"}"#, r#"["ok", "\udc00"]"#, r#"{"\udbff": 1}"#] {
        let (status, reason) = status_and_reason(json(http.post(s.url("j"))).body(body)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "append {body}: {reason}");
        let (status, _) = status_and_reason(json(http.put(s.url("j2"))).body(body)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "create {body}");
    }
    // A pair is text, and so is an escaped backslash before `ud800`.
    assert_eq!(
        status_and_reason(json(http.post(s.url("j"))).body(r#"{"v":"\ud83d\ude00 \\ud800"}"#)).await.0,
        StatusCode::NO_CONTENT
    );
    let text = http.get(s.url("j")).send().await.expect("get").text().await.expect("text");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&text).expect("json"),
        serde_json::json!([{ "v": "\u{1F600} \\ud800" }])
    );
    // Inside a State Protocol value on a stream made for compaction.
    let r = json(http.put(s.url("state"))).header("stream-compaction", "state").send().await.expect("put");
    assert_eq!(r.status(), StatusCode::CREATED);
    let change = r#"{"type":"t","key":"k","value":{"name":"\ud800"},"headers":{"operation":"insert"}}"#;
    assert_eq!(status_and_reason(json(http.post(s.url("state"))).body(change)).await.0, StatusCode::BAD_REQUEST);

    // A transactional commit's output.
    for path in ["wake", "in/a", "out"] {
        assert!(json(http.put(s.url(path))).send().await.expect("put").status().is_success());
    }
    let sub = s.url("__ds/subscriptions/tx");
    let cfg = r#"{"type":"pull-wake","pattern":"in/*","wake_stream":"wake","lease_ttl_ms":5000}"#;
    assert_eq!(json(http.put(&sub)).body(cfg).send().await.expect("put").status(), StatusCode::CREATED);
    json(http.post(s.url("in/a"))).body("1").send().await.expect("append");
    let claim: serde_json::Value = serde_json::from_str(
        &json(http.post(format!("{sub}/claim")))
            .body(r#"{"worker":"w"}"#)
            .send()
            .await
            .expect("claim")
            .text()
            .await
            .expect("text"),
    )
    .expect("json");
    let token = claim["token"].as_str().expect("token");
    let commit = |data: &str| {
        format!(
            r#"{{"wake_id":{},"generation":{},"done":false,"appends":[{{"stream":"out","producer":{{"id":"p","epoch":0,"seq":0}},"data":{data}}}]}}"#,
            claim["wake_id"], claim["generation"]
        )
    };
    let (status, reason) = status_and_reason(
        json(http.post(format!("{sub}/commit"))).bearer_auth(token).body(commit(r#"{"v":"\ud800"}"#)),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{reason}");
    assert_eq!(http.get(s.url("out")).send().await.expect("get").text().await.expect("text"), "[]");
    let (status, reason) = status_and_reason(
        json(http.post(format!("{sub}/commit"))).bearer_auth(token).body(commit(r#"{"v":"\ud800\udc00"}"#)),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{reason}");
}

/// Subscription patterns are bounded (length, segments, `**`), runs of `**` are one, and a
/// pattern with many `**` over deep paths is matched at once.
async fn subscription_patterns_are_bounded_and_cheap_to_match(front: Front) {
    let (s, http, _tls) = server(front).await;
    let json = |r: reqwest::RequestBuilder| r.header("content-type", "application/json");
    assert!(json(http.put(s.url("wake"))).send().await.expect("put").status().is_success());
    let put = |id: &str, pattern: String| {
        json(http.put(s.url(&format!("__ds/subscriptions/{id}"))))
            .body(format!(r#"{{"type":"pull-wake","pattern":"{pattern}","wake_stream":"wake"}}"#))
            .send()
    };
    for (id, pattern) in [
        ("stars", "a/**/b/**/c/**/d/**/e/**".to_owned()),
        ("long", "x".repeat(1025)),
        ("segments", vec!["s"; 65].join("/")),
    ] {
        let r = put(id, pattern).await.expect("put");
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{id}");
        assert!(r.text().await.expect("text").contains("at most"), "{id}");
    }
    // A run of `**` is one `**`: this pattern is stored as `e/**/b`.
    let r = put("deep", "e/**/**/**/**/b".into()).await.expect("put");
    assert_eq!(r.status(), StatusCode::CREATED);
    let view: serde_json::Value = serde_json::from_str(&r.text().await.expect("text")).expect("json");
    assert_eq!(view["pattern"], "e/**/b", "{view}");
    // Streams 300 segments deep: creating them, writing to them (which matches each against the
    // pattern) and listing the subscription's links all answer.
    let deep = |end: &str| format!("e/{}{end}", "x/".repeat(300));
    for end in ["c", "b"] {
        assert!(json(http.put(s.url(&deep(end)))).send().await.expect("put").status().is_success());
        assert_eq!(
            json(http.post(s.url(&deep(end)))).body("1").send().await.expect("post").status(),
            StatusCode::NO_CONTENT
        );
    }
    let r = http.get(s.url("__ds/subscriptions/deep")).send().await.expect("get");
    assert_eq!(r.status(), StatusCode::OK);
}

/// A trim or compaction header sent twice, or both together, is refused before anything moves:
/// taking the first line would execute one of two requests (issue 31, item 4).
async fn a_trim_or_compact_header_sent_twice_or_both_together_is_refused(front: Front) {
    let (s, http, _tls) = server(front).await;
    let r = http.post(s.url("t")).header("content-type", "text/plain").body("0123456789").send().await.expect("append");
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let tail = r.headers()["stream-next-offset"].to_str().expect("offset").to_owned();
    let zero = "0000000000000000_0000000000000000";
    let cases: Vec<(&str, Vec<(&str, &str)>)> = vec![
        ("trim twice", vec![("stream-trim-to", tail.as_str()), ("stream-trim-to", zero)]),
        ("trim twice, same value", vec![("stream-trim-to", tail.as_str()), ("stream-trim-to", tail.as_str())]),
        ("compact twice", vec![("stream-compact", "true"), ("stream-compact", "true")]),
        ("trim and compact", vec![("stream-trim-to", tail.as_str()), ("stream-compact", "true")]),
        ("compact and trim", vec![("stream-compact", "true"), ("stream-trim-to", tail.as_str())]),
    ];
    for (what, headers) in cases {
        let mut rb = http.post(s.url("t"));
        for (k, v) in headers {
            rb = rb.header(k, v);
        }
        let (status, reason) = status_and_reason(rb).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{what}: {reason}");
        assert!(reason.contains("at most once") || reason.contains("together"), "{what}: {reason}");
        let head = http.head(s.url("t")).send().await.expect("head");
        assert_eq!(head.headers()["stream-earliest-offset"], zero, "{what}: nothing was trimmed");
    }
    // One header alone still trims.
    let r = http.post(s.url("t")).header("stream-trim-to", tail.as_str()).send().await.expect("trim");
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    assert_eq!(r.headers()["stream-earliest-offset"], tail.as_str());
}

/// `Host` is validated as RFC 9112 section 3.2 asks: two of them, one that is no `host[:port]`
/// (a port that is no number 0-65535 included), or none on HTTP/1.1 is `400`, and nothing of such a request is done or echoed (issue 31,
/// item 5).
#[tokio::test]
async fn a_request_with_two_hosts_a_bad_host_or_none_is_refused() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (s, http, _tls) = server(Front::Plain).await;
    let send = |raw: String| async move {
        let mut conn = tokio::net::TcpStream::connect(s.addr).await.expect("connect");
        conn.write_all(raw.as_bytes()).await.expect("write");
        let mut out = Vec::new();
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), conn.read_to_end(&mut out)).await;
        String::from_utf8_lossy(&out).into_owned()
    };
    let put = |path: &str, hosts: &str, version: &str| {
        format!("PUT /v1/stream/{path} {version}\r\n{hosts}Content-Type: text/plain\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
    };
    for (what, path, hosts, version) in [
        ("two hosts", "h1", "Host: a.example\r\nHost: evil.example\r\n", "HTTP/1.1"),
        ("a host with a space", "h2", "Host: a.example evil\r\n", "HTTP/1.1"),
        ("a host with userinfo", "h3", "Host: user@a.example\r\n", "HTTP/1.1"),
        ("an empty host", "h4", "Host: \r\n", "HTTP/1.1"),
        ("no host on HTTP/1.1", "h5", "", "HTTP/1.1"),
        // A port that is no number 0-65535 (issue 45, item 12a): it was accepted and echoed into
        // `Location`.
        ("a port that is no number", "h6", "Host: evil:xx\r\n", "HTTP/1.1"),
        ("a port past 65535", "h7", "Host: evil:65536\r\n", "HTTP/1.1"),
        ("an empty port", "h8", "Host: evil:\r\n", "HTTP/1.1"),
        ("a port with letters after it", "h9", "Host: [::1]:80x\r\n", "HTTP/1.1"),
    ] {
        let answer = send(put(path, hosts, version)).await;
        assert!(answer.starts_with("HTTP/1.1 400"), "{what}: {answer:?}");
        assert!(!answer.to_ascii_lowercase().contains("location:"), "{what}: {answer:?}");
        assert!(answer.contains("Host"), "{what} says why: {answer:?}");
        let head = http.head(s.url(path)).send().await.expect("head");
        assert_eq!(head.status(), StatusCode::NOT_FOUND, "{what}: nothing was created");
    }
    // One valid host (with a port, or an IPv6 literal), and HTTP/1.0 without one, are served.
    for (path, hosts, version) in [
        ("ok1", "Host: a.example:8080\r\n", "HTTP/1.1"),
        ("ok2", "Host: [::1]:80\r\n", "HTTP/1.1"),
        ("ok3", "", "HTTP/1.0"),
        ("ok4", "Host: a.example:65535\r\n", "HTTP/1.1"),
        ("ok5", "Host: [::1]\r\n", "HTTP/1.1"),
    ] {
        let answer = send(put(path, hosts, version)).await;
        assert!(answer.contains(" 201 "), "{path}: {answer:?}");
    }
}

async fn a_stream_path_is_percent_decoded_once_and_must_be_utf8_without_nul(front: Front) {
    let (s, http, _tls) = server(front).await;
    // Not UTF-8 once decoded: 400 with the reason, for every method.
    for method in [reqwest::Method::GET, reqwest::Method::PUT, reqwest::Method::POST] {
        let (status, reason) =
            status_and_reason(http.request(method, s.url("%FF")).header("content-type", "text/plain").body("x")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{reason}");
        assert!(reason.contains("UTF-8"), "{reason}");
    }
    // A NUL character names no stream on any engine: not created, never found.
    let (status, reason) = status_and_reason(http.put(s.url("a%00b")).header("content-type", "text/plain")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{reason}");
    assert!(reason.contains("NUL"), "{reason}");
    let (status, reason) =
        status_and_reason(http.post(s.url("a%00b")).header("content-type", "text/plain").body("x")).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{reason}");
    // Nothing after the prefix is no route at all.
    let (status, reason) = status_and_reason(http.get(format!("{}/v1/stream/", s.origin))).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{reason}");
    assert!(reason.contains("no such route"), "{reason}");
    // `a%2Fb` names the stream `a/b`: created under one spelling, read under the other.
    let r = http.put(s.url("a%2Fb")).header("content-type", "text/plain").send().await.expect("put");
    assert_eq!(r.status(), StatusCode::CREATED);
    let r = http.post(s.url("a/b")).header("content-type", "text/plain").body("hello").send().await.expect("post");
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let r = http.get(format!("{}?offset=-1", s.url("a%2Fb"))).send().await.expect("get");
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers().get("content-length").and_then(|v| v.to_str().ok()), Some("5"));
    assert_eq!(r.text().await.expect("body"), "hello");
    // HEAD answers with the stream's headers and a length, never a body.
    let r = http.head(s.url("a/b")).send().await.expect("head");
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers().get("content-length").and_then(|v| v.to_str().ok()), Some("0"));
}

/// Each case above as two tests: `NAME::plain_http1` and `NAME::tls_http2`.
macro_rules! on_both_fronts {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test]
            async fn plain_http1() {
                super::$name(super::Front::Plain).await
            }
            #[tokio::test]
            async fn tls_http2() {
                super::$name(super::Front::TlsH2).await
            }
        }
    )*};
}

on_both_fronts!(
    a_protocol_header_sent_twice_is_refused,
    a_malformed_content_type_on_append_is_400_not_a_mismatch,
    a_content_type_mismatch_names_both_types,
    a_fork_source_on_another_host_is_refused,
    json_deeper_than_the_limit_is_refused,
    an_empty_body_with_a_stream_closed_value_other_than_true_says_so,
    a_made_up_offset_inside_a_json_message_is_refused,
    json_with_a_lone_surrogate_escape_is_refused_everywhere,
    subscription_patterns_are_bounded_and_cheap_to_match,
    a_trim_or_compact_header_sent_twice_or_both_together_is_refused,
    a_stream_path_is_percent_decoded_once_and_must_be_utf8_without_nul,
);
