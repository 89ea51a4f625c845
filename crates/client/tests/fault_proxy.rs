//! Exactly-once through a hostile network.
//!
//! A fault-injecting TCP proxy (below, plain tokio) sits between the client and a real Oncelog
//! server. At random it drops the connection after a request reached the server and before the
//! response got back (the case that makes naive retries duplicate), drops requests before they
//! reach the server, resets connections (RST), and delays traffic in both directions. Several
//! producers push 100,000 messages through it while an SSE reader follows the stream through it
//! too. Then:
//!
//! - the stream holds every message exactly once, each producer's messages in order;
//! - no producer wedged (everything finished inside the time limit, `flush` returned `Ok`);
//! - the SSE reader, reconnecting after every fault, saw exactly the stream's bytes.
//!
//! The figures are printed (run with `--nocapture` to see them).

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::TestServer;
use futures_util::StreamExt;
use oncelog_client::{Client, CreateOptions, LiveMode, ReadFrom, ReadOptions, RetryPolicy};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const PRODUCERS: usize = 4;
const MESSAGES: usize = 100_000;
const STREAM: &str = "chaos/exactly-once";
/// The whole run must finish well inside this; a wedged producer would not.
const TIME_LIMIT: Duration = Duration::from_secs(90);

/// Per-chunk fault probabilities, in parts per thousand.
#[derive(Debug, Clone, Copy)]
struct FaultPlan {
    /// Client → server: close both sides instead of forwarding (the request never arrives).
    drop_request: u64,
    /// Server → client: close both sides instead of forwarding (the server did the work).
    drop_response: u64,
    /// Server → client: reset the client connection (RST) instead of forwarding.
    reset: u64,
    /// Either direction: wait 1–25 ms before forwarding.
    delay: u64,
}

/// Faults injected, by kind.
#[derive(Debug, Default)]
struct FaultCounts {
    /// Connections accepted (each fault costs the client one).
    connections: AtomicU64,
    /// Requests that never reached the server.
    dropped_requests: AtomicU64,
    /// Responses lost after the server processed the request.
    dropped_responses: AtomicU64,
    /// Connections reset (RST) instead of answered.
    resets: AtomicU64,
    /// Chunks delayed.
    delays: AtomicU64,
}

/// How a proxied connection ended.
enum End {
    /// One side closed normally.
    Closed,
    /// Injected: close both sides.
    Drop,
    /// Injected: RST the client side.
    Reset,
}

struct Proxy {
    /// Where clients connect.
    addr: SocketAddr,
    /// What was injected, for the figures.
    counts: Arc<FaultCounts>,
}

impl Proxy {
    async fn start(upstream: SocketAddr, plan: FaultPlan) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy addr");
        let counts = Arc::new(FaultCounts::default());
        let c = counts.clone();
        tokio::spawn(async move {
            let mut seed = 0x2545_F491_4F6C_DD1D_u64;
            while let Ok((client, _)) = listener.accept().await {
                seed = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
                c.connections.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(proxy_connection(client, upstream, plan, c.clone(), seed));
            }
        });
        Proxy { addr, counts }
    }
}

fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// Forwards `from` to `to` chunk by chunk, injecting faults on the way.
async fn pump(
    from: &mut (impl AsyncReadExt + Unpin),
    to: &mut (impl AsyncWriteExt + Unpin),
    downstream: bool,
    plan: FaultPlan,
    counts: &FaultCounts,
    mut rng: u64,
) -> End {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => {
                let _ = to.shutdown().await;
                // Half-close: keep the other direction going.
                std::future::pending::<()>().await;
                return End::Closed;
            }
            Ok(n) => n,
        };
        let roll = xorshift(&mut rng) % 1000;
        if downstream {
            if roll < plan.drop_response {
                counts.dropped_responses.fetch_add(1, Ordering::Relaxed);
                return End::Drop;
            }
            if roll < plan.drop_response + plan.reset {
                counts.resets.fetch_add(1, Ordering::Relaxed);
                return End::Reset;
            }
        } else if roll < plan.drop_request {
            counts.dropped_requests.fetch_add(1, Ordering::Relaxed);
            return End::Drop;
        }
        if xorshift(&mut rng) % 1000 < plan.delay {
            counts.delays.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(1 + xorshift(&mut rng) % 25)).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return End::Closed;
        }
    }
}

async fn proxy_connection(mut client: TcpStream, upstream: SocketAddr, plan: FaultPlan, counts: Arc<FaultCounts>, seed: u64) {
    let Ok(mut server) = TcpStream::connect(upstream).await else { return };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let end = {
        let (mut cr, mut cw) = client.split();
        let (mut sr, mut sw) = server.split();
        tokio::select! {
            e = pump(&mut cr, &mut sw, false, plan, &counts, seed) => e,
            e = pump(&mut sr, &mut cw, true, plan, &counts, seed ^ 0xDEAD_BEEF) => e,
        }
    };
    if matches!(end, End::Reset) {
        // SO_LINGER 0: closing sends RST instead of FIN.
        let _ = client.set_zero_linger();
    }
    drop(client);
    drop(server);
}

/// A server with text stream `stream`, a proxy injecting `plan` in front of it, a client through
/// the proxy (retrying transient failures forever) and one straight to the server.
async fn chaos(stream: &str, plan: FaultPlan) -> (TestServer, Proxy, Client, Client) {
    let server = TestServer::start().await;
    let proxy = Proxy::start(server.addr, plan).await;
    let proxied = Client::builder(format!("http://{}/v1/stream", proxy.addr))
        .request_timeout(Duration::from_secs(10))
        .retry_policy(RetryPolicy::default().with_max_attempts(None).expect("policy"))
        .build()
        .expect("client");
    let direct = Client::new(&server.base).expect("client");
    direct.stream(stream).create(CreateOptions::content_type("text/plain")).await.expect("create");
    (server, proxy, proxied, direct)
}

fn message(producer: usize, n: usize) -> String {
    format!("p{producer}-{n:06}\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_through_a_faulty_network() {
    let (_server, proxy, proxied, direct) = chaos(STREAM, FaultPlan { drop_request: 15, drop_response: 40, reset: 15, delay: 40 }).await;
    let started = Instant::now();

    // A live reader through the proxy, from the beginning, until EOF.
    let reader_stream = proxied.stream(STREAM).with_content_type("text/plain");
    let reader = tokio::spawn(async move {
        let mut opts = ReadOptions::new(ReadFrom::Beginning, LiveMode::Sse);
        opts.retry = Some(RetryPolicy::default().with_max_attempts(None).expect("policy"));
        let mut chunks = reader_stream.read(opts);
        let mut got = Vec::new();
        while let Some(c) = chunks.next().await {
            got.extend_from_slice(&c.expect("the reader retries every transient failure").data);
        }
        got
    });

    let per_producer = MESSAGES / PRODUCERS;
    let mut tasks = Vec::new();
    for p in 0..PRODUCERS {
        let stream = proxied.stream(STREAM);
        tasks.push(tokio::spawn(async move {
            let producer = stream
                .producer(format!("chaos-{p}"))
                .content_type("text/plain")
                .max_batch_items(25)
                .linger(Duration::from_millis(1))
                .max_in_flight(5)
                .start()
                .await
                .expect("producer");
            for n in 0..per_producer {
                // Receipts are dropped: fire and forget; flush reports any failure.
                let _receipt = producer.append(message(p, n)).await.expect("append");
            }
            producer.flush().await.expect("flush: no error");
            producer.close().await.expect("close");
            producer.stats()
        }));
    }
    let stats = tokio::time::timeout(TIME_LIMIT, futures_util::future::join_all(tasks))
        .await
        .expect("a producer wedged: the run did not finish in time");
    let stats: Vec<_> = stats.into_iter().map(|r| r.expect("producer task")).collect();
    let produce_time = started.elapsed();
    direct.stream(STREAM).close().await.expect("close stream");

    // Verify the stream itself, read directly from the server.
    let mut stored = Vec::new();
    let mut all = direct.stream(STREAM).read(ReadOptions::default());
    while let Some(c) = all.next().await {
        stored.extend_from_slice(&c.expect("read").data);
    }
    let text = String::from_utf8(stored.clone()).expect("utf-8");
    let mut next_expected = [0usize; PRODUCERS];
    let mut seen: HashMap<(usize, usize), usize> = HashMap::new();
    let mut out_of_order = 0;
    for line in text.lines() {
        let (p, n) = line
            .strip_prefix('p')
            .and_then(|r| r.split_once('-'))
            .and_then(|(p, n)| Some((p.parse::<usize>().ok()?, n.parse::<usize>().ok()?)))
            .unwrap_or_else(|| panic!("garbage in the stream: {line:?}"));
        *seen.entry((p, n)).or_default() += 1;
        if n != next_expected[p] {
            out_of_order += 1;
        }
        next_expected[p] = n + 1;
    }
    let duplicates: usize = seen.values().map(|c| c - 1).sum();
    let lost = (0..PRODUCERS).flat_map(|p| (0..per_producer).map(move |n| (p, n))).filter(|k| !seen.contains_key(k)).count();

    let read_back = tokio::time::timeout(Duration::from_secs(30), reader).await.expect("reader ended at EOF").expect("reader task");
    let c = &proxy.counts;
    let total = |f: fn(&oncelog_client::ProducerStats) -> u64| stats.iter().map(f).sum::<u64>();
    println!(
        "fault proxy: {} messages from {PRODUCERS} producers in {:.1} s; {} batches, {} requests, {} retries \
         ({} answered as duplicates, {} gap waits); faults injected: {} dropped responses (after the server \
         processed the request), {} dropped requests, {} connection resets, {} delays, over {} connections; \
         stream: {} duplicates, {} lost, {} out of order; SSE reader through the proxy: {} bytes, identical: {}",
        seen.len(),
        produce_time.as_secs_f64(),
        total(|s| s.batches),
        total(|s| s.requests),
        total(|s| s.retries),
        total(|s| s.duplicates),
        total(|s| s.gap_waits),
        c.dropped_responses.load(Ordering::Relaxed),
        c.dropped_requests.load(Ordering::Relaxed),
        c.resets.load(Ordering::Relaxed),
        c.delays.load(Ordering::Relaxed),
        c.connections.load(Ordering::Relaxed),
        duplicates,
        lost,
        out_of_order,
        read_back.len(),
        read_back == stored,
    );
    assert_eq!(duplicates, 0, "a message was written twice");
    assert_eq!(lost, 0, "a message was lost");
    assert_eq!(out_of_order, 0, "a producer's messages are out of order");
    assert!(c.dropped_responses.load(Ordering::Relaxed) > 0 && c.resets.load(Ordering::Relaxed) > 0, "faults were injected");
    assert!(total(|s| s.duplicates) > 0, "some retries hit requests the server had already stored");
    assert_eq!(read_back, stored, "the SSE reader saw exactly the stream");
}

/// Writers that keep no counter: each append carries a fresh `Idempotency-Key` and is retried
/// through the faulty proxy until acknowledged, and every append is also sent a second time on
/// its own (a duplicating network or an impatient user). Every append is in the stream exactly
/// once, each writer's in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_writers_append_exactly_once_through_a_faulty_network() {
    const WRITERS: usize = 4;
    const PER_WRITER: usize = 250;
    const KEYED: &str = "chaos/keyed";
    let (_server, proxy, proxied, direct) = chaos(KEYED, FaultPlan { drop_request: 15, drop_response: 60, reset: 15, delay: 40 }).await;
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let stream = proxied.stream(KEYED).with_content_type("text/plain");
        tasks.push(tokio::spawn(async move {
            for n in 0..PER_WRITER {
                let key = oncelog_client::new_idempotency_key();
                let opts = || oncelog_client::AppendOptions { idempotency_key: Some(key.clone()), ..Default::default() };
                let body = message(w, n);
                // The same request twice at once; both must succeed, one of them as the repeat.
                let (a, b) = tokio::join!(stream.append(body.clone(), opts()), stream.append(body.clone(), opts()));
                let (a, b) = (a.expect("keyed appends are retried until acknowledged"), b.expect("and so is the repeat"));
                assert_eq!(a.next_offset, b.next_offset, "both answers name the one append");
            }
        }));
    }
    tokio::time::timeout(TIME_LIMIT, async {
        for t in tasks {
            t.await.expect("writer");
        }
    })
    .await
    .expect("the keyed writers finished in time");
    // A catch-up read pages through the whole stream and ends at the tail.
    let mut chunks = direct.stream(KEYED).read(ReadOptions::default());
    let mut all = String::new();
    while let Some(c) = chunks.next().await {
        all.push_str(std::str::from_utf8(&c.expect("read").data).expect("utf-8"));
    }
    let mut count: HashMap<&str, usize> = HashMap::new();
    let mut last: HashMap<usize, usize> = HashMap::new();
    for line in all.lines() {
        *count.entry(line).or_default() += 1;
        let (w, n) = line.trim_start_matches('p').split_once('-').expect("message shape");
        let (w, n): (usize, usize) = (w.parse().expect("writer"), n.parse().expect("n"));
        if let Some(prev) = last.insert(w, n) {
            assert!(n > prev, "writer {w}: {n} after {prev}");
        }
    }
    let c = &proxy.counts;
    println!(
        "keyed writers: {} lines, {} distinct; faults: {} dropped responses, {} dropped requests, {} resets",
        all.lines().count(),
        count.len(),
        c.dropped_responses.load(Ordering::Relaxed),
        c.dropped_requests.load(Ordering::Relaxed),
        c.resets.load(Ordering::Relaxed)
    );
    assert_eq!(count.len(), WRITERS * PER_WRITER, "every append is there");
    assert!(count.values().all(|n| *n == 1), "none twice");
    assert!(c.dropped_responses.load(Ordering::Relaxed) > 0, "faults were injected");
}
