//! Producer appends that arrived ahead of their predecessors, waiting for them (see
//! [`crate::Engine::append`] and [`crate::rules::parkable`]), for every engine.
//!
//! A writer decides the appends of one atomic unit (a log frame, a database transaction) in a
//! [`Round`]: each is decided against the engine's state; an early producer append is set aside
//! to wait, and an accepted one brings its parked successor in right behind it (and that one
//! its own, and so on), decided in the same unit. Once the unit is durable, [`Round::settle`]
//! parks the early ones in the [`ParkingLot`] and hands back the answers to send. If the unit
//! failed before it was durable, [`Round::retry`] hands every request back to be decided again.
//! A parked append waits at most [`PARK_TIMEOUT`] from its arrival; then it is decided once
//! more and answered whatever the verdict ([`ParkingLot::take_due`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::oneshot;

use crate::engine::{AppendError, AppendOutcome, AppendRequest, AppendStatus};
use crate::rules::{self, PARK_TIMEOUT};

/// Where an append's answer goes.
pub type AppendReply = oneshot::Sender<Result<AppendOutcome, AppendError>>;

/// An append on its way through a writer.
pub struct Pending {
    pub req: AppendRequest,
    pub reply: AppendReply,
    /// When it arrived: it may wait for its predecessors until `since + PARK_TIMEOUT`.
    pub since: Instant,
    /// It waited already (counted once, however often it is tried again).
    counted: bool,
}

impl Pending {
    pub fn new(req: AppendRequest, reply: AppendReply, since: Instant) -> Pending {
        Pending { req, reply, since, counted: false }
    }

    /// When its wait ends.
    pub fn deadline(&self) -> Instant {
        self.since + PARK_TIMEOUT
    }
}

/// Waiting appends by (path, producer id), then by (epoch, seq).
#[derive(Default)]
pub struct ParkingLot {
    waiting: HashMap<(String, String), BTreeMap<(u64, u64), Pending>>,
    /// Appends that waited, ever (an engine's [`crate::EngineStats::parked_appends`]; shared by
    /// an engine's lots).
    parked: Arc<AtomicU64>,
}

impl ParkingLot {
    /// A lot counting into `parked` (shared by the lots of one engine).
    pub fn counting(parked: Arc<AtomicU64>) -> ParkingLot {
        ParkingLot { waiting: HashMap::new(), parked }
    }

    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    /// When the next wait ends.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.waiting.values().flat_map(|m| m.values().map(Pending::deadline)).min()
    }

    /// Parks a producer append. Returns an older copy of the same `(epoch, seq)` that this retry
    /// replaces; it should get the answer it would have had.
    fn park(&mut self, mut p: Pending) -> Option<Pending> {
        let Some(prod) = &p.req.producer else { return Some(p) };
        let (stamp, key) = ((prod.epoch, prod.seq), (p.req.path.clone(), prod.id.clone()));
        if !p.counted {
            p.counted = true;
            self.parked.fetch_add(1, Ordering::Relaxed);
        }
        self.waiting.entry(key).or_default().insert(stamp, p)
    }

    /// Takes out the parked append of producer `producer` on `path` stamped `next`, if any.
    fn take(&mut self, path: &str, producer: &str, next: (u64, u64)) -> Option<Pending> {
        // Asked after every accepted producer append; the lot is almost always empty, and the
        // lookup below needs its key built (two allocations).
        if self.waiting.is_empty() {
            return None;
        }
        let key = (path.to_owned(), producer.to_owned());
        let m = self.waiting.get_mut(&key)?;
        let p = m.remove(&next);
        if m.is_empty() {
            self.waiting.remove(&key);
        }
        p
    }

    /// Takes out every append whose wait ended by `now` (all of them at shutdown, with a `now`
    /// far ahead; PostgreSQL also takes them all to try them again).
    pub fn take_due(&mut self, now: Instant) -> Vec<Pending> {
        let mut due = Vec::new();
        for m in self.waiting.values_mut() {
            let stamps: Vec<(u64, u64)> = m.iter().filter(|(_, p)| p.deadline() <= now).map(|(s, _)| *s).collect();
            due.extend(stamps.into_iter().filter_map(|s| m.remove(&s)));
        }
        self.waiting.retain(|_, m| !m.is_empty());
        due
    }
}

/// What a round decided for one append.
enum Verdict {
    Answer(Result<AppendOutcome, AppendError>),
    /// Wait for the predecessor; the refusal it got now (answered to a copy a retry replaces).
    Park(AppendError),
}

/// The appends decided in one atomic unit (see the module note).
#[derive(Default)]
pub struct Round {
    decided: Vec<(Pending, Verdict)>,
}

impl Round {
    /// Decides `p` with `apply` (the engine's decide-and-stage of one append) and, when it is an
    /// accepted producer append, the parked successors it releases. An early producer append
    /// waits if `may_park` (a writer that has stopped writes parks nothing) and its wait has not
    /// ended at `now`.
    pub fn decide(
        &mut self,
        p: Pending,
        lot: &mut ParkingLot,
        now: Instant,
        may_park: bool,
        apply: &mut impl FnMut(&AppendRequest) -> Result<AppendOutcome, AppendError>,
    ) {
        let mut next = Some(p);
        while let Some(p) = next.take() {
            let result = apply(&p.req);
            if let (Ok(o), Some(prod)) = (&result, &p.req.producer) {
                if o.status == AppendStatus::Appended {
                    // Accepted: its producer now expects seq + 1 of this epoch.
                    next = lot.take(&p.req.path, &prod.id, (prod.epoch, prod.seq + 1));
                }
            }
            let verdict = match result {
                Err(e) if may_park && now < p.deadline() && rules::parkable(&p.req, &e) => Verdict::Park(e),
                r => Verdict::Answer(r),
            };
            self.decided.push((p, verdict));
        }
    }

    /// After `req` was accepted outside this round's [`Round::decide`] (a transaction's append),
    /// decides the parked successors it releases.
    pub fn release(
        &mut self,
        req: &AppendRequest,
        lot: &mut ParkingLot,
        now: Instant,
        apply: &mut impl FnMut(&AppendRequest) -> Result<AppendOutcome, AppendError>,
    ) {
        let Some(prod) = &req.producer else { return };
        if let Some(successor) = lot.take(&req.path, &prod.id, (prod.epoch, prod.seq + 1)) {
            self.decide(successor, lot, now, true, apply);
        }
    }

    /// The unit failed before it was durable: every append of the round (released successors
    /// included), to be decided again.
    pub fn retry(self) -> Vec<Pending> {
        self.decided.into_iter().map(|(p, _)| p).collect()
    }

    /// The unit is durable (or its failure is answered to every reply by the caller): parks the
    /// early appends and hands each answer to send to `answer`.
    pub fn settle(self, lot: &mut ParkingLot, mut answer: impl FnMut(AppendReply, Result<AppendOutcome, AppendError>)) {
        for (p, verdict) in self.decided {
            match verdict {
                Verdict::Answer(r) => answer(p.reply, r),
                Verdict::Park(refusal) => {
                    if let Some(older) = lot.park(p) {
                        answer(older.reply, Err(refusal));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use oncelog_protocol::headers::ProducerHeaders;

    fn req(seq: u64) -> AppendRequest {
        let mut r = AppendRequest::plain("s", "text/plain", false, Bytes::from_static(b"x"), 0);
        r.producer = Some(ProducerHeaders { id: "p".into(), epoch: 0, seq });
        r
    }

    /// A round's answers, collected.
    fn settled(round: Round, lot: &mut ParkingLot) -> Vec<(AppendReply, Result<AppendOutcome, AppendError>)> {
        let mut answers = Vec::new();
        round.settle(lot, |reply, r| answers.push((reply, r)));
        answers
    }

    /// A toy engine: accepts seq n when n is next, else a gap.
    fn engine(next: &mut u64) -> impl FnMut(&AppendRequest) -> Result<AppendOutcome, AppendError> + '_ {
        move |r| {
            let seq = r.producer.as_ref().map_or(0, |p| p.seq);
            if seq != *next {
                return Err(AppendError::ProducerSeqGap { expected: *next, received: seq });
            }
            *next += 1;
            Ok(AppendOutcome {
                status: AppendStatus::Appended,
                next_offset: oncelog_protocol::Offset(*next),
                closed: false,
                producer: Some((0, seq)),
            })
        }
    }

    #[test]
    fn an_early_append_waits_and_is_decided_right_behind_its_predecessor() {
        let counter = Arc::new(AtomicU64::new(0));
        let mut lot = ParkingLot::counting(counter.clone());
        let mut next = 0;
        let now = Instant::now();
        let mut answers = Vec::new();
        // seq 2 and seq 1 arrive first: both wait.
        for seq in [2, 1] {
            let (tx, rx) = oneshot::channel();
            let mut round = Round::default();
            round.decide(Pending::new(req(seq), tx, now), &mut lot, now, true, &mut engine(&mut next));
            assert!(settled(round, &mut lot).is_empty(), "seq {seq} waits");
            answers.push(rx);
        }
        assert_eq!(counter.load(Ordering::Relaxed), 2);
        // seq 0 lands: 1 and 2 are decided in the same round, in order.
        let (tx, rx0) = oneshot::channel();
        let mut round = Round::default();
        round.decide(Pending::new(req(0), tx, now), &mut lot, now, true, &mut engine(&mut next));
        for (reply, r) in settled(round, &mut lot) {
            let _ = reply.send(r);
        }
        assert!(lot.is_empty());
        let seqs: Vec<u64> = std::iter::once(rx0)
            .chain(answers.into_iter().rev())
            .map(|mut rx| rx.try_recv().expect("answered").expect("ok").producer.expect("p").1)
            .collect();
        assert_eq!(seqs, [0, 1, 2]);
        assert_eq!(next, 3);
    }

    #[test]
    fn a_wait_ends_after_the_park_timeout_and_a_stopped_writer_parks_nothing() {
        let mut lot = ParkingLot::default();
        let mut next = 0;
        let now = Instant::now();
        let (tx, _rx) = oneshot::channel();
        let mut round = Round::default();
        round.decide(Pending::new(req(1), tx, now), &mut lot, now + PARK_TIMEOUT, true, &mut engine(&mut next));
        let answers = settled(round, &mut lot);
        assert!(matches!(answers.as_slice(), [(_, Err(AppendError::ProducerSeqGap { .. }))]), "too late to wait");
        let (tx, _rx) = oneshot::channel();
        let mut round = Round::default();
        round.decide(Pending::new(req(1), tx, now), &mut lot, now, false, &mut engine(&mut next));
        assert_eq!(settled(round, &mut lot).len(), 1, "no parking while writes are stopped");
        // A parked one is due once its time is up; retry hands a round's appends back.
        let (tx, _rx) = oneshot::channel();
        let mut round = Round::default();
        round.decide(Pending::new(req(1), tx, now), &mut lot, now, true, &mut engine(&mut next));
        assert_eq!(round.retry().len(), 1);
        assert!(lot.take_due(now + PARK_TIMEOUT).is_empty());
    }
}
