//! `POST` of data: append and close. The operation already looked the stream up; the write is one engine call.

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use bytes::Bytes;
use oncelog_protocol::content_type;
use oncelog_protocol::digest::BodyDigest;
use oncelog_protocol::json::{self, EmptyArray};
use oncelog_storage::{AppendError, AppendOutcome, AppendRequest, AppendStatus, Engine, StreamInfo};

use super::Caller;
use crate::auth::scope::Op;
use crate::auth::AuthError;
use crate::error::ApiError;
use crate::headers::name;
use crate::request::{AppendHeaders, RequestError};
use crate::state::AppState;
use crate::{metrics, reply};

/// How often a write is re-validated when the stream it was framed for was replaced (deleted
/// and re-created) while its body was being read. Once is almost always enough; the bound only
/// stops a pathological delete/re-create loop from holding the request forever.
pub(super) const REVALIDATIONS: usize = 3;

/// An append's body as its stream stores it, the same for a `POST` and a transactional commit's
/// output ([`crate::subs`]).
pub(crate) struct Stored {
    /// Framed as JSON: only when the request's and the stream's types both are JSON (any other
    /// mismatch is the engine's 409).
    pub json_framed: bool,
    pub data: Bytes,
    /// For a writer that can tell retries apart (a producer or a key): hashed here, on the
    /// request's task, not on the engine's writer.
    pub body_digest: Option<BodyDigest>,
}

/// Frames `body` for the stream `info` ([`Stored`]); on a compacted stream every message must be
/// a State Protocol message (a compaction must be able to fold every message it meets).
pub(crate) fn stored_body(
    info: &StreamInfo,
    content_type: Option<&str>,
    body: &Bytes,
    digest: bool,
) -> Result<Stored, RequestError> {
    let json_framed =
        content_type.is_some_and(|ct| content_type::is_json(ct) && content_type::is_json(&info.config.content_type));
    let data = match json_framed {
        true => Bytes::from(json::encode_body(body, EmptyArray::Rejected)?),
        false => body.clone(),
    };
    if info.config.compaction {
        oncelog_protocol::state::validate(&data)?;
    }
    let body_digest = digest.then(|| BodyDigest::of(&data));
    Ok(Stored { json_framed, data, body_digest })
}

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
        let Stored { json_framed, data, body_digest } = stored_body(&info, ct.as_deref(), &body, has_producer)?;
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use oncelog_protocol::Offset;
    use oncelog_storage::StreamConfig;

    use super::*;

    fn stream(content_type: &str, compaction: bool) -> StreamInfo {
        let config = StreamConfig {
            content_type: content_type.into(),
            expiry: Default::default(),
            retention: Default::default(),
            compaction,
        };
        StreamInfo { id: 1, config: Arc::new(config), tail: Offset(0), closed: false, earliest: Offset(0) }
    }

    #[test]
    fn a_body_is_stored_as_json_only_when_both_types_are_json() {
        let body = Bytes::from_static(b"[1,2]");
        let framed =
            stored_body(&stream("application/json", false), Some("application/json"), &body, true).expect("framed");
        let expected = Bytes::from(json::encode_body(&body, EmptyArray::Rejected).expect("encodes"));
        assert!(framed.json_framed);
        assert_ne!(expected, body);
        assert_eq!(framed.data, expected);
        assert_eq!(framed.body_digest, Some(BodyDigest::of(&expected)));
        // A text stream stores the bytes as sent; no digest unless asked for.
        let plain = stored_body(&stream("text/plain", false), Some("application/json"), &body, false).expect("plain");
        assert!(!plain.json_framed);
        assert_eq!((plain.data, plain.body_digest), (body, None));
        let empty = stored_body(
            &stream("application/json", false),
            Some("application/json"),
            &Bytes::from_static(b"[]"),
            false,
        );
        assert!(matches!(empty, Err(RequestError::Json(_))));
    }

    #[test]
    fn a_compacted_stream_stores_state_protocol_messages_only() {
        let compacted = stream("application/json", true);
        let r = stored_body(&compacted, Some("application/json"), &Bytes::from_static(b"{\"not\":\"state\"}"), false);
        assert!(matches!(r, Err(RequestError::NotStateProtocol(_))));
        let message = Bytes::from_static(br#"{"type":"user","key":"a","value":1,"headers":{"operation":"insert"}}"#);
        assert!(stored_body(&compacted, Some("application/json"), &message, false).is_ok());
    }
}
