//! Space comes back after a trim: the next checkpoint drops the index entries below the earliest
//! offset and deletes the segments nothing else lives in — except what a fork still reads.

use std::time::{Duration, Instant};

use oncelog_log::{Durability, LogEngine, LogOptions};
use oncelog_protocol::Offset;
use oncelog_storage::contract::{append_req, create, create_req, fork_req};
use oncelog_storage::{AppendRequest, Engine};

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
        tail = e.append(AppendRequest { content_type: Some("text/plain".into()), ..append_req(path, &data) }).await.expect("append").next_offset;
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
        let kept = e.read("big", Offset(tail.0 - 2 * PIECE as u64), 1 << 20, 0).await.expect("read");
        assert_eq!(kept.data.len(), 2 * PIECE);

        // A fork of an early point keeps that range readable through trims of its source.
        create(&e, create_req("src", "text/plain")).await;
        let src_tail = fill(&e, "src", 40).await;
        let point = Offset(8 * PIECE as u64);
        create(&e, fork_req("f", "src", Some(point.0), 0)).await;
        let early = e.read("f", Offset::ZERO, 1 << 20, 0).await.expect("read").data;
        e.trim("src", src_tail, 0).await.expect("trim");
        fill(&e, "big", 20).await; // more writing, more segments, more checkpoints
        tokio::time::sleep(Duration::from_millis(200)).await;
        e.shutdown().await.expect("shutdown");
        drop(e);
        let e = LogEngine::open(opts(dir.path())).expect("reopen");
        assert_eq!(e.read("f", Offset::ZERO, 1 << 20, 0).await.expect("the fork still reads its range").data, early);
        assert!(e.read("src", Offset::ZERO, 1, 0).await.is_err(), "the source itself is trimmed");
    });
}
