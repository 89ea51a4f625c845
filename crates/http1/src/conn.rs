//! The connection loop: requests read from a socket one at a time, each handed to a service, its
//! answer written back before the next request is read (pipelined requests wait in the read
//! buffer and are answered in order).
//!
//! - **Keep-alive** unless the client, the handler (`Connection: close`) or a graceful shutdown
//!   says otherwise, or the answer's length is delimited by the close (HTTP/1.0, no length).
//! - **A request body the handler left unread** (or that failed) ends the connection after the
//!   answer, which says `connection: close`: where the next request starts is no longer known.
//!   Body bytes already in the read buffer are skipped rather than closing for them.
//! - **`Expect: 100-continue`**: the interim answer is written when the handler first asks for
//!   the body; a handler that answers without reading sends none (and the connection closes).
//! - **Half-close**: a client that shuts its side after a request still gets the answer; the
//!   connection ends when the next head would be read.
//! - **Refusals** of a head ([`HeadError`]) are answered with their status and a one-line reason,
//!   then the connection is closed; a malformed chunked body reaches the handler as a body
//!   error.
//! - **No timer per request**: one timer per connection, reset for each head: a client gets
//!   [`Config::header_timeout`] to send a head, which also bounds how long an idle keep-alive
//!   connection stays open. Write deadlines are the socket's (the server wraps it).
//! - **Writes**: the head and small body pieces are gathered in one buffer and written with one
//!   write; a large piece goes to the socket as it is, beside the buffer in one vectored write
//!   (the server's socket recognises a mapped file range by its address and sends it with
//!   `sendfile`). Buffered bytes are written whenever the body has nothing ready, so a streamed
//!   answer (SSE) goes out as it is produced.

use std::future::{poll_fn, Future};
use std::io::{self, IoSlice};
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use http::header::{CONNECTION, CONTENT_LENGTH, CONTENT_TYPE};
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, Version};
use http_body::Body;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::Notify;
use tokio::time::{Instant, Sleep};
use tower_service::Service;

use crate::body::{self, Feeder, Piece, RequestBody};
use crate::head::{self, Head, HeadError, HeadLimits};
use crate::park::Park;
use crate::response::{self, BodyFraming, ResponseHead};

/// An error of a handler or a response body.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A connection's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    pub head_limits: HeadLimits,
    /// How long a client has to send a request head, from the end of the previous answer (or
    /// the connection's start).
    pub header_timeout: Duration,
    /// Bytes asked of the socket per read.
    pub read_chunk: usize,
    /// Body pieces shorter than this are copied into the write buffer; longer ones are queued
    /// behind it as they are (not copied) and go out with it in one vectored write.
    pub copy_below: usize,
    /// The write buffer is written out once it holds this much.
    pub write_buffer: usize,
    /// For a body of known length, what is queued (the buffer and the pieces behind it) is
    /// written out once it holds this many bytes: a catch-up answer of many small appends then
    /// costs one vectored write per this much, not one per append (a write of 64 KiB at a time
    /// cost 0.88x the CPU per GB of one per append where 1 MiB cost 0.63x). It is also what a
    /// client that stops reading pins beyond one piece (the body is asked for more while the
    /// queue is short), so a body of unknown length (SSE, a streamed answer, whose pieces are
    /// framed for it) gathers only up to `write_buffer`: 200 stalled SSE readers pinned 145 MiB
    /// more with 1 MiB than with 64 KiB.
    pub gather_bytes: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            head_limits: HeadLimits::default(),
            header_timeout: Duration::from_secs(30),
            read_chunk: 8 << 10,
            copy_below: 2 << 10,
            write_buffer: 64 << 10,
            gather_bytes: 1 << 20,
        }
    }
}

/// Why a connection ended other than by the client closing it between requests or a graceful
/// shutdown.
#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    #[error("reading from the client: {0}")]
    Read(#[source] io::Error),
    #[error("writing to the client: {0}")]
    Write(#[source] io::Error),
    #[error("request head refused: {0}")]
    Head(#[from] HeadError),
    #[error("no complete request head within {0:?}")]
    HeaderTimeout(Duration),
    #[error("the client closed the connection inside a request head")]
    IncompleteHead,
    #[error("the handler failed: {0}")]
    Service(#[source] BoxError),
    #[error("the response body failed: {0}")]
    ResponseBody(#[source] BoxError),
    #[error("the response body's length differs from its Content-Length ({expected})")]
    BodyLength { expected: u64 },
}

/// Asks a connection to end gracefully: at once if it waits for a request, else after the
/// answer in progress (which then says `connection: close`).
#[derive(Debug, Clone, Default)]
pub struct Shutdown(Arc<ShutdownState>);

#[derive(Debug, Default)]
struct ShutdownState {
    asked: AtomicBool,
    notify: Notify,
}

impl Shutdown {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn graceful(&self) {
        self.0.asked.store(true, Ordering::Release);
        self.0.notify.notify_waiters();
    }

    fn asked(&self) -> bool {
        self.0.asked.load(Ordering::Acquire)
    }

    async fn wait(&self) {
        loop {
            let notified = self.0.notify.notified();
            let mut notified = pin!(notified);
            notified.as_mut().enable();
            if self.asked() {
                return;
            }
            notified.await;
        }
    }
}

/// Most write buffer capacity a connection keeps between answers.
const KEPT_WRITE_BUFFER: usize = 8 << 10;

/// Most pieces queued before they are written.
const MAX_QUEUED: usize = 1024;
/// Most slices handed to one vectored write (Linux's `IOV_MAX` is 1024).
const MAX_IOVECS: usize = 256;

/// The interim answer to `Expect: 100-continue`.
const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// Serves requests on `io` with `service` until the client closes the connection, a graceful
/// `shutdown` ends it, or an error does.
pub async fn serve<I, S, B>(io: I, service: S, config: &Config, shutdown: &Shutdown) -> Result<(), ConnError>
where
    I: AsyncRead + AsyncWrite + Unpin,
    S: Service<Request<RequestBody>, Response = Response<B>>,
    S::Error: Into<BoxError>,
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    serve_parked(io, None, service, config, shutdown).await
}

/// As [`serve`], and while an answer of unknown length waits on its body, lets `park` (made for
/// `io`'s socket) write the body's next pieces from outside (see [`crate::park`]). The park is
/// closed before this returns or is dropped.
pub async fn serve_parked<I, S, B>(
    io: I,
    park: Option<Park>,
    mut service: S,
    config: &Config,
    shutdown: &Shutdown,
) -> Result<(), ConnError>
where
    I: AsyncRead + AsyncWrite + Unpin,
    S: Service<Request<RequestBody>, Response = Response<B>>,
    S::Error: Into<BoxError>,
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let mut conn = Conn {
        park,
        io,
        rbuf: BytesMut::with_capacity(config.read_chunk),
        // Grown as answers need: an idle connection holds no write buffer.
        wbuf: BytesMut::new(),
        queued: Vec::new(),
        queued_bytes: 0,
        config,
        eof: false,
    };
    // The one timer of this connection, reset for each head.
    let timer = pin!(tokio::time::sleep(config.header_timeout));
    let mut timer: Pin<&mut Sleep> = timer;
    loop {
        timer.as_mut().reset(Instant::now() + config.header_timeout);
        let Some(head) = conn.read_head(timer.as_mut(), shutdown).await? else {
            let _ = conn.io.shutdown().await;
            return Ok(());
        };
        if !conn.serve_one(head, &mut service, shutdown).await? {
            let _ = conn.io.shutdown().await;
            return Ok(());
        }
    }
}

struct Conn<'c, I> {
    /// Closed when the connection is dropped, before `io` is.
    park: Option<Park>,
    io: I,
    rbuf: BytesMut,
    wbuf: BytesMut,
    /// What goes out before `wbuf`, in order: body pieces as they came (never copied) and the
    /// parts of the buffer written before each. Written with `wbuf` in vectored writes.
    queued: Vec<Bytes>,
    /// The bytes in `queued`.
    queued_bytes: usize,
    config: &'c Config,
    /// The client shut its side (a read returned 0).
    eof: bool,
}

impl<I> Drop for Conn<'_, I> {
    fn drop(&mut self) {
        if let Some(park) = &self.park {
            park.close();
        }
    }
}

impl<I: AsyncRead + AsyncWrite + Unpin> Conn<'_, I> {
    /// The next request's head; `None` when the connection ends between requests (the client
    /// closed it, it stayed idle past the timeout, or a graceful shutdown was asked).
    async fn read_head(&mut self, mut timer: Pin<&mut Sleep>, shutdown: &Shutdown) -> Result<Option<Head>, ConnError> {
        loop {
            match head::parse(&mut self.rbuf, &self.config.head_limits) {
                Ok(Some(head)) => return Ok(Some(head)),
                Ok(None) => {}
                Err(e) => {
                    self.refuse(e.status(), &e.to_string()).await;
                    return Err(ConnError::Head(e));
                }
            }
            let idle = self.rbuf.is_empty();
            if idle && shutdown.asked() {
                return Ok(None);
            }
            if self.eof {
                return if idle { Ok(None) } else { Err(ConnError::IncompleteHead) };
            }
            self.rbuf.reserve(self.config.read_chunk);
            tokio::select! {
                biased;
                read = self.io.read_buf(&mut self.rbuf) => {
                    if read.map_err(ConnError::Read)? == 0 {
                        self.eof = true;
                    }
                }
                () = timer.as_mut() => {
                    return if idle { Ok(None) } else { Err(ConnError::HeaderTimeout(self.config.header_timeout)) };
                }
                () = shutdown.wait(), if idle => return Ok(None),
            }
        }
    }

    /// Serves one request; whether the connection may carry another.
    async fn serve_one<S, B>(&mut self, head: Head, service: &mut S, shutdown: &Shutdown) -> Result<bool, ConnError>
    where
        S: Service<Request<RequestBody>, Response = Response<B>>,
        S::Error: Into<BoxError>,
        B: Body<Data = Bytes>,
        B::Error: Into<BoxError>,
    {
        let Head { method, uri, version, headers, framing, keep_alive, expect_continue } = head;
        let (body, mut feeder) = body::channel(framing);
        let mut request = Request::new(body);
        *request.method_mut() = method.clone();
        *request.uri_mut() = uri;
        *request.version_mut() = version;
        *request.headers_mut() = headers;

        poll_fn(|cx| service.poll_ready(cx)).await.map_err(|e| ConnError::Service(e.into()))?;
        let answer = service.call(request);
        let mut answer = pin!(answer);
        let mut interim = Interim { due: expect_continue, sent: 0 };
        // The handler's future runs here, and its body is fed from the socket when it asks.
        // Errors become `BoxError` at once: the handler's own error type need not be `Send`
        // for this future to be.
        let response = poll_fn(|cx| loop {
            if let Poll::Ready(response) = answer.as_mut().poll(cx) {
                return Poll::Ready(response.map_err(Into::<BoxError>::into));
            }
            match self.feed(cx, &mut feeder, &mut interim) {
                Poll::Ready(()) => continue,
                Poll::Pending => return Poll::Pending,
            }
        })
        .await;
        let response = match response {
            Ok(response) => response,
            Err(e) => {
                self.refuse(StatusCode::INTERNAL_SERVER_ERROR, "internal error").await;
                return Err(ConnError::Service(e));
            }
        };
        let body_done = feeder.finish_from(&mut self.rbuf);
        self.respond(&method, version, response, keep_alive && body_done && !shutdown.asked()).await
    }

    /// Feeds the handler's body: `Ready` when something changed (a piece handed over, the
    /// interim answer written), `Pending` when nothing can be done now.
    fn feed(&mut self, cx: &mut Context<'_>, feeder: &mut Feeder, interim: &mut Interim) -> Poll<()> {
        if !feeder.wanted(cx.waker()) {
            return Poll::Pending;
        }
        if interim.due {
            while interim.sent < CONTINUE.len() {
                match Pin::new(&mut self.io).poll_write(cx, &CONTINUE[interim.sent..]) {
                    Poll::Ready(Ok(n)) if n > 0 => interim.sent += n,
                    Poll::Ready(Ok(_)) => {
                        feeder.deliver(Piece::Error(body::BodyError::Io(io::ErrorKind::WriteZero.into())));
                        return Poll::Ready(());
                    }
                    Poll::Ready(Err(e)) => {
                        feeder.deliver(Piece::Error(body::BodyError::Io(e)));
                        return Poll::Ready(());
                    }
                    Poll::Pending => return Poll::Pending,
                }
            }
            interim.due = false;
        }
        loop {
            match feeder.next(&mut self.rbuf) {
                Piece::NeedMore => {}
                piece => {
                    feeder.deliver(piece);
                    return Poll::Ready(());
                }
            }
            if self.eof {
                feeder.deliver(Piece::Error(body::BodyError::Incomplete));
                return Poll::Ready(());
            }
            self.rbuf.reserve(self.config.read_chunk);
            let read = pin!(self.io.read_buf(&mut self.rbuf)).poll(cx);
            match read {
                Poll::Ready(Ok(0)) => self.eof = true,
                Poll::Ready(Ok(_)) => {}
                Poll::Ready(Err(e)) => {
                    feeder.deliver(Piece::Error(body::BodyError::Io(e)));
                    return Poll::Ready(());
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    /// Writes `response`; whether the connection may carry another request.
    async fn respond<B>(
        &mut self,
        method: &Method,
        version: Version,
        response: Response<B>,
        keep_alive: bool,
    ) -> Result<bool, ConnError>
    where
        B: Body<Data = Bytes>,
        B::Error: Into<BoxError>,
    {
        let (mut parts, body) = response.into_parts();
        // A body that does not know its size may still be given one by its handler (a catch-up
        // answer streamed from storage): the handler's `Content-Length` then frames it.
        let exact = body.size_hint().exact().or_else(|| content_length(&parts.headers));
        let framing = BodyFraming::decide(method, version, parts.status, exact);
        if framing == BodyFraming::Head && !parts.headers.contains_key(CONTENT_LENGTH) {
            if let Some(n) = exact {
                parts.headers.insert(CONTENT_LENGTH, HeaderValue::from(n));
            }
        }
        let keep_alive = keep_alive && framing != BodyFraming::UntilClose && !asks_close(&parts.headers);
        let head = ResponseHead { status: parts.status, version, headers: &parts.headers, framing, keep_alive };
        crate::date::with_now(|date| head.encode(date, &mut self.wbuf));
        if framing.has_body() {
            self.write_body(body, framing).await?;
        }
        self.flush().await?;
        Ok(keep_alive)
    }

    async fn write_body<B>(&mut self, body: B, framing: BodyFraming) -> Result<(), ConnError>
    where
        B: Body<Data = Bytes>,
        B::Error: Into<BoxError>,
    {
        let mut body = pin!(body);
        let mut written = 0u64;
        let gather = match framing {
            BodyFraming::Length(_) => self.config.gather_bytes,
            _ => self.config.write_buffer,
        };
        loop {
            // What is ready now; when nothing is, what was gathered goes out before waiting.
            // (Errors become `BoxError` at once, as above.)
            let frame = match poll_fn(|cx| Poll::Ready(poll_frame(body.as_mut(), cx))).await {
                Poll::Ready(frame) => frame,
                Poll::Pending => {
                    self.flush().await?;
                    match self.park.as_ref().filter(|_| framing.parks()) {
                        None => poll_fn(|cx| poll_frame(body.as_mut(), cx)).await,
                        Some(park) => {
                            // Nothing is buffered: pieces may be written from outside until the
                            // body gives one here; what such a write left is written first.
                            let chunked = framing == BodyFraming::Chunked;
                            let waited = poll_fn(|cx| {
                                if let Some(rest) = park.wait(chunked, cx.waker()) {
                                    return Poll::Ready(Err(rest));
                                }
                                poll_frame(body.as_mut(), cx).map(|frame| Ok((park.resume(), frame)))
                            })
                            .await;
                            match waited {
                                Err(rest) => {
                                    self.wbuf.extend_from_slice(&rest);
                                    continue;
                                }
                                Ok((rest, frame)) => {
                                    if let Some(rest) = rest {
                                        self.wbuf.extend_from_slice(&rest);
                                    }
                                    frame
                                }
                            }
                        }
                    }
                }
            };
            let Some(frame) = frame else { break };
            let frame = frame.map_err(ConnError::ResponseBody)?;
            let Ok(data) = frame.into_data() else { continue };
            if data.is_empty() {
                continue;
            }
            written += data.len() as u64;
            if let BodyFraming::Length(expected) = framing {
                if written > expected {
                    return Err(ConnError::BodyLength { expected });
                }
            }
            if framing == BodyFraming::Chunked {
                response::chunk_start(data.len(), &mut self.wbuf);
            }
            if data.len() < self.config.copy_below {
                self.wbuf.extend_from_slice(&data);
            } else {
                self.queue(data);
            }
            if framing == BodyFraming::Chunked {
                self.wbuf.extend_from_slice(response::CHUNK_END);
            }
            if self.wbuf.len() >= self.config.write_buffer
                || self.queued_bytes + self.wbuf.len() >= gather
                || self.queued.len() >= MAX_QUEUED
            {
                self.flush().await?;
            }
        }
        match framing {
            BodyFraming::Length(expected) if written != expected => {
                self.flush().await?;
                Err(ConnError::BodyLength { expected })
            }
            BodyFraming::Chunked => {
                self.wbuf.extend_from_slice(response::LAST_CHUNK);
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Queues `data` behind what the buffer holds (see `queued`).
    fn queue(&mut self, data: Bytes) {
        if !self.wbuf.is_empty() {
            let before = self.wbuf.split().freeze();
            self.queued_bytes += before.len();
            self.queued.push(before);
        }
        self.queued_bytes += data.len();
        self.queued.push(data);
    }

    /// Writes out what is queued, then the buffer.
    async fn flush(&mut self) -> Result<(), ConnError> {
        if self.queued.is_empty() {
            if !self.wbuf.is_empty() {
                self.io.write_all(&self.wbuf).await.map_err(ConnError::Write)?;
                self.wbuf.clear();
            }
        } else {
            if !self.wbuf.is_empty() {
                let rest = self.wbuf.split().freeze();
                self.queued.push(rest);
            }
            let mut first = 0;
            while first < self.queued.len() {
                let slices: Vec<IoSlice<'_>> =
                    self.queued[first..].iter().take(MAX_IOVECS).map(|b| IoSlice::new(b)).collect();
                let mut n = self.io.write_vectored(&slices).await.map_err(ConnError::Write)?;
                if n == 0 {
                    return Err(ConnError::Write(io::ErrorKind::WriteZero.into()));
                }
                while n > 0 && first < self.queued.len() {
                    let piece = &mut self.queued[first];
                    let taken = n.min(piece.len());
                    piece.advance(taken);
                    n -= taken;
                    if piece.is_empty() {
                        first += 1;
                    }
                }
            }
            // The buffer was split off into the pieces just written: dropped now, their storage
            // is the buffer's again at its next `reserve`.
            self.queued.clear();
            self.queued_bytes = 0;
        }
        self.io.flush().await.map_err(ConnError::Write)?;
        self.release();
        Ok(())
    }

    /// Gives back a write buffer a large answer grew (an idle connection keeps a small one).
    fn release(&mut self) {
        if self.wbuf.is_empty() && self.wbuf.capacity() > KEPT_WRITE_BUFFER {
            self.wbuf = BytesMut::new();
        }
    }

    /// Answers `status` with `reason` and `connection: close` (errors writing it are the
    /// client's: the connection ends either way).
    async fn refuse(&mut self, status: StatusCode, reason: &str) {
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
        let text = format!("{reason}\n");
        let head = ResponseHead {
            status,
            version: Version::HTTP_11,
            headers: &headers,
            framing: BodyFraming::Length(text.len() as u64),
            keep_alive: false,
        };
        self.wbuf.clear();
        crate::date::with_now(|date| head.encode(date, &mut self.wbuf));
        self.wbuf.extend_from_slice(text.as_bytes());
        let _ = self.flush().await;
    }
}

fn poll_frame<B>(body: Pin<&mut B>, cx: &mut Context<'_>) -> Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    body.poll_frame(cx).map(|frame| frame.map(|frame| frame.map_err(Into::into)))
}

/// The interim answer's progress.
struct Interim {
    due: bool,
    sent: usize,
}

/// The handler's `Content-Length`, when it is one valid number.
fn content_length(headers: &HeaderMap) -> Option<u64> {
    let mut values = headers.get_all(CONTENT_LENGTH).iter();
    let value = values.next()?;
    if values.next().is_some() {
        return None;
    }
    std::str::from_utf8(value.as_bytes()).ok()?.parse().ok()
}

/// Whether the handler's `Connection` field lists `close`.
fn asks_close(headers: &HeaderMap) -> bool {
    headers
        .get_all(CONNECTION)
        .iter()
        .any(|v| v.as_bytes().split(|&b| b == b',').any(|t| t.trim_ascii().eq_ignore_ascii_case(b"close")))
}

#[cfg(test)]
mod tests;
