//! Node-local plumbing that decides nothing: wake-ups for live readers, and reads' TTL touches
//! waiting to be written.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::Notify;

/// Live readers waiting on streams, by stream id. An entry lives while a waiter holds it
/// (weak references), so an idle stream costs nothing.
#[derive(Default)]
pub(crate) struct Watches {
    by_id: Mutex<HashMap<u64, Weak<Notify>>>,
    /// Bumped before every wake-up (see `flight`): reads that began at an older epoch may
    /// predate the commit that woke their reader, so it does not share them.
    pub epoch: crate::flight::Epoch,
}

impl Watches {
    /// The wake-up of stream `id`; waiters call `notified()` on it *before* re-reading the
    /// stream, so a commit between that read and the wait is not missed.
    pub fn get(&self, id: u64) -> Arc<Notify> {
        let mut map = self.by_id.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = map.get(&id).and_then(Weak::upgrade) {
            return n;
        }
        if map.len() > 1024 {
            map.retain(|_, w| w.strong_count() > 0);
        }
        let n = Arc::new(Notify::new());
        map.insert(id, Arc::downgrade(&n));
        n
    }

    /// Ids with waiters now (what the safety-net poll looks at).
    pub fn watched(&self) -> Vec<u64> {
        let map = self.by_id.lock().unwrap_or_else(|p| p.into_inner());
        map.iter().filter(|(_, w)| w.strong_count() > 0).map(|(id, _)| *id).collect()
    }

    /// Wakes every waiter (after wake-ups may have been missed).
    pub fn wake_all(&self) {
        self.epoch.bump();
        let map = self.by_id.lock().unwrap_or_else(|p| p.into_inner());
        for n in map.values().filter_map(Weak::upgrade) {
            n.notify_waiters();
        }
    }

    /// Wakes every waiter of stream `id` (after a commit changed it, here or on another node).
    pub fn wake(&self, id: u64) {
        self.epoch.bump();
        let map = self.by_id.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = map.get(&id).and_then(Weak::upgrade) {
            n.notify_waiters();
        }
    }
}

/// Reads slide a TTL window, but a read must not write to the database: this node remembers
/// the latest read time per TTL stream and a background task writes them in one statement
/// (`maint::flush_touches`). Until then this node's own reads see them (`Touches::at`).
#[derive(Default)]
pub(crate) struct Touches {
    by_id: Mutex<HashMap<u64, i64>>,
}

impl Touches {
    pub fn touch(&self, id: u64, now_ms: i64) {
        let mut map = self.by_id.lock().unwrap_or_else(|p| p.into_inner());
        let t = map.entry(id).or_insert(now_ms);
        *t = (*t).max(now_ms);
    }

    /// The latest unflushed read time of stream `id`, if any.
    pub fn at(&self, id: u64) -> Option<i64> {
        self.by_id.lock().unwrap_or_else(|p| p.into_inner()).get(&id).copied()
    }

    /// Everything waiting to be written (kept until [`Touches::flushed`], so reads in between
    /// still see it).
    pub fn pending(&self) -> Vec<(u64, i64)> {
        self.by_id.lock().unwrap_or_else(|p| p.into_inner()).iter().map(|(k, v)| (*k, *v)).collect()
    }

    /// Forgets what was written, unless a newer read came since.
    pub fn flushed(&self, items: &[(u64, i64)]) {
        let mut map = self.by_id.lock().unwrap_or_else(|p| p.into_inner());
        for (id, t) in items {
            if map.get(id).is_some_and(|cur| cur <= t) {
                map.remove(id);
            }
        }
    }
}
