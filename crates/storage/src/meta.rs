//! A stream's logical state, the same for every engine: what the [`crate::rules`] decide over
//! and what an engine persists (each in its own format).

use std::collections::HashMap;
use std::sync::Arc;

use oncelog_protocol::digest::{BodyDigest, KeyId};
use oncelog_protocol::headers::Expiry;
use oncelog_protocol::Offset;

use crate::engine::StreamConfig;

/// What is remembered of an append made with an `Idempotency-Key`, for the key's window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyEntry {
    /// Where its data ended (the `Stream-Next-Offset` a repeat is answered with).
    pub end: Offset,
    /// Its body's digest: a repeat with other bytes is refused.
    pub digest: BodyDigest,
    /// When it was accepted (Unix ms); the key counts until `at_ms` + the window.
    pub at_ms: i64,
}

/// A stream's idempotency keys. Boxed and absent until the first key: most streams have none, and
/// an empty map would cost every stream 48 bytes.
pub type IdempotencyKeys = Option<Box<HashMap<KeyId, KeyEntry>>>;

/// A stream's metadata. The tail is kept beside it by each engine (the log engine derives it
/// from its records on recovery), and producer states are kept per producer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamMeta {
    /// Unique across the life of the store: a re-created path gets a new id, so ETags and
    /// [`crate::AppendRequest::stream_id`] of a deleted stream never match its successor.
    pub id: u64,
    /// Unix ms of creation (kept for operators; no rule depends on it).
    pub created_ms: i64,
    /// Content type, expiry, retention and compaction: fixed at creation, so one immutable value
    /// is shared by the writer's state, the readers' entry and every answer that shows it (an
    /// engine may hand identical configurations one allocation: at a million streams the copies
    /// were a fifth of what a stream cost).
    pub config: Arc<StreamConfig>,
    pub closed: bool,
    /// The last `Stream-Seq` accepted, compared byte-wise.
    pub stream_seq: Option<String>,
    /// Set for a fork: it reads its source's bytes below `fork_point` (never copied).
    pub fork: Option<ForkOf>,
    /// Deleted by its owner while forks still read its data: the path answers 410 and stays
    /// reserved until the last fork goes.
    pub soft_deleted: bool,
    /// The earliest offset readers may read from (a trim moved it forward; 0 otherwise). Only
    /// ever grows.
    pub earliest: Offset,
}

/// Where a fork comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForkOf {
    /// The direct source's id; the chain of further ancestors is derived, never stored.
    pub source_id: u64,
    /// Byte position in the shared offset space where the fork's own data begins.
    pub fork_point: u64,
}

impl StreamMeta {
    /// A new open stream of `content_type`: no expiry, no fork, nothing trimmed, no retention,
    /// not made for compaction (what a plain create makes; other fields are set from there).
    pub fn new(id: u64, created_ms: i64, content_type: impl Into<String>) -> StreamMeta {
        let config = StreamConfig {
            content_type: content_type.into(),
            expiry: Expiry::Never,
            retention: crate::retention::RetentionPolicy::NONE,
            compaction: false,
        };
        StreamMeta::with_config(id, created_ms, config)
    }

    /// A new open stream of `config`: no fork, nothing trimmed.
    pub fn with_config(id: u64, created_ms: i64, config: StreamConfig) -> StreamMeta {
        StreamMeta {
            id,
            created_ms,
            config: Arc::new(config),
            closed: false,
            stream_seq: None,
            fork: None,
            soft_deleted: false,
            earliest: Offset::ZERO,
        }
    }

    /// What readers see of this stream at `tail`.
    pub fn info(&self, tail: oncelog_protocol::Offset) -> crate::engine::StreamInfo {
        crate::engine::StreamInfo {
            id: self.id,
            config: self.config.clone(),
            tail,
            closed: self.closed,
            earliest: self.earliest,
        }
    }
}
