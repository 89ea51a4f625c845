//! What readers share with the writer, per stream and store-wide: the published state (only
//! durable effects reach it), the index of appends with the hot tail, and the counters.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Instant;

use bytes::Bytes;
use oncelog_protocol::Offset;
use oncelog_storage::machine::chain::Segment;
use oncelog_storage::*;
use tokio::sync::Notify;

use super::path_table::{Named, PathTable};
use crate::format::Extent;
use crate::fs::File;

/// The published, reader-visible state of a stream: only durable effects reach it. Kept packed
/// in one `AtomicU64` ([`PublishedCell`]): offsets stay below 2^54.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Published {
    pub tail: Offset,
    pub closed: bool,
    /// Fully removed: waiters end with 404.
    pub deleted: bool,
    /// Deleted by its owner while forks still read it: 410 on its path.
    pub soft_deleted: bool,
}

const CLOSED: u64 = 1 << 63;
const DELETED: u64 = 1 << 62;
const SOFT_DELETED: u64 = 1 << 61;
const TAIL_MASK: u64 = (1 << 61) - 1;

/// [`Published`] in one word, with a [`Notify`] that wakes live readers when it changes: per
/// stream about 40 bytes, where a `tokio::sync::watch` channel took several hundred (it matters
/// at a million streams).
pub(crate) struct PublishedCell {
    word: AtomicU64,
    changed: Notify,
}

impl PublishedCell {
    fn new(p: Published) -> Self {
        PublishedCell { word: AtomicU64::new(Self::pack(p)), changed: Notify::new() }
    }

    fn pack(p: Published) -> u64 {
        (p.tail.0 & TAIL_MASK)
            | if p.closed { CLOSED } else { 0 }
            | if p.deleted { DELETED } else { 0 }
            | if p.soft_deleted { SOFT_DELETED } else { 0 }
    }

    pub fn get(&self) -> Published {
        let w = self.word.load(Ordering::Acquire);
        Published {
            tail: Offset(w & TAIL_MASK),
            closed: w & CLOSED != 0,
            deleted: w & DELETED != 0,
            soft_deleted: w & SOFT_DELETED != 0,
        }
    }

    /// Changes the state (writer only) without waking the waiting readers yet: a reader that
    /// looks sees it at once; [`PublishedCell::wake`] wakes the waiters.
    pub(super) fn update(&self, f: impl FnOnce(&mut Published)) {
        let mut p = self.get();
        f(&mut p);
        self.word.store(Self::pack(p), Ordering::Release);
    }

    /// Wakes every reader waiting for a change.
    pub(super) fn wake(&self) {
        self.changed.notify_waiters();
    }

    /// Waits until the state is not `seen` any more, or `deadline`. Returns the state then.
    pub async fn changed_from(&self, seen: Published, deadline: tokio::time::Instant) -> Published {
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            // Registered before the state is read again, so a change in between is not missed.
            notified.as_mut().enable();
            let now = self.get();
            if now != seen {
                return now;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.get();
            }
        }
    }
}

/// Where a stream's bytes are, for readers. Appended to after each durable commit, before the
/// new tail is published, so a reader that saw a tail finds every byte below it here.
pub(crate) struct StreamData {
    /// Where the stream's own data begins: 0, or a fork's fork point.
    pub start: u64,
    /// One per append, in offset order.
    pub extents: Vec<Extent>,
    /// The newest appends' bytes, shared with every live reader: N readers of a stream cost no
    /// storage read and no copy. Bounded by the store-wide hot budget.
    pub hot: HotTail,
}

/// A stream's hot tail: (start offset, bytes) of its newest appends, oldest first. Absent until
/// the stream is first read live: most of a million streams never are, and an empty deque in
/// place cost each of them 32 bytes.
// Boxed on purpose: the box is one pointer where the deque in place is four words.
#[allow(clippy::box_collection)]
#[derive(Default)]
pub(crate) struct HotTail(Option<Box<VecDeque<(u64, Bytes)>>>);

impl HotTail {
    /// The bytes of the append that starts at `start`, when they are still here.
    pub fn get(&self, start: u64) -> Option<&Bytes> {
        let q = self.0.as_deref()?;
        q.binary_search_by_key(&start, |(s, _)| *s).ok().map(|k| &q[k].1)
    }

    /// Keeps the bytes of the append that starts at `start` (after every append kept before).
    pub fn push(&mut self, start: u64, bytes: Bytes) {
        // Most streams hold few appends: room for exactly one at first.
        self.0.get_or_insert_with(|| Box::new(VecDeque::with_capacity(1))).push_back((start, bytes));
    }

    /// Drops the oldest append when it is the one that starts at `start` (the store-wide budget
    /// evicts in the order appends were kept).
    pub fn pop_oldest(&mut self, start: u64) {
        if let Some(q) = self.0.as_deref_mut() {
            if q.front().is_some_and(|(s, _)| *s == start) {
                q.pop_front();
            }
        }
    }
}

/// Per-stream entry shared by readers.
pub(crate) struct StreamView {
    pub id: u64,
    /// Where the stream is listed (its key in the path tables). A detached stream is listed
    /// nowhere: it keeps the path it had, or none after a restart (checkpoints keep no path for
    /// it); either way no table is searched for it by path.
    pub path: Arc<str>,
    /// The same allocation as the writer's [`StreamMeta::config`].
    pub config: Arc<StreamConfig>,
    /// For a fork: each ancestor's byte range it reads, oldest first
    /// ([`oncelog_storage::machine::chain`]). Holding the ancestors keeps their index alive
    /// exactly as long as a fork reads it.
    pub chain: Box<[Segment<Arc<StreamView>>]>,
    /// Forks of this stream that still exist (a stream with forks is soft-deleted, not removed).
    pub forks: AtomicUsize,
    /// Tail and closure, published after each durable commit; live readers wait on it.
    pub state: PublishedCell,
    /// Last read or write (Unix ms), for the sliding TTL. Memory only: a read never writes.
    pub last_access_ms: AtomicI64,
    /// Where reads may start (raised by a trim once it is durable).
    pub earliest: AtomicU64,
    /// When a reader last waited at or reached the tail ([`live_clock`] seconds, 0 = never):
    /// only a stream read live keeps its new appends in the hot tail, so memory follows the
    /// readers rather than the writers (64 producers with no reader keep none).
    pub live_at: AtomicU32,
    pub data: RwLock<StreamData>,
}

/// How long a stream counts as read live after its last live read: longer than the gap between
/// a long-poll answer and the next request, or between an SSE reader's waits.
const LIVE_WINDOW_SECS: u32 = 30;

/// Seconds since the process started, plus one (so 0 can mean "never"); monotonic.
pub(crate) fn live_clock() -> u32 {
    static START: OnceLock<Instant> = OnceLock::new();
    let secs = START.get_or_init(Instant::now).elapsed().as_secs();
    u32::try_from(secs).unwrap_or(u32::MAX - 1) + 1
}

impl Named for Arc<StreamView> {
    fn path(&self) -> &Arc<str> {
        &self.path
    }
}

impl StreamView {
    pub fn info(&self) -> StreamInfo {
        let p = self.state.get();
        StreamInfo {
            id: self.id,
            config: self.config.clone(),
            tail: p.tail,
            closed: p.closed,
            earliest: Offset(self.earliest.load(Ordering::Acquire)),
        }
    }

    pub fn touch(&self, now_ms: i64) {
        self.last_access_ms.fetch_max(now_ms, Ordering::Relaxed);
    }

    pub fn expired(&self, now_ms: i64) -> bool {
        rules::expired(self.config.expiry, self.last_access_ms.load(Ordering::Relaxed), now_ms)
    }

    /// A reader is at the live edge: new appends are kept in the hot tail for a while.
    pub fn mark_live(&self) {
        let now = live_clock();
        // A store only when the second changed: many readers of one stream share the line.
        if self.live_at.load(Ordering::Relaxed) != now {
            self.live_at.store(now, Ordering::Relaxed);
        }
    }

    /// Whether a reader was at the live edge within the window before `now` ([`live_clock`],
    /// read once per group by the writer rather than once per append).
    pub fn read_live(&self, now: u32) -> bool {
        let at = self.live_at.load(Ordering::Relaxed);
        at != 0 && now.saturating_sub(at) <= LIVE_WINDOW_SECS
    }

    pub fn forks(&self) -> usize {
        self.forks.load(Ordering::Relaxed)
    }
}

/// Reader-visible state of the whole store, shared by the writer, the readers and the
/// checkpointer.
#[derive(Default)]
pub(crate) struct View {
    pub streams: RwLock<PathTable<Arc<StreamView>>>,
    /// Every segment file still on disk, open once (no descriptor per stream).
    pub segments: RwLock<std::collections::BTreeMap<u64, Arc<dyn File>>>,
    /// Where the log is written (and, with `Durability::Fsync`, synced) to: what the shipper to
    /// a bucket may send. Set by recovery and after each frame.
    pub synced: Mutex<Synced>,
}

/// A position in the log: after frame `lsn`, which ends at byte `pos` of segment `segment`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Synced {
    pub lsn: u64,
    pub segment: u64,
    pub pos: u64,
}

/// Shared between the writer, the checkpointer and the engine handle.
#[derive(Default)]
pub(crate) struct Counters {
    pub streams: AtomicU64,
    pub producers: AtomicU64,
    /// Producer appends that waited for their predecessors (the parking lot counts them).
    pub parked: Arc<AtomicU64>,
    /// Bytes in the hot tail, as of the last group.
    pub hot_bytes: AtomicU64,
    /// Why writes stopped, once they have (set by the writer or by background work).
    pub failure: Mutex<Option<String>>,
    /// With a bucket: the last LSN a published cut holds (0 before the first publish).
    pub shipped_lsn: AtomicU64,
}

impl Counters {
    pub fn fail(&self, why: String) {
        if let Ok(mut slot) = self.failure.lock() {
            slot.get_or_insert(why);
        }
    }

    pub fn failed(&self) -> bool {
        self.failure.lock().map_or(true, |s| s.is_some())
    }
}

pub(super) fn new_shared(
    meta: &StreamMeta,
    path: Arc<str>,
    tail: Offset,
    chain: Vec<Segment<Arc<StreamView>>>,
    forks: usize,
    now_ms: i64,
    data: StreamData,
) -> Arc<StreamView> {
    let state =
        PublishedCell::new(Published { tail, closed: meta.closed, deleted: false, soft_deleted: meta.soft_deleted });
    Arc::new(StreamView {
        id: meta.id,
        path,
        config: meta.config.clone(),
        chain: chain.into_boxed_slice(),
        forks: AtomicUsize::new(forks),
        state,
        last_access_ms: AtomicI64::new(now_ms),
        earliest: AtomicU64::new(meta.earliest.0),
        live_at: AtomicU32::new(0),
        data: RwLock::new(data),
    })
}
