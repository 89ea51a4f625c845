//! `ProducerRecord`: one idempotent producer's state on one stream (the log engine's
//! checkpoints; PostgreSQL's `producers.state`).
//!
//! Layout, tag `0x02`: epoch u64, last_seq u64, last_active_ms i64, receipt count u8, then (when
//! the count is not zero) the newest receipt's end offset as u64 and, going back in time, the
//! difference to each older one as a varint (receipts are end offsets of consecutive sequence
//! numbers, so each difference is one append's length: a couple of bytes instead of eight), then
//! the receipts' body digests, newest first, u64 each. All fixed-width integers little-endian.
//!
//! Tag `0x01` (written before digests and activity times were kept) is the same without
//! `last_active_ms` and digests: it still decodes, its digests as
//! [`BodyDigest::UNKNOWN`](oncelog_protocol::digest::BodyDigest::UNKNOWN) and its activity time as
//! the time given to [`ProducerRecord::decode`] (the recovery time: the TTL starts then).
//!
//! PostgreSQL rewrites this record with every accepted append of its producer, in the append's
//! transaction, so its size is traffic on the hot path.

use std::collections::VecDeque;

use oncelog_protocol::digest::BodyDigest;
use oncelog_protocol::producer::{ProducerState, Receipt, RECEIPT_WINDOW};
use oncelog_protocol::Offset;

use super::{DecodeError, Decoder, Encoder};

const TAG_V1: u8 = 0x01;
const TAG_V2: u8 = 0x02;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProducerRecord(pub ProducerState);

impl ProducerRecord {
    pub fn encode(&self) -> Vec<u8> {
        Self::encode_state(&self.0)
    }

    /// Encodes a state without wrapping (or copying) it.
    pub fn encode_state(s: &ProducerState) -> Vec<u8> {
        let mut e = Encoder(Vec::with_capacity(34 + 11 * s.receipts.len()));
        let n = s.receipts.len().min(RECEIPT_WINDOW);
        e.u8(TAG_V2).u64(s.epoch).u64(s.last_seq).u64(s.last_active_ms as u64).u8(n as u8);
        let mut newer: Option<u64> = None;
        for r in s.receipts.iter().rev().take(n) {
            match newer {
                None => e.u64(r.end.0),
                // Receipts never decrease; saturate rather than wrap on a corrupt state.
                Some(n) => e.varint(n.saturating_sub(r.end.0)),
            };
            newer = Some(r.end.0);
        }
        for r in s.receipts.iter().rev().take(n) {
            e.u64(r.digest.0);
        }
        e.0
    }

    /// Decodes either version; `legacy_active_ms` stands in for a version-1 record's missing
    /// activity time.
    pub fn decode(bytes: &[u8], legacy_active_ms: i64) -> Result<Self, DecodeError> {
        let mut d = Decoder(bytes);
        let v2 = match d.u8()? {
            TAG_V1 => false,
            TAG_V2 => true,
            t => return Err(DecodeError::UnknownTag(t)),
        };
        let epoch = d.u64()?;
        let last_seq = d.u64()?;
        let last_active_ms = if v2 { d.u64()? as i64 } else { legacy_active_ms };
        let n = d.u8()? as usize;
        if n > RECEIPT_WINDOW {
            return Err(DecodeError::InvalidValue);
        }
        let mut ends = Vec::with_capacity(n);
        if n > 0 {
            let mut r = d.u64()?;
            ends.push(r);
            for _ in 1..n {
                r = r.checked_sub(d.varint()?).ok_or(DecodeError::InvalidValue)?;
                ends.push(r);
            }
        }
        // As many as stored, not the whole window: a restart does not grow every idle
        // producer's state to the full window (see `ProducerState::new`).
        let mut receipts = VecDeque::with_capacity(n);
        for end in ends {
            let digest = if v2 { BodyDigest(d.u64()?) } else { BodyDigest::UNKNOWN };
            receipts.push_front(Receipt { end: Offset(end), digest });
        }
        d.finish()?;
        Ok(ProducerRecord(ProducerState { epoch, last_seq, receipts, last_active_ms }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn round_trip(epoch: u64, last_seq: u64, last_active_ms: i64, mut receipts in proptest::collection::vec((any::<u64>(), any::<u64>()), 0..=RECEIPT_WINDOW)) {
            receipts.sort_unstable(); // receipts are end offsets of consecutive appends
            let receipts = receipts.into_iter().map(|(end, d)| Receipt { end: Offset(end), digest: BodyDigest(d) }).collect();
            let rec = ProducerRecord(ProducerState { epoch, last_seq, receipts, last_active_ms });
            prop_assert_eq!(ProducerRecord::decode(&rec.encode(), 0), Ok(rec));
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = ProducerRecord::decode(&bytes, 0);
        }
    }

    #[test]
    fn a_full_window_of_kilobyte_appends_is_small() {
        let receipts = (1..=RECEIPT_WINDOW as u64)
            .map(|i| Receipt { end: Offset(1_000_000 + i * 1024), digest: BodyDigest(i) })
            .collect();
        let rec = ProducerRecord(ProducerState { epoch: 1, last_seq: 99, receipts, last_active_ms: 1 });
        let digests = 8 * RECEIPT_WINDOW;
        assert!(rec.encode().len() <= 26 + 8 + 2 * (RECEIPT_WINDOW - 1) + digests, "{} bytes", rec.encode().len());
    }

    /// Bytes a version-1 record had on disk: epoch 3, last_seq 7, two receipts (20 and 12).
    #[test]
    fn version_1_records_still_decode() {
        let mut v1 = vec![TAG_V1];
        v1.extend_from_slice(&3u64.to_le_bytes());
        v1.extend_from_slice(&7u64.to_le_bytes());
        v1.push(2);
        v1.extend_from_slice(&20u64.to_le_bytes());
        v1.push(8);
        let got = ProducerRecord::decode(&v1, 555).expect("v1").0;
        assert_eq!((got.epoch, got.last_seq, got.last_active_ms), (3, 7, 555));
        let unknown = |end| Receipt { end: Offset(end), digest: BodyDigest::UNKNOWN };
        assert_eq!(got.receipts, VecDeque::from(vec![unknown(12), unknown(20)]));
    }

    #[test]
    fn unknown_tag_is_refused() {
        assert_eq!(ProducerRecord::decode(&[0x7f], 0), Err(DecodeError::UnknownTag(0x7f)));
    }
}
