//! The group-commit writer thread: the only code that mutates stream state.
//!
//! One loop iteration = one group: block for the first command, drain whatever else is queued
//! (bounded by [`MAX_GROUP_COMMANDS`] and [`MAX_GROUP_BYTES`]), validate and stage each command in
//! order against the authoritative state (so later commands of a group see earlier ones), commit
//! the staged effects as one fjall batch, sync once, publish, reply. Writes stop for good after a
//! failed commit or sync.
//!
//! A transaction ([`Engine::transact`]) is one command: it is decided whole (a dry run of every
//! append against the same rules) before anything of it is staged, because a staged fjall batch
//! entry cannot be taken back; then its appends and metadata writes join the group's batch like
//! any other command's. The writer keeps all engine metadata in memory, so guards and scans are
//! answered without reading disk.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use fjall::PersistMode;
use oncelog_protocol::producer::ProducerState;
use oncelog_protocol::Offset;
use oncelog_storage::parking::ParkingLot;
use oncelog_storage::rules::{self, AppendPlan, CreatePlan, Removal, Segment, PARK_TIMEOUT};
use oncelog_storage::*;
use tokio::sync::{oneshot, watch};

use super::gc::GcHandle;
use super::{append_at, backend, Counters, Durability, Failpoints, Keyspaces, Published, Shared};
use crate::records::{keys, stream_meta, sys, ProducerRecord};

/// Most commands in one group commit: bounds the latency a group adds to its first member.
const MAX_GROUP_COMMANDS: usize = 4096;
/// Most data bytes in one group commit, for the same reason.
const MAX_GROUP_BYTES: usize = 32 << 20;
/// fjall's limits on one key and one value; requests beyond them are refused, never passed on
/// (fjall asserts on them, which would take the writer thread down).
const MAX_KEY_BYTES: usize = u16::MAX as usize;
const MAX_VALUE_BYTES: u64 = u32::MAX as u64;
/// [`MAX_VALUE_BYTES`] as a length: the largest metadata value a transaction may write.
const MAX_VALUE_LEN: usize = MAX_VALUE_BYTES as usize;

/// A group commit slower than this is logged at debug level, to find latency outliers.
const SLOW_GROUP: Duration = Duration::from_millis(20);

pub(crate) enum Command {
    Create { req: CreateRequest, reply: oneshot::Sender<Result<CreateOutcome, CreateError>> },
    Append { req: AppendRequest, reply: oneshot::Sender<Result<AppendOutcome, AppendError>> },
    Delete { path: String, if_tail: Option<Vec<Offset>>, now_ms: i64, reply: oneshot::Sender<Result<(), LookupError>> },
    Trim { path: String, to: Offset, now_ms: i64, reply: oneshot::Sender<Result<TrimOutcome, TrimError>> },
    Expire { paths: Vec<String>, now_ms: i64, reply: oneshot::Sender<Result<usize, StorageError>> },
    /// A State Protocol snapshot at the tail and the earliest offset moved there, in one batch.
    Compact { req: CompactRequest, reply: oneshot::Sender<Result<TrimOutcome, CompactError>> },
    /// The retention sweep (see [`Engine::retain`]).
    Retain { now_ms: i64, reply: oneshot::Sender<Result<usize, StorageError>> },
    /// Metadata writes and appends to several streams, all or nothing (see [`Engine::transact`]).
    Transact { txn: TxnRequest, reply: oneshot::Sender<Result<TxnOutcome, TxnError>> },
    /// The metadata under a prefix: answered from the writer's map once its group is durable,
    /// so it reflects every acknowledged transaction and nothing that might still fail.
    MetaScan { prefix: Vec<u8>, reply: oneshot::Sender<Result<MetaEntries, StorageError>> },
}

/// Engine-metadata entries in key order, as [`Engine::meta_scan`] answers them.
pub(crate) type MetaEntries = Vec<(Vec<u8>, Bytes)>;

/// The writer's authoritative view of one stream.
pub(crate) struct WStream {
    pub meta: StreamMeta,
    pub tail: Offset,
    pub producers: HashMap<String, ProducerState>,
    /// Idempotency keys (none for most streams). Expired ones are ignored by the rules and
    /// stay stored until the stream is deleted.
    pub keys: IdempotencyKeys,
    /// When its data was written, for its maximum age (empty without one); mark `i` is stored
    /// under number `mark_base + i`.
    pub marks: TimeMarks,
    pub mark_base: u64,
    /// The reader-visible entry this stream publishes to.
    pub shared: Arc<Shared>,
}

impl WStream {
    pub fn recovered(meta: StreamMeta, tail: Offset, chain: Vec<Segment>, forks: usize, now_ms: i64) -> Self {
        let shared = new_shared(&meta, tail, chain, forks, now_ms);
        WStream { meta, tail, producers: HashMap::new(), keys: None, marks: TimeMarks::new(), mark_base: 0, shared }
    }

    fn forks(&self) -> usize {
        self.shared.forks.load(Ordering::Relaxed)
    }
}

fn new_shared(meta: &StreamMeta, tail: Offset, chain: Vec<Segment>, forks: usize, now_ms: i64) -> Arc<Shared> {
    let published = Published { tail, closed: meta.closed, deleted: false, soft_deleted: meta.soft_deleted, earliest: meta.earliest };
    let (state, _) = watch::channel(published);
    Arc::new(Shared {
        id: meta.id,
        config: meta.config(),
        chain,
        forks: AtomicUsize::new(forks),
        state,
        last_access_ms: AtomicI64::new(now_ms),
    })
}

/// A reply to send, and reader-visible changes to make, once the group is durable.
enum Effect {
    Publish { shared: Arc<Shared>, tail: Offset, closed: bool },
    Insert { path: String, shared: Arc<Shared> },
    Remove { path: String, shared: Arc<Shared> },
    SoftDelete { shared: Arc<Shared> },
    Trim { shared: Arc<Shared>, earliest: Offset },
    Reply(Box<dyn FnOnce(Option<StorageError>) + Send>),
}

pub(crate) struct Writer {
    ks: Arc<Keyspaces>,
    published: Arc<RwLock<HashMap<String, Arc<Shared>>>>,
    streams: HashMap<String, WStream>,
    /// Path of every stream by id, to follow a fork to its source.
    paths_by_id: HashMap<u64, String>,
    next_id: u64,
    durability: Durability,
    gc: GcHandle,
    failpoints: Failpoints,
    /// Set after a failed commit or sync; from then on every write is refused.
    poisoned: bool,
    /// Shared with the engine handle: readiness and metrics read them.
    counters: Arc<Counters>,
    /// Appends that arrived ahead of sequence.
    parked: ParkingLot,
    retention: rules::Retention,
    /// All engine metadata (keyspace `meta`), including what this group staged: small by
    /// design (the seam's "small ordered key-value map"), and read by every guard and scan.
    meta: BTreeMap<Vec<u8>, Bytes>,
}

/// Wraps a reply so that a storage failure of the whole group overrides the staged result.
fn reply<T: Send + 'static, E: From<StorageError> + Send + 'static>(
    tx: oneshot::Sender<Result<T, E>>,
    result: Result<T, E>,
) -> Effect {
    Effect::Reply(Box::new(move |failure| {
        let _ = tx.send(match failure {
            Some(e) => Err(E::from(e)),
            None => result,
        });
    }))
}

impl Writer {
    // One constructor, called once, taking each shared handle the writer keeps.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        ks: Arc<Keyspaces>,
        published: Arc<RwLock<HashMap<String, Arc<Shared>>>>,
        streams: HashMap<String, WStream>,
        next_id: u64,
        durability: Durability,
        gc: GcHandle,
        failpoints: Failpoints,
        counters: Arc<Counters>,
        retention: rules::Retention,
        meta: BTreeMap<Vec<u8>, Bytes>,
    ) -> Self {
        let paths_by_id = streams.iter().map(|(p, w)| (w.meta.id, p.clone())).collect();
        let producers: usize = streams.values().map(|w| w.producers.len()).sum();
        counters.streams.store(streams.len() as u64, Ordering::Relaxed);
        counters.producers.store(producers as u64, Ordering::Relaxed);
        Writer {
            ks,
            published,
            streams,
            paths_by_id,
            next_id,
            durability,
            gc,
            failpoints,
            poisoned: false,
            counters,
            parked: ParkingLot::default(),
            retention,
            meta,
        }
    }

    pub fn run(mut self, rx: mpsc::Receiver<Command>) {
        self.collect_orphans();
        loop {
            let first = match self.next_park_deadline() {
                None => match rx.recv() {
                    Ok(cmd) => Some(cmd),
                    Err(_) => break,
                },
                Some(deadline) => match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                    Ok(cmd) => Some(cmd),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => break,
                },
            };
            let mut batch = self.ks.db.batch();
            let mut effects = Vec::new();
            self.expire_parked(Instant::now(), &mut batch, &mut effects);
            if let Some(first) = first {
                let mut bytes = self.stage(first, &mut batch, &mut effects);
                let mut count = 1usize;
                while count < MAX_GROUP_COMMANDS && bytes < MAX_GROUP_BYTES {
                    let Ok(cmd) = rx.try_recv() else { break };
                    bytes += self.stage(cmd, &mut batch, &mut effects);
                    count += 1;
                }
                metrics::histogram!("oncelog_group_commit_commands").record(count as f64);
            }
            let failure = self.commit(batch);
            self.finish(effects, failure);
        }
        // Channel closed: shutdown. Everything received was committed and synced above; parked
        // appends get their final answer.
        let mut batch = self.ks.db.batch();
        let mut effects = Vec::new();
        self.expire_parked(Instant::now() + PARK_TIMEOUT * 2, &mut batch, &mut effects);
        let failure = self.commit(batch);
        self.finish(effects, failure);
    }

    /// Removes soft-deleted streams that no fork references any more (left by a crash between
    /// a fork's removal and its source's, which a single batch normally prevents).
    fn collect_orphans(&mut self) {
        let orphans: Vec<String> =
            self.streams.iter().filter(|(_, w)| w.meta.soft_deleted && w.forks() == 0).map(|(p, _)| p.clone()).collect();
        if orphans.is_empty() {
            return;
        }
        let mut batch = self.ks.db.batch();
        let mut effects = Vec::new();
        for p in orphans {
            self.remove(&p, &mut batch, &mut effects);
        }
        self.count_streams();
        let failure = self.commit(batch);
        self.finish(effects, failure);
    }

    fn next_park_deadline(&self) -> Option<Instant> {
        self.parked.next_deadline()
    }

    /// Answers parked appends whose wait is over: re-validated now, never parked again.
    fn expire_parked(&mut self, now: Instant, batch: &mut fjall::OwnedWriteBatch, effects: &mut Vec<Effect>) {
        for p in self.parked.take_due(now) {
            let r = self.append(&p.req, batch, effects);
            effects.push(reply(p.reply, r));
        }
    }

    /// Stages an append; one that is ahead of its producer's sequence waits (is parked) instead
    /// of failing, and one that is accepted releases its parked successor. "Ahead" is a gap in
    /// the current epoch, or a non-zero sequence number of a new epoch whose seq 0 has not
    /// arrived yet (pipelining right after an epoch bump).
    fn stage_append(
        &mut self,
        req: AppendRequest,
        tx: oneshot::Sender<Result<AppendOutcome, AppendError>>,
        batch: &mut fjall::OwnedWriteBatch,
        effects: &mut Vec<Effect>,
    ) {
        let r = self.append(&req, batch, effects);
        // Only producer requests are ever parked or release parked ones.
        let Some(p) = &req.producer else {
            effects.push(reply(tx, r));
            return;
        };
        match &r {
            Err(e) if rules::parkable(&req, e) => {
                metrics::counter!("oncelog_parked_appends_total").increment(1);
                let answer = r.clone();
                if let Some(old) = self.parked.park(req, tx, Instant::now()) {
                    // A retry replaced it; the older copy gets the answer it would have had.
                    effects.push(reply(old.reply, answer));
                }
            }
            Ok(out) if out.status == AppendStatus::Appended => {
                effects.push(reply(tx, r.clone()));
                // Nothing is parked almost always; only then is there anything to release.
                if !self.parked.is_empty() {
                    let (path, id) = (req.path.clone(), p.id.clone());
                    self.release_parked(&path, &id, batch, effects);
                }
            }
            _ => effects.push(reply(tx, r)),
        }
    }

    /// Stages the parked successors of a producer's newly accepted sequence number, in order.
    fn release_parked(&mut self, path: &str, producer: &str, batch: &mut fjall::OwnedWriteBatch, effects: &mut Vec<Effect>) {
        loop {
            let next = self.streams.get(path).and_then(|w| w.producers.get(producer)).map(rules::next_expected);
            let Some(p) = next.and_then(|n| self.parked.take(path, producer, n)) else { return };
            let r = self.append(&p.req, batch, effects);
            let accepted = matches!(&r, Ok(o) if o.status == AppendStatus::Appended);
            effects.push(reply(p.reply, r));
            if !accepted {
                return;
            }
        }
    }

    fn commit(&mut self, batch: fjall::OwnedWriteBatch) -> Option<StorageError> {
        if self.poisoned {
            return Some(StorageError::Poisoned);
        }
        if batch.is_empty() {
            return None;
        }
        let mode = match self.durability {
            Durability::Fsync => PersistMode::SyncData,
            Durability::Buffered => PersistMode::Buffer,
        };
        let items = batch.len();
        let started = Instant::now();
        let committed = batch.commit();
        let commit_time = started.elapsed();
        let result = committed.and_then(|()| {
            if self.failpoints.sync_should_fail() {
                return Err(fjall::Error::Io(std::io::Error::other("injected fdatasync failure")));
            }
            self.ks.db.persist(mode)
        });
        let total = started.elapsed();
        metrics::histogram!("oncelog_fsync_seconds").record((total - commit_time).as_secs_f64());
        metrics::histogram!("oncelog_group_commit_seconds").record(total.as_secs_f64());
        if total > SLOW_GROUP {
            tracing::debug!(items, ?commit_time, sync_time = ?(total - commit_time), "slow group commit");
        }
        match result {
            Ok(()) => None,
            Err(e) => {
                tracing::error!(error = %e, "commit or sync failed; refusing all further writes");
                self.fail_stop(format!("writes stopped after a storage failure: {e}"));
                Some(backend(e))
            }
        }
    }

    /// Refuses every later write, and the group being staged (its batch is never committed).
    fn fail_stop(&mut self, reason: String) {
        self.poisoned = true;
        if let Ok(mut slot) = self.counters.failure.lock() {
            *slot = Some(reason);
        }
    }

    fn finish(&self, effects: Vec<Effect>, failure: Option<StorageError>) {
        for effect in effects {
            match effect {
                Effect::Reply(f) => f(failure.clone()),
                _ if failure.is_some() => {}
                Effect::Trim { shared, earliest } => {
                    shared.state.send_modify(|p| p.earliest = p.earliest.max(earliest));
                    // Only now, with the earliest offset published (readers re-check it after
                    // their scan), may the collector remove the data below it.
                    self.gc.wake();
                }
                Effect::Publish { shared, tail, closed } => {
                    shared.state.send_modify(|p| {
                        p.tail = tail;
                        p.closed = closed;
                    });
                }
                Effect::Insert { path, shared } => {
                    if let Ok(mut map) = self.published.write() {
                        map.insert(path, shared);
                    }
                }
                Effect::SoftDelete { shared } => shared.state.send_modify(|p| p.soft_deleted = true),
                Effect::Remove { path, shared } => {
                    if let Ok(mut map) = self.published.write() {
                        if map.get(&path).is_some_and(|s| Arc::ptr_eq(s, &shared)) {
                            map.remove(&path);
                        }
                    }
                    shared.state.send_modify(|p| p.deleted = true);
                    self.gc.wake();
                }
            }
        }
    }

    /// Validates one command against current state and stages its effects; returns data bytes staged.
    fn stage(&mut self, cmd: Command, batch: &mut fjall::OwnedWriteBatch, effects: &mut Vec<Effect>) -> usize {
        if self.poisoned {
            // Refuse before touching state; `finish` answers with the failure.
            match cmd {
                Command::Create { reply: tx, .. } => effects.push(reply(tx, Err(CreateError::Storage(StorageError::Poisoned)))),
                Command::Append { reply: tx, .. } => effects.push(reply(tx, Err(AppendError::Storage(StorageError::Poisoned)))),
                Command::Delete { reply: tx, .. } => effects.push(reply(tx, Err(LookupError::Storage(StorageError::Poisoned)))),
                Command::Expire { reply: tx, .. } => effects.push(reply(tx, Err(StorageError::Poisoned))),
                Command::Trim { reply: tx, .. } => effects.push(reply(tx, Err(TrimError::Storage(StorageError::Poisoned)))),
                Command::Retain { reply: tx, .. } => effects.push(reply(tx, Err(StorageError::Poisoned))),
                Command::Compact { reply: tx, .. } => effects.push(reply(tx, Err(CompactError::Storage(StorageError::Poisoned)))),
                Command::Transact { reply: tx, .. } => effects.push(reply(tx, Err(TxnError::Storage(StorageError::Poisoned)))),
                // The map may hold what the failed group staged, which was never acknowledged.
                Command::MetaScan { reply: tx, .. } => effects.push(reply(tx, Err(StorageError::Poisoned))),
            }
            return 0;
        }
        match cmd {
            Command::Create { req, reply: tx } => {
                let n = req.initial.len();
                let r = self.create(req, batch, effects);
                effects.push(reply(tx, r));
                n
            }
            Command::Append { req, reply: tx } => {
                let n = req.data.len();
                self.stage_append(req, tx, batch, effects);
                n
            }
            Command::Delete { path, if_tail, now_ms, reply: tx } => {
                self.drop_if_expired(&path, now_ms, batch, effects);
                let r = self.delete(&path, if_tail.as_deref(), batch, effects);
                self.count_streams();
                effects.push(reply(tx, r));
                0
            }
            Command::Trim { path, to, now_ms, reply: tx } => {
                self.drop_if_expired(&path, now_ms, batch, effects);
                let r = self.trim(&path, to, batch, effects);
                effects.push(reply(tx, r));
                0
            }
            Command::Expire { paths, now_ms, reply: tx } => {
                let before = self.streams.len();
                for p in &paths {
                    self.drop_if_expired(p, now_ms, batch, effects);
                }
                self.count_streams();
                effects.push(reply(tx, Ok(before - self.streams.len())));
                0
            }
            Command::Retain { now_ms, reply: tx } => {
                let n = self.retain(now_ms, batch, effects);
                effects.push(reply(tx, n));
                0
            }
            Command::Compact { req, reply: tx } => {
                let n = req.pieces.iter().map(bytes::Bytes::len).sum();
                self.drop_if_expired(&req.path, req.now_ms, batch, effects);
                let r = self.compact(req, batch, effects);
                effects.push(reply(tx, r));
                n
            }
            Command::Transact { txn, reply: tx } => {
                let n = txn.appends.iter().map(|a| a.data.len()).sum::<usize>()
                    + txn.meta.iter().filter_map(|w| w.value.as_ref()).map(Bytes::len).sum::<usize>();
                let r = self.transact(txn, batch, effects);
                effects.push(reply(tx, r));
                n
            }
            Command::MetaScan { prefix, reply: tx } => {
                effects.push(reply(tx, Ok(self.meta_scan(&prefix))));
                0
            }
        }
    }

    /// Stages a transaction, all or nothing. Every check runs before anything is staged: its
    /// guards, then a dry run of each append. The appends target distinct streams (`txn_shape`)
    /// and an append's decision depends only on its own stream, so the real appends that follow
    /// reach the dry run's decisions.
    fn transact(&mut self, txn: TxnRequest, batch: &mut fjall::OwnedWriteBatch, effects: &mut Vec<Effect>) -> Result<TxnOutcome, TxnError> {
        rules::txn_shape(&txn, MAX_VALUE_LEN)?;
        for req in &txn.appends {
            // With the request's own clock, as `append` does, so that `append` finds nothing
            // left to expire and decides against the state the dry run saw.
            self.drop_if_expired(&req.path, req.now_ms, batch, effects);
        }
        let meta = &self.meta;
        rules::txn_expect(&txn, |k| meta.get(k))?;
        for (index, req) in txn.appends.iter().enumerate() {
            self.check_append(req).map_err(|error| TxnError::Append { index, error })?;
        }
        let mut appends = Vec::with_capacity(txn.appends.len());
        for (index, req) in txn.appends.iter().enumerate() {
            match self.append(req, batch, effects) {
                Ok(out) => appends.push(out),
                Err(error) => return Err(self.half_transaction(index, &error)),
            }
        }
        self.write_meta(txn.meta, batch);
        // Parked successors go only now, so nothing else is staged between a transaction's parts.
        for (req, out) in txn.appends.iter().zip(&appends) {
            let Some(p) = &req.producer else { continue };
            if out.status == AppendStatus::Appended && !self.parked.is_empty() {
                self.release_parked(&req.path, &p.id, batch, effects);
            }
        }
        Ok(TxnOutcome { appends })
    }

    /// A transaction's append refused after its dry run accepted it: a bug, never an answer.
    /// The batch already holds the transaction's earlier appends and cannot drop them, so the
    /// group is refused and writes stop rather than half a transaction commit.
    fn half_transaction(&mut self, index: usize, error: &AppendError) -> TxnError {
        tracing::error!(index, %error, "a transaction append was refused after its dry run accepted it; refusing all further writes");
        self.fail_stop(format!("writes stopped: append {index} of a transaction was refused after its dry run accepted it ({error})"));
        TxnError::Storage(StorageError::Poisoned)
    }

    /// Stages metadata writes and applies them to the writer's map, where later commands of
    /// the group (guards, scans) see them.
    fn write_meta(&mut self, writes: Vec<MetaWrite>, batch: &mut fjall::OwnedWriteBatch) {
        for w in writes {
            let stored = keys::meta(&w.key);
            match w.value {
                Some(value) => {
                    batch.insert(&self.ks.meta, stored, value.clone());
                    self.meta.insert(w.key, value);
                }
                // The map holds every stored key, so a key it lacks needs no tombstone.
                None => {
                    if self.meta.remove(&w.key).is_some() {
                        batch.remove(&self.ks.meta, stored);
                    }
                }
            }
        }
    }

    fn meta_scan(&self, prefix: &[u8]) -> MetaEntries {
        self.meta
            .range(prefix.to_vec()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// Trims every stream whose retention policy lets go of data, to where
    /// [`retention::floor`] says; returns how many moved. A fork's retention drops only its
    /// own appends.
    fn retain(&mut self, now_ms: i64, batch: &mut fjall::OwnedWriteBatch, effects: &mut Vec<Effect>) -> Result<usize, StorageError> {
        let mut due = Vec::new();
        for (path, w) in &self.streams {
            if w.meta.retention.is_none() || w.meta.soft_deleted {
                continue;
            }
            let (id, own_start, earliest) = (w.meta.id, w.meta.fork.map_or(0, |f| f.fork_point), w.meta.earliest);
            let mut failure = None;
            let below = |x: Offset| {
                if x.0 < own_start {
                    return earliest;
                }
                let last = self.ks.data.range(keys::data(id, own_start + 1)..=keys::data(id, x.0)).next_back();
                match last.map(|item| item.key()) {
                    None => Offset(own_start),
                    Some(Ok(k)) => keys::parse_data(&k).map_or(earliest, |(_, end)| Offset(end)),
                    Some(Err(e)) => {
                        failure.get_or_insert(e);
                        earliest
                    }
                }
            };
            let to = retention::floor(&w.meta.retention, w.tail, earliest, now_ms, &w.marks, below);
            if let Some(e) = failure {
                return Err(backend(e));
            }
            if let Some(to) = to {
                due.push((path.clone(), to));
            }
        }
        let mut moved = 0;
        for (path, to) in due {
            if let Ok(out) = self.trim(&path, to, batch, effects) {
                moved += usize::from(out.earliest == to);
            }
        }
        Ok(moved)
    }

    fn count_streams(&self) {
        self.counters.streams.store(self.streams.len() as u64, Ordering::Relaxed);
    }

    fn drop_if_expired(&mut self, path: &str, now_ms: i64, batch: &mut fjall::OwnedWriteBatch, effects: &mut Vec<Effect>) {
        let expired = self.streams.get(path).is_some_and(|w| {
            !w.meta.soft_deleted && rules::expired(w.meta.expiry, w.shared.last_access_ms.load(Ordering::Relaxed), now_ms)
        });
        if expired {
            // It exists and is not soft-deleted, so the delete verdict cannot be an error.
            let _ = self.delete(path, None, batch, effects);
        }
    }

    /// Moves a stream's earliest offset forward as [`rules::trim`] decides: its metadata is
    /// rewritten in the group's batch.
    /// Writes a compaction's snapshot pieces at the tail and trims to where they start, as
    /// [`rules::compact`] decides, in this batch.
    fn compact(&mut self, req: CompactRequest, batch: &mut fjall::OwnedWriteBatch, effects: &mut Vec<Effect>) -> Result<TrimOutcome, CompactError> {
        if req.pieces.iter().any(|p| p.len() as u64 > MAX_VALUE_BYTES) {
            return Err(CompactError::TooLarge);
        }
        let w = self.streams.get_mut(&req.path).ok_or(CompactError::NotFound)?;
        let ends = rules::compact(&w.meta, w.tail, &req)?;
        for (piece, end) in req.pieces.iter().zip(&ends) {
            batch.insert(&self.ks.data, keys::data(w.meta.id, end.0), piece.clone());
            w.tail = *end;
        }
        effects.push(Effect::Publish { shared: w.shared.clone(), tail: w.tail, closed: w.meta.closed });
        Ok(self.trim(&req.path, req.at, batch, effects)?)
    }

    fn trim(&mut self, path: &str, to: Offset, batch: &mut fjall::OwnedWriteBatch, effects: &mut Vec<Effect>) -> Result<TrimOutcome, TrimError> {
        let w = self.streams.get_mut(path).ok_or(TrimError::NotFound)?;
        if let Some(earliest) = rules::trim(&w.meta, w.tail, to)? {
            w.meta.earliest = earliest;
            batch.insert(&self.ks.streams, path.as_bytes(), stream_meta::encode(&w.meta));
            // The data below it goes in the background (see `gc`) unless a fork reads this
            // stream's keys: then it stays (forks pin what they reference).
            if w.shared.forks.load(Ordering::Relaxed) == 0 {
                batch.insert(&self.ks.trims, keys::stream_prefix(w.meta.id), earliest.0.to_be_bytes().to_vec());
            }
            let dropped = retention::drop_marks_below(&mut w.marks, earliest) as u64;
            for no in w.mark_base..w.mark_base + dropped {
                batch.remove(&self.ks.marks, keys::mark(w.meta.id, no));
            }
            w.mark_base += dropped;
            effects.push(Effect::Trim { shared: w.shared.clone(), earliest });
        }
        Ok(TrimOutcome { earliest: w.meta.earliest, tail: w.tail })
    }

    /// Deletes a stream as [`rules::delete`] decides: soft-deletes it while forks still read it,
    /// removes it otherwise.
    fn delete(&mut self, path: &str, if_tail: Option<&[Offset]>, batch: &mut fjall::OwnedWriteBatch, effects: &mut Vec<Effect>) -> Result<(), LookupError> {
        let w = self.streams.get_mut(path).ok_or(LookupError::NotFound)?;
        match rules::delete(&w.meta, w.tail, w.forks(), if_tail)? {
            Removal::Remove => self.remove(path, batch, effects),
            Removal::SoftDelete => {
                // Its data stays for the forks; its writer state goes, as nothing can append any more.
                w.meta.soft_deleted = true;
                batch.insert(&self.ks.streams, path.as_bytes(), stream_meta::encode(&w.meta));
                let dropped = std::mem::take(&mut w.producers);
                for producer in dropped.keys() {
                    batch.remove(&self.ks.producers, keys::producer(w.meta.id, producer));
                }
                self.counters.producers.fetch_sub(dropped.len() as u64, Ordering::Relaxed);
                for k in w.keys.take().iter().flat_map(|m| m.keys()) {
                    batch.remove(&self.ks.idempotency, keys::idempotency(w.meta.id, *k));
                }
                effects.push(Effect::SoftDelete { shared: w.shared.clone() });
            }
        }
        Ok(())
    }

    /// Removes a stream's metadata and producer state; its data is left to the garbage collector,
    /// recorded in the same batch so a crash cannot orphan it. A fork releases its source, and a
    /// soft-deleted source whose last fork this was is removed too, up the chain, in this batch.
    fn remove(&mut self, path: &str, batch: &mut fjall::OwnedWriteBatch, effects: &mut Vec<Effect>) {
        let mut next = Some(path.to_owned());
        while let Some(path) = next.take() {
            let Some(w) = self.streams.remove(&path) else { return };
            self.paths_by_id.remove(&w.meta.id);
            batch.remove(&self.ks.streams, path.as_bytes());
            for producer in w.producers.keys() {
                batch.remove(&self.ks.producers, keys::producer(w.meta.id, producer));
            }
            self.counters.producers.fetch_sub(w.producers.len() as u64, Ordering::Relaxed);
            for k in w.keys.iter().flat_map(|m| m.keys()) {
                batch.remove(&self.ks.idempotency, keys::idempotency(w.meta.id, *k));
            }
            for no in w.mark_base..w.mark_base + w.marks.len() as u64 {
                batch.remove(&self.ks.marks, keys::mark(w.meta.id, no));
            }
            batch.remove(&self.ks.trims, keys::stream_prefix(w.meta.id));
            batch.insert(&self.ks.gc, keys::stream_prefix(w.meta.id), Vec::new());
            effects.push(Effect::Remove { path, shared: w.shared });
            let Some(f) = w.meta.fork else { continue };
            let Some(src_path) = self.paths_by_id.get(&f.source_id) else { continue };
            let Some(src) = self.streams.get(src_path) else { continue };
            let left = src.shared.forks.fetch_sub(1, Ordering::Relaxed).saturating_sub(1);
            if rules::source_follows(&src.meta, left) {
                next = Some(src_path.clone());
            }
        }
    }

    fn create(&mut self, req: CreateRequest, batch: &mut fjall::OwnedWriteBatch, effects: &mut Vec<Effect>) -> Result<CreateOutcome, CreateError> {
        if req.path.is_empty() || req.path.len() > MAX_KEY_BYTES {
            return Err(CreateError::InvalidPath);
        }
        if req.initial.len() as u64 > MAX_VALUE_BYTES {
            return Err(CreateError::TooLarge);
        }
        self.drop_if_expired(&req.path, req.now_ms, batch, effects);
        // A fork: resolved against its source, whose chain the new stream extends.
        let mut fork = None;
        if let Some(f) = &req.fork {
            self.drop_if_expired(&f.source, req.now_ms, batch, effects);
            let src = self.streams.get(&f.source);
            let data = &self.ks.data;
            let resolved = rules::resolve_fork(src.map(|w| (&w.meta, w.tail)), f, |at| match src {
                Some(w) => append_at(data, &w.shared.chain, w.meta.id, at, w.tail.0),
                None => Ok(None),
            })?;
            let chain = src.map_or_else(Vec::new, |w| rules::fork_chain(&w.shared.chain, w.meta.id, resolved.fork.fork_point));
            fork = Some((resolved, chain));
        }
        let existing = self.streams.get(&req.path).map(|w| (&w.meta, w.tail));
        let (meta, tail) = match rules::create(existing, fork.as_ref().map(|f| &f.0), &req, self.next_id)? {
            CreatePlan::Existing(info) => return Ok(CreateOutcome::Existing(info)),
            CreatePlan::Create { meta, tail } => (meta, tail),
        };
        let id = meta.id;
        self.next_id += 1;
        batch.insert(&self.ks.sys, keys::NEXT_STREAM_ID, sys::encode(self.next_id));
        batch.insert(&self.ks.streams, req.path.as_bytes(), stream_meta::encode(&meta));
        let has_initial = !req.initial.is_empty();
        if has_initial {
            batch.insert(&self.ks.data, keys::data(id, tail.0), req.initial);
        }
        let chain = match fork {
            Some((_, chain)) => {
                if let Some(src) = req.fork.as_ref().and_then(|f| self.streams.get(&f.source)) {
                    src.shared.forks.fetch_add(1, Ordering::Relaxed);
                }
                chain
            }
            None => Vec::new(),
        };
        let shared = new_shared(&meta, tail, chain, 0, req.now_ms);
        let info = meta.info(tail);
        let mut marks = TimeMarks::new();
        if has_initial && retention::note_write(&mut marks, &meta.retention, tail, req.now_ms) != retention::MarkChange::None {
            batch.insert(&self.ks.marks, keys::mark(id, 0), keys::mark_value(&marks[0]));
        }
        let w = WStream { meta, tail, producers: HashMap::new(), keys: None, marks, mark_base: 0, shared: shared.clone() };
        self.streams.insert(req.path.clone(), w);
        self.paths_by_id.insert(id, req.path.clone());
        self.count_streams();
        effects.push(Effect::Insert { path: req.path, shared });
        Ok(CreateOutcome::Created(info))
    }

    /// Decides one append by [`rules::append`] and stages its effects. Takes the request by
    /// reference so that a parked request can be retried later without copying it on the
    /// (single-threaded) hot path.
    fn append(&mut self, req: &AppendRequest, batch: &mut fjall::OwnedWriteBatch, effects: &mut Vec<Effect>) -> Result<AppendOutcome, AppendError> {
        storable(req)?;
        self.drop_if_expired(&req.path, req.now_ms, batch, effects);
        let Some(w) = self.streams.get_mut(&req.path) else { return Err(AppendError::NotFound) };
        if req.stream_id.is_none_or(|id| id == w.meta.id) {
            // Any request that reaches this stream is an access: it slides the TTL window.
            w.shared.touch(req.now_ms);
        }
        let writer = rules::WriterState::of(req, &w.producers, &w.keys);
        let plan = rules::append(&w.meta, w.tail, writer, req, &self.retention)?;
        let write = match plan {
            AppendPlan::Answer(outcome) => return Ok(outcome),
            AppendPlan::Write(write) => write,
        };
        if !req.data.is_empty() {
            batch.insert(&self.ks.data, keys::data(w.meta.id, write.new_tail.0), req.data.clone());
        }
        let closed_before = w.meta.closed;
        if write.apply_meta(&mut w.meta, req) {
            batch.insert(&self.ks.streams, req.path.as_bytes(), stream_meta::encode(&w.meta));
        }
        if let Some(p) = &req.producer {
            let state = match w.producers.get_mut(&p.id) {
                Some(s) => s,
                None => {
                    self.counters.producers.fetch_add(1, Ordering::Relaxed);
                    w.producers.entry(p.id.clone()).or_insert_with(|| ProducerState::new(p.epoch))
                }
            };
            write.apply_producer(state);
            batch.insert(&self.ks.producers, keys::producer(w.meta.id, &p.id), ProducerRecord::encode_state(state));
        }
        if let Some(k) = write.key {
            write.apply_key(&mut w.keys);
            if let Some(entry) = w.keys.as_ref().and_then(|m| m.get(&k)) {
                batch.insert(&self.ks.idempotency, keys::idempotency(w.meta.id, k), oncelog_storage::codec::key_entry::encode(entry));
            }
        }
        w.tail = write.new_tail;
        if !req.data.is_empty() && retention::note_write(&mut w.marks, &w.meta.retention, w.tail, req.now_ms) != retention::MarkChange::None {
            if let Some(last) = w.marks.last() {
                let no = w.mark_base + w.marks.len() as u64 - 1;
                batch.insert(&self.ks.marks, keys::mark(w.meta.id, no), keys::mark_value(last));
            }
        }
        effects.push(Effect::Publish { shared: w.shared.clone(), tail: w.tail, closed: w.meta.closed });
        Ok(write.outcome(closed_before))
    }

    /// Decides an append as [`Self::append`] would, changing nothing (not even the TTL
    /// window): a transaction's dry run. The caller has already dropped an expired stream.
    fn check_append(&self, req: &AppendRequest) -> Result<(), AppendError> {
        storable(req)?;
        let w = self.streams.get(&req.path).ok_or(AppendError::NotFound)?;
        let writer = rules::WriterState::of(req, &w.producers, &w.keys);
        rules::append(&w.meta, w.tail, writer, req, &self.retention).map(|_| ())
    }
}

/// Whether fjall can store what an append would write (its producer key and data record).
fn storable(req: &AppendRequest) -> Result<(), AppendError> {
    if req.producer.as_ref().is_some_and(|p| p.id.is_empty() || p.id.len() + 8 > MAX_KEY_BYTES) {
        return Err(AppendError::ProducerIdTooLong);
    }
    if req.data.len() as u64 > MAX_VALUE_BYTES {
        return Err(AppendError::TooLarge);
    }
    Ok(())
}
