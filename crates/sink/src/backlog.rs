//! What the streams already hold when a worker starts.
//!
//! The server wakes a subscription only for data a linked stream got after it was linked: a
//! subscription made when its streams already had data starts its cursors at their tails, so
//! that history would never wake the sink. The target's positions, not the cursors, say what
//! is applied, so at start the worker compares them: every linked stream whose position in the
//! target is behind its tail (0 for a stream the sink never applied) is in the backlog, and is
//! applied from its position outside any wake, between claims (new data first). That is as safe
//! as applying it under a claim: the compare-and-set of each batch, not the claim, is what keeps
//! two workers from applying one batch twice; a worker that finds the position moved (another
//! worker is applying the stream) tries the stream again later, from where it then stands.
//!
//! There is nothing to ack while catching up: the stream's cursor is at its tail as the worker
//! saw it, ahead of the target's position. Data that arrives meanwhile moves the tail past the
//! cursor, so the server wakes the sink for it, and the claim then moves the cursor.
//!
//! With `--from-now`, a stream with no position in the target starts at its tail instead: the
//! worker records that position (as if applied up to there) and skips the history before it.
//! Streams created later, and streams with a recorded position, are applied whole either way.

use std::collections::{BTreeMap, VecDeque};

use oncelog_protocol::Offset;

use crate::batch::offset_of;
use crate::error::SinkError;
use crate::lease::Lease;
use crate::metrics;
use crate::position as positions;
use crate::sink::Sink;
use crate::worker::{Worker, BACKOFF};

impl<S: Sink> Worker<S> {
    /// The linked streams whose position in the target is behind their tail, in the
    /// subscription's order (with `--from-now`, after recording the tail as the position of each
    /// stream that has none). Logs what it found.
    pub(crate) async fn backlog(&self) -> Result<VecDeque<String>, SinkError> {
        let info = self.client.subscriptions().get(&self.opts.subscription).await?;
        let paths: Vec<&str> = info.streams.iter().map(|l| l.path.as_str()).collect();
        let schema = self.target.schema();
        let stored: BTreeMap<String, positions::Stored> = {
            let conn = self.target.conn().await?;
            positions::stored_all(&**conn, schema, &paths).await?
        };
        let mut behind = VecDeque::new();
        let (mut behind_bytes, mut skipped, mut skipped_bytes) = (0u64, 0usize, 0u64);
        for link in &info.streams {
            let tail = offset_of(&link.path, &link.tail_offset)?;
            let at = match stored.get(&link.path) {
                // Set aside: not read until an operator clears its reason.
                Some(s) if s.set_aside.is_some() => continue,
                Some(s) => s.position,
                None if self.opts.from_now && tail > Offset::ZERO => {
                    let conn = self.target.conn().await?;
                    // A worker that applied it meanwhile keeps its own position.
                    if positions::start_at(&**conn, schema, &link.path, &link.tail_offset, tail).await? {
                        tracing::debug!(stream = %link.path, position = tail.0, "--from-now: starts at its tail");
                        skipped += 1;
                        skipped_bytes += tail.0;
                    }
                    continue;
                }
                None => Offset::ZERO,
            };
            // A position beyond the tail (a re-created stream) is met when the stream is read.
            if at < tail {
                metrics::lag(&link.path, tail.0 - at.0);
                behind_bytes += tail.0 - at.0;
                behind.push_back(link.path.clone());
            }
        }
        if self.opts.from_now {
            tracing::info!(
                streams = skipped,
                skipped_bytes,
                "--from-now: streams the sink never applied start at their tails"
            );
        }
        if behind.is_empty() {
            tracing::info!(
                linked = info.streams.len(),
                "nothing to catch up: every linked stream is applied up to its tail"
            );
        } else {
            tracing::info!(
                streams = behind.len(),
                behind_bytes,
                linked = info.streams.len(),
                "catching up on what the streams held at start"
            );
        }
        Ok(behind)
    }

    /// Applies the first stream of `backlog` outside any wake. A stream whose position another
    /// worker moved meanwhile goes to the back, to be read again from where it then stands; one
    /// that failed for a reason that may pass stays first, after the usual pause.
    pub(crate) async fn catch_up(&self, backlog: &mut VecDeque<String>) -> Result<(), SinkError> {
        let Some(path) = backlog.pop_front() else { return Ok(()) };
        match self.follow(&mut Lease::outside(), &path).await {
            Ok(_) => {
                if backlog.is_empty() {
                    tracing::info!("caught up with what the streams held at start");
                }
                Ok(())
            }
            Err(SinkError::PositionMoved { .. }) => {
                metrics::conflict();
                tracing::debug!(stream = %path, "another worker moved the position while catching up; later");
                backlog.push_back(path);
                // It is applying the stream now: reading it again at once would mostly read
                // what that worker commits next.
                tokio::time::sleep(BACKOFF).await;
                Ok(())
            }
            Err(e) => {
                backlog.push_front(path);
                self.retry_or_stop(e, "catching up failed; retrying").await
            }
        }
    }
}
