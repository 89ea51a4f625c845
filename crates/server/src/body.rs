//! Reading a request body within its limits.

use axum::body::Body;
use axum::http::HeaderMap;
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;

/// Why a body could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    #[error("request body exceeds the limit of {limit} bytes")]
    TooLarge { limit: usize },
    #[error("could not read the request body")]
    Read,
    #[error("the request body stalled; send it without long pauses")]
    Stalled,
}

/// Reads a request body, refusing more than `limit` bytes with 413 and a client that pauses
/// longer than `pause` between two pieces with 408.
pub(crate) async fn read(body: Body, req_headers: &HeaderMap, limit: usize, pause: std::time::Duration) -> Result<Bytes, BodyError> {
    let declared = req_headers
        .get("content-length")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(BodyError::TooLarge { limit });
    }
    let mut stream = body.into_data_stream();
    let mut buf = BytesMut::with_capacity(declared.map_or(0, |n| n as usize));
    while let Some(frame) = tokio::time::timeout(pause, stream.next()).await.map_err(|_| BodyError::Stalled)? {
        let frame = frame.map_err(|_| BodyError::Read)?;
        if buf.len() + frame.len() > limit {
            return Err(BodyError::TooLarge { limit });
        }
        buf.extend_from_slice(&frame);
    }
    Ok(buf.freeze())
}
