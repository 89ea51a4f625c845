//! The `Date` header's text (RFC 9110 section 6.6.1: an origin server with a clock sends it),
//! formatted at most once a second per thread rather than once per response.

use std::cell::RefCell;
use std::time::{SystemTime, UNIX_EPOCH};

/// Length of an IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`).
pub const DATE_LEN: usize = 29;

struct Cached {
    second: u64,
    text: [u8; DATE_LEN],
}

thread_local! {
    static CACHED: RefCell<Cached> = const { RefCell::new(Cached { second: u64::MAX, text: [0; DATE_LEN] }) };
}

/// Calls `f` with the current date's text.
pub fn with_now<R>(f: impl FnOnce(&[u8]) -> R) -> R {
    let now = SystemTime::now();
    let second = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    CACHED.with(|cached| {
        let mut cached = cached.borrow_mut();
        if cached.second != second {
            let text = httpdate::fmt_http_date(now);
            // Always 29 bytes for dates from 1970 to 9999; a clock outside that range gets the
            // text cut or padded rather than a panic.
            let n = text.len().min(DATE_LEN);
            cached.text = [b' '; DATE_LEN];
            cached.text[..n].copy_from_slice(&text.as_bytes()[..n]);
            cached.second = second;
        }
        f(&cached.text)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_date_is_an_imf_fixdate_of_now() {
        let text = with_now(|t| String::from_utf8(t.to_vec()).expect("ascii"));
        let parsed = httpdate::parse_http_date(&text).expect("an HTTP date");
        let age = SystemTime::now().duration_since(parsed).unwrap_or_default();
        assert!(age.as_secs() <= 2, "{text} is not now");
        assert!(text.ends_with(" GMT"), "{text}");
    }
}
