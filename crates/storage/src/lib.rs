//! The storage seam of Oncelog: what the HTTP layer needs from a backend, and the rules every
//! backend applies the same way. No backend lives here: the engines are `oncelog-log` (the
//! default) and `oncelog-postgres`.
//!
//! Module map:
//! - [`engine`]: the [`Engine`] trait, its request / outcome types and one error enum per
//!   operation. An append is one atomic unit carrying its data, its closure effect, its
//!   `Stream-Seq` and its producer-state effect, so a backend commits all of them together or
//!   none. Live-tail wake-ups are part of the trait ([`Engine::wait`]).
//! - [`meta`]: a stream's logical state ([`StreamMeta`]), the same for every engine.
//! - [`rules`]: the protocol's decisions (create, append, close, delete, fork, expiry, parking)
//!   as pure functions over that state, returning verdicts and the effects to persist.
//! - [`machine`]: the stream state machine every engine drives inside its per-stream
//!   serialisation: decide and apply an append ([`machine::StreamState`]), prune expired writer
//!   state, park early producer appends and release them ([`machine::parking`]).
//! - [`compaction`]: compaction of State Protocol streams over any engine (fold the history,
//!   [`Engine::compact`] the snapshot).
//! - [`retention`]: retention policies, time marks and where the retention sweep trims to.
//! - [`codec`]: the stored forms of stream metadata, producer state, idempotency key entries and
//!   time marks, shared by both engines (each with a tag and a round-trip test).
//! - [`file_bytes`]: bytes an engine returns that are a mapped file range, found again by the
//!   HTTP layer so a plain socket sends them with `sendfile(2)`.
//! - [`clock`]: time behind a trait, so expiry is testable with a manual clock.
//! - `contract` (feature `contract`): the engine contract suite; every engine runs it through
//!   `engine_contract_tests!`.
//!
//! Where a new engine plugs in: implement [`Engine`] by keeping [`StreamMeta`], a tail and
//! producer states per stream, serialising each stream's writes, and calling [`rules`] inside
//! that serialisation; then add `oncelog_storage::engine_contract_tests!(YourHarness);` to its
//! tests.

pub mod clock;
pub mod codec;
pub mod compaction;
pub mod engine;
pub mod file_bytes;
pub mod machine;
pub mod meta;
pub mod retention;
pub mod rules;

#[cfg(feature = "contract")]
pub mod contract;

pub use clock::{Clock, ManualClock, SystemClock};
pub use engine::*;
pub use meta::{ForkOf, IdempotencyKeys, KeyEntry, StreamMeta};
pub use retention::{RetentionPolicy, RetentionRequest, TimeMark, TimeMarks};
