//! Retention policies: configuration fixed at creation, and the sweep that applies them.

use oncelog_protocol::Offset;

use super::*;
use crate::retention::{RetentionPolicy, RetentionRequest};

fn policy(max_age_s: Option<u64>, max_bytes: Option<u64>) -> RetentionPolicy {
    RetentionPolicy { max_age_s, max_bytes }
}

fn named(p: RetentionPolicy) -> RetentionRequest {
    RetentionRequest { policy: p, named_age: true, named_bytes: true }
}

pub async fn retention_policies_are_configuration<H: Harness>() {
    let mut h = H::open().await;
    let e = h.engine();
    let p = policy(Some(60), Some(100));
    let info = create(e, CreateRequest { retention: named(p), ..create_req("s", "text/plain") }).await;
    assert_eq!(info.config.retention, p);
    // The same again is the same stream; another named limit is another configuration; limits
    // the request did not name came from server defaults and are not compared.
    let again = e.create(CreateRequest { retention: named(p), ..create_req("s", "text/plain") }).await;
    assert!(matches!(again, Ok(CreateOutcome::Existing(_))), "{again:?}");
    let other = RetentionRequest { policy: policy(None, Some(5)), named_age: false, named_bytes: true };
    let r = e.create(CreateRequest { retention: other, ..create_req("s", "text/plain") }).await;
    assert!(matches!(r, Err(CreateError::ConfigMismatch(_))), "{r:?}");
    let defaults = RetentionRequest { policy: RetentionPolicy::NONE, named_age: false, named_bytes: false };
    let r = e.create(CreateRequest { retention: defaults, ..create_req("s", "text/plain") }).await;
    assert!(matches!(r, Ok(CreateOutcome::Existing(_))), "{r:?}");
    // A fork has its own policy, not its source's.
    append(e, append_req("s", "abc")).await;
    let f = create(e, fork_req("f", "s", None, 0)).await;
    assert_eq!(f.config.retention, RetentionPolicy::NONE);
    h.reopen().await;
    let e = h.engine();
    assert_eq!(e.head("s", 0).await.expect("head").config.retention, p);
    assert_eq!(e.head("f", 0).await.expect("head").config.retention, RetentionPolicy::NONE);
}

pub async fn retention_drops_whole_old_appends_by_size_and_age<H: Harness>() {
    let mut h = H::open().await;
    let t0 = 1_000_000;
    let e = h.engine();
    // By size: keep at least 10 of the newest bytes, cut only between appends.
    create(e, CreateRequest { retention: named(policy(None, Some(10))), ..create_req("b", "text/plain") }).await;
    create(e, create_req("keep", "text/plain")).await;
    for chunk in ["aaaa", "bbbb", "cccc", "dddd", "eeee"] {
        append(e, append_req("b", chunk)).await;
        append(e, append_req("keep", chunk)).await;
    }
    assert_eq!(
        e.retain(t0).await.expect("retain"),
        Retained { streams: 1, bytes: 8 },
        "one stream, two appends of 4 bytes"
    );
    let b = e.head("b", t0).await.expect("head");
    assert_eq!((b.earliest, b.tail), (Offset(8), Offset(20)), "20 - 10 = 10 rounds down to the append boundary 8");
    assert!(matches!(
        e.read(ReadRequest::new("b", Offset(4), 1 << 20, t0)).await,
        Err(LookupError::Trimmed { earliest: Offset(8) })
    ));
    assert_eq!(read_all(e, "b", 7).await, "ccccddddeeee");
    assert_eq!(e.head("keep", t0).await.expect("head").earliest, Offset::ZERO, "no policy, nothing dropped");
    assert_eq!(e.retain(t0).await.expect("retain"), Retained::default(), "nothing more to drop");

    // By age (64 s: marks a second apart). Initial data counts from the creation.
    let aged = CreateRequest {
        retention: named(policy(Some(64), None)),
        initial: Bytes::from_static(b"0000"),
        now_ms: t0,
        ..create_req("a", "text/plain")
    };
    create(e, aged).await;
    for (i, chunk) in ["1111", "2222", "3333"].into_iter().enumerate() {
        append(e, AppendRequest { now_ms: t0 + 2_000 * (i as i64 + 1), ..append_req("a", chunk) }).await;
    }
    // Time marks survive a reopen: the sweep after it knows how old each append is.
    h.reopen().await;
    let e = h.engine();
    let age_ms = 64_000;
    assert_eq!(e.retain(t0 + age_ms - 1).await.expect("retain"), Retained::default(), "nothing is 64 s old yet");
    assert_eq!(e.head("a", t0).await.expect("head").earliest, Offset::ZERO);
    assert_eq!(e.retain(t0 + age_ms + 2_500).await.expect("retain"), Retained { streams: 1, bytes: 8 });
    let a = e.head("a", t0).await.expect("head");
    assert_eq!(a.earliest, Offset(8), "what was written by t0 + 2 s is dropped, the rest is younger");
    assert_eq!(read_all(e, "a", 7).await, "22223333");
    h.reopen().await;
    let e = h.engine();
    assert_eq!(e.head("a", t0).await.expect("head").earliest, Offset(8), "the sweep's trim is durable");
    assert_eq!(e.retain(t0 + age_ms + 6_000).await.expect("retain"), Retained { streams: 1, bytes: 8 });
    let a = e.head("a", t0).await.expect("head");
    assert_eq!((a.earliest, a.tail), (Offset(16), Offset(16)), "all of it is old now");
    // The stream lives on: new appends are kept and readable.
    append(e, AppendRequest { now_ms: t0 + age_ms + 7_000, ..append_req("a", "4444") }).await;
    assert_eq!(read_all(e, "a", 7).await, "4444");
}
