//! Reads: from the hot tail when the bytes are there (shared `Bytes`, no copy), else from the
//! segment files with positional reads — one `pread` for a run of appends that lie close
//! together in a segment (a stream written steadily has its appends a few header bytes apart).

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use bytes::{Bytes, BytesMut};
use oncelog_protocol::Offset;
use oncelog_storage::machine::chain;
use oncelog_storage::StorageError;

use super::view::StreamView;
use crate::error::{backend, LogError};
use crate::fs::File;

/// Appends this close together in one segment are read with one `pread` (the gap holds the
/// next record's header).
const COALESCE_GAP: u64 = 4096;
/// Appends at least this large get a `pread` of their own into the answer; only smaller ones are
/// read in runs (through a scratch buffer, to drop the record headers between them).
const LARGE_PIECE: usize = 64 * 1024;

/// Most pieces a read may have and still be sliced on the async thread ([`Plan::maps_without_io`]).
const INLINE_PIECES: usize = 32;

/// One piece of a read, before it is materialised.
enum Piece {
    Mem(Bytes),
    Disk { segment: u64, pos: u64, len: usize },
}

/// Which stored bytes of a stream a read returns, from `from` through a fork's ancestors and
/// then its own data, up to `tail` (published, so durable) and about `max_bytes` (whole appends,
/// except where a fork point cuts one), and where each piece is; also whether `from` starts an
/// append or a fork segment. Decided under the stream's index lock, without I/O.
pub(crate) struct Plan {
    pieces: Vec<Piece>,
    total: usize,
    next: Offset,
    aligned: bool,
}

/// `bounded`: `max_bytes` is a hard limit, and the last append may be cut to meet it.
pub(crate) fn plan(
    shared: &Arc<StreamView>,
    from: u64,
    tail: u64,
    max_bytes: usize,
    bounded: bool,
) -> Result<Plan, StorageError> {
    let mut pieces = Vec::new();
    let mut r = chain::ReadCursor::new(&shared.chain, from, max_bytes, bounded);
    for part in chain::parts(&shared.chain, shared, from, tail) {
        let d = part.source.data.read().map_err(|_| StorageError::Poisoned)?;
        if r.pos() < d.start {
            // Below what the index retains (trimmed, and no fork pins it): never guess bytes.
            return Err(backend(LogError::Corrupt(format!(
                "read at {} below the retained index (from {})",
                r.pos(),
                d.start
            ))));
        }
        let mut i = d.extents.partition_point(|e| e.end <= r.pos());
        while i < d.extents.len() && r.wants(part.end) {
            let e = d.extents[i];
            let start = if i == 0 { d.start } else { d.extents[i - 1].end };
            let range = r
                .take(start, e.end, part.end)
                .map_err(|_| backend(LogError::Corrupt(format!("read at {}: the index has a gap", r.pos()))))?;
            match d.hot.get(start) {
                Some(b) => pieces.push(Piece::Mem(b.slice(range))),
                None => pieces.push(Piece::Disk {
                    segment: e.segment(),
                    pos: e.pos() + range.start as u64,
                    len: range.len(),
                }),
            }
            i += 1;
        }
        if r.full() {
            break;
        }
    }
    Ok(Plan { pieces, total: r.total(), next: Offset(r.pos()), aligned: r.aligned() })
}

impl Plan {
    /// Whether every byte is in the hot tail (no file to read: no need to leave the runtime).
    pub fn in_memory(&self) -> bool {
        self.pieces.iter().all(|p| matches!(p, Piece::Mem(_)))
    }

    /// Whether [`Plan::pieces`] answers at once, so the read may stay on the async thread: few
    /// pieces (at most [`INLINE_PIECES`]), every disk piece in a segment whose file maps without
    /// reading (the bytes are read when a socket sends them). A read of many small appends
    /// still leaves: slicing hundreds of them costs more than the hand-off, and on the blocking
    /// pool it runs beside the socket's writes (A/B in BENCHMARKS.md).
    pub fn maps_without_io(&self, segments: &RwLock<BTreeMap<u64, Arc<dyn File>>>) -> bool {
        if self.pieces.len() > INLINE_PIECES {
            return false;
        }
        let Ok(files) = segments.read() else { return false };
        self.pieces.iter().all(|p| match p {
            Piece::Mem(_) => true,
            Piece::Disk { segment, .. } => files.get(segment).is_some_and(|f| f.maps_without_io()),
        })
    }

    /// The bytes and whether the read began where the engine minted an offset: one shared
    /// piece as is, otherwise gathered into one buffer (files read here).
    pub fn bytes(
        self,
        segments: &RwLock<BTreeMap<u64, Arc<dyn File>>>,
    ) -> Result<((Bytes, bool), Offset), StorageError> {
        if let [Piece::Mem(b)] = self.pieces.as_slice() {
            return Ok(((b.clone(), self.aligned), self.next));
        }
        Ok(((materialise(&self.pieces, self.total, segments)?, self.aligned), self.next))
    }

    /// The bytes as consecutive pieces, for a caller that sends them on as they are: each run of
    /// appends in a segment is a slice of the segment's mapping per append, no copy. A plain
    /// socket sends large slices ([`oncelog_storage::file_bytes::LOOKUP_MIN`] or more) with `sendfile(2)` and
    /// gathers small ones into vectored writes straight from the mapping (one copy, into the
    /// socket), where reading them first would copy them twice. Where the file gives no mapping
    /// (the simulated disk, a cold segment), the run is read into one buffer.
    pub fn pieces(self, segments: &RwLock<BTreeMap<u64, Arc<dyn File>>>) -> Result<(Vec<Bytes>, Offset), StorageError> {
        if !self.pieces.iter().any(|p| matches!(p, Piece::Disk { .. })) {
            let ((b, _), next) = self.bytes(segments)?;
            return Ok((vec![b], next));
        }
        let mut out = Vec::with_capacity(self.pieces.len());
        let pieces = &self.pieces;
        let mut i = 0;
        while i < pieces.len() {
            match &pieces[i] {
                Piece::Mem(b) => {
                    out.push(b.clone());
                    i += 1;
                }
                Piece::Disk { segment, pos, .. } => {
                    let (j, end) = run_end(pieces, i, false);
                    let span = (end - pos) as usize;
                    match segment_file(segments, *segment)?.map_range(*pos, span).map_err(io)? {
                        Some(map) => {
                            for p in &pieces[i..j] {
                                if let Piece::Disk { pos: p, len: l, .. } = p {
                                    let off = (p - pos) as usize;
                                    out.push(map.slice(off..off + l));
                                }
                            }
                        }
                        None => out.push(materialise(&pieces[i..j], disk_len(&pieces[i..j]), segments)?),
                    }
                    i = j;
                }
            }
        }
        Ok((out, self.next))
    }
}

fn io(e: std::io::Error) -> StorageError {
    backend(LogError::Io { what: "read from the log".into(), source: e })
}

/// The bytes the disk pieces among `pieces` hold.
fn disk_len(pieces: &[Piece]) -> usize {
    pieces.iter().map(|p| if let Piece::Disk { len, .. } = p { *len } else { 0 }).sum()
}

fn segment_file(segments: &RwLock<BTreeMap<u64, Arc<dyn File>>>, segment: u64) -> Result<Arc<dyn File>, StorageError> {
    segments
        .read()
        .map_err(|_| StorageError::Poisoned)?
        .get(&segment)
        .cloned()
        .ok_or_else(|| backend(LogError::MissingSegment(segment)))
}

/// The end of the run of disk pieces from `pieces[i]`: pieces of the same segment, each
/// starting at most [`COALESCE_GAP`] after the last ends; with `split_large`, a piece of
/// [`LARGE_PIECE`] or more runs alone. Returns the index after the run and the run's end.
fn run_end(pieces: &[Piece], i: usize, split_large: bool) -> (usize, u64) {
    let Piece::Disk { segment, pos, len } = &pieces[i] else { return (i + 1, 0) };
    let mut j = i + 1;
    let mut end = pos + *len as u64;
    while let Some(Piece::Disk { segment: s, pos: p, len: l }) = pieces.get(j) {
        let large = *len >= LARGE_PIECE || *l >= LARGE_PIECE;
        if s != segment || *p < end || *p - end > COALESCE_GAP || (split_large && large) {
            break;
        }
        end = p + *l as u64;
        j += 1;
    }
    (j, end)
}

/// The pieces' bytes as one `Bytes`. A lone disk piece of at least [`crate::fs::MAP_MIN`] is a
/// mapping of its own (`File::map_alone`: no copy into a buffer of ours, and the pages the
/// server touches leave with the answer); otherwise the disk pieces are read with `pread`, a run
/// of small ones at once.
fn materialise(
    pieces: &[Piece],
    total: usize,
    segments: &RwLock<BTreeMap<u64, Arc<dyn File>>>,
) -> Result<Bytes, StorageError> {
    if let [Piece::Disk { segment, pos, len }] = pieces {
        if let Some(b) = segment_file(segments, *segment)?.map_alone(*pos, *len).map_err(io)? {
            return Ok(b);
        }
    }
    let mut out = BytesMut::with_capacity(total);
    let mut scratch = Vec::new();
    let mut i = 0;
    while i < pieces.len() {
        match &pieces[i] {
            Piece::Mem(b) => {
                out.extend_from_slice(b);
                i += 1;
            }
            Piece::Disk { segment, pos, len } => {
                let file = segment_file(segments, *segment)?;
                // A run of disk pieces in the same segment, each starting shortly after the last.
                // Large pieces are read straight into the answer: one copy, not two.
                let (j, end) = run_end(pieces, i, true);
                if j == i + 1 {
                    let at = out.len();
                    out.resize(at + len, 0);
                    file.read_exact_at(&mut out[at..], *pos).map_err(io)?;
                } else {
                    scratch.resize((end - pos) as usize, 0);
                    file.read_exact_at(&mut scratch, *pos).map_err(io)?;
                    for p in &pieces[i..j] {
                        if let Piece::Disk { pos: p, len: l, .. } = p {
                            let off = (p - pos) as usize;
                            out.extend_from_slice(&scratch[off..off + l]);
                        }
                    }
                }
                i = j;
            }
        }
    }
    Ok(out.freeze())
}

/// The append of `shared` that starts exactly at `at`, if any: its stored bytes, cut at the
/// fork segment boundary it lies in. Used to resolve fork sub-offsets.
pub(crate) fn append_at(
    shared: &Arc<StreamView>,
    segments: &RwLock<BTreeMap<u64, Arc<dyn File>>>,
    at: u64,
    tail: u64,
) -> Result<Option<Bytes>, StorageError> {
    let Some(part) = chain::part_at(&shared.chain, shared, at, tail) else { return Ok(None) };
    let d = part.source.data.read().map_err(|_| StorageError::Poisoned)?;
    let i = d.extents.partition_point(|e| e.end <= at);
    let Some(e) = d.extents.get(i).copied() else { return Ok(None) };
    let start = if i == 0 { d.start } else { d.extents[i - 1].end };
    let Some(range) = chain::append_at(start, e.end, at, part.end) else { return Ok(None) };
    drop(d);
    let piece = [Piece::Disk { segment: e.segment(), pos: e.pos(), len: range.len() }];
    materialise(&piece, range.len(), segments).map(Some)
}
