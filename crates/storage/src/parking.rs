//! Producer appends that arrived ahead of their predecessors, waiting for them (see
//! [`crate::Engine::append`] and [`crate::rules::parkable`]). Engine-neutral bookkeeping: an
//! engine's writer parks a request when the rules say it may wait, takes its successor out when
//! an append is accepted, and answers the ones whose wait is over.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use tokio::sync::oneshot;

use crate::engine::{AppendError, AppendOutcome, AppendRequest};
use crate::rules::PARK_TIMEOUT;

/// Where an append's answer goes.
pub type AppendReply = oneshot::Sender<Result<AppendOutcome, AppendError>>;

/// One waiting append.
pub struct Parked {
    pub req: AppendRequest,
    pub reply: AppendReply,
    pub deadline: Instant,
}

/// Waiting appends by (path, producer id), then by (epoch, seq).
#[derive(Default)]
pub struct ParkingLot {
    waiting: HashMap<(String, String), BTreeMap<(u64, u64), Parked>>,
}

impl ParkingLot {
    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    /// When the next wait ends.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.waiting.values().flat_map(|m| m.values().map(|p| p.deadline)).min()
    }

    /// Parks a producer request (callers check [`crate::rules::parkable`] first) until
    /// `now + PARK_TIMEOUT`. Returns an older copy of the same `(epoch, seq)` that this retry
    /// replaces; it should get the answer it would have had.
    pub fn park(&mut self, req: AppendRequest, reply: AppendReply, now: Instant) -> Option<Parked> {
        let p = req.producer.as_ref()?;
        let (stamp, key) = ((p.epoch, p.seq), (req.path.clone(), p.id.clone()));
        let parked = Parked { req, reply, deadline: now + PARK_TIMEOUT };
        self.waiting.entry(key).or_default().insert(stamp, parked)
    }

    /// Takes out the parked request of producer `producer` on `path` stamped `next`, if any.
    pub fn take(&mut self, path: &str, producer: &str, next: (u64, u64)) -> Option<Parked> {
        let key = (path.to_owned(), producer.to_owned());
        let m = self.waiting.get_mut(&key)?;
        let p = m.remove(&next);
        if m.is_empty() {
            self.waiting.remove(&key);
        }
        p
    }

    /// Takes out every request whose wait ended by `now`.
    pub fn take_due(&mut self, now: Instant) -> Vec<Parked> {
        let mut due = Vec::new();
        for m in self.waiting.values_mut() {
            let stamps: Vec<(u64, u64)> = m.iter().filter(|(_, p)| p.deadline <= now).map(|(s, _)| *s).collect();
            due.extend(stamps.into_iter().filter_map(|s| m.remove(&s)));
        }
        self.waiting.retain(|_, m| !m.is_empty());
        due
    }
}
