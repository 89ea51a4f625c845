//! Two `oncelog serve` processes over one PostgreSQL database: exactly-once across nodes while
//! one node is SIGKILLed and restarted, and while the database itself crashes and comes back.
//!
//! Load in both scenarios: [`PRODUCERS`] idempotent producers on one stream, each with
//! [`IN_FLIGHT`] requests in flight; request `seq` of producer `i` goes to node `(i + seq) % 2`
//! and every retry of it (same epoch, seq and body) to the other node in turn, until it is
//! acknowledged (200, or 204 for a duplicate). Readers (SSE and long-poll, through the client
//! library with unlimited retries) tail the stream through one node. At the end the stream is
//! closed and:
//! - every acknowledged `(producer, seq)` is in the stream exactly once, ending at the offset
//!   its acknowledgement gave, and nothing else is (no record twice, none never sent), in
//!   sequence order per producer;
//! - every reader saw exactly the final stream's bytes.
//!
//! Nodes, clusters, load and check are in `common::pg` and `common::load` (shared with
//! failover.rs).
//!
//! Needs `ONCELOG_TEST_POSTGRES_URL` (see crates/postgres/tests/common); the database-restart
//! scenario starts its own cluster with `scripts/postgres`, so the shared one is never crashed.
//! Unix only (signals). The two scenarios hold one lock: the machine has two cores.

#![cfg(unix)]

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::load::{check_stream, close_stream, create_stream, producer, read_all, readyz, tail, Load, Route, Tally};
use common::pg::{database_url, Cluster, Node};
use oncelog_client::LiveMode;
use reqwest::StatusCode;

const STREAM: &str = "two-nodes";
const PRODUCERS: usize = 8;
const IN_FLIGHT: usize = 4;

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn schema(tag: &str) -> String {
    common::pg::schema("two_nodes", tag)
}

async fn ready(base: &str) -> Option<StatusCode> {
    readyz(base).await.map(|(s, _)| s)
}

/// Runs the load for `run`, calling `disturb` meanwhile; then drains, closes, and checks.
async fn scenario<F, Fut>(urls: Vec<String>, reader_base: String, run: Duration, disturb: F) -> (Tally, usize)
where
    F: FnOnce(Arc<AtomicBool>) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    create_stream(&urls[0], STREAM).await;
    let give_up = Instant::now() + run + Duration::from_secs(90);
    let load =
        Load { stream: STREAM.into(), urls: Arc::new(urls), route: Route::Alternate, in_flight: IN_FLIGHT, give_up };
    let tally = Arc::new(Mutex::new(Tally::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = [LiveMode::Sse, LiveMode::Sse, LiveMode::Sse, LiveMode::LongPoll, LiveMode::LongPoll]
        .into_iter()
        .map(|m| {
            let sink = Arc::new(Mutex::new(Vec::new()));
            (sink.clone(), tokio::spawn(tail(reader_base.clone(), STREAM.into(), m, sink)))
        })
        .collect();
    let producers: Vec<_> =
        (0..PRODUCERS).map(|i| tokio::spawn(producer(i, load.clone(), None, stop.clone(), tally.clone()))).collect();
    let disturbing = disturb(stop.clone());
    let timer = async {
        tokio::time::sleep(run).await;
    };
    tokio::join!(disturbing, timer);
    stop.store(true, Ordering::Relaxed);
    for p in producers {
        p.await.expect("producer");
    }
    let tally = Arc::try_unwrap(tally).ok().expect("producers done").into_inner().expect("tally");
    let unacked = Instant::now() >= load.give_up;
    assert!(!unacked, "some requests were never acknowledged");
    assert!(tally.wrong.is_empty(), "answers that must not happen: {:?}", &tally.wrong[..tally.wrong.len().min(5)]);
    close_stream(&reader_base, STREAM).await;
    let whole = read_all(&reader_base, STREAM).await;
    let records = check_stream(&whole, &tally);
    for (k, (sink, r)) in readers.into_iter().enumerate() {
        tokio::time::timeout(Duration::from_secs(60), r)
            .await
            .expect("reader ends at EOF")
            .expect("reader")
            .expect("reader error");
        let got = sink.lock().expect("sink").clone();
        assert!(got == whole, "reader {k} saw {} bytes, the stream holds {}", got.len(), whole.len());
    }
    (tally, records)
}

#[test]
fn a_node_killed_mid_run_loses_and_duplicates_nothing() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let db = database_url();
    let schema = schema("kill");
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let a = Arc::new(Mutex::new(Node::start(&db, &schema, dir.path().join("a.log"))));
    let b = Node::start(&db, &schema, dir.path().join("b.log"));
    let (urls, b_url) = (vec![a.lock().expect("a").url(), b.url()], b.url());
    let kills = Arc::new(AtomicU64::new(0));
    let b_not_ready = Arc::new(AtomicU64::new(0));
    let (tally, records) = rt.block_on(async {
        let (a2, kills2, b_url2, not_ready) = (a.clone(), kills.clone(), b_url.clone(), b_not_ready.clone());
        scenario(urls, b_url.clone(), Duration::from_secs(16), move |_stop| async move {
            let killing = AtomicBool::new(true);
            let watch_b = async {
                while killing.load(Ordering::Relaxed) {
                    if ready(&b_url2).await != Some(StatusCode::OK) {
                        not_ready.fetch_add(1, Ordering::Relaxed);
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            };
            let killer = async {
                // Varied moments: right after a start, mid-load, after longer runs.
                for pause_ms in [700u64, 150, 1300, 40, 900, 2100, 300, 1000] {
                    tokio::time::sleep(Duration::from_millis(pause_ms)).await;
                    let a = a2.clone();
                    tokio::task::spawn_blocking(move || {
                        let mut a = a.lock().expect("a");
                        a.kill9();
                        std::thread::sleep(Duration::from_millis(200));
                        a.launch();
                    })
                    .await
                    .expect("restart");
                    kills2.fetch_add(1, Ordering::Relaxed);
                }
                killing.store(false, Ordering::Relaxed);
            };
            tokio::join!(watch_b, killer);
        })
        .await
    });
    eprintln!(
        "two nodes, node A SIGKILLed {}x: {} acknowledged, {records} records, {} retries, {} gap answers, {} 503s",
        kills.load(Ordering::Relaxed),
        tally.acked.len(),
        tally.retries,
        tally.gaps,
        tally.unavailable
    );
    assert_eq!(kills.load(Ordering::Relaxed), 8);
    assert!(tally.acked.len() > 100, "the load ran ({} acknowledged)", tally.acked.len());
    assert_eq!(b_not_ready.load(Ordering::Relaxed), 0, "node B stayed ready while A was killed");
}

#[test]
fn a_database_crash_mid_run_loses_and_duplicates_nothing() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let cluster = Cluster::start();
    let schema = schema("dbcrash");
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let a = Node::start(&cluster.url, &schema, dir.path().join("a.log"));
    let b = Node::start(&cluster.url, &schema, dir.path().join("b.log"));
    let urls = vec![a.url(), b.url()];
    let pg_dir = cluster.dir.path().to_owned();
    let outage_ready = Arc::new(Mutex::new(Vec::new()));
    let recovered_in = Arc::new(Mutex::new(None));
    let (tally, records) = rt.block_on(async {
        let (urls2, outage2, recovered2) = (urls.clone(), outage_ready.clone(), recovered_in.clone());
        scenario(urls.clone(), b.url(), Duration::from_secs(14), move |_stop| async move {
            tokio::time::sleep(Duration::from_secs(4)).await;
            let dir = pg_dir.clone();
            tokio::task::spawn_blocking(move || Cluster::run(&["crash"], &dir)).await.expect("crash");
            tokio::time::sleep(Duration::from_millis(1500)).await;
            for u in urls2.iter() {
                let r = ready(u).await;
                outage2.lock().expect("outage").push(r);
            }
            tokio::time::sleep(Duration::from_millis(1500)).await;
            let dir = pg_dir.clone();
            tokio::task::spawn_blocking(move || Cluster::run(&["start"], &dir)).await.expect("restart");
            let back = Instant::now();
            'wait: loop {
                let mut all = true;
                for u in urls2.iter() {
                    all &= ready(u).await == Some(StatusCode::OK);
                }
                if all {
                    *recovered2.lock().expect("recovered") = Some(back.elapsed());
                    break 'wait;
                }
                if back.elapsed() > Duration::from_secs(30) {
                    break 'wait;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await
    });
    let outage = outage_ready.lock().expect("outage").clone();
    let recovered = *recovered_in.lock().expect("recovered");
    eprintln!(
        "two nodes, database crashed for 3 s: {} acknowledged, {records} records, {} retries, {} 503s, readyz during the outage {outage:?}, both ready {recovered:?} after the restart",
        tally.acked.len(),
        tally.retries,
        tally.unavailable
    );
    assert_eq!(outage, vec![Some(StatusCode::SERVICE_UNAVAILABLE); 2], "both nodes report the outage on /readyz");
    assert!(
        recovered.is_some_and(|t| t < Duration::from_secs(10)),
        "both nodes ready again without a restart: {recovered:?}"
    );
    assert!(tally.unavailable > 0, "the outage was seen as 503s");
    assert!(tally.acked.len() > 100, "the load ran ({} acknowledged)", tally.acked.len());
    drop((a, b));
}
