//! The guard on its own, against the test database: two transactions that read the same
//! position — the second waits for the first's row lock and then finds the position moved, so
//! it applies nothing; a stale position is refused outright; an absent row is the position 0.
//! A set-aside stream's position moves no further until its reason is cleared, and a positions
//! table made before set-aside existed gets its columns, and tables made before `stream_offset`
//! and `updated_at` get them once (a later start takes no lock). The database's own words in errors.

use std::time::Duration;

use oncelog_client::StreamOffset;
use oncelog_protocol::Offset;
use oncelog_sink::position::Stored;
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
    assert!(matches!(
        position::advance(&tx, &schema, "s", Offset(5), &t, p, 0).await,
        Err(SinkError::PositionMoved { .. })
    ));
    drop(tx);
    let tx = conn.transaction().await.expect("begin");
    position::advance(&tx, &schema, "s", Offset(10), &t, p, 0).await.expect("from the stored position");
    tx.commit().await.expect("commit");
    assert_eq!(position::read(&**conn, &schema, "s").await.expect("read"), Offset(20));
    conn.batch_execute(&format!("DROP SCHEMA {schema} CASCADE")).await.expect("drop the test schema");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_aside_stream_moves_no_further_and_an_old_positions_table_gets_the_columns() {
    let schema = schema();
    let target = Target::new(&url(), &schema, Duration::from_secs(10)).expect("target");
    let mut conn = target.conn().await.expect("conn");
    // The positions table as a sink made it before streams could be set aside.
    conn.batch_execute(&format!(
        "CREATE SCHEMA {schema};
         CREATE TABLE {schema}.positions (stream text PRIMARY KEY, next_offset text NOT NULL, position bigint NOT NULL,
            rows_applied bigint NOT NULL DEFAULT 0, lost_bytes bigint NOT NULL DEFAULT 0, updated_at timestamptz NOT NULL DEFAULT now());
         INSERT INTO {schema}.positions (stream, next_offset, position) VALUES ('s', '{}', 10)",
        StreamOffset::from(Offset(10))
    ))
    .await
    .expect("old table");
    target.prepare(&PostgresSink::new(&schema)).await.expect("prepare migrates it");
    assert_eq!(
        position::stored(&**conn, &schema, "s").await.expect("read"),
        Stored { position: Offset(10), set_aside: None }
    );

    let tx = conn.transaction().await.expect("begin");
    position::set_aside(&tx, &schema, "s", "ERROR 22P05: refused").await.expect("set aside");
    tx.commit().await.expect("commit");
    assert_eq!(
        position::stored(&**conn, &schema, "s").await.expect("read").set_aside.as_deref(),
        Some("ERROR 22P05: refused")
    );
    let tx = conn.transaction().await.expect("begin");
    let outcome =
        position::advance(&tx, &schema, "s", Offset(10), &StreamOffset::from(Offset(20)), Offset(20), 0).await;
    assert!(matches!(outcome, Err(SinkError::PositionMoved { .. })), "a set-aside stream does not move: {outcome:?}");
    drop(tx);
    conn.batch_execute(&format!("UPDATE {schema}.positions SET set_aside_reason = NULL WHERE stream = 's'"))
        .await
        .expect("resume");
    let tx = conn.transaction().await.expect("begin");
    position::advance(&tx, &schema, "s", Offset(10), &StreamOffset::from(Offset(20)), Offset(20), 0)
        .await
        .expect("moves once resumed");
    tx.commit().await.expect("commit");
    conn.batch_execute(&format!("DROP SCHEMA {schema} CASCADE")).await.expect("drop the test schema");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_show_the_database_s_own_words_not_the_driver_s_db_error() {
    let target = Target::new(&url(), &schema(), Duration::from_secs(10)).expect("target");
    let conn = target.conn().await.expect("conn");
    let refused = conn.query_one(r#"SELECT '{"bad":"\u0000"}'::jsonb"#, &[]).await.map(|_| ()).map_err(SinkError::from);
    let text = refused.err().map(|e| e.to_string()).unwrap_or_default();
    assert_eq!(text, "target database: ERROR 22P05: unsupported Unicode escape sequence; detail: \\u0000 cannot be converted to text.");
    // A connection that fails: the cause under the pool's and the driver's texts.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
    let away = Target::new(
        &format!("postgres://nobody@127.0.0.1:{closed}/db?sslmode=disable&connect_timeout=2"),
        "s",
        Duration::from_secs(5),
    )
    .expect("target");
    let text = away.conn().await.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(
        text.starts_with("target database connection: error connecting to server: ") && text.contains("refused"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tables_of_an_older_sink_get_stream_offset_and_updated_at_once_and_are_then_left_alone() {
    let schema = schema();
    let target = Target::new(&url(), &schema, Duration::from_secs(10)).expect("target");
    let conn = target.conn().await.expect("conn");
    // The tables as a sink made them before the column was renamed and `updated_at` added.
    conn.batch_execute(&format!(
        r#"CREATE SCHEMA {schema};
         CREATE TABLE {schema}.state (stream text NOT NULL, type text NOT NULL, key text NOT NULL,
            value jsonb NOT NULL, "offset" bigint NOT NULL, PRIMARY KEY (stream, type, key));
         CREATE TABLE {schema}.messages (stream text NOT NULL, "offset" bigint NOT NULL, value jsonb NOT NULL, PRIMARY KEY (stream, "offset"));
         CREATE TABLE {schema}.chunks (stream text NOT NULL, "offset" bigint NOT NULL, next_offset bigint NOT NULL, data bytea NOT NULL,
            PRIMARY KEY (stream, "offset"));
         INSERT INTO {schema}.state VALUES ('s', 't', 'k', '1', 7);
         INSERT INTO {schema}.messages VALUES ('m', 8, '2');
         INSERT INTO {schema}.chunks VALUES ('c', 0, 3, 'abc');"#
    ))
    .await
    .expect("old tables");
    drop(conn);
    target.prepare(&PostgresSink::new(&schema)).await.expect("prepare migrates them");
    let conn = target.conn().await.expect("conn");
    let columns = |table: &'static str| {
        let (conn, schema) = (&conn, &schema);
        async move {
            let rows = conn
                .query("SELECT column_name::text FROM information_schema.columns WHERE table_schema = $1 AND table_name = $2 ORDER BY ordinal_position", &[schema, &table])
                .await
                .expect("columns");
            rows.iter().map(|r| r.get::<_, String>(0)).collect::<Vec<_>>()
        }
    };
    assert_eq!(columns("state").await, ["stream", "type", "key", "value", "stream_offset", "updated_at"]);
    assert_eq!(columns("messages").await, ["stream", "stream_offset", "value"]);
    assert_eq!(columns("chunks").await, ["stream", "stream_offset", "next_offset", "data"]);
    // The rows are kept; the old state rows get the migration's time.
    let one = |sql: String| {
        let conn = &conn;
        async move { conn.query_one(&sql, &[]).await.expect("row").get::<_, i64>(0) }
    };
    assert_eq!(one(format!("SELECT stream_offset FROM {schema}.state WHERE updated_at IS NOT NULL")).await, 7);
    assert_eq!(one(format!("SELECT stream_offset FROM {schema}.messages")).await, 8);
    assert_eq!(one(format!("SELECT next_offset FROM {schema}.chunks WHERE stream_offset = 0")).await, 3);

    // Once done, a start changes nothing and takes no lock: a transaction that reads the tables
    // (as a frozen worker's might) does not hold it up, as an ALTER TABLE it would.
    let reader = Target::new(&url(), &schema, Duration::from_secs(10)).expect("target");
    let mut reading = reader.conn().await.expect("conn");
    let tx = reading.transaction().await.expect("begin");
    tx.batch_execute(&format!(
        "SELECT 1 FROM {schema}.state, {schema}.messages, {schema}.chunks, {schema}.positions LIMIT 1"
    ))
    .await
    .expect("read");
    let again = tokio::time::timeout(Duration::from_secs(3), target.prepare(&PostgresSink::new(&schema))).await;
    assert!(matches!(again, Ok(Ok(()))), "a second start waited or failed: {again:?}");
    drop(tx);
    conn.batch_execute(&format!("DROP SCHEMA {schema} CASCADE")).await.expect("drop the test schema");
}
