//! The stream state machine: the one way a stream's writer-side state changes, for every engine.
//!
//! [`crate::rules`] gives verdicts; this module applies them. An engine serialises each stream's
//! writes (the log engine: its writer thread; PostgreSQL: the stream's row lock) and, inside that
//! serialisation, holds the stream's [`StreamState`] and calls it:
//!
//! - [`StreamState::append`] decides an append by [`crate::rules::append`] and applies every
//!   effect of an accepted one (metadata, the producer's state, the idempotency key's entry, the
//!   time marks, the tail); the engine persists what it is handed ([`Written`]) with the data in
//!   one atomic unit and wakes readers once that unit is durable.
//! - [`StreamState::prune`] drops producer states idle past their TTL and keys past their
//!   window, and says which, so an engine can drop their stored copies too.
//! - [`StreamState::trim`], [`StreamState::compact`] and [`StreamState::soft_delete`] change
//!   the state as a trim, a compaction (the snapshot at the tail, the earliest offset moved to
//!   it) or a soft deletion does.
//! - [`parking`]: early producer appends wait for their predecessors, and are released right
//!   behind them, in the same atomic unit ([`parking::Round`]).
//! - [`chain`]: which part of which ancestor a read of a fork covers.
//! - [`transact`]: the order in which a transaction's appends are checked and staged, over an
//!   engine's [`Appender`].
//!
//! Nothing here does I/O or reads a clock.

pub mod chain;
pub mod parking;
mod stream;

pub use stream::{AppendEffects, ProducerEffect, Pruned, SnapshotWrite, Step, StreamState, Written};

use crate::engine::{AppendError, AppendOutcome, AppendRequest, StorageError, TxnError, TxnRequest};

/// Records one group commit in the metrics every engine reports the same way: how many commands
/// shared it, and how long it took to make them durable (log: write and sync; PostgreSQL: decide,
/// write and COMMIT).
pub fn record_group_commit(commands: usize, took: std::time::Duration) {
    metrics::histogram!("oncelog_group_commit_commands").record(commands as f64);
    metrics::histogram!("oncelog_group_commit_seconds").record(took.as_secs_f64());
}

/// An engine's writer as [`transact`] drives it, inside its serialisation, while one atomic
/// unit (a frame, a database transaction) is being staged.
pub trait Appender {
    /// Decides `req` against the state as staged so far and stages what it accepted; the answer
    /// to send once the unit is durable.
    fn append(&mut self, req: &AppendRequest) -> Result<AppendOutcome, AppendError>;
    /// The verdict on `req` against that state, staging nothing.
    fn check(&mut self, req: &AppendRequest) -> Result<(), AppendError>;
    /// An append refused after its check passed: impossible by construction (see [`transact`]),
    /// so the engine's own failure (the log engine stops writes).
    fn diverged(&mut self, e: AppendError) -> StorageError;
}

/// A transaction's appends, in the one order every engine follows: its shape
/// ([`crate::rules::txn_shape`]) and guards ([`crate::rules::txn_expect`]) are checked by the
/// caller first; then every append is checked against the state as it is, before anything is
/// staged (one append per stream, so each sees exactly the state it will be applied to), and a
/// refusal leaves the whole transaction unwritten; then each is staged in request order.
pub fn transact(txn: &TxnRequest, a: &mut impl Appender) -> Result<Vec<AppendOutcome>, TxnError> {
    for (index, req) in txn.appends.iter().enumerate() {
        a.check(req).map_err(|error| TxnError::Append { index, error })?;
    }
    let mut outcomes = Vec::with_capacity(txn.appends.len());
    for req in &txn.appends {
        match a.append(req) {
            Ok(o) => outcomes.push(o),
            Err(e) => return Err(TxnError::Storage(a.diverged(e))),
        }
    }
    Ok(outcomes)
}
