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
}
