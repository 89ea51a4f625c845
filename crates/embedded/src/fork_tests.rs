//! Embedded-only fork scenarios: a crash between a fork's creation and its first append, and
//! the disk cost of a fork. Chains, sub-offsets and cascades are in the engine contract suite.

use bytes::Bytes;
use oncelog_protocol::Offset;

use oncelog_storage::contract::{self, append_req, create_req};

use super::test_support::copy_dir;
use super::*;

async fn read_all(e: &EmbeddedEngine, path: &str) -> String {
    contract::read_all(e, path, 3).await
}

fn open_at(dir: &std::path::Path) -> EmbeddedEngine {
    EmbeddedEngine::open(EmbeddedOptions::new(dir)).expect("open engine")
}

fn plain(path: &str, initial: &str) -> CreateRequest {
    CreateRequest { initial: Bytes::from(initial.to_owned()), ..create_req(path, "text/plain") }
}

fn fork(path: &str, source: &str, offset: Option<u64>) -> CreateRequest {
    contract::fork_req(path, source, offset, 0)
}

async fn append(e: &EmbeddedEngine, path: &str, data: &str) -> AppendOutcome {
    contract::append(e, append_req(path, data)).await
}

#[tokio::test]
async fn a_crash_between_fork_creation_and_its_first_append_loses_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let e = open_at(dir.path());
        e.create(plain("src", "hello ")).await.expect("src");
        append(&e, "src", "world").await;
        e.create(fork("f", "src", Some(6))).await.expect("fork");
        std::mem::forget(e); // crash: no shutdown, no final sync beyond what acknowledged
    }
    let copy = tempfile::tempdir().expect("tempdir");
    copy_dir(dir.path(), copy.path());
    let e = open_at(copy.path());
    assert_eq!(read_all(&e, "f").await, "hello ");
    assert_eq!(e.head("f", 0).await.expect("head").tail, Offset(6));
    // The source is still referenced by the recovered fork: deleting it soft-deletes it.
    e.delete("src", 0).await.expect("delete src");
    assert!(matches!(e.head("src", 0).await, Err(LookupError::Gone)));
    assert_eq!(append(&e, "f", "fork").await.next_offset, Offset(10));
    assert_eq!(read_all(&e, "f").await, "hello fork");
}


/// Bytes allocated on disk below `dir`, journals excluded (they are preallocated and recycled;
/// what a fork costs shows in the tables once memtables are flushed).
fn allocated_bytes(dir: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    for entry in std::fs::read_dir(dir).expect("read_dir") {
        let entry = entry.expect("entry");
        let meta = entry.metadata().expect("metadata");
        if meta.is_dir() {
            total += allocated_bytes(&entry.path());
        } else if entry.path().extension().is_none_or(|x| x != "jnl") {
            total += meta.blocks() * 512;
        }
    }
    total
}

#[tokio::test]
async fn a_fork_of_a_100_mb_stream_costs_metadata_not_data() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut opts = EmbeddedOptions::new(dir.path());
    opts.durability = Durability::Buffered; // writing 100 MB quickly; the measurement is disk use
    let e = EmbeddedEngine::open(opts).expect("open");
    e.create(CreateRequest { content_type: Some("application/octet-stream".into()), ..plain("big", "") })
        .await
        .expect("big");
    let chunk = Bytes::from(vec![7u8; 1 << 20]);
    for _ in 0..100 {
        e.append(AppendRequest::plain("big", "application/octet-stream", false, chunk.clone(), 0))
        .await
        .expect("append");
    }
    e.flush_to_tables().expect("flush");
    let before = allocated_bytes(dir.path());
    for i in 0..10 {
        e.create(fork(&format!("fork{i}"), "big", Some(50 << 20))).await.expect("fork");
    }
    e.flush_to_tables().expect("flush");
    let after = allocated_bytes(dir.path());
    let record = e.inner.ks.streams.get("fork0").expect("get").expect("fork0 meta").len() + "fork0".len();
    println!("a fork's whole persistent footprint is its metadata record: {record} B (key + value)");
    e.shutdown().await.expect("shutdown");
    drop(e);
    let per_fork = after.saturating_sub(before) / 10;
    println!("disk (journals excluded) before forks {before} B, after 10 forks {after} B: {per_fork} B per fork of a 100 MiB stream");
    assert!(before >= 100 << 20, "the source really holds 100 MiB ({before} B)");
    assert!(per_fork < 64 << 10, "a fork must not copy data: {per_fork} B per fork");
    let e = open_at(dir.path());
    let c = e.read("fork3", Offset((50 << 20) - 3), 16, 0).await.expect("read");
    assert_eq!(&c.data[..], &[7, 7, 7]);
    assert!(c.up_to_date());
}
