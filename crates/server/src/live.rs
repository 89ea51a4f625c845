//! Bounds on live readers (long-poll and SSE): in all and per stream. A reader holds a
//! [`LiveSlot`] while it waits or streams; beyond a bound the read is answered `503` with
//! `Retry-After`, so a flood of readers cannot take every task and socket of the server.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::metrics;

/// Every place is taken (answered `503` with `Retry-After`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("too many live readers; retry later")]
pub struct TooManyReaders;

/// The counters behind the bounds.
pub struct LiveSlots {
    max_total: usize,
    max_per_stream: usize,
    /// Readers per stream path; the sum is the total.
    held: Mutex<(usize, HashMap<String, usize>)>,
}

/// One reader's place; given back when dropped.
pub struct LiveSlot {
    slots: Arc<LiveSlots>,
    path: String,
    _gauge: metrics::LiveReader,
}

impl LiveSlots {
    pub fn new(max_total: usize, max_per_stream: usize) -> Arc<Self> {
        Arc::new(Self { max_total, max_per_stream, held: Mutex::new((0, HashMap::new())) })
    }

    /// Takes a place for a `mode` reader of `path`, or refuses with `503`.
    pub fn acquire(self: &Arc<Self>, path: &str, mode: &'static str) -> Result<LiveSlot, TooManyReaders> {
        let mut held = self.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (total, per) = &mut *held;
        let here = per.get(path).copied().unwrap_or(0);
        if *total >= self.max_total || here >= self.max_per_stream {
            return Err(TooManyReaders);
        }
        *total += 1;
        per.insert(path.to_owned(), here + 1);
        Ok(LiveSlot { slots: Arc::clone(self), path: path.to_owned(), _gauge: metrics::LiveReader::open(mode) })
    }
}

impl Drop for LiveSlot {
    fn drop(&mut self) {
        let mut held = self.slots.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (total, per) = &mut *held;
        *total = total.saturating_sub(1);
        if let Some(n) = per.get_mut(&self.path) {
            *n -= 1;
            if *n == 0 {
                per.remove(&self.path);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_hold_and_places_come_back() {
        let slots = LiveSlots::new(3, 2);
        let a1 = slots.acquire("a", "sse").expect("a1");
        let _a2 = slots.acquire("a", "sse").expect("a2");
        assert!(matches!(slots.acquire("a", "sse"), Err(TooManyReaders)), "per stream");
        let _b1 = slots.acquire("b", "long-poll").expect("b1");
        assert!(matches!(slots.acquire("c", "sse"), Err(TooManyReaders)), "in all");
        drop(a1);
        let _c1 = slots.acquire("c", "sse").expect("a place came back");
    }
}
