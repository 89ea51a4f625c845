//! Reads, expiry, live waits, persistence across reopen, readiness.

use std::time::{Duration, Instant};

use oncelog_protocol::headers::Expiry;
use oncelog_protocol::Offset;

use super::*;

pub async fn reads_page_through_whole_appends<H: Harness>() {
    let h = H::open().await;
    let e = h.engine();
    create(e, create_req("s", "text/plain")).await;
    for w in ["alpha", "beta", "gamma", "delta"] {
        append(e, append_req("s", w)).await;
    }
    // A small page still returns at least one whole append, and never splits one.
    let c = e.read(ReadRequest::new("s", Offset::ZERO, 1, 0)).await.expect("read");
    assert_eq!((&c.data[..], c.next, c.up_to_date()), (&b"alpha"[..], Offset(5), false));
    let c = e.read(ReadRequest::new("s", Offset(5), 6, 0)).await.expect("read");
    assert!(c.data.starts_with(b"beta") && c.next.0 == 5 + c.data.len() as u64);
    // From inside an append: its remainder, then whole appends.
    let c = e.read(ReadRequest::new("s", Offset(2), 1 << 20, 0)).await.expect("read");
    assert_eq!((&c.data[..], c.next, c.up_to_date()), (&b"phabetagammadelta"[..], Offset(19), true));
    // At the tail: empty and up to date.
    let c = e.read(ReadRequest::new("s", Offset(19), 1 << 20, 0)).await.expect("read");
    assert!(c.data.is_empty() && c.up_to_date() && c.next == Offset(19));
    assert_eq!(read_all(e, "s", 7).await, "alphabetagammadelta");
    assert!(matches!(e.read(ReadRequest::new("nope", Offset::ZERO, 10, 0)).await, Err(LookupError::NotFound)));
}

pub async fn bounded_reads_may_end_inside_an_append<H: Harness>() {
    let mut h = H::open().await;
    create(h.engine(), create_req("s", "text/plain")).await;
    let words = ["alpha", "beta", "gamma", "a-longer-append-than-the-page", "z"];
    for w in words {
        append(h.engine(), append_req("s", w)).await;
    }
    let whole: String = words.concat();
    // Twice: once as written, once reopened (the bytes then come from storage, not memory).
    for round in 0..2 {
        let e = h.engine();
        for page in [1, 3, 7, 64] {
            let mut at = Offset::ZERO;
            let mut got = Vec::new();
            loop {
                let c = e.read(ReadRequest::new("s", at, page, 0).bounded()).await.expect("read");
                assert!(c.data.len() <= page, "round {round}: {} bytes for a page of {page}", c.data.len());
                assert_eq!(c.next.0, at.0 + c.data.len() as u64, "next is where the bytes end");
                got.extend_from_slice(&c.data);
                at = c.next;
                if c.up_to_date() {
                    break;
                }
                assert!(!c.data.is_empty(), "a read before the tail returns data");
            }
            assert_eq!(String::from_utf8(got).expect("utf-8"), whole, "page {page}, round {round}");
        }
        let c = e.read(ReadRequest::new("s", Offset(2), 4, 0).bounded()).await.expect("read");
        assert_eq!((&c.data[..], c.next), (&b"phab"[..], Offset(6)));
        h.reopen().await;
    }
}

/// `read_pieces` is `read` in pieces: concatenated, the same bytes and the same next offset,
/// for large appends (which an engine may hand over apart) and small ones, from memory and
/// (after a reopen) from storage.
pub async fn read_pieces_are_the_read_in_order<H: Harness>() {
    let mut h = H::open().await;
    create(h.engine(), create_req("s", "application/octet-stream")).await;
    let sizes = [40_000usize, 100, 70_000, 20_000, 20_000, 5, 150_000, 30_000];
    let mut total = 0u64;
    for (i, n) in sizes.iter().enumerate() {
        let data: Vec<u8> = (0..*n).map(|k| ((k * 11 + i * 5) % 251) as u8).collect();
        let req = AppendRequest::plain("s", "application/octet-stream", false, data.into(), 0);
        append(h.engine(), req).await;
        total += *n as u64;
    }
    for round in 0..2 {
        let e = h.engine();
        for from in [0, 1, 39_999, 40_000, 40_100, 110_100, total - 1] {
            for (max, bounded) in [(1, true), (50_000, true), (100_000, false), (300_000, true), (1 << 20, false)] {
                let req = || {
                    let r = ReadRequest::new("s", Offset(from), max, 0);
                    if bounded {
                        r.bounded()
                    } else {
                        r
                    }
                };
                let whole = e.read(req()).await.expect("read");
                let pieces = e.read_pieces(req()).await.expect("read pieces");
                let joined: Vec<u8> = pieces.pieces.iter().flat_map(|p| p.iter().copied()).collect();
                assert!(joined == whole.data[..], "round {round}, from {from}, max {max}: same bytes");
                assert_eq!(pieces.next, whole.next, "round {round}, from {from}, max {max}");
                assert_eq!(pieces.len(), whole.data.len());
            }
        }
        h.reopen().await;
    }
}

pub async fn trims_move_the_earliest_offset_forward<H: Harness>() {
    let mut h = H::open().await;
    let e = h.engine();
    create(e, create_req("s", "text/plain")).await;
    append(e, produce("s", "abc", "p", 0, 0)).await;
    append(e, append_req("s", "def")).await;
    let t = e.trim("s", Offset(3), 0).await.expect("trim");
    assert_eq!((t.earliest, t.tail), (Offset(3), Offset(6)));
    // Never backwards; never beyond the tail; only existing streams.
    assert_eq!(e.trim("s", Offset(2), 0).await.expect("trim").earliest, Offset(3));
    assert!(matches!(e.trim("s", Offset(7), 0).await, Err(TrimError::BeyondTail { tail: Offset(6) })));
    assert!(matches!(e.trim("nope", Offset(0), 0).await, Err(TrimError::NotFound)));
    // A fork from a trimmed offset is refused; one above the earliest starts where its source does.
    assert!(matches!(
        e.create(fork_req("early", "s", Some(2), 0)).await,
        Err(CreateError::ForkTrimmed { earliest: Offset(3) })
    ));
    create(e, fork_req("f", "s", Some(4), 0)).await;
    // Twice: as written, and reopened (the earliest offset is stored).
    for round in 0..2 {
        let e = h.engine();
        assert_eq!(e.head("s", 0).await.expect("head").earliest, Offset(3), "round {round}");
        assert!(
            matches!(
                e.read(ReadRequest::new("s", Offset(0), 1 << 20, 0)).await,
                Err(LookupError::Trimmed { earliest: Offset(3) })
            ),
            "round {round}"
        );
        assert_eq!(
            &e.read(ReadRequest::new("s", Offset(3), 1 << 20, 0)).await.expect("read").data[..],
            b"def",
            "round {round}"
        );
        // Producer state is not affected: a retry of the trimmed append is still its duplicate.
        let dup = append(e, produce("s", "abc", "p", 0, 0)).await;
        assert_eq!((dup.status, dup.next_offset), (AppendStatus::Duplicate, Offset(3)), "round {round}");
        let fork = e.head("f", 0).await.expect("fork");
        assert_eq!(fork.earliest, Offset(3), "round {round}");
        assert_eq!(
            &e.read(ReadRequest::new("f", Offset(3), 1 << 20, 0)).await.expect("read").data[..],
            b"d",
            "round {round}"
        );
        h.reopen().await;
    }
}

pub async fn ttl_and_absolute_expiry<H: Harness>() {
    let h = H::open().await;
    let e = h.engine();
    let t0 = 1_000_000;
    create(e, CreateRequest { expiry: Some(Expiry::Ttl(10)), now_ms: t0, ..create_req("ttl", "text/plain") }).await;
    create(e, CreateRequest { expiry: Some(Expiry::At(t0 + 5_000)), now_ms: t0, ..create_req("at", "text/plain") })
        .await;
    create(e, CreateRequest { now_ms: t0, ..create_req("forever", "text/plain") }).await;
    // A read slides the TTL window; head does not.
    e.read(ReadRequest::new("ttl", Offset::ZERO, 10, t0 + 8_000)).await.expect("read");
    e.head("ttl", t0 + 17_000).await.expect("still there: last access at +8 s");
    assert!(matches!(e.head("at", t0 + 5_000).await, Err(LookupError::NotFound)));
    // An append slides it too.
    let mut a = append_req("ttl", "x");
    a.now_ms = t0 + 17_500;
    append(e, a).await;
    e.head("ttl", t0 + 27_499).await.expect("last access at +17.5 s");
    assert!(matches!(e.head("ttl", t0 + 27_500).await, Err(LookupError::NotFound)));
    assert!(matches!(e.read(ReadRequest::new("ttl", Offset::ZERO, 10, t0 + 27_500)).await, Err(LookupError::NotFound)));
    // The sweep removes what expired; the path can be created afresh.
    let n = e.expire(t0 + 30_000).await.expect("expire");
    assert_eq!(n, 2, "ttl and at expired, forever did not");
    e.head("forever", t0 + 30_000).await.expect("never expires");
    let again = e.create(CreateRequest { now_ms: t0 + 30_000, ..create_req("ttl", "text/html") }).await;
    assert!(matches!(again, Ok(CreateOutcome::Created(_))));
    // An expired stream with forks is gone (410) for its own path while its fork reads on.
    create(e, CreateRequest { expiry: Some(Expiry::At(t0 + 40_000)), now_ms: t0, ..create_req("src", "text/plain") })
        .await;
    append(e, AppendRequest { now_ms: t0, ..append_req("src", "abc") }).await;
    create(e, CreateRequest { expiry: Some(Expiry::Never), now_ms: t0, ..fork_req("f", "src", None, 0) }).await;
    assert!(matches!(e.head("src", t0 + 40_000).await, Err(LookupError::Gone)));
    // Writes get the readers' verdicts (`rules::writable`), before any sweep ran: gone while
    // forks read the stream, else absent.
    let r = e.append(AppendRequest { now_ms: t0 + 40_000, ..append_req("src", "d") }).await;
    assert!(matches!(r, Err(AppendError::Gone)), "{r:?}");
    create(e, CreateRequest { expiry: Some(Expiry::At(t0 + 50_000)), now_ms: t0, ..create_req("late", "text/plain") })
        .await;
    let r = e.append(AppendRequest { now_ms: t0 + 50_000, ..append_req("late", "x") }).await;
    assert!(matches!(r, Err(AppendError::NotFound)), "{r:?}");
    e.expire(t0 + 40_000).await.expect("expire");
    assert!(matches!(e.head("src", t0 + 40_001).await, Err(LookupError::Gone)));
    let r = e.read(ReadRequest::new("f", Offset::ZERO, 1 << 20, t0 + 40_001)).await.expect("fork reads on");
    assert_eq!(&r.data[..], b"abc");
}

pub async fn live_waits_wake_on_append_closure_and_delete<H: Harness>() {
    let h = H::open().await;
    let e = h.engine();
    create(e, create_req("s", "text/plain")).await;
    // Nothing happens: times out with the current state.
    let w = e.wait("s", Offset::ZERO, Duration::from_millis(50), 0).await.expect("wait");
    assert!(matches!(w, WaitOutcome::TimedOut(ref i) if i.tail == Offset::ZERO), "{w:?}");
    // An append wakes a waiter at once, with the new tail.
    let started = Instant::now();
    let (w, _) = tokio::join!(e.wait("s", Offset::ZERO, Duration::from_secs(5), 0), async {
        tokio::time::sleep(Duration::from_millis(30)).await;
        append(e, append_req("s", "abc")).await
    });
    assert!(matches!(w, Ok(WaitOutcome::Changed(ref i)) if i.tail == Offset(3)), "{w:?}");
    assert!(started.elapsed() < Duration::from_secs(2));
    // Already past: returns at once.
    assert!(matches!(e.wait("s", Offset(1), Duration::from_secs(5), 0).await, Ok(WaitOutcome::Changed(_))));
    // Closure wakes it.
    let (w, _) = tokio::join!(e.wait("s", Offset(3), Duration::from_secs(5), 0), async {
        tokio::time::sleep(Duration::from_millis(30)).await;
        append(e, close_req("s")).await
    });
    assert!(matches!(w, Ok(WaitOutcome::Changed(ref i)) if i.closed && i.tail == Offset(3)), "{w:?}");
    // Deletion ends it with not-found.
    create(e, create_req("d", "text/plain")).await;
    let (w, _) = tokio::join!(e.wait("d", Offset::ZERO, Duration::from_secs(5), 0), async {
        tokio::time::sleep(Duration::from_millis(30)).await;
        e.delete("d", 0).await
    });
    assert!(matches!(w, Err(LookupError::NotFound)), "{w:?}");
    assert!(matches!(e.wait("nope", Offset::ZERO, Duration::from_millis(10), 0).await, Err(LookupError::NotFound)));
}

pub async fn state_survives_reopen<H: Harness>() {
    let mut h = H::open().await;
    {
        let e = h.engine();
        create(e, CreateRequest { expiry: Some(Expiry::Ttl(3600)), ..create_req("s", "text/plain; charset=utf-8") })
            .await;
        append(e, produce("s", "one", "p", 3, 0)).await;
        append(e, AppendRequest { stream_seq: Some("m".into()), ..produce("s", "two", "p", 3, 1) }).await;
        create(e, create_req("c", "application/json")).await;
        let j = AppendRequest {
            content_type: Some("application/json".into()),
            data: json_framed(&["1"]),
            json_framed: true,
            close: true,
            ..append_req("c", "")
        };
        append(e, j).await;
    }
    h.reopen().await;
    let e = h.engine();
    let s = e.head("s", 0).await.expect("head");
    assert_eq!(
        (s.tail, s.closed, s.config.content_type.as_str(), s.config.expiry),
        (Offset(6), false, "text/plain; charset=utf-8", Expiry::Ttl(3600))
    );
    assert_eq!(read_all(e, "s", 2).await, "onetwo");
    let dup = append(e, produce("s", "two", "p", 3, 1)).await;
    assert_eq!((dup.status, dup.next_offset), (AppendStatus::Duplicate, Offset(6)));
    assert!(matches!(
        e.append(produce("s", "x", "p", 2, 0)).await,
        Err(AppendError::ProducerFenced { current_epoch: 3 })
    ));
    let stale_seq = AppendRequest { stream_seq: Some("a".into()), ..append_req("s", "x") };
    assert!(matches!(e.append(stale_seq).await, Err(AppendError::StreamSeqRegression { .. })));
    let c = e.head("c", 0).await.expect("head");
    assert!(c.closed && c.tail == Offset(2));
}

pub async fn deleted_paths_start_fresh_with_new_ids<H: Harness>() {
    let mut h = H::open().await;
    let first = create(h.engine(), create_req("s", "text/plain")).await;
    append(h.engine(), produce("s", "abc", "p", 0, 0)).await;
    h.engine().delete("s", 0).await.expect("delete");
    assert!(matches!(h.engine().head("s", 0).await, Err(LookupError::NotFound)));
    assert!(matches!(h.engine().delete("s", 0).await, Err(LookupError::NotFound)));
    h.reopen().await;
    let e = h.engine();
    let second = create(e, create_req("s", "application/json")).await;
    assert!(second.id > first.id, "ids are never reused, even across a restart");
    assert_eq!(second.tail, Offset::ZERO);
    // No data and no producer state from the old incarnation.
    assert_eq!(read_all(e, "s", 8).await, "");
    let j = AppendRequest {
        content_type: Some("application/json".into()),
        data: json_framed(&["1"]),
        json_framed: true,
        ..produce("s", "", "p", 0, 0)
    };
    assert_eq!(append(e, j).await.status, AppendStatus::Appended);
}

pub async fn readiness_and_stats<H: Harness>() {
    let h = H::open().await;
    let e = h.engine();
    assert_eq!(e.readiness(), Readiness::Ready);
    assert_eq!(e.stats(), EngineStats { streams: 0, producers: 0, parked_appends: 0 });
    create(e, create_req("a", "text/plain")).await;
    create(e, create_req("b", "text/plain")).await;
    append(e, produce("a", "x", "p", 0, 0)).await;
    append(e, produce("a", "x", "q", 0, 0)).await;
    append(e, produce("b", "x", "p", 0, 0)).await;
    append(e, produce("b", "y", "p", 0, 1)).await;
    assert_eq!(e.stats(), EngineStats { streams: 2, producers: 3, parked_appends: 0 });
    e.delete("a", 0).await.expect("delete");
    assert_eq!(e.stats(), EngineStats { streams: 1, producers: 1, parked_appends: 0 });
    e.shutdown().await.expect("shutdown");
    assert!(matches!(e.readiness(), Readiness::NotReady { .. }));
    assert!(matches!(e.append(append_req("b", "z")).await, Err(AppendError::Storage(StorageError::ShuttingDown))));
}

pub async fn reads_say_whether_they_start_at_a_minted_offset<H: Harness>() {
    let h = H::open().await;
    let e = h.engine();
    create(e, create_req("s", "text/plain")).await;
    append(e, append_req("s", "abc")).await;
    append(e, append_req("s", "defg")).await;
    for (from, aligned) in [(0, true), (1, false), (3, true), (5, false), (7, true)] {
        let c = e.read(ReadRequest::new("s", Offset(from), 1 << 20, 0)).await.expect("read");
        assert_eq!(c.aligned, aligned, "read from {from}");
    }
    // A fork point cut inside an append is minted too, for the fork.
    create(e, fork_req("f", "s", Some(3), 2)).await;
    append(e, append_req("f", "xy")).await;
    let c = e.read(ReadRequest::new("f", Offset(5), 1 << 20, 0)).await.expect("read");
    assert!(c.aligned && &c.data[..] == b"xy", "{c:?}");
    assert!(!e.read(ReadRequest::new("f", Offset(4), 1 << 20, 0)).await.expect("read").aligned);
}

pub async fn reads_after_a_wait_see_at_least_what_it_saw<H: Harness>() {
    let h = H::open().await;
    let e = h.engine();
    create(e, create_req("s", "text/plain")).await;
    append(e, append_req("s", "abc")).await;
    // An ordinary read first (an engine may remember what it learned from it).
    assert_eq!(&e.read(ReadRequest::new("s", Offset::ZERO, 64, 0)).await.expect("read").data[..], b"abc");
    let (w, _) = tokio::join!(e.wait("s", Offset(3), Duration::from_secs(5), 0), async {
        tokio::time::sleep(Duration::from_millis(30)).await;
        append(e, append_req("s", "defg")).await
    });
    let Ok(WaitOutcome::Changed(seen)) = w else { panic!("{w:?}") };
    let c = e.read(ReadRequest::new("s", Offset(3), 1 << 20, 0).after(&seen)).await.expect("read");
    assert_eq!((&c.data[..], c.next, c.up_to_date()), (&b"defg"[..], Offset(7), true));
    let c = e.read(ReadRequest::new("s", Offset(3), 2, 0).bounded().after(&seen)).await.expect("bounded read");
    assert_eq!((&c.data[..], c.next), (&b"de"[..], Offset(5)), "bounded: cut inside the append");
    let c = e.read(ReadRequest::new("s", Offset(7), 64, 0).after(&seen)).await.expect("read at the tail");
    assert!(c.data.is_empty() && c.up_to_date());
    // What the wait saw bounds nothing below it: a later trim still answers.
    e.trim("s", Offset(3), 0).await.expect("trim");
    let seen = e.head("s", 0).await.expect("head");
    assert!(matches!(
        e.read(ReadRequest::new("s", Offset(1), 64, 0).after(&seen)).await,
        Err(LookupError::Trimmed { earliest: Offset(3) })
    ));
    // A fork's woken reader reads through its source.
    create(e, fork_req("f", "s", Some(5), 0)).await;
    assert_eq!(&e.read(ReadRequest::new("f", Offset(3), 64, 0)).await.expect("read").data[..], b"de");
    let (w, _) = tokio::join!(e.wait("f", Offset(5), Duration::from_secs(5), 0), async {
        tokio::time::sleep(Duration::from_millis(30)).await;
        append(e, append_req("f", "XY")).await
    });
    let Ok(WaitOutcome::Changed(seen)) = w else { panic!("{w:?}") };
    let c = e.read(ReadRequest::new("f", Offset(3), 64, 0).after(&seen)).await.expect("fork read");
    assert_eq!((&c.data[..], c.next), (&b"deXY"[..], Offset(7)));
}
