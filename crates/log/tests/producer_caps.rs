//! `--max-producers` inside a transaction: its checks and its appends compare the same producer
//! count, so a transaction whose checks passed is written whole. (Were each append to see the
//! producers the ones before it created, the last could be refused after its check passed: a
//! divergence, which stops the engine's writes.)

use bytes::Bytes;
use oncelog_log::{LogEngine, LogOptions};
use oncelog_protocol::headers::ProducerHeaders;
use oncelog_storage::rules::Retention;
use oncelog_storage::*;

fn produce(path: &str, id: &str) -> AppendRequest {
    let mut r = AppendRequest::plain(path, "text/plain", false, Bytes::from_static(b"x"), 10);
    r.producer = Some(ProducerHeaders { id: id.into(), epoch: 0, seq: 0 });
    r
}

#[tokio::test]
async fn a_transaction_of_new_producers_at_the_total_cap_is_decided_as_checked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut opts = LogOptions::new(dir.path());
    opts.retention = Retention { max_producers: 2, ..Retention::default() };
    let e = LogEngine::open(opts).expect("open");
    for path in ["a", "b", "c"] {
        let req = CreateRequest {
            path: path.into(),
            content_type: Some("text/plain".into()),
            expiry: None,
            fork: None,
            retention: Default::default(),
            compaction: false,
            closed: false,
            initial: Bytes::new(),
            json_framed: false,
            now_ms: 0,
        };
        e.create(req).await.expect("create");
    }
    e.append(produce("a", "p")).await.expect("one producer below the cap");
    // One slot left; the transaction's two new producers are both checked against it.
    let txn = TxnRequest { appends: vec![produce("b", "q"), produce("c", "r")], now_ms: 10, ..Default::default() };
    let out = e.transact(txn).await.expect("written whole, as checked");
    assert!(out.appends.iter().all(|o| o.status == AppendStatus::Appended));
    assert_eq!(e.readiness(), Readiness::Ready, "no divergence: writes go on");
    // Now the cap holds for the next new producer.
    assert!(matches!(
        e.append(produce("a", "s")).await,
        Err(AppendError::ProducerLimit { cap: ProducerCap::Total, limit: 2 })
    ));
    assert_eq!(e.stats().producers, 3);
}
