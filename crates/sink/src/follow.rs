//! One stream of a claim: read from the position stored in the target, and commit each read as
//! one transaction of the target — the position's compare-and-set, the sink's effect, the count
//! — then ack. Dropped history is met here: a State Protocol stream restarts from its snapshot
//! (its `reset` clears the stream's rows), any other stream stops the sink or, if asked, skips
//! ahead and counts what it lost. A message the target refuses is found in its batch; the sink
//! stops naming it or, if asked, sets the stream aside before that batch.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use oncelog_client::{Chunk, LiveMode, ReadFrom, ReadOptions, StreamOffset};
use oncelog_protocol::content_type;
use oncelog_protocol::state::Change;
use oncelog_protocol::Offset;

use crate::batch::{self, offset_of, Batch, Message, StreamKind, StreamRef};
use crate::error::{ApplyError, SinkError, Why};
use crate::lease::Lease;
use crate::metrics;
use crate::position as positions;
use crate::sink::Sink;
use crate::worker::{Mode, OnRefused, OnTrimmed, Worker};

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
    /// The target refused a message of the read from `stored` and the stream was set aside
    /// there: stop reading it.
    set_aside: bool,
}

impl<S: Sink> Worker<S> {
    /// Applies `path` from its stored position until the read is up to date; answers the rows
    /// applied. A stream that no longer exists has nothing to apply.
    pub(crate) async fn follow(&self, lease: &mut Lease<'_>, path: &str) -> Result<u64, SinkError> {
        // The stored position first, the tail second: tails only grow, so a position another
        // worker commits meanwhile can never look beyond the tail read after it.
        let stored = {
            let conn = self.target.conn().await?;
            positions::stored(&**conn, self.target.schema(), path).await?
        };
        let handle = self.client.stream(path);
        let info = match handle.head().await {
            Ok(i) => i,
            Err(oncelog_client::Error::NotFound { .. } | oncelog_client::Error::Gone { .. }) => return Ok(0),
            Err(e) => return Err(e.into()),
        };
        let mut tail = offset_of(path, &info.next_offset)?;
        if let Some(reason) = &stored.set_aside {
            tracing::debug!(
                stream = path,
                position = stored.position.0,
                reason,
                "set aside; not read (clear positions.set_aside_reason to resume)"
            );
            self.pass_over(lease, path, stored.position, tail).await?;
            return Ok(0);
        }
        let stored = stored.position;
        let json = content_type::is_json(&info.content_type);
        let kind = match (self.opts.mode, info.state_compaction, json) {
            (Mode::Auto, true, _) => StreamKind::State,
            (Mode::Auto, false, true) => StreamKind::Json,
            (Mode::Auto, false, false) => StreamKind::Bytes,
            (Mode::State, _, true) => StreamKind::State,
            (Mode::Messages, _, true) => StreamKind::Json,
            (Mode::Chunks, _, _) => StreamKind::Bytes,
            (Mode::State | Mode::Messages, _, false) => {
                let stream = StreamRef { path: path.to_owned(), kind: StreamKind::Bytes };
                self.not_json(lease, &stream, stored, tail, &info.content_type).await?;
                return Ok(0);
            }
        };
        let stream = StreamRef { path: path.to_owned(), kind };
        if stored > tail {
            return Err(SinkError::WentBack { stream: path.to_owned(), position: stored.0, tail: tail.0 });
        }
        let behind = tail.0 - stored.0;
        metrics::lag(path, behind);
        let mut cur = Cursor { stored, read_from: stored, restarting: false, set_aside: false };
        let mut rows = 0;
        let mut logged = Instant::now();
        'reads: loop {
            let mut reader = handle.read(ReadOptions::new(ReadFrom::Offset(cur.read_from.into()), LiveMode::CatchUp));
            while let Some(item) = reader.next().await {
                let chunk = match item {
                    Ok(c) => c,
                    Err(oncelog_client::Error::Trimmed { earliest }) => {
                        self.trimmed(&stream, &mut cur, offset_of(path, &earliest)?, &earliest).await?;
                        continue 'reads;
                    }
                    Err(e) => return Err(e.into()),
                };
                if chunk.data.is_empty() {
                    continue;
                }
                rows += self.apply_chunk(&stream, &mut cur, &chunk).await?;
                if cur.set_aside {
                    self.pass_over(lease, path, cur.stored, tail.max(offset_of(path, &chunk.next_offset)?)).await?;
                    return Ok(rows);
                }
                tail = tail.max(cur.stored);
                metrics::lag(path, tail.0 - cur.stored.0);
                // A long catch-up shows its progress every few seconds, not only at its end.
                if logged.elapsed() >= PROGRESS_EVERY {
                    tracing::info!(
                        stream = path,
                        rows,
                        position = cur.stored.0,
                        lag_bytes = tail.0 - cur.stored.0,
                        "catching up"
                    );
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
                return Err(SinkError::NotASnapshot {
                    stream: stream.path.clone(),
                    position: cur.stored.0,
                    earliest: cur.read_from.0,
                });
            }
            tracing::info!(stream = %stream.path, from = cur.stored.0, snapshot = cur.read_from.0, "history compacted; restarting from the snapshot");
        }
        let next = offset_of(&stream.path, &chunk.next_offset)?;
        let rows = match self.commit(stream, cur.stored, &batch, &chunk.next_offset, next, 0).await {
            Ok(rows) => rows,
            Err(e) => return self.refused(stream, cur, &batch, e.into_refusal()?).await,
        };
        *cur = Cursor { stored: next, read_from: next, restarting: false, set_aside: false };
        Ok(rows)
    }

    /// The target refused `batch` and would on every try (`why`): find the first message it
    /// refuses, then stop naming it (`--on-refused stop`) or set the stream aside where the
    /// batch starts (`skip-stream`). Nothing of the batch is applied: it is one transaction, and
    /// a JSON stream can be read again only from where an append starts, which a message inside
    /// the batch need not be.
    async fn refused(
        &self,
        stream: &StreamRef,
        cur: &mut Cursor,
        batch: &Batch<'_>,
        why: ApplyError,
    ) -> Result<u64, SinkError> {
        let (offset, why) = self.first_refused(stream, cur, batch, why).await?;
        if self.opts.on_refused == OnRefused::Stop {
            return Err(SinkError::Refused { stream: stream.path.clone(), offset: offset.0, source: why });
        }
        let reason = format!("the message at offset {}: {}", offset.0, Why(&why));
        self.set_aside(stream, cur.stored, &reason).await?;
        metrics::set_aside(&stream.path);
        tracing::warn!(stream = %stream.path, position = cur.stored.0, offset = offset.0, %reason, "the target refused a message: stream set aside, the others go on (--on-refused skip-stream)");
        cur.set_aside = true;
        Ok(0)
    }

    /// `--mode state` or `messages` met a stream that is not JSON: it has no messages to apply
    /// that way. Stops (`--on-refused stop`) or sets the stream aside at its position, as for a
    /// message the target refuses: the operator decides (another mode for it, or a pattern that
    /// leaves it out).
    async fn not_json(
        &self,
        lease: &mut Lease<'_>,
        stream: &StreamRef,
        at: Offset,
        tail: Offset,
        content_type: &str,
    ) -> Result<(), SinkError> {
        let mode = match self.opts.mode {
            Mode::State => "state",
            _ => "messages",
        };
        if self.opts.on_refused == OnRefused::Stop {
            return Err(SinkError::NotJson {
                stream: stream.path.clone(),
                mode,
                content_type: content_type.to_owned(),
            });
        }
        let reason = format!("--mode {mode} applies JSON streams only; this one is {content_type}");
        self.set_aside(stream, at, &reason).await?;
        metrics::set_aside(&stream.path);
        tracing::warn!(stream = %stream.path, position = at.0, %reason, "stream set aside, the others go on (--on-refused skip-stream)");
        self.pass_over(lease, &stream.path, at, tail).await
    }

    /// Of a refused `batch`, where the first message the target refuses starts, and why it
    /// refuses that one: a binary search over the batch's prefixes, each tried in a transaction
    /// that is rolled back. A byte read is refused whole.
    async fn first_refused(
        &self,
        stream: &StreamRef,
        cur: &Cursor,
        batch: &Batch<'_>,
        why: ApplyError,
    ) -> Result<(Offset, ApplyError), SinkError> {
        let Batch::Messages(m) = batch else { return Ok((cur.read_from, why)) };
        // The prefix of `ok` messages applies, the one of `refused` does not.
        let (mut ok, mut refused, mut why) = (0, m.len(), why);
        while refused - ok > 1 {
            let mid = ok + (refused - ok) / 2;
            match self.try_apply(stream, &m[..mid], m[mid].offset).await {
                Ok(()) => ok = mid,
                Err(e) => {
                    why = e.into_refusal()?;
                    refused = mid;
                }
            }
        }
        Ok((m.get(ok).map_or(cur.read_from, |m| m.offset), why))
    }

    /// Whether the target takes `messages` (ending where `next` starts): applied in a
    /// transaction that is rolled back.
    async fn try_apply(&self, stream: &StreamRef, messages: &[Message<'_>], next: Offset) -> Result<(), SinkError> {
        let mut conn = self.target.conn().await?;
        let tx = conn.transaction().await?;
        self.sink.apply(&tx, stream, &Batch::Messages(messages.to_vec()), &next.into()).await?;
        tx.rollback().await?;
        Ok(())
    }

    /// Marks `stream` set aside at `at`, its stored position (checked by compare-and-set).
    async fn set_aside(&self, stream: &StreamRef, at: Offset, reason: &str) -> Result<(), SinkError> {
        let schema = self.target.schema();
        let mut conn = self.target.conn().await?;
        let tx = conn.transaction().await?;
        positions::advance(&tx, schema, &stream.path, at, &at.into(), at, 0).await?;
        positions::set_aside(&tx, schema, &stream.path, reason).await?;
        tx.commit().await?;
        Ok(())
    }

    /// A set-aside stream is not read. Its subscription cursor goes to `tail`, the last seen,
    /// or the server would see its unread data as work and wake the sink for it again and
    /// again; its position in the target stays at `at`, before the refused message.
    async fn pass_over(&self, lease: &mut Lease<'_>, path: &str, at: Offset, tail: Offset) -> Result<(), SinkError> {
        metrics::lag(path, tail.0.saturating_sub(at.0));
        lease.settle(path, &tail.into()).await
    }

    /// The read from `cur` was refused: history before `earliest` is gone.
    async fn trimmed(
        &self,
        stream: &StreamRef,
        cur: &mut Cursor,
        earliest: Offset,
        token: &StreamOffset,
    ) -> Result<(), SinkError> {
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
                *cur = Cursor { stored: earliest, read_from: earliest, restarting: false, set_aside: false };
            }
            (_, OnTrimmed::Fail) => {
                return Err(SinkError::Trimmed {
                    stream: stream.path.clone(),
                    position: cur.stored.0,
                    earliest: earliest.0,
                    lost,
                })
            }
        }
        Ok(())
    }

    /// One target transaction: the position from `from` to `next` (the guard, first), the
    /// sink's effect of `batch`, the count; committed together or not at all.
    async fn commit(
        &self,
        stream: &StreamRef,
        from: Offset,
        batch: &Batch<'_>,
        token: &StreamOffset,
        next: Offset,
        lost: u64,
    ) -> Result<u64, SinkError> {
        let started = Instant::now();
        let schema = self.target.schema();
        let mut conn = self.target.conn().await?;
        // Dropped on any error before the commit: the driver rolls the transaction back.
        let tx = conn.transaction().await?;
        positions::advance(&tx, schema, &stream.path, from, token, next, lost).await?;
        let rows = if batch.is_empty() { 0 } else { self.sink.apply(&tx, stream, batch, token).await? };
        positions::count(&tx, schema, &stream.path, rows).await?;
        tx.commit().await?;
        metrics::committed(&stream.path, rows, started.elapsed());
        tracing::debug!(stream = %stream.path, from = from.0, to = next.0, rows, "batch committed");
        Ok(rows)
    }
}
