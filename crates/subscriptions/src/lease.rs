//! The dispatcher lease: which of the processes sharing an engine hands out webhook deliveries
//! (`lease/dispatcher` in the metadata map), and the holder ids that name them.

use std::sync::atomic::Ordering;

use bytes::Bytes;

use super::codec;
use super::{SubError, Subscriptions};
use oncelog_storage::engine::{Engine, MetaWrite, TxnError, TxnRequest};

/// Over a shared engine: which process hands out webhook deliveries, and until when
/// ([`codec::encode_lease`]).
const LEASE_KEY: &str = "lease/dispatcher";

/// How long the dispatcher lease lasts unless renewed: how long webhooks wait when its holder
/// dies. Renewed once less than half of it is left, so passes (at least one a second) keep it.
pub const DISPATCH_LEASE_MS: i64 = 10_000;

/// Dispatcher holder ids of this process that no live [`Subscriptions`] uses any more.
static FREE_NODE_IDS: std::sync::Mutex<Vec<u64>> = std::sync::Mutex::new(Vec::new());

/// A holder id for a new [`Subscriptions`]: distinct from every other live one
/// ([`oncelog_storage::clock::unique_id`]). A dropped instance's id goes to the next one made in this
/// process: that is the same dispatcher reopened, and it takes its own lease over at once
/// instead of waiting out [`DISPATCH_LEASE_MS`].
pub(super) fn take_node_id() -> u64 {
    FREE_NODE_IDS.lock().ok().and_then(|mut f| f.pop()).unwrap_or_else(oncelog_storage::clock::unique_id)
}

impl<E> Drop for Subscriptions<E> {
    fn drop(&mut self) {
        if let Ok(mut free) = FREE_NODE_IDS.lock() {
            free.push(self.node);
        }
    }
}

/// What holder `node` does about the lease stored as `stored` at `now_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// It holds the lease, with more than half of it left: nothing to write.
    Keep,
    /// Another holder's lease runs: `node` does not dispatch.
    Leave,
    /// The lease is free (absent, ended, unreadable) or `node`'s own and half gone: take or
    /// renew it, under compare-and-set on `stored`.
    Take,
}

/// The decision of [`Subscriptions::hold_lease`]. Anything that is not a lease (damage) is
/// simply taken over.
fn step(stored: Option<&[u8]>, node: u64, now_ms: i64) -> Step {
    match stored.and_then(|v| codec::decode_lease(v).ok()) {
        Some((holder, until)) if holder == node && until.saturating_sub(now_ms) > DISPATCH_LEASE_MS / 2 => Step::Keep,
        Some((holder, until)) if holder != node && now_ms < until => Step::Leave,
        _ => Step::Take,
    }
}

impl<E: Engine> Subscriptions<E> {
    /// Takes the dispatcher lease when it is free (absent, ended, unreadable, or this
    /// instance's), renewing it once less than half is left; answers whether this instance holds
    /// it. Both under compare-and-set: of two processes taking it at once, one gets it.
    pub(super) async fn hold_lease(&self, now_ms: i64) -> Result<bool, SubError> {
        let held = self.try_lease(now_ms).await;
        self.dispatching.store(matches!(held, Ok(true)), Ordering::Relaxed);
        held
    }

    async fn try_lease(&self, now_ms: i64) -> Result<bool, SubError> {
        let key = LEASE_KEY.as_bytes();
        let stored = self.meta_get(key).await?;
        match step(stored.as_deref(), self.node, now_ms) {
            Step::Keep => return Ok(true),
            Step::Leave => return Ok(false),
            Step::Take => {}
        }
        let value = Bytes::from(codec::encode_lease(self.node, now_ms.saturating_add(DISPATCH_LEASE_MS)));
        let txn = TxnRequest {
            expect: vec![(key.to_vec(), stored)],
            meta: vec![MetaWrite { key: key.to_vec(), value: Some(value) }],
            now_ms,
            ..Default::default()
        };
        match self.engine.transact(txn).await {
            Ok(_) => Ok(true),
            // Another process took or renewed it first.
            Err(TxnError::Conflict { .. }) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `node` does at `now_ms` about the lease of `holder` until `until`.
    fn at(holder: u64, until: i64, node: u64, now_ms: i64) -> Step {
        step(Some(codec::encode_lease(holder, until).as_slice()), node, now_ms)
    }

    #[test]
    fn a_free_lease_is_taken() {
        assert_eq!(step(None, 7, 0), Step::Take, "absent");
        assert_eq!(step(Some(&b"damage"[..]), 7, 0), Step::Take, "unreadable");
        assert_eq!(at(8, 1_000, 7, 1_000), Step::Take, "another's, ended just now");
        assert_eq!(at(8, 1_000, 7, 5_000), Step::Take, "another's, ended long ago");
    }

    #[test]
    fn another_holders_running_lease_is_left_alone() {
        assert_eq!(at(8, 1_000, 7, 999), Step::Leave);
        assert_eq!(at(8, i64::MAX, 7, 0), Step::Leave);
    }

    #[test]
    fn its_own_lease_is_kept_and_renewed_once_half_is_gone() {
        let until = 100 + DISPATCH_LEASE_MS;
        assert_eq!(at(7, until, 7, 100), Step::Keep, "fresh");
        assert_eq!(at(7, until, 7, until - DISPATCH_LEASE_MS / 2 - 1), Step::Keep, "more than half left");
        assert_eq!(at(7, until, 7, until - DISPATCH_LEASE_MS / 2), Step::Take, "half left: renew");
        assert_eq!(at(7, until, 7, until + 1), Step::Take, "ended: take again");
        assert_eq!(at(7, i64::MIN, 7, i64::MAX), Step::Take, "no overflow");
    }
}
