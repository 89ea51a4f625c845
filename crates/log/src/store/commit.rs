//! The group commit: the frame being built with what to do once it is durable, one `pwrite` and
//! one `fdatasync` of it, segment rotation, then publishing to readers (index, hot tail, tails)
//! and answering.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use oncelog_protocol::Offset;
use oncelog_storage::*;
use tokio::sync::oneshot;

use crate::error::{backend, LogError};
use crate::format::{self, Extent, Record};
use crate::fs::{File, Fs};
use crate::options::Durability;

use super::mutant::is_on;
use super::view::StreamView;
use super::{io_err, Store};

/// A change to make visible, or an answer to send, once the group is durable.
pub(super) enum Effect {
    /// New data of `shared` ends at `end` and starts at payload offset `at` (`hot`: its bytes).
    Data {
        shared: Arc<StreamView>,
        end: u64,
        at: usize,
        hot: Bytes,
    },
    Publish {
        shared: Arc<StreamView>,
        tail: Offset,
        closed: bool,
    },
    Insert {
        shared: Arc<StreamView>,
    },
    /// `listed`: still at its path in the view (not detached from it).
    Remove {
        listed: bool,
        shared: Arc<StreamView>,
    },
    SoftDelete {
        shared: Arc<StreamView>,
    },
    /// The stream leaves its path (a purge): readers of the path find nothing from now on;
    /// forks keep reading it through their chains.
    Detach {
        shared: Arc<StreamView>,
    },
    Trim {
        shared: Arc<StreamView>,
        earliest: u64,
    },
    Reply(Box<dyn FnOnce(Option<StorageError>) + Send>),
}

/// Wraps a reply so that a failure of the whole group overrides the staged result.
pub(super) fn reply<T: Send + 'static, E: From<StorageError> + Send + 'static>(
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

impl Group {
    /// Answers every request of the group with `failure` now, leaving what it makes visible
    /// for [`Store::finish`] (a group whose acknowledgement waited too long for the bucket:
    /// its outcome is unknown to its writers, and it becomes visible once the bucket holds it).
    pub fn answer_now(&mut self, failure: &StorageError) {
        for e in std::mem::take(&mut self.effects) {
            match e {
                Effect::Reply(f) => f(Some(failure.clone())),
                other => self.effects.push(other),
            }
        }
    }
}

/// The frame being built and what to do once it is durable.
pub(crate) struct Group {
    /// Frame header space followed by the records.
    pub(super) frame: Vec<u8>,
    /// Tests only, under the mutants that split an atomic unit: records split off into a second
    /// frame.
    #[cfg(test)]
    split: Vec<u8>,
    pub(super) effects: Vec<Effect>,
    /// Data bytes staged, to bound a group.
    pub bytes: usize,
    /// The segment its frame went into, once committed (a group published later, after the
    /// bucket holds it, must not take a later segment's number).
    segment: Option<u64>,
}

impl Group {
    pub fn new() -> Self {
        Group {
            frame: vec![0; format::FRAME_HEADER],
            #[cfg(test)]
            split: vec![0; format::FRAME_HEADER],
            effects: Vec::new(),
            bytes: 0,
            segment: None,
        }
    }

    pub(super) fn record(&mut self, rec: &Record<'_>) -> usize {
        format::encode(rec, &mut self.frame)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.frame.len() == format::FRAME_HEADER
    }

    /// Tests only (the mutants that split an atomic unit): from now on records go to the other
    /// frame, until swapped back.
    pub(super) fn swap_split(&mut self) {
        #[cfg(test)]
        std::mem::swap(&mut self.frame, &mut self.split);
    }

    /// Tests only: `rec` into the second frame.
    pub(super) fn record_split(&mut self, rec: &Record<'_>) {
        #[cfg(test)]
        format::encode(rec, &mut self.split);
        #[cfg(not(test))]
        let _ = rec;
    }

    fn split_len(&self) -> usize {
        #[cfg(test)]
        return self.split.len() - format::FRAME_HEADER;
        #[cfg(not(test))]
        0
    }

    /// The second frame, when a mutant put records into it.
    fn take_split(&mut self) -> Option<Vec<u8>> {
        #[cfg(test)]
        if self.split.len() > format::FRAME_HEADER {
            return Some(std::mem::take(&mut self.split));
        }
        None
    }
}
/// Appends up to this size are copied into the hot tail (see [`Store::finish`]).
const SMALL_APPEND: usize = 4096;

/// Largest append kept in the hot tail: bigger ones are read from the page cache.
const MAX_HOT_APPEND: usize = 1 << 20;

impl Store {
    /// Writes the group's frame and syncs it: one `pwrite`, one `fdatasync`. Returns the failure
    /// that every reply of the group must carry instead of its staged result.
    pub fn commit(&mut self, g: &mut Group) -> Option<StorageError> {
        if self.poisoned() {
            return Some(StorageError::Poisoned);
        }
        if g.is_empty() {
            return None;
        }
        let started = Instant::now();
        let len = (g.frame.len() + g.split_len()) as u64;
        if self.active_len > format::SEGMENT_HEADER && self.active_len + len > self.cfg.segment_bytes {
            if let Err(e) = self.rotate() {
                return Some(self.stopped(e));
            }
        }
        if self.active_len + len >= format::MAX_SEGMENT_BYTES {
            return Some(self.fail(backend(LogError::FrameTooLarge)));
        }
        let pos = self.active_len;
        if let Err(e) = self.write_frame(&mut g.frame, started) {
            return Some(self.stopped(e));
        }
        if let Some(mut split) = g.take_split() {
            if let Err(e) = self.write_frame(&mut split, started) {
                return Some(self.stopped(e));
            }
        }
        g.segment = Some(self.active_no);
        // Data positions so far are relative to the frame; make them absolute file positions.
        let base = pos;
        for e in &mut g.effects {
            if let Effect::Data { at, .. } = e {
                *at += base as usize;
            }
        }
        None
    }

    /// Fail-stop after a write or sync of the log failed: the group's answer is
    /// [`LogError::WritesStopped`], a 503 (`fail` logs the cause and stops writes).
    fn stopped(&mut self, e: StorageError) -> StorageError {
        let e = self.fail(e);
        StorageError::Unavailable(std::sync::Arc::new(crate::error::LogError::WritesStopped(e)))
    }

    /// Seals and writes one frame at the end of the active segment, then syncs it.
    pub(super) fn write_frame(&mut self, frame: &mut [u8], started: Instant) -> Result<(), StorageError> {
        format::seal_frame(frame, self.lsn + 1);
        self.active.write_all_at(frame, self.active_len).map_err(|e| io_err("write to the log", e))?;
        let written_at = started.elapsed();
        #[cfg(any(test, feature = "failpoints"))]
        if self.cfg.failpoints.sync_should_fail() {
            return Err(io_err("fdatasync of the log", std::io::Error::other("injected fdatasync failure")));
        }
        if self.cfg.durability == Durability::Fsync && !is_on!(self.cfg, SkipSync) {
            self.active.sync_data().map_err(|e| io_err("fdatasync of the log", e))?;
        }
        metrics::histogram!("oncelog_fsync_seconds").record((started.elapsed() - written_at).as_secs_f64());
        self.active_len += frame.len() as u64;
        self.lsn += 1;
        self.since_checkpoint += frame.len() as u64;
        if let Ok(mut s) = self.view.synced.lock() {
            *s = super::view::Synced { lsn: self.lsn, segment: self.active_no, pos: self.active_len };
        }
        Ok(())
    }

    /// Starts a new segment: created, its header synced, and the directory synced before any
    /// frame goes into it, so a synced frame is never in a file the directory may lose.
    pub(super) fn rotate(&mut self) -> Result<(), StorageError> {
        let no = self.active_no + 1;
        if no > format::MAX_SEGMENT_NUMBER {
            return Err(backend(LogError::TooManySegments));
        }
        let file = new_segment(&*self.fs, no, self.cfg.segment_bytes, !is_on!(self.cfg, SkipDirSync))?;
        if let Ok(mut segs) = self.view.segments.write() {
            segs.insert(no, file.clone());
        }
        self.active = file;
        self.active_no = no;
        self.active_len = format::SEGMENT_HEADER;
        if let Ok(mut s) = self.view.synced.lock() {
            *s = super::view::Synced { lsn: self.lsn, segment: no, pos: format::SEGMENT_HEADER };
        }
        Ok(())
    }

    /// Publishes a committed group to readers and answers every command in it.
    ///
    /// A stream's new state is stored when its effect comes (before the replies staged after it,
    /// so an answered append is visible to any read that follows), but its waiting readers are
    /// woken only after every reply of the group: a commit that wakes thousands of live readers
    /// queues its writers' answers ahead of them, instead of behind them on the runtime, and a
    /// stream with several appends in the group wakes its readers once.
    pub fn finish(&mut self, g: Group, failure: Option<StorageError>) {
        let segment = g.segment.unwrap_or(self.active_no);
        let live_now = super::view::live_clock();
        let mut woken = Woken::default();
        for effect in g.effects {
            match effect {
                Effect::Reply(f) => f(failure.clone()),
                _ if failure.is_some() => {}
                Effect::Data { shared, end, at, hot } => {
                    let start = end - hot.len() as u64;
                    let keep_hot = self.cfg.hot_bytes > 0
                        && hot.len() <= MAX_HOT_APPEND.min(self.cfg.hot_bytes)
                        && shared.read_live(live_now);
                    // A small append usually shares its buffer with the connection that read it;
                    // its own copy keeps the hot tail from pinning that buffer.
                    let hot = if hot.len() <= SMALL_APPEND { Bytes::copy_from_slice(&hot) } else { hot };
                    if let Ok(mut d) = shared.data.write() {
                        // Most streams hold few appends: start with room for exactly one.
                        if d.extents.capacity() == 0 {
                            d.extents.reserve_exact(1);
                        }
                        d.extents.push(Extent::new(end, segment, at as u64));
                        if keep_hot {
                            d.hot.push(start, hot.clone());
                        }
                    }
                    if keep_hot {
                        self.hot_bytes += hot.len();
                        self.hot_queue.push_back((Arc::downgrade(&shared), start, hot.len()));
                        self.evict_hot();
                        self.counters.hot_bytes.store(self.hot_bytes as u64, Ordering::Relaxed);
                    }
                }
                Effect::Publish { shared, tail, closed } => {
                    shared.state.update(|p| {
                        p.tail = tail;
                        p.closed = closed;
                    });
                    woken.add(shared);
                }
                Effect::Insert { shared } => {
                    if let Ok(mut map) = self.view.streams.write() {
                        map.insert(shared);
                    }
                }
                Effect::SoftDelete { shared } => {
                    shared.state.update(|p| p.soft_deleted = true);
                    woken.add(shared);
                }
                Effect::Trim { shared, earliest } => {
                    shared.earliest.fetch_max(earliest, Ordering::AcqRel);
                }
                Effect::Remove { listed, shared } => {
                    if listed {
                        self.unlist(&shared);
                    }
                    shared.state.update(|p| p.deleted = true);
                    woken.add(shared);
                }
                Effect::Detach { shared } => {
                    self.unlist(&shared);
                    // Its waiters end as the path now answers (404); forks wait on their own
                    // state and read this one's index through their chains, which nothing here
                    // changes.
                    shared.state.update(|p| {
                        p.soft_deleted = true;
                        p.deleted = true;
                    });
                    woken.add(shared);
                }
            }
        }
        woken.wake();
    }

    /// Takes `shared` off its path in the readers' map, unless the path already names another
    /// stream (a create in the same group).
    fn unlist(&self, shared: &Arc<StreamView>) {
        if let Ok(mut map) = self.view.streams.write() {
            if map.get(&shared.path).is_some_and(|s| Arc::ptr_eq(s, shared)) {
                map.remove(&shared.path);
            }
        }
    }

    /// Drops the oldest hot-tail entries until the store-wide budget holds.
    pub(super) fn evict_hot(&mut self) {
        while self.hot_bytes > self.cfg.hot_bytes {
            let Some((weak, start, len)) = self.hot_queue.pop_front() else { return };
            self.hot_bytes -= len;
            if let Some(shared) = weak.upgrade() {
                if let Ok(mut d) = shared.data.write() {
                    d.hot.pop_oldest(start);
                }
            }
        }
    }
}

/// Creates segment `no` with its header and its space (`bytes`) allocated, synced, and syncs the
/// directory. Allocated space reads as zeros (the format's clean end of a segment); a frame
/// written into it changes no file size, so its `fdatasync` flushes data and no size
/// (measured here: 167-181 µs per 1 KiB `pwrite` + `fdatasync` against 232-235 µs growing the
/// file, docs/BENCHMARKS.md).
pub(super) fn new_segment(fs: &dyn Fs, no: u64, bytes: u64, sync_dir: bool) -> Result<Arc<dyn File>, StorageError> {
    let name = format::segment_name(no);
    let file = fs.open(&name, true).map_err(|e| io_err("create a log segment", e))?;
    file.set_len(0).map_err(|e| io_err("create a log segment", e))?;
    file.write_all_at(&format::segment_header(no), 0).map_err(|e| io_err("write a segment header", e))?;
    file.allocate(bytes.max(format::SEGMENT_HEADER)).map_err(|e| io_err("allocate a log segment", e))?;
    file.sync_data().map_err(|e| io_err("sync a segment header", e))?;
    if sync_dir {
        fs.sync_dir(format::LOG_DIR).map_err(|e| io_err("sync the log directory", e))?;
    }
    Ok(file)
}

/// The streams whose readers a group wakes, each once, after its replies.
#[derive(Default)]
struct Woken(Vec<Arc<StreamView>>);

impl Woken {
    fn add(&mut self, shared: Arc<StreamView>) {
        self.0.push(shared);
    }

    fn wake(mut self) {
        self.0.sort_unstable_by_key(Arc::as_ptr);
        self.0.dedup_by(|a, b| Arc::ptr_eq(a, b));
        for s in self.0 {
            s.state.wake();
        }
    }
}
