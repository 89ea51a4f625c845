//! Building answers: the response helpers every handler shares (a leaf: it imports no other
//! module of the server).

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode};
use axum::response::Response;
use oncelog_protocol::headers::{format_rfc3339, names, Expiry};
use oncelog_storage::StreamInfo;

/// Headers every answer gets on its way out (`Content-Length`, the CORS and browser-security
/// headers, `Connection`): room kept for them when an answer is built, so that its header map
/// is allocated once.
const ADDED_ON_THE_WAY_OUT: usize = 7;

/// An answer with room for `headers` headers of its own (and those added on the way out).
pub(crate) fn with_headers(status: StatusCode, headers: usize, body: Body) -> Response {
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    *resp.headers_mut() = axum::http::HeaderMap::with_capacity(headers + ADDED_ON_THE_WAY_OUT);
    resp
}

/// `v` as a header value, formatted without an intermediate `String` (one allocation: the
/// value's own). For values that are always header text (numbers, offsets).
pub(crate) fn value(v: impl std::fmt::Display) -> HeaderValue {
    use std::io::Write as _;
    let mut buf = [0u8; 64];
    let mut cursor = std::io::Cursor::new(&mut buf[..]);
    if write!(cursor, "{v}").is_ok() {
        let n = usize::try_from(cursor.position()).unwrap_or(0);
        if let Ok(value) = HeaderValue::from_bytes(&buf[..n]) {
            return value;
        }
    }
    // Longer than the buffer (or not header text, which callers never pass).
    HeaderValue::from_str(&v.to_string()).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// Builds a response from a status and header pairs; values are always valid header text.
pub(crate) fn respond(status: StatusCode, pairs: Vec<(&'static str, String)>, body: Body) -> Response {
    let mut resp = with_headers(status, pairs.len(), body);
    let h = resp.headers_mut();
    for (name, value) in pairs {
        if let Ok(v) = HeaderValue::from_str(&value) {
            h.insert(name, v);
        }
    }
    resp
}

/// A JSON answer.
pub(crate) fn json(status: StatusCode, v: &serde_json::Value) -> Response {
    respond(status, vec![("content-type", "application/json".into())], Body::from(v.to_string()))
}

/// `204` with no headers of its own.
pub(crate) fn no_content() -> Response {
    respond(StatusCode::NO_CONTENT, vec![], Body::empty())
}

/// Metadata headers shared by HEAD, PUT responses.
pub(crate) fn meta_headers(info: &StreamInfo) -> Vec<(&'static str, String)> {
    let mut v = vec![
        ("content-type", info.config.content_type.clone()),
        (names::STREAM_NEXT_OFFSET, info.tail.to_string()),
        (names::STREAM_EARLIEST_OFFSET, info.earliest.to_string()),
    ];
    match info.config.expiry {
        Expiry::Never => {}
        Expiry::Ttl(s) => v.push((names::STREAM_TTL, s.to_string())),
        Expiry::At(ms) => v.push((names::STREAM_EXPIRES_AT, format_rfc3339(ms))),
    }
    if info.closed {
        v.push((names::STREAM_CLOSED, "true".into()));
    }
    if info.config.compaction {
        v.push((names::STREAM_COMPACTION, "state".into()));
    }
    let r = info.config.retention;
    for (name, limit) in
        [(names::STREAM_RETENTION_MAX_AGE, r.max_age_s), (names::STREAM_RETENTION_MAX_BYTES, r.max_bytes)]
    {
        if let Some(n) = limit {
            v.push((name, n.to_string()));
        }
    }
    v
}
