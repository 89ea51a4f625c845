//! Files that are re-read when they change (authentication keys, TLS certificates): one task per
//! kind of file calls its `reload` every interval and logs what happened.

use std::fmt::Display;
use std::path::Path;
use std::time::{Duration, SystemTime};

/// A file's modification time, by which a reload notices a change (`None`: unreadable now).
pub fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// Calls `reload` every `every` for the life of the runtime; `reload` says whether anything
/// changed, and on an error the previous contents stay in force.
pub fn every<E: Display>(
    every: Duration,
    what: &'static str,
    reload: impl Fn() -> Result<bool, E> + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        loop {
            tick.tick().await;
            match reload() {
                Ok(true) => tracing::info!(what, "reloaded"),
                Ok(false) => {}
                Err(e) => tracing::warn!(what, error = %e, "reload failed; keeping the previous version"),
            }
        }
    })
}
