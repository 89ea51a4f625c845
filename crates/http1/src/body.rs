//! A request's body as the handler sees it ([`RequestBody`], an `http_body::Body`), and the
//! connection's side of it ([`Feeder`]).
//!
//! The connection owns its socket; the body owns nothing but a slot they share. A body that is
//! polled and holds no data says so in the slot (`want`) and wakes the connection, which reads
//! and decodes the next piece into the slot and wakes the body. One piece at a time: a handler
//! that reads slowly holds at most one read's worth of the body in memory, and a handler that
//! never reads leaves the rest in the kernel (the connection is then closed after the answer: its
//! framing is lost). Usually both run in the connection's task (the handler's future polls the
//! body, the connection polls the handler's future), so a wake is a flag, not a thread hop.

use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use bytes::{Bytes, BytesMut};
use http_body::{Frame, SizeHint};

use crate::chunked::{Chunk, ChunkedDecoder, ChunkedError};
use crate::head::Framing;

/// Why a request body ended early.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error("malformed chunked body: {0}")]
    Chunked(#[from] ChunkedError),
    #[error("the client closed the connection inside the request body")]
    Incomplete,
    #[error("reading the request body: {0}")]
    Io(#[source] std::io::Error),
}

#[derive(Default)]
struct Slot {
    /// A piece read for the body and not yet taken.
    piece: Option<Result<Bytes, BodyError>>,
    /// The body's end was reached (after `piece`, if any).
    ended: bool,
    /// The body was polled with nothing to give: the connection should read.
    want: bool,
    /// Whom to wake when a piece arrives.
    body_waker: Option<Waker>,
    /// Whom to wake when the body wants more.
    conn_waker: Option<Waker>,
}

/// Locks a slot; a panic elsewhere while it was held leaves plain data, still usable.
fn lock(slot: &Mutex<Slot>) -> MutexGuard<'_, Slot> {
    slot.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Replaces `waker` by `new` unless it already wakes the same task.
fn register(waker: &mut Option<Waker>, new: &Waker) {
    if !waker.as_ref().is_some_and(|w| w.will_wake(new)) {
        *waker = Some(new.clone());
    }
}

/// The body of a request served by this engine.
#[derive(Debug)]
pub struct RequestBody {
    /// `None`: a request without a body.
    slot: Option<Arc<Mutex<Slot>>>,
    /// Bytes still to come of a `Content-Length` body (the size hint).
    remaining: Option<u64>,
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slot").field("ended", &self.ended).field("want", &self.want).finish_non_exhaustive()
    }
}

impl RequestBody {
    /// A body with no bytes.
    pub fn empty() -> Self {
        RequestBody { slot: None, remaining: Some(0) }
    }
}

impl http_body::Body for RequestBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let Some(slot) = &self.slot else { return Poll::Ready(None) };
        let mut slot = lock(slot);
        if let Some(piece) = slot.piece.take() {
            drop(slot);
            if let (Ok(data), Some(remaining)) = (&piece, self.remaining.as_mut()) {
                *remaining = remaining.saturating_sub(data.len() as u64);
            }
            return Poll::Ready(Some(piece.map(Frame::data)));
        }
        if slot.ended {
            return Poll::Ready(None);
        }
        slot.want = true;
        register(&mut slot.body_waker, cx.waker());
        // The connection usually polls this body from its own task, right after this returns:
        // no wake needed then.
        if let Some(conn) = slot.conn_waker.as_ref().filter(|w| !w.will_wake(cx.waker())) {
            conn.wake_by_ref();
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.slot.as_ref().is_none_or(|slot| {
            let slot = lock(slot);
            slot.ended && slot.piece.is_none()
        })
    }

    fn size_hint(&self) -> SizeHint {
        match self.remaining {
            Some(n) => SizeHint::with_exact(n),
            None => SizeHint::default(),
        }
    }
}

/// How much of the body is still to be read from the connection.
#[derive(Debug)]
enum Rest {
    Length(u64),
    Chunked(ChunkedDecoder),
    /// The whole body was handed over.
    Done,
    /// It ended early (an error was handed over): the connection's framing is lost.
    Failed,
}

/// What [`Feeder::next`] found in the read buffer.
#[derive(Debug)]
pub(crate) enum Piece {
    Data(Bytes),
    End,
    Error(BodyError),
    /// Read more.
    NeedMore,
}

/// The connection's side of a request body.
#[derive(Debug)]
pub(crate) struct Feeder {
    slot: Option<Arc<Mutex<Slot>>>,
    rest: Rest,
}

/// A request body of `framing`, and the connection's side of it.
pub(crate) fn channel(framing: Framing) -> (RequestBody, Feeder) {
    let rest = match framing {
        Framing::None | Framing::Length(0) => return (RequestBody::empty(), Feeder { slot: None, rest: Rest::Done }),
        Framing::Length(n) => Rest::Length(n),
        Framing::Chunked => Rest::Chunked(ChunkedDecoder::new()),
    };
    let slot = Arc::new(Mutex::new(Slot::default()));
    let remaining = match rest {
        Rest::Length(n) => Some(n),
        _ => None,
    };
    (RequestBody { slot: Some(Arc::clone(&slot)), remaining }, Feeder { slot: Some(slot), rest })
}

impl Feeder {
    /// Whether the body asked for more and the connection should read for it. Registers `waker`
    /// to be woken when it asks later.
    pub(crate) fn wanted(&mut self, waker: &Waker) -> bool {
        let Some(slot) = &self.slot else { return false };
        if !matches!(self.rest, Rest::Length(_) | Rest::Chunked(_)) {
            return false;
        }
        let mut slot = lock(slot);
        register(&mut slot.conn_waker, waker);
        slot.want && slot.piece.is_none()
    }

    /// The next piece of the body in `buf`.
    pub(crate) fn next(&mut self, buf: &mut BytesMut) -> Piece {
        match &mut self.rest {
            Rest::Length(0) => Piece::End,
            Rest::Length(remaining) => {
                if buf.is_empty() {
                    return Piece::NeedMore;
                }
                let n = usize::try_from(*remaining).map_or(buf.len(), |r| r.min(buf.len()));
                *remaining -= n as u64;
                Piece::Data(buf.split_to(n).freeze())
            }
            Rest::Chunked(decoder) => match decoder.decode(buf) {
                Ok(Chunk::Data(data)) => Piece::Data(data),
                Ok(Chunk::End) => Piece::End,
                Ok(Chunk::NeedMore) => Piece::NeedMore,
                Err(e) => Piece::Error(e.into()),
            },
            Rest::Done | Rest::Failed => Piece::End,
        }
    }

    /// Hands `piece` (not `NeedMore`) to the body and wakes it.
    pub(crate) fn deliver(&mut self, piece: Piece) {
        let (piece, ended) = match piece {
            Piece::Data(data) => {
                let ended = matches!(self.rest, Rest::Length(0));
                (Some(Ok(data)), ended)
            }
            Piece::End => (None, true),
            Piece::Error(e) => (Some(Err(e)), true),
            Piece::NeedMore => return,
        };
        self.rest = match (&piece, ended) {
            (Some(Err(_)), _) => Rest::Failed,
            (_, true) => Rest::Done,
            _ => std::mem::replace(&mut self.rest, Rest::Done),
        };
        let Some(slot) = &self.slot else { return };
        let mut slot = lock(slot);
        slot.piece = piece;
        slot.ended = ended;
        slot.want = false;
        if let Some(body) = slot.body_waker.take() {
            body.wake();
        }
    }

    /// After the answer: takes what is left of the body's framing from `buf` without reading
    /// more. Whether the body is then wholly consumed (else the connection cannot carry another
    /// request: the rest of the body would be read as one).
    pub(crate) fn finish_from(&mut self, buf: &mut BytesMut) -> bool {
        loop {
            match self.rest {
                Rest::Done => return true,
                Rest::Failed => return false,
                Rest::Length(_) | Rest::Chunked(_) => {}
            }
            match self.next(buf) {
                // Body bytes the handler did not read, already buffered: skipped (their end is
                // known). Nothing more is read for them.
                Piece::Data(_) => {}
                Piece::End => self.rest = Rest::Done,
                Piece::NeedMore | Piece::Error(_) => {
                    self.rest = Rest::Failed;
                    return false;
                }
            }
        }
    }
}
