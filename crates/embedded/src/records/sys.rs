//! `NextStreamId` (keyspace `sys`, key `next_stream_id`): the id the next created stream gets.
//! Written in the batch of every create, so ids are never reused, even across a crash.
//!
//! Layout, tag `0x02`: the id as u64. Data directories written before the tag existed hold the
//! bare 8-byte u64; [`decode`] still reads that form (it cannot be confused with the tagged one,
//! which is 9 bytes) and the next create rewrites it tagged.

use super::{DecodeError, Decoder, Encoder};

const TAG_V1: u8 = 0x02;

pub fn encode(next_id: u64) -> Vec<u8> {
    let mut e = Encoder(Vec::with_capacity(9));
    e.u8(TAG_V1).u64(next_id);
    e.0
}

pub fn decode(bytes: &[u8]) -> Result<u64, DecodeError> {
    if bytes.len() == 8 {
        return Decoder(bytes).u64();
    }
    let mut d = Decoder(bytes);
    d.tag(TAG_V1)?;
    let v = d.u64()?;
    d.finish()?;
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn round_trip_and_legacy_form(v: u64) {
            prop_assert_eq!(decode(&encode(v)), Ok(v));
            prop_assert_eq!(decode(&v.to_le_bytes()), Ok(v));
        }
    }

    #[test]
    fn other_tags_are_refused() {
        let mut b = encode(5);
        b[0] = 0x01;
        assert_eq!(decode(&b), Err(DecodeError::UnknownTag(0x01)));
    }
}
