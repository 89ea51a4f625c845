//! Durable Streams protocol types for Oncelog, shared by the server, the storage rules and the
//! client.
//!
//! Nothing in this crate does I/O or depends on an async runtime: every function is a pure
//! transformation that can be unit- and property-tested in isolation.
//!
//! Module map:
//! - [`offset`]: the opaque offset token (a fixed-width position in the logical stream) and the
//!   `-1` / `now` sentinels of the `offset` query parameter.
//! - [`headers`]: header names and strict parsers for every request header the protocol defines
//!   (`Stream-TTL`, `Stream-Expires-At`, `Stream-Closed`, `Stream-Seq`, `Producer-*`).
//! - [`producer`]: the idempotent-producer state machine (section 5.2.1) as a pure function from
//!   state and request to a verdict, plus the receipts that let a duplicate learn its offset.
//! - [`json`]: JSON-mode framing: validation, one-level array flattening, stored form, read form.
//! - [`sse`]: Server-Sent-Events encoding of data and control events.
//! - [`cursor`]: the CDN-collapsing cursor of section 10.1.
//! - [`content_type`]: media-type normalisation and the rules that depend on it.
//! - [`state`]: the State Protocol's changes and controls, the state they fold into, and the
//!   snapshot a compaction writes.

pub mod content_type;
pub mod cursor;
pub mod digest;
pub mod headers;
pub mod json;
pub mod offset;
pub mod producer;
pub mod sse;
pub mod state;

pub use offset::{Offset, OffsetParam};
