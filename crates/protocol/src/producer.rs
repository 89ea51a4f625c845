//! The idempotent-producer state machine of protocol section 5.2.1, as pure functions.
//!
//! Written by hand because it *is* the product: the exactly-once promise rests on these few
//! comparisons, and keeping them free of I/O lets a property test hold them against a model.
//!
//! The storage engine calls [`validate`] while it holds the stream's write serialisation, and on
//! [`Verdict::Accept`] commits [`ProducerState::accepted`] in the same atomic unit as the data.
//!
//! Beyond the protocol, the state keeps *receipts*: the end offset and body digest of each of the
//! last [`RECEIPT_WINDOW`] accepted sequence numbers of the current epoch, so that the `204`
//! answering a duplicate can say where the original append landed, and a "duplicate" whose body
//! differs is refused instead of silently dropped. It also keeps when the producer was last
//! active, so state idle for longer than a TTL can be forgotten ([`ProducerState::is_live`]).

use std::collections::VecDeque;

use crate::digest::BodyDigest;
use crate::Offset;

/// How many recent sequence numbers remember their offsets. A pipelined client keeps a handful of
/// requests in flight; 32 covers any sane depth with room for retries that arrive late.
pub const RECEIPT_WINDOW: usize = 32;

/// What the server remembers of one producer on one stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProducerState {
    /// The highest epoch accepted; lower epochs are fenced.
    pub epoch: u64,
    /// The highest sequence number accepted in `epoch`.
    pub last_seq: u64,
    /// The most recent accepted sequence numbers of `epoch`, oldest first; the last entry
    /// belongs to `last_seq`.
    pub receipts: VecDeque<Receipt>,
    /// When a request of this producer was last accepted (Unix ms): how long it has been idle.
    pub last_active_ms: i64,
}

/// What is remembered of one accepted append.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Receipt {
    /// Where its data ended.
    pub end: Offset,
    /// Its body's digest.
    pub digest: BodyDigest,
}

/// The decision for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// New data in sequence: append it, then record [`ProducerState::accepted`].
    Accept,
    /// Already accepted: answer `204` without writing (unless the body differs from the
    /// receipt's). `receipt` is that append's, while the sequence number is inside the window.
    Duplicate { receipt: Option<Receipt> },
    /// A zombie from an older epoch: `403` with the current epoch.
    Fenced { current_epoch: u64 },
    /// A gap: `409` with the expected and received sequence numbers.
    Gap { expected: u64, received: u64 },
    /// A new epoch must start at sequence 0: `400`.
    NewEpochMustStartAtZero,
}

/// Decides what to do with `(epoch, seq)` given the producer's current state (`None` = unknown
/// producer on this stream).
pub fn validate(state: Option<&ProducerState>, epoch: u64, seq: u64) -> Verdict {
    let Some(state) = state else {
        return if seq == 0 { Verdict::Accept } else { Verdict::Gap { expected: 0, received: seq } };
    };
    if epoch < state.epoch {
        return Verdict::Fenced { current_epoch: state.epoch };
    }
    if epoch > state.epoch {
        return if seq == 0 { Verdict::Accept } else { Verdict::NewEpochMustStartAtZero };
    }
    if seq <= state.last_seq {
        return Verdict::Duplicate { receipt: state.receipt(seq) };
    }
    if seq == state.last_seq + 1 {
        return Verdict::Accept;
    }
    Verdict::Gap { expected: state.last_seq + 1, received: seq }
}

impl ProducerState {
    /// The state after `(epoch, seq)` was accepted at `at_ms`, with `receipt`.
    pub fn accepted(
        state: Option<&ProducerState>,
        epoch: u64,
        seq: u64,
        receipt: Receipt,
        at_ms: i64,
    ) -> ProducerState {
        let mut next = state.cloned().unwrap_or_else(|| ProducerState::new(epoch));
        next.accept(epoch, seq, receipt, at_ms);
        next
    }

    /// A producer seen for the first time, before its first accepted request. Its receipts grow
    /// as it appends (to at most [`RECEIPT_WINDOW`]) rather than starting at the full window: a
    /// producer that appends once (most of a flood of new ids) then holds 4 receipts (64 bytes),
    /// not 32 (512).
    pub fn new(epoch: u64) -> ProducerState {
        ProducerState { epoch, last_seq: 0, receipts: VecDeque::new(), last_active_ms: i64::MIN }
    }

    /// Records in place that `(epoch, seq)` was accepted at `at_ms` (the same as
    /// [`ProducerState::accepted`], without copying the receipts). Sequence 0 starts afresh: it is
    /// accepted only for a producer new to the stream, a new epoch, or state that had expired.
    pub fn accept(&mut self, epoch: u64, seq: u64, receipt: Receipt, at_ms: i64) {
        if epoch != self.epoch || seq == 0 {
            self.receipts.clear();
        }
        if self.receipts.len() == RECEIPT_WINDOW {
            self.receipts.pop_front();
        }
        self.receipts.push_back(receipt);
        self.epoch = epoch;
        self.last_seq = seq;
        self.last_active_ms = self.last_active_ms.max(at_ms);
    }

    /// Whether the state still counts at `now_ms` with an idle TTL of `ttl_ms`; state idle for
    /// longer is treated as absent (a new producer).
    pub fn is_live(&self, now_ms: i64, ttl_ms: i64) -> bool {
        now_ms < self.last_active_ms.saturating_add(ttl_ms)
    }

    /// The receipt of `seq` in the current epoch, if still remembered.
    pub fn receipt(&self, seq: u64) -> Option<Receipt> {
        let back = self.last_seq.checked_sub(seq)?;
        let back = usize::try_from(back).ok()?;
        let idx = self.receipts.len().checked_sub(1)?.checked_sub(back)?;
        self.receipts.get(idx).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn at(end: u64) -> Receipt {
        Receipt { end: Offset(end), digest: BodyDigest(end) }
    }

    #[test]
    fn spec_examples() {
        let s0 = ProducerState::accepted(None, 0, 0, at(10), 5);
        assert_eq!(validate(None, 0, 0), Verdict::Accept);
        assert_eq!(validate(None, 0, 3), Verdict::Gap { expected: 0, received: 3 });
        assert_eq!(validate(Some(&s0), 0, 0), Verdict::Duplicate { receipt: Some(at(10)) });
        assert_eq!(validate(Some(&s0), 0, 1), Verdict::Accept);
        assert_eq!(validate(Some(&s0), 0, 2), Verdict::Gap { expected: 1, received: 2 });
        assert_eq!(validate(Some(&s0), 1, 1), Verdict::NewEpochMustStartAtZero);
        let s1 = ProducerState::accepted(Some(&s0), 1, 0, at(20), 7);
        assert_eq!(validate(Some(&s1), 0, 5), Verdict::Fenced { current_epoch: 1 });
        assert_eq!(s1.receipts.len(), 1, "a new epoch starts a fresh receipt window");
        assert_eq!(s1.last_active_ms, 7);
        assert!(s1.is_live(7 + 99, 100) && !s1.is_live(7 + 100, 100));
    }

    #[test]
    fn sequence_zero_after_expiry_starts_afresh() {
        let mut s = ProducerState::accepted(None, 2, 0, at(1), 0);
        s.accept(2, 1, at(2), 10);
        // Forgotten after its TTL: the same epoch's seq 0 is a new producer's first append.
        s.accept(2, 0, at(3), 1_000);
        assert_eq!((s.last_seq, s.receipts.len(), s.last_active_ms), (0, 1, 1_000));
        assert_eq!(s.receipt(0), Some(at(3)));
    }

    #[test]
    fn receipts_expire_after_the_window() {
        let mut s = ProducerState::accepted(None, 0, 0, at(1), 0);
        for seq in 1..=(RECEIPT_WINDOW as u64 + 5) {
            s = ProducerState::accepted(Some(&s), 0, seq, at(seq + 1), 0);
        }
        assert_eq!(s.receipts.len(), RECEIPT_WINDOW);
        assert_eq!(validate(Some(&s), 0, 0), Verdict::Duplicate { receipt: None });
        assert_eq!(validate(Some(&s), 0, s.last_seq), Verdict::Duplicate { receipt: Some(at(s.last_seq + 1)) });
        let oldest = s.last_seq + 1 - RECEIPT_WINDOW as u64;
        assert_eq!(s.receipt(oldest), Some(at(oldest + 1)));
        assert_eq!(s.receipt(oldest - 1), None);
    }

    /// A deliberately naive model: the full history of accepted (epoch, seq, end) triples.
    #[derive(Default)]
    struct Model {
        accepted: Vec<(u64, u64, Offset)>,
    }

    impl Model {
        fn verdict(&self, epoch: u64, seq: u64) -> Verdict {
            let Some(&(cur_epoch, _, _)) = self.accepted.last() else {
                return if seq == 0 { Verdict::Accept } else { Verdict::Gap { expected: 0, received: seq } };
            };
            if epoch < cur_epoch {
                return Verdict::Fenced { current_epoch: cur_epoch };
            }
            if epoch > cur_epoch {
                return if seq == 0 { Verdict::Accept } else { Verdict::NewEpochMustStartAtZero };
            }
            let in_epoch: Vec<_> = self.accepted.iter().filter(|a| a.0 == epoch).collect();
            let max_seq = in_epoch.iter().map(|a| a.1).max().unwrap_or(0);
            if seq <= max_seq {
                let recent = in_epoch.iter().rev().take(RECEIPT_WINDOW).find(|a| a.1 == seq);
                return Verdict::Duplicate {
                    receipt: recent.map(|a| Receipt { end: a.2, digest: BodyDigest(a.2 .0) }),
                };
            }
            if seq == max_seq + 1 {
                Verdict::Accept
            } else {
                Verdict::Gap { expected: max_seq + 1, received: seq }
            }
        }
    }

    proptest! {
        #[test]
        fn state_machine_matches_model(ops in proptest::collection::vec((0u64..3, 0u64..6), 1..400)) {
            let mut model = Model::default();
            let mut state: Option<ProducerState> = None;
            let mut tail = 0u64;
            for (epoch, seq) in ops {
                let got = validate(state.as_ref(), epoch, seq);
                prop_assert_eq!(got, model.verdict(epoch, seq), "epoch {} seq {}", epoch, seq);
                if got == Verdict::Accept {
                    tail += 1 + seq;
                    state = Some(ProducerState::accepted(state.as_ref(), epoch, seq, at(tail), 0));
                    model.accepted.push((epoch, seq, Offset(tail)));
                }
            }
        }
    }
}
