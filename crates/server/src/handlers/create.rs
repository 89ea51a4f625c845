//! `PUT`: create a stream or a fork of one (or confirm an existing one).

use axum::body::Body;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::Response;
use bytes::Bytes;
use oncelog_protocol::content_type;
use oncelog_protocol::json::{self, EmptyArray};
use oncelog_storage::{
    CreateError, CreateOutcome, CreateRequest, Engine, ForkRequest, LookupError, RetentionPolicy, RetentionRequest,
};

use super::append::REVALIDATIONS;
use crate::error::ApiError;
use crate::reply;
use crate::request::{CreateHeaders, RequestError};
use crate::state::AppState;

/// `PUT`: creates the stream, or a fork of another, or confirms an existing one.
pub(super) async fn create<E: Engine>(
    st: &AppState<E>,
    path: &str,
    uri: &Uri,
    req_headers: &HeaderMap,
    h: CreateHeaders,
    body: Body,
) -> Result<Response, ApiError> {
    // With If-Match, PUT only confirms an existing stream (whose tail, when named, must match):
    // without a current representation the precondition fails.
    if let Some(cond) = &h.if_match {
        match st.engine.head(path, st.clock.now_ms()).await {
            Ok(info) if cond.as_ref().is_none_or(|t| t.contains(&info.tail)) => {}
            Ok(info) => return Err(LookupError::PreconditionFailed { tail: info.tail, closed: info.closed }.into()),
            Err(LookupError::NotFound | LookupError::Gone) => return Err(ApiError::PreconditionNoStream),
            Err(e) => return Err(e.into()),
        }
    }
    let body = crate::body::read(body, req_headers, st.config.body_limits()).await?;
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
            (None, Some(f)) => st.engine.head(&f.source, now_ms).await.ok().map(|i| i.config.content_type.clone()),
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
        crate::subs::after_write(st, path, st.clock.now_ms()).await;
    }
    let mut pairs = reply::meta_headers(&info);
    if status == StatusCode::CREATED {
        pairs.push(("location", location(st, uri, req_headers)));
    }
    Ok(reply::respond(status, pairs, Body::empty()))
}

/// The new stream's URL: under `--public-url` when set (the server behind a proxy), else the
/// connection's scheme and the authority the request was sent to (HTTP/2's `:authority`, which
/// the URI carries, or HTTP/1.1's `Host`).
fn location<E>(st: &AppState<E>, uri: &Uri, req_headers: &HeaderMap) -> String {
    let base = match &st.config.public_url {
        Some(public) => public.trim_end_matches('/').to_owned(),
        None => {
            let scheme = if st.config.tls.is_some() { "https" } else { "http" };
            let authority = crate::request::authority(uri, req_headers);
            // Without either (an HTTP/1.0 request), the address the server listens on.
            match authority {
                Some(a) => format!("{scheme}://{a}"),
                None => st.base_url.get().cloned().unwrap_or_else(|| format!("{scheme}://localhost")),
            }
        }
    };
    format!("{base}{}", uri.path())
}
