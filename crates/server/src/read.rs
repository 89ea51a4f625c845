//! Reading a stream: `GET` (catch-up, long-poll and SSE reads, sections 5.6–5.8, 10) and `HEAD`.

use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::TryStreamExt;
use oncelog_protocol::headers::names;
use oncelog_protocol::sse::{self, Control, DataEncoding};
use oncelog_protocol::{content_type, cursor, json, Offset, OffsetParam};
use oncelog_storage::{Engine, ReadChunk, ReadRequest, StreamInfo, WaitOutcome};

use crate::auth::Access;
use crate::error::ApiError;
use crate::live::{Framed, LiveSlot};
pub use crate::live_read::SSE_READ_BYTES;
use crate::live_read::{data_event, frame_whole, sse_read, TTL_RENEW_INTERVAL};
use crate::reply::{self, respond};
use crate::request::{Live, ReadQuery, RequestError};
use crate::state::AppState;

/// Data chunks are immutable by position, so they may be cached; tail answers may not.
const CACHEABLE: &str = "public, max-age=60, stale-while-revalidate=300";
/// The same for a request that carried credentials: browsers may cache it, shared caches (which
/// would hand it to anyone) may not.
const CACHEABLE_PRIVATE: &str = "private, max-age=60, stale-while-revalidate=300";

/// `HEAD`: the stream's metadata; with `If-Match`, only if its tail is one named.
pub fn head(info: StreamInfo, if_match: Option<Option<Vec<Offset>>>) -> Result<Response, ApiError> {
    // The stream's entity tag for preconditions is its tail, as for conditional appends.
    if let Some(Some(tails)) = if_match {
        if !tails.contains(&info.tail) {
            return Err(
                oncelog_storage::LookupError::PreconditionFailed { tail: info.tail, closed: info.closed }.into()
            );
        }
    }
    let mut h = reply::meta_headers(&info);
    h.push(("cache-control", "no-store".into()));
    Ok(respond(StatusCode::OK, h, Body::empty()))
}

/// `GET`: `info` is the stream as the request found it.
pub async fn get<E: Engine>(
    st: &AppState<E>,
    path: &str,
    info: StreamInfo,
    mut q: ReadQuery,
    req_headers: &HeaderMap,
    access: &Access,
    own_connection: bool,
) -> Result<Response, ApiError> {
    let now_ms = st.clock.now_ms();
    if q.live == Live::Sse {
        if let Some(resume) = crate::request::last_event_id(req_headers)? {
            q.offset = OffsetParam::At(resume);
        }
    }
    let from = start_offset(q.offset, &info)?;
    match q.live {
        Live::CatchUp => {
            let chunk = aligned(st.engine.read(ReadRequest::new(path, from, st.config.max_read_bytes, now_ms)).await?)?;
            count_read(st, path, chunk.data.len());
            let is_now = q.offset == OffsetParam::Now;
            Ok(match catch_up_end(st, &chunk, from) {
                Some(end) => {
                    let body = catch_up_body(st.clone(), path.to_owned(), chunk.data.clone(), chunk.next, end);
                    render(&chunk.info, from, end, is_now, None, req_headers, Payload::Streamed(body))
                }
                None => render_chunk(&chunk, from, is_now, None, req_headers),
            })
        }
        Live::LongPoll => long_poll(st, path, &q, from, info, req_headers, access).await,
        Live::Sse => {
            // The first read happens before the 200 goes out, so a bad offset is still a 400;
            // the response then starts with that chunk instead of reading it again.
            let first = if from < info.tail {
                Some(aligned(
                    sse_read(st, path, from, content_type::is_json(&info.config.content_type), None, now_ms).await?,
                )?)
            } else {
                None
            };
            sse(st, path, &q, from, &info, access, first, own_connection)
        }
    }
}

/// The offset a read starts from, checked against the tail.
fn start_offset(param: oncelog_protocol::OffsetParam, info: &StreamInfo) -> Result<Offset, ApiError> {
    let tail = info.tail;
    let from = match param {
        // The beginning is where the stream can still be read from.
        oncelog_protocol::OffsetParam::Start => info.earliest,
        oncelog_protocol::OffsetParam::Now => tail,
        oncelog_protocol::OffsetParam::At(o) => o,
    };
    if from > tail {
        return Err(RequestError::OffsetBeyondTail.into());
    }
    oncelog_storage::rules::readable_from(info.earliest, from)?;
    Ok(from)
}

/// A JSON stream can be read only from offsets that are message boundaries (those the engine
/// minted); from anywhere else the body would not be JSON.
fn aligned(chunk: ReadChunk) -> Result<ReadChunk, ApiError> {
    if !chunk.aligned && content_type::is_json(&chunk.info.config.content_type) {
        return Err(RequestError::OffsetInsideMessage.into());
    }
    Ok(chunk)
}

/// How long until the reader's credentials expire (`None`: never).
fn credentials_left<E: Engine>(st: &AppState<E>, access: &Access) -> Option<Duration> {
    let left_ms = access.expires_at_ms?.saturating_sub(st.clock.now_ms());
    Some(Duration::from_millis(u64::try_from(left_ms).unwrap_or(0)))
}

/// Waits for the tail to pass `after` (or closure) for at most `timeout`, in slices: each slice
/// is an access that renews the sliding TTL, so a stream with a live reader does not expire
/// while it waits (section 5.1).
async fn wait_live<E: Engine>(
    st: &AppState<E>,
    path: &str,
    after: Offset,
    timeout: Duration,
) -> Result<WaitOutcome, ApiError> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
        let slice = remaining.min(TTL_RENEW_INTERVAL);
        match st.engine.wait(path, after, slice, st.clock.now_ms()).await? {
            WaitOutcome::TimedOut(_) if slice < remaining => continue,
            outcome => return Ok(outcome),
        }
    }
}

fn cursor_for<E: Engine>(st: &AppState<E>, q: &ReadQuery) -> u64 {
    cursor::next_cursor(u64::try_from(st.clock.now_ms()).unwrap_or(0), q.cursor.as_deref(), st.clock.jitter_s())
}

/// Counts a read for `--metrics-streams` (nothing to do without it).
fn count_read<E: Engine>(st: &AppState<E>, path: &str, bytes: usize) {
    if let Some(series) = &st.stream_metrics {
        series.read(path, bytes);
    }
}

/// Where a catch-up response of a byte stream ends when its first read (`chunk`, up to
/// `max_read_bytes`) did not reach the tail: at the tail as the read found it, or
/// `catch_up_bytes` after `from`, whichever comes first. `None`: the chunk is the whole answer
/// (a JSON stream, whose responses are whole messages rendered as one array, or the tail reached).
///
/// Any offset of a byte stream can start a read, so the end needs no append boundary; a response
/// for an offset still always starts there, and its entity tag names its end, so caching by
/// offset stays correct.
fn catch_up_end<E: Engine>(st: &AppState<E>, chunk: &ReadChunk, from: Offset) -> Option<Offset> {
    if content_type::is_json(&chunk.info.config.content_type) || chunk.up_to_date() {
        return None;
    }
    let end = chunk.info.tail.0.min(from.0.saturating_add(st.config.catch_up_bytes));
    (end > chunk.next.0).then_some(Offset(end))
}

/// The body of a catch-up response that runs past its first read: that read's bytes, then
/// bounded reads of up to `max_read_bytes` each until `end`, one at a time as the client takes
/// them (a reader that stops reading pins one piece, not the response). The bytes below the tail
/// never change, so the pieces are the bytes the headers promised; a read that fails midway (the
/// stream deleted or trimmed under the reader) ends the body short, and the client, holding a
/// `Content-Length`, sees the response cut.
fn catch_up_body<E: Engine>(st: AppState<E>, path: String, first: Bytes, after_first: Offset, end: Offset) -> Body {
    let start = (st, path, Some(first), after_first);
    let reads = futures_util::stream::try_unfold(start, move |(st, path, first, at)| async move {
        if let Some(b) = first {
            return Ok(Some((vec![b], (st, path, None, at))));
        }
        if at >= end {
            return Ok(None);
        }
        let want = usize::try_from(end.0 - at.0).unwrap_or(usize::MAX).min(st.config.max_read_bytes);
        // As pieces: an engine that holds the bytes apart (mapped segment ranges) hands them
        // over without gathering them, and a plain socket sends them with `sendfile(2)`.
        let read = match st.engine.read_pieces(ReadRequest::new(&path, at, want, st.clock.now_ms()).bounded()).await {
            Ok(r) if !r.is_empty() && r.next <= end => r,
            Ok(_) => return Err(std::io::Error::other("a catch-up read found less than the response promised")),
            Err(e) => {
                tracing::debug!(stream = %path, at = at.0, error = %e, "catch-up response cut short");
                return Err(std::io::Error::other(e));
            }
        };
        if let Some(series) = &st.stream_metrics {
            series.read_more(&path, read.len());
        }
        let next = read.next;
        Ok(Some((read.pieces, (st, path, None, next))))
    });
    let pieces = reads
        .map_ok(|pieces| futures_util::stream::iter(pieces.into_iter().map(Ok::<_, std::io::Error>)))
        .try_flatten();
    Body::from_stream(pieces)
}

/// A response body and what is known of its size before it is sent.
enum Payload {
    /// Held whole.
    Whole(Bytes),
    /// Produced while it is sent; exactly the bytes from `from` to `next` (sent as
    /// `Content-Length`).
    Streamed(Body),
}

/// A 200 carrying a chunk (possibly empty at the tail).
fn render_chunk(
    chunk: &ReadChunk,
    from: Offset,
    is_now: bool,
    cursor: Option<u64>,
    req_headers: &HeaderMap,
) -> Response {
    let body = if content_type::is_json(&chunk.info.config.content_type) {
        Bytes::from(json::render_array(&chunk.data))
    } else {
        chunk.data.clone()
    };
    render(&chunk.info, from, chunk.next, is_now, cursor, req_headers, Payload::Whole(body))
}

/// A 200 carrying the bytes from `from` to `next` of the stream `info` describes (as read).
fn render(
    info: &StreamInfo,
    from: Offset,
    next: Offset,
    is_now: bool,
    cursor: Option<u64>,
    req_headers: &HeaderMap,
    body: Payload,
) -> Response {
    let at_tail = next >= info.tail;
    let eof = info.closed && at_tail;
    let mut pairs =
        vec![("content-type", info.config.content_type.clone()), (names::STREAM_NEXT_OFFSET, next.to_string())];
    if at_tail {
        pairs.push((names::STREAM_UP_TO_DATE, "true".into()));
    }
    if eof {
        pairs.push((names::STREAM_CLOSED, "true".into()));
    }
    if let Some(c) = cursor {
        pairs.push((names::STREAM_CURSOR, c.to_string()));
    }
    if is_now || next == from {
        pairs.push(("cache-control", "no-store".into()));
    } else {
        let private = req_headers.contains_key("authorization");
        pairs.push(("cache-control", if private { CACHEABLE_PRIVATE } else { CACHEABLE }.into()));
    }
    // Varies with the stream, the range and closure, so a 304 never hides new data or EOF.
    let etag = (!is_now).then(|| format!("\"{}:{}:{}{}\"", info.id, from.0, next.0, if eof { ":c" } else { "" }));
    // If-Match on a read, per HTTP: `*`, or one of the tags must be this response's (strong).
    if let Some(cond) = req_headers.get("if-match").map(|v| v.to_str().unwrap_or("")) {
        let ok = cond.trim() == "*" || etag.as_ref().is_some_and(|e| cond.split(',').any(|t| t.trim() == e));
        if !ok {
            return crate::error::ApiError::PreconditionEtag.into_response();
        }
    }
    if let Some(etag) = etag {
        let matches = req_headers
            .get("if-none-match")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.split(',').any(|t| t.trim() == etag || t.trim() == "*"));
        pairs.push(("etag", etag));
        if matches {
            return respond(StatusCode::NOT_MODIFIED, pairs, Body::empty());
        }
    }
    let body = match body {
        Payload::Whole(b) => Body::from(b),
        Payload::Streamed(b) => {
            pairs.push(("content-length", (next.0 - from.0).to_string()));
            b
        }
    };
    respond(StatusCode::OK, pairs, body)
}

/// A 204: nothing new (or EOF) at `tail`.
fn no_content(info: &StreamInfo, cursor: u64) -> Response {
    let mut pairs = vec![
        (names::STREAM_NEXT_OFFSET, info.tail.to_string()),
        (names::STREAM_UP_TO_DATE, "true".into()),
        ("cache-control", "no-store".into()),
    ];
    if info.closed {
        pairs.push((names::STREAM_CLOSED, "true".into()));
    } else {
        pairs.push((names::STREAM_CURSOR, cursor.to_string()));
    }
    respond(StatusCode::NO_CONTENT, pairs, Body::empty())
}

#[allow(clippy::too_many_arguments)]
async fn long_poll<E: Engine>(
    st: &AppState<E>,
    path: &str,
    q: &ReadQuery,
    from: Offset,
    info: StreamInfo,
    req_headers: &HeaderMap,
    access: &Access,
) -> Result<Response, ApiError> {
    let cursor = cursor_for(st, q);
    // A long-poll never outlives the credentials it was allowed with.
    let timeout =
        credentials_left(st, access).map_or(st.config.long_poll_timeout, |left| left.min(st.config.long_poll_timeout));
    if from >= info.tail {
        if info.closed {
            return Ok(no_content(&info, cursor));
        }
        let _live = st.live.acquire(path, "long-poll")?;
        let seen = match wait_live(st, path, from, timeout).await? {
            WaitOutcome::Changed(i) if i.tail > from => i,
            WaitOutcome::Changed(i) | WaitOutcome::TimedOut(i) => return Ok(no_content(&i, cursor)),
        };
        let chunk = aligned(
            st.engine
                .read(ReadRequest::new(path, from, st.config.max_read_bytes, st.clock.now_ms()).after(&seen))
                .await?,
        )?;
        count_read(st, path, chunk.data.len());
        return Ok(render_chunk(&chunk, from, false, Some(cursor), req_headers));
    }
    let chunk =
        aligned(st.engine.read(ReadRequest::new(path, from, st.config.max_read_bytes, st.clock.now_ms())).await?)?;
    count_read(st, path, chunk.data.len());
    Ok(render_chunk(&chunk, from, false, Some(cursor), req_headers))
}

/// The comment an SSE answer sends when it has had nothing to say for a keep-alive interval.
const KEEP_ALIVE: &[u8] = b": keep-alive\n\n";

/// State of one SSE response.
struct SseState<E> {
    st: AppState<E>,
    path: String,
    offset: Offset,
    cursor: u64,
    encoding: DataEncoding,
    json: bool,
    /// Whether any control event was sent: at the tail, one `upToDate` control is sent first and
    /// then only after new data.
    sent_control: bool,
    /// When the server ends the response: so clients reconnect through CDNs, or because the
    /// reader's credentials expire then.
    deadline: tokio::time::Instant,
    /// The deadline is the credentials' expiry: the response ends with a control event saying so.
    ends_for_credentials: bool,
    done: bool,
    /// This response's place among the live readers, until it ends; and the events the stream's
    /// readers share.
    live: LiveSlot,
    /// The chunk read before the response began, sent first.
    first: Option<ReadChunk>,
    /// What the last wait saw when it woke: the next read may take the stream's state from it.
    seen: Option<StreamInfo>,
    /// The data event being sent, framed a piece at a time: a reader that stops reading holds
    /// one piece (and a share of the chunk) instead of a framed copy of the whole chunk.
    sending: Option<Sending>,
    /// The connection's park, where this reader waits parked ([`crate::fanout`]): plain HTTP/1
    /// on the server's engine.
    park: Option<oncelog_http1::Park>,
}

/// What a wait step of an SSE response leads to.
enum Step {
    /// Send this (a keep-alive comment).
    Emit(Bytes),
    /// Look at the stream again.
    Again,
    /// End the response.
    End,
}

/// A data event on its way out, and the control event that follows it.
struct Sending {
    event: sse::DataEvent,
    up_to_date: bool,
    closed: bool,
}

#[allow(clippy::too_many_arguments)]
fn sse<E: Engine>(
    st: &AppState<E>,
    path: &str,
    q: &ReadQuery,
    from: Offset,
    info: &StreamInfo,
    access: &Access,
    first: Option<ReadChunk>,
    own_connection: bool,
) -> Result<Response, ApiError> {
    let live = st.live.acquire(path, "sse")?;
    let text = content_type::sse_is_text(&info.config.content_type);
    let (lifetime, ends_for_credentials) = match credentials_left(st, access) {
        Some(left) if left < st.config.sse_max_duration => (left, true),
        _ => (st.config.sse_max_duration, false),
    };
    let state = SseState {
        st: st.clone(),
        path: path.to_owned(),
        offset: from,
        cursor: cursor_for(st, q),
        encoding: if text { DataEncoding::Text } else { DataEncoding::Base64 },
        json: content_type::is_json(&info.config.content_type),
        sent_control: false,
        deadline: tokio::time::Instant::now() + lifetime,
        ends_for_credentials,
        done: false,
        live,
        first,
        seen: None,
        sending: None,
        // The access log counts an answer's bytes as its task writes them: with it on, readers
        // do not park.
        park: if own_connection && !st.config.access_log { crate::fanout::current_park() } else { None },
    };
    let events = futures_util::stream::unfold(state, |mut s| async move {
        let bytes = s.next_event().await?;
        Some((Ok::<Bytes, std::convert::Infallible>(bytes), s))
    });
    let mut pairs = vec![("content-type", "text/event-stream".to_owned()), ("cache-control", "no-cache".to_owned())];
    if !text {
        pairs.push((names::STREAM_SSE_DATA_ENCODING, "base64".into()));
    }
    Ok(respond(StatusCode::OK, pairs, Body::from_stream(events)))
}

impl<E: Engine> SseState<E> {
    /// The next piece of the event stream, or `None` to end the response.
    async fn next_event(&mut self) -> Option<Bytes> {
        loop {
            if self.done {
                return None;
            }
            if let Some(sending) = &mut self.sending {
                // One piece per poll: the connection asks for the next only when it took this one.
                // Sized to the piece (plus its control event): small events stay small.
                let mut out = Vec::with_capacity(sending.event.next_piece_len() + 160);
                if sending.event.next_into(&mut out) {
                    return Some(Bytes::from(out));
                }
                let (up_to_date, closed) = (sending.up_to_date, sending.closed);
                self.sending = None;
                // The last piece and its control go out in one write.
                self.control(&mut out, up_to_date, closed);
                return Some(Bytes::from(out));
            }
            if self.ends_for_credentials && tokio::time::Instant::now() >= self.deadline {
                let mut out = Vec::new();
                self.end_for_credentials(&mut out);
                return Some(Bytes::from(out));
            }
            let first = self.first.take();
            if first.is_none() {
                if let Some(bytes) = self.shared_frame() {
                    return Some(bytes);
                }
                // Known to be at the tail of an open stream (the control said so): nothing to
                // read until the wait says the stream moved; a wait returns at once if it did.
                let at_tail = self.seen.as_ref().filter(|s| self.offset >= s.tail && !s.closed);
                if let Some(stream) = at_tail.filter(|_| self.sent_control).map(|s| (s.id, s.config.compaction)) {
                    match self.wait_or_park(stream.0, stream.1).await {
                        Step::Emit(bytes) => return Some(bytes),
                        Step::Again => continue,
                        Step::End => return None,
                    }
                }
            }
            // One lookup per step: at the tail the read is empty and still reports closure.
            let chunk = match first {
                Some(chunk) => chunk,
                None => match sse_read(
                    &self.st,
                    &self.path,
                    self.offset,
                    self.json,
                    self.seen.take().as_ref(),
                    self.st.clock.now_ms(),
                )
                .await
                {
                    Ok(chunk) => chunk,
                    // A trim overtook this reader: say so; its reconnect gets the 410 and the
                    // stream's earliest offset.
                    Err(oncelog_storage::LookupError::Trimmed { .. }) => {
                        let mut out = Vec::new();
                        self.end_with(&mut out, "trimmed");
                        return Some(Bytes::from(out));
                    }
                    Err(_) => return None,
                },
            };
            if chunk.next > self.offset {
                count_read(&self.st, &self.path, chunk.data.len());
                let from = self.offset;
                self.offset = chunk.next;
                let (up_to_date, closed) = (chunk.up_to_date(), chunk.info.closed && chunk.up_to_date());
                if let Some(bytes) = frame_whole(&chunk, self.encoding, self.json, self.cursor) {
                    // One piece: framed whole with its control and left for the stream's other
                    // readers, which a commit wakes together (`shared_frame`).
                    self.sent_control = true;
                    self.done = closed;
                    let (id, cursor) = (chunk.info.id, self.cursor);
                    self.live.frames.put(Framed {
                        id,
                        from,
                        next: chunk.next,
                        cursor,
                        up_to_date,
                        closed,
                        bytes: bytes.clone(),
                    });
                    self.seen = Some(chunk.info);
                    return Some(bytes);
                }
                // The next look may start from what this read saw (an engine may then skip
                // looking the stream up again before it waits).
                self.seen = Some(chunk.info.clone());
                let event = data_event(&chunk, self.encoding, self.json);
                self.sending = Some(Sending { event, up_to_date, closed });
                continue;
            }
            if chunk.info.closed {
                let mut out = Vec::new();
                self.control(&mut out, true, true);
                return Some(Bytes::from(out));
            }
            if !self.sent_control {
                let mut out = Vec::new();
                self.control(&mut out, true, false);
                return Some(Bytes::from(out));
            }
            match self.wait_or_park(chunk.info.id, chunk.info.config.compaction).await {
                Step::Emit(bytes) => return Some(bytes),
                Step::Again => continue,
                Step::End => return None,
            }
        }
    }

    /// Waits for the stream (`id` as last seen; `compaction`: whether it is compacted) to pass
    /// this reader's offset, for at most a keep-alive interval: parked with its runtime's fan-out
    /// where it can be ([`crate::fanout`]), else as a task waiting on the stream.
    async fn wait_or_park(&mut self, id: u64, compaction: bool) -> Step {
        // A compacted stream's bytes below the tail may change: its events are never shared.
        if let Some(park) = self.park.as_ref().filter(|_| !compaction).cloned() {
            if let Some(step) = self.park_step(park, id).await {
                return step;
            }
        }
        self.wait_step().await
    }

    /// Parked until its fan-out hands it back or a keep-alive interval passes; `None` where it
    /// could not park.
    async fn park_step(&mut self, park: oncelog_http1::Park, id: u64) -> Option<Step> {
        let remaining = self.deadline.saturating_duration_since(tokio::time::Instant::now());
        if remaining == Duration::ZERO {
            return None;
        }
        let slice = remaining.min(self.st.config.sse_keepalive);
        let at = crate::fanout::At {
            path: &self.path,
            id,
            offset: self.offset,
            cursor: self.cursor,
            json: self.json,
            encoding: self.encoding,
        };
        let parked = crate::fanout::park(&self.st, park, at)?;
        let handed_back = tokio::select! {
            biased;
            () = parked.back() => true,
            () = tokio::time::sleep(slice) => false,
        };
        let left = parked.leave();
        if left.delivered {
            // Each event went out whole, with its control event (`frame_whole`).
            self.offset = left.offset;
            self.sent_control = true;
            self.done = left.done;
        }
        // Looked at again before the next wait.
        self.seen = None;
        Some(if handed_back || self.done || slice == remaining {
            Step::Again
        } else {
            Step::Emit(Bytes::from_static(KEEP_ALIVE))
        })
    }

    /// Waits for the stream to pass this reader's offset, for at most a keep-alive interval.
    async fn wait_step(&mut self) -> Step {
        let remaining = self.deadline.saturating_duration_since(tokio::time::Instant::now());
        if remaining == Duration::ZERO {
            return if self.ends_for_credentials { Step::Again } else { Step::End };
        }
        // A comment now and then: it keeps proxies from timing the response out, and the
        // write is how a reader that went away is noticed (its place given back).
        let slice = remaining.min(self.st.config.sse_keepalive);
        match wait_live(&self.st, &self.path, self.offset, slice).await {
            Err(_) => Step::End,
            Ok(WaitOutcome::TimedOut(_)) if slice < remaining => Step::Emit(Bytes::from_static(KEEP_ALIVE)),
            Ok(WaitOutcome::TimedOut(_)) => Step::Again,
            Ok(WaitOutcome::Changed(info)) => {
                self.seen = Some(info);
                Step::Again
            }
        }
    }

    /// The event another reader of this stream framed, when it is exactly what this reader would
    /// frame now: woken by a wait that saw the stream (`seen`), the same stream, from this
    /// reader's offset, with its cursor, not below the earliest offset (a trim since), and
    /// saying up to date exactly when the tail seen is where it ends. The bytes below the tail
    /// never change; a compacted stream's may, so its events are never shared.
    fn shared_frame(&mut self) -> Option<Bytes> {
        let seen = self.seen.as_ref()?;
        let f = self.live.frames.get()?;
        let same = f.id == seen.id && f.from == self.offset && f.cursor == self.cursor && !seen.config.compaction;
        if !same || seen.earliest > self.offset || (f.next >= seen.tail) != f.up_to_date {
            return None;
        }
        count_read(&self.st, &self.path, f.bytes_covered());
        // `seen` stays: its tail is at most this event's end (checked above), so the next step
        // knows whether to read or wait.
        self.offset = f.next;
        self.sent_control = true;
        self.done = f.closed;
        Some(f.bytes.clone())
    }

    fn control(&mut self, out: &mut Vec<u8>, up_to_date: bool, closed: bool) {
        self.sent_control = true;
        self.done = closed;
        sse::control_event(
            out,
            &Control {
                next_offset: self.offset,
                cursor: (!closed).then_some(self.cursor),
                up_to_date,
                closed,
                end_reason: None,
            },
        );
    }

    /// The last event of a response whose reader's credentials expired.
    fn end_for_credentials(&mut self, out: &mut Vec<u8>) {
        self.end_with(out, "tokenExpired");
    }

    /// The last event of a response the server ends for `reason` (an `endReason`).
    fn end_with(&mut self, out: &mut Vec<u8>, reason: &'static str) {
        self.done = true;
        sse::control_event(
            out,
            &Control {
                next_offset: self.offset,
                cursor: None,
                up_to_date: false,
                closed: false,
                end_reason: Some(reason),
            },
        );
    }
}
