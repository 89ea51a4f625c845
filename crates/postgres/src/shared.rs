//! What every part of the engine uses: the pool, the schema, the stream watches and touches,
//! the caches, the counters and the node's identity; and the advisory-lock keys.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use deadpool_postgres::Pool;
use oncelog_protocol::Offset;
use oncelog_storage::machine::chain::Segment;
use oncelog_storage::rules;
use oncelog_storage::StorageError;
use tokio::sync::mpsc;

use crate::watch::{Touches, Watches};
use crate::{error, flight, row};

/// What every part of the engine uses.
pub(crate) struct Shared {
    pub pool: Pool,
    /// Part of every advisory-lock key: clusters in other schemas of the database never wait
    /// on this one's locks.
    pub schema: String,
    pub retention: rules::Retention,
    /// How long one request's work in the database may take ([`Shared::within`]).
    pub deadline: std::time::Duration,
    pub watches: Watches,
    pub touches: Touches,
    /// Fork chains by stream id (immutable once a fork exists).
    pub chains: Mutex<HashMap<u64, Arc<Vec<Segment<u64>>>>>,
    /// What appends are framed for (`seen`).
    pub seen: crate::seen::Seen,
    pub stats: Counters,
    /// Why the database could not be used, while it cannot (for `/readyz`).
    pub unavailable: Mutex<Option<String>>,
    /// Whether `unavailable` holds a reason: every request notes its success, and only this
    /// flag is read then (no lock on the read path while all is well).
    pub degraded: AtomicBool,
    /// Rows read by live readers, shared per path and wake epoch (`flight`).
    pub rows: flight::Flights<(String, u64), Option<row::Stream>>,
    /// Data ranges read, shared per (stream id, from, tail, max bytes).
    pub scans: flight::Flights<(u64, u64, u64, usize), Option<(bytes::Bytes, Offset, bool)>>,
    /// This engine, for the reads shared by `flight` (which outlive the reader that began them).
    pub me: std::sync::Weak<Shared>,
    /// Why the `LISTEN` connection is down, while it is (for `/readyz`).
    pub listen_down: Mutex<Option<String>>,
    /// This node, in its notifications (so it skips its own).
    pub node: u64,
    /// Stream ids this node committed, for the notifier.
    pub notify: mpsc::UnboundedSender<u64>,
    /// Another node committed: parked requests are tried again.
    pub kick: tokio::sync::Notify,
}

/// What a committed transaction changed, applied to this node's plumbing after COMMIT.
#[derive(Default)]
pub(crate) struct Effects {
    pub wake: Vec<u64>,
    pub streams: i64,
    pub producers: i64,
}

/// [`EngineStats`], counted at open and every [`COUNT_EVERY`], and kept by this node's commits
/// in between (exact with one node; with several, right again at each count).
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) streams: AtomicI64,
    pub(crate) producers: AtomicI64,
    /// Producer appends that waited for their predecessors on this node (its committers' lots).
    pub(crate) parked: Arc<AtomicU64>,
}

impl Counters {
    pub fn add_producers(&self, n: i64) {
        self.producers.fetch_add(n, Ordering::Relaxed);
    }
}

/// An advisory-lock key for `what` (a path, a metadata key, …) of kind `kind` in `schema`.
pub(crate) fn lock_key(schema: &str, kind: &[u8], what: &[u8]) -> i64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(schema.as_bytes());
    h.update(&[0]);
    h.update(kind);
    h.update(&[0]);
    h.update(what);
    h.digest() as i64
}

impl Shared {
    pub(crate) fn me(&self) -> Option<Arc<Shared>> {
        self.me.upgrade()
    }

    pub(crate) async fn client(&self) -> Result<deadpool_postgres::Client, error::Fail> {
        Ok(self.pool.get().await?)
    }

    /// After a commit: wakes this node's waiters, counts.
    pub(crate) fn apply(&self, fx: Effects) {
        for id in fx.wake {
            self.published(id);
        }
        self.stats.streams.fetch_add(fx.streams, Ordering::Relaxed);
        self.stats.producers.fetch_add(fx.producers, Ordering::Relaxed);
    }

    /// Sets the counters to the database's counts (every node's changes).
    pub(crate) async fn count(&self) -> Result<(), error::Fail> {
        let c = self.client().await?;
        let r = c.query_one("SELECT (SELECT count(*) FROM streams), (SELECT count(*) FROM producers)", &[]).await?;
        self.stats.streams.store(r.get(0), Ordering::Relaxed);
        self.stats.producers.store(r.get(1), Ordering::Relaxed);
        Ok(())
    }

    /// Stream `id` changed (committed): this node's waiters wake now, the other nodes'
    /// through the notifier.
    pub(crate) fn published(&self, id: u64) {
        self.watches.wake(id);
        let _ = self.notify.send(id);
    }

    pub(crate) fn set_listen_down(&self, why: Option<String>) {
        *self.listen_down.lock().unwrap_or_else(|p| p.into_inner()) = why;
    }

    /// A request failed: the node is unready only when the database is out of reach (a lost
    /// or refused connection, a server shutting down or read-only), not when it was merely slow
    /// or busy (a missed deadline, a lock or statement timeout): that is the probe's call.
    pub(crate) fn note_failure(&self, e: &StorageError) {
        if let StorageError::Unavailable(cause) = e {
            if cause.downcast_ref::<error::Unreachable>().is_some() {
                self.note_unreachable(e);
            }
        }
    }

    /// The database cannot be used (the probe failed): unready, with the reason.
    pub(crate) fn note_unreachable(&self, e: &StorageError) {
        let reason = match e {
            StorageError::Unavailable(cause) if cause.downcast_ref::<error::Unreachable>().is_some() => {
                cause.to_string()
            }
            other => format!("PostgreSQL unreachable: {other}"),
        };
        *self.unavailable.lock().unwrap_or_else(|p| p.into_inner()) = Some(reason);
        self.degraded.store(true, Ordering::Release);
    }

    /// Runs one request's work in the database within the node's deadline. Past it the work is
    /// dropped where it stands — perhaps mid-transaction, perhaps mid-COMMIT — and the answer is
    /// [`StorageError::Unavailable`] (503). The connection it held went back to the pool with
    /// its state unknown, so every idle connection is dropped and made anew.
    pub(crate) async fn within<T>(
        &self,
        work: impl std::future::Future<Output = Result<T, error::Fail>>,
    ) -> Result<T, error::Fail> {
        match tokio::time::timeout(self.deadline, work).await {
            Ok(r) => r,
            Err(_) => Err(self.stalled()),
        }
    }

    /// The failure of work that missed the deadline; drops the pool's idle connections.
    pub(crate) fn stalled(&self) -> error::Fail {
        self.pool.retain(|_, _| false);
        error::Fail::Other(StorageError::Unavailable(Arc::new(error::Stalled { ms: self.deadline.as_millis() as u64 })))
    }

    pub(crate) fn note_success(&self) {
        if self.degraded.swap(false, Ordering::AcqRel) {
            *self.unavailable.lock().unwrap_or_else(|p| p.into_inner()) = None;
        }
    }
}
