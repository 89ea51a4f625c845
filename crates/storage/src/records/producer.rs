//! `ProducerRecord`: one idempotent producer's state on one stream (keyspace `producers`).
//!
//! Layout, tag `0x01`: epoch u64, last_seq u64, receipt count u8, receipts (end offsets, u64
//! each, oldest first). Written in the same batch as the append it accepts.

use std::collections::VecDeque;

use oncelog_protocol::producer::{ProducerState, RECEIPT_WINDOW};
use oncelog_protocol::Offset;

use super::{DecodeError, Decoder, Encoder};

const TAG_V1: u8 = 0x01;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProducerRecord(pub ProducerState);

impl ProducerRecord {
    pub fn encode(&self) -> Vec<u8> {
        let s = &self.0;
        let mut e = Encoder(Vec::with_capacity(18 + 8 * s.receipts.len()));
        let n = s.receipts.len().min(RECEIPT_WINDOW);
        e.u8(TAG_V1).u64(s.epoch).u64(s.last_seq).u8(n as u8);
        for r in s.receipts.iter().skip(s.receipts.len() - n) {
            e.u64(r.0);
        }
        e.0
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut d = Decoder(bytes);
        d.tag(TAG_V1)?;
        let epoch = d.u64()?;
        let last_seq = d.u64()?;
        let n = d.u8()? as usize;
        let mut receipts = VecDeque::with_capacity(n);
        for _ in 0..n {
            receipts.push_back(Offset(d.u64()?));
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
        fn round_trip(epoch: u64, last_seq: u64, receipts in proptest::collection::vec(any::<u64>(), 0..=RECEIPT_WINDOW)) {
            let rec = ProducerRecord(ProducerState { epoch, last_seq, receipts: receipts.into_iter().map(Offset).collect() });
            prop_assert_eq!(ProducerRecord::decode(&rec.encode()), Ok(rec));
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = ProducerRecord::decode(&bytes);
        }
    }

    #[test]
    fn unknown_tag_is_refused() {
        assert_eq!(ProducerRecord::decode(&[0x7f]), Err(DecodeError::UnknownTag(0x7f)));
    }
}
