//! The writer's side of the log: the authoritative state of every stream, the group commit, and
//! recovery. Synchronous and single-threaded by design — the engine runs it on one thread, and
//! the power-loss simulation drives it step by step with a seeded schedule.
//!
//! One group: [`Store::stage`] each command (decided by the stream state machine against the
//! state as left by the commands before it, and encoded as one record into the frame being
//! built), then [`Store::commit`] (one `pwrite` of the frame, one `fdatasync`), then
//! [`Store::finish`] (publish to readers, answer). A failed write or sync stops all writes for
//! good (fail-stop): the kernel may have dropped the unsynced pages and would report the next
//! sync as a success.
//!
//! Files: this one holds the store and dispatches commands; [`view`] what readers share;
//! [`read`] reads from the hot tail or the segment files;
//! `stage` each command's decision and records; `commit` the group's frame, its write and sync,
//! and publishing; `checkpoint` snapshots and index pruning; `recovery` opening a directory.

mod checkpoint;
mod commit;
mod configs;
pub(crate) mod mutant;
mod path_table;
pub(crate) mod read;
mod recovery;
mod stage;
pub(crate) mod view;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Instant;

use bytes::Bytes;
use oncelog_protocol::Offset;
use oncelog_storage::machine::parking::ParkingLot;
use oncelog_storage::machine::{self, StreamState};
use oncelog_storage::rules::{self};
use oncelog_storage::*;
use tokio::sync::oneshot;

use crate::error::{backend, LogError};
use crate::fs::{File, Fs};
use crate::options::Durability;

pub(crate) use checkpoint::{
    install_checkpoint, read_checkpoint, remove_segments, write_checkpoint, write_checkpoint_keeping,
};
use commit::reply;
pub(crate) use commit::Group;
use path_table::PathTable;
pub(crate) use recovery::open;
pub(crate) use view::{Counters, StreamView, Synced, View};

/// A command for the writer.
pub(crate) enum Command {
    Create {
        req: CreateRequest,
        reply: oneshot::Sender<Result<CreateOutcome, CreateError>>,
    },
    Append {
        req: AppendRequest,
        reply: oneshot::Sender<Result<AppendOutcome, AppendError>>,
    },
    Delete {
        path: String,
        req: DeleteRequest,
        now_ms: i64,
        reply: oneshot::Sender<Result<(), LookupError>>,
    },
    Trim {
        path: String,
        to: Offset,
        now_ms: i64,
        reply: oneshot::Sender<Result<TrimOutcome, TrimError>>,
    },
    Expire {
        paths: Vec<String>,
        now_ms: i64,
        reply: oneshot::Sender<Result<usize, StorageError>>,
    },
    /// A State Protocol snapshot appended at the tail and the earliest offset moved there, in
    /// one frame.
    Compact {
        req: CompactRequest,
        reply: oneshot::Sender<Result<TrimOutcome, CompactError>>,
    },
    /// The retention sweep: trims every stream its policy lets go of (one Trim record each).
    Retain {
        now_ms: i64,
        reply: oneshot::Sender<Result<Retained, StorageError>>,
    },
    /// Metadata changes and appends in one frame.
    Transact {
        txn: TxnRequest,
        reply: oneshot::Sender<Result<TxnOutcome, TxnError>>,
    },
    /// Drops writer state past its TTL or window (memory only: the next checkpoint leaves it
    /// out, and the log holds nothing a later replay would need of it).
    Prune {
        now_ms: i64,
        reply: oneshot::Sender<PruneOutcome>,
    },
    /// The metadata entries under a prefix, answered once the group before it is durable.
    MetaScan {
        prefix: Vec<u8>,
        reply: oneshot::Sender<Result<Vec<(Vec<u8>, Bytes)>, StorageError>>,
    },
    /// From the shipper (`--ack-mode bucket`): a cut was published, or the shipper failed;
    /// groups waiting for the bucket may be answered now. Stages nothing.
    Shipped,
}

/// The writer's authoritative view of one stream: its state as the machine keeps it (every
/// producer and key of the window; time marks only with a maximum age), and what readers share.
struct WStream {
    st: StreamState,
    shared: Arc<StreamView>,
}
impl path_table::Named for Box<WStream> {
    fn path(&self) -> &Arc<str> {
        &self.shared.path
    }
}

/// The store and the group being staged, as the machine's [`machine::Appender`].
struct Staging<'a> {
    store: &'a mut Store,
    g: &'a mut Group,
    /// The producer states held when the transaction began: its checks and its appends compare
    /// the same count with `--max-producers` (an append's new producer must not refuse a later
    /// append whose check passed: that would be a divergence, which stops writes).
    producers_total: u64,
}

impl machine::Appender for Staging<'_> {
    fn append(&mut self, req: &AppendRequest) -> Result<AppendOutcome, AppendError> {
        self.store.append_counted(req, self.g, self.producers_total)
    }

    fn check(&mut self, req: &AppendRequest) -> Result<(), AppendError> {
        rules::shape::append(req)?;
        let w = self.store.streams.get(req.path.as_str()).ok_or(AppendError::NotFound)?;
        w.st.check(req, &self.store.cfg.retention, self.producers_total)
    }

    fn diverged(&mut self, e: AppendError) -> StorageError {
        self.store.fail(backend(LogError::TxnDiverged(e.to_string())))
    }
}

/// Tuning and durability, fixed at open.
#[derive(Debug, Clone)]
pub(crate) struct StoreConfig {
    pub durability: Durability,
    pub segment_bytes: u64,
    pub hot_bytes: usize,
    /// The power-loss test breaks one guarantee at a time to show that it notices
    /// ([`mutant`]); test builds only.
    #[cfg(test)]
    pub mutant: mutant::Mutant,
    #[cfg(any(test, feature = "failpoints"))]
    pub failpoints: crate::options::Failpoints,
    pub retention: rules::Retention,
}

pub(crate) struct Store {
    fs: Arc<dyn Fs>,
    view: Arc<View>,
    cfg: StoreConfig,
    /// Boxed: a map's empty slots then cost a pointer, not a whole stream's state.
    streams: PathTable<Box<WStream>>,
    /// The path of each stream at a path that forks read (its fork count is above 0), by id:
    /// a fork names its source by id. Only sources are here, so the many streams without forks
    /// cost no entry (at a million streams a map entry each was about 50 bytes a stream).
    source_paths: HashMap<u64, Arc<str>>,
    /// Every stream's configuration, one allocation per distinct one.
    configs: configs::Configs,
    /// Streams detached from their paths by a purging delete ([`rules::Removal::Detach`]): kept
    /// by id, for their forks only (no request names them), until their last fork goes.
    detached: HashMap<u64, Box<WStream>>,
    next_id: u64,
    /// The segment frames go to, its number and its length (where the next frame goes).
    active: Arc<dyn File>,
    active_no: u64,
    active_len: u64,
    /// LSN of the last frame written.
    lsn: u64,
    /// Log bytes written since the last checkpoint.
    pub since_checkpoint: u64,
    /// A trim or a removed stream made index entries (and maybe whole segments) unreachable:
    /// the next checkpoint gives them back, so it is written soon rather than after
    /// `checkpoint_bytes`.
    pub reclaim_wanted: bool,
    /// The latest request time seen (Unix ms): what "now" is when idle producers are pruned
    /// (the store reads no clock; time comes with the commands).
    latest_ms: i64,
    counters: Arc<Counters>,
    /// Set after a failed write or sync (by the writer or the checkpointer): writes are refused.
    poisoned: bool,
    /// Appends waiting for their predecessors (taken out while a round runs: [`Store::with_lot`]).
    parked: Option<ParkingLot>,
    /// Hot-tail entries oldest first, store-wide, with their sizes: evicted past the budget.
    hot_queue: VecDeque<(Weak<StreamView>, u64, usize)>,
    hot_bytes: usize,
    /// The engine metadata map ([`oncelog_storage::MetaWrite`]), as of the records staged.
    meta: BTreeMap<Vec<u8>, Bytes>,
    /// Held while the store is open: one server per data directory.
    _lock: Box<dyn std::any::Any + Send + Sync>,
}

/// What recovery found, for the startup log.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    pub streams: usize,
    pub producers: usize,
    pub closed_streams: usize,
    /// Sum of all tails: bytes of stream data.
    pub bytes: u64,
    /// Segment files read after the checkpoint.
    pub segments_replayed: usize,
    /// Frames replayed after the checkpoint.
    pub frames_replayed: u64,
    /// Bytes cut from a torn tail of the last segment.
    pub torn_bytes_cut: u64,
    /// Whether a checkpoint was loaded.
    pub from_checkpoint: bool,
}
fn io_err(what: &str, e: std::io::Error) -> StorageError {
    backend(LogError::Io { what: what.to_owned(), source: e })
}

impl Store {
    pub fn counters(&self) -> &Arc<Counters> {
        &self.counters
    }

    /// Where the next frame goes in the active segment.
    #[cfg(test)]
    pub fn active_len(&self) -> u64 {
        self.active_len
    }

    pub fn view(&self) -> &Arc<View> {
        &self.view
    }

    /// The LSN of the last frame written.
    pub fn lsn(&self) -> u64 {
        self.lsn
    }

    fn poisoned(&mut self) -> bool {
        if !self.poisoned && self.counters.failed() {
            self.poisoned = true;
        }
        self.poisoned
    }

    fn fail(&mut self, e: StorageError) -> StorageError {
        tracing::error!(error = %e, "log write or sync failed; refusing all further writes");
        self.poisoned = true;
        self.counters.fail(format!("writes stopped after a storage failure: {e}"));
        e
    }

    pub fn next_park_deadline(&self) -> Option<Instant> {
        self.parked.as_ref().and_then(ParkingLot::next_deadline)
    }

    /// Validates one command against current state and stages its effects.
    pub fn stage(&mut self, cmd: Command, g: &mut Group) {
        if self.poisoned() {
            match cmd {
                Command::Create { reply: tx, .. } => {
                    g.effects.push(reply(tx, Err(CreateError::Storage(StorageError::Poisoned))))
                }
                Command::Append { reply: tx, .. } => {
                    g.effects.push(reply(tx, Err(AppendError::Storage(StorageError::Poisoned))))
                }
                Command::Delete { reply: tx, .. } => {
                    g.effects.push(reply(tx, Err(LookupError::Storage(StorageError::Poisoned))))
                }
                Command::Expire { reply: tx, .. } => g.effects.push(reply(tx, Err(StorageError::Poisoned))),
                Command::Trim { reply: tx, .. } => {
                    g.effects.push(reply(tx, Err(TrimError::Storage(StorageError::Poisoned))))
                }
                Command::Retain { reply: tx, .. } => g.effects.push(reply(tx, Err(StorageError::Poisoned))),
                Command::Compact { reply: tx, .. } => {
                    g.effects.push(reply(tx, Err(CompactError::Storage(StorageError::Poisoned))))
                }
                Command::Transact { reply: tx, .. } => {
                    g.effects.push(reply(tx, Err(TxnError::Storage(StorageError::Poisoned))))
                }
                Command::MetaScan { reply: tx, .. } => g.effects.push(reply(tx, Err(StorageError::Poisoned))),
                // Pruning memory needs no write.
                Command::Prune { now_ms, reply } => {
                    let _ = reply.send(self.prune_writers(now_ms));
                }
                Command::Shipped => {}
            }
            return;
        }
        let at = match &cmd {
            Command::Transact { txn, .. } => txn.now_ms,
            Command::MetaScan { .. } | Command::Prune { .. } | Command::Shipped => i64::MIN,
            Command::Create { req, .. } => req.now_ms,
            Command::Append { req, .. } => req.now_ms,
            Command::Compact { req, .. } => req.now_ms,
            Command::Delete { now_ms, .. }
            | Command::Expire { now_ms, .. }
            | Command::Trim { now_ms, .. }
            | Command::Retain { now_ms, .. } => *now_ms,
        };
        self.latest_ms = self.latest_ms.max(at);
        match cmd {
            Command::Create { req, reply: tx } => {
                g.bytes += req.initial.len();
                let r = self.create(req, g);
                g.effects.push(reply(tx, r));
            }
            Command::Append { req, reply: tx } => {
                g.bytes += req.data.len();
                self.stage_append(req, tx, g);
            }
            Command::Delete { path, req, now_ms, reply: tx } => {
                self.drop_if_expired(&path, now_ms, g);
                let r = self.delete(&path, &req, g);
                self.count_streams();
                g.effects.push(reply(tx, r));
            }
            Command::Trim { path, to, now_ms, reply: tx } => {
                self.drop_if_expired(&path, now_ms, g);
                let r = self.trim(&path, to, g);
                g.effects.push(reply(tx, r));
            }
            Command::Expire { paths, now_ms, reply: tx } => {
                let before = self.streams.len();
                for p in &paths {
                    self.drop_if_expired(p, now_ms, g);
                }
                self.count_streams();
                g.effects.push(reply(tx, Ok(before - self.streams.len())));
            }
            Command::Retain { now_ms, reply: tx } => {
                let done = self.retain(now_ms, g);
                g.effects.push(reply(tx, Ok(done)));
            }
            Command::Compact { req, reply: tx } => {
                g.bytes += req.pieces.iter().map(Bytes::len).sum::<usize>();
                self.drop_if_expired(&req.path, req.now_ms, g);
                let r = self.compact(req, g);
                g.effects.push(reply(tx, r));
            }
            Command::Transact { txn, reply: tx } => {
                g.bytes += txn.appends.iter().map(|a| a.data.len()).sum::<usize>();
                let r = self.transact(txn, g);
                g.effects.push(reply(tx, r));
            }
            Command::Prune { now_ms, reply } => {
                let _ = reply.send(self.prune_writers(now_ms));
            }
            Command::MetaScan { prefix, reply: tx } => {
                let found = self
                    .meta
                    .range(prefix.clone()..)
                    .take_while(|(k, _)| k.starts_with(&prefix))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                g.effects.push(reply(tx, Ok(found)));
            }
            Command::Shipped => {}
        }
    }

    /// Counts every stream that exists, detached ones included (as [`EngineStats::streams`] says).
    fn count_streams(&self) {
        self.counters.streams.store((self.streams.len() + self.detached.len()) as u64, Ordering::Relaxed);
    }

    /// Detached streams (tests: the simulation checks that their removal is durable too).
    #[cfg(test)]
    pub fn detached_count(&self) -> usize {
        self.detached.len()
    }
}
