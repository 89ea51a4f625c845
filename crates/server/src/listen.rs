//! The connection loop: accepts TCP connections and serves each with HTTP/1.1 or HTTP/2 (h2c
//! with prior knowledge; the protocol is detected from the first bytes), under limits that keep
//! broken or hostile clients from holding the server's resources:
//!
//! - at most [`Limits::max_connections`] connections are served at once; beyond that the
//!   listener stops accepting until one closes (new clients wait in the kernel's backlog);
//! - an HTTP/1 client gets [`Limits::header_read_timeout`] to send each request's headers, which
//!   also bounds how long an idle keep-alive connection stays open (slowloris, idle sockets);
//! - a write to a client may stay blocked (the client not reading) for at most
//!   [`Limits::write_timeout`]; then the connection is closed and what was queued for it freed;
//! - a client that half-closes its socket after a complete request still gets its answer
//!   (HTTP/1 half-close): a write applied without an answer is the ambiguity this server exists
//!   to remove.
//!
//! With TLS ([`crate::tls`]) the protocol is the one ALPN negotiated (`h2` or `http/1.1`), and
//! the handshake must finish within the header-read timeout.
//!
//! Written with `hyper-util`'s connection builder rather than `axum::serve`, which exposes none of
//! these settings.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::front::Front;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::deadline_io::DeadlineIo;
use crate::sendfile_io::SendfileIo;

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
}

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
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    tokio::pin!(stop);
    loop {
        let permit = tokio::select! {
            () = &mut stop => break,
            permit = slots.clone().acquire_owned() => match permit {
                Ok(p) => p,
                Err(_) => break,
            },
        };
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
        let _ = stream.set_nodelay(true);
        metrics::counter!("oncelog_connections_accepted_total").increment(1);
        let service = TowerToHyperService::new(router.for_peer(peer));
        let (h1, h2) = (h1.clone(), h2.clone());
        let watcher = graceful.watcher();
        let first_bytes_by = tokio::time::Instant::now() + limits.header_read_timeout;
        let tls = tls.clone();
        tokio::spawn(async move {
            match tls {
                None => {
                    let builder = match sniff(&stream, first_bytes_by).await {
                        Some(Protocol::Http1) => h1,
                        Some(Protocol::Http2) => h2,
                        None => return,
                    };
                    serve_io(
                        &builder,
                        TokioIo::new(DeadlineIo::new(SendfileIo::new(stream), limits.write_timeout)),
                        service,
                        watcher,
                    )
                    .await;
                }
                Some(acceptor) => {
                    let stream = DeadlineIo::new(stream, limits.write_timeout);
                    let Ok(Ok(tls)) = tokio::time::timeout_at(first_bytes_by, acceptor.accept(stream)).await else {
                        return;
                    };
                    let builder = if tls.get_ref().1.alpn_protocol() == Some(b"h2") { h2 } else { h1 };
                    serve_io(&builder, TokioIo::new(tls), service, watcher).await;
                }
            }
            drop(permit);
        });
    }
    drop(listener);
    tokio::time::timeout(grace, graceful.shutdown()).await.is_ok()
}

/// Serves one connection until it ends or the graceful shutdown it is watched by closes it.
async fn serve_io<I>(
    builder: &Builder<TokioExecutor>,
    io: I,
    service: TowerToHyperService<Front>,
    watcher: hyper_util::server::graceful::Watcher,
) where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let conn = builder.serve_connection(io, service);
    // Errors here are the client's (reset, timeout, malformed framing); hyper has already
    // answered what could be answered.
    let _ = watcher.watch(conn).await;
}
