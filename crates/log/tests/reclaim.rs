//! Space comes back after a trim: the next checkpoint drops the index entries below the earliest
//! offset and deletes the segments nothing else lives in — except what a fork still reads.

use std::time::{Duration, Instant};

use oncelog_log::{Durability, LogEngine, LogOptions};
use oncelog_protocol::Offset;
use oncelog_storage::contract::{append_req, create, create_req, fork_req};
use oncelog_storage::{AppendRequest, Engine, ReadRequest};

const PIECE: usize = 32 << 10;

fn opts(dir: &std::path::Path) -> LogOptions {
    let mut o = LogOptions::new(dir);
    o.durability = Durability::Buffered;
    o.segment_bytes = 128 << 10;
    o.hot_bytes = 0;
    o.reclaim_interval = Duration::ZERO;
    o
}

fn log_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir.join("log")).expect("log dir").filter_map(|e| e.ok()?.metadata().ok()).map(|m| m.len()).sum()
}

async fn fill(e: &LogEngine, path: &str, n: usize) -> Offset {
    let mut tail = Offset::ZERO;
    for i in 0..n {
        let data = format!("{:0width$}", i, width = PIECE);
        tail = e
            .append(AppendRequest { content_type: Some("text/plain".into()), ..append_req(path, &data) })
            .await
            .expect("append")
            .next_offset;
    }
    tail
}

#[test]
fn a_trim_gives_space_back_but_not_what_a_fork_reads() {
    oncelog_storage::contract::run(|| async {
        let dir = tempfile::tempdir().expect("tempdir");
        let e = LogEngine::open(opts(dir.path())).expect("open");
        create(&e, create_req("big", "text/plain")).await;
        let tail = fill(&e, "big", 80).await; // 2.5 MiB: about 20 segments
        let before = log_bytes(dir.path());
        e.trim("big", Offset(tail.0 - 2 * PIECE as u64), 0).await.expect("trim");
        // The writer checkpoints soon after the trim and deletes what nothing needs.
        let t0 = Instant::now();
        while log_bytes(dir.path()) > before / 4 && t0.elapsed() < Duration::from_secs(10) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let after = log_bytes(dir.path());
        assert!(after <= before / 4, "{before} bytes before the trim, {after} after");
        let kept = e.read(ReadRequest::new("big", Offset(tail.0 - 2 * PIECE as u64), 1 << 20, 0)).await.expect("read");
        assert_eq!(kept.data.len(), 2 * PIECE);

        // A fork of an early point keeps that range readable through trims of its source.
        create(&e, create_req("src", "text/plain")).await;
        let src_tail = fill(&e, "src", 40).await;
        let point = Offset(8 * PIECE as u64);
        create(&e, fork_req("f", "src", Some(point.0), 0)).await;
        let early = e.read(ReadRequest::new("f", Offset::ZERO, 1 << 20, 0)).await.expect("read").data;
        e.trim("src", src_tail, 0).await.expect("trim");
        fill(&e, "big", 20).await; // more writing, more segments, more checkpoints
        tokio::time::sleep(Duration::from_millis(200)).await;
        e.shutdown().await.expect("shutdown");
        drop(e);
        let e = LogEngine::open(opts(dir.path())).expect("reopen");
        assert_eq!(
            e.read(ReadRequest::new("f", Offset::ZERO, 1 << 20, 0)).await.expect("the fork still reads its range").data,
            early
        );
        assert!(e.read(ReadRequest::new("src", Offset::ZERO, 1, 0)).await.is_err(), "the source itself is trimmed");
    });
}

fn dir_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .expect("read_dir")
        .filter_map(|e| e.ok())
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

/// The space test, at default segment size and reclaim interval: 1 GiB in one stream,
/// trimmed to its last 10 MiB, while another stream keeps taking appends.
#[test]
fn a_gigabyte_trimmed_to_its_last_10_mb_leaves_under_100_mb_while_appends_continue() {
    oncelog_storage::contract::run(|| async {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut o = LogOptions::new(dir.path());
        o.durability = Durability::Buffered; // the test is about space, not about fsync speed
        let e = std::sync::Arc::new(LogEngine::open(o).expect("open"));
        create(&*e, create_req("big", "application/octet-stream")).await;
        create(&*e, create_req("live", "text/plain")).await;
        let chunk = bytes::Bytes::from(vec![b'x'; 1 << 20]);
        let mut tail = Offset::ZERO;
        for _ in 0..1024 {
            let req = AppendRequest {
                content_type: Some("application/octet-stream".into()),
                data: chunk.clone(),
                ..append_req("big", "")
            };
            tail = e.append(req).await.expect("append").next_offset;
        }
        let written = dir_bytes(dir.path());
        assert!(written >= 1 << 30, "{written} bytes on disk after writing 1 GiB");
        // Appends go on through the trim and the reclamation.
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = {
            let (e, stop) = (e.clone(), stop.clone());
            tokio::spawn(async move {
                let mut n = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    e.append(append_req("live", "tick\n")).await.expect("appends continue");
                    n += 1;
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                n
            })
        };
        let keep = 10 << 20;
        let t0 = Instant::now();
        e.trim("big", Offset(tail.0 - keep), 0).await.expect("trim");
        let limit = Duration::from_secs(30);
        while dir_bytes(dir.path()) >= 100 << 20 && t0.elapsed() < limit {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let (took, after) = (t0.elapsed(), dir_bytes(dir.path()));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let ticks = writer.await.expect("writer");
        println!("space: {written} bytes before the trim, {after} bytes {took:?} after it; {ticks} appends meanwhile");
        assert!(after < 100 << 20, "{after} bytes after {took:?} (bound: 100 MB within {limit:?})");
        assert!(ticks > 0);
        let last = e.read(ReadRequest::new("big", Offset(tail.0 - keep), 1 << 30, 0)).await.expect("the kept 10 MiB");
        assert_eq!(last.data.len() as u64, keep);
        assert_eq!(e.head("live", 0).await.expect("head").tail, Offset(ticks * 5));
    });
}
