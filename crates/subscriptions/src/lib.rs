//! Subscriptions (protocol sections 6 and 7) over any [`Engine`](oncelog_storage::Engine): who
//! is told about new data in which streams, how far each has processed them, and who may act on
//! it now. A crate of its own over the storage seam: the engines know nothing of it
//! (`oncelog-storage` imports nothing from here).
//!
//! Module map (each file one concern):
//! - [`model`]: the stored state ([`SubRecord`], [`Cursor`]); [`codec`]: its stored forms (and
//!   the dispatcher lease's and the uid sequence's), with tags.
//! - [`glob`]: stream patterns.
//! - [`service`]: [`Subscriptions`], the public API: each operation loads the state, decides
//!   with `rules`, and writes through `store`.
//! - `config.rs`: which configurations, ids and paths are valid, and which paths a subscription
//!   links.
//! - `rules.rs`: what each operation (create, relink, wake, claim, ack, release, delivery)
//!   does to a subscription: pure decisions, no I/O, unit-tested in `rules/tests.rs`.
//! - `state.rs`: what memory holds: an entry per subscription, the state behind the lock, and
//!   the lock-free filters a stream write consults.
//! - `links.rs`: what a subscription links now, read from the engine's streams: views, wake
//!   notices, and the next wake planned over the pending work.
//! - `store.rs`: the metadata map's key layout, loading and reloading, the compare-and-set
//!   guarded writes, and the retry combinator (`Subscriptions::retrying`: decide once more,
//!   on reloaded state, after a write lost to another process).
//! - `dispatch.rs`: the dispatcher's pass: the wakes due without an event, the webhook
//!   deliveries to hand out.
//! - `lease.rs`: the dispatcher lease (which process hands out webhook deliveries) and node ids.
//!
//! Every change of cursors, generation, wake, lease and retry schedule is one
//! [`Engine::transact`](oncelog_storage::Engine::transact) (one log frame, one PostgreSQL transaction), together with the wake event it
//! appends to a pull-wake stream or the output appends of a transactional commit. So they are
//! durable and atomic with each other on every engine, and the engines know nothing about
//! subscriptions: they keep a metadata map ([`oncelog_storage::MetaWrite`]) and commit transactions.

pub mod codec;
mod config;
#[cfg(feature = "contract")]
pub mod contract;
mod dispatch;
pub mod glob;
mod lease;
mod links;
pub mod model;
#[cfg(test)]
mod model_check;
mod rules;
pub mod service;
mod state;
mod store;

pub use model::*;
pub use service::*;

use oncelog_protocol::Offset;

use oncelog_storage::engine::{AppendError, StorageError, TxnError};

/// Why a subscription configuration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidSub {
    #[error("a subscription needs a pattern or a non-empty list of streams")]
    NoTarget,
    #[error("lease_ttl_ms must be between 1000 and 600000")]
    LeaseTtl,
    #[error("stream paths must be non-empty and outside __ds/")]
    BadPath,
    #[error("subscription ids must be 1 to 256 characters, without '/'")]
    BadId,
    #[error(transparent)]
    Pattern(#[from] glob::PatternError),
}

/// Why a subscription operation was refused or failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SubError {
    #[error("subscription not found")]
    NotFound,
    #[error("a subscription with this id exists with a different configuration")]
    AlreadyExists,
    #[error(transparent)]
    Invalid(#[from] InvalidSub),
    #[error("the token does not belong to this subscription")]
    TokenInvalid,
    #[error("stale generation or wake id: this work has ended or passed to another worker")]
    Fenced,
    #[error("the work is claimed by {holder}")]
    AlreadyClaimed { holder: String, generation: u64 },
    #[error("no pending work to claim")]
    NoPendingWork,
    #[error("this operation is for {needs} subscriptions")]
    WrongType { needs: &'static str },
    #[error("invalid offset for {stream}: {why}")]
    InvalidOffset { stream: String, why: &'static str },
    #[error("append {index} to {stream} was refused: {error}")]
    Append { index: usize, stream: String, error: AppendError },
    #[error("the subscription changed meanwhile; retry")]
    Conflict,
    #[error("this server holds its most subscriptions ({max}); delete one first")]
    TooMany { max: usize },
    #[error("the subscriptions under {prefix:?} are at their share ({max}); delete one first")]
    ShareUsed { prefix: String, max: usize },
    #[error(transparent)]
    Storage(#[from] StorageError),
}

impl From<TxnError> for SubError {
    fn from(e: TxnError) -> Self {
        match e {
            TxnError::Conflict { .. } => SubError::Conflict,
            TxnError::Storage(s) => SubError::Storage(s),
            // Our own metadata is small and our appends target distinct streams; an append
            // refusal is mapped by the caller, which knows the stream.
            TxnError::TooLarge | TxnError::RepeatedStream { .. } | TxnError::Append { .. } => {
                SubError::Storage(StorageError::Backend(std::sync::Arc::new(e)))
            }
        }
    }
}

/// What the server learnt from a verified token, and what the request says: the fence every
/// callback, ack, release and commit must pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    /// The subscription incarnation the token was minted for.
    pub uid: u64,
    pub token_generation: u64,
    /// `generation` of the request body.
    pub generation: u64,
    /// `wake_id` of the request body.
    pub wake_id: String,
}

/// One acknowledgement: `stream` processed up to `offset`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ack {
    pub stream: String,
    pub offset: Offset,
}

/// Whether a stream is linked by name or by the pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkType {
    Explicit,
    Glob,
}

/// One linked stream, as of one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    pub path: String,
    pub link_type: LinkType,
    /// The stream incarnation (0: no stream at this path now).
    pub stream_id: u64,
    pub acked: Offset,
    pub tail: Offset,
}

impl Link {
    pub fn has_pending(&self) -> bool {
        self.tail > self.acked
    }
}

/// How far behind a subscription is ([`Subscriptions::lags`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubLag {
    pub id: String,
    /// Over its links: tail minus acknowledged offset, summed.
    pub bytes: u64,
    /// Its links with unacknowledged data.
    pub pending_streams: usize,
}

/// A subscription as `GET` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubView {
    pub record: SubRecord,
    pub links: Vec<Link>,
}

#[cfg(feature = "contract")]
#[doc(hidden)]
pub use oncelog_storage as __storage;

/// The one list of the subscription cases, in the order they run: expands to
/// `CALLBACK! { PREFIX... case, ... }` (the callback a macro path in brackets).
/// [`subscription_contract_tests!`] and [`contract::ALL_CASES`] are built from it, and a test
/// holds it to the cases `contract.rs` defines, so a new case cannot be left unrun.
#[cfg(feature = "contract")]
#[doc(hidden)]
#[macro_export]
macro_rules! __subscription_cases {
    ([$($callback:tt)+] $($prefix:tt)*) => {
        $($callback)+! {
            $($prefix)*
            subscriptions_are_configuration_that_survives_reopen,
            pull_wake_claims_are_fenced_by_generation,
            webhook_deliveries_follow_a_stored_schedule,
            commits_write_outputs_and_acks_atomically,
            missed_wakes_are_issued_by_the_full_pass,
            cursors_work_for_the_longest_paths,
            a_pattern_is_matched_against_each_path_once,
            backfill_is_one_shared_baseline_not_a_cursor_per_stream,
            subscriptions_stored_with_a_cursor_per_stream_still_load,
        }
    };
}

#[cfg(feature = "contract")]
/// Expands to one `#[test]` per subscription case of the engine contract ([`contract`], feature
/// `contract`) for the harness type given: an engine's contract tests run
/// `oncelog_storage::engine_contract_tests!(H);` and `oncelog_subscriptions::subscription_contract_tests!(H);`.
#[macro_export]
macro_rules! subscription_contract_tests {
    ($harness:ty) => {
        $crate::__subscription_cases! { [$crate::subscription_contract_tests] @cases $harness; }
    };
    (@cases $harness:ty; $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                $crate::__storage::contract::run(|| $crate::contract::$case::<$harness>());
            }
        )*
    };
}
