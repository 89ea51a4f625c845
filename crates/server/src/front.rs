//! The one service in front of the router, run for every request: it adds the connection's
//! peer address, asks the authentication hook (stream paths only), hands the resulting
//! [`Access`] to the handlers, counts the answer in the request metrics, and puts the CORS and
//! browser-security headers on every answer. Stream operations go from here to their handler
//! directly ([`StreamRoute`]); the router serves the rest.
//!
//! It also watches whether the request's body was read to its end. An answer given before that
//! (a `404`, `401` or `429` decided from the headers) leaves unread bytes on an HTTP/1.1
//! connection, which is then closed; the answer says so (`Connection: close`), so the client
//! knows not to send its next request on that connection.
//!
//! Written as one hand-made `tower::Service` rather than as `axum::middleware::from_fn` layers:
//! each of those boxes a future and clones the inner service per request, and a per-connection
//! `Extension` layer re-wraps every route. Together they were about 10% of the server's CPU per
//! append in `perf` (docs/BENCHMARKS.md).

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::http::{HeaderValue, Method, Request};
use axum::response::{IntoResponse, Response};
use axum::Router;
use tower_service::Service;

use crate::auth::{Access, Gate};
use crate::error::ApiError;
use crate::handlers::Caller;
use crate::headers::{self, CorsOrigins};
use crate::request_kind::Kind;

/// The client's address, in every request's extensions (for per-address limits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerAddr(pub std::net::SocketAddr);

/// What the front service needs besides the router; shared by every connection.
pub struct FrontConfig {
    pub gate: Gate,
    pub cors: CorsOrigins,
    /// Operational endpoints: neither authenticated nor counted in the request metrics.
    pub ops_paths: Vec<String>,
    /// `--access-log`: the request log at `info` (else at `debug`; `5xx` always).
    pub access_log: bool,
}

/// The stream operations (`/v1/stream/{path}`), called by the front service directly: see
/// [`crate::handlers::stream`].
pub type StreamRoute =
    Arc<dyn Fn(Request<Body>, Caller) -> Pin<Box<dyn Future<Output = Response> + Send>> + Send + Sync>;

/// The router behind the front service, for one connection.
#[derive(Clone)]
pub struct Front {
    router: Router,
    streams: StreamRoute,
    config: Arc<FrontConfig>,
    /// The connection's peer, when known (not in `app()` used alone).
    peer: Option<SocketAddr>,
}

impl Front {
    pub fn new(router: Router, streams: StreamRoute, config: FrontConfig) -> Self {
        Front { router, streams, config: Arc::new(config), peer: None }
    }

    /// The same service for a connection from `peer`.
    pub fn for_peer(&self, peer: SocketAddr) -> Self {
        Front {
            router: self.router.clone(),
            streams: self.streams.clone(),
            config: self.config.clone(),
            peer: Some(peer),
        }
    }
}

/// A request body that records when it was read to its end.
struct Watched<B> {
    inner: B,
    ended: Arc<AtomicBool>,
}

impl<B: http_body::Body + Unpin> http_body::Body for Watched<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<B::Data>, B::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) || self.inner.is_end_stream() {
            self.ended.store(true, Ordering::Relaxed);
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

/// Wraps a request's body when it has one (HTTP/1.x only: an HTTP/2 stream's unread body costs
/// its connection nothing); the flag says whether it was read to its end.
fn watch<B>(req: Request<B>) -> (Request<Body>, Option<Arc<AtomicBool>>)
where
    B: http_body::Body<Data = bytes::Bytes> + Send + Unpin + 'static,
    B::Error: Into<axum::BoxError>,
{
    let (parts, body) = req.into_parts();
    if body.is_end_stream() || parts.version >= axum::http::Version::HTTP_2 {
        return (Request::from_parts(parts, Body::new(body)), None);
    }
    let ended = Arc::new(AtomicBool::new(false));
    (Request::from_parts(parts, Body::new(Watched { inner: body, ended: ended.clone() })), Some(ended))
}

/// Says `Connection: close` on an answer given before its request's body was read.
fn close_if_unread(resp: &mut Response, body_ended: Option<&AtomicBool>) {
    if body_ended.is_some_and(|e| !e.load(Ordering::Relaxed)) {
        resp.headers_mut().insert(axum::http::header::CONNECTION, HeaderValue::from_static("close"));
    }
}

impl<B> Service<Request<B>> for Front
where
    B: http_body::Body<Data = bytes::Bytes> + Send + Unpin + 'static,
    B::Error: Into<axum::BoxError>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // The router is always ready.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let config = self.config.clone();
        let origin = req.headers().get(axum::http::header::ORIGIN).cloned();
        let (mut req, body_ended) = watch(req);
        if let Err(e) = crate::request::check_host(req.version(), req.headers()) {
            let mut resp = ApiError::from(e).into_response();
            decorate(&mut resp, &config.cors, origin);
            close_if_unread(&mut resp, body_ended.as_deref());
            return Box::pin(async move { Ok(resp) });
        }
        // Stream operations go to their handler directly, with what this service learnt of them
        // (`Caller`); the extensions carry it only for the router's handlers and for
        // authentication hooks, which read it from there (each insert is two allocations).
        let direct = crate::request::raw_stream_path(req.uri().path()).is_some();
        let via_extensions = !direct || !config.gate.auth.is_open();
        if let Some(peer) = self.peer.filter(|_| via_extensions) {
            req.extensions_mut().insert(PeerAddr(peer));
        }
        if config.ops_paths.iter().any(|p| p == req.uri().path()) {
            let fut = self.router.call(req);
            return Box::pin(async move {
                let mut resp = fut.await.unwrap_or_else(|never| match never {});
                decorate(&mut resp, &config.cors, origin);
                close_if_unread(&mut resp, body_ended.as_deref());
                Ok(resp)
            });
        }
        let method = req.method().clone();
        let version = req.version();
        let begun = crate::access_log::begin(&method, req.uri(), version, req.headers(), self.peer, config.access_log);
        // What the request is, decided once: access control and the handler both use it.
        let kind = Kind::of(&method, req.headers());
        if via_extensions {
            req.extensions_mut().insert(kind);
        }
        let admitted = if method == Method::OPTIONS {
            Ok((req, Access::default()))
        } else {
            let (parts, body) = req.into_parts();
            match config.gate.auth.authorize(&parts, config.gate.clock.now_ms()) {
                Ok(access) => Ok((Request::from_parts(parts, body), access)),
                Err(e) => Err(ApiError::Auth(e).into_response()),
            }
        };
        let fut = admitted.map(|(mut req, access)| {
            if direct {
                let caller = Caller::new(access, self.peer, kind, version);
                (self.streams)(req, caller)
            } else {
                if access != Access::default() {
                    req.extensions_mut().insert(access);
                }
                let fut = self.router.call(req);
                Box::pin(async move { fut.await.unwrap_or_else(|never| match never {}) })
            }
        });
        Box::pin(async move {
            let resp = match fut {
                Ok(fut) => {
                    let mut resp = fut.await;
                    if direct {
                        finish_route(&method, &mut resp);
                    }
                    resp
                }
                Err(refused) => refused,
            };
            crate::metrics::request(&method, resp.status());
            let mut resp = crate::access_log::finish(begun, resp);
            decorate(&mut resp, &config.cors, origin);
            close_if_unread(&mut resp, body_ended.as_deref());
            if version >= axum::http::Version::HTTP_2 {
                // Connection-specific headers have no place in HTTP/2 (RFC 9113 section 8.2.2):
                // an answer that closes an HTTP/1 connection leaves an HTTP/2 one as it is.
                resp.headers_mut().remove(axum::http::header::CONNECTION);
            }
            Ok(resp)
        })
    }
}

/// What the router does to every answer of a route, done for the stream route called without
/// it: a `Content-Length` where the body's size is known and none is set, and no body for `HEAD`
/// (its length stays).
fn finish_route(method: &Method, resp: &mut Response) {
    use http_body::Body as _;
    if !resp.headers().contains_key(axum::http::header::CONTENT_LENGTH) {
        if let Some(n) = resp.body().size_hint().exact() {
            let n = if n == 0 { HeaderValue::from_static("0") } else { crate::reply::value(n) };
            resp.headers_mut().insert(axum::http::header::CONTENT_LENGTH, n);
        }
    }
    if method == Method::HEAD {
        *resp.body_mut() = Body::empty();
    }
}

/// The CORS and browser-security headers of section 12.7.
fn decorate(resp: &mut Response, cors: &CorsOrigins, origin: Option<HeaderValue>) {
    let h = resp.headers_mut();
    h.reserve(5);
    h.insert(headers::name::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(headers::name::CROSS_ORIGIN_RESOURCE_POLICY, HeaderValue::from_static("cross-origin"));
    match cors {
        CorsOrigins::Any => {
            h.insert("access-control-allow-origin", HeaderValue::from_static("*"));
        }
        CorsOrigins::List(allowed) => {
            h.append("vary", HeaderValue::from_static("origin"));
            if let Some(o) = origin.filter(|o| o.to_str().is_ok_and(|o| allowed.iter().any(|a| a == o))) {
                h.insert("access-control-allow-origin", o);
            }
        }
    }
    h.insert("access-control-expose-headers", HeaderValue::from_static(headers::EXPOSE));
}
