//! Subscriptions over the engine: configuration, wakes, claims, fencing, webhook delivery
//! schedules and transactional commits, each across a reopen. The decisions are the shared
//! [`crate`] code; what an engine must get right is the metadata map and transactions
//! underneath, and these cases hold it to that.

use std::sync::Arc;

use crate::*;
use oncelog_storage::contract::*;
use oncelog_storage::*;

macro_rules! case_names {
    ($($case:ident),* $(,)?) => {
        &[$(stringify!($case)),*]
    };
}

/// Every subscription case, in the order [`crate::subscription_contract_tests!`] runs them.
pub const ALL_CASES: &[&str] = crate::__subscription_cases! { [case_names] };

/// Subscriptions over the harness's engine (a clone sharing it). Dropped before each reopen,
/// so the old engine is gone when the storage opens again.
fn subs<H: Harness>(h: &H) -> Subscriptions<H::Engine> {
    Subscriptions::new(Arc::new(h.engine().clone()))
}

fn pull(pattern: Option<&str>, streams: &[&str], wake_stream: &str) -> SubConfig {
    SubConfig {
        kind: SubKind::PullWake { wake_stream: wake_stream.into() },
        pattern: pattern.map(Into::into),
        streams: streams.iter().map(|s| s.to_string()).collect(),
        lease_ttl_ms: 1_000,
        description: None,
        outputs: Vec::new(),
    }
}

fn webhook(pattern: &str) -> SubConfig {
    SubConfig { kind: SubKind::Webhook { url: "https://hooks.example/x".into() }, ..pull(Some(pattern), &[], "") }
}

fn fence(n: &WakeNotice) -> Fence {
    Fence { uid: n.uid, token_generation: n.generation, generation: n.generation, wake_id: n.wake_id.clone() }
}

fn ack_req(n: &WakeNotice, acks: Vec<Ack>, done: bool, via: AckVia) -> AckRequest {
    AckRequest { fence: fence(n), acks, done, via, outputs: Vec::new() }
}

fn acked(view: &SubView, path: &str) -> Option<(Offset, Offset)> {
    view.links.iter().find(|l| l.path == path).map(|l| (l.acked, l.tail))
}

async fn json_append<E: Engine>(e: &E, path: &str, v: &str) -> Offset {
    append(e, json_req(path, &[v])).await.next_offset
}

pub async fn subscriptions_are_configuration_that_survives_reopen<H: Harness>() {
    let mut h = H::open().await;
    let e = h.engine();
    create(e, create_req("events/a", "application/json")).await;
    json_append(e, "events/a", "1").await;
    create(e, create_req("events/a/deeper", "application/json")).await;
    create(e, create_req("other", "application/json")).await;
    create(e, create_req("__ds/reserved", "application/json")).await;
    let s = subs(&h);
    let cfg = webhook("/events/*/");
    let (verdict, view) = s.put("one", cfg.clone(), 10).await.expect("put");
    assert_eq!(verdict, PutVerdict::Created);
    assert_eq!(view.record.config.pattern.as_deref(), Some("events/*"), "patterns are normalized");
    // Backfill: existing matches are linked at their tails, so old data is not pending.
    assert_eq!(view.links.len(), 1);
    let tail = e.head("events/a", 0).await.expect("head").tail;
    assert_eq!(acked(&view, "events/a"), Some((tail, tail)));
    assert_eq!(s.put("one", cfg.clone(), 20).await.expect("again").0, PutVerdict::Existing);
    let other = SubConfig { lease_ttl_ms: 2_000, ..cfg.clone() };
    assert!(matches!(s.put("one", other, 20).await, Err(SubError::AlreadyExists)));
    assert!(matches!(
        s.put("bad", SubConfig { lease_ttl_ms: 999, ..cfg.clone() }, 0).await,
        Err(SubError::Invalid(InvalidSub::LeaseTtl))
    ));
    assert!(matches!(s.put("bad", pull(None, &[], "w"), 0).await, Err(SubError::Invalid(InvalidSub::NoTarget))));
    assert!(matches!(s.put("a/b", cfg.clone(), 0).await, Err(SubError::Invalid(InvalidSub::BadId))));

    // Explicit links, also to streams that do not exist; removal keeps a glob match.
    s.put("two", pull(Some("events/*"), &["manual/a"], "wake"), 30).await.expect("put two");
    s.relink("two", vec!["manual/b".into(), "events/a".into()], vec![], 31).await.expect("add");
    s.relink("two", vec![], vec!["manual/b".into(), "events/a".into()], 32).await.expect("remove");
    let two = s.get("two", 33).await.expect("get");
    let kinds: Vec<(&str, LinkType)> = two.links.iter().map(|l| (l.path.as_str(), l.link_type)).collect();
    assert_eq!(kinds, [("events/a", LinkType::Glob), ("manual/a", LinkType::Explicit)]);
    let uid_two = two.record.uid;

    drop(s);
    h.reopen().await;
    let s = subs(&h);
    let again = s.get("one", 40).await.expect("get after reopen");
    assert_eq!(again.record, view.record);
    assert_eq!(again.links, view.links);
    assert_eq!(s.get("two", 40).await.expect("two").links.len(), 2);
    assert!(s.delete("two", 41).await.expect("delete"));
    assert!(!s.delete("two", 41).await.expect("delete again"));
    assert!(matches!(s.get("two", 42).await, Err(SubError::NotFound)));
    // A re-created subscription is a new incarnation: tokens of the old one do not fit it.
    let (_, fresh) = s.put("two", pull(Some("events/*"), &[], "wake"), 43).await.expect("recreate");
    assert!(fresh.record.uid > uid_two);
    drop(s);
    h.reopen().await;
    let s = subs(&h);
    assert_eq!(s.list().await.expect("list").iter().map(|r| r.id.as_str()).collect::<Vec<_>>(), ["one", "two"]);
}

pub async fn pull_wake_claims_are_fenced_by_generation<H: Harness>() {
    let mut h = H::open().await;
    let e = h.engine();
    create(e, create_req("wake", "application/json")).await;
    create(e, create_req("jobs/a", "application/json")).await;
    let s = subs(&h);
    s.put("p", pull(Some("jobs/*"), &[], "wake"), 0).await.expect("put");
    assert!(matches!(s.claim("p", "w1", 0).await, Err(SubError::NoPendingWork)));

    // An append wakes the subscription once: one event in the wake stream, generation 1.
    let tail = json_append(e, "jobs/a", r#"{"n":1}"#).await;
    s.on_write("jobs/a", 100).await.expect("on_write");
    json_append(e, "jobs/a", r#"{"n":2}"#).await;
    s.on_write("jobs/a", 101).await.expect("no second wake while one is live");
    let events = read_all(e, "wake", 1 << 20).await;
    assert_eq!(events.matches("\"type\":\"wake\"").count(), 1, "{events}");
    assert!(events.contains("\"subscription_id\":\"p\"") && events.contains("\"generation\":1"), "{events}");

    let a = s.claim("p", "w1", 200).await.expect("claim");
    assert_eq!(a.generation, 1);
    assert_eq!(a.streams.iter().map(|l| (l.path.as_str(), l.acked)).collect::<Vec<_>>(), [("jobs/a", Offset::ZERO)]);
    match s.claim("p", "w2", 300).await {
        Err(SubError::AlreadyClaimed { holder, generation: 1 }) => assert_eq!(holder, "w1"),
        r => panic!("{r:?}"),
    }
    // The holder claiming again (a lost answer) gets the same wake back.
    let again = s.claim("p", "w1", 300).await.expect("re-claim by the holder");
    assert_eq!((again.generation, again.wake_id.as_str()), (1, a.wake_id.as_str()));
    // A heartbeat (ack without done) moves the cursor and extends the lease.
    let first = AckOutcome { next_wake: false, duplicate: false, appends: vec![] };
    assert_eq!(
        s.ack("p", ack_req(&a, vec![Ack { stream: "jobs/a".into(), offset: tail }], false, AckVia::Ack), 1_100)
            .await
            .expect("heartbeat"),
        first
    );
    // Cursors never move back, nor past the tail, nor on streams not linked; nothing applies
    // when one is wrong.
    let bad = [
        vec![Ack { stream: "jobs/a".into(), offset: Offset::ZERO }],
        vec![Ack { stream: "jobs/a".into(), offset: Offset(1 << 40) }],
        vec![
            Ack { stream: "jobs/a".into(), offset: Offset(tail.0 + 1) },
            Ack { stream: "nope".into(), offset: Offset::ZERO },
        ],
    ];
    for acks in bad {
        let r = s.ack("p", ack_req(&a, acks, true, AckVia::Ack), 1_200).await;
        assert!(matches!(r, Err(SubError::InvalidOffset { .. })), "{r:?}");
    }
    assert_eq!(acked(&s.get("p", 1_200).await.expect("get"), "jobs/a").map(|x| x.0), Some(tail));

    // The lease (extended to 2_100) runs out with work pending: the dispatcher's pass wakes it
    // again (generation 2, a new event), w2 claims that; everything of w1 is fenced.
    s.due(2_150).await.expect("due");
    let events = read_all(e, "wake", 1 << 20).await;
    assert!(events.contains("\"generation\":2"), "a lease that ran out re-wakes pending work: {events}");
    let b = s.claim("p", "w2", 2_200).await.expect("claim after the lease ended");
    assert_eq!(b.generation, 2);
    let before = s.get("p", 2_300).await.expect("get");
    let end = e.head("jobs/a", 0).await.expect("head").tail;
    let zombie = [
        s.ack("p", ack_req(&a, vec![Ack { stream: "jobs/a".into(), offset: end }], true, AckVia::Ack), 2_300)
            .await
            .err(),
        s.release("p", &fence(&a), 2_300).await.err(),
        s.ack(
            "p",
            AckRequest { outputs: vec![append_req("jobs/a", "x")], ..ack_req(&a, vec![], true, AckVia::Commit) },
            2_300,
        )
        .await
        .err(),
        // Another subscription's token, or a wrong wake id, of the current generation.
        s.ack(
            "p",
            AckRequest { fence: Fence { uid: b.uid + 100, ..fence(&b) }, ..ack_req(&b, vec![], true, AckVia::Ack) },
            2_300,
        )
        .await
        .err(),
        s.ack(
            "p",
            AckRequest {
                fence: Fence { wake_id: "w_0_0".into(), ..fence(&b) },
                ..ack_req(&b, vec![], true, AckVia::Ack)
            },
            2_300,
        )
        .await
        .err(),
    ];
    for (i, r) in zombie.iter().enumerate() {
        assert!(matches!(r, Some(SubError::Fenced | SubError::TokenInvalid)), "{i}: {r:?}");
    }
    assert_eq!(s.get("p", 2_300).await.expect("get"), before, "fenced requests change nothing");
    assert_eq!(e.head("jobs/a", 0).await.expect("head").tail, end, "a fenced commit writes nothing");

    // done acks and ends the wake; nothing pending, so no next wake; the same again is fenced.
    let done = s
        .ack("p", ack_req(&b, vec![Ack { stream: "jobs/a".into(), offset: end }], true, AckVia::Ack), 2_400)
        .await
        .expect("done");
    assert!(!done.next_wake);
    assert!(matches!(s.ack("p", ack_req(&b, vec![], true, AckVia::Ack), 2_400).await, Err(SubError::Fenced)));

    // State survives a reopen: cursor, generation; a new append wakes generation 3.
    drop(s);
    h.reopen().await;
    let e = h.engine();
    let s = subs(&h);
    assert_eq!(acked(&s.get("p", 2_500).await.expect("get"), "jobs/a"), Some((end, end)));
    json_append(e, "jobs/a", r#"{"n":3}"#).await;
    s.on_write("jobs/a", 2_600).await.expect("on_write");
    let c = s.claim("p", "w3", 2_700).await.expect("claim");
    assert_eq!(c.generation, 3);
    // A release gives the work back: pending work wakes again at once (generation 4).
    s.release("p", &fence(&c), 2_800).await.expect("release");
    assert_eq!(s.claim("p", "w1", 2_900).await.expect("claim").generation, 4);
    assert_eq!(read_all(e, "wake", 1 << 20).await.matches("\"type\":\"wake\"").count(), 4);
}

pub async fn webhook_deliveries_follow_a_stored_schedule<H: Harness>() {
    let mut h = H::open().await;
    let e = h.engine();
    create(e, create_req("ev/a", "application/json")).await;
    let s = subs(&h);
    s.put("hook", webhook("ev/*"), 0).await.expect("put");
    assert!(s.due(0).await.expect("due").deliveries.is_empty());
    let tail = json_append(e, "ev/a", "1").await;
    s.on_write("ev/a", 1_000).await.expect("on_write");
    let due = s.due(1_000).await.expect("due");
    assert_eq!(due.deliveries.len(), 1);
    let d = &due.deliveries[0];
    assert_eq!((d.generation, d.url.as_deref(), d.streams[0].tail), (1, Some("https://hooks.example/x"), tail));
    assert_eq!(due.next_deadline_ms, Some(2_000), "the lease's end");
    assert!(s.due(1_001).await.expect("due").deliveries.is_empty(), "one delivery in flight");
    s.delivery_failed("hook", 1, 5_000, 1_100).await.expect("failed");
    // The retry time is stored: nothing before it, even after a reopen.
    drop(s);
    h.reopen().await;
    let e = h.engine();
    let s = subs(&h);
    assert_eq!(s.get("hook", 1_200).await.expect("get").record.failures, 1);
    assert!(s.due(1_200).await.expect("due").deliveries.is_empty());
    assert!(s.due(6_000).await.expect("due").deliveries.is_empty(), "retry at 6_100");
    let retry = s.due(6_100).await.expect("due");
    // The first wake's lease ended meanwhile: the retry is a new generation.
    assert_eq!(retry.deliveries.iter().map(|d| d.generation).collect::<Vec<_>>(), [2]);
    // A stale delivery result changes nothing; the current one with done acks the snapshot.
    s.delivered("hook", 1, true, 6_200).await.expect("stale");
    assert_eq!(acked(&s.get("hook", 6_200).await.expect("get"), "ev/a"), Some((Offset::ZERO, tail)));
    json_append(e, "ev/a", "2").await; // after the snapshot: not acked by this wake's done
    s.delivered("hook", 2, true, 6_300).await.expect("delivered");
    let view = s.get("hook", 6_300).await.expect("get");
    assert_eq!(view.record.failures, 0);
    assert_eq!(acked(&view, "ev/a").map(|x| x.0), Some(tail));
    // ...so the next wake (generation 3) follows at once.
    assert_eq!(view.record.wake.as_ref().map(|w| w.generation), Some(3));
}

pub async fn commits_write_outputs_and_acks_atomically<H: Harness>() {
    let mut h = H::open().await;
    let e = h.engine();
    create(e, create_req("wake", "application/json")).await;
    create(e, create_req("in/a", "application/json")).await;
    create(e, create_req("out", "text/plain")).await;
    create(e, create_req("closed", "text/plain")).await;
    append(e, close_req("closed")).await;
    let s = subs(&h);
    s.put("t", pull(Some("in/*"), &[], "wake"), 0).await.expect("put");
    let tail = json_append(e, "in/a", "1").await;
    s.on_write("in/a", 10).await.expect("on_write");
    let c = s.claim("t", "w", 20).await.expect("claim");
    let output = |data: &str, seq| produce("out", data, "sub:t", c.generation, seq);
    let acks = vec![Ack { stream: "in/a".into(), offset: tail }];

    // An output the engine refuses: nothing at all is written, the cursor stays.
    let refused = AckRequest {
        outputs: vec![output("x", 0), append_req("closed", "y")],
        ..ack_req(&c, acks.clone(), true, AckVia::Commit)
    };
    match s.ack("t", refused, 30).await {
        Err(SubError::Append { index: 1, stream, error: AppendError::Closed { .. } }) => assert_eq!(stream, "closed"),
        r => panic!("{r:?}"),
    }
    assert_eq!(read_all(e, "out", 1 << 20).await, "");
    assert_eq!(acked(&s.get("t", 30).await.expect("get"), "in/a").map(|x| x.0), Some(Offset::ZERO));

    let commit = AckRequest { outputs: vec![output("total=1", 0)], ..ack_req(&c, acks.clone(), true, AckVia::Commit) };
    let done = s.ack("t", commit.clone(), 40).await.expect("commit");
    assert!(!done.duplicate && !done.next_wake);
    assert_eq!(done.appends[0].status, AppendStatus::Appended);
    // A retry of it (its answer was lost) is recognised, also after a reopen: nothing again.
    drop(s);
    h.reopen().await;
    let e = h.engine();
    let s = subs(&h);
    assert_eq!(read_all(e, "out", 1 << 20).await, "total=1");
    assert_eq!(acked(&s.get("t", 50).await.expect("get"), "in/a").map(|x| x.0), Some(tail));
    let again = s.ack("t", commit, 50).await.expect("retried commit");
    assert!(again.duplicate);
    assert_eq!(read_all(e, "out", 1 << 20).await, "total=1");
    // A retry claiming more than was acked is not that commit: fenced.
    let more = AckRequest {
        outputs: vec![],
        ..ack_req(&c, vec![Ack { stream: "in/a".into(), offset: Offset(tail.0 + 1) }], true, AckVia::Commit)
    };
    assert!(matches!(s.ack("t", more, 60).await, Err(SubError::Fenced)));
}

pub async fn missed_wakes_are_issued_by_the_full_pass<H: Harness>() {
    let h = H::open().await;
    let e = h.engine();
    create(e, create_req("wake", "application/json")).await;
    create(e, create_req("jobs/a", "application/json")).await;
    let s = subs(&h);
    s.put("p", pull(Some("jobs/*"), &[], "wake"), 0).await.expect("put");
    assert!(s.due(0).await.expect("due").deliveries.is_empty());
    // New data whose wake was never issued (the server died between the append and its wake):
    // a settled subscription is not looked at on every pass...
    json_append(e, "jobs/a", "1").await;
    s.due(1_000).await.expect("due");
    assert_eq!(s.get("p", 1_000).await.expect("get").record.generation, 0);
    // ...but the full pass finds it.
    s.due(FULL_PASS_MS + 1).await.expect("due");
    assert_eq!(s.get("p", FULL_PASS_MS + 1).await.expect("get").record.generation, 1);
    assert_eq!(read_all(e, "wake", 1 << 20).await.matches("\"type\":\"wake\"").count(), 1);
}

/// A subscription keeps a cursor for every path the server accepts, up to the longest
/// (`MAX_PATH_BYTES`): before, a path of about 1,000 bytes made the cursor's metadata key too
/// long, so creating a subscription that matched it, and every ack of it, failed.
pub async fn cursors_work_for_the_longest_paths<H: Harness>() {
    let mut h = H::open().await;
    let e = h.engine();
    let long = format!("long/{}", "x".repeat(oncelog_protocol::headers::MAX_PATH_BYTES - 5));
    let named = format!("named/{}", "y".repeat(oncelog_protocol::headers::MAX_PATH_BYTES - 6));
    assert_eq!(long.len(), oncelog_protocol::headers::MAX_PATH_BYTES);
    create(e, create_req("wake", "application/json")).await;
    for p in [&long, &named, &"long/short".to_string()] {
        create(e, create_req(p, "application/json")).await;
        json_append(e, p, "1").await;
    }
    let s = subs(&h);
    // Backfill starts every linked stream at its tail: the long one too.
    let (_, view) =
        s.put("p", pull(Some("long/*"), &[named.as_str()], "wake"), 0).await.expect("put matching a long path");
    assert_eq!(view.links.len(), 3, "{:?}", view.links.iter().map(|l| l.path.len()).collect::<Vec<_>>());
    assert!(view.links.iter().all(|l| l.acked == l.tail), "every link starts at its tail");
    let ends = [json_append(e, &long, "2").await, json_append(e, &named, "2").await];
    s.on_write(&long, 10).await.expect("on_write");
    let n = s.claim("p", "w", 20).await.expect("claim");
    let mut pending: Vec<usize> = n.streams.iter().map(|l| l.path.len()).collect();
    pending.sort();
    assert_eq!(pending, [oncelog_protocol::headers::MAX_PATH_BYTES; 2]);
    let acks = vec![Ack { stream: long.clone(), offset: ends[0] }, Ack { stream: named.clone(), offset: ends[1] }];
    s.ack("p", ack_req(&n, acks, true, AckVia::Ack), 30).await.expect("ack of long paths");
    drop(s);
    h.reopen().await;
    let e = h.engine();
    let s = subs(&h);
    let view = s.get("p", 40).await.expect("get after reopen");
    assert_eq!(acked(&view, &long), Some((ends[0], ends[0])));
    assert_eq!(acked(&view, &named), Some((ends[1], ends[1])));
    // Removing the explicit link and deleting the subscription leave no cursor behind.
    s.relink("p", vec![], vec![named.clone()], 50).await.expect("unlink");
    assert!(s.delete("p", 60).await.expect("delete"));
    let left: Vec<usize> = e.meta_scan(b"cur").await.expect("scan").iter().map(|(k, _)| k.len()).collect();
    assert!(left.is_empty(), "cursors left after the delete: keys of {left:?} bytes");
}

/// The links a `GET` of `id` shows, and how many pattern matches it evaluated.
async fn per_get<E: Engine>(s: &Subscriptions<E>, id: &str) -> (usize, u64) {
    let before = s.pattern_evaluations();
    let view = s.get(id, 1).await.expect("get");
    (view.links.len(), s.pattern_evaluations() - before)
}

/// Linking by pattern matches each stream path against the pattern once, not on every call:
/// the matching work of a `GET` (or a claim) does not grow with the number of streams the
/// pattern matches. (Counted, not timed.)
pub async fn a_pattern_is_matched_against_each_path_once<H: Harness>() {
    let h = H::open().await;
    let e = h.engine();
    create(e, create_req("wake", "application/json")).await;
    for i in 0..10 {
        create(e, create_req(&format!("t/{i}"), "application/json")).await;
    }
    let s = subs(&h);
    s.put("p", pull(Some("t/*"), &[], "wake"), 0).await.expect("put");
    let after_put = s.pattern_evaluations();
    assert!(after_put <= 12, "the first listing matches each path once: {after_put}");
    assert_eq!(per_get(&s, "p").await, (10, 0), "nothing matched again");
    for i in 10..200 {
        create(e, create_req(&format!("t/{i}"), "application/json")).await;
    }
    assert_eq!(per_get(&s, "p").await, (200, 190), "only the new paths are matched");
    assert_eq!(per_get(&s, "p").await, (200, 0), "and then not again: the work per GET does not grow with the matches");
    json_append(e, "t/7", "1").await;
    s.on_write("t/7", 2).await.expect("on_write");
    let before = s.pattern_evaluations();
    let n = s.claim("p", "w", 3).await.expect("claim");
    assert_eq!(n.streams.len(), 1);
    assert_eq!(s.pattern_evaluations() - before, 0, "a claim matches nothing again either");
}

/// Backfill is one baseline (stream id and tail per matched stream, a few bytes stored), not a
/// cursor per matched stream, and subscriptions created over the same unmoved streams share
/// it in memory: 128 pattern subscriptions over 20,000 streams took 772 MB and 129 MB on disk
/// with a cursor each. A cursor is stored once an ack moves a stream past its baseline. Across
/// a reopen, the baseline is where every stream starts, and still shared.
pub async fn backfill_is_one_shared_baseline_not_a_cursor_per_stream<H: Harness>() {
    const STREAMS: usize = 60;
    const SUBS: usize = 8;
    let mut h = H::open().await;
    let e = h.engine();
    create(e, create_req("wake", "application/json")).await;
    for i in 0..STREAMS {
        let p = format!("m/{i}");
        create(e, create_req(&p, "application/json")).await;
        json_append(e, &p, "1").await;
    }
    create(e, create_req("m/empty", "application/json")).await;
    let s = subs(&h);
    for i in 0..SUBS {
        let (_, view) = s.put(&format!("s{i}"), pull(Some("m/**"), &[], "wake"), 0).await.expect("put");
        assert_eq!(view.links.len(), STREAMS + 1);
        assert!(view.links.iter().all(|l| l.acked == l.tail), "every link starts at its tail");
    }
    let check = |r: Remembered, cursors: usize| {
        assert_eq!(r.subscriptions, SUBS);
        assert_eq!(r.cursors, cursors, "a cursor only where an ack moved one");
        assert_eq!(r.baseline_entries, STREAMS, "one baseline for all, nothing for the empty stream");
    };
    check(s.remembered().await.expect("remembered"), 0);
    assert!(e.meta_scan(b"cur").await.expect("scan").is_empty(), "no cursor stored at creation");
    let stored: usize = e.meta_scan(b"base/").await.expect("scan").iter().map(|(k, v)| k.len() + v.len()).sum();
    assert!(stored <= SUBS * (STREAMS * 4 + 64), "a few bytes a stream: {stored}");

    drop(s);
    h.reopen().await;
    let e = h.engine();
    let s = subs(&h);
    check(s.remembered().await.expect("remembered after reopen"), 0);
    let view = s.get("s3", 1).await.expect("get");
    assert!(view.links.iter().all(|l| l.acked == l.tail && !l.has_pending()), "still at the tails");
    // New data is pending from the baseline on; its ack stores one cursor, for that stream.
    let start = e.head("m/7", 0).await.expect("head").tail;
    let end = json_append(e, "m/7", "2").await;
    assert_eq!(acked(&s.get("s3", 2).await.expect("get"), "m/7"), Some((start, end)));
    s.on_write("m/7", 3).await.expect("on_write");
    let n = s.claim("s3", "w", 4).await.expect("claim");
    assert_eq!(n.streams.iter().map(|l| (l.path.as_str(), l.acked)).collect::<Vec<_>>(), [("m/7", start)]);
    let acks = vec![Ack { stream: "m/7".into(), offset: end }];
    s.ack("s3", ack_req(&n, acks, true, AckVia::Ack), 5).await.expect("ack");
    check(s.remembered().await.expect("remembered"), 1);
    assert_eq!(e.meta_scan(b"cur").await.expect("scan").len(), 1);
    // A deleted subscription leaves no baseline behind; the others keep theirs.
    assert!(s.delete("s3", 6).await.expect("delete"));
    let bases = e.meta_scan(b"base/").await.expect("scan");
    assert_eq!(bases.len(), SUBS - 1, "one chunk each: {:?}", bases.iter().map(|(k, _)| k).collect::<Vec<_>>());
}

/// A subscription stored before baselines existed (its starting points are `cur/` cursors, one
/// per stream linked at creation) loads and works as before.
pub async fn subscriptions_stored_with_a_cursor_per_stream_still_load<H: Harness>() {
    let mut h = H::open().await;
    let e = h.engine();
    create(e, create_req("wake", "application/json")).await;
    let mut tails = Vec::new();
    for p in ["old/a", "old/b"] {
        create(e, create_req(p, "application/json")).await;
        tails.push((p, e.head(p, 0).await.expect("head").id, json_append(e, p, "1").await));
    }
    // Stored as an older server stored it: the record, a cursor per linked stream, the uid.
    let rec = SubRecord {
        uid: 5,
        id: "legacy".into(),
        config: pull(Some("old/*"), &[], "wake").normalized().expect("valid"),
        created_ms: 0,
        generation: 0,
        wake: None,
        last_done: 0,
        failures: 0,
        next_attempt_ms: 0,
        explicit: Default::default(),
    };
    let mut meta = vec![
        MetaWrite { key: b"sub/legacy".to_vec(), value: Some(crate::codec::encode(&rec).into()) },
        MetaWrite { key: b"seq/subscription".to_vec(), value: Some(crate::codec::encode_uid(6).into()) },
    ];
    for (p, id, tail) in &tails {
        let c = Cursor { stream_id: *id, acked: *tail };
        meta.push(MetaWrite {
            key: format!("cur/{:016x}/{p}", 5).into_bytes(),
            value: Some(crate::codec::encode_cursor(&c).into()),
        });
    }
    e.transact(TxnRequest { meta, now_ms: 0, ..Default::default() }).await.expect("store the old form");
    h.reopen().await;
    let e = h.engine();
    let s = subs(&h);
    let view = s.get("legacy", 1).await.expect("get");
    assert_eq!(view.links.len(), 2);
    assert!(view.links.iter().all(|l| l.acked == l.tail), "its cursors are where each stream starts");
    let end = json_append(e, "old/b", "2").await;
    assert_eq!(acked(&s.get("legacy", 2).await.expect("get"), "old/b"), Some((tails[1].2, end)));
    // And a new subscription beside it gets a baseline.
    s.put("new", pull(Some("old/*"), &[], "wake"), 3).await.expect("put");
    assert_eq!(s.remembered().await.expect("remembered").cursors, 2);
    assert!(s.delete("legacy", 4).await.expect("delete"));
    assert!(e.meta_scan(b"cur").await.expect("scan").is_empty(), "its cursors went with it");
}

#[cfg(test)]
mod tests {
    /// Every public case this file defines is in the list the engines run, and nothing else is.
    #[test]
    fn every_case_defined_here_is_run_by_the_engines() {
        let mut defined: Vec<&str> = include_str!("contract.rs")
            .lines()
            .filter_map(|l| l.strip_prefix("pub async fn "))
            .map(|l| l.split(['<', '(']).next().unwrap_or(l))
            .collect();
        let mut listed = super::ALL_CASES.to_vec();
        defined.sort_unstable();
        listed.sort_unstable();
        assert_eq!(defined, listed, "add a new case to `__subscription_cases!` in lib.rs");
        assert!(listed.len() >= 7);
    }
}
