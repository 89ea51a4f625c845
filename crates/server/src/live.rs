//! Bounds on live readers (long-poll and SSE): in all, per stream, and in the connections they
//! hold — an HTTP/1 connection with its reader, an HTTP/2 connection with one or more — below the
//! connection limit by a reserve. A reader holds a [`LiveSlot`] while it waits or streams; beyond
//! a bound the read is answered `503` with `Retry-After` (and, on HTTP/1, `Connection: close`,
//! so the refused connection's place is free at once), and counted, so a flood of readers can
//! neither take every task and socket of the server nor the last connections a writer needs.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use oncelog_protocol::Offset;

use crate::metrics;

/// Which bound refused a reader (the `reason` label of the refusals' counter).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Full {
    /// `--max-live-readers`.
    Total,
    /// `--max-live-readers-per-stream`.
    Stream,
    /// The connections live readers may hold: `--max-connections` less its reserve.
    Connections,
}

impl Full {
    pub fn label(self) -> &'static str {
        match self {
            Full::Total => "total",
            Full::Stream => "stream",
            Full::Connections => "connections",
        }
    }
}

/// Every place is taken (answered `503` with `Retry-After`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("too many live readers; retry later")]
pub struct TooManyReaders(pub Full);

pub use crate::conns::connection_reserve;

/// The counters behind the bounds.
pub struct LiveSlots {
    max_total: usize,
    max_per_stream: usize,
    /// Connections holding live readers: this many at most.
    max_connections_held: usize,
    held: Mutex<Held>,
}

#[derive(Default)]
struct Held {
    total: usize,
    /// Connections with at least one live reader (changed only under this lock).
    connections: usize,
    /// Readers per stream path (the sum is the total), and what they share.
    per_stream: HashMap<String, (usize, Arc<FrameCell>)>,
}

/// An SSE event (data and its control event, whole) framed by one reader of a stream, for the
/// stream's other SSE readers: with many readers at the tail, each commit is read and framed
/// once, and every other reader woken by it sends these bytes as they are. A reader uses it only
/// where it would have framed the same bytes (see `read::SseState::shared_frame`).
#[derive(Debug)]
pub struct Framed {
    /// The stream's id: a path deleted and created again is another stream.
    pub id: u64,
    /// The offsets the data event covers.
    pub from: Offset,
    pub next: Offset,
    /// The control event's cursor.
    pub cursor: u64,
    /// What the control event says.
    pub up_to_date: bool,
    pub closed: bool,
    pub bytes: Bytes,
}

impl Framed {
    /// The stream bytes the event carries.
    pub fn bytes_covered(&self) -> usize {
        usize::try_from(self.next.0 - self.from.0).unwrap_or(usize::MAX)
    }
}

/// The newest [`Framed`] event of one stream.
#[derive(Debug, Default)]
pub struct FrameCell(Mutex<Option<Arc<Framed>>>);

impl FrameCell {
    pub fn get(&self) -> Option<Arc<Framed>> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    pub fn put(&self, framed: Framed) {
        *self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Arc::new(framed));
    }
}

/// One reader's place; given back when dropped.
pub struct LiveSlot {
    slots: Arc<LiveSlots>,
    path: String,
    /// Shared by the stream's live readers while any is left.
    pub frames: Arc<FrameCell>,
    _gauge: metrics::LiveReader,
    /// The reader's connection holds a live reader (neither idle nor slow; on HTTP/1 dropped
    /// when its client leaves; see `conns`).
    connection: Option<crate::conns::LiveMark>,
}

impl LiveSlots {
    /// Bounds of `max_total` readers, `max_per_stream` per stream, and, of `max_connections`,
    /// all but [`connection_reserve`] for the connections live readers hold.
    pub fn new(max_total: usize, max_per_stream: usize, max_connections: usize) -> Arc<Self> {
        let max_connections_held = max_connections.saturating_sub(connection_reserve(max_connections));
        Arc::new(Self { max_total, max_per_stream, max_connections_held, held: Mutex::new(Held::default()) })
    }

    /// Takes a place for a `mode` reader of `path` on the connection the current task serves
    /// (see `conns::current`), or refuses it.
    pub fn acquire(self: &Arc<Self>, path: &str, mode: &'static str) -> Result<LiveSlot, TooManyReaders> {
        self.acquire_on(path, mode, crate::conns::current())
    }

    /// [`LiveSlots::acquire`] on `connection`: the first live reader of a connection makes it one
    /// the readers hold (an HTTP/2 connection's next ones share it).
    pub fn acquire_on(
        self: &Arc<Self>,
        path: &str,
        mode: &'static str,
        connection: Option<Arc<crate::conns::Conn>>,
    ) -> Result<LiveSlot, TooManyReaders> {
        let mut held = self.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let here = held.per_stream.get(path).map_or(0, |(n, _)| *n);
        let takes_connection = connection.as_ref().is_some_and(|c| !c.is_live());
        let full = if held.total >= self.max_total {
            Some(Full::Total)
        } else if here >= self.max_per_stream {
            Some(Full::Stream)
        } else if takes_connection && held.connections >= self.max_connections_held {
            Some(Full::Connections)
        } else {
            None
        };
        if let Some(full) = full {
            drop(held);
            metrics::live_reader_refused(full.label());
            return Err(TooManyReaders(full));
        }
        held.total += 1;
        if takes_connection {
            held.connections += 1;
        }
        let entry = held.per_stream.entry(path.to_owned()).or_default();
        entry.0 += 1;
        let frames = Arc::clone(&entry.1);
        Ok(LiveSlot {
            slots: Arc::clone(self),
            path: path.to_owned(),
            frames,
            _gauge: metrics::LiveReader::open(mode),
            // Marked under the lock: whether a connection already holds a reader is decided
            // here only.
            connection: connection.map(crate::conns::LiveMark::new),
        })
    }
}

impl Drop for LiveSlot {
    fn drop(&mut self) {
        let mut held = self.slots.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        held.total = held.total.saturating_sub(1);
        if let Some(mark) = self.connection.take() {
            if mark.is_last() {
                held.connections = held.connections.saturating_sub(1);
            }
        }
        if let Some((n, _)) = held.per_stream.get_mut(&self.path) {
            *n -= 1;
            if *n == 0 {
                held.per_stream.remove(&self.path);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::conns::Conn;

    fn conn() -> Option<Arc<Conn>> {
        Some(crate::conns::test_conn())
    }

    #[test]
    fn bounds_hold_and_places_come_back() {
        let slots = LiveSlots::new(3, 2, 1000);
        let a1 = slots.acquire_on("a", "sse", conn()).expect("a1");
        let _a2 = slots.acquire_on("a", "sse", conn()).expect("a2");
        assert_eq!(slots.acquire_on("a", "sse", conn()).err(), Some(TooManyReaders(Full::Stream)));
        let _b1 = slots.acquire_on("b", "long-poll", None).expect("b1");
        assert_eq!(slots.acquire_on("c", "sse", None).err(), Some(TooManyReaders(Full::Total)));
        drop(a1);
        let _c1 = slots.acquire_on("c", "sse", conn()).expect("a place came back");
    }

    #[test]
    fn the_connections_readers_hold_leave_the_reserve_free() {
        // 32 connections: 2 reserved, 30 for the connections live readers hold.
        let slots = LiveSlots::new(1000, 1000, 32);
        assert_eq!(connection_reserve(32), 2);
        let mut held: Vec<LiveSlot> =
            (0..30).map(|i| slots.acquire_on("s", "sse", conn()).unwrap_or_else(|e| panic!("{i}: {e}"))).collect();
        assert_eq!(slots.acquire_on("s", "sse", conn()).err(), Some(TooManyReaders(Full::Connections)));
        // An HTTP/2 connection that already holds a reader takes no other place for its next.
        let shared = crate::conns::test_conn();
        drop(held.pop());
        let first = slots.acquire_on("s", "sse", Some(Arc::clone(&shared))).expect("the first on a connection");
        assert_eq!(slots.acquire_on("s", "sse", conn()).err(), Some(TooManyReaders(Full::Connections)));
        let second = slots.acquire_on("s", "sse", Some(Arc::clone(&shared))).expect("a second on the same one");
        // The connection's place comes back with its last reader only.
        drop(first);
        assert_eq!(slots.acquire_on("s", "sse", conn()).err(), Some(TooManyReaders(Full::Connections)));
        drop(second);
        assert!(slots.acquire_on("s", "sse", conn()).is_ok());
        assert_eq!((connection_reserve(16_384), connection_reserve(1_000_000), connection_reserve(2)), (1024, 1024, 1));
    }
}
