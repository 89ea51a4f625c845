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
//!
//! The same proxy, scripted instead of random (a fault on the first connection only) and
//! recording the requests it forwards, shows what a plain append does when its first attempt
//! was stored but its answer lost: retried with the same automatic `Idempotency-Key` and stored
//! once; with the opt-out, not retried; with the caller's own key, that key on every attempt.

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::TestServer;
use futures_util::StreamExt;
use oncelog_client::{AppendOptions, Client, CreateOptions, Error, LiveMode, ReadFrom, ReadOptions, RetryPolicy};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const PRODUCERS: usize = 4;
const MESSAGES: usize = 100_000;
const STREAM: &str = "chaos/exactly-once";
/// The whole run must finish well inside this; a wedged producer would not.
const TIME_LIMIT: Duration = Duration::from_secs(90);

/// Per-chunk fault probabilities, in parts per thousand.
#[derive(Debug, Clone, Copy, Default)]
struct FaultPlan {
    /// Client → server: close both sides instead of forwarding (the request never arrives).
    drop_request: u64,
    /// Server → client: close both sides instead of forwarding (the server did the work).
    drop_response: u64,
    /// Server → client: reset the client connection (RST) instead of forwarding.
    reset: u64,
    /// Server → client: answer `502 Bad Gateway` instead of forwarding (the server did the work).
    bad_gateway: u64,
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
    /// Answers replaced by a `502`.
    bad_gateways: AtomicU64,
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

/// The client → server bytes of each connection, in order of connection (scripted proxies).
type Recording = Arc<Mutex<Vec<Vec<u8>>>>;

struct Proxy {
    /// Where clients connect.
    addr: SocketAddr,
    /// What was injected, for the figures.
    counts: Arc<FaultCounts>,
    /// What clients sent, when recorded.
    sent: Option<Recording>,
}

impl Proxy {
    /// Every connection gets the random faults of `plan`.
    async fn start(upstream: SocketAddr, plan: FaultPlan) -> Proxy {
        Proxy::start_with(upstream, Arc::new(move |_| plan), false).await
    }

    /// Connection number `n` (from 0) gets `script[n]`, later ones none; requests are recorded.
    async fn scripted(upstream: SocketAddr, script: Vec<FaultPlan>) -> Proxy {
        Proxy::start_with(upstream, Arc::new(move |n| script.get(n).copied().unwrap_or_default()), true).await
    }

    async fn start_with(
        upstream: SocketAddr,
        plan_of: Arc<dyn Fn(usize) -> FaultPlan + Send + Sync>,
        record: bool,
    ) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy addr");
        let counts = Arc::new(FaultCounts::default());
        let sent: Option<Recording> = record.then(Default::default);
        let (c, log) = (counts.clone(), sent.clone());
        tokio::spawn(async move {
            let mut seed = 0x2545_F491_4F6C_DD1D_u64;
            while let Ok((client, _)) = listener.accept().await {
                seed = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
                let n = c.connections.fetch_add(1, Ordering::Relaxed) as usize;
                let log = log.as_ref().map(|l| {
                    let mut g = l.lock().expect("recording");
                    g.push(Vec::new());
                    (l.clone(), g.len() - 1)
                });
                tokio::spawn(proxy_connection(client, upstream, plan_of(n), c.clone(), seed, log));
            }
        });
        Proxy { addr, counts, sent }
    }

    /// The requests clients sent through a scripted proxy, in order of connection.
    fn requests(&self) -> Vec<SentRequest> {
        let log = self.sent.as_ref().expect("a recording proxy").lock().expect("recording").clone();
        log.iter().flat_map(|bytes| parse_requests(bytes)).collect()
    }

    /// The appends (`POST`s) among [`Proxy::requests`].
    fn posts(&self) -> Vec<SentRequest> {
        self.requests().into_iter().filter(|r| r.method == "POST").collect()
    }
}

/// One HTTP/1.1 request as a client sent it.
#[derive(Debug, Clone)]
struct SentRequest {
    /// `GET`, `POST`, ...
    method: String,
    /// Its `Idempotency-Key` header, if any.
    key: Option<String>,
    /// Whether it carried `Producer-Id`.
    producer: bool,
}

/// Splits a connection's client → server bytes into requests (bodies sized by Content-Length).
fn parse_requests(mut bytes: &[u8]) -> Vec<SentRequest> {
    let mut out = Vec::new();
    while let Some(end) = bytes.windows(4).position(|w| w == b"\r\n\r\n") {
        let head = String::from_utf8_lossy(&bytes[..end]).into_owned();
        let mut lines = head.split("\r\n");
        let method = lines.next().unwrap_or("").split(' ').next().unwrap_or("").to_owned();
        let (mut key, mut producer, mut len) = (None, false, 0usize);
        for line in lines {
            let (name, value) = line.split_once(':').unwrap_or((line, ""));
            match name.trim().to_ascii_lowercase().as_str() {
                "idempotency-key" => key = Some(value.trim().to_owned()),
                "producer-id" => producer = true,
                "content-length" => len = value.trim().parse().expect("content-length"),
                _ => {}
            }
        }
        out.push(SentRequest { method, key, producer });
        bytes = &bytes[(end + 4 + len).min(bytes.len())..];
    }
    out
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
    record: Option<&(Recording, usize)>,
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
            if roll < plan.drop_response + plan.reset + plan.bad_gateway {
                counts.bad_gateways.fetch_add(1, Ordering::Relaxed);
                let _ = to
                    .write_all(
                        b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 11\r\nconnection: close\r\n\r\nbad gateway",
                    )
                    .await;
                let _ = to.flush().await;
                return End::Drop;
            }
        } else if roll < plan.drop_request {
            counts.dropped_requests.fetch_add(1, Ordering::Relaxed);
            return End::Drop;
        }
        if let Some((log, conn)) = record {
            log.lock().expect("recording")[*conn].extend_from_slice(&buf[..n]);
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

async fn proxy_connection(
    mut client: TcpStream,
    upstream: SocketAddr,
    plan: FaultPlan,
    counts: Arc<FaultCounts>,
    seed: u64,
    record: Option<(Recording, usize)>,
) {
    let Ok(mut server) = TcpStream::connect(upstream).await else { return };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let end = {
        let (mut cr, mut cw) = client.split();
        let (mut sr, mut sw) = server.split();
        tokio::select! {
            e = pump(&mut cr, &mut sw, false, plan, &counts, seed, record.as_ref()) => e,
            e = pump(&mut sr, &mut cw, true, plan, &counts, seed ^ 0xDEAD_BEEF, None) => e,
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
    let (_server, proxy, proxied, direct) =
        chaos(STREAM, FaultPlan { drop_request: 15, drop_response: 40, reset: 15, delay: 40, ..FaultPlan::default() })
            .await;
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
    let lost =
        (0..PRODUCERS).flat_map(|p| (0..per_producer).map(move |n| (p, n))).filter(|k| !seen.contains_key(k)).count();

    let read_back =
        tokio::time::timeout(Duration::from_secs(30), reader).await.expect("reader ended at EOF").expect("reader task");
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
    assert!(
        c.dropped_responses.load(Ordering::Relaxed) > 0 && c.resets.load(Ordering::Relaxed) > 0,
        "faults were injected"
    );
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
    let (_server, proxy, proxied, direct) =
        chaos(KEYED, FaultPlan { drop_request: 15, drop_response: 60, reset: 15, delay: 40, ..FaultPlan::default() })
            .await;
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let stream = proxied.stream(KEYED).with_content_type("text/plain");
        tasks.push(tokio::spawn(async move {
            for n in 0..PER_WRITER {
                let key = oncelog_client::new_idempotency_key();
                let opts =
                    || oncelog_client::AppendOptions { idempotency_key: Some(key.clone()), ..Default::default() };
                let body = message(w, n);
                // The same request twice at once; both must succeed, one of them as the repeat.
                let (a, b) = tokio::join!(stream.append(body.clone(), opts()), stream.append(body.clone(), opts()));
                let (a, b) =
                    (a.expect("keyed appends are retried until acknowledged"), b.expect("and so is the repeat"));
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

/// The first connection's answer never reaches the client: the server stored the append.
fn lost_answer() -> FaultPlan {
    FaultPlan { drop_response: 1000, ..FaultPlan::default() }
}

/// The first connection's answer is replaced by a `502`: the server stored the append.
fn bad_gateway() -> FaultPlan {
    FaultPlan { bad_gateway: 1000, ..FaultPlan::default() }
}

/// A server with text stream `stream`; a recording proxy in front of it giving connection `n`
/// the faults `script[n]`; a handle through the proxy from a client that `build` finishes (quick
/// retries, at most 5 attempts); and a handle straight to the server.
async fn scripted(
    stream: &str,
    script: Vec<FaultPlan>,
    build: impl FnOnce(oncelog_client::ClientBuilder) -> oncelog_client::ClientBuilder,
) -> (TestServer, Proxy, oncelog_client::StreamHandle, oncelog_client::StreamHandle) {
    let server = TestServer::start().await;
    let proxy = Proxy::scripted(server.addr, script).await;
    let policy = RetryPolicy::new(Duration::from_millis(10), Duration::from_millis(50), 2.0)
        .expect("policy")
        .with_max_attempts(Some(5))
        .expect("policy");
    let proxied = build(Client::builder(format!("http://{}/v1/stream", proxy.addr)).retry_policy(policy))
        .build()
        .expect("client");
    let direct = Client::new(&server.base).expect("client").stream(stream);
    direct.create(CreateOptions::content_type("text/plain")).await.expect("create");
    // The content type is known: no HEAD goes through the proxy before the append.
    (server, proxy, proxied.stream(stream).with_content_type("text/plain"), direct)
}

/// Everything in the stream, read straight from the server.
async fn read_all(s: &oncelog_client::StreamHandle) -> String {
    let mut chunks = s.read(ReadOptions::default());
    let mut all = String::new();
    while let Some(c) = chunks.next().await {
        all.push_str(std::str::from_utf8(&c.expect("read").data).expect("utf-8"));
    }
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_append_whose_answer_was_lost_is_retried_with_the_same_key_and_stored_once() {
    for (name, fault) in [("lost answer", lost_answer()), ("502 after storing", bad_gateway())] {
        let (_server, proxy, s, direct) = scripted("keys/auto", vec![fault], |b| b).await;
        let appended = s
            .append("once\n", AppendOptions::default())
            .await
            .unwrap_or_else(|e| panic!("{name}: the append is retried until acknowledged: {e:?}"));
        let c = &proxy.counts;
        assert_eq!(
            c.dropped_responses.load(Ordering::Relaxed) + c.bad_gateways.load(Ordering::Relaxed),
            1,
            "{name}: the server answered the first attempt, and that answer was lost"
        );
        assert_eq!(read_all(&direct).await, "once\n", "{name}: stored exactly once");
        let posts = proxy.posts();
        assert_eq!(posts.len(), 2, "{name}: the first attempt and one retry: {posts:?}");
        let key = posts[0].key.clone().unwrap_or_else(|| panic!("{name}: an automatic key"));
        assert!(key.len() == 32 && key.bytes().all(|b| b.is_ascii_hexdigit()), "{name}: 128 bits as hex: {key}");
        assert_eq!(posts[1].key.as_deref(), Some(key.as_str()), "{name}: the retry carries the same key");
        assert_eq!(
            appended.next_offset,
            direct.head().await.expect("head").next_offset,
            "{name}: the answer names the append"
        );

        // The next append is another one: another key.
        s.append("twice\n", AppendOptions::default()).await.expect("second append");
        let posts = proxy.posts();
        assert_eq!(posts.len(), 3, "{name}: no fault, no retry");
        assert!(posts[2].key.as_ref().is_some_and(|k| *k != key), "{name}: a new key per append: {posts:?}");
        assert_eq!(read_all(&direct).await, "once\ntwice\n");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_opt_out_a_plain_append_is_not_retried_once_the_server_may_have_it() {
    for per_append in [true, false] {
        for (name, fault) in [("lost answer", lost_answer()), ("502 after storing", bad_gateway())] {
            let name = format!("{name}, opted out {}", if per_append { "per append" } else { "on the client" });
            let (_server, proxy, s, direct) =
                scripted("keys/off", vec![fault], |b| if per_append { b } else { b.auto_idempotency_key(false) }).await;
            let opts = AppendOptions { auto_idempotency_key: per_append.then_some(false), ..AppendOptions::default() };
            let err = s.append("maybe\n", opts).await.expect_err("the failure surfaces");
            assert!(err.is_transient() && !err.is_retry_safe(), "{name}: {err:?}");
            if fault.bad_gateway > 0 {
                assert_eq!(err.status(), Some(502), "{name}: {err:?}");
            } else {
                assert!(matches!(err, Error::Transport { .. }), "{name}: {err:?}");
            }
            let posts = proxy.posts();
            assert_eq!(posts.len(), 1, "{name}: sent once: {posts:?}");
            assert_eq!(posts[0].key, None, "{name}: no key");
            assert_eq!(
                read_all(&direct).await,
                "maybe\n",
                "{name}: the server had stored it (a blind retry would store it again)"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_callers_own_key_is_kept_on_every_attempt() {
    for (name, auto, by_header) in
        [("option", true, false), ("header", true, true), ("option, automatic keys off", false, false)]
    {
        let key = format!("caller-key-{name}").replace([' ', ','], "-");
        let (_server, proxy, s, direct) =
            scripted("keys/caller", vec![lost_answer()], |b| b.auto_idempotency_key(auto)).await;
        let mut opts = AppendOptions::default();
        if by_header {
            opts.headers.insert("idempotency-key", key.parse().expect("header value"));
        } else {
            opts.idempotency_key = Some(key.clone());
        }
        s.append("mine\n", opts).await.unwrap_or_else(|e| panic!("{name}: retried until acknowledged: {e:?}"));
        assert_eq!(read_all(&direct).await, "mine\n", "{name}: stored once");
        let posts = proxy.posts();
        assert_eq!(posts.len(), 2, "{name}: {posts:?}");
        assert!(
            posts.iter().all(|p| p.key.as_deref() == Some(key.as_str())),
            "{name}: the caller's key every time: {posts:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_mismatch_and_other_client_errors_are_never_retried() {
    let (_server, proxy, s, direct) = scripted("keys/4xx", vec![], |b| b).await;
    let keyed = |body: &'static str| {
        let s = s.clone();
        async move {
            s.append(body, AppendOptions { idempotency_key: Some("k-1".into()), ..AppendOptions::default() }).await
        }
    };
    keyed("a").await.expect("first use of the key");
    let err = keyed("b").await.expect_err("the key with another body");
    assert!(matches!(err, Error::IdempotencyKeyMismatch { .. }), "{err:?}");
    assert_eq!(proxy.posts().len(), 2, "422 is not retried");

    let empty_key = AppendOptions { idempotency_key: Some(String::new()), ..AppendOptions::default() };
    let err = s.append("c", empty_key).await.expect_err("an empty key is malformed");
    assert!(matches!(err, Error::BadRequest { .. }), "{err:?}");
    assert_eq!(proxy.posts().len(), 3, "400 is not retried");

    let err = s
        .append("d", AppendOptions { content_type: Some("application/json".into()), ..AppendOptions::default() })
        .await;
    assert!(matches!(err, Err(Error::Conflict { .. })), "{err:?}");
    assert_eq!(proxy.posts().len(), 4, "409 is not retried");

    let missing = s.client().stream("keys/missing").with_content_type("text/plain");
    let err = missing.append("e", AppendOptions::default()).await.expect_err("no such stream");
    assert!(matches!(err, Error::NotFound { .. }), "{err:?}");
    let posts = proxy.posts();
    assert_eq!(posts.len(), 5, "404 is not retried");
    assert!(posts[2..].iter().all(|p| p.key.is_some()), "the automatic key was there: {posts:?}");
    assert_eq!(read_all(&direct).await, "a");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producer_appends_never_carry_a_key() {
    let (_server, proxy, s, direct) = scripted("keys/producer", vec![], |b| b).await;
    let p = s.producer("p").content_type("text/plain").start().await.expect("producer");
    p.append("one\n").await.expect("append").await.expect("stored");
    p.close().await.expect("close");
    // A plain append with producer headers of the caller's is deduplicated by them: no key (the
    // server would refuse the mix with 400).
    let mut headers = reqwest::header::HeaderMap::new();
    for (k, v) in [("producer-id", "q"), ("producer-epoch", "0"), ("producer-seq", "0")] {
        headers.insert(k, v.parse().expect("header value"));
    }
    s.append("two\n", AppendOptions { headers, ..AppendOptions::default() }).await.expect("producer-headed append");
    let posts = proxy.posts();
    assert_eq!(posts.len(), 2, "{posts:?}");
    assert!(posts.iter().all(|p| p.producer && p.key.is_none()), "{posts:?}");
    assert_eq!(read_all(&direct).await, "one\ntwo\n");
}
