//! The connection loop under broken and hostile clients: half-closed sockets, clients that
//! trickle headers or bodies, idle sockets, too many connections; and HTTP/2 without TLS.
//!
//! Every case that drives raw sockets runs on both front ends (issue 47), as `NAME::plain_*` and
//! `NAME::tls_*`: plain TCP (HTTP/1 on the server's own engine, or h2c), and TLS (hyper), whose
//! raw client speaks HTTP/1.1 (ALPN `http/1.1`) or, where the case is about HTTP/2, HTTP/2 (ALPN
//! `h2`). On TLS, the helper requests around a case go over HTTP/2 (what `reqwest` negotiates).

mod common;

use std::time::{Duration, Instant};

use common::{read_to_close, Front, FrontServer};
use oncelog_server::ServerConfig;
use reqwest::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn config() -> ServerConfig {
    ServerConfig {
        header_read_timeout: Duration::from_millis(500),
        body_read_timeout: Duration::from_millis(500),
        long_poll_timeout: Duration::from_millis(300),
        ..ServerConfig::default()
    }
}

async fn start(front: Front, config: ServerConfig) -> FrontServer {
    FrontServer::start(front, config).await
}

async fn put(s: &FrontServer, path: &str) {
    let r = s.client().put(s.url(path)).header("content-type", "text/plain").send().await.expect("put");
    assert!(r.status().is_success());
}

/// The stream's tail, by `HEAD`.
async fn tail(s: &FrontServer, path: &str) -> String {
    let head = s.client().head(s.url(path)).send().await.expect("head");
    head.headers()["stream-next-offset"].to_str().expect("tail").to_owned()
}

const EMPTY: &str = "0000000000000000_0000000000000000";

/// On TLS the half-close is TLS's own (`close_notify`, then the socket's write side shut down),
/// read by hyper as the end of the request side (`half_close(true)`).
async fn a_client_that_half_closes_after_its_request_still_gets_the_answer(front: Front) {
    let s = start(front, config()).await;
    put(&s, "h").await;
    let mut conn = s.connect().await;
    conn.write_all(
        b"POST /v1/stream/h HTTP/1.1\r\nHost: t\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\nhello",
    )
    .await
    .expect("write");
    conn.shutdown().await.expect("half-close");
    let (answer, _) = read_to_close(&mut conn, Duration::from_secs(5)).await;
    assert!(answer.starts_with("HTTP/1.1 204"), "answer: {answer:?}");
    let body = s.client().get(s.url("h")).send().await.expect("get").text().await.expect("text");
    assert_eq!(body, "hello");
}

/// On TLS, half of the idle sockets never send their `ClientHello` (the handshake must end
/// within the header timeout), the other half finished the handshake and send no request.
async fn idle_and_trickling_connections_are_closed_and_never_starve_others(front: Front) {
    let s = start(front, config()).await;
    put(&s, "t").await;
    // 600 sockets: 100 send nothing, 500 trickle a header a byte at a time.
    let mut idle: Vec<common::Raw> = Vec::new();
    for i in 0..100 {
        idle.push(if i % 2 == 0 { Box::new(s.connect_tcp().await) } else { s.connect().await });
    }
    let mut trickling = Vec::new();
    for _ in 0..500 {
        trickling.push(s.connect().await);
    }
    let trickle = tokio::spawn(async move {
        let header = b"GET /v1/stream/t HTTP/1.1\r\nHost: t\r\nX-Slow: ";
        for i in 0..40usize {
            for c in trickling.iter_mut() {
                if c.write_all(&header[i % header.len()..][..1]).await.is_err() {
                    continue;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        trickling
    });
    // A normal client is served promptly meanwhile.
    let started = Instant::now();
    let http = s.client();
    for _ in 0..10 {
        let r = http.get(s.url("t")).send().await.expect("get");
        assert_eq!(r.status(), StatusCode::OK);
    }
    assert!(started.elapsed() < Duration::from_secs(2), "normal requests took {:?}", started.elapsed());
    // The idle sockets are closed once the header timeout passes.
    for c in &mut idle {
        let (_, closed) = read_to_close(c, Duration::from_secs(3)).await;
        assert!(closed, "an idle socket stays open");
    }
    // So are the trickling ones, although they keep sending.
    let mut trickling = trickle.await.expect("trickle task");
    for c in &mut trickling {
        let (_, closed) = read_to_close(c, Duration::from_secs(3)).await;
        assert!(closed, "a trickling socket stays open");
    }
}

async fn a_stalled_body_is_answered_408(front: Front) {
    let s = start(front, config()).await;
    put(&s, "b").await;
    let mut conn = s.connect().await;
    conn.write_all(
        b"POST /v1/stream/b HTTP/1.1\r\nHost: t\r\nContent-Type: text/plain\r\nContent-Length: 10\r\n\r\nabc",
    )
    .await
    .expect("write");
    let (answer, closed) = read_to_close(&mut conn, Duration::from_secs(3)).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "answer: {answer:?}");
    assert!(closed);
    assert_eq!(tail(&s, "b").await, EMPTY, "nothing written");
}

/// A body dripped a byte at a time, each just inside the pause limit, is cut off by the total
/// deadline (`--body-total-timeout-ms`): before it, the request could stay open for ever.
async fn a_dripped_body_is_answered_408_at_the_total_deadline(front: Front) {
    let config = ServerConfig { body_total_timeout: Duration::from_millis(1_500), ..config() };
    let s = start(front, config).await;
    put(&s, "d").await;
    let mut conn = s.connect().await;
    conn.write_all(
        b"POST /v1/stream/d HTTP/1.1\r\nHost: t\r\nContent-Type: text/plain\r\nContent-Length: 1000\r\n\r\n",
    )
    .await
    .expect("write");
    let started = Instant::now();
    let (mut rd, mut wr) = tokio::io::split(conn);
    // A byte every 200 ms (the pause limit is 500 ms), for up to 10 s.
    let drip = tokio::spawn(async move {
        for _ in 0..50 {
            if wr.write_all(b"x").await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    let (answer, closed) = read_to_close(&mut rd, Duration::from_secs(8)).await;
    let took = started.elapsed();
    drip.abort();
    assert!(answer.starts_with("HTTP/1.1 408"), "answer after {took:?}: {answer:?}");
    assert!(closed, "the connection is closed");
    assert!(took >= Duration::from_millis(1_400) && took < Duration::from_secs(5), "answered after {took:?}");
    assert_eq!(tail(&s, "d").await, EMPTY, "nothing written");
}

/// At the limit a new client is not left waiting behind silent sockets: it takes the place of
/// the one idle longest, which is closed; the others stay (issue 45, item 7; before, the new client
/// waited for the header timeout to free a place). On TLS the silent sockets finished their
/// handshake; the new client (`reqwest`) speaks HTTP/2.
async fn at_max_connections_a_new_client_takes_the_place_of_the_oldest_idle_socket(front: Front) {
    let config = ServerConfig { max_connections: 2, header_read_timeout: Duration::from_secs(5), ..config() };
    let s = start(front, config).await;
    put(&s, "m").await;
    let http = s.client();
    let mut oldest = s.connect().await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut newer = s.connect().await;
    // A socket gives its place once idle for a second (the header timeout here: 5 s).
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let r = tokio::time::timeout(Duration::from_millis(1_000), http.get(s.url("m")).send())
        .await
        .expect("served before the header timeout frees a place")
        .expect("get");
    assert_eq!(r.status(), StatusCode::OK);
    let (_, closed) = read_to_close(&mut oldest, Duration::from_millis(400)).await;
    assert!(closed, "the socket idle longest made room");
    let (_, closed) = read_to_close(&mut newer, Duration::from_millis(100)).await;
    assert!(!closed, "only one socket is closed for one new client");
}

/// Plain only: HTTP/2 with prior knowledge (h2c) exists on plain TCP alone; over TLS, HTTP/2
/// with many live readers on one connection is `tls.rs`'s case.
#[tokio::test]
async fn http2_with_prior_knowledge_carries_every_read_mode_on_one_connection() {
    let s = common::TestServer::start(config(), None).await;
    let h2 = reqwest::Client::builder().http2_prior_knowledge().build().expect("client");
    let r = h2.put(s.url("two")).header("content-type", "text/plain").send().await.expect("put");
    assert_eq!((r.status(), r.version()), (StatusCode::CREATED, reqwest::Version::HTTP_2));
    let tail = r.headers().get("stream-next-offset").and_then(|v| v.to_str().ok()).expect("tail").to_owned();
    // Twenty SSE readers and a long-poll on one HTTP/2 connection, then one append reaches all.
    // The long-poll asks from the tail before the append (not `now`): on a loaded machine it may
    // arrive after the append and must still get it.
    let readers = common::h2_sse_readers(&h2, &(s.url("two") + "?offset=-1&live=sse"), 20, "hello");
    let lp = {
        let h2 = h2.clone();
        let url = s.url("two") + &format!("?offset={tail}&live=long-poll");
        tokio::spawn(async move { h2.get(url).send().await.expect("long-poll").text().await.expect("text") })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let r = h2.post(s.url("two")).header("content-type", "text/plain").body("hello").send().await.expect("post");
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    for r in readers {
        r.await.expect("reader");
    }
    assert_eq!(lp.await.expect("long-poll"), "hello");
}

/// On TLS the readers are streams of one HTTP/2 connection (what `reqwest` negotiates): the
/// bound is per stream of the log, not per connection.
async fn live_readers_are_bounded_per_stream_and_answered_503_beyond(front: Front) {
    let config = ServerConfig { max_live_readers_per_stream: 2, sse_keepalive: Duration::from_millis(100), ..config() };
    let s = start(front, config).await;
    put(&s, "busy").await;
    let http = s.client();
    let url = s.url("busy") + "?offset=-1&live=sse";
    let a = http.get(&url).send().await.expect("sse 1");
    let b = http.get(&url).send().await.expect("sse 2");
    assert_eq!((a.status(), b.status()), (StatusCode::OK, StatusCode::OK));
    let c = http.get(&url).send().await.expect("sse 3");
    assert_eq!(c.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(c.headers().contains_key("retry-after"));
    // Another stream is not affected, and a place comes back when a reader leaves.
    put(&s, "calm").await;
    assert_eq!(http.get(s.url("calm") + "?offset=-1&live=sse").send().await.expect("sse").status(), StatusCode::OK);
    drop(a);
    let mut ok = false;
    for _ in 0..100 {
        if http.get(&url).send().await.expect("sse").status() == StatusCode::OK {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(ok, "the place of a closed reader is given back");
}

/// On TLS the socket's write deadline lies under TLS: what blocks is the encrypted stream.
async fn a_reader_that_stops_reading_is_disconnected_after_the_write_timeout(front: Front) {
    let s = start(front, ServerConfig { write_timeout: Duration::from_millis(500), ..config() }).await;
    put(&s, "big").await;
    let http = s.client();
    let chunk = vec![b'x'; 4 << 20];
    for _ in 0..4 {
        let r = http
            .post(s.url("big"))
            .header("content-type", "text/plain")
            .body(chunk.clone())
            .send()
            .await
            .expect("post");
        assert_eq!(r.status(), StatusCode::NO_CONTENT);
    }
    // A reader that asks for 16 MiB over SSE and never reads.
    let mut stalled = s.connect().await;
    stalled.write_all(b"GET /v1/stream/big?offset=-1&live=sse HTTP/1.1\r\nHost: t\r\n\r\n").await.expect("write");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // By now the server gave up on it: draining the socket ends in EOF, well short of 16 MiB.
    let (got, drained) = read_to_close(&mut stalled, Duration::from_secs(5)).await;
    assert!(drained, "the server kept the stalled connection open");
    assert!(got.len() < 16 << 20, "received {} bytes", got.len());
    // Meanwhile a normal reader gets everything.
    let body = http.get(s.url("big")).send().await.expect("get").bytes().await.expect("bytes");
    assert!(!body.is_empty());
}

/// Speaks just enough raw HTTP/2 to open a connection (preface, empty SETTINGS, a SETTINGS
/// acknowledgement) and then reads frames for `for_how_long`, answering PINGs only if
/// `answer_pings`. Returns whether the server closed the connection in that time.
async fn h2_peer(s: &FrontServer, answer_pings: bool, for_how_long: Duration) -> bool {
    let mut conn = s.connect_h2().await;
    conn.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await.expect("preface");
    conn.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await.expect("settings");
    let deadline = tokio::time::Instant::now() + for_how_long;
    loop {
        let mut head = [0u8; 9];
        match tokio::time::timeout_at(deadline, conn.read_exact(&mut head)).await {
            Err(_) => return false,
            Ok(Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
        let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
        let mut payload = vec![0u8; len];
        if conn.read_exact(&mut payload).await.is_err() {
            return true;
        }
        let (kind, flags) = (head[3], head[4]);
        if kind == 4 && flags & 1 == 0 {
            conn.write_all(&[0, 0, 0, 4, 1, 0, 0, 0, 0]).await.expect("settings ack");
        }
        if kind == 6 && flags & 1 == 0 && answer_pings {
            let mut ack = vec![0, 0, 8, 6, 1, 0, 0, 0, 0];
            ack.extend_from_slice(&payload);
            conn.write_all(&ack).await.expect("ping ack");
        }
    }
}

async fn an_http2_peer_that_stops_answering_pings_is_dropped_and_one_that_answers_stays(front: Front) {
    let pings = ServerConfig {
        h2_ping_interval: Duration::from_millis(200),
        h2_ping_timeout: Duration::from_millis(200),
        ..config()
    };
    let s = start(front, pings).await;
    let (silent, answering) =
        tokio::join!(h2_peer(&s, false, Duration::from_secs(3)), h2_peer(&s, true, Duration::from_secs(2)));
    assert!(silent, "a peer that never answers pings must be dropped within interval + timeout");
    assert!(!answering, "a peer that answers pings must keep its connection");
}

/// An answer given before the request's body was read (here a 404 for a missing stream) is
/// followed by the connection's close, and says so; an answer after the whole body keeps it.
async fn an_answer_before_the_body_was_read_says_connection_close(front: Front) {
    let s = start(front, config()).await;
    put(&s, "k").await;
    let mut conn = s.connect().await;
    let head =
        "POST /v1/stream/missing HTTP/1.1\r\nHost: t\r\nContent-Type: text/plain\r\nContent-Length: 1000000\r\n\r\n";
    conn.write_all(head.as_bytes()).await.expect("write");
    conn.write_all(&[b'x'; 4096]).await.expect("write");
    let (answer, closed) = read_to_close(&mut conn, Duration::from_secs(5)).await;
    assert!(answer.starts_with("HTTP/1.1 404"), "answer: {answer:?}");
    assert!(answer.to_ascii_lowercase().contains("\r\nconnection: close\r\n"), "answer: {answer:?}");
    assert!(closed);

    // A request whose body was read keeps its connection, and its answer does not say close.
    let mut conn = s.connect().await;
    let req = "POST /v1/stream/k HTTP/1.1\r\nHost: t\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok";
    conn.write_all(req.as_bytes()).await.expect("write");
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), conn.read(&mut buf)).await.expect("answer").expect("read");
    let answer = String::from_utf8_lossy(&buf[..n]).to_ascii_lowercase();
    assert!(answer.starts_with("http/1.1 204") && !answer.contains("connection: close"), "answer: {answer:?}");
    conn.write_all(b"GET /v1/stream/k HTTP/1.1\r\nHost: t\r\n\r\n")
        .await
        .expect("second request on the same connection");
    let n = tokio::time::timeout(Duration::from_secs(5), conn.read(&mut buf)).await.expect("answer").expect("read");
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
}

/// A shutdown with only live readers whose clients left finishes at once (issue 46, item 4):
/// before, it waited for their long-poll timeout or SSE keep-alive, up to the grace period. On
/// TLS the clients leave without `close_notify`, as a vanished client does.
async fn a_shutdown_does_not_wait_for_live_readers_that_left(front: Front) {
    use tokio::io::{AsyncBufReadExt, BufReader};
    let dir = tempfile::tempdir().expect("tempdir");
    let engine = oncelog_log::LogEngine::open(oncelog_log::LogOptions::new(dir.path())).expect("engine");
    // Far longer than the test waits: only readers still waiting could hold the shutdown.
    let mut config = ServerConfig { shutdown_grace: Duration::from_secs(30), ..ServerConfig::default() };
    let ca = (front == Front::Tls).then(|| {
        let (ca, cert, key) = common::pki("shutdown");
        let files =
            oncelog_server::tls::TlsFiles { cert: dir.path().join("cert.pem"), key: dir.path().join("key.pem") };
        std::fs::write(&files.cert, cert).expect("cert");
        std::fs::write(&files.key, key).expect("key");
        config.tls = Some(files);
        ca
    });
    let state = oncelog_server::AppState::new(std::sync::Arc::new(engine), config);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(oncelog_server::serve(listener, state, async move {
        let _ = stopped.await;
    }));
    let connect = || async {
        let conn: common::Raw = match &ca {
            None => Box::new(TcpStream::connect(addr).await.expect("connect")),
            Some(ca) => Box::new(common::tls_connect(addr, ca, b"http/1.1").await),
        };
        conn
    };
    let mut create = connect().await;
    create
        .write_all(b"PUT /v1/stream/s HTTP/1.1\r\nHost: t\r\nContent-Type: text/plain\r\nContent-Length: 0\r\n\r\n")
        .await
        .expect("put");
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), create.read(&mut buf)).await.expect("answer").expect("read");
    assert!(buf[..n].starts_with(b"HTTP/1.1 201"), "{}", String::from_utf8_lossy(&buf[..n]));
    drop(create);
    let mut long_poll = connect().await;
    long_poll
        .write_all(b"GET /v1/stream/s?offset=now&live=long-poll HTTP/1.1\r\nHost: t\r\n\r\n")
        .await
        .expect("write");
    let mut sse = BufReader::new(connect().await);
    sse.get_mut().write_all(b"GET /v1/stream/s?offset=now&live=sse HTTP/1.1\r\nHost: t\r\n\r\n").await.expect("write");
    let mut status = String::new();
    sse.read_line(&mut status).await.expect("status line");
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop((long_poll, sse));
    let started = Instant::now();
    stop.send(()).expect("stop");
    let ended = tokio::time::timeout(Duration::from_secs(5), server).await;
    assert!(ended.is_ok(), "the shutdown still waits after {:?}", started.elapsed());
    ended.expect("ended").expect("task").expect("a clean shutdown");
}

/// Each case above as two tests, `NAME::PLAIN` and `NAME::TLS`, named for the protocol each
/// speaks.
macro_rules! on_both_fronts {
    ($flavor:meta, ($plain:ident, $tls:ident): $($name:ident),* $(,)?) => {$(
        mod $name {
            #[$flavor]
            async fn $plain() {
                super::$name(super::Front::Plain).await
            }
            #[$flavor]
            async fn $tls() {
                super::$name(super::Front::Tls).await
            }
        }
    )*};
}

on_both_fronts!(
    tokio::test,
    (plain_http1, tls_http1):
    a_client_that_half_closes_after_its_request_still_gets_the_answer,
    idle_and_trickling_connections_are_closed_and_never_starve_others,
    a_stalled_body_is_answered_408,
    a_dripped_body_is_answered_408_at_the_total_deadline,
    at_max_connections_a_new_client_takes_the_place_of_the_oldest_idle_socket,
    a_reader_that_stops_reading_is_disconnected_after_the_write_timeout,
    an_answer_before_the_body_was_read_says_connection_close,
);
on_both_fronts!(tokio::test, (plain_http1, tls_http2): live_readers_are_bounded_per_stream_and_answered_503_beyond);
on_both_fronts!(
    tokio::test,
    (plain_h2c, tls_http2): an_http2_peer_that_stops_answering_pings_is_dropped_and_one_that_answers_stays
);
on_both_fronts!(
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    (plain_http1, tls_http1): a_shutdown_does_not_wait_for_live_readers_that_left
);
