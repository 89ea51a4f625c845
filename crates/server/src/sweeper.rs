//! Deletes expired streams in the background, applies retention policies, compacts State
//! Protocol streams whose history grew, prunes writer state past its TTL or window (at most once
//! every [`PRUNE_EVERY`]) and forgets idle rate-limit buckets. Access paths already treat an
//! expired stream (or producer, or key) as absent; this reclaims its space when nobody touches
//! it again. Retention and background compaction happen only here; each retention pass that
//! dropped something and each compaction (background or requested, [`compact`]) is one info
//! line with its sizes and duration.

use std::collections::HashMap;

use oncelog_protocol::Offset;

use oncelog_storage::compaction::Compacted;
use oncelog_storage::{CompactError, Engine, StorageError};

use crate::state::AppState;

/// How often writer state is pruned ([`oncelog_storage::Housekeeping::prune`]): it only frees
/// space (the rules ignore expired state at once), and on PostgreSQL it scans the producers
/// table, so less often than the other sweeps.
pub const PRUNE_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

/// Runs until the engine shuts down.
pub async fn run<E: Engine>(state: AppState<E>) {
    let mut tick = tokio::time::interval(state.config.sweep_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Each compaction stream's tail when it was last compacted (or found not worth it): it is
    // tried again only once it grew by the threshold, so a stream whose snapshot would not be
    // smaller is not folded on every tick.
    let mut compacted_at: HashMap<String, Offset> = HashMap::new();
    let mut pruned_at: Option<tokio::time::Instant> = None;
    loop {
        tick.tick().await;
        state.rate.prune();
        if pruned_at.is_none_or(|at| at.elapsed() >= PRUNE_EVERY) {
            pruned_at = Some(tokio::time::Instant::now());
            match state.engine.prune(state.clock.now_ms()).await {
                Ok(p) if p.producers + p.keys > 0 => {
                    tracing::debug!(producers = p.producers, keys = p.keys, "idle writer state pruned")
                }
                Ok(_) => {}
                Err(StorageError::ShuttingDown) => return,
                Err(e) => tracing::warn!(error = %e, "pruning writer state failed"),
            }
        }
        match state.engine.expire(state.clock.now_ms()).await {
            Ok(0) => {}
            Ok(n) => tracing::debug!(expired = n, "expired streams deleted"),
            Err(StorageError::ShuttingDown) => return,
            Err(e) => tracing::warn!(error = %e, "expiry sweep failed"),
        }
        let started = std::time::Instant::now();
        match state.engine.retain(state.clock.now_ms()).await {
            Ok(done) if done.streams == 0 => {}
            // Once per pass that dropped something (not per stream): what an operator looks for
            // when disk space came back or a reader got a 410.
            Ok(done) => tracing::info!(
                streams = done.streams,
                bytes_dropped = done.bytes,
                elapsed_ms = millis(started),
                "retention pass"
            ),
            Err(StorageError::ShuttingDown) => return,
            Err(e) => tracing::warn!(error = %e, "retention sweep failed"),
        }
        if compact_grown(&state, &mut compacted_at).await.is_err() {
            return;
        }
    }
}

/// Compacts the streams whose history grew by `compaction_min_bytes` since their last
/// compaction. `Err` once the engine shuts down.
async fn compact_grown<E: Engine>(state: &AppState<E>, compacted_at: &mut HashMap<String, Offset>) -> Result<(), ()> {
    let min = state.config.compaction_min_bytes;
    if min == 0 {
        return Ok(());
    }
    let candidates = match state.engine.compaction_candidates(min).await {
        Ok(c) => c,
        Err(StorageError::ShuttingDown) => return Err(()),
        Err(e) => {
            tracing::warn!(error = %e, "background compaction: candidates not listed");
            return Ok(());
        }
    };
    compacted_at.retain(|p, _| candidates.iter().any(|(c, _)| c == p));
    for (path, tail) in candidates {
        if compacted_at.get(&path).is_some_and(|at| tail.0.saturating_sub(at.0) < min) {
            continue;
        }
        match compact(state, &path, "background").await {
            Ok(done) => {
                compacted_at.insert(path, done.tail);
            }
            Err(CompactError::Storage(StorageError::ShuttingDown)) => return Err(()),
            Err(_) => {
                compacted_at.insert(path, tail);
            }
        }
    }
    Ok(())
}

/// Compacts the stream at `path` (`trigger`: `background` or `request`) and logs it: one info
/// line per compaction that read a history, with its sizes and duration, since a compaction
/// reads a whole history, holds its state in memory and sends every reader behind the tail a
/// 410. Refusals the caller answers (no such stream, closed, not made for compaction) are
/// debug; other failures a warning.
pub(crate) async fn compact<E: Engine>(
    state: &AppState<E>,
    path: &str,
    trigger: &'static str,
) -> Result<Compacted, CompactError> {
    let started = std::time::Instant::now();
    let r = oncelog_storage::compaction::compact(state.engine.as_ref(), path, state.clock.now_ms()).await;
    let elapsed_ms = millis(started);
    match &r {
        Ok(d) if d.written => tracing::info!(
            stream = path,
            trigger,
            history_bytes = d.history_bytes,
            snapshot_bytes = d.snapshot_bytes,
            entities = d.entities,
            earliest = d.earliest.0,
            elapsed_ms,
            "compacted"
        ),
        Ok(d) => tracing::info!(
            stream = path,
            trigger,
            history_bytes = d.history_bytes,
            snapshot_bytes = d.snapshot_bytes,
            entities = d.entities,
            elapsed_ms,
            "compaction not written: the snapshot would not be smaller than the history"
        ),
        Err(CompactError::Storage(StorageError::ShuttingDown)) => {}
        Err(
            e @ (CompactError::NotFound | CompactError::Gone | CompactError::Closed | CompactError::NotCompactable),
        ) => {
            tracing::debug!(stream = path, trigger, error = %e, "compaction refused");
        }
        Err(e) => tracing::warn!(stream = path, trigger, error = %e, elapsed_ms, "compaction failed"),
    }
    r
}

/// Milliseconds since `started`, for log lines.
fn millis(started: std::time::Instant) -> u64 {
    u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// Spawns [`run`] on the current runtime.
pub fn spawn<E: Engine>(state: &AppState<E>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(run(state.clone()))
}
