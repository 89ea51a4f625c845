//! Building answers: the response helpers every handler shares (a leaf: it imports no other
//! module of the server).

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode};
use axum::response::Response;
use oncelog_protocol::headers::{format_rfc3339, names, Expiry};
use oncelog_storage::StreamInfo;

/// Builds a response from a status and header pairs; values are always valid header text.
pub(crate) fn respond(status: StatusCode, pairs: Vec<(&'static str, String)>, body: Body) -> Response {
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
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
    for (name, limit) in [(names::STREAM_RETENTION_MAX_AGE, r.max_age_s), (names::STREAM_RETENTION_MAX_BYTES, r.max_bytes)] {
        if let Some(n) = limit {
            v.push((name, n.to_string()));
        }
    }
    v
}
