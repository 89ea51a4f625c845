//! Several engines (as several nodes would open them) on one schema: what only this engine must
//! get right. Each scenario opens its own schema; see `common` for the database they need.

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use oncelog_postgres::PgEngine;
use oncelog_protocol::Offset;
use oncelog_storage::contract::{self, append_req, create_req, produce};
use oncelog_storage::*;

async fn nodes(n: usize) -> (String, Vec<PgEngine>) {
    let schema = common::fresh_schema();
    let mut engines = Vec::new();
    for _ in 0..n {
        engines.push(PgEngine::open(common::options(&schema)).await.expect("open"));
    }
    (schema, engines)
}

#[test]
fn nodes_starting_at_once_migrate_a_schema_once() {
    contract::run(|| async {
        let schema = common::fresh_schema();
        let opens = (0..4).map(|_| PgEngine::open(common::options(&schema)));
        let engines: Vec<PgEngine> =
            futures_util::future::join_all(opens).await.into_iter().map(|r| r.expect("open")).collect();
        let client = common::session().await;
        let rows = client
            .query(&format!("SELECT version FROM {schema}.oncelog_schema ORDER BY version"), &[])
            .await
            .expect("versions");
        let versions: Vec<i32> = rows.iter().map(|r| r.get(0)).collect();
        assert_eq!(
            versions,
            (1..=oncelog_postgres::schema::SCHEMA_VERSION).collect::<Vec<_>>(),
            "each migration applied once"
        );
        // And every engine works on it.
        contract::create(&engines[0], create_req("s", "text/plain")).await;
        for e in &engines {
            contract::append(e, append_req("s", "x")).await;
        }
        assert_eq!(engines[3].head("s", 0).await.expect("head").tail, Offset(4));
    });
}

#[test]
fn a_commit_on_one_node_is_announced_to_the_others() {
    contract::run(|| async {
        let (schema, e) = nodes(1).await;
        let info = contract::create(&e[0], create_req("s", "text/plain")).await;
        // A bystander listening on the cluster's channel, as another node does.
        let (cfg, tls) = oncelog_postgres::driver_config(&common::url()).expect("test URL");
        let (client, mut conn) = cfg.connect(tls).await.expect("connect");
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut m = futures_util::stream::poll_fn(move |cx| conn.poll_message(cx));
            while let Some(Ok(msg)) = m.next().await {
                if let tokio_postgres::AsyncMessage::Notification(n) = msg {
                    let _ = tx.send(n.payload().to_owned());
                }
            }
        });
        let mut channel = format!("oncelog_{schema}");
        channel.truncate(63);
        client.batch_execute(&format!("LISTEN {channel}")).await.expect("listen");
        contract::append(&e[0], append_req("s", "abc")).await;
        let payload =
            tokio::time::timeout(Duration::from_secs(5), rx.recv()).await.expect("a notification").expect("payload");
        let ids: Vec<&str> = payload.split(' ').skip(1).collect();
        assert_eq!(ids, vec![format!("{:x}", info.id)], "{payload}");
    });
}

#[test]
fn a_reader_on_one_node_wakes_for_an_append_on_another() {
    contract::run(|| async {
        let (_, e) = nodes(2).await;
        contract::create(&e[0], create_req("s", "text/plain")).await;
        let started = Instant::now();
        let (w, _) = tokio::join!(e[1].wait("s", Offset::ZERO, Duration::from_secs(20), 0), async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            contract::append(&e[0], append_req("s", "abc")).await
        });
        assert!(matches!(w, Ok(WaitOutcome::Changed(ref i)) if i.tail == Offset(3)), "{w:?}");
        // Far sooner than the waiter's own last-resort re-read (5 s).
        assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
        // A delete on one node ends a wait on the other with not-found.
        let (w, _) = tokio::join!(e[1].wait("s", Offset(3), Duration::from_secs(20), 0), async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            e[0].delete("s", 0).await
        });
        assert!(matches!(w, Err(LookupError::NotFound)), "{w:?}");
    });
}

#[test]
fn pipelined_producer_requests_spread_over_nodes_wait_for_their_predecessors() {
    contract::run(|| async {
        let (_, e) = nodes(2).await;
        contract::create(&e[0], create_req("s", "text/plain")).await;
        for round in 0..5u64 {
            let base = round * 2;
            // seq base+1 reaches node B first; its predecessor lands on node A 50 ms later.
            let (later, earlier) = tokio::join!(e[1].append(produce("s", "b", "p", 0, base + 1)), async {
                tokio::time::sleep(Duration::from_millis(50)).await;
                e[0].append(produce("s", "a", "p", 0, base)).await
            });
            let (later, earlier) = (later.expect("no spurious gap"), earlier.expect("append"));
            assert_eq!(
                (earlier.status, later.status),
                (AppendStatus::Appended, AppendStatus::Appended),
                "round {round}"
            );
            assert!(later.next_offset > earlier.next_offset, "applied in sequence order");
        }
        assert_eq!(contract::read_all(&e[0], "s", 64).await, "ab".repeat(5));
        // A real gap is still answered, after the park timeout.
        let r = e[1].append(produce("s", "x", "p", 0, 20)).await;
        assert!(matches!(r, Err(AppendError::ProducerSeqGap { expected: 10, received: 20 })), "{r:?}");
    });
}

#[test]
fn guards_on_an_absent_key_let_exactly_one_node_win() {
    contract::run(|| async {
        let (_, e) = nodes(2).await;
        for round in 0..10 {
            let key = format!("k{round}").into_bytes();
            let txn = |v: &'static str| TxnRequest {
                expect: vec![(key.clone(), None)],
                meta: vec![MetaWrite { key: key.clone(), value: Some(Bytes::from_static(v.as_bytes())) }],
                ..Default::default()
            };
            let (a, b) = tokio::join!(e[0].transact(txn("a")), e[1].transact(txn("b")));
            let won = [a.is_ok(), b.is_ok()];
            assert_eq!(won.iter().filter(|w| **w).count(), 1, "round {round}: {a:?} {b:?}");
            let loser = if won[0] { b } else { a };
            assert!(matches!(loser, Err(TxnError::Conflict { .. })), "round {round}: {loser:?}");
        }
    });
}

#[test]
fn every_node_may_sweep_expired_streams_but_each_goes_once() {
    contract::run(|| async {
        let (_, e) = nodes(2).await;
        let t0 = 1_000_000;
        for i in 0..40 {
            let req = CreateRequest {
                expiry: Some(oncelog_protocol::headers::Expiry::At(t0 + 1_000)),
                now_ms: t0,
                ..create_req(&format!("s{i}"), "text/plain")
            };
            contract::create(&e[i % 2], req).await;
        }
        let (a, b) = tokio::join!(e[0].expire(t0 + 2_000), e[1].expire(t0 + 2_000));
        assert_eq!(a.expect("sweep") + b.expect("sweep"), 40, "each expired stream removed by exactly one node");
        assert!(e[0].list_streams("", t0).await.expect("list").is_empty());
    });
}

#[test]
fn counts_include_every_nodes_changes_after_a_refresh() {
    contract::run(|| async {
        let (_, e) = nodes(2).await;
        contract::create(&e[0], create_req("a", "text/plain")).await;
        contract::create(&e[0], create_req("b", "text/plain")).await;
        contract::append(&e[0], produce("a", "x", "p", 0, 0)).await;
        contract::create(&e[1], create_req("c", "text/plain")).await;
        assert_eq!(
            e[1].stats(),
            EngineStats { streams: 1, producers: 0, parked_appends: 0 },
            "B counts only what it did until it refreshes"
        );
        e[1].refresh_stats().await.expect("refresh");
        assert_eq!(e[1].stats(), EngineStats { streams: 3, producers: 1, parked_appends: 0 });
    });
}
