//! The HTTP plumbing every operation shares: a [`Request`] kept whole so it can be sent again,
//! reading an answer's headers, and turning a failed answer into its typed [`Error`]. It knows
//! no client, stream, reader or producer: those all build on it.

use std::time::Duration;

use bytes::Bytes;
use oncelog_protocol::headers::{closed_flag, names};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use reqwest::{Method, Url};

use crate::error::{status_means_not_processed, Error};
use crate::offset::StreamOffset;

/// One request, kept whole so that it can be sent again.
#[derive(Debug, Clone)]
pub(crate) struct Request {
    /// HTTP method.
    pub method: Method,
    /// Full URL, query included (per-request query parameters are added at send time).
    pub url: Url,
    /// Operation headers (they override default and provided headers of the same name).
    pub headers: HeaderMap,
    /// Body; empty means none.
    pub body: Bytes,
    /// Total time allowed; `None` for streaming responses (SSE).
    pub timeout: Option<Duration>,
    /// Whether repeating the request cannot apply it twice.
    pub idempotent: bool,
}

impl Request {
    pub(crate) fn new(method: Method, url: Url, idempotent: bool, timeout: Option<Duration>) -> Request {
        Request { method, url, headers: HeaderMap::new(), body: Bytes::new(), timeout, idempotent }
    }

    /// Adds a header whose name and value are known to be valid.
    pub(crate) fn header(&mut self, name: &'static str, value: &str) -> Result<(), Error> {
        let v = HeaderValue::from_str(value)
            .map_err(|_| Error::invalid(format!("invalid value for header {name}: {value:?}")))?;
        self.headers.insert(HeaderName::from_static(name), v);
        Ok(())
    }
}

/// What kind of operation a failed response answered; it decides what a `409` means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Create,
    Append { stream_seq: bool },
    Other,
}

/// A header as text, when present and valid UTF-8.
pub(crate) fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim)
}

/// A header as an unsigned integer, when present and well-formed.
pub(crate) fn header_u64(headers: &HeaderMap, name: &str) -> Option<u64> {
    header_str(headers, name).and_then(|v| v.parse().ok())
}

/// `Stream-Next-Offset`, which every successful answer carries.
pub(crate) fn next_offset(headers: &HeaderMap) -> Result<StreamOffset, Error> {
    match header_str(headers, names::STREAM_NEXT_OFFSET) {
        Some(v) if !v.is_empty() => Ok(StreamOffset::new(v)),
        _ => Err(Error::InvalidResponse("response has no Stream-Next-Offset header".into())),
    }
}

/// `Retry-After` in seconds (the HTTP-date form is not used by Durable Streams servers).
pub(crate) fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    header_u64(headers, "retry-after").map(Duration::from_secs)
}

/// Reads at most a short prefix of an error body: the server's one-line reason.
async fn reason(resp: reqwest::Response) -> String {
    const LIMIT: usize = 512;
    let bytes = resp.bytes().await.unwrap_or_default();
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(LIMIT)]);
    text.lines().next().unwrap_or("").trim().to_owned()
}

/// Maps a non-success response to its typed error.
pub(crate) async fn error_from_response(resp: reqwest::Response, op: Op, idempotent: bool) -> Error {
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    match status {
        404 => return Error::NotFound { url: resp.url().as_str().to_owned() },
        410 => {
            // Oncelog's trims and retention answer with where the stream starts now; a
            // soft-deleted stream's 410 has no such header.
            if let Some(earliest) = header_str(&headers, names::STREAM_EARLIEST_OFFSET).filter(|v| !v.is_empty()) {
                return Error::Trimmed { earliest: StreamOffset::new(earliest) };
            }
        }
        409 if closed_flag(header_str(&headers, names::STREAM_CLOSED)) => {
            return Error::StreamClosed { final_offset: next_offset(&headers).ok() };
        }
        412 => {
            return match next_offset(&headers) {
                Ok(current) => Error::PreconditionFailed {
                    current,
                    closed: closed_flag(header_str(&headers, names::STREAM_CLOSED)),
                },
                Err(e) => e,
            };
        }
        _ => {}
    }
    if status == 409 && header_str(&headers, names::PRODUCER_CONFLICT) == Some("body-mismatch") {
        if let (Some(epoch), Some(seq)) =
            (header_u64(&headers, names::PRODUCER_EPOCH), header_u64(&headers, names::PRODUCER_SEQ))
        {
            return Error::BodyMismatch { epoch, seq };
        }
    }
    if status == 409 {
        if let (Some(expected), Some(received)) =
            (header_u64(&headers, names::PRODUCER_EXPECTED_SEQ), header_u64(&headers, names::PRODUCER_RECEIVED_SEQ))
        {
            return Error::SequenceGap { expected, received };
        }
    }
    let message = reason(resp).await;
    // The protocol's words for a strict compare-and-append that lost (`Stream-Expected-Offset`).
    if status == 409 && message.to_ascii_lowercase().starts_with("expected offset conflict") {
        if let Ok(current) = next_offset(&headers) {
            return Error::ExpectedOffsetConflict { current };
        }
    }
    match (status, op) {
        (400, _) => Error::BadRequest { message },
        (410, _) => Error::Gone { message },
        (413, _) => Error::PayloadTooLarge { message },
        (422, Op::Append { .. }) => Error::IdempotencyKeyMismatch { message },
        (409, Op::Create) => Error::ConfigMismatch { message },
        (409, Op::Append { stream_seq: true }) if !message.to_ascii_lowercase().contains("content") => {
            Error::StreamSeqConflict { message }
        }
        (409, _) => Error::Conflict { message },
        _ => Error::Status {
            status,
            message,
            retry_after: retry_after(&headers),
            retry_safe: idempotent || status_means_not_processed(status),
        },
    }
}
