//! Forks: chains, sub-offsets, verdicts, soft delete and cascading removal, purge (detaching a
//! source from its path).

use oncelog_protocol::headers::Expiry;
use oncelog_protocol::Offset;

use super::*;

/// `a` = "0123456789"; `b` forks `a` at 4 and appends "BB"; `c` forks `b` at 5 and appends "C".
async fn build_chain<E: Engine>(e: &E) {
    let mut a = create_req("a", "text/plain");
    a.initial = Bytes::from_static(b"01234");
    create(e, a).await;
    append(e, append_req("a", "56789")).await;
    let b = create(e, fork_req("b", "a", Some(4), 0)).await;
    assert_eq!(b.tail, Offset(4));
    append(e, append_req("b", "BB")).await;
    create(e, fork_req("c", "b", Some(5), 0)).await;
    append(e, append_req("c", "C")).await;
}

pub async fn fork_chains_read_through_their_ancestors<H: Harness>() {
    let mut h = H::open().await;
    build_chain(h.engine()).await;
    for _ in 0..2 {
        let e = h.engine();
        assert_eq!(read_all(e, "a", 3).await, "0123456789");
        assert_eq!(read_all(e, "b", 3).await, "0123BB");
        assert_eq!(read_all(e, "c", 1).await, "0123BC");
        // A read that starts inside an inherited append returns its remainder.
        let r = e.read(ReadRequest::new("c", Offset(2), 1 << 20, 0)).await.expect("read");
        assert!(r.data.starts_with(b"23"));
        // The source goes on independently.
        h.reopen().await;
    }
    append(h.engine(), append_req("a", "X")).await;
    assert_eq!(read_all(h.engine(), "c", 2).await, "0123BC");
    // A fork inherits the source's type and expiry unless it names its own.
    let e = h.engine();
    create(e, CreateRequest { expiry: Some(Expiry::Ttl(3600)), ..create_req("t", "text/plain") }).await;
    let f = create(e, fork_req("tf", "t", None, 0)).await;
    assert_eq!((f.config.content_type.as_str(), f.config.expiry), ("text/plain", Expiry::Ttl(3600)));
}

pub async fn fork_sub_offsets_count_bytes_or_messages<H: Harness>() {
    let h = H::open().await;
    let e = h.engine();
    create(e, create_req("bytes", "text/plain")).await;
    append(e, append_req("bytes", "hello")).await;
    append(e, append_req("bytes", "world")).await;
    // 3 bytes into the append that starts at 5.
    let f = create(e, fork_req("bf", "bytes", Some(5), 3)).await;
    assert_eq!(f.tail, Offset(8));
    assert_eq!(read_all(e, "bf", 1 << 20).await, "hellowor");
    create(e, create_req("json", "application/json")).await;
    let data = json_framed(&["1", "{\"k\":\"a,b\"}", "3"]);
    let json = AppendRequest {
        content_type: Some("application/json".into()),
        data,
        json_framed: true,
        ..append_req("json", "")
    };
    append(e, json).await;
    // 2 messages into the append at 0: `1,` and `{"k":"a,b"},`.
    let f = create(e, fork_req("jf", "json", Some(0), 2)).await;
    assert_eq!(f.tail, Offset(14));
    let r = e.read(ReadRequest::new("jf", Offset::ZERO, 1 << 20, 0)).await.expect("read");
    assert_eq!(&r.data[..], b"1,{\"k\":\"a,b\"},");
    assert!(matches!(e.create(fork_req("x", "json", Some(0), 4)).await, Err(CreateError::SubOffsetOvershoot)));
    assert!(matches!(e.create(fork_req("x", "bytes", Some(5), 6)).await, Err(CreateError::SubOffsetOvershoot)));
    // Not the start of an append.
    assert!(matches!(e.create(fork_req("x", "bytes", Some(6), 1)).await, Err(CreateError::SubOffsetOvershoot)));
}

pub async fn fork_verdicts<H: Harness>() {
    let h = H::open().await;
    let e = h.engine();
    create(e, create_req("s", "text/plain")).await;
    append(e, append_req("s", "abc")).await;
    assert!(matches!(e.create(fork_req("f", "nope", None, 0)).await, Err(CreateError::SourceNotFound)));
    assert!(matches!(e.create(fork_req("f", "s", Some(4), 0)).await, Err(CreateError::ForkOffsetBeyondTail)));
    let other_type = CreateRequest { content_type: Some("text/html".into()), ..fork_req("f", "s", None, 0) };
    assert!(matches!(e.create(other_type).await, Err(CreateError::ContentTypeMismatch { .. })));
    // An identical fork request again is 200; a different fork point is 409.
    let f = e.create(fork_req("f", "s", Some(2), 0)).await.expect("fork");
    assert!(matches!(f, CreateOutcome::Created(_)));
    assert!(matches!(e.create(fork_req("f", "s", Some(2), 0)).await, Ok(CreateOutcome::Existing(_))));
    assert!(matches!(e.create(fork_req("f", "s", Some(1), 0)).await, Err(CreateError::ConfigMismatch(_))));
    // A fork has its own producer state and Stream-Seq.
    append(e, produce("s", "d", "p", 0, 0)).await;
    let first = append(e, produce("f", "x", "p", 0, 0)).await;
    assert_eq!((first.status, first.next_offset), (AppendStatus::Appended, Offset(3)));
}

pub async fn soft_delete_keeps_data_for_forks_and_cascades<H: Harness>() {
    let mut h = H::open().await;
    build_chain(h.engine()).await;
    let e = h.engine();
    // Deleting the middle of a chain: its path answers 410 and stays reserved; its fork still reads.
    e.delete("b", 0).await.expect("delete b");
    assert!(matches!(e.head("b", 0).await, Err(LookupError::Gone)));
    assert!(matches!(e.read(ReadRequest::new("b", Offset::ZERO, 10, 0)).await, Err(LookupError::Gone)));
    assert!(matches!(e.append(append_req("b", "x")).await, Err(AppendError::Gone)));
    assert!(matches!(e.delete("b", 0).await, Err(LookupError::Gone)));
    assert!(matches!(e.create(create_req("b", "text/plain")).await, Err(CreateError::PathReserved)));
    assert!(matches!(e.create(fork_req("b2", "b", None, 0)).await, Err(CreateError::SourceGone)));
    e.delete("a", 0).await.expect("delete a");
    h.reopen().await;
    let e = h.engine();
    assert_eq!(read_all(e, "c", 2).await, "0123BC");
    assert!(matches!(e.head("a", 0).await, Err(LookupError::Gone)));
    // Removing the last fork removes every soft-deleted ancestor with it.
    e.delete("c", 0).await.expect("delete c");
    for p in ["a", "b", "c"] {
        assert!(matches!(e.head(p, 0).await, Err(LookupError::NotFound)), "{p} removed");
    }
    h.reopen().await;
    let e = h.engine();
    assert!(matches!(e.head("b", 0).await, Err(LookupError::NotFound)));
    assert!(matches!(e.create(create_req("b", "text/plain")).await, Ok(CreateOutcome::Created(_))));
    assert_eq!(read_all(e, "b", 8).await, "");
}

/// A purge (`DELETE …?purge=true`) of a source that forks read, live or already soft-deleted
/// (the owner's way out when another tenant's fork keeps a deleted path reserved): the path is
/// free at once and a create there makes a new, unrelated stream; the forks read every byte
/// they read before, at the same offsets, before and after a reopen; the detached remains are
/// still counted until the last fork goes, and then gone with it, up a chain.
pub async fn purge_detaches_a_forked_source_from_its_path<H: Harness>() {
    let mut h = H::open().await;
    let e = h.engine();
    let mut src = create_req("src", "text/plain");
    src.initial = Bytes::from_static(b"abc");
    let old = create(e, src).await;
    append(e, append_req("src", "def")).await;
    // A fork point inside an append: the fork reads "abcde", then its own "XY".
    create(e, fork_req("f", "src", Some(5), 0)).await;
    append(e, append_req("f", "XY")).await;
    // A second source, soft-deleted first by a plain delete: its path stays reserved.
    create(e, create_req("held", "text/plain")).await;
    append(e, append_req("held", "123")).await;
    create(e, fork_req("hf", "held", None, 0)).await;
    append(e, append_req("hf", "Z")).await;
    e.delete("held", 0).await.expect("plain delete");
    assert!(matches!(e.create(create_req("held", "text/plain")).await, Err(CreateError::PathReserved)));
    // A purge is conditional on the tail as a plain delete is, and writes nothing when refused.
    let stale = e.delete_if("src", DeleteRequest { if_tail: Some(vec![Offset(5)]), purge: true }, 0).await;
    assert!(matches!(stale, Err(LookupError::PreconditionFailed { tail: Offset(6), .. })), "{stale:?}");
    assert_eq!(read_all(e, "src", 8).await, "abcdef");
    e.delete_if("src", DeleteRequest { if_tail: Some(vec![Offset(6)]), purge: true }, 0)
        .await
        .expect("purge a live source");
    e.delete_if("held", DeleteRequest::purge(), 0).await.expect("purge a soft-deleted source");
    for p in ["src", "held"] {
        assert!(matches!(e.head(p, 0).await, Err(LookupError::NotFound)), "{p} is free");
        assert!(matches!(e.read(ReadRequest::new(p, Offset::ZERO, 8, 0)).await, Err(LookupError::NotFound)), "{p}");
        assert!(matches!(e.append(append_req(p, "x")).await, Err(AppendError::NotFound)), "{p}");
        assert!(matches!(e.delete_if(p, DeleteRequest::purge(), 0).await, Err(LookupError::NotFound)), "{p}");
        assert!(matches!(e.create(fork_req("x", p, None, 0)).await, Err(CreateError::SourceNotFound)), "{p}");
    }
    // The remains exist still (for the forks), but no path names them.
    assert_eq!(e.stats().streams, 4);
    let listed: Vec<String> = e.list_streams("", 0).await.expect("list").into_iter().map(|l| l.path).collect();
    assert_eq!(listed, ["f", "hf"]);
    // The path takes a new, unrelated stream at once.
    let new = create(e, create_req("src", "text/plain")).await;
    assert!(new.id != old.id && new.tail == Offset::ZERO, "{new:?}");
    append(e, append_req("src", "new")).await;
    for round in 0..2 {
        let e = h.engine();
        assert_eq!(read_all(e, "f", 2).await, "abcdeXY", "round {round}");
        let from3 = e.read(ReadRequest::new("f", Offset(3), 1 << 20, 0)).await.expect("read f from 3");
        assert_eq!(&from3.data[..], b"deXY", "round {round}: the same bytes at the same offsets");
        assert_eq!(read_all(e, "hf", 1).await, "123Z");
        assert_eq!(read_all(e, "src", 8).await, "new");
        assert_eq!(e.head("src", 0).await.expect("head").id, new.id);
        assert!(matches!(e.head("held", 0).await, Err(LookupError::NotFound)));
        assert_eq!(e.stats().streams, 5, "round {round}");
        h.reopen().await;
    }
    // A fork of the fork reads through the detached ancestor too.
    let e = h.engine();
    create(e, fork_req("g", "f", None, 0)).await;
    assert_eq!(read_all(e, "g", 3).await, "abcdeXY");
    // The last fork gone, the remains go with it, up the chain; the new stream stays.
    e.delete("f", 0).await.expect("soft-delete f: g reads it");
    e.delete("g", 0).await.expect("delete g");
    assert_eq!(e.stats().streams, 3, "g, f and the detached src removed");
    e.delete("hf", 0).await.expect("delete hf");
    assert_eq!(e.stats().streams, 1, "hf and the detached held removed");
    h.reopen().await;
    let e = h.engine();
    assert_eq!(e.stats().streams, 1);
    let listed: Vec<String> = e.list_streams("", 0).await.expect("list").into_iter().map(|l| l.path).collect();
    assert_eq!(listed, ["src"]);
    assert_eq!(read_all(e, "src", 8).await, "new");
    // And a purge of a stream without forks is a plain delete.
    e.delete_if("src", DeleteRequest::purge(), 0).await.expect("purge without forks");
    assert!(matches!(e.head("src", 0).await, Err(LookupError::NotFound)));
    assert_eq!(e.stats().streams, 0);
}
