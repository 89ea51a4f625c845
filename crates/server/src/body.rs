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
    #[error("the request body took too long to arrive; send it faster")]
    TooSlow,
}

/// What a request body may be ([`crate::ServerConfig::body_limits`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyLimits {
    /// Larger is `413`.
    pub max_bytes: usize,
    /// A longer pause between two pieces is `408`.
    pub pause: std::time::Duration,
    /// A body that takes longer in all is `408`.
    pub total: std::time::Duration,
}

/// Reads a request body, refusing more than `limits.max_bytes` with 413, and with 408 a client
/// that pauses longer than `limits.pause` between two pieces or takes longer than
/// `limits.total` in all.
pub(crate) async fn read(body: Body, req_headers: &HeaderMap, limits: BodyLimits) -> Result<Bytes, BodyError> {
    let limit = limits.max_bytes;
    let declared = req_headers.get("content-length").and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(BodyError::TooLarge { limit });
    }
    let deadline = tokio::time::Instant::now() + limits.total;
    let mut stream = body.into_data_stream();
    let mut buf = BytesMut::with_capacity(declared.map_or(0, |n| n as usize));
    loop {
        let piece = tokio::time::timeout_at(deadline, tokio::time::timeout(limits.pause, stream.next()));
        let Some(frame) = piece.await.map_err(|_| BodyError::TooSlow)?.map_err(|_| BodyError::Stalled)? else { break };
        let frame = frame.map_err(|_| BodyError::Read)?;
        if buf.len() + frame.len() > limit {
            return Err(BodyError::TooLarge { limit });
        }
        buf.extend_from_slice(&frame);
    }
    Ok(buf.freeze())
}
