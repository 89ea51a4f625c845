//! The subscription rules one decision at a time, over records built by hand (the engine
//! contract cases in `oncelog_storage::contract::subscriptions` run them through the service).

use oncelog_protocol::Offset;

use super::*;
use crate::{LinkType, SubKind};

const TTL: u32 = 1_000;

fn pull() -> SubRecord {
    let config = SubConfig {
        kind: SubKind::PullWake { wake_stream: "wake".into() },
        pattern: Some("jobs/*".into()),
        streams: vec!["x".into()],
        lease_ttl_ms: TTL,
        description: None,
        outputs: Vec::new(),
    };
    new_record("p", 7, &config, 5)
}

fn webhook() -> SubRecord {
    let mut rec = pull();
    rec.config.kind = SubKind::Webhook { url: "https://hooks.example/x".into() };
    rec
}

fn entry(rec: SubRecord) -> Entry {
    Entry::new(rec, Bytes::new())
}

fn link(path: &str, stream_id: u64, acked: u64, tail: u64) -> Link {
    Link { path: path.into(), link_type: LinkType::Glob, stream_id, acked: Offset(acked), tail: Offset(tail) }
}

fn ack(stream: &str, offset: u64) -> Ack {
    Ack { stream: stream.into(), offset: Offset(offset) }
}

/// `rec` with a wake of `generation`, held by `holder`, its lease to `until`.
fn woken(mut rec: SubRecord, generation: u64, holder: Option<&str>, until: Option<i64>) -> SubRecord {
    rec.generation = generation;
    rec.wake = Some(Wake {
        generation,
        holder: holder.map(Into::into),
        lease_until_ms: until,
        snapshot: vec![("jobs/a".into(), 1, Offset(10))],
    });
    rec
}

fn fence_of(rec: &SubRecord, generation: u64) -> Fence {
    Fence { uid: rec.uid, token_generation: generation, generation, wake_id: rec.wake_id(generation) }
}

#[test]
fn a_new_record_links_what_its_configuration_names_and_has_no_wake() {
    let rec = pull();
    assert_eq!((rec.uid, rec.id.as_str(), rec.created_ms), (7, "p", 5));
    assert_eq!(rec.explicit.iter().collect::<Vec<_>>(), ["x"]);
    assert_eq!(
        (rec.generation, rec.wake.is_none(), rec.last_done, rec.failures, rec.next_attempt_ms),
        (0, true, 0, 0, 0)
    );
}

#[test]
fn new_links_start_at_the_tails_of_existing_streams() {
    let mut e = entry(pull());
    e.baseline = std::sync::Arc::new(start_at_tails(vec![
        link("jobs/a", 3, 0, 40),
        link("x", 0, 0, 0),
        link("jobs/empty", 4, 0, 0),
    ]));
    assert!(e.cursors.is_empty(), "no cursor: a baseline");
    assert_eq!(e.baseline.len(), 1, "nothing where no stream exists, nor for an empty stream");
    assert_eq!(e.acked("jobs/a", 3), Offset(40));
    assert_eq!(e.acked("jobs/a", 5), Offset::ZERO, "another incarnation starts over");
    assert_eq!(e.acked("jobs/empty", 4), Offset::ZERO);
}

#[test]
fn relinking_answers_only_paths_linked_in_no_way_before() {
    let before = entry(pull());
    let mut next = before.rec.clone();
    let add: Vec<String> = ["y", "jobs/b", "x", "y", "z"].map(String::from).to_vec();
    let remove: Vec<String> = ["x", "z", "absent"].map(String::from).to_vec();
    let fresh = relink(&before, &mut next, &add, &remove);
    // "jobs/b" is the pattern's already, "x" explicit already, the second "y" a repeat.
    assert_eq!(fresh, ["y", "z"]);
    assert_eq!(next.explicit.iter().collect::<Vec<_>>(), ["jobs/b", "y"], "adds first, then removes");
}

#[test]
fn a_wake_is_issued_only_when_none_is_live_and_no_retry_is_awaited() {
    assert!(may_wake(&pull(), 0));
    assert!(!may_wake(&woken(pull(), 1, None, None), 1_000_000), "an unclaimed pull wake never runs out");
    assert!(!may_wake(&woken(pull(), 1, Some("w"), Some(100)), 99));
    assert!(may_wake(&woken(pull(), 1, Some("w"), Some(100)), 100), "a lease ends at its end");
    let mut hook = webhook();
    hook.failures = 2;
    hook.next_attempt_ms = 500;
    assert!(!may_wake(&hook, 499), "a webhook waits for its retry time");
    assert!(may_wake(&hook, 500));
    let mut pulled = pull();
    pulled.failures = 2;
    pulled.next_attempt_ms = 500;
    assert!(may_wake(&pulled, 0), "retry times are a webhook's only");
}

#[test]
fn without_pending_work_a_run_out_wake_ends_and_nothing_else_happens() {
    let mut rec = pull();
    assert!(matches!(wake(&mut rec, &[], None, 0), Woke::Nothing));
    assert_eq!(rec, pull());
    let mut rec = woken(pull(), 3, Some("w"), Some(100));
    assert!(matches!(wake(&mut rec, &[], None, 200), Woke::Ended));
    assert_eq!((rec.wake, rec.generation), (None, 3));
}

#[test]
fn a_pull_wake_takes_the_next_generation_snapshots_the_pending_tails_and_announces_itself() {
    let mut rec = woken(pull(), 3, Some("w"), Some(100));
    let pending = [link("jobs/a", 1, 10, 20), link("jobs/b", 2, 0, 5)];
    let Woke::Issued(Some(event)) = wake(&mut rec, &pending, None, 200) else { panic!("a pull wake has an event") };
    let w = rec.wake.clone().expect("wake");
    assert_eq!(
        (rec.generation, w.generation, w.holder, w.lease_until_ms),
        (4, 4, None, None),
        "unclaimed: no lease yet"
    );
    assert_eq!(w.snapshot, [("jobs/a".to_string(), 1, Offset(20)), ("jobs/b".to_string(), 2, Offset(5))]);
    assert_eq!(
        (event.path.as_str(), event.json_framed, event.content_type.as_deref()),
        ("wake", true, Some("application/json"))
    );
    let msg: serde_json::Value = serde_json::from_slice(event.data.strip_suffix(b",").expect("framed")).expect("json");
    assert_eq!(
        msg,
        serde_json::json!({"type": "wake", "subscription_id": "p", "stream": "jobs/a", "generation": 4, "ts": 200})
    );
    // The write that woke it is the stream the event names.
    let mut rec = pull();
    let event = wake(&mut rec, &pending, Some("jobs/b"), 0).event().expect("event");
    let msg: serde_json::Value = serde_json::from_slice(event.data.strip_suffix(b",").expect("framed")).expect("json");
    assert_eq!(msg["stream"], "jobs/b");
}

#[test]
fn a_webhook_wake_has_no_event_and_its_lease_runs_at_once() {
    let mut rec = webhook();
    assert!(matches!(wake(&mut rec, &[link("jobs/a", 1, 0, 5)], None, 200), Woke::Issued(None)));
    assert_eq!(rec.wake.expect("wake").lease_until_ms, Some(200 + i64::from(TTL)));
}

#[test]
fn claims_go_to_pull_wakes_nobody_else_holds() {
    assert!(matches!(may_claim(&webhook(), "w", 0), Err(SubError::WrongType { needs: "pull-wake" })));
    assert!(matches!(may_claim(&pull(), "w", 0), Ok(false)), "no wake: one must be issued");
    assert!(matches!(may_claim(&woken(pull(), 2, None, None), "w", 0), Ok(true)), "unclaimed");
    assert!(matches!(may_claim(&woken(pull(), 2, Some("w"), Some(100)), "w", 50), Ok(true)), "its own, again");
    match may_claim(&woken(pull(), 2, Some("v"), Some(100)), "w", 50) {
        Err(SubError::AlreadyClaimed { holder, generation: 2 }) => assert_eq!(holder, "v"),
        r => panic!("{r:?}"),
    }
    assert!(matches!(may_claim(&woken(pull(), 2, Some("v"), Some(100)), "w", 100), Ok(false)), "the lease ran out");
}

#[test]
fn holding_a_wake_names_the_worker_and_starts_its_lease() {
    let mut rec = woken(pull(), 2, None, None);
    assert_eq!(hold(&mut rec, "w", 300).expect("hold"), 2);
    let w = rec.wake.expect("wake");
    assert_eq!((w.holder.as_deref(), w.lease_until_ms), (Some("w"), Some(300 + i64::from(TTL))));
    assert!(matches!(hold(&mut pull(), "w", 0), Err(SubError::NoPendingWork)));
}

#[test]
fn fences_check_kind_incarnation_generation_wake_id_and_holder() {
    let held = woken(pull(), 2, Some("w"), Some(100));
    let f = fence_of(&held, 2);
    assert!(fence(&held, &f, AckVia::Ack, 50).is_ok());
    assert!(fence(&held, &f, AckVia::Commit, 50).is_ok());
    assert!(matches!(fence(&held, &f, AckVia::Callback, 50), Err(SubError::WrongType { needs: "webhook" })));
    assert!(matches!(fence(&held, &Fence { uid: 8, ..f.clone() }, AckVia::Ack, 50), Err(SubError::TokenInvalid)));
    assert!(matches!(fence(&held, &f, AckVia::Ack, 100), Err(SubError::Fenced)), "the lease ran out");
    for stale in [
        Fence { token_generation: 1, ..f.clone() },
        Fence { generation: 1, ..f.clone() },
        Fence { wake_id: held.wake_id(1), ..f.clone() },
    ] {
        assert!(matches!(fence(&held, &stale, AckVia::Ack, 50), Err(SubError::Fenced)), "{stale:?}");
    }
    let unclaimed = woken(pull(), 2, None, None);
    assert!(matches!(fence(&unclaimed, &f, AckVia::Ack, 50), Err(SubError::Fenced)), "only the claimant acts");
    let hook = woken(webhook(), 2, None, Some(100));
    assert!(fence(&hook, &f, AckVia::Callback, 50).is_ok(), "a webhook's receiver holds it at once");
    assert!(matches!(fence(&hook, &f, AckVia::Ack, 50), Err(SubError::WrongType { needs: "pull-wake" })));
    assert!(matches!(fence(&pull(), &fence_of(&pull(), 0), AckVia::Ack, 0), Err(SubError::Fenced)), "no wake");
}

#[test]
fn only_a_commit_with_the_last_done_wakes_fence_is_a_possible_repeat() {
    let mut rec = pull();
    assert!(!ended_by(&rec, &fence_of(&rec, 0), AckVia::Commit), "nothing ended yet");
    rec.generation = 3;
    rec.last_done = 3;
    let f = fence_of(&rec, 3);
    assert!(ended_by(&rec, &f, AckVia::Commit));
    assert!(!ended_by(&rec, &f, AckVia::Ack));
    assert!(!ended_by(&rec, &f, AckVia::Callback));
    for other in [
        Fence { uid: 8, ..f.clone() },
        Fence { token_generation: 2, ..f.clone() },
        Fence { generation: 2, ..f.clone() },
        Fence { wake_id: rec.wake_id(2), ..f.clone() },
    ] {
        assert!(!ended_by(&rec, &other, AckVia::Commit), "{other:?}");
    }
}

#[test]
fn acks_are_in_already_when_every_named_stream_is_processed_that_far() {
    let mut e = entry(pull());
    e.cursors.insert("jobs/a".into(), Cursor { stream_id: 1, acked: Offset(10) });
    let links = [link("jobs/a", 1, 10, 20), link("gone", 0, 0, 0)];
    assert!(acked_already(&e, &links, &[]));
    assert!(acked_already(&e, &links, &[ack("jobs/a", 10), ack("jobs/a", 3)]));
    assert!(!acked_already(&e, &links, &[ack("jobs/a", 11)]));
    assert!(!acked_already(&e, &links, &[ack("gone", 0)]), "no stream there");
    assert!(!acked_already(&e, &links, &[ack("other", 0)]), "not linked");
    // A cursor of an earlier incarnation does not count.
    assert!(!acked_already(&e, &[link("jobs/a", 2, 0, 20)], &[ack("jobs/a", 10)]));
}

#[test]
fn acks_move_cursors_forward_within_the_tail_of_a_linked_stream() {
    let mut e = entry(pull());
    e.cursors.insert("jobs/a".into(), Cursor { stream_id: 1, acked: Offset(10) });
    let links = [link("jobs/a", 1, 10, 20), link("jobs/b", 2, 0, 5), link("gone", 0, 0, 0)];
    let moved = apply_acks(&mut e, &links, &[ack("jobs/a", 10), ack("jobs/b", 5)]).expect("acks");
    assert_eq!(moved, ["jobs/b"], "an ack where the cursor is moves nothing");
    assert_eq!(e.cursors["jobs/b"], Cursor { stream_id: 2, acked: Offset(5) });
    let refused = |acks: &[Ack]| match apply_acks(&mut e.clone(), &links, acks) {
        Err(SubError::InvalidOffset { stream, why }) => (stream, why),
        r => panic!("{r:?}"),
    };
    assert_eq!(refused(&[ack("jobs/a", 21)]), ("jobs/a".into(), "beyond the stream's tail"));
    assert_eq!(
        refused(&[ack("jobs/a", 9)]),
        ("jobs/a".into(), "behind the acknowledged offset: cursors never move back")
    );
    assert_eq!(refused(&[ack("gone", 0)]), ("gone".into(), "not a linked stream"));
    assert_eq!(
        refused(&[ack("jobs/a", 15), ack("other", 0)]),
        ("other".into(), "not a linked stream"),
        "one bad ack fails them all"
    );
    // A new incarnation at a path starts over, whatever the old cursor said.
    let mut e2 = e.clone();
    assert_eq!(apply_acks(&mut e2, &[link("jobs/a", 9, 0, 4)], &[ack("jobs/a", 4)]).expect("acks"), ["jobs/a"]);
    assert_eq!(e2.cursors["jobs/a"], Cursor { stream_id: 9, acked: Offset(4) });
}

#[test]
fn done_ends_the_wake_and_remembers_it_and_otherwise_the_lease_is_extended() {
    let mut rec = woken(pull(), 4, Some("w"), Some(100));
    extend(&mut rec, 90);
    assert_eq!(rec.wake.as_ref().and_then(|w| w.lease_until_ms), Some(90 + i64::from(TTL)));
    finish(&mut rec);
    assert_eq!((rec.wake.is_none(), rec.last_done, rec.generation), (true, 4, 4));
    extend(&mut rec, 95);
    assert!(rec.wake.is_none(), "no wake, nothing to extend");
}

#[test]
fn the_pass_skips_settled_subscriptions_but_on_a_full_pass() {
    let mut e = entry(pull());
    assert!(!pass_skips(&e, false), "not settled");
    e.settled = true;
    assert!(pass_skips(&e, false));
    assert!(!pass_skips(&e, true));
    e.rec = woken(pull(), 1, None, None);
    assert!(!pass_skips(&e, false), "a wake is looked at");
    assert!(settles(&pull()));
    assert!(!settles(&woken(pull(), 1, None, None)));
    let mut failing = webhook();
    failing.failures = 1;
    assert!(!settles(&failing));
}

#[test]
fn deliveries_go_once_per_wake_and_again_when_a_retry_is_due() {
    let mut e = entry(woken(webhook(), 2, None, Some(1_000)));
    assert_eq!(delivery(&e, 100), (Some(1_000), Some((2, "https://hooks.example/x".into()))));
    e.sent = 2;
    assert_eq!(delivery(&e, 100), (Some(1_000), None), "sent already");
    e.sent = 0;
    e.in_flight = true;
    assert_eq!(delivery(&e, 100), (Some(1_000), None), "in flight");
    e.in_flight = false;
    e.sent = 2;
    e.rec.failures = 1;
    e.rec.next_attempt_ms = 400;
    assert_eq!(delivery(&e, 100), (Some(400), None), "waiting for the retry time, the sooner deadline");
    assert_eq!(delivery(&e, 400), (Some(1_000), Some((2, "https://hooks.example/x".into()))), "the retry is due");
    assert_eq!(delivery(&e, 1_000), (None, None), "the lease ran out");
    let mut waiting = entry(webhook());
    waiting.rec.failures = 1;
    waiting.rec.next_attempt_ms = 400;
    assert_eq!(delivery(&waiting, 100), (Some(400), None), "no wake, but a retry time");
    assert_eq!(
        delivery(&entry(woken(pull(), 2, Some("w"), Some(700))), 100),
        (Some(700), None),
        "pull wakes are not delivered"
    );
    assert_eq!(delivery(&entry(woken(pull(), 2, None, None)), 100), (None, None));
}

#[test]
fn an_accepted_delivery_counts_for_the_live_wake_when_it_ends_it_or_ends_failures() {
    let rec = woken(webhook(), 2, None, Some(1_000));
    assert!(delivery_counts(&rec, 2, true, 100));
    assert!(!delivery_counts(&rec, 2, false, 100), "healthy and not done: nothing to write");
    assert!(!delivery_counts(&rec, 1, true, 100), "another wake's");
    assert!(!delivery_counts(&rec, 2, true, 1_000), "run out");
    let mut failing = rec.clone();
    failing.failures = 3;
    assert!(delivery_counts(&failing, 2, false, 100));
}

#[test]
fn an_accepted_done_acks_the_snapshot_and_ends_the_wake() {
    let mut rec = woken(webhook(), 2, None, Some(1_000));
    rec.failures = 3;
    rec.next_attempt_ms = 50;
    rec.wake.as_mut().expect("wake").snapshot.push(("jobs/b".into(), 2, Offset(4)));
    let mut e = entry(rec);
    e.cursors.insert("jobs/b".into(), Cursor { stream_id: 2, acked: Offset(4) });
    let mut kept = e.clone();
    assert!(delivered(&mut kept, 2, false).is_empty());
    assert_eq!(
        (kept.rec.failures, kept.rec.next_attempt_ms, kept.rec.wake.is_some(), kept.rec.last_done),
        (0, 0, true, 0)
    );
    let moved = delivered(&mut e, 2, true);
    assert_eq!(moved, ["jobs/a"], "jobs/b was acked that far already");
    assert_eq!(e.cursors["jobs/a"], Cursor { stream_id: 1, acked: Offset(10) });
    assert_eq!((e.rec.failures, e.rec.wake.is_none(), e.rec.last_done), (0, true, 2));
}

#[test]
fn a_failed_delivery_of_the_current_wake_schedules_the_retry() {
    let rec = woken(webhook(), 2, None, Some(1_000));
    assert!(failure_counts(&rec, 2));
    assert!(failure_counts(&rec, 2) && rec.live_wake(5_000).is_none(), "also once its lease ran out");
    assert!(!failure_counts(&rec, 1));
    assert!(!failure_counts(&webhook(), 0));
    let mut rec = rec;
    delivery_failed(&mut rec, 250, 100);
    delivery_failed(&mut rec, 500, 200);
    assert_eq!((rec.failures, rec.next_attempt_ms), (2, 700));
    rec.failures = u32::MAX;
    delivery_failed(&mut rec, i64::MAX, 1);
    assert_eq!((rec.failures, rec.next_attempt_ms), (u32::MAX, i64::MAX), "saturates");
}
