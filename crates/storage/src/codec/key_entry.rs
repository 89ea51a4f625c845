//! The stored form of a [`KeyEntry`]: what is kept of one idempotency key (PostgreSQL's
//! `idem_keys.entry`; the log engine keeps the same fields in its Append records).
//!
//! Layout, tag `0x01`: end offset u64, body digest u64, time of acceptance (Unix ms) i64, all
//! little-endian: 25 bytes.

use oncelog_protocol::digest::BodyDigest;
use oncelog_protocol::Offset;

use super::{DecodeError, Decoder, Encoder};
use crate::meta::KeyEntry;

const TAG_V1: u8 = 0x01;

pub fn encode(e: &KeyEntry) -> Vec<u8> {
    let mut out = Encoder(Vec::with_capacity(25));
    out.u8(TAG_V1).u64(e.end.0).u64(e.digest.0).u64(e.at_ms as u64);
    out.0
}

pub fn decode(bytes: &[u8]) -> Result<KeyEntry, DecodeError> {
    let mut d = Decoder(bytes);
    d.tag(TAG_V1)?;
    let entry = KeyEntry { end: Offset(d.u64()?), digest: BodyDigest(d.u64()?), at_ms: d.u64()? as i64 };
    d.finish()?;
    Ok(entry)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn round_trip(end: u64, digest: u64, at_ms: i64) {
            let e = KeyEntry { end: Offset(end), digest: BodyDigest(digest), at_ms };
            prop_assert_eq!(decode(&encode(&e)), Ok(e));
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            let _ = decode(&bytes);
        }
    }
}
