//! Append rate limits per writer: a token bucket of appends per second and one of body bytes
//! per second, each keyed by who writes (the token's subject or digest when authentication is
//! on, the client's IP address when it is off). Beyond either: `429` with `Retry-After`; a
//! producer retries with the same sequence number, so nothing is written twice.
//!
//! Buckets refill continuously (GCRA, by `governor`); a bucket holds one second's worth, and the
//! byte bucket at least one largest-possible append, so that any single append can pass.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use governor::clock::{Clock as _, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};

/// A writer's bucket is empty: `429` with `Retry-After`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("append rate limit reached; retry in {retry_after_s} s")]
pub struct RateLimited {
    pub retry_after_s: u64,
}

/// The limits; `None` for a bucket that is off.
pub struct RateLimits {
    appends: Option<DefaultKeyedRateLimiter<String>>,
    bytes: Option<DefaultKeyedRateLimiter<String>>,
    clock: DefaultClock,
}

fn retry_after(wait: Duration) -> RateLimited {
    RateLimited { retry_after_s: wait.as_secs() + u64::from(wait.subsec_nanos() > 0) }
}

impl RateLimits {
    /// `appends_per_s` and `bytes_per_s` of 0 switch that bucket off.
    pub fn new(appends_per_s: u32, bytes_per_s: u32, max_append_bytes: usize) -> Arc<Self> {
        let appends = NonZeroU32::new(appends_per_s).map(|n| RateLimiter::keyed(Quota::per_second(n)));
        let bytes = NonZeroU32::new(bytes_per_s).map(|n| {
            let burst = NonZeroU32::new(n.get().max(u32::try_from(max_append_bytes).unwrap_or(u32::MAX))).unwrap_or(n);
            RateLimiter::keyed(Quota::per_second(n).allow_burst(burst))
        });
        Arc::new(Self { appends, bytes, clock: DefaultClock::default() })
    }

    pub fn enabled(&self) -> bool {
        self.appends.is_some() || self.bytes.is_some()
    }

    /// One append by `who`.
    pub fn append(&self, who: &str) -> Result<(), RateLimited> {
        let Some(l) = &self.appends else { return Ok(()) };
        l.check_key(&who.to_owned()).map_err(|not_until| retry_after(not_until.wait_time_from(self.clock.now())))
    }

    /// `n` body bytes by `who`.
    pub fn bytes(&self, who: &str, n: usize) -> Result<(), RateLimited> {
        let (Some(l), Some(n)) = (&self.bytes, NonZeroU32::new(u32::try_from(n).unwrap_or(u32::MAX))) else {
            return Ok(());
        };
        match l.check_key_n(&who.to_owned(), n) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(not_until)) => Err(retry_after(not_until.wait_time_from(self.clock.now()))),
            // Larger than a whole bucket: never passes at this rate; say when it is full again.
            Err(_) => Err(retry_after(Duration::from_secs(1))),
        }
    }

    /// Forgets writers whose buckets are full again (bounded memory under many addresses).
    pub fn prune(&self) {
        for l in [&self.appends, &self.bytes].into_iter().flatten() {
            l.retain_recent();
            l.shrink_to_fit();
        }
    }
}
