//! Batching: items accumulate in an open batch until a size or count limit, the linger time, a
//! flush or a close seals it into one request body; and the [`Ack`] each item's waiter is told.

use bytes::Bytes;
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::error::Error;
use crate::offset::StreamOffset;

/// How an appended item ended: stored, in the batch `(epoch, seq)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ack {
    /// The stream's offset after the batch that carried the item (for a duplicate older than the
    /// server's receipt window, a later offset).
    pub next_offset: StreamOffset,
    /// The batch's epoch.
    pub epoch: u64,
    /// The batch's sequence number.
    pub seq: u64,
    /// Whether the server had already stored the batch (an earlier attempt's answer was lost).
    pub duplicate: bool,
}

/// Who is told how an item (or a close) ended.
pub(crate) type Waiter = oneshot::Sender<Result<Ack, Error>>;

/// Limits that seal a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    /// Largest body; an item alone may exceed it (it then travels alone).
    pub max_bytes: usize,
    /// Most items per batch.
    pub max_items: usize,
    /// JSON streams: the body is `[item,item,...]` so each item is one message.
    pub json: bool,
}

/// The batch being filled.
#[derive(Debug, Default)]
pub(crate) struct OpenBatch {
    /// The items, in append order.
    items: Vec<Bytes>,
    /// One waiter per item.
    waiters: Vec<Waiter>,
    /// Body size if sealed now.
    body_len: usize,
    /// Buffer permits held by the items, returned when the batch is done.
    permits: usize,
    /// When the first item arrived: the linger clock.
    started: Option<Instant>,
}

/// A sealed batch, ready to be sequenced and sent.
#[derive(Debug)]
pub(crate) struct Sealed {
    /// The request body.
    pub body: Bytes,
    /// One waiter per item.
    pub waiters: Vec<Waiter>,
    /// Buffer permits to give back when done.
    pub permits: usize,
}

impl OpenBatch {
    pub(crate) fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// When the linger time started.
    pub(crate) fn started(&self) -> Option<Instant> {
        self.started
    }

    /// The body size after adding an item of `len` bytes.
    fn len_with(&self, len: usize, limits: Limits) -> usize {
        if limits.json {
            // `[` + items joined by `,` + `]`
            if self.items.is_empty() {
                len + 2
            } else {
                self.body_len + 1 + len
            }
        } else {
            self.body_len + len
        }
    }

    /// Whether an item of `len` bytes must go into a new batch (this one would overflow).
    pub(crate) fn would_overflow(&self, len: usize, limits: Limits) -> bool {
        !self.items.is_empty() && self.len_with(len, limits) > limits.max_bytes
    }

    /// Adds an item; returns whether the batch is now full and must be sealed.
    pub(crate) fn push(&mut self, item: Bytes, permits: usize, waiter: Waiter, limits: Limits, now: Instant) -> bool {
        self.body_len = self.len_with(item.len(), limits);
        self.items.push(item);
        self.waiters.push(waiter);
        self.permits += permits;
        self.started.get_or_insert(now);
        self.body_len >= limits.max_bytes || self.items.len() >= limits.max_items
    }

    /// Seals the batch into a body, leaving this one empty.
    pub(crate) fn seal(&mut self, limits: Limits) -> Sealed {
        let items = std::mem::take(&mut self.items);
        let mut body = Vec::with_capacity(self.body_len + items.len() + 2);
        if limits.json {
            oncelog_protocol::json::write_array(items.iter().map(|i| &i[..]), &mut body);
        } else {
            for item in &items {
                body.extend_from_slice(item);
            }
        }
        let sealed =
            Sealed { body: Bytes::from(body), waiters: std::mem::take(&mut self.waiters), permits: self.permits };
        self.body_len = 0;
        self.permits = 0;
        self.started = None;
        sealed
    }

    /// Takes the waiters and permits out (the batch failed before it was sealed).
    pub(crate) fn abandon(&mut self) -> (Vec<Waiter>, usize) {
        self.items.clear();
        self.body_len = 0;
        self.started = None;
        (std::mem::take(&mut self.waiters), std::mem::take(&mut self.permits))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiter() -> Waiter {
        oneshot::channel().0
    }

    #[test]
    fn byte_batches_concatenate_and_seal_at_the_limits() {
        let limits = Limits { max_bytes: 10, max_items: 3, json: false };
        let now = Instant::now();
        let mut b = OpenBatch::default();
        assert!(!b.push(Bytes::from_static(b"abcd"), 4, waiter(), limits, now));
        assert!(!b.would_overflow(6, limits));
        assert!(b.would_overflow(7, limits), "4 + 7 > 10");
        assert!(b.push(Bytes::from_static(b"efghij"), 6, waiter(), limits, now), "exactly 10 bytes: full");
        let s = b.seal(limits);
        assert_eq!((&s.body[..], s.waiters.len(), s.permits), (&b"abcdefghij"[..], 2, 10));
        assert!(b.is_empty() && b.started().is_none());

        for _ in 0..2 {
            assert!(!b.push(Bytes::from_static(b"x"), 1, waiter(), limits, now));
        }
        assert!(b.push(Bytes::from_static(b"x"), 1, waiter(), limits, now), "three items: full");
    }

    #[test]
    fn json_batches_are_one_array() {
        let limits = Limits { max_bytes: 100, max_items: 100, json: true };
        let now = Instant::now();
        let mut b = OpenBatch::default();
        for item in [&b"{\"a\":1}"[..], b"[1,2]", b"\"s\""] {
            b.push(Bytes::copy_from_slice(item), item.len(), waiter(), limits, now);
        }
        let s = b.seal(limits);
        assert_eq!(&s.body[..], b"[{\"a\":1},[1,2],\"s\"]");
        let v: Vec<serde_json::Value> = serde_json::from_slice(&s.body).expect("valid JSON");
        assert_eq!(v.len(), 3, "an array item stays one message: the server flattens one level");
    }

    #[test]
    fn an_oversized_item_goes_alone() {
        let limits = Limits { max_bytes: 4, max_items: 100, json: false };
        let mut b = OpenBatch::default();
        assert!(!b.would_overflow(100, limits), "an empty batch takes anything");
        assert!(b.push(Bytes::from(vec![0; 100]), 100, waiter(), limits, Instant::now()));
    }
}
