//! Reads: every read a prefix of the final stream from where it began (nothing a reader saw ever
//! vanishes or changes), and a reader never going back.

use std::collections::HashMap;

use super::Violation;
use crate::history::{History, OpKind, Outcome};

pub(super) fn check(h: &History, out: &mut Vec<Violation>) {
    // Where each (process, stream) read up to, in completion order.
    let mut upto: HashMap<(&str, &str), u64> = HashMap::new();
    let mut reads: Vec<_> =
        h.ops.iter().filter(|op| op.outcome == Outcome::Ok && matches!(op.kind, OpKind::Read { .. })).collect();
    reads.sort_by_key(|op| (op.completed_ms, op.id));
    for op in reads {
        let OpKind::Read { stream, from, bytes } = &op.kind else { continue };
        let content = h.finals.get(stream).map_or("", String::as_str).as_bytes();
        let lo = usize::try_from(*from).unwrap_or(usize::MAX);
        let seen = content.get(lo..).and_then(|rest| rest.get(..bytes.len()));
        if seen != Some(bytes.as_bytes()) {
            out.push(Violation::ReadNotPrefix { stream: stream.clone(), op: op.id, from: *from });
        }
        let end = from + bytes.len() as u64;
        let before = upto.entry((op.process.as_str(), stream.as_str())).or_insert(0);
        if *from < *before {
            out.push(Violation::ReaderWentBack {
                stream: stream.clone(),
                process: op.process.clone(),
                from: *from,
                before: *before,
            });
        }
        *before = (*before).max(end);
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixture::*;
    use super::super::{check, Violation};
    use crate::history::Outcome;

    #[test]
    fn reads_are_prefixes_and_readers_go_forward() {
        let a = append(1, "a\n", Outcome::Ok, Some(2));
        let b = append(2, "b\n", Outcome::Ok, Some(4));
        let ok = history(
            vec![a.clone(), b.clone(), read(3, "r", 0, "a\n"), read(4, "r", 2, "b\n"), read(5, "t", 0, "a\nb\n")],
            "a\nb\n",
        );
        assert_eq!(check(&ok), vec![]);
        // A reader saw bytes that later vanished or changed.
        let changed = history(vec![a.clone(), b.clone(), read(3, "r", 0, "a\nx\n")], "a\nb\n");
        assert!(matches!(check(&changed)[..], [Violation::ReadNotPrefix { op: 3, .. }]));
        let past_the_end = history(vec![a.clone(), b.clone(), read(3, "r", 2, "b\nc\n")], "a\nb\n");
        assert!(matches!(check(&past_the_end)[..], [Violation::ReadNotPrefix { .. }]));
        // A live reader that went back (and so saw a record twice).
        let back = history(vec![a, b, read(3, "r", 0, "a\nb\n"), read(4, "r", 2, "b\n")], "a\nb\n");
        assert!(matches!(check(&back)[..], [Violation::ReaderWentBack { from: 2, before: 4, .. }]));
    }
}
