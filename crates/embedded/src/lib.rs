//! Oncelog's embedded engine: fjall keyspaces (see [`records::keys`]) behind one group-commit
//! writer thread. It implements [`oncelog_storage::Engine`] by holding each stream's
//! [`StreamMeta`], tail and producer states in the writer thread and deciding every command with
//! [`oncelog_storage::rules`]; it passes the engine contract suite (`tests/contract.rs`).
//!
//! Module map: this file (the engine handle, reads, live waits, recovery), [`writer`] (the only
//! code that mutates state: validation through the rules, group commit, publishing), `gc`
//! (background removal of deleted streams' data), [`records`] (the on-disk record types and key
//! layouts, each with a stable tag and a round-trip property test).
//!
//! Data flow of an append: the HTTP task sends a command to the writer thread (over an unbounded
//! channel: every queued command is a request already holding its body, so the server's
//! in-flight requests bound it) and awaits a oneshot reply. The writer drains every command that
//! is waiting, decides each with the shared rules against its authoritative in-memory state
//! (closure, content type, producer, `Stream-Seq`), puts all their
//! effects — data, producer records, metadata — into **one** fjall write batch, commits it,
//! fdatasyncs the journal **once**, then publishes the new tails to readers and replies. So:
//!
//! - an acknowledged append is on disk together with its producer state and closure (one batch is
//!   one atomic journal entry; fjall checksums journal entries and truncates a torn tail on
//!   recovery);
//! - many writers share one fsync (group commit), and streams never wait on each other for
//!   anything else;
//! - readers only ever see published tails, i.e. durable data;
//! - after a failed commit or fsync the writer refuses every later write (fail-stop) instead of
//!   pretending; fjall poisons itself the same way.
//!
//! A transaction ([`Engine::transact`]) is one writer command: checked whole first (its guards,
//! then a dry run of every append), then staged into the same group batch, so its appends and
//! its engine-metadata writes (keyspace `meta`) commit in one journal entry or not at all.
//!
//! Memory: per stream, one small metadata entry and a `watch` channel; per producer, its state
//! with a bounded receipt window; the engine metadata whole (a small map, held by the writer).
//! Data lives on disk and in fjall's bounded block cache.
//!
//! Keyspaces (layouts in [`records::keys`]): `streams`, `data`, `producers`, `idempotency`,
//! `marks`, `trims`, `gc`, `sys`, and `meta` (engine metadata). Opening a directory written
//! before a keyspace existed creates it empty, which is what such a directory holds.

mod gc;
pub mod records;
mod writer;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use fjall::{Database, Keyspace, KeyspaceCreateOptions, KvSeparationOptions};
use oncelog_protocol::Offset;
use oncelog_storage::rules::{self, fork_chain, Segment};
use oncelog_storage::*;
use tokio::sync::{oneshot, watch};

use records::{keys, stream_meta, sys, DecodeError, ProducerRecord};
use writer::{Command, MetaEntries, WStream, Writer};

/// What "acknowledged" means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Acknowledged after `fdatasync` of the journal (the default): survives power loss.
    Fsync,
    /// Acknowledged after the journal is handed to the OS: survives a process crash, not a power
    /// loss or kernel crash. An explicit, weaker choice for throughput.
    Buffered,
}

#[derive(Clone)]
pub struct EmbeddedOptions {
    pub data_dir: PathBuf,
    pub durability: Durability,
    /// fjall block-cache size: the bound on RAM spent caching data.
    pub cache_bytes: u64,
    /// Fault injection for tests; production leaves it at the default (inactive).
    pub failpoints: Failpoints,
    /// Where recovery takes "now" from (the start of every recovered stream's TTL window).
    pub clock: Arc<dyn Clock>,
    /// How long idle producer state counts (`--producer-state-ttl`). This engine treats expired
    /// state as absent but keeps its record until the stream is deleted.
    pub retention: rules::Retention,
}

impl EmbeddedOptions {
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        Self {
            data_dir: data_dir.into(),
            durability: Durability::Fsync,
            cache_bytes: 64 << 20,
            failpoints: Failpoints::default(),
            clock: Arc::new(SystemClock::default()),
            retention: rules::Retention::default(),
        }
    }
}

/// Switches that make the writer fail on purpose, so fail-stop behaviour can be tested without a
/// broken disk. Cheap to clone; all clones share the switches.
#[derive(Debug, Clone, Default)]
pub struct Failpoints {
    sync_error: Arc<std::sync::atomic::AtomicBool>,
}

impl Failpoints {
    /// While set, every group commit fails as if `fdatasync` had returned EIO.
    pub fn fail_sync(&self, on: bool) {
        self.sync_error.store(on, Ordering::SeqCst);
    }

    pub(crate) fn sync_should_fail(&self) -> bool {
        self.sync_error.load(Ordering::SeqCst)
    }
}

/// What recovery found, for the startup log.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    pub streams: usize,
    pub producers: usize,
    pub closed_streams: usize,
    /// Sum of all tails: bytes of stream data.
    pub bytes: u64,
    /// Deleted streams whose data was still being removed, and trimmed streams whose removed
    /// range is rechecked.
    pub pending_gc: usize,
}

/// The published, reader-visible state of a stream: only durable effects reach it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Published {
    tail: Offset,
    closed: bool,
    /// Fully removed: waiters end with 404.
    deleted: bool,
    /// Deleted by its owner while forks still read it: 410 on its path.
    soft_deleted: bool,
    /// Where reads may start (raised by a trim once it is durable).
    earliest: Offset,
}

/// Per-stream entry shared by readers.
pub(crate) struct Shared {
    id: u64,
    config: StreamConfig,
    /// For a fork, the ancestors' byte ranges it reads (empty for a plain stream). Immutable:
    /// inherited bytes never change.
    chain: Vec<Segment>,
    /// Streams forked from this one that still exist: a stream with forks is soft-deleted, not
    /// removed, when it is deleted or expires. Maintained by the writer.
    forks: std::sync::atomic::AtomicUsize,
    /// Publishes tail and closure after each durable commit; live readers subscribe to it.
    state: watch::Sender<Published>,
    /// Last read or write (Unix ms), for the sliding TTL. Memory only: reading must never write
    /// to disk, and after a restart the window restarts (expiry may come up to one TTL late).
    pub(crate) last_access_ms: AtomicI64,
}

impl Shared {
    fn info(&self) -> StreamInfo {
        let p = *self.state.borrow();
        StreamInfo { id: self.id, config: self.config.clone(), tail: p.tail, closed: p.closed, earliest: p.earliest }
    }

    fn touch(&self, now_ms: i64) {
        self.last_access_ms.fetch_max(now_ms, Ordering::Relaxed);
    }

    pub(crate) fn expired(&self, now_ms: i64) -> bool {
        rules::expired(self.config.expiry, self.last_access_ms.load(Ordering::Relaxed), now_ms)
    }

    /// Whether readers may see the stream ([`rules::visible`]), as of `now_ms`.
    fn visible(&self, now_ms: i64) -> Result<(), LookupError> {
        let soft_deleted = self.state.borrow().soft_deleted;
        rules::visible(soft_deleted, self.expired(now_ms), self.forks.load(Ordering::Relaxed))
    }
}

/// Shared between the writer thread and the engine handle, for readiness and metrics.
#[derive(Default)]
pub(crate) struct Counters {
    pub streams: AtomicU64,
    pub producers: AtomicU64,
    /// Why writes stopped (a fail-stop), once they have.
    pub failure: Mutex<Option<String>>,
}

pub(crate) struct Keyspaces {
    db: Database,
    streams: Keyspace,
    data: Keyspace,
    producers: Keyspace,
    idempotency: Keyspace,
    marks: Keyspace,
    /// Streams whose data below an earliest offset the collector removes (see `gc`).
    trims: Keyspace,
    gc: Keyspace,
    sys: Keyspace,
    /// Engine metadata ([`Engine::transact`]), mirrored whole by the writer.
    meta: Keyspace,
}

/// The embedded engine. Cheap to clone.
#[derive(Clone)]
pub struct EmbeddedEngine {
    inner: Arc<Inner>,
}

struct Inner {
    ks: Arc<Keyspaces>,
    streams: Arc<RwLock<HashMap<String, Arc<Shared>>>>,
    /// `None` once shutdown began.
    tx: Mutex<Option<mpsc::Sender<Command>>>,
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
    gc: gc::GcHandle,
    report: RecoveryReport,
    counters: Arc<Counters>,
}

fn backend(e: impl std::error::Error + Send + Sync + 'static) -> StorageError {
    StorageError::Backend(Arc::new(e))
}

impl EmbeddedEngine {
    /// Opens (or creates) the store in `opts.data_dir`, recovers every stream, and starts the
    /// writer and garbage-collector threads.
    pub fn open(opts: EmbeddedOptions) -> Result<Self, StorageError> {
        std::fs::create_dir_all(&opts.data_dir).map_err(backend)?;
        let db = Database::builder(&opts.data_dir)
            .cache_size(opts.cache_bytes)
            .manual_journal_persist(true)
            .open()
            .map_err(backend)?;
        let plain = KeyspaceCreateOptions::default;
        let ks = Arc::new(Keyspaces {
            streams: db.keyspace("streams", plain).map_err(backend)?,
            data: db
                .keyspace("data", || {
                    KeyspaceCreateOptions::default()
                        .with_kv_separation(Some(KvSeparationOptions::default()))
                })
                .map_err(backend)?,
            producers: db.keyspace("producers", plain).map_err(backend)?,
            idempotency: db.keyspace("idempotency", plain).map_err(backend)?,
            marks: db.keyspace("marks", plain).map_err(backend)?,
            trims: db.keyspace("trims", plain).map_err(backend)?,
            gc: db.keyspace("gc", plain).map_err(backend)?,
            sys: db.keyspace("sys", plain).map_err(backend)?,
            meta: db.keyspace("meta", plain).map_err(backend)?,
            db,
        });

        let (wstreams, next_id, report, pending_gc) = recover(&ks, opts.clock.now_ms())?;
        let meta = recover_meta(&ks.meta)?;
        let shared: HashMap<String, Arc<Shared>> =
            wstreams.iter().map(|(p, w)| (p.clone(), w.shared.clone())).collect();
        let streams = Arc::new(RwLock::new(shared));
        let gc = gc::GcHandle::start(ks.clone(), !pending_gc.is_empty() || report.pending_gc > 0);
        // Unbounded: every queued command is an HTTP request already holding its body, so the
        // queue is bounded by the server's in-flight requests; sending never blocks a runtime thread.
        let (tx, rx) = mpsc::channel();
        let counters = Arc::new(Counters::default());
        let writer = Writer::new(
            ks.clone(),
            streams.clone(),
            wstreams,
            next_id,
            opts.durability,
            gc.clone(),
            opts.failpoints.clone(),
            counters.clone(),
            opts.retention,
            meta,
        );
        let handle = std::thread::Builder::new()
            .name("oncelog-writer".into())
            .spawn(move || writer.run(rx))
            .map_err(backend)?;
        Ok(Self {
            inner: Arc::new(Inner {
                ks,
                streams,
                tx: Mutex::new(Some(tx)),
                writer: Mutex::new(Some(handle)),
                gc,
                report,
                counters,
            }),
        })
    }

    pub fn recovery_report(&self) -> RecoveryReport {
        self.inner.report
    }

    /// Flushes every keyspace's memtable to disk tables, so on-disk size can be measured
    /// without the journal (tests and benchmarks).
    ///
    /// Waits at most `FLUSH_WAIT` for the background flushes: a flush that cannot finish (a full
    /// disk: fjall's worker keeps retrying) is an error here, never a wait without end.
    pub fn flush_to_tables(&self) -> Result<(), StorageError> {
        const FLUSH_WAIT: std::time::Duration = std::time::Duration::from_secs(60);
        let ks = &self.inner.ks;
        let all = [&ks.streams, &ks.data, &ks.producers, &ks.idempotency, &ks.marks, &ks.trims, &ks.gc, &ks.sys, &ks.meta];
        for k in all {
            k.rotate_memtable().map_err(backend)?;
        }
        let deadline = std::time::Instant::now() + FLUSH_WAIT;
        while all.iter().any(|k| k.sealed_memtable_count() > 0) {
            if std::time::Instant::now() >= deadline {
                return Err(backend(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("memtables not flushed within {FLUSH_WAIT:?} (is the disk full?)"),
                )));
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        Ok(())
    }

    async fn call<T>(&self, make: impl FnOnce(oneshot::Sender<T>) -> Command) -> Result<T, StorageError> {
        let tx = self
            .inner
            .tx
            .lock()
            .map_err(|_| StorageError::Poisoned)?
            .clone()
            .ok_or(StorageError::ShuttingDown)?;
        let (reply, rx) = oneshot::channel();
        tx.send(make(reply)).map_err(|_| StorageError::ShuttingDown)?;
        rx.await.map_err(|_| StorageError::ShuttingDown)
    }

    fn lookup(&self, path: &str, now_ms: i64) -> Result<Arc<Shared>, LookupError> {
        let map = self.inner.streams.read().map_err(|_| StorageError::Poisoned)?;
        let s = map.get(path).ok_or(LookupError::NotFound)?;
        s.visible(now_ms)?;
        Ok(s.clone())
    }
}

impl Engine for EmbeddedEngine {
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

    async fn delete_if(&self, path: &str, if_tail: Option<Vec<Offset>>, now_ms: i64) -> Result<(), LookupError> {
        let path = path.to_owned();
        self.call(|reply| Command::Delete { path, if_tail, now_ms, reply }).await?
    }

    /// Answered from memory: the published state is the durable one.
    async fn head(&self, path: &str, now_ms: i64) -> Result<StreamInfo, LookupError> {
        Ok(self.lookup(path, now_ms)?.info())
    }

    async fn read(&self, path: &str, from: Offset, max_bytes: usize, now_ms: i64) -> Result<ReadChunk, LookupError> {
        let shared = self.lookup(path, now_ms)?;
        shared.touch(now_ms);
        let info = shared.info();
        if let Some(at_tail) = rules::read_start(&info, from)? {
            return Ok(at_tail);
        }
        let id = info.id;
        let tail = info.tail;
        let ks = self.inner.ks.clone();
        let reader = shared.clone();
        let (data, next, aligned) = tokio::task::spawn_blocking(move || scan(&ks.data, &reader.chain, id, from, tail, max_bytes))
            .await
            .map_err(backend)??;
        // A trim that committed during the scan may have let the collector remove what the scan
        // looked for (it then finds a later append): the earliest offset as of now decides.
        rules::readable_from(shared.state.borrow().earliest, from)?;
        // `info` is the snapshot the scan was bounded by, so up-to-date and EOF are judged
        // against the same tail as the data.
        Ok(ReadChunk { info, data, next, aligned })
    }

    async fn wait(&self, path: &str, after: Offset, timeout: Duration, now_ms: i64) -> Result<WaitOutcome, LookupError> {
        let shared = self.lookup(path, now_ms)?;
        shared.touch(now_ms);
        let mut rx = shared.state.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let p = *rx.borrow_and_update();
            if p.deleted {
                return Err(LookupError::NotFound);
            }
            if p.soft_deleted {
                return Err(LookupError::Gone);
            }
            if p.tail > after || p.closed {
                return Ok(WaitOutcome::Changed(shared.info()));
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Err(_) => return Ok(WaitOutcome::TimedOut(shared.info())),
                Ok(Err(_)) => return Err(LookupError::NotFound),
                Ok(Ok(())) => {}
            }
        }
    }

    async fn expire(&self, now_ms: i64) -> Result<usize, StorageError> {
        let expired: Vec<String> = {
            let map = self.inner.streams.read().map_err(|_| StorageError::Poisoned)?;
            map.iter()
                .filter(|(_, s)| !s.state.borrow().soft_deleted && s.expired(now_ms))
                .map(|(p, _)| p.clone())
                .collect()
        };
        if expired.is_empty() {
            return Ok(0);
        }
        self.call(|reply| Command::Expire { paths: expired, now_ms, reply }).await?
    }

    async fn retain(&self, now_ms: i64) -> Result<usize, StorageError> {
        let any = {
            let map = self.inner.streams.read().map_err(|_| StorageError::Poisoned)?;
            map.values().any(|s| !s.config.retention.is_none())
        };
        if !any {
            return Ok(0);
        }
        self.call(|reply| Command::Retain { now_ms, reply }).await?
    }

    async fn transact(&self, txn: TxnRequest) -> Result<TxnOutcome, TxnError> {
        self.call(|reply| Command::Transact { txn, reply }).await?
    }

    /// Through the writer, which holds the metadata: answered once every transaction staged
    /// before it is durable.
    async fn meta_scan(&self, prefix: &[u8]) -> Result<MetaEntries, StorageError> {
        let prefix = prefix.to_vec();
        self.call(|reply| Command::MetaScan { prefix, reply }).await?
    }

    /// From the published state, as `head` answers.
    async fn list_streams(&self, prefix: &str, now_ms: i64) -> Result<Vec<Listed>, StorageError> {
        let map = self.inner.streams.read().map_err(|_| StorageError::Poisoned)?;
        let mut listed: Vec<Listed> = map
            .iter()
            .filter(|(p, s)| p.starts_with(prefix) && s.visible(now_ms).is_ok())
            .map(|(p, s)| Listed { path: p.clone(), info: s.info() })
            .collect();
        listed.sort_unstable_by(|a, b| a.path.cmp(&b.path));
        Ok(listed)
    }

    async fn shutdown(&self) -> Result<(), StorageError> {
        // Dropping the last sender lets the writer drain what is queued, sync, and exit.
        self.inner.tx.lock().map_err(|_| StorageError::Poisoned)?.take();
        let handle = self.inner.writer.lock().map_err(|_| StorageError::Poisoned)?.take();
        if let Some(h) = handle {
            tokio::task::spawn_blocking(move || h.join()).await.map_err(backend)?.map_err(|_| StorageError::Poisoned)?;
        }
        let gc = self.inner.gc.clone();
        tokio::task::spawn_blocking(move || gc.stop()).await.map_err(backend)?;
        self.inner.ks.db.persist(fjall::PersistMode::SyncAll).map_err(backend)
    }

    async fn compaction_candidates(&self, min_bytes: u64) -> Result<Vec<(String, Offset)>, StorageError> {
        let map = self.inner.streams.read().map_err(|_| StorageError::Poisoned)?;
        Ok(map
            .iter()
            .filter(|(_, s)| s.config.compaction)
            .map(|(p, s)| (p, s.info()))
            .filter(|(_, i)| oncelog_storage::compaction::is_candidate(i, min_bytes))
            .map(|(p, i)| (p.to_string(), i.tail))
            .collect())
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
        }
    }
}

/// Accumulates read pieces, copying only when there is more than one.
#[derive(Default)]
struct Pieces {
    first: Option<Bytes>,
    rest: Option<BytesMut>,
}

impl Pieces {
    fn push(&mut self, piece: Bytes, capacity: usize) {
        match (&mut self.rest, &self.first) {
            (None, None) => self.first = Some(piece),
            (None, Some(f)) => {
                let mut buf = BytesMut::with_capacity(capacity.max(f.len() + piece.len()));
                buf.extend_from_slice(f);
                buf.extend_from_slice(&piece);
                self.rest = Some(buf);
            }
            (Some(buf), _) => buf.extend_from_slice(&piece),
        }
    }

    fn len(&self) -> usize {
        self.rest.as_ref().map_or_else(|| self.first.as_ref().map_or(0, Bytes::len), BytesMut::len)
    }

    fn into_bytes(self) -> Bytes {
        match self.rest {
            Some(buf) => buf.freeze(),
            None => self.first.unwrap_or_default(),
        }
    }
}

/// Reads stored bytes from `from`, through a fork's inherited `chain` and then stream `id`'s
/// own data, stopping at `tail` (the published, durable tail) and after about `max_bytes`.
/// Whole appends are returned, except where a segment boundary (a fork point) cuts one. Also
/// says whether `from` was the start of an append or a segment boundary.
fn scan(
    data: &Keyspace,
    chain: &[Segment],
    id: u64,
    from: Offset,
    tail: Offset,
    max_bytes: usize,
) -> Result<(Bytes, Offset, bool), LookupError> {
    let own = Segment { id, end: tail.0 };
    let mut pieces = Pieces::default();
    let mut pos = from.0;
    // A segment boundary (a fork point, where a fork's own data starts) is minted too.
    let mut aligned = from.0 == 0 || chain.iter().any(|s| s.end == from.0);
    for seg in chain.iter().chain(std::iter::once(&own)) {
        let seg_end = seg.end.min(tail.0);
        if pos >= seg_end {
            continue;
        }
        for item in data.range(keys::data(seg.id, pos + 1)..=keys::data(seg.id, u64::MAX)) {
            let (k, v) = item.into_inner().map_err(backend)?;
            let (_, end) = keys::parse_data(&k).ok_or(DecodeError::Truncated)?;
            let start = end.saturating_sub(v.len() as u64);
            if start >= seg_end {
                break;
            }
            let lo = usize::try_from(pos.saturating_sub(start)).unwrap_or(usize::MAX).min(v.len());
            if pos == from.0 && lo == 0 {
                aligned = true;
            }
            let hi = usize::try_from(end.min(seg_end) - start).unwrap_or(usize::MAX).min(v.len());
            pieces.push(Bytes::from(v).slice(lo..hi), max_bytes);
            pos = start + hi as u64;
            if pieces.len() >= max_bytes || pos >= seg_end {
                break;
            }
        }
        if pieces.len() >= max_bytes {
            break;
        }
    }
    Ok((pieces.into_bytes(), Offset(pos), aligned))
}

/// The append of stream `id` (reading through `chain`) that starts exactly at `at`, if any: its
/// stored bytes, cut at the segment boundary it lies in. Used to resolve fork sub-offsets.
pub(crate) fn append_at(data: &Keyspace, chain: &[Segment], id: u64, at: u64, tail: u64) -> Result<Option<Bytes>, StorageError> {
    let own = Segment { id, end: tail };
    let mut start_of_seg = 0;
    for seg in chain.iter().chain(std::iter::once(&own)) {
        let seg_end = seg.end.min(tail);
        if at >= start_of_seg && at < seg_end {
            let Some(item) = data.range(keys::data(seg.id, at + 1)..=keys::data(seg.id, u64::MAX)).next() else {
                return Ok(None);
            };
            let (k, v) = item.into_inner().map_err(backend)?;
            let (_, end) = keys::parse_data(&k).ok_or(DecodeError::Truncated)?;
            let start = end.saturating_sub(v.len() as u64);
            if start != at {
                return Ok(None);
            }
            let hi = usize::try_from(end.min(seg_end) - start).unwrap_or(usize::MAX).min(v.len());
            return Ok(Some(Bytes::from(v).slice(..hi)));
        }
        start_of_seg = seg_end;
    }
    Ok(None)
}

/// Rebuilds the writer's state from disk.
#[allow(clippy::type_complexity)]
fn recover(ks: &Keyspaces, now_ms: i64) -> Result<(HashMap<String, WStream>, u64, RecoveryReport, Vec<u64>), StorageError> {
    let mut report = RecoveryReport::default();
    let next_id = match ks.sys.get(keys::NEXT_STREAM_ID).map_err(backend)? {
        Some(v) => sys::decode(&v)?,
        None => 1,
    };
    let mut by_id: HashMap<u64, String> = HashMap::new();
    let mut found: Vec<(String, StreamMeta, u64)> = Vec::new();
    for item in ks.streams.iter() {
        let (k, v) = item.into_inner().map_err(backend)?;
        let path = String::from_utf8(k.to_vec()).map_err(|_| DecodeError::InvalidUtf8)?;
        let meta = stream_meta::decode(&v)?;
        let own_tail = match ks.data.prefix(keys::stream_prefix(meta.id)).next_back() {
            Some(g) => {
                let k = g.key().map_err(backend)?;
                keys::parse_data(&k).map(|(_, end)| end).ok_or(DecodeError::Truncated)?
            }
            None => 0,
        };
        // A fork with no data of its own yet ends where it diverged.
        let tail = own_tail.max(meta.fork.map_or(0, |f| f.fork_point));
        by_id.insert(meta.id, path.clone());
        found.push((path, meta, tail));
    }
    // Fork chains are derived from each fork's direct source, ancestors first.
    let forks_of: HashMap<u64, ForkOf> =
        found.iter().filter_map(|(_, m, _)| m.fork.map(|f| (m.id, f))).collect();
    let mut chains: HashMap<u64, Vec<Segment>> = HashMap::new();
    fn chain_of(
        id: u64,
        forks_of: &HashMap<u64, ForkOf>,
        chains: &mut HashMap<u64, Vec<Segment>>,
    ) -> Vec<Segment> {
        if let Some(c) = chains.get(&id) {
            return c.clone();
        }
        let c = match forks_of.get(&id) {
            None => Vec::new(),
            Some(f) => {
                let parent = chain_of(f.source_id, forks_of, chains);
                fork_chain(&parent, f.source_id, f.fork_point)
            }
        };
        chains.insert(id, c.clone());
        c
    }
    let mut streams = HashMap::new();
    let mut fork_counts: HashMap<u64, usize> = HashMap::new();
    for (_, m, _) in &found {
        if let Some(f) = m.fork {
            *fork_counts.entry(f.source_id).or_default() += 1;
        }
    }
    for (path, meta, tail) in found {
        report.streams += 1;
        report.bytes += tail;
        report.closed_streams += usize::from(meta.closed);
        let chain = chain_of(meta.id, &forks_of, &mut chains);
        let forks = fork_counts.get(&meta.id).copied().unwrap_or(0);
        let w = WStream::recovered(meta, Offset(tail), chain, forks, now_ms);
        streams.insert(path, w);
    }
    for item in ks.producers.iter() {
        let (k, v) = item.into_inner().map_err(backend)?;
        let (id, producer) = keys::parse_producer(&k).ok_or(DecodeError::Truncated)?;
        let rec = ProducerRecord::decode(&v, now_ms)?;
        if let Some(w) = by_id.get(&id).and_then(|p| streams.get_mut(p)) {
            w.producers.insert(producer, rec.0);
            report.producers += 1;
        }
    }
    for item in ks.idempotency.iter() {
        let (k, v) = item.into_inner().map_err(backend)?;
        let (id, key) = keys::parse_idempotency(&k).ok_or(DecodeError::Truncated)?;
        let entry = oncelog_storage::codec::key_entry::decode(&v)?;
        if let Some(w) = by_id.get(&id).and_then(|p| streams.get_mut(p)) {
            w.keys.get_or_insert_with(Default::default).insert(key, entry);
        }
    }
    for item in ks.marks.iter() {
        let (k, v) = item.into_inner().map_err(backend)?;
        let (id, no) = keys::parse_data(&k).ok_or(DecodeError::Truncated)?;
        let mark = keys::parse_mark_value(&v).ok_or(DecodeError::Truncated)?;
        if let Some(w) = by_id.get(&id).and_then(|p| streams.get_mut(p)) {
            // Keys sort by number: the first one read is the stream's first mark.
            if w.marks.is_empty() {
                w.mark_base = no;
            }
            w.marks.push(mark);
        }
    }
    let mut pending = Vec::new();
    for item in ks.gc.iter() {
        let k = item.key().map_err(backend)?;
        if let Ok(b) = <[u8; 8]>::try_from(k.as_ref()) {
            pending.push(u64::from_be_bytes(b));
        }
    }
    report.pending_gc = pending.len() + ks.trims.iter().count();
    Ok((streams, next_id, report, pending))
}

/// Loads the engine metadata, which the writer keeps whole.
fn recover_meta(meta: &Keyspace) -> Result<BTreeMap<Vec<u8>, Bytes>, StorageError> {
    let mut map = BTreeMap::new();
    for item in meta.iter() {
        let (k, v) = item.into_inner().map_err(backend)?;
        let key = keys::parse_meta(&k).ok_or(DecodeError::Truncated)?;
        // Copied: a value read from disk shares its table block, which the map would then keep
        // in memory for as long as the engine runs.
        map.insert(key.to_vec(), Bytes::copy_from_slice(&v));
    }
    Ok(map)
}

#[cfg(test)]
mod fork_tests;
#[cfg(test)]
mod test_support;
#[cfg(test)]
mod tests;
