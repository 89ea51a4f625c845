//! The stored form of a stream's retention time marks ([`TimeMarks`]): PostgreSQL's
//! `streams.marks` column and the log engine's checkpoints (from layout 5).
//!
//! Layout, tag `0x01`: then per mark its end offset u64 and its time (Unix ms) i64, both
//! little-endian, oldest first: 1 + 16 bytes per mark (at most about 130 marks per stream).

use oncelog_protocol::Offset;

use super::{DecodeError, Decoder, Encoder};
use crate::retention::{TimeMark, TimeMarks};

const TAG_V1: u8 = 0x01;

pub fn encode(marks: &[TimeMark]) -> Vec<u8> {
    let mut out = Encoder(Vec::with_capacity(1 + 16 * marks.len()));
    out.u8(TAG_V1);
    for m in marks {
        out.u64(m.end.0).i64(m.at_ms);
    }
    out.0
}

pub fn decode(bytes: &[u8]) -> Result<TimeMarks, DecodeError> {
    let mut d = Decoder(bytes);
    d.tag(TAG_V1)?;
    if d.remaining() % 16 != 0 {
        return Err(DecodeError::Truncated);
    }
    let mut marks = TimeMarks::with_capacity(d.remaining() / 16);
    while d.remaining() > 0 {
        marks.push(TimeMark { end: Offset(d.u64()?), at_ms: d.i64()? });
    }
    Ok(marks)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn round_trip(raw in proptest::collection::vec((any::<u64>(), any::<i64>()), 0..20)) {
            let marks: TimeMarks = raw.into_iter().map(|(end, at_ms)| TimeMark { end: Offset(end), at_ms }).collect();
            prop_assert_eq!(decode(&encode(&marks)), Ok(marks));
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..60)) {
            let _ = decode(&bytes);
        }
    }

    #[test]
    fn unknown_tags_and_torn_marks_are_refused() {
        assert_eq!(decode(&[0x02]), Err(DecodeError::UnknownTag(0x02)));
        let mut one = encode(&[TimeMark { end: Offset(5), at_ms: 7 }]);
        one.pop();
        assert!(decode(&one).is_err());
    }
}
