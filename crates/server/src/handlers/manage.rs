//! Trim, compact and delete: the operations that drop history or a whole stream.

use axum::body::Body;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use oncelog_protocol::headers::names;
use oncelog_protocol::{content_type, Offset};
use oncelog_storage::{DeleteRequest, Engine, ReadRequest, StreamInfo};

use crate::error::ApiError;
use crate::reply;
use crate::request::RequestError;
use crate::state::AppState;

/// A trim or a compaction writes nothing of the request's: no body, no write headers.
async fn refuse_writes<E: Engine>(st: &AppState<E>, req_headers: &HeaderMap, body: Body) -> Result<(), ApiError> {
    let writes = [
        names::PRODUCER_ID,
        names::PRODUCER_EPOCH,
        names::PRODUCER_SEQ,
        names::IDEMPOTENCY_KEY,
        names::IF_MATCH,
        names::STREAM_SEQ,
    ];
    let closes =
        oncelog_protocol::headers::closed_flag(req_headers.get(names::STREAM_CLOSED).and_then(|v| v.to_str().ok()));
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
pub(super) async fn compact<E: Engine>(
    st: &AppState<E>,
    path: &str,
    req_headers: &HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    refuse_writes(st, req_headers, body).await?;
    let done = crate::sweeper::compact(st, path, "request").await?;
    let pairs = vec![
        (names::STREAM_EARLIEST_OFFSET, done.earliest.to_string()),
        (names::STREAM_NEXT_OFFSET, done.tail.to_string()),
    ];
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
    let pairs =
        vec![(names::STREAM_EARLIEST_OFFSET, t.earliest.to_string()), (names::STREAM_NEXT_OFFSET, t.tail.to_string())];
    Ok(reply::respond(StatusCode::NO_CONTENT, pairs, Body::empty()))
}

/// `DELETE`; with `If-Match`, only if nobody wrote since the tail named; with `?purge=true`, a
/// stream that forks read (live or already deleted) is detached from its path, which is free at
/// once (docs/PROTOCOL-EXTENSIONS.md). Decided by the engine atomically with the delete.
pub(super) async fn delete<E: Engine>(st: &AppState<E>, path: &str, req: DeleteRequest) -> Result<Response, ApiError> {
    st.engine.delete_if(path, req, st.clock.now_ms()).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// The `purge` query parameter of a `DELETE`: absent, or `true` once. Any other value, or two,
/// is refused rather than guessed at: `purge=false` read as a plain delete, or a typo read as
/// one, would leave the path reserved while its owner believes it free. Other parameters are
/// ignored, as on reads.
pub(super) fn purge(query: Option<&str>) -> Result<bool, ApiError> {
    let [found] = crate::request::params(query, ["purge"])?;
    match found.as_deref() {
        None => Ok(false),
        Some("true") => Ok(true),
        Some(_) => Err(ApiError::InvalidPurge),
    }
}
