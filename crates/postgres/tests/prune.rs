//! Writer state on PostgreSQL stays bounded: the rows of idempotency keys past their window (and
//! of producers idle past their TTL) are deleted by the sweep's prune. Needs
//! `ONCELOG_TEST_POSTGRES_URL`.

mod common;

use bytes::Bytes;
use futures_util::future::join_all;
use oncelog_postgres::{PgEngine, PgOptions};
use oncelog_protocol::digest::KeyId;
use oncelog_protocol::headers::ProducerHeaders;
use oncelog_storage::rules::Retention;
use oncelog_storage::*;

const KEYED: u64 = 10_000;

async fn rows(schema: &str, table: &str) -> i64 {
    let client = common::session().await;
    client.query_one(&format!("SELECT count(*) FROM {schema}.{table}"), &[]).await.expect("count").get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_past_their_window_and_idle_producers_are_deleted() {
    let schema = common::fresh_schema();
    let retention = Retention { producer_ttl_ms: 60_000, idempotency_window_ms: 1_000, ..Retention::default() };
    let e = PgEngine::open(PgOptions { retention, ..common::options(&schema) }).await.expect("open");
    let create = CreateRequest {
        path: "k".into(),
        content_type: Some("text/plain".into()),
        expiry: None,
        fork: None,
        retention: RetentionRequest::default(),
        compaction: false,
        closed: false,
        initial: Bytes::new(),
        json_framed: false,
        now_ms: 0,
    };
    e.create(create).await.expect("create");
    // 10,000 keyed appends at t = 0..10 s, 200 at a time; and one producer at t = 0.
    for batch in 0..(KEYED / 200) {
        let appends = (0..200).map(|i| {
            let n = batch * 200 + i;
            let mut req =
                AppendRequest::plain("k", "text/plain", false, Bytes::from_static(b"x"), (n / 1_000) as i64 * 1_000);
            req.idempotency_key = Some(KeyId(u128::from(n) + 1));
            e.append(req)
        });
        for r in join_all(appends).await {
            assert_eq!(r.expect("append").status, AppendStatus::Appended);
        }
    }
    let mut req = AppendRequest::plain("k", "text/plain", false, Bytes::from_static(b"p"), 0);
    req.producer = Some(ProducerHeaders { id: "p".into(), epoch: 0, seq: 0 });
    e.append(req).await.expect("producer append");
    assert_eq!(rows(&schema, "idem_keys").await, KEYED as i64);
    assert_eq!(rows(&schema, "producers").await, 1);

    // Halfway: only the keys whose window ended go.
    let pruned = e.prune(5_500).await.expect("prune");
    assert_eq!(pruned, PruneOutcome { producers: 0, keys: 5_000 });
    assert_eq!(rows(&schema, "idem_keys").await, 5_000);
    // The window has passed for all of them; the producer is still within its TTL.
    let pruned = e.prune(11_000).await.expect("prune");
    assert_eq!(pruned, PruneOutcome { producers: 0, keys: 5_000 });
    assert_eq!((rows(&schema, "idem_keys").await, rows(&schema, "producers").await), (0, 1));
    // Past the TTL the producer's row goes too.
    let pruned = e.prune(60_000).await.expect("prune");
    assert_eq!(pruned, PruneOutcome { producers: 1, keys: 0 });
    assert_eq!(rows(&schema, "producers").await, 0);
    assert_eq!(e.stats().producers, 0);
    e.shutdown().await.expect("shutdown");
}
