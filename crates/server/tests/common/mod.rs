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
        let (s, http, _ca, dir) = TestServer::start_tls_with_ca(config).await;
        (s, http, dir)
    }

    /// [`TestServer::start_tls`], also answering the PEM of the CA that signed the server's
    /// certificate, for clients a test builds itself ([`tls_connect`]).
    pub async fn start_tls_with_ca(config: ServerConfig) -> (TestServer, reqwest::Client, String, tempfile::TempDir) {
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
        (s, http, ca, dir)
    }
}

/// A raw TLS connection to `addr` (as `localhost`, trusting the CA `ca_pem`) offering the ALPN
/// protocol `alpn` (`b"http/1.1"`, `b"h2"`) alone; panics unless the server chose it.
pub async fn tls_connect(
    addr: std::net::SocketAddr,
    ca_pem: &str,
    alpn: &[u8],
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    use rustls_pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pki_types::CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.expect("ca pem")).expect("root");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![alpn.to_vec()];
    let name = rustls_pki_types::ServerName::try_from("localhost").expect("name");
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config)).connect(name, tcp).await.expect("tls handshake");
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(alpn), "ALPN");
    tls
}

/// Which front end a case of a suite that runs on both goes through (issue 47).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Front {
    /// Plain TCP: HTTP/1 on the server's own engine (HTTP/2 with prior knowledge on hyper).
    Plain,
    /// TLS: hyper, HTTP/1.1 or HTTP/2 as ALPN chose.
    Tls,
}

/// A client's end of a raw connection, whichever the front end.
pub trait RawIo: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> RawIo for T {}
pub type Raw = Box<dyn RawIo>;

/// A [`TestServer`] on one [`Front`], with what its clients need: raw connections that speak
/// HTTP/1.1 ([`FrontServer::connect`]) or HTTP/2 ([`FrontServer::connect_h2`]) over it, and
/// `reqwest` clients (on TLS they negotiate HTTP/2).
pub struct FrontServer {
    pub s: TestServer,
    pub front: Front,
    /// The CA of the server's certificate (TLS only).
    ca: Option<String>,
    _dir: Option<tempfile::TempDir>,
}

impl FrontServer {
    pub async fn start(front: Front, config: ServerConfig) -> FrontServer {
        match front {
            Front::Plain => FrontServer { s: TestServer::start(config, None).await, front, ca: None, _dir: None },
            Front::Tls => {
                let (s, _, ca, dir) = TestServer::start_tls_with_ca(config).await;
                FrontServer { s, front, ca: Some(ca), _dir: Some(dir) }
            }
        }
    }

    pub fn url(&self, path: &str) -> String {
        self.s.url(path)
    }

    /// A new `reqwest` client (its own connections) that trusts the server.
    pub fn client(&self) -> reqwest::Client {
        let mut b = reqwest::Client::builder();
        if let Some(ca) = &self.ca {
            b = b.add_root_certificate(reqwest::Certificate::from_pem(ca.as_bytes()).expect("ca"));
        }
        b.build().expect("client")
    }

    /// A new connection ready for HTTP/1.1 requests: plain TCP, or TLS with `http/1.1` chosen
    /// by ALPN (the handshake done).
    pub async fn connect(&self) -> Raw {
        self.connect_alpn(b"http/1.1").await
    }

    /// A new connection for HTTP/2: plain TCP (h2c with prior knowledge), or TLS with `h2`.
    pub async fn connect_h2(&self) -> Raw {
        self.connect_alpn(b"h2").await
    }

    /// A new TCP connection, whatever the front: on TLS, one that never sends its `ClientHello`.
    pub async fn connect_tcp(&self) -> tokio::net::TcpStream {
        tokio::net::TcpStream::connect(self.s.addr).await.expect("connect")
    }

    async fn connect_alpn(&self, alpn: &[u8]) -> Raw {
        match &self.ca {
            None => Box::new(self.connect_tcp().await),
            Some(ca) => Box::new(tls_connect(self.s.addr, ca, alpn).await),
        }
    }
}

/// Reads `conn` until the peer closes it (end of stream, or an error such as a reset or, on
/// TLS, a close without `close_notify`) or `limit` passes; returns what arrived and whether it
/// closed.
pub async fn read_to_close<R: tokio::io::AsyncRead + Unpin + ?Sized>(
    conn: &mut R,
    limit: std::time::Duration,
) -> (String, bool) {
    use tokio::io::AsyncReadExt;
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    let closed = tokio::time::timeout(limit, async {
        loop {
            match conn.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .is_ok();
    (String::from_utf8_lossy(&out).into_owned(), closed)
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
