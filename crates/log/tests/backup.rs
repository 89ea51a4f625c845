//! Online backup: copies taken while appends, segment rotations and checkpoints go on each open
//! as one moment of the store: every append acknowledged before the copy began is in it, and
//! what it holds is a prefix of what was written, never a hole or a mix.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use oncelog_log::backup::backup;
use oncelog_log::{Durability, LogEngine, LogOptions};
use oncelog_storage::contract::{append_req, create, create_req, read_all};
use oncelog_storage::Engine;

const STREAMS: [&str; 2] = ["a", "b"];
const APPENDS: usize = 3_000;

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
        let acked = Arc::new(AtomicUsize::new(0));
        let writer = {
            let (engine, acked) = (engine.clone(), acked.clone());
            tokio::spawn(async move {
                for i in 0..APPENDS {
                    engine.append(append_req(STREAMS[i % 2], &record(i))).await.expect("append");
                    acked.store(i + 1, Ordering::SeqCst);
                }
            })
        };
        // Copies while the writer runs, each noting how much was acknowledged before it began.
        let mut copies = Vec::new();
        let mut restarts = 0;
        while !writer.is_finished() || copies.is_empty() {
            let before = acked.load(Ordering::SeqCst);
            let dst = root.path().join(format!("copy{}", copies.len()));
            let (s, d) = (src.clone(), dst.clone());
            let report = tokio::task::spawn_blocking(move || backup(&s, &d)).await.expect("join").expect("backup");
            restarts += report.restarts;
            copies.push((dst, before));
        }
        writer.await.expect("writer");
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
                // Appends alternate between the streams: those acknowledged before the copy.
                let must = (0..*before).filter(|i| i % 2 == k).count();
                assert!(got.len() >= must * record(0).len(), "{}: stream {s} lost acknowledged appends", dst.display());
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
