//! The HTTP face of Oncelog: the Durable Streams Protocol over any [`Engine`], as a library.
//! [`serve`] runs a whole server (router, TTL sweeper, graceful drain, engine shutdown); the
//! `oncelog` binary and every test start servers through it.
//!
//! Module map:
//! - [`config`]: server tunables (long-poll timeout, body and read limits, SSE lifetime, sweep
//!   interval, shutdown grace, ops paths).
//! - [`request_kind`]: what a request is — its [`request_kind::Kind`] (method and headers; what
//!   access control checks) and its [`request_kind::Operation`] with typed arguments, decided
//!   once; the subscription API's calls ([`request_kind::SubCall`]).
//! - [`request`]: typed parsing of the protocol's request headers and query; returns typed errors,
//!   never responses.
//! - [`error`]: every error the server can answer with, mapped to a status code in one place.
//! - [`handlers`]: the one stream route's dispatch to a thin handler per operation (create,
//!   append, trim / compact / delete): typed arguments (the stream looked up once) → one engine call → an answer.
//! - [`read`]: the read operations: `HEAD`, and catch-up, long-poll and SSE reads.
//! - `reply`, `body`: response helpers shared by every handler, and reading a bounded body.
//! - [`front`]: the one service in front of the router: peer address, authentication hook,
//!   request metrics, CORS and browser-security headers on every answer.
//! - [`access_log`]: the request log, one line per stream request when its answer ends.
//! - [`headers`]: CORS origins and the CORS preflight.
//! - [`auth`]: the authentication hook point.
//! - [`deadline_io`]: sockets whose blocked writes time out (stalled readers).
//! - [`listing`]: the stream listing (`GET /v1/stream/__ds/streams`), filtered by the caller's
//!   grants.
//! - [`live`]: bounds on live readers, in all and per stream.
//! - [`live_read`]: the bounded read and whole-event framing SSE readers and fan-outs share.
//! - [`fanout`]: SSE readers parked at the tail on a plain HTTP/1 connection: one task per
//!   (connection runtime, stream) writes each event to every parked socket.
//! - [`listen`]: the connection loop (HTTP/1.1 and h2c, connection limits, header timeouts,
//!   half-close, graceful drain).
//! - [`conns`]: the connections of a listener and what each is doing (idle, slow, holding a live
//!   reader): which one makes room at `--max-connections`, and live readers whose client left.
//! - [`ops`]: `/healthz`, `/readyz`, `/metrics`.
//! - [`metrics`]: what is recorded, and the Prometheus scrape.
//! - [`rate`]: append and byte rate limits per writer.
//! - [`reload`]: the periodic re-reading of key and certificate files.
//! - [`subs`]: the subscription API under `/v1/stream/__ds/` and webhook delivery.
//! - [`sendfile_io`]: the plain socket that sends mapped segment ranges with `sendfile(2)`.
//! - [`signing`]: the webhook signing keys (rotated), the JWKS, claim and callback tokens.
//! - [`state`]: [`AppState`], what every handler shares.
//! - [`sweeper`]: the background task that deletes expired streams, applies retention, compacts
//!   and prunes idle writer state.
//! - [`tls`]: certificates for HTTPS (reloaded when their files change) and ALPN.
//!
//! Time comes from [`Clock`] (re-exported from `oncelog-storage`), so tests drive expiry and
//! cursors by hand.

pub mod access_log;
pub mod auth;
mod body;
pub mod config;
pub mod conns;
pub mod deadline_io;
pub mod error;
pub mod fanout;
pub mod front;
pub mod handlers;
pub mod headers;
pub mod listen;
pub mod listing;
pub mod live;
pub mod live_read;
pub mod metrics;
pub mod ops;
pub mod rate;
pub mod read;
pub mod relay;
pub mod reload;
mod reply;
pub mod request;
pub mod request_kind;
pub mod sendfile_io;
pub mod signing;
pub mod state;
mod stored_body;
pub mod subs;
pub mod sweeper;
pub mod tls;
pub mod workers;

use std::future::Future;
use std::sync::atomic::Ordering;

use axum::routing::get;
use axum::Router;
use oncelog_storage::{Engine, StorageError};

pub use auth::{Access, AllowAll, AuthError, Authorize};
pub use config::{ConfigError, ServerConfig};
pub use oncelog_storage::clock::{Clock, ManualClock, SystemClock};
pub use state::{AppState, Shared};

/// The service: [`front::Front`] (peer address, authentication hook for everything but the
/// operational endpoints, request metrics, CORS and browser-security headers on every answer)
/// in front of the stream operations under `/v1/stream/{path}` (called directly) and of the
/// router: the operational endpoints ([`ops`]) and a 404 with a reason for anything else.
pub fn app<E: Engine>(state: AppState<E>) -> Result<front::Front, ConfigError> {
    state.config.validate()?;
    let fallback = Router::new().fallback(handlers::no_route).with_state(state.clone());
    let route_state = state.clone();
    let stream_route: front::StreamRoute =
        std::sync::Arc::new(move |req, caller| Box::pin(handlers::stream(route_state.clone(), req, caller)));
    let mut ops = Router::new()
        .route(&state.config.healthz_path, get(ops::healthz))
        .route(&state.config.readyz_path, get(ops::readyz::<E>));
    let mut ops_paths = vec![state.config.healthz_path.clone(), state.config.readyz_path.clone()];
    // With a metrics listener of its own (`--metrics-addr`) the path is not served here.
    if let Some(path) = state.config.metrics_path.as_ref().filter(|_| state.config.metrics_addr.is_none()) {
        ops = ops.route(path, get(ops::metrics::<E>));
        ops_paths.push(path.clone());
    }
    let config = front::FrontConfig {
        gate: auth::Gate { auth: state.auth.clone(), clock: state.clock.clone() },
        cors: state.config.cors_origins.clone(),
        ops_paths,
        access_log: state.config.access_log,
    };
    Ok(front::Front::new(ops.with_state(state).merge(fallback), stream_route, config))
}

/// The service of the metrics listener (`--metrics-addr`): the metrics path, and a 404 for
/// everything else, streams included. `None` when metrics are off.
pub fn metrics_app<E: Engine>(state: AppState<E>) -> Option<front::Front> {
    let path = state.config.metrics_path.clone()?;
    let fallback = Router::new().fallback(handlers::no_route).with_state(state.clone());
    let router = Router::new().route(&path, get(ops::metrics::<E>)).with_state(state.clone()).merge(fallback);
    let no_streams: front::StreamRoute = std::sync::Arc::new(|_, _| {
        Box::pin(async { axum::response::IntoResponse::into_response(error::ApiError::NoRoute) })
    });
    let config = front::FrontConfig {
        gate: auth::Gate { auth: state.auth.clone(), clock: state.clock.clone() },
        cors: state.config.cors_origins.clone(),
        ops_paths: vec![path],
        access_log: false,
    };
    Some(front::Front::new(router, no_streams, config))
}

/// Why [`serve`] stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    #[error("storage did not shut down cleanly: {0}")]
    Storage(#[from] StorageError),
    #[error("metrics listener on {addr}: {source}")]
    MetricsListener { addr: std::net::SocketAddr, source: std::io::Error },
}

/// Serves `state` on `listener` until `shutdown` completes; then stops accepting, turns
/// `/readyz` to 503, gives in-flight requests [`ServerConfig::shutdown_grace`] to finish, stops
/// the sweeper and shuts the engine down (every acknowledged write durable). The only way the
/// binary and the tests run a server.
pub async fn serve<E: Engine>(
    listener: tokio::net::TcpListener,
    state: AppState<E>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    let router = app(state.clone())?;
    let tls = match &state.config.tls {
        Some(files) => {
            let store = tls::CertStore::load(files.clone())?;
            let acceptor = store.acceptor()?;
            Some((acceptor, store.spawn_reloader(std::time::Duration::from_secs(1))))
        }
        None => None,
    };
    if let Ok(addr) = listener.local_addr() {
        let scheme = if tls.is_some() { "https" } else { "http" };
        let _ = state.base_url.set(format!("{scheme}://{addr}"));
    }
    let limits = || listen::Limits {
        max_connections: state.config.max_connections,
        header_read_timeout: state.config.header_read_timeout,
        write_timeout: state.config.write_timeout,
        h2_ping_interval: state.config.h2_ping_interval,
        h2_ping_timeout: state.config.h2_ping_timeout,
        http1_engine: state.config.http1_engine,
        io_threads: state.config.io_threads,
    };
    let metrics_listener = match (state.config.metrics_addr, metrics_app(state.clone())) {
        (Some(addr), Some(front)) => {
            let l = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|source| ServeError::MetricsListener { addr, source })?;
            if let Ok(bound) = l.local_addr() {
                let _ = state.metrics_addr.set(bound);
                tracing::info!(%bound, "metrics served on their own listener");
            }
            let grace = state.config.shutdown_grace;
            // A scrape now and then needs no runtime of its own.
            let limits = listen::Limits { io_threads: 0, ..limits() };
            Some(tokio::spawn(listen::run(l, front, limits, None, std::future::pending(), grace)))
        }
        _ => None,
    };
    let sweeper = sweeper::spawn(&state);
    let dispatcher = subs::dispatch::spawn(&state);
    let limits = limits();
    let draining = state.draining.clone();
    let stop = async move {
        shutdown.await;
        draining.store(true, Ordering::Relaxed);
        tracing::info!("shutting down: no new connections; finishing in-flight requests");
    };
    let acceptor = tls.as_ref().map(|(a, _)| a.clone());
    if !listen::run(listener, router, limits, acceptor, stop, state.config.shutdown_grace).await {
        tracing::warn!("grace period over; closing remaining connections");
    }
    sweeper.abort();
    dispatcher.abort();
    if let Some(m) = metrics_listener {
        m.abort();
    }
    if let Some((_, reloader)) = tls {
        reloader.abort();
    }
    state.engine.shutdown().await?;
    Ok(())
}
