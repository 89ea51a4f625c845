//! Compaction of State Protocol streams, for any engine: read the history from the earliest
//! offset, fold it into the state it materialises, and have the engine write that state's
//! snapshot at the tail and move the earliest offset there ([`Engine::compact`], one atomic
//! unit). Appends go on meanwhile: a compaction whose stream moved on between the fold and the
//! write is refused by the engine, and made again.
//!
//! Why at the tail, and not in place of the dropped history: offsets count stored bytes, so a
//! snapshot written *inside* the dropped range would need positions that readers may already
//! hold tokens for. At the tail every offset the stream ever minted keeps its meaning: below the
//! new earliest it is `410` (the reader restarts from the snapshot), at the tail it is where the
//! snapshot begins. A reader following the tail gets the snapshot as new messages, behind a
//! `reset` control message that tells it to drop the state it had.

use oncelog_protocol::state::{self, Materialized};
use oncelog_protocol::Offset;

use crate::engine::*;

/// Attempts before a compaction gives up on a stream that keeps moving.
const ATTEMPTS: usize = 8;

/// Bytes read per step of the fold.
const READ_BYTES: usize = 1 << 20;

/// What a compaction did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Compacted {
    /// Whether a snapshot was written (`false`: it would not have been smaller than the history).
    pub written: bool,
    /// Where the stream starts now.
    pub earliest: Offset,
    /// The stream's tail after the compaction.
    pub tail: Offset,
    /// Live entities in the snapshot.
    pub entities: usize,
    /// Bytes of history the snapshot replaced.
    pub history_bytes: u64,
    /// Bytes of the snapshot.
    pub snapshot_bytes: u64,
}

fn from_lookup(e: LookupError) -> Option<CompactError> {
    match e {
        LookupError::NotFound => Some(CompactError::NotFound),
        LookupError::Gone => Some(CompactError::Gone),
        // A trim or another compaction moved the start: fold again from the new one.
        LookupError::Trimmed { .. } | LookupError::PreconditionFailed { .. } => None,
        LookupError::Storage(s) => Some(CompactError::Storage(s)),
    }
}

/// Whether a stream as `info` describes it is one a background compactor looks at: made for
/// compaction, open, with at least `min_bytes` of history (for [`crate::engine::Housekeeping::compaction_candidates`]).
pub fn is_candidate(info: &StreamInfo, min_bytes: u64) -> bool {
    info.config.compaction && !info.closed && info.tail.0.saturating_sub(info.earliest.0) >= min_bytes
}

/// Compacts the stream at `path` as of now.
pub async fn compact<E: Engine>(e: &E, path: &str, now_ms: i64) -> Result<Compacted, CompactError> {
    'attempt: for _ in 0..ATTEMPTS {
        let info = match e.head(path, now_ms).await {
            Ok(i) => i,
            Err(err) => match from_lookup(err) {
                Some(c) => return Err(c),
                None => continue,
            },
        };
        if !info.config.compaction {
            return Err(CompactError::NotCompactable);
        }
        if info.closed {
            return Err(CompactError::Closed);
        }
        let mut folded = Materialized::default();
        let mut at = info.earliest;
        loop {
            let chunk = match e.read(ReadRequest::new(path, at, READ_BYTES, now_ms)).await {
                Ok(c) => c,
                Err(err) => match from_lookup(err) {
                    Some(c) => return Err(c),
                    None => continue 'attempt,
                },
            };
            if chunk.info.id != info.id {
                continue 'attempt;
            }
            folded.fold(&chunk.data)?;
            if chunk.next <= at || chunk.up_to_date() {
                at = chunk.next.max(at);
                break;
            }
            at = chunk.next;
        }
        let pieces = state::snapshot(&folded, at);
        let snapshot_bytes: u64 = pieces.iter().map(|p| p.len() as u64).sum();
        let history_bytes = at.0 - info.earliest.0;
        let summary = Compacted {
            written: false,
            earliest: info.earliest,
            tail: at,
            entities: folded.len(),
            history_bytes,
            snapshot_bytes,
        };
        if snapshot_bytes >= history_bytes {
            return Ok(summary);
        }
        let req = CompactRequest {
            path: path.to_owned(),
            stream_id: Some(info.id),
            at,
            pieces: pieces.into_iter().map(Into::into).collect(),
            now_ms,
        };
        match e.compact(req).await {
            Ok(t) => return Ok(Compacted { written: true, earliest: t.earliest, tail: t.tail, ..summary }),
            Err(CompactError::Stale { .. }) => continue,
            Err(other) => return Err(other),
        }
    }
    // Appends kept arriving between the fold and the write, every time.
    let tail = e.head(path, now_ms).await.map(|i| i.tail).unwrap_or_default();
    Err(CompactError::Stale { tail })
}
