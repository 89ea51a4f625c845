//! The connections a listener serves and what each is doing, so that at `--max-connections` the
//! server makes room instead of leaving a writer in the backlog (issue 45, item 7):
//!
//! - a connection is **idle** while no request is in flight on it (a keep-alive socket between
//!   requests, or a new one that has not sent its first request); at the limit, a new connection
//!   takes the place of the one idle longest, once that has been idle for [`IDLE_AFTER`], as
//!   proxies do. The evicted one is
//!   closed gracefully (HTTP/1: at once, or after the request that raced in; HTTP/2: `GOAWAY`);
//! - an HTTP/1 connection is **slow** while its request waits on the client for longer than
//!   [`SLOW_AFTER`]: a request body still arriving, or a response the client takes in slowly (or
//!   not at all). Slow connections and live readers together may hold all but
//!   [`connection_reserve`] of the connections; beyond that, at the limit, the
//!   connection slow the longest is closed to admit the new one. Its request loses nothing: a body
//!   not yet whole was never applied, and a response being sent was already decided. The check is
//!   made again by the connection's own task, which also runs its request, so a body that just
//!   ended (a write about to be applied) is never cut;
//! - an HTTP/2 connection is **slow** when every stream open on it has waited on the client for
//!   longer than [`SLOW_AFTER`] (a request body still arriving, or an answer held by the
//!   client's flow-control window), with the same share and the same eviction; a live reader
//!   makes it live, as on HTTP/1;
//! - everything else (a request being handled, on either protocol) is left alone; when all
//!   connections are such, a new one waits until one ends or becomes evictable.
//!
//! The registry also tells each HTTP/1 connection's task whether a live reader waits on it (see
//! [`LiveMark`]): the task then watches the socket, and drops the connection when the client
//! closes it (issue 46, item 4). The connections holding live readers (HTTP/1 and HTTP/2 alike)
//! are what `live::LiveSlots` holds to its share.
//!
//! And it tells each HTTP/2 connection's task when one of its answers has waited on the client's
//! flow control for `--write-timeout-ms` ([`Conn::stalled`]; issue 45, item 8). A client can keep
//! its socket drained and answer PINGs while it never opens a stream's window: no write then
//! blocks, so the socket's deadline ([`crate::deadline_io`]) never fires, and hyper stops taking
//! the answer's body without a limit, holding its pieces (mapped segment ranges: a deleted
//! segment's disk space too). hyper cannot reset one stream from outside, so, as on HTTP/1, the
//! connection is closed. See `Paced` for how a stalled answer is told from a live reader
//! waiting for data.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::http::Request;
use axum::response::Response;
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use tokio::sync::Notify;
use tower_service::Service;

/// The connections of `max_connections` that live readers (and, at the limit, slow connections)
/// never hold: a sixteenth, at least 1, at most 1,024 — enough for writers and catch-up readers
/// while the rest are held by live ones.
pub fn connection_reserve(max_connections: usize) -> usize {
    (max_connections / 16).clamp(1, 1024)
}

/// How long an HTTP/1 request may wait on its client (body arriving, response being taken in)
/// before its connection counts as slow. Far below the body and write timeouts (10-60 s by
/// default), far above what a client on any working network needs between two pieces of a
/// request or an answer of ordinary size.
pub const SLOW_AFTER: Duration = Duration::from_secs(1);

/// How long a connection must have been idle to give its place: a new connection whose first
/// request is still on its way (or waits in the socket for its task), or a keep-alive one between
/// two requests of a busy client, is not idle in any useful sense, and closing it would cut a
/// request the client already sent.
pub const IDLE_AFTER: Duration = Duration::from_secs(1);

/// The most of an HTTP/2 answer's data handed to hyper at once (the protocol's default frame
/// size): hyper takes the next piece once the client's window has let out the last, so a client
/// that reads at all, however slowly, shows progress at least this often, and one whose window
/// stays shut leaves a piece in hyper's hands that [`Conn::stalled`] sees.
const H2_PIECE: usize = 16 << 10;

/// How often a new connection waiting for room looks again at the others (a connection becoming
/// idle or slow is not announced).
const ADMIT_RECHECK: Duration = Duration::from_millis(50);

tokio::task_local! {
    /// The connection whose request the current task serves: an HTTP/1 connection's task, or the
    /// task hyper runs an HTTP/2 stream's handler in (scoped by [`Tracked`]).
    static CONNECTION: Arc<Conn>;
}

/// Why a connection is asked to close.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// It was idle when a new connection needed its place: close gracefully.
    Idle,
    /// It was slow when a new connection needed its place: close now if it still is.
    Slow,
    /// The server is shutting down: close gracefully.
    Shutdown,
}

impl Order {
    fn code(self) -> u8 {
        match self {
            Order::Idle => 1,
            Order::Slow => 2,
            Order::Shutdown => 3,
        }
    }

    fn from_code(code: u8) -> Option<Order> {
        match code {
            1 => Some(Order::Idle),
            2 => Some(Order::Slow),
            3 => Some(Order::Shutdown),
            _ => None,
        }
    }
}

/// One connection's state, shared by its task, its requests and the registry.
pub struct Conn {
    id: u64,
    epoch: Instant,
    /// Requests being served (HTTP/2: streams), answers still being sent included.
    in_flight: AtomicU32,
    /// Requests begun on it so far.
    started: AtomicU64,
    /// When the last request ended (or the connection was accepted), in ms since `epoch`.
    last_active: AtomicU64,
    /// Since when (ms since `epoch`, plus one; 0: not) the request's body is awaited (HTTP/1).
    receiving_since: AtomicU64,
    /// Since when (as above) the answer is being sent (HTTP/1).
    sending_since: AtomicU64,
    /// Live readers waiting or streaming on it (HTTP/1: at most one).
    live: AtomicU32,
    /// Taken out of the count of connections (asked to close).
    closing: AtomicBool,
    order: AtomicU8,
    orders: Notify,
    live_changed: Notify,
    /// Served as HTTP/2: slow by its streams ([`StreamWaits`]).
    http2: AtomicBool,
    /// A plain HTTP/1 connection of the server's engine: its park, where its SSE readers wait
    /// (`crate::fanout`).
    park: std::sync::OnceLock<oncelog_http1::Park>,
    /// HTTP/2 streams in flight, each with since when it waits on the client.
    streams: Mutex<HashMap<u64, Arc<StreamWaits>>>,
    next_stream: AtomicU64,
}

/// Since when (stamps as `Conn::stamp`; 0: not) an HTTP/2 stream waits on its client.
#[derive(Default)]
struct StreamWaits {
    /// Its request body is still arriving.
    receiving: AtomicU64,
    /// hyper holds a piece of its answer that the client's window has not let out (see
    /// [`Paced`]).
    sending: AtomicU64,
}

impl StreamWaits {
    /// Since when (ms since `epoch`) it waits on the client, if it does.
    fn waiting_since(&self) -> Option<u64> {
        [self.receiving.load(Ordering::Acquire), self.sending.load(Ordering::Acquire)]
            .into_iter()
            .filter(|s| *s > 0)
            .min()
            .map(|s| s - 1)
    }
}

impl Conn {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn stamp(&self) -> u64 {
        self.now_ms().saturating_add(1)
    }

    fn begin_request(&self, receiving: bool) {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.started.fetch_add(1, Ordering::Relaxed);
        if receiving {
            self.receiving_since.store(self.stamp(), Ordering::Release);
        }
    }

    fn body_received(&self) {
        self.receiving_since.store(0, Ordering::Release);
    }

    fn answer_ready(&self, sending: bool) {
        self.receiving_since.store(0, Ordering::Release);
        if sending {
            self.sending_since.store(self.stamp(), Ordering::Release);
        }
    }

    fn end_request(&self) {
        self.sending_since.store(0, Ordering::Release);
        self.last_active.store(self.now_ms(), Ordering::Release);
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
    }

    fn is_idle(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) == 0
    }

    /// Idle for at least [`IDLE_AFTER`].
    fn idle_long_enough(&self) -> bool {
        let idle_after = u64::try_from(IDLE_AFTER.as_millis()).unwrap_or(u64::MAX);
        self.is_idle() && self.now_ms().saturating_sub(self.last_active.load(Ordering::Acquire)) >= idle_after
    }

    /// No request was ever begun on it, and none is: closing it loses nothing.
    pub fn never_used(&self) -> bool {
        self.started.load(Ordering::Acquire) == 0 && self.is_idle()
    }

    /// Whether a live reader holds the connection.
    pub fn is_live(&self) -> bool {
        self.live.load(Ordering::Acquire) > 0
    }

    /// Since when (ms since `epoch`) its request has waited on the client, if it is slow; on
    /// HTTP/2, since when every stream in flight has.
    fn slow_since(&self) -> Option<u64> {
        if self.is_live() || self.is_idle() {
            return None;
        }
        let slow_after = u64::try_from(SLOW_AFTER.as_millis()).unwrap_or(u64::MAX);
        if self.http2.load(Ordering::Acquire) {
            let now = self.now_ms();
            let streams = self.streams.lock().unwrap_or_else(PoisonError::into_inner);
            let in_flight = self.in_flight.load(Ordering::Acquire) as usize;
            let waiting: Vec<u64> = streams
                .values()
                .filter_map(|w| w.waiting_since())
                .filter(|since| now.saturating_sub(*since) >= slow_after)
                .collect();
            // Every stream: one whose handler runs (or whose answer is being produced) is not
            // waiting on the client, and closing the connection would cut it.
            return if waiting.len() >= in_flight { waiting.into_iter().max() } else { None };
        }
        let since = [self.receiving_since.load(Ordering::Acquire), self.sending_since.load(Ordering::Acquire)]
            .into_iter()
            .filter(|s| *s > 0)
            .min()?
            - 1;
        (self.now_ms().saturating_sub(since) >= slow_after).then_some(since)
    }

    /// Whether it is slow now (see the module docs).
    pub fn is_slow(&self) -> bool {
        self.slow_since().is_some()
    }

    fn send(&self, order: Order) {
        self.order.store(order.code(), Ordering::Release);
        self.orders.notify_one();
    }

    /// The next order given to this connection.
    pub async fn next_order(&self) -> Order {
        loop {
            let notified = self.orders.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(order) = Order::from_code(self.order.swap(0, Ordering::AcqRel)) {
                return order;
            }
            notified.await;
        }
    }

    /// A record of an HTTP/2 stream (`receiving`: its body is still arriving), for
    /// [`Conn::slow_since`] and [`Conn::stalled`]; removed when dropped.
    fn watch_stream(self: &Arc<Self>, receiving: bool) -> StreamRecord {
        let id = self.next_stream.fetch_add(1, Ordering::Relaxed);
        let waits = Arc::new(StreamWaits::default());
        if receiving {
            waits.receiving.store(self.stamp(), Ordering::Release);
        }
        self.streams.lock().unwrap_or_else(PoisonError::into_inner).insert(id, Arc::clone(&waits));
        StreamRecord { clock: SendClock { conn: Arc::clone(self), waits }, id }
    }

    /// Since when (ms since `epoch`) the HTTP/2 answer waiting longest on its client's window has.
    fn stalled_since(&self) -> Option<u64> {
        let streams = self.streams.lock().unwrap_or_else(PoisonError::into_inner);
        streams.values().map(|w| w.sending.load(Ordering::Acquire)).filter(|s| *s > 0).min().map(|s| s - 1)
    }

    /// Returns once an HTTP/2 answer on this connection has waited `timeout` for its client to
    /// open its window (see the module docs). A connection without one sleeps, waking once per
    /// `timeout` to look again: an answer stalled since just after a look is found at its own
    /// deadline, since the next sleep ends there.
    pub async fn stalled(&self, timeout: Duration) {
        let timeout_ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        loop {
            let wait = match self.stalled_since() {
                Some(since) => {
                    let waited = self.now_ms().saturating_sub(since);
                    if waited >= timeout_ms {
                        return;
                    }
                    timeout_ms - waited
                }
                None => timeout_ms,
            };
            tokio::time::sleep(Duration::from_millis(wait)).await;
        }
    }

    /// Returns once a live reader waits on the connection (`true`) or none does (`false`).
    pub async fn wait_live(&self, live: bool) {
        loop {
            let notified = self.live_changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.is_live() == live {
                return;
            }
            notified.await;
        }
    }
}

/// A live reader on a connection, while it lives (see [`LiveMark::new`]).
pub struct LiveMark(Arc<Conn>);

impl Drop for LiveMark {
    fn drop(&mut self) {
        self.0.live.fetch_sub(1, Ordering::AcqRel);
        self.0.live_changed.notify_waiters();
    }
}

impl LiveMark {
    /// Marks `conn` as holding a live reader, until the mark is dropped: such a connection is
    /// neither idle nor slow, and (HTTP/1) its task drops it when the client closes the socket.
    pub fn new(conn: Arc<Conn>) -> LiveMark {
        conn.live.fetch_add(1, Ordering::AcqRel);
        conn.live_changed.notify_waiters();
        LiveMark(conn)
    }

    /// The mark is the connection's only one.
    pub fn is_last(&self) -> bool {
        self.0.live.load(Ordering::Acquire) == 1
    }
}

/// The connection whose request the current task serves (see [`CONNECTION`]).
pub fn current() -> Option<Arc<Conn>> {
    CONNECTION.try_with(Arc::clone).ok()
}

/// The park of the connection the current task serves, if it has one.
pub fn current_park() -> Option<oncelog_http1::Park> {
    CONNECTION.try_with(|conn| conn.park.get().cloned()).ok().flatten()
}

/// A connection of a registry of its own, for tests of what holds connections.
#[cfg(test)]
pub(crate) fn test_conn() -> Arc<Conn> {
    let place = Registry::new(1).try_admit().expect("a place");
    Arc::clone(place.conn())
}

impl Conn {
    /// Gives the connection its park (see `crate::fanout`); once.
    pub fn set_park(&self, park: oncelog_http1::Park) {
        let _ = self.park.set(park);
    }
}

/// Runs `fut` (an HTTP/1 connection's serving) with `conn` as the connection of its task.
pub async fn serving_http1<F: Future>(conn: Arc<Conn>, fut: F) -> F::Output {
    CONNECTION.scope(conn, fut).await
}

/// The connections of one listener; see the module docs.
pub struct Registry {
    max: usize,
    /// What slow connections and live readers never hold together.
    reserve: usize,
    epoch: Instant,
    next_id: AtomicU64,
    inner: Mutex<Inner>,
    /// A connection ended.
    ended: Notify,
}

#[derive(Default)]
struct Inner {
    conns: HashMap<u64, Arc<Conn>>,
    /// Connections not asked to close: at most `max`.
    counted: usize,
}

/// A connection's place in the registry; given back when dropped.
pub struct Place {
    registry: Arc<Registry>,
    conn: Arc<Conn>,
}

impl Place {
    pub fn conn(&self) -> &Arc<Conn> {
        &self.conn
    }

    /// The connection was asked to close as slow but is no longer: it counts again.
    pub fn keep(&self) {
        let mut inner = self.registry.lock();
        if self.conn.closing.swap(false, Ordering::AcqRel) {
            inner.counted += 1;
        }
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut inner = self.registry.lock();
        inner.conns.remove(&self.conn.id);
        if !self.conn.closing.load(Ordering::Acquire) {
            inner.counted = inner.counted.saturating_sub(1);
        }
        drop(inner);
        self.registry.ended.notify_waiters();
    }
}

impl Registry {
    pub fn new(max_connections: usize) -> Arc<Registry> {
        let max = max_connections.max(1);
        Arc::new(Registry {
            max,
            reserve: connection_reserve(max),
            epoch: Instant::now(),
            next_id: AtomicU64::new(0),
            inner: Mutex::new(Inner::default()),
            ended: Notify::new(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A place for a new connection: at once below the limit; at it, once an idle or (beyond
    /// the share slow ones may hold) slow connection was asked to close, or one ended.
    pub async fn admit(self: &Arc<Self>) -> Place {
        loop {
            let ended = self.ended.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            if let Some(place) = self.try_admit() {
                return place;
            }
            let _ = tokio::time::timeout(ADMIT_RECHECK, ended).await;
        }
    }

    fn try_admit(self: &Arc<Self>) -> Option<Place> {
        let mut inner = self.lock();
        if inner.counted >= self.max && !self.evict(&mut inner) {
            return None;
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(Conn {
            id,
            epoch: self.epoch,
            in_flight: AtomicU32::new(0),
            started: AtomicU64::new(0),
            last_active: AtomicU64::new(u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)),
            receiving_since: AtomicU64::new(0),
            sending_since: AtomicU64::new(0),
            live: AtomicU32::new(0),
            closing: AtomicBool::new(false),
            order: AtomicU8::new(0),
            orders: Notify::new(),
            live_changed: Notify::new(),
            http2: AtomicBool::new(false),
            park: std::sync::OnceLock::new(),
            streams: Mutex::new(HashMap::new()),
            next_stream: AtomicU64::new(0),
        });
        inner.conns.insert(id, Arc::clone(&conn));
        inner.counted += 1;
        Some(Place { registry: Arc::clone(self), conn })
    }

    /// Asks one connection to close to make room; whether one was.
    fn evict(&self, inner: &mut Inner) -> bool {
        let open = || inner.conns.values().filter(|c| !c.closing.load(Ordering::Acquire));
        let idle = open().filter(|c| c.idle_long_enough()).min_by_key(|c| c.last_active.load(Ordering::Acquire));
        let (victim, order) = match idle {
            Some(c) => (Arc::clone(c), Order::Idle),
            None => {
                let live = open().filter(|c| c.is_live()).count();
                let slow: Vec<_> = open().filter_map(|c| c.slow_since().map(|s| (s, c))).collect();
                if live + slow.len() <= self.max.saturating_sub(self.reserve) {
                    return false;
                }
                match slow.into_iter().min_by_key(|(s, _)| *s) {
                    Some((_, c)) => (Arc::clone(c), Order::Slow),
                    None => return false,
                }
            }
        };
        victim.closing.store(true, Ordering::Release);
        inner.counted = inner.counted.saturating_sub(1);
        let reason = if order == Order::Idle { "idle" } else { "slow" };
        metrics::counter!("oncelog_connections_evicted_total", "reason" => reason).increment(1);
        victim.send(order);
        true
    }

    /// Asks every connection to close gracefully (the server is shutting down).
    pub fn shutdown(&self) {
        for conn in self.lock().conns.values() {
            conn.send(Order::Shutdown);
        }
    }

    /// Returns once every connection has ended.
    pub async fn all_ended(&self) {
        loop {
            let ended = self.ended.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            if self.lock().conns.is_empty() {
                return;
            }
            ended.await;
        }
    }
}

/// The front service `S` of one connection, keeping the connection's state up to date;
/// `phases` (HTTP/1) also tracks whether its request waits on the client's body or answer;
/// without it (HTTP/2), answers are [`Paced`]. Generic over the service so this module knows
/// nothing of what serves the requests.
#[derive(Clone)]
pub struct Tracked<S> {
    front: S,
    conn: Arc<Conn>,
    phases: bool,
}

impl<S> Tracked<S> {
    pub fn new(front: S, conn: Arc<Conn>, phases: bool) -> Tracked<S> {
        if !phases {
            conn.http2.store(true, Ordering::Release);
        }
        Tracked { front, conn, phases }
    }
}

/// Ends its request's record when dropped (with the answer's body, or with the request).
struct RequestGuard {
    conn: Arc<Conn>,
    /// HTTP/2: the stream's record.
    stream: Option<StreamRecord>,
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.stream = None;
        self.conn.end_request();
    }
}

impl<S, B> Service<Request<B>> for Tracked<S>
where
    B: http_body::Body,
    S: Service<Request<TrackedIncoming<B>>, Response = Response, Error = Infallible>,
    S::Future: Unpin,
{
    type Response = Response<TrackedBody>;
    type Error = Infallible;
    type Future = TrackedFuture<S::Future>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> TrackedFuture<S::Future> {
        let receiving = !req.body().is_end_stream();
        self.conn.begin_request(receiving && self.phases);
        let stream = (!self.phases).then(|| self.conn.watch_stream(receiving));
        let watcher = match &stream {
            _ if !receiving => None,
            None => Some(Received::Connection(Arc::clone(&self.conn))),
            Some(record) => Some(Received::Stream(Arc::clone(&record.clock.waits))),
        };
        let guard = RequestGuard { conn: Arc::clone(&self.conn), stream };
        let req = req.map(|inner| TrackedIncoming { inner, received: watcher });
        let inner = if self.phases {
            Handling::Here(self.front.call(req))
        } else {
            // hyper runs an HTTP/2 stream's handler in a task of its own: the connection is
            // scoped onto it, as an HTTP/1 connection's task has it ([`current`]).
            Handling::Scoped(Box::pin(CONNECTION.scope(Arc::clone(&self.conn), self.front.call(req))))
        };
        TrackedFuture { inner, guard: Some(guard), sending: self.phases }
    }
}

/// A handler's future: polled as it is (HTTP/1: the connection's task has the connection), or
/// with the connection scoped onto the task that polls it (HTTP/2).
pub enum Handling<F> {
    Here(F),
    Scoped(Pin<Box<tokio::task::futures::TaskLocalFuture<Arc<Conn>, F>>>),
}

/// The request's answer, then its body's record.
pub struct TrackedFuture<F> {
    inner: Handling<F>,
    guard: Option<RequestGuard>,
    /// HTTP/1 (its sending is tracked); else HTTP/2 (its body is paced).
    sending: bool,
}

impl<F: Future<Output = Result<Response, Infallible>> + Unpin> Future for TrackedFuture<F> {
    type Output = Result<Response<TrackedBody>, Infallible>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let polled = match &mut self.inner {
            Handling::Here(f) => Pin::new(f).poll(cx),
            Handling::Scoped(f) => f.as_mut().poll(cx),
        };
        let Poll::Ready(Ok(resp)) = polled else { return Poll::Pending };
        let guard = self.guard.take();
        if let Some(g) = &guard {
            g.conn.answer_ready(self.sending);
            if let Some(stream) = &g.stream {
                // Answered: the rest of its body no longer holds it (as on HTTP/1).
                stream.clock.waits.receiving.store(0, Ordering::Release);
            }
        }
        // An empty body is sent with the headers (nothing for the window to hold back).
        let paced = match guard.as_ref().and_then(|g| g.stream.as_ref()) {
            Some(stream) if !http_body::Body::is_end_stream(resp.body()) => {
                let length = http_body::Body::size_hint(resp.body()).exact().or_else(|| {
                    let value = resp.headers().get(axum::http::header::CONTENT_LENGTH)?;
                    value.to_str().ok()?.parse().ok()
                });
                Some(Paced::new(stream.clock.clone(), length))
            }
            _ => None,
        };
        Poll::Ready(Ok(resp.map(|inner| TrackedBody { inner, paced, _guard: guard })))
    }
}

/// A request body that records when it has all arrived (or is given up). `B`: the body of
/// whichever engine serves the connection (hyper's, or `oncelog_http1`'s).
pub struct TrackedIncoming<B> {
    inner: B,
    received: Option<Received>,
}

/// Whose record a request body's arrival ends.
enum Received {
    /// HTTP/1: the connection's.
    Connection(Arc<Conn>),
    /// HTTP/2: the stream's.
    Stream(Arc<StreamWaits>),
}

impl<B> TrackedIncoming<B> {
    fn received(&mut self) {
        match self.received.take() {
            Some(Received::Connection(conn)) => conn.body_received(),
            Some(Received::Stream(waits)) => waits.receiving.store(0, Ordering::Release),
            None => {}
        }
    }
}

impl<B> Drop for TrackedIncoming<B> {
    fn drop(&mut self) {
        self.received();
    }
}

impl<B: http_body::Body + Unpin> http_body::Body for TrackedIncoming<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<B::Data>, B::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) || self.inner.is_end_stream() {
            self.received();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// An answer's body, holding its request's record until it is sent (or dropped).
pub struct TrackedBody {
    inner: axum::body::Body,
    /// HTTP/2 only. An HTTP/1 answer goes to hyper as it is: a client that does not take it
    /// in blocks the socket's writes, which `DeadlineIo` times out.
    paced: Option<Paced>,
    _guard: Option<RequestGuard>,
}

impl http_body::Body for TrackedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = &mut *self;
        match &mut this.paced {
            None => Pin::new(&mut this.inner).poll_frame(cx),
            Some(paced) => paced.poll_frame(&mut this.inner, cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.paced {
            None => self.inner.is_end_stream(),
            Some(paced) => paced.is_end_stream(&self.inner),
        }
    }

    fn size_hint(&self) -> SizeHint {
        let inner = self.inner.size_hint();
        let Some(paced) = &self.paced else { return inner };
        let held = paced.held();
        let mut hint = SizeHint::new();
        hint.set_lower(inner.lower().saturating_add(held));
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper.saturating_add(held));
        }
        hint
    }
}

/// An HTTP/2 answer's clock in its stream's record ([`Conn::stalled`]): since when hyper holds a
/// piece of it that the client's window has not let out.
#[derive(Clone)]
struct SendClock {
    conn: Arc<Conn>,
    waits: Arc<StreamWaits>,
}

impl SendClock {
    /// hyper took a piece: until it comes back for the next, the window holds it.
    fn handed(&self) {
        self.waits.sending.store(self.conn.stamp(), Ordering::Release);
    }

    /// hyper came back: the window let out what it took.
    fn taken(&self) {
        self.waits.sending.store(0, Ordering::Release);
    }
}

/// An HTTP/2 stream's record in its connection; removed when dropped.
struct StreamRecord {
    clock: SendClock,
    id: u64,
}

impl Drop for StreamRecord {
    fn drop(&mut self) {
        self.clock.conn.streams.lock().unwrap_or_else(PoisonError::into_inner).remove(&self.id);
    }
}

/// How an HTTP/2 answer's body is handed to hyper so that a stall on the client's flow control
/// shows. hyper (1.x) takes a piece of the body, waits until the stream's window covers what it
/// already queued plus a byte, queues the piece and comes back for the next. So:
///
/// - between handing a piece out and being asked for the next, the answer waits on the client's
///   window: that time is its [`SendClock`]. A body waiting for its own data (an SSE or
///   long-poll reader before the next message) was asked and has not answered: it is not
///   stalled, however long it waits;
/// - data goes out [`H2_PIECE`] at a time, so a client that opens its window at all, however
///   slowly, shows progress;
/// - the answer's last byte goes out on its own, with its end: hyper hands it over only once
///   the window covers everything before it. Handed with the end any earlier, the last piece
///   would sit in HTTP/2's queue after the body was gone, unseen and holding what it refers to
///   (a mapped segment range). The last byte is known by the body's end or by its length
///   (`Content-Length`: a streamed catch-up answer); an answer of neither (SSE) ends with an
///   empty frame after its last piece, which may then wait unseen (one piece, never mapped).
struct Paced {
    /// The rest of the inner body's current data frame, not yet handed out.
    rest: Bytes,
    /// A frame taken from the inner body while looking for its end.
    next: Option<Frame<Bytes>>,
    /// Bytes the answer still owes by its length, when known.
    left: Option<u64>,
    /// The inner body has ended.
    ended: bool,
    clock: SendClock,
}

impl Paced {
    fn new(clock: SendClock, length: Option<u64>) -> Paced {
        // Until hyper first asks for the body, it waits on the window (of zero, say).
        clock.handed();
        Paced { rest: Bytes::new(), next: None, left: length, ended: false, clock }
    }

    /// Data taken from the inner body and not yet handed out.
    fn held(&self) -> u64 {
        let next = self.next.as_ref().and_then(Frame::data_ref).map_or(0, Bytes::len);
        u64::try_from(self.rest.len().saturating_add(next)).unwrap_or(u64::MAX)
    }

    fn is_end_stream(&self, inner: &axum::body::Body) -> bool {
        use http_body::Body as _;
        self.rest.is_empty() && self.next.is_none() && (self.ended || inner.is_end_stream())
    }

    fn poll_frame(
        &mut self,
        inner: &mut axum::body::Body,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        use http_body::Body as _;
        self.clock.taken();
        while self.rest.is_empty() {
            let frame = match self.next.take() {
                Some(frame) => frame,
                None if self.ended => return Poll::Ready(None),
                None => match std::task::ready!(Pin::new(&mut *inner).poll_frame(cx)) {
                    Some(Ok(frame)) => frame,
                    Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                    None => {
                        self.ended = true;
                        return Poll::Ready(None);
                    }
                },
            };
            match frame.into_data() {
                Ok(data) => self.rest = data,
                // Trailers end the answer and take no window.
                Err(frame) => return Poll::Ready(Some(Ok(frame))),
            }
        }
        let len = self.rest.len();
        let by_length = u64::try_from(len).is_ok_and(|n| self.left == Some(n));
        let last =
            |p: &Paced, inner: &axum::body::Body| p.next.is_none() && (p.ended || inner.is_end_stream() || by_length);
        if last(self, inner) && len == 1 && !self.ended && !inner.is_end_stream() {
            // The last byte by the length: the inner body ends as it would have (its access
            // log line says so) before the end goes with the byte. A body longer than it said
            // goes on as it is.
            match std::task::ready!(Pin::new(&mut *inner).poll_frame(cx)) {
                None => self.ended = true,
                Some(Ok(frame)) => self.next = Some(frame),
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
            }
        }
        let n = (if last(self, inner) && len > 1 { len - 1 } else { len }).min(H2_PIECE);
        let piece = self.rest.split_to(n);
        self.left = self.left.map(|l| l.saturating_sub(u64::try_from(n).unwrap_or(u64::MAX)));
        self.clock.handed();
        Poll::Ready(Some(Ok(Frame::data(piece))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A new connection with a request in flight (`receiving`: waiting on its body).
    fn busy(registry: &Arc<Registry>, receiving: bool) -> Option<Place> {
        let place = registry.try_admit()?;
        place.conn.begin_request(receiving);
        Some(place)
    }

    fn ordered(place: &Place) -> Option<Order> {
        Order::from_code(place.conn.order.load(Ordering::Acquire))
    }

    #[tokio::test]
    async fn at_the_limit_the_idle_connection_idle_longest_makes_room() {
        let registry = Registry::new(3);
        let a = registry.try_admit().expect("a");
        tokio::time::sleep(Duration::from_millis(5)).await;
        let b = registry.try_admit().expect("b");
        let _c = busy(&registry, false).expect("c");
        assert!(registry.try_admit().is_none(), "connections idle for less than IDLE_AFTER keep their place");
        tokio::time::sleep(IDLE_AFTER).await;
        let _d = busy(&registry, false).expect("the oldest idle one makes room");
        assert_eq!((ordered(&a), ordered(&b)), (Some(Order::Idle), None), "only the oldest is asked to close");
        let _e = busy(&registry, false).expect("then the next");
        assert_eq!(ordered(&b), Some(Order::Idle));
        assert!(registry.try_admit().is_none(), "no idle connection is left, and none is slow");
    }

    #[tokio::test]
    async fn slow_connections_and_live_readers_leave_the_reserve() {
        // 32 connections: a reserve of 2.
        let registry = Registry::new(32);
        let places: Vec<Place> = (0..32).map(|_| busy(&registry, true).expect("room")).collect();
        assert!(registry.try_admit().is_none(), "busy, not slow yet");
        tokio::time::sleep(SLOW_AFTER + Duration::from_millis(50)).await;
        // All 32 are slow, more than the 30 they may hold: the slowest makes room, twice.
        let _n1 = busy(&registry, false).expect("a place");
        assert_eq!(places.iter().filter(|p| ordered(p) == Some(Order::Slow)).count(), 1);
        let _n2 = busy(&registry, false).expect("another place");
        // Now 30 slow ones and 2 others: the share is full, not exceeded.
        assert!(registry.try_admit().is_none());
        // A live reader counts in that share: with one of the slow ones live, still none.
        places[5].conn.live.fetch_add(1, Ordering::AcqRel);
        assert!(registry.try_admit().is_none());
    }
}
