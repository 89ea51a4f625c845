//! TLS to PostgreSQL: `verify-full` against the test cluster's CA connects and the session is
//! encrypted; a wrong CA, a wrong host name and a server without TLS are each refused at open,
//! at once, with their reason; `verify-ca` accepts the wrong name; a missing root file is
//! refused before any connection.
//!
//! Needs `ONCELOG_TEST_POSTGRES_URL` as `scripts/test` sets it: a `verify-full` URL naming the
//! cluster's CA (`scripts/postgres tls-url DIR`).

mod common;

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use oncelog_postgres::conninfo::{self, Roots, SslMode};
use oncelog_postgres::{OpenError, PgEngine, PgOptions};
use oncelog_storage::Engine;

/// The test cluster's port and CA file, from the TLS URL.
fn cluster() -> (u16, PathBuf) {
    let (rest, tls) = conninfo::split(&common::url()).expect("test URL");
    let Roots::File(ca) = tls.roots else {
        panic!("the TLS tests need a verify-full URL with sslrootcert: ONCELOG_TEST_POSTGRES_URL=$(scripts/postgres tls-url DIR)")
    };
    assert_eq!(tls.mode, SslMode::VerifyFull, "the TLS tests need sslmode=verify-full in ONCELOG_TEST_POSTGRES_URL");
    let cfg = tokio_postgres::Config::from_str(&rest).expect("driver URL");
    (cfg.get_ports().first().copied().unwrap_or(5432), ca)
}

fn url(host: &str, port: u16, mode: &str, ca: &std::path::Path) -> String {
    format!("postgres://oncelog@{host}:{port}/postgres?hostaddr=127.0.0.1&sslmode={mode}&sslrootcert={}", ca.display())
}

async fn open(url: String) -> Result<PgEngine, OpenError> {
    let schema = common::fresh_schema();
    PgEngine::open(PgOptions { schema, pool_size: 2, committers: 1, connect_timeout: Duration::from_secs(20), ..PgOptions::new(url) }).await
}

/// Opening must fail at once (not after `connect_timeout`), with `want` in its reason.
async fn refused(url: String, want: &str) {
    let started = std::time::Instant::now();
    let err = match open(url.clone()).await {
        Ok(_) => panic!("{url} was accepted"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains(want), "{url}: expected {want:?} in {err:?}");
    assert!(started.elapsed() < Duration::from_secs(10), "{url}: a TLS refusal is not retried ({:?})", started.elapsed());
}

#[tokio::test]
async fn verify_full_connects_and_the_session_is_encrypted() {
    let (port, ca) = cluster();
    let engine = open(url("localhost", port, "verify-full", &ca)).await.expect("verify-full against the cluster's CA");
    engine.shutdown().await.expect("shutdown");
    // The same connector the engine uses, on a session of its own: PostgreSQL says it is TLS.
    let (cfg, tls) = oncelog_postgres::driver_config(&url("localhost", port, "verify-full", &ca)).expect("url");
    let (client, conn) = cfg.connect(tls).await.expect("connect");
    tokio::spawn(conn);
    let ssl: bool = client.query_one("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()", &[]).await.expect("query").get(0);
    assert!(ssl, "the session is not encrypted");
}

#[tokio::test]
async fn a_certificate_from_another_ca_is_refused() {
    let (port, _) = cluster();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let other = params.self_signed(&rcgen::KeyPair::generate().expect("key")).expect("ca");
    let dir = tempfile::tempdir().expect("tempdir");
    let other_ca = dir.path().join("other-ca.crt");
    std::fs::write(&other_ca, other.pem()).expect("write");
    refused(url("localhost", port, "verify-full", &other_ca), "not signed by a trusted CA").await;
    refused(url("localhost", port, "verify-ca", &other_ca), "not signed by a trusted CA").await;
}

#[tokio::test]
async fn a_host_name_the_certificate_does_not_list_is_refused_by_verify_full_only() {
    let (port, ca) = cluster();
    // The certificate lists localhost and 127.0.0.1; this name reaches the same server.
    refused(url("oncelog.invalid", port, "verify-full", &ca), "does not name the host").await;
    let engine = open(url("oncelog.invalid", port, "verify-ca", &ca)).await.expect("verify-ca does not check the name");
    engine.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn a_server_without_tls_is_refused_when_tls_is_required() {
    // A server that answers PostgreSQL's TLS request with "no", as one with ssl=off does.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut request = [0u8; 8];
                if s.read_exact(&mut request).await.is_ok() && request[4..] == [0x04, 0xd2, 0x16, 0x2f] {
                    let _ = s.write_all(b"N").await;
                    let mut rest = Vec::new();
                    let _ = s.read_to_end(&mut rest).await;
                }
            });
        }
    });
    let (_, ca) = cluster();
    refused(url("localhost", port, "require", &ca), "does not offer TLS").await;
    refused(format!("postgres://oncelog@127.0.0.1:{port}/postgres?sslmode=require"), "does not offer TLS").await;
}

#[tokio::test]
async fn unusable_tls_settings_are_refused_before_connecting() {
    let (port, _) = cluster();
    refused(url("localhost", port, "verify-full", std::path::Path::new("/nonexistent/ca.crt")), "sslrootcert /nonexistent/ca.crt").await;
    refused(format!("postgres://oncelog@127.0.0.1:{port}/postgres?sslmode=verify-everything"), "is not one of").await;
    refused(format!("postgres://oncelog@127.0.0.1:{port}/postgres?sslcert=/c.pem"), "sslcert and sslkey go together").await;
}
