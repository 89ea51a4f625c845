//! A plain TCP socket that sends body bytes which are a mapped file range
//! ([`oncelog_storage::file_bytes`]) with `sendfile(2)`: the kernel takes them from the page
//! cache, so a catch-up response of segment data costs no copy through user memory. Everything
//! else is written as usual. Connections without TLS use it, HTTP/1 and h2c alike (a slice it finds
//! is sent as the same bytes, whatever frames them); under TLS the bytes must be encrypted, and
//! the socket sees only ciphertext.
//!
//! hyper writes a response as a list of slices (head, then body pieces); a write that meets a
//! mapped slice first writes the slices before it, then `sendfile`s that one. Short writes are
//! fine: hyper advances past what was written and calls again with the rest.

use std::io;
use std::os::fd::AsRawFd;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use oncelog_storage::file_bytes::{self, FileSpan};
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::TcpStream;

/// See the module docs.
pub struct SendfileIo(Socket);

impl SendfileIo {
    pub fn new(socket: Socket) -> Self {
        SendfileIo(socket)
    }

    fn poll_send_file(&self, cx: &mut Context<'_>, span: &FileSpan, len: usize) -> Poll<io::Result<usize>> {
        let stream = self.0.stream();
        // One call sends at most this much (Linux's own cap on a transfer).
        let len = len.min(0x7fff_f000);
        loop {
            ready!(stream.poll_write_ready(cx))?;
            let sent = stream.try_io(Interest::WRITABLE, || send_file(stream.as_raw_fd(), span, len));
            match sent {
                Ok(n) => {
                    metrics::counter!("oncelog_sendfile_bytes_total").increment(n as u64);
                    return Poll::Ready(Ok(n));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

fn send_file(socket: i32, span: &FileSpan, len: usize) -> io::Result<usize> {
    let mut offset = libc::off_t::try_from(span.offset).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: both descriptors are open (the socket is ours; the file is held by `span`), and
    // `offset` is a valid pointer for the duration of the call.
    let n = unsafe { libc::sendfile(socket, span.file.as_raw_fd(), &mut offset, len) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

impl AsyncRead for SendfileIo {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for SendfileIo {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if let Some(span) = file_bytes::lookup(buf) {
            return self.poll_send_file(cx, &span, buf.len());
        }
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match bufs.iter().enumerate().find_map(|(i, b)| file_bytes::lookup(b).map(|s| (i, s))) {
            None => Pin::new(&mut self.0).poll_write_vectored(cx, bufs),
            Some((0, span)) => self.poll_send_file(cx, &span, bufs[0].len()),
            Some((i, _)) => Pin::new(&mut self.0).poll_write_vectored(cx, &bufs[..i]),
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// A connection's TCP socket, shared: hyper reads and writes it through one handle, and the
/// connection's task watches it through another for the client's end while a live reader waits
/// (`listen::departed`), on the same registration (no second descriptor per reader).
#[derive(Clone)]
pub struct Socket(Arc<TcpStream>);

impl Socket {
    pub fn new(stream: TcpStream) -> Self {
        Socket(Arc::new(stream))
    }

    pub fn stream(&self) -> &TcpStream {
        &self.0
    }
}

impl AsyncRead for Socket {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let stream = &*self.0;
        loop {
            ready!(stream.poll_read_ready(cx))?;
            // SAFETY: `recv` writes at most `unfilled.len()` bytes into `unfilled`, and only the
            // bytes it reports written are then marked initialised.
            let unfilled = unsafe { buf.unfilled_mut() };
            let read = stream.try_io(Interest::READABLE, || {
                let n = unsafe { libc::recv(stream.as_raw_fd(), unfilled.as_mut_ptr().cast(), unfilled.len(), 0) };
                usize::try_from(n).map_err(|_| io::Error::last_os_error())
            });
            match read {
                Ok(n) => {
                    // SAFETY: see above.
                    unsafe { buf.assume_init(n) };
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl AsyncWrite for Socket {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        loop {
            ready!(self.0.poll_write_ready(cx))?;
            match self.0.try_write(buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                written => return Poll::Ready(written),
            }
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        loop {
            ready!(self.0.poll_write_ready(cx))?;
            match self.0.try_write_vectored(bufs) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                written => return Poll::Ready(written),
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // SAFETY: the descriptor is open for as long as `self`.
        let r = unsafe { libc::shutdown(self.0.as_raw_fd(), libc::SHUT_WR) };
        Poll::Ready(if r == 0 { Ok(()) } else { Err(io::Error::last_os_error()) })
    }
}
