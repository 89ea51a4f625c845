//! Memory follows the readers: the hot tail keeps a stream's new appends only while a reader
//! follows that stream live (waits at the tail or reads up to it). Writers alone keep nothing.

use std::time::Duration;

use oncelog_log::{Durability, LogEngine, LogOptions};
use oncelog_protocol::Offset;
use oncelog_storage::contract::{append_req, create, create_req};
use oncelog_storage::{Engine, ReadRequest};

fn engine(dir: &std::path::Path) -> LogEngine {
    let mut o = LogOptions::new(dir);
    o.durability = Durability::Buffered;
    o.hot_bytes = 1 << 20;
    LogEngine::open(o).expect("open")
}

#[test]
fn only_streams_read_live_keep_appends_in_memory() {
    oncelog_storage::contract::run(|| async {
        let dir = tempfile::tempdir().expect("tempdir");
        let e = engine(dir.path());
        create(&e, create_req("written", "text/plain")).await;
        create(&e, create_req("followed", "text/plain")).await;

        // No reader: a hundred appends leave the hot tail empty.
        for i in 0..100 {
            e.append(append_req("written", &format!("w{i:04}"))).await.expect("append");
        }
        assert_eq!(e.hot_tail_bytes(), 0, "appends nobody reads live stay out of memory");

        // A reader that caught up and waits at the tail: the next appends are kept for it.
        let tail = e.read(ReadRequest::new("followed", Offset::ZERO, 1 << 20, 0)).await.expect("read").next;
        let waiter = {
            let e = e.clone();
            tokio::spawn(async move { e.wait("followed", tail, Duration::from_secs(5), 0).await })
        };
        tokio::task::yield_now().await;
        for i in 0..10 {
            e.append(append_req("followed", &format!("f{i:04}"))).await.expect("append");
        }
        waiter.await.expect("join").expect("wait");
        assert_eq!(e.hot_tail_bytes(), 50, "ten 5-byte appends of a followed stream are in memory");
        let live = e.read(ReadRequest::new("followed", tail, 1 << 20, 0)).await.expect("read");
        assert_eq!(live.data.len(), 50);

        // The unread stream's appends still read back whole, from the file.
        let all = e.read(ReadRequest::new("written", Offset::ZERO, 1 << 20, 0)).await.expect("read");
        assert_eq!(all.data.len(), 500);
        assert_eq!(e.hot_tail_bytes(), 50, "a catch-up read does not fill memory with the past");
        e.shutdown().await.expect("shutdown");
    });
}
