//! The rules against a deliberately naive model (the whole history, re-scanned for every
//! request), plus the create / fork / delete verdict tables.

use std::collections::HashMap;

use bytes::Bytes;
use oncelog_protocol::headers::{Expiry, ProducerHeaders};
use oncelog_protocol::producer::RECEIPT_WINDOW;
use proptest::prelude::*;

use super::*;
use crate::machine::Step;

fn meta(ct: &str) -> StreamMeta {
    StreamMeta::new(1, 0, ct)
}

#[derive(Debug, Clone)]
struct Op {
    producer: Option<(u8, u64, u64)>,
    matching_type: bool,
    len: usize,
    /// Which bytes: a producer retry with another variant has a different body.
    variant: u8,
    close: bool,
    stream_seq: Option<u8>,
    /// `Stream-Expected-Offset` as a distance from the tail at the time (0: the tail itself).
    expected: Option<i8>,
    /// Time passing before the request (now and then beyond the producer TTL).
    wait_ms: i64,
}

/// The producer TTL of the model test: a few waits exceed it.
const TTL_MS: i64 = 100;

fn op() -> impl Strategy<Value = Op> {
    (
        proptest::option::weighted(0.8, (0u8..2, 0u64..3, 0u64..6)),
        proptest::bool::weighted(0.9),
        0usize..4,
        proptest::bool::weighted(0.2).prop_map(u8::from),
        proptest::bool::weighted(0.05),
        proptest::option::weighted(0.2, 0u8..6),
        proptest::option::weighted(0.2, prop_oneof![3 => Just(0i8), 1 => -3i8..4]),
        prop_oneof![8 => Just(0i64), 1 => 0i64..(2 * TTL_MS)],
    )
        .prop_map(|(producer, matching_type, len, variant, close, stream_seq, expected, wait_ms)| Op {
            producer,
            matching_type,
            len,
            variant,
            close,
            stream_seq,
            expected,
            wait_ms,
        })
}

/// The request `op` makes at `now_ms` against a stream whose tail is `tail` (what its
/// `Stream-Expected-Offset` is relative to).
fn request(op: &Op, now_ms: i64, tail: u64) -> AppendRequest {
    AppendRequest {
        path: "s".into(),
        stream_id: Some(1),
        json_framed: false,
        content_type: Some(if op.matching_type { "text/plain; charset=utf-8" } else { "text/html" }.into()),
        data: Bytes::from(vec![b'x' + op.variant; op.len]),
        close: op.close,
        stream_seq: op.stream_seq.map(|s| format!("s{s}")),
        producer: op.producer.map(|(id, epoch, seq)| ProducerHeaders { id: format!("p{id}"), epoch, seq }),
        if_match: None,
        expected_offset: op.expected.map(|d| Offset(tail.saturating_add_signed(i64::from(d)))),
        body_digest: None,
        idempotency_key: None,
        now_ms,
    }
}

/// One accepted request.
#[derive(Debug, Clone)]
struct Accepted {
    /// (id, epoch, seq, incarnation of the producer's state: a new one after it expired)
    producer: Option<(u8, u64, u64, u32)>,
    end: u64,
    close: bool,
    stream_seq: Option<u8>,
    body: Vec<u8>,
    at_ms: i64,
}

/// Every accepted request, in order: the model's only state.
#[derive(Default)]
struct Model {
    accepted: Vec<Accepted>,
    /// Per producer id, how many times its state was forgotten.
    incarnations: HashMap<u8, u32>,
}

impl Model {
    fn tail(&self) -> u64 {
        self.accepted.last().map_or(0, |a| a.end)
    }
    fn closed(&self) -> bool {
        self.accepted.iter().any(|a| a.close)
    }

    /// The producer's accepted requests that still count at `now`: those of its current
    /// incarnation, unless it has been idle for the TTL.
    fn live_history(&mut self, id: u8, now: i64) -> Vec<Accepted> {
        let inc = *self.incarnations.get(&id).unwrap_or(&0);
        let mine: Vec<Accepted> =
            self.accepted.iter().filter(|a| a.producer.is_some_and(|p| p.0 == id && p.3 == inc)).cloned().collect();
        match mine.last() {
            Some(last) if now >= last.at_ms + TTL_MS => {
                self.incarnations.insert(id, inc + 1);
                Vec::new()
            }
            _ => mine,
        }
    }

    fn answer(&mut self, op: &Op, now: i64) -> Result<AppendOutcome, AppendError> {
        let tail = Offset(self.tail());
        let closed = self.closed();
        if op.len == 0 && !op.close {
            return Err(AppendError::Empty);
        }
        if let Some((id, epoch, seq)) = op.producer {
            let mine = self.live_history(id, now);
            let body = vec![b'x' + op.variant; op.len];
            match mine.last().and_then(|a| a.producer) {
                None if seq != 0 => {
                    return Err(if closed {
                        AppendError::Closed { tail }
                    } else {
                        AppendError::ProducerSeqGap { expected: 0, received: seq }
                    })
                }
                None => {}
                Some((_, cur, _, _)) if epoch < cur => return Err(AppendError::ProducerFenced { current_epoch: cur }),
                Some((_, cur, _, _)) if epoch > cur && seq != 0 => return Err(AppendError::ProducerEpochSeq),
                Some((_, cur, _, _)) if epoch > cur => {}
                Some((_, cur, last, _)) => {
                    let in_epoch: Vec<&Accepted> =
                        mine.iter().filter(|m| m.producer.is_some_and(|p| p.1 == cur)).collect();
                    if seq <= last {
                        let original =
                            in_epoch.iter().rev().take(RECEIPT_WINDOW).find(|m| m.producer.is_some_and(|p| p.2 == seq));
                        if !closed && original.is_some_and(|o| o.body != body) {
                            return Err(AppendError::ProducerBodyMismatch { epoch, seq });
                        }
                        return Ok(AppendOutcome {
                            status: AppendStatus::Duplicate,
                            next_offset: original.map_or(tail, |o| Offset(o.end)),
                            closed,
                            producer: Some((epoch, last)),
                        });
                    }
                    if seq != last + 1 {
                        return Err(if closed {
                            AppendError::Closed { tail }
                        } else {
                            AppendError::ProducerSeqGap { expected: last + 1, received: seq }
                        });
                    }
                }
            }
        }
        if closed {
            return if op.close && op.len == 0 {
                Ok(AppendOutcome {
                    status: AppendStatus::AlreadyClosed,
                    next_offset: tail,
                    closed: true,
                    producer: None,
                })
            } else {
                Err(AppendError::Closed { tail })
            };
        }
        if op.expected.is_some_and(|d| tail.0.saturating_add_signed(i64::from(d)) != tail.0) {
            return Err(AppendError::ExpectedOffsetConflict { tail });
        }
        if op.len > 0 && !op.matching_type {
            return Err(AppendError::ContentTypeMismatch {
                stream: "text/plain".into(),
                requested: Some("text/html".into()),
            });
        }
        let last_seq = self.accepted.iter().filter_map(|a| a.stream_seq).next_back();
        if let (Some(s), Some(last)) = (op.stream_seq, last_seq) {
            if format!("s{s}") <= format!("s{last}") {
                return Err(AppendError::StreamSeqRegression { tail });
            }
        }
        Ok(AppendOutcome {
            status: AppendStatus::Appended,
            next_offset: Offset(tail.0 + op.len as u64),
            closed: op.close,
            producer: op.producer.map(|p| (p.1, p.2)),
        })
    }

    fn record(&mut self, op: &Op, end: u64, now: i64) {
        let producer = op.producer.map(|(id, e, s)| (id, e, s, *self.incarnations.get(&id).unwrap_or(&0)));
        let body = vec![b'x' + op.variant; op.len];
        self.accepted.push(Accepted { producer, end, close: op.close, stream_seq: op.stream_seq, body, at_ms: now });
    }
}

fn same_error(a: &AppendError, b: &AppendError) -> bool {
    format!("{a:?}") == format!("{b:?}")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]
    #[test]
    fn append_rules_match_the_model(ops in proptest::collection::vec(op(), 1..120)) {
        // The rules as every engine applies them: through the stream state machine.
        let mut st = crate::machine::StreamState::new(meta("text/plain"), Offset::ZERO);
        let mut model = Model::default();
        let retention = Retention { producer_ttl_ms: TTL_MS, ..Retention::default() };
        let mut now = 0i64;
        for op in ops {
            now += op.wait_ms;
            let req = request(&op, now, model.tail());
            let got = st.append(&req, &retention, 0);
            let want = model.answer(&op, now);
            match (&got, &want) {
                (Ok(Step::Write(w)), Ok(o)) => {
                    prop_assert_eq!(&w.outcome, o);
                    prop_assert_eq!(w.outcome.next_offset, st.tail);
                    model.record(&op, st.tail.0, now);
                }
                (Ok(Step::Answer(a)), Ok(o)) => prop_assert_eq!(a, o),
                (Err(a), Err(b)) => prop_assert!(same_error(a, b), "{:?} vs {:?} for {:?}", a, b, op),
                _ => prop_assert!(false, "rules {:?}, model {:?}, for {:?}", got, want, op),
            }
            prop_assert_eq!(st.meta.closed, model.closed());
        }
    }
}

#[test]
fn a_request_for_another_incarnation_is_refused_before_anything_else() {
    let m = meta("application/json");
    let mut req = request(
        &Op {
            producer: Some((0, 0, 0)),
            matching_type: true,
            len: 3,
            variant: 0,
            close: false,
            stream_seq: None,
            expected: None,
            wait_ms: 0,
        },
        0,
        0,
    );
    req.stream_id = Some(2);
    assert!(matches!(
        append(&m, Offset::ZERO, WriterState::default(), &req, &Retention::default()),
        Err(AppendError::StreamChanged)
    ));
    // The same request for the right incarnation, unframed, into a JSON stream.
    req.stream_id = Some(1);
    req.content_type = Some("application/json".into());
    assert!(matches!(
        append(&m, Offset::ZERO, WriterState::default(), &req, &Retention::default()),
        Err(AppendError::FramingMismatch)
    ));
    req.json_framed = true;
    assert!(matches!(
        append(&m, Offset::ZERO, WriterState::default(), &req, &Retention::default()),
        Ok(AppendPlan::Write(_))
    ));
}

#[test]
fn parking_covers_small_gaps_and_early_new_epoch_requests_only() {
    let req = request(
        &Op {
            producer: Some((0, 1, 3)),
            matching_type: true,
            len: 1,
            variant: 0,
            close: false,
            stream_seq: None,
            expected: None,
            wait_ms: 0,
        },
        0,
        0,
    );
    assert!(parkable(&req, &AppendError::ProducerSeqGap { expected: 1, received: 3 }));
    assert!(!parkable(&req, &AppendError::ProducerSeqGap { expected: 1, received: 1 + MAX_PARK_AHEAD + 1 }));
    assert!(parkable(&req, &AppendError::ProducerEpochSeq));
    assert!(!parkable(&req, &AppendError::ContentTypeMismatch { stream: "a/b".into(), requested: None }));
    let plain = request(
        &Op {
            producer: None,
            matching_type: true,
            len: 1,
            variant: 0,
            close: false,
            stream_seq: None,
            expected: None,
            wait_ms: 0,
        },
        0,
        0,
    );
    assert!(!parkable(&plain, &AppendError::ProducerSeqGap { expected: 1, received: 3 }));
}

fn create_req(ct: Option<&str>, expiry: Option<Expiry>, closed: bool) -> CreateRequest {
    CreateRequest {
        path: "s".into(),
        content_type: ct.map(str::to_owned),
        expiry,
        fork: None,
        retention: Default::default(),
        compaction: false,
        closed,
        initial: Bytes::new(),
        json_framed: false,
        now_ms: 5,
    }
}

#[test]
fn create_verdicts() {
    let plan = create(None, None, &create_req(None, None, false), 9).expect("create");
    let CreatePlan::Create { meta: m, tail } = plan else { panic!("expected a new stream") };
    assert_eq!(
        (m.id, m.config.content_type.as_str(), m.config.expiry, tail),
        (9, content_type::DEFAULT, Expiry::Never, Offset::ZERO)
    );
    // Identical re-create (parameters of the media type ignored) is 200; anything else 409.
    let existing = meta("text/plain");
    let same =
        create(Some((&existing, Offset(4))), None, &create_req(Some("text/plain;charset=utf-8"), None, false), 10);
    assert!(matches!(same, Ok(CreatePlan::Existing(i)) if i.tail == Offset(4) && i.id == 1));
    // The 409 names the first difference, with both sides.
    let mut compacted = create_req(Some("text/plain"), None, false);
    compacted.compaction = true;
    let mut retained = create_req(Some("text/plain"), None, false);
    retained.retention = crate::RetentionRequest {
        policy: crate::RetentionPolicy { max_age_s: Some(60), max_bytes: None },
        named_age: true,
        named_bytes: false,
    };
    let cases = [
        (
            create_req(Some("text/html"), None, false),
            r#"its content type is "text/plain", the request says "text/html""#,
        ),
        (
            create_req(Some("text/plain"), Some(Expiry::Ttl(5)), false),
            "its expiry is none, the request says Stream-TTL 5",
        ),
        (create_req(Some("text/plain"), None, true), "it is open, the request says closed"),
        (retained, "its retention is max age none, max bytes none; the request names max age 60"),
    ];
    for (differing, says) in cases {
        match create(Some((&existing, Offset(4))), None, &differing, 10) {
            Err(e @ CreateError::ConfigMismatch(_)) => {
                assert_eq!(e.to_string(), format!("stream exists with a different configuration: {says}"))
            }
            other => panic!("{says}: {other:?}"),
        }
    }
    // A stream made for compaction must be JSON: checked before the comparison, so the plain
    // stream here answers that instead.
    assert!(matches!(
        create(Some((&existing, Offset(4))), None, &compacted, 10),
        Err(CreateError::CompactionNeedsJson)
    ));
    let mut gone = existing.clone();
    gone.soft_deleted = true;
    assert!(matches!(
        create(Some((&gone, Offset(4))), None, &create_req(Some("text/plain"), None, false), 10),
        Err(CreateError::PathReserved)
    ));
    // The initial body's framing must match the stream's type.
    let mut unframed = create_req(Some("application/json"), None, false);
    unframed.initial = Bytes::from_static(b"1,");
    assert!(matches!(create(None, None, &unframed, 10), Err(CreateError::FramingMismatch)));
    unframed.json_framed = true;
    assert!(matches!(create(None, None, &unframed, 10), Ok(CreatePlan::Create { tail: Offset(2), .. })));
}

#[test]
fn fork_resolution_verdicts() {
    let src = meta("application/json");
    let f = |offset: Option<u64>, sub: u64| ForkRequest {
        source: "src".into(),
        offset: offset.map(Offset),
        sub_offset: sub,
    };
    let stored = Bytes::from_static(b"{\"a\":1},2,[3],");
    let at = |o: u64| -> Result<Option<Bytes>, StorageError> { Ok((o == 10).then(|| stored.clone())) };
    assert!(matches!(resolve_fork(None, &f(None, 0), at), Err(CreateError::SourceNotFound)));
    let r = resolve_fork(Some((&src, Offset(30))), &f(None, 0), at).expect("fork at tail");
    assert_eq!(r.fork, ForkOf { source_id: 1, fork_point: 30 });
    assert!(matches!(
        resolve_fork(Some((&src, Offset(30))), &f(Some(31), 0), at),
        Err(CreateError::ForkOffsetBeyondTail)
    ));
    // Sub-offsets count messages of a JSON source: two messages are `{"a":1},2,` = 10 bytes.
    let r = resolve_fork(Some((&src, Offset(30))), &f(Some(10), 2), at).expect("sub-offset");
    assert_eq!(r.fork.fork_point, 20);
    assert!(matches!(
        resolve_fork(Some((&src, Offset(30))), &f(Some(10), 4), at),
        Err(CreateError::SubOffsetOvershoot)
    ));
    assert!(matches!(
        resolve_fork(Some((&src, Offset(30))), &f(Some(11), 1), at),
        Err(CreateError::SubOffsetOvershoot)
    ));
    let mut gone = src.clone();
    gone.soft_deleted = true;
    assert!(matches!(resolve_fork(Some((&gone, Offset(30))), &f(None, 0), at), Err(CreateError::SourceGone)));
    // A fork inherits type and expiry unless it names its own; a different type is refused.
    let mut req = create_req(None, None, false);
    let plan = create(None, Some(&r), &req, 7).expect("fork");
    assert!(
        matches!(plan, CreatePlan::Create { ref meta, tail: Offset(20) } if meta.config.content_type == "application/json" && meta.fork == Some(r.fork))
    );
    req.content_type = Some("text/plain".into());
    let refused = create(None, Some(&r), &req, 7);
    assert!(
        matches!(&refused, Err(CreateError::ContentTypeMismatch { source_type, requested }) if source_type == "application/json" && requested == "text/plain"),
        "{refused:?}"
    );
}

#[test]
fn delete_expiry_and_visibility_verdicts() {
    let mut m = meta("text/plain");
    let plain = DeleteRequest::default();
    let purge = DeleteRequest::purge();
    let if_tail = |t: u64, purge: bool| DeleteRequest { if_tail: Some(vec![Offset(t)]), purge };
    assert!(matches!(delete(&m, Offset(4), 0, &plain), Ok(Removal::Remove)));
    assert!(matches!(delete(&m, Offset(4), 2, &plain), Ok(Removal::SoftDelete)));
    assert!(matches!(delete(&m, Offset(4), 0, &if_tail(4, false)), Ok(Removal::Remove)));
    assert!(matches!(
        delete(&m, Offset(4), 0, &if_tail(3, false)),
        Err(LookupError::PreconditionFailed { tail: Offset(4), closed: false })
    ));
    // A purge is a plain delete without forks, and detaches the stream from its path with them.
    assert!(matches!(delete(&m, Offset(4), 0, &purge), Ok(Removal::Remove)));
    assert!(matches!(delete(&m, Offset(4), 2, &purge), Ok(Removal::Detach)));
    assert!(matches!(
        delete(&m, Offset(4), 2, &if_tail(3, true)),
        Err(LookupError::PreconditionFailed { tail: Offset(4), closed: false })
    ));
    m.soft_deleted = true;
    assert!(matches!(delete(&m, Offset(4), 2, &plain), Err(LookupError::Gone)));
    assert!(matches!(delete(&m, Offset(4), 2, &if_tail(3, false)), Err(LookupError::Gone)));
    // The owner's way out of a path a fork keeps reserved: a soft-deleted stream is detached.
    assert!(matches!(delete(&m, Offset(4), 2, &purge), Ok(Removal::Detach)));
    assert!(matches!(delete(&m, Offset(4), 2, &if_tail(4, true)), Ok(Removal::Detach)));
    assert!(matches!(delete(&m, Offset(4), 2, &if_tail(3, true)), Err(LookupError::PreconditionFailed { .. })));
    assert!(source_follows(&m, 0));
    assert!(!source_follows(&m, 1));
    assert!(matches!(visible(m.soft_deleted, false, 1), Err(LookupError::Gone)));
    m.soft_deleted = false;
    std::sync::Arc::make_mut(&mut m.config).expiry = Expiry::Ttl(2);
    assert!(!expired(m.config.expiry, 1_000, 2_999));
    assert!(expired(m.config.expiry, 1_000, 3_000));
    assert!(matches!(visible(m.soft_deleted, true, 0), Err(LookupError::NotFound)));
    assert!(matches!(visible(m.soft_deleted, true, 1), Err(LookupError::Gone)));
    assert!(visible(false, false, 3).is_ok());
    std::sync::Arc::make_mut(&mut m.config).expiry = Expiry::At(50);
    assert!(!expired(m.config.expiry, 0, 49) && expired(m.config.expiry, 0, 50));
}

proptest! {
    /// The prune's cut-off times name exactly the writer state the machine treats as dead, so a
    /// store that deletes rows by time (PostgreSQL) drops what `StreamState::prune` drops. Times
    /// are drawn around each boundary (a few ms either side), where an off-by-one would show.
    #[test]
    fn prune_cutoffs_name_exactly_the_dead_writer_state(
        now in (1i64 << 41)..(1 << 45),
        producer_ttl_ms in 0i64..(1 << 40),
        idempotency_window_ms in 0i64..(1 << 40),
        around_producer in -3i64..=3,
        around_key in -3i64..=3,
    ) {
        let retention = Retention { producer_ttl_ms, idempotency_window_ms, ..Retention::default() };
        let (producers_before, keys_before) = retention.dead_at_or_before(now);
        let last = now - producer_ttl_ms + around_producer;
        let state = ProducerState { epoch: 0, last_seq: 0, receipts: Default::default(), last_active_ms: last };
        prop_assert_eq!(last <= producers_before, !state.is_live(now, producer_ttl_ms));
        let at = now - idempotency_window_ms + around_key;
        let entry = KeyEntry { end: Offset(1), digest: oncelog_protocol::digest::BodyDigest::of(b"x"), at_ms: at };
        prop_assert_eq!(at <= keys_before, !retention.key_is_live(&entry, now));
    }
}

/// The producer caps refuse only what would create producer state, after every other check: at
/// the cap a new producer's gap is still a gap and a closed stream still answers closed, and a
/// known producer (a live state) is never refused, however full the stream or the server.
#[test]
fn the_producer_caps_come_last_and_spare_known_producers() {
    let retention = Retention { max_producers_per_stream: 2, max_producers: 5, ..Retention::default() };
    let m = meta("text/plain");
    let produce = |id: &str, seq: u64| {
        let mut r = AppendRequest::plain("s", "text/plain", false, Bytes::from_static(b"x"), 10);
        r.producer = Some(ProducerHeaders { id: id.into(), epoch: 0, seq });
        r
    };
    let full =
        |on_stream, total| WriterState { producers_on_stream: on_stream, producers_total: total, ..Default::default() };
    let verdict =
        |m: &StreamMeta, w: WriterState<'_>, r: &AppendRequest| append(m, Offset(1), w, r, &retention).map(drop);
    let new = produce("new", 0);
    assert!(matches!(
        verdict(&m, full(2, 0), &new),
        Err(AppendError::ProducerLimit { cap: ProducerCap::PerStream, limit: 2 })
    ));
    assert!(matches!(
        verdict(&m, full(0, 5), &new),
        Err(AppendError::ProducerLimit { cap: ProducerCap::Total, limit: 5 })
    ));
    assert!(verdict(&m, full(1, 4), &new).is_ok(), "below both caps");
    assert!(matches!(verdict(&m, full(2, 5), &produce("new", 1)), Err(AppendError::ProducerSeqGap { .. })));
    let mut closed = m.clone();
    closed.closed = true;
    assert!(matches!(verdict(&closed, full(2, 5), &new), Err(AppendError::Closed { .. })));
    // A known producer: its next seq and its retry, at both caps.
    let known = ProducerState::accepted(
        None,
        0,
        0,
        oncelog_protocol::producer::Receipt { end: Offset(1), digest: BodyDigest::of(b"x") },
        5,
    );
    let w = WriterState { producer: Some(&known), ..full(2, 5) };
    assert!(matches!(append(&m, Offset(1), w, &produce("new", 1), &retention), Ok(AppendPlan::Write(_))));
    assert!(matches!(append(&m, Offset(1), w, &produce("new", 0), &retention), Ok(AppendPlan::Answer(_))));
    // The same state once expired is a new producer again, and meets the cap.
    let late = AppendRequest { now_ms: 5 + retention.producer_ttl_ms, ..produce("new", 0) };
    assert!(matches!(append(&m, Offset(1), w, &late, &retention), Err(AppendError::ProducerLimit { .. })));
}
