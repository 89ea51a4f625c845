//! At `--max-connections`, every kind of slow client together never keeps a writer out (issue 45,
//! item 7: 320 reconnecting clients kept one out for 45 s). Idle keep-alive sockets make room for
//! a new connection; dripped bodies and catch-up readers that stop reading may hold all but a
//! reserve of the connections, beyond which the one slow the longest is closed. The timeouts that
//! would otherwise free a place (10-60 s by default) are far longer than the writer's deadline.
//!
//! Every case runs on both front ends (issue 47), as `NAME::plain_http1` and `NAME::tls_http1`:
//! the slow clients speak HTTP/1.1 over plain TCP (the server's own engine) or over TLS (ALPN
//! `http/1.1`, hyper); on TLS the writer speaks HTTP/2 (what `reqwest` negotiates).

mod common;

use std::time::Duration;

use common::{Front, FrontServer};
use oncelog_server::ServerConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const CONNECTIONS: usize = 32;

/// What the writer is given to have its append acknowledged: well under every default timeout.
const WRITER_DEADLINE: Duration = Duration::from_secs(5);

async fn server(front: Front) -> FrontServer {
    let s = FrontServer::start(front, ServerConfig { max_connections: CONNECTIONS, ..ServerConfig::default() }).await;
    let r = s.client().put(s.url("s")).header("content-type", "text/plain").send().await.expect("put");
    assert_eq!(r.status(), 201);
    s
}

/// A writer on a new connection has its append acknowledged within [`WRITER_DEADLINE`].
async fn writer_gets_in(s: &FrontServer, what: &str) {
    let wrote = tokio::time::timeout(
        WRITER_DEADLINE,
        s.client().post(s.url("s")).header("content-type", "text/plain").body("hello").send(),
    )
    .await
    .unwrap_or_else(|_| panic!("{what}: the writer was kept out for {WRITER_DEADLINE:?}"))
    .expect("post");
    assert_eq!(wrote.status(), 204, "{what}");
}

/// A server (see [`server`]) whose stream `s` holds 16 MiB: a catch-up answer larger than any
/// socket buffer.
async fn server_with_large_stream(front: Front) -> FrontServer {
    let s = server(front).await;
    let http = s.client();
    for _ in 0..4 {
        let r = http
            .post(s.url("s"))
            .header("content-type", "text/plain")
            .body(vec![b'x'; 4 << 20])
            .send()
            .await
            .expect("post");
        assert_eq!(r.status(), 204);
    }
    s
}

/// Nothing of a dripped body that was cut off was written: the stream holds the writer's one
/// append. Then the drips stop.
async fn only_the_writers_append(s: &FrontServer, drips: Vec<tokio::task::JoinHandle<()>>) {
    let body = s.client().get(s.url("s")).send().await.expect("get").text().await.expect("text");
    assert_eq!(body, "hello");
    for d in drips {
        d.abort();
    }
}

/// Keep-alive connections that each made a request, read its answer and then stay open, idle.
async fn idle_keep_alive_sockets_make_room_for_a_writer(front: Front) {
    let s = server(front).await;
    let mut idle = Vec::new();
    for _ in 0..CONNECTIONS {
        let mut conn = s.connect().await;
        conn.write_all(b"GET /v1/stream/s HTTP/1.1\r\nHost: t\r\n\r\n").await.expect("request");
        let mut buf = vec![0u8; 4096];
        let n = tokio::time::timeout(Duration::from_secs(5), conn.read(&mut buf)).await.expect("answer").expect("read");
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&buf[..n]));
        idle.push(conn);
    }
    writer_gets_in(&s, "idle keep-alive sockets").await;
}

/// New connections that never send a request (each holds its place up to the header timeout):
/// on TLS, ones that finished their handshake; [`silent_tcp_sockets_on_the_tls_port_make_room_for_a_writer`]
/// has those that never begin it.
async fn silent_sockets_make_room_for_a_writer(front: Front) {
    let s = server(front).await;
    let mut silent = Vec::new();
    for _ in 0..CONNECTIONS {
        silent.push(s.connect().await);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    writer_gets_in(&s, "silent sockets").await;
}

/// TLS only: connections that never send their `ClientHello` (each holds its place up to the
/// header timeout, which bounds the handshake) are idle too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_tcp_sockets_on_the_tls_port_make_room_for_a_writer() {
    let s = server(Front::Tls).await;
    let mut silent = Vec::new();
    for _ in 0..CONNECTIONS {
        silent.push(s.connect_tcp().await);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    writer_gets_in(&s, "TCP sockets silent before the TLS handshake").await;
}

/// Appends whose bodies are dripped a byte at a time, each well inside the pause limit.
async fn dripped_bodies_leave_a_writer_room(front: Front) {
    let s = server(front).await;
    let mut drips = Vec::new();
    for _ in 0..CONNECTIONS {
        let mut conn = s.connect().await;
        conn.write_all(
            b"POST /v1/stream/s HTTP/1.1\r\nHost: t\r\nContent-Type: text/plain\r\nContent-Length: 1000\r\n\r\n",
        )
        .await
        .expect("head");
        drips.push(tokio::spawn(async move {
            for _ in 0..200 {
                if conn.write_all(b"x").await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    writer_gets_in(&s, "dripped bodies").await;
    only_the_writers_append(&s, drips).await;
}

/// Catch-up reads of a large stream by clients that never read the answer.
async fn catch_up_readers_that_stop_reading_leave_a_writer_room(front: Front) {
    let s = server_with_large_stream(front).await;
    let mut stalled = Vec::new();
    for _ in 0..CONNECTIONS {
        let mut conn = s.connect().await;
        conn.write_all(b"GET /v1/stream/s?offset=-1 HTTP/1.1\r\nHost: t\r\n\r\n").await.expect("request");
        stalled.push(conn);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    writer_gets_in(&s, "catch-up readers that stop reading").await;
}

/// Over TLS most clients speak HTTP/2 (ALPN `h2`): the same slow clients, each on a connection
/// of its own with one HTTP/2 stream (the `h2` crate, driven by a task of its own so PINGs and
/// SETTINGS are answered), as `over_http2::NAME::tls_http2`, and over plain TCP with prior
/// knowledge (h2c, the same hyper code) as `over_http2::NAME::plain_h2c`. An HTTP/2 connection
/// whose every stream waits on its client is slow (`conns.rs`), and the connections holding live
/// readers are held to the reserve on either protocol (`live.rs`); before, an HTTP/2 connection
/// with a stream open was never closed to make room, and three of these cases kept a writer out
/// for 20-60 s.
mod over_http2 {
    use super::*;
    use bytes::Bytes;

    /// A TLS connection speaking HTTP/2, ready for a request.
    async fn h2_conn(s: &FrontServer) -> h2::client::SendRequest<Bytes> {
        let (client, conn) = h2::client::handshake(s.connect_h2().await).await.expect("h2 handshake");
        tokio::spawn(async move {
            let _ = conn.await;
        });
        client.ready().await.expect("ready")
    }

    fn request(s: &FrontServer, method: &str, path: &str) -> axum::http::Request<()> {
        axum::http::Request::builder()
            .method(method)
            .uri(match s.front {
                Front::Plain => s.url(path),
                Front::Tls => format!("https://localhost:{}/v1/stream/{path}", s.s.addr.port()),
            })
            .header("content-type", "text/plain")
            .body(())
            .expect("request")
    }

    /// HTTP/2 connections with no stream open, after their handshake.
    async fn idle_connections_make_room_for_a_writer(front: Front) {
        let s = server(front).await;
        let mut idle = Vec::new();
        for _ in 0..CONNECTIONS {
            idle.push(h2_conn(&s).await);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        writer_gets_in(&s, "idle HTTP/2 connections").await;
    }

    /// Appends whose bodies are dripped a byte at a time in DATA frames.
    async fn dripped_bodies_leave_a_writer_room(front: Front) {
        let s = server(front).await;
        let mut drips = Vec::new();
        for _ in 0..CONNECTIONS {
            let mut client = h2_conn(&s).await;
            let mut req = request(&s, "POST", "s");
            req.headers_mut().insert("content-length", "1000".parse().expect("length"));
            let (resp, mut body) = client.send_request(req, false).expect("send request");
            drips.push(tokio::spawn(async move {
                let _kept = (client, resp);
                for _ in 0..200 {
                    if body.send_data(Bytes::from_static(b"x"), false).is_err() {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        writer_gets_in(&s, "dripped bodies over HTTP/2").await;
        only_the_writers_append(&s, drips).await;
    }

    /// Catch-up reads of a large stream whose clients never read the answer (never open its
    /// window).
    async fn catch_up_readers_that_stop_reading_leave_a_writer_room(front: Front) {
        let s = server_with_large_stream(front).await;
        let mut stalled = Vec::new();
        for _ in 0..CONNECTIONS {
            let mut client = h2_conn(&s).await;
            let (resp, _) = client.send_request(request(&s, "GET", "s?offset=-1"), true).expect("send request");
            let resp = tokio::time::timeout(WRITER_DEADLINE, resp).await.expect("answer in time").expect("answer");
            assert_eq!(resp.status(), 200);
            stalled.push((client, resp));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        writer_gets_in(&s, "catch-up readers over HTTP/2 that stop reading").await;
    }

    /// SSE readers, one per connection: live readers may hold all but the reserve; the readers
    /// beyond are refused (503) and their connections, idle then, make room.
    async fn live_readers_leave_a_writer_room(front: Front) {
        let s = server(front).await;
        let mut readers = Vec::new();
        let mut refused = 0;
        for _ in 0..CONNECTIONS {
            let mut client = h2_conn(&s).await;
            let (resp, _) = client.send_request(request(&s, "GET", "s?offset=now&live=sse"), true).expect("send");
            let resp = tokio::time::timeout(WRITER_DEADLINE, resp).await.expect("answer in time").expect("answer");
            match resp.status().as_u16() {
                200 => {}
                503 => refused += 1,
                other => panic!("a live reader answered {other}"),
            }
            readers.push((client, resp));
        }
        let reserve = oncelog_server::live::connection_reserve(CONNECTIONS);
        assert_eq!(refused, reserve, "the readers beyond all but the reserve are refused");
        tokio::time::sleep(Duration::from_millis(200)).await;
        writer_gets_in(&s, "live readers over HTTP/2").await;
    }

    /// Each case above as two tests: `NAME::plain_h2c` and `NAME::tls_http2`.
    macro_rules! on_both_fronts_h2 {
        ($($name:ident $(#[$attr:meta])*;)*) => {$(
            mod $name {
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                $(#[$attr])*
                async fn plain_h2c() {
                    super::$name(super::Front::Plain).await
                }
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                $(#[$attr])*
                async fn tls_http2() {
                    super::$name(super::Front::Tls).await
                }
            }
        )*};
    }

    on_both_fronts_h2! {
        idle_connections_make_room_for_a_writer;
        dripped_bodies_leave_a_writer_room;
        catch_up_readers_that_stop_reading_leave_a_writer_room;
        live_readers_leave_a_writer_room;
    }
}

/// Each case above as two tests: `NAME::plain_http1` and `NAME::tls_http1`.
macro_rules! on_both_fronts {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn plain_http1() {
                super::$name(super::Front::Plain).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn tls_http1() {
                super::$name(super::Front::Tls).await
            }
        }
    )*};
}

on_both_fronts!(
    idle_keep_alive_sockets_make_room_for_a_writer,
    silent_sockets_make_room_for_a_writer,
    dripped_bodies_leave_a_writer_room,
    catch_up_readers_that_stop_reading_leave_a_writer_room,
);
