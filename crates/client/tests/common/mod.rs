//! An in-process Oncelog server on a loopback port 0, for the client's integration tests.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use oncelog_log::{Durability, LogEngine, LogOptions};
use oncelog_server::{serve, AppState, ServerConfig};

/// A running server; dropping it stops accepting (the runtime ends with the test).
pub struct TestServer {
    /// `http://127.0.0.1:PORT/v1/stream`
    pub base: String,
    /// `127.0.0.1:PORT`
    pub addr: std::net::SocketAddr,
    /// Keeps the data directory alive.
    _dir: tempfile::TempDir,
}

impl TestServer {
    /// A server with a short long-poll timeout and SSE lifetime, so live reads cycle quickly.
    pub async fn start() -> TestServer {
        TestServer::start_with(ServerConfig {
            long_poll_timeout: Duration::from_millis(500),
            sse_max_duration: Duration::from_secs(2),
            ..ServerConfig::default()
        })
        .await
    }

    pub async fn start_with(config: ServerConfig) -> TestServer {
        TestServer::start_with_auth(config, None).await
    }

    /// A server whose requests are decided by `auth` (token authentication, say).
    pub async fn start_with_auth(config: ServerConfig, auth: Option<Arc<dyn oncelog_server::Authorize>>) -> TestServer {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut opts = LogOptions::new(dir.path());
        // The tests here are about the network path, not disk durability.
        opts.durability = Durability::Buffered;
        let engine = LogEngine::open(opts).expect("engine");
        let mut state = AppState::new(Arc::new(engine), config);
        if let Some(auth) = auth {
            state = state.with_auth(auth);
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(serve(listener, state, std::future::pending()));
        TestServer { base: format!("http://{addr}/v1/stream"), addr, _dir: dir }
    }
}
