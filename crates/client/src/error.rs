//! Errors, and whether retrying is safe.
//!
//! Every failure is an [`Error`] variant; none is a string to parse. Two questions matter to a
//! caller and each has a method:
//!
//! - [`Error::is_transient`]: might the same request succeed later? (network errors, `5xx`, `429`)
//! - [`Error::is_retry_safe`]: is it transient *and* can repeating the request not write anything
//!   twice? A network error on a plain append without an `Idempotency-Key` is transient but not
//!   retry-safe: the server may have stored the data before the connection broke. Keys (a
//!   caller's own, or the automatic one, see [`crate::AppendOptions::auto_idempotency_key`]) and
//!   the [`crate::Producer`]'s `(producer id, epoch, seq)` make retries safe, and the client
//!   makes them itself. An automatic key stays inside the client, so once it gives up, calling
//!   `append` again is a new request with a new key: its error is retry-safe only if no attempt
//!   can have been processed.

use std::sync::Arc;
use std::time::Duration;

use crate::offset::StreamOffset;

/// Any failure of this crate. Cheap to clone (sources are shared), so one failure can be handed
/// to every receipt waiting on the batch that failed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An argument was refused before any request was made.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// The request failed on the network: connection refused or reset, timeout, or a response
    /// body cut short.
    #[error("network error ({}): {source}", if *.retry_safe { "safe to retry" } else { "outcome unknown" })]
    Transport {
        /// What reqwest reported.
        #[source]
        source: Arc<reqwest::Error>,
        /// Whether repeating the request cannot apply it twice: the request is idempotent, or it
        /// never reached the server (connect failure).
        retry_safe: bool,
    },

    /// `404`: the stream does not exist.
    #[error("stream not found: {url}")]
    NotFound {
        /// The stream's URL, so the message says which stream.
        url: String,
    },

    /// `410` with `Stream-Earliest-Offset`: the requested offset was dropped (a trim or the
    /// stream's retention policy); the stream can still be read from `earliest`. A reader with
    /// [`crate::OnTrimmed::RestartFromEarliest`] moves there by itself.
    #[error("offset trimmed: the stream now starts at {earliest}")]
    Trimmed {
        /// Where the stream can be read from now.
        earliest: StreamOffset,
    },

    /// `410`: the stream is gone (soft-deleted while forks still read it).
    #[error("gone: {message}")]
    Gone {
        /// The server's one-line reason.
        message: String,
    },

    /// `409` on create: the stream exists with a different configuration.
    #[error("create refused (409): {message}")]
    ConfigMismatch {
        /// The server's one-line reason.
        message: String,
    },

    /// `409` with `Stream-Closed: true`: the stream is closed and takes no more data.
    #[error("stream is closed{}", .final_offset.as_ref().map(|o| format!(" at offset {o}")).unwrap_or_default())]
    StreamClosed {
        /// The stream's final offset, when the server said it.
        final_offset: Option<StreamOffset>,
    },

    /// `409` because a `Stream-Seq` did not increase.
    #[error("Stream-Seq conflict: {message}")]
    StreamSeqConflict {
        /// The server's one-line reason.
        message: String,
    },

    /// Any other `409` (for example a content type that does not match the stream's).
    #[error("conflict: {message}")]
    Conflict {
        /// The server's one-line reason.
        message: String,
    },

    /// `403` with `Producer-Epoch`: a newer epoch of this producer id exists; this one is a
    /// zombie and is fenced off.
    #[error("producer fenced: epoch {epoch} is stale, the server is at epoch {current_epoch}")]
    Fenced {
        /// The epoch the request carried.
        epoch: u64,
        /// The server's current epoch for the producer id.
        current_epoch: u64,
    },

    /// The server answered "duplicate" to the first request of a fresh producer session: the
    /// epoch was already used by an earlier session, whose data would silently swallow ours.
    #[error("epoch {epoch} was already used by an earlier session of this producer id; start with a higher epoch (see EpochStore)")]
    EpochReused {
        /// The epoch in question.
        epoch: u64,
    },

    /// `409` with `Producer-Expected-Seq`: a sequence gap that waiting for predecessors could
    /// not close.
    #[error("producer sequence gap: server expected seq {expected}, got {received}")]
    SequenceGap {
        /// `Producer-Expected-Seq`.
        expected: u64,
        /// `Producer-Received-Seq`.
        received: u64,
    },

    /// `409` with `Producer-Conflict: body-mismatch`: this `(epoch, seq)` was already accepted
    /// with a different body. A client bug (a sequence number reused for new data); nothing was
    /// written.
    #[error("producer conflict: seq {seq} of epoch {epoch} was already accepted with a different body")]
    BodyMismatch {
        /// `Producer-Epoch`.
        epoch: u64,
        /// `Producer-Seq`.
        seq: u64,
    },

    /// `422` to an append with an `Idempotency-Key`: the key was already used on this stream,
    /// within its window, with a different body. Nothing was written; new data needs a new key.
    #[error("idempotency key reused with a different body: {message}")]
    IdempotencyKeyMismatch {
        /// The server's one-line reason.
        message: String,
    },

    /// `412` to a conditional append ([`crate::StreamHandle::append_if`]): the stream's tail is no
    /// longer the offset the append was conditional on; nothing was written.
    #[error("precondition failed: the stream's tail is now {current}{}", if *.closed { " (closed)" } else { "" })]
    PreconditionFailed {
        /// The stream's tail now: read from the old one up to here, decide again, retry with it.
        current: StreamOffset,
        /// Whether the stream is closed (then no conditional append can succeed).
        closed: bool,
    },

    /// `409` to an append with `Stream-Expected-Offset` ([`crate::AppendOptions::expected_offset`]):
    /// the stream's tail is not that offset; nothing was written.
    #[error("expected offset conflict: the stream's tail is now {current}")]
    ExpectedOffsetConflict {
        /// The stream's tail now: read from the old one up to here, decide again, retry with it.
        current: StreamOffset,
    },

    /// `400`: the server refused the request as malformed (an invalid offset, for example).
    #[error("bad request: {message}")]
    BadRequest {
        /// The server's one-line reason.
        message: String,
    },

    /// `413`: the body exceeds the server's limit.
    #[error("payload too large: {message}")]
    PayloadTooLarge {
        /// The server's one-line reason.
        message: String,
    },

    /// A subscription API answer other than success: `code` is the protocol's name for it
    /// (`FENCED`: the work passed to another worker, stop; `ALREADY_CLAIMED`, `NO_PENDING_WORK`,
    /// `INVALID_OFFSET`, `SUBSCRIPTION_NOT_FOUND`, `TOKEN_INVALID`, `APPEND_REFUSED`, ...).
    #[error("subscription request refused ({status} {code}): {message}")]
    Subscription {
        /// The HTTP status.
        status: u16,
        /// `error.code` of the answer.
        code: String,
        /// `error.message` of the answer.
        message: String,
        /// `error.current_holder` (with `ALREADY_CLAIMED`).
        holder: Option<String>,
    },

    /// Any other status: `5xx`, `429`, or one this client does not expect.
    #[error("server answered {status}: {message}")]
    Status {
        /// The HTTP status code.
        status: u16,
        /// The server's one-line reason (the start of the body).
        message: String,
        /// `Retry-After`, when the server sent one.
        retry_after: Option<Duration>,
        /// Whether repeating the request cannot apply it twice (see [`Error::is_retry_safe`]).
        retry_safe: bool,
    },

    /// The response broke the protocol: a missing or malformed header, an SSE control event that
    /// is not JSON, a JSON stream body that is not a JSON array.
    #[error("invalid response: {0}")]
    InvalidResponse(String),

    /// A value could not be (de)serialized as JSON.
    #[error("JSON error: {0}")]
    Json(#[source] Arc<serde_json::Error>),

    /// The producer was closed; it takes no more appends.
    #[error("producer is closed")]
    ProducerClosed,

    /// `try_append` found the producer's buffer full.
    #[error("producer buffer is full")]
    BufferFull,

    /// An earlier failure stopped the producer; this item was not acknowledged (it may or may not
    /// have been written if it was already in flight).
    #[error("producer stopped after an earlier error: {0}")]
    ProducerFailed(Arc<Error>),

    /// The epoch store hook failed to load or store the epoch.
    #[error("epoch store: {0}")]
    EpochStore(String),
}

impl Error {
    /// Whether the same request might succeed if repeated later: network errors, `5xx`, `408`
    /// and `429`.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Transport { .. } => true,
            Error::Status { status, .. } | Error::Subscription { status, .. } => is_transient_status(*status),
            _ => false,
        }
    }

    /// Whether this is the subscription API's `FENCED`: the work belongs to another worker now.
    pub fn is_fenced(&self) -> bool {
        matches!(self, Error::Subscription { code, .. } if code == "FENCED")
    }

    /// Whether repeating the request is both useful and harmless: it is [transient](Self::is_transient)
    /// and cannot write anything twice (the request is idempotent, or never reached the server,
    /// or the server said it did not process it).
    pub fn is_retry_safe(&self) -> bool {
        match self {
            Error::Transport { retry_safe, .. } => *retry_safe,
            Error::Status { status, retry_safe, .. } => is_transient_status(*status) && *retry_safe,
            _ => false,
        }
    }

    /// The HTTP status the error came from, if any.
    pub fn status(&self) -> Option<u16> {
        Some(match self {
            Error::NotFound { .. } => 404,
            Error::Gone { .. } | Error::Trimmed { .. } => 410,
            Error::ConfigMismatch { .. }
            | Error::StreamClosed { .. }
            | Error::StreamSeqConflict { .. }
            | Error::ExpectedOffsetConflict { .. }
            | Error::Conflict { .. }
            | Error::SequenceGap { .. } => 409,
            Error::Fenced { .. } => 403,
            Error::BadRequest { .. } => 400,
            Error::PayloadTooLarge { .. } => 413,
            Error::Status { status, .. } | Error::Subscription { status, .. } => *status,
            Error::Transport { source, .. } => return source.status().map(|s| s.as_u16()),
            Error::ProducerFailed(inner) => return inner.status(),
            _ => return None,
        })
    }

    /// The `Retry-After` delay the server asked for, if any.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Error::Status { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// Whether this is a network error that happened before any byte of the request reached the
    /// server (a failed connect).
    pub(crate) fn is_connect_failure(&self) -> bool {
        matches!(self, Error::Transport { source, .. } if source.is_connect())
    }

    /// The same error, marked as not safe to repeat (a new request would not be the same one).
    pub(crate) fn not_retry_safe(self) -> Error {
        match self {
            Error::Transport { source, .. } => Error::Transport { source, retry_safe: false },
            Error::Status { status, message, retry_after, .. } => {
                Error::Status { status, message, retry_after, retry_safe: false }
            }
            e => e,
        }
    }

    pub(crate) fn transport(source: reqwest::Error, idempotent: bool) -> Error {
        // A connect failure means no byte of the request reached the server.
        let retry_safe = idempotent || source.is_connect();
        Error::Transport { source: Arc::new(source), retry_safe }
    }

    pub(crate) fn invalid(msg: impl Into<String>) -> Error {
        Error::InvalidArgument(msg.into())
    }
}

impl From<serde_json::Error> for Error {
    fn from(e: serde_json::Error) -> Self {
        Error::Json(Arc::new(e))
    }
}

/// Statuses after which the same request may succeed.
pub(crate) fn is_transient_status(status: u16) -> bool {
    status >= 500 || status == 429 || status == 408
}

/// Statuses that say the server did not process the request, so even a non-idempotent request
/// may be repeated: `429 Too Many Requests` and `503 Service Unavailable`.
pub(crate) fn status_means_not_processed(status: u16) -> bool {
    status == 429 || status == 503
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transience_and_safety() {
        let s = |status, retry_safe| Error::Status { status, message: String::new(), retry_after: None, retry_safe };
        assert!(s(500, true).is_transient() && s(500, true).is_retry_safe());
        assert!(s(500, false).is_transient() && !s(500, false).is_retry_safe());
        assert!(s(429, true).is_retry_safe());
        assert!(!s(418, true).is_transient() && !s(418, true).is_retry_safe());
        assert!(!Error::NotFound { url: "u".into() }.is_transient());
        assert!(!Error::StreamClosed { final_offset: None }.is_retry_safe());
        assert_eq!(Error::Fenced { epoch: 1, current_epoch: 2 }.status(), Some(403));
        assert!(status_means_not_processed(503) && !status_means_not_processed(500));
    }
}
