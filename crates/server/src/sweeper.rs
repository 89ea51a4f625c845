//! Deletes expired streams in the background, applies retention policies (and forgets idle
//! rate-limit buckets). Access paths already treat an expired stream as absent; this reclaims
//! its space when nobody touches it again. Retention is applied only here.

use oncelog_storage::Engine;

use crate::AppState;

/// Runs until the engine shuts down.
pub async fn run<E: Engine>(state: AppState<E>) {
    let mut tick = tokio::time::interval(state.config.sweep_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        state.rate.prune();
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
    }
}

/// Spawns [`run`] on the current runtime.
pub fn spawn<E: Engine>(state: &AppState<E>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(run(state.clone()))
}
