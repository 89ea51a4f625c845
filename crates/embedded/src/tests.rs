//! Scenario tests of the embedded engine against a real data directory.

use oncelog_protocol::Offset;
use oncelog_storage::contract::{self, append_req, create_req, produce};

use super::test_support::{copy_dir, write_at};
use super::*;

async fn read_all(e: &EmbeddedEngine, path: &str) -> Vec<u8> {
    contract::read_all(e, path, 7).await.into_bytes()
}

fn open(dir: &std::path::Path) -> EmbeddedEngine {
    EmbeddedEngine::open(EmbeddedOptions::new(dir)).expect("open engine")
}

async fn create(e: &EmbeddedEngine, path: &str) -> StreamInfo {
    contract::create(e, create_req(path, "text/plain")).await
}

#[tokio::test]
async fn crash_without_shutdown_keeps_acknowledged_appends() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let e = open(dir.path());
        create(&e, "s").await;
        for i in 0..50u64 {
            e.append(produce("s", "x", "p", 0, i)).await.expect("append");
        }
        // Dropped without shutdown: only what fsync made durable may be relied on.
        std::mem::forget(e);
    }
    // The forgotten engine still holds the directory lock, so reopen a copy of the directory as
    // a crashed process would have left it.
    let copy = tempfile::tempdir().expect("tempdir");
    copy_dir(dir.path(), copy.path());
    let e = open(copy.path());
    assert_eq!(e.head("s", 0).await.expect("head").tail, Offset(50));
    let dup = e.append(produce("s", "x", "p", 0, 49)).await.expect("dup");
    assert_eq!(dup.status, AppendStatus::Duplicate);
}


#[tokio::test]
async fn torn_journal_tail_is_truncated_on_recovery() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let e = open(dir.path());
        create(&e, "s").await;
        for i in 0..20u64 {
            e.append(append_req("s", &format!("r{i:03}"))).await.expect("append");
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
    let start = end.saturating_sub(6);
    for b in &mut bytes[start..=end] {
        *b ^= 0xA5;
    }
    write_at(&jnl, start as u64, &bytes[start..=end]);

    let e = open(copy.path());
    let data = read_all(&e, "s").await;
    // Recovery drops the torn last batch and keeps every whole one before it, in order.
    assert_eq!(data.len(), 19 * 4, "only the torn last append is lost");
    for (i, rec) in data.chunks(4).enumerate() {
        assert_eq!(rec, format!("r{i:03}").as_bytes());
    }
    assert_eq!(e.head("s", 0).await.expect("head").tail, Offset(data.len() as u64));
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
                let r = e.append(produce(&path, "0123456789", &format!("p{p}"), 0, seq)).await.expect("append");
                assert_eq!(r.status, AppendStatus::Appended);
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    for s in 0..4 {
        assert_eq!(e.head(&format!("s{s}"), 0).await.expect("head").tail, Offset(8 * 20 * 10));
    }
}

#[tokio::test]
async fn a_failed_sync_stops_all_later_writes_but_not_reads() {
    let dir = tempfile::tempdir().expect("tempdir");
    let opts = EmbeddedOptions::new(dir.path());
    let failpoints = opts.failpoints.clone();
    let e = EmbeddedEngine::open(opts).expect("open");
    create(&e, "s").await;
    e.append(append_req("s", "ok")).await.expect("append before the failure");

    failpoints.fail_sync(true);
    let failed = e.append(append_req("s", "lost")).await;
    assert!(matches!(failed, Err(AppendError::Storage(StorageError::Backend(_)))), "{failed:?}");
    // The disk "recovers", but the writer does not pretend: fail-stop until restart.
    failpoints.fail_sync(false);
    let later = e.append(append_req("s", "later")).await;
    assert!(matches!(later, Err(AppendError::Storage(StorageError::Poisoned))), "{later:?}");
    let create_later = e
        .create(create_req("t", "text/plain"))
        .await;
    assert!(matches!(create_later, Err(CreateError::Storage(StorageError::Poisoned))));
    // Readers still see exactly the acknowledged data; the failed append was never published.
    assert_eq!(read_all(&e, "s").await, b"ok");
    assert_eq!(e.head("s", 0).await.expect("head").tail, Offset(2));
}

#[tokio::test]
async fn keys_too_long_to_store_are_refused_without_harming_the_writer() {
    let dir = tempfile::tempdir().expect("tempdir");
    let e = open(dir.path());
    create(&e, "s").await;
    let long_id = "i".repeat(70_000);
    let r = e.append(produce("s", "x", &long_id, 0, 0)).await;
    assert!(matches!(r, Err(AppendError::ProducerIdTooLong)), "{r:?}");
    let r = e.create(create_req(&"p".repeat(70_000), "text/plain")).await;
    assert!(matches!(r, Err(CreateError::InvalidPath)), "{r:?}");
    let r = e.create(create_req("", "text/plain")).await;
    assert!(matches!(r, Err(CreateError::InvalidPath)), "{r:?}");
    assert_eq!(e.append(append_req("s", "ok")).await.expect("writer alive").next_offset, Offset(2));
}

/// Data keys of stream `id` still stored.
fn data_keys(e: &EmbeddedEngine, id: u64) -> usize {
    e.inner.ks.data.prefix(crate::records::keys::stream_prefix(id)).count()
}

#[tokio::test]
async fn trimmed_data_is_removed_in_the_background_unless_a_fork_reads_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let e = open(dir.path());
    let s = create(&e, "s").await;
    let f_src = create(&e, "src").await;
    for i in 0..100u64 {
        e.append(append_req("s", &format!("r{i:03}"))).await.expect("append");
        e.append(append_req("src", &format!("r{i:03}"))).await.expect("append");
    }
    e.create(contract::fork_req("f", "src", Some(200), 0)).await.expect("fork");
    e.trim("s", Offset(360), 0).await.expect("trim");
    e.trim("src", Offset(360), 0).await.expect("trim");
    let t0 = std::time::Instant::now();
    while data_keys(&e, s.id) > 10 && t0.elapsed() < std::time::Duration::from_secs(10) {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(data_keys(&e, s.id), 10, "the 90 appends below the earliest offset are removed");
    assert_eq!(read_all(&e, "s").await, (90..100).map(|i| format!("r{i:03}")).collect::<String>().into_bytes());
    // The source of a fork keeps what the fork reads.
    assert_eq!(data_keys(&e, f_src.id), 100);
    let fork = contract::read_all(&e, "f", 7).await;
    assert_eq!(fork, (0..50).map(|i| format!("r{i:03}")).collect::<String>());
}

fn put(key: &[u8], value: &str) -> MetaWrite {
    MetaWrite { key: key.to_vec(), value: Some(Bytes::from(value.to_owned())) }
}

async fn meta_all(e: &EmbeddedEngine) -> Vec<(Vec<u8>, Bytes)> {
    e.meta_scan(b"").await.expect("meta scan")
}

#[tokio::test]
async fn transactions_survive_flush_reopen_and_crash() {
    let dir = tempfile::tempdir().expect("tempdir");
    let e = open(dir.path());
    create(&e, "s").await;
    create(&e, "t").await;
    let first = TxnRequest {
        // The empty key too: fjall refuses empty keys, the seam does not.
        meta: vec![put(b"", "empty key"), put(b"cur/s", "1"), put(b"gone", "x")],
        appends: vec![produce("s", "a", "p", 0, 0), append_req("t", "b")],
        ..Default::default()
    };
    e.transact(first).await.expect("first");
    let removal = TxnRequest { meta: vec![MetaWrite { key: b"gone".to_vec(), value: None }], ..Default::default() };
    e.transact(removal).await.expect("removal");
    // Into disk tables, so recovery reads them rather than the journal.
    e.flush_to_tables().expect("flush");
    e.shutdown().await.expect("shutdown");
    drop(e);

    let e = open(dir.path());
    let flushed = vec![(b"".to_vec(), Bytes::from("empty key")), (b"cur/s".to_vec(), Bytes::from("1"))];
    assert_eq!(meta_all(&e).await, flushed);
    assert_eq!(read_all(&e, "s").await, b"a");
    assert_eq!(read_all(&e, "t").await, b"b");

    // A later transaction only in the journal, then a crash.
    let later = TxnRequest { meta: vec![put(b"cur/s", "2")], appends: vec![produce("s", "c", "p", 0, 1)], ..Default::default() };
    e.transact(later).await.expect("later");
    std::mem::forget(e);
    let copy = tempfile::tempdir().expect("tempdir");
    copy_dir(dir.path(), copy.path());
    let e = open(copy.path());
    let crashed = vec![(b"".to_vec(), Bytes::from("empty key")), (b"cur/s".to_vec(), Bytes::from("2"))];
    assert_eq!(meta_all(&e).await, crashed);
    assert_eq!(read_all(&e, "s").await, b"ac");
    // The producer state came back with the transaction's append.
    let dup = e.append(produce("s", "c", "p", 0, 1)).await.expect("retry");
    assert_eq!(dup.status, AppendStatus::Duplicate);
}
