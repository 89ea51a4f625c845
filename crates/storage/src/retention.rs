//! Retention policies: how much of a stream is kept, and the rules that decide where the
//! retention sweep moves a stream's earliest offset. One set of rules for every engine; an
//! engine only supplies its append boundaries and the stream's time marks.
//!
//! ## Time marks
//! Age retention needs to know when data was written, and an append's record does not say.
//! So a stream with a maximum age keeps *time marks*: `(end, at_ms)` pairs, in offset order,
//! each meaning "every byte below `end` was written at or before `at_ms`". Every append to such
//! a stream notes its end and time ([`note_write`]): the last mark moves forward to cover it,
//! or, once the mark before the last is [`mark_interval_ms`] old, a new mark starts. So any two
//! marks with one between them are at least 1/64 of the maximum age apart (and at least a
//! second): a stream holds at most about 130 marks whatever its write rate, and age retention
//! drops data at most one interval (plus a sweep interval) late, never early. Engines persist every noted write (the time rides in the append's own atomic unit)
//! and replay it through the same function, so marks after recovery equal marks before.

use oncelog_protocol::Offset;

/// How much of a stream is kept. `None`: no limit. Fixed at creation (`Stream-Retention-Max-Age`,
/// `Stream-Retention-Max-Bytes`, or the server's defaults); shown on `HEAD`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RetentionPolicy {
    /// Data older than this many seconds is dropped.
    pub max_age_s: Option<u64>,
    /// At least this many of the newest bytes are kept; whole appends before them are dropped.
    pub max_bytes: Option<u64>,
}

impl RetentionPolicy {
    /// No limits: the stream keeps everything until trimmed or deleted.
    pub const NONE: RetentionPolicy = RetentionPolicy { max_age_s: None, max_bytes: None };

    pub fn is_none(&self) -> bool {
        self.max_age_s.is_none() && self.max_bytes.is_none()
    }
}

/// A create request's retention: the policy a new stream gets, and which limits the request
/// named itself. Only named limits are compared by an idempotent re-create: the others came from
/// the server's defaults, which an operator may change between the two requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RetentionRequest {
    pub policy: RetentionPolicy,
    pub named_age: bool,
    pub named_bytes: bool,
}

impl RetentionRequest {
    /// Whether an existing stream's policy satisfies this request.
    pub fn matches(&self, existing: &RetentionPolicy) -> bool {
        (!self.named_age || self.policy.max_age_s == existing.max_age_s)
            && (!self.named_bytes || self.policy.max_bytes == existing.max_bytes)
    }
}

/// Every byte below `end` was written at or before `at_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeMark {
    pub end: Offset,
    pub at_ms: i64,
}

/// A stream's time marks, oldest first. Empty (no allocation) for streams without a maximum age.
pub type TimeMarks = Vec<TimeMark>;

/// Marks per maximum age: the precision of age retention.
pub const MARKS_PER_AGE: u64 = 64;

/// How far apart marks start, for a maximum age of `max_age_s`.
pub fn mark_interval_ms(max_age_s: u64) -> i64 {
    i64::try_from(max_age_s.saturating_mul(1000) / MARKS_PER_AGE).unwrap_or(i64::MAX).max(1000)
}

/// Whether appends to a stream with this policy carry their time (to be noted as marks).
pub fn marks_writes(policy: &RetentionPolicy) -> bool {
    policy.max_age_s.is_some()
}

/// What noting a write did to the marks, for engines that store marks one key per mark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkChange {
    /// The policy keeps no marks, or the write changed nothing.
    None,
    /// The last mark (index `len - 1`) now covers the write.
    Extended,
    /// A new mark was pushed.
    Started,
}

/// Notes that the stream's data up to `end` was written at `at_ms` (the append's time, or the
/// creation time of initial data). Engines call it for every append of a stream whose policy
/// [`marks_writes`], when writing and again when replaying.
pub fn note_write(marks: &mut TimeMarks, policy: &RetentionPolicy, end: Offset, at_ms: i64) -> MarkChange {
    let Some(max_age_s) = policy.max_age_s else { return MarkChange::None };
    let interval = mark_interval_ms(max_age_s);
    // Times only move forward here: a clock stepping back must not make a mark claim that
    // bytes written later are older.
    let at_ms = marks.last().map_or(at_ms, |m| m.at_ms.max(at_ms));
    let n = marks.len();
    let start_new = n < 2 || at_ms.saturating_sub(marks[n - 2].at_ms) >= interval;
    if start_new {
        if marks.last().is_some_and(|m| m.end >= end) {
            return MarkChange::None;
        }
        marks.push(TimeMark { end, at_ms });
        MarkChange::Started
    } else {
        let last = &mut marks[n - 1];
        last.end = last.end.max(end);
        last.at_ms = at_ms;
        MarkChange::Extended
    }
}

/// Drops the marks a stream no longer needs once its earliest offset is `earliest`: those whose
/// bytes all lie below it. Returns how many were dropped (from the front).
pub fn drop_marks_below(marks: &mut TimeMarks, earliest: Offset) -> usize {
    let n = marks.partition_point(|m| m.end <= earliest);
    marks.drain(..n);
    n
}

/// Where the retention sweep moves a stream's earliest offset at `now_ms`, or `None` when it
/// stays. The new earliest is the greatest append boundary such that everything below it is
/// either older than the maximum age or outside the newest `max_bytes`; it never moves back and
/// never cuts an append. `boundary_at_or_below(x)` is the engine's greatest append boundary
/// (an append's end offset, or where the stream's own data starts) at or below `x`.
pub fn floor(
    policy: &RetentionPolicy,
    tail: Offset,
    earliest: Offset,
    now_ms: i64,
    marks: &[TimeMark],
    mut boundary_at_or_below: impl FnMut(Offset) -> Offset,
) -> Option<Offset> {
    let by_bytes =
        policy.max_bytes.and_then(|keep| tail.0.checked_sub(keep)).map(|cut| boundary_at_or_below(Offset(cut)));
    let by_age = policy.max_age_s.and_then(|age| {
        let cutoff = now_ms.saturating_sub(i64::try_from(age.saturating_mul(1000)).unwrap_or(i64::MAX));
        // Marks are boundaries already: each one's end is an append's end.
        marks.iter().take_while(|m| m.at_ms <= cutoff).last().map(|m| m.end.min(tail))
    });
    let to = by_bytes.into_iter().chain(by_age).max()?;
    (to > earliest).then_some(to)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn age(s: u64) -> RetentionPolicy {
        RetentionPolicy { max_age_s: Some(s), max_bytes: None }
    }

    #[test]
    fn marks_are_spaced_by_an_interval_and_the_last_one_follows_the_tail() {
        let p = age(64); // interval: 1 s
        let mut m = TimeMarks::new();
        for (i, t) in [0i64, 100, 200, 900, 1100, 1200, 2000, 2100].iter().enumerate() {
            note_write(&mut m, &p, Offset((i as u64 + 1) * 10), *t);
        }
        let got: Vec<(u64, i64)> = m.iter().map(|x| (x.end.0, x.at_ms)).collect();
        // 0 starts; 100 starts a second (fewer than two marks); 200 and 900 extend it (the mark
        // before it, at 0, is not a second old); at 1100 it is: a new mark; 1200 extends it
        // (the one before was last written at 900); 2000 is 1.1 s after 900: new; 2100 extends
        // it (900 ms after 1200).
        assert_eq!(got, vec![(10, 0), (40, 900), (60, 1200), (80, 2100)]);
    }

    #[test]
    fn a_policy_without_an_age_keeps_no_marks() {
        let mut m = TimeMarks::new();
        let p = RetentionPolicy { max_age_s: None, max_bytes: Some(10) };
        assert_eq!(note_write(&mut m, &p, Offset(5), 1), MarkChange::None);
        assert!(m.is_empty());
    }

    #[test]
    fn a_clock_stepping_back_never_makes_later_bytes_older() {
        let mut m = TimeMarks::new();
        note_write(&mut m, &age(64), Offset(10), 5000);
        note_write(&mut m, &age(64), Offset(20), 1000);
        assert!(m.iter().all(|x| x.at_ms >= 5000), "{m:?}");
    }

    #[test]
    fn the_byte_limit_keeps_at_least_max_bytes_and_cuts_at_an_append_boundary() {
        let bounds = [0u64, 10, 25, 40, 60];
        let below = |x: Offset| Offset(*bounds.iter().rfind(|b| **b <= x.0).unwrap_or(&0));
        let p = RetentionPolicy { max_age_s: None, max_bytes: Some(30) };
        // tail 60, keep 30: cut at 30 rounds down to 25 (35 bytes kept).
        assert_eq!(floor(&p, Offset(60), Offset::ZERO, 0, &[], below), Some(Offset(25)));
        // Already there: nothing to do.
        assert_eq!(floor(&p, Offset(60), Offset(25), 0, &[], below), None);
        // Never backwards.
        assert_eq!(floor(&p, Offset(60), Offset(40), 0, &[], below), None);
        // Less than max_bytes in all: nothing.
        assert_eq!(floor(&p, Offset(20), Offset::ZERO, 0, &[], below), None);
    }

    #[test]
    fn the_age_limit_drops_only_what_a_mark_proves_old() {
        let marks = [TimeMark { end: Offset(10), at_ms: 1_000 }, TimeMark { end: Offset(30), at_ms: 5_000 }];
        let p = age(2);
        let none = |_: Offset| Offset::ZERO;
        assert_eq!(floor(&p, Offset(40), Offset::ZERO, 2_999, &marks, none), None);
        assert_eq!(floor(&p, Offset(40), Offset::ZERO, 3_000, &marks, none), Some(Offset(10)));
        assert_eq!(floor(&p, Offset(40), Offset::ZERO, 7_000, &marks, none), Some(Offset(30)));
    }

    #[test]
    fn a_re_create_compares_only_the_limits_it_named() {
        let existing = RetentionPolicy { max_age_s: Some(60), max_bytes: Some(100) };
        let from_defaults = RetentionRequest { policy: RetentionPolicy::NONE, named_age: false, named_bytes: false };
        assert!(from_defaults.matches(&existing));
        let same_age = RetentionRequest {
            policy: RetentionPolicy { max_age_s: Some(60), max_bytes: None },
            named_age: true,
            named_bytes: false,
        };
        assert!(same_age.matches(&existing));
        let other_bytes = RetentionRequest {
            policy: RetentionPolicy { max_age_s: None, max_bytes: Some(5) },
            named_age: false,
            named_bytes: true,
        };
        assert!(!other_bytes.matches(&existing));
        let named_none = RetentionRequest { policy: RetentionPolicy::NONE, named_age: true, named_bytes: false };
        assert!(!named_none.matches(&existing));
    }

    proptest! {
        /// Whatever the writes, marks stay few, ordered, and never claim a byte older than it is:
        /// for every write, the first mark at or past its end has a time at or after the write.
        #[test]
        fn marks_never_claim_data_older_than_it_is(
            max_age_s in 1u64..10_000,
            writes in proptest::collection::vec((1u64..1000, 0i64..200_000), 1..400),
        ) {
            let p = age(max_age_s);
            let mut marks = TimeMarks::new();
            let (mut end, mut now, mut log) = (0u64, 0i64, Vec::new());
            for (len, step) in writes {
                end += len;
                now += step;
                note_write(&mut marks, &p, Offset(end), now);
                log.push((end, now));
            }
            prop_assert!(marks.windows(2).all(|w| w[0].end < w[1].end && w[0].at_ms <= w[1].at_ms));
            prop_assert_eq!(marks.last().map(|m| m.end.0), Some(end));
            for (e, t) in log {
                let m = marks.iter().find(|m| m.end.0 >= e).expect("a mark covers every write");
                prop_assert!(m.at_ms >= t);
            }
            // Few marks: any two marks with one between them are an interval apart.
            let span = now / mark_interval_ms(max_age_s);
            prop_assert!(marks.len() as i64 <= 2 * span + 3, "{} marks over {} intervals", marks.len(), span);
        }
    }
}
