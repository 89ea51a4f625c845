//! The HTTP face of Oncelog: the Durable Streams Protocol over any [`Engine`].
//!
//! Module map:
//! - [`config`]: server tunables (long-poll timeout, body and read limits, SSE lifetime).
//! - [`clock`]: wall-clock time and jitter behind a small trait, so time-based behaviour is testable.
//! - [`request`]: typed parsing of the protocol's request headers and query; returns typed errors,
//!   never responses.
//! - [`error`]: every error the server can answer with, mapped to a status code in one place.
//! - [`handlers`]: thin axum handlers: parse → one engine call → render.
//! - [`read`]: rendering of catch-up, long-poll and SSE reads.
//! - [`headers`]: the response headers every answer carries (CORS, browser security) and the
//!   CORS preflight.
//! - [`sweeper`]: the background task that deletes expired streams.
//!
//! Handlers are generic over the engine; [`app`] builds the router.

pub mod clock;
pub mod config;
pub mod error;
pub mod handlers;
pub mod headers;
pub mod read;
pub mod request;
pub mod sweeper;

use std::sync::Arc;

use axum::routing::any;
use axum::Router;
use oncelog_storage::Engine;

pub use clock::{Clock, SystemClock};
pub use config::ServerConfig;

/// Everything a handler needs. Cheap to clone.
pub struct AppState<E> {
    pub engine: Arc<E>,
    pub config: Arc<ServerConfig>,
    pub clock: Arc<dyn Clock>,
}

impl<E> Clone for AppState<E> {
    fn clone(&self) -> Self {
        Self { engine: self.engine.clone(), config: self.config.clone(), clock: self.clock.clone() }
    }
}

/// The router: streams under `/v1/stream/{path}`; everything else is a 404 with a reason.
pub fn app<E: Engine>(state: AppState<E>) -> Router {
    Router::new()
        .route("/v1/stream/{*path}", any(handlers::stream::<E>))
        .fallback(handlers::no_route)
        .layer(axum::middleware::map_response(headers::common))
        .with_state(state)
}
