//! Trim, compact and delete: the operations that drop history or a whole stream.

use axum::body::Body;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use oncelog_protocol::headers::names;
use oncelog_protocol::{content_type, Offset};
use oncelog_storage::{Engine, ReadRequest, StreamInfo};

use crate::error::ApiError;
use crate::request::RequestError;
use crate::reply;
use crate::state::AppState;

/// A trim or a compaction writes nothing of the request's: no body, no write headers.
async fn refuse_writes<E: Engine>(st: &AppState<E>, req_headers: &HeaderMap, body: Body) -> Result<(), ApiError> {
    let writes = [names::PRODUCER_ID, names::PRODUCER_EPOCH, names::PRODUCER_SEQ, names::IDEMPOTENCY_KEY, names::IF_MATCH, names::STREAM_SEQ];
    let closes = oncelog_protocol::headers::closed_flag(req_headers.get(names::STREAM_CLOSED).and_then(|v| v.to_str().ok()));
    if closes || writes.iter().any(|h| req_headers.contains_key(*h)) {
        return Err(ApiError::TrimWithWrite);
    }
    if !crate::body::read(body, req_headers, st.config.body_limits()).await?.is_empty() {
        return Err(ApiError::TrimWithWrite);
    }
    Ok(())
}

/// `POST` with `Stream-Compact: true` and no body: replaces a State Protocol stream's history
/// with a snapshot at its tail (an Oncelog extension; see `oncelog_storage::compaction`).
pub(super) async fn compact<E: Engine>(st: &AppState<E>, path: &str, req_headers: &HeaderMap, body: Body) -> Result<Response, ApiError> {
    refuse_writes(st, req_headers, body).await?;
    let done = oncelog_storage::compaction::compact(st.engine.as_ref(), path, st.clock.now_ms()).await?;
    tracing::debug!(path, written = done.written, entities = done.entities, history = done.history_bytes, snapshot = done.snapshot_bytes, "compaction");
    let pairs = vec![(names::STREAM_EARLIEST_OFFSET, done.earliest.to_string()), (names::STREAM_NEXT_OFFSET, done.tail.to_string())];
    Ok(reply::respond(StatusCode::NO_CONTENT, pairs, Body::empty()))
}

/// `POST` with `Stream-Trim-To` and no body: moves the stream's earliest offset forward (an
/// Oncelog extension). A JSON stream is trimmed only at a message boundary.
pub(super) async fn trim<E: Engine>(
    st: &AppState<E>,
    path: &str,
    info: &StreamInfo,
    to: Offset,
    req_headers: &HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    refuse_writes(st, req_headers, body).await?;
    if content_type::is_json(&info.config.content_type) && to > info.earliest && to <= info.tail {
        let chunk = st.engine.read(ReadRequest::new(path, to, 1, st.clock.now_ms())).await?;
        if !chunk.aligned {
            return Err(RequestError::OffsetInsideMessage.into());
        }
    }
    let t = st.engine.trim(path, to, st.clock.now_ms()).await?;
    let pairs = vec![(names::STREAM_EARLIEST_OFFSET, t.earliest.to_string()), (names::STREAM_NEXT_OFFSET, t.tail.to_string())];
    Ok(reply::respond(StatusCode::NO_CONTENT, pairs, Body::empty()))
}

/// `DELETE`; with `If-Match`, only if nobody wrote since the tail named (decided by the engine
/// atomically with the delete).
pub(super) async fn delete<E: Engine>(st: &AppState<E>, path: &str, if_tail: Option<Vec<Offset>>) -> Result<Response, ApiError> {
    st.engine.delete_if(path, if_tail, st.clock.now_ms()).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}
