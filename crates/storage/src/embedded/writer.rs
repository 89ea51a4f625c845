//! The group-commit writer thread: the only code that mutates stream state.
//!
//! One loop iteration = one group: block for the first command, drain whatever else is queued
//! (bounded by [`MAX_GROUP_COMMANDS`] and [`MAX_GROUP_BYTES`]), validate and stage each command in
//! order against the authoritative state (so later commands of a group see earlier ones), commit
//! the staged effects as one fjall batch, sync once, publish, reply. Writes stop for good after a
//! failed commit or sync.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use fjall::PersistMode;
use oncelog_protocol::headers::Expiry;
use oncelog_protocol::{content_type, json};
use oncelog_protocol::producer::{self, ProducerState, Verdict};
use oncelog_protocol::Offset;
use tokio::sync::{oneshot, watch};

use super::gc::GcHandle;
use super::{append_at, backend, fork_chain, Durability, Failpoints, Keyspaces, Published, Segment, Shared};
use crate::engine::*;
use crate::records::stream_meta::ForkOf;
use crate::records::{keys, ProducerRecord, StreamMeta};

/// Most commands in one group commit: bounds the latency a group adds to its first member.
const MAX_GROUP_COMMANDS: usize = 4096;
/// Most data bytes in one group commit, for the same reason.
const MAX_GROUP_BYTES: usize = 32 << 20;
/// How long an append that arrived ahead of its producer's next sequence number waits for its
/// predecessors before it is answered 409. Pipelined requests over several connections arrive
/// out of order by a few milliseconds; parking them turns a would-be 409-and-resend into a 200.
const PARK_TIMEOUT: Duration = Duration::from_millis(250);
/// fjall's limits on one key and one value; requests beyond them are refused, never passed on
/// (fjall asserts on them, which would take the writer thread down).
const MAX_KEY_BYTES: usize = u16::MAX as usize;
const MAX_VALUE_BYTES: u64 = u32::MAX as u64;

/// A group commit slower than this is logged at debug level, to find latency outliers.
const SLOW_GROUP: Duration = Duration::from_millis(20);
/// How far ahead of the expected sequence number a request may be and still be parked.
const MAX_PARK_AHEAD: u64 = 64;

/// An append waiting for its producer's earlier sequence numbers.
struct Parked {
    req: AppendRequest,
    reply: oneshot::Sender<Result<AppendOutcome, AppendError>>,
    deadline: Instant,
}

pub(crate) enum Command {
    Create { req: CreateRequest, reply: oneshot::Sender<Result<CreateOutcome, CreateError>> },
    Append { req: AppendRequest, reply: oneshot::Sender<Result<AppendOutcome, AppendError>> },
    Delete { path: String, now_ms: i64, reply: oneshot::Sender<Result<(), LookupError>> },
    Expire { paths: Vec<String>, now_ms: i64, reply: oneshot::Sender<Result<usize, StorageError>> },
}

/// The writer's authoritative view of one stream.
pub(crate) struct WStream {
    pub meta: StreamMeta,
    pub tail: Offset,
    pub producers: HashMap<String, ProducerState>,
    /// The reader-visible entry this stream publishes to.
    pub shared: Arc<Shared>,
}

impl WStream {
    pub fn recovered(meta: StreamMeta, tail: Offset, chain: Vec<Segment>, forks: usize, now_ms: i64) -> Self {
        let shared = new_shared(&meta, tail, chain, forks, now_ms);
        WStream { meta, tail, producers: HashMap::new(), shared }
    }

    fn forks(&self) -> usize {
        self.shared.forks.load(Ordering::Relaxed)
    }
}

fn new_shared(meta: &StreamMeta, tail: Offset, chain: Vec<Segment>, forks: usize, now_ms: i64) -> Arc<Shared> {
    let published = Published { tail, closed: meta.closed, deleted: false, soft_deleted: meta.soft_deleted };
    let (state, _) = watch::channel(published);
    Arc::new(Shared {
        id: meta.id,
        config: StreamConfig { content_type: meta.content_type.clone(), expiry: meta.expiry },
        chain,
        forks: AtomicUsize::new(forks),
        state,
        last_access_ms: AtomicI64::new(now_ms),
    })
}

/// A fork request resolved against its source.
struct ResolvedFork {
    source_path: String,
    content_type: String,
    expiry: Expiry,
    fork: ForkOf,
    chain: Vec<Segment>,
}

/// A reply to send, and reader-visible changes to make, once the group is durable.
enum Effect {
    Publish { shared: Arc<Shared>, tail: Offset, closed: bool },
    Insert { path: String, shared: Arc<Shared> },
    Remove { path: String, shared: Arc<Shared> },
    SoftDelete { shared: Arc<Shared> },
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
    /// Appends that arrived ahead of sequence, by (path, producer id) and (epoch, seq).
    parked: HashMap<(String, String), BTreeMap<(u64, u64), Parked>>,
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
    pub fn new(
        ks: Arc<Keyspaces>,
        published: Arc<RwLock<HashMap<String, Arc<Shared>>>>,
        streams: HashMap<String, WStream>,
        next_id: u64,
        durability: Durability,
        gc: GcHandle,
        failpoints: Failpoints,
    ) -> Self {
        let paths_by_id = streams.iter().map(|(p, w)| (w.meta.id, p.clone())).collect();
        Writer { ks, published, streams, paths_by_id, next_id, durability, gc, failpoints, poisoned: false, parked: HashMap::new() }
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
        let failure = self.commit(batch);
        self.finish(effects, failure);
    }

    fn next_park_deadline(&self) -> Option<Instant> {
        self.parked.values().flat_map(|m| m.values().map(|p| p.deadline)).min()
    }

    /// Answers parked appends whose wait is over: re-validated now, never parked again.
    fn expire_parked(&mut self, now: Instant, batch: &mut fjall::OwnedWriteBatch, effects: &mut Vec<Effect>) {
        let mut due = Vec::new();
        for m in self.parked.values_mut() {
            let seqs: Vec<(u64, u64)> = m.iter().filter(|(_, p)| p.deadline <= now).map(|(s, _)| *s).collect();
            due.extend(seqs.into_iter().filter_map(|s| m.remove(&s)));
        }
        self.parked.retain(|_, m| !m.is_empty());
        for p in due {
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
        let stamp = req.producer.as_ref().map(|p| (p.epoch, p.seq));
        let r = self.append(&req, batch, effects);
        let ahead = match &r {
            Err(AppendError::ProducerSeqGap { expected, received }) => received - expected <= MAX_PARK_AHEAD,
            Err(AppendError::ProducerEpochSeq) => stamp.is_some_and(|(_, seq)| seq <= MAX_PARK_AHEAD),
            _ => false,
        };
        let key = |req: &AppendRequest| req.producer.as_ref().map(|p| (req.path.clone(), p.id.clone()));
        match (&r, stamp) {
            (Err(_), Some(stamp)) if ahead => {
                let Some(key) = key(&req) else {
                    effects.push(reply(tx, r));
                    return;
                };
                let parked = Parked { req, reply: tx, deadline: Instant::now() + PARK_TIMEOUT };
                if let Some(old) = self.parked.entry(key).or_default().insert(stamp, parked) {
                    // A retry replaced it; the older copy gets the answer it would have had.
                    effects.push(reply(old.reply, r));
                }
            }
            (Ok(out), Some(_)) if out.status == AppendStatus::Appended => {
                effects.push(reply(tx, r.clone()));
                // Only a producer's accepted append can release parked successors; nothing is
                // parked almost always, so check that before building the key.
                if !self.parked.is_empty() {
                    if let Some(k) = key(&req) {
                        self.release_parked(k, batch, effects);
                    }
                }
            }
            _ => effects.push(reply(tx, r)),
        }
    }

    /// Stages the parked successors of a producer's newly accepted sequence number, in order.
    fn release_parked(&mut self, key: (String, String), batch: &mut fjall::OwnedWriteBatch, effects: &mut Vec<Effect>) {
        loop {
            let next = self
                .streams
                .get(&key.0)
                .and_then(|w| w.producers.get(&key.1))
                .map(|s| (s.epoch, s.last_seq + 1));
            let Some(next) = next else { return };
            let Some(p) = self.parked.get_mut(&key).and_then(|m| m.remove(&next)) else { return };
            if self.parked.get(&key).is_some_and(BTreeMap::is_empty) {
                self.parked.remove(&key);
            }
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
        if total > SLOW_GROUP {
            tracing::debug!(items, ?commit_time, sync_time = ?(total - commit_time), "slow group commit");
        }
        match result {
            Ok(()) => None,
            Err(e) => {
                tracing::error!(error = %e, "commit or sync failed; refusing all further writes");
                self.poisoned = true;
                Some(backend(e))
            }
        }
    }

    fn finish(&self, effects: Vec<Effect>, failure: Option<StorageError>) {
        for effect in effects {
            match effect {
                Effect::Reply(f) => f(failure.clone()),
                _ if failure.is_some() => {}
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
            Command::Delete { path, now_ms, reply: tx } => {
                self.drop_if_expired(&path, now_ms, batch, effects);
                let r = match self.streams.get(&path) {
                    None => Err(LookupError::NotFound),
                    Some(w) if w.meta.soft_deleted => Err(LookupError::Gone),
                    Some(_) => {
                        self.delete(&path, batch, effects);
                        Ok(())
                    }
                };
                effects.push(reply(tx, r));
                0
            }
            Command::Expire { paths, now_ms, reply: tx } => {
                let before = self.streams.len();
                for p in &paths {
                    self.drop_if_expired(p, now_ms, batch, effects);
                }
                effects.push(reply(tx, Ok(before - self.streams.len())));
                0
            }
        }
    }

    fn drop_if_expired(&mut self, path: &str, now_ms: i64, batch: &mut fjall::OwnedWriteBatch, effects: &mut Vec<Effect>) {
        if self.streams.get(path).is_some_and(|w| !w.meta.soft_deleted && w.shared.expired(now_ms)) {
            self.delete(path, batch, effects);
        }
    }

    /// Deletes a stream: soft-deletes it while forks still read it, removes it otherwise.
    fn delete(&mut self, path: &str, batch: &mut fjall::OwnedWriteBatch, effects: &mut Vec<Effect>) {
        let Some(w) = self.streams.get_mut(path) else { return };
        if w.forks() == 0 {
            self.remove(path, batch, effects);
            return;
        }
        // Its data stays for the forks; its writer state goes, as nothing can append any more.
        w.meta.soft_deleted = true;
        batch.insert(&self.ks.streams, path.as_bytes(), w.meta.encode());
        for producer in std::mem::take(&mut w.producers).keys() {
            batch.remove(&self.ks.producers, keys::producer(w.meta.id, producer));
        }
        effects.push(Effect::SoftDelete { shared: w.shared.clone() });
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
            batch.insert(&self.ks.gc, keys::stream_prefix(w.meta.id), Vec::new());
            effects.push(Effect::Remove { path, shared: w.shared });
            let Some(f) = w.meta.fork else { continue };
            let Some(src_path) = self.paths_by_id.get(&f.source_id) else { continue };
            let Some(src) = self.streams.get(src_path) else { continue };
            let left = src.shared.forks.fetch_sub(1, Ordering::Relaxed).saturating_sub(1);
            if left == 0 && src.meta.soft_deleted {
                next = Some(src_path.clone());
            }
        }
    }

    /// Resolves `Stream-Forked-From` / `-Fork-Offset` / `-Fork-Sub-Offset` against the source.
    fn resolve_fork(&mut self, f: &ForkRequest, now_ms: i64, batch: &mut fjall::OwnedWriteBatch, effects: &mut Vec<Effect>) -> Result<ResolvedFork, CreateError> {
        self.drop_if_expired(&f.source, now_ms, batch, effects);
        let src = self.streams.get(&f.source).ok_or(CreateError::SourceNotFound)?;
        if src.meta.soft_deleted {
            return Err(CreateError::SourceGone);
        }
        let at = f.offset.map_or(src.tail.0, |o| o.0);
        if at > src.tail.0 {
            return Err(CreateError::ForkOffsetBeyondTail);
        }
        let point = if f.sub_offset == 0 {
            at
        } else {
            let append = append_at(&self.ks.data, &src.shared.chain, src.meta.id, at, src.tail.0)?
                .ok_or(CreateError::SubOffsetOvershoot)?;
            let k = usize::try_from(f.sub_offset).map_err(|_| CreateError::SubOffsetOvershoot)?;
            let bytes = if content_type::is_json(&src.meta.content_type) {
                let lens: Vec<usize> = json::messages(&append).take(k).map(|m| m.len() + 1).collect();
                if lens.len() < k {
                    return Err(CreateError::SubOffsetOvershoot);
                }
                lens.iter().sum()
            } else if k > append.len() {
                return Err(CreateError::SubOffsetOvershoot);
            } else {
                k
            };
            at + bytes as u64
        };
        Ok(ResolvedFork {
            source_path: f.source.clone(),
            content_type: src.meta.content_type.clone(),
            expiry: src.meta.expiry,
            fork: ForkOf { source_id: src.meta.id, fork_point: point },
            chain: fork_chain(&src.shared.chain, src.meta.id, point),
        })
    }

    fn create(&mut self, req: CreateRequest, batch: &mut fjall::OwnedWriteBatch, effects: &mut Vec<Effect>) -> Result<CreateOutcome, CreateError> {
        if req.path.is_empty() || req.path.len() > MAX_KEY_BYTES {
            return Err(CreateError::InvalidPath);
        }
        if req.initial.len() as u64 > MAX_VALUE_BYTES {
            return Err(CreateError::TooLarge);
        }
        self.drop_if_expired(&req.path, req.now_ms, batch, effects);
        let fork = match &req.fork {
            Some(f) => Some(self.resolve_fork(f, req.now_ms, batch, effects)?),
            None => None,
        };
        let content_type = match (&req.content_type, &fork) {
            (Some(ct), Some(f)) if !content_type::matches(ct, &f.content_type) => {
                return Err(CreateError::ContentTypeMismatch);
            }
            (Some(ct), _) => ct.clone(),
            (None, Some(f)) => f.content_type.clone(),
            (None, None) => content_type::DEFAULT.to_owned(),
        };
        // Section 4.2: a fork without its own expiry inherits the source's TTL or deadline.
        let expiry = req.expiry.or(fork.as_ref().map(|f| f.expiry)).unwrap_or(Expiry::Never);
        let fork_of = fork.as_ref().map(|f| f.fork);
        if let Some(w) = self.streams.get(&req.path) {
            if w.meta.soft_deleted {
                return Err(CreateError::PathReserved);
            }
            let same = content_type::matches(&w.meta.content_type, &content_type)
                && w.meta.expiry == expiry
                && w.meta.closed == req.closed
                && w.meta.fork == fork_of;
            return if same { Ok(CreateOutcome::Existing(info_of(w))) } else { Err(CreateError::ConfigMismatch) };
        }
        let id = self.next_id;
        self.next_id += 1;
        batch.insert(&self.ks.sys, keys::NEXT_STREAM_ID, self.next_id.to_le_bytes().to_vec());
        let meta = StreamMeta {
            id,
            created_ms: req.now_ms,
            content_type,
            expiry,
            closed: req.closed,
            stream_seq: None,
            fork: fork_of,
            soft_deleted: false,
        };
        batch.insert(&self.ks.streams, req.path.as_bytes(), meta.encode());
        let start = fork_of.map_or(0, |f| f.fork_point);
        let tail = Offset(start + req.initial.len() as u64);
        if !req.initial.is_empty() {
            batch.insert(&self.ks.data, keys::data(id, tail.0), req.initial);
        }
        let (chain, source) = fork.map_or((Vec::new(), None), |f| (f.chain, Some(f.source_path)));
        if let Some(src) = source.and_then(|p| self.streams.get(&p)) {
            src.shared.forks.fetch_add(1, Ordering::Relaxed);
        }
        let shared = new_shared(&meta, tail, chain, 0, req.now_ms);
        let w = WStream { meta, tail, producers: HashMap::new(), shared: shared.clone() };
        let info = info_of(&w);
        self.streams.insert(req.path.clone(), w);
        self.paths_by_id.insert(id, req.path.clone());
        effects.push(Effect::Insert { path: req.path, shared });
        Ok(CreateOutcome::Created(info))
    }

    /// Validates and stages one append. Takes the request by reference so that a parked request
    /// can be retried later without copying it on the (single-threaded) hot path.
    fn append(&mut self, req: &AppendRequest, batch: &mut fjall::OwnedWriteBatch, effects: &mut Vec<Effect>) -> Result<AppendOutcome, AppendError> {
        if req.producer.as_ref().is_some_and(|p| p.id.is_empty() || p.id.len() + 8 > MAX_KEY_BYTES) {
            return Err(AppendError::ProducerIdTooLong);
        }
        if req.data.len() as u64 > MAX_VALUE_BYTES {
            return Err(AppendError::TooLarge);
        }
        self.drop_if_expired(&req.path, req.now_ms, batch, effects);
        let Some(w) = self.streams.get_mut(&req.path) else { return Err(AppendError::NotFound) };
        if w.meta.soft_deleted {
            return Err(AppendError::Gone);
        }
        w.shared.touch(req.now_ms);

        // 1. Producer verdict first: a retry of an accepted request (even the one that closed the
        //    stream) must be answered 204, whatever else changed since.
        if let Some(p) = &req.producer {
            match producer::validate(w.producers.get(&p.id), p.epoch, p.seq) {
                Verdict::Accept => {}
                Verdict::Duplicate { receipt } => {
                    let last = w.producers.get(&p.id).map_or(p.seq, |s| s.last_seq);
                    return Ok(AppendOutcome {
                        status: AppendStatus::Duplicate,
                        next_offset: receipt.unwrap_or(w.tail),
                        closed: w.meta.closed,
                        producer: Some((p.epoch, last)),
                    });
                }
                Verdict::Fenced { current_epoch } => return Err(AppendError::ProducerFenced { current_epoch }),
                Verdict::NewEpochMustStartAtZero => return Err(AppendError::ProducerEpochSeq),
                // On a closed stream the closure is the more useful answer: waiting for the
                // missing predecessors cannot help.
                Verdict::Gap { .. } if w.meta.closed => return Err(AppendError::Closed { tail: w.tail }),
                Verdict::Gap { expected, received } => return Err(AppendError::ProducerSeqGap { expected, received }),
            }
        }
        // 2. Closure, before content type and Stream-Seq, so the client learns about it.
        if w.meta.closed {
            if req.close && req.data.is_empty() {
                return Ok(AppendOutcome { status: AppendStatus::AlreadyClosed, next_offset: w.tail, closed: true, producer: None });
            }
            return Err(AppendError::Closed { tail: w.tail });
        }
        // 3. Content type, when there is a body.
        if !req.data.is_empty() {
            let ok = req.content_type.as_deref().is_some_and(|ct| content_type::matches(ct, &w.meta.content_type));
            if !ok {
                return Err(AppendError::ContentTypeMismatch);
            }
        }
        // 4. Stream-Seq, strictly increasing byte-wise.
        if let (Some(seq), Some(last)) = (&req.stream_seq, &w.meta.stream_seq) {
            if seq.as_bytes() <= last.as_bytes() {
                return Err(AppendError::StreamSeqRegression);
            }
        }

        let new_tail = w.tail.0.checked_add(req.data.len() as u64).filter(|t| *t <= Offset::MAX.0).ok_or(AppendError::OffsetOverflow)?;
        let data_len = req.data.len();
        if data_len > 0 {
            batch.insert(&self.ks.data, keys::data(w.meta.id, new_tail), req.data.clone());
        }
        let mut meta_changed = false;
        if let Some(seq) = &req.stream_seq {
            w.meta.stream_seq = Some(seq.clone());
            meta_changed = true;
        }
        if req.close {
            // A retry of the closing request is recognised by the producer verdict (the closing
            // seq is the producer's last), so closure needs no record of who closed.
            w.meta.closed = true;
            meta_changed = true;
        }
        if meta_changed {
            batch.insert(&self.ks.streams, req.path.as_bytes(), w.meta.encode());
        }
        let mut echo = None;
        if let Some(p) = &req.producer {
            let state = match w.producers.get_mut(&p.id) {
                Some(s) => s,
                None => w.producers.entry(p.id.clone()).or_insert_with(|| ProducerState::new(p.epoch)),
            };
            state.accept(p.epoch, p.seq, Offset(new_tail));
            batch.insert(&self.ks.producers, keys::producer(w.meta.id, &p.id), ProducerRecord::encode_state(state));
            echo = Some((p.epoch, p.seq));
        }
        w.tail = Offset(new_tail);
        effects.push(Effect::Publish { shared: w.shared.clone(), tail: w.tail, closed: w.meta.closed });
        Ok(AppendOutcome { status: AppendStatus::Appended, next_offset: w.tail, closed: w.meta.closed, producer: echo })
    }
}

fn info_of(w: &WStream) -> StreamInfo {
    StreamInfo {
        id: w.meta.id,
        config: StreamConfig { content_type: w.meta.content_type.clone(), expiry: w.meta.expiry },
        tail: w.tail,
        closed: w.meta.closed,
    }
}
