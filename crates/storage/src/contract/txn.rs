//! Transactions: metadata and appends to several streams, all or nothing, durable together.

use super::*;

fn put(key: &str, value: &str) -> MetaWrite {
    MetaWrite { key: key.as_bytes().to_vec(), value: Some(Bytes::from(value.to_owned())) }
}

fn del(key: &str) -> MetaWrite {
    MetaWrite { key: key.as_bytes().to_vec(), value: None }
}

async fn meta<E: Engine>(e: &E, prefix: &str) -> Vec<(String, String)> {
    let all = e.meta_scan(prefix.as_bytes()).await.expect("meta scan");
    all.into_iter()
        .map(|(k, v)| (String::from_utf8(k).expect("utf-8 key"), String::from_utf8(v.to_vec()).expect("utf-8 value")))
        .collect()
}

fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
    items.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

pub async fn transactions_commit_metadata_and_appends_together<H: Harness>() {
    let mut h = H::open().await;
    let e = h.engine();
    create(e, create_req("in", "text/plain")).await;
    create(e, create_req("out", "text/plain")).await;
    append(e, append_req("in", "abc")).await;

    let txn = TxnRequest {
        meta: vec![put("sub/a", "one"), put("cur/a/in", "3"), put("other", "x")],
        appends: vec![produce("out", "hello", "w", 1, 0), append_req("in", "de")],
        ..Default::default()
    };
    let done = e.transact(txn.clone()).await.expect("transact");
    assert_eq!(done.appends.len(), 2);
    assert_eq!((done.appends[0].status, done.appends[0].next_offset), (AppendStatus::Appended, Offset(5)));
    assert_eq!(done.appends[0].producer, Some((1, 0)));
    assert_eq!((done.appends[1].status, done.appends[1].next_offset), (AppendStatus::Appended, Offset(5)));
    assert_eq!(read_all(e, "out", 1 << 20).await, "hello");
    assert_eq!(read_all(e, "in", 1 << 20).await, "abcde");
    // Prefix scans are in key order.
    assert_eq!(meta(e, "").await, pairs(&[("cur/a/in", "3"), ("other", "x"), ("sub/a", "one")]));
    assert_eq!(meta(e, "sub/").await, pairs(&[("sub/a", "one")]));

    // The same transaction again: the producer append is a duplicate (nothing written), the
    // plain one is written again, the metadata rewritten.
    let again = e.transact(txn).await.expect("transact again");
    assert_eq!((again.appends[0].status, again.appends[0].next_offset), (AppendStatus::Duplicate, Offset(5)));
    assert_eq!(again.appends[1].next_offset, Offset(7));
    assert_eq!(read_all(e, "out", 1 << 20).await, "hello");

    // A transaction of metadata only; deletes; guards that hold.
    let guarded = TxnRequest {
        expect: vec![(b"sub/a".to_vec(), Some(Bytes::from_static(b"one"))), (b"nothing".to_vec(), None)],
        meta: vec![put("sub/a", "two"), del("other"), del("never-there")],
        ..Default::default()
    };
    assert!(e.transact(guarded).await.expect("guarded").appends.is_empty());
    assert_eq!(meta(e, "").await, pairs(&[("cur/a/in", "3"), ("sub/a", "two")]));

    // Everything survives a reopen.
    h.reopen().await;
    let e = h.engine();
    assert_eq!(meta(e, "").await, pairs(&[("cur/a/in", "3"), ("sub/a", "two")]));
    assert_eq!(read_all(e, "out", 1 << 20).await, "hello");
    // Producer state written by a transaction is the stream's producer state.
    let retry = e.append(produce("out", "hello", "w", 1, 0)).await.expect("retry");
    assert_eq!(retry.status, AppendStatus::Duplicate);
    let stale = e.append(produce("out", "zombie", "w", 0, 5)).await;
    assert!(matches!(stale, Err(AppendError::ProducerFenced { current_epoch: 1 })), "{stale:?}");
}

pub async fn a_refused_transaction_writes_nothing<H: Harness>() {
    let mut h = H::open().await;
    let e = h.engine();
    create(e, create_req("a", "text/plain")).await;
    create(e, create_req("b", "text/plain")).await;
    append(e, produce("b", "x", "p", 2, 0)).await;
    create(e, create_req("closed", "text/plain")).await;
    append(e, close_req("closed")).await;
    e.transact(TxnRequest { meta: vec![put("k", "v0")], ..Default::default() }).await.expect("seed");

    let base = || TxnRequest {
        meta: vec![put("k", "v1"), put("new", "n")],
        appends: vec![append_req("a", "first")],
        ..Default::default()
    };
    let refusals: Vec<(TxnRequest, &str)> = vec![
        (TxnRequest { appends: vec![append_req("a", "first"), append_req("closed", "late")], ..base() }, "closed"),
        (TxnRequest { appends: vec![append_req("a", "first"), append_req("missing", "x")], ..base() }, "missing"),
        (TxnRequest { appends: vec![append_req("a", "first"), produce("b", "zombie", "p", 1, 0)], ..base() }, "fenced"),
        // No parking inside a transaction: a sequence number ahead is a gap at once.
        (TxnRequest { appends: vec![append_req("a", "first"), produce("b", "early", "p", 2, 5)], ..base() }, "gap"),
        (TxnRequest { appends: vec![append_req("a", "first"), append_req("a", "second")], ..base() }, "repeated"),
        (TxnRequest { expect: vec![(b"k".to_vec(), Some(Bytes::from_static(b"stale")))], ..base() }, "conflict"),
        (TxnRequest { expect: vec![(b"k".to_vec(), None)], ..base() }, "conflict on absent"),
        (
            TxnRequest { meta: vec![MetaWrite { key: vec![b'k'; MAX_META_KEY_BYTES + 1], value: None }], ..base() },
            "key too large",
        ),
    ];
    for (txn, why) in refusals {
        let r = e.transact(txn).await;
        match (why, &r) {
            ("closed", Err(TxnError::Append { index: 1, error: AppendError::Closed { .. } }))
            | ("missing", Err(TxnError::Append { index: 1, error: AppendError::NotFound }))
            | ("fenced", Err(TxnError::Append { index: 1, error: AppendError::ProducerFenced { current_epoch: 2 } }))
            | (
                "gap",
                Err(TxnError::Append { index: 1, error: AppendError::ProducerSeqGap { expected: 1, received: 5 } }),
            )
            | ("repeated", Err(TxnError::RepeatedStream { index: 1 }))
            | ("conflict" | "conflict on absent", Err(TxnError::Conflict { .. }))
            | ("key too large", Err(TxnError::TooLarge)) => {}
            _ => panic!("{why}: unexpected answer {r:?}"),
        }
        assert_eq!(read_all(e, "a", 1 << 20).await, "", "{why}: nothing appended");
        assert_eq!(read_all(e, "b", 1 << 20).await, "x", "{why}");
        assert_eq!(meta(e, "").await, pairs(&[("k", "v0")]), "{why}: no metadata written");
    }
    h.reopen().await;
    let e = h.engine();
    assert_eq!(read_all(e, "a", 1 << 20).await, "");
    assert_eq!(meta(e, "").await, pairs(&[("k", "v0")]));
    // The producer's next sequence number is still 1: nothing of the refused ones counted.
    assert_eq!(append(e, produce("b", "y", "p", 2, 1)).await.status, AppendStatus::Appended);
}

/// A producer append that arrived ahead of its sequence and waits for its predecessor lands
/// when a transaction commits that predecessor, before its wait ([`crate::rules::PARK_TIMEOUT`])
/// runs out: the transaction's outputs and a plain `POST` of the same producer are one sequence.
/// (At the timeout it would be decided again and land too, a park timeout late.)
pub async fn a_transaction_releases_the_appends_waiting_for_it<H: Harness>() {
    use std::time::{Duration, Instant};
    let h = H::open().await;
    let e = h.engine();
    create(e, create_req("out", "text/plain")).await;
    let started = Instant::now();
    let (early, committed) =
        tokio::join!(async { (e.append(produce("out", "b", "w", 0, 1)).await, started.elapsed()) }, async {
            tokio::time::sleep(Duration::from_millis(30)).await;
            let txn = TxnRequest {
                meta: vec![put("cur", "1")],
                appends: vec![produce("out", "a", "w", 0, 0)],
                ..Default::default()
            };
            e.transact(txn).await
        });
    let committed = committed.expect("transaction");
    assert_eq!(committed.appends[0].next_offset, Offset(1));
    let (early, waited) = (early.0.expect("released, not a gap"), early.1);
    assert_eq!((early.status, early.next_offset, early.producer), (AppendStatus::Appended, Offset(2), Some((0, 1))));
    assert!(waited < crate::rules::PARK_TIMEOUT, "released by the transaction, not by its timeout: waited {waited:?}");
    assert_eq!(read_all(e, "out", 1 << 20).await, "ab");
}

pub async fn listed_streams_are_the_visible_ones<H: Harness>() {
    let h = H::open().await;
    let e = h.engine();
    for p in ["jobs/b", "jobs/a", "jobs/a/x", "other", "jobsx"] {
        create(e, create_req(p, "text/plain")).await;
    }
    append(e, append_req("jobs/a", "12345")).await;
    e.delete("jobs/b", 0).await.expect("delete");
    let listed = e.list_streams("jobs/", 0).await.expect("list");
    let paths: Vec<&str> = listed.iter().map(|l| l.path.as_str()).collect();
    assert_eq!(paths, ["jobs/a", "jobs/a/x"]);
    assert_eq!(listed[0].info.tail, Offset(5));
    assert_eq!(e.list_streams("", 0).await.expect("list").len(), 4);
    // An expired stream is not listed.
    create(
        e,
        CreateRequest {
            expiry: Some(oncelog_protocol::headers::Expiry::At(1_000)),
            ..create_req("jobs/c", "text/plain")
        },
    )
    .await;
    assert_eq!(e.list_streams("jobs/", 999).await.expect("list").len(), 3);
    assert_eq!(e.list_streams("jobs/", 1_000).await.expect("list").len(), 2);
}
