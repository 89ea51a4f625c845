//! Online backup: a copy of a data directory while a server writes to it, that opens as the
//! state of some moment (`oncelog backup --data-dir SRC --to DIR`).
//!
//! Why it works without stopping or asking the server (see the format's invariants):
//! - segments are append-only and only the last one is written; a frame becomes visible to
//!   readers after every frame before it (one `pwrite` per frame, in order);
//! - the checkpoint is replaced whole (rename), and segments are deleted only *after* a newer
//!   checkpoint no longer needs them;
//! - recovery cuts a torn tail of the last segment.
//!
//! So: read the checkpoint (its bytes, once), then copy every segment it needs, oldest first, the
//! last one up to the length it has when it is copied. The copy is the log as of the moment the
//! last segment was read: every frame written before the backup started is in it; a frame being
//! written then may be cut (its tail is torn: recovery drops it). If a needed segment vanished
//! meanwhile (the server installed a newer checkpoint and deleted it), the copy starts over.
//!
//! The copy may hold frames that were written but not yet synced by the server: a state no
//! worse than what a power cut at that moment could have kept. Every file and directory of the
//! copy is synced before the backup reports success.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use crate::error::LogError;
use crate::format::{self, Checkpoint, CHECKPOINT, LOG_DIR};

/// How many times a backup starts over because the server deleted a segment under it.
const ATTEMPTS: usize = 10;

/// What a backup copied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupReport {
    /// Whether a checkpoint was copied (recovery replays only what follows it).
    pub checkpoint: bool,
    /// Segment numbers copied, oldest first.
    pub segments: Vec<u64>,
    /// Bytes copied in all.
    pub bytes: u64,
    /// Times the copy started over.
    pub restarts: usize,
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> LogError {
    let what = what.into();
    move |source| LogError::Io { what, source }
}

/// Copies the log store in `src` to `dst`, which must not exist or be empty.
pub fn backup(src: &Path, dst: &Path) -> Result<BackupReport, LogError> {
    if !src.join(LOG_DIR).is_dir() {
        return Err(LogError::Corrupt(format!("{} holds no log (no {LOG_DIR}/ directory)", src.display())));
    }
    if dst.exists() && std::fs::read_dir(dst).map_err(io(format!("read {}", dst.display())))?.next().is_some() {
        return Err(LogError::Io {
            what: format!("back up into {}", dst.display()),
            source: std::io::Error::new(std::io::ErrorKind::AlreadyExists, "the target directory is not empty"),
        });
    }
    for restarts in 0..ATTEMPTS {
        if dst.exists() {
            std::fs::remove_dir_all(dst).map_err(io(format!("clear {}", dst.display())))?;
        }
        std::fs::create_dir_all(dst.join(LOG_DIR)).map_err(io(format!("create {}", dst.display())))?;
        if let Some(mut report) = attempt(src, dst)? {
            report.restarts = restarts;
            sync_dir(&dst.join(LOG_DIR))?;
            sync_dir(dst)?;
            return Ok(report);
        }
    }
    Err(LogError::Corrupt(format!("the segments of {} kept changing under the backup; try again", src.display())))
}

/// One pass; `None` when a segment vanished and the copy must start over.
fn attempt(src: &Path, dst: &Path) -> Result<Option<BackupReport>, LogError> {
    // The checkpoint first: the segments it needs exist until a newer one is installed.
    let checkpoint = match std::fs::read(src.join(CHECKPOINT)) {
        Ok(bytes) => Some(bytes),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(io("read the checkpoint")(e)),
    };
    // What the checkpoint needs: the segments its streams have data in, and every segment from
    // where its replay continues. (Its activity-time fallback is irrelevant here.)
    let (first, referenced) = match &checkpoint {
        Some(bytes) => {
            let cp = Checkpoint::decode(bytes, 0).map_err(|e| LogError::Corrupt(format!("checkpoint: {e}")))?;
            let referenced: BTreeSet<u64> =
                cp.streams.iter().flat_map(|s| s.extents.iter().map(|e| e.segment())).collect();
            (cp.segment, referenced)
        }
        None => (0, BTreeSet::new()),
    };
    let listed: BTreeSet<u64> = std::fs::read_dir(src.join(LOG_DIR))
        .map_err(io("list the segments"))?
        .filter_map(|e| e.ok().and_then(|e| e.file_name().to_str().and_then(format::parse_segment_name)))
        .collect();
    if !referenced.is_subset(&listed) {
        // Deleted after the checkpoint was read: a newer one replaced it. Start over. Unless
        // the checkpoint is still the same: then they are not here at all (only in a bucket).
        if checkpoint.is_some() && std::fs::read(src.join(CHECKPOINT)).ok() == checkpoint {
            return Err(LogError::SegmentsInTheBucket(referenced.difference(&listed).copied().collect()));
        }
        return Ok(None);
    }
    let numbers: Vec<u64> = listed.iter().copied().filter(|n| *n >= first || referenced.contains(n)).collect();
    let mut bytes = 0;
    for n in &numbers {
        let name = format::segment_name(*n);
        match copy_file(&src.join(&name), &dst.join(&name)) {
            Ok(len) => bytes += len,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io(format!("copy {name}"))(e)),
        }
    }
    if let Some(cp) = &checkpoint {
        write_synced(&dst.join(CHECKPOINT), cp).map_err(io("write the checkpoint copy"))?;
        bytes += cp.len() as u64;
    }
    Ok(Some(BackupReport { checkpoint: checkpoint.is_some(), segments: numbers, bytes, restarts: 0 }))
}

/// Copies what `from` holds now (its length at open) and syncs the copy.
fn copy_file(from: &PathBuf, to: &PathBuf) -> std::io::Result<u64> {
    let mut src = std::fs::File::open(from)?;
    let len = src.metadata()?.len();
    let mut out = std::fs::File::create(to)?;
    let copied = std::io::copy(&mut (&mut src).take(len), &mut out)?;
    out.sync_all()?;
    Ok(copied)
}

fn write_synced(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut f = std::fs::File::create(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

fn sync_dir(dir: &Path) -> Result<(), LogError> {
    std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io(format!("sync {}", dir.display())))
}
