//! The producer's engine: one task that owns all sequencing state, so no lock guards the
//! exactly-once logic; and the [`ProducerStats`] it counts.
//!
//! Rules it keeps:
//! - Sequence numbers are assigned in batch order when a batch is first sent, one per batch, and
//!   a batch keeps its `(epoch, seq)` and its exact body for every retry. A seq is never skipped
//!   and never reused for different data (an epoch change starts a new numbering, below).
//! - At most `max_in_flight` sequenced batches are unacknowledged at once; until the first batch
//!   of an epoch is acknowledged only that one is in flight (a new epoch must start at seq 0, and
//!   the server would refuse a pipelined seq 1 arriving first).
//! - Network errors, `5xx`, `408` and `429` are retried with the same `(epoch, seq)`, with
//!   backoff and jitter: the server deduplicates.
//! - A `409` gap parks the batch until every earlier batch is acknowledged, then resends it.
//! - `403` fails the producer, or with auto-claim moves to a higher epoch and renumbers every
//!   unacknowledged batch from seq 0 (old-epoch requests still in flight can only be fenced).
//! - Any other failure of batch `n` fails `n` and every later batch (they can no longer be
//!   accepted in this epoch) while earlier batches still finish; the producer then refuses new
//!   appends and `flush` reports the first error.
//! - Receipts resolve in batch order.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::future::BoxFuture;
use futures_util::stream::FuturesUnordered;
use futures_util::StreamExt;
use oncelog_protocol::headers::MAX_SAFE_INTEGER;
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio::time::Instant;

use super::batch::{Ack, Limits, OpenBatch, Waiter};
use super::epoch::EpochStore;
use super::transport::{classify, BatchRequest, BatchResponse, Transport, Verdict};
use crate::error::Error;
use crate::retry::{Backoff, Jitter, RetryPolicy};

/// How many times a batch is resent after a gap answer that arrived when every earlier batch was
/// already acknowledged (a race that resolves at once) before the gap is declared real.
const MAX_GAP_RESENDS: u32 = 3;
/// How many times auto-claim may move to a new epoch before giving up (two producers both
/// auto-claiming the same id would otherwise fence each other forever).
const MAX_CLAIMS: u32 = 8;

/// Requests from [`super::Producer`] handles.
pub(crate) enum Cmd {
    /// One item; its buffer permits are already taken.
    Append { item: Bytes, permits: usize, reply: Waiter },
    /// Seal what is open; answer when everything sent so far is resolved.
    Flush { reply: oneshot::Sender<Result<(), Error>> },
    /// Send the last batch with `Stream-Closed: true` (with `last` as its body, if any).
    CloseStream { last: Option<Bytes>, reply: Waiter },
    /// Take no more appends; answer when everything is resolved.
    Detach { reply: oneshot::Sender<Result<(), Error>> },
}

/// Settings fixed at start.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    /// Batch sealing limits.
    pub limits: Limits,
    /// How long the first item of a batch may wait for company.
    pub linger: Duration,
    /// Most unacknowledged sequenced batches.
    pub max_in_flight: usize,
    /// Retry policy per batch.
    pub retry: RetryPolicy,
    /// Move to a higher epoch on `403` instead of failing.
    pub auto_claim: bool,
    /// `Producer-Id`, for the epoch store.
    pub producer_id: String,
}

/// State shared between the pipeline task and the producer handles.
#[derive(Debug)]
pub(crate) struct Shared {
    /// Buffer bytes: appends take permits, finished batches give them back (backpressure).
    pub sem: Arc<Semaphore>,
    /// The first failure, so handles refuse appends without asking the task.
    pub failed: OnceLock<Error>,
    /// Set by close/detach: handles refuse appends.
    pub closed: AtomicBool,
    /// The current epoch (changes on auto-claim).
    pub epoch: AtomicU64,
    /// Counters for [`ProducerStats`].
    pub counters: Counters,
}

/// Counters for observing a producer (tests print them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProducerStats {
    /// Batches sealed.
    pub batches: u64,
    /// HTTP requests sent, retries included.
    pub requests: u64,
    /// Requests that repeated an earlier attempt of the same `(epoch, seq)`.
    pub retries: u64,
    /// `409` sequence gaps that made a batch wait for its predecessors.
    pub gap_waits: u64,
    /// `204` duplicates (a retry of something already stored).
    pub duplicates: u64,
    /// Epochs claimed by auto-claim.
    pub epoch_claims: u64,
}

/// Monotonic counters; see [`ProducerStats`].
#[derive(Debug, Default)]
pub(crate) struct Counters {
    /// Batches sealed.
    pub batches: AtomicU64,
    /// Requests sent (first attempts and retries).
    pub requests: AtomicU64,
    /// Requests that repeated an earlier attempt.
    pub retries: AtomicU64,
    /// `409` gaps that parked a batch.
    pub gap_waits: AtomicU64,
    /// Acknowledgements that were duplicates (`204`).
    pub duplicates: AtomicU64,
    /// Epoch changes by auto-claim.
    pub claims: AtomicU64,
}

impl Counters {
    pub(crate) fn snapshot(&self) -> ProducerStats {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ProducerStats {
            batches: g(&self.batches),
            requests: g(&self.requests),
            retries: g(&self.retries),
            gap_waits: g(&self.gap_waits),
            duplicates: g(&self.duplicates),
            epoch_claims: g(&self.claims),
        }
    }

    fn bump(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }
}

/// Where a batch stands.
#[derive(Debug)]
enum State {
    /// Sealed, not sequenced yet (waiting for pipeline room).
    Queued,
    /// A request is out; its answer is matched by this id (older answers are stale).
    Sending { request: u64 },
    /// Waiting to retry.
    Backoff { until: Instant },
    /// Got a gap; resent once every earlier batch is acknowledged.
    WaitPredecessors,
    /// Finished; released to its waiters in batch order.
    Done(Result<Ack, Error>),
}

/// A sealed batch.
#[derive(Debug)]
struct Batch {
    /// Position in sealing order (contiguous across the pipeline's life).
    id: u64,
    /// The exact bytes every attempt sends.
    body: Bytes,
    /// Told the outcome.
    waiters: Vec<Waiter>,
    /// Buffer permits returned when released.
    permits: usize,
    /// The stream-closing batch.
    close: bool,
    /// Assigned on first send (and again after an epoch change).
    seq: Option<u64>,
    /// Where it stands.
    state: State,
    /// Retry state, created on the first transient failure.
    backoff: Option<Backoff>,
    /// Requests sent for this `(epoch, seq)`.
    attempts: u32,
    /// Gap answers received while every earlier batch was acknowledged.
    gap_resends: u32,
}

impl Batch {
    fn in_flight(&self) -> bool {
        self.seq.is_some() && !matches!(self.state, State::Done(_))
    }
    fn acked(&self) -> Option<&Ack> {
        match &self.state {
            State::Done(Ok(a)) => Some(a),
            _ => None,
        }
    }
}

type Answer = (u64, u64, Result<BatchResponse, Error>);

/// The task.
pub(crate) struct Pipeline {
    /// Sends batches.
    transport: Arc<dyn Transport>,
    /// Fixed settings.
    settings: Settings,
    /// Shared with handles.
    shared: Arc<Shared>,
    /// Persists epochs before they are used (auto-claim).
    store: Option<Arc<dyn EpochStore>>,
    /// Spreads retry delays.
    jitter: Arc<dyn Jitter>,
    /// Commands from handles.
    rx: mpsc::UnboundedReceiver<Cmd>,
    /// False once every handle is gone.
    rx_open: bool,
    /// Current `Producer-Epoch`.
    epoch: u64,
    /// Next `Producer-Seq` to assign in this epoch.
    next_seq: u64,
    /// Whether a batch of this epoch was acknowledged (pipelining allowed).
    established: bool,
    /// Epoch changes made by auto-claim.
    claims: u32,
    /// The batch being filled.
    open: OpenBatch,
    /// Sequenced batches not yet released, in seq order (the pipeline window: in flight, waiting
    /// to retry, or done and waiting for an earlier one).
    window: VecDeque<Batch>,
    /// Sealed batches not yet sequenced, in order (they follow every batch of the window).
    queue: VecDeque<Batch>,
    /// Id of the next sealed batch.
    next_batch_id: u64,
    /// Every batch with a smaller id is released.
    released: u64,
    /// Flush and detach waiters: answered once `released` reaches the id.
    flushes: Vec<(u64, oneshot::Sender<Result<(), Error>>)>,
    /// Requests in flight.
    requests: FuturesUnordered<BoxFuture<'static, Answer>>,
    /// Id for the next request.
    next_request: u64,
    /// The first failure.
    failed: Option<Error>,
    /// Close or detach was asked: no more appends.
    closing: bool,
}

impl Pipeline {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        transport: Arc<dyn Transport>,
        settings: Settings,
        shared: Arc<Shared>,
        store: Option<Arc<dyn EpochStore>>,
        jitter: Arc<dyn Jitter>,
        rx: mpsc::UnboundedReceiver<Cmd>,
        epoch: u64,
    ) -> Pipeline {
        Pipeline {
            transport,
            settings,
            shared,
            store,
            jitter,
            rx,
            rx_open: true,
            epoch,
            next_seq: 0,
            established: false,
            claims: 0,
            open: OpenBatch::default(),
            window: VecDeque::new(),
            queue: VecDeque::new(),
            next_batch_id: 0,
            released: 0,
            flushes: Vec::new(),
            requests: FuturesUnordered::new(),
            next_request: 0,
            failed: None,
            closing: false,
        }
    }

    /// Runs until every handle is gone and every batch is resolved.
    pub(crate) async fn run(mut self) {
        loop {
            self.pump();
            if !self.rx_open && self.window.is_empty() && self.queue.is_empty() && self.open.is_empty() {
                break;
            }
            let wake = self.next_wake();
            tokio::select! {
                biased;
                Some((request, batch, outcome)) = self.requests.next(), if !self.requests.is_empty() => {
                    self.on_answer(request, batch, outcome).await;
                }
                cmd = self.rx.recv(), if self.rx_open => match cmd {
                    Some(cmd) => self.on_cmd(cmd),
                    None => {
                        // Every handle is gone: send what is left, then stop.
                        self.rx_open = false;
                        self.seal_open();
                    }
                },
                () = tokio::time::sleep_until(wake.unwrap_or_else(Instant::now)), if wake.is_some() => {}
            }
        }
        self.shared.sem.close();
    }

    fn on_cmd(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Append { item, permits, reply } => {
                let refusal = match (&self.failed, self.closing) {
                    (Some(e), _) => Some(Error::ProducerFailed(Arc::new(e.clone()))),
                    (None, true) => Some(Error::ProducerClosed),
                    (None, false) => None,
                };
                if let Some(e) = refusal {
                    let _ = reply.send(Err(e));
                    self.shared.sem.add_permits(permits);
                    return;
                }
                let limits = self.settings.limits;
                if self.open.would_overflow(item.len(), limits) {
                    self.seal_open();
                }
                if self.open.push(item, permits, reply, limits, Instant::now()) {
                    self.seal_open();
                }
            }
            Cmd::Flush { reply } => {
                self.seal_open();
                self.flushes.push((self.next_batch_id, reply));
            }
            Cmd::Detach { reply } => {
                self.closing = true;
                self.seal_open();
                self.flushes.push((self.next_batch_id, reply));
            }
            Cmd::CloseStream { last, reply } => {
                if let Some(e) = &self.failed {
                    let _ = reply.send(Err(Error::ProducerFailed(Arc::new(e.clone()))));
                    return;
                }
                if self.closing {
                    let _ = reply.send(Err(Error::ProducerClosed));
                    return;
                }
                self.closing = true;
                self.seal_open();
                let body = match last {
                    Some(b) if self.settings.limits.json => {
                        let mut out = BytesMut::with_capacity(b.len() + 2);
                        out.extend_from_slice(b"[");
                        out.extend_from_slice(&b);
                        out.extend_from_slice(b"]");
                        out.freeze()
                    }
                    Some(b) => b,
                    None => Bytes::new(),
                };
                self.push_batch(body, vec![reply], 0, true);
            }
        }
    }

    fn seal_open(&mut self) {
        if self.open.is_empty() {
            return;
        }
        let sealed = self.open.seal(self.settings.limits);
        self.push_batch(sealed.body, sealed.waiters, sealed.permits, false);
    }

    fn push_batch(&mut self, body: Bytes, waiters: Vec<Waiter>, permits: usize, close: bool) {
        Counters::bump(&self.shared.counters.batches);
        self.queue.push_back(Batch {
            id: self.next_batch_id,
            body,
            waiters,
            permits,
            close,
            seq: None,
            state: State::Queued,
            backoff: None,
            attempts: 0,
            gap_resends: 0,
        });
        self.next_batch_id += 1;
    }

    fn in_flight(&self) -> usize {
        self.window.iter().filter(|b| b.in_flight()).count()
    }

    fn has_capacity(&self) -> bool {
        let cap = if self.established { self.settings.max_in_flight } else { 1 };
        self.failed.is_none() && self.in_flight() < cap
    }

    fn has_queued(&self) -> bool {
        !self.queue.is_empty()
    }

    /// Everything that can happen without waiting: linger sealing, due retries, gap resends, new
    /// sends, in-order release, flush answers.
    fn pump(&mut self) {
        let now = Instant::now();
        if self.has_capacity() && !self.has_queued() {
            if let Some(started) = self.open.started() {
                if started + self.settings.linger <= now {
                    self.seal_open();
                }
            }
        }
        let mut earlier_acked = true;
        for i in 0..self.window.len() {
            let resend = match self.window[i].state {
                State::WaitPredecessors => earlier_acked,
                State::Backoff { until } => until <= now,
                _ => false,
            };
            if resend {
                self.send(i);
            }
            earlier_acked &= self.window[i].acked().is_some();
        }
        while self.has_capacity() {
            let Some(mut b) = self.queue.pop_front() else { break };
            b.seq = Some(self.next_seq);
            self.next_seq += 1;
            self.window.push_back(b);
            self.send(self.window.len() - 1);
        }
        self.release();
    }

    fn send(&mut self, i: usize) {
        let request = self.next_request;
        self.next_request += 1;
        let b = &mut self.window[i];
        let Some(seq) = b.seq else { return };
        b.state = State::Sending { request };
        b.attempts += 1;
        Counters::bump(&self.shared.counters.requests);
        if b.attempts > 1 {
            Counters::bump(&self.shared.counters.retries);
        }
        let fut = self.transport.send(BatchRequest { epoch: self.epoch, seq, body: b.body.clone(), close: b.close });
        let id = b.id;
        self.requests.push(Box::pin(async move { (request, id, fut.await) }));
    }

    fn index_of(&self, id: u64) -> Option<usize> {
        let front = self.window.front()?.id;
        let i = usize::try_from(id.checked_sub(front)?).ok()?;
        (i < self.window.len()).then_some(i)
    }

    async fn on_answer(&mut self, request: u64, id: u64, outcome: Result<BatchResponse, Error>) {
        let Some(i) = self.index_of(id) else { return };
        let b = &self.window[i];
        if !matches!(b.state, State::Sending { request: r } if r == request) {
            return; // an answer to a request this batch no longer waits for
        }
        let Some(seq) = b.seq else { return };
        match classify(&outcome, b.body.is_empty()) {
            Verdict::Ack { next_offset, duplicate, server_seq } => {
                // The first answer of a session is a duplicate of something we never sent: an
                // earlier session used this epoch, and our data would be silently dropped.
                let reused = !self.established && duplicate && (server_seq.is_some_and(|s| s > seq) || b.attempts == 1);
                if reused {
                    let epoch = self.epoch;
                    if self.settings.auto_claim && self.failed.is_none() && self.claims < MAX_CLAIMS {
                        self.claim(epoch.saturating_add(1), i).await;
                    } else {
                        self.fail_from(i, Error::EpochReused { epoch });
                    }
                    return;
                }
                self.established = true;
                if duplicate {
                    Counters::bump(&self.shared.counters.duplicates);
                }
                self.window[i].state = State::Done(Ok(Ack { next_offset, epoch: self.epoch, seq, duplicate }));
            }
            Verdict::Retry(err) => {
                let (policy, jitter) = (self.settings.retry.clone(), self.jitter.clone());
                let b = &mut self.window[i];
                let backoff = b.backoff.get_or_insert_with(|| Backoff::new(policy, jitter));
                match backoff.next_delay(err.retry_after()) {
                    Some(delay) => {
                        tracing::debug!(error = %err, seq, ?delay, "batch failed; retrying with the same seq");
                        b.state = State::Backoff { until: Instant::now() + delay };
                    }
                    None => self.fail_from(i, err),
                }
            }
            Verdict::Gap { expected, received } => {
                if expected > seq {
                    self.fail_from(i, Error::SequenceGap { expected, received });
                    return;
                }
                let earlier_acked = self.window.iter().take(i).all(|b| b.acked().is_some());
                let b = &mut self.window[i];
                if earlier_acked {
                    b.gap_resends += 1;
                    if b.gap_resends > MAX_GAP_RESENDS {
                        self.fail_from(i, Error::SequenceGap { expected, received });
                        return;
                    }
                }
                Counters::bump(&self.shared.counters.gap_waits);
                b.state = State::WaitPredecessors;
            }
            // The server holds other bytes under this (epoch, seq). First answer of a session:
            // an earlier session used the epoch (as a duplicate answer would say, had the bytes
            // been equal). Later: the same seq was sent with two bodies, which this pipeline
            // never does; refuse rather than lose either.
            Verdict::BodyMismatch if !self.established => {
                let epoch = self.epoch;
                if self.settings.auto_claim && self.failed.is_none() && self.claims < MAX_CLAIMS {
                    self.claim(epoch.saturating_add(1), i).await;
                } else {
                    self.fail_from(i, Error::EpochReused { epoch });
                }
            }
            Verdict::BodyMismatch => {
                let epoch = self.epoch;
                self.fail_from(i, Error::BodyMismatch { epoch, seq });
            }
            Verdict::Fenced { current_epoch } => {
                let epoch = self.epoch;
                if self.settings.auto_claim && self.failed.is_none() && self.claims < MAX_CLAIMS {
                    self.claim(current_epoch.max(epoch).saturating_add(1), i).await;
                } else {
                    self.fail_from(i, Error::Fenced { epoch, current_epoch });
                }
            }
            Verdict::Fatal(e) => self.fail_from(i, e),
        }
    }

    /// Moves to `new_epoch` (auto-claim): persists it, then renumbers every unacknowledged batch
    /// from seq 0. Batches below the highest acknowledged seq were accepted (the server accepts
    /// in order) even if their own answer was lost; they are resolved, not resent.
    async fn claim(&mut self, new_epoch: u64, trigger: usize) {
        if new_epoch > MAX_SAFE_INTEGER {
            self.fail_from(trigger, Error::InvalidArgument("epoch would exceed 2^53-1".into()));
            return;
        }
        if let Some(store) = self.store.clone() {
            let id = self.settings.producer_id.clone();
            let stored = tokio::task::spawn_blocking(move || store.store(&id, new_epoch))
                .await
                .unwrap_or_else(|e| Err(Error::EpochStore(e.to_string())));
            if let Err(e) = stored {
                self.fail_from(trigger, e);
                return;
            }
        }
        tracing::info!(old = self.epoch, new = new_epoch, "producer claims a new epoch");
        let old_epoch = self.epoch;
        self.claims += 1;
        Counters::bump(&self.shared.counters.claims);
        self.epoch = new_epoch;
        self.shared.epoch.store(new_epoch, Ordering::Relaxed);
        self.next_seq = 0;
        self.established = false;
        let highest_acked = self.window.iter().filter(|b| b.acked().is_some()).filter_map(|b| b.seq).max();
        for i in 0..self.window.len() {
            if !self.window[i].in_flight() {
                continue;
            }
            let below = matches!((self.window[i].seq, highest_acked), (Some(s), Some(h)) if s < h);
            let later_ack = self.window.iter().skip(i + 1).find_map(Batch::acked).map(|a| a.next_offset.clone());
            if let (true, Some(next_offset), Some(seq)) = (below, later_ack, self.window[i].seq) {
                self.window[i].state = State::Done(Ok(Ack { next_offset, epoch: old_epoch, seq, duplicate: true }));
            }
        }
        // What is left unacknowledged now follows every finished batch (a batch below an
        // acknowledged one was resolved above), so it is a suffix: it goes back to the queue,
        // in order, ahead of what was queued.
        let first_open = self.window.iter().position(Batch::in_flight).unwrap_or(self.window.len());
        debug_assert!(self.window.iter().skip(first_open).all(Batch::in_flight));
        let requeue = self.window.split_off(first_open);
        for mut b in requeue.into_iter().rev() {
            b.seq = None;
            b.state = State::Queued;
            b.backoff = None;
            b.attempts = 0;
            b.gap_resends = 0;
            self.queue.push_front(b);
        }
    }

    /// Batch `i` cannot succeed: it fails, and every later batch fails with it.
    fn fail_from(&mut self, i: usize, err: Error) {
        tracing::warn!(error = %err, "producer failed");
        let first = self.failed.get_or_insert_with(|| err.clone()).clone();
        let _ = self.shared.failed.set(first.clone());
        let first = Arc::new(first);
        for (j, b) in self.window.iter_mut().enumerate().skip(i) {
            let e = if j == i { err.clone() } else { Error::ProducerFailed(first.clone()) };
            b.state = State::Done(Err(e));
        }
        while let Some(mut b) = self.queue.pop_front() {
            b.state = State::Done(Err(Error::ProducerFailed(first.clone())));
            self.window.push_back(b);
        }
        let (waiters, permits) = self.open.abandon();
        for w in waiters {
            let _ = w.send(Err(Error::ProducerFailed(first.clone())));
        }
        self.shared.sem.add_permits(permits);
    }

    /// Hands finished batches at the front to their waiters, in order, and answers flushes.
    fn release(&mut self) {
        while self.window.front().is_some_and(|b| matches!(b.state, State::Done(_))) {
            let Some(b) = self.window.pop_front() else { break };
            if let State::Done(result) = b.state {
                for w in b.waiters {
                    let _ = w.send(result.clone());
                }
            }
            self.shared.sem.add_permits(b.permits);
            self.released = b.id + 1;
        }
        if self.flushes.is_empty() {
            return;
        }
        let released = self.released;
        let (ready, waiting): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.flushes).into_iter().partition(|(t, _)| *t <= released);
        self.flushes = waiting;
        for (_, reply) in ready {
            let _ = reply.send(match &self.failed {
                Some(e) => Err(e.clone()),
                None => Ok(()),
            });
        }
    }

    /// When the task must wake up with nothing else happening: the open batch's linger deadline
    /// (only when it could be sent) or the earliest retry.
    fn next_wake(&self) -> Option<Instant> {
        let linger = match self.open.started() {
            Some(s) if self.has_capacity() && !self.has_queued() => Some(s + self.settings.linger),
            _ => None,
        };
        let retry = self
            .window
            .iter()
            .filter_map(|b| match b.state {
                State::Backoff { until } => Some(until),
                _ => None,
            })
            .min();
        match (linger, retry) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}
