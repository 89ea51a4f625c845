//! A node cut off from PostgreSQL does not hold the others hostage.
//!
//! Two `oncelog serve` nodes on the shared test database (over TLS, as `scripts/test` gives
//! it): node B connects directly, node A through a proxy that can go silent — it stops
//! forwarding in both directions and closes nothing, as a path that drops packets does
//! (`common::freeze`). Eight idempotent producers, four requests in flight each, on four
//! streams: on every stream one producer writes through A and one through B, so A's cut-off
//! transactions hold rows that B's appends need. After a warm-up A's path goes silent for
//! [`PARTITION`], then heals, and the load goes on a while.
//!
//! Checks:
//! - every request to B in flight at any moment while A was cut off took at most [`B_MAX_WAIT`] (PostgreSQL ends
//!   A's silent transactions and frees their rows: `idle_in_transaction_session_timeout`), and
//!   B's `/readyz` stayed 200 throughout;
//! - A answered every request in flight meanwhile within its deadline (`--pg-request-timeout-ms`, 5 s, plus the
//!   park time and slack: [`A_MAX_ANSWER`]), 503 while cut off, never hanging;
//! - no answer anywhere was a 500 or another status the protocol does not give here;
//! - A's `/readyz` is 200 again within [`A_READY_WITHIN`] of the heal;
//! - every acknowledged append is in its stream exactly once, at the offset its answer gave, in
//!   order per producer, and nothing that was never sent (`common::load::check_stream`).
//!
//! Mutant: `idle_in_transaction_session_timeout` as it was (15 s) → B's appends wait for A's
//! locks past [`B_MAX_WAIT`] and the test fails.

#![cfg(unix)]

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::freeze::FreezeProxy;
use common::load::{check_stream, read_all, readyz, record, Ack, Tally};
use common::pg::{database_url, schema, Node};
use reqwest::StatusCode;

const STREAMS: usize = 4;
const PRODUCERS: usize = 8;
const IN_FLIGHT: usize = 4;
const WARM_UP: Duration = Duration::from_secs(3);
const PARTITION: Duration = Duration::from_secs(20);
const AFTER_HEAL: Duration = Duration::from_secs(12);
const B_MAX_WAIT: Duration = Duration::from_secs(5);
const A_MAX_ANSWER: Duration = Duration::from_secs(7);
const A_READY_WITHIN: Duration = Duration::from_secs(10);
/// Requests not acknowledged by then fail the test.
const GIVE_UP: Duration = Duration::from_secs(120);

/// One answered request: which node, when it was sent, how long it took, what came back.
struct Attempt {
    node: usize,
    sent: Instant,
    took: Duration,
    status: Option<u16>,
}

struct Run {
    nodes: [String; 2],
    attempts: Mutex<Vec<Attempt>>,
    /// Per stream: acknowledgements and issued sequence numbers, for the exactly-once check.
    tallies: Vec<Mutex<Tally>>,
    wrong: Mutex<Vec<String>>,
    give_up: Instant,
}

fn stream(s: usize) -> String {
    format!("part-{s}")
}

fn offset_of(r: &reqwest::Response) -> Option<u64> {
    let token = r.headers().get("stream-next-offset")?.to_str().ok()?;
    token.split_once('_')?.1.parse().ok()
}

/// Request `seq` of producer `i` (stream `i % STREAMS`, node `i / STREAMS`), sent to its node
/// until acknowledged; every attempt recorded.
async fn send(run: Arc<Run>, http: reqwest::Client, i: usize, seq: u64) {
    let (s, node) = (i % STREAMS, i / STREAMS);
    while Instant::now() < run.give_up {
        let sent = Instant::now();
        let r = http
            .post(format!("{}/v1/stream/{}", run.nodes[node], stream(s)))
            .header("content-type", "text/plain")
            .header("producer-id", format!("p{i}"))
            .header("producer-epoch", "0")
            .header("producer-seq", seq.to_string())
            .body(record(i, seq))
            .timeout(Duration::from_secs(30))
            .send()
            .await;
        let took = sent.elapsed();
        let status = r.as_ref().ok().map(|r| r.status().as_u16());
        run.attempts.lock().expect("attempts").push(Attempt { node, sent, took, status });
        let pause = match r {
            Ok(r) if r.status() == StatusCode::OK || r.status() == StatusCode::NO_CONTENT => {
                let status = r.status().as_u16();
                match offset_of(&r) {
                    Some(offset) => {
                        run.tallies[s].lock().expect("tally").acked.entry((i, seq)).or_insert(Ack { status, offset });
                    }
                    None => {
                        run.wrong.lock().expect("wrong").push(format!("p{i} seq {seq}: {status} without an offset"))
                    }
                }
                return;
            }
            // A predecessor still on its way (or cut off with A): parked past its time.
            Ok(r) if r.status() == StatusCode::CONFLICT => Duration::from_millis(50),
            Ok(r) if r.status() == StatusCode::SERVICE_UNAVAILABLE => Duration::from_millis(200),
            Ok(r) => {
                let status = r.status();
                let body = r.text().await.unwrap_or_default();
                run.wrong
                    .lock()
                    .expect("wrong")
                    .push(format!("p{i} seq {seq} via node {node}: {status} {}", body.trim()));
                Duration::from_millis(200)
            }
            Err(e) => {
                run.wrong
                    .lock()
                    .expect("wrong")
                    .push(format!("p{i} seq {seq} via node {node}: no answer after {took:?}: {e}"));
                Duration::from_millis(200)
            }
        };
        tokio::time::sleep(pause).await;
    }
}

async fn producer(run: Arc<Run>, i: usize, stop: Arc<AtomicBool>) {
    let http = reqwest::Client::new();
    let window = Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT));
    let mut tasks = tokio::task::JoinSet::new();
    let mut seq = 0u64;
    while !stop.load(Ordering::Relaxed) && Instant::now() < run.give_up {
        let permit = window.clone().acquire_owned().await.expect("semaphore");
        run.tallies[i % STREAMS].lock().expect("tally").issued.insert(i, seq + 1);
        let run = run.clone();
        let http = http.clone();
        tasks.spawn(async move {
            send(run, http, i, seq).await;
            drop(permit);
        });
        seq += 1;
    }
    while tasks.join_next().await.is_some() {}
}

/// A's sessions, as PostgreSQL lists them.
const A_NAME: &str = "oncelog-partition-a";

/// Freezes A's path at a moment when one of A's transactions holds stream rows (so B needs
/// what A holds): freezes, asks the database whether a session of A sits idle in a transaction
/// holding row locks on `streams`, and if not, heals and tries again a moment later. Returns
/// when the path is frozen with such a transaction.
async fn cut_mid_transaction(proxy: &FreezeProxy, db: &str, schema: &str) -> Instant {
    let (cfg, tls) = oncelog_postgres::driver_config(db).expect("test URL");
    let (client, conn) = cfg.connect(tls).await.expect("a session to watch A's");
    tokio::spawn(conn);
    // pgrowlocks (contrib) lists the rows a transaction locked `FOR UPDATE`.
    client.batch_execute("CREATE EXTENSION IF NOT EXISTS pgrowlocks").await.expect("pgrowlocks");
    let sql = format!(
        "SELECT count(*) FROM pgrowlocks('{schema}.streams') r JOIN pg_stat_activity a ON a.pid = ANY(r.pids) \
         WHERE a.application_name = $1 AND a.state = 'idle in transaction'"
    );
    for attempt in 0..400u64 {
        proxy.freeze();
        let at = Instant::now();
        // What was on its way has arrived; A can send nothing more.
        tokio::time::sleep(Duration::from_millis(30)).await;
        let held: i64 = client.query_one(&sql, &[&A_NAME]).await.expect("pg_locks").get(0);
        if held > 0 {
            eprintln!("A's path cut with {held} stream rows locked by its transactions (try {})", attempt + 1);
            return at;
        }
        proxy.heal();
        tokio::time::sleep(Duration::from_millis(3 + attempt * 7 % 23)).await;
    }
    panic!("never caught a transaction of node A holding stream rows");
}

/// The database's address, from the test URL (`hostaddr`, else the host, and the port).
fn database_addr(url: &str) -> (SocketAddr, u16) {
    let (cfg, _) = oncelog_postgres::driver_config(url).expect("test URL");
    let port = cfg.get_ports().first().copied().unwrap_or(5432);
    let ip = cfg.get_hostaddrs().first().copied().unwrap_or(std::net::IpAddr::from([127, 0, 0, 1]));
    (SocketAddr::new(ip, port), port)
}

#[test]
fn a_node_cut_off_from_the_database_does_not_stall_the_others() {
    let db = database_url();
    let (db_addr, db_port) = database_addr(&db);
    let schema = schema("partition", "cut");
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let proxy = rt.block_on(FreezeProxy::start(db_addr));
    let via_proxy = db.replacen(&format!(":{db_port}/"), &format!(":{}/", proxy.addr.port()), 1);
    assert_ne!(via_proxy, db, "the test URL names the database's port as host:PORT/");
    let sep = if via_proxy.contains('?') { '&' } else { '?' };
    let via_proxy = format!("{via_proxy}{sep}application_name={A_NAME}");
    let b = Node::start(&db, &schema, dir.path().join("b.log"));
    let a = Node::start(&via_proxy, &schema, dir.path().join("a.log"));
    let run = Arc::new(Run {
        nodes: [a.url(), b.url()],
        attempts: Mutex::new(Vec::new()),
        tallies: (0..STREAMS).map(|_| Mutex::new(Tally::default())).collect(),
        wrong: Mutex::new(Vec::new()),
        give_up: Instant::now() + GIVE_UP,
    });
    let (cut, healed, b_unready, a_was_unready, a_ready_after) = rt.block_on(async {
        let http = reqwest::Client::new();
        for s in 0..STREAMS {
            let r = http
                .put(format!("{}/v1/stream/{}", run.nodes[1], stream(s)))
                .header("content-type", "text/plain")
                .send()
                .await
                .expect("create");
            assert!(r.status().is_success(), "create: {}", r.status());
        }
        let stop = Arc::new(AtomicBool::new(false));
        let producers: Vec<_> = (0..PRODUCERS).map(|i| tokio::spawn(producer(run.clone(), i, stop.clone()))).collect();
        tokio::time::sleep(WARM_UP).await;
        let cut = cut_mid_transaction(&proxy, &db, &schema).await;
        // Readiness of both nodes every 200 ms while A is cut off.
        let (mut b_unready, mut a_was_unready) = (Vec::new(), false);
        while cut.elapsed() < PARTITION {
            let (ra, rb) = tokio::join!(readyz(&run.nodes[0]), readyz(&run.nodes[1]));
            if rb.as_ref().map(|r| r.0) != Some(StatusCode::OK) {
                b_unready.push(format!("{:?} after {:?}", rb, cut.elapsed()));
            }
            a_was_unready |= ra.is_some_and(|r| r.0 == StatusCode::SERVICE_UNAVAILABLE);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        proxy.heal();
        let healed = Instant::now();
        let mut a_ready_after = None;
        while healed.elapsed() < AFTER_HEAL.max(A_READY_WITHIN + Duration::from_secs(5)) {
            if a_ready_after.is_none() && readyz(&run.nodes[0]).await.is_some_and(|r| r.0 == StatusCode::OK) {
                a_ready_after = Some(healed.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        stop.store(true, Ordering::Relaxed);
        for p in producers {
            p.await.expect("producer");
        }
        (cut, healed, b_unready, a_was_unready, a_ready_after)
    });

    let wrong = run.wrong.lock().expect("wrong").clone();
    assert!(wrong.is_empty(), "answers that must not happen: {:?}", &wrong[..wrong.len().min(5)]);
    let attempts = run.attempts.lock().expect("attempts");
    // In flight at some moment of the partition: answered after the cut, sent before the heal.
    let during = |a: &&Attempt| a.sent + a.took > cut && a.sent < healed;
    let b_during: Vec<&Attempt> = attempts.iter().filter(|a| a.node == 1).filter(during).collect();
    let a_during: Vec<&Attempt> = attempts.iter().filter(|a| a.node == 0).filter(during).collect();
    let b_slowest = b_during.iter().map(|a| a.took).max().unwrap_or_default();
    let a_slowest = a_during.iter().map(|a| a.took).max().unwrap_or_default();
    let statuses = |v: &[&Attempt]| {
        let mut m: BTreeMap<Option<u16>, usize> = BTreeMap::new();
        for a in v {
            *m.entry(a.status).or_default() += 1;
        }
        m
    };
    eprintln!(
        "partition of node A for {PARTITION:?}: node B answered {} requests meanwhile ({:?}), slowest {b_slowest:?}; \
         node A answered {} ({:?}), slowest {a_slowest:?}; A ready {a_ready_after:?} after the heal",
        b_during.len(),
        statuses(&b_during),
        a_during.len(),
        statuses(&a_during),
    );
    assert!(
        b_unready.is_empty(),
        "node B's /readyz was not 200 while A was cut off: {:?}",
        &b_unready[..b_unready.len().min(5)]
    );
    assert!(b_during.len() > 100, "node B kept appending while A was cut off ({} requests)", b_during.len());
    assert!(
        b_slowest <= B_MAX_WAIT,
        "a request to node B waited {b_slowest:?} while A was cut off (at most {B_MAX_WAIT:?})"
    );
    assert!(a_slowest <= A_MAX_ANSWER, "node A took {a_slowest:?} to answer while cut off (at most {A_MAX_ANSWER:?})");
    assert!(a_during.iter().any(|a| a.status == Some(503)), "node A answered 503 while cut off");
    assert!(a_was_unready, "node A's /readyz said 503 while it could not reach the database");
    let after = a_ready_after
        .unwrap_or_else(|| panic!("node A not ready within {:?} of the heal; log:\n{}", AFTER_HEAL, a.log_text()));
    assert!(after <= A_READY_WITHIN, "node A ready {after:?} after the heal (at most {A_READY_WITHIN:?})");
    drop(attempts);

    let mut records = 0;
    for s in 0..STREAMS {
        let bytes = rt.block_on(read_all(&run.nodes[1], &stream(s)));
        let tally = run.tallies[s].lock().expect("tally");
        let issued: u64 = tally.issued.values().sum();
        assert_eq!(tally.acked.len() as u64, issued, "stream {s}: every request issued was acknowledged");
        records += check_stream(&bytes, &tally);
    }
    eprintln!("{records} records, every acknowledged append exactly once");
    drop(proxy);
}
