//! Bounds on live readers (long-poll and SSE): in all, per stream, and — for readers that hold
//! a connection of their own (HTTP/1) — below the connection limit by a reserve. A reader holds
//! a [`LiveSlot`] while it waits or streams; beyond a bound the read is answered `503` with
//! `Retry-After` (and, on HTTP/1, `Connection: close`, so the refused connection's place is free
//! at once), and counted, so a flood of readers can neither take every task and socket of the
//! server nor the last connections a writer needs.

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
    /// Readers that hold a connection of their own may take this many connections at most.
    max_on_own_connection: usize,
    held: Mutex<Held>,
}

#[derive(Default)]
struct Held {
    total: usize,
    on_own_connection: usize,
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
    own_connection: bool,
    /// Shared by the stream's live readers while any is left.
    pub frames: Arc<FrameCell>,
    _gauge: metrics::LiveReader,
    /// On HTTP/1: the reader's connection holds a live reader (neither idle nor slow, and
    /// dropped when its client leaves; see `conns`).
    _connection: Option<crate::conns::LiveMark>,
}

impl LiveSlots {
    /// Bounds of `max_total` readers, `max_per_stream` per stream, and, of `max_connections`,
    /// all but [`connection_reserve`] for readers on a connection of their own.
    pub fn new(max_total: usize, max_per_stream: usize, max_connections: usize) -> Arc<Self> {
        let max_on_own_connection = max_connections.saturating_sub(connection_reserve(max_connections));
        Arc::new(Self { max_total, max_per_stream, max_on_own_connection, held: Mutex::new(Held::default()) })
    }

    /// Takes a place for a `mode` reader of `path` (`own_connection`: on an HTTP/1 connection,
    /// which it holds while it reads; an HTTP/2 reader shares its connection), or refuses it.
    pub fn acquire(
        self: &Arc<Self>,
        path: &str,
        mode: &'static str,
        own_connection: bool,
    ) -> Result<LiveSlot, TooManyReaders> {
        let mut held = self.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let here = held.per_stream.get(path).map_or(0, |(n, _)| *n);
        let full = if held.total >= self.max_total {
            Some(Full::Total)
        } else if here >= self.max_per_stream {
            Some(Full::Stream)
        } else if own_connection && held.on_own_connection >= self.max_on_own_connection {
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
        if own_connection {
            held.on_own_connection += 1;
        }
        let entry = held.per_stream.entry(path.to_owned()).or_default();
        entry.0 += 1;
        let frames = Arc::clone(&entry.1);
        Ok(LiveSlot {
            slots: Arc::clone(self),
            path: path.to_owned(),
            own_connection,
            frames,
            _gauge: metrics::LiveReader::open(mode),
            _connection: if own_connection { crate::conns::mark_live() } else { None },
        })
    }
}

impl Drop for LiveSlot {
    fn drop(&mut self) {
        let mut held = self.slots.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        held.total = held.total.saturating_sub(1);
        if self.own_connection {
            held.on_own_connection = held.on_own_connection.saturating_sub(1);
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

    #[test]
    fn bounds_hold_and_places_come_back() {
        let slots = LiveSlots::new(3, 2, 1000);
        let a1 = slots.acquire("a", "sse", true).expect("a1");
        let _a2 = slots.acquire("a", "sse", true).expect("a2");
        assert_eq!(slots.acquire("a", "sse", true).err(), Some(TooManyReaders(Full::Stream)));
        let _b1 = slots.acquire("b", "long-poll", false).expect("b1");
        assert_eq!(slots.acquire("c", "sse", false).err(), Some(TooManyReaders(Full::Total)));
        drop(a1);
        let _c1 = slots.acquire("c", "sse", true).expect("a place came back");
    }

    #[test]
    fn readers_on_connections_of_their_own_leave_the_reserve_free() {
        // 32 connections: 2 reserved, 30 for live readers on HTTP/1.
        let slots = LiveSlots::new(1000, 1000, 32);
        assert_eq!(connection_reserve(32), 2);
        let held: Vec<LiveSlot> =
            (0..30).map(|i| slots.acquire("s", "sse", true).unwrap_or_else(|e| panic!("{i}: {e}"))).collect();
        assert_eq!(slots.acquire("s", "sse", true).err(), Some(TooManyReaders(Full::Connections)));
        // HTTP/2 readers share their connection: not bounded by it.
        let _h2 = slots.acquire("s", "sse", false).expect("an HTTP/2 reader");
        drop(held);
        assert!(slots.acquire("s", "sse", true).is_ok());
        assert_eq!((connection_reserve(16_384), connection_reserve(1_000_000), connection_reserve(2)), (1024, 1024, 1));
    }
}
