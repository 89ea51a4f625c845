//! Time and jitter behind a trait (and [`unique_id`]): expiry, TTL windows and cursors depend on them, and tests need
//! to control them. Engines take `now_ms` from their callers, and read the clock only where no
//! caller is there to ask (recovery's start of the TTL windows).

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

pub trait Clock: Send + Sync + 'static {
    /// Unix time in milliseconds.
    fn now_ms(&self) -> i64;
    /// A pseudo-random number of seconds in `1..=3600`, for cursor jitter (section 10.1).
    fn jitter_s(&self) -> u64;
}

/// The real clock; jitter from a SplitMix64 sequence seeded by the start time. Cursor jitter needs
/// spread, not unpredictability.
#[derive(Default)]
pub struct SystemClock {
    counter: AtomicU64,
}

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
            .unwrap_or(0)
    }

    fn jitter_s(&self) -> u64 {
        let seed = self.counter.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed) ^ (self.now_ms() as u64);
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) % 3600 + 1
    }
}

/// An id that differs from every other this process makes, and (but for a 2^-64 chance) from
/// those of other processes: who a node is in notifications and leases. `RandomState`'s keys come
/// from the operating system's randomness; pid, time and a counter only add to it. No dependency
/// for an id that must merely differ.
pub fn unique_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static MADE: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u128(SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
    h.write_u64(MADE.fetch_add(1, Ordering::Relaxed));
    h.finish()
}

/// A clock that moves only when told to, with fixed jitter: for tests of time-based behaviour.
pub struct ManualClock {
    now_ms: AtomicI64,
    jitter_s: u64,
}

impl ManualClock {
    pub fn new(now_ms: i64) -> Self {
        Self { now_ms: AtomicI64::new(now_ms), jitter_s: 7 }
    }

    pub fn set(&self, now_ms: i64) {
        self.now_ms.store(now_ms, Ordering::SeqCst);
    }

    pub fn advance_ms(&self, ms: i64) {
        self.now_ms.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.now_ms.load(Ordering::SeqCst)
    }

    fn jitter_s(&self) -> u64 {
        self.jitter_s
    }
}
