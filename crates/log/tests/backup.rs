//! Online backup: copies taken while appends, segment rotations and checkpoints go on each open
//! as one moment of the store: every append acknowledged before the copy began is in it, and
//! what it holds is a prefix of what was written, never a hole or a mix; producer state travels
//! with the data, so a producer's retry of the last append a copy holds is a duplicate there and
//! its next append is new.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use oncelog_log::backup::backup;
use oncelog_log::{Durability, LogEngine, LogOptions};
use oncelog_storage::contract::{create, create_req, produce, read_all};
use oncelog_storage::{AppendStatus, Engine};

const STREAMS: [&str; 2] = ["a", "b"];
/// Appends per stream, each stream written by its own producer.
const APPENDS: usize = 1_500;
/// Appends a producer has in flight at once (pipelined: they may reach the writer out of order).
const PIPELINE: usize = 8;

fn opts(dir: &std::path::Path) -> LogOptions {
    let mut o = LogOptions::new(dir);
    o.durability = Durability::Buffered;
    // Small segments and frequent checkpoints: rotations and segment deletions during the copies.
    o.segment_bytes = 64 << 10;
    o.checkpoint_bytes = 128 << 10;
    o
}

fn record(i: usize) -> String {
    format!("r{i:06};{}", "x".repeat(90))
}

#[test]
fn backups_taken_under_load_open_as_a_prefix_holding_every_earlier_acknowledgement() {
    oncelog_storage::contract::run(|| async {
        let root = tempfile::tempdir().expect("tempdir");
        let src = root.path().join("data");
        let engine = LogEngine::open(opts(&src)).expect("open");
        for s in STREAMS {
            create(&engine, create_req(s, "text/plain")).await;
        }
        // Per stream: how many of its producer's appends are acknowledged (all before it too).
        let acked: Arc<[AtomicUsize; 2]> = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
        let mut writers = Vec::new();
        for k in 0..STREAMS.len() {
            let (engine, acked) = (engine.clone(), acked.clone());
            writers.push(tokio::spawn(async move {
                for batch in (0..APPENDS).collect::<Vec<_>>().chunks(PIPELINE) {
                    let sends: Vec<_> = batch
                        .iter()
                        .map(|&seq| {
                            let engine = engine.clone();
                            tokio::spawn(async move {
                                engine.append(produce(STREAMS[k], &record(seq), &format!("p{k}"), 0, seq as u64)).await
                            })
                        })
                        .collect();
                    for send in sends {
                        assert_eq!(send.await.expect("join").expect("append").status, AppendStatus::Appended);
                    }
                    acked[k].store(batch[batch.len() - 1] + 1, Ordering::SeqCst);
                }
            }));
        }
        // Copies while the writer runs, each noting how much was acknowledged before it began.
        let mut copies = Vec::new();
        let mut restarts = 0;
        while writers.iter().any(|w| !w.is_finished()) || copies.is_empty() {
            let before = [acked[0].load(Ordering::SeqCst), acked[1].load(Ordering::SeqCst)];
            let dst = root.path().join(format!("copy{}", copies.len()));
            let (s, d) = (src.clone(), dst.clone());
            let report = tokio::task::spawn_blocking(move || backup(&s, &d)).await.expect("join").expect("backup");
            restarts += report.restarts;
            copies.push((dst, before));
        }
        for w in writers {
            w.await.expect("writer");
        }
        let mut full = Vec::new();
        for s in STREAMS {
            full.push(read_all(&engine, s, 1 << 20).await);
        }
        engine.shutdown().await.expect("shutdown");
        assert!(copies.len() >= 2, "only {} copies were taken under load", copies.len());
        for (dst, before) in &copies {
            let copy = LogEngine::open(opts(dst)).expect("a backup opens");
            for (k, s) in STREAMS.iter().enumerate() {
                let got = read_all(&copy, s, 1 << 20).await;
                assert!(full[k].starts_with(&got), "{}: stream {s} is not a prefix of the original", dst.display());
                assert!(
                    got.len() >= before[k] * record(0).len(),
                    "{}: stream {s} lost acknowledged appends",
                    dst.display()
                );
                // The copy's producer state matches its data: a retry of the last append it holds
                // is a duplicate at its end, and the next sequence number is new data.
                let held = got.len() / record(0).len();
                assert_eq!(got.len() % record(0).len(), 0, "whole appends only");
                let p = format!("p{k}");
                if held > 0 {
                    let dup = copy.append(produce(s, &record(held - 1), &p, 0, held as u64 - 1)).await.expect("retry");
                    assert_eq!(
                        (dup.status, dup.next_offset.0),
                        (AppendStatus::Duplicate, got.len() as u64),
                        "{}: {s}",
                        dst.display()
                    );
                }
                let next = copy.append(produce(s, &record(held), &p, 0, held as u64)).await.expect("next");
                assert_eq!(next.status, AppendStatus::Appended, "{}: {s}", dst.display());
            }
            copy.shutdown().await.expect("shutdown");
        }
        eprintln!("{} backups under load, {restarts} restarts", copies.len());
        // With the server stopped, a backup is the whole store.
        let last = root.path().join("stopped");
        backup(&src, &last).expect("backup");
        let copy = LogEngine::open(opts(&last)).expect("open");
        for (k, s) in STREAMS.iter().enumerate() {
            assert_eq!(read_all(&copy, s, 1 << 20).await, full[k]);
        }
        // A target that is not empty is refused.
        assert!(backup(&src, &last).is_err());
    });
}
