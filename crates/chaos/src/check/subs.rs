//! Subscriptions: the output stream holds exactly one application of each input record the
//! subscription acknowledged, in each input stream's order, and nothing else; a commit refused
//! as fenced (with no earlier attempt of unknown outcome) left no trace.
//!
//! Output lines are `<generation>|<input record>`, so a fenced generation's commit that was
//! applied anyway shows both as an input applied twice and as its own lines present.

use std::collections::{HashMap, HashSet};

use super::{records, Violation};
use crate::history::{History, OpKind, Outcome};

pub(super) fn check(h: &History, out: &mut Vec<Violation>) {
    let Some(end) = &h.subs else { return };
    // Each acknowledged input record, and where it belongs.
    let mut expected: HashMap<&str, Vec<&str>> = HashMap::new();
    let mut stream_of: HashMap<&str, &str> = HashMap::new();
    for (stream, acked) in &end.acked {
        let content = h.finals.get(stream).map_or("", String::as_str);
        for (record, _, record_end) in records(content) {
            stream_of.insert(record, stream);
            if record_end <= *acked {
                expected.entry(stream).or_default().push(record);
            }
        }
    }
    let lines = records(&end.output);
    let mut applied: HashMap<&str, Vec<&str>> = HashMap::new();
    for (line, _, _) in &lines {
        match line.split_once('|').and_then(|(_, record)| stream_of.get(record).map(|s| (*s, record))) {
            Some((stream, record)) => applied.entry(stream).or_default().push(record),
            None => out.push(Violation::OutputOfNothing { line: (*line).into() }),
        }
    }
    let streams: HashSet<&str> = expected.keys().chain(applied.keys()).copied().collect();
    for stream in streams {
        let want = expected.get(stream).map_or(&[][..], Vec::as_slice);
        let got = applied.get(stream).map_or(&[][..], Vec::as_slice);
        let mut times: HashMap<&str, usize> = HashMap::new();
        for r in got {
            *times.entry(r).or_default() += 1;
        }
        let mut twice: Vec<_> = times.iter().filter(|(_, n)| **n > 1).collect();
        twice.sort();
        for (record, n) in twice {
            out.push(Violation::AppliedTwice { stream: stream.into(), record: (*record).into(), times: *n });
        }
        let got_set: HashSet<&str> = got.iter().copied().collect();
        let want_set: HashSet<&str> = want.iter().copied().collect();
        for r in want.iter().filter(|r| !got_set.contains(*r)) {
            out.push(Violation::AckedNotApplied { stream: stream.into(), record: (*r).into() });
        }
        // Applied but never acknowledged: the ack and the output were not one step.
        for r in got.iter().filter(|r| !want_set.contains(*r)) {
            out.push(Violation::AppliedNotAcked { stream: stream.into(), record: (*r).into() });
        }
        let mut seen = HashSet::new();
        let firsts: Vec<&str> = got.iter().copied().filter(|r| seen.insert(*r) && want_set.contains(r)).collect();
        if let Some(i) = firsts.iter().zip(want.iter()).position(|(a, b)| a != b) {
            out.push(Violation::AppliedOutOfOrder { stream: stream.into(), record: firsts[i].into() });
        }
    }
    let present: HashSet<&str> = lines.iter().map(|(l, _, _)| *l).collect();
    for op in &h.ops {
        if let (OpKind::Commit { generation, output, .. }, Outcome::Failed) = (&op.kind, op.outcome) {
            for (line, _, _) in records(output) {
                if present.contains(line) {
                    out.push(Violation::FencedCommitApplied { op: op.id, generation: *generation, line: line.into() });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::fixture::history;
    use crate::history::{Input, Op, SubsEnd};

    fn commit(id: u64, generation: u64, output: &str, outcome: Outcome) -> Op {
        Op {
            id,
            process: "w".into(),
            invoked_ms: id,
            completed_ms: id + 1,
            outcome,
            kind: OpKind::Commit {
                generation,
                inputs: vec![Input { stream: "s".into(), from: 0, to: 0 }],
                output: output.into(),
            },
        }
    }

    fn run(ops: Vec<Op>, acked: u64, output: &str) -> Vec<Violation> {
        let mut h = history(ops, "a\nb\nc\n");
        h.subs = Some(SubsEnd { acked: [("s".to_owned(), acked)].into_iter().collect(), output: output.into() });
        let mut out = Vec::new();
        check(&h, &mut out);
        out
    }

    #[test]
    fn one_application_of_each_acknowledged_input_passes() {
        assert_eq!(
            run(
                vec![commit(1, 1, "1|a\n1|b\n", Outcome::Ok), commit(2, 2, "2|c\n", Outcome::Ok)],
                6,
                "1|a\n1|b\n2|c\n"
            ),
            vec![]
        );
    }

    #[test]
    fn each_broken_property_is_reported() {
        let v = run(vec![], 6, "1|a\n1|b\n2|a\n2|b\n2|c\n");
        assert!(
            v.iter().any(|v| matches!(v, Violation::AppliedTwice { record, times: 2, .. } if record == "a\n")),
            "{v:?}"
        );
        let v = run(vec![], 6, "1|a\n1|c\n");
        assert!(v.iter().any(|v| matches!(v, Violation::AckedNotApplied { record, .. } if record == "b\n")), "{v:?}");
        let v = run(vec![], 4, "1|a\n1|b\n1|c\n");
        assert!(v.iter().any(|v| matches!(v, Violation::AppliedNotAcked { record, .. } if record == "c\n")), "{v:?}");
        let v = run(vec![], 6, "1|b\n1|a\n1|c\n");
        assert!(v.iter().any(|v| matches!(v, Violation::AppliedOutOfOrder { .. })), "{v:?}");
        let v = run(vec![], 2, "1|a\n1|zz\n");
        assert!(v.iter().any(|v| matches!(v, Violation::OutputOfNothing { .. })), "{v:?}");
        let v = run(vec![commit(1, 1, "1|a\n", Outcome::Failed), commit(2, 2, "2|a\n", Outcome::Ok)], 2, "1|a\n2|a\n");
        assert!(v.iter().any(|v| matches!(v, Violation::FencedCommitApplied { op: 1, generation: 1, .. })), "{v:?}");
    }
}
