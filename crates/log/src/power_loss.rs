//! Power loss, simulated: a deterministic, seeded test that runs thousands of schedules of
//! writes against the store on a [`SimFs`], cuts the power at every kind of point (inside a
//! group commit, a segment rotation or a checkpoint, or right after an acknowledgement),
//! recovers, and holds the result against a model:
//!
//! - every acknowledged effect is present, exactly once, in order, and nothing else is, except
//!   the whole of the one group that was being committed when the power went (a frame survives
//!   whole or not at all);
//! - a producer retry after recovery is a duplicate exactly when its data survived, and applies
//!   it exactly once when it did not;
//! - the most recent acknowledged append of every producer is still recognised as a duplicate,
//!   with its original offset;
//! - retention sweeps (some streams keep 16 s of data, one keeps its newest 24 bytes; time moves
//!   0.9 s per group) trim exactly where the model's sweep does, so time marks survive power
//!   cuts exactly as they were written;
//! - compactions of a State Protocol stream (`c0`: its snapshot appended and its earliest offset
//!   moved in one frame) are seen whole or not at all;
//! - transactions (metadata writes and appends to two streams, one as a producer) are seen whole
//!   or not at all: the metadata map (as `meta_scan` of everything answers) is compared with the
//!   model together with the streams, so both must be on the same side of the cut; a refused one
//!   (a failing guard, a closed stream, a stale epoch or a seq gap) leaves nothing.
//!
//! The operations ([`Op`]): creates and forks; plain, producer, keyed and conditional appends
//! (some producer appends close their stream); trims, deletes (a third of them purges, which
//! detach a forked source from its path, live or soft-deleted: the path is seen free, and the
//! count of detached streams is compared too, so their removal with their last fork is held
//! to the same side of a cut), retention sweeps and compactions
//! of `c0`; and transactions. After a power cut every group's requests are retried as clients
//! would (not plain or conditional appends, sweeps or compactions): a producer or keyed append is
//! a duplicate exactly when it survived, a transaction is decided again against what survived
//! (its producer append a duplicate when it had landed, or a conflict when its guard was on a key
//! it wrote).
//!
//! [`the_simulation_catches_broken_guarantees`] shows that it bites: it fails with each of the
//! store's mutants ([`Mutant`]) — the sync skipped (`SkipSync`), the directory sync skipped
//! (`SkipDirSync`), producer state written in a frame of its own (`SplitProducer`), a compaction's
//! trim in a frame of its own (`CompactInTwoFrames`), or a transaction's metadata in a frame of
//! its own after its appends' (`SplitTxn`).

use std::collections::BTreeMap;
use std::sync::Arc;

use oncelog_storage::contract::{append_req, create_req, fork_req, keyed, produce};
use oncelog_storage::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::oneshot;

use crate::options::Durability;
use crate::sim::SimFs;
use crate::store::mutant::Mutant;
use crate::store::{self, Command, Group, Store, StoreConfig};

/// The content type of the contract suite's request builders.
const CT: &str = "text/plain";

#[derive(Debug, Clone)]
enum Op {
    Create {
        path: String,
    },
    Fork {
        path: String,
        source: String,
        at: u64,
    },
    Append {
        path: String,
        data: Vec<u8>,
    },
    Produce {
        path: String,
        producer: String,
        epoch: u64,
        seq: u64,
        data: Vec<u8>,
        close: bool,
    },
    /// An append with an idempotency key (a fresh one: repeats come as retries).
    Keyed {
        path: String,
        key: String,
        data: Vec<u8>,
    },
    Trim {
        path: String,
        to: u64,
    },
    /// A plain append with `If-Match: at`; `holds` when `at` is the tail it will meet (else it is
    /// refused and changes nothing).
    Conditional {
        path: String,
        data: Vec<u8>,
        at: u64,
        holds: bool,
    },
    /// `purge`: `DELETE …?purge=true`: a source that forks read (live or already soft-deleted)
    /// is detached from its path, which is free at once.
    Delete {
        path: String,
        purge: bool,
    },
    /// The retention sweep, at the group's time.
    Retain,
    /// A compaction of a State Protocol stream: `pieces` (stored JSON) appended at the tail `at`,
    /// which becomes the earliest offset.
    Compact {
        path: String,
        at: u64,
        pieces: Vec<Vec<u8>>,
    },
    /// A transaction ([`Engine::transact`]): metadata writes (`None` deletes the key) and two
    /// appends, a plain one to `plain` and one to `produced` as producer [`TXN_PRODUCER`]
    /// (`epoch`, `seq`), all or nothing. `expect` guards it (the key must hold that value, `None`:
    /// be absent). Whether it commits is the model's decision ([`Model::decide_txn`]), made in the
    /// store's order: the guard, then each append.
    Txn {
        expect: Option<(String, Option<String>)>,
        meta: Vec<(String, Option<String>)>,
        plain: String,
        plain_data: Vec<u8>,
        produced: String,
        epoch: u64,
        seq: u64,
        produced_data: Vec<u8>,
    },
}

impl Op {
    fn path(&self) -> &str {
        match self {
            Op::Create { path }
            | Op::Fork { path, .. }
            | Op::Append { path, .. }
            | Op::Produce { path, .. }
            | Op::Keyed { path, .. }
            | Op::Trim { path, .. }
            | Op::Conditional { path, .. }
            | Op::Delete { path, .. }
            | Op::Compact { path, .. } => path,
            Op::Retain | Op::Txn { .. } => "",
        }
    }

    /// Whether the operation writes to or otherwise acts on the stream at `p`.
    fn touches(&self, p: &str) -> bool {
        match self {
            Op::Txn { plain, produced, .. } => plain == p || produced == p,
            _ => self.path() == p,
        }
    }
}

/// The producer id of every transaction's producer append (plain producer appends use `a` and
/// `b`, so their retries' answers stay as [`schedule`] works them out).
const TXN_PRODUCER: &str = "t";

/// The metadata keys transactions write and guard.
const META_KEYS: [&str; 4] = ["m0", "m1", "m2", "m3"];

/// The State Protocol stream (JSON, made for compaction); every other path is `text/plain`.
const STATE: &str = "c0";

/// Generated data in the form the stream at `path` stores: a State Protocol change (stored JSON:
/// its text and a `,`) for [`STATE`], else `<n>`. JSON data is recognised by its `{`.
fn data_for(path: &str, counter: u64) -> Vec<u8> {
    if path == STATE {
        let key = counter % 4;
        if counter.is_multiple_of(5) {
            format!(r#"{{"type":"t","key":"k{key}","headers":{{"operation":"delete"}}}},"#).into_bytes()
        } else {
            format!(r#"{{"type":"t","key":"k{key}","value":{counter},"headers":{{"operation":"upsert"}}}},"#)
                .into_bytes()
        }
    } else {
        format!("<{counter}>").into_bytes()
    }
}

/// The retention policy the generated create of `path` asks for.
fn policy_of(path: &str) -> RetentionPolicy {
    match path {
        "s0" | "s1" => RetentionPolicy { max_age_s: Some(16), max_bytes: None },
        "s2" => RetentionPolicy { max_age_s: None, max_bytes: Some(24) },
        _ => RetentionPolicy::NONE,
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct MStream {
    data: Vec<u8>,
    closed: bool,
    soft_deleted: bool,
    fork_of: Option<String>,
    /// Producer → (epoch, next seq, end offset and body of its last accepted append).
    producers: BTreeMap<String, (u64, u64, u64, Vec<u8>)>,
    /// Idempotency key → (end offset, body) of its append.
    keys: BTreeMap<String, (u64, Vec<u8>)>,
    /// Where reads may start.
    earliest: u64,
    policy: RetentionPolicy,
    /// Every append's end offset, for the byte limit's boundaries.
    bounds: Vec<u64>,
    /// Time marks, noted as the store notes them.
    marks: TimeMarks,
}

impl MStream {
    /// An append of `data` at `now`.
    fn push(&mut self, data: &[u8], now: i64) {
        self.data.extend_from_slice(data);
        let end = self.data.len() as u64;
        self.bounds.push(end);
        retention::note_write(&mut self.marks, &self.policy, oncelog_protocol::Offset(end), now);
    }

    fn trim_to(&mut self, to: u64) {
        self.earliest = self.earliest.max(to);
        retention::drop_marks_below(&mut self.marks, oncelog_protocol::Offset(self.earliest));
    }
}

/// What a reader can observe of a path.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    Gone,
    Live { data: Vec<u8>, closed: bool, earliest: u64 },
}

/// Everything observable: the streams, and the metadata map (`meta_scan` of everything). One
/// value, so that a transaction's metadata and its appends are held to the same side of a cut.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Observed {
    streams: BTreeMap<String, Seen>,
    meta: BTreeMap<String, String>,
    /// How many streams are detached from their paths (kept for forks only): their removal
    /// with their last fork must be as durable as any other.
    detached: usize,
}

#[derive(Debug, Clone, Default)]
struct Model {
    streams: BTreeMap<String, MStream>,
    /// Streams detached from their paths by a purge, under names no path has (`#n`); their
    /// forks' `fork_of` names them so.
    detached: BTreeMap<String, MStream>,
    /// The next `#n`.
    next_detached: u64,
    /// The engine metadata map.
    meta: BTreeMap<String, String>,
    /// The time of the group being applied (Unix ms).
    now: i64,
}

/// How one append of a committed transaction is answered: `(written, next offset)` (not
/// written: a producer duplicate).
type TxnAnswer = [(bool, u64); 2];

impl Model {
    /// What the transaction `op` meets in this state: its appends' answers, or the message of the
    /// error that refuses all of it.
    fn decide_txn(&self, op: &Op) -> Result<TxnAnswer, String> {
        let Op::Txn { expect, plain, plain_data, produced, epoch, seq, .. } = op else {
            unreachable!("not a transaction")
        };
        if let Some((key, want)) = expect {
            if self.meta.get(key) != want.as_ref() {
                return Err(TxnError::Conflict { key: key.clone().into_bytes() }.to_string());
            }
        }
        let refused = |index: usize, error: AppendError| Err(TxnError::Append { index, error }.to_string());
        let stream = |path: &str| match self.streams.get(path) {
            None => Err(AppendError::NotFound),
            Some(s) if s.soft_deleted => Err(AppendError::Gone),
            Some(s) => Ok(s),
        };
        let a = match stream(plain) {
            Err(e) => return refused(0, e),
            Ok(s) if s.closed => {
                return refused(0, AppendError::Closed { tail: oncelog_protocol::Offset(s.data.len() as u64) })
            }
            Ok(s) => s,
        };
        let plain_end = (a.data.len() + plain_data.len()) as u64;
        let b = match stream(produced) {
            Err(e) => return refused(1, e),
            Ok(s) => s,
        };
        let tail = b.data.len() as u64;
        // The producer verdict (see `oncelog_protocol::producer::validate`), then the closure.
        let accept = match b.producers.get(TXN_PRODUCER) {
            None if *seq == 0 => true,
            None => {
                return refused(
                    1,
                    if b.closed {
                        AppendError::Closed { tail: oncelog_protocol::Offset(tail) }
                    } else {
                        AppendError::ProducerSeqGap { expected: 0, received: *seq }
                    },
                )
            }
            Some((current, ..)) if epoch < current => {
                return refused(1, AppendError::ProducerFenced { current_epoch: *current })
            }
            Some((current, ..)) if epoch > current => {
                if *seq != 0 {
                    return refused(1, AppendError::ProducerEpochSeq);
                }
                true
            }
            // A transaction's producer path takes no other transaction in its group, so a retry
            // meets its own seq as the last one (whose receipt is kept).
            Some((_, next, end, _)) if *seq + 1 == *next => return Ok([(true, plain_end), (false, *end)]),
            Some((_, next, ..)) if seq == next => true,
            Some((_, next, ..)) if seq < next => panic!("generated: an older seq of {TXN_PRODUCER} on {produced}"),
            Some((_, next, ..)) => {
                return refused(
                    1,
                    if b.closed {
                        AppendError::Closed { tail: oncelog_protocol::Offset(tail) }
                    } else {
                        AppendError::ProducerSeqGap { expected: *next, received: *seq }
                    },
                )
            }
        };
        if accept && b.closed {
            return refused(1, AppendError::Closed { tail: oncelog_protocol::Offset(tail) });
        }
        let Op::Txn { produced_data, .. } = op else { unreachable!() };
        Ok([(true, plain_end), (true, tail + produced_data.len() as u64)])
    }

    /// The transaction's answer as [`status`] writes it.
    fn txn_status(&self, op: &Op) -> String {
        match self.decide_txn(op) {
            Ok(answers) => answers
                .iter()
                .map(|(written, end)| format!("{}@{end}", if *written { "Appended" } else { "Duplicate" }))
                .collect::<Vec<_>>()
                .join(","),
            Err(e) => e,
        }
    }

    fn apply(&mut self, op: &Op) {
        match op {
            Op::Txn { meta, plain, plain_data, produced, epoch, seq, produced_data, .. } => {
                let Ok([_, (written, _)]) = self.decide_txn(op) else { return };
                for (key, value) in meta {
                    match value {
                        Some(v) => self.meta.insert(key.clone(), v.clone()),
                        None => self.meta.remove(key),
                    };
                }
                self.streams.get_mut(plain).expect("decided").push(plain_data, self.now);
                if written {
                    let s = self.streams.get_mut(produced).expect("decided");
                    s.push(produced_data, self.now);
                    s.producers
                        .insert(TXN_PRODUCER.to_owned(), (*epoch, seq + 1, s.data.len() as u64, produced_data.clone()));
                }
            }
            Op::Create { path } => {
                self.streams.insert(path.clone(), MStream { policy: policy_of(path), ..MStream::default() });
            }
            Op::Compact { path, at, pieces } => {
                let s = self.streams.get_mut(path).expect("generated valid");
                for p in pieces {
                    s.push(p, self.now);
                }
                s.trim_to(*at);
            }
            Op::Fork { path, source, at } => {
                let data = self.streams[source].data[..*at as usize].to_vec();
                let earliest = self.streams[source].earliest;
                self.streams.insert(
                    path.clone(),
                    MStream { data, fork_of: Some(source.clone()), earliest, ..Default::default() },
                );
            }
            Op::Append { path, data } | Op::Conditional { path, data, holds: true, .. } => {
                self.streams.get_mut(path).expect("generated valid").push(data, self.now)
            }
            Op::Conditional { holds: false, .. } => {}
            Op::Produce { path, producer, epoch, seq, data, close } => {
                let s = self.streams.get_mut(path).expect("generated valid");
                s.push(data, self.now);
                s.closed |= close;
                s.producers.insert(producer.clone(), (*epoch, seq + 1, s.data.len() as u64, data.clone()));
            }
            Op::Trim { path, to } => self.streams.get_mut(path).expect("generated valid").trim_to(*to),
            Op::Retain => {
                for s in self.streams.values_mut().filter(|s| !s.soft_deleted && !s.policy.is_none()) {
                    let below = |x: oncelog_protocol::Offset| {
                        oncelog_protocol::Offset(s.bounds.iter().copied().rfind(|b| *b <= x.0).unwrap_or(0))
                    };
                    let tail = oncelog_protocol::Offset(s.data.len() as u64);
                    if let Some(to) = retention::floor(
                        &s.policy,
                        tail,
                        oncelog_protocol::Offset(s.earliest),
                        self.now,
                        &s.marks,
                        below,
                    ) {
                        s.trim_to(to.0);
                    }
                }
            }
            Op::Keyed { path, key, data } => {
                let s = self.streams.get_mut(path).expect("generated valid");
                s.push(data, self.now);
                s.keys.insert(key.clone(), (s.data.len() as u64, data.clone()));
            }
            Op::Delete { path, purge } => {
                let forked = |m: &Model, src: &str| {
                    m.streams.values().chain(m.detached.values()).any(|s| s.fork_of.as_deref() == Some(src))
                };
                if forked(self, path) {
                    let s = self.streams.get_mut(path).expect("generated valid");
                    s.soft_deleted = true;
                    s.producers.clear();
                    s.keys.clear();
                    if *purge {
                        let s = self.streams.remove(path).expect("generated valid");
                        let name = format!("#{}", self.next_detached);
                        self.next_detached += 1;
                        for f in self
                            .streams
                            .values_mut()
                            .chain(self.detached.values_mut())
                            .filter(|f| f.fork_of.as_deref() == Some(path))
                        {
                            f.fork_of = Some(name.clone());
                        }
                        self.detached.insert(name, s);
                    }
                    return;
                }
                let mut cur = self.streams.remove(path).and_then(|s| s.fork_of);
                while let Some(src) = cur.take() {
                    if forked(self, &src) {
                        continue;
                    }
                    if let Some(s) = self.detached.remove(&src) {
                        cur = s.fork_of;
                    } else if self.streams.get(&src).is_some_and(|s| s.soft_deleted) {
                        cur = self.streams.remove(&src).and_then(|s| s.fork_of);
                    }
                }
            }
        }
    }

    fn seen(&self) -> Observed {
        let streams = self
            .streams
            .iter()
            .map(|(p, s)| {
                (
                    p.clone(),
                    if s.soft_deleted {
                        Seen::Gone
                    } else {
                        Seen::Live { data: s.data.clone(), closed: s.closed, earliest: s.earliest }
                    },
                )
            })
            .collect();
        Observed { streams, meta: self.meta.clone(), detached: self.detached.len() }
    }

    fn writable(&self, path: &str) -> bool {
        self.streams.get(path).is_some_and(|s| !s.closed && !s.soft_deleted)
    }
}

/// Generates one group of valid operations against `model` (applying them to it).
fn gen_group(rng: &mut StdRng, model: &mut Model, counter: &mut u64) -> Vec<Op> {
    let mut ops = Vec::new();
    // Paths created, forked or deleted in this group take no further structural operation in it,
    // so re-running the group after a power cut means the same thing.
    let mut structural: Vec<String> = Vec::new();
    let mut deleted: Vec<String> = Vec::new();
    // A fork point below the source's length before the group stays valid when the group's
    // plain appends (which are not retried) are lost.
    let lengths: BTreeMap<String, u64> = model.streams.iter().map(|(p, s)| (p.clone(), s.data.len() as u64)).collect();
    for _ in 0..rng.random_range(1..=6) {
        *counter += 1;
        let data = format!("<{counter}>").into_bytes();
        let existing: Vec<String> = model.streams.keys().filter(|p| !deleted.contains(p)).cloned().collect();
        let writable: Vec<String> = existing.iter().filter(|p| model.writable(p)).cloned().collect();
        let roll = rng.random_range(0..100);
        let op = if roll < 12 || writable.is_empty() {
            let path = match rng.random_range(0..7) {
                6 => STATE.to_owned(),
                n => format!("s{n}"),
            };
            if model.streams.contains_key(&path) || structural.contains(&path) {
                continue;
            }
            Op::Create { path }
        } else if roll < 20 {
            let path = format!("f{}", rng.random_range(0..4));
            // (Not of the JSON stream: a fork point there must be a message boundary.)
            let sources: Vec<&String> =
                existing.iter().filter(|p| !model.streams[*p].soft_deleted && p.as_str() != STATE).collect();
            if model.streams.contains_key(&path) || structural.contains(&path) || sources.is_empty() {
                continue;
            }
            let source = sources[rng.random_range(0..sources.len())].clone();
            // (A cascade may have removed and a create re-made the source within the group.)
            let len = lengths.get(&source).copied().unwrap_or(0).min(model.streams[&source].data.len() as u64);
            // Not from before the source's earliest offset (that fork is refused).
            let earliest = model.streams[&source].earliest;
            if earliest > len {
                continue;
            }
            Op::Fork { path, source, at: rng.random_range(earliest..=len) }
        } else if roll < 24 {
            let path = writable[rng.random_range(0..writable.len())].clone();
            if roll < 21 {
                Op::Append { path, data }
            } else {
                // At the tail it will meet, or one byte past it (refused).
                let tail = model.streams[&path].data.len() as u64;
                let holds = rng.random_range(0..3) > 0;
                Op::Conditional { path, data, at: if holds { tail } else { tail + 1 }, holds }
            }
        } else if roll < 30 {
            Op::Keyed { path: writable[rng.random_range(0..writable.len())].clone(), key: format!("k{counter}"), data }
        } else if roll < 34 {
            // A trim of a stream that existed before the group, within what it held then.
            // (Not the JSON stream: its trims must fall between messages.)
            let candidates: Vec<&String> = existing
                .iter()
                .filter(|p| {
                    lengths.contains_key(*p)
                        && !structural.contains(p)
                        && !model.streams[*p].soft_deleted
                        && p.as_str() != STATE
                })
                .collect();
            if candidates.is_empty() {
                continue;
            }
            let path = candidates[rng.random_range(0..candidates.len())].clone();
            let (earliest, len) = (model.streams[&path].earliest, lengths[&path]);
            Op::Trim { path, to: rng.random_range(earliest.min(len)..=len) }
        } else if roll < 37 {
            Op::Retain
        } else if roll < 40 {
            if !writable.iter().any(|p| p == STATE) {
                continue;
            }
            let st = &model.streams[STATE];
            let mut folded = oncelog_protocol::state::Materialized::default();
            folded.fold(&st.data[st.earliest as usize..]).expect("generated State Protocol data");
            let at = st.data.len() as u64;
            Op::Compact {
                path: STATE.to_owned(),
                at,
                pieces: oncelog_protocol::state::snapshot(&folded, oncelog_protocol::Offset(at)),
            }
        } else if roll < 85 {
            let path = writable[rng.random_range(0..writable.len())].clone();
            let producer = ["a", "b"][rng.random_range(0..2)].to_owned();
            let (epoch, seq) = match model.streams[&path].producers.get(&producer) {
                None => (0, 0),
                Some(_) if rng.random_range(0..20) == 0 => (model.streams[&path].producers[&producer].0 + 1, 0),
                Some((e, next, _, _)) => (*e, *next),
            };
            Op::Produce { path, producer, epoch, seq, data, close: rng.random_range(0..25) == 0 }
        } else if roll < 92 {
            match gen_txn(rng, model, counter, &existing, &writable, &ops) {
                Some(op) => op,
                None => continue,
            }
        } else {
            // A third are purges, which may also take a soft-deleted stream (the owner's case).
            let purge = rng.random_range(0..3) == 0;
            let candidates: Vec<&String> = existing
                .iter()
                .filter(|p| (purge || !model.streams[*p].soft_deleted) && !ops.iter().any(|o: &Op| o.touches(p)))
                .collect();
            if candidates.is_empty() {
                continue;
            }
            Op::Delete { path: candidates[rng.random_range(0..candidates.len())].clone(), purge }
        };
        let mut op = op;
        if let Op::Append { path, data }
        | Op::Produce { path, data, .. }
        | Op::Keyed { path, data, .. }
        | Op::Conditional { path, data, .. } = &mut op
        {
            *data = data_for(path, *counter);
        }
        match &op {
            Op::Create { path } | Op::Fork { path, .. } => structural.push(path.clone()),
            Op::Delete { path, .. } => {
                structural.push(path.clone());
                deleted.push(path.clone());
            }
            _ => {}
        }
        model.apply(&op);
        ops.push(op);
    }
    ops
}

/// A transaction against `model` (see [`Op::Txn`]): writes one or two of [`META_KEYS`] (a
/// quarter of them deletions), sometimes guarded (half of them on a key it writes, which makes a
/// retry after it landed a conflict), and appends to two writable streams, the second as producer
/// [`TXN_PRODUCER`] (starting in epoch 0, 1 or 2, now and then bumping it). About one in four is refused: a guard that
/// fails, a plain append to a closed stream (when there is one), a producer seq gap, or a stale
/// producer epoch (a gap before the producer has bumped its epoch). `None` when there is no room.
fn gen_txn(
    rng: &mut StdRng,
    model: &Model,
    counter: &mut u64,
    existing: &[String],
    writable: &[String],
    ops: &[Op],
) -> Option<Op> {
    // One transaction per producer path and group: a retry then meets its own seq as the last.
    let taken = |p: &String| ops.iter().any(|o| matches!(o, Op::Txn { produced, .. } if produced == p));
    let producible: Vec<&String> = writable.iter().filter(|p| !taken(p)).collect();
    if producible.is_empty() {
        return None;
    }
    let produced = producible[rng.random_range(0..producible.len())].clone();
    // 0: a guard that fails; 1: a plain append to a closed stream; 2: a seq gap; 3: a stale epoch
    // (a gap while the producer is unknown or in epoch 0); else it commits.
    let refusal = rng.random_range(0..16);
    let closed: Vec<&String> =
        existing.iter().filter(|p| model.streams[*p].closed && !model.streams[*p].soft_deleted).collect();
    let plains: Vec<&String> =
        if refusal == 1 && !closed.is_empty() { closed } else { writable.iter().filter(|p| **p != produced).collect() };
    if plains.is_empty() {
        return None;
    }
    let plain = plains[rng.random_range(0..plains.len())].clone();
    let (epoch, seq) = match model.streams[&produced].producers.get(TXN_PRODUCER) {
        None if refusal == 2 || refusal == 3 => (0, 1),
        // (A producer may start in any epoch.)
        None => (rng.random_range(0..3), 0),
        Some((e, next, ..)) if refusal == 3 && *e > 0 => (e - 1, next + 1),
        Some((e, next, ..)) if refusal == 2 || refusal == 3 => (*e, next + 1),
        Some((e, ..)) if rng.random_range(0..5) == 0 => (e + 1, 0),
        Some((e, next, ..)) => (*e, *next),
    };
    let mut keys = META_KEYS.to_vec();
    let mut meta = Vec::new();
    for _ in 0..rng.random_range(1..=2) {
        let key = keys.remove(rng.random_range(0..keys.len()));
        *counter += 1;
        meta.push((key.to_owned(), (rng.random_range(0..4) > 0).then(|| format!("v{counter}"))));
    }
    let expect = if refusal == 0 {
        let key = META_KEYS[rng.random_range(0..META_KEYS.len())];
        // ("v0" is never written.)
        Some((key.to_owned(), if model.meta.contains_key(key) { None } else { Some("v0".to_owned()) }))
    } else if rng.random_range(0..2) == 0 {
        let key = if rng.random_range(0..2) == 0 {
            meta[0].0.clone()
        } else {
            META_KEYS[rng.random_range(0..META_KEYS.len())].to_owned()
        };
        let value = model.meta.get(&key).cloned();
        Some((key, value))
    } else {
        None
    };
    *counter += 1;
    let plain_data = data_for(&plain, *counter);
    *counter += 1;
    let produced_data = data_for(&produced, *counter);
    Some(Op::Txn { expect, meta, plain, plain_data, produced, epoch, seq, produced_data })
}

/// A reply to check once the group is finished.
enum Pending {
    Create(oneshot::Receiver<Result<CreateOutcome, CreateError>>),
    Append(oneshot::Receiver<Result<AppendOutcome, AppendError>>),
    Delete(oneshot::Receiver<Result<(), LookupError>>),
    Trim(oneshot::Receiver<Result<TrimOutcome, TrimError>>),
    Retain(oneshot::Receiver<Result<Retained, StorageError>>),
    Compact(oneshot::Receiver<Result<TrimOutcome, CompactError>>),
    Txn(oneshot::Receiver<Result<TxnOutcome, TxnError>>),
}

/// The request of an append-like operation.
fn append_request(op: &Op, now_ms: i64) -> AppendRequest {
    let (Op::Append { path, data }
    | Op::Produce { path, data, .. }
    | Op::Keyed { path, data, .. }
    | Op::Conditional { path, data, .. }) = op
    else {
        unreachable!("not an append: {op:?}")
    };
    // Generated data is ASCII (`<n>`).
    let text = String::from_utf8_lossy(data);
    let req = match op {
        Op::Produce { producer, epoch, seq, close, .. } => {
            AppendRequest { close: *close, ..produce(path, &text, producer, *epoch, *seq) }
        }
        Op::Keyed { key, .. } => keyed(path, &text, key),
        Op::Conditional { at, .. } => {
            AppendRequest { if_match: Some(vec![oncelog_protocol::Offset(*at)]), ..append_req(path, &text) }
        }
        _ => append_req(path, &text),
    };
    let req = if data.first() == Some(&b'{') {
        // Already in stored JSON form (see `data_for`).
        AppendRequest {
            json_framed: true,
            content_type: Some("application/json".into()),
            data: bytes::Bytes::from(data.clone()),
            ..req
        }
    } else {
        req
    };
    AppendRequest { now_ms, ..req }
}

fn command(op: &Op, now_ms: i64) -> (Command, Pending) {
    match op {
        Op::Create { path } | Op::Fork { path, .. } => {
            let req = match op {
                Op::Fork { source, at, .. } => fork_req(path, source, Some(*at), 0),
                _ if path == STATE => CreateRequest { compaction: true, ..create_req(path, "application/json") },
                _ => {
                    let retention = RetentionRequest { policy: policy_of(path), named_age: true, named_bytes: true };
                    CreateRequest { retention, ..create_req(path, CT) }
                }
            };
            let req = CreateRequest { now_ms, ..req };
            let (tx, rx) = oneshot::channel();
            (Command::Create { req, reply: tx }, Pending::Create(rx))
        }
        Op::Append { .. } | Op::Produce { .. } | Op::Keyed { .. } | Op::Conditional { .. } => {
            let (tx, rx) = oneshot::channel();
            (Command::Append { req: append_request(op, now_ms), reply: tx }, Pending::Append(rx))
        }
        Op::Txn { expect, meta, plain, plain_data, produced, epoch, seq, produced_data } => {
            let bytes = |v: &Option<String>| v.as_ref().map(|v| bytes::Bytes::from(v.clone().into_bytes()));
            let txn = TxnRequest {
                expect: expect.iter().map(|(k, v)| (k.clone().into_bytes(), bytes(v))).collect(),
                meta: meta.iter().map(|(k, v)| MetaWrite { key: k.clone().into_bytes(), value: bytes(v) }).collect(),
                appends: vec![
                    append_request(&Op::Append { path: plain.clone(), data: plain_data.clone() }, now_ms),
                    append_request(
                        &Op::Produce {
                            path: produced.clone(),
                            producer: TXN_PRODUCER.to_owned(),
                            epoch: *epoch,
                            seq: *seq,
                            data: produced_data.clone(),
                            close: false,
                        },
                        now_ms,
                    ),
                ],
                now_ms,
            };
            let (tx, rx) = oneshot::channel();
            (Command::Transact { txn, reply: tx }, Pending::Txn(rx))
        }
        Op::Trim { path, to } => {
            let (tx, rx) = oneshot::channel();
            (
                Command::Trim { path: path.clone(), to: oncelog_protocol::Offset(*to), now_ms: 0, reply: tx },
                Pending::Trim(rx),
            )
        }
        Op::Delete { path, purge } => {
            let (tx, rx) = oneshot::channel();
            (
                Command::Delete {
                    path: path.clone(),
                    req: DeleteRequest { if_tail: None, purge: *purge },
                    now_ms: 0,
                    reply: tx,
                },
                Pending::Delete(rx),
            )
        }
        Op::Retain => {
            let (tx, rx) = oneshot::channel();
            (Command::Retain { now_ms, reply: tx }, Pending::Retain(rx))
        }
        Op::Compact { path, at, pieces } => {
            let (tx, rx) = oneshot::channel();
            let req = CompactRequest {
                path: path.clone(),
                stream_id: None,
                at: oncelog_protocol::Offset(*at),
                pieces: pieces.iter().map(|p| bytes::Bytes::from(p.clone())).collect(),
                now_ms,
            };
            (Command::Compact { req, reply: tx }, Pending::Compact(rx))
        }
    }
}

/// Stages `ops` as one group and commits it. `Ok(answers)` when it was acknowledged.
fn run_group(store: &mut Store, ops: &[Op], now_ms: i64) -> Result<Vec<Pending>, StorageError> {
    let mut g = Group::new();
    let mut pending = Vec::new();
    for op in ops {
        let (cmd, p) = command(op, now_ms);
        store.stage(cmd, &mut g);
        pending.push(p);
    }
    let failure = store.commit(&mut g);
    store.finish(g, failure.clone());
    match failure {
        Some(e) => Err(e),
        None => Ok(pending),
    }
}

/// The answer in a short comparable form (`Created`, `Appended@17`, `Duplicate@9`, an error's
/// message...).
fn status(p: Pending) -> String {
    let r = match p {
        Pending::Create(mut rx) => rx
            .try_recv()
            .map(|r| r.map(|o| format!("{o:?}").split('(').next().unwrap_or("").to_owned()).map_err(|e| e.to_string())),
        Pending::Append(mut rx) => {
            rx.try_recv().map(|r| r.map(|o| format!("{:?}@{}", o.status, o.next_offset.0)).map_err(|e| e.to_string()))
        }
        Pending::Delete(mut rx) => rx.try_recv().map(|r| r.map(|()| "Deleted".to_owned()).map_err(|e| e.to_string())),
        Pending::Trim(mut rx) => {
            rx.try_recv().map(|r| r.map(|t| format!("Trimmed@{}", t.earliest.0)).map_err(|e| e.to_string()))
        }
        Pending::Retain(mut rx) => rx.try_recv().map(|r| r.map(|_| "Retained".to_owned()).map_err(|e| e.to_string())),
        Pending::Compact(mut rx) => {
            rx.try_recv().map(|r| r.map(|t| format!("Compacted@{}", t.earliest.0)).map_err(|e| e.to_string()))
        }
        Pending::Txn(mut rx) => rx.try_recv().map(|r| {
            r.map(|o| {
                o.appends.iter().map(|a| format!("{:?}@{}", a.status, a.next_offset.0)).collect::<Vec<_>>().join(",")
            })
            .map_err(|e| e.to_string())
        }),
    };
    match r {
        Ok(Ok(s)) | Ok(Err(s)) => s,
        Err(_) => "no answer".into(),
    }
}

/// Everything a reader can see in the store: its streams, and its metadata as `meta_scan(b"")`
/// answers (the same command, staged in a group of its own).
fn observe(store: &mut Store) -> Result<Observed, String> {
    let (tx, mut rx) = oneshot::channel();
    let mut g = Group::new();
    store.stage(Command::MetaScan { prefix: Vec::new(), reply: tx }, &mut g);
    let failure = store.commit(&mut g);
    store.finish(g, failure);
    let scanned = rx.try_recv().map_err(|_| "meta_scan: no answer")?.map_err(|e| format!("meta_scan: {e}"))?;
    let meta = scanned
        .into_iter()
        .map(|(k, v)| (String::from_utf8_lossy(&k).into_owned(), String::from_utf8_lossy(&v).into_owned()))
        .collect();
    let view = store.view();
    let streams: Vec<(Arc<str>, Arc<store::StreamView>)> =
        view.streams.read().map_err(|_| "lock")?.iter().map(|(p, s)| (p.clone(), s.clone())).collect();
    let mut out = BTreeMap::new();
    for (path, s) in streams {
        let p = s.state.get();
        if p.soft_deleted {
            out.insert(path.to_string(), Seen::Gone);
            continue;
        }
        let ((data, _), next) = crate::store::read::plan(&s, 0, p.tail.0, usize::MAX, false)
            .and_then(|plan| plan.bytes(&view.segments))
            .map_err(|e| format!("read {path}: {e}"))?;
        if next != p.tail {
            return Err(format!("{path}: read ended at {} below the tail {}", next.0, p.tail.0));
        }
        let earliest = s.earliest.load(std::sync::atomic::Ordering::Acquire);
        out.insert(path.to_string(), Seen::Live { data: data.to_vec(), closed: p.closed, earliest });
    }
    Ok(Observed { streams: out, meta, detached: store.detached_count() })
}

/// Identifies a producer append: (path, producer, epoch, seq).
fn op_key(op: &Op) -> (String, String, u64, u64) {
    match op {
        Op::Produce { path, producer, epoch, seq, .. } => (path.clone(), producer.clone(), *epoch, *seq),
        Op::Keyed { path, key, .. } => (path.clone(), format!("key {key}"), 0, 0),
        _ => Default::default(),
    }
}

fn config(mutant: Mutant) -> StoreConfig {
    StoreConfig {
        durability: Durability::Fsync,
        segment_bytes: 1024,
        hot_bytes: 256,
        mutant,
        failpoints: Default::default(),
        retention: Default::default(),
    }
}

/// One schedule: `groups` groups of random operations with power cuts; `Err` describes the
/// first broken guarantee.
fn schedule(seed: u64, groups: usize, mutant: Mutant) -> Result<(), String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let fs = SimFs::new();
    let open = |fs: &SimFs| {
        store::open(Arc::new(fs.clone()), config(mutant), 0)
            .map(|(s, _)| s)
            .map_err(|e| format!("recovery failed: {e}"))
    };
    let mut store = open(&fs)?;
    let mut model = Model::default();
    let mut counter = 0;
    for step in 0..groups {
        // Time moves 0.9 s per group: marks (a second apart for a 16 s age) start now and then.
        let t = 1_000_000 + 900 * step as i64;
        model.now = t;
        let before = model.clone();
        let ops = gen_group(&mut rng, &mut model, &mut counter);
        let cut = rng.random_range(0..100);
        if cut < 15 {
            fs.fail_after(rng.random_range(0..10));
        }
        match run_group(&mut store, &ops, t) {
            Ok(answers) => {
                let mut check = before.clone();
                for (op, a) in ops.iter().zip(answers) {
                    let txn_want = matches!(op, Op::Txn { .. }).then(|| check.txn_status(op));
                    check.apply(op);
                    let got = status(a);
                    let want = match op {
                        Op::Txn { .. } => txn_want.unwrap_or_default(),
                        Op::Create { .. } | Op::Fork { .. } => "Created".to_owned(),
                        Op::Append { path, .. }
                        | Op::Produce { path, .. }
                        | Op::Keyed { path, .. }
                        | Op::Conditional { path, holds: true, .. } => {
                            format!("Appended@{}", check.streams[path].data.len())
                        }
                        Op::Conditional { holds: false, .. } => {
                            AppendError::PreconditionFailed { tail: Default::default(), closed: false }.to_string()
                        }
                        Op::Trim { path, .. } => format!("Trimmed@{}", check.streams[path].earliest),
                        Op::Delete { .. } => "Deleted".into(),
                        Op::Retain => "Retained".into(),
                        Op::Compact { at, .. } => format!("Compacted@{at}"),
                    };
                    if got != want {
                        return Err(format!("step {step}: {op:?} answered {got}, expected {want}"));
                    }
                }
                if cut < 20 {
                    // The power goes right after the acknowledgement (or the countdown set for
                    // a cut inside the commit outlived it).
                    fs.kill();
                }
            }
            Err(_) if fs.is_dead() => {}
            Err(e) => return Err(format!("step {step}: group failed without a power cut: {e}")),
        }
        if !fs.is_dead() && (20..30).contains(&cut) {
            if cut < 24 {
                fs.fail_after(rng.random_range(0..8));
            }
            let _ = store::write_checkpoint(&fs, store.view(), &store.snapshot());
            if cut < 24 {
                fs.kill();
            }
        }
        if !fs.is_dead() {
            if step % 8 == 0 && observe(&mut store)? != model.seen() {
                return Err(format!("step {step}: running store differs from the model"));
            }
            continue;
        }
        // The power went out somewhere in this step.
        drop(store);
        fs.power_cut(&mut rng);
        store = open(&fs)?;
        let seen = observe(&mut store)?;
        let acked = if seen == model.seen() {
            true
        } else if seen == before.seen() {
            false
        } else {
            // Which side each part matches, when it matches one (a split transaction: the streams
            // after it, the metadata before).
            let side = |same_before: bool, same_after: bool| match (same_before, same_after) {
                (_, true) => "after",
                (true, false) => "before",
                (false, false) => "neither",
            };
            let (b, a) = (before.seen(), model.seen());
            return Err(format!(
                "step {step}: after recovery the store matches neither the state before the group nor after it (streams: {}, metadata: {})\n  seen:   {seen:?}\n  before: {b:?}\n  after:  {a:?}\n  ops: {ops:?}",
                side(seen.streams == b.streams, seen.streams == a.streams),
                side(seen.meta == b.meta, seen.meta == a.meta),
            ));
        };
        // Where each producer append of the group ended, had it landed.
        let mut ends = BTreeMap::new();
        let mut replay = before.clone();
        for (i, op) in ops.iter().enumerate() {
            replay.apply(op);
            if let Op::Produce { path, producer, epoch, .. } = op {
                // A later epoch of the same producer in the group fences this one's retry.
                let bumped = ops[i..].iter().any(|o| matches!(o, Op::Produce { path: p, producer: q, epoch: e, .. } if p == path && q == producer && e > epoch));
                let answer = if bumped {
                    "producer epoch is stale".to_owned()
                } else {
                    format!("Duplicate@{}", replay.streams[path].data.len())
                };
                ends.insert(op_key(op), answer);
            }
            if let Op::Keyed { path, .. } = op {
                ends.insert(op_key(op), format!("Duplicate@{}", replay.streams[path].data.len()));
            }
        }
        // Retry the group as clients would (plain appends have no way to retry safely).
        // (Neither are conditional ones: a retry after a lost answer meets a moved tail.)
        // Nor is the retention sweep a request anyone retries: the next sweep is its own.
        // A compaction is made again from a new fold, never retried as it was.
        let retry: Vec<Op> = ops
            .iter()
            .filter(|o| !matches!(o, Op::Append { .. } | Op::Conditional { .. } | Op::Retain | Op::Compact { .. }))
            .cloned()
            .collect();
        let mut expect = if acked { model.clone() } else { before.clone() };
        let mut cur = if acked { model.clone() } else { before.clone() };
        for op in &retry {
            let answers = run_group(&mut store, std::slice::from_ref(op), t)
                .map_err(|e| format!("step {step}: retry failed: {e}"))?;
            let got = status(answers.into_iter().next().ok_or("no answer")?);
            let ok = match op {
                Op::Produce { .. } | Op::Keyed { .. } if acked => Some(&got) == ends.get(&op_key(op)),
                Op::Produce { path, .. } | Op::Keyed { path, .. } => {
                    cur.apply(op);
                    got == format!("Appended@{}", cur.streams[path].data.len())
                }
                Op::Create { path } | Op::Fork { path, .. } => {
                    if !acked {
                        cur.apply(op);
                    }
                    // A stream closed since differs from the create request in its closure.
                    let closed = model.streams.get(path).is_some_and(|s| s.closed);
                    // A fork is resolved against its source first: one deleted since is gone.
                    let source_gone = matches!(op, Op::Fork { source, .. } if model.streams.get(source).is_some_and(|s| s.soft_deleted));
                    // ... and one trimmed past the fork point since refuses it.
                    let source_trimmed = matches!(op, Op::Fork { source, at, .. } if model.streams.get(source).is_some_and(|s| s.earliest > *at));
                    // ... and one purged since is no stream at all.
                    let source_purged = matches!(op, Op::Fork { source, .. } if !model.streams.contains_key(source));
                    match (acked, source_gone, closed) {
                        (false, _, _) => got == "Created",
                        (true, _, _) if source_purged => got == "fork source not found",
                        (true, true, _) => got == "fork source has been deleted",
                        (true, false, _) if source_trimmed => got
                            == "the fork offset was trimmed from the source; it now starts at Stream-Earliest-Offset",
                        (true, false, false) => got == "Existing",
                        // The refusal names what differs: the closure.
                        (true, false, true) => {
                            got == "stream exists with a different configuration: it is closed, the request says open"
                        }
                    }
                }
                Op::Trim { path, .. } => {
                    // Idempotent: the retry answers where the stream starts now.
                    if !acked {
                        cur.apply(op);
                    }
                    got == format!("Trimmed@{}", cur.streams[path].earliest)
                }
                Op::Delete { .. } => {
                    if !acked {
                        cur.apply(op);
                    }
                    if acked {
                        got.contains("not found") || got.contains("deleted")
                    } else {
                        got == "Deleted"
                    }
                }
                Op::Txn { .. } => {
                    // Decided afresh against what is there now: after its group survived, a retry
                    // is a conflict (a guard on a key it wrote), or writes its plain append and its
                    // metadata again with the producer append a duplicate (at its original end).
                    let want = cur.txn_status(op);
                    cur.apply(op);
                    if acked {
                        expect.apply(op);
                    }
                    got == want
                }
                Op::Append { .. } | Op::Conditional { .. } | Op::Retain | Op::Compact { .. } => true,
            };
            if !ok {
                return Err(format!(
                    "step {step}: retry of {op:?} after recovery ({}) answered {got}",
                    if acked { "its group survived" } else { "its group was lost" }
                ));
            }
        }
        if !acked {
            for op in &retry {
                expect.apply(op);
            }
        }
        let seen = observe(&mut store)?;
        if seen != expect.seen() {
            return Err(format!(
                "step {step}: after retries the store differs from the model\n  seen: {seen:?}\n  want: {:?}",
                expect.seen()
            ));
        }
        // The last acknowledged append of every producer is still known, with its offset.
        for (path, s) in &expect.streams {
            if s.soft_deleted {
                continue;
            }
            for (producer, (epoch, next, end, data)) in &s.producers {
                let op = Op::Produce {
                    path: path.clone(),
                    producer: producer.clone(),
                    epoch: *epoch,
                    seq: next - 1,
                    data: data.clone(),
                    close: false,
                };
                let answers = run_group(&mut store, std::slice::from_ref(&op), t)
                    .map_err(|e| format!("step {step}: retry failed: {e}"))?;
                let got = status(answers.into_iter().next().ok_or("no answer")?);
                if got != format!("Duplicate@{end}") {
                    return Err(format!("step {step}: {producer} on {path}: retry of its last append answered {got}, expected Duplicate@{end}"));
                }
                // Its body's digest survived too: the same seq with other bytes is refused (on an
                // open stream; on a closed one every duplicate is a duplicate).
                let changed = Op::Produce {
                    path: path.clone(),
                    producer: producer.clone(),
                    epoch: *epoch,
                    seq: next - 1,
                    data: [data.as_slice(), b"!"].concat(),
                    close: false,
                };
                let answers = run_group(&mut store, std::slice::from_ref(&changed), t)
                    .map_err(|e| format!("step {step}: retry failed: {e}"))?;
                let got = status(answers.into_iter().next().ok_or("no answer")?);
                let expected =
                    if s.closed { got == format!("Duplicate@{end}") } else { got.contains("different body") };
                if !expected {
                    return Err(format!(
                        "step {step}: {producer} on {path}: its last seq with another body answered {got}"
                    ));
                }
            }
            // Every idempotency key is still known, with its append's offset and body.
            for (key, (end, data)) in &s.keys {
                let repeat = Op::Keyed { path: path.clone(), key: key.clone(), data: data.clone() };
                let changed =
                    Op::Keyed { path: path.clone(), key: key.clone(), data: [data.as_slice(), b"!"].concat() };
                for (op, want) in [(repeat, format!("Duplicate@{end}")), (changed, "different body".to_owned())] {
                    let answers = run_group(&mut store, std::slice::from_ref(&op), t)
                        .map_err(|e| format!("step {step}: retry failed: {e}"))?;
                    let got = status(answers.into_iter().next().ok_or("no answer")?);
                    if !got.contains(&want) {
                        return Err(format!(
                            "step {step}: key {key} on {path}: {op:?} answered {got}, expected {want}"
                        ));
                    }
                }
            }
        }
        model = expect;
    }
    Ok(())
}

#[test]
fn thousands_of_schedules_keep_every_acknowledged_write_exactly_once() {
    let seeds: u64 = std::env::var("ONCELOG_POWER_LOSS_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(2000);
    for seed in 0..seeds {
        if let Err(e) = schedule(seed, 40, Mutant::None) {
            panic!("seed {seed}: {e}");
        }
    }
}

#[test]
fn the_simulation_catches_broken_guarantees() {
    for mutant in
        [Mutant::SkipSync, Mutant::SkipDirSync, Mutant::SplitProducer, Mutant::CompactInTwoFrames, Mutant::SplitTxn]
    {
        let caught = (0..2000).find_map(|seed| schedule(seed, 40, mutant).err().map(|e| (seed, e)));
        let (seed, why) = caught.unwrap_or_else(|| panic!("{mutant:?} went unnoticed in 2000 schedules"));
        eprintln!("{mutant:?} caught by seed {seed}: {}", why.lines().next().unwrap_or(""));
    }
}
