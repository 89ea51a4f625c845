//! A reader's fork must not keep a stream's owner from its own path (issue 31, item 9). Forking
//! needs only `read` on the source, so another tenant's fork keeps a deleted source's path
//! reserved (`410`, and `PUT` `409`) for as long as that tenant likes. `DELETE …?purge=true`,
//! under the `delete` grant alone, detaches the source from its path instead: the path is free
//! at once and the fork reads on, unchanged (docs/SECURITY.md, docs/PROTOCOL-EXTENSIONS.md).

mod common;

use std::sync::Arc;

use oncelog_server::auth::token::{TokenAuth, TokenConfig};
use oncelog_server::{ManualClock, ServerConfig};
use reqwest::{Method, StatusCode};

const SECRET: &[u8] = b"purge-test-secret";
const NOW_S: i64 = 1_800_000_000;

/// A token with `(path, exact, ops)` grants.
fn token(grants: &[(&str, bool, &str)]) -> String {
    common::grants_token(SECRET, grants, NOW_S + 3600)
}

struct Setup {
    s: common::TestServer,
    http: reqwest::Client,
    _dir: tempfile::TempDir,
}

async fn setup() -> Setup {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("secret"), SECRET).expect("secret");
    let auth = TokenAuth::load(TokenConfig { secret_file: Some(dir.path().join("secret")), ..TokenConfig::default() })
        .expect("keys");
    let clock = Arc::new(ManualClock::new(NOW_S * 1000));
    let s = common::TestServer::start_with_auth(ServerConfig::default(), Some(clock), Some(auth)).await;
    Setup { s, http: reqwest::Client::new(), _dir: dir }
}

impl Setup {
    async fn send(
        &self,
        method: Method,
        path: &str,
        bearer: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> reqwest::Response {
        let mut rb = self.http.request(method, self.s.url(path)).bearer_auth(bearer);
        for (k, v) in headers {
            rb = rb.header(*k, *v);
        }
        if !body.is_empty() {
            rb = rb.body(body.to_owned());
        }
        rb.send().await.expect("send")
    }

    async fn status(&self, method: Method, path: &str, bearer: &str) -> StatusCode {
        self.send(method, path, bearer, &[], "").await.status()
    }

    /// Everything readable from the stream at `path`, and where it ends.
    async fn read(&self, path: &str, bearer: &str) -> (String, String) {
        let r = self.send(Method::GET, &format!("{path}?offset=-1"), bearer, &[], "").await;
        assert_eq!(r.status(), StatusCode::OK, "read {path}");
        let next = r.headers().get("stream-next-offset").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
        (r.text().await.expect("body"), next)
    }
}

#[tokio::test]
async fn a_purge_frees_a_path_another_tenants_fork_keeps_reserved() {
    let t = setup().await;
    // Owner A holds everything under `a/`; tenant B may read `a/src` and create under `b/`.
    let a = token(&[("a/", false, "all")]);
    let b = token(&[("a/src", true, "read"), ("b/", false, "create,read")]);
    let text = [("content-type", "text/plain")];
    assert_eq!(t.send(Method::PUT, "a/src", &a, &text, "hello ").await.status(), StatusCode::CREATED);
    let r = t.send(Method::POST, "a/src", &a, &text, "world").await;
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let tail = r.headers().get("stream-next-offset").and_then(|v| v.to_str().ok()).expect("tail").to_owned();
    // B forks it: `read` on the source and `create` on the fork are all it needs.
    let fork = [("stream-forked-from", "/v1/stream/a/src")];
    assert_eq!(t.send(Method::PUT, "b/fork", &b, &fork, "").await.status(), StatusCode::CREATED);
    let before = t.read("b/fork", &b).await;
    assert_eq!(before, ("hello world".to_owned(), tail.clone()));

    // A plain delete keeps A's path reserved for B's fork: 410, and A cannot create it again.
    assert_eq!(t.status(Method::DELETE, "a/src", &a).await, StatusCode::NO_CONTENT);
    assert_eq!(t.status(Method::HEAD, "a/src", &a).await, StatusCode::GONE);
    assert_eq!(t.send(Method::PUT, "a/src", &a, &text, "").await.status(), StatusCode::CONFLICT);

    // `purge` is `true` or absent, once; B, without `delete` on it, cannot purge A's stream.
    for bad in ["a/src?purge=maybe", "a/src?purge=false", "a/src?purge=", "a/src?purge=true&purge=true"] {
        assert_eq!(t.status(Method::DELETE, bad, &a).await, StatusCode::BAD_REQUEST, "{bad}");
    }
    assert_eq!(t.status(Method::DELETE, "a/src?purge=true", &b).await, StatusCode::FORBIDDEN);
    // If-Match composes as for a plain delete: the tail it names must be the stream's.
    let stale = t
        .send(Method::DELETE, "a/src?purge=true", &a, &[("if-match", "\"0000000000000000_0000000000000003\"")], "")
        .await;
    assert_eq!(stale.status(), StatusCode::PRECONDITION_FAILED);
    assert_eq!(t.status(Method::HEAD, "a/src", &a).await, StatusCode::GONE, "a refused purge changes nothing");

    // The way out: the path is free at once.
    let quoted = format!("\"{tail}\"");
    assert_eq!(
        t.send(Method::DELETE, "a/src?purge=true", &a, &[("if-match", &quoted)], "").await.status(),
        StatusCode::NO_CONTENT
    );
    assert_eq!(t.status(Method::HEAD, "a/src", &a).await, StatusCode::NOT_FOUND);
    assert_eq!(t.status(Method::GET, "a/src?offset=-1", &a).await, StatusCode::NOT_FOUND);
    assert_eq!(t.status(Method::DELETE, "a/src?purge=true", &a).await, StatusCode::NOT_FOUND);
    assert_eq!(t.send(Method::PUT, "a/src", &a, &text, "").await.status(), StatusCode::CREATED);
    assert_eq!(t.read("a/src", &a).await.0, "", "a new, unrelated stream");
    assert_eq!(t.send(Method::POST, "a/src", &a, &text, "new").await.status(), StatusCode::NO_CONTENT);

    // B's fork reads every byte it read before, at the same offsets; A's new data is not in it.
    assert_eq!(t.read("b/fork", &b).await, before);
    let from_6 = t.send(Method::GET, "b/fork?offset=0000000000000000_0000000000000006", &b, &[], "").await;
    assert_eq!(from_6.text().await.expect("body"), "world");
    assert_eq!(t.read("a/src", &a).await.0, "new");
    // Without forks a purge is a plain delete.
    assert_eq!(t.status(Method::DELETE, "a/src?purge=true", &a).await, StatusCode::NO_CONTENT);
    assert_eq!(t.status(Method::HEAD, "a/src", &a).await, StatusCode::NOT_FOUND);
}
