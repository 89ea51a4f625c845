//! Readers: catch-up, long-poll and SSE reads as a [`futures_util::Stream`] of [`Chunk`]s,
//! started by [`StreamHandle::read`].
//!
//! A reader starts at any [`ReadFrom`] position and keeps its place in the stream itself: each
//! response's `Stream-Next-Offset` (or SSE `streamNextOffset`) becomes the next request's offset,
//! and the server's cursor is echoed back (section 10.1). Transient failures (network errors,
//! `5xx`, `429`) are retried from the last confirmed offset with backoff, so no chunk is skipped
//! or delivered twice. Every mode ends cleanly, after a chunk whose `closed` is `true`, when the
//! stream is closed (EOF); catch-up mode also ends once it is up to date.
//!
//! Chunks may be empty: an empty chunk reports reaching the tail (`up_to_date`) or EOF
//! (`closed`). Long-poll timeouts that change nothing are not reported.
//!
//! For `application/json` streams a chunk's data is a JSON array of messages;
//! [`ChunkStream::json`] and [`ChunkStream::messages`] decode them with serde.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use base64::Engine as _;
use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use oncelog_protocol::content_type;
use oncelog_protocol::headers::{closed_flag, names};
use reqwest::header::{HeaderMap, HeaderValue, ACCEPT, CONTENT_TYPE};
use reqwest::Method;
use serde::de::{DeserializeOwned, IgnoredAny};

use crate::error::Error;
use crate::http::{error_from_response, header_str, next_offset, Op, Request};
use crate::offset::{ReadFrom, StreamOffset};
use crate::retry::{Backoff, RetryPolicy};
use crate::sse::{ControlEvent, SseParser};
use crate::stream::StreamHandle;

/// How a reader waits for data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LiveMode {
    /// Plain GETs until up to date, then the reader ends.
    #[default]
    CatchUp,
    /// `live=long-poll` requests forever (until EOF).
    LongPoll,
    /// One `live=sse` connection at a time, reconnected when the server ends it (until EOF).
    Sse,
    /// Catch-up until up to date, then long-poll.
    Auto,
}

/// What a reader does when its position was dropped from the stream (a `410` with
/// `Stream-Earliest-Offset`: a trim or a retention policy got there first), as Kafka's
/// `auto.offset.reset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnTrimmed {
    /// End with [`Error::Trimmed`], which carries the earliest offset: the caller decides.
    #[default]
    Fail,
    /// Go on from the earliest offset (what was dropped is skipped; counted in
    /// [`ReadStatus::trim_restarts`]).
    RestartFromEarliest,
}

/// Options of [`StreamHandle::read`].
#[derive(Debug, Clone, Default)]
pub struct ReadOptions {
    /// Where to start.
    pub from: ReadFrom,
    /// How to wait for data.
    pub live: LiveMode,
    /// A cursor from an earlier read, echoed on the first live request.
    pub cursor: Option<String>,
    /// Extra headers for every request of this reader.
    pub headers: HeaderMap,
    /// The retry policy; the client's when `None`. Use `with_max_attempts(None)` for a tail that
    /// must never give up.
    pub retry: Option<RetryPolicy>,
    /// When the reader's position was trimmed away.
    pub on_trimmed: OnTrimmed,
}

impl ReadOptions {
    /// Reads from `from` in mode `live`.
    pub fn new(from: impl Into<ReadFrom>, live: LiveMode) -> ReadOptions {
        ReadOptions { from: from.into(), live, ..ReadOptions::default() }
    }
}

/// One piece of a stream, and where the reader stands after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    /// The bytes (for JSON streams: a JSON array of messages). May be empty.
    pub data: Bytes,
    /// The offset after this chunk: resume from here.
    pub next_offset: StreamOffset,
    /// Whether the reader has caught up with the tail (more may still come).
    pub up_to_date: bool,
    /// Whether the stream is closed and this chunk ends it (EOF).
    pub closed: bool,
    /// The server's cursor, when it sent one.
    pub cursor: Option<String>,
    /// Whether `data` is a JSON array of messages (an `application/json` stream).
    pub json: bool,
}

impl Chunk {
    /// Decodes the messages of a JSON chunk. An empty chunk has none.
    pub fn json_items<T: DeserializeOwned>(&self) -> Result<Vec<T>, Error> {
        if self.data.is_empty() {
            return Ok(Vec::new());
        }
        Ok(serde_json::from_slice(&self.data)?)
    }
}

/// Typed messages of one chunk of a JSON stream.
#[derive(Debug, Clone, PartialEq)]
pub struct JsonBatch<T> {
    /// The messages, in stream order.
    pub items: Vec<T>,
    /// The offset after these messages.
    pub next_offset: StreamOffset,
    /// Whether the reader has caught up.
    pub up_to_date: bool,
    /// Whether the stream ended here (EOF).
    pub closed: bool,
}

/// Where a reader stands; readable while it runs (see [`ChunkStream::status`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReadStatus {
    /// The offset the next request will start at; `None` before the first response when the
    /// read started at `now` or at the beginning.
    pub offset: Option<StreamOffset>,
    /// The last cursor received.
    pub cursor: Option<String>,
    /// Whether the last response said the reader is caught up.
    pub up_to_date: bool,
    /// Whether EOF was reached.
    pub closed: bool,
    /// The HTTP status of the last successful response: `200`, or `204` when a long-poll ended
    /// without data.
    pub last_status: Option<u16>,
    /// How many times the reader skipped to the earliest offset after its position was trimmed
    /// ([`OnTrimmed::RestartFromEarliest`]).
    pub trim_restarts: u64,
}

/// The chunks of a read, as a [`Stream`]. Ends after EOF (and, in catch-up mode, once up to
/// date), or after an error that retrying cannot fix.
pub struct ChunkStream {
    /// The reader's async state machine.
    inner: Pin<Box<dyn Stream<Item = Result<Chunk, Error>> + Send>>,
    /// Shared with the reader so callers can see its position at any time.
    status: Arc<Mutex<ReadStatus>>,
}

impl std::fmt::Debug for ChunkStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChunkStream").field("status", &self.status()).finish_non_exhaustive()
    }
}

// Here rather than in stream.rs, so that the handle, which readers use, never names the reader.
impl StreamHandle {
    /// A reader: a [`futures_util::Stream`] of [`crate::Chunk`]s from `opts.from`, in the mode
    /// `opts.live` chooses. See [`crate::read`].
    pub fn read(&self, opts: ReadOptions) -> ChunkStream {
        ChunkStream::new(self.clone(), opts)
    }
}

impl ChunkStream {
    fn new(handle: StreamHandle, opts: ReadOptions) -> ChunkStream {
        let status = Arc::new(Mutex::new(ReadStatus {
            offset: match &opts.from {
                ReadFrom::Offset(o) => Some(o.clone()),
                _ => None,
            },
            cursor: opts.cursor.clone(),
            ..ReadStatus::default()
        }));
        let reader = Reader::new(handle, opts, status.clone());
        let inner = futures_util::stream::unfold(reader, |mut r| async move { r.next().await.map(|item| (item, r)) });
        ChunkStream { inner: Box::pin(inner), status }
    }

    /// Where the reader stands now.
    pub fn status(&self) -> ReadStatus {
        self.status.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Decodes each chunk of a JSON stream into typed messages.
    pub fn json<T: DeserializeOwned + Send + 'static>(self) -> impl Stream<Item = Result<JsonBatch<T>, Error>> + Send {
        self.map(|r| {
            let c = r?;
            Ok(JsonBatch {
                items: c.json_items()?,
                next_offset: c.next_offset,
                up_to_date: c.up_to_date,
                closed: c.closed,
            })
        })
    }

    /// The messages of a JSON stream one by one.
    pub fn messages<T: DeserializeOwned + Send + 'static>(self) -> impl Stream<Item = Result<T, Error>> + Send {
        self.json::<T>().flat_map(|r| {
            let items: Vec<Result<T, Error>> = match r {
                Ok(batch) => batch.items.into_iter().map(Ok).collect(),
                Err(e) => vec![Err(e)],
            };
            futures_util::stream::iter(items)
        })
    }
}

impl Stream for ChunkStream {
    type Item = Result<Chunk, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.as_mut().poll_next(cx)
    }
}

/// Which kind of request the reader makes next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    CatchUp,
    LongPoll,
    Sse,
}

/// An open SSE response.
struct SseConn {
    /// The response body.
    body: Pin<Box<dyn Stream<Item = reqwest::Result<Bytes>> + Send>>,
    /// Splits the body into events.
    parser: SseParser,
    /// `stream-sse-data-encoding: base64`: data events carry base64.
    base64: bool,
    /// Data events received since the last control event (only a control event confirms them).
    pending: Vec<Bytes>,
    /// Whether this connection delivered a control event (a connection that ends without one
    /// counts as a failure for backoff).
    got_control: bool,
}

/// The state machine behind a [`ChunkStream`].
struct Reader {
    /// The stream being read.
    handle: StreamHandle,
    /// Where the next request starts.
    from: ReadFrom,
    /// The cursor to echo.
    cursor: Option<String>,
    /// What the caller asked for.
    mode: LiveMode,
    /// What the reader does next.
    phase: Phase,
    /// Set after EOF, after catch-up completes, or after a fatal error.
    done: bool,
    /// Whether the stream is `application/json` (known after the first response).
    json: bool,
    /// Extra request headers.
    headers: HeaderMap,
    /// Retry state; reset by every successful response.
    backoff: Backoff,
    /// `up_to_date` of the last chunk handed out, so that repeated "still at the tail" answers
    /// are reported once.
    reported_up_to_date: bool,
    /// The open SSE connection, if any.
    sse: Option<SseConn>,
    /// What to do when the position was trimmed away.
    on_trimmed: OnTrimmed,
    /// Shared with the [`ChunkStream`].
    status: Arc<Mutex<ReadStatus>>,
}

impl Reader {
    fn new(handle: StreamHandle, opts: ReadOptions, status: Arc<Mutex<ReadStatus>>) -> Reader {
        let policy = opts.retry.unwrap_or_else(|| handle.client().retry_policy().clone());
        let backoff = Backoff::new(policy, handle.client().jitter());
        let phase = match opts.live {
            LiveMode::CatchUp | LiveMode::Auto => Phase::CatchUp,
            LiveMode::LongPoll => Phase::LongPoll,
            LiveMode::Sse => Phase::Sse,
        };
        let json = handle.known_content_type().is_some_and(|ct| content_type::is_json(&ct));
        Reader {
            handle,
            from: opts.from,
            cursor: opts.cursor,
            mode: opts.live,
            phase,
            done: false,
            json,
            headers: opts.headers,
            backoff,
            reported_up_to_date: false,
            sse: None,
            on_trimmed: opts.on_trimmed,
            status,
        }
    }

    /// The next item for the stream, or `None` when it is over.
    async fn next(&mut self) -> Option<Result<Chunk, Error>> {
        loop {
            if self.done {
                return None;
            }
            let step = match self.phase {
                Phase::Sse => self.sse_step().await,
                Phase::CatchUp | Phase::LongPoll => self.get_step().await,
            };
            match step {
                Ok(Some(chunk)) => return Some(Ok(chunk)),
                Ok(None) => continue,
                Err(Error::Trimmed { earliest }) if self.on_trimmed == OnTrimmed::RestartFromEarliest => {
                    tracing::warn!(url = %self.handle.url(), from = %self.from.as_query(), %earliest, "read position was trimmed; going on from the earliest offset");
                    self.sse = None;
                    self.from = ReadFrom::Offset(earliest.clone());
                    if let Ok(mut s) = self.status.lock() {
                        s.offset = Some(earliest);
                        s.trim_restarts += 1;
                    }
                }
                Err(e) => {
                    if e.is_retry_safe() {
                        if let Some(delay) = self.backoff.next_delay(e.retry_after()) {
                            tracing::debug!(error = %e, ?delay, url = %self.handle.url(), "read failed; retrying");
                            tokio::time::sleep(delay).await;
                            continue;
                        }
                    }
                    self.done = true;
                    return Some(Err(e));
                }
            }
        }
    }

    /// The read URL: query parameters in lexicographic key order, for CDN cache keys.
    fn url(&self, live: Option<&str>) -> reqwest::Url {
        let mut url = self.handle.url().clone();
        {
            let mut q = url.query_pairs_mut();
            if live.is_some() {
                if let Some(c) = &self.cursor {
                    q.append_pair("cursor", c);
                }
            }
            if let Some(l) = live {
                q.append_pair("live", l);
            }
            q.append_pair("offset", self.from.as_query());
        }
        url
    }

    /// One catch-up or long-poll request. `Ok(None)`: nothing to report, go on.
    async fn get_step(&mut self) -> Result<Option<Chunk>, Error> {
        let long_poll = self.phase == Phase::LongPoll;
        let client = self.handle.client().clone();
        let timeout = if long_poll { client.long_poll_timeout() } else { client.request_timeout() };
        let mut req = Request::new(Method::GET, self.url(long_poll.then_some("long-poll")), true, Some(timeout));
        req.headers = self.headers.clone();
        let resp = client.send_once(&req).await?;
        let status = resp.status().as_u16();
        match status {
            200 => {
                self.set_last_status(200);
                let h = resp.headers().clone();
                if let Some(ct) = header_str(&h, CONTENT_TYPE.as_str()) {
                    self.json = content_type::is_json(ct);
                }
                let body = resp.bytes().await.map_err(|e| Error::transport(e, true))?;
                if self.json {
                    validate_json_array(&body)?;
                }
                let data = if self.json && is_empty_json_array(&body) { Bytes::new() } else { body };
                self.backoff.reset();
                let up_to_date =
                    header_str(&h, names::STREAM_UP_TO_DATE).is_some_and(|v| v.eq_ignore_ascii_case("true"));
                let closed = closed_flag(header_str(&h, names::STREAM_CLOSED));
                let cursor = header_str(&h, names::STREAM_CURSOR).map(str::to_owned);
                Ok(self.advance(data, next_offset(&h)?, up_to_date, closed, cursor))
            }
            204 => {
                self.set_last_status(204);
                let h = resp.headers().clone();
                self.backoff.reset();
                let closed = closed_flag(header_str(&h, names::STREAM_CLOSED));
                let cursor = header_str(&h, names::STREAM_CURSOR).map(str::to_owned);
                Ok(self.advance(Bytes::new(), next_offset(&h)?, true, closed, cursor))
            }
            _ => Err(error_from_response(resp, Op::Other, true).await),
        }
    }

    fn set_last_status(&self, status: u16) {
        if let Ok(mut s) = self.status.lock() {
            s.last_status = Some(status);
        }
    }

    /// Records a response's position and decides what the caller sees.
    fn advance(
        &mut self,
        data: Bytes,
        next: StreamOffset,
        up_to_date: bool,
        closed: bool,
        cursor: Option<String>,
    ) -> Option<Chunk> {
        // A server that answers "nothing here" without saying "up to date" would make a catch-up
        // reader spin; no progress at all means the reader is at the tail.
        let no_progress = data.is_empty() && matches!(&self.from, ReadFrom::Offset(o) if *o == next);
        let up_to_date = up_to_date || no_progress;
        self.from = ReadFrom::Offset(next.clone());
        if cursor.is_some() {
            self.cursor = cursor.clone();
        }
        if let Ok(mut s) = self.status.lock() {
            s.offset = Some(next.clone());
            s.cursor = self.cursor.clone();
            s.up_to_date = up_to_date;
            s.closed = closed;
        }
        if closed {
            self.done = true;
            self.sse = None;
        } else if up_to_date && self.phase == Phase::CatchUp {
            match self.mode {
                LiveMode::Auto => self.phase = Phase::LongPoll,
                _ => self.done = true,
            }
        }
        let newly_up_to_date = up_to_date && !self.reported_up_to_date;
        self.reported_up_to_date = up_to_date;
        if data.is_empty() && !closed && !newly_up_to_date {
            return None;
        }
        Some(Chunk { data, next_offset: next, up_to_date, closed, cursor, json: self.json })
    }

    /// Reads SSE events until one produces a chunk, opening the connection first if needed.
    async fn sse_step(&mut self) -> Result<Option<Chunk>, Error> {
        if self.sse.is_none() {
            self.sse = Some(self.sse_connect().await?);
        }
        loop {
            let Some(conn) = self.sse.as_mut() else { return Ok(None) };
            match conn.parser.next_event()? {
                Some(ev) if ev.event == "data" => {
                    let payload =
                        if conn.base64 {
                            let text: String = ev.data.chars().filter(|c| *c != '\n' && *c != '\r').collect();
                            Bytes::from(base64::engine::general_purpose::STANDARD.decode(text.as_bytes()).map_err(
                                |e| Error::InvalidResponse(format!("SSE data event is not valid base64: {e}")),
                            )?)
                        } else {
                            Bytes::from(ev.data)
                        };
                    if self.json {
                        validate_json_array(&payload)?;
                    }
                    conn.pending.push(payload);
                    continue;
                }
                Some(ev) if ev.event == "control" => {
                    let control = ControlEvent::parse(&ev.data)?;
                    conn.got_control = true;
                    let pending = std::mem::take(&mut conn.pending);
                    self.backoff.reset();
                    let data = if self.json { join_json_arrays(pending) } else { join_bytes(pending) };
                    let next = StreamOffset::new(control.stream_next_offset);
                    let up_to_date = control.up_to_date || control.stream_closed;
                    match self.advance(data, next, up_to_date, control.stream_closed, control.stream_cursor) {
                        Some(chunk) => return Ok(Some(chunk)),
                        None => continue,
                    }
                }
                // Unknown event types are for future protocol versions: skip them.
                Some(_) => continue,
                None => {}
            }
            match conn.body.next().await {
                Some(Ok(bytes)) => conn.parser.push(&bytes),
                Some(Err(e)) => {
                    self.sse = None;
                    return Err(Error::transport(e, true));
                }
                None => {
                    // The server ended the response (it does so every minute or so). Data
                    // without its control event is dropped: the offset did not move past it.
                    let fruitful = conn.got_control;
                    self.sse = None;
                    if fruitful {
                        return Ok(None);
                    }
                    return Err(Error::Status {
                        status: 503,
                        message: "SSE response ended without a control event".into(),
                        retry_after: None,
                        retry_safe: true,
                    });
                }
            }
        }
    }

    async fn sse_connect(&mut self) -> Result<SseConn, Error> {
        if self.handle.known_content_type().is_none() {
            // The SSE response's own content type is text/event-stream; JSON mode depends on
            // the stream's.
            self.handle.head_with_headers(self.headers.clone()).await?;
        }
        self.json = self.handle.known_content_type().is_some_and(|ct| content_type::is_json(&ct));
        let client = self.handle.client().clone();
        let mut req = Request::new(Method::GET, self.url(Some("sse")), true, None);
        req.headers = self.headers.clone();
        req.headers.insert(ACCEPT, HeaderValue::from_static("text/event-stream"));
        let resp = client.send_once(&req).await?;
        if resp.status().as_u16() != 200 {
            return Err(error_from_response(resp, Op::Other, true).await);
        }
        let h = resp.headers();
        let ct = header_str(h, CONTENT_TYPE.as_str()).unwrap_or("");
        if !ct.to_ascii_lowercase().starts_with("text/event-stream") {
            return Err(Error::InvalidResponse(format!("SSE response has content type {ct:?}")));
        }
        self.set_last_status(200);
        let base64 = header_str(h, names::STREAM_SSE_DATA_ENCODING).is_some_and(|v| v.eq_ignore_ascii_case("base64"));
        Ok(SseConn {
            body: Box::pin(resp.bytes_stream()),
            parser: SseParser::default(),
            base64,
            pending: Vec::new(),
            got_control: false,
        })
    }
}

/// Refuses a JSON-stream body that is not a JSON array.
fn validate_json_array(body: &[u8]) -> Result<(), Error> {
    serde_json::from_slice::<Vec<IgnoredAny>>(body)
        .map(|_| ())
        .map_err(|e| Error::InvalidResponse(format!("JSON stream body is not a JSON array: {e}")))
}

fn is_empty_json_array(body: &[u8]) -> bool {
    body.iter().filter(|b| !b.is_ascii_whitespace()).eq(b"[]".iter())
}

fn join_bytes(parts: Vec<Bytes>) -> Bytes {
    match parts.len() {
        0 => Bytes::new(),
        1 => parts.into_iter().next().unwrap_or_default(),
        _ => Bytes::from(parts.concat()),
    }
}

/// Joins JSON arrays (each already validated) into one: `[a,b]` + `[c]` → `[a,b,c]`.
fn join_json_arrays(parts: Vec<Bytes>) -> Bytes {
    let inners: Vec<&[u8]> = parts
        .iter()
        .filter_map(|p| {
            let t = p.trim_ascii();
            let inner = t.strip_prefix(b"[")?.strip_suffix(b"]")?.trim_ascii();
            (!inner.is_empty()).then_some(inner)
        })
        .collect();
    if inners.is_empty() {
        return Bytes::new();
    }
    let mut out = Vec::with_capacity(inners.iter().map(|i| i.len() + 1).sum::<usize>() + 2);
    oncelog_protocol::json::write_array(inners, &mut out);
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reader(live: LiveMode) -> Reader {
        let handle = crate::Client::new("http://127.0.0.1:1/v1/stream").expect("client").stream("s");
        Reader::new(handle, ReadOptions::new(ReadFrom::Now, live), Arc::new(Mutex::new(ReadStatus::default())))
    }

    #[test]
    fn live_requests_echo_the_cursor_and_resume_at_the_last_offset() {
        let mut r = reader(LiveMode::LongPoll);
        assert_eq!(r.url(Some("long-poll")).query(), Some("live=long-poll&offset=now"));
        let chunk = r.advance(Bytes::from_static(b"x"), StreamOffset::new("0_5"), true, false, Some("42".into()));
        assert!(chunk.is_some_and(|c| c.cursor.as_deref() == Some("42")));
        assert_eq!(
            r.url(Some("long-poll")).query(),
            Some("cursor=42&live=long-poll&offset=0_5"),
            "keys in lexicographic order"
        );
        assert_eq!(r.url(None).query(), Some("offset=0_5"), "catch-up reads carry no cursor");
        // A 204 without a cursor (closed streams may omit it) keeps the last one.
        assert!(
            r.advance(Bytes::new(), StreamOffset::new("0_5"), true, false, None).is_none(),
            "still at the tail: not reported twice"
        );
        assert_eq!(r.cursor.as_deref(), Some("42"));
    }

    #[test]
    fn catch_up_ends_when_up_to_date_and_auto_switches_to_long_poll() {
        let mut r = reader(LiveMode::CatchUp);
        assert!(r.advance(Bytes::from_static(b"a"), StreamOffset::new("1"), false, false, None).is_some());
        assert!(!r.done);
        let c = r.advance(Bytes::new(), StreamOffset::new("1"), true, false, None).expect("up-to-date is reported");
        assert!(c.up_to_date && r.done);
        let mut r = reader(LiveMode::Auto);
        r.advance(Bytes::new(), StreamOffset::new("1"), true, false, None);
        assert!(!r.done && r.phase == Phase::LongPoll);
        let c = r.advance(Bytes::new(), StreamOffset::new("1"), true, true, None).expect("EOF is reported");
        assert!(c.closed && r.done);
    }

    #[test]
    fn json_helpers() {
        assert!(validate_json_array(b"[1, {\"a\":2}]").is_ok());
        assert!(validate_json_array(b"[1, {\"a\":").is_err());
        assert!(validate_json_array(b"{}").is_err());
        assert!(is_empty_json_array(b" [ ] "));
        let joined = join_json_arrays(vec![
            Bytes::from_static(b"[1,2]"),
            Bytes::from_static(b"[]"),
            Bytes::from_static(b"\n[\n3\n]"),
        ]);
        assert_eq!(&joined[..], b"[1,2,3]");
        assert!(join_json_arrays(vec![Bytes::from_static(b"[]")]).is_empty());
    }
}
