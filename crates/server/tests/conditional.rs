//! Conditional appends over HTTP: `If-Match: <offset>` writes only at that tail, `412` otherwise.

mod common;

use std::sync::Arc;

use oncelog_protocol::Offset;
use oncelog_server::ServerConfig;
use reqwest::{Client, StatusCode};
use tokio::sync::Barrier;

async fn server() -> (common::TestServer, Client) {
    let s = common::TestServer::start(ServerConfig::default(), None).await;
    let http = Client::new();
    let r = http.put(s.url("s")).header("content-type", "text/plain").send().await.expect("put");
    assert_eq!(r.status(), StatusCode::CREATED);
    (s, http)
}

fn tail(r: &reqwest::Response) -> String {
    r.headers().get("stream-next-offset").and_then(|v| v.to_str().ok()).expect("Stream-Next-Offset").to_owned()
}

async fn post(http: &Client, url: &str, if_match: &str, body: &'static str) -> reqwest::Response {
    http.post(url)
        .header("content-type", "text/plain")
        .header("if-match", if_match)
        .body(body)
        .send()
        .await
        .expect("post")
}

#[tokio::test]
async fn an_append_at_the_named_tail_is_written_and_elsewhere_is_412_with_the_tail() {
    let (s, http) = server().await;
    let url = s.url("s");
    let zero = Offset(0).to_string();
    // Bare, and quoted like an entity tag.
    let r = post(&http, &url, &zero, "ab").await;
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    assert_eq!(tail(&r), Offset(2).to_string());
    let r = post(&http, &url, &format!("\"{}\"", Offset(2)), "c").await;
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    // Stale: 412, the current tail, nothing written.
    let r = post(&http, &url, &zero, "zz").await;
    assert_eq!(r.status(), StatusCode::PRECONDITION_FAILED);
    assert_eq!(tail(&r), Offset(3).to_string());
    assert!(r.headers().get("stream-closed").is_none());
    assert!(!r.text().await.expect("body").is_empty(), "the 412 says why");
    // `*` only asks for the stream to exist.
    assert_eq!(post(&http, &url, "*", "d").await.status(), StatusCode::NO_CONTENT);
    assert_eq!(post(&http, &s.url("missing"), "*", "d").await.status(), StatusCode::NOT_FOUND);
    // Malformed or weak: 400 with a reason.
    for bad in ["-1", "now", "5", "W/\"0000000000000000_0000000000000004\""] {
        let r = post(&http, &url, bad, "x").await;
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{bad}");
        assert!(r.text().await.expect("body").contains("If-Match"), "{bad}");
    }
    // A closed stream: a stale condition is 412 and says closed.
    let r = http
        .post(&url)
        .header("stream-closed", "true")
        .header("if-match", Offset(4).to_string())
        .send()
        .await
        .expect("close");
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let r = post(&http, &url, &zero, "x").await;
    assert_eq!(r.status(), StatusCode::PRECONDITION_FAILED);
    assert_eq!(r.headers().get("stream-closed").map(|v| v.to_str().unwrap_or("")), Some("true"));
    let body = http.get(&url).send().await.expect("get").text().await.expect("text");
    assert_eq!(body, "abcd");
}

#[tokio::test]
async fn a_producer_retry_of_a_conditional_append_that_landed_is_a_duplicate_not_412() {
    let (s, http) = server().await;
    let url = s.url("s");
    let send = || {
        http.post(&url)
            .header("content-type", "text/plain")
            .header("if-match", Offset(0).to_string())
            .header("producer-id", "p")
            .header("producer-epoch", "0")
            .header("producer-seq", "0")
            .body("once")
            .send()
    };
    let first = send().await.expect("post");
    assert_eq!(first.status(), StatusCode::OK);
    // The response was lost; the client sends the same request again.
    let retry = send().await.expect("post");
    assert_eq!(retry.status(), StatusCode::NO_CONTENT);
    assert_eq!(tail(&retry), Offset(4).to_string());
    assert_eq!(http.get(&url).send().await.expect("get").text().await.expect("text"), "once");
}

/// Writers that each read the tail and then append conditionally on it: per round exactly one
/// wins, the others learn the new tail, and the stream holds the winners' records whole, each
/// at the offset its writer read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_conditional_writers_have_exactly_one_winner_per_round() {
    const WRITERS: usize = 8;
    const ROUNDS: usize = 25;
    let (s, http) = server().await;
    let url = Arc::new(s.url("s"));
    let barrier = Arc::new(Barrier::new(WRITERS));
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let (http, url, barrier) = (http.clone(), url.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            let mut wins = Vec::new();
            for round in 0..ROUNDS {
                let seen = tail(&http.head(url.as_str()).send().await.expect("head"));
                barrier.wait().await;
                let record = format!("[w{w} r{round} at {seen}]");
                let r = http
                    .post(url.as_str())
                    .header("content-type", "text/plain")
                    .header("if-match", &seen)
                    .body(record.clone())
                    .send()
                    .await
                    .expect("post");
                match r.status() {
                    StatusCode::NO_CONTENT => wins.push((round, seen, record)),
                    StatusCode::PRECONDITION_FAILED => {
                        assert_ne!(tail(&r), seen, "a 412 names a tail other than the one read")
                    }
                    other => panic!("unexpected {other}"),
                }
                // Everyone has answered before the next round reads the tail.
                barrier.wait().await;
            }
            wins
        }));
    }
    let mut wins = Vec::new();
    for t in tasks {
        wins.extend(t.await.expect("writer"));
    }
    wins.sort();
    let rounds: Vec<usize> = wins.iter().map(|(r, _, _)| *r).collect();
    assert_eq!(rounds, (0..ROUNDS).collect::<Vec<_>>(), "exactly one winner per round");
    let body = http.get(url.as_str()).send().await.expect("get").text().await.expect("text");
    let mut expected = String::new();
    for (_, seen, record) in &wins {
        assert_eq!(
            Offset::parse(seen).expect("offset").0,
            expected.len() as u64,
            "each record lands where its writer read the tail"
        );
        expected.push_str(record);
    }
    assert_eq!(body, expected);
}

/// If-Match on the other methods, per HTTP: HEAD, PUT and DELETE take the stream's tail as its
/// entity tag (as a conditional append does); GET compares with the read's own ETag.
#[tokio::test]
async fn if_match_on_head_put_delete_and_get() {
    let (s, http) = server().await;
    let url = s.url("s");
    let zero = Offset(0).to_string();
    assert_eq!(post(&http, &url, &zero, "abc").await.status(), StatusCode::NO_CONTENT);
    let at = |o: u64| Offset(o).to_string();
    // HEAD: 200 at the tail, 412 with the tail elsewhere.
    assert_eq!(http.head(&url).header("if-match", at(3)).send().await.expect("head").status(), StatusCode::OK);
    let r = http.head(&url).header("if-match", at(1)).send().await.expect("head");
    assert_eq!((r.status(), tail(&r)), (StatusCode::PRECONDITION_FAILED, at(3)));
    // PUT: confirms an existing stream at the named tail; no stream, no representation: 412.
    let put = |u: String, m: String| http.put(u).header("content-type", "text/plain").header("if-match", m).send();
    assert_eq!(put(url.clone(), at(3)).await.expect("put").status(), StatusCode::OK);
    assert_eq!(put(url.clone(), at(1)).await.expect("put").status(), StatusCode::PRECONDITION_FAILED);
    assert_eq!(put(s.url("new"), "*".into()).await.expect("put").status(), StatusCode::PRECONDITION_FAILED);
    assert_eq!(http.head(s.url("new")).send().await.expect("head").status(), StatusCode::NOT_FOUND, "nothing created");
    // GET: the read's ETag.
    let r = http.get(&url).send().await.expect("get");
    let etag = r.headers().get("etag").and_then(|v| v.to_str().ok()).expect("etag").to_owned();
    assert_eq!(http.get(&url).header("if-match", &etag).send().await.expect("get").status(), StatusCode::OK);
    assert_eq!(
        http.get(&url).header("if-match", "\"other\"").send().await.expect("get").status(),
        StatusCode::PRECONDITION_FAILED
    );
    // DELETE: only at the named tail.
    let r = http.delete(&url).header("if-match", at(1)).send().await.expect("delete");
    assert_eq!((r.status(), tail(&r)), (StatusCode::PRECONDITION_FAILED, at(3)));
    assert_eq!(
        http.delete(&url).header("if-match", at(3)).send().await.expect("delete").status(),
        StatusCode::NO_CONTENT
    );
    assert_eq!(http.head(&url).send().await.expect("head").status(), StatusCode::NOT_FOUND);
}

/// `Stream-Expected-Offset` (the upstream protocol's strict compare-and-append): `409` with the
/// body `Expected offset conflict` and the tail in `Stream-Next-Offset`; a regressing
/// `Stream-Seq`'s `409` carries the tail too (body `Sequence conflict`); a closed stream's `409`
/// wins; a malformed or repeated header is `400`; browsers may send it.
#[tokio::test]
async fn stream_expected_offset_appends_only_at_that_tail_and_409s_with_it() {
    let (s, http) = server().await;
    let url = s.url("s");
    let expecting = |at: &str, body: &'static str| {
        http.post(&url).header("content-type", "text/plain").header("stream-expected-offset", at.to_owned()).body(body)
    };
    let zero = Offset(0).to_string();
    let r = expecting(&zero, "ab").send().await.expect("post");
    assert_eq!((r.status(), tail(&r)), (StatusCode::NO_CONTENT, Offset(2).to_string()));
    let r = expecting(&zero, "zz").send().await.expect("post");
    assert_eq!((r.status(), tail(&r)), (StatusCode::CONFLICT, Offset(2).to_string()));
    let text = r.text().await.expect("text");
    assert!(text.starts_with("Expected offset conflict"), "{text}");
    // Composes with Stream-Seq: each 409 says the tail, with its own words.
    let two = Offset(2).to_string();
    let r = expecting(&two, "cd").header("stream-seq", "5").send().await.expect("post");
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let four = Offset(4).to_string();
    let r = expecting(&four, "ef").header("stream-seq", "3").send().await.expect("post");
    assert_eq!((r.status(), tail(&r)), (StatusCode::CONFLICT, four.clone()));
    assert!(r.text().await.expect("text").starts_with("Sequence conflict"));
    // A producer retry of an append that landed is a duplicate whatever it expected.
    let produce = |at: &str| {
        expecting(at, "gh").header("producer-id", "p").header("producer-epoch", "0").header("producer-seq", "0")
    };
    let r = produce(&four).send().await.expect("post");
    assert_eq!(r.status(), StatusCode::OK);
    let six = tail(&r);
    let r = produce(&four).send().await.expect("retry");
    assert_eq!((r.status(), tail(&r)), (StatusCode::NO_CONTENT, six.clone()));
    // Malformed, or sent twice: 400, nothing written.
    assert_eq!(expecting("nope", "x").send().await.expect("post").status(), StatusCode::BAD_REQUEST);
    // -1 (a read position) is refused in words that do not offer it back.
    let r = expecting("-1", "x").send().await.expect("post");
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let text = r.text().await.expect("text");
    assert!(text.contains("Stream-Expected-Offset must be a tail") && !text.contains("must be -1"), "{text}");
    let twice = expecting(&six, "x").header("stream-expected-offset", six.clone()).send().await.expect("post");
    assert_eq!(twice.status(), StatusCode::BAD_REQUEST);
    // Closed: the closure's 409 wins, even at the right offset.
    let r = http.post(&url).header("stream-closed", "true").send().await.expect("close");
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let r = expecting(&six, "x").send().await.expect("post");
    assert_eq!(r.status(), StatusCode::CONFLICT);
    assert_eq!(r.headers().get("stream-closed").and_then(|v| v.to_str().ok()), Some("true"));
    assert_eq!(http.get(&url).send().await.expect("get").text().await.expect("text"), "abcdgh");
    // A browser may send it: it is in the list a preflight answers (asking for no header in
    // particular, so nothing is echoed back).
    let pre = http
        .request(reqwest::Method::OPTIONS, &url)
        .header("origin", "https://app.example")
        .header("access-control-request-method", "POST")
        .send()
        .await
        .expect("preflight");
    let allowed =
        pre.headers().get("access-control-allow-headers").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    assert!(allowed.split(", ").any(|h| h == "stream-expected-offset"), "{allowed}");
}
