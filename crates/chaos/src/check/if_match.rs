//! `If-Match`: the winners form one chain — no two acknowledged conditional appends on one tail,
//! and each winner written exactly where its condition said.

use std::collections::HashMap;

use super::{records, Violation};
use crate::history::{History, OpKind, Outcome};

pub(super) fn check(h: &History, out: &mut Vec<Violation>) {
    let mut winners: HashMap<(&str, u64), u64> = HashMap::new();
    for op in h.ops.iter().filter(|op| op.outcome == Outcome::Ok) {
        let OpKind::Append { stream, record, if_match: Some(tail), .. } = &op.kind else { continue };
        if let Some(first) = winners.insert((stream.as_str(), *tail), op.id) {
            out.push(Violation::TwoWinners { stream: stream.clone(), tail: *tail, first, second: op.id });
        }
        let content = h.finals.get(stream).map_or("", String::as_str);
        if !records(content).iter().any(|(r, start, _)| r == record && start == tail) {
            out.push(Violation::WinnerElsewhere { stream: stream.clone(), tail: *tail, op: op.id });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixture::*;
    use super::super::{check, Violation};
    use crate::history::{Op, OpKind, Outcome};

    fn conditional(id: u64, record: &str, tail: u64, outcome: Outcome) -> Op {
        let mut op = append(id, record, outcome, None);
        if let OpKind::Append { if_match, .. } = &mut op.kind {
            *if_match = Some(tail);
        }
        op
    }

    #[test]
    fn winners_form_one_chain() {
        let chain = history(
            vec![
                conditional(1, "a\n", 0, Outcome::Ok),
                conditional(2, "b\n", 0, Outcome::Failed),
                conditional(3, "c\n", 2, Outcome::Ok),
            ],
            "a\nc\n",
        );
        assert_eq!(check(&chain), vec![]);
        let two = history(vec![conditional(1, "a\n", 0, Outcome::Ok), conditional(2, "b\n", 0, Outcome::Ok)], "a\nb\n");
        assert!(check(&two).iter().any(|v| matches!(v, Violation::TwoWinners { tail: 0, first: 1, second: 2, .. })));
        let misplaced = history(vec![conditional(1, "a\n", 2, Outcome::Ok)], "a\n");
        assert!(matches!(check(&misplaced)[..], [Violation::WinnerElsewhere { tail: 2, .. }]));
    }
}
