//! The request log: one line per stream request, written when its answer ends (a live read's
//! when the reader leaves or the server ends it), with what an operator asks first: method,
//! path, status, bytes sent, duration, the peer, the producer's id / epoch / seq when the request
//! carries them, and the reason of a `4xx` / `5xx`.
//!
//! Level: `debug` (target `oncelog_server::access`), or `info` with `--access-log`; a `5xx` is
//! always logged, at `warn`. When neither applies a request costs one check of the level and a
//! clone of its URI (reference counted): the answer's body is wrapped only for a line to write.
//!
//! Never logged: request and answer bodies, headers (tokens are in `Authorization`), and the
//! values of the query parameters that carry a credential (`sig`, `token`, `access_token`,
//! `signature`; written `***`).

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use axum::body::Body;
use axum::http::{HeaderMap, Method, Uri, Version};
use axum::response::Response;

/// Why a request was refused or failed: the error's own words, put on the answer by
/// [`crate::error::ApiError`] so that the log line can say them without reading the body.
#[derive(Debug, Clone)]
pub struct Reason(pub Arc<str>);

/// Query parameters whose values are credentials.
const SECRET_PARAMS: [&str; 4] = ["sig", "token", "access_token", "signature"];

/// A request as it arrived, for its line.
pub struct Begun {
    method: Method,
    uri: Uri,
    version: Version,
    peer: Option<SocketAddr>,
    /// `Producer-Id`, `-Epoch`, `-Seq`, read only when a line will be written.
    producer: Option<[String; 3]>,
    at: Instant,
    /// `--access-log`: the line at `info`.
    info: bool,
}

/// Whether a request's line is written whatever its status (below `5xx`).
fn enabled(info: bool) -> bool {
    info || tracing::enabled!(target: "oncelog_server::access", tracing::Level::DEBUG)
}

/// Notes a request's start. Cheap when the log is off: the method and URI are reference-counted
/// clones, the producer headers are read only when a line will be written.
pub fn begin(
    method: &Method,
    uri: &Uri,
    version: Version,
    headers: &HeaderMap,
    peer: Option<SocketAddr>,
    info: bool,
) -> Begun {
    let producer = enabled(info).then(|| producer(headers)).flatten();
    Begun { method: method.clone(), uri: uri.clone(), version, peer, producer, at: Instant::now(), info }
}

fn producer(h: &HeaderMap) -> Option<[String; 3]> {
    let get = |n: &str| h.get(n).map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let id = get(oncelog_protocol::headers::names::PRODUCER_ID)?;
    let epoch = get(oncelog_protocol::headers::names::PRODUCER_EPOCH).unwrap_or_default();
    let seq = get(oncelog_protocol::headers::names::PRODUCER_SEQ).unwrap_or_default();
    Some([id, epoch, seq])
}

/// Hands `resp` back with its line to be written when its body ends (or at once, for a body
/// known to be empty), or as it is when no line is due.
pub fn finish(begun: Begun, mut resp: Response) -> Response {
    let status = resp.status();
    if !status.is_server_error() && !enabled(begun.info) {
        return resp;
    }
    let reason = resp.extensions().get::<Reason>().map(|r| r.0.clone());
    let line = Line { begun, status: status.as_u16(), reason, bytes: 0, ended: false };
    let body = std::mem::take(resp.body_mut());
    *resp.body_mut() = Body::new(Logged { inner: body, line });
    resp
}

/// An answer's body that counts what it sent and writes the request's line when dropped:
/// after its end, or when the client left (then `ended=false`).
struct Logged {
    inner: Body,
    line: Line,
}

struct Line {
    begun: Begun,
    status: u16,
    reason: Option<Arc<str>>,
    bytes: u64,
    /// The body was sent to its end (false: the client left or the connection failed first).
    ended: bool,
}

impl http_body::Body for Logged {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, axum::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    self.line.bytes += data.len() as u64;
                }
                if self.inner.is_end_stream() {
                    self.line.ended = true;
                }
            }
            Poll::Ready(None) => self.line.ended = true,
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Logged {
    fn drop(&mut self) {
        if http_body::Body::is_end_stream(&self.inner) {
            self.line.ended = true;
        }
        self.line.write();
    }
}

impl Line {
    fn write(&self) {
        let b = &self.begun;
        let path = redacted(&b.uri);
        let duration_ms = u64::try_from(b.at.elapsed().as_millis()).unwrap_or(u64::MAX);
        let peer = b.peer.map(|p| p.to_string()).unwrap_or_default();
        let (pid, pepoch, pseq) = match &b.producer {
            Some([id, epoch, seq]) => (id.as_str(), epoch.as_str(), seq.as_str()),
            None => ("", "", ""),
        };
        let reason = self.reason.as_deref().unwrap_or("");
        macro_rules! line {
            ($level:expr) => {
                tracing::event!(
                    target: "oncelog_server::access",
                    $level,
                    method = %b.method,
                    path = %path,
                    status = self.status,
                    bytes = self.bytes,
                    duration_ms,
                    completed = self.ended,
                    peer = %peer,
                    version = ?b.version,
                    producer_id = pid,
                    producer_epoch = pepoch,
                    producer_seq = pseq,
                    reason,
                    "request"
                )
            };
        }
        if self.status >= 500 {
            line!(tracing::Level::WARN);
        } else if b.info {
            line!(tracing::Level::INFO);
        } else {
            line!(tracing::Level::DEBUG);
        }
    }
}

/// The path and query with credential parameters' values replaced by `***`.
fn redacted(uri: &Uri) -> String {
    let path = uri.path();
    let Some(query) = uri.query() else { return path.to_owned() };
    let mut out = String::with_capacity(path.len() + query.len() + 1);
    out.push_str(path);
    out.push('?');
    for (i, pair) in query.split('&').enumerate() {
        if i > 0 {
            out.push('&');
        }
        match pair.split_once('=') {
            // A percent-encoded name may decode to one of them: hidden too.
            Some((k, _)) if k.contains('%') || SECRET_PARAMS.iter().any(|s| k.eq_ignore_ascii_case(s)) => {
                out.push_str(k);
                out.push_str("=***");
            }
            _ => out.push_str(pair),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_in_the_query_are_not_written() {
        let uri: Uri =
            "/v1/stream/a?offset=-1&live=sse&expires=17&sig=Qm9vYWJj&token=abc&%73ig=x".parse().expect("uri");
        assert_eq!(redacted(&uri), "/v1/stream/a?offset=-1&live=sse&expires=17&sig=***&token=***&%73ig=***");
        let uri: Uri = "/v1/stream/a".parse().expect("uri");
        assert_eq!(redacted(&uri), "/v1/stream/a");
    }
}
