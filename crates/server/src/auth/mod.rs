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
    /// `401` with `WWW-Authenticate: Bearer error="{code}", error_description="{why}"` (the code
    /// is [`Why::code`]); the body says the same.
    #[error("authentication required: {why}")]
    Unauthenticated { why: Why },
    /// `401` with a JSON body carrying the proxy protocol's code.
    #[error(transparent)]
    Signature(SignatureError),
    /// `403` (with `WWW-Authenticate: Bearer error="insufficient_scope"` and the same words):
    /// authenticated, but no grant covers this operation on this stream.
    #[error("the token does not grant {op} on {stream}")]
    Forbidden { op: scope::Op, stream: String },
    /// `404`: not allowed, and the stream's existence is not revealed.
    #[error("stream not found")]
    Hidden,
}

/// Why credentials were not accepted: the short reason a `401` gives, in its body and its
/// `WWW-Authenticate` header's `error_description`, so a client (and its operator) can tell an
/// expired token from a wrong key or a missing grant without reading server logs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Why {
    #[error("no credentials: send `Authorization: Bearer <token>`, or use a signed URL")]
    NoCredentials,
    #[error("the Authorization header is not `Bearer <token>`")]
    NotBearer,
    #[error("the token is not a well-formed JWT")]
    Malformed,
    #[error("the token's header names critical extensions (crit), which this server does not implement")]
    CriticalHeader,
    #[error("no key of this server matches the token's algorithm and key id (kid)")]
    NoKey,
    #[error("the token's signature does not verify")]
    BadSignature,
    #[error("the token's issuer (iss) is not the one this server requires")]
    WrongIssuer,
    #[error("the token's audience (aud) is not the one this server requires")]
    WrongAudience,
    #[error("the token has no expiry (exp)")]
    NoExpiry,
    #[error("the token expired at {}", http_date(*at_ms))]
    Expired { at_ms: i64 },
    #[error("the token is not valid before {}", http_date(*from_ms))]
    NotYetValid { from_ms: i64 },
    #[error("the token's grants are malformed: each must name exactly one of stream and prefix")]
    BadGrant,
    /// The reason of an authentication hook of the embedding application's own.
    #[error("{0}")]
    Other(std::borrow::Cow<'static, str>),
}

impl Why {
    /// RFC 6750's error code: `invalid_request` when no usable credentials came at all,
    /// `invalid_token` for credentials that did not verify.
    pub fn code(&self) -> &'static str {
        match self {
            Why::NoCredentials | Why::NotBearer => "invalid_request",
            _ => "invalid_token",
        }
    }
}

/// A Unix time in ms as an HTTP date (`Fri, 27 Nov 2026 18:00:00 GMT`).
fn http_date(ms: i64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    httpdate::fmt_http_date(t)
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
