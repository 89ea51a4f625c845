//! Idempotency keys for writers that keep no sequence counter.
//!
//! [`new_idempotency_key`] makes a UUIDv7 (RFC 9562): 48 bits of Unix milliseconds, then random
//! bits, so keys sort by time and never repeat in practice. Written here rather than taken from
//! a UUID crate: it is twenty lines, and the client's dependency set has no UUID crate. The
//! random bits come from the standard library's per-process random hasher keys mixed with a
//! counter: unique, not secret (a key only has to differ from other writers' keys).
//!
//! [`random_key`] makes the key a plain append carries when the caller set none (see
//! [`crate::AppendOptions::auto_idempotency_key`]): 128 bits, all of them unpredictable, as 32
//! hex digits. They are SipHash outputs of a per-process counter under a 128-bit key the
//! standard library draws from the operating system's random source (`RandomState`): without
//! that key the next value cannot be predicted from earlier ones. (The `getrandom` crate is in
//! the dependency tree, under rustls, but depending on it directly would change Cargo.lock.)

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

/// A new UUIDv7 in its text form, for `Idempotency-Key`.
pub fn new_idempotency_key() -> String {
    static SEED: OnceLock<std::collections::hash_map::RandomState> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    let mut h = SEED.get_or_init(Default::default).build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.write_u64(ms);
    let r1 = h.finish();
    h.write_u64(r1);
    let r2 = h.finish();
    // 48 bits time | version 7 | 12 random bits | variant 10 | 62 random bits
    let hi = (ms & 0xFFFF_FFFF_FFFF) << 16 | 0x7000 | (r1 & 0x0FFF);
    let lo = (r2 & 0x3FFF_FFFF_FFFF_FFFF) | 0x8000_0000_0000_0000;
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        hi >> 32,
        (hi >> 16) & 0xFFFF,
        hi & 0xFFFF,
        lo >> 48,
        lo & 0xFFFF_FFFF_FFFF
    )
}

/// A new random key for an automatic `Idempotency-Key`: 128 unpredictable bits as 32 lowercase
/// hex digits. Never repeats within a process (a counter is hashed), and between processes only
/// with probability 2^-128 per pair.
pub(crate) fn random_key() -> String {
    static SECRET: OnceLock<std::collections::hash_map::RandomState> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let secret = SECRET.get_or_init(Default::default);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let half = |lane: u64| {
        let mut h = secret.build_hasher();
        h.write_u64(n);
        h.write_u64(lane);
        h.finish()
    };
    format!("{:016x}{:016x}", half(0), half(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_keys_are_128_bit_hex_and_distinct() {
        let keys: std::collections::HashSet<String> = (0..10_000).map(|_| random_key()).collect();
        assert_eq!(keys.len(), 10_000, "no repeats");
        for k in keys.iter().take(100) {
            assert_eq!(k.len(), 32, "{k}");
            assert!(k.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()), "{k}");
        }
        // Every bit position varies: no fixed (version, time or counter) fields.
        let (mut ones, mut zeros) = (0u128, 0u128);
        for k in &keys {
            let v = u128::from_str_radix(k, 16).expect("hex");
            ones |= v;
            zeros |= !v;
        }
        assert_eq!((ones, zeros), (u128::MAX, u128::MAX));
    }

    #[test]
    fn keys_are_uuid_v7_and_distinct() {
        let a = new_idempotency_key();
        let b = new_idempotency_key();
        assert_ne!(a, b);
        assert_eq!(a.len(), 36);
        let parts: Vec<&str> = a.split('-').collect();
        assert_eq!(parts.iter().map(|p| p.len()).collect::<Vec<_>>(), vec![8, 4, 4, 4, 12]);
        assert!(parts[2].starts_with('7'), "version 7: {a}");
        assert!(matches!(parts[3].as_bytes()[0], b'8' | b'9' | b'a' | b'b'), "RFC variant: {a}");
        let ms = u64::from_str_radix(&format!("{}{}", parts[0], parts[1]), 16).expect("hex");
        let now = SystemTime::now().duration_since(UNIX_EPOCH).expect("clock").as_millis() as u64;
        assert!(now.abs_diff(ms) < 60_000, "the time field is now");
    }
}
