//! The connection loop: accepts TCP connections and serves each with HTTP/1.1 or HTTP/2 (h2c
//! with prior knowledge; the protocol is detected from the first bytes), under limits that keep
//! broken or hostile clients from holding the server's resources:
//!
//! - at most [`Limits::max_connections`] connections are served at once; at the limit a new
//!   connection takes the place of an idle one, or of a slow one beyond the share slow clients
//!   and live readers may hold ([`crate::conns`]); when neither is found it waits for a place
//!   (later clients wait in the kernel's backlog);
//! - an HTTP/1 client gets [`Limits::header_read_timeout`] to send each request's headers, which
//!   also bounds how long an idle keep-alive connection stays open (slowloris, idle sockets);
//! - a write to a client may stay blocked (the client not reading) for at most
//!   [`Limits::write_timeout`]; then the connection is closed and what was queued for it freed.
//!   On HTTP/2 the same holds for an answer stalled by the client's flow control (a window it
//!   never opens, while its socket is drained), which blocks no write ([`Conn::stalled`]);
//! - a client that half-closes its socket after a complete request still gets its answer
//!   (HTTP/1 half-close): a write applied without an answer is the ambiguity this server exists
//!   to remove.
//!
//! With TLS ([`crate::tls`]) the protocol is the one ALPN negotiated (`h2` or `http/1.1`), and
//! the handshake must finish within the header-read timeout.
//!
//! Plain HTTP/1 is served by the server's own engine ([`oncelog_http1`], `--http1-engine
//! oncelog`, the default) or by hyper; TLS and HTTP/2 by hyper, through `hyper-util`'s connection
//! builder rather than `axum::serve`, which exposes none of these settings. Requests reach the
//! same [`Front`] through the same [`Tracked`] whichever engine read them.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::conns::{self, Conn, Order, Place, Registry, Tracked};
use crate::front::Front;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use tokio::io::Interest;
use tokio::net::TcpListener;

use crate::deadline_io::DeadlineIo;
use crate::sendfile_io::{SendfileIo, Socket};
use crate::workers::Workers;

/// Connection limits; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_connections: usize,
    pub header_read_timeout: Duration,
    /// Longest a write to a client may stay blocked (the client not reading) before the
    /// connection is closed.
    pub write_timeout: Duration,
    /// HTTP/2 keep-alive pings: interval, and how long an answer may take.
    pub h2_ping_interval: Duration,
    pub h2_ping_timeout: Duration,
    /// Which engine serves plain HTTP/1 connections.
    pub http1_engine: Http1Engine,
    /// Runtimes of their own the connections run on (one thread each, [`crate::workers`]); 0:
    /// on the caller's runtime.
    pub io_threads: usize,
}

pub use crate::config::{Http1Engine, UnknownEngine};

/// How long to pause accepting after an accept error (such as running out of file descriptors),
/// so the loop does not spin.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// What an HTTP/2 client sends first (RFC 9113 section 3.4).
const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// How often a connection whose first bytes could still be the HTTP/2 preface is looked at again.
const SNIFF_PAUSE: Duration = Duration::from_millis(10);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Protocol {
    Http1,
    Http2,
}

/// Which protocol a new connection speaks, from its first bytes (peeked, not consumed), within
/// `deadline`; `None` when it closes or sends nothing in time. Done here rather than by the
/// connection builder, which would wait for those bytes without any time limit.
async fn sniff(stream: &tokio::net::TcpStream, deadline: tokio::time::Instant) -> Option<Protocol> {
    let mut buf = [0u8; 24];
    loop {
        let n = tokio::time::timeout_at(deadline, stream.peek(&mut buf)).await.ok()?.ok()?;
        if n == 0 {
            return None;
        }
        if buf[..n] != H2_PREFACE[..n] {
            return Some(Protocol::Http1);
        }
        if n == H2_PREFACE.len() {
            return Some(Protocol::Http2);
        }
        // A prefix of the preface: wait for the rest (peek would return the same bytes at once).
        tokio::time::sleep(SNIFF_PAUSE).await;
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
    }
}

/// Serves `router` on `listener` until `stop` completes, then stops accepting and lets open
/// connections finish their in-flight requests for at most `grace`. Returns whether every
/// connection finished within the grace period.
/// Most an HTTP/1 connection queues for writing (and buffers of a request head still incomplete).
pub const HTTP1_BUFFER_BYTES: usize = 64 << 10;

/// Most bytes of an HTTP/1 request head on the server's own engine (`431` beyond). hyper, with
/// its buffer bounded by [`HTTP1_BUFFER_BYTES`], takes heads of up to 100 KB and refuses 200 KB
/// (measured): both engines take what clients already send (a 70 KB producer id gets its own
/// `400`, not a `431`).
pub const HTTP1_MAX_HEAD_BYTES: usize = 128 << 10;

/// Blocking tasks (disk reads) each connection runtime may run at once: the main runtime's
/// bound (8 per core) spread over one runtime per core.
const BLOCKING_PER_IO_THREAD: usize = 8;

pub async fn run(
    listener: TcpListener,
    router: Front,
    limits: Limits,
    tls: Option<tokio_rustls::TlsAcceptor>,
    stop: impl Future<Output = ()>,
    grace: Duration,
) -> bool {
    let mut h1 = Builder::new(TokioExecutor::new()).http1_only();
    // The write queue of a connection holds at most HTTP1_BUFFER_BYTES (and one more body
    // piece): what a reader that stops reading can pin in it (hyper's default is about 400 KiB).
    h1.http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .half_close(true)
        .max_buf_size(HTTP1_BUFFER_BYTES);
    let mut h2 = Builder::new(TokioExecutor::new()).http2_only();
    // Pings find HTTP/2 peers that vanished without closing (their streams are then dropped).
    h2.http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(limits.h2_ping_interval)
        .keep_alive_timeout(limits.h2_ping_timeout);
    let (h1, h2) = (Arc::new(h1), Arc::new(h2));
    let own = Arc::new(oncelog_http1::Config {
        header_timeout: limits.header_read_timeout,
        head_limits: oncelog_http1::HeadLimits {
            max_head_bytes: HTTP1_MAX_HEAD_BYTES,
            ..oncelog_http1::HeadLimits::default()
        },
        write_buffer: HTTP1_BUFFER_BYTES,
        ..oncelog_http1::Config::default()
    });
    let registry = Registry::new(limits.max_connections);
    let workers = match limits.io_threads {
        0 => None,
        n => match Workers::start(n, BLOCKING_PER_IO_THREAD) {
            Ok(w) => Some(w),
            Err(e) => {
                tracing::warn!(error = %e, io_threads = n, "cannot start the connection runtimes; serving on the main one");
                None
            }
        },
    };
    tokio::pin!(stop);
    loop {
        let (stream, peer) = tokio::select! {
            () = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                    continue;
                }
            },
        };
        // At the limit, an idle or slow connection makes room (see `conns`), or this one waits
        // for a place (later clients wait in the kernel's backlog meanwhile).
        let place = tokio::select! {
            () = &mut stop => break,
            place = registry.admit() => place,
        };
        let _ = stream.set_nodelay(true);
        metrics::counter!("oncelog_connections_accepted_total").increment(1);
        let front = router.for_peer(peer);
        let (h1, h2) = (h1.clone(), h2.clone());
        let first_bytes_by = tokio::time::Instant::now() + limits.header_read_timeout;
        let tls = tls.clone();
        let own = Arc::clone(&own);
        let serve = move |stream: tokio::net::TcpStream| async move {
            let conn = Arc::clone(place.conn());
            let socket = Socket::new(stream);
            match tls {
                None => {
                    // A connection asked to close before its first request is closed at once.
                    let protocol = tokio::select! {
                        p = sniff(socket.stream(), first_bytes_by) => p,
                        _ = conn.next_order() => None,
                    };
                    let watch = socket.clone();
                    let io = DeadlineIo::new(SendfileIo::new(socket), limits.write_timeout);
                    match (protocol, limits.http1_engine) {
                        (Some(Protocol::Http1), Http1Engine::Oncelog) => {
                            let served = serve_own(io, front, &place, watch, &own);
                            conns::serving_http1(Arc::clone(place.conn()), served).await;
                        }
                        (Some(Protocol::Http1), Http1Engine::Hyper) => {
                            serve_http1(&h1, TokioIo::new(io), front, &place, watch).await
                        }
                        (Some(Protocol::Http2), _) => {
                            serve_io(&h2, TokioIo::new(io), front, &place, None, limits.write_timeout).await
                        }
                        (None, _) => {}
                    }
                }
                Some(acceptor) => {
                    let watch = socket.clone();
                    let stream = DeadlineIo::new(socket, limits.write_timeout);
                    let handshake = tokio::time::timeout_at(first_bytes_by, acceptor.accept(stream));
                    let tls = tokio::select! {
                        done = handshake => match done {
                            Ok(Ok(tls)) => tls,
                            _ => return,
                        },
                        _ = conn.next_order() => return,
                    };
                    let h2_negotiated = tls.get_ref().1.alpn_protocol() == Some(b"h2");
                    let io = TokioIo::new(tls);
                    if h2_negotiated {
                        serve_io(&h2, io, front, &place, None, limits.write_timeout).await;
                    } else {
                        serve_http1(&h1, io, front, &place, watch).await;
                    }
                }
            }
        };
        match &workers {
            Some(workers) => workers.spawn_connection(stream, serve),
            None => {
                tokio::spawn(serve(stream));
            }
        }
    }
    drop(listener);
    registry.shutdown();
    tokio::time::timeout(grace, registry.all_ended()).await.is_ok()
}

/// Serves an HTTP/1 connection: its requests run in its task, and see it as theirs (live readers
/// mark it, see [`crate::conns::mark_live`]).
async fn serve_http1<I>(builder: &Builder<TokioExecutor>, io: I, front: Front, place: &Place, socket: Socket)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    // The write timeout is the socket's own (`DeadlineIo`): an HTTP/1 answer has no window.
    let served = serve_io(builder, io, front, place, Some(&socket), Duration::MAX);
    conns::serving_http1(Arc::clone(place.conn()), served).await;
}

/// Serves a plain HTTP/1 connection with the server's own engine, under the same orders, the
/// same watch for a departed live reader and the same request tracking as [`serve_io`].
async fn serve_own<I>(io: I, front: Front, place: &Place, socket: Socket, config: &oncelog_http1::Config)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let shutdown = oncelog_http1::Shutdown::new();
    // SAFETY: `io` wraps this socket, and `serve_parked` closes the park before it drops `io`.
    let park = unsafe { oncelog_http1::Park::new(std::os::fd::AsRawFd::as_raw_fd(socket.stream())) };
    let tracked = Tracked::new(front, Arc::clone(place.conn()), true);
    // Live readers of this connection may park (see `fanout`).
    place.conn().set_park(park.clone());
    let served = oncelog_http1::serve_parked(io, Some(park), tracked, config, &shutdown);
    tokio::pin!(served);
    let graceful = |_: std::pin::Pin<&mut _>| shutdown.graceful();
    // Errors here are the client's (reset, timeout, malformed framing), answered where they
    // could be.
    if let Some(Err(e)) = drive(served, graceful, place, Some(&socket), Duration::MAX).await {
        tracing::debug!(error = %e, "HTTP/1 connection ended");
    }
}

/// Serves one connection until it ends, or it is closed on an order (see [`crate::conns`]), or,
/// on HTTP/1 (`socket`: its socket), its live reader's client went away, or, on HTTP/2, an
/// answer waited `write_timeout` on the client's flow control.
async fn serve_io<I>(
    builder: &Builder<TokioExecutor>,
    io: I,
    front: Front,
    place: &Place,
    socket: Option<&Socket>,
    write_timeout: Duration,
) where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let http1 = socket.is_some();
    let served =
        builder.serve_connection(io, TowerToHyperService::new(Tracked::new(front, Arc::clone(place.conn()), http1)));
    tokio::pin!(served);
    // Errors here are the client's (reset, timeout, malformed framing); hyper has already
    // answered what could be answered.
    let _ = drive(served, |s| s.graceful_shutdown(), place, socket, write_timeout).await;
}

/// Runs a connection's future `served` (either engine's) until it ends, or the connection is
/// closed on an order, or its live reader's client went away (HTTP/1: `socket`), or an HTTP/2
/// answer stalled past `write_timeout`; `graceful` asks the engine to finish what it serves and
/// close. Returns the future's output when it ended by itself.
async fn drive<F: Future>(
    mut served: std::pin::Pin<&mut F>,
    mut graceful: impl FnMut(std::pin::Pin<&mut F>),
    place: &Place,
    socket: Option<&Socket>,
    write_timeout: Duration,
) -> Option<F::Output> {
    let conn = place.conn();
    let http1 = socket.is_some();
    let mut asked = false;
    loop {
        tokio::select! {
            ended = served.as_mut() => return Some(ended),
            () = departed(conn, socket) => {
                metrics::counter!("oncelog_live_readers_departed_total").increment(1);
                return None;
            }
            // Dropped as HTTP/1 drops a reader that stops reading: hyper cannot reset the one
            // stream, and dropping the connection frees what every stream of it held.
            () = stalled(conn, http1, write_timeout) => {
                tracing::debug!(?write_timeout, "an HTTP/2 answer stalled on the client's flow control: connection closed");
                return None;
            }
            order = conn.next_order() => match order {
                // Checked here, in the task that also runs the request: between this check and
                // the drop, no body can end and no write be applied.
                Order::Slow if conn.is_slow() => return None,
                Order::Slow => place.keep(),
                // Nothing was ever read from it: nothing is lost.
                Order::Idle | Order::Shutdown if http1 && conn.never_used() => return None,
                Order::Idle | Order::Shutdown => {
                    if !asked {
                        asked = true;
                        graceful(served.as_mut());
                    }
                }
            },
        }
    }
}

/// Returns when the client of an HTTP/1 connection (`socket`) closed it while a live reader
/// waits on it; never on HTTP/2 (`None`), whose streams are reset by the client.
///
/// While a request is in flight, HTTP/1 does not read from the socket (a client may half-close
/// after its request and still wants the answer), so a long-poll or an idle SSE reader whose
/// client left would be noticed only at the next write (20-30 s later), holding its place and
/// delaying shutdown. A live read has nothing to lose, so its connection is dropped as soon as
/// the socket reports the client's end (FIN or reset).
async fn departed(conn: &Conn, socket: Option<&Socket>) {
    let Some(socket) = socket else { return std::future::pending().await };
    loop {
        conn.wait_live(true).await;
        tokio::select! {
            () = peer_closed(socket.stream()) => return,
            () = conn.wait_live(false) => {}
        }
    }
}

/// Returns when an answer on an HTTP/2 connection waited `write_timeout` on the client's flow
/// control; never on HTTP/1, whose answers block the socket's writes instead.
async fn stalled(conn: &Conn, http1: bool, write_timeout: Duration) {
    if http1 {
        return std::future::pending().await;
    }
    conn.stalled(write_timeout).await;
}

/// How often a socket holding bytes hyper has not read (a pipelined request, a TLS alert) is
/// looked at again for the client's end: its readiness stays set until they are read.
const DEPARTED_RECHECK: Duration = Duration::from_millis(250);

async fn peer_closed(socket: &tokio::net::TcpStream) {
    use std::os::fd::AsRawFd;
    loop {
        match socket.ready(Interest::READABLE).await {
            Ok(ready) if ready.is_read_closed() || ready.is_write_closed() || ready.is_error() => return,
            Ok(_) => {}
            Err(_) => return,
        }
        // Readable: the client's end, bytes hyper has not read, or a readiness left over from
        // hyper's last read. A peek tells them apart; in the last case it also clears the
        // readiness (`try_io` does on `WouldBlock`), so the next wait sleeps until an event.
        let mut byte = [0u8; 1];
        let peeked = socket.try_io(Interest::READABLE, || {
            // SAFETY: a valid one-byte buffer, on the open socket of the calling connection.
            let n = unsafe {
                libc::recv(socket.as_raw_fd(), byte.as_mut_ptr().cast(), 1, libc::MSG_PEEK | libc::MSG_DONTWAIT)
            };
            usize::try_from(n).map_err(|_| std::io::Error::last_os_error())
        });
        match peeked {
            Ok(0) => return,
            Ok(_) => tokio::time::sleep(DEPARTED_RECHECK).await,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}
