//! The exactly-once producer: fire-and-forget appends, batched and pipelined, each batch
//! carrying `(Producer-Id, Producer-Epoch, Producer-Seq)` so that every retry is safe.
//!
//! - [`Producer::append`] queues an item and returns a [`Receipt`], a future of the item's
//!   [`Ack`]. It waits while the buffer is full (backpressure); [`Producer::try_append`] fails
//!   instead.
//! - Items are batched by bytes, by count and by linger time; JSON values are batched as one
//!   array (the server flattens it back into messages). Up to `max_in_flight` batches are in
//!   flight; receipts resolve in order.
//! - [`Producer::flush`] waits for everything appended so far and returns the first error;
//!   [`Producer::close`] flushes and stops; [`Producer::close_stream`] appends a final item (or
//!   none) and closes the stream, idempotently.
//! - The epoch comes from [`ProducerBuilder::epoch`] and/or an [`EpochStore`].
//!
//! What happens to a batch on each answer:
//! - network error, `5xx`, `408`, `429`: resent with the same `(epoch, seq)` and the same bytes
//!   after exponential backoff with jitter (safe: the server deduplicates);
//! - `409` sequence gap: the batch waits until every earlier batch is acknowledged, then is
//!   resent; a seq is never skipped and never reused for different data;
//! - `409` with `Stream-Closed`: [`Error::StreamClosed`] at once, no retry;
//! - `403`: [`Error::Fenced`], or with [`ProducerBuilder::auto_claim`] a higher epoch and every
//!   unacknowledged batch renumbered from seq 0;
//! - a "duplicate" answer to the first request of a session: [`Error::EpochReused`];
//! - anything else, or retries exhausted: the batch and every later one fail (earlier ones still
//!   finish); [`Producer::flush`] returns the first error and new appends are refused.

mod batch;
mod epoch;
pub(crate) mod pipeline;
#[cfg(test)]
mod tests;
pub(crate) mod transport;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use oncelog_protocol::content_type;
use oncelog_protocol::headers::MAX_SAFE_INTEGER;
use serde::de::IgnoredAny;
use serde::Serialize;
use tokio::sync::{mpsc, oneshot, OnceCell, Semaphore, TryAcquireError};

pub use batch::Ack;
pub use epoch::{EpochStore, FileEpochStore};
pub use pipeline::ProducerStats;

use crate::error::Error;
use crate::offset::StreamOffset;
use crate::retry::{Jitter, RetryPolicy};
use crate::stream::StreamHandle;
use batch::Limits;
use pipeline::{Cmd, Counters, Pipeline, Settings, Shared};
use transport::{HttpTransport, Transport};

/// The future outcome of one append. Dropping it does not cancel the append.
#[derive(Debug)]
pub struct Receipt {
    /// Answered by the pipeline when the item's batch is released.
    rx: oneshot::Receiver<Result<Ack, Error>>,
}

impl Future for Receipt {
    type Output = Result<Ack, Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.rx).poll(cx).map(|r| r.unwrap_or(Err(Error::ProducerClosed)))
    }
}

/// Configures and starts a [`Producer`]; from [`StreamHandle::producer`].
pub struct ProducerBuilder {
    /// The stream.
    handle: StreamHandle,
    /// `Producer-Id`: stable across restarts of the same logical producer.
    producer_id: String,
    /// The configured epoch (the store may raise it).
    epoch: Option<u64>,
    /// Loads/stores the epoch across restarts.
    epoch_store: Option<Arc<dyn EpochStore>>,
    /// Move to a higher epoch on `403` instead of failing.
    auto_claim: bool,
    /// Seal a batch at this many body bytes.
    max_batch_bytes: usize,
    /// Seal a batch at this many items.
    max_batch_items: usize,
    /// How long a batch waits for more items.
    linger: Duration,
    /// Most unacknowledged batches.
    max_in_flight: usize,
    /// Most bytes buffered (queued or in flight) before `append` waits.
    max_buffered_bytes: usize,
    /// Per-batch retry policy.
    retry: RetryPolicy,
    /// The stream's content type; asked with `HEAD` if unknown.
    content_type: Option<String>,
    /// Randomness for retry delays.
    jitter: Option<Arc<dyn Jitter>>,
}

// Here rather than in stream.rs, so that the handle, which the producer uses, never names the
// producer.
impl StreamHandle {
    /// Starts configuring an exactly-once [`Producer`] with this producer id.
    pub fn producer(&self, producer_id: impl Into<String>) -> ProducerBuilder {
        ProducerBuilder::new(self.clone(), producer_id.into())
    }
}

impl ProducerBuilder {
    fn new(handle: StreamHandle, producer_id: String) -> ProducerBuilder {
        ProducerBuilder {
            handle,
            producer_id,
            epoch: None,
            epoch_store: None,
            auto_claim: false,
            max_batch_bytes: 1 << 20,
            max_batch_items: 10_000,
            linger: Duration::from_millis(5),
            max_in_flight: 5,
            max_buffered_bytes: 16 << 20,
            retry: ProducerBuilder::default_retry(),
            content_type: None,
            jitter: None,
        }
    }

    /// The producer's default retry policy: 100 ms doubling to 2 s, no attempt limit, give up on
    /// a batch after 2 minutes.
    pub fn default_retry() -> RetryPolicy {
        RetryPolicy::default()
            .with_max_attempts(None)
            .unwrap_or_default()
            .with_max_elapsed(Some(Duration::from_secs(120)))
    }

    /// The epoch to use (default 0). With an [`EpochStore`], the stored epoch + 1 wins if higher.
    pub fn epoch(mut self, epoch: u64) -> Self {
        self.epoch = Some(epoch);
        self
    }

    /// Persists epochs so that each start uses a higher one. See [`EpochStore`].
    pub fn epoch_store(mut self, store: impl EpochStore + 'static) -> Self {
        self.epoch_store = Some(Arc::new(store));
        self
    }

    /// On `403` (a newer epoch exists), claim a higher epoch and continue instead of failing.
    /// For ephemeral producers without a persisted epoch. A batch whose earlier attempt's answer
    /// was lost right when the claim happens may then be written twice (once per epoch).
    pub fn auto_claim(mut self, on: bool) -> Self {
        self.auto_claim = on;
        self
    }

    /// Seal a batch once its body reaches this many bytes (default 1 MiB).
    pub fn max_batch_bytes(mut self, n: usize) -> Self {
        self.max_batch_bytes = n;
        self
    }

    /// Seal a batch once it holds this many items (default 10 000).
    pub fn max_batch_items(mut self, n: usize) -> Self {
        self.max_batch_items = n;
        self
    }

    /// How long the first item of a batch waits for more (default 5 ms). Zero sends as soon as
    /// there is room in the pipeline; items still batch up while it is full.
    pub fn linger(mut self, d: Duration) -> Self {
        self.linger = d;
        self
    }

    /// Batches in flight at once (default 5).
    pub fn max_in_flight(mut self, n: usize) -> Self {
        self.max_in_flight = n;
        self
    }

    /// Memory bound: bytes appended but not yet acknowledged (default 16 MiB).
    pub fn max_buffered_bytes(mut self, n: usize) -> Self {
        self.max_buffered_bytes = n;
        self
    }

    /// Per-batch retry policy (default: [`ProducerBuilder::default_retry`]).
    pub fn retry_policy(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }

    /// The stream's content type, saving a `HEAD` at start.
    pub fn content_type(mut self, ct: impl Into<String>) -> Self {
        self.content_type = Some(ct.into());
        self
    }

    /// Replaces the randomness behind retry delays.
    pub fn jitter(mut self, jitter: Arc<dyn Jitter>) -> Self {
        self.jitter = Some(jitter);
        self
    }

    /// Checks the settings without starting anything.
    pub fn validate(&self) -> Result<(), Error> {
        if self.producer_id.trim().is_empty() {
            return Err(Error::invalid("producerId must not be empty"));
        }
        if reqwest::header::HeaderValue::from_str(&self.producer_id).is_err() {
            return Err(Error::invalid("producerId must be valid header text (visible ASCII)"));
        }
        if self.epoch.is_some_and(|e| e > MAX_SAFE_INTEGER) {
            return Err(Error::invalid("epoch must be between 0 and 2^53-1"));
        }
        if self.max_batch_bytes == 0 {
            return Err(Error::invalid("maxBatchBytes (max_batch_bytes) must be greater than zero"));
        }
        if self.max_batch_items == 0 {
            return Err(Error::invalid("maxBatchItems (max_batch_items) must be greater than zero"));
        }
        if self.max_in_flight == 0 {
            return Err(Error::invalid("maxInFlight (max_in_flight) must be greater than zero"));
        }
        if self.max_buffered_bytes == 0 || self.max_buffered_bytes > u32::MAX as usize {
            return Err(Error::invalid("max_buffered_bytes must be between 1 and 2^32-1"));
        }
        Ok(())
    }

    /// Starts the producer: learns the content type if needed (`HEAD`), settles the epoch with
    /// the [`EpochStore`] (stored before any request), and spawns the pipeline task on the
    /// current Tokio runtime.
    pub async fn start(self) -> Result<Producer, Error> {
        self.validate()?;
        let content_type = match self.content_type.clone().or_else(|| self.handle.known_content_type()) {
            Some(ct) => ct,
            None => self.handle.content_type().await?,
        };
        let epoch = match &self.epoch_store {
            Some(store) => {
                let (store, id, floor) = (store.clone(), self.producer_id.clone(), self.epoch.unwrap_or(0));
                tokio::task::spawn_blocking(move || {
                    let epoch = match store.load(&id)? {
                        Some(last) => last
                            .checked_add(1)
                            .filter(|e| *e <= MAX_SAFE_INTEGER)
                            .ok_or_else(|| Error::EpochStore(format!("stored epoch {last} cannot be incremented")))?,
                        None => 0,
                    }
                    .max(floor);
                    store.store(&id, epoch)?;
                    Ok::<u64, Error>(epoch)
                })
                .await
                .map_err(|e| Error::EpochStore(e.to_string()))??
            }
            None => self.epoch.unwrap_or(0),
        };
        let transport = Arc::new(HttpTransport {
            handle: self.handle.clone(),
            producer_id: self.producer_id.clone(),
            content_type: content_type.clone(),
        });
        let jitter = self.jitter.clone().unwrap_or_else(|| self.handle.client().jitter());
        Ok(self.spawn(transport, epoch, content_type::is_json(&content_type), jitter))
    }

    pub(crate) fn spawn(
        self,
        transport: Arc<dyn Transport>,
        epoch: u64,
        json: bool,
        jitter: Arc<dyn Jitter>,
    ) -> Producer {
        let shared = Arc::new(Shared {
            sem: Arc::new(Semaphore::new(self.max_buffered_bytes)),
            failed: OnceLock::new(),
            closed: AtomicBool::new(false),
            epoch: AtomicU64::new(epoch),
            counters: Counters::default(),
        });
        let settings = Settings {
            limits: Limits { max_bytes: self.max_batch_bytes, max_items: self.max_batch_items, json },
            linger: self.linger,
            max_in_flight: self.max_in_flight,
            retry: self.retry,
            auto_claim: self.auto_claim,
            producer_id: self.producer_id.clone(),
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let pipeline = Pipeline::new(transport, settings, shared.clone(), self.epoch_store, jitter, rx, epoch);
        tokio::spawn(pipeline.run());
        Producer {
            tx,
            shared,
            json,
            capacity: self.max_buffered_bytes,
            producer_id: Arc::from(self.producer_id),
            closed_stream: Arc::new(OnceCell::new()),
            detached: Arc::new(OnceCell::new()),
        }
    }
}

/// An exactly-once producer. Cheap to clone: clones share one pipeline, and items keep the order
/// in which `append` calls returned.
#[derive(Clone)]
pub struct Producer {
    /// Commands to the pipeline task.
    tx: mpsc::UnboundedSender<Cmd>,
    /// Buffer permits, failure and closure flags, counters.
    shared: Arc<Shared>,
    /// Whether items are JSON values (an `application/json` stream).
    json: bool,
    /// `max_buffered_bytes`: no single item may exceed it.
    capacity: usize,
    /// `Producer-Id`, for display.
    producer_id: Arc<str>,
    /// The result of the first `close_stream`, returned again by later calls (idempotent).
    closed_stream: Arc<OnceCell<Result<StreamOffset, Error>>>,
    /// The result of the first `close`, returned again by later calls.
    detached: Arc<OnceCell<Result<(), Error>>>,
}

impl std::fmt::Debug for Producer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Producer").field("id", &self.producer_id).field("epoch", &self.epoch()).finish_non_exhaustive()
    }
}

impl Producer {
    /// The current epoch (auto-claim may raise it).
    pub fn epoch(&self) -> u64 {
        self.shared.epoch.load(Ordering::Relaxed)
    }

    /// The producer id.
    pub fn id(&self) -> &str {
        &self.producer_id
    }

    /// Counters since start.
    pub fn stats(&self) -> ProducerStats {
        self.shared.counters.snapshot()
    }

    /// Whether items are JSON messages (the stream is `application/json`).
    pub fn is_json(&self) -> bool {
        self.json
    }

    fn refusal(&self) -> Option<Error> {
        if let Some(e) = self.shared.failed.get() {
            return Some(Error::ProducerFailed(Arc::new(e.clone())));
        }
        self.shared.closed.load(Ordering::Acquire).then_some(Error::ProducerClosed)
    }

    /// Checks an item; returns its buffer cost.
    fn check(&self, item: &Bytes) -> Result<usize, Error> {
        if item.is_empty() {
            return Err(Error::invalid("an item must not be empty"));
        }
        if self.json {
            serde_json::from_slice::<IgnoredAny>(item)?;
        }
        if item.len() > self.capacity {
            return Err(Error::invalid(format!(
                "item of {} bytes exceeds the producer's buffer of {} bytes",
                item.len(),
                self.capacity
            )));
        }
        Ok(item.len())
    }

    fn enqueue(&self, item: Bytes, permits: usize) -> Result<Receipt, Error> {
        let (reply, rx) = oneshot::channel();
        if self.tx.send(Cmd::Append { item, permits, reply }).is_err() {
            self.shared.sem.add_permits(permits);
            return Err(Error::ProducerClosed);
        }
        Ok(Receipt { rx })
    }

    /// Queues one item (bytes; for a JSON stream, the text of one JSON value). Waits while the
    /// buffer is full. The returned [`Receipt`] resolves when the item is stored (or failed).
    pub async fn append(&self, item: impl Into<Bytes>) -> Result<Receipt, Error> {
        let item = item.into();
        let permits = self.check(&item)?;
        if let Some(e) = self.refusal() {
            return Err(e);
        }
        let n = u32::try_from(permits).map_err(|_| Error::invalid("item too large"))?;
        let permit = self.shared.sem.clone().acquire_many_owned(n).await.map_err(|_| Error::ProducerClosed)?;
        permit.forget();
        self.enqueue(item, permits)
    }

    /// Like [`Producer::append`] but fails with [`Error::BufferFull`] instead of waiting.
    pub fn try_append(&self, item: impl Into<Bytes>) -> Result<Receipt, Error> {
        let item = item.into();
        let permits = self.check(&item)?;
        if let Some(e) = self.refusal() {
            return Err(e);
        }
        let n = u32::try_from(permits).map_err(|_| Error::invalid("item too large"))?;
        match self.shared.sem.clone().try_acquire_many_owned(n) {
            Ok(permit) => permit.forget(),
            Err(TryAcquireError::NoPermits) => return Err(Error::BufferFull),
            Err(TryAcquireError::Closed) => return Err(Error::ProducerClosed),
        }
        self.enqueue(item, permits)
    }

    /// Serializes `value` as JSON and appends it (one message on a JSON stream).
    pub async fn append_json<T: Serialize + ?Sized>(&self, value: &T) -> Result<Receipt, Error> {
        self.append(serde_json::to_vec(value)?).await
    }

    /// Like [`Producer::append_json`] but fails with [`Error::BufferFull`] instead of waiting.
    pub fn try_append_json<T: Serialize + ?Sized>(&self, value: &T) -> Result<Receipt, Error> {
        self.try_append(serde_json::to_vec(value)?)
    }

    /// Sends what is buffered and waits until everything appended before this call is stored
    /// or failed. Returns the producer's first error, if any.
    pub async fn flush(&self) -> Result<(), Error> {
        let (reply, rx) = oneshot::channel();
        if self.tx.send(Cmd::Flush { reply }).is_err() {
            return Err(self.shared.failed.get().cloned().unwrap_or(Error::ProducerClosed));
        }
        rx.await.unwrap_or(Err(Error::ProducerClosed))
    }

    /// Flushes, then stops taking appends (the stream stays open). Idempotent: later calls
    /// return the first call's result.
    pub async fn close(&self) -> Result<(), Error> {
        self.detached
            .get_or_init(|| async {
                self.shared.closed.store(true, Ordering::Release);
                let (reply, rx) = oneshot::channel();
                if self.tx.send(Cmd::Detach { reply }).is_err() {
                    return Err(self.shared.failed.get().cloned().unwrap_or(Error::ProducerClosed));
                }
                rx.await.unwrap_or(Err(Error::ProducerClosed))
            })
            .await
            .clone()
    }

    /// Flushes, then closes the stream with producer headers, atomically appending `last` if
    /// given (raw bytes, or one JSON value's text on a JSON stream). Retried safely like any
    /// batch, and idempotent: later calls return the first call's result. Returns the stream's
    /// final offset.
    pub async fn close_stream(&self, last: Option<Bytes>) -> Result<StreamOffset, Error> {
        self.closed_stream
            .get_or_init(|| async {
                if let Some(b) = &last {
                    if self.json {
                        serde_json::from_slice::<IgnoredAny>(b)?;
                    }
                }
                self.shared.closed.store(true, Ordering::Release);
                let (reply, rx) = oneshot::channel();
                if self.tx.send(Cmd::CloseStream { last: last.filter(|b| !b.is_empty()), reply }).is_err() {
                    return Err(self.shared.failed.get().cloned().unwrap_or(Error::ProducerClosed));
                }
                match rx.await {
                    Ok(Ok(ack)) => Ok(ack.next_offset),
                    Ok(Err(e)) => Err(e),
                    Err(_) => Err(Error::ProducerClosed),
                }
            })
            .await
            .clone()
    }
}
