//! Single-flight reads. A commit wakes every live reader of its stream at once (200 SSE readers
//! of one stream: 200 row reads and 200 data reads per message), and they all ask the database
//! the same thing. Here the first asks and the others share its answer:
//!
//! - a live wait's look at a stream's row, keyed by path and the node's *wake epoch*: every
//!   wake-up this node sees bumps the epoch before waking anyone, so a waiter joins only a read
//!   that began after the wake-up that woke it (never an answer older than the commit it was
//!   woken for; a wait that sees an older tail just waits again). Any answer under the current
//!   epoch is that fresh, so finished ones are kept and shared too, until the epoch moves. Plain reads and heads do not
//!   share row reads: joining one that began before a write acknowledged by another node could
//!   miss that write, and they must reflect every acknowledged write;
//! - a range of data, keyed by stream id, start, tail and size: bytes below a tail never change
//!   (a trim that removes some is caught by the reader as for an unshared read).
//!
//! Visibility (expiry at the reader's own clock) is decided by each reader, not shared.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use futures_util::future::{BoxFuture, FutureExt, Shared};
use oncelog_storage::StorageError;

/// In-flight reads of one kind, by key.
pub(crate) struct Flights<K, V: Clone> {
    inflight: Mutex<HashMap<K, Shared<BoxFuture<'static, Result<V, StorageError>>>>>,
    /// Keep finished answers too (for keys that make any answer under them valid, such as a
    /// wake epoch: every read under it began after that wake-up), at most this many.
    keep: usize,
}

impl<K, V: Clone> Default for Flights<K, V> {
    fn default() -> Self {
        Flights { inflight: Mutex::new(HashMap::new()), keep: 0 }
    }
}

impl<K, V: Clone> Flights<K, V> {
    /// Flights whose finished answers stay valid for their key: kept (up to `keep`, all dropped
    /// when full) so readers arriving after a read ended share it too.
    pub fn keeping(keep: usize) -> Self {
        Flights { inflight: Mutex::new(HashMap::new()), keep }
    }
}

impl<K: Hash + Eq + Clone + Send + 'static, V: Clone + Send + Sync + 'static> Flights<K, V> {
    /// The answer of the read in flight for `key`, or of a new one made by `start`.
    pub async fn run(
        &self,
        key: K,
        start: impl FnOnce() -> BoxFuture<'static, Result<V, StorageError>>,
    ) -> Result<V, StorageError> {
        let fut = {
            let mut map = self.inflight.lock().unwrap_or_else(|p| p.into_inner());
            if self.keep > 0 && map.len() >= self.keep && !map.contains_key(&key) {
                map.clear();
            }
            map.entry(key.clone()).or_insert_with(|| finished_by_itself(start()).shared()).clone()
        };
        let out = fut.clone().await;
        if self.keep > 0 && out.is_ok() {
            return out;
        }
        // Whoever sees it finish removes it (the reader that began it may have gone): unless kept,
        // only reads in flight are ever joined, never finished answers; a failure is never kept.
        let mut map = self.inflight.lock().unwrap_or_else(|p| p.into_inner());
        if map.get(&key).is_some_and(|f| f.ptr_eq(&fut)) {
            map.remove(&key);
        }
        out
    }
}

/// `read` run as a task of its own, so that it ends (and gives back the connection it holds)
/// even when every reader sharing it went away: a shared future is driven only by those who
/// await it, and one whose readers all left would sit in the map mid-query, holding a pooled
/// connection, until another reader joined its key — with keys of a past wake epoch, never (16
/// such reads held the whole pool: every request then answered 503 after 5 s).
fn finished_by_itself<V: Send + 'static>(
    read: BoxFuture<'static, Result<V, StorageError>>,
) -> BoxFuture<'static, Result<V, StorageError>> {
    let task = tokio::spawn(read);
    async move {
        match task.await {
            Ok(out) => out,
            Err(e) => Err(StorageError::Backend(std::sync::Arc::new(e))),
        }
    }
    .boxed()
}

/// The node's wake epoch (see the module note).
#[derive(Default)]
pub(crate) struct Epoch(AtomicU64);

impl Epoch {
    pub fn bump(&self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }

    pub fn now(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    fn counting(starts: &Arc<AtomicUsize>, value: u32) -> BoxFuture<'static, Result<u32, StorageError>> {
        starts.fetch_add(1, Ordering::SeqCst);
        async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            Ok(value)
        }
        .boxed()
    }

    #[tokio::test]
    async fn readers_asking_at_once_share_one_read_but_never_a_finished_one() {
        let flights: Flights<&str, u32> = Flights::default();
        let starts = Arc::new(AtomicUsize::new(0));
        let (a, b) = tokio::join!(flights.run("k", || counting(&starts, 1)), flights.run("k", || counting(&starts, 2)));
        assert_eq!((a.ok(), b.ok()), (Some(1), Some(1)), "the second joined the first");
        assert_eq!(starts.load(Ordering::SeqCst), 1);
        // Finished: the next reader asks again and gets a new answer.
        assert_eq!(flights.run("k", || counting(&starts, 3)).await.ok(), Some(3));
        assert_eq!(starts.load(Ordering::SeqCst), 2);
        // Another key is another read.
        let (c, d) = tokio::join!(flights.run("k", || counting(&starts, 4)), flights.run("j", || counting(&starts, 5)));
        assert_eq!((c.ok(), d.ok()), (Some(4), Some(5)));
    }

    #[tokio::test]
    async fn kept_answers_are_shared_after_they_finish_but_failures_are_not() {
        let flights: Flights<&str, u32> = Flights::keeping(2);
        let starts = Arc::new(AtomicUsize::new(0));
        assert_eq!(flights.run("k", || counting(&starts, 1)).await.ok(), Some(1));
        assert_eq!(flights.run("k", || counting(&starts, 2)).await.ok(), Some(1), "the finished answer");
        assert_eq!(starts.load(Ordering::SeqCst), 1);
        let failing = || async { Err(StorageError::ShuttingDown) }.boxed();
        assert!(flights.run("e", failing).await.is_err());
        assert_eq!(flights.run("e", || counting(&starts, 3)).await.ok(), Some(3), "a failure is asked again");
        // Full: everything kept is dropped and read again.
        assert_eq!(flights.run("x", || counting(&starts, 4)).await.ok(), Some(4));
        assert_eq!(flights.run("k", || counting(&starts, 5)).await.ok(), Some(5));
    }

    #[tokio::test]
    async fn a_read_whose_readers_all_went_away_still_ends_and_lets_go_of_what_it_holds() {
        let flights: Flights<(u64, &str), u32> = Flights::keeping(4096);
        // What the read holds while it runs (a pooled connection in the engine).
        let held = Arc::new(());
        let read = {
            let held = Arc::clone(&held);
            move || {
                async move {
                    let _held = held;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    Ok(7)
                }
                .boxed()
            }
        };
        // Its only reader gives up mid-read, and no one asks under that key again (a past epoch).
        let _ = tokio::time::timeout(Duration::from_millis(5), flights.run((1, "k"), read)).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(Arc::strong_count(&held), 1, "the read ended by itself and let go of what it held");
    }

    #[tokio::test]
    async fn a_read_whose_reader_went_away_is_finished_by_the_next() {
        let flights: Flights<&str, u32> = Flights::default();
        let starts = Arc::new(AtomicUsize::new(0));
        // The first reader gives up before its read ends.
        let _ = tokio::time::timeout(Duration::from_millis(5), flights.run("k", || counting(&starts, 1))).await;
        // A reader joining now gets that read's answer, and it is then forgotten.
        assert_eq!(flights.run("k", || counting(&starts, 2)).await.ok(), Some(1));
        assert_eq!(flights.run("k", || counting(&starts, 3)).await.ok(), Some(3));
        assert_eq!(starts.load(Ordering::SeqCst), 2);
    }
}
