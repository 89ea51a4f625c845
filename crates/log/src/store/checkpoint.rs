//! Checkpoints: a consistent snapshot of the writer's state, written on their own thread, and
//! what is dropped just before one (index entries no reader can reach, orphans).

use std::collections::HashMap;

use oncelog_storage::*;

use crate::format::{self, Checkpoint, CheckpointStream, Extent};
use crate::fs::Fs;

use super::commit::Group;
use super::view::View;
use super::{io_err, Store};

impl Store {
    /// Drops the index entries no reader can reach any more: those wholly below a stream's
    /// earliest offset, unless a fork still reads them (a fork pins what it references from its
    /// earliest offset on). The next checkpoint then no longer lists them, and segments nothing
    /// listed lives in are deleted after it: the space of trimmed data comes back. Called before
    /// each checkpoint. Returns the number of entries dropped.
    pub fn prune_index(&mut self) -> usize {
        // Each stream's floor: its own earliest offset, lowered by the forks that read it
        // (detached streams are read by forks only, and may be forks themselves).
        let all = || self.streams.values().chain(self.detached.values());
        let mut floor: HashMap<u64, u64> = all().map(|w| (w.st.meta.id, w.st.meta.earliest.0)).collect();
        for w in all() {
            let reads_from = w.st.meta.earliest.0;
            let mut lo = 0;
            for seg in &w.shared.chain {
                if reads_from < seg.end {
                    let pin = lo.max(reads_from);
                    floor.entry(seg.source.id).and_modify(|f| *f = (*f).min(pin));
                }
                lo = seg.end;
            }
        }
        let mut dropped = 0;
        for w in all() {
            let f = floor.get(&w.st.meta.id).copied().unwrap_or(0);
            if f == 0 {
                continue;
            }
            let Ok(mut d) = w.shared.data.write() else { continue };
            let n = d.extents.partition_point(|x| x.end <= f);
            if n > 0 {
                d.start = d.extents[n - 1].end;
                d.extents.drain(..n);
                dropped += n;
            }
        }
        dropped
    }

    /// A consistent snapshot of the state as of the last committed frame (call between groups).
    pub fn snapshot(&self) -> Checkpoint {
        let at_paths = self.streams.iter().map(|(path, w)| (Some(path.to_string()), w));
        let streams = at_paths
            .chain(self.detached.values().map(|w| (None, w)))
            .map(|(path, w)| {
                let (start, extents) = w.shared.data.read().map(|d| (d.start, d.extents.clone())).unwrap_or_default();
                CheckpointStream {
                    path,
                    meta: w.st.meta.clone(),
                    tail: w.st.tail.0,
                    start,
                    producers: w.st.producers.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
                    extents,
                    keys: w.st.keys.iter().flat_map(|m| m.iter().map(|(k, e)| (*k, *e))).collect(),
                    marks: w.st.marks.clone(),
                }
            })
            .collect();
        let meta = self.meta.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        Checkpoint {
            lsn: self.lsn,
            segment: self.active_no,
            pos: self.active_len,
            next_id: self.next_id,
            streams,
            meta,
        }
    }

    /// Removes soft-deleted streams (detached ones included) no fork references any more
    /// (cannot normally happen: a fork's removal takes its source along in the same frame).
    pub fn collect_orphans(&mut self) {
        let orphan = |w: &super::WStream| w.st.meta.soft_deleted && w.shared.forks() == 0;
        let at_paths: Vec<std::sync::Arc<str>> =
            self.streams.iter().filter(|(_, w)| orphan(w)).map(|(p, _)| p.clone()).collect();
        let detached: Vec<u64> = self.detached.values().filter(|w| orphan(w)).map(|w| w.st.meta.id).collect();
        if at_paths.is_empty() && detached.is_empty() {
            return;
        }
        let mut g = Group::new();
        for path in at_paths {
            self.remove(&path, &mut g);
        }
        for id in detached {
            self.remove_detached(id, &mut g);
        }
        self.count_streams();
        let failure = self.commit(&mut g);
        self.finish(g, failure);
    }
}

// ---------------------------------------------------------------------------------------------
// Checkpoints

/// Writes `cp` atomically (temporary file, sync, rename, directory sync), then deletes every
/// segment before the checkpoint's that no stream's data lies in any more.
pub(crate) fn write_checkpoint(fs: &dyn Fs, view: &View, cp: &Checkpoint) -> Result<usize, StorageError> {
    let written = write_checkpoint_keeping(fs, view, cp)?;
    remove_segments(fs, view, &written.dead)?;
    Ok(written.dead.len())
}

/// A checkpoint written and installed, and what it made unnecessary.
pub(crate) struct Written {
    /// Its stored form (what a bucket gets).
    pub bytes: Vec<u8>,
    /// The segments nothing after it needs any more (not removed yet).
    pub dead: Vec<u64>,
}

/// Removes the segments `dead` from the readers' view and from disk.
pub(crate) fn remove_segments(fs: &dyn Fs, view: &View, dead: &[u64]) -> Result<(), StorageError> {
    for n in dead {
        // Readers that already hold the file keep reading it; the space returns when they finish.
        if let Ok(mut segs) = view.segments.write() {
            segs.remove(n);
        }
        fs.remove(&format::segment_name(*n)).map_err(|e| io_err("remove a log segment", e))?;
    }
    Ok(())
}

/// Installs `bytes` as the checkpoint atomically: a temporary file, synced, renamed over the
/// checkpoint, the directory synced. (A checkpoint written here, or one restored from a bucket.)
pub(crate) fn install_checkpoint(fs: &dyn Fs, bytes: &[u8]) -> Result<(), StorageError> {
    // A leftover temporary file is unlinked, not truncated: a crash between a rename and its
    // directory sync may leave that name on the installed checkpoint's own inode.
    if fs.exists(format::CHECKPOINT_TMP).map_err(|e| io_err("inspect the data directory", e))? {
        fs.remove(format::CHECKPOINT_TMP).map_err(|e| io_err("remove a leftover checkpoint", e))?;
    }
    let tmp = fs.open(format::CHECKPOINT_TMP, true).map_err(|e| io_err("create the checkpoint", e))?;
    tmp.set_len(0).map_err(|e| io_err("write the checkpoint", e))?;
    tmp.write_all_at(bytes, 0).map_err(|e| io_err("write the checkpoint", e))?;
    tmp.sync_data().map_err(|e| io_err("sync the checkpoint", e))?;
    fs.rename(format::CHECKPOINT_TMP, format::CHECKPOINT).map_err(|e| io_err("install the checkpoint", e))?;
    fs.sync_dir("").map_err(|e| io_err("sync the data directory", e))
}

/// The installed checkpoint's bytes (`None`: there is none).
pub(crate) fn read_checkpoint(fs: &dyn Fs) -> Result<Option<Vec<u8>>, StorageError> {
    if !fs.exists(format::CHECKPOINT).map_err(|e| io_err("inspect the data directory", e))? {
        return Ok(None);
    }
    let f = fs.open(format::CHECKPOINT, false).map_err(|e| io_err("open the checkpoint", e))?;
    let len = f.len().map_err(|e| io_err("read the checkpoint", e))?;
    let mut buf = vec![0u8; len as usize];
    f.read_exact_at(&mut buf, 0).map_err(|e| io_err("read the checkpoint", e))?;
    Ok(Some(buf))
}

/// [`write_checkpoint`] without removing the segments it made unnecessary: with a bucket, they
/// go once the bucket holds this checkpoint (until then the bucket's cut may need them).
pub(crate) fn write_checkpoint_keeping(fs: &dyn Fs, view: &View, cp: &Checkpoint) -> Result<Written, StorageError> {
    // Every frame the checkpoint covers must be on disk before the checkpoint is (with
    // `--fsync false` they may not be yet).
    let active = view.segments.read().map_err(|_| StorageError::Poisoned)?.get(&cp.segment).cloned();
    if let Some(f) = active {
        f.sync_data().map_err(|e| io_err("sync the log before a checkpoint", e))?;
    }
    let bytes = cp.encode();
    install_checkpoint(fs, &bytes)?;
    let live: std::collections::BTreeSet<u64> =
        cp.streams.iter().flat_map(|s| s.extents.iter().map(Extent::segment)).collect();
    let dead: Vec<u64> = match view.segments.read() {
        Ok(segs) => segs.keys().copied().filter(|n| *n < cp.segment && !live.contains(n)).collect(),
        Err(_) => return Err(StorageError::Poisoned),
    };
    Ok(Written { bytes, dead })
}
