//! Deletes expired streams in the background, applies retention policies, compacts State
//! Protocol streams whose history grew, prunes writer state past its TTL or window (at most once
//! every [`PRUNE_EVERY`]) and forgets idle rate-limit buckets. Access paths already treat an
//! expired stream (or producer, or key) as absent; this reclaims its space when nobody touches
//! it again. Retention and background compaction happen only here.

use std::collections::HashMap;

use oncelog_protocol::Offset;

use oncelog_storage::Engine;

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
                Ok(p) if p.producers + p.keys > 0 => tracing::debug!(producers = p.producers, keys = p.keys, "idle writer state pruned"),
                Ok(_) => {}
                Err(oncelog_storage::StorageError::ShuttingDown) => return,
                Err(e) => tracing::warn!(error = %e, "pruning writer state failed"),
            }
        }
        match state.engine.expire(state.clock.now_ms()).await {
            Ok(0) => {}
            Ok(n) => tracing::debug!(expired = n, "expired streams deleted"),
            Err(oncelog_storage::StorageError::ShuttingDown) => return,
            Err(e) => tracing::warn!(error = %e, "expiry sweep failed"),
        }
        match state.engine.retain(state.clock.now_ms()).await {
            Ok(0) => {}
            Ok(n) => tracing::debug!(streams = n, "retention moved earliest offsets"),
            Err(oncelog_storage::StorageError::ShuttingDown) => return,
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
        Err(oncelog_storage::StorageError::ShuttingDown) => return Err(()),
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
        match oncelog_storage::compaction::compact(state.engine.as_ref(), &path, state.clock.now_ms()).await {
            Ok(done) => {
                tracing::debug!(path, written = done.written, entities = done.entities, history = done.history_bytes, snapshot = done.snapshot_bytes, "background compaction");
                compacted_at.insert(path, done.tail);
            }
            Err(oncelog_storage::CompactError::Storage(oncelog_storage::StorageError::ShuttingDown)) => return Err(()),
            Err(e) => {
                tracing::debug!(path, error = %e, "background compaction skipped");
                compacted_at.insert(path, tail);
            }
        }
    }
    Ok(())
}

/// Spawns [`run`] on the current runtime.
pub fn spawn<E: Engine>(state: &AppState<E>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(run(state.clone()))
}
