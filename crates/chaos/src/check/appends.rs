//! Appends: every acknowledged append present exactly once, at the offset its answer named; one
//! of unknown outcome at most once; a refused one never; nothing present that was never sent;
//! each producer's appends in `(epoch, seq)` order.

use std::collections::{BTreeMap, HashMap};

use super::{records, Violation};
use crate::history::{History, OpKind, Outcome, Stamp};

/// What the history says of one record: the best outcome any attempt got, the offsets answered.
#[derive(Default)]
struct Sent<'a> {
    outcome: Option<Outcome>,
    answered: Vec<u64>,
    stamp: Option<&'a Stamp>,
}

fn better(a: Option<Outcome>, b: Outcome) -> Outcome {
    match (a, b) {
        (Some(Outcome::Ok), _) | (_, Outcome::Ok) => Outcome::Ok,
        (Some(Outcome::Unknown), _) | (_, Outcome::Unknown) => Outcome::Unknown,
        _ => Outcome::Failed,
    }
}

pub(super) fn check(h: &History, out: &mut Vec<Violation>) {
    let mut sent: HashMap<(&str, &str), Sent> = HashMap::new();
    for op in &h.ops {
        if let OpKind::Append { stream, record, stamp, next_offset, .. } = &op.kind {
            let s = sent.entry((stream.as_str(), record.as_str())).or_default();
            s.outcome = Some(better(s.outcome, op.outcome));
            if op.outcome == Outcome::Ok {
                s.answered.extend(next_offset);
            }
            s.stamp = s.stamp.or(stamp.as_ref());
        }
    }
    let empty = String::new();
    let streams: std::collections::BTreeSet<&str> =
        sent.keys().map(|(s, _)| *s).chain(h.finals.keys().map(String::as_str)).collect();
    for stream in streams {
        let content = h.finals.get(stream).unwrap_or(&empty);
        let present = records(content);
        let mut found: HashMap<&str, Vec<u64>> = HashMap::new();
        for (record, _, end) in &present {
            found.entry(record).or_default().push(*end);
        }
        let mut last_of: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
        for (record, _, _) in &present {
            let Some(s) = sent.get(&(stream, *record)) else {
                out.push(Violation::NeverSent { stream: stream.into(), record: (*record).into() });
                continue;
            };
            if let Some(st) = s.stamp {
                let now = (st.epoch, st.seq);
                if let Some(before) = last_of.insert(&st.producer, now).filter(|b| *b >= now) {
                    out.push(Violation::OutOfOrder {
                        stream: stream.into(),
                        producer: st.producer.clone(),
                        epoch: now.0,
                        seq: now.1,
                        after_epoch: before.0,
                        after_seq: before.1,
                    });
                }
            }
        }
        let mut mine: Vec<(&str, &Sent)> =
            sent.iter().filter(|((s, _), _)| *s == stream).map(|((_, r), v)| (*r, v)).collect();
        mine.sort_by_key(|(r, _)| *r);
        for (record, s) in mine {
            let ends = found.get(record).map_or(&[][..], Vec::as_slice);
            let v = |times| (stream.to_owned(), record.to_owned(), times);
            match (s.outcome, ends.len()) {
                (Some(Outcome::Ok), 0) => out.push(Violation::Lost { stream: stream.into(), record: record.into() }),
                (Some(Outcome::Failed), n) if n > 0 => {
                    out.push(Violation::RefusedButPresent { stream: stream.into(), record: record.into() })
                }
                (_, n) if n > 1 => {
                    let (stream, record, times) = v(n);
                    out.push(Violation::Duplicated { stream, record, times });
                }
                _ => {}
            }
            if let [actual] = ends {
                for answered in s.answered.iter().filter(|a| *a != actual) {
                    out.push(Violation::WrongOffset {
                        stream: stream.into(),
                        record: record.into(),
                        answered: *answered,
                        actual: *actual,
                    });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixture::*;
    use super::super::{check, Violation};
    use crate::history::Outcome;

    #[test]
    fn a_clean_run_has_no_violation() {
        let h = history(
            vec![
                append(1, "a\n", Outcome::Ok, Some(2)),
                append(2, "b\n", Outcome::Unknown, None),
                append(3, "c\n", Outcome::Unknown, None),
                append(4, "d\n", Outcome::Failed, None),
            ],
            "a\nb\n",
        );
        assert_eq!(check(&h), vec![]);
    }

    #[test]
    fn each_broken_promise_is_reported() {
        let lost = history(vec![append(1, "a\n", Outcome::Ok, Some(2))], "");
        assert!(matches!(check(&lost)[..], [Violation::Lost { .. }]));
        let twice = history(vec![append(1, "a\n", Outcome::Unknown, None)], "a\na\n");
        assert!(matches!(check(&twice)[..], [Violation::Duplicated { times: 2, .. }]));
        let refused = history(vec![append(1, "a\n", Outcome::Failed, None)], "a\n");
        assert!(matches!(check(&refused)[..], [Violation::RefusedButPresent { .. }]));
        let invented = history(vec![], "z\n");
        assert!(matches!(check(&invented)[..], [Violation::NeverSent { .. }]));
        let elsewhere =
            history(vec![append(1, "a\n", Outcome::Ok, Some(2)), append(2, "b\n", Outcome::Ok, Some(2))], "a\nb\n");
        assert!(matches!(check(&elsewhere)[..], [Violation::WrongOffset { answered: 2, actual: 4, .. }]));
    }

    #[test]
    fn a_producer_out_of_order_is_reported() {
        let ok = history(
            vec![stamped(1, "p0\n", 0, 0, 3), stamped(2, "p1\n", 0, 1, 6), stamped(3, "q0\n", 1, 0, 9)],
            "p0\np1\nq0\n",
        );
        assert_eq!(check(&ok), vec![]);
        let swapped = history(vec![stamped(1, "p0\n", 0, 0, 6), stamped(2, "p1\n", 0, 1, 3)], "p1\np0\n");
        assert!(matches!(check(&swapped)[..], [Violation::OutOfOrder { epoch: 0, seq: 0, after_seq: 1, .. }]));
        // A zombie's append (epoch 0) after its successor's (epoch 1).
        let zombie = history(vec![stamped(1, "q0\n", 1, 0, 3), stamped(2, "p1\n", 0, 1, 6)], "q0\np1\n");
        assert!(matches!(check(&zombie)[..], [Violation::OutOfOrder { epoch: 0, after_epoch: 1, .. }]));
    }
}
