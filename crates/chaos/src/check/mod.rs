//! The properties a run must keep (docs/design/issue-24-plan.md, "A history and a checker").
//! Each module checks some of them over a [`History`] and adds what it finds; [`check`] runs
//! them all. A violation names the stream, the record or operation, and what was wrong.

mod appends;
mod if_match;
mod reads;
mod subs;

use crate::history::History;

/// One property broken by a run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Violation {
    #[error("{stream}: acknowledged append {record:?} is missing")]
    Lost { stream: String, record: String },
    #[error("{stream}: append {record:?} is present {times} times")]
    Duplicated { stream: String, record: String, times: usize },
    #[error("{stream}: append {record:?} was refused but is present")]
    RefusedButPresent { stream: String, record: String },
    #[error("{stream}: record {record:?} was never sent")]
    NeverSent { stream: String, record: String },
    #[error("{stream}: append {record:?} was answered offset {answered}, but ends at {actual}")]
    WrongOffset { stream: String, record: String, answered: u64, actual: u64 },
    #[error("{stream}: producer {producer} wrote ({epoch}, {seq}) after ({after_epoch}, {after_seq})")]
    OutOfOrder { stream: String, producer: String, epoch: u64, seq: u64, after_epoch: u64, after_seq: u64 },
    #[error("{stream}: read {op} from {from} saw bytes the final stream does not hold there")]
    ReadNotPrefix { stream: String, op: u64, from: u64 },
    #[error("{stream}: {process} read from {from} after reading up to {before}")]
    ReaderWentBack { stream: String, process: String, from: u64, before: u64 },
    #[error("{stream}: appends {first} and {second} both won If-Match {tail}")]
    TwoWinners { stream: String, tail: u64, first: u64, second: u64 },
    #[error("{stream}: If-Match {tail} winner {op} does not start at {tail}")]
    WinnerElsewhere { stream: String, tail: u64, op: u64 },
    #[error("subscription output {line:?} is no input record")]
    OutputOfNothing { line: String },
    #[error("{stream}: input {record:?} was applied {times} times by the subscription")]
    AppliedTwice { stream: String, record: String, times: usize },
    #[error("{stream}: input {record:?} was applied but is not acknowledged (output and ack were not one step)")]
    AppliedNotAcked { stream: String, record: String },
    #[error("{stream}: input {record:?} is acknowledged but its output is missing")]
    AckedNotApplied { stream: String, record: String },
    #[error("{stream}: the subscription's outputs are not in input order at {record:?}")]
    AppliedOutOfOrder { stream: String, record: String },
    #[error("commit {op} of generation {generation} was refused (fenced) but its output {line:?} is present")]
    FencedCommitApplied { op: u64, generation: u64, line: String },
    /// Answers 500-599 other than 503: a fault is no reason for one (an unusable backend is 503).
    #[error("{count} answers with status {status}")]
    ServerErrors { status: u16, count: u64 },
}

/// Every violation of every property in `h`.
pub fn check(h: &History) -> Vec<Violation> {
    let mut out = Vec::new();
    appends::check(h, &mut out);
    reads::check(h, &mut out);
    if_match::check(h, &mut out);
    subs::check(h, &mut out);
    out
}

/// A final stream split into its records (each ending in `\n`; a last piece without one counts
/// as a record too): `(record, start, end)`.
fn records(content: &str) -> Vec<(&str, u64, u64)> {
    let mut out = Vec::new();
    let mut start = 0usize;
    for (i, b) in content.bytes().enumerate() {
        if b == b'\n' {
            out.push((&content[start..=i], start as u64, i as u64 + 1));
            start = i + 1;
        }
    }
    if start < content.len() {
        out.push((&content[start..], start as u64, content.len() as u64));
    }
    out
}

#[cfg(test)]
pub(crate) mod fixture {
    //! Histories for the checkers' tests.
    use crate::history::{History, Op, OpKind, Outcome, Stamp};

    pub fn append(id: u64, record: &str, outcome: Outcome, next_offset: Option<u64>) -> Op {
        Op {
            id,
            process: format!("w{id}"),
            invoked_ms: id,
            completed_ms: id + 1,
            outcome,
            kind: OpKind::Append {
                stream: "s".into(),
                record: record.into(),
                stamp: None,
                if_match: None,
                next_offset,
            },
        }
    }

    pub fn stamped(id: u64, record: &str, epoch: u64, seq: u64, next_offset: u64) -> Op {
        let mut op = append(id, record, Outcome::Ok, Some(next_offset));
        if let OpKind::Append { stamp, .. } = &mut op.kind {
            *stamp = Some(Stamp { producer: "p".into(), epoch, seq });
        }
        op
    }

    pub fn read(id: u64, process: &str, from: u64, bytes: &str) -> Op {
        Op {
            id,
            process: process.into(),
            invoked_ms: id,
            completed_ms: id + 1,
            outcome: Outcome::Ok,
            kind: OpKind::Read { stream: "s".into(), from, bytes: bytes.into() },
        }
    }

    pub fn history(ops: Vec<Op>, last: &str) -> History {
        History { ops, finals: [("s".to_owned(), last.to_owned())].into_iter().collect(), subs: None }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_splits_into_its_records() {
        assert_eq!(records("a\nbc\nd"), vec![("a\n", 0, 2), ("bc\n", 2, 5), ("d", 5, 6)]);
        assert!(records("").is_empty());
    }
}
