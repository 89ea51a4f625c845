//! The guard on its own, against the test database: two transactions that read the same
//! position — the second waits for the first's row lock and then finds the position moved, so
//! it applies nothing; a stale position is refused outright; an absent row is the position 0.

use std::time::Duration;

use oncelog_client::StreamOffset;
use oncelog_protocol::Offset;
use oncelog_sink::{position, PostgresSink, SinkError, Target};

fn url() -> String {
    std::env::var("ONCELOG_TEST_POSTGRES_URL").unwrap_or_else(|_| {
        panic!("PostgreSQL tests need ONCELOG_TEST_POSTGRES_URL: ./scripts/test starts a private cluster and sets it; by hand: `url=$(scripts/postgres tls-url /tmp/pg) && ONCELOG_TEST_POSTGRES_URL=$url cargo test -p oncelog-sink`")
    })
}

fn schema() -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    format!("sink_pos_{}_{nanos}", std::process::id())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_two_transactions_from_one_position_only_the_first_moves_it() {
    let schema = schema();
    let target = Target::new(&url(), &schema, Duration::from_secs(10)).expect("target");
    target.prepare(&PostgresSink::new(&schema)).await.expect("prepare");
    let to = |n: u64| (StreamOffset::from(Offset(n)), Offset(n));

    let mut first = target.conn().await.expect("conn");
    let tx1 = first.transaction().await.expect("begin");
    let (t, p) = to(10);
    position::advance(&tx1, &schema, "s", Offset::ZERO, &t, p, 0).await.expect("the first moves it");

    // The second started from the same read: it waits on the row until the first commits.
    let (target2, schema2) = (target.clone(), schema.clone());
    let second = tokio::spawn(async move {
        let mut conn = target2.conn().await.expect("conn");
        let tx = conn.transaction().await.expect("begin");
        let (t, p) = (StreamOffset::from(Offset(10)), Offset(10));
        position::advance(&tx, &schema2, "s", Offset::ZERO, &t, p, 0).await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!second.is_finished(), "the second waits for the first's outcome");
    tx1.commit().await.expect("commit");
    let outcome = second.await.expect("task");
    assert!(matches!(outcome, Err(SinkError::PositionMoved { .. })), "{outcome:?}");

    // From the current position it moves; from a stale one it does not.
    let conn = target.conn().await.expect("conn");
    assert_eq!(position::read(&**conn, &schema, "s").await.expect("read"), Offset(10));
    drop(conn);
    let mut conn = target.conn().await.expect("conn");
    let tx = conn.transaction().await.expect("begin");
    let (t, p) = to(20);
    assert!(matches!(position::advance(&tx, &schema, "s", Offset(5), &t, p, 0).await, Err(SinkError::PositionMoved { .. })));
    drop(tx);
    let tx = conn.transaction().await.expect("begin");
    position::advance(&tx, &schema, "s", Offset(10), &t, p, 0).await.expect("from the stored position");
    tx.commit().await.expect("commit");
    assert_eq!(position::read(&**conn, &schema, "s").await.expect("read"), Offset(20));
    conn.batch_execute(&format!("DROP SCHEMA {schema} CASCADE")).await.expect("drop the test schema");
}
