//! The [`Sink`] trait: what a target does with a batch, inside the transaction the worker opened
//! for it. The worker owns the transaction and the position in it; a sink only adds its effect,
//! so the effect and the position commit together or not at all, whatever the sink does.

use std::future::Future;

use oncelog_client::StreamOffset;
use tokio_postgres::Transaction;

use crate::batch::{Batch, StreamRef};
use crate::error::ApplyError;

/// A target a worker applies streams to (see the crate docs for the guarantee).
///
/// Both methods run inside a transaction of the target database that the worker commits (or
/// rolls back) itself: a sink must not commit, and need not be idempotent — its effect of a
/// batch is committed exactly once, with the position after the batch.
pub trait Sink: Send + Sync + 'static {
    /// Creates what [`Sink::apply`] writes to, if missing, in `schema` (the worker's schema, on
    /// the search path). Runs once per worker start, under a lock that keeps two workers'
    /// migrations apart.
    fn prepare(&self, tx: &Transaction<'_>, schema: &str) -> impl Future<Output = Result<(), ApplyError>> + Send;

    /// Applies `batch`, read from `stream`, after which the stream's position will be
    /// `next_offset`. Answers the number of rows (or effects) it applied, for progress metrics.
    fn apply(
        &self,
        tx: &Transaction<'_>,
        stream: &StreamRef,
        batch: &Batch<'_>,
        next_offset: &StreamOffset,
    ) -> impl Future<Output = Result<u64, ApplyError>> + Send;
}
