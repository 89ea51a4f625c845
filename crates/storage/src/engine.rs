//! The storage seam: everything the HTTP layer needs from a backend.
//!
//! Validation that must be atomic with the data (closure, content-type match, `Stream-Seq`,
//! producer epoch/seq) happens *inside* the backend, under its per-stream write serialisation,
//! by calling the shared [`crate::rules`]; the HTTP layer only parses and renders. What every
//! backend must do is pinned by `crate::contract` (feature `contract`), not by this file's prose alone.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use oncelog_protocol::digest::{BodyDigest, KeyId};
use oncelog_protocol::headers::{Expiry, ProducerHeaders};
use oncelog_protocol::Offset;

/// Configuration fixed at creation; an idempotent re-create must match it exactly.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StreamConfig {
    pub content_type: String,
    pub expiry: Expiry,
    /// What the retention sweep may drop (compared on re-create only where the request named
    /// it: [`crate::RetentionRequest::matches`]).
    pub retention: crate::retention::RetentionPolicy,
    /// `Stream-Compaction: state` (see [`StreamMeta::compaction`](crate::StreamMeta)).
    pub compaction: bool,
}

/// What a reader needs to know about a stream, as of one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamInfo {
    /// Internal id, unique across the life of the store: a re-created path gets a new one, so
    /// ETags of a deleted stream never match its successor's.
    pub id: u64,
    /// Shared with the stream's state: an answer holds the configuration, it does not copy it.
    pub config: Arc<StreamConfig>,
    /// Offset after the last durable byte.
    pub tail: Offset,
    pub closed: bool,
    /// Where reads may start (an explicit trim moved it; 0 until then).
    pub earliest: Offset,
}

#[derive(Debug, Clone)]
pub struct CreateRequest {
    pub path: String,
    /// `None`: the default (`application/octet-stream`), or the source's for a fork.
    pub content_type: Option<String>,
    /// `None`: no expiry requested: never, or the source's for a fork (section 4.2 table).
    pub expiry: Option<Expiry>,
    /// Set to create a fork of another stream.
    pub fork: Option<ForkRequest>,
    /// The retention policy (already resolved against the server's defaults). A fork has its
    /// own: the source's is not inherited.
    pub retention: crate::retention::RetentionRequest,
    /// `Stream-Compaction: state`: a JSON stream of State Protocol messages that compactions may
    /// shorten. A fork of such a stream is one too.
    pub compaction: bool,
    /// Create in the closed state (`Stream-Closed: true`).
    pub closed: bool,
    /// Initial content in stored form (already JSON-framed for JSON streams); may be empty.
    pub initial: Bytes,
    /// Whether `initial` was framed as JSON messages. The caller decides framing from a lookup
    /// made before the body arrived; the engine refuses the create when that decision no longer
    /// matches the stream's content type ([`CreateError::FramingMismatch`]).
    pub json_framed: bool,
    /// Unix milliseconds, from the caller's clock.
    pub now_ms: i64,
}

/// `Stream-Forked-From`, `Stream-Fork-Offset`, `Stream-Fork-Sub-Offset`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForkRequest {
    /// The source stream's path (same namespace as [`CreateRequest::path`]).
    pub source: String,
    /// Where to diverge; `None` = the source's tail.
    pub offset: Option<Offset>,
    /// Units past `offset` inside the append that starts there: messages for JSON streams,
    /// bytes otherwise. 0 = exactly at `offset`.
    pub sub_offset: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CreateOutcome {
    /// `201`: a new stream.
    Created(StreamInfo),
    /// `200`: it existed with the same configuration and closure status.
    Existing(StreamInfo),
}

/// What differs between an existing stream and a create that names the same path: the first
/// difference found, with both sides, so the `409` says what to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Mismatch {
    #[error("its content type is {existing:?}, the request says {requested:?}")]
    ContentType { existing: String, requested: String },
    #[error("its expiry is {}, the request says {}", expiry(existing), expiry(requested))]
    Expiry { existing: Expiry, requested: Expiry },
    #[error("it is {}, the request says {}", open_or_closed(*existing), open_or_closed(!*existing))]
    Closed { existing: bool },
    #[error("{}, the request says {}", fork_of(existing, "it"), fork_of(requested, "it"))]
    Fork { existing: Option<crate::ForkOf>, requested: Option<crate::ForkOf> },
    #[error("it was {}made for compaction (Stream-Compaction: state), the request says {}", if *existing { "" } else { "not " }, if *existing { "otherwise" } else { "it is" })]
    Compaction { existing: bool },
    #[error("its retention is max age {}, max bytes {}; the request names {}", limit(existing.max_age_s), limit(existing.max_bytes), requested_retention(requested))]
    Retention { existing: crate::RetentionPolicy, requested: crate::retention::RetentionRequest },
}

fn expiry(e: &Expiry) -> String {
    match e {
        Expiry::Never => "none".to_owned(),
        Expiry::Ttl(s) => format!("Stream-TTL {s}"),
        Expiry::At(ms) => format!("Stream-Expires-At {ms} ms"),
    }
}

fn open_or_closed(closed: bool) -> &'static str {
    if closed {
        "closed"
    } else {
        "open"
    }
}

fn fork_of(f: &Option<crate::ForkOf>, who: &str) -> String {
    match f {
        None => format!("{who} is no fork"),
        Some(f) => format!("{who} forks stream #{} at byte {}", f.source_id, f.fork_point),
    }
}

/// A request's content type as an error names it (`None`: the request sent none).
fn requested_type(ct: &Option<String>) -> String {
    ct.as_ref().map_or_else(|| "(none)".to_owned(), |ct| format!("{ct:?}"))
}

fn limit(v: Option<u64>) -> String {
    v.map_or_else(|| "none".to_owned(), |v| v.to_string())
}

fn requested_retention(r: &crate::retention::RetentionRequest) -> String {
    let mut parts = Vec::new();
    if r.named_age {
        parts.push(format!("max age {}", limit(r.policy.max_age_s)));
    }
    if r.named_bytes {
        parts.push(format!("max bytes {}", limit(r.policy.max_bytes)));
    }
    parts.join(", ")
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum CreateError {
    #[error("stream exists with a different configuration: {0}")]
    ConfigMismatch(Mismatch),
    #[error("the fork offset was trimmed from the source; it now starts at Stream-Earliest-Offset")]
    ForkTrimmed { earliest: Offset },
    #[error("path belongs to a deleted stream whose data forks still read")]
    PathReserved,
    #[error("fork source not found")]
    SourceNotFound,
    #[error("fork source has been deleted")]
    SourceGone,
    /// `409`: a fork names a content type other than its source's; both are named, so the
    /// client sees which one to send (or to leave out: a fork without one inherits it).
    #[error("content type {requested:?} does not match the fork source's {source_type:?}")]
    ContentTypeMismatch { source_type: String, requested: String },
    #[error("fork offset is beyond the source's tail")]
    ForkOffsetBeyondTail,
    #[error("fork sub-offset is past the end of the append at the fork offset")]
    SubOffsetOvershoot,
    /// The path is empty, longer than [`crate::rules::shape::MAX_PATH_BYTES`] or holds a NUL
    /// character ([`crate::rules::shape::create`]).
    #[error("stream path must be 1 to 4,096 bytes without NUL characters")]
    InvalidPath,
    #[error("initial body is too large to store as one record")]
    TooLarge,
    #[error("the fork source changed while the request was read; retry")]
    FramingMismatch,
    #[error("Stream-Compaction: state needs a JSON stream (application/json)")]
    CompactionNeedsJson,
    #[error("Stream-Compaction: state cannot be combined with a retention policy: retention would drop the snapshot")]
    CompactionWithRetention,
    #[error("a fork of a stream not made for compaction cannot be made for compaction: its inherited history is not checked State Protocol")]
    CompactionOfPlainSource,
    #[error(transparent)]
    Storage(#[from] StorageError),
}

#[derive(Debug, Clone)]
pub struct AppendRequest {
    pub path: String,
    /// The stream incarnation ([`StreamInfo::id`]) the request was validated and framed
    /// against; the engine answers [`AppendError::StreamChanged`] when the path now holds
    /// another stream. `None`: whatever stream the path holds.
    pub stream_id: Option<u64>,
    /// Whether `data` was framed as JSON messages; must equal whether the stream is JSON
    /// (else [`AppendError::FramingMismatch`]), so unframed bytes never enter a JSON stream.
    pub json_framed: bool,
    /// The request's content type; `None` when the body is empty (close-only), where it is ignored.
    pub content_type: Option<String>,
    /// Body in stored form; empty only for close-only requests.
    pub data: Bytes,
    /// `Stream-Closed: true`.
    pub close: bool,
    pub stream_seq: Option<String>,
    pub producer: Option<ProducerHeaders>,
    /// `If-Match`: the append is written only if the stream's tail is one of these (else
    /// [`AppendError::PreconditionFailed`]). `None`: unconditional.
    pub if_match: Option<Vec<Offset>>,
    /// `Stream-Expected-Offset`: the append is written only if the stream's tail is exactly this
    /// offset (else [`AppendError::ExpectedOffsetConflict`]), decided with the write. A
    /// producer retry of an append that landed is still a duplicate: that verdict comes first.
    pub expected_offset: Option<Offset>,
    /// The digest of `data`, when the caller computed it (off the engine's writer); computed
    /// from `data` when needed otherwise.
    pub body_digest: Option<BodyDigest>,
    /// `Idempotency-Key` (as its [`KeyId`]): a repeat within the window is answered from the
    /// first append instead of written again.
    pub idempotency_key: Option<KeyId>,
    pub now_ms: i64,
}

impl AppendRequest {
    /// An unconditional append of `data` (in stored form: JSON-framed when `json_framed`) with
    /// no producer, key, `Stream-Seq` or closure: the fields callers set first.
    pub fn plain(path: impl Into<String>, content_type: &str, json_framed: bool, data: Bytes, now_ms: i64) -> Self {
        AppendRequest {
            path: path.into(),
            stream_id: None,
            json_framed,
            content_type: Some(content_type.to_owned()),
            data,
            close: false,
            stream_seq: None,
            producer: None,
            if_match: None,
            expected_offset: None,
            body_digest: None,
            idempotency_key: None,
            now_ms,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AppendStatus {
    /// New data (or a first close) was committed.
    Appended,
    /// A producer retry of something already committed; nothing written.
    Duplicate,
    /// Close-only request on an already closed stream; nothing written.
    AlreadyClosed,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppendOutcome {
    pub status: AppendStatus,
    /// For `Appended`, the new tail. For `Duplicate`, where the original append ended when the
    /// receipt is still remembered, else the current tail. For `AlreadyClosed`, the final tail.
    pub next_offset: Offset,
    /// Whether the stream is closed after this request.
    pub closed: bool,
    /// `(epoch, highest accepted seq)` to echo in `Producer-Epoch` / `Producer-Seq`.
    pub producer: Option<(u64, u64)>,
}

impl AppendOutcome {
    /// Whether this success is new data (`had_data`) from a writer that can tell its retries
    /// apart (`identified`: a producer or an idempotency key), which the protocol answers `200`;
    /// every other success is `204`: a duplicate, a close, a plain writer's data.
    pub fn is_new_identified_data(&self, identified: bool, had_data: bool) -> bool {
        self.status == AppendStatus::Appended && identified && had_data
    }
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum AppendError {
    #[error("stream not found")]
    NotFound,
    #[error("stream has been deleted")]
    Gone,
    #[error("stream is closed")]
    Closed { tail: Offset },
    /// `409`: the body's content type is not the stream's; both are named, so a client that
    /// sent the wrong one sees what the stream expects.
    #[error("content type {} does not match the stream's {stream:?}", requested_type(requested))]
    ContentTypeMismatch { stream: String, requested: Option<String> },
    /// `409` with the tail, body `Sequence conflict` (the upstream protocol's words first).
    #[error("Sequence conflict: Stream-Seq must be greater than the last one")]
    StreamSeqRegression { tail: Offset },
    /// `409` with the tail, body `Expected offset conflict`.
    #[error("Expected offset conflict: the stream's tail is not the offset Stream-Expected-Offset names; someone wrote since (the tail is in Stream-Next-Offset)")]
    ExpectedOffsetConflict { tail: Offset },
    #[error("producer epoch is stale")]
    ProducerFenced { current_epoch: u64 },
    #[error("producer sequence gap: expected {expected}, received {received}")]
    ProducerSeqGap { expected: u64, received: u64 },
    #[error("a new producer epoch must start at sequence 0")]
    ProducerEpochSeq,
    #[error("stream offset space exhausted")]
    OffsetOverflow,
    /// The producer id is empty, longer than [`crate::rules::shape::MAX_PRODUCER_ID_BYTES`] or
    /// holds a NUL character ([`crate::rules::shape::append`]).
    #[error("producer id must be 1 to 1,024 bytes without NUL characters")]
    InvalidProducerId,
    #[error("body is too large to store as one record")]
    TooLarge,
    #[error("an empty body is only allowed with Stream-Closed: true")]
    Empty,
    #[error("the stream was replaced while the request was read; retry")]
    StreamChanged,
    #[error("body framing does not match the stream's content type")]
    FramingMismatch,
    #[error("Producer-Seq {seq} of epoch {epoch} was already accepted with a different body; a retry must resend the same bytes, new data needs the next Producer-Seq")]
    ProducerBodyMismatch { epoch: u64, seq: u64 },
    #[error("this Idempotency-Key was already used on this stream with a different body; use a new key for new data")]
    IdempotencyKeyMismatch,
    #[error("Idempotency-Key cannot be combined with producer headers")]
    IdempotencyKeyWithProducer,
    #[error("the stream's tail is not the one If-Match names: someone wrote since; read from the tail in Stream-Next-Offset and decide again")]
    PreconditionFailed { tail: Offset, closed: bool },
    /// A producer new to the stream beyond a producer cap ([`crate::rules::Retention`]): nothing
    /// was stored, so the same request (same id, epoch and seq) may be sent again later.
    #[error("{} ({} {limit}): this Producer-Id is new here and was refused, nothing was written; retry later with the same Producer-Id, epoch and seq (slots free as idle producers expire), or write as a known producer", cap.what(), cap.flag())]
    ProducerLimit { cap: ProducerCap, limit: u64 },
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// Which cap refused a new producer ([`AppendError::ProducerLimit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProducerCap {
    /// `--max-producers-per-stream`: live producer states on the stream.
    PerStream,
    /// `--max-producers`: producer states across the server's streams.
    Total,
}

impl ProducerCap {
    fn what(self) -> &'static str {
        match self {
            ProducerCap::PerStream => "too many producers on this stream",
            ProducerCap::Total => "too many producers on this server",
        }
    }

    /// The server flag that sets it (named in the refusal, so an operator knows what to raise).
    pub fn flag(self) -> &'static str {
        match self {
            ProducerCap::PerStream => "--max-producers-per-stream",
            ProducerCap::Total => "--max-producers",
        }
    }
}

/// Why a trim was refused.
#[derive(Debug, Clone, thiserror::Error)]
pub enum TrimError {
    #[error("stream not found")]
    NotFound,
    #[error("stream has been deleted")]
    Gone,
    #[error("the trim offset lies beyond the stream's tail")]
    BeyondTail { tail: Offset },
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// A compaction: the snapshot of a State Protocol stream's whole history, written at its tail
/// with the earliest offset moved there, in one atomic unit (see [`Engine::compact`]).
#[derive(Debug, Clone)]
pub struct CompactRequest {
    pub path: String,
    /// The incarnation the snapshot was made from (`None`: whatever stream the path holds).
    pub stream_id: Option<u64>,
    /// The tail the snapshot describes: refused ([`CompactError::Stale`]) if the stream moved on.
    pub at: Offset,
    /// The snapshot's appends, in stored JSON form ([`oncelog_protocol::state::snapshot`]).
    pub pieces: Vec<Bytes>,
    pub now_ms: i64,
}

/// Why a compaction was refused.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CompactError {
    #[error("stream not found")]
    NotFound,
    #[error("stream has been deleted")]
    Gone,
    #[error("the stream was not created with Stream-Compaction: state")]
    NotCompactable,
    #[error("a closed stream takes no snapshot")]
    Closed,
    #[error("the stream moved on while its snapshot was made")]
    Stale { tail: Offset },
    #[error("the snapshot is too large to store")]
    TooLarge,
    /// A stored message the fold cannot read (cannot happen for messages checked on append).
    #[error("stored message is not a State Protocol message: {0}")]
    NotStateProtocol(#[from] oncelog_protocol::state::StateError),
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// A compaction ends with a trim of its own stream, which the compaction's checks already made
/// valid; should it still fail, this is what the compaction answers.
impl From<TrimError> for CompactError {
    fn from(e: TrimError) -> Self {
        match e {
            TrimError::NotFound => CompactError::NotFound,
            TrimError::Gone => CompactError::Gone,
            TrimError::BeyondTail { tail } => CompactError::Stale { tail },
            TrimError::Storage(s) => CompactError::Storage(s),
        }
    }
}

/// Largest engine-metadata key, in bytes.
pub const MAX_META_KEY_BYTES: usize = 1024;

/// One change to the engine's metadata: a small ordered key-value map that engines keep
/// beside the streams, for state that layers above them (subscriptions) must commit
/// atomically with appends. `value: None` deletes the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaWrite {
    pub key: Vec<u8>,
    pub value: Option<Bytes>,
}

/// A transaction ([`Engine::transact`]): metadata changes and appends to several streams that
/// commit as one atomic unit, or not at all.
#[derive(Debug, Clone, Default)]
pub struct TxnRequest {
    /// Compare-and-set guards: each key's current value must equal the one given (`None`:
    /// absent), checked atomically with the writes, else [`TxnError::Conflict`]. A single
    /// process that serialises its own changes needs none; they let several processes share
    /// one backend safely.
    pub expect: Vec<(Vec<u8>, Option<Bytes>)>,
    pub meta: Vec<MetaWrite>,
    /// At most one per stream path; decided in order by the same rules as [`Engine::append`],
    /// except that nothing parks: an early producer sequence number is a gap at once.
    pub appends: Vec<AppendRequest>,
    pub now_ms: i64,
}

/// What a committed transaction did: one outcome per append, in request order (a producer
/// retry is [`AppendStatus::Duplicate`] and wrote nothing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnOutcome {
    pub appends: Vec<AppendOutcome>,
}

/// Why a transaction wrote nothing.
#[derive(Debug, Clone, thiserror::Error)]
pub enum TxnError {
    #[error("a guarded metadata key changed")]
    Conflict { key: Vec<u8> },
    #[error("append {index} was refused: {error}")]
    Append { index: usize, error: AppendError },
    #[error("append {index} targets a stream an earlier append of the same transaction targets")]
    RepeatedStream { index: usize },
    #[error("a metadata key or value is too large to store")]
    TooLarge,
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// One stream as [`Engine::list_streams`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub path: String,
    pub info: StreamInfo,
}

/// How a delete ([`Engine::delete_if`]) is made.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeleteRequest {
    /// `If-Match`: only if the stream's tail is one of these (else
    /// [`LookupError::PreconditionFailed`]), decided atomically with the delete.
    pub if_tail: Option<Vec<Offset>>,
    /// `?purge=true`: when forks still read the stream (it is live or already soft-deleted),
    /// detach it from its path instead of keeping the path reserved: its remains stay, by id,
    /// for the forks only, and the path is free at once ([`crate::rules::Removal::Detach`]).
    /// Without forks it is a plain delete.
    pub purge: bool,
}

impl DeleteRequest {
    /// A delete only if the tail is one of `tails` (`If-Match`).
    pub fn if_tail(tails: Vec<Offset>) -> Self {
        DeleteRequest { if_tail: Some(tails), purge: false }
    }

    /// A purging delete ([`DeleteRequest::purge`]).
    pub fn purge() -> Self {
        DeleteRequest { if_tail: None, purge: true }
    }
}

/// A trim's result: where the stream now starts, and its tail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrimOutcome {
    pub earliest: Offset,
    pub tail: Offset,
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum LookupError {
    #[error("stream not found")]
    NotFound,
    #[error("stream has been deleted")]
    Gone,
    /// The offset read lies before the stream's earliest retained one (trimmed).
    #[error("that offset was trimmed; the stream now starts at Stream-Earliest-Offset")]
    Trimmed { earliest: Offset },
    /// A conditional delete whose `If-Match` names another tail.
    #[error("the stream's tail is not the one If-Match names: someone wrote since")]
    PreconditionFailed { tail: Offset, closed: bool },
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// A read ([`Engine::read`]): one request type for every kind of read.
#[derive(Debug, Clone, Copy)]
pub struct ReadRequest<'a> {
    pub path: &'a str,
    pub from: Offset,
    /// About this many bytes: whole appends, at least one when data exists (JSON stays
    /// message-aligned); with `bounded`, never more (at least one byte when data exists).
    pub max_bytes: usize,
    /// `max_bytes` is a hard limit and the answer may end inside an append. For byte streams
    /// only (a JSON reader needs whole messages). A live reader that stops reading holds one such
    /// chunk, so what it can pin does not grow with the size of the appends; an engine that can
    /// read part of an append should, rather than read it whole and cut it
    /// ([`ReadChunk::cut_to`]).
    pub bounded: bool,
    /// A live reader that [`Engine::wait`] just woke: what the wait saw (its
    /// `WaitOutcome::Changed` info). The engine may take the stream's state from it instead of
    /// looking it up again, so the answer is as of `seen` or later (a database engine saves one
    /// query per woken reader: with many readers per stream, most of its work).
    pub seen: Option<&'a StreamInfo>,
    /// Unix milliseconds, from the caller's clock (expiry; a read slides the TTL).
    pub now_ms: i64,
}

impl<'a> ReadRequest<'a> {
    /// A read of whole appends.
    pub fn new(path: &'a str, from: Offset, max_bytes: usize, now_ms: i64) -> ReadRequest<'a> {
        ReadRequest { path, from, max_bytes, bounded: false, seen: None, now_ms }
    }

    /// The same read, bounded (see [`ReadRequest::bounded`]).
    pub fn bounded(self) -> ReadRequest<'a> {
        ReadRequest { bounded: true, ..self }
    }

    /// The same read by a reader a wait woke with `seen` (see [`ReadRequest::seen`]).
    pub fn after(self, seen: &'a StreamInfo) -> ReadRequest<'a> {
        ReadRequest { seen: Some(seen), ..self }
    }
}

/// Bytes read from a stream.
#[derive(Debug, Clone)]
pub struct ReadChunk {
    pub info: StreamInfo,
    /// Stored bytes from the requested offset; whole appends only, so JSON stays message-aligned.
    pub data: Bytes,
    /// Offset after the last returned byte.
    pub next: Offset,
    /// The read began at a position the engine minted: the start of an append, a fork point or
    /// the tail. A JSON stream is message-aligned only there; any other offset is made up.
    pub aligned: bool,
}

/// A read's bytes as consecutive pieces ([`Engine::read_pieces`]).
#[derive(Debug, Clone)]
pub struct ReadPieces {
    pub info: StreamInfo,
    /// In order: their concatenation is what [`Engine::read`] would have returned.
    pub pieces: Vec<Bytes>,
    /// Offset after the last returned byte.
    pub next: Offset,
}

impl From<ReadChunk> for ReadPieces {
    /// The chunk's bytes as one piece.
    fn from(chunk: ReadChunk) -> ReadPieces {
        ReadPieces { info: chunk.info, pieces: vec![chunk.data], next: chunk.next }
    }
}

impl ReadPieces {
    /// How many bytes the pieces hold.
    pub fn len(&self) -> usize {
        self.pieces.iter().map(Bytes::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl ReadChunk {
    /// The chunk cut to at most `max_bytes` (at least one), possibly inside an append: what a
    /// bounded read ([`ReadRequest::bounded`]) answers.
    pub fn cut_to(mut self, max_bytes: usize) -> ReadChunk {
        let max_bytes = max_bytes.max(1);
        if self.data.len() > max_bytes {
            let over = (self.data.len() - max_bytes) as u64;
            self.data.truncate(max_bytes);
            self.next = Offset(self.next.0 - over);
        }
        self
    }

    /// True when the chunk reaches the tail as it was when the read began.
    pub fn up_to_date(&self) -> bool {
        self.next >= self.info.tail
    }
}

/// A backend failure. Not the client's fault: the HTTP layer answers 5xx.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StorageError {
    #[error("storage backend failed: {0}")]
    Backend(Arc<dyn std::error::Error + Send + Sync>),
    #[error("writes are stopped after an earlier storage failure")]
    Poisoned,
    /// Stored state that cannot be decoded; the cause is the engine's own error type.
    #[error("corrupt stored state: {0}")]
    Corrupt(Arc<dyn std::error::Error + Send + Sync>),
    #[error("storage is shutting down")]
    ShuttingDown,
    /// The backend cannot be used now (a database connection lost, a log whose disk is full):
    /// nothing was done, or what was is unknown (a commit cut short); the same request may
    /// succeed once it is back, and an idempotent retry finds out. The cause says why.
    #[error("storage is unavailable: {0}")]
    Unavailable(Arc<dyn std::error::Error + Send + Sync>),
}

/// What [`Engine::wait`] observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WaitOutcome {
    /// The tail moved past the offset, or the stream closed.
    Changed(StreamInfo),
    /// Nothing happened before the deadline.
    TimedOut(StreamInfo),
}

/// What one [`Housekeeping::retain`] pass let go of: for the operator's log line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Retained {
    /// Streams whose earliest offset moved.
    pub streams: usize,
    /// Bytes of history dropped from them (sum of how far each earliest offset moved).
    pub bytes: u64,
}

/// What [`Housekeeping::prune`] dropped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PruneOutcome {
    /// Producer states idle past the producer TTL.
    pub producers: u64,
    /// Idempotency keys past their window.
    pub keys: u64,
}

/// The background work of an engine, apart from requests: what the server's sweeper asks for
/// every `--sweep-interval-ms` (pruning less often, see the server's `sweeper`). Each method
/// takes `now_ms` from the caller's clock.
pub trait Housekeeping: Send + Sync + 'static {
    /// Deletes every stream whose TTL or absolute expiry has passed; returns how many.
    fn expire(&self, now_ms: i64) -> impl Future<Output = Result<usize, StorageError>> + Send;

    /// The retention sweep: moves the earliest offset of every stream whose retention policy
    /// lets go of data to where [`crate::retention::floor`] says (durably, as a trim would);
    /// returns how many streams moved and by how many bytes.
    fn retain(&self, now_ms: i64) -> impl Future<Output = Result<Retained, StorageError>> + Send;

    /// Drops writer state the rules already treat as absent at `now_ms`: producer states idle
    /// for longer than the producer TTL and idempotency keys older than their window
    /// ([`crate::rules::Retention`]), from memory and from storage, so that neither grows for
    /// as long as a stream lives. A retry that arrives later behaves as it would without the
    /// state (documented in WRITE-MODES.md); pruning changes no answer.
    fn prune(&self, now_ms: i64) -> impl Future<Output = Result<PruneOutcome, StorageError>> + Send;

    /// The streams made for compaction whose history (tail minus earliest offset) is at least
    /// `min_bytes`, with their tails: what a background compactor looks at. Reads only what
    /// readers see (async for the same reason as [`Engine::list_streams`]).
    fn compaction_candidates(
        &self,
        min_bytes: u64,
    ) -> impl Future<Output = Result<Vec<(String, Offset)>, StorageError>> + Send;
}

/// A storage backend.
///
/// Every method takes `now_ms` (Unix milliseconds) from the caller's clock: expiry is decided
/// against it, and reads and appends (not `head`) slide a stream's TTL window.
pub trait Engine: Housekeeping {
    fn create(&self, req: CreateRequest) -> impl Future<Output = Result<CreateOutcome, CreateError>> + Send;

    /// Appends, closes, or both, atomically with any producer and `Stream-Seq` effect. Returns
    /// only once the effect is durable (per the backend's durability mode).
    ///
    /// **Parking.** A producer request that is ahead of its producer's next sequence number
    /// (see [`crate::rules::parkable`]) is not refused at once: it waits up to
    /// [`crate::rules::PARK_TIMEOUT`] for its predecessors, is applied in order as soon as they
    /// land, and only then, if they never came, gets its gap answer. Pipelined producers whose
    /// requests overtake each other on separate connections therefore see no spurious `409`.
    fn append(&self, req: AppendRequest) -> impl Future<Output = Result<AppendOutcome, AppendError>> + Send;

    /// Moves the stream's earliest readable offset forward to `to` (never back: a trim at or
    /// below the current earliest changes nothing). Durable and atomic like an append; reads
    /// from before it then answer [`LookupError::Trimmed`]. Producer state, receipts and
    /// idempotency keys are not affected; forks keep reading what they reference.
    fn trim(&self, path: &str, to: Offset, now_ms: i64) -> impl Future<Output = Result<TrimOutcome, TrimError>> + Send;

    /// Deletes the stream at `path` as [`crate::rules::delete`] decides for `req`: only if its
    /// tail is one of `req.if_tail` when given (`If-Match`; else
    /// [`LookupError::PreconditionFailed`]), decided atomically with the delete. With forks it
    /// is soft-deleted (its path answers `410` and stays reserved) or, with `req.purge`,
    /// detached (its path is free at once; its remains, unreachable by any path, go with its
    /// last fork); a purge also detaches a stream that is already soft-deleted. Persisted in
    /// one atomic unit; forks read the same bytes at the same offsets before and after.
    fn delete_if(
        &self,
        path: &str,
        req: DeleteRequest,
        now_ms: i64,
    ) -> impl Future<Output = Result<(), LookupError>> + Send;

    fn delete(&self, path: &str, now_ms: i64) -> impl Future<Output = Result<(), LookupError>> + Send {
        self.delete_if(path, DeleteRequest::default(), now_ms)
    }

    /// Metadata without sliding the TTL. Reflects every acknowledged write.
    fn head(&self, path: &str, now_ms: i64) -> impl Future<Output = Result<StreamInfo, LookupError>> + Send;

    /// The stream at `path` as this process last saw it, when the engine keeps that and a
    /// [`Engine::head`] would cost a database round trip; `None`: ask `head`. Only for framing
    /// a write, which needs the incarnation's id and configuration (content type, compaction:
    /// fixed for an incarnation), not its current tail. It may be stale: the stream deleted,
    /// replaced or expired since. The write names the incarnation
    /// ([`AppendRequest::stream_id`]), so the engine refuses a replaced one with
    /// [`AppendError::StreamChanged`] and judges a missing or expired one as `head` would; a
    /// caller that refuses the write itself must first ask `head` (a missing stream is `404`
    /// whatever else is wrong with the request). The default keeps nothing.
    fn last_seen(&self, path: &str) -> Option<StreamInfo> {
        let _ = path;
        None
    }

    /// Reads from `req.from` up to about `req.max_bytes` (at least one whole append when data
    /// exists), or exactly at most that with `req.bounded`; see [`ReadRequest`].
    fn read(&self, req: ReadRequest<'_>) -> impl Future<Output = Result<ReadChunk, LookupError>> + Send;

    /// [`Engine::read`] with its bytes as consecutive pieces, for a caller that sends them on as
    /// they are (the rest of a catch-up body): an engine that holds them apart (the log engine's
    /// mapped segment ranges, one per append) returns them without gathering them into one
    /// buffer. The default is `read`'s bytes as one piece.
    fn read_pieces(&self, req: ReadRequest<'_>) -> impl Future<Output = Result<ReadPieces, LookupError>> + Send {
        async move { self.read(req).await.map(ReadPieces::from) }
    }

    /// Waits until the tail passes `after` or the stream closes, at most `timeout`.
    fn wait(
        &self,
        path: &str,
        after: Offset,
        timeout: Duration,
        now_ms: i64,
    ) -> impl Future<Output = Result<WaitOutcome, LookupError>> + Send;

    /// Writes a State Protocol stream's snapshot (`req.pieces`, one append each) at its tail
    /// `req.at` and moves its earliest offset there, all in one atomic unit: a reader from the
    /// earliest offset then materialises the same state as one that read the whole history, and
    /// readers of the dropped history get [`LookupError::Trimmed`]. Refused unless the stream is
    /// still incarnation `req.stream_id` with tail `req.at`, open, and made for compaction.
    fn compact(&self, req: CompactRequest) -> impl Future<Output = Result<TrimOutcome, CompactError>> + Send;

    /// Commits `txn` as one atomic unit (one frame, one batch): every metadata write and every
    /// append that is not a duplicate, or nothing. Durable like an append when it returns.
    fn transact(&self, txn: TxnRequest) -> impl Future<Output = Result<TxnOutcome, TxnError>> + Send;

    /// Every metadata entry whose key starts with `prefix`, in key order, reflecting every
    /// acknowledged transaction.
    fn meta_scan(&self, prefix: &[u8]) -> impl Future<Output = Result<Vec<(Vec<u8>, Bytes)>, StorageError>> + Send;

    /// The streams readers can see whose path starts with `prefix`, in path order; reads only
    /// what readers see. Async and fallible because an engine whose state lives in a database
    /// asks it (the log engine answers from memory at once).
    fn list_streams(&self, prefix: &str, now_ms: i64)
        -> impl Future<Output = Result<Vec<Listed>, StorageError>> + Send;

    /// Finishes in-flight writes and makes them durable; later writes fail with `ShuttingDown`.
    fn shutdown(&self) -> impl Future<Output = Result<(), StorageError>> + Send;

    /// Whether writes are accepted now (for `/readyz`). Cheap; never blocks.
    fn readiness(&self) -> Readiness;

    /// Counts for metrics. Cheap; never blocks.
    fn stats(&self) -> EngineStats;

    /// Whether several processes may change this engine's state concurrently (server nodes
    /// sharing one database). Layers above must then not trust what they cached, and must guard
    /// their writes with [`TxnRequest::expect`]. An engine one process owns answers `false`.
    fn shared(&self) -> bool {
        false
    }
}

/// Whether an engine accepts writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    Ready,
    /// Writes are refused; `reason` says why in one line (a fail-stop's cause, shutdown).
    NotReady {
        reason: String,
    },
}

/// Sizes an engine reports for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// Streams that exist (including soft-deleted and detached ones kept for their forks).
    pub streams: u64,
    /// Idempotent producers remembered across all streams.
    pub producers: u64,
    /// Producer appends that waited for their predecessors since the engine started
    /// ([`crate::machine::parking`]).
    pub parked_appends: u64,
}
