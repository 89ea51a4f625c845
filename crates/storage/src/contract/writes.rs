//! Create and append verdicts: precedence, receipts, parking, closure, `Stream-Seq`,
//! incarnations and framing.

use std::time::{Duration, Instant};

use oncelog_protocol::headers::Expiry;
use oncelog_protocol::Offset;

use super::*;
use crate::rules::PARK_TIMEOUT;

pub async fn create_verdicts<H: Harness>() {
    let h = H::open().await;
    let e = h.engine();
    let mut req = create_req("s", "text/plain");
    req.initial = Bytes::from_static(b"hello");
    let CreateOutcome::Created(info) = e.create(req.clone()).await.expect("create") else { panic!("201 expected") };
    assert_eq!((info.tail, info.closed, info.config.content_type.as_str()), (Offset(5), false, "text/plain"));
    // Identical again (the media type's parameters do not count): 200, the body is not appended.
    req.content_type = Some("text/plain; charset=utf-8".into());
    let again = e.create(req.clone()).await.expect("re-create");
    assert!(matches!(again, CreateOutcome::Existing(ref i) if i.tail == Offset(5) && i.id == info.id), "{again:?}");
    // Any difference in type, expiry or closure: 409.
    for (ct, expiry, closed) in
        [("text/html", None, false), ("text/plain", Some(Expiry::Ttl(60)), false), ("text/plain", None, true)]
    {
        let r = CreateRequest { content_type: Some(ct.into()), expiry, closed, ..create_req("s", "") };
        assert!(matches!(e.create(r).await, Err(CreateError::ConfigMismatch(_))), "{ct} {expiry:?} {closed}");
    }
    // No content type: the default.
    let d = create(e, CreateRequest { content_type: None, ..create_req("d", "") }).await;
    assert_eq!(d.config.content_type, oncelog_protocol::content_type::DEFAULT);
    // Created closed: appends are refused, reads see the closure.
    let c = create(e, CreateRequest { closed: true, ..create_req("c", "text/plain") }).await;
    assert!(c.closed);
    assert!(matches!(e.append(append_req("c", "x")).await, Err(AppendError::Closed { tail: Offset(0) })));
    assert!(matches!(e.head("nope", 0).await, Err(LookupError::NotFound)));
}

/// The shape limits ([`crate::rules::shape`]) answer the same on every engine, called directly
/// (no header parser in front): names at the limit are taken, one byte over, empty or holding a
/// NUL character are refused with the same error, bodies over one record too; a transaction's
/// append is held to the same shape.
pub async fn shape_limits_are_the_same_on_every_engine<H: Harness>() {
    use crate::rules::shape::{MAX_PATH_BYTES, MAX_PRODUCER_ID_BYTES, MAX_RECORD_BYTES};
    let h = H::open().await;
    let e = h.engine();
    let longest = "p".repeat(MAX_PATH_BYTES);
    create(e, create_req(&longest, "text/plain")).await;
    for bad in ["".to_owned(), "p".repeat(MAX_PATH_BYTES + 1), "a\0b".to_owned()] {
        let r = e.create(create_req(&bad, "text/plain")).await;
        assert!(matches!(r, Err(CreateError::InvalidPath)), "create of a {}-byte path: {r:?}", bad.len());
        let r = e.append(append_req(&bad, "x")).await;
        assert!(matches!(r, Err(AppendError::NotFound)), "append to a {}-byte path: {r:?}", bad.len());
    }
    let big = Bytes::from(vec![b'x'; MAX_RECORD_BYTES + 1]);
    let r = e.create(CreateRequest { initial: big.clone(), ..create_req("big", "text/plain") }).await;
    assert!(matches!(r, Err(CreateError::TooLarge)), "{r:?}");
    let id = "i".repeat(MAX_PRODUCER_ID_BYTES);
    assert_eq!(append(e, produce(&longest, "a", &id, 0, 0)).await.status, AppendStatus::Appended);
    for bad in ["".to_owned(), "i".repeat(MAX_PRODUCER_ID_BYTES + 1), "p\0".to_owned()] {
        let r = e.append(produce(&longest, "b", &bad, 0, 0)).await;
        assert!(matches!(r, Err(AppendError::InvalidProducerId)), "a {}-byte producer id: {r:?}", bad.len());
        let txn = TxnRequest { appends: vec![produce(&longest, "b", &bad, 0, 0)], ..Default::default() };
        let r = e.transact(txn).await;
        assert!(matches!(r, Err(TxnError::Append { index: 0, error: AppendError::InvalidProducerId })), "{r:?}");
    }
    let r = e.append(AppendRequest { data: big, ..append_req(&longest, "") }).await;
    assert!(matches!(r, Err(AppendError::TooLarge)), "{r:?}");
    assert_eq!(read_all(e, &longest, 1 << 20).await, "a");
}

pub async fn append_precedence<H: Harness>() {
    let h = H::open().await;
    let e = h.engine();
    assert!(matches!(e.append(append_req("missing", "x")).await, Err(AppendError::NotFound)));
    create(e, create_req("s", "text/plain")).await;
    assert!(matches!(e.append(append_req("s", "")).await, Err(AppendError::Empty)));
    append(e, produce("s", "a", "p", 1, 0)).await;
    // Fenced and epoch rules.
    assert!(matches!(
        e.append(produce("s", "z", "p", 0, 1)).await,
        Err(AppendError::ProducerFenced { current_epoch: 1 })
    ));
    let bump = e.append(produce("s", "z", "p", 2, 70)).await;
    assert!(matches!(bump, Err(AppendError::ProducerEpochSeq)), "{bump:?}");
    // Content type beats Stream-Seq; Stream-Seq is checked once the type is right.
    append(e, AppendRequest { stream_seq: Some("5".into()), ..append_req("s", "b") }).await;
    let r =
        AppendRequest { stream_seq: Some("1".into()), content_type: Some("text/html".into()), ..append_req("s", "c") };
    assert!(matches!(e.append(r).await, Err(AppendError::ContentTypeMismatch { .. })));
    let r = AppendRequest { stream_seq: Some("1".into()), ..append_req("s", "c") };
    assert!(matches!(e.append(r).await, Err(AppendError::StreamSeqRegression { .. })));
    // The producer closes the stream with its seq 1.
    let closing = AppendRequest { close: true, ..produce("s", "c", "p", 1, 1) };
    let out = append(e, closing.clone()).await;
    assert_eq!(
        (out.status, out.next_offset, out.closed, out.producer),
        (AppendStatus::Appended, Offset(3), true, Some((1, 1)))
    );
    // A retry of the closing request is a duplicate, not a closed-stream error.
    let dup = append(e, closing).await;
    assert_eq!((dup.status, dup.next_offset, dup.closed), (AppendStatus::Duplicate, Offset(3), true));
    // Closure beats content type; a gap on a closed stream is answered with the closure.
    let r = AppendRequest { content_type: Some("text/html".into()), ..append_req("s", "d") };
    assert!(matches!(e.append(r).await, Err(AppendError::Closed { tail: Offset(3) })));
    assert!(matches!(e.append(produce("s", "d", "p", 1, 5)).await, Err(AppendError::Closed { tail: Offset(3) })));
    // Fencing still beats closure.
    assert!(matches!(e.append(produce("s", "d", "p", 0, 0)).await, Err(AppendError::ProducerFenced { .. })));
    // A close-only request on a closed stream succeeds without writing.
    let again = append(e, close_req("s")).await;
    assert_eq!((again.status, again.next_offset, again.closed), (AppendStatus::AlreadyClosed, Offset(3), true));
    assert_eq!(read_all(e, "s", 1 << 20).await, "abc");
}

/// A content-type refusal names both types, the stream's (or fork source's) and the request's,
/// as the rules decide it: the same words from every engine, and in the `409`'s body.
pub async fn content_type_mismatches_name_both_types<H: Harness>() {
    let h = H::open().await;
    let e = h.engine();
    create(e, create_req("s", "text/plain")).await;
    append(e, append_req("s", "a")).await;
    let wrong = AppendRequest { content_type: Some("application/json".into()), ..append_req("s", "b") };
    let err = e.append(wrong).await.expect_err("another type");
    assert!(
        matches!(&err, AppendError::ContentTypeMismatch { stream, requested }
            if stream == "text/plain" && requested.as_deref() == Some("application/json")),
        "{err:?}"
    );
    assert_eq!(err.to_string(), r#"content type "application/json" does not match the stream's "text/plain""#);
    // A body without a content type is refused the same way, saying none was sent.
    let err = e.append(AppendRequest { content_type: None, ..append_req("s", "b") }).await.expect_err("no type");
    assert_eq!(err.to_string(), r#"content type (none) does not match the stream's "text/plain""#);
    // A fork naming another type than its source's.
    let fork = CreateRequest { content_type: Some("text/html".into()), ..fork_req("f", "s", None, 0) };
    let err = e.create(fork).await.expect_err("another type than the source's");
    assert!(
        matches!(&err, CreateError::ContentTypeMismatch { source_type, requested }
            if source_type == "text/plain" && requested == "text/html"),
        "{err:?}"
    );
    assert_eq!(err.to_string(), r#"content type "text/html" does not match the fork source's "text/plain""#);
    // Nothing was written by the refusals.
    assert_eq!(read_all(e, "s", 1 << 20).await, "a");
    assert!(matches!(e.head("f", 0).await, Err(LookupError::NotFound)));
}

pub async fn conditional_appends<H: Harness>() {
    let h = H::open().await;
    let e = h.engine();
    create(e, create_req("s", "text/plain")).await;
    let at = |req: AppendRequest, tails: &[u64]| AppendRequest {
        if_match: Some(tails.iter().map(|t| Offset(*t)).collect()),
        ..req
    };
    // At the named tail: written. Anywhere else: refused with the tail, nothing written.
    assert_eq!(append(e, at(append_req("s", "ab"), &[0])).await.next_offset, Offset(2));
    let stale = e.append(at(append_req("s", "zz"), &[0])).await;
    assert!(matches!(stale, Err(AppendError::PreconditionFailed { tail: Offset(2), closed: false })), "{stale:?}");
    // One of several named tails.
    assert_eq!(append(e, at(append_req("s", "c"), &[0, 2])).await.next_offset, Offset(3));
    // A producer's retry of a conditional append that landed is its duplicate, not a refusal,
    // although the condition no longer holds.
    let first = append(e, at(produce("s", "de", "p", 0, 0), &[3])).await;
    assert_eq!((first.status, first.next_offset), (AppendStatus::Appended, Offset(5)));
    let retry = append(e, at(produce("s", "de", "p", 0, 0), &[3])).await;
    assert_eq!((retry.status, retry.next_offset), (AppendStatus::Duplicate, Offset(5)));
    // A refused producer append consumes nothing: the same seq goes through at the right tail.
    let refused = e.append(at(produce("s", "f", "p", 0, 1), &[3])).await;
    assert!(matches!(refused, Err(AppendError::PreconditionFailed { tail: Offset(5), .. })), "{refused:?}");
    assert_eq!(append(e, at(produce("s", "f", "p", 0, 1), &[5])).await.next_offset, Offset(6));
    // The condition is checked before closure and content type, after the stream's existence.
    let wrong_type = AppendRequest { content_type: Some("text/html".into()), ..append_req("s", "g") };
    assert!(matches!(e.append(at(wrong_type.clone(), &[0])).await, Err(AppendError::PreconditionFailed { .. })));
    assert!(matches!(e.append(at(wrong_type, &[6])).await, Err(AppendError::ContentTypeMismatch { .. })));
    assert!(matches!(e.append(at(append_req("missing", "g"), &[0])).await, Err(AppendError::NotFound)));
    // A conditional close: at the tail it closes; on a closed stream the refusal says closed.
    let close = append(e, at(close_req("s"), &[6])).await;
    assert_eq!((close.status, close.closed), (AppendStatus::Appended, true));
    let late = e.append(at(append_req("s", "h"), &[5])).await;
    assert!(matches!(late, Err(AppendError::PreconditionFailed { tail: Offset(6), closed: true })), "{late:?}");
    assert!(matches!(e.append(at(append_req("s", "h"), &[6])).await, Err(AppendError::Closed { .. })));
    assert_eq!(read_all(e, "s", 1 << 20).await, "abcdef");
    // A conditional delete: at another tail it is refused and the stream stays.
    let stale = e.delete_if("s", DeleteRequest::if_tail(vec![Offset(5)]), 0).await;
    assert!(matches!(stale, Err(LookupError::PreconditionFailed { tail: Offset(6), closed: true })), "{stale:?}");
    assert_eq!(read_all(e, "s", 1 << 20).await, "abcdef");
    e.delete_if("s", DeleteRequest::if_tail(vec![Offset(6)]), 0).await.expect("deleted at its tail");
    assert!(matches!(e.head("s", 0).await, Err(LookupError::NotFound)));
}

pub async fn a_producer_retry_with_another_body_is_refused<H: Harness>() {
    let mut h = H::open().await;
    create(h.engine(), create_req("s", "text/plain")).await;
    append(h.engine(), produce("s", "ab", "p", 0, 0)).await;
    append(h.engine(), produce("s", "cd", "p", 0, 1)).await;
    // Twice: as written, and reopened (the digests are stored with the receipts).
    for round in 0..2 {
        let e = h.engine();
        let same = append(e, produce("s", "ab", "p", 0, 0)).await;
        assert_eq!((same.status, same.next_offset), (AppendStatus::Duplicate, Offset(2)), "round {round}");
        let other = e.append(produce("s", "XY", "p", 0, 0)).await;
        assert!(
            matches!(other, Err(AppendError::ProducerBodyMismatch { epoch: 0, seq: 0 })),
            "round {round}: {other:?}"
        );
        let other = e.append(produce("s", "cd!", "p", 0, 1)).await;
        assert!(
            matches!(other, Err(AppendError::ProducerBodyMismatch { epoch: 0, seq: 1 })),
            "round {round}: {other:?}"
        );
        assert_eq!(read_all(e, "s", 1 << 20).await, "abcd", "round {round}: nothing written");
        h.reopen().await;
    }
    // Once the stream is closed, a retry is a duplicate whatever its body (the protocol's suite
    // requires it of a retried close).
    let close = append(h.engine(), AppendRequest { close: true, ..produce("s", "ef", "p", 0, 2) }).await;
    assert!(close.closed);
    let retry = append(h.engine(), AppendRequest { close: true, ..produce("s", "EF", "p", 0, 2) }).await;
    assert_eq!((retry.status, retry.next_offset), (AppendStatus::Duplicate, Offset(6)));
}

pub async fn idle_producer_state_expires<H: Harness>() {
    let mut h = H::open().await;
    let ttl = crate::rules::Retention::DEFAULT_PRODUCER_TTL_MS;
    let at = |req: AppendRequest, now_ms: i64| AppendRequest { now_ms, ..req };
    create(h.engine(), create_req("s", "text/plain")).await;
    append(h.engine(), at(produce("s", "a", "p", 3, 0), 0)).await;
    append(h.engine(), at(produce("s", "b", "p", 3, 1), 1_000)).await;
    h.reopen().await;
    // Within the TTL of the last activity (kept across the reopen): a retry is a duplicate.
    let dup = append(h.engine(), at(produce("s", "b", "p", 3, 1), 1_000 + ttl - 1)).await;
    assert_eq!(dup.status, AppendStatus::Duplicate);
    // Past it, the producer is forgotten: a later sequence number is a gap from 0, never
    // accepted; so it stays after a reopen.
    for round in 0..2 {
        let late = h.engine().append(at(produce("s", "c", "p", 3, 100), 1_000 + ttl + round)).await;
        assert!(
            matches!(late, Err(AppendError::ProducerSeqGap { expected: 0, received: 100 })),
            "round {round}: {late:?}"
        );
        h.reopen().await;
    }
    // Sequence 0 of a forgotten producer is new data (the documented trade-off), whatever its
    // epoch, and starts a fresh state.
    let e = h.engine();
    let again = append(e, at(produce("s", "a", "p", 1, 0), 1_000 + ttl + 2)).await;
    assert_eq!((again.status, again.next_offset), (AppendStatus::Appended, Offset(3)));
    let dup = append(e, at(produce("s", "a", "p", 1, 0), 1_000 + ttl + 3)).await;
    assert_eq!((dup.status, dup.next_offset), (AppendStatus::Duplicate, Offset(3)));
    assert_eq!(read_all(e, "s", 1 << 20).await, "aba");
}

pub async fn idempotency_keys<H: Harness>() {
    let mut h = H::open().await;
    let window = crate::rules::Retention::DEFAULT_IDEMPOTENCY_WINDOW_MS;
    let at = |req: AppendRequest, now_ms: i64| AppendRequest { now_ms, ..req };
    create(h.engine(), create_req("s", "text/plain")).await;
    create(h.engine(), create_req("t", "text/plain")).await;
    let first = append(h.engine(), at(keyed("s", "ab", "k1"), 0)).await;
    assert_eq!((first.status, first.next_offset), (AppendStatus::Appended, Offset(2)));
    append(h.engine(), append_req("s", "cd")).await;
    // Twice: as written, and reopened (keys are stored with their appends).
    for round in 0..2 {
        let e = h.engine();
        // A repeat, after other appends: answered with the original's end, nothing written.
        let again = append(e, at(keyed("s", "ab", "k1"), 10)).await;
        assert_eq!((again.status, again.next_offset), (AppendStatus::Duplicate, Offset(2)), "round {round}");
        let other = e.append(at(keyed("s", "XY", "k1"), 10)).await;
        assert!(matches!(other, Err(AppendError::IdempotencyKeyMismatch)), "round {round}: {other:?}");
        assert_eq!(read_all(e, "s", 1 << 20).await, "abcd", "round {round}");
        h.reopen().await;
    }
    let e = h.engine();
    // Keys are per stream.
    let elsewhere = append(e, at(keyed("t", "ab", "k1"), 10)).await;
    assert_eq!((elsewhere.status, elsewhere.next_offset), (AppendStatus::Appended, Offset(2)));
    // With producer headers: refused.
    let both = AppendRequest { idempotency_key: keyed("s", "x", "k2").idempotency_key, ..produce("s", "x", "p", 0, 0) };
    assert!(matches!(e.append(both).await, Err(AppendError::IdempotencyKeyWithProducer)));
    // A repeat on a stream closed since is still a duplicate; new keyed data is refused.
    append(e, close_req("s")).await;
    let closed = append(e, at(keyed("s", "ab", "k1"), 20)).await;
    assert_eq!((closed.status, closed.next_offset, closed.closed), (AppendStatus::Duplicate, Offset(2), true));
    assert!(matches!(e.append(at(keyed("s", "z", "k3"), 20)).await, Err(AppendError::Closed { .. })));
    // After the window the key is forgotten: the same request is new data (the trade-off).
    let late = append(e, at(keyed("t", "ab", "k1"), 10 + window)).await;
    assert_eq!((late.status, late.next_offset), (AppendStatus::Appended, Offset(4)));
    assert_eq!(read_all(e, "t", 1 << 20).await, "abab");
}

/// Pruning drops exactly the writer state the rules already ignore — producers idle past the
/// TTL, keys past the window — and leaves the rest; afterwards every retry is answered as the
/// rules say it is without that state (a forgotten producer's seq 0 and an expired key are new
/// data), and the live ones are still duplicates.
pub async fn idle_writer_state_is_pruned<H: Harness>() {
    let h = H::open().await;
    let e = h.engine();
    let ttl = crate::rules::Retention::DEFAULT_PRODUCER_TTL_MS;
    let window = crate::rules::Retention::DEFAULT_IDEMPOTENCY_WINDOW_MS;
    let at = |req: AppendRequest, now_ms: i64| AppendRequest { now_ms, ..req };
    create(e, create_req("s", "text/plain")).await;
    append(e, at(produce("s", "a", "old", 0, 0), 0)).await;
    append(e, at(keyed("s", "b", "old-key"), 0)).await;
    let now = ttl + 1;
    append(e, at(produce("s", "c", "live", 0, 0), now - 10)).await;
    append(e, at(keyed("s", "d", "live-key"), now - 10)).await;
    assert_eq!(e.stats().producers, 2);
    let pruned = e.prune(now).await.expect("prune");
    assert_eq!(pruned, PruneOutcome { producers: 1, keys: 1 });
    assert_eq!(e.stats().producers, 1);
    assert_eq!(e.prune(now).await.expect("prune again"), PruneOutcome::default(), "nothing left to prune");
    // Live state answers retries as before.
    let dup = append(e, at(produce("s", "c", "live", 0, 0), now)).await;
    assert_eq!((dup.status, dup.next_offset), (AppendStatus::Duplicate, Offset(3)));
    let dup = append(e, at(keyed("s", "d", "live-key"), now)).await;
    assert_eq!((dup.status, dup.next_offset), (AppendStatus::Duplicate, Offset(4)));
    // Pruned state is gone: its retries are new data (as the rules said before pruning).
    let again = append(e, at(produce("s", "a", "old", 0, 0), now)).await;
    assert_eq!((again.status, again.next_offset), (AppendStatus::Appended, Offset(5)));
    let again = append(e, at(keyed("s", "b", "old-key"), now)).await;
    assert_eq!((again.status, again.next_offset), (AppendStatus::Appended, Offset(6)));
    assert_eq!(read_all(e, "s", 1 << 20).await, "abcdab");
    assert!(window < ttl, "the key window ends before the producer TTL in this case");
}

/// `--max-producers-per-stream` (at its default): once a stream holds that many live producers,
/// a new one is refused with nothing written, while a known producer's next append and retries
/// go on; a producer whose state expired frees its slot at once (no prune needed), and other
/// streams are not affected.
pub async fn a_new_producer_beyond_the_stream_cap_is_refused<H: Harness>() {
    let h = H::open().await;
    let e = h.engine();
    let cap = crate::rules::Retention::DEFAULT_MAX_PRODUCERS_PER_STREAM;
    let ttl = crate::rules::Retention::DEFAULT_PRODUCER_TTL_MS;
    let at = |req: AppendRequest, now_ms: i64| AppendRequest { now_ms, ..req };
    create(e, create_req("s", "text/plain")).await;
    create(e, create_req("other", "text/plain")).await;
    // One known producer, then the rest of the cap, 500 at a time (both engines group them;
    // all at once would queue past PostgreSQL's request deadline).
    append(e, at(produce("s", "k", "known", 0, 0), 10)).await;
    let ids: Vec<String> = (1..cap).map(|i| format!("filler-{i}")).collect();
    for chunk in ids.chunks(500) {
        let fill = chunk.iter().map(|id| e.append(at(produce("s", "f", id, 0, 0), 0)));
        for out in futures_util::future::join_all(fill).await {
            assert_eq!(out.expect("a producer below the cap").status, AppendStatus::Appended);
        }
    }
    let tail = e.head("s", 20).await.expect("head").tail;
    assert_eq!(tail, Offset(cap));
    // A new producer at the cap: refused, naming the cap, and nothing written.
    match e.append(at(produce("s", "n", "newcomer", 0, 0), 20)).await {
        Err(AppendError::ProducerLimit { cap: ProducerCap::PerStream, limit }) => assert_eq!(limit, cap),
        other => panic!("a new producer at the cap: {other:?}"),
    }
    assert_eq!(e.head("s", 20).await.expect("head").tail, tail, "the refusal wrote nothing");
    // The known producer is never refused: its next append, then its retry (a duplicate).
    let next = append(e, at(produce("s", "k", "known", 0, 1), 30)).await;
    assert_eq!((next.status, next.next_offset), (AppendStatus::Appended, Offset(cap + 1)));
    let retry = append(e, at(produce("s", "k", "known", 0, 1), 40)).await;
    assert_eq!((retry.status, retry.next_offset), (AppendStatus::Duplicate, Offset(cap + 1)));
    // The cap is per stream.
    assert_eq!(append(e, at(produce("other", "o", "newcomer", 0, 0), 40)).await.status, AppendStatus::Appended);
    // Once the fillers' states expired, their slots are free, before any prune: the refused
    // producer's same request is accepted, once.
    let later = ttl + 1;
    let admitted = append(e, at(produce("s", "n", "newcomer", 0, 0), later)).await;
    assert_eq!((admitted.status, admitted.next_offset), (AppendStatus::Appended, Offset(cap + 2)));
    let retry = append(e, at(produce("s", "n", "newcomer", 0, 0), later)).await;
    assert_eq!(retry.status, AppendStatus::Duplicate);
}

pub async fn duplicates_answer_with_their_original_offset<H: Harness>() {
    let mut h = H::open().await;
    create(h.engine(), create_req("s", "text/plain")).await;
    for seq in 0..40u64 {
        let out = append(h.engine(), produce("s", "xy", "p", 0, seq)).await;
        assert_eq!(out.next_offset, Offset(2 * (seq + 1)));
    }
    h.reopen().await;
    let e = h.engine();
    // Inside the receipt window: where the original landed; the echo is the highest seq.
    let dup = append(e, produce("s", "xy", "p", 0, 30)).await;
    assert_eq!((dup.status, dup.next_offset, dup.producer), (AppendStatus::Duplicate, Offset(62), Some((0, 39))));
    // Older than the window: still a duplicate (nothing written), answered with the tail.
    let old = append(e, produce("s", "xy", "p", 0, 1)).await;
    assert_eq!((old.status, old.next_offset), (AppendStatus::Duplicate, Offset(80)));
    assert_eq!(e.head("s", 0).await.expect("head").tail, Offset(80));
    // Producers are per stream: the same id elsewhere starts fresh.
    create(e, create_req("t", "text/plain")).await;
    let fresh = e.append(produce("t", "q", "p", 0, 3)).await;
    assert!(matches!(fresh, Err(AppendError::ProducerSeqGap { expected: 0, received: 3 })), "{fresh:?}");
}

pub async fn out_of_order_producer_appends_wait_for_their_predecessors<H: Harness>() {
    let h = H::open().await;
    let e = h.engine();
    create(e, create_req("s", "text/plain")).await;
    // seq 1 and 2 arrive before seq 0: they wait, then land in order.
    let (r2, r1, r0) = tokio::join!(
        e.append(produce("s", "c", "p", 0, 2)),
        async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            e.append(produce("s", "b", "p", 0, 1)).await
        },
        async {
            tokio::time::sleep(Duration::from_millis(40)).await;
            e.append(produce("s", "a", "p", 0, 0)).await
        },
    );
    let offsets: Vec<Offset> = [r0, r1, r2].into_iter().map(|r| r.expect("accepted").next_offset).collect();
    assert_eq!(offsets, vec![Offset(1), Offset(2), Offset(3)]);
    assert_eq!(read_all(e, "s", 1 << 20).await, "abc");
    // Right after an epoch bump, the new epoch's seq 1 may overtake its seq 0.
    let (b1, b0) = tokio::join!(e.append(produce("s", "e", "p", 1, 1)), async {
        tokio::time::sleep(Duration::from_millis(20)).await;
        e.append(produce("s", "d", "p", 1, 0)).await
    });
    assert_eq!((b0.expect("seq 0").next_offset, b1.expect("seq 1").next_offset), (Offset(4), Offset(5)));
    assert_eq!(read_all(e, "s", 1 << 20).await, "abcde");
}

/// Every append that waited for its predecessors is counted once
/// ([`EngineStats::parked_appends`], the `oncelog_parked_appends_total` metric), one that did not
/// wait is not, and a wait that ends in a gap still counts.
pub async fn parked_appends_are_counted<H: Harness>() {
    let h = H::open().await;
    let e = h.engine();
    create(e, create_req("s", "text/plain")).await;
    let before = e.stats().parked_appends;
    append(e, produce("s", "a", "p", 0, 0)).await;
    assert_eq!(e.stats().parked_appends, before, "in order: nothing waits");
    let (r2, r1) = tokio::join!(e.append(produce("s", "c", "p", 0, 2)), async {
        tokio::time::sleep(Duration::from_millis(40)).await;
        e.append(produce("s", "b", "p", 0, 1)).await
    });
    assert_eq!((r1.expect("seq 1").next_offset, r2.expect("seq 2").next_offset), (Offset(2), Offset(3)));
    assert_eq!(e.stats().parked_appends, before + 1, "seq 2 waited for seq 1");
    let r = e.append(produce("s", "z", "p", 0, 5)).await;
    assert!(matches!(r, Err(AppendError::ProducerSeqGap { .. })), "{r:?}");
    assert_eq!(e.stats().parked_appends, before + 2, "a wait that ended in a gap counts too");
}

pub async fn a_real_gap_is_answered_after_the_park_timeout<H: Harness>() {
    let h = H::open().await;
    let e = h.engine();
    create(e, create_req("s", "text/plain")).await;
    append(e, produce("s", "a", "p", 0, 0)).await;
    let started = Instant::now();
    let r = e.append(produce("s", "c", "p", 0, 2)).await;
    assert!(matches!(r, Err(AppendError::ProducerSeqGap { expected: 1, received: 2 })), "{r:?}");
    assert!(started.elapsed() >= PARK_TIMEOUT - Duration::from_millis(5), "answered after {:?}", started.elapsed());
    // Far ahead: answered at once, never parked.
    let started = Instant::now();
    let r = e.append(produce("s", "z", "p", 0, 1000)).await;
    assert!(matches!(r, Err(AppendError::ProducerSeqGap { expected: 1, received: 1000 })), "{r:?}");
    assert!(started.elapsed() < PARK_TIMEOUT, "not parked");
    assert_eq!(read_all(e, "s", 1 << 20).await, "a");
}

pub async fn closure<H: Harness>() {
    let h = H::open().await;
    let e = h.engine();
    create(e, create_req("s", "text/plain")).await;
    append(e, append_req("s", "ab")).await;
    // Append and close in one request.
    let out = append(e, AppendRequest { close: true, ..append_req("s", "cd") }).await;
    assert_eq!((out.status, out.next_offset, out.closed), (AppendStatus::Appended, Offset(4), true));
    let info = e.head("s", 0).await.expect("head");
    assert!(info.closed && info.tail == Offset(4));
    let c = e.read(ReadRequest::new("s", Offset(4), 1 << 20, 0)).await.expect("read at tail");
    assert!(c.info.closed && c.up_to_date() && c.data.is_empty());
    assert!(matches!(e.append(append_req("s", "x")).await, Err(AppendError::Closed { tail: Offset(4) })));
    // Close-only on an open stream writes the closure alone.
    create(e, create_req("t", "text/plain")).await;
    let out = append(e, close_req("t")).await;
    assert_eq!((out.status, out.next_offset, out.closed), (AppendStatus::Appended, Offset(0), true));
}

pub async fn stream_seq_must_increase<H: Harness>() {
    let h = H::open().await;
    let e = h.engine();
    create(e, create_req("s", "text/plain")).await;
    let seq = |s: &str, d: &str| AppendRequest { stream_seq: Some(s.into()), ..append_req("s", d) };
    append(e, seq("b", "1")).await;
    // Compared byte-wise: "b" < "ba" < "c".
    assert!(matches!(e.append(seq("b", "2")).await, Err(AppendError::StreamSeqRegression { .. })));
    assert!(matches!(e.append(seq("a", "2")).await, Err(AppendError::StreamSeqRegression { .. })));
    append(e, seq("ba", "2")).await;
    // An append without Stream-Seq does not reset it.
    append(e, append_req("s", "3")).await;
    assert!(matches!(e.append(seq("ba", "4")).await, Err(AppendError::StreamSeqRegression { .. })));
    append(e, seq("c", "4")).await;
    assert_eq!(read_all(e, "s", 1 << 20).await, "1234");
}

pub async fn appends_validated_against_a_replaced_stream_are_refused<H: Harness>() {
    let h = H::open().await;
    let e = h.engine();
    let old = create(e, create_req("s", "text/plain")).await;
    e.delete("s", 0).await.expect("delete");
    let new = create(e, create_req("s", "text/plain")).await;
    assert_ne!(old.id, new.id, "a re-created path is a new incarnation");
    let stale = AppendRequest { stream_id: Some(old.id), ..append_req("s", "x") };
    assert!(matches!(e.append(stale).await, Err(AppendError::StreamChanged)));
    let current = AppendRequest { stream_id: Some(new.id), ..append_req("s", "x") };
    assert_eq!(append(e, current).await.next_offset, Offset(1));
    assert_eq!(read_all(e, "s", 1 << 20).await, "x");
}

pub async fn framing_must_match_the_stream_type<H: Harness>() {
    let h = H::open().await;
    let e = h.engine();
    create(e, create_req("j", "application/json")).await;
    let json = |data: Bytes, framed: bool| AppendRequest {
        content_type: Some("application/json".into()),
        data,
        json_framed: framed,
        ..append_req("j", "")
    };
    let r = e.append(json(Bytes::from_static(b"{\"a\":1}"), false)).await;
    assert!(matches!(r, Err(AppendError::FramingMismatch)), "{r:?}");
    append(e, json(json_framed(&["{\"a\":1}", "2"]), true)).await;
    let c = e.read(ReadRequest::new("j", Offset::ZERO, 1 << 20, 0)).await.expect("read");
    assert_eq!(&c.data[..], b"{\"a\":1},2,");
    // The other way round: framed bytes never enter a byte stream.
    create(e, create_req("b", "text/plain")).await;
    let r = e.append(AppendRequest { json_framed: true, ..append_req("b", "1,") }).await;
    assert!(matches!(r, Err(AppendError::FramingMismatch)), "{r:?}");
    // Creates check the initial body the same way.
    let mut c = create_req("j2", "application/json");
    c.initial = Bytes::from_static(b"[1]");
    assert!(matches!(e.create(c.clone()).await, Err(CreateError::FramingMismatch)));
    c.initial = json_framed(&["1"]);
    c.json_framed = true;
    assert_eq!(create(e, c).await.tail, Offset(2));
}

/// `Stream-Expected-Offset`: a strict compare-and-append, decided with the write. The append
/// lands only at exactly the tail named; a producer retry of an append that landed is still a
/// duplicate (that verdict comes first); it composes with `Stream-Seq`, whose refusal carries the
/// tail too; a closed stream's refusal wins even when the offset matches; a fork compares against
/// its own tail.
pub async fn expected_offset_is_a_strict_compare_and_append<H: Harness>() {
    let mut h = H::open().await;
    let e = h.engine();
    let expecting = |req: AppendRequest, at: Offset| AppendRequest { expected_offset: Some(at), ..req };
    let t0 = create(e, create_req("s", "text/plain")).await.tail;
    let t1 = append(e, expecting(append_req("s", "ab"), t0)).await.next_offset;
    assert_eq!(t1, Offset(t0.0 + 2));
    // A stale expectation: nothing written, the tail in the answer.
    match e.append(expecting(append_req("s", "zz"), t0)).await {
        Err(AppendError::ExpectedOffsetConflict { tail }) => assert_eq!(tail, t1),
        r => panic!("stale expected offset: {r:?}"),
    }
    // An expectation beyond the tail is no better.
    assert!(matches!(
        e.append(expecting(append_req("s", "zz"), Offset(t1.0 + 100))).await,
        Err(AppendError::ExpectedOffsetConflict { .. })
    ));
    // A producer's append with the right expectation, then its retry, whose expectation is
    // stale by now: a duplicate, answered with where it landed.
    let first = append(e, expecting(produce("s", "cd", "p", 0, 0), t1)).await;
    assert_eq!(first.status, AppendStatus::Appended);
    let t2 = first.next_offset;
    let retry = append(e, expecting(produce("s", "cd", "p", 0, 0), t1)).await;
    assert_eq!((retry.status, retry.next_offset), (AppendStatus::Duplicate, t2));
    // The producer's next append with a stale expectation is refused, and its sequence number
    // is still free for the right one.
    assert!(
        matches!(e.append(expecting(produce("s", "ef", "p", 0, 1), t1)).await, Err(AppendError::ExpectedOffsetConflict { tail }) if tail == t2)
    );
    let t3 = append(e, expecting(produce("s", "ef", "p", 0, 1), t2)).await.next_offset;
    // With Stream-Seq: each refusal names the tail; both must pass.
    let seq = |s: &str, d: &str| AppendRequest { stream_seq: Some(s.into()), ..append_req("s", d) };
    let t4 = append(e, expecting(seq("5", "gh"), t3)).await.next_offset;
    match e.append(expecting(seq("4", "ij"), t4)).await {
        Err(AppendError::StreamSeqRegression { tail }) => assert_eq!(tail, t4),
        r => panic!("a regressing Stream-Seq: {r:?}"),
    }
    assert!(
        matches!(e.append(expecting(seq("6", "ij"), t3)).await, Err(AppendError::ExpectedOffsetConflict { tail }) if tail == t4)
    );
    let t5 = append(e, expecting(seq("6", "ij"), t4)).await.next_offset;
    assert_eq!(read_all(e, "s", 4).await, "abcdefghij");
    // A fork compares against its own tail, not its source's.
    let fork_tail = create(e, fork_req("f", "s", Some(t1.0), 0)).await.tail;
    assert_eq!(fork_tail, t1);
    assert!(
        matches!(e.append(expecting(append_req("f", "F"), t5)).await, Err(AppendError::ExpectedOffsetConflict { tail }) if tail == t1)
    );
    let f1 = append(e, expecting(append_req("f", "F"), t1)).await.next_offset;
    assert_eq!(read_all(e, "f", 4).await, "abF");
    // Closed: the closure's answer wins, even with the right offset.
    append(e, close_req("s")).await;
    assert!(
        matches!(e.append(expecting(append_req("s", "kl"), t5)).await, Err(AppendError::Closed { tail }) if tail == t5)
    );
    h.reopen().await;
    let e = h.engine();
    assert!(
        matches!(e.append(expecting(append_req("f", "G"), t1)).await, Err(AppendError::ExpectedOffsetConflict { tail }) if tail == f1)
    );
    assert_eq!(append(e, expecting(append_req("f", "G"), f1)).await.next_offset, Offset(f1.0 + 1));
}
