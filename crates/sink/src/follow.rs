//! One stream of a claim: read from the position stored in the target, and commit each read as
//! one transaction of the target — the position's compare-and-set, the sink's effect, the count
//! — then ack. Dropped history is met here: a State Protocol stream restarts from its snapshot
//! (its `reset` clears the stream's rows), any other stream stops the sink or, if asked, skips
//! ahead and counts what it lost.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use oncelog_client::{Chunk, LiveMode, ReadFrom, ReadOptions, StreamOffset};
use oncelog_protocol::content_type;
use oncelog_protocol::state::Change;
use oncelog_protocol::Offset;

use crate::batch::{self, position, Batch, StreamKind, StreamRef};
use crate::error::SinkError;
use crate::lease::Lease;
use crate::metrics;
use crate::position as positions;
use crate::sink::Sink;
use crate::worker::{OnTrimmed, Worker};

/// How often a stream that takes long to apply logs where it stands.
const PROGRESS_EVERY: Duration = Duration::from_secs(10);

/// Where a stream's reading and its stored position stand.
struct Cursor {
    /// The position in the target (what the next compare-and-set expects).
    stored: Offset,
    /// Where the next read starts: `stored`, except after a compaction dropped it (then the
    /// snapshot's start, until the first batch from there commits).
    read_from: Offset,
    /// Reading a State Protocol stream from its snapshot: the first message must be the reset.
    restarting: bool,
}

impl<S: Sink> Worker<S> {
    /// Applies `path` from its stored position until the read is up to date; answers the rows
    /// applied. A stream that no longer exists has nothing to apply.
    pub(crate) async fn follow(&self, lease: &mut Lease<'_>, path: &str) -> Result<u64, SinkError> {
        // The stored position first, the tail second: tails only grow, so a position another
        // worker commits meanwhile can never look beyond the tail read after it.
        let stored = {
            let conn = self.target.conn().await?;
            positions::read(&**conn, self.target.schema(), path).await?
        };
        let handle = self.client.stream(path);
        let info = match handle.head().await {
            Ok(i) => i,
            Err(oncelog_client::Error::NotFound { .. } | oncelog_client::Error::Gone { .. }) => return Ok(0),
            Err(e) => return Err(e.into()),
        };
        let kind = match (info.state_compaction, content_type::is_json(&info.content_type)) {
            (true, _) => StreamKind::State,
            (false, true) => StreamKind::Json,
            (false, false) => StreamKind::Bytes,
        };
        let stream = StreamRef { path: path.to_owned(), kind };
        let mut tail = position(path, &info.next_offset)?;
        if stored > tail {
            return Err(SinkError::WentBack { stream: path.to_owned(), position: stored.0, tail: tail.0 });
        }
        let behind = tail.0 - stored.0;
        metrics::lag(path, behind);
        let mut cur = Cursor { stored, read_from: stored, restarting: false };
        let mut rows = 0;
        let mut logged = Instant::now();
        'reads: loop {
            let mut reader = handle.read(ReadOptions::new(ReadFrom::Offset(cur.read_from.into()), LiveMode::CatchUp));
            while let Some(item) = reader.next().await {
                let chunk = match item {
                    Ok(c) => c,
                    Err(oncelog_client::Error::Trimmed { earliest }) => {
                        self.trimmed(&stream, &mut cur, position(path, &earliest)?, &earliest).await?;
                        continue 'reads;
                    }
                    Err(e) => return Err(e.into()),
                };
                if chunk.data.is_empty() {
                    continue;
                }
                rows += self.apply_chunk(&stream, &mut cur, &chunk).await?;
                tail = tail.max(cur.stored);
                metrics::lag(path, tail.0 - cur.stored.0);
                // A long catch-up shows its progress every few seconds, not only at its end.
                if logged.elapsed() >= PROGRESS_EVERY {
                    tracing::info!(stream = path, rows, position = cur.stored.0, lag_bytes = tail.0 - cur.stored.0, "catching up");
                    logged = Instant::now();
                }
                lease.progress(path, &chunk.next_offset).await?;
            }
            break;
        }
        // The target may be ahead of the subscription's cursor with nothing left to read (a
        // worker died between its commit and its ack): move the cursor there, or the server
        // would see the same work pending and wake the sink for it again and again.
        lease.settle(path, &cur.stored.into()).await?;
        // Caught up with the tail the read last saw.
        metrics::lag(path, 0);
        tracing::info!(stream = path, rows, position = cur.stored.0, lag_bytes_before = behind, "stream applied");
        Ok(rows)
    }

    /// Commits one read: compare-and-set of the position, the sink's effect, the count.
    async fn apply_chunk(&self, stream: &StreamRef, cur: &mut Cursor, chunk: &Chunk) -> Result<u64, SinkError> {
        let batch = batch::decode(stream, cur.read_from, chunk)?;
        if cur.restarting {
            // A compaction writes its reset alone at the offset it trims to: anything else there
            // means the history went by some other way, and the rows cannot be rebuilt.
            let first = match &batch {
                Batch::Messages(m) => m.first().map(|m| m.change()),
                Batch::Bytes { .. } => None,
            };
            if first != Some(Ok(Change::Reset)) {
                return Err(SinkError::NotASnapshot { stream: stream.path.clone(), position: cur.stored.0, earliest: cur.read_from.0 });
            }
            tracing::info!(stream = %stream.path, from = cur.stored.0, snapshot = cur.read_from.0, "history compacted; restarting from the snapshot");
        }
        let next = position(&stream.path, &chunk.next_offset)?;
        let rows = self.commit(stream, cur.stored, &batch, &chunk.next_offset, next, 0).await?;
        *cur = Cursor { stored: next, read_from: next, restarting: false };
        Ok(rows)
    }

    /// The read from `cur` was refused: history before `earliest` is gone.
    async fn trimmed(&self, stream: &StreamRef, cur: &mut Cursor, earliest: Offset, token: &StreamOffset) -> Result<(), SinkError> {
        let lost = earliest.0.saturating_sub(cur.stored.0);
        match (stream.kind, self.opts.on_trimmed) {
            (StreamKind::State, _) => {
                cur.read_from = earliest;
                cur.restarting = true;
            }
            (_, OnTrimmed::Skip) => {
                self.commit(stream, cur.stored, &Batch::Messages(Vec::new()), token, earliest, lost).await?;
                metrics::lost(&stream.path, lost);
                tracing::warn!(stream = %stream.path, from = cur.stored.0, to = earliest.0, lost, "history trimmed; skipped ahead (--on-trimmed skip)");
                *cur = Cursor { stored: earliest, read_from: earliest, restarting: false };
            }
            (_, OnTrimmed::Fail) => return Err(SinkError::Trimmed { stream: stream.path.clone(), position: cur.stored.0, earliest: earliest.0, lost }),
        }
        Ok(())
    }

    /// One target transaction: the position from `from` to `next` (the guard, first), the
    /// sink's effect of `batch`, the count; committed together or not at all.
    async fn commit(&self, stream: &StreamRef, from: Offset, batch: &Batch<'_>, token: &StreamOffset, next: Offset, lost: u64) -> Result<u64, SinkError> {
        let started = Instant::now();
        let schema = self.target.schema();
        let mut conn = self.target.conn().await?;
        // Dropped on any error before the commit: the driver rolls the transaction back.
        let tx = conn.transaction().await?;
        positions::advance(&tx, schema, &stream.path, from, token, next, lost).await?;
        let rows = if batch.is_empty() {
            0
        } else {
            self.sink.apply(&tx, stream, batch, token).await.inspect_err(|e| tracing::warn!(stream = %stream.path, from = from.0, error = %e, "batch refused; rolled back"))?
        };
        positions::count(&tx, schema, &stream.path, rows).await?;
        tx.commit().await?;
        metrics::committed(&stream.path, rows, started.elapsed());
        tracing::debug!(stream = %stream.path, from = from.0, to = next.0, rows, "batch committed");
        Ok(rows)
    }
}
