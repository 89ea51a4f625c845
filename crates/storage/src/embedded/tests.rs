//! Scenario tests of the embedded engine against a real data directory.

use std::time::Duration;

use bytes::Bytes;
use oncelog_protocol::headers::{Expiry, ProducerHeaders};
use oncelog_protocol::Offset;

use super::test_support::copy_dir;
use super::*;

async fn read_all(e: &EmbeddedEngine, path: &str) -> Vec<u8> {
    super::test_support::read_all(e, path, 7).await
}

fn open(dir: &std::path::Path) -> EmbeddedEngine {
    EmbeddedEngine::open(EmbeddedOptions::new(dir)).expect("open engine")
}

fn create_req(path: &str, ct: &str) -> CreateRequest {
    CreateRequest {
        path: path.into(),
        content_type: Some(ct.into()),
        expiry: None,
        fork: None,
        closed: false,
        initial: Bytes::new(),
        now_ms: 0,
    }
}

async fn create(e: &EmbeddedEngine, path: &str) -> StreamInfo {
    match e.create(create_req(path, "text/plain")).await.expect("create") {
        CreateOutcome::Created(i) | CreateOutcome::Existing(i) => i,
    }
}

fn append_req(path: &str, data: &str, producer: Option<(&str, u64, u64)>) -> AppendRequest {
    AppendRequest {
        path: path.into(),
        content_type: Some("text/plain".into()),
        data: Bytes::from(data.to_owned()),
        close: false,
        stream_seq: None,
        producer: producer.map(|(id, epoch, seq)| ProducerHeaders { id: id.into(), epoch, seq }),
        now_ms: 0,
    }
}


#[tokio::test]
async fn appends_read_back_in_order_across_small_pages() {
    let dir = tempfile::tempdir().expect("tempdir");
    let e = open(dir.path());
    create(&e, "s").await;
    for w in ["alpha", "beta", "gamma", "delta"] {
        e.append(append_req("s", w, None)).await.expect("append");
    }
    assert_eq!(read_all(&e, "s").await, b"alphabetagammadelta");
    // A read starting inside an append returns its remainder.
    let c = e.read("s", Offset(2), 1 << 20, 0).await.expect("read");
    assert_eq!(&c.data[..], b"phabetagammadelta");
    assert_eq!(c.next, Offset(19));
    e.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn producer_state_and_tail_survive_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let e = open(dir.path());
        create(&e, "s").await;
        let a = e.append(append_req("s", "one", Some(("p", 0, 0)))).await.expect("append");
        assert_eq!((a.status, a.next_offset), (AppendStatus::Appended, Offset(3)));
        e.append(append_req("s", "two", Some(("p", 0, 1)))).await.expect("append");
        e.shutdown().await.expect("shutdown");
    }
    let e = open(dir.path());
    assert_eq!(e.recovery_report().streams, 1);
    assert_eq!(e.recovery_report().producers, 1);
    assert_eq!(e.head("s", 0).expect("head").tail, Offset(6));
    // A retry of seq 0 after the restart is a duplicate that still knows where it landed.
    let dup = e.append(append_req("s", "one", Some(("p", 0, 0)))).await.expect("dup");
    assert_eq!((dup.status, dup.next_offset, dup.producer), (AppendStatus::Duplicate, Offset(3), Some((0, 1))));
    let gap = e.append(append_req("s", "four", Some(("p", 0, 3)))).await;
    assert!(matches!(gap, Err(AppendError::ProducerSeqGap { expected: 2, received: 3 })));
    assert_eq!(read_all(&e, "s").await, b"onetwo");
}

#[tokio::test]
async fn crash_without_shutdown_keeps_acknowledged_appends() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let e = open(dir.path());
        create(&e, "s").await;
        for i in 0..50u64 {
            e.append(append_req("s", "x", Some(("p", 0, i)))).await.expect("append");
        }
        // Dropped without shutdown: only what fsync made durable may be relied on.
        std::mem::forget(e);
    }
    // The forgotten engine still holds the directory lock, so reopen a copy of the directory as
    // a crashed process would have left it.
    let copy = tempfile::tempdir().expect("tempdir");
    copy_dir(dir.path(), copy.path());
    let e = open(copy.path());
    assert_eq!(e.head("s", 0).expect("head").tail, Offset(50));
    let dup = e.append(append_req("s", "x", Some(("p", 0, 49)))).await.expect("dup");
    assert_eq!(dup.status, AppendStatus::Duplicate);
}


#[tokio::test]
async fn torn_journal_tail_is_truncated_on_recovery() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let e = open(dir.path());
        create(&e, "s").await;
        for i in 0..20u64 {
            e.append(append_req("s", &format!("r{i:03}"), None)).await.expect("append");
        }
        std::mem::forget(e);
    }
    let copy = tempfile::tempdir().expect("tempdir");
    copy_dir(dir.path(), copy.path());
    // Tear the last journal entry: flip bytes just before the end of the written region.
    let jnl = std::fs::read_dir(copy.path())
        .expect("read_dir")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "jnl"))
        .expect("a journal file");
    let mut bytes = std::fs::read(&jnl).expect("read journal");
    let end = bytes.iter().rposition(|b| *b != 0).expect("journal has data");
    for b in &mut bytes[end.saturating_sub(6)..=end] {
        *b ^= 0xA5;
    }
    std::fs::write(&jnl, &bytes).expect("write journal");

    let e = open(copy.path());
    let data = read_all(&e, "s").await;
    // Recovery drops the torn last batch and keeps every whole one before it, in order.
    assert_eq!(data.len(), 19 * 4, "only the torn last append is lost");
    for (i, rec) in data.chunks(4).enumerate() {
        assert_eq!(rec, format!("r{i:03}").as_bytes());
    }
    assert_eq!(e.head("s", 0).expect("head").tail, Offset(data.len() as u64));
}

#[tokio::test]
async fn concurrent_appends_share_group_commits_and_all_land() {
    let dir = tempfile::tempdir().expect("tempdir");
    let e = open(dir.path());
    for s in 0..4 {
        create(&e, &format!("s{s}")).await;
    }
    let mut tasks = Vec::new();
    for p in 0..32u64 {
        let e = e.clone();
        tasks.push(tokio::spawn(async move {
            let path = format!("s{}", p % 4);
            for seq in 0..20u64 {
                let r = e.append(append_req(&path, "0123456789", Some((&format!("p{p}"), 0, seq)))).await.expect("append");
                assert_eq!(r.status, AppendStatus::Appended);
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    for s in 0..4 {
        assert_eq!(e.head(&format!("s{s}"), 0).expect("head").tail, Offset(8 * 20 * 10));
    }
}

#[tokio::test]
async fn deleted_stream_is_gone_and_its_path_starts_fresh() {
    let dir = tempfile::tempdir().expect("tempdir");
    let e = open(dir.path());
    let first = create(&e, "s").await;
    e.append(append_req("s", "old", Some(("p", 0, 0)))).await.expect("append");
    e.delete("s", 0).await.expect("delete");
    assert!(matches!(e.head("s", 0), Err(LookupError::NotFound)));
    assert!(matches!(e.delete("s", 0).await, Err(LookupError::NotFound)));
    let second = create(&e, "s").await;
    assert_ne!(first.id, second.id);
    assert_eq!(second.tail, Offset::ZERO);
    // Fresh producer state: seq 0 is new data again, not a duplicate.
    let r = e.append(append_req("s", "new", Some(("p", 0, 0)))).await.expect("append");
    assert_eq!(r.status, AppendStatus::Appended);
    assert_eq!(read_all(&e, "s").await, b"new");
    // The garbage collector removes the old data keys.
    let ks = e.inner.ks.clone();
    for _ in 0..100 {
        if ks.data.prefix(keys::stream_prefix(first.id)).next().is_none() && ks.gc.iter().next().is_none() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("old data was not collected");
}

#[tokio::test]
async fn closure_is_durable_and_rejects_appends() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let e = open(dir.path());
        create(&e, "s").await;
        let mut req = append_req("s", "last", Some(("p", 0, 0)));
        req.close = true;
        let r = e.append(req.clone()).await.expect("close");
        assert!(r.closed);
        // The closing request's retry is a duplicate, anything else is refused.
        assert_eq!(e.append(req).await.expect("retry").status, AppendStatus::Duplicate);
        e.shutdown().await.expect("shutdown");
    }
    let e = open(dir.path());
    assert!(e.head("s", 0).expect("head").closed);
    assert!(matches!(e.append(append_req("s", "more", None)).await, Err(AppendError::Closed { tail: Offset(4) })));
    let mut close_only = append_req("s", "", None);
    close_only.close = true;
    assert_eq!(e.append(close_only).await.expect("close again").status, AppendStatus::AlreadyClosed);
}

#[tokio::test]
async fn ttl_and_absolute_expiry_hide_and_sweep_streams() {
    let dir = tempfile::tempdir().expect("tempdir");
    let e = open(dir.path());
    let mk = |path: &str, expiry| CreateRequest { expiry: Some(expiry), now_ms: 1_000, ..create_req(path, "text/plain") };
    e.create(mk("ttl", Expiry::Ttl(2))).await.expect("create");
    e.create(mk("at", Expiry::At(5_000))).await.expect("create");
    // A read at 2.5 s slides the TTL window; HEAD does not.
    e.read("ttl", Offset::ZERO, 10, 2_500).await.expect("read");
    assert!(e.head("ttl", 4_000).is_ok());
    assert!(e.head("ttl", 4_500).is_err());
    assert!(e.head("at", 4_999).is_ok());
    assert!(e.head("at", 5_000).is_err());
    assert_eq!(e.expire(10_000).await.expect("expire"), 2);
    assert_eq!(e.expire(10_000).await.expect("expire"), 0);
}

#[tokio::test]
async fn live_wait_wakes_on_append_and_times_out_otherwise() {
    let dir = tempfile::tempdir().expect("tempdir");
    let e = open(dir.path());
    create(&e, "s").await;
    let t = e.wait("s", Offset::ZERO, Duration::from_millis(50), 0).await.expect("wait");
    assert!(matches!(t, WaitOutcome::TimedOut(_)));
    let waiter = {
        let e = e.clone();
        tokio::spawn(async move { e.wait("s", Offset::ZERO, Duration::from_secs(10), 0).await })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    e.append(append_req("s", "hi", None)).await.expect("append");
    match waiter.await.expect("join").expect("wait") {
        WaitOutcome::Changed(i) => assert_eq!(i.tail, Offset(2)),
        other => panic!("expected a wake-up, got {other:?}"),
    }
}

#[tokio::test]
async fn out_of_order_pipelined_appends_wait_for_their_predecessors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let e = open(dir.path());
    create(&e, "s").await;
    // seq 2 and 1 arrive before 0, as pipelined requests over several connections can.
    let mut later = Vec::new();
    for (seq, body) in [(2u64, "c"), (1, "b")] {
        let e = e.clone();
        later.push(tokio::spawn(async move { e.append(append_req("s", body, Some(("p", 0, seq)))).await }));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let first = e.append(append_req("s", "a", Some(("p", 0, 0)))).await.expect("seq 0");
    assert_eq!(first.status, AppendStatus::Appended);
    for t in later {
        let r = t.await.expect("join").expect("parked append accepted");
        assert_eq!(r.status, AppendStatus::Appended);
    }
    assert_eq!(read_all(&e, "s").await, b"abc");
}

#[tokio::test]
async fn a_real_gap_is_answered_409_after_the_park_timeout() {
    let dir = tempfile::tempdir().expect("tempdir");
    let e = open(dir.path());
    create(&e, "s").await;
    e.append(append_req("s", "a", Some(("p", 0, 0)))).await.expect("seq 0");
    let started = std::time::Instant::now();
    let r = e.append(append_req("s", "c", Some(("p", 0, 2)))).await;
    assert!(matches!(r, Err(AppendError::ProducerSeqGap { expected: 1, received: 2 })), "{r:?}");
    assert!(started.elapsed() >= Duration::from_millis(200), "it waited for seq 1 first");
    // Far ahead of the window: refused at once.
    let started = std::time::Instant::now();
    let r = e.append(append_req("s", "z", Some(("p", 0, 1000)))).await;
    assert!(matches!(r, Err(AppendError::ProducerSeqGap { .. })));
    assert!(started.elapsed() < Duration::from_millis(200));
    assert_eq!(read_all(&e, "s").await, b"a");
}

#[tokio::test]
async fn a_failed_sync_stops_all_later_writes_but_not_reads() {
    let dir = tempfile::tempdir().expect("tempdir");
    let opts = EmbeddedOptions::new(dir.path());
    let failpoints = opts.failpoints.clone();
    let e = EmbeddedEngine::open(opts).expect("open");
    create(&e, "s").await;
    e.append(append_req("s", "ok", None)).await.expect("append before the failure");

    failpoints.fail_sync(true);
    let failed = e.append(append_req("s", "lost", None)).await;
    assert!(matches!(failed, Err(AppendError::Storage(StorageError::Backend(_)))), "{failed:?}");
    // The disk "recovers", but the writer does not pretend: fail-stop until restart.
    failpoints.fail_sync(false);
    let later = e.append(append_req("s", "later", None)).await;
    assert!(matches!(later, Err(AppendError::Storage(StorageError::Poisoned))), "{later:?}");
    let create_later = e
        .create(create_req("t", "text/plain"))
        .await;
    assert!(matches!(create_later, Err(CreateError::Storage(StorageError::Poisoned))));
    // Readers still see exactly the acknowledged data; the failed append was never published.
    assert_eq!(read_all(&e, "s").await, b"ok");
    assert_eq!(e.head("s", 0).expect("head").tail, Offset(2));
}

#[tokio::test]
async fn pipelining_right_after_an_epoch_bump_waits_for_the_new_epochs_seq_0() {
    let dir = tempfile::tempdir().expect("tempdir");
    let e = open(dir.path());
    create(&e, "s").await;
    e.append(append_req("s", "old", Some(("p", 0, 0)))).await.expect("epoch 0");
    // Epoch 1's seq 1 overtakes its seq 0.
    let early = {
        let e = e.clone();
        tokio::spawn(async move { e.append(append_req("s", "B", Some(("p", 1, 1)))).await })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    let first = e.append(append_req("s", "A", Some(("p", 1, 0)))).await.expect("epoch 1 seq 0");
    assert_eq!(first.status, AppendStatus::Appended);
    let r = early.await.expect("join").expect("parked seq 1 accepted");
    assert_eq!((r.status, r.producer), (AppendStatus::Appended, Some((1, 1))));
    assert_eq!(read_all(&e, "s").await, b"oldAB");
    // Without its seq 0, a new epoch's seq 1 is still refused (400), once the wait is over.
    let r = e.append(append_req("s", "x", Some(("p", 2, 1)))).await;
    assert!(matches!(r, Err(AppendError::ProducerEpochSeq)), "{r:?}");
}

#[tokio::test]
async fn keys_too_long_to_store_are_refused_without_harming_the_writer() {
    let dir = tempfile::tempdir().expect("tempdir");
    let e = open(dir.path());
    create(&e, "s").await;
    let long_id = "i".repeat(70_000);
    let r = e.append(append_req("s", "x", Some((&long_id, 0, 0)))).await;
    assert!(matches!(r, Err(AppendError::ProducerIdTooLong)), "{r:?}");
    let r = e.create(create_req(&"p".repeat(70_000), "text/plain")).await;
    assert!(matches!(r, Err(CreateError::InvalidPath)), "{r:?}");
    let r = e.create(create_req("", "text/plain")).await;
    assert!(matches!(r, Err(CreateError::InvalidPath)), "{r:?}");
    assert_eq!(e.append(append_req("s", "ok", None)).await.expect("writer alive").next_offset, Offset(2));
}
