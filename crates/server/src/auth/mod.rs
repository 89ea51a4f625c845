//! Access control: the authentication hook point and Oncelog's own implementation of it.
//!
//! Every request to `/v1/stream/…` is decided by an [`Authorize`] before it is routed. The
//! default, [`AllowAll`], lets everything through (authentication off: development, or a server
//! behind a gateway that does it). [`token::TokenAuth`] verifies bearer tokens (JWT) and
//! pre-signed read URLs against grants ([`scope`]). Plug one in with
//! [`crate::AppState::with_auth`].
//!
//! Not consulted for CORS preflights (browsers send them without credentials) nor for the
//! health and metrics endpoints (probes carry no tokens).

pub mod scope;
pub mod signed_url;
pub mod token;

use std::sync::Arc;

use axum::http::request::Parts;

use oncelog_storage::clock::Clock;

pub use signed_url::SignatureError;

/// Why a request is refused; mapped to a status in [`crate::error`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// `401` with `WWW-Authenticate: Bearer error="{error}"` (`invalid_request`: no usable
    /// credentials; `invalid_token`: malformed, badly signed, expired or not yet valid).
    #[error("authentication required: {error}")]
    Unauthenticated { error: &'static str },
    /// `401` with a JSON body carrying the proxy protocol's code.
    #[error(transparent)]
    Signature(SignatureError),
    /// `403`: authenticated, but not allowed to do this.
    #[error("the token does not allow this operation on this stream")]
    Forbidden,
    /// `404`: not allowed, and the stream's existence is not revealed.
    #[error("stream not found")]
    Hidden,
}

/// What an allowed request may rely on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Access {
    /// When the credentials expire (Unix ms): a live read ends then. `None`: never.
    pub expires_at_ms: Option<i64>,
    /// Who is writing, for per-writer rate limits; `None`: the client's address is used.
    pub principal: Option<String>,
    /// What the credentials allow, for requests that reach streams other than their own path
    /// (a subscription's links and wake stream); `None`: no access control.
    pub scope: Option<std::sync::Arc<scope::Scope>>,
}

impl Access {
    /// Whether these credentials allow `op` on `path` (always, without access control). For a
    /// right that only the request's body reveals: a `POST` classified as a bodiless close
    /// whose body turns out to hold data is an append too.
    pub fn permits(&self, path: &str, op: scope::Op) -> bool {
        self.scope.as_ref().is_none_or(|s| s.allows(path, op))
    }
}

/// Decides whether a request may proceed.
pub trait Authorize: Send + Sync + 'static {
    fn authorize(&self, req: &Parts, now_ms: i64) -> Result<Access, AuthError>;

    /// Whether everything is allowed to everyone (no access control at all). Requests whose
    /// rights cannot be expressed as grants (a transactional commit's outputs) need it.
    fn is_open(&self) -> bool {
        false
    }

    /// Whether refusals must not reveal what exists (`--auth-hide-forbidden`): handlers that
    /// check rights themselves then answer as for something missing, whatever exists.
    fn hides_forbidden(&self) -> bool {
        false
    }
}

/// The default: no access control.
pub struct AllowAll;

impl Authorize for AllowAll {
    fn authorize(&self, _req: &Parts, _now_ms: i64) -> Result<Access, AuthError> {
        Ok(Access::default())
    }

    fn is_open(&self) -> bool {
        true
    }
}

/// The hook and the clock it decides with (used by [`crate::front`]).
#[derive(Clone)]
pub struct Gate {
    pub auth: Arc<dyn Authorize>,
    pub clock: Arc<dyn Clock>,
}

