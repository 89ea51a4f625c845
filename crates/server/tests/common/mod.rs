//! A real server for the HTTP tests: the log engine (the default) in a temporary directory, run by
//! `oncelog_server::serve` on a loopback port 0 until the test's runtime ends.

#![allow(dead_code)]

use std::sync::Arc;

use oncelog_log::{Failpoints, LogEngine, LogOptions};
use oncelog_server::{serve, AppState, Authorize, Clock, ServerConfig};

pub struct TestServer {
    /// `http://127.0.0.1:PORT`
    pub origin: String,
    /// `http://127.0.0.1:PORT/v1/stream`
    pub base: String,
    pub addr: std::net::SocketAddr,
    /// Switches that make the engine's storage fail on purpose.
    pub failpoints: Failpoints,
    /// Keeps the data directory alive.
    _dir: tempfile::TempDir,
}

impl TestServer {
    pub async fn start(config: ServerConfig, clock: Option<Arc<dyn Clock>>) -> TestServer {
        TestServer::start_with_auth(config, clock, None).await
    }

    pub async fn start_with_auth(
        config: ServerConfig,
        clock: Option<Arc<dyn Clock>>,
        auth: Option<Arc<dyn Authorize>>,
    ) -> TestServer {
        let dir = tempfile::tempdir().expect("tempdir");
        let opts = LogOptions::new(dir.path());
        let failpoints = opts.failpoints.clone();
        let engine = LogEngine::open(opts).expect("engine");
        let mut state = AppState::new(Arc::new(engine), config);
        if let Some(clock) = clock {
            state = state.with_clock(clock);
        }
        if let Some(auth) = auth {
            state = state.with_auth(auth);
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(serve(listener, state, std::future::pending()));
        TestServer {
            origin: format!("http://{addr}"),
            base: format!("http://{addr}/v1/stream"),
            addr,
            failpoints,
            _dir: dir,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}/{path}", self.base)
    }

    /// [`TestServer::start`] behind TLS (a certificate made here for `localhost`), with a
    /// client that trusts it: its `origin` and `base` are `https://localhost:PORT…`, and the
    /// client speaks HTTP/2 (offered by ALPN), so the requests take the hyper front end.
    pub async fn start_tls(config: ServerConfig) -> (TestServer, reqwest::Client, tempfile::TempDir) {
        let dir = tempfile::tempdir().expect("tempdir");
        let (ca, cert, key) = pki("test");
        let files =
            oncelog_server::tls::TlsFiles { cert: dir.path().join("cert.pem"), key: dir.path().join("key.pem") };
        std::fs::write(&files.cert, cert).expect("cert");
        std::fs::write(&files.key, key).expect("key");
        let mut s = TestServer::start(ServerConfig { tls: Some(files), ..config }, None).await;
        s.origin = format!("https://localhost:{}", s.addr.port());
        s.base = format!("{}/v1/stream", s.origin);
        let http = reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(ca.as_bytes()).expect("ca"))
            .build()
            .expect("client");
        (s, http, dir)
    }
}

/// A CA and a `localhost` / `127.0.0.1` certificate it signed, as PEM: (ca, cert, key).
pub fn pki(name: &str) -> (String, String, String) {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(rcgen::DnType::CommonName, format!("{name} test CA"));
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().expect("ca key")).expect("ca");
    let key = KeyPair::generate().expect("key");
    let params = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).expect("params");
    let cert = params.signed_by(&key, &ca).expect("cert");
    (ca.pem(), cert.pem(), key.serialize_pem())
}

/// An `HS256` token signed with `secret`, valid until `exp` (Unix s), granting `(path, exact,
/// ops)`: `exact` names one stream, else a prefix; `ops` comma-separated.
pub fn grants_token(secret: &[u8], grants: &[(&str, bool, &str)], exp: i64) -> String {
    use oncelog_server::auth::scope::{GrantClaim, ScopeClaim};
    let grants = grants
        .iter()
        .map(|(p, exact, ops)| GrantClaim {
            stream: exact.then(|| p.to_string()),
            prefix: (!exact).then(|| p.to_string()),
            ops: ops.split(',').map(str::to_owned).collect(),
        })
        .collect();
    oncelog_server::auth::token::issue(secret, ScopeClaim { grants }, exp, None, None, None).expect("sign")
}

/// Spawns `n` SSE readers of `url` that must arrive over HTTP/2 and see `needle` within 5 s.
pub fn h2_sse_readers(
    http: &reqwest::Client,
    url: &str,
    n: usize,
    needle: &'static str,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..n)
        .map(|_| {
            let (http, url) = (http.clone(), url.to_owned());
            tokio::spawn(async move {
                let mut resp = http.get(url).send().await.expect("sse");
                assert_eq!(resp.version(), reqwest::Version::HTTP_2);
                let mut seen = String::new();
                while !seen.contains(needle) {
                    match tokio::time::timeout(std::time::Duration::from_secs(5), resp.chunk()).await {
                        Ok(Ok(Some(c))) => seen.push_str(&String::from_utf8_lossy(&c)),
                        other => panic!("SSE ended early: {other:?} after {seen:?}"),
                    }
                }
            })
        })
        .collect()
}

/// The private PostgreSQL cluster of `./scripts/test` (`ONCELOG_TEST_POSTGRES_URL`), for the tests
/// that run the server over that engine; a panic that says how to get one.
pub fn postgres_url() -> String {
    std::env::var("ONCELOG_TEST_POSTGRES_URL").unwrap_or_else(|_| {
        panic!("this test needs ONCELOG_TEST_POSTGRES_URL: ./scripts/test starts a private cluster and sets it")
    })
}

/// Options for one PostgreSQL node of a test on `schema` (two cores: a small pool, one committer).
pub fn postgres_options(schema: &str) -> oncelog_postgres::PgOptions {
    oncelog_postgres::PgOptions {
        schema: schema.to_owned(),
        pool_size: 2,
        committers: 1,
        ..oncelog_postgres::PgOptions::new(postgres_url())
    }
}
