//! Headers every response carries, and the CORS preflight.

use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

/// Response headers a browser client must be allowed to read.
const EXPOSE: &str = "stream-next-offset, stream-cursor, stream-up-to-date, stream-closed, stream-ttl, \
stream-expires-at, stream-sse-data-encoding, producer-epoch, producer-seq, producer-expected-seq, \
producer-received-seq, etag, location, content-type";

/// Request headers a browser client may send.
const ALLOW_HEADERS: &str = "content-type, if-none-match, authorization, stream-ttl, stream-expires-at, \
stream-closed, stream-seq, stream-forked-from, stream-fork-offset, stream-fork-sub-offset, producer-id, \
producer-epoch, producer-seq";

/// Adds CORS and browser-security headers (section 12.7) to every response.
pub async fn common(mut resp: Response) -> Response {
    let h = resp.headers_mut();
    h.insert("x-content-type-options", HeaderValue::from_static("nosniff"));
    h.insert("cross-origin-resource-policy", HeaderValue::from_static("cross-origin"));
    h.insert("access-control-allow-origin", HeaderValue::from_static("*"));
    h.insert("access-control-expose-headers", HeaderValue::from_static(EXPOSE));
    resp
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
