//! Every error the server answers with, and its status code — in this one place.

use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use oncelog_protocol::headers::names;
use oncelog_storage::{AppendError, CompactError, CreateError, LookupError, StorageError, TrimError};

use crate::auth::AuthError;
use crate::body::BodyError;
use crate::live::TooManyReaders;
use crate::rate::RateLimited;
use crate::request::RequestError;
use crate::signing::TokenError;
use crate::subs::error::SubApiError;
use crate::subs::wire::WireError;
use oncelog_subscriptions::SubError;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error(transparent)]
    BadRequest(#[from] RequestError),
    #[error(transparent)]
    Body(#[from] BodyError),
    #[error(transparent)]
    RateLimited(#[from] RateLimited),
    #[error(transparent)]
    TooManyReaders(#[from] TooManyReaders),
    #[error("no such route; streams live under /v1/stream/")]
    NoRoute,
    #[error("method not allowed on a stream")]
    MethodNotAllowed,
    #[error("If-Match needs an existing stream, and there is none")]
    PreconditionNoStream,
    #[error("If-Match names none of this response's entity tags")]
    PreconditionEtag,
    #[error(transparent)]
    Create(#[from] CreateError),
    #[error(transparent)]
    Append(#[from] AppendError),
    #[error(transparent)]
    Lookup(#[from] LookupError),
    #[error(transparent)]
    Trim(#[from] TrimError),
    #[error("a trim or compaction carries no body and no producer, key, If-Match or Stream-Closed headers")]
    TrimWithWrite,
    #[error("`purge` takes the value `true` (DELETE …?purge=true)")]
    InvalidPurge,
    #[error(transparent)]
    Compact(#[from] CompactError),
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error(transparent)]
    Auth(#[from] AuthError),
    #[error(transparent)]
    Sub(SubApiError),
}

/// A subscription request's refusal; one by access control or of its body is answered as for
/// any request.
impl From<SubApiError> for ApiError {
    fn from(e: SubApiError) -> Self {
        match e {
            SubApiError::Auth(e) => ApiError::Auth(e),
            SubApiError::Body(e) => ApiError::Body(e),
            e => ApiError::Sub(e),
        }
    }
}

fn storage_status(e: &StorageError) -> StatusCode {
    match e {
        StorageError::Poisoned | StorageError::ShuttingDown | StorageError::Unavailable(_) => {
            StatusCode::SERVICE_UNAVAILABLE
        }
        StorageError::Backend(_) | StorageError::Corrupt(_) => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// `410` for an offset before the stream's earliest: where it starts now (which moves: no-store).
fn trimmed(earliest: oncelog_protocol::Offset) -> (StatusCode, Vec<(HeaderName, HeaderValue)>) {
    (StatusCode::GONE, vec![h(names::STREAM_EARLIEST_OFFSET, earliest), h("cache-control", "no-store")])
}

/// `412`: the tail the request was conditional on is not the stream's; here is the current one.
fn precondition_failed(tail: oncelog_protocol::Offset, closed: bool) -> (StatusCode, Vec<(HeaderName, HeaderValue)>) {
    let mut v = vec![h(names::STREAM_NEXT_OFFSET, tail)];
    if closed {
        v.push(h(names::STREAM_CLOSED, "true"));
    }
    (StatusCode::PRECONDITION_FAILED, v)
}

fn h(name: &'static str, value: impl ToString) -> (HeaderName, HeaderValue) {
    let v = HeaderValue::from_str(&value.to_string()).unwrap_or(HeaderValue::from_static(""));
    (HeaderName::from_static(name), v)
}

impl ApiError {
    /// The engine's verdict on the stream as it is (not a refusal the server made itself).
    pub fn from_engine(&self) -> bool {
        matches!(self, ApiError::Append(_) | ApiError::Lookup(_) | ApiError::Storage(_))
    }

    fn status_and_headers(&self) -> (StatusCode, Vec<(HeaderName, HeaderValue)>) {
        match self {
            ApiError::BadRequest(_) => (StatusCode::BAD_REQUEST, vec![]),
            ApiError::Body(BodyError::TooLarge { .. }) => (StatusCode::PAYLOAD_TOO_LARGE, vec![]),
            ApiError::Body(BodyError::Read) => (StatusCode::BAD_REQUEST, vec![]),
            ApiError::Body(BodyError::Stalled | BodyError::TooSlow) => {
                (StatusCode::REQUEST_TIMEOUT, vec![h("connection", "close")])
            }
            ApiError::NoRoute => (StatusCode::NOT_FOUND, vec![]),
            // The refused reader's connection is closed (HTTP/1), so its place serves someone else
            // at once: a flood of readers waits in the client's retry, not in the listener.
            ApiError::TooManyReaders(_) => (StatusCode::SERVICE_UNAVAILABLE, vec![h("connection", "close")]),
            ApiError::RateLimited(RateLimited { retry_after_s }) => {
                (StatusCode::TOO_MANY_REQUESTS, vec![h("retry-after", retry_after_s)])
            }
            ApiError::MethodNotAllowed => {
                (StatusCode::METHOD_NOT_ALLOWED, vec![h("allow", "GET, HEAD, PUT, POST, DELETE, OPTIONS")])
            }
            ApiError::Create(e) => match e {
                CreateError::ConfigMismatch(_)
                | CreateError::PathReserved
                | CreateError::SourceGone
                | CreateError::ContentTypeMismatch { .. }
                | CreateError::FramingMismatch => (StatusCode::CONFLICT, vec![]),
                CreateError::SourceNotFound => (StatusCode::NOT_FOUND, vec![]),
                CreateError::ForkTrimmed { earliest } => trimmed(*earliest),
                CreateError::ForkOffsetBeyondTail
                | CreateError::SubOffsetOvershoot
                | CreateError::InvalidPath
                | CreateError::CompactionNeedsJson
                | CreateError::CompactionWithRetention
                | CreateError::CompactionOfPlainSource => (StatusCode::BAD_REQUEST, vec![]),
                CreateError::TooLarge => (StatusCode::PAYLOAD_TOO_LARGE, vec![]),
                CreateError::Storage(e) => (storage_status(e), vec![]),
            },
            ApiError::Append(e) => match e {
                AppendError::NotFound => (StatusCode::NOT_FOUND, vec![]),
                AppendError::Gone => (StatusCode::GONE, vec![]),
                AppendError::Closed { tail } => {
                    (StatusCode::CONFLICT, vec![h(names::STREAM_CLOSED, "true"), h(names::STREAM_NEXT_OFFSET, tail)])
                }
                AppendError::StreamSeqRegression { tail } | AppendError::ExpectedOffsetConflict { tail } => {
                    (StatusCode::CONFLICT, vec![h(names::STREAM_NEXT_OFFSET, tail)])
                }
                AppendError::ContentTypeMismatch { .. } | AppendError::StreamChanged | AppendError::FramingMismatch => {
                    (StatusCode::CONFLICT, vec![])
                }
                AppendError::Empty => (StatusCode::BAD_REQUEST, vec![]),
                AppendError::ProducerFenced { current_epoch } => {
                    (StatusCode::FORBIDDEN, vec![h(names::PRODUCER_EPOCH, current_epoch)])
                }
                AppendError::ProducerSeqGap { expected, received } => (
                    StatusCode::CONFLICT,
                    vec![h(names::PRODUCER_EXPECTED_SEQ, expected), h(names::PRODUCER_RECEIVED_SEQ, received)],
                ),
                AppendError::ProducerEpochSeq | AppendError::InvalidProducerId => (StatusCode::BAD_REQUEST, vec![]),
                AppendError::TooLarge => (StatusCode::PAYLOAD_TOO_LARGE, vec![]),
                AppendError::OffsetOverflow => (StatusCode::INSUFFICIENT_STORAGE, vec![]),
                AppendError::ProducerBodyMismatch { epoch, seq } => (
                    StatusCode::CONFLICT,
                    vec![
                        h(names::PRODUCER_CONFLICT, "body-mismatch"),
                        h(names::PRODUCER_EPOCH, epoch),
                        h(names::PRODUCER_SEQ, seq),
                    ],
                ),
                AppendError::IdempotencyKeyMismatch => (StatusCode::UNPROCESSABLE_ENTITY, vec![]),
                AppendError::IdempotencyKeyWithProducer => (StatusCode::BAD_REQUEST, vec![]),
                AppendError::PreconditionFailed { tail, closed } => precondition_failed(*tail, *closed),
                // A slot frees when an idle producer's state expires; the total's only once the
                // sweep prunes it (every PRUNE_EVERY): one interval is when a retry can count on it.
                AppendError::ProducerLimit { .. } => {
                    (StatusCode::TOO_MANY_REQUESTS, vec![h("retry-after", crate::sweeper::PRUNE_EVERY.as_secs())])
                }
                AppendError::Storage(e) => (storage_status(e), vec![]),
            },
            ApiError::Auth(e) => match e {
                AuthError::Unauthenticated { why } => {
                    (StatusCode::UNAUTHORIZED, vec![challenge(why.code(), &why.to_string())])
                }
                AuthError::Signature(_) => (StatusCode::UNAUTHORIZED, vec![]),
                AuthError::Forbidden { .. } => {
                    (StatusCode::FORBIDDEN, vec![challenge("insufficient_scope", &e.to_string())])
                }
                AuthError::Hidden => (StatusCode::NOT_FOUND, vec![]),
            },
            ApiError::PreconditionNoStream | ApiError::PreconditionEtag => (StatusCode::PRECONDITION_FAILED, vec![]),
            ApiError::Lookup(LookupError::NotFound) => (StatusCode::NOT_FOUND, vec![]),
            ApiError::Lookup(LookupError::Gone) => (StatusCode::GONE, vec![]),
            ApiError::Lookup(LookupError::PreconditionFailed { tail, closed }) => precondition_failed(*tail, *closed),
            ApiError::Lookup(LookupError::Trimmed { earliest }) => trimmed(*earliest),
            ApiError::Trim(e) => match e {
                TrimError::NotFound => (StatusCode::NOT_FOUND, vec![]),
                TrimError::Gone => (StatusCode::GONE, vec![]),
                TrimError::BeyondTail { tail } => (StatusCode::BAD_REQUEST, vec![h(names::STREAM_NEXT_OFFSET, tail)]),
                TrimError::Storage(e) => (storage_status(e), vec![]),
            },
            ApiError::TrimWithWrite | ApiError::InvalidPurge => (StatusCode::BAD_REQUEST, vec![]),
            ApiError::Compact(e) => match e {
                CompactError::NotFound => (StatusCode::NOT_FOUND, vec![]),
                CompactError::Gone => (StatusCode::GONE, vec![]),
                CompactError::NotCompactable => (StatusCode::CONFLICT, vec![]),
                CompactError::Closed => (StatusCode::CONFLICT, vec![h(names::STREAM_CLOSED, "true")]),
                // Appends kept the stream moving through every attempt: try again later.
                CompactError::Stale { .. } => (StatusCode::SERVICE_UNAVAILABLE, vec![]),
                CompactError::TooLarge => (StatusCode::INSUFFICIENT_STORAGE, vec![]),
                CompactError::NotStateProtocol(_) => (StatusCode::CONFLICT, vec![]),
                CompactError::Storage(e) => (storage_status(e), vec![]),
            },
            ApiError::Lookup(LookupError::Storage(e)) | ApiError::Storage(e) => (storage_status(e), vec![]),
            ApiError::Sub(e) => (sub_status(e).0, vec![]),
        }
    }
}

/// A subscription error's status and `error.code` (the protocol's names), and extra fields.
fn sub_status(e: &SubApiError) -> (StatusCode, &'static str, serde_json::Value) {
    use serde_json::json;
    let none = serde_json::Value::Null;
    match e {
        SubApiError::Sub(e) => match e {
            SubError::NotFound => (StatusCode::NOT_FOUND, "SUBSCRIPTION_NOT_FOUND", none),
            SubError::AlreadyExists => (StatusCode::CONFLICT, "SUBSCRIPTION_ALREADY_EXISTS", none),
            SubError::Invalid(_) | SubError::WrongType { .. } => (StatusCode::BAD_REQUEST, "INVALID_REQUEST", none),
            SubError::TokenInvalid => (StatusCode::UNAUTHORIZED, "TOKEN_INVALID", none),
            SubError::Fenced => (StatusCode::CONFLICT, "FENCED", none),
            SubError::AlreadyClaimed { holder, generation } => {
                (StatusCode::CONFLICT, "ALREADY_CLAIMED", json!({ "current_holder": holder, "generation": generation }))
            }
            SubError::NoPendingWork => (StatusCode::CONFLICT, "NO_PENDING_WORK", none),
            SubError::InvalidOffset { stream, .. } => {
                (StatusCode::CONFLICT, "INVALID_OFFSET", json!({ "stream": stream }))
            }
            SubError::Append { index, stream, error } => {
                let (status, _) = ApiError::Append(error.clone()).status_and_headers();
                (status, "APPEND_REFUSED", json!({ "index": index, "stream": stream }))
            }
            // Another server changed it first (several servers over one backend): try again.
            SubError::Conflict => (StatusCode::SERVICE_UNAVAILABLE, "CONFLICT", none),
            SubError::TooMany { max } => {
                (StatusCode::TOO_MANY_REQUESTS, "TOO_MANY_SUBSCRIPTIONS", json!({ "max": max }))
            }
            SubError::ShareUsed { prefix, max } => {
                (StatusCode::FORBIDDEN, "SUBSCRIPTION_SHARE_USED", json!({ "prefix": prefix, "max": max }))
            }
            SubError::Storage(s) => (storage_status(s), "STORAGE_ERROR", none),
        },
        SubApiError::Wire(WireError::Offset { stream }) => {
            (StatusCode::CONFLICT, "INVALID_OFFSET", json!({ "stream": stream }))
        }
        SubApiError::Wire(_) | SubApiError::Output { .. } => (StatusCode::BAD_REQUEST, "INVALID_REQUEST", none),
        SubApiError::OutputLookup { index, stream, source } => {
            let (status, _) = ApiError::Lookup(source.clone()).status_and_headers();
            (status, "APPEND_REFUSED", json!({ "index": index, "stream": stream }))
        }
        SubApiError::UrlRejected(_) => (StatusCode::BAD_REQUEST, "WEBHOOK_URL_REJECTED", none),
        SubApiError::Token(TokenError::Invalid) => (StatusCode::UNAUTHORIZED, "TOKEN_INVALID", none),
        SubApiError::Token(TokenError::Expired) => (StatusCode::UNAUTHORIZED, "TOKEN_EXPIRED", none),
        SubApiError::NoRoute => (StatusCode::NOT_FOUND, "SUBSCRIPTION_NOT_FOUND", none),
        SubApiError::Method => (StatusCode::METHOD_NOT_ALLOWED, "METHOD_NOT_ALLOWED", none),
        SubApiError::OutputNotAllowed { index, stream } => {
            (StatusCode::FORBIDDEN, "OUTPUT_NOT_ALLOWED", json!({ "index": index, "stream": stream }))
        }
        // Answered as any request's (see `From<SubApiError> for ApiError`); these codes only
        // name them should one be rendered here.
        SubApiError::Auth(e) => (ApiError::Auth(e.clone()).status_and_headers().0, "UNAUTHORIZED", none),
        SubApiError::Body(e) => (ApiError::Body(*e).status_and_headers().0, "INVALID_REQUEST", none),
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        // The reason, for the request log (crate::access_log): only errors pay for it.
        let reason = crate::access_log::Reason(self.to_string().into());
        let mut resp = self.render();
        resp.extensions_mut().insert(reason);
        resp
    }
}

impl ApiError {
    fn render(self) -> Response {
        let (status, mut headers) = self.status_and_headers();
        if status == StatusCode::SERVICE_UNAVAILABLE {
            // Shutting down or stopped after a storage failure: another node or a restart will do.
            headers.push(h("retry-after", 1));
        }
        // A refused live reader is expected under load: counted, not logged per request.
        if status.is_server_error() && !matches!(self, ApiError::TooManyReaders(_)) {
            tracing::error!(error = %self, %status, "request failed");
        }
        if let ApiError::Sub(e) = &self {
            // The subscription API answers JSON: {"error": {"code", "message", ...}}.
            let (status, code, extra) = sub_status(e);
            if status.is_server_error() {
                tracing::error!(error = %e, %status, "subscription request failed");
            }
            let mut err = serde_json::json!({ "code": code, "message": e.to_string() });
            if let (Some(m), serde_json::Value::Object(x)) = (err.as_object_mut(), extra) {
                m.extend(x);
            }
            let mut resp =
                (status, [("content-type", "application/json")], serde_json::json!({ "error": err }).to_string())
                    .into_response();
            if status == StatusCode::SERVICE_UNAVAILABLE {
                resp.headers_mut().insert("retry-after", HeaderValue::from_static("1"));
            }
            return resp;
        }
        if let ApiError::Auth(AuthError::Signature(e)) = &self {
            // The proxy protocol's error shape, so browser code can tell expiry from tampering.
            let body = serde_json::json!({ "error": { "code": e.code(), "message": e.to_string() } }).to_string();
            let mut resp = (status, [("content-type", "application/json")], body).into_response();
            resp.headers_mut().extend(headers);
            return resp;
        }
        let mut resp = (status, [("content-type", "text/plain; charset=utf-8")], format!("{self}\n")).into_response();
        resp.headers_mut().extend(headers);
        resp
    }
}

/// `WWW-Authenticate: Bearer error="…", error_description="…"` (RFC 6750 section 3). The
/// description may hold only printable ASCII without `"` and `\\`: anything else (a stream path
/// is any UTF-8) is percent-encoded, so the header is always valid and says what the body says.
fn challenge(code: &str, description: &str) -> (HeaderName, HeaderValue) {
    let mut safe = String::with_capacity(description.len());
    for b in description.bytes() {
        match b {
            b'"' | b'\\' | b'%' => safe.push_str(&format!("%{b:02X}")),
            0x20..=0x7e => safe.push(char::from(b)),
            _ => safe.push_str(&format!("%{b:02X}")),
        }
    }
    h("www-authenticate", format!("Bearer error=\"{code}\", error_description=\"{safe}\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unreachable_backend_is_503_with_retry_after_and_its_reason() {
        let cause = std::sync::Arc::new(std::io::Error::other("connection to the database lost"));
        let resp = ApiError::Storage(StorageError::Unavailable(cause)).into_response();
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(resp.headers().get("retry-after").and_then(|v| v.to_str().ok()), Some("1"));
        let append = ApiError::Append(AppendError::Storage(StorageError::Unavailable(std::sync::Arc::new(
            std::io::Error::other("x"),
        ))))
        .into_response();
        assert_eq!(append.status(), StatusCode::SERVICE_UNAVAILABLE);
        let text = ApiError::Storage(StorageError::Unavailable(std::sync::Arc::new(std::io::Error::other(
            "connection to the database lost",
        ))))
        .to_string();
        assert!(text.contains("connection to the database lost"), "{text}");
    }
}
