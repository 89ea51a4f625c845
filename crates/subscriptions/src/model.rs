//! A subscription's logical state: what is stored (through [`super::codec`]) and
//! what every decision in the service's rules (`rules.rs`) reads.

use std::collections::BTreeSet;

use oncelog_protocol::Offset;

/// Lease bounds (protocol section 6): a worker gets at least a second, at most ten minutes.
pub const MIN_LEASE_TTL_MS: u32 = 1_000;
pub const MAX_LEASE_TTL_MS: u32 = 600_000;
pub const DEFAULT_LEASE_TTL_MS: u32 = 30_000;

/// How a subscription tells its worker there is work.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubKind {
    /// Signed `POST`s to a URL; the receiver acks through the callback URL (or answers
    /// `{"done":true}`).
    Webhook { url: String },
    /// Wake events appended to a JSON stream; workers claim, ack and release.
    PullWake { wake_stream: String },
}

/// What a subscription is, as created: an idempotent re-create must match it exactly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubConfig {
    pub kind: SubKind,
    /// A glob ([`super::glob`]), normalized.
    pub pattern: Option<String>,
    /// Explicit links named at creation, sorted and deduplicated.
    pub streams: Vec<String>,
    pub lease_ttl_ms: u32,
    pub description: Option<String>,
    /// Path prefixes a transactional commit may append to (Oncelog extension `outputs`), sorted
    /// and deduplicated. With access control on, a commit may only write under them, and
    /// creating the subscription needs `append` on each.
    pub outputs: Vec<String>,
}

/// The current wake: work was announced for `generation` and is not finished yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wake {
    pub generation: u64,
    /// Pull-wake: the worker holding the claim (`None` until claimed).
    pub holder: Option<String>,
    /// When the lease ends (Unix ms); `None` for an unclaimed pull wake, which waits for a
    /// claim without end. A lease past its end counts as ended at once: nothing is written
    /// when it passes.
    pub lease_until_ms: Option<i64>,
    /// The pending streams at the wake: `(path, incarnation id, tail)`. A `done` acks exactly
    /// these tails, not what arrived later.
    pub snapshot: Vec<(String, u64, Offset)>,
}

/// One subscription, as stored (its cursors are stored one per key beside it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubRecord {
    /// Internal id, never reused: tokens and wake ids name it, so a deleted and re-created
    /// subscription never accepts its predecessor's.
    pub uid: u64,
    pub id: String,
    pub config: SubConfig,
    pub created_ms: i64,
    /// Counts wakes, from 0 (none yet). Fences every callback, ack and release.
    pub generation: u64,
    pub wake: Option<Wake>,
    /// The generation of the last wake ended by a `done`: a retried transactional commit of
    /// that wake is recognised as a duplicate rather than fenced.
    pub last_done: u64,
    /// Webhook deliveries that failed in a row (0: the subscription is healthy).
    pub failures: u32,
    /// No delivery before this time (Unix ms) after a failure; 0 when none is scheduled.
    pub next_attempt_ms: i64,
    /// Explicit links now: those named at creation plus added, minus removed.
    pub explicit: BTreeSet<String>,
}

/// How far a subscription has processed one stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor {
    /// The incarnation it refers to ([`oncelog_storage::StreamInfo::id`]); a cursor of a deleted stream
    /// does not apply to a new stream at the same path, which starts over.
    pub stream_id: u64,
    pub acked: Offset,
}

impl SubRecord {
    /// The wake id of a generation: derived, so unique forever without storage or randomness.
    pub fn wake_id(&self, generation: u64) -> String {
        format!("w_{:x}_{:x}", self.uid, generation)
    }

    /// The current wake if its lease has not run out at `now_ms`.
    pub fn live_wake(&self, now_ms: i64) -> Option<&Wake> {
        self.wake.as_ref().filter(|w| w.lease_until_ms.is_none_or(|t| now_ms < t))
    }
}
