//! `ProducerRecord`: one idempotent producer's state on one stream (the embedded engine's
//! keyspace `producers`; the log engine's checkpoints).
//!
//! Layout, tag `0x01`: epoch u64, last_seq u64, receipt count u8, then (when the count is not
//! zero) the newest receipt as u64 and, going back in time, the difference to each older receipt
//! as a varint. Receipts are end offsets of consecutive sequence numbers, so each difference is
//! one append's length: a couple of bytes instead of eight. This record is rewritten with every
//! accepted append, so its size is journal traffic on the hot path. Written in the same batch as
//! the append it accepts.

use std::collections::VecDeque;

use oncelog_protocol::producer::{ProducerState, RECEIPT_WINDOW};
use oncelog_protocol::Offset;

use super::{DecodeError, Decoder, Encoder};

const TAG_V1: u8 = 0x01;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProducerRecord(pub ProducerState);

impl ProducerRecord {
    pub fn encode(&self) -> Vec<u8> {
        Self::encode_state(&self.0)
    }

    /// Encodes a state without wrapping (or copying) it.
    pub fn encode_state(s: &ProducerState) -> Vec<u8> {
        let mut e = Encoder(Vec::with_capacity(26 + 3 * s.receipts.len()));
        let n = s.receipts.len().min(RECEIPT_WINDOW);
        e.u8(TAG_V1).u64(s.epoch).u64(s.last_seq).u8(n as u8);
        let mut newer: Option<u64> = None;
        for r in s.receipts.iter().rev().take(n) {
            match newer {
                None => e.u64(r.0),
                // Receipts never decrease; saturate rather than wrap on a corrupt state.
                Some(n) => e.varint(n.saturating_sub(r.0)),
            };
            newer = Some(r.0);
        }
        e.0
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut d = Decoder(bytes);
        d.tag(TAG_V1)?;
        let epoch = d.u64()?;
        let last_seq = d.u64()?;
        let n = d.u8()? as usize;
        if n > RECEIPT_WINDOW {
            return Err(DecodeError::InvalidValue);
        }
        let mut receipts = VecDeque::with_capacity(n);
        if n > 0 {
            let mut r = d.u64()?;
            receipts.push_front(Offset(r));
            for _ in 1..n {
                r = r.checked_sub(d.varint()?).ok_or(DecodeError::InvalidValue)?;
                receipts.push_front(Offset(r));
            }
        }
        d.finish()?;
        Ok(ProducerRecord(ProducerState { epoch, last_seq, receipts }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn round_trip(epoch: u64, last_seq: u64, mut receipts in proptest::collection::vec(any::<u64>(), 0..=RECEIPT_WINDOW)) {
            receipts.sort_unstable(); // receipts are end offsets of consecutive appends
            let rec = ProducerRecord(ProducerState { epoch, last_seq, receipts: receipts.into_iter().map(Offset).collect() });
            prop_assert_eq!(ProducerRecord::decode(&rec.encode()), Ok(rec));
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = ProducerRecord::decode(&bytes);
        }
    }

    #[test]
    fn a_full_window_of_kilobyte_appends_is_small() {
        let receipts = (1..=RECEIPT_WINDOW as u64).map(|i| Offset(1_000_000 + i * 1024)).collect();
        let rec = ProducerRecord(ProducerState { epoch: 1, last_seq: 99, receipts });
        assert!(rec.encode().len() <= 18 + 8 + 2 * (RECEIPT_WINDOW - 1), "{} bytes", rec.encode().len());
    }

    #[test]
    fn unknown_tag_is_refused() {
        assert_eq!(ProducerRecord::decode(&[0x7f]), Err(DecodeError::UnknownTag(0x7f)));
    }
}
