//! Forks: chains, sub-offsets, verdicts, soft delete and cascading removal.

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
    let json = AppendRequest { content_type: Some("application/json".into()), data, json_framed: true, ..append_req("json", "") };
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
    assert!(matches!(e.create(other_type).await, Err(CreateError::ContentTypeMismatch)));
    // An identical fork request again is 200; a different fork point is 409.
    let f = e.create(fork_req("f", "s", Some(2), 0)).await.expect("fork");
    assert!(matches!(f, CreateOutcome::Created(_)));
    assert!(matches!(e.create(fork_req("f", "s", Some(2), 0)).await, Ok(CreateOutcome::Existing(_))));
    assert!(matches!(e.create(fork_req("f", "s", Some(1), 0)).await, Err(CreateError::ConfigMismatch)));
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
