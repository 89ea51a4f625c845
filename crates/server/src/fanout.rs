//! Live readers on a reactor (issue 47, step 5): an SSE reader of a plain HTTP/1 connection that
//! waits at the tail of its stream is **parked** with its runtime's fan-out for that stream,
//! and costs its task nothing per event. The fan-out — one task per (connection runtime,
//! stream), one wait on the stream — reads and frames each new event once (per cursor) and
//! writes it to every parked reader's socket through the connection's [`Park`] (one `sendmsg`
//! each, chunk line included), advancing the reader's offset in the cell they share.
//!
//! A reader is **handed back** to its task (a wake; it goes on as an unparked reader would, from
//! the offset the fan-out left it at) whenever the fan-out cannot do exactly what the reader
//! would have done: the socket is full or failed (the connection's own writes, under
//! `--write-timeout-ms`, take over), the event is larger than one piece, the stream was
//! compacted, closed, deleted or trimmed, or the reader is not where the event starts. Its own
//! timer (the keep-alive interval, the response's lifetime, the credentials' end) takes it back
//! too. So every rule of an SSE answer stays in `read.rs`; the fan-out only repeats, for many
//! sockets at once, the one step that dominates a live stream (`live_read::frame_whole`).
//!
//! Parking happens only where the connection's task and the fan-out share one thread (the
//! current-thread connection runtimes of `--io-threads`), so a fan-out's writes never race its
//! readers' tasks; the state is behind locks anyway, as the answer's body must be `Send`.

use std::cell::RefCell;
use std::collections::HashMap;
use std::future::poll_fn;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Poll, Waker};

use bytes::Bytes;
use oncelog_http1::{Park, Sent};
use oncelog_protocol::sse::DataEncoding;
use oncelog_protocol::Offset;
use oncelog_storage::{Engine, WaitOutcome};
use tokio::sync::Notify;

use crate::state::AppState;

/// The park of the connection the current task serves (a plain HTTP/1 connection of our engine,
/// `conns::Conn::set_park`), where its readers may park: only on a current-thread connection
/// runtime, where the fan-out and the connection share one thread.
pub fn current_park() -> Option<Park> {
    let on_own_runtime = tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread);
    if !on_own_runtime {
        return None;
    }
    crate::conns::current_park()
}

thread_local! {
    /// This runtime's fan-outs, by stream path.
    static FANOUTS: RefCell<HashMap<String, Arc<FanOut>>> = RefCell::new(HashMap::new());
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What one stream's SSE readers of one runtime share.
struct FanOut {
    /// The stream (a path deleted and created again is another).
    id: u64,
    json: bool,
    encoding: DataEncoding,
    inner: Mutex<Inner>,
    /// The last reader left: the task ends now rather than at its next wake.
    emptied: Notify,
}

#[derive(Default)]
struct Inner {
    readers: Vec<Arc<Reader>>,
    /// The offset the task waits past: a reader below it would wait for nothing (it does not
    /// park).
    waiting_after: Offset,
    /// The task runs; once it ended, the next reader starts another.
    running: bool,
}

/// A parked reader, as its fan-out sees it.
struct Reader {
    park: Park,
    cursor: u64,
    cell: Mutex<Cell>,
}

#[derive(Default)]
struct Cell {
    /// Where the reader's next event starts.
    offset: Offset,
    /// Events went out for it while parked.
    delivered: bool,
    /// The last of them said the stream is closed: the answer ends.
    done: bool,
    /// Handed back to its task.
    back: bool,
    waker: Option<Waker>,
}

impl Cell {
    fn hand_back(&mut self) {
        self.back = true;
        if let Some(w) = self.waker.take() {
            w.wake();
        }
    }
}

/// A reader's place with its fan-out, while it is parked; it leaves when dropped.
pub struct Parked {
    fan: Arc<FanOut>,
    reader: Arc<Reader>,
}

/// What became of a reader while it was parked.
pub struct Left {
    pub offset: Offset,
    pub delivered: bool,
    pub done: bool,
}

/// How a reader parks: its stream and where it is.
pub struct At<'a> {
    pub path: &'a str,
    /// The stream's id as the reader last saw it.
    pub id: u64,
    pub offset: Offset,
    pub cursor: u64,
    pub json: bool,
    pub encoding: DataEncoding,
}

/// Parks a reader at `at` on its connection's `park`; `None` where it cannot (it waits as an
/// unparked reader does).
pub fn park<E: Engine>(st: &AppState<E>, park: Park, at: At<'_>) -> Option<Parked> {
    FANOUTS.with(|fanouts| {
        let mut fanouts = fanouts.borrow_mut();
        let live = fanouts.get(at.path).filter(|f| lock(&f.inner).running).cloned();
        let fan = match live {
            Some(fan) if fan.id != at.id => return None,
            Some(fan) => fan,
            // None, or one whose task ended (no reader was left): a new one.
            None => {
                let fan = Arc::new(FanOut {
                    id: at.id,
                    json: at.json,
                    encoding: at.encoding,
                    inner: Mutex::new(Inner { running: true, waiting_after: at.offset, ..Inner::default() }),
                    emptied: Notify::new(),
                });
                fanouts.insert(at.path.to_owned(), Arc::clone(&fan));
                tokio::spawn(run(st.clone(), at.path.to_owned(), Arc::clone(&fan)));
                fan
            }
        };
        let mut inner = lock(&fan.inner);
        if at.offset < inner.waiting_after {
            return None;
        }
        let reader = Arc::new(Reader {
            park,
            cursor: at.cursor,
            cell: Mutex::new(Cell { offset: at.offset, ..Cell::default() }),
        });
        inner.readers.push(Arc::clone(&reader));
        drop(inner);
        metrics::counter!("oncelog_sse_parks_total").increment(1);
        Some(Parked { fan, reader })
    })
}

impl Parked {
    /// Returns once the reader is handed back to its task.
    pub async fn back(&self) {
        poll_fn(|cx| {
            let mut cell = lock(&self.reader.cell);
            if cell.back {
                return Poll::Ready(());
            }
            if !cell.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                cell.waker = Some(cx.waker().clone());
            }
            Poll::Pending
        })
        .await;
    }

    /// Leaves the fan-out: what was delivered meanwhile.
    pub fn leave(self) -> Left {
        let cell = lock(&self.reader.cell);
        Left { offset: cell.offset, delivered: cell.delivered, done: cell.done }
    }
}

impl Drop for Parked {
    fn drop(&mut self) {
        let mut inner = lock(&self.fan.inner);
        if let Some(i) = inner.readers.iter().position(|r| Arc::ptr_eq(r, &self.reader)) {
            inner.readers.swap_remove(i);
            if inner.readers.is_empty() {
                self.fan.emptied.notify_one();
            }
        }
    }
}

/// The fan-out's task: waits on the stream past its readers' offset, and delivers each new event
/// to every reader there; ends when no reader is left.
async fn run<E: Engine>(st: AppState<E>, path: String, fan: Arc<FanOut>) {
    loop {
        let at = {
            let mut inner = lock(&fan.inner);
            match inner.readers.iter().map(|r| lock(&r.cell).offset).min() {
                Some(at) => {
                    inner.waiting_after = at;
                    at
                }
                None => {
                    inner.running = false;
                    break;
                }
            }
        };
        // Each wait is an access: the stream's sliding TTL is renewed while readers wait, as
        // their own waits would.
        let waited = tokio::select! {
            biased;
            () = fan.emptied.notified() => continue,
            waited = st.engine.wait(&path, at, crate::live_read::TTL_RENEW_INTERVAL, st.clock.now_ms()) => waited,
        };
        let info = match waited {
            Ok(WaitOutcome::TimedOut(_)) => continue,
            Ok(WaitOutcome::Changed(info)) if info.id == fan.id && info.tail > at => info,
            Ok(WaitOutcome::Changed(info)) if info.id == fan.id && !info.closed => continue,
            // Deleted, re-created, or closed here: each reader's own path says so.
            _ => {
                hand_back(&fan, Why::Stream, |_| true);
                continue;
            }
        };
        match crate::live_read::sse_read(&st, &path, at, fan.json, Some(&info), st.clock.now_ms()).await {
            Ok(chunk) => deliver(&st, &path, &fan, at, &chunk),
            Err(_) => hand_back(&fan, Why::Stream, |offset| offset == at),
        }
    }
    FANOUTS.with(|fanouts| {
        let mut fanouts = fanouts.borrow_mut();
        if fanouts.get(&path).is_some_and(|f| Arc::ptr_eq(f, &fan)) {
            fanouts.remove(&path);
        }
    });
}

/// Why readers were handed back (the `reason` label of `oncelog_sse_handed_back_total`).
#[derive(Clone, Copy)]
enum Why {
    /// The socket was full (or failed): the connection's own writes take over.
    Full,
    /// The event is not one whole piece any reader may share (large, or compacted).
    Event,
    /// The stream closed, was deleted or re-created, or its read failed (a trim).
    Stream,
}

impl Why {
    fn label(self) -> &'static str {
        match self {
            Why::Full => "full",
            Why::Event => "event",
            Why::Stream => "stream",
        }
    }
}

fn counted_back(why: Why, n: usize) {
    if n > 0 {
        metrics::counter!("oncelog_sse_handed_back_total", "reason" => why.label()).increment(n as u64);
    }
}

/// Hands back (and lets go of) the readers whose offset `which` picks.
fn hand_back(fan: &FanOut, why: Why, which: impl Fn(Offset) -> bool) {
    let mut n = 0;
    lock(&fan.inner).readers.retain(|r| {
        let mut cell = lock(&r.cell);
        if which(cell.offset) {
            cell.hand_back();
            n += 1;
            return false;
        }
        true
    });
    counted_back(why, n);
}

/// Writes the event `chunk` (read from `at`) to every reader at `at`.
fn deliver<E: Engine>(st: &AppState<E>, path: &str, fan: &FanOut, at: Offset, chunk: &oncelog_storage::ReadChunk) {
    if chunk.next <= at || chunk.info.id != fan.id {
        return hand_back(fan, Why::Stream, |offset| offset == at);
    }
    // Framed once per cursor (readers that came within one cursor interval share one).
    let mut frames: Vec<(u64, Option<Bytes>)> = Vec::with_capacity(1);
    let closed = chunk.info.closed && chunk.up_to_date();
    let (mut delivered, mut large, mut full) = (0usize, 0usize, 0usize);
    lock(&fan.inner).readers.retain(|r| {
        let mut cell = lock(&r.cell);
        if cell.offset != at {
            return true;
        }
        let frame = match frames.iter().find(|(c, _)| *c == r.cursor) {
            Some((_, f)) => f.clone(),
            None => {
                let f = crate::live_read::frame_whole(chunk, fan.encoding, fan.json, r.cursor);
                frames.push((r.cursor, f.clone()));
                f
            }
        };
        let Some(frame) = frame else {
            cell.hand_back();
            large += 1;
            return false;
        };
        match r.park.send(&frame) {
            Sent::All if !closed => {
                cell.offset = chunk.next;
                cell.delivered = true;
                delivered += 1;
                true
            }
            sent => {
                if sent == Sent::All || sent == Sent::Partly {
                    cell.offset = chunk.next;
                    cell.delivered = true;
                    cell.done = closed;
                    delivered += 1;
                }
                // Closed: the answer ends on its task; else the socket is full (or failed).
                if !closed || sent != Sent::All {
                    full += 1;
                }
                cell.hand_back();
                false
            }
        }
    });
    counted_back(Why::Event, large);
    counted_back(Why::Full, full);
    if delivered > 0 {
        metrics::counter!("oncelog_sse_parked_events_total").increment(delivered as u64);
    }
    if let (Some(series), true) = (&st.stream_metrics, delivered > 0) {
        series.reads(path, delivered, chunk.data.len());
    }
}
