//! Retry timing: exponential backoff with jitter, and the randomness behind it.
//!
//! Randomness sits behind the small [`Jitter`] trait so tests can make delays exact; time is
//! `tokio::time`, so tests can pause and advance it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::Error;

/// A source of numbers in `[0, 1)` that spreads retries out.
pub trait Jitter: Send + Sync + std::fmt::Debug {
    /// The next number in `[0, 1)`.
    fn unit(&self) -> f64;
}

/// The default [`Jitter`]: a xorshift generator seeded from the standard library's per-process
/// random hasher keys. Not cryptographic; it only has to keep clients from retrying in lockstep.
#[derive(Debug)]
pub struct SystemJitter {
    /// Generator state; atomic so one instance can serve many tasks.
    state: AtomicU64,
}

impl Default for SystemJitter {
    fn default() -> Self {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(0x9E37_79B9_7F4A_7C15);
        SystemJitter { state: AtomicU64::new(h.finish() | 1) }
    }
}

impl Jitter for SystemJitter {
    fn unit(&self) -> f64 {
        let step = |mut x: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let prev = self.state.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |x| Some(step(x))).unwrap_or(1);
        (step(prev) >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// A [`Jitter`] that always answers the same number: for tests and for deterministic delays.
#[derive(Debug, Clone, Copy)]
pub struct FixedJitter(pub f64);

impl Jitter for FixedJitter {
    fn unit(&self) -> f64 {
        self.0.clamp(0.0, 1.0 - f64::EPSILON)
    }
}

/// How a failed request is retried.
///
/// The n-th retry waits a random time in `[d/2, d)` where `d = min(max_delay, initial_delay ·
/// multiplier^(n-1))` ("equal jitter": never zero, never in lockstep). A server's `Retry-After` is
/// honoured when it asks for longer (up to [`RetryPolicy::MAX_RETRY_AFTER`]).
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// The first retry's delay bound.
    initial_delay: Duration,
    /// The cap on any delay bound.
    max_delay: Duration,
    /// Growth factor of the delay bound per attempt.
    multiplier: f64,
    /// At most this many attempts in total (the first included); `None` = no limit.
    max_attempts: Option<u32>,
    /// Give up once this much time has passed since the first attempt; `None` = no limit.
    max_elapsed: Option<Duration>,
}

impl Default for RetryPolicy {
    /// 100 ms doubling to 2 s, at most 10 attempts: a request fails within about 12 s when the
    /// server stays unreachable.
    fn default() -> Self {
        RetryPolicy {
            initial_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(2),
            multiplier: 2.0,
            max_attempts: Some(10),
            max_elapsed: None,
        }
    }
}

impl RetryPolicy {
    /// The longest `Retry-After` honoured; longer requests are capped so a misbehaving server
    /// cannot park a client for hours.
    pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

    /// A validated policy: `initial_delay > 0`, `max_delay >= initial_delay`, `multiplier >= 1`.
    pub fn new(initial_delay: Duration, max_delay: Duration, multiplier: f64) -> Result<RetryPolicy, Error> {
        if initial_delay.is_zero() {
            return Err(Error::invalid("initialDelayMs (initial_delay) must be greater than zero"));
        }
        if max_delay < initial_delay {
            return Err(Error::invalid("maxDelayMs (max_delay) must not be less than initial_delay"));
        }
        if !(multiplier >= 1.0 && multiplier.is_finite()) {
            return Err(Error::invalid("multiplier must be a finite number >= 1.0"));
        }
        Ok(RetryPolicy { initial_delay, max_delay, multiplier, max_attempts: None, max_elapsed: None })
    }

    /// Never retry.
    pub fn none() -> RetryPolicy {
        RetryPolicy { max_attempts: Some(1), ..RetryPolicy::default() }
    }

    /// Caps the number of attempts (the first one included); `None` removes the cap. Zero is
    /// refused: a request is always attempted once.
    pub fn with_max_attempts(mut self, max_attempts: Option<u32>) -> Result<RetryPolicy, Error> {
        if max_attempts == Some(0) {
            return Err(Error::invalid("maxRetries (max_attempts) must allow at least one attempt"));
        }
        self.max_attempts = max_attempts;
        Ok(self)
    }

    /// Caps the time spent retrying one request; `None` removes the cap.
    pub fn with_max_elapsed(mut self, max_elapsed: Option<Duration>) -> RetryPolicy {
        self.max_elapsed = max_elapsed;
        self
    }

    /// The attempt cap.
    pub fn max_attempts(&self) -> Option<u32> {
        self.max_attempts
    }

    /// The delay bound before retry number `retry` (1-based), before jitter.
    fn bound(&self, retry: u32) -> Duration {
        let exp = self.multiplier.powi(i32::try_from(retry.saturating_sub(1)).unwrap_or(i32::MAX));
        let secs = (self.initial_delay.as_secs_f64() * exp).min(self.max_delay.as_secs_f64());
        Duration::try_from_secs_f64(secs).unwrap_or(self.max_delay)
    }

    /// The jittered delay before retry number `retry` (1-based).
    pub fn delay(&self, retry: u32, jitter: &dyn Jitter) -> Duration {
        let bound = self.bound(retry);
        bound / 2 + bound.mul_f64(jitter.unit() / 2.0)
    }
}

/// The retry state of one request: counts attempts and decides the next delay.
#[derive(Debug)]
pub struct Backoff {
    /// The policy being followed.
    policy: RetryPolicy,
    /// Spreads delays out.
    jitter: Arc<dyn Jitter>,
    /// Attempts made so far.
    attempts: u32,
    /// When the first attempt was made, for `max_elapsed`.
    started: Instant,
}

impl Backoff {
    /// A fresh state; call [`Backoff::next_delay`] after each failed attempt.
    pub fn new(policy: RetryPolicy, jitter: Arc<dyn Jitter>) -> Backoff {
        Backoff { policy, jitter, attempts: 1, started: Instant::now() }
    }

    /// Attempts made so far (starts at 1: the first attempt).
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// After a failed attempt: how long to wait before the next one, or `None` when the policy
    /// says to give up. `retry_after` is the server's `Retry-After`, if any.
    pub fn next_delay(&mut self, retry_after: Option<Duration>) -> Option<Duration> {
        if self.policy.max_attempts.is_some_and(|max| self.attempts >= max) {
            return None;
        }
        let mut delay = self.policy.delay(self.attempts, self.jitter.as_ref());
        if let Some(ra) = retry_after {
            delay = delay.max(ra.min(RetryPolicy::MAX_RETRY_AFTER));
        }
        if let Some(max) = self.policy.max_elapsed {
            if self.started.elapsed() + delay > max {
                return None;
            }
        }
        self.attempts += 1;
        Some(delay)
    }

    /// Starts over after a success, keeping the policy.
    pub fn reset(&mut self) {
        self.attempts = 1;
        self.started = Instant::now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_are_capped_and_jittered() {
        let p = RetryPolicy::new(Duration::from_millis(100), Duration::from_millis(800), 2.0).expect("valid");
        let lo = FixedJitter(0.0);
        let hi = FixedJitter(0.999_999);
        assert_eq!(p.delay(1, &lo), Duration::from_millis(50));
        assert_eq!(p.delay(2, &lo), Duration::from_millis(100));
        assert_eq!(p.delay(3, &lo), Duration::from_millis(200));
        assert_eq!(p.delay(10, &lo), Duration::from_millis(400), "capped at max_delay");
        assert!(p.delay(1, &hi) < Duration::from_millis(100) && p.delay(1, &hi) > Duration::from_millis(99));
    }

    #[test]
    fn validation_names_the_field() {
        let e = |r: Result<RetryPolicy, Error>| r.expect_err("invalid").to_string();
        assert!(e(RetryPolicy::new(Duration::ZERO, Duration::from_secs(1), 2.0)).contains("initialDelayMs"));
        assert!(e(RetryPolicy::new(Duration::from_secs(2), Duration::from_secs(1), 2.0)).contains("maxDelayMs"));
        assert!(e(RetryPolicy::new(Duration::from_secs(1), Duration::from_secs(1), 0.5)).contains("multiplier"));
        assert!(e(RetryPolicy::default().with_max_attempts(Some(0))).contains("maxRetries"));
    }

    #[tokio::test(start_paused = true)]
    async fn backoff_honours_limits_and_retry_after() {
        let policy = RetryPolicy::default().with_max_attempts(Some(3)).expect("valid");
        let mut b = Backoff::new(policy, Arc::new(FixedJitter(0.0)));
        assert_eq!(b.next_delay(None), Some(Duration::from_millis(50)));
        assert_eq!(
            b.next_delay(Some(Duration::from_secs(1))),
            Some(Duration::from_secs(1)),
            "Retry-After wins when longer"
        );
        assert_eq!(b.next_delay(None), None, "three attempts made");
        b.reset();
        assert_eq!(b.attempts(), 1);

        let policy = RetryPolicy::default()
            .with_max_attempts(None)
            .expect("valid")
            .with_max_elapsed(Some(Duration::from_secs(1)));
        let mut b = Backoff::new(policy, Arc::new(FixedJitter(0.0)));
        tokio::time::advance(Duration::from_millis(990)).await;
        assert_eq!(b.next_delay(None), None, "the next delay would overrun max_elapsed");
    }

    #[test]
    fn system_jitter_is_in_range_and_varies() {
        let j = SystemJitter::default();
        let xs: Vec<f64> = (0..1000).map(|_| j.unit()).collect();
        assert!(xs.iter().all(|x| (0.0..1.0).contains(x)));
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        assert!((0.4..0.6).contains(&mean), "mean {mean}");
    }
}
