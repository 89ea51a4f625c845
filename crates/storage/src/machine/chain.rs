//! Reading through fork chains, for every engine: which part of which stream's own data a read
//! (or a fork sub-offset's lookup) of a fork covers.
//!
//! A fork shares its source's bytes below its fork point, never copied. Its offset space is a
//! *chain* of inherited segments — offsets from the previous segment's end (0 for the first) up
//! to `end` are read from that segment's `source` — followed by its own data up to its tail. A
//! source is whatever an engine reads a stream's own data through: the log engine's shared
//! reader state, PostgreSQL's stream id.

/// One inherited piece of a fork's offset space (see the module note).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment<S> {
    pub source: S,
    pub end: u64,
}

/// The inherited segments of a fork of `parent` (whose own inherited segments are
/// `parent_chain`) at `fork_point`: the parent's view of `[0, fork_point)`.
pub fn fork_chain<S: Clone>(parent_chain: &[Segment<S>], parent: &S, fork_point: u64) -> Vec<Segment<S>> {
    let mut chain = Vec::with_capacity(parent_chain.len() + 1);
    let mut start = 0;
    let whole_parent = Segment { source: parent.clone(), end: u64::MAX };
    for seg in parent_chain.iter().chain(std::iter::once(&whole_parent)) {
        if start >= fork_point {
            break;
        }
        let end = seg.end.min(fork_point);
        if end > start {
            chain.push(Segment { source: seg.source.clone(), end });
        }
        start = end;
    }
    chain
}

/// A piece of a stream's offset space: offsets `[start, end)` are in `source`'s own data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Part<'a, S> {
    pub source: &'a S,
    pub start: u64,
    pub end: u64,
}

/// The parts of the stream whose inherited segments are `chain` and whose own data is `own`
/// that a read from `from` up to `tail` goes through, in order, each clipped to `[from, tail)`.
pub fn parts<'a, S>(
    chain: &'a [Segment<S>],
    own: &'a S,
    from: u64,
    tail: u64,
) -> impl Iterator<Item = Part<'a, S>> + 'a {
    let mut start = 0;
    chain.iter().map(|s| (&s.source, s.end)).chain(std::iter::once((own, u64::MAX))).filter_map(move |(source, end)| {
        let (seg_start, seg_end) = (start, end.min(tail));
        start = seg_end.max(start);
        let part = Part { source, start: seg_start.max(from), end: seg_end };
        (part.start < part.end).then_some(part)
    })
}

/// The part that holds offset `at`, from `at` on (`None` at or past the tail).
pub fn part_at<'a, S>(chain: &'a [Segment<S>], own: &'a S, at: u64, tail: u64) -> Option<Part<'a, S>> {
    parts(chain, own, at, tail).next()
}

/// Whether `at` is where a part of the offset space begins (0, or a fork point of the chain):
/// an offset the engine minted, whatever the appends around it.
pub fn at_boundary<S>(chain: &[Segment<S>], at: u64) -> bool {
    at == 0 || chain.iter().any(|s| s.end == at)
}

/// A read's progress through the parts of a stream's offset space ([`parts`]), one stored append
/// at a time: which bytes of each append it returns, where it stands, and whether it began at an
/// offset the engine minted. Every engine's read goes through it; engines differ only in how they
/// find the stored append that covers an offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadCursor {
    from: u64,
    pos: u64,
    total: usize,
    max_bytes: usize,
    /// `max_bytes` is a hard limit: the last append may be cut to meet it (otherwise a read
    /// returns whole appends, and stops after the one that reaches `max_bytes`).
    bounded: bool,
    aligned: bool,
}

/// The stored append that should cover a read's position does not: the bytes there are not
/// stored (trimmed meanwhile, or an index that lost them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gap;

impl ReadCursor {
    /// A read from `from` of a stream whose inherited segments are `chain`, of about `max_bytes`.
    pub fn new<S>(chain: &[Segment<S>], from: u64, max_bytes: usize, bounded: bool) -> ReadCursor {
        ReadCursor { from, pos: from, total: 0, max_bytes, bounded, aligned: at_boundary(chain, from) }
    }

    /// The offset the read has reached (where the next read would start).
    pub fn pos(&self) -> u64 {
        self.pos
    }

    /// How many bytes the read returns so far.
    pub fn total(&self) -> usize {
        self.total
    }

    /// Whether `from` was minted: 0, a fork point, or the start of a stored append it took.
    pub fn aligned(&self) -> bool {
        self.aligned
    }

    /// Whether the read has all the bytes it wants.
    pub fn full(&self) -> bool {
        self.total >= self.max_bytes
    }

    /// Whether the read wants more of the part ending at `part_end`.
    pub fn wants(&self, part_end: u64) -> bool {
        self.pos < part_end && !self.full()
    }

    /// Takes what the read returns of the stored append `[start, end)` of a part ending at
    /// `part_end` (the append covers the read's position): the range of the append's bytes, and
    /// the read moves past it.
    pub fn take(&mut self, start: u64, end: u64, part_end: u64) -> Result<std::ops::Range<usize>, Gap> {
        if start > self.pos || end <= self.pos {
            return Err(Gap);
        }
        let lo = self.pos - start;
        let mut hi = end.min(part_end).max(self.pos) - start;
        if self.bounded {
            hi = hi.min(lo + self.max_bytes.saturating_sub(self.total) as u64);
        }
        if lo == 0 && self.pos == self.from {
            self.aligned = true;
        }
        let (lo, hi) = (usize::try_from(lo).map_err(|_| Gap)?, usize::try_from(hi).map_err(|_| Gap)?);
        self.total += hi - lo;
        self.pos = start + hi as u64;
        Ok(lo..hi)
    }
}

/// The bytes of the stored append `[start, end)` that a fork sub-offset at `at` counts into:
/// the whole append if it starts exactly at `at`, cut where its part ends (`part_end`).
pub fn append_at(start: u64, end: u64, at: u64, part_end: u64) -> Option<std::ops::Range<usize>> {
    (start == at && end > start).then(|| 0..usize::try_from(end.min(part_end) - start).unwrap_or(usize::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fork_chains_are_the_parents_view_below_the_fork_point() {
        let a = fork_chain(&[], &1, 10);
        assert_eq!(a, vec![Segment { source: 1, end: 10 }]);
        let b = fork_chain(&a, &2, 15);
        assert_eq!(b, vec![Segment { source: 1, end: 10 }, Segment { source: 2, end: 15 }]);
        assert_eq!(fork_chain(&b, &3, 5), vec![Segment { source: 1, end: 5 }]);
        assert_eq!(fork_chain(&b, &3, 0), vec![]);
    }

    #[test]
    fn a_read_goes_through_the_ancestors_then_the_own_data() {
        // Stream 3: [0,10) from 1, [10,15) from 2, then its own from 15 on.
        let chain = vec![Segment { source: 1, end: 10 }, Segment { source: 2, end: 15 }];
        let all: Vec<(u64, u64, u64)> = parts(&chain, &3, 0, 20).map(|p| (*p.source, p.start, p.end)).collect();
        assert_eq!(all, [(1, 0, 10), (2, 10, 15), (3, 15, 20)]);
        let mid: Vec<(u64, u64, u64)> = parts(&chain, &3, 12, 20).map(|p| (*p.source, p.start, p.end)).collect();
        assert_eq!(mid, [(2, 12, 15), (3, 15, 20)]);
        // A tail inside the chain cuts it there (a fork at its point has no own data yet).
        let short: Vec<(u64, u64, u64)> = parts(&chain, &3, 5, 12).map(|p| (*p.source, p.start, p.end)).collect();
        assert_eq!(short, [(1, 5, 10), (2, 10, 12)]);
        assert_eq!(parts(&chain, &3, 20, 20).count(), 0);
        assert_eq!(part_at(&chain, &3, 10, 20).map(|p| (*p.source, p.start)), Some((2, 10)));
        assert_eq!(part_at(&chain, &3, 16, 20).map(|p| (*p.source, p.start, p.end)), Some((3, 16, 20)));
        assert_eq!(part_at(&chain, &3, 20, 20), None);
        assert!(
            at_boundary(&chain, 0) && at_boundary(&chain, 10) && at_boundary(&chain, 15) && !at_boundary(&chain, 12)
        );
        // A stream of its own: one part.
        assert_eq!(parts(&[], &7, 3, 9).map(|p| (*p.source, p.start, p.end)).collect::<Vec<_>>(), [(7, 3, 9)]);
    }

    #[test]
    fn a_read_takes_whole_appends_cut_only_at_part_ends_and_hard_limits() {
        // Stream 3: [0,10) from 1, then its own. Source 1's appends: [0,4) [4,12) (a fork point
        // cuts the second); the own data: [10,13) [13,20).
        let chain = vec![Segment { source: 1, end: 10 }];
        let mut r = ReadCursor::new(&chain, 2, 100, false);
        assert!(!r.aligned());
        assert_eq!(r.take(0, 4, 10), Ok(2..4));
        assert_eq!(r.take(4, 12, 10), Ok(0..6));
        assert_eq!((r.pos(), r.total(), r.wants(10)), (10, 8, false));
        assert_eq!(r.take(10, 13, u64::MAX), Ok(0..3));
        assert_eq!(r.take(13, 20, u64::MAX), Ok(0..7));
        assert_eq!((r.pos(), r.total()), (20, 18));
        // A read from an append's start is aligned; a soft limit returns the append that reaches it.
        let mut r = ReadCursor::new(&chain, 4, 3, false);
        assert_eq!(r.take(4, 12, 10), Ok(0..6));
        assert!(r.aligned() && r.full() && !r.wants(10));
        // A hard limit cuts the append.
        let mut r = ReadCursor::new(&chain, 4, 3, true);
        assert_eq!(r.take(4, 12, 10), Ok(0..3));
        assert_eq!(r.pos(), 7);
        // A fork point is minted even mid-append; an append that begins past the position is a gap.
        assert!(ReadCursor::new(&chain, 10, 5, false).aligned());
        let mut r = ReadCursor::new(&chain, 5, 5, false);
        assert_eq!(r.take(6, 9, 10), Err(Gap));
        assert_eq!(r.take(0, 5, 10), Err(Gap));
        assert_eq!(r.total(), 0);
        // A sub-offset counts into the append that starts exactly there, cut at its part's end.
        assert_eq!(append_at(4, 12, 4, 10), Some(0..6));
        assert_eq!(append_at(4, 12, 4, u64::MAX), Some(0..8));
        assert_eq!(append_at(4, 12, 5, 10), None);
    }
}
