//! Headers every response carries, and the CORS preflight.

use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};

/// Names of headers set on every append's answer, built once: a name given as `&str` is
/// copied into a new allocation each time it is inserted (the `http` crate owns custom names).
pub(crate) mod name {
    use axum::http::HeaderName;
    use oncelog_protocol::headers::names;

    pub(crate) const STREAM_NEXT_OFFSET: HeaderName = HeaderName::from_static(names::STREAM_NEXT_OFFSET);
    pub(crate) const STREAM_CLOSED: HeaderName = HeaderName::from_static(names::STREAM_CLOSED);
    pub(crate) const PRODUCER_EPOCH: HeaderName = HeaderName::from_static(names::PRODUCER_EPOCH);
    pub(crate) const PRODUCER_SEQ: HeaderName = HeaderName::from_static(names::PRODUCER_SEQ);
    pub(crate) const X_CONTENT_TYPE_OPTIONS: HeaderName = HeaderName::from_static("x-content-type-options");
    pub(crate) const CROSS_ORIGIN_RESOURCE_POLICY: HeaderName = HeaderName::from_static("cross-origin-resource-policy");
}

/// Response headers a browser client must be allowed to read.
pub(crate) const EXPOSE: &str = "stream-next-offset, stream-cursor, stream-up-to-date, stream-closed, stream-ttl, \
stream-expires-at, stream-sse-data-encoding, producer-epoch, producer-seq, producer-expected-seq, \
producer-received-seq, producer-conflict, stream-earliest-offset, stream-retention-max-age, \
stream-retention-max-bytes, stream-compaction, etag, location, content-type, retry-after, www-authenticate";

/// Request headers a browser client may send.
const ALLOW_HEADERS: &str = "content-type, if-none-match, authorization, stream-ttl, stream-expires-at, \
stream-closed, stream-seq, stream-forked-from, stream-fork-offset, stream-fork-sub-offset, producer-id, \
producer-epoch, producer-seq, if-match, stream-expected-offset, idempotency-key, stream-trim-to, stream-retention-max-age, \
stream-retention-max-bytes, stream-compaction, stream-compact, last-event-id";

/// Which browser origins may read answers (`--cors-origins`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CorsOrigins {
    /// Any origin (`Access-Control-Allow-Origin: *`): the development default. Credentials are
    /// never allowed with it (and Oncelog's bearer tokens need none: they are headers).
    Any,
    /// Only these origins (`https://app.example.com`), echoed back when they ask, with
    /// `Vary: Origin` so caches keep answers per origin.
    List(Vec<String>),
}

impl CorsOrigins {
    /// `*` or a comma-separated list of origins.
    pub fn parse(text: &str) -> CorsOrigins {
        if text.trim() == "*" {
            return CorsOrigins::Any;
        }
        CorsOrigins::List(
            text.split(',').map(|o| o.trim().trim_end_matches('/').to_owned()).filter(|o| !o.is_empty()).collect(),
        )
    }
}

/// Answers a CORS preflight for any stream path, existing or not.
pub fn preflight(req: &HeaderMap) -> Response {
    let allow_headers = req
        .get("access-control-request-headers")
        .and_then(|v| v.to_str().ok())
        .map_or_else(|| ALLOW_HEADERS.to_owned(), |asked| format!("{ALLOW_HEADERS}, {asked}"));
    (
        StatusCode::NO_CONTENT,
        [
            ("access-control-allow-methods", "GET, HEAD, PUT, POST, DELETE, OPTIONS".to_owned()),
            ("access-control-allow-headers", allow_headers),
            ("access-control-max-age", "86400".to_owned()),
        ],
    )
        .into_response()
}
