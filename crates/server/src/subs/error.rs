//! Why a subscription request was refused (a leaf: the server's error mapping imports it).

use oncelog_storage::LookupError;
use oncelog_subscriptions::SubError;

use super::{ssrf, wire};
use crate::auth::AuthError;
use crate::body::BodyError;
use crate::signing as keys;

/// Why a subscription request was refused; statuses and codes are in [`crate::error`].
#[derive(Debug, thiserror::Error)]
pub enum SubApiError {
    #[error(transparent)]
    Sub(#[from] SubError),
    #[error(transparent)]
    Wire(#[from] wire::WireError),
    #[error("webhook URL rejected: {0}")]
    UrlRejected(#[from] ssrf::Rejected),
    #[error(transparent)]
    Token(#[from] keys::TokenError),
    #[error("no such subscription route")]
    NoRoute,
    #[error("method not allowed on this subscription route")]
    Method,
    #[error("commit output {index}: {why}")]
    Output { index: usize, why: &'static str },
    #[error("commit output {index} to {stream}: {source}")]
    OutputLookup { index: usize, stream: String, source: LookupError },
    #[error("commit output {index}: {stream} is not under the subscription's outputs prefixes")]
    OutputNotAllowed { index: usize, stream: String },
    /// Refused by access control: answered as any stream request refused so is.
    #[error(transparent)]
    Auth(#[from] AuthError),
    /// The body could not be read: answered as for any request.
    #[error(transparent)]
    Body(#[from] BodyError),
}
