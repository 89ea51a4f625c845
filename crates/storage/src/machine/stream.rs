//! One stream's writer-side state and how an append changes it.

use std::collections::HashMap;

use oncelog_protocol::digest::{BodyDigest, KeyId};
use oncelog_protocol::producer::{ProducerState, Receipt};
use oncelog_protocol::Offset;

use crate::engine::{AppendError, AppendOutcome, AppendRequest, CompactError, CompactRequest, StreamInfo, TrimError};
use crate::meta::{IdempotencyKeys, KeyEntry, StreamMeta};
use crate::retention::{self, MarkChange, TimeMarks};
use crate::rules::{self, AppendPlan, AppendWrite, Retention, WriterState};

/// What appends to one stream are decided against: its metadata and tail, the states of its
/// producers and the entries of its idempotency keys (those the engine holds: the log engine
/// all of them, PostgreSQL those a group's requests name), and its time marks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamState {
    pub meta: StreamMeta,
    pub tail: Offset,
    pub producers: HashMap<String, ProducerState>,
    /// Live producer states on the stream that `producers` does not hold: PostgreSQL loads only
    /// the states a group's requests name and counts the others when a request may create one
    /// (for `--max-producers-per-stream`); the log engine holds them all (0).
    pub producers_elsewhere: u64,
    pub keys: IdempotencyKeys,
    pub marks: TimeMarks,
}

/// What deciding an append came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step<'a> {
    /// Nothing to write (a duplicate, a close of a closed stream): the answer.
    Answer(AppendOutcome),
    /// Accepted and applied to the state: persist it.
    Write(Written<'a>),
}

/// An accepted append, already applied to the [`StreamState`]: what the engine persists with
/// the request's data, in one atomic unit, before it answers [`Written::outcome`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written<'a> {
    pub effects: AppendEffects<'a>,
    /// What noting the write did to the time marks.
    pub marks: MarkChange,
    /// The producer had no state on this stream before (engines count producers).
    pub new_producer: bool,
    pub outcome: AppendOutcome,
}

/// The effects of one accepted append on its stream's state, as decided now or as read back
/// from storage: the one description both writing and recovery apply
/// ([`StreamState::apply`]), so a recovered state is the state that was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppendEffects<'a> {
    /// The tail after the append's data.
    pub new_tail: Offset,
    pub close: bool,
    /// The `Stream-Seq` that became the stream's last.
    pub stream_seq: Option<&'a str>,
    pub producer: Option<ProducerEffect<'a>>,
    /// The idempotency key and its entry.
    pub key: Option<(KeyId, KeyEntry)>,
    /// When the data was written, kept for a stream with a maximum age (its time marks).
    pub write_time: Option<i64>,
}

/// A producer's accepted `(epoch, seq)` with its receipt's digest and the time of acceptance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerEffect<'a> {
    pub id: &'a str,
    pub epoch: u64,
    pub seq: u64,
    pub digest: BodyDigest,
    pub at_ms: i64,
}

impl<'a> AppendEffects<'a> {
    /// The effects the rules decided for `req`.
    fn of(w: &AppendWrite<'a>, req: &'a AppendRequest, marks_writes: bool) -> AppendEffects<'a> {
        AppendEffects {
            new_tail: w.new_tail,
            close: w.close,
            stream_seq: if w.set_stream_seq { req.stream_seq.as_deref() } else { None },
            producer: w.producer.map(|p| ProducerEffect {
                id: p.id,
                epoch: p.epoch,
                seq: p.seq,
                digest: w.digest,
                at_ms: w.at_ms,
            }),
            key: w.key.map(|k| (k, KeyEntry { end: w.new_tail, digest: w.digest, at_ms: w.at_ms })),
            write_time: (marks_writes && !req.data.is_empty()).then_some(req.now_ms),
        }
    }
}

/// A compaction applied to the [`StreamState`]: what the engine persists in one atomic unit
/// (the snapshot's pieces ending at `ends`, then the earliest offset moved to `earliest`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotWrite {
    /// Each snapshot piece's end offset; the last is the new tail.
    pub ends: Vec<Offset>,
    /// The new earliest offset (the snapshot's start), `None` when it did not move (the stream
    /// was empty, or already began there).
    pub earliest: Option<Offset>,
}

/// What [`StreamState::prune`] dropped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pruned {
    pub producers: Vec<String>,
    pub keys: Vec<KeyId>,
}

impl StreamState {
    /// A stream with no writer state yet.
    pub fn new(meta: StreamMeta, tail: Offset) -> StreamState {
        StreamState {
            meta,
            tail,
            producers: HashMap::new(),
            producers_elsewhere: 0,
            keys: None,
            marks: TimeMarks::new(),
        }
    }

    /// What readers see of it.
    pub fn info(&self) -> StreamInfo {
        self.meta.info(self.tail)
    }

    /// What `req` is decided against: its producer's state and its key's entry, and the producer
    /// counts the caps compare (`producers_total`: the engine's count across its streams).
    fn writer(&self, req: &AppendRequest, retention: &Retention, producers_total: u64) -> WriterState<'_> {
        let mut writer = WriterState::of(req, &self.producers, &self.keys);
        writer.producers_total = producers_total;
        let held = self.producers_elsewhere.saturating_add(self.producers.len() as u64);
        writer.producers_on_stream = if held >= retention.max_producers_per_stream
            && rules::makes_new_producer(req, writer.producer, retention)
        {
            // At the cap, for a request that would add a producer: count only the live
            // states, so expired ones free their slot at once, not at the next prune. A scan
            // of at most the cap's size, and only for a refusal or a slot just freed.
            let live = self.producers.values().filter(|s| s.is_live(req.now_ms, retention.producer_ttl_ms)).count();
            self.producers_elsewhere.saturating_add(live as u64)
        } else {
            held
        };
        writer
    }

    /// The rules' verdict on `req`, changing nothing (a transaction checks every append first).
    /// `producers_total`: the producer states the engine holds across its streams.
    pub fn check(&self, req: &AppendRequest, retention: &Retention, producers_total: u64) -> Result<(), AppendError> {
        let writer = self.writer(req, retention, producers_total);
        rules::append(&self.meta, self.tail, writer, req, retention).map(drop)
    }

    /// Decides `req` by [`rules::append`] and, when it is accepted, applies every effect to this
    /// state ([`StreamState::apply`]). `producers_total`: the producer states the engine holds
    /// across its streams (for [`Retention::max_producers`]).
    pub fn append<'a>(
        &mut self,
        req: &'a AppendRequest,
        retention: &Retention,
        producers_total: u64,
    ) -> Result<Step<'a>, AppendError> {
        let writer = self.writer(req, retention, producers_total);
        let w = match rules::append(&self.meta, self.tail, writer, req, retention)? {
            AppendPlan::Answer(outcome) => return Ok(Step::Answer(outcome)),
            AppendPlan::Write(w) => w,
        };
        let outcome = w.outcome(self.meta.closed);
        let effects = AppendEffects::of(&w, req, retention::marks_writes(&self.meta.config.retention));
        let (marks, new_producer) = self.apply(&effects);
        Ok(Step::Write(Written { effects, marks, new_producer, outcome }))
    }

    /// Applies an accepted append's effects: closure and `Stream-Seq`, the producer's state with
    /// its receipt, the key's entry, the time marks and the tail. Returns what it did to the
    /// marks and whether the producer is new on this stream.
    pub fn apply(&mut self, e: &AppendEffects<'_>) -> (MarkChange, bool) {
        // A retry of the closing request is recognised by the producer verdict (the closing seq
        // is the producer's last), so closure needs no record of who closed.
        self.meta.closed |= e.close;
        if let Some(seq) = e.stream_seq {
            self.meta.stream_seq = Some(seq.to_owned());
        }
        let mut new_producer = false;
        if let Some(p) = e.producer {
            let state = match self.producers.get_mut(p.id) {
                Some(s) => s,
                None => {
                    new_producer = true;
                    self.producers.entry(p.id.to_owned()).or_insert_with(|| ProducerState::new(p.epoch))
                }
            };
            state.accept(p.epoch, p.seq, Receipt { end: e.new_tail, digest: p.digest }, p.at_ms);
        }
        if let Some((k, entry)) = e.key {
            self.keys.get_or_insert_with(Default::default).insert(k, entry);
        }
        self.tail = e.new_tail;
        let marks = match e.write_time {
            Some(at_ms) => retention::note_write(&mut self.marks, &self.meta.config.retention, self.tail, at_ms),
            None => MarkChange::None,
        };
        (marks, new_producer)
    }

    /// Notes the initial data of a new stream (written at its creation time) in its marks.
    pub fn created(&mut self) -> MarkChange {
        if self.tail.0 > self.meta.fork.map_or(0, |f| f.fork_point) {
            retention::note_write(&mut self.marks, &self.meta.config.retention, self.tail, self.meta.created_ms)
        } else {
            MarkChange::None
        }
    }

    /// Drops the producer states idle for longer than the TTL and the keys older than their
    /// window at `now_ms` (the rules already treat both as absent); returns which.
    pub fn prune(&mut self, now_ms: i64, retention: &Retention) -> Pruned {
        let mut pruned = Pruned::default();
        self.producers.retain(|id, s| {
            let live = s.is_live(now_ms, retention.producer_ttl_ms);
            if !live {
                pruned.producers.push(id.clone());
            }
            live
        });
        if let Some(keys) = &mut self.keys {
            keys.retain(|k, e| {
                let live = retention.key_is_live(e, now_ms);
                if !live {
                    pruned.keys.push(*k);
                }
                live
            });
            if keys.is_empty() {
                self.keys = None;
            }
        }
        pruned
    }

    /// Moves the earliest offset to `to` as [`rules::trim`] decides; returns the new earliest
    /// offset, or `None` when it does not move.
    pub fn trim(&mut self, to: Offset) -> Result<Option<Offset>, TrimError> {
        let moved = rules::trim(&self.meta, self.tail, to)?;
        if let Some(earliest) = moved {
            self.set_earliest(earliest);
        }
        Ok(moved)
    }

    /// Applies a compaction ([`rules::compact`]): the snapshot's pieces at the tail, then the
    /// earliest offset moved to where they start (`req.at`), as a trim would. Decided in full
    /// before anything changes, so a refusal leaves the state as it was. The shape of the pieces
    /// ([`rules::shape::compact`]) is checked by the engine first, before any stream is looked up.
    pub fn compact(&mut self, req: &CompactRequest) -> Result<SnapshotWrite, CompactError> {
        let ends = rules::compact(&self.meta, self.tail, req)?;
        let new_tail = ends.last().copied().unwrap_or(self.tail);
        let earliest = rules::trim(&self.meta, new_tail, req.at)?;
        self.tail = new_tail;
        if let Some(e) = earliest {
            self.set_earliest(e);
        }
        Ok(SnapshotWrite { ends, earliest })
    }

    /// Moves the earliest offset forward to `earliest` (never back), dropping the time marks
    /// below it: what a trim, a retention move or a compaction does, decided or replayed.
    pub fn set_earliest(&mut self, earliest: Offset) {
        self.meta.earliest = self.meta.earliest.max(earliest);
        retention::drop_marks_below(&mut self.marks, self.meta.earliest);
    }

    /// Marks the stream deleted while forks still read it: its writer state goes (nothing can
    /// write to it again). Returns how many producer states were dropped.
    pub fn soft_delete(&mut self) -> usize {
        self.meta.soft_deleted = true;
        self.keys = None;
        std::mem::take(&mut self.producers).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use oncelog_protocol::headers::ProducerHeaders;

    fn meta() -> StreamMeta {
        let mut m = StreamMeta::new(1, 0, "text/plain");
        std::sync::Arc::make_mut(&mut m.config).retention =
            crate::retention::RetentionPolicy { max_age_s: Some(3600), max_bytes: None };
        m
    }

    fn req(producer: Option<(&str, u64)>, key: Option<u128>, now_ms: i64) -> AppendRequest {
        let mut r = AppendRequest::plain("s", "text/plain", false, Bytes::from_static(b"abc"), now_ms);
        r.producer = producer.map(|(id, seq)| ProducerHeaders { id: id.into(), epoch: 0, seq });
        r.idempotency_key = key.map(KeyId);
        r
    }

    #[test]
    fn an_accepted_append_changes_every_part_of_the_state_at_once() {
        let mut st = StreamState::new(meta(), Offset::ZERO);
        let r = req(Some(("p", 0)), None, 1_000);
        let Step::Write(w) = st.append(&r, &Retention::default(), 0).expect("accepted") else { panic!("not written") };
        assert_eq!((w.outcome.next_offset, w.outcome.producer, w.new_producer), (Offset(3), Some((0, 0)), true));
        assert_eq!(w.effects.producer.map(|p| p.id), Some("p"));
        assert_eq!((w.effects.write_time, w.marks), (Some(1_000), MarkChange::Started));
        // Applying the same effects to the state before it (as recovery does) gives this state.
        let mut replayed = StreamState::new(meta(), Offset::ZERO);
        replayed.apply(&w.effects);
        assert_eq!(replayed, st);
        assert_eq!(st.tail, Offset(3));
        assert_eq!(st.producers.get("p").map(|s| (s.epoch, s.last_seq)), Some((0, 0)));
        // A retry is answered from the state, and changes nothing.
        let before = st.clone();
        assert!(matches!(st.append(&r, &Retention::default(), 0), Ok(Step::Answer(o)) if o.next_offset == Offset(3)));
        assert_eq!(st, before);
        // A keyed append remembers its key.
        let k = req(None, Some(7), 2_000);
        assert!(matches!(st.append(&k, &Retention::default(), 0), Ok(Step::Write(_))));
        assert_eq!(st.keys.as_ref().and_then(|m| m.get(&KeyId(7))).map(|e| e.end), Some(Offset(6)));
    }

    #[test]
    fn pruning_drops_what_the_rules_already_ignore_and_says_what() {
        let retention = Retention { producer_ttl_ms: 1_000, idempotency_window_ms: 500, ..Retention::default() };
        let mut st = StreamState::new(meta(), Offset::ZERO);
        for r in [
            req(Some(("old", 0)), None, 0),
            req(None, Some(1), 0),
            req(Some(("new", 0)), None, 900),
            req(None, Some(2), 900),
        ] {
            assert!(matches!(st.append(&r, &retention, 0), Ok(Step::Write(_))));
        }
        let pruned = st.prune(1_000, &retention);
        assert_eq!(pruned, Pruned { producers: vec!["old".into()], keys: vec![KeyId(1)] });
        assert_eq!(st.producers.keys().collect::<Vec<_>>(), ["new"]);
        assert_eq!(st.keys.as_ref().map(|m| m.len()), Some(1));
        // Once everything is old, the key map itself goes.
        let pruned = st.prune(10_000, &retention);
        assert_eq!((pruned.producers.len(), pruned.keys.len(), st.keys.is_none()), (1, 1, true));
    }

    #[test]
    fn a_compaction_is_decided_whole_before_the_state_changes() {
        let mut m = StreamMeta::new(1, 0, "application/json");
        std::sync::Arc::make_mut(&mut m.config).compaction = true;
        let mut st = StreamState::new(m, Offset(10));
        let creq = |at: u64, pieces: &[&'static [u8]]| CompactRequest {
            path: "s".into(),
            stream_id: None,
            at: Offset(at),
            pieces: pieces.iter().map(|p| Bytes::from_static(p)).collect(),
            now_ms: 0,
        };
        // A snapshot of a tail the stream has left: refused, nothing changed.
        let before = st.clone();
        assert!(matches!(st.compact(&creq(7, &[b"{}"])), Err(CompactError::Stale { tail: Offset(10) })));
        assert_eq!(st, before);
        // Accepted: the pieces at the tail, the earliest offset where they start.
        let done = st.compact(&creq(10, &[b"ab", b"cde"])).expect("compacted");
        assert_eq!(done, SnapshotWrite { ends: vec![Offset(12), Offset(15)], earliest: Some(Offset(10)) });
        assert_eq!((st.tail, st.meta.earliest), (Offset(15), Offset(10)));
        assert_eq!(st.info().tail, Offset(15));
        // Again at the new tail: the earliest offset moves on to it.
        let again = st.compact(&creq(15, &[b"f"])).expect("compacted");
        assert_eq!((again.earliest, st.meta.earliest, st.tail), (Some(Offset(15)), Offset(15), Offset(16)));
        // A closed stream takes no snapshot, and keeps its state.
        st.meta.closed = true;
        let before = st.clone();
        assert!(matches!(st.compact(&creq(16, &[b"g"])), Err(CompactError::Closed)));
        assert_eq!(st, before);
    }
}
