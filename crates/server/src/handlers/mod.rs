//! The stream operations: the one route under `/v1/stream/` parses its request into an
//! [`Operation`] (from the [`Kind`] the front service classified) and hands it to that
//! operation's handler — each thin: typed arguments in (the stream looked up once where the operation needs it), one engine call, an answer out.
//!
//! - [`crate::read`]: read (catch-up, long-poll, SSE) and head;
//! - `create`: create and fork;
//! - `append`: append and close;
//! - `manage`: trim, compact and delete;
//! - [`crate::subs`]: the subscription API under `__ds/`;
//! - [`crate::listing`]: the stream listing, `__ds/streams`.

mod append;
mod create;
mod manage;

use axum::body::Body;
use axum::http::{HeaderMap, Method, Request, Uri};
use axum::response::{IntoResponse, Response};
use oncelog_storage::Engine;

use crate::error::ApiError;
use crate::request::{self, AppendHeaders, CreateHeaders, ReadQuery, RequestError};
use crate::request_kind::{Kind, Operation, SubCall};
use crate::state::AppState;
use crate::{headers, read};

/// Every request under `/v1/stream/` with a path after it, called by the front service directly
/// rather than through the router: one boxed future per request instead of the router's
/// matching, its URL-parameter map and the copies its extractors make (the header map, the URI,
/// the method) — about a tenth of the allocations of an append (docs/design/issue-33-plan.md,
/// step 5). The front service calls it for a request with a [`request::raw_stream_path`].
pub async fn stream<E: Engine>(st: AppState<E>, req: Request<Body>, caller: Caller) -> Response {
    let (parts, body) = req.into_parts();
    let raw = request::raw_stream_path(parts.uri.path()).unwrap_or_default();
    let path = match request::decode_stream_path(raw) {
        Ok(path) => path,
        Err(e) => return ApiError::from(e).into_response(),
    };
    dispatch(&st, &path, &parts.method, &parts.uri, &parts.headers, caller, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn dispatch<E: Engine>(
    st: &AppState<E>,
    path: &str,
    method: &Method,
    uri: &Uri,
    h: &HeaderMap,
    caller: Caller,
    body: Body,
) -> Result<Response, ApiError> {
    if path.is_empty() {
        return Err(RequestError::EmptyPath.into());
    }
    if path.len() > oncelog_protocol::headers::MAX_PATH_BYTES {
        return Err(RequestError::PathTooLong.into());
    }
    if oncelog_subscriptions::reserved(path) {
        // The stream listing, else the subscription API (sections 6 and 7); both routed on the
        // raw path, as access control decided them.
        if SubCall::parse(method, uri.path()) == Ok(SubCall::Streams) {
            return Box::pin(crate::listing::streams(st, uri.query(), &caller.access)).await;
        }
        return Ok(Box::pin(crate::subs::route(st, method, uri, h, body, &caller.access)).await?);
    }
    let kind = caller.kind;
    // A write is framed for the stream as this node last saw it when the engine keeps that (a
    // `head` is a database round trip on PostgreSQL); the engine judges the write against the
    // stream as it is. A refusal the server makes itself is checked against a fresh `head`
    // first, so a missing stream is still 404 whatever else is wrong (the engine's own answers,
    // a 503 among them, stand as they are).
    let seen = if matches!(kind, Kind::Append { .. } | Kind::Close) { st.engine.last_seen(path) } else { None };
    let unchecked = seen.is_some();
    // Every operation but the append is boxed: a future holds the state of its largest branch,
    // and this one is moved into the heap once per request (the front service boxes it), so
    // unboxed reads and creates made every append copy kilobytes (`perf`: 1.4% of the CPU).
    let result = async {
        match operation(st, kind, path, uri, h, seen).await? {
            Operation::Read { info, query } => {
                Box::pin(read::get(st, path, info, query, h, &caller.access, caller.own_connection())).await
            }
            Operation::Head { info, if_match } => read::head(info, if_match),
            Operation::Create(args) | Operation::Fork(args) => {
                Box::pin(create::create(st, path, uri, h, args, body)).await
            }
            Operation::Append { info, headers } => {
                append::append(st, path, info, headers, h, body, &caller, false).await
            }
            Operation::Close { info, headers } => append::append(st, path, info, headers, h, body, &caller, true).await,
            Operation::Trim { info, to } => Box::pin(manage::trim(st, path, &info, to, h, body)).await,
            Operation::Compact { .. } => Box::pin(manage::compact(st, path, h, body)).await,
            Operation::Delete { if_tail, purge } => {
                Box::pin(manage::delete(st, path, oncelog_storage::DeleteRequest { if_tail, purge })).await
            }
            Operation::Preflight => Ok(headers::preflight(h)),
        }
    }
    .await;
    match result {
        Err(refused) if oncelog_storage::rules::refusal_needs_lookup(unchecked, refused.from_engine()) => {
            st.engine.head(path, st.clock.now_ms()).await?;
            Err(refused)
        }
        r => r,
    }
}

/// The request's operation on the stream at `path`, with its typed arguments. Operations on an
/// existing stream look it up first (`seen`: a write's stream as last seen, see
/// [`Engine::last_seen`]): a missing stream is `404` whatever else is wrong.
async fn operation<E: Engine>(
    st: &AppState<E>,
    kind: Kind,
    path: &str,
    uri: &Uri,
    h: &HeaderMap,
    seen: Option<oncelog_storage::StreamInfo>,
) -> Result<Operation, ApiError> {
    let query = uri.query();
    let info = match (kind, seen) {
        (Kind::Append { .. } | Kind::Close, Some(info)) => info,
        (Kind::Read | Kind::Head | Kind::Append { .. } | Kind::Close | Kind::Trim | Kind::Compact, _) => {
            st.engine.head(path, st.clock.now_ms()).await?
        }
        (Kind::Create, _) => return Ok(Operation::Create(CreateHeaders::parse(h, request::authority(uri, h))?)),
        (Kind::Fork, _) => return Ok(Operation::Fork(CreateHeaders::parse(h, request::authority(uri, h))?)),
        (Kind::Delete, _) => {
            return Ok(Operation::Delete { if_tail: request::if_match(h)?.flatten(), purge: manage::purge(query)? })
        }
        (Kind::Preflight, _) => return Ok(Operation::Preflight),
        (Kind::NotAllowed, _) => return Err(ApiError::MethodNotAllowed),
    };
    Ok(match kind {
        Kind::Read => Operation::Read { info, query: ReadQuery::parse(query)? },
        Kind::Head => Operation::Head { info, if_match: request::if_match(h)? },
        Kind::Close => Operation::Close { info, headers: AppendHeaders::parse(h)? },
        Kind::Trim => Operation::Trim { info, to: request::trim_to(h)? },
        Kind::Compact => {
            request::compact(h)?;
            Operation::Compact { info }
        }
        _ => Operation::Append { info, headers: AppendHeaders::parse(h)? },
    })
}

/// Who is asking: what their credentials allow, where from, and the request's kind as the
/// front service classified it.
pub struct Caller {
    access: crate::auth::Access,
    peer: Option<std::net::SocketAddr>,
    kind: Kind,
    version: axum::http::Version,
}

impl Caller {
    /// What the front service learnt of a request before handing it over.
    pub(crate) fn new(
        access: crate::auth::Access,
        peer: Option<std::net::SocketAddr>,
        kind: Kind,
        version: axum::http::Version,
    ) -> Self {
        Caller { access, peer, kind, version }
    }

    /// Whether the request holds its connection for as long as it is answered (HTTP/1: a live
    /// reader takes one of `--max-connections`; HTTP/2 requests share theirs).
    fn own_connection(&self) -> bool {
        self.version < axum::http::Version::HTTP_2
    }

    /// Who writes, for per-writer limits: the credentials' principal, else the client's address.
    fn writer_key(&self) -> String {
        match (&self.access.principal, self.peer) {
            (Some(p), _) => p.clone(),
            (None, Some(peer)) => format!("addr:{}", peer.ip()),
            (None, None) => "unknown".to_owned(),
        }
    }
}

/// Anything outside `/v1/stream/`.
pub async fn no_route(method: Method, req_headers: HeaderMap) -> Response {
    if method == Method::OPTIONS {
        return headers::preflight(&req_headers);
    }
    ApiError::NoRoute.into_response()
}

#[cfg(test)]
mod tests {
    /// The future of a stream request is moved into the heap once per request: it stays small
    /// when only the append is inline (reads, creates, the subscription API and the wake of
    /// subscriptions after a write are boxed).
    #[test]
    fn the_stream_future_holds_the_append_path_only() {
        fn size<F: std::future::Future>(_: &F) -> usize {
            std::mem::size_of::<F>()
        }
        let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        let _guard = rt.enter();
        let dir = tempfile::tempdir().expect("dir");
        let engine = oncelog_log::LogEngine::open(oncelog_log::LogOptions::new(dir.path())).expect("engine");
        let state = crate::AppState::new(std::sync::Arc::new(engine), crate::ServerConfig::default());
        let req = axum::http::Request::new(axum::body::Body::empty());
        let caller =
            super::Caller::new(Default::default(), None, crate::request_kind::Kind::Read, axum::http::Version::HTTP_11);
        let n = size(&super::stream(state, req, caller));
        // 3,008 bytes in a debug build (the tests' profile) once the subscription wake after an
        // append was boxed; 6,240 before.
        assert!(n <= 4096, "the stream future is {n} bytes");
    }
}
