//! The protocol's decisions as pure functions over a stream's state: one set of rules for every
//! engine.
//!
//! An engine holds its streams' state ([`StreamMeta`], tail, producer states) and serialises the
//! writes of each stream. For each command it calls one function here with the state as it is
//! *inside* that serialisation, gets a verdict and a description of the effects, and persists
//! those effects in its own atomic unit (the log engine: one frame; PostgreSQL: one
//! transaction). No function here does I/O or reads a clock: time comes in as `now_ms`, data an
//! engine must look up (the append a fork sub-offset points into) comes in through a closure.
//!
//! Precedence of an append's checks, in order (the first that applies answers), after its shape
//! (path, producer id, size: [`shape`], the same limits on every engine):
//! 1. the stream incarnation ([`AppendError::StreamChanged`]) and soft deletion (`Gone`);
//! 2. the idempotency key (combined with producer headers: `IdempotencyKeyWithProducer`): a key
//!    seen within the window is a duplicate answered with its append's end offset, or
//!    `IdempotencyKeyMismatch` when the body differs; or the producer verdict (state idle for longer than [`Retention::producer_ttl_ms`] counts as
//!    absent): a retry of an accepted request is a duplicate whatever changed since (even when
//!    that request closed the stream, or when its `If-Match` no longer holds) — unless its body
//!    differs from the original's on a stream still open, which is `ProducerBodyMismatch`,
//!    never a silent drop; a stale
//!    epoch is fenced; a gap on a *closed* stream answers `Closed` (waiting for predecessors
//!    cannot help);
//! 3. `If-Match`: a tail other than the ones named is `PreconditionFailed`, with the tail and
//!    closure, so a conditional writer learns both from one answer;
//! 4. closure (a close-only request on a closed stream is `AlreadyClosed`, not an error);
//! 5. content type (only when there is a body), then JSON framing;
//! 6. `Stream-Seq`, strictly increasing byte-wise;
//! 7. offset space;
//! 8. the producer caps ([`Retention::max_producers_per_stream`], [`Retention::max_producers`]):
//!    a request that would create producer state beyond them is `ProducerLimit`, and only such
//!    a request.

use std::time::Duration;

use bytes::Bytes;
use oncelog_protocol::digest::{BodyDigest, KeyId};
use oncelog_protocol::headers::Expiry;
use oncelog_protocol::producer::{self, ProducerState, Verdict};
use oncelog_protocol::{content_type, json, Offset};

use crate::engine::*;
use crate::meta::{ForkOf, IdempotencyKeys, KeyEntry, StreamMeta};

pub mod shape;

/// How long an append that arrived ahead of its producer's next sequence number waits for its
/// predecessors before it gets its gap answer. Pipelined requests over several connections
/// arrive out of order by a few milliseconds; waiting turns a would-be 409-and-resend into a 200.
pub const PARK_TIMEOUT: Duration = Duration::from_millis(250);

/// How far ahead of the expected sequence number a request may be and still wait.
pub const MAX_PARK_AHEAD: u64 = 64;

/// How long write-side state is kept, and how much of it, set per server
/// (`--producer-state-ttl`, `--idempotency-window`, `--max-producers-per-stream`,
/// `--max-producers`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// A producer idle for longer is forgotten: treated as new by the rules at once, its state
    /// dropped from memory and storage later. A retry that arrives after this may be taken as
    /// new data (a forgotten producer's seq 0 is appended again); any other sequence number of a
    /// forgotten producer is a gap (`409`), never accepted.
    pub producer_ttl_ms: i64,
    /// An `Idempotency-Key` counts for this long after its append (`--idempotency-window`); a
    /// repeat that arrives later is taken as new data.
    pub idempotency_window_ms: i64,
    /// Live producer states one stream may hold: a producer new to the stream (or whose state
    /// expired) beyond it is refused ([`AppendError::ProducerLimit`]); a known one never is.
    pub max_producers_per_stream: u64,
    /// Producer states the engine may hold across all its streams, as the engine counts them
    /// (see [`WriterState::producers_total`]).
    pub max_producers: u64,
}

impl Retention {
    /// Seven days, as Kafka keeps idle producer ids.
    pub const DEFAULT_PRODUCER_TTL_MS: i64 = 7 * 24 * 3600 * 1000;
    /// A day: longer than any client's retry schedule.
    pub const DEFAULT_IDEMPOTENCY_WINDOW_MS: i64 = 24 * 3600 * 1000;
    /// Far more writers than one stream sees in real use (a producer per writing process), few
    /// enough that a stream's producer states stay a few MB.
    pub const DEFAULT_MAX_PRODUCERS_PER_STREAM: u64 = 10_000;
    /// A few hundred MB of producer state at most (docs/OPERATIONS.md states the cost).
    pub const DEFAULT_MAX_PRODUCERS: u64 = 1_000_000;

    /// Whether an idempotency key accepted at `at_ms` still counts at `now_ms`.
    pub fn key_is_live(&self, entry: &KeyEntry, now_ms: i64) -> bool {
        now_ms < entry.at_ms.saturating_add(self.idempotency_window_ms)
    }

    /// What is dead at `now_ms`, as times a store can delete by: a producer whose last activity
    /// is at or before the first (not [`ProducerState::is_live`]), a key accepted at or before the
    /// second (not [`Retention::key_is_live`]). A store that deletes rows by time (PostgreSQL's
    /// prune) deletes exactly what [`crate::machine::StreamState::prune`] drops.
    pub fn dead_at_or_before(&self, now_ms: i64) -> (i64, i64) {
        (now_ms.saturating_sub(self.producer_ttl_ms), now_ms.saturating_sub(self.idempotency_window_ms))
    }
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            producer_ttl_ms: Self::DEFAULT_PRODUCER_TTL_MS,
            idempotency_window_ms: Self::DEFAULT_IDEMPOTENCY_WINDOW_MS,
            max_producers_per_stream: Self::DEFAULT_MAX_PRODUCERS_PER_STREAM,
            max_producers: Self::DEFAULT_MAX_PRODUCERS,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Expiry and visibility

/// Whether a stream has expired at `now_ms`, given when it was last read or written (sliding TTL).
pub fn expired(expiry: Expiry, last_access_ms: i64, now_ms: i64) -> bool {
    match expiry {
        Expiry::Never => false,
        Expiry::At(at) => now_ms >= at,
        Expiry::Ttl(secs) => {
            let ttl_ms = i64::try_from(secs.saturating_mul(1000)).unwrap_or(i64::MAX);
            now_ms >= last_access_ms.saturating_add(ttl_ms)
        }
    }
}

/// The write path's verdict on an expired stream (`expired`: [`expired`] at the request's time):
/// what [`visible`] says of it, absent or `Gone` while forks still read it. A soft-deleted stream
/// has its own answer ([`append`]'s first rule). Engines answer it alike; the log engine also
/// removes the stream in the write's group, PostgreSQL leaves that to the sweep.
pub fn writable(soft_deleted: bool, expired: bool, live_forks: usize) -> Result<(), AppendError> {
    match visible(false, expired && !soft_deleted, live_forks) {
        Ok(()) => Ok(()),
        Err(LookupError::Gone) => Err(AppendError::Gone),
        Err(_) => Err(AppendError::NotFound),
    }
}

/// Whether a write slides its stream's TTL window: any request that reaches the incarnation it
/// names (one framed for a stream since replaced does not).
pub fn write_slides_ttl(req: &AppendRequest, meta: &StreamMeta) -> bool {
    req.stream_id.is_none_or(|id| id == meta.id)
}

/// How a path holding a stream looks to a reader: soft-deleted streams are `410`; an expired one
/// is absent (`404`), or `410` while forks still read it (it is about to be soft-deleted).
pub fn visible(soft_deleted: bool, expired: bool, live_forks: usize) -> Result<(), LookupError> {
    if soft_deleted {
        return Err(LookupError::Gone);
    }
    if expired {
        return Err(if live_forks > 0 { LookupError::Gone } else { LookupError::NotFound });
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Append

/// What an engine does with an append.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AppendPlan<'a> {
    /// Nothing to write: answer with this (a producer duplicate, or a close of a closed stream).
    Answer(AppendOutcome),
    /// Write the request's data at the tail and apply these effects, all in one atomic unit.
    Write(AppendWrite<'a>),
}

/// The producer whose `(epoch, seq)` an accepted append moves to (borrowed from the request).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerStamp<'a> {
    pub id: &'a str,
    pub epoch: u64,
    pub seq: u64,
}

/// The effects of an accepted append.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendWrite<'a> {
    /// The tail after the data: the data occupies `[old tail, new_tail)`.
    pub new_tail: Offset,
    /// The stream becomes closed.
    pub close: bool,
    /// The request's `Stream-Seq` becomes the stream's last one.
    pub set_stream_seq: bool,
    /// The producer and the `(epoch, seq)` to accept into its state, with `new_tail` and
    /// `digest` as its receipt, at `at_ms`.
    pub producer: Option<ProducerStamp<'a>>,
    /// The body's digest (for the producer's receipt).
    pub digest: BodyDigest,
    /// When the request was decided (the producer's activity time).
    pub at_ms: i64,
    /// The request's idempotency key, to remember with `new_tail` and `digest`.
    pub key: Option<KeyId>,
}

impl AppendWrite<'_> {
    /// The answer once the effects are durable.
    pub fn outcome(&self, closed_before: bool) -> AppendOutcome {
        AppendOutcome {
            status: AppendStatus::Appended,
            next_offset: self.new_tail,
            closed: closed_before || self.close,
            producer: self.producer.map(|p| (p.epoch, p.seq)),
        }
    }
}

/// What an append is decided against besides the stream's metadata and tail: the state of the
/// request's producer on this stream and the entry of its idempotency key, when there are
/// (expired or not: the [`Retention`] decides), and how many producer states the stream and the
/// engine hold (for the caps a new producer is held to).
#[derive(Debug, Clone, Copy, Default)]
pub struct WriterState<'a> {
    pub producer: Option<&'a ProducerState>,
    pub key: Option<&'a KeyEntry>,
    /// Live producer states on the stream, compared only with
    /// [`Retention::max_producers_per_stream`]: below the cap a count of the states held
    /// (expired ones included) will do; the machine counts the live ones exactly at the cap.
    pub producers_on_stream: u64,
    /// Producer states the engine holds across all streams, as it counts them: compared with
    /// [`Retention::max_producers`].
    pub producers_total: u64,
}

impl<'a> WriterState<'a> {
    /// Looks the request's producer and key up in a stream's maps (the counts are left at 0).
    pub fn of(
        req: &AppendRequest,
        producers: &'a std::collections::HashMap<String, ProducerState>,
        keys: &'a IdempotencyKeys,
    ) -> Self {
        WriterState {
            producer: req.producer.as_ref().and_then(|p| producers.get(&p.id)),
            key: req.idempotency_key.and_then(|k| keys.as_ref()?.get(&k)),
            producers_on_stream: 0,
            producers_total: 0,
        }
    }
}

/// Whether `req`, if accepted, creates producer state on its stream: it names a producer with
/// no live state there (`state`: the stream's state of that producer, if any).
pub fn makes_new_producer(req: &AppendRequest, state: Option<&ProducerState>, retention: &Retention) -> bool {
    req.producer.is_some() && !state.is_some_and(|s| s.is_live(req.now_ms, retention.producer_ttl_ms))
}

/// Decides an append against the stream's current state.
pub fn append<'a>(
    meta: &StreamMeta,
    tail: Offset,
    writer: WriterState<'_>,
    req: &'a AppendRequest,
    retention: &Retention,
) -> Result<AppendPlan<'a>, AppendError> {
    let producer = writer.producer.filter(|s| s.is_live(req.now_ms, retention.producer_ttl_ms));
    let key = writer.key.filter(|k| retention.key_is_live(k, req.now_ms));
    // Hashed only when a producer needs it (its receipt, or the duplicate check).
    let digest = || req.body_digest.unwrap_or_else(|| BodyDigest::of(&req.data));
    // 1. Incarnation and deletion.
    if req.stream_id.is_some_and(|id| id != meta.id) {
        return Err(AppendError::StreamChanged);
    }
    if meta.soft_deleted {
        return Err(AppendError::Gone);
    }
    if req.data.is_empty() && !req.close {
        return Err(AppendError::Empty);
    }
    if req.idempotency_key.is_some() && req.producer.is_some() {
        return Err(AppendError::IdempotencyKeyWithProducer);
    }
    // 2. Producer verdict, or the idempotency key's (a writer has one or the other).
    if let Some(k) = key {
        if !k.digest.matches(digest()) {
            return Err(AppendError::IdempotencyKeyMismatch);
        }
        return Ok(AppendPlan::Answer(AppendOutcome {
            status: AppendStatus::Duplicate,
            next_offset: k.end,
            closed: meta.closed,
            producer: None,
        }));
    }
    if let Some(p) = &req.producer {
        match producer::validate(producer, p.epoch, p.seq) {
            Verdict::Accept => {}
            Verdict::Duplicate { receipt } => {
                // On a closed stream nothing more can be written anyway, and the protocol's
                // conformance suite requires a retried close with another body to be a duplicate.
                if !meta.closed && receipt.is_some_and(|r| !r.digest.matches(digest())) {
                    return Err(AppendError::ProducerBodyMismatch { epoch: p.epoch, seq: p.seq });
                }
                let last = producer.map_or(p.seq, |s| s.last_seq);
                return Ok(AppendPlan::Answer(AppendOutcome {
                    status: AppendStatus::Duplicate,
                    next_offset: receipt.map_or(tail, |r| r.end),
                    closed: meta.closed,
                    producer: Some((p.epoch, last)),
                }));
            }
            Verdict::Fenced { current_epoch } => return Err(AppendError::ProducerFenced { current_epoch }),
            Verdict::NewEpochMustStartAtZero => return Err(AppendError::ProducerEpochSeq),
            Verdict::Gap { .. } if meta.closed => return Err(AppendError::Closed { tail }),
            Verdict::Gap { expected, received } => return Err(AppendError::ProducerSeqGap { expected, received }),
        }
    }
    // 3. The condition.
    if req.if_match.as_ref().is_some_and(|tails| !tails.contains(&tail)) {
        return Err(AppendError::PreconditionFailed { tail, closed: meta.closed });
    }
    // 4. Closure.
    if meta.closed {
        if req.close && req.data.is_empty() {
            return Ok(AppendPlan::Answer(AppendOutcome {
                status: AppendStatus::AlreadyClosed,
                next_offset: tail,
                closed: true,
                producer: None,
            }));
        }
        return Err(AppendError::Closed { tail });
    }
    // 5. The strict compare-and-append (a closed stream's answer, above, wins even when the
    // offset matches).
    if req.expected_offset.is_some_and(|o| o != tail) {
        return Err(AppendError::ExpectedOffsetConflict { tail });
    }
    // 6. Content type and framing, when there is a body.
    if !req.data.is_empty() {
        let ok = req.content_type.as_deref().is_some_and(|ct| content_type::matches(ct, &meta.config.content_type));
        if !ok {
            return Err(AppendError::ContentTypeMismatch {
                stream: meta.config.content_type.clone(),
                requested: req.content_type.clone(),
            });
        }
        if req.json_framed != content_type::is_json(&meta.config.content_type) {
            return Err(AppendError::FramingMismatch);
        }
    }
    // 7. Stream-Seq.
    if let (Some(seq), Some(last)) = (&req.stream_seq, &meta.stream_seq) {
        if seq.as_bytes() <= last.as_bytes() {
            return Err(AppendError::StreamSeqRegression { tail });
        }
    }
    // 7. Offset space.
    let new_tail =
        tail.0.checked_add(req.data.len() as u64).filter(|t| *t <= Offset::MAX.0).ok_or(AppendError::OffsetOverflow)?;
    // 8. The producer caps, last: only a request that would otherwise create producer state is
    // refused, so no other verdict (a duplicate, a gap, a fence, a closed stream) turns into a
    // 429, and a known producer's appends and retries never meet the caps.
    if req.producer.is_some() && producer.is_none() {
        if writer.producers_on_stream >= retention.max_producers_per_stream {
            return Err(AppendError::ProducerLimit {
                cap: ProducerCap::PerStream,
                limit: retention.max_producers_per_stream,
            });
        }
        if writer.producers_total >= retention.max_producers {
            return Err(AppendError::ProducerLimit { cap: ProducerCap::Total, limit: retention.max_producers });
        }
    }
    Ok(AppendPlan::Write(AppendWrite {
        new_tail: Offset(new_tail),
        close: req.close,
        set_stream_seq: req.stream_seq.is_some(),
        producer: req.producer.as_ref().map(|p| ProducerStamp { id: &p.id, epoch: p.epoch, seq: p.seq }),
        digest: if req.producer.is_some() || req.idempotency_key.is_some() { digest() } else { BodyDigest::UNKNOWN },
        at_ms: req.now_ms,
        key: req.idempotency_key,
    }))
}

/// Whether a refused producer append should wait for its predecessors (see
/// [`crate::Engine::append`]): a gap of at most [`MAX_PARK_AHEAD`] in the current epoch, or a
/// non-zero sequence number of a new epoch whose seq 0 has not landed yet (pipelining right after
/// an epoch bump).
pub fn parkable(req: &AppendRequest, err: &AppendError) -> bool {
    let Some(p) = &req.producer else { return false };
    match err {
        AppendError::ProducerSeqGap { expected, received } => received - expected <= MAX_PARK_AHEAD,
        AppendError::ProducerEpochSeq => p.seq <= MAX_PARK_AHEAD,
        _ => false,
    }
}

// ---------------------------------------------------------------------------------------------
// Create and fork

/// A fork request resolved against its source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedFork {
    pub fork: ForkOf,
    /// Inherited unless the request names its own.
    pub content_type: String,
    pub expiry: Expiry,
    /// The source's earliest offset: the fork starts there too.
    pub earliest: Offset,
    /// A fork of a stream made for compaction is one too.
    pub compaction: bool,
}

/// Resolves `Stream-Forked-From` / `-Fork-Offset` / `-Fork-Sub-Offset` against the source
/// (`None`: no stream at the source path, after expiry was applied). `append_at(offset)` gives
/// the stored bytes of the source's append that starts exactly at `offset` (as the source reads
/// them), if any; it is called only for a non-zero sub-offset.
pub fn resolve_fork(
    source: Option<(&StreamMeta, Offset)>,
    f: &ForkRequest,
    append_at: impl FnOnce(u64) -> Result<Option<Bytes>, StorageError>,
) -> Result<ResolvedFork, CreateError> {
    let (src, tail) = source.ok_or(CreateError::SourceNotFound)?;
    if src.soft_deleted {
        return Err(CreateError::SourceGone);
    }
    let at = f.offset.map_or(tail.0, |o| o.0);
    if at > tail.0 {
        return Err(CreateError::ForkOffsetBeyondTail);
    }
    if at < src.earliest.0 {
        return Err(CreateError::ForkTrimmed { earliest: src.earliest });
    }
    let point = if f.sub_offset == 0 {
        at
    } else {
        let append = append_at(at)?.ok_or(CreateError::SubOffsetOvershoot)?;
        let k = usize::try_from(f.sub_offset).map_err(|_| CreateError::SubOffsetOvershoot)?;
        let bytes = if content_type::is_json(&src.config.content_type) {
            // Stored JSON is one message per `value,`: count messages, not bytes.
            let lens: Vec<usize> = json::messages(&append).take(k).map(|m| m.len() + 1).collect();
            if lens.len() < k {
                return Err(CreateError::SubOffsetOvershoot);
            }
            lens.iter().sum()
        } else if k > append.len() {
            return Err(CreateError::SubOffsetOvershoot);
        } else {
            k
        };
        at + bytes as u64
    };
    Ok(ResolvedFork {
        fork: ForkOf { source_id: src.id, fork_point: point },
        content_type: src.config.content_type.clone(),
        expiry: src.config.expiry,
        earliest: src.earliest,
        compaction: src.config.compaction,
    })
}

/// What an engine does with a create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CreatePlan {
    /// `200`: an identical stream exists; nothing to write.
    Existing(StreamInfo),
    /// `201`: persist `meta` (and the initial data, ending at `tail`) in one atomic unit; a fork
    /// also takes a reference on its source.
    Create { meta: StreamMeta, tail: Offset },
}

/// Decides a create. `existing` is the stream at the path (after expiry was applied), `fork` the
/// resolved fork when the request names a source, `new_id` the id a new stream would get.
pub fn create(
    existing: Option<(&StreamMeta, Offset)>,
    fork: Option<&ResolvedFork>,
    req: &CreateRequest,
    new_id: u64,
) -> Result<CreatePlan, CreateError> {
    let content_type = match (&req.content_type, fork) {
        (Some(ct), Some(f)) if !content_type::matches(ct, &f.content_type) => {
            return Err(CreateError::ContentTypeMismatch {
                source_type: f.content_type.clone(),
                requested: ct.clone(),
            });
        }
        (Some(ct), _) => ct.clone(),
        (None, Some(f)) => f.content_type.clone(),
        (None, None) => content_type::DEFAULT.to_owned(),
    };
    // Section 4.2: a fork without its own expiry inherits the source's TTL or deadline.
    let expiry = req.expiry.or(fork.map(|f| f.expiry)).unwrap_or(Expiry::Never);
    let fork_of = fork.map(|f| f.fork);
    // A fork inherits its source's history: a plain stream's cannot be folded.
    if req.compaction && fork.is_some_and(|f| !f.compaction) {
        return Err(CreateError::CompactionOfPlainSource);
    }
    let compaction = req.compaction || fork.is_some_and(|f| f.compaction);
    if compaction && !content_type::is_json(&content_type) {
        return Err(CreateError::CompactionNeedsJson);
    }
    // Retention would drop the snapshot a compaction writes, and with it the state.
    if compaction && !req.retention.policy.is_none() {
        return Err(CreateError::CompactionWithRetention);
    }
    if let Some((m, tail)) = existing {
        if m.soft_deleted {
            return Err(CreateError::PathReserved);
        }
        let mismatch = if !content_type::matches(&m.config.content_type, &content_type) {
            Some(Mismatch::ContentType { existing: m.config.content_type.clone(), requested: content_type })
        } else if m.config.expiry != expiry {
            Some(Mismatch::Expiry { existing: m.config.expiry, requested: expiry })
        } else if m.closed != req.closed {
            Some(Mismatch::Closed { existing: m.closed })
        } else if m.fork != fork_of {
            Some(Mismatch::Fork { existing: m.fork, requested: fork_of })
        } else if m.config.compaction != compaction {
            Some(Mismatch::Compaction { existing: m.config.compaction })
        } else if !req.retention.matches(&m.config.retention) {
            Some(Mismatch::Retention { existing: m.config.retention, requested: req.retention })
        } else {
            None
        };
        return match mismatch {
            None => Ok(CreatePlan::Existing(m.info(tail))),
            Some(differs) => Err(CreateError::ConfigMismatch(differs)),
        };
    }
    if !req.initial.is_empty() && req.json_framed != content_type::is_json(&content_type) {
        return Err(CreateError::FramingMismatch);
    }
    let start = fork_of.map_or(0, |f| f.fork_point);
    let tail =
        start.checked_add(req.initial.len() as u64).filter(|t| *t <= Offset::MAX.0).ok_or(CreateError::TooLarge)?;
    let config = StreamConfig { content_type, expiry, retention: req.retention.policy, compaction };
    let meta = StreamMeta {
        closed: req.closed,
        fork: fork_of,
        earliest: fork.map_or(Offset::ZERO, |f| f.earliest),
        ..StreamMeta::with_config(new_id, req.now_ms, config)
    };
    Ok(CreatePlan::Create { meta, tail: Offset(tail) })
}

// ---------------------------------------------------------------------------------------------
// Delete

/// What deleting (or expiring) a stream does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    /// Forks still read its data: keep the data, mark it deleted (its path answers `410` and stays
    /// reserved), drop its producer state.
    SoftDelete,
    /// Forks still read its data and its owner asked for the path back (a purge): as
    /// [`Removal::SoftDelete`], and the stream is detached from its path, so the path is free at
    /// once (`404`; a create makes a new, unrelated stream there). Its remains are kept by id
    /// for its forks only, which read every byte they read before at the same offsets (they
    /// name their source by id, never by path), and go with the last fork as a soft-deleted
    /// source does ([`source_follows`]). Nothing is copied.
    Detach,
    /// Remove it; a fork releases its source, which may follow ([`source_follows`]).
    Remove,
}

/// Decides a delete of an existing stream with `live_forks` forks, whose tail is `tail`, as
/// `req` asks: `req.if_tail` (`If-Match`): only if the tail is one of these; `req.purge`: detach
/// it from its path when forks read it, also when it is already soft-deleted (the owner's way
/// out when a fork, perhaps another tenant's, keeps a deleted path reserved).
pub fn delete(meta: &StreamMeta, tail: Offset, live_forks: usize, req: &DeleteRequest) -> Result<Removal, LookupError> {
    if meta.soft_deleted && !req.purge {
        return Err(LookupError::Gone);
    }
    // A soft-deleted stream's tail no longer moves: a purge of it is conditional on it all
    // the same, as a plain delete would have been.
    if req.if_tail.as_deref().is_some_and(|t| !t.contains(&tail)) {
        return Err(LookupError::PreconditionFailed { tail, closed: meta.closed });
    }
    Ok(match (live_forks, req.purge) {
        (0, _) => Removal::Remove,
        (_, true) => Removal::Detach,
        (_, false) => Removal::SoftDelete,
    })
}

/// Decides a trim of a stream to `to`: the new earliest offset, or `None` when it would not move
/// forward (a repeat, or an older trim arriving late).
pub fn trim(meta: &StreamMeta, tail: Offset, to: Offset) -> Result<Option<Offset>, TrimError> {
    if meta.soft_deleted {
        return Err(TrimError::Gone);
    }
    if to > tail {
        return Err(TrimError::BeyondTail { tail });
    }
    Ok((to > meta.earliest).then_some(to))
}

/// Decides a compaction of a stream as it is now; `Ok` gives each snapshot piece's end offset
/// (the new tail is the last). The new earliest offset is `req.at`.
pub fn compact(meta: &StreamMeta, tail: Offset, req: &CompactRequest) -> Result<Vec<Offset>, CompactError> {
    if meta.soft_deleted {
        return Err(CompactError::Gone);
    }
    if req.stream_id.is_some_and(|id| id != meta.id) {
        return Err(CompactError::NotFound);
    }
    if !meta.config.compaction {
        return Err(CompactError::NotCompactable);
    }
    if meta.closed {
        return Err(CompactError::Closed);
    }
    if tail != req.at {
        return Err(CompactError::Stale { tail });
    }
    let mut end = tail.0;
    let mut ends = Vec::with_capacity(req.pieces.len());
    for p in &req.pieces {
        end = end.checked_add(p.len() as u64).filter(|e| *e <= Offset::MAX.0).ok_or(CompactError::TooLarge)?;
        ends.push(Offset(end));
    }
    Ok(ends)
}

/// Whether a refusal must wait for a fresh lookup of the stream before it is answered: a write
/// framed for the stream as last seen (`framed_on_last_seen`: [`Engine::last_seen`], no lookup
/// first) that the layer above refuses by itself (a bad header, not the engine). A missing
/// stream is `NotFound` whatever else is wrong with the request, so the lookup's answer comes
/// first; an engine's own refusal was judged against the stream as it is.
pub fn refusal_needs_lookup(framed_on_last_seen: bool, refused_by_engine: bool) -> bool {
    framed_on_last_seen && !refused_by_engine
}

/// Whether a read from `from` is allowed by the stream's earliest offset.
pub fn readable_from(earliest: Offset, from: Offset) -> Result<(), LookupError> {
    if from < earliest {
        return Err(LookupError::Trimmed { earliest });
    }
    Ok(())
}

/// The start of a read from `from` of a stream as `info` describes it: refused before the
/// earliest offset; at or past the tail, the (empty, up-to-date) answer itself; otherwise `None`:
/// the engine reads the bytes.
pub fn read_start(info: &StreamInfo, from: Offset) -> Result<Option<ReadChunk>, LookupError> {
    readable_from(info.earliest, from)?;
    Ok((from >= info.tail).then(|| ReadChunk { next: from, data: Bytes::new(), info: info.clone(), aligned: true }))
}

/// After a fork was removed, whether its source is removed too (in the same atomic unit): a
/// soft-deleted source whose last fork that was (a detached source is soft-deleted too).
pub fn source_follows(source: &StreamMeta, forks_left: usize) -> bool {
    source.soft_deleted && forks_left == 0
}

#[cfg(test)]
mod tests;

// ---------------------------------------------------------------------------------------------
// Transactions
// ---------------------------------------------------------------------------------------------

/// The checks of a transaction that need no state: key and value sizes (a value fits one
/// record, [`shape::MAX_RECORD_BYTES`]), at most one append per stream. Each append's own shape
/// is checked with its state ([`shape::append`], by the engine's `check`).
pub fn txn_shape(txn: &TxnRequest) -> Result<(), TxnError> {
    let too_large = txn.meta.iter().any(|w| {
        w.key.len() > MAX_META_KEY_BYTES || w.value.as_ref().is_some_and(|v| v.len() > shape::MAX_RECORD_BYTES)
    });
    if too_large || txn.expect.iter().any(|(k, _)| k.len() > MAX_META_KEY_BYTES) {
        return Err(TxnError::TooLarge);
    }
    for (index, a) in txn.appends.iter().enumerate() {
        if txn.appends[..index].iter().any(|b| b.path == a.path) {
            return Err(TxnError::RepeatedStream { index });
        }
    }
    Ok(())
}

/// The compare-and-set guards of a transaction against the current values (`current(key)`).
pub fn txn_expect<'a>(txn: &TxnRequest, current: impl Fn(&[u8]) -> Option<&'a Bytes>) -> Result<(), TxnError> {
    match txn.expect.iter().find(|(k, v)| current(k) != v.as_ref()) {
        Some((key, _)) => Err(TxnError::Conflict { key: key.clone() }),
        None => Ok(()),
    }
}
