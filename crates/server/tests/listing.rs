//! The stream listing, `GET /v1/stream/__ds/streams` (issue 32, item 7; docs/PROTOCOL-EXTENSIONS.md
//! "Listing streams"): prefix, pages that follow one another by their `next` cursor, limit
//! bounds, reserved paths never listed, and with access control on, only what a token may read,
//! with no `next` cursor that points past what it may see.

mod common;

use std::sync::Arc;

use oncelog_log::{LogEngine, LogOptions};
use oncelog_server::auth::token::{TokenAuth, TokenConfig};
use oncelog_server::{serve, AppState, Authorize, ManualClock, ServerConfig};
use oncelog_storage::{CreateRequest, Engine};
use reqwest::{Method, StatusCode};
use serde_json::Value;

const SECRET: &[u8] = b"listing-test-secret";
const NOW_S: i64 = 1_800_000_000;

struct Server {
    base: String,
    http: reqwest::Client,
    _dir: tempfile::TempDir,
}

/// A server on the log engine that also holds `__ds/hidden` and `__dsx`, created in the engine
/// directly: `PUT` cannot make a stream under `__ds/` (the router answers those paths itself), but
/// an engine may hold one, and the listing must not show it.
async fn start(hide_forbidden: Option<bool>) -> Server {
    let dir = tempfile::tempdir().expect("tempdir");
    let engine = Arc::new(LogEngine::open(LogOptions::new(dir.path().join("data"))).expect("engine"));
    for path in ["__ds/hidden", "__dsx"] {
        let req = CreateRequest {
            path: path.into(),
            content_type: Some("text/plain".into()),
            expiry: None,
            fork: None,
            retention: Default::default(),
            compaction: false,
            closed: false,
            initial: bytes::Bytes::new(),
            json_framed: false,
            now_ms: NOW_S * 1000,
        };
        engine.create(req).await.expect("create in the engine");
    }
    let mut state = AppState::new(engine, ServerConfig::default()).with_clock(Arc::new(ManualClock::new(NOW_S * 1000)));
    if let Some(hide) = hide_forbidden {
        std::fs::write(dir.path().join("secret"), SECRET).expect("secret");
        let auth = TokenAuth::load(TokenConfig {
            secret_file: Some(dir.path().join("secret")),
            hide_forbidden: hide,
            ..TokenConfig::default()
        })
        .expect("keys");
        state = state.with_auth(auth as Arc<dyn Authorize>);
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(serve(listener, state, std::future::pending()));
    Server { base: format!("http://{addr}/v1/stream"), http: reqwest::Client::new(), _dir: dir }
}

/// A token with `(path, exact, ops)` grants.
fn token(grants: &[(&str, bool, &str)]) -> String {
    common::grants_token(SECRET, grants, NOW_S + 3600)
}

impl Server {
    async fn send(
        &self,
        method: Method,
        path_and_query: &str,
        bearer: Option<&str>,
        headers: &[(&str, &str)],
    ) -> reqwest::Response {
        let mut rb = self.http.request(method, format!("{}/{path_and_query}", self.base));
        if let Some(t) = bearer {
            rb = rb.bearer_auth(t);
        }
        for (k, v) in headers {
            rb = rb.header(*k, *v);
        }
        rb.send().await.expect("send")
    }

    async fn create(&self, path: &str, bearer: Option<&str>, closed: bool) {
        let mut h = vec![("content-type", "text/plain")];
        if closed {
            h.push(("stream-closed", "true"));
        }
        assert_eq!(self.send(Method::PUT, path, bearer, &h).await.status(), StatusCode::CREATED, "create {path}");
    }

    /// One page: its body, after checking it is a `200` JSON answer that no cache keeps.
    async fn page(&self, query: &str, bearer: Option<&str>) -> Value {
        let r = self.send(Method::GET, &format!("__ds/streams{query}"), bearer, &[]).await;
        assert_eq!(r.status(), StatusCode::OK, "GET __ds/streams{query}");
        assert_eq!(r.headers().get("content-type").and_then(|v| v.to_str().ok()), Some("application/json"));
        assert_eq!(r.headers().get("cache-control").and_then(|v| v.to_str().ok()), Some("no-store"));
        serde_json::from_slice(&r.bytes().await.expect("body")).expect("JSON")
    }

    /// The paths of one page, and its `next`.
    async fn paths(&self, query: &str, bearer: Option<&str>) -> (Vec<String>, Option<String>) {
        let v = self.page(query, bearer).await;
        let paths = v["streams"]
            .as_array()
            .expect("streams")
            .iter()
            .map(|s| s["path"].as_str().expect("path").to_owned())
            .collect();
        (paths, v["next"].as_str().map(str::to_owned))
    }

    /// Every page from the first, following `next`: the paths in order, and the page sizes.
    async fn all(&self, prefix: &str, limit: usize, bearer: Option<&str>) -> (Vec<String>, Vec<usize>) {
        let (mut out, mut sizes, mut after) = (Vec::new(), Vec::new(), None::<String>);
        loop {
            let mut q = format!("?prefix={}&limit={limit}", enc(prefix));
            if let Some(a) = &after {
                q.push_str(&format!("&after={}", enc(a)));
            }
            let (paths, next) = self.paths(&q, bearer).await;
            assert_eq!(next.as_ref(), paths.last().filter(|_| next.is_some()), "next is the page's last path");
            sizes.push(paths.len());
            out.extend(paths);
            match next {
                Some(n) => after = Some(n),
                None => return (out, sizes),
            }
            assert!(sizes.len() < 100, "the pages never end");
        }
    }
}

fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| if b.is_ascii_alphanumeric() || b == b'_' { (b as char).to_string() } else { format!("%{b:02X}") })
        .collect()
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[tokio::test]
async fn the_listing_pages_through_a_prefix_in_path_order_and_never_shows_reserved_paths() {
    let s = start(None).await;
    for p in ["a/3", "a/1", "a/2", "a/5", "a/4", "a/6", "a/7", "b/1", "a b/x"] {
        s.create(p, None, false).await;
    }
    s.create("a/closed", None, true).await;
    let appended = s
        .http
        .post(format!("{}/a/2", s.base))
        .header("content-type", "text/plain")
        .body("hello")
        .send()
        .await
        .expect("append");
    assert_eq!(appended.status(), StatusCode::NO_CONTENT);
    let tail = appended.headers().get("stream-next-offset").and_then(|v| v.to_str().ok()).expect("tail").to_owned();
    s.create("gone", None, false).await;
    assert_eq!(s.send(Method::DELETE, "gone", None, &[]).await.status(), StatusCode::NO_CONTENT);

    // Everything, in byte order (`_` sorts before letters); `__dsx` is a stream like any other,
    // `__ds/hidden` is under the reserved prefix and never listed; a deleted stream is gone.
    let (paths, next) = s.paths("", None).await;
    assert_eq!(paths, strings(&["__dsx", "a b/x", "a/1", "a/2", "a/3", "a/4", "a/5", "a/6", "a/7", "a/closed", "b/1"]));
    assert_eq!(next, None, "one page holds them all (limit 100)");
    assert_eq!(s.paths("?prefix=__ds", None).await.0, strings(&["__dsx"]));
    assert_eq!(s.paths("?prefix=__ds%2F", None).await.0, Vec::<String>::new());

    // Each entry shows what HEAD shows.
    let page = s.page("?prefix=a%2F&limit=2", None).await;
    let a2 = &page["streams"][1];
    assert_eq!(a2["path"], "a/2");
    assert_eq!(a2["content_type"], "text/plain");
    assert_eq!(a2["next_offset"].as_str(), Some(tail.as_str()));
    assert_eq!(a2["earliest_offset"], "0000000000000000_0000000000000000");
    assert_eq!(a2["closed"], false);
    assert_eq!(page["next"], "a/2");
    let closed = s.page("?prefix=a%2Fclosed", None).await;
    assert_eq!(closed["streams"][0]["closed"], true);

    // Pages of 3 follow one another by `next` and add up to the whole prefix; the last page
    // has `next: null`, and none is empty.
    let (paged, sizes) = s.all("a/", 3, None).await;
    assert_eq!(paged, strings(&["a/1", "a/2", "a/3", "a/4", "a/5", "a/6", "a/7", "a/closed"]));
    assert_eq!(sizes, vec![3, 3, 2]);
    let (paged, sizes) = s.all("a/", 4, None).await;
    assert_eq!((paged.len(), sizes), (8, vec![4, 4]), "a full last page still ends with next: null");
    // `after` need not be a listed path: it is a position in byte order.
    assert_eq!(s.paths("?prefix=a%2F&after=a%2F35", None).await.0, strings(&["a/4", "a/5", "a/6", "a/7", "a/closed"]));

    // Limit bounds: 1 to 1000; beyond, malformed or repeated parameters are 400 with a reason.
    assert_eq!(s.paths("?limit=1000", None).await.0.len(), 11);
    assert_eq!(s.paths("?limit=1", None).await, (strings(&["__dsx"]), Some("__dsx".into())));
    for bad in
        ["?limit=1001", "?limit=0", "?limit=-1", "?limit=ten", "?limit=", "?prefix=a&prefix=b", "?after=a&after=b"]
    {
        let r = s.send(Method::GET, &format!("__ds/streams{bad}"), None, &[]).await;
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{bad}");
        let reason = r.text().await.expect("body");
        assert!(reason.contains("limit") || reason.contains("at most once"), "{bad}: {reason}");
    }
    // The route takes GET only.
    for m in [Method::POST, Method::PUT, Method::DELETE] {
        assert_eq!(s.send(m.clone(), "__ds/streams", None, &[]).await.status(), StatusCode::METHOD_NOT_ALLOWED, "{m}");
    }
}

#[tokio::test]
async fn with_access_control_a_token_lists_only_the_streams_it_may_read() {
    for hide in [false, true] {
        let s = start(Some(hide)).await;
        let admin = token(&[("", false, "all")]);
        for p in ["a/1", "a/2", "ab", "b/1", "b/2", "c"] {
            s.create(p, Some(&admin), false).await;
        }
        // No credentials, or bad ones: 401, as for any stream request.
        let r = s.send(Method::GET, "__ds/streams", None, &[]).await;
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "hide {hide}");
        assert_eq!(
            s.send(Method::GET, "__ds/streams", Some("not-a-token"), &[]).await.status(),
            StatusCode::UNAUTHORIZED
        );

        // `read` on the prefix `a/`: the listing needs no grant of its own, and shows `a/…` only
        // (not `ab`, which starts with `a` but not with `a/`).
        let reader = token(&[("a/", false, "read")]);
        assert_eq!(s.paths("", Some(&reader)).await, (strings(&["a/1", "a/2"]), None), "hide {hide}");
        // A prefix outside its grants is an empty page, not a 403 or 404: nothing about what
        // exists there is revealed, with or without --auth-hide-forbidden.
        assert_eq!(s.paths("?prefix=b%2F", Some(&reader)).await, (vec![], None));
        // Pages of one: the cursor after `a/2` is `null` although `ab`, `b/1`, ... follow; a
        // `next` there would tell the reader that something it may not see exists.
        let (paged, sizes) = s.all("", 1, Some(&reader)).await;
        assert_eq!((paged, sizes), (strings(&["a/1", "a/2"]), vec![1, 1]));
        assert_eq!(s.paths("?after=a%2F2", Some(&reader)).await, (vec![], None));

        // Other operations than `read` list nothing; an exact grant lists that stream.
        let writer = token(&[("", false, "append,create,close,delete,trim")]);
        assert_eq!(s.paths("", Some(&writer)).await, (vec![], None));
        let one = token(&[("b/2", true, "read"), ("c", true, "append")]);
        assert_eq!(s.paths("", Some(&one)).await, (strings(&["b/2"]), None));
        // Every stream for a token that may read every path, reserved ones still hidden.
        assert_eq!(s.paths("", Some(&admin)).await.0, strings(&["__dsx", "a/1", "a/2", "ab", "b/1", "b/2", "c"]));
        // A bad limit is refused for any valid token.
        assert_eq!(
            s.send(Method::GET, "__ds/streams?limit=5000", Some(&reader), &[]).await.status(),
            StatusCode::BAD_REQUEST
        );
    }
}
