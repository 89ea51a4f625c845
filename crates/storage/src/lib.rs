//! Storage for Oncelog: the [`Engine`] trait the HTTP layer talks to, and [`EmbeddedEngine`], the
//! crash-safe single-node engine that `oncelog serve` runs by default.
//!
//! Module map:
//! - [`engine`]: the trait, its request / outcome types and one error enum per operation. An
//!   append is one atomic unit carrying its data, its closure effect, its `Stream-Seq` and its
//!   producer-state effect, so a backend (embedded today, PostgreSQL later) commits all of them
//!   together or none. Live-tail wake-ups are part of the trait ([`Engine::wait`]).
//! - [`records`]: the persisted record types and key layouts, each with a stable tag byte and a
//!   round-trip property test.
//! - [`embedded`]: the embedded engine: fjall keyspaces behind one group-commit writer thread.

pub mod embedded;
pub mod engine;
pub mod records;

pub use embedded::{Durability, EmbeddedEngine, EmbeddedOptions, Failpoints};
pub use engine::*;
