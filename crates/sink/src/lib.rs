//! Exactly-once sinks: apply Oncelog streams to PostgreSQL in the same transaction as their
//! position.
//!
//! A [`Worker`] follows the streams matching a pattern through a pull-wake subscription (it reads
//! only streams that changed; several workers share them by taking turns on the claim). For each
//! stream it reads the position stored **in the target database**, reads the stream from there,
//! and commits each read as **one target transaction**: a compare-and-set of the position from
//! the value it read to the one after the read, the [`Sink`]'s effect, and a row count. Then it
//! acks the claim. A crash anywhere leaves the effect and the position on the same side of a
//! commit; a worker that lost its claim while paused or cut off finds the position moved when
//! another worker applied its batch meanwhile, and applies nothing. Details, tables and failure modes: `docs/SINKS.md`.
//!
//! Module map, from the top down:
//! - [`worker`]: [`Worker`] and its options: setup (target tables, wake stream, subscription),
//!   the claim loop (saying whom it waits for), which failures stop it;
//! - `backlog`: what the streams held when the worker started (the server never wakes the sink
//!   for it): linked streams whose position in the target is behind their tail, applied between
//!   claims; `--from-now` records the tails instead;
//! - `follow`: one stream of a claim: read from the stored position, one transaction per read,
//!   trimmed and compacted history, messages the target refuses (stop, or set the stream aside);
//! - `lease`: acks that follow the committed positions and keep the lease;
//! - [`position`]: the positions table and the compare-and-set guard;
//! - [`sink`]: the [`Sink`] trait a target implements; [`postgres`]: [`PostgresSink`], the
//!   built-in one (State Protocol rows, JSON messages, byte chunks);
//! - [`batch`]: a read cut into messages with their offsets (State Protocol messages read by
//!   `oncelog_protocol::state::parse`, the parser the server's compaction folds with);
//! - [`target`]: connections to the target database (URLs as the PostgreSQL engine takes them);
//! - [`metrics`]: progress metrics; [`error`]: [`SinkError`], [`ApplyError`].
//!
//! # A custom sink
//!
//! ```no_run
//! use oncelog_client::StreamOffset;
//! use oncelog_sink::{ApplyError, Batch, Sink, StreamRef};
//! use tokio_postgres::Transaction;
//!
//! /// Adds each message's `n` to its stream's total: not idempotent, applied exactly once.
//! struct Totals;
//!
//! impl Sink for Totals {
//!     async fn prepare(&self, tx: &Transaction<'_>, _schema: &str) -> Result<(), ApplyError> {
//!         tx.batch_execute("CREATE TABLE IF NOT EXISTS totals (stream text PRIMARY KEY, sum bigint NOT NULL)").await?;
//!         Ok(())
//!     }
//!
//!     async fn apply(&self, tx: &Transaction<'_>, stream: &StreamRef, batch: &Batch<'_>, _next: &StreamOffset) -> Result<u64, ApplyError> {
//!         let Batch::Messages(messages) = batch else { return Ok(0) };
//!         let mut sum = 0i64;
//!         for m in messages {
//!             let v: serde_json::Value = serde_json::from_str(m.json.get()).map_err(|e| ApplyError::Other(e.into()))?;
//!             sum += v["n"].as_i64().unwrap_or(0);
//!         }
//!         tx.execute("INSERT INTO totals VALUES ($1, 0) ON CONFLICT DO NOTHING", &[&stream.path]).await?;
//!         tx.execute("UPDATE totals SET sum = sum + $2 WHERE stream = $1", &[&stream.path, &sum]).await?;
//!         Ok(messages.len() as u64)
//!     }
//! }
//! ```

mod backlog;
pub mod batch;
pub mod error;
mod follow;
mod lease;
pub mod metrics;
pub mod position;
pub mod postgres;
pub mod sink;
pub mod target;
pub mod worker;

pub use batch::{Batch, Message, StreamKind, StreamRef};
pub use error::{ApplyError, SinkError};
pub use postgres::PostgresSink;
pub use sink::Sink;
pub use target::Target;
pub use worker::{Mode, OnRefused, OnTrimmed, SinkOptions, Worker};
