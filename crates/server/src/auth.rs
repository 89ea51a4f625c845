//! The authentication hook point: one decision per request to `/v1/stream/…`, made before the
//! request is routed. The default lets everything through; an access-control implementation
//! (tokens, signed URLs) plugs in here with [`crate::AppState::with_auth`].
//!
//! Not consulted for CORS preflights (browsers send them without credentials) nor for the
//! health and metrics endpoints (probes carry no tokens).

use axum::extract::{Request, State};
use axum::http::request::Parts;
use axum::http::Method;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

use crate::error::ApiError;

/// Why a request is refused; mapped to a status in [`crate::error`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// `401` with `WWW-Authenticate: Bearer error="{error}"`.
    #[error("authentication required: {error}")]
    Unauthenticated { error: &'static str },
    /// `403`: authenticated, but not allowed to do this.
    #[error("not allowed")]
    Forbidden,
    /// `404`: not allowed, and the stream's existence is not revealed.
    #[error("stream not found")]
    Hidden,
}

/// Decides whether a request may proceed.
pub trait Authorize: Send + Sync + 'static {
    fn authorize(&self, req: &Parts) -> Result<(), AuthError>;
}

/// The default: no access control (put the server behind one, or plug one in).
pub struct AllowAll;

impl Authorize for AllowAll {
    fn authorize(&self, _req: &Parts) -> Result<(), AuthError> {
        Ok(())
    }
}

/// The middleware that asks the hook.
pub async fn check(State(auth): State<Arc<dyn Authorize>>, req: Request, next: Next) -> Response {
    if req.method() == Method::OPTIONS {
        return next.run(req).await;
    }
    let (parts, body) = req.into_parts();
    if let Err(e) = auth.authorize(&parts) {
        return ApiError::Auth(e).into_response();
    }
    next.run(Request::from_parts(parts, body)).await
}
