//! HTTPS: a certificate made here (rcgen) for a private CA; HTTP/2 negotiated by ALPN with many
//! live readers on one connection; the certificate renewed in place; the Rust client and the CLI
//! trusting the CA through `--cacert`. Alone in its binary: it counts connections in the
//! process-wide metrics.

mod common;

use std::time::Duration;

use oncelog_server::tls::TlsFiles;
use oncelog_server::ServerConfig;
use reqwest::StatusCode;

fn client(ca_pem: &str) -> reqwest::Client {
    let ca = reqwest::Certificate::from_pem(ca_pem.as_bytes()).expect("ca");
    reqwest::Client::builder().add_root_certificate(ca).build().expect("client")
}

fn metric(scrape: &str, name: &str) -> f64 {
    scrape
        .lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')))
        .map_or(0.0, |v| v.parse().expect("number"))
}

#[tokio::test]
async fn https_with_http2_many_live_readers_on_one_connection_and_certificate_renewal() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (ca, cert, key) = common::pki("first");
    let files = TlsFiles { cert: dir.path().join("cert.pem"), key: dir.path().join("key.pem") };
    std::fs::write(&files.cert, &cert).expect("cert");
    std::fs::write(&files.key, &key).expect("key");
    let config = ServerConfig { tls: Some(files.clone()), ..ServerConfig::default() };
    let s = common::TestServer::start(config, None).await;
    let base = format!("https://localhost:{}/v1/stream", s.addr.port());
    let origin = format!("https://localhost:{}", s.addr.port());
    let http = client(&ca);

    let scrape =
        || async { http.get(format!("{origin}/metrics")).send().await.expect("scrape").text().await.expect("text") };
    let before = metric(&scrape().await, "oncelog_connections_accepted_total");
    let r = http.put(format!("{base}/s")).header("content-type", "text/plain").send().await.expect("put");
    assert_eq!((r.status(), r.version()), (StatusCode::CREATED, reqwest::Version::HTTP_2));
    // The new stream's URL as the client reached it: https, with the port (HTTP/2 sends no Host).
    assert_eq!(r.headers().get("location").and_then(|v| v.to_str().ok()), Some(format!("{base}/s").as_str()));
    // Twenty SSE readers on the one HTTP/2 connection, all reached by one append.
    let readers = common::h2_sse_readers(&http, &format!("{base}/s?offset=-1&live=sse"), 20, "hello");
    tokio::time::sleep(Duration::from_millis(200)).await;
    http.post(format!("{base}/s")).header("content-type", "text/plain").body("hello").send().await.expect("post");
    for r in readers {
        r.await.expect("reader");
    }
    let after = metric(&scrape().await, "oncelog_connections_accepted_total");
    assert_eq!(after - before, 0.0, "the scrape, the writes and 20 readers all used the connection opened before");

    // An untrusting client is refused; plain HTTP on the TLS port gets nowhere.
    assert!(reqwest::get(format!("{base}/s")).await.is_err());

    // Renewal: new files signed by another CA; new connections get them, the old one keeps working.
    let (ca2, cert2, key2) = common::pki("second");
    std::fs::write(&files.key, &key2).expect("key");
    std::fs::write(&files.cert, &cert2).expect("cert");
    let fresh = client(&ca2);
    let mut renewed = false;
    for _ in 0..50 {
        if fresh.get(format!("{base}/s")).send().await.is_ok_and(|r| r.status() == StatusCode::OK) {
            renewed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(renewed, "the renewed certificate is served within 5 s");
    let r = http.get(format!("{base}/s")).send().await.expect("the open connection survives the renewal");
    assert_eq!(r.text().await.expect("text"), "hello");
}
