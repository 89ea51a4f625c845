//! A token that may only close a stream cannot append to it, on any HTTP version (issue 31, item
//! 1). The request kind is first decided from framing headers, and an HTTP/2 body needs neither
//! `Content-Length` nor `Transfer-Encoding`: a `POST` with `Stream-Closed: true` and DATA frames
//! but no length looks like a bodiless close. The data that does arrive must be refused unless
//! the token also grants `append`. Driven with the `h2` crate itself, so the frames are exactly
//! what an attacker sends (no client adds a `Content-Length`), over h2c and over TLS with ALPN.

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use oncelog_server::auth::scope::{GrantClaim, ScopeClaim};
use oncelog_server::auth::token::{issue, TokenAuth, TokenConfig};
use oncelog_server::tls::TlsFiles;
use oncelog_server::{ManualClock, ServerConfig};
use tokio::io::{AsyncRead, AsyncWrite};

const SECRET: &[u8] = b"close-grant-test-secret";
const NOW_S: i64 = 1_800_000_000;

fn token(ops: &str) -> String {
    let grants =
        vec![GrantClaim { stream: None, prefix: Some("c/".into()), ops: ops.split(',').map(str::to_owned).collect() }];
    issue(SECRET, ScopeClaim { grants }, NOW_S + 3600, None, None, None).expect("sign")
}

async fn server(dir: &tempfile::TempDir, tls: Option<TlsFiles>) -> common::TestServer {
    std::fs::write(dir.path().join("secret"), SECRET).expect("secret");
    let auth = TokenAuth::load(TokenConfig { secret_file: Some(dir.path().join("secret")), ..TokenConfig::default() })
        .expect("keys");
    let clock = Arc::new(ManualClock::new(NOW_S * 1000));
    let config = ServerConfig { tls, ..ServerConfig::default() };
    common::TestServer::start_with_auth(config, Some(clock), Some(auth)).await
}

/// One request over a fresh HTTP/2 connection on `io`: headers without any length, then `body`
/// (if any) as DATA frames. Answers the status.
async fn h2_post<T>(io: T, authority: &str, path: &str, bearer: &str, extra: &[(&str, &str)], body: &[u8]) -> u16
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut client, conn) = h2::client::handshake(io).await.expect("h2 handshake");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut req = axum::http::Request::builder()
        .method("POST")
        .uri(format!("https://{authority}/v1/stream/{path}"))
        .header("authorization", format!("Bearer {bearer}"));
    for (k, v) in extra {
        req = req.header(*k, *v);
    }
    let req = req.body(()).expect("request");
    let (resp, mut send) = client.send_request(req, body.is_empty()).expect("send headers");
    if !body.is_empty() {
        // Two frames, the last one ending the stream: a body that only DATA frames announce.
        let (a, b) = body.split_at(body.len() / 2);
        send.send_data(Bytes::copy_from_slice(a), false).expect("data");
        send.send_data(Bytes::copy_from_slice(b), true).expect("data");
    }
    let resp = tokio::time::timeout(Duration::from_secs(10), resp).await.expect("answer in time").expect("answer");
    resp.status().as_u16()
}

async fn plain(addr: std::net::SocketAddr) -> tokio::net::TcpStream {
    tokio::net::TcpStream::connect(addr).await.expect("connect")
}

/// Reads the stream with full rights over HTTP/1.1.
async fn contents(s: &common::TestServer, path: &str) -> String {
    let http = reqwest::Client::builder().http1_only().build().expect("client");
    let r = http.get(format!("{}?offset=-1", s.url(path))).bearer_auth(token("all")).send().await.expect("read");
    assert_eq!(r.status(), 200, "read {path}");
    r.text().await.expect("text")
}

async fn create(s: &common::TestServer, path: &str) {
    let http = reqwest::Client::builder().http1_only().build().expect("client");
    let r = http
        .put(s.url(path))
        .bearer_auth(token("all"))
        .header("content-type", "text/plain")
        .send()
        .await
        .expect("create");
    assert_eq!(r.status(), 201, "create {path}");
}

const CLOSE: (&str, &str) = ("stream-closed", "true");
const TEXT: (&str, &str) = ("content-type", "text/plain");

#[tokio::test]
async fn over_h2c_a_close_only_token_closes_but_cannot_append() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = server(&dir, None).await;
    let authority = s.addr.to_string();
    create(&s, "c/x").await;
    let status = h2_post(plain(s.addr).await, &authority, "c/x", &token("close"), &[CLOSE, TEXT], b"INJECTED;").await;
    assert_eq!(status, 403, "a close-only token sent data over h2c without a length");
    assert_eq!(contents(&s, "c/x").await, "", "nothing was appended");
    // The same token, the same headers, no DATA frame: a real close, which it may do.
    assert_eq!(h2_post(plain(s.addr).await, &authority, "c/x", &token("close"), &[CLOSE, TEXT], b"").await, 204);
    // A token that may append and close does both.
    create(&s, "c/y").await;
    assert_eq!(
        h2_post(plain(s.addr).await, &authority, "c/y", &token("append,close"), &[CLOSE, TEXT], b"DATA;").await,
        204
    );
    assert_eq!(contents(&s, "c/y").await, "DATA;");
    // Over HTTP/1.1 the same request has a length, so it is an append from the start: 403.
    create(&s, "c/z").await;
    let http = reqwest::Client::builder().http1_only().build().expect("client");
    let r = http
        .post(s.url("c/z"))
        .bearer_auth(token("close"))
        .header(CLOSE.0, CLOSE.1)
        .header(TEXT.0, TEXT.1)
        .body("INJECTED;")
        .send()
        .await
        .expect("post");
    assert_eq!(r.status(), 403, "HTTP/1.1 with a body");
    assert_eq!(contents(&s, "c/z").await, "");
}

#[tokio::test]
async fn over_tls_h2_a_close_only_token_cannot_append() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (ca, cert, key) = common::pki("close-grant");
    let files = TlsFiles { cert: dir.path().join("cert.pem"), key: dir.path().join("key.pem") };
    std::fs::write(&files.cert, cert).expect("cert");
    std::fs::write(&files.key, key).expect("key");
    let s = server(&dir, Some(files)).await;
    let authority = format!("localhost:{}", s.addr.port());
    let connect = || common::tls_connect(s.addr, &ca, b"h2");
    let http = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(ca.as_bytes()).expect("ca"))
        .build()
        .expect("client");
    let base = format!("https://{authority}/v1/stream");
    let r =
        http.put(format!("{base}/c/x")).bearer_auth(token("all")).header(TEXT.0, TEXT.1).send().await.expect("create");
    assert_eq!(r.status(), 201);
    assert_eq!(h2_post(connect().await, &authority, "c/x", &token("close"), &[CLOSE, TEXT], b"INJECTED;").await, 403);
    let read = http.get(format!("{base}/c/x?offset=-1")).bearer_auth(token("all")).send().await.expect("read");
    assert_eq!(read.text().await.expect("text"), "", "nothing was appended");
    assert_eq!(
        h2_post(connect().await, &authority, "c/x", &token("close"), &[CLOSE, TEXT], b"").await,
        204,
        "a real close"
    );
}
