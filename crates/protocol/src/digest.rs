//! Digests of append bodies, kept with each producer receipt so that a retry reusing a sequence
//! number with *different* bytes is told apart from a true retry.
//!
//! 64-bit XXH3: the digest only has to catch a client that reuses `(epoch, seq)` for new data by
//! mistake, for which a 1-in-2^64 accidental match is negligible; someone able to craft a
//! collision can already write anything to the stream with that producer. XXH3 runs at memory
//! speed, so hashing a 16 MiB body costs about a millisecond, on the request's own task.

/// The digest of one append's stored body; [`BodyDigest::UNKNOWN`] for receipts written before
/// digests were kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct BodyDigest(pub u64);

impl BodyDigest {
    /// No digest: matches any body (receipts recovered from records that predate digests).
    pub const UNKNOWN: BodyDigest = BodyDigest(0);

    pub fn of(body: &[u8]) -> BodyDigest {
        // 0 is reserved for UNKNOWN; a body hashing to it is recorded as 1.
        BodyDigest(xxhash_rust::xxh3::xxh3_64(body).max(1))
    }

    /// Whether a receipt with this digest can belong to a body with digest `other`.
    pub fn matches(self, other: BodyDigest) -> bool {
        self == other || self == Self::UNKNOWN || other == Self::UNKNOWN
    }
}

/// An `Idempotency-Key`, as kept: the 128-bit XXH3 of the key, so every key costs 16 bytes in
/// records and memory whatever its length (up to 255 characters); two different keys of one
/// stream colliding is a 1-in-2^128 event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyId(pub u128);

impl KeyId {
    pub fn of(key: &str) -> KeyId {
        KeyId(xxhash_rust::xxh3::xxh3_128(key.as_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_bodies_match_and_different_ones_do_not() {
        assert_eq!(BodyDigest::of(b"abc"), BodyDigest::of(b"abc"));
        assert!(!BodyDigest::of(b"abc").matches(BodyDigest::of(b"abd")));
        assert!(BodyDigest::UNKNOWN.matches(BodyDigest::of(b"x")) && BodyDigest::of(b"x").matches(BodyDigest::UNKNOWN));
        assert_ne!(BodyDigest::of(b""), BodyDigest::UNKNOWN);
    }
}
