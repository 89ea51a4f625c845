//! TLS to PostgreSQL: `verify-full` against the test cluster's CA connects and the session is
//! encrypted; a wrong CA, a wrong host name and a server without TLS are each refused at open,
//! at once, with their reason; `verify-ca` accepts the wrong name; a missing root file is
//! refused before any connection; a client certificate authenticates where the server requires
//! one.
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
    PgEngine::open(PgOptions {
        schema,
        pool_size: 2,
        committers: 1,
        connect_timeout: Duration::from_secs(20),
        ..PgOptions::new(url)
    })
    .await
}

/// Opening must fail at once (not after `connect_timeout`), with `want` in its reason.
async fn refused(url: String, want: &str) {
    let started = std::time::Instant::now();
    let err = match open(url.clone()).await {
        Ok(_) => panic!("{url} was accepted"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains(want), "{url}: expected {want:?} in {err:?}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{url}: a TLS refusal is not retried ({:?})",
        started.elapsed()
    );
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
    let ssl: bool =
        client.query_one("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()", &[]).await.expect("query").get(0);
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
    refused(
        url("localhost", port, "verify-full", std::path::Path::new("/nonexistent/ca.crt")),
        "sslrootcert /nonexistent/ca.crt",
    )
    .await;
    refused(format!("postgres://oncelog@127.0.0.1:{port}/postgres?sslmode=verify-everything"), "is not one of").await;
    refused(format!("postgres://oncelog@127.0.0.1:{port}/postgres?sslcert=/c.pem"), "sslcert and sslkey go together")
        .await;
}

/// `sslcert` / `sslkey`: where the server requires a client certificate (`hostssl … cert`, for
/// a role of this test's own), the connector presents the one named and PostgreSQL takes its CN
/// as the user; without it the same URL is refused.
#[tokio::test]
async fn a_client_certificate_authenticates_where_the_server_requires_one() {
    let (port, ca) = cluster();
    let tls_dir = ca.parent().expect("tls dir").to_owned();
    let cluster_dir = tls_dir.parent().expect("cluster dir").to_owned();
    let role = "oncelog_cert";
    // The server learns to check client certificates against the cluster's CA, and requires
    // one from this role only (every other test connects as before).
    let admin = {
        let (cfg, tls) = oncelog_postgres::driver_config(&url("localhost", port, "verify-full", &ca)).expect("url");
        let (client, conn) = cfg.connect(tls).await.expect("connect as the test user");
        tokio::spawn(conn);
        client
    };
    admin
        .batch_execute(&format!("DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{role}') THEN CREATE ROLE {role} LOGIN; END IF; END $$"))
        .await
        .expect("role");
    admin.batch_execute(&format!("ALTER SYSTEM SET ssl_ca_file = '{}'", ca.display())).await.expect("ssl_ca_file");
    let hba = cluster_dir.join("data/pg_hba.conf");
    let rules = std::fs::read_to_string(&hba).expect("pg_hba.conf");
    let line = format!("hostssl all {role} 127.0.0.1/32 cert\n");
    if !rules.contains(&line) {
        std::fs::write(&hba, format!("{line}{rules}")).expect("pg_hba.conf");
    }
    admin.batch_execute("SELECT pg_reload_conf()").await.expect("reload");
    tokio::time::sleep(Duration::from_millis(500)).await;

    // A key and a certificate for the role, signed by the cluster's CA (as an operator would).
    let dir = tempfile::tempdir().expect("tempdir");
    let (key, csr, cert) =
        (dir.path().join("client.key"), dir.path().join("client.csr"), dir.path().join("client.crt"));
    let openssl = |args: &[&std::ffi::OsStr]| {
        let out =
            std::process::Command::new("openssl").args(args).output().expect("openssl (scripts/postgres needs it too)");
        assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    let s = |v: &str| std::ffi::OsString::from(v);
    openssl(&[
        &s("req"),
        &s("-new"),
        &s("-newkey"),
        &s("ec"),
        &s("-pkeyopt"),
        &s("ec_paramgen_curve:prime256v1"),
        &s("-nodes"),
        &s(&format!("-subj=/CN={role}")),
        &s("-keyout"),
        key.as_os_str(),
        &s("-out"),
        csr.as_os_str(),
    ]);
    // An X.509 v3 certificate for client authentication (rustls takes no v1 certificate).
    let ext = dir.path().join("client.ext");
    std::fs::write(
        &ext,
        "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n",
    )
    .expect("ext");
    openssl(&[
        &s("x509"),
        &s("-req"),
        &s("-in"),
        csr.as_os_str(),
        &s("-CA"),
        ca.as_os_str(),
        &s("-CAkey"),
        tls_dir.join("ca.key").as_os_str(),
        &s("-set_serial"),
        &s("1"),
        &s("-days"),
        &s("1"),
        &s("-extfile"),
        ext.as_os_str(),
        &s("-out"),
        cert.as_os_str(),
    ]);

    let base = format!(
        "postgres://{role}@localhost:{port}/postgres?hostaddr=127.0.0.1&sslmode=verify-full&sslrootcert={}",
        ca.display()
    );
    let with_cert = format!("{base}&sslcert={}&sslkey={}", cert.display(), key.display());
    let (cfg, tls) = oncelog_postgres::driver_config(&with_cert).expect("url");
    let (client, conn) = cfg.connect(tls).await.expect("the certificate is accepted");
    tokio::spawn(conn);
    let who: String = client.query_one("SELECT current_user::text", &[]).await.expect("query").get(0);
    assert_eq!(who, role);
    let (cfg, tls) = oncelog_postgres::driver_config(&base).expect("url");
    assert!(cfg.connect(tls).await.is_err(), "without a certificate the role is refused");
}

/// The test cluster's certificates are valid from well before they were made (as public CAs
/// backdate theirs): the fault suite restarts nodes with clocks minutes behind, and a node whose
/// clock ran behind a just-made certificate refused it as "not valid yet" and never started.
#[test]
fn the_test_clusters_certificates_are_valid_from_before_they_were_made() {
    let (_, ca) = cluster();
    let dir = ca.parent().expect("the CA file's directory");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs();
    for file in [ca.clone(), dir.join("server.crt")] {
        let out = std::process::Command::new("openssl")
            .args(["x509", "-noout", "-startdate", "-in"])
            .arg(&file)
            .output()
            .expect("openssl");
        let start = String::from_utf8_lossy(&out.stdout).trim().trim_start_matches("notBefore=").to_owned();
        let secs = std::process::Command::new("date").args(["-u", "-d", &start, "+%s"]).output().expect("date");
        let since: u64 = String::from_utf8_lossy(&secs.stdout)
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("notBefore of {}: {start:?}", file.display()));
        assert!(
            since + 3_600 <= now,
            "{} is valid only from {start}: a node whose clock runs an hour behind would refuse it",
            file.display()
        );
    }
}
