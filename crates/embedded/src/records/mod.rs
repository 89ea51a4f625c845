//! Persisted record types and key layouts of the embedded engine (the only on-disk format;
//! another engine keeps the same logical state in its own).
//!
//! Every value starts with a one-byte tag that names its type *and* version; a decoder refuses a
//! tag it does not know rather than guessing. Integers are little-endian fixed width inside
//! values; keys use big-endian so that byte order equals numeric order.
//!
//! Hand-written rather than serde-derived: the format is an on-disk contract, and a derive would
//! let a field rename silently change it.

pub mod keys;
pub mod sys;

pub use oncelog_storage::codec::{producer, stream_meta, DecodeError, Decoder, Encoder, ProducerRecord};

