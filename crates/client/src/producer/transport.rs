//! How a batch reaches the server, behind a small trait so the pipeline can be driven by a
//! scripted server in unit tests; and the pure decision of what an answer means.

use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use oncelog_protocol::headers::{closed_flag, names};
use reqwest::Method;

use crate::error::{is_transient_status, Error};
use crate::http::{header_str, header_u64, next_offset, retry_after, Request};
use crate::offset::StreamOffset;
use crate::stream::StreamHandle;

/// One attempt at sending one batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BatchRequest {
    /// `Producer-Epoch`.
    pub epoch: u64,
    /// `Producer-Seq`.
    pub seq: u64,
    /// The batch body (for JSON streams, one JSON array).
    pub body: Bytes,
    /// `Stream-Closed: true`: this batch closes the stream.
    pub close: bool,
}

/// The parts of an answer the pipeline looks at.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct BatchResponse {
    /// HTTP status.
    pub status: u16,
    /// `Stream-Next-Offset`.
    pub next_offset: Option<StreamOffset>,
    /// `Stream-Closed: true`.
    pub closed: bool,
    /// `Producer-Epoch` (the current epoch on `403`).
    pub producer_epoch: Option<u64>,
    /// `Producer-Seq` (the highest accepted seq on `200`/`204`).
    pub producer_seq: Option<u64>,
    /// `Producer-Expected-Seq` (on a `409` gap).
    pub expected_seq: Option<u64>,
    /// `Producer-Received-Seq` (on a `409` gap).
    pub received_seq: Option<u64>,
    /// `Producer-Conflict: body-mismatch` (on a `409`): the seq was accepted with other bytes.
    pub body_mismatch: bool,
    /// `Retry-After`.
    pub retry_after: Option<Duration>,
    /// The start of an error body.
    pub message: String,
    /// The URL answered, for error messages.
    pub url: String,
}

/// Sends batches. The real one is HTTP; tests script one.
pub(crate) trait Transport: Send + Sync {
    /// One attempt; `Err` is a failure to get any answer (network).
    fn send(&self, req: BatchRequest) -> BoxFuture<'static, Result<BatchResponse, Error>>;
}

/// The HTTP transport: `POST` with the three producer headers.
pub(crate) struct HttpTransport {
    /// The stream and its client.
    pub handle: StreamHandle,
    /// `Producer-Id`.
    pub producer_id: String,
    /// The stream's content type, sent with every non-empty body.
    pub content_type: String,
}

impl Transport for HttpTransport {
    fn send(&self, b: BatchRequest) -> BoxFuture<'static, Result<BatchResponse, Error>> {
        let client = self.handle.client().clone();
        let mut req = Request::new(Method::POST, self.handle.url().clone(), true, Some(client.request_timeout()));
        let built = (|| {
            if !b.body.is_empty() {
                req.header("content-type", &self.content_type)?;
            }
            req.header(names::PRODUCER_ID, &self.producer_id)?;
            req.header(names::PRODUCER_EPOCH, &b.epoch.to_string())?;
            req.header(names::PRODUCER_SEQ, &b.seq.to_string())?;
            if b.close {
                req.header(names::STREAM_CLOSED, "true")?;
            }
            Ok::<(), Error>(())
        })();
        req.body = b.body;
        Box::pin(async move {
            built?;
            let resp = client.send_once(&req).await?;
            let h = resp.headers().clone();
            let status = resp.status().as_u16();
            let message = if (200..300).contains(&status) {
                String::new()
            } else {
                let body = resp.bytes().await.unwrap_or_default();
                String::from_utf8_lossy(&body[..body.len().min(512)]).lines().next().unwrap_or("").trim().to_owned()
            };
            Ok(BatchResponse {
                status,
                next_offset: next_offset(&h).ok(),
                closed: closed_flag(header_str(&h, names::STREAM_CLOSED)),
                producer_epoch: header_u64(&h, names::PRODUCER_EPOCH),
                producer_seq: header_u64(&h, names::PRODUCER_SEQ),
                expected_seq: header_u64(&h, names::PRODUCER_EXPECTED_SEQ),
                received_seq: header_u64(&h, names::PRODUCER_RECEIVED_SEQ),
                body_mismatch: header_str(&h, names::PRODUCER_CONFLICT) == Some("body-mismatch"),
                retry_after: retry_after(&h),
                message,
                url: req.url.as_str().to_owned(),
            })
        })
    }
}

/// What an attempt's outcome means for its batch.
#[derive(Debug, Clone)]
pub(crate) enum Verdict {
    /// Stored (`200`) or already stored (`204`).
    Ack {
        /// The tail after the batch (for an old duplicate: a later offset).
        next_offset: StreamOffset,
        /// `204`: an earlier attempt (or an earlier session, see [`Error::EpochReused`]) stored it.
        duplicate: bool,
        /// The server's highest accepted seq in this epoch, if it said.
        server_seq: Option<u64>,
    },
    /// Transient: send the same `(epoch, seq)` and body again after a delay.
    Retry(Error),
    /// `409` gap: earlier seqs have not arrived yet.
    Gap {
        /// `Producer-Expected-Seq`.
        expected: u64,
        /// `Producer-Received-Seq`.
        received: u64,
    },
    /// `403`: a newer epoch exists.
    Fenced {
        /// The server's epoch.
        current_epoch: u64,
    },
    /// `409 Producer-Conflict: body-mismatch`: this `(epoch, seq)` holds other bytes (on a
    /// session's first answer: an earlier session used the epoch).
    BodyMismatch,
    /// Anything else: this batch cannot succeed.
    Fatal(Error),
}

/// Classifies one attempt's outcome. Pure, so every branch is unit-tested.
pub(crate) fn classify(outcome: &Result<BatchResponse, Error>, body_empty: bool) -> Verdict {
    let r = match outcome {
        Ok(r) => r,
        Err(e) if e.is_transient() => return Verdict::Retry(e.clone()),
        Err(e) => return Verdict::Fatal(e.clone()),
    };
    let message = || r.message.clone();
    match r.status {
        200 | 204 => match &r.next_offset {
            Some(o) => Verdict::Ack {
                next_offset: o.clone(),
                // A close without data is answered 204 whether new or not.
                duplicate: r.status == 204 && !body_empty,
                server_seq: r.producer_seq,
            },
            None => Verdict::Fatal(Error::InvalidResponse(format!("{} without Stream-Next-Offset", r.status))),
        },
        403 => match r.producer_epoch {
            Some(current_epoch) => Verdict::Fenced { current_epoch },
            None => {
                Verdict::Fatal(Error::Status { status: 403, message: message(), retry_after: None, retry_safe: false })
            }
        },
        409 if r.closed => Verdict::Fatal(Error::StreamClosed { final_offset: r.next_offset.clone() }),
        409 if r.body_mismatch => Verdict::BodyMismatch,
        409 => match (r.expected_seq, r.received_seq) {
            (Some(expected), Some(received)) => Verdict::Gap { expected, received },
            _ => Verdict::Fatal(Error::Conflict { message: message() }),
        },
        404 => Verdict::Fatal(Error::NotFound { url: r.url.clone() }),
        400 => Verdict::Fatal(Error::BadRequest { message: message() }),
        410 => Verdict::Fatal(Error::Gone { message: message() }),
        413 => Verdict::Fatal(Error::PayloadTooLarge { message: message() }),
        s if is_transient_status(s) => Verdict::Retry(Error::Status {
            status: s,
            message: message(),
            retry_after: r.retry_after,
            retry_safe: true,
        }),
        s => Verdict::Fatal(Error::Status { status: s, message: message(), retry_after: None, retry_safe: false }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resp(status: u16) -> BatchResponse {
        BatchResponse { status, next_offset: Some(StreamOffset::new("o")), ..BatchResponse::default() }
    }

    #[test]
    fn every_answer_has_one_meaning() {
        assert!(matches!(classify(&Ok(resp(200)), false), Verdict::Ack { duplicate: false, .. }));
        assert!(matches!(classify(&Ok(resp(204)), false), Verdict::Ack { duplicate: true, .. }));
        assert!(
            matches!(classify(&Ok(resp(204)), true), Verdict::Ack { duplicate: false, .. }),
            "close-only is always 204"
        );
        let no_offset = BatchResponse { status: 200, ..BatchResponse::default() };
        assert!(matches!(classify(&Ok(no_offset), false), Verdict::Fatal(Error::InvalidResponse(_))));

        for s in [500, 502, 503, 504, 429, 408] {
            assert!(matches!(classify(&Ok(resp(s)), false), Verdict::Retry(_)), "{s} is retried");
        }
        let gap =
            BatchResponse { status: 409, expected_seq: Some(2), received_seq: Some(4), ..BatchResponse::default() };
        assert!(matches!(classify(&Ok(gap), false), Verdict::Gap { expected: 2, received: 4 }));
        let closed =
            BatchResponse { status: 409, closed: true, expected_seq: Some(2), received_seq: Some(4), ..resp(409) };
        assert!(
            matches!(classify(&Ok(closed), false), Verdict::Fatal(Error::StreamClosed { .. })),
            "closed wins, never retried"
        );
        let mismatch = BatchResponse { status: 409, body_mismatch: true, ..resp(409) };
        assert!(matches!(classify(&Ok(mismatch), false), Verdict::BodyMismatch));
        let fenced = BatchResponse { status: 403, producer_epoch: Some(7), ..BatchResponse::default() };
        assert!(matches!(classify(&Ok(fenced), false), Verdict::Fenced { current_epoch: 7 }));
        assert!(matches!(classify(&Ok(resp(403)), false), Verdict::Fatal(_)), "403 without an epoch is not fencing");
        for s in [400, 404, 409, 410, 413, 418] {
            assert!(matches!(classify(&Ok(resp(s)), false), Verdict::Fatal(_)), "{s} is final");
        }
        let net = Error::Status { status: 502, message: String::new(), retry_after: None, retry_safe: true };
        assert!(matches!(classify(&Err(net), false), Verdict::Retry(_)));
        assert!(matches!(classify(&Err(Error::NotFound { url: String::new() }), false), Verdict::Fatal(_)));
    }
}
