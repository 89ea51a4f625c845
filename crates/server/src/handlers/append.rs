//! `POST` of data: append and close. The operation already looked the stream up; the write is one engine call.

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use oncelog_storage::{AppendError, AppendOutcome, AppendRequest, AppendStatus, Engine, StreamInfo};

use super::Caller;
use crate::auth::scope::Op;
use crate::auth::AuthError;
use crate::error::ApiError;
use crate::headers::name;
use crate::request::{AppendHeaders, RequestError};
use crate::state::AppState;
use crate::stored_body::Stored;
use crate::{metrics, reply};

/// How often a write is re-validated when the stream it was framed for was replaced (deleted
/// and re-created) while its body was being read. Once is almost always enough; the bound only
/// stops a pathological delete/re-create loop from holding the request forever.
pub(super) const REVALIDATIONS: usize = 3;

/// `POST` with a body (an append, closing the stream too when it says so) or without one and
/// `Stream-Closed: true` (a close). `info`: the stream as it was when the request arrived (the
/// body is framed for it; if it was replaced meanwhile, the engine says so and it is framed
/// again). `as_close`: the request was classified (and its access checked) as a bodiless close
/// ([`crate::request_kind::Kind::Close`]) from its headers.
#[allow(clippy::too_many_arguments)]
pub(super) async fn append<E: Engine>(
    st: &AppState<E>,
    path: &str,
    mut info: StreamInfo,
    h: AppendHeaders,
    req_headers: &HeaderMap,
    body: Body,
    caller: &Caller,
    as_close: bool,
) -> Result<Response, ApiError> {
    let writer = st.rate.enabled().then(|| caller.writer_key());
    if let Some(w) = &writer {
        st.rate.append(w)?;
    }
    let body = crate::body::read(body, req_headers, st.config.body_limits()).await?;
    // Framing headers cannot tell a bodiless close: an HTTP/2 body needs neither
    // `Content-Length` nor `Transfer-Encoding`. Data that did arrive is an append, whatever the
    // headers said, and needs the `append` grant.
    if as_close && !body.is_empty() && !caller.access.permits(path, Op::Append) {
        return Err(ApiError::Auth(if st.auth.hides_forbidden() {
            AuthError::Hidden
        } else {
            AuthError::Forbidden { op: Op::Append, stream: path.to_owned() }
        }));
    }
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
        // Framed against `info`, so the request names that incarnation: if the path was deleted
        // and re-created meanwhile, the engine refuses it and it is framed again.
        let Stored { json_framed, data, body_digest } =
            crate::stored_body::stored_body(&info, ct.as_deref(), &body, has_producer)?;
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
            expected_offset: h.expected_offset,
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
    if let (Some(series), Ok(o)) = (&st.stream_metrics, &result) {
        if o.status == AppendStatus::Appended {
            series.appended(path, body.len());
        }
    }
    let out: AppendOutcome = result?;
    if out.status == AppendStatus::Appended && !body.is_empty() {
        crate::subs::after_write(st, path, st.clock.now_ms()).await;
    }
    let status = if out.is_new_identified_data(has_producer, !body.is_empty()) {
        StatusCode::OK
    } else {
        StatusCode::NO_CONTENT
    };
    let mut resp = reply::with_headers(status, 4, Body::empty());
    let headers = resp.headers_mut();
    headers.insert(name::STREAM_NEXT_OFFSET, reply::value(out.next_offset));
    if out.closed {
        headers.insert(name::STREAM_CLOSED, HeaderValue::from_static("true"));
    }
    if let Some((epoch, seq)) = out.producer {
        headers.insert(name::PRODUCER_EPOCH, reply::value(epoch));
        headers.insert(name::PRODUCER_SEQ, reply::value(seq));
    }
    Ok(resp)
}
