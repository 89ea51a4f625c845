//! The CDN-collapsing cursor of protocol section 10.1.
//!
//! Time is cut into fixed intervals counted from an epoch; the cursor is the interval number. A
//! client that echoes a cursor at or beyond the current interval gets a strictly larger one, so a
//! CDN can never serve the same cached empty long-poll response forever.

/// 2024-10-09T00:00:00Z in Unix milliseconds: the epoch the protocol suggests.
pub const EPOCH_MS: u64 = 1_728_432_000_000;
/// Interval length: 20 seconds, as the protocol suggests.
pub const INTERVAL_MS: u64 = 20_000;

/// The cursor to return. `now_ms` is Unix time in milliseconds; `jitter_s` is a random number of
/// seconds in `1..=3600` supplied by the caller (this crate has no randomness of its own).
pub fn next_cursor(now_ms: u64, client_cursor: Option<&str>, jitter_s: u64) -> u64 {
    let current = now_ms.saturating_sub(EPOCH_MS) / INTERVAL_MS;
    match client_cursor.and_then(|c| c.parse::<u64>().ok()) {
        Some(client) if client >= current => {
            let jitter_intervals = (jitter_s.clamp(1, 3600) * 1000).div_ceil(INTERVAL_MS);
            client.saturating_add(jitter_intervals.max(1))
        }
        _ => current,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_follows_time_and_never_repeats_a_client_cursor() {
        let now = EPOCH_MS + 10 * INTERVAL_MS + 5;
        assert_eq!(next_cursor(now, None, 1), 10);
        assert_eq!(next_cursor(now, Some("3"), 1), 10);
        assert_eq!(next_cursor(now, Some("garbage"), 1), 10);
        assert!(next_cursor(now, Some("10"), 1) > 10);
        assert!(next_cursor(now, Some("500"), 3600) > 500);
    }
}
