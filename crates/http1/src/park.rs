//! Writing an answer's body from outside the connection's task while the answer waits (issue 47,
//! "live readers on a reactor"): a live reader parked at the tail of its stream costs its task
//! nothing per event; whoever holds the connection's [`Park`] writes the event to the socket
//! with one `sendmsg`, framed as the answer is (a chunk, or raw bytes for an answer delimited by
//! the close).
//!
//! The rules that keep the bytes in order:
//! - a write from outside goes out only while the connection is **idle**: it waits on the body
//!   of a chunked (or close-delimited) answer with everything before written (its buffer
//!   flushed). Any other time [`Park::send`] refuses ([`Sent::NotNow`]) and writes nothing.
//! - a write the socket takes only in part leaves its rest with the park; the connection is
//!   woken and writes that rest before anything else, and the park is no longer idle.
//! - the socket's descriptor is forgotten ([`Park::close`]) before the connection drops the
//!   socket, under the same lock a write takes: a park never writes to a descriptor that was
//!   closed (or reused).
//!
//! Written by hand: the engine's own write path, for the one thing a general engine does not
//! offer (a write into an answer from beside it).

use std::io::IoSlice;
use std::os::fd::RawFd;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::Waker;

/// A connection's socket as seen from outside its task; cheap to clone.
#[derive(Clone)]
pub struct Park(Arc<Mutex<State>>);

impl std::fmt::Debug for Park {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.lock();
        f.debug_struct("Park").field("fd", &s.fd).field("idle", &s.idle).finish()
    }
}

struct State {
    /// The socket; -1 once the connection is done with it.
    fd: RawFd,
    /// The connection waits on its answer's body with all before written (see the module docs).
    idle: bool,
    /// How the waiting answer's body is framed: chunks, or raw bytes.
    chunked: bool,
    /// What a write from outside left unwritten: the connection writes it before anything else.
    rest: Vec<u8>,
    /// The connection's task, woken when a rest is left for it.
    waker: Option<Waker>,
}

/// What became of a [`Park::send`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sent {
    /// All of it went out.
    All,
    /// It is committed: part went out, the connection writes the rest (the socket is full; the
    /// connection's own writes, with their deadline, take over).
    Partly,
    /// Nothing went out: the socket is full.
    Blocked,
    /// Nothing went out: the connection is not waiting on a body (or is gone), or the socket
    /// failed (the connection's own next write finds out).
    NotNow,
}

impl Park {
    /// A park for the connection on socket `fd`.
    ///
    /// # Safety
    /// `fd` must stay open until [`Park::close`] is called on this park (or a clone): give the
    /// park to [`crate::serve_parked`] with the socket it serves, which closes it before it
    /// drops the socket.
    pub unsafe fn new(fd: RawFd) -> Park {
        Park(Arc::new(Mutex::new(State { fd, idle: false, chunked: false, rest: Vec::new(), waker: None })))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Writes `data` as the next piece of the waiting answer's body, without blocking.
    pub fn send(&self, data: &[u8]) -> Sent {
        if data.is_empty() {
            return Sent::All;
        }
        let mut s = self.lock();
        if s.fd < 0 || !s.idle {
            return Sent::NotNow;
        }
        let (line, line_len) = if s.chunked { crate::response::chunk_line(data.len()) } else { ([0; 18], 0) };
        let end: &[u8] = if s.chunked { crate::response::CHUNK_END } else { b"" };
        let parts = [IoSlice::new(&line[..line_len]), IoSlice::new(data), IoSlice::new(end)];
        let total = line_len + data.len() + end.len();
        let n = match send_now(s.fd, &parts) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Sent::Blocked,
            Err(_) => return Sent::NotNow,
        };
        if n == total {
            return Sent::All;
        }
        if n == 0 {
            return Sent::Blocked;
        }
        let mut rest = Vec::with_capacity(total - n);
        let mut skip = n;
        for part in &parts {
            let taken = skip.min(part.len());
            rest.extend_from_slice(&part[taken..]);
            skip -= taken;
        }
        s.rest = rest;
        s.idle = false;
        if let Some(w) = s.waker.take() {
            w.wake();
        }
        Sent::Partly
    }

    /// The connection waits on its answer's body (`chunked`: framed in chunks), woken by
    /// `waker`; returns instead a rest to write first when one was left.
    pub(crate) fn wait(&self, chunked: bool, waker: &Waker) -> Option<Vec<u8>> {
        let mut s = self.lock();
        if !s.rest.is_empty() {
            s.idle = false;
            return Some(std::mem::take(&mut s.rest));
        }
        s.idle = true;
        s.chunked = chunked;
        if !s.waker.as_ref().is_some_and(|w| w.will_wake(waker)) {
            s.waker = Some(waker.clone());
        }
        None
    }

    /// The body gave the connection something: it writes again (after the rest, if any).
    pub(crate) fn resume(&self) -> Option<Vec<u8>> {
        let mut s = self.lock();
        s.idle = false;
        s.waker = None;
        (!s.rest.is_empty()).then(|| std::mem::take(&mut s.rest))
    }

    /// The connection is done with the socket: nothing is written through this park again.
    pub fn close(&self) {
        let mut s = self.lock();
        s.fd = -1;
        s.idle = false;
        s.waker = None;
    }
}

/// One `sendmsg` that neither blocks nor raises `SIGPIPE`.
fn send_now(fd: RawFd, parts: &[IoSlice<'_>]) -> std::io::Result<usize> {
    // SAFETY: an all-zero `msghdr` is valid (no name, no control data); `msg_iov` then points
    // at `parts`, `IoSlice` is ABI-compatible with `iovec`, and both outlive the call. `fd` is
    // open: the caller holds the park's lock, and `close` takes the same lock before the
    // connection drops the socket.
    let n = unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = parts.as_ptr() as *mut libc::iovec;
        msg.msg_iovlen = parts.len() as _;
        libc::sendmsg(fd, &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL)
    };
    usize::try_from(n).map_err(|_| std::io::Error::last_os_error())
}
