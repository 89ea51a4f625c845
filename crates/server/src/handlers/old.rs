//! Thin handlers: parse the request into protocol types, make one engine call, render.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use oncelog_protocol::headers::{format_rfc3339, names, Expiry};
use oncelog_protocol::json::{self, EmptyArray};
use oncelog_protocol::digest::BodyDigest;
use oncelog_protocol::{content_type, Offset};
use oncelog_storage::{
    AppendError, AppendOutcome, AppendRequest, AppendStatus, CreateError, CreateOutcome, CreateRequest, Engine, ForkRequest,
    LookupError, RetentionPolicy, RetentionRequest, StreamInfo,
};

use crate::error::ApiError;
use crate::request::{AppendHeaders, CreateHeaders, RequestError};
use crate::{headers, metrics, read, AppState};

/// How often a write is re-validated when the stream it was framed for was replaced (deleted
/// and re-created) while its body was being read. Once is almost always enough; the bound only
/// stops a pathological delete/re-create loop from holding the request forever.
const REVALIDATIONS: usize = 3;

/// Every method on `/v1/stream/{path}`.
pub async fn stream<E: Engine>(
    State(st): State<AppState<E>>,
    Path(path): Path<String>,
    method: Method,
    uri: Uri,
    req_headers: HeaderMap,
    caller: Caller,
    body: Body,
) -> Response {
    let Caller { access, peer } = caller;
    let result = if path.is_empty() {
        Err(RequestError::EmptyPath.into())
    } else if path.len() > oncelog_protocol::headers::MAX_PATH_BYTES {
        Err(RequestError::PathTooLong.into())
    } else if path == "__ds" || path.starts_with("__ds/") {
        // The subscription API (sections 6 and 7).
        crate::subs::route(&st, &method, &uri, &req_headers, body, &access).await
    } else {
        match method {
            Method::GET => read::get(&st, &path, uri.query(), &req_headers, &access).await,
            Method::HEAD => head(&st, &path, &req_headers).await,
            Method::PUT => create(&st, &path, &uri, &req_headers, body).await,
            Method::POST => append(&st, &path, &req_headers, body, &access, peer).await,
            Method::DELETE => delete(&st, &path, &req_headers).await,
            Method::OPTIONS => Ok(headers::preflight(&req_headers)),
            _ => Err(ApiError::MethodNotAllowed),
        }
    };
    result.unwrap_or_else(IntoResponse::into_response)
}

/// Who is asking: what their credentials allow, and where from.
pub struct Caller {
    access: crate::Access,
    peer: Option<std::net::SocketAddr>,
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Caller {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, _: &S) -> Result<Self, Self::Rejection> {
        let access = parts.extensions.remove::<crate::Access>().unwrap_or_default();
        let peer = parts.extensions.get::<crate::listen::PeerAddr>().map(|p| p.0);
        Ok(Caller { access, peer })
    }
}

/// Who writes, for per-writer limits: the credentials' principal, else the client's address.
fn writer_key(access: &crate::Access, peer: Option<std::net::SocketAddr>) -> String {
    match (&access.principal, peer) {
        (Some(p), _) => p.clone(),
        (None, Some(peer)) => format!("addr:{}", peer.ip()),
        (None, None) => "unknown".to_owned(),
    }
}

/// Anything outside `/v1/stream/`.
pub async fn no_route(method: Method, req_headers: HeaderMap) -> Response {
    if method == Method::OPTIONS {
        return headers::preflight(&req_headers);
    }
    ApiError::NoRoute.into_response()
}

/// Reads a request body, refusing more than `limit` bytes with 413 and a client that pauses
/// longer than `pause` between two pieces with 408.
pub(crate) async fn body_bytes(body: Body, req_headers: &HeaderMap, limit: usize, pause: std::time::Duration) -> Result<Bytes, ApiError> {
    let declared = req_headers
        .get("content-length")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ApiError::PayloadTooLarge { limit });
    }
    let mut stream = body.into_data_stream();
    let mut buf = BytesMut::with_capacity(declared.map_or(0, |n| n as usize));
    while let Some(frame) = tokio::time::timeout(pause, stream.next()).await.map_err(|_| ApiError::BodyTimeout)? {
        let frame = frame.map_err(|_| ApiError::BodyRead)?;
        if buf.len() + frame.len() > limit {
            return Err(ApiError::PayloadTooLarge { limit });
        }
        buf.extend_from_slice(&frame);
    }
    Ok(buf.freeze())
}

/// After new data in `path`: the subscriptions linked to it are woken. A failure is only
/// logged: the write stands, and the dispatcher's periodic pass issues the wake.
pub(crate) async fn after_write<E: Engine>(st: &AppState<E>, path: &str, now_ms: i64) {
    if let Err(e) = st.subs.on_write(path, now_ms).await {
        tracing::warn!(stream = path, error = %e, "subscriptions not woken now; the dispatcher will retry");
    }
}

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

/// Metadata headers shared by HEAD, PUT responses.
fn meta_headers(info: &StreamInfo) -> Vec<(&'static str, String)> {
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

async fn head<E: Engine>(st: &AppState<E>, path: &str, req_headers: &HeaderMap) -> Result<Response, ApiError> {
    let info = st.engine.head(path, st.clock.now_ms()).await?;
    // The stream's entity tag for preconditions is its tail, as for conditional appends.
    if let Some(Some(tails)) = crate::request::if_match(req_headers)? {
        if !tails.contains(&info.tail) {
            return Err(LookupError::PreconditionFailed { tail: info.tail, closed: info.closed }.into());
        }
    }
    let mut h = meta_headers(&info);
    h.push(("cache-control", "no-store".into()));
    Ok(respond(StatusCode::OK, h, Body::empty()))
}

async fn create<E: Engine>(
    st: &AppState<E>,
    path: &str,
    uri: &Uri,
    req_headers: &HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let h = CreateHeaders::parse(req_headers)?;
    // With If-Match, PUT only confirms an existing stream (whose tail, when named, must match):
    // without a current representation the precondition fails.
    if let Some(cond) = crate::request::if_match(req_headers)? {
        match st.engine.head(path, st.clock.now_ms()).await {
            Ok(info) if cond.as_ref().is_none_or(|t| t.contains(&info.tail)) => {}
            Ok(info) => return Err(LookupError::PreconditionFailed { tail: info.tail, closed: info.closed }.into()),
            Err(LookupError::NotFound | LookupError::Gone) => return Err(ApiError::PreconditionNoStream),
            Err(e) => return Err(e.into()),
        }
    }
    let body = body_bytes(body, req_headers, st.config.max_append_bytes, st.config.body_read_timeout).await?;
    let fork = h.fork.map(|f| ForkRequest { source: f.source, offset: f.offset, sub_offset: f.sub_offset });
    // A compaction stream takes no retention from the defaults: retention would drop its
    // snapshot (asked for by name, it is refused).
    // (A fork of a compaction stream is one too.)
    let source_compacts = match &fork {
        Some(f) => st.engine.head(&f.source, st.clock.now_ms()).await.is_ok_and(|i| i.config.compaction),
        None => false,
    };
    let defaults = if h.compaction || source_compacts { RetentionPolicy::NONE } else { st.config.default_retention };
    let retention = RetentionRequest {
        policy: RetentionPolicy {
            max_age_s: h.retention_max_age.unwrap_or(defaults.max_age_s),
            max_bytes: h.retention_max_bytes.unwrap_or(defaults.max_bytes),
        },
        named_age: h.retention_max_age.is_some(),
        named_bytes: h.retention_max_bytes.is_some(),
    };
    let mut attempt = 0;
    let outcome = loop {
        attempt += 1;
        let now_ms = st.clock.now_ms();
        // The initial body is framed by the stream's content type: the request's, or for a fork
        // without one, the source's (a mismatch is the engine's 409). The engine re-checks the
        // framing decision, as the source may change before the create is applied.
        let effective_ct = match (&h.content_type, &fork) {
            (Some(ct), _) => Some(ct.clone()),
            (None, Some(f)) => st.engine.head(&f.source, now_ms).await.ok().map(|i| i.config.content_type),
            (None, None) => None,
        };
        let json_framed = effective_ct.as_deref().is_some_and(content_type::is_json) && !body.is_empty();
        let initial = if json_framed {
            Bytes::from(json::encode_body(&body, EmptyArray::Allowed).map_err(RequestError::from)?)
        } else {
            body.clone()
        };
        // The initial messages of a compaction stream (or of a fork of one) must fold too.
        if json_framed && (h.compaction || source_compacts) {
            oncelog_protocol::state::validate(&initial).map_err(RequestError::from)?;
        }
        let req = CreateRequest {
            path: path.to_owned(),
            content_type: h.content_type.clone(),
            expiry: h.expiry,
            fork: fork.clone(),
            retention,
            compaction: h.compaction,
            closed: h.closed,
            initial,
            json_framed,
            now_ms,
        };
        match st.engine.create(req).await {
            Err(CreateError::FramingMismatch) if attempt < REVALIDATIONS => continue,
            r => break r?,
        }
    };
    let (status, info) = match outcome {
        CreateOutcome::Created(info) => (StatusCode::CREATED, info),
        CreateOutcome::Existing(info) => (StatusCode::OK, info),
    };
    if status == StatusCode::CREATED && info.tail.0 > 0 {
        after_write(st, path, st.clock.now_ms()).await;
    }
    let mut pairs = meta_headers(&info);
    if status == StatusCode::CREATED {
        pairs.push(("location", location(st, uri, req_headers)));
    }
    Ok(respond(status, pairs, Body::empty()))
}

/// The new stream's URL: under `--public-url` when set (the server behind a proxy), else the
/// connection's scheme and the authority the request was sent to (HTTP/2's `:authority`, which
/// the URI carries, or HTTP/1.1's `Host`).
fn location<E>(st: &AppState<E>, uri: &Uri, req_headers: &HeaderMap) -> String {
    let base = match &st.config.public_url {
        Some(public) => public.trim_end_matches('/').to_owned(),
        None => {
            let scheme = if st.config.tls.is_some() { "https" } else { "http" };
            let authority = uri.authority().map(|a| a.as_str()).or_else(|| req_headers.get("host").and_then(|v| v.to_str().ok()));
            // Without either (an HTTP/1.0 request), the address the server listens on.
            match authority {
                Some(a) => format!("{scheme}://{a}"),
                None => st.base_url.get().cloned().unwrap_or_else(|| format!("{scheme}://localhost")),
            }
        }
    };
    format!("{base}{}", uri.path())
}

async fn append<E: Engine>(
    st: &AppState<E>,
    path: &str,
    req_headers: &HeaderMap,
    body: Body,
    access: &crate::Access,
    peer: Option<std::net::SocketAddr>,
) -> Result<Response, ApiError> {
    // Existence first: a missing stream is 404 whatever else is wrong with the request.
    let mut info = st.engine.head(path, st.clock.now_ms()).await?;
    if let Some(to) = req_headers.get(names::STREAM_TRIM_TO) {
        return trim(st, path, &info, to, req_headers, body).await;
    }
    if let Some(v) = req_headers.get(names::STREAM_COMPACT) {
        if !v.to_str().is_ok_and(|v| v.trim().eq_ignore_ascii_case("true")) {
            return Err(RequestError::from(oncelog_protocol::headers::HeaderError::InvalidCompact).into());
        }
        return compact(st, path, req_headers, body).await;
    }
    let h = AppendHeaders::parse(req_headers)?;
    let writer = st.rate.enabled().then(|| writer_key(access, peer));
    if let Some(w) = &writer {
        st.rate.append(w)?;
    }
    let body = body_bytes(body, req_headers, st.config.max_append_bytes, st.config.body_read_timeout).await?;
    if let Some(w) = &writer {
        st.rate.bytes(w, body.len())?;
    }
    if body.is_empty() && !h.close {
        return Err(match h.ignored_closed_value.clone() {
            Some(v) => RequestError::EmptyBodyClosedValue(v),
            None => RequestError::EmptyBody,
        }
        .into());
    }
    let ct = if body.is_empty() { None } else { Some(h.content_type.clone().ok_or(RequestError::MissingContentType)?) };
    // New data from a writer that can tell retries apart (a producer or a key) is 200.
    let has_producer = h.producer.is_some() || h.idempotency_key.is_some();
    let mut attempt = 0;
    let started = std::time::Instant::now();
    let result = loop {
        attempt += 1;
        // Frame as JSON only when both sides are JSON; any mismatch is the engine's 409. The
        // decision was made against `info`, so the request names that incarnation: if the path
        // was deleted and re-created meanwhile, the engine refuses it and it is decided again.
        let json_framed = ct.as_deref().is_some_and(|ct| content_type::is_json(ct) && content_type::is_json(&info.config.content_type));
        let data = if json_framed {
            Bytes::from(json::encode_body(&body, EmptyArray::Rejected).map_err(RequestError::from)?)
        } else {
            body.clone()
        };
        if info.config.compaction {
            // A compaction must be able to fold every message it meets.
            oncelog_protocol::state::validate(&data).map_err(RequestError::from)?;
        }
        // Hashed here, on the request's task, not on the engine's writer.
        let body_digest = (h.producer.is_some() || h.idempotency_key.is_some()).then(|| BodyDigest::of(&data));
        let req = AppendRequest {
            path: path.to_owned(),
            stream_id: Some(info.id),
            json_framed,
            content_type: ct.clone(),
            data,
            close: h.close,
            stream_seq: h.stream_seq.clone(),
            producer: h.producer.clone(),
            if_match: h.if_match.clone(),
            body_digest,
            idempotency_key: h.idempotency_key,
            now_ms: st.clock.now_ms(),
        };
        match st.engine.append(req).await {
            Err(AppendError::StreamChanged | AppendError::FramingMismatch) if attempt < REVALIDATIONS => {
                info = st.engine.head(path, st.clock.now_ms()).await?;
            }
            r => break r,
        }
    };
    // Once per request, whatever number of attempts it took.
    metrics::appended(&result, body.len(), started.elapsed());
    let out: AppendOutcome = result?;
    if out.status == AppendStatus::Appended && !body.is_empty() {
        after_write(st, path, st.clock.now_ms()).await;
    }
    // 200 marks new data from an idempotent producer or keyed writer; every other success is 204.
    let status = if out.status == AppendStatus::Appended && has_producer && !body.is_empty() {
        StatusCode::OK
    } else {
        StatusCode::NO_CONTENT
    };
    let mut pairs = vec![(names::STREAM_NEXT_OFFSET, out.next_offset.to_string())];
    if out.closed {
        pairs.push((names::STREAM_CLOSED, "true".into()));
    }
    if let Some((epoch, seq)) = out.producer {
        pairs.push((names::PRODUCER_EPOCH, epoch.to_string()));
        pairs.push((names::PRODUCER_SEQ, seq.to_string()));
    }
    Ok(respond(status, pairs, Body::empty()))
}

/// A trim or a compaction writes nothing of the request's: no body, no write headers.
async fn refuse_writes<E: Engine>(st: &AppState<E>, req_headers: &HeaderMap, body: Body) -> Result<(), ApiError> {
    let writes = [names::PRODUCER_ID, names::PRODUCER_EPOCH, names::PRODUCER_SEQ, names::IDEMPOTENCY_KEY, names::IF_MATCH, names::STREAM_SEQ];
    let closes = oncelog_protocol::headers::closed_flag(req_headers.get(names::STREAM_CLOSED).and_then(|v| v.to_str().ok()));
    if closes || writes.iter().any(|h| req_headers.contains_key(*h)) {
        return Err(ApiError::TrimWithWrite);
    }
    if !body_bytes(body, req_headers, st.config.max_append_bytes, st.config.body_read_timeout).await?.is_empty() {
        return Err(ApiError::TrimWithWrite);
    }
    Ok(())
}

/// `POST` with `Stream-Compact: true` and no body: replaces a State Protocol stream's history
/// with a snapshot at its tail (an Oncelog extension; see `oncelog_storage::compaction`).
async fn compact<E: Engine>(st: &AppState<E>, path: &str, req_headers: &HeaderMap, body: Body) -> Result<Response, ApiError> {
    refuse_writes(st, req_headers, body).await?;
    let done = oncelog_storage::compaction::compact(st.engine.as_ref(), path, st.clock.now_ms()).await?;
    tracing::debug!(path, written = done.written, entities = done.entities, history = done.history_bytes, snapshot = done.snapshot_bytes, "compaction");
    let pairs = vec![(names::STREAM_EARLIEST_OFFSET, done.earliest.to_string()), (names::STREAM_NEXT_OFFSET, done.tail.to_string())];
    Ok(respond(StatusCode::NO_CONTENT, pairs, Body::empty()))
}

/// `POST` with `Stream-Trim-To` and no body: moves the stream's earliest offset forward (an
/// Oncelog extension). A JSON stream is trimmed only at a message boundary.
async fn trim<E: Engine>(
    st: &AppState<E>,
    path: &str,
    info: &StreamInfo,
    to: &axum::http::HeaderValue,
    req_headers: &HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let to = to.to_str().ok().and_then(|v| Offset::parse(v.trim()).ok()).ok_or(RequestError::Offset(oncelog_protocol::offset::OffsetError::Malformed))?;
    refuse_writes(st, req_headers, body).await?;
    if content_type::is_json(&info.config.content_type) && to > info.earliest && to <= info.tail {
        let chunk = st.engine.read(oncelog_storage::ReadRequest::new(path, to, 1, st.clock.now_ms())).await?;
        if !chunk.aligned {
            return Err(RequestError::OffsetInsideMessage.into());
        }
    }
    let t = st.engine.trim(path, to, st.clock.now_ms()).await?;
    let pairs = vec![(names::STREAM_EARLIEST_OFFSET, t.earliest.to_string()), (names::STREAM_NEXT_OFFSET, t.tail.to_string())];
    Ok(respond(StatusCode::NO_CONTENT, pairs, Body::empty()))
}

async fn delete<E: Engine>(st: &AppState<E>, path: &str, req_headers: &HeaderMap) -> Result<Response, ApiError> {
    // Conditional: deleted only if nobody wrote since the tail named, decided by the engine
    // atomically with the delete.
    let if_tail = crate::request::if_match(req_headers)?.flatten();
    st.engine.delete_if(path, if_tail, st.clock.now_ms()).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// The offset a read starts from, checked against the tail.
pub(crate) fn start_offset(param: oncelog_protocol::OffsetParam, info: &StreamInfo) -> Result<Offset, ApiError> {
    let tail = info.tail;
    let from = match param {
        // The beginning is where the stream can still be read from.
        oncelog_protocol::OffsetParam::Start => info.earliest,
        oncelog_protocol::OffsetParam::Now => tail,
        oncelog_protocol::OffsetParam::At(o) => o,
    };
    if from > tail {
        return Err(RequestError::OffsetBeyondTail.into());
    }
    oncelog_storage::rules::readable_from(info.earliest, from)?;
    Ok(from)
}
