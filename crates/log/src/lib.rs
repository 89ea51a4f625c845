//! Oncelog's own log engine: a segmented, checksummed write-ahead log that *is* the store.
//!
//! Module map:
//! - [`fs`]: the file-system trait all I/O goes through, and the real file system;
//! - `sim` (tests only): a simulated disk that loses unsynced writes at a power cut;
//! - [`format`]: segments, frames, records and checkpoints — the on-disk format and its
//!   invariants, written beside the code;
//! - `store`: the writer's state, the group commit, recovery and reads (synchronous, so a
//!   seeded test can drive it step by step);
//! - [`backup`]: copying a running store;
//! - [`tier`] (`--object-store`): the shipper to a bucket, the restore from it, the takeover;
//!   `cold`: segments only in the bucket, read through the tiered file system;
//! - `options`: [`LogOptions`], [`Durability`]; `error`: [`LogError`];
//! - this file: [`LogEngine`], the [`Engine`] over a writer thread and a checkpointer thread.
//!
//! Data flow of an append: the HTTP task sends a command to the writer thread and awaits a
//! oneshot reply. The writer drains what is queued, decides each command with the stream state
//! machine ([`oncelog_storage::machine`]) against its in-memory state, encodes each accepted one
//! as **one record** (data, closure, `Stream-Seq` and producer state together) into **one
//! frame**, writes the frame with one `pwrite`, `fdatasync`s once, then publishes the new tails
//! (and the appended bytes, as a hot tail) to readers and replies.
//! Background work — the checkpoint that
//! bounds recovery time and lets old segments go — runs on its own thread from a snapshot and
//! never holds anything the commit path needs.
//!
//! Why written by hand: the log, its commit path and its recovery are the product's core (the
//! exactly-once promise is only as good as them), and owning them removes the failure modes a
//! general-purpose store brought (a foreign lock on the commit path, a poisoning race after a
//! failed fsync, no way to simulate power loss beneath it).
//!
//! Memory: per stream its metadata, a packed published state with a `Notify`, and 16 bytes per
//! append of index; per
//! producer its state; plus a store-wide bounded hot tail, filled only for streams followed live.
//! Data lives in the segment files and the OS page cache.

pub mod backup;
mod cold;
mod error;
#[cfg(test)]
mod fault_tests;
pub mod format;
pub mod fs;
mod options;
#[cfg(test)]
mod power_loss;
#[cfg(test)]
mod sim;
mod store;
pub mod tier;

use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use oncelog_protocol::Offset;
use oncelog_storage::*;
use tokio::sync::oneshot;

use error::backend;
pub use error::LogError;
#[cfg(any(test, feature = "failpoints"))]
pub use options::Failpoints;
pub use options::{Durability, LogOptions};
pub use store::RecoveryReport;
use store::{Command, Group, Store, StoreConfig, StreamView, View};

/// Most commands in one group commit: bounds the latency a group adds to its first member.
const MAX_GROUP_COMMANDS: usize = 4096;
/// Most data bytes in one group commit, for the same reason.
pub(crate) const MAX_GROUP_BYTES: usize = 32 << 20;

/// The log engine. Cheap to clone.
#[derive(Clone)]
pub struct LogEngine {
    inner: Arc<Inner>,
}

/// The segment files by number, as readers find them.
type Segments = std::sync::RwLock<std::collections::BTreeMap<u64, Arc<dyn crate::fs::File>>>;

/// What a read found before fetching a byte ([`LogEngine::find`]).
enum Found {
    /// The read starts at the tail: this is the whole answer.
    AtTail(ReadChunk),
    /// The stream as the read found it, its entry, and where the bytes are.
    Planned(StreamInfo, Arc<StreamView>, store::read::Plan),
}

struct Inner {
    view: Arc<View>,
    counters: Arc<store::Counters>,
    /// `None` once shutdown began. Shared with the shipper in `--ack-mode bucket` (it wakes
    /// the writer when a cut is published), so dropping it here still ends the writer.
    tx: WriterTx,
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// The bucket's shipper (`--object-store`), stopped after the writer.
    shipper: Mutex<Option<std::thread::JoinHandle<()>>>,
    report: RecoveryReport,
}

impl LogEngine {
    /// Where the bytes of a read of up to about `req.max_bytes` are (exactly, when bounded: see
    /// [`ReadRequest::bounded`]), decided without I/O: the answer itself at the tail, else the
    /// stream's state as the read found it and the plan.
    fn find(&self, req: &ReadRequest<'_>) -> Result<Found, LookupError> {
        let (from, now_ms) = (req.from, req.now_ms);
        let max_bytes = if req.bounded { req.max_bytes.max(1) } else { req.max_bytes };
        let shared = self.lookup(req.path, now_ms)?;
        shared.touch(now_ms);
        let info = shared.info();
        if let Some(at_tail) = rules::read_start(&info, from)? {
            shared.mark_live();
            return Ok(Found::AtTail(at_tail));
        }
        let plan = store::read::plan(&shared, from.0, info.tail.0, max_bytes, req.bounded)?;
        Ok(Found::Planned(info, shared, plan))
    }

    /// Fetches a plan's bytes with `take`: at once when they are all in the hot tail, or when
    /// `mapped` (`take` answers with slices of mapped segments) and every segment maps without
    /// I/O (a local file: the bytes are read when a socket sends them; only a mapping that
    /// cannot be made, out of `vm.max_map_count`, falls back to a `pread` here); else off the
    /// async runtime. A read that reached the tail marks the stream read live.
    async fn fetch<T: Send + 'static>(
        &self,
        info: &StreamInfo,
        shared: &StreamView,
        plan: store::read::Plan,
        take: fn(store::read::Plan, &Segments) -> Result<(T, Offset), StorageError>,
        mapped: bool,
    ) -> Result<(T, Offset), LookupError> {
        // Off the async threads only when the answer must wait for a read: pieces of mapped
        // segments are slices (their bytes are read when a socket sends them).
        let inline = plan.in_memory() || (mapped && plan.maps_without_io(&self.inner.view.segments));
        let (out, next) = if inline {
            take(plan, &self.inner.view.segments)?
        } else {
            let view = self.inner.view.clone();
            tokio::task::spawn_blocking(move || take(plan, &view.segments))
                .await
                .map_err(|e| backend(LogError::Io { what: "read".into(), source: std::io::Error::other(e) }))??
        };
        if next >= info.tail {
            shared.mark_live();
        }
        Ok((out, next))
    }

    /// Opens (or creates) the store, recovers it, and starts the writer thread.
    pub fn open(opts: LogOptions) -> Result<Self, StorageError> {
        let cfg = StoreConfig {
            durability: opts.durability,
            segment_bytes: opts.segment_bytes,
            hot_bytes: opts.hot_bytes,
            #[cfg(test)]
            mutant: store::mutant::Mutant::None,
            #[cfg(any(test, feature = "failpoints"))]
            failpoints: opts.failpoints.clone(),
            retention: opts.retention,
        };
        let started = Instant::now();
        // With a bucket: restore or check the data directory, and take the bucket over, before
        // the store opens it; the shipper starts once the store is open.
        // The log then lives on the tiered file system: the data directory plus the segments
        // that are only in the bucket (cold).
        let (fs, shipper): (Arc<dyn fs::Fs>, _) = match &opts.tier {
            Some(tier) => {
                // Its own client: cold reads run on a runtime of their own (see `Bucket::reopened`).
                let cold = cold::Cold::new(tier.bucket.reopened().map_err(tier::bucket_err)?)
                    .map_err(|e| backend(LogError::Io { what: "start the cold reads".into(), source: e }))?;
                let held =
                    opts.fs.create_dir("").and_then(|()| opts.fs.lock(format::LOCK)).map_err(|e| match e.kind() {
                        std::io::ErrorKind::WouldBlock => backend(LogError::Locked),
                        _ => backend(LogError::Io { what: "lock the data directory".into(), source: e }),
                    })?;
                let tiered = Arc::new(cold::TieredFs {
                    local: opts.fs.clone(),
                    cold: cold.clone(),
                    held: Mutex::new(Some(held)),
                });
                let shipper = start_shipper(opts.fs.clone(), tiered.clone(), cold, tier.clone(), opts.clock.now_ms())?;
                (tiered, Some(shipper))
            }
            None => (opts.fs.clone(), None),
        };
        let (store, report) = store::open(fs.clone(), cfg, opts.clock.now_ms())?;
        // Debug: `oncelog serve` logs the report at info, with its settings, once per start
        // (an embedder reads it from `recovery_report`).
        tracing::debug!(?report, elapsed = ?started.elapsed(), "log recovered");
        let view = store.view().clone();
        let counters = store.counters().clone();
        // Unbounded: every queued command is an HTTP request already holding its body, so the
        // server's in-flight requests bound the queue; sending never blocks a runtime thread.
        let (tx, rx) = mpsc::channel();
        let tx: WriterTx = Arc::new(Mutex::new(Some(tx)));
        let (checkpoint_bytes, reclaim_interval) = (opts.checkpoint_bytes, opts.reclaim_interval);
        let bucket_acks = match opts.tier.as_ref().map(|t| t.ack) {
            Some(tier::AckMode::Bucket { timeout }) => Some(timeout),
            _ => None,
        };
        let (ship, shipper) = match shipper {
            Some((start, handle)) => {
                let (ship_tx, ship_rx) = mpsc::channel::<tier::ShipMsg>();
                let wake = bucket_acks.map(|_| tx.clone());
                // A shipper that is gone already failed and said why.
                let _ = start.send((view.clone(), counters.clone(), ship_rx, wake));
                (Some(ship_tx), Some(handle))
            }
            None => (None, None),
        };
        let handle = std::thread::Builder::new()
            .name("oncelog-log-writer".into())
            .spawn(move || run_writer(store, rx, fs, checkpoint_bytes, reclaim_interval, ship, bucket_acks))
            .map_err(|e| backend(LogError::Io { what: "start the writer thread".into(), source: e }))?;
        Ok(Self {
            inner: Arc::new(Inner {
                view,
                counters,
                tx,
                writer: Mutex::new(Some(handle)),
                shipper: Mutex::new(shipper),
                report,
            }),
        })
    }

    /// With a bucket: the last LSN the log has written, and the last one a published cut of
    /// the bucket holds (what a node restored from it would have). `None` without a bucket.
    pub fn shipping(&self) -> Option<(u64, u64)> {
        self.inner.shipper.lock().ok()?.as_ref()?;
        let written = self.inner.view.synced.lock().ok()?.lsn;
        Some((written, self.inner.counters.shipped_lsn.load(Ordering::Acquire)))
    }

    pub fn recovery_report(&self) -> RecoveryReport {
        self.inner.report
    }

    /// Bytes of recent appends held in memory for live readers (the hot tail), as of the last
    /// group commit that added to it.
    pub fn hot_tail_bytes(&self) -> u64 {
        self.inner.counters.hot_bytes.load(Ordering::Relaxed)
    }

    async fn call<T>(&self, make: impl FnOnce(oneshot::Sender<T>) -> Command) -> Result<T, StorageError> {
        let tx = self.inner.tx.lock().map_err(|_| StorageError::Poisoned)?.clone().ok_or(StorageError::ShuttingDown)?;
        let (reply, rx) = oneshot::channel();
        tx.send(make(reply)).map_err(|_| StorageError::ShuttingDown)?;
        rx.await.map_err(|_| StorageError::ShuttingDown)
    }

    fn lookup(&self, path: &str, now_ms: i64) -> Result<Arc<StreamView>, LookupError> {
        let map = self.inner.view.streams.read().map_err(|_| StorageError::Poisoned)?;
        let s = map.get(path).ok_or(LookupError::NotFound)?;
        let soft_deleted = s.state.get().soft_deleted;
        rules::visible(soft_deleted, s.expired(now_ms), s.forks())?;
        Ok(s.clone())
    }
}

/// How soon a due trim checkpoint is tried again while the checkpointer is busy.
const RECLAIM_RETRY: Duration = Duration::from_millis(20);

/// The writer thread: one group per loop, a checkpoint handed to its own thread now and then.
fn run_writer(
    mut store: Store,
    rx: mpsc::Receiver<Command>,
    fs: Arc<dyn fs::Fs>,
    checkpoint_bytes: u64,
    reclaim_interval: Duration,
    ship: Option<mpsc::Sender<tier::ShipMsg>>,
    bucket_acks: Option<Duration>,
) {
    let mut last_checkpoint = Instant::now();
    store.collect_orphans();
    // `--ack-mode bucket`: committed groups wait here, in order, until a published cut holds
    // them; only then are they answered and made visible (`Awaiting`).
    let mut awaiting = Awaiting { groups: std::collections::VecDeque::new(), timeout: bucket_acks, nudge: None };
    if bucket_acks.is_some() {
        awaiting.nudge.clone_from(&ship);
    }
    let checkpointer = Checkpointer::start(fs, store.view().clone(), store.counters().clone(), ship);
    loop {
        awaiting.release(&mut store);
        // Wake for a parked append's deadline, for a trim's checkpoint when it is due (a
        // little later again while the checkpointer is still busy with the last one), and for
        // the timeout of the oldest group waiting for the bucket (a publish wakes the writer
        // itself: `Command::Shipped`).
        let reclaim_at =
            store.reclaim_wanted.then(|| (last_checkpoint + reclaim_interval).max(Instant::now() + RECLAIM_RETRY));
        let bucket_at = awaiting.next_timeout();
        let first = match [store.next_park_deadline(), reclaim_at, bucket_at].into_iter().flatten().min() {
            None => match rx.recv() {
                Ok(cmd) => Some(cmd),
                Err(_) => break,
            },
            Some(deadline) => match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(cmd) => Some(cmd),
                Err(mpsc::RecvTimeoutError::Timeout) => None,
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            },
        };
        if matches!(first, Some(Command::Shipped)) {
            continue;
        }
        let mut g = Group::new();
        store.expire_parked(Instant::now(), &mut g);
        let mut count = 0usize;
        if let Some(first) = first {
            store.stage(first, &mut g);
            count = 1;
            while count < MAX_GROUP_COMMANDS && g.bytes < MAX_GROUP_BYTES {
                let Ok(cmd) = rx.try_recv() else { break };
                store.stage(cmd, &mut g);
                count += 1;
            }
        }
        let committing = Instant::now();
        let failure = store.commit(&mut g);
        if count > 0 {
            oncelog_storage::machine::record_group_commit(count, committing.elapsed());
        }
        awaiting.finish(&mut store, g, failure);
        let due = store.since_checkpoint >= checkpoint_bytes
            || (store.reclaim_wanted && last_checkpoint.elapsed() >= reclaim_interval);
        if due && !store.counters().failed() && checkpointer.idle() {
            // A checkpoint is the state readers see (the index) with the writer's: groups
            // still waiting for the bucket are in one and not yet in the other. Wait for them
            // (one ship round, normally); a bucket that does not answer postpones it instead.
            if awaiting.settle(&mut store) {
                store.since_checkpoint = 0;
                store.reclaim_wanted = false;
                store.prune_idle();
                store.prune_index();
                checkpointer.send(store.snapshot());
            }
            last_checkpoint = Instant::now();
        }
    }
    // Channel closed: shutdown. Parked appends get their final answer; a last checkpoint makes
    // the next start quick.
    let mut g = Group::new();
    store.expire_all_parked(&mut g);
    let failure = store.commit(&mut g);
    awaiting.finish(&mut store, g, failure);
    awaiting.drain(&mut store);
    if !store.counters().failed() && (store.since_checkpoint > 0 || store.reclaim_wanted) {
        store.prune_idle();
        store.prune_index();
        checkpointer.send(store.snapshot());
    }
    checkpointer.stop();
}

/// Writes checkpoints on its own thread, one at a time; a failure stops all writes (fail-stop
/// covers background work too).
struct Checkpointer {
    tx: Option<mpsc::SyncSender<format::Checkpoint>>,
    busy: Arc<std::sync::atomic::AtomicBool>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Checkpointer {
    /// `ship`: with a bucket, each checkpoint goes to the shipper, and the segments it made
    /// unnecessary stay until the bucket holds it (the shipper removes them).
    fn start(
        fs: Arc<dyn fs::Fs>,
        view: Arc<View>,
        counters: Arc<store::Counters>,
        ship: Option<mpsc::Sender<tier::ShipMsg>>,
    ) -> Self {
        let (tx, rx) = mpsc::sync_channel::<format::Checkpoint>(1);
        let busy = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = busy.clone();
        let handle = std::thread::Builder::new()
            .name("oncelog-checkpoint".into())
            .spawn(move || {
                for cp in rx {
                    let started = Instant::now();
                    let written = match &ship {
                        None => store::write_checkpoint(&*fs, &view, &cp),
                        Some(ship) => store::write_checkpoint_keeping(&*fs, &view, &cp).map(|w| {
                            let kept = w.dead.len();
                            let _ = ship.send(tier::ShipMsg::Checkpoint(tier::Shipment { lsn: cp.lsn, bytes: w.bytes, dead: w.dead }));
                            kept
                        }),
                    };
                    match written {
                        Ok(removed) => {
                            metrics::histogram!("oncelog_checkpoint_seconds").record(started.elapsed().as_secs_f64());
                            tracing::debug!(lsn = cp.lsn, removed_segments = removed, elapsed = ?started.elapsed(), "checkpoint written");
                        }
                        Err(e) => {
                            tracing::error!(error = %e, "checkpoint failed; refusing all further writes");
                            counters.fail(format!("writes stopped after a checkpoint failure: {e}"));
                        }
                    }
                    flag.store(false, Ordering::SeqCst);
                }
            })
            .ok();
        Checkpointer { tx: handle.as_ref().map(|_| tx), busy, handle }
    }

    fn idle(&self) -> bool {
        !self.busy.load(Ordering::SeqCst)
    }

    fn send(&self, cp: format::Checkpoint) {
        if let Some(tx) = &self.tx {
            self.busy.store(true, Ordering::SeqCst);
            if tx.send(cp).is_err() {
                self.busy.store(false, Ordering::SeqCst);
            }
        }
    }

    fn stop(mut self) {
        self.tx.take();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

impl Housekeeping for LogEngine {
    async fn expire(&self, now_ms: i64) -> Result<usize, StorageError> {
        let expired: Vec<String> = {
            let map = self.inner.view.streams.read().map_err(|_| StorageError::Poisoned)?;
            map.iter()
                .filter(|(_, s)| !s.state.get().soft_deleted && s.expired(now_ms))
                .map(|(p, _)| p.to_string())
                .collect()
        };
        if expired.is_empty() {
            return Ok(0);
        }
        self.call(|reply| Command::Expire { paths: expired, now_ms, reply }).await?
    }

    async fn retain(&self, now_ms: i64) -> Result<Retained, StorageError> {
        let any = {
            let map = self.inner.view.streams.read().map_err(|_| StorageError::Poisoned)?;
            map.values().any(|s| !s.config.retention.is_none())
        };
        if !any {
            return Ok(Retained::default());
        }
        self.call(|reply| Command::Retain { now_ms, reply }).await?
    }

    async fn prune(&self, now_ms: i64) -> Result<PruneOutcome, StorageError> {
        self.call(|reply| Command::Prune { now_ms, reply }).await
    }

    async fn compaction_candidates(&self, min_bytes: u64) -> Result<Vec<(String, Offset)>, StorageError> {
        let map = self.inner.view.streams.read().map_err(|_| StorageError::Poisoned)?;
        Ok(map
            .iter()
            .filter(|(_, s)| s.config.compaction)
            .map(|(p, s)| (p, s.info()))
            .filter(|(_, i)| oncelog_storage::compaction::is_candidate(i, min_bytes))
            .map(|(p, i)| (p.to_string(), i.tail))
            .collect())
    }
}

impl Engine for LogEngine {
    async fn create(&self, req: CreateRequest) -> Result<CreateOutcome, CreateError> {
        self.call(|reply| Command::Create { req, reply }).await?
    }

    async fn append(&self, req: AppendRequest) -> Result<AppendOutcome, AppendError> {
        self.call(|reply| Command::Append { req, reply }).await?
    }

    async fn trim(&self, path: &str, to: Offset, now_ms: i64) -> Result<TrimOutcome, TrimError> {
        let path = path.to_owned();
        self.call(|reply| Command::Trim { path, to, now_ms, reply }).await?
    }

    async fn compact(&self, req: CompactRequest) -> Result<TrimOutcome, CompactError> {
        self.call(|reply| Command::Compact { req, reply }).await?
    }

    async fn delete_if(&self, path: &str, req: DeleteRequest, now_ms: i64) -> Result<(), LookupError> {
        let path = path.to_owned();
        self.call(|reply| Command::Delete { path, req, now_ms, reply }).await?
    }

    async fn head(&self, path: &str, now_ms: i64) -> Result<StreamInfo, LookupError> {
        Ok(self.lookup(path, now_ms)?.info())
    }

    /// Reads afresh from memory whether or not a wait woke the reader (`req.seen` saves this
    /// engine nothing); a bounded read reads only the part of an append it returns.
    async fn read(&self, req: ReadRequest<'_>) -> Result<ReadChunk, LookupError> {
        match self.find(&req)? {
            Found::AtTail(chunk) => Ok(chunk),
            Found::Planned(info, shared, plan) => {
                let ((data, aligned), next) = self.fetch(&info, &shared, plan, store::read::Plan::bytes, false).await?;
                Ok(ReadChunk { info, data, next, aligned })
            }
        }
    }

    async fn read_pieces(&self, req: ReadRequest<'_>) -> Result<ReadPieces, LookupError> {
        match self.find(&req)? {
            Found::AtTail(chunk) => Ok(ReadPieces::from(chunk)),
            Found::Planned(info, shared, plan) => {
                let (pieces, next) = self.fetch(&info, &shared, plan, store::read::Plan::pieces, true).await?;
                Ok(ReadPieces { info, pieces, next })
            }
        }
    }

    async fn wait(
        &self,
        path: &str,
        after: Offset,
        timeout: Duration,
        now_ms: i64,
    ) -> Result<WaitOutcome, LookupError> {
        let shared = self.lookup(path, now_ms)?;
        shared.touch(now_ms);
        shared.mark_live();
        let deadline = tokio::time::Instant::now() + timeout;
        let mut p = shared.state.get();
        loop {
            if p.deleted {
                return Err(LookupError::NotFound);
            }
            if p.soft_deleted {
                return Err(LookupError::Gone);
            }
            if p.tail > after || p.closed {
                return Ok(WaitOutcome::Changed(shared.info()));
            }
            if tokio::time::Instant::now() >= deadline {
                return Ok(WaitOutcome::TimedOut(shared.info()));
            }
            p = shared.state.changed_from(p, deadline).await;
        }
    }

    async fn transact(&self, txn: TxnRequest) -> Result<TxnOutcome, TxnError> {
        self.call(|reply| Command::Transact { txn, reply }).await?
    }

    async fn meta_scan(&self, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Bytes)>, StorageError> {
        let prefix = prefix.to_vec();
        self.call(|reply| Command::MetaScan { prefix, reply }).await?
    }

    async fn list_streams(&self, prefix: &str, now_ms: i64) -> Result<Vec<Listed>, StorageError> {
        let map = self.inner.view.streams.read().map_err(|_| StorageError::Poisoned)?;
        let mut out: Vec<Listed> = map
            .iter()
            .filter(|(p, s)| {
                p.starts_with(prefix)
                    && rules::visible(s.state.get().soft_deleted, s.expired(now_ms), s.forks()).is_ok()
            })
            .map(|(p, s)| Listed { path: p.to_string(), info: s.info() })
            .collect();
        out.sort_unstable_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }

    async fn shutdown(&self) -> Result<(), StorageError> {
        self.inner.tx.lock().map_err(|_| StorageError::Poisoned)?.take();
        let handle = self.inner.writer.lock().map_err(|_| StorageError::Poisoned)?.take();
        if let Some(h) = handle {
            tokio::task::spawn_blocking(move || h.join())
                .await
                .map_err(|e| {
                    backend(LogError::Io { what: "stop the writer".into(), source: std::io::Error::other(e) })
                })?
                .map_err(|_| StorageError::Poisoned)?;
        }
        // The writer's checkpointer is gone, so the shipper makes its last round and stops.
        let shipper = self.inner.shipper.lock().map_err(|_| StorageError::Poisoned)?.take();
        if let Some(h) = shipper {
            tokio::task::spawn_blocking(move || h.join())
                .await
                .map_err(|e| {
                    backend(LogError::Io { what: "stop the shipper".into(), source: std::io::Error::other(e) })
                })?
                .map_err(|_| StorageError::Poisoned)?;
        }
        Ok(())
    }

    fn readiness(&self) -> Readiness {
        if let Ok(slot) = self.inner.counters.failure.lock() {
            if let Some(reason) = slot.as_ref() {
                return Readiness::NotReady { reason: reason.clone() };
            }
        }
        match self.inner.tx.lock() {
            Ok(tx) if tx.is_some() => Readiness::Ready,
            _ => Readiness::NotReady { reason: "shutting down".into() },
        }
    }

    fn stats(&self) -> EngineStats {
        EngineStats {
            streams: self.inner.counters.streams.load(Ordering::Relaxed),
            producers: self.inner.counters.producers.load(Ordering::Relaxed),
            parked_appends: self.inner.counters.parked.load(Ordering::Relaxed),
        }
    }
}

/// The writer's command queue, `None` once shutdown began.
pub(crate) type WriterTx = Arc<Mutex<Option<mpsc::Sender<Command>>>>;

/// What the shipper thread waits for once the store is open (the writer's queue: to wake it
/// when a cut is published, in `--ack-mode bucket`).
type ShipperStart = mpsc::Sender<(Arc<View>, Arc<store::Counters>, mpsc::Receiver<tier::ShipMsg>, Option<WriterTx>)>;

/// Starts the shipper's thread with a runtime of its own: it restores or checks the data
/// directory and takes the bucket over (reported back before this returns), then waits for the
/// open store and ships until fenced or stopped.
fn start_shipper(
    local: Arc<dyn fs::Fs>,
    fs: Arc<dyn fs::Fs>,
    cold: Arc<cold::Cold>,
    tier: tier::Tier,
    now_ms: i64,
) -> Result<(ShipperStart, std::thread::JoinHandle<()>), StorageError> {
    let (ready_tx, ready_rx) = mpsc::channel::<Result<(), StorageError>>();
    let (start_tx, start_rx) = mpsc::channel();
    let handle = std::thread::Builder::new()
        .name("oncelog-shipper".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = ready_tx.send(Err(backend(LogError::Io { what: "start the shipper".into(), source: e })));
                    return;
                }
            };
            let (writer, pending) = match rt.block_on(tier::prepare(&*local, &cold, &tier, now_ms)) {
                Ok(w) => w,
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            let _ = ready_tx.send(Ok(()));
            let Ok((view, counters, rx, wake)) = start_rx.recv() else { return };
            let shipper = tier::Shipper {
                rx,
                writer,
                view,
                counters,
                fs,
                interval: tier.ship_interval,
                pending,
                doomed: Default::default(),
                caught_up: Instant::now(),
                sweep_after: tier.sweep_after,
                last_sweep: None,
                cold,
                local,
                cache_max: tier.cache_max_bytes,
                delete_grace: tier.delete_grace,
                filling: None,
                wake,
            };
            rt.block_on(shipper.run());
        })
        .map_err(|e| backend(LogError::Io { what: "start the shipper".into(), source: e }))?;
    match ready_rx.recv() {
        Ok(Ok(())) => Ok((start_tx, handle)),
        Ok(Err(e)) => {
            let _ = handle.join();
            Err(e)
        }
        Err(_) => {
            let _ = handle.join();
            Err(backend(LogError::Io { what: "start the shipper".into(), source: std::io::Error::other("it stopped") }))
        }
    }
}

/// How often the writer looks at the bucket's progress while it waits for the groups to settle
/// (before a checkpoint, at shutdown; otherwise a publish wakes it).
const AWAIT_POLL: Duration = Duration::from_millis(1);

/// `--ack-mode bucket`: committed groups waiting for a published cut to hold their frame, in
/// commit order. A group that wrote nothing waits too, behind the ones before it (its answers
/// may name their data: a duplicate's offset, a close).
struct Awaiting {
    /// (the last LSN written when the group committed, when, whether it was answered, it).
    groups: std::collections::VecDeque<(u64, Instant, bool, Group)>,
    /// `None`: `--ack-mode local`, nothing waits.
    timeout: Option<Duration>,
    /// Tells the shipper there is something to ship now.
    nudge: Option<mpsc::Sender<tier::ShipMsg>>,
}

impl Awaiting {
    /// Finishes a committed group now (local acknowledgement, or a failure), or queues it.
    fn finish(&mut self, store: &mut Store, g: Group, failure: Option<StorageError>) {
        if self.timeout.is_none() || failure.is_some() {
            store.finish(g, failure);
            return;
        }
        let lsn = store.lsn();
        if self.groups.is_empty() && lsn <= store.counters().shipped_lsn.load(Ordering::Acquire) {
            store.finish(g, None);
            return;
        }
        self.groups.push_back((lsn, Instant::now(), false, g));
        if let Some(n) = &self.nudge {
            let _ = n.send(tier::ShipMsg::Synced);
        }
    }

    /// When the oldest group not yet answered will have waited too long.
    fn next_timeout(&self) -> Option<Instant> {
        let timeout = self.timeout?;
        self.groups.iter().find(|(_, _, answered, _)| !answered).map(|(_, since, _, _)| *since + timeout)
    }

    /// Finishes the groups a published cut holds; answers 503 to those that waited too long
    /// (they become visible later); after a failure (fenced), answers every waiting group with
    /// it and makes none visible.
    fn release(&mut self, store: &mut Store) {
        let Some(timeout) = self.timeout else { return };
        if self.groups.is_empty() {
            return;
        }
        if store.counters().failed() {
            let why = store.counters().failure.lock().ok().and_then(|s| s.clone()).unwrap_or_default();
            let e = StorageError::Unavailable(Arc::new(std::io::Error::other(why)));
            for (_, _, answered, mut g) in self.groups.drain(..) {
                if !answered {
                    g.answer_now(&e);
                }
            }
            return;
        }
        let shipped = store.counters().shipped_lsn.load(Ordering::Acquire);
        while self.groups.front().is_some_and(|(lsn, ..)| *lsn <= shipped) {
            if let Some((_, _, _, g)) = self.groups.pop_front() {
                store.finish(g, None);
            }
        }
        let now = Instant::now();
        for (_, since, answered, g) in self.groups.iter_mut() {
            if !*answered && now.duration_since(*since) >= timeout {
                let e = StorageError::Unavailable(Arc::new(std::io::Error::other(
                    "the bucket does not answer: the write's outcome is unknown (a retry is recognised)",
                )));
                g.answer_now(&e);
                *answered = true;
            }
        }
    }

    /// Waits (up to the timeout, taking no new command) until no group waits; whether none
    /// does.
    fn settle(&mut self, store: &mut Store) -> bool {
        let deadline = Instant::now() + self.timeout.unwrap_or_default();
        loop {
            self.release(store);
            if self.groups.is_empty() {
                return true;
            }
            if Instant::now() >= deadline || store.counters().failed() {
                return false;
            }
            std::thread::sleep(AWAIT_POLL);
        }
    }

    /// At shutdown: waits (up to the timeout) for the shipper's last rounds; what is left is
    /// answered "shutting down" (its outcome unknown) and made visible, so the last checkpoint
    /// is the state the local log holds (the next start ships it). After a failure (fenced)
    /// nothing is made visible and no checkpoint is written.
    fn drain(&mut self, store: &mut Store) {
        self.settle(store);
        let failed = store.counters().failed();
        for (_, _, answered, mut g) in self.groups.drain(..) {
            if !answered {
                g.answer_now(&StorageError::ShuttingDown);
            }
            if !failed {
                store.finish(g, None);
            }
        }
    }
}
