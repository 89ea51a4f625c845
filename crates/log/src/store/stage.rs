//! Each command decided against the writer's state and staged into the group: creates and
//! forks, appends through the stream state machine (parking included), deletes, trims,
//! compactions, transactions, the retention sweep and pruning.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use oncelog_protocol::Offset;
use oncelog_storage::machine::chain::fork_chain;
use oncelog_storage::machine::parking::{ParkingLot, Pending, Round};
use oncelog_storage::machine::{self, AppendEffects, Step, StreamState};
use oncelog_storage::rules::{self, CreatePlan, Removal, PARK_TIMEOUT};
use oncelog_storage::*;
use tokio::sync::oneshot;

use crate::format::{AcceptedProducer, Record};

use super::commit::{reply, Effect, Group};
use super::mutant::is_on;
use super::view::{new_shared, StreamData};
use super::{Staging, Store, WStream};

impl Store {
    /// Stages a transaction as [`Engine::transact`](oncelog_storage::Engine::transact) says:
    /// every append checked first without staging anything ([`machine::transact`]), then the
    /// appends and Meta records into this group's one frame; parked successors of its producer
    /// appends are released behind them.
    pub(super) fn transact(&mut self, txn: TxnRequest, g: &mut Group) -> Result<TxnOutcome, TxnError> {
        rules::txn_shape(&txn)?;
        for a in &txn.appends {
            self.drop_if_expired(&a.path, a.now_ms, g);
        }
        rules::txn_expect(&txn, |k| self.meta.get(k))?;
        let producers_total = self.producers_held();
        let appends = machine::transact(&txn, &mut Staging { store: self, g, producers_total })?;
        let split = is_on!(self.cfg, SplitTxn);
        if split {
            g.swap_split();
        }
        for w in &txn.meta {
            g.record(&Record::Meta { key: &w.key, value: w.value.as_deref() });
            match &w.value {
                Some(v) => self.meta.insert(w.key.clone(), v.clone()),
                None => self.meta.remove(&w.key),
            };
        }
        if split {
            g.swap_split();
        }
        let accepted: Vec<&AppendRequest> = txn
            .appends
            .iter()
            .zip(&appends)
            .filter(|(_, o)| o.status == AppendStatus::Appended)
            .map(|(a, _)| a)
            .collect();
        if !accepted.is_empty() && self.parked.as_ref().is_some_and(|lot| !lot.is_empty()) {
            let now = Instant::now();
            self.with_lot(|store, lot| {
                let mut round = Round::default();
                for a in accepted {
                    round.release(a, lot, now, &mut |r| store.append(r, g));
                }
                round.settle(lot, |tx, r| g.effects.push(reply(tx, r)));
            });
        }
        Ok(TxnOutcome { appends })
    }

    /// Trims every stream whose retention policy lets go of data, to where
    /// [`retention::floor`] says; returns how many moved and by how much. A fork's retention
    /// drops only its own appends (the boundaries of what it inherited are its source's).
    pub(super) fn retain(&mut self, now_ms: i64, g: &mut Group) -> Retained {
        let due: Vec<(Arc<str>, Offset, Offset)> = self
            .streams
            .iter()
            .filter(|(_, w)| !w.st.meta.config.retention.is_none() && !w.st.meta.soft_deleted)
            .filter_map(|(path, w)| {
                let d = w.shared.data.read().ok()?;
                let below = |x: Offset| {
                    let n = d.extents.partition_point(|e| e.end <= x.0);
                    Offset(match n {
                        0 if x.0 >= d.start => d.start,
                        0 => w.st.meta.earliest.0,
                        n => d.extents[n - 1].end,
                    })
                };
                let to = retention::floor(
                    &w.st.meta.config.retention,
                    w.st.tail,
                    w.st.meta.earliest,
                    now_ms,
                    &w.st.marks,
                    below,
                )?;
                Some((path.clone(), w.st.meta.earliest, to))
            })
            .collect();
        let mut done = Retained::default();
        for (path, from, to) in due {
            if let Ok(out) = self.trim(&path, to, g) {
                if out.earliest == to {
                    done.streams += 1;
                    done.bytes += to.0.saturating_sub(from.0);
                }
            }
        }
        done
    }

    /// Runs `f` with the parking lot taken out of the store (a round needs both at once).
    pub(super) fn with_lot<R>(&mut self, f: impl FnOnce(&mut Store, &mut ParkingLot) -> R) -> R {
        let mut lot = self.parked.take().unwrap_or_default();
        let r = f(self, &mut lot);
        self.parked = Some(lot);
        r
    }

    /// Decides appends in one round (see [`oncelog_storage::machine::parking`]) and stages their
    /// answers; `may_park`: early producer appends may wait (not once writes stopped).
    pub(super) fn decide_round(
        &mut self,
        pending: impl IntoIterator<Item = Pending>,
        now: Instant,
        may_park: bool,
        g: &mut Group,
    ) {
        self.with_lot(|store, lot| {
            let mut round = Round::default();
            for p in pending {
                round.decide(p, lot, now, may_park, &mut |r| store.append(r, g));
            }
            round.settle(lot, |tx, r| g.effects.push(reply(tx, r)));
        });
    }

    /// Answers parked appends whose wait is over: decided again now, never parked again.
    pub fn expire_parked(&mut self, now: Instant, g: &mut Group) {
        let due = self.parked.as_mut().map(|lot| lot.take_due(now)).unwrap_or_default();
        if !due.is_empty() {
            self.decide_round(due, now, false, g);
        }
    }

    /// Final answers for every parked append (at shutdown).
    pub fn expire_all_parked(&mut self, g: &mut Group) {
        self.expire_parked(Instant::now() + PARK_TIMEOUT * 2, g);
    }

    pub(super) fn stage_append(
        &mut self,
        req: AppendRequest,
        tx: oneshot::Sender<Result<AppendOutcome, AppendError>>,
        g: &mut Group,
    ) {
        let now = Instant::now();
        let may_park = !self.poisoned;
        self.decide_round(std::iter::once(Pending::new(req, tx, now)), now, may_park, g);
    }

    pub(super) fn drop_if_expired(&mut self, path: &str, now_ms: i64, g: &mut Group) {
        let expired = self.streams.get(path).is_some_and(|w| !w.st.meta.soft_deleted && w.shared.expired(now_ms));
        if expired {
            // It exists and is not soft-deleted, so the delete verdict cannot be an error.
            let _ = self.delete(path, &DeleteRequest::default(), g);
        }
    }

    /// Deletes a stream as [`rules::delete`] decides.
    pub(super) fn delete(&mut self, path: &str, req: &DeleteRequest, g: &mut Group) -> Result<(), LookupError> {
        let w = self.streams.get_mut(path).ok_or(LookupError::NotFound)?;
        match rules::delete(&w.st.meta, w.st.tail, w.shared.forks(), req)? {
            Removal::Remove => self.remove(path, g),
            Removal::SoftDelete => {
                g.record(&Record::SoftDelete { id: w.st.meta.id });
                let dropped = w.st.soft_delete();
                self.counters.producers.fetch_sub(dropped as u64, Ordering::Relaxed);
                g.effects.push(Effect::SoftDelete { shared: w.shared.clone() });
            }
            Removal::Detach => self.detach(path, g),
        }
        Ok(())
    }

    /// Detaches a stream from its path (one Detach record): soft-deleted if it was not yet, out
    /// of the path map (a create of the path makes a new stream), and kept by id for its forks,
    /// which hold its index in their chains and read it as before. Its remains go with its last
    /// fork ([`Store::remove_stream`]).
    fn detach(&mut self, path: &str, g: &mut Group) {
        let Some(mut w) = self.streams.remove(path) else { return };
        let id = w.st.meta.id;
        g.record(&Record::Detach { id });
        let dropped = w.st.soft_delete();
        self.counters.producers.fetch_sub(dropped as u64, Ordering::Relaxed);
        self.source_paths.remove(&id);
        g.effects.push(Effect::Detach { shared: w.shared.clone() });
        self.detached.insert(id, w);
    }

    /// Appends a compaction's snapshot pieces and trims to where they start, as
    /// [`StreamState::compact`] decides: Append records and a Trim record in this group's one
    /// frame, so a power cut keeps all of it or none.
    pub(super) fn compact(&mut self, req: CompactRequest, g: &mut Group) -> Result<TrimOutcome, CompactError> {
        rules::shape::compact(&req.pieces)?;
        let w = self.streams.get_mut(req.path.as_str()).ok_or(CompactError::NotFound)?;
        let done = w.st.compact(&req)?;
        // (A compaction stream has no retention policy, so its appends carry no write time.)
        for (piece, end) in req.pieces.iter().zip(&done.ends) {
            let at = g.record(&Record::Append {
                id: w.st.meta.id,
                new_tail: end.0,
                close: false,
                stream_seq: None,
                producer: None,
                key: None,
                time: None,
                data: piece,
            });
            g.effects.push(Effect::Data { shared: w.shared.clone(), end: end.0, at, hot: piece.clone() });
        }
        g.effects.push(Effect::Publish { shared: w.shared.clone(), tail: w.st.tail, closed: w.st.meta.closed });
        if let Some(earliest) = done.earliest {
            let split = is_on!(self.cfg, CompactInTwoFrames);
            if split {
                g.swap_split();
            }
            record_trim(w, earliest, g);
            self.reclaim_wanted = true;
            if split {
                g.swap_split();
            }
        }
        Ok(TrimOutcome { earliest: w.st.meta.earliest, tail: w.st.tail })
    }

    /// Moves a stream's earliest offset forward as [`StreamState::trim`] decides: one Trim record.
    pub(super) fn trim(&mut self, path: &str, to: Offset, g: &mut Group) -> Result<TrimOutcome, TrimError> {
        let w = self.streams.get_mut(path).ok_or(TrimError::NotFound)?;
        if let Some(earliest) = w.st.trim(to)? {
            record_trim(w, earliest, g);
            self.reclaim_wanted = true;
        }
        Ok(TrimOutcome { earliest: w.st.meta.earliest, tail: w.st.tail })
    }

    /// Removes the stream at `path` as [`Store::remove_stream`] does.
    pub(super) fn remove(&mut self, path: &str, g: &mut Group) {
        if let Some(w) = self.streams.remove(path) {
            self.remove_stream(true, w, g);
        }
    }

    /// Removes a detached stream as [`Store::remove_stream`] does.
    pub(super) fn remove_detached(&mut self, id: u64, g: &mut Group) {
        if let Some(w) = self.detached.remove(&id) {
            self.remove_stream(false, w, g);
        }
    }

    /// Removes stream `w`, taken from its path (`listed`) or from the detached streams; a fork
    /// releases its source, and a soft-deleted source (detached or not) whose last fork this
    /// was goes too, up the chain, in the same frame.
    // The stream comes boxed as the maps keep it (not unboxed to be boxed again).
    #[allow(clippy::boxed_local)]
    fn remove_stream(&mut self, mut listed: bool, mut w: Box<WStream>, g: &mut Group) {
        loop {
            let id = w.st.meta.id;
            self.source_paths.remove(&id);
            g.record(&Record::Remove { id });
            // Its data may have been all a segment held: like a trim, the next checkpoint gives
            // the space back (and with a bucket, drops the segment's objects) soon.
            self.reclaim_wanted = true;
            self.counters.producers.fetch_sub(w.st.producers.len() as u64, Ordering::Relaxed);
            g.effects.push(Effect::Remove { listed, shared: w.shared });
            let Some(f) = w.st.meta.fork else { return };
            // The source has a fork (this one), so it is in `source_paths` while at its path.
            let src_path = self.source_paths.get(&f.source_id).cloned();
            let src = match &src_path {
                Some(p) => self.streams.get(p),
                None => self.detached.get(&f.source_id),
            };
            let Some(src) = src else { return };
            let left = src.shared.forks.fetch_sub(1, Ordering::Relaxed).saturating_sub(1);
            let follows = rules::source_follows(&src.st.meta, left);
            if left == 0 {
                self.source_paths.remove(&f.source_id);
            }
            if !follows {
                return;
            }
            let next = match &src_path {
                Some(p) => self.streams.remove(p),
                None => self.detached.remove(&f.source_id),
            };
            let Some(next) = next else { return };
            (listed, w) = (src_path.is_some(), next);
        }
    }

    pub(super) fn create(&mut self, req: CreateRequest, g: &mut Group) -> Result<CreateOutcome, CreateError> {
        rules::shape::create(&req.path, req.initial.len())?;
        self.drop_if_expired(&req.path, req.now_ms, g);
        let mut fork = None;
        if let Some(f) = &req.fork {
            self.drop_if_expired(&f.source, req.now_ms, g);
            let src = self.streams.get(f.source.as_str());
            let view = &self.view;
            let resolved = rules::resolve_fork(src.map(|w| (&w.st.meta, w.st.tail)), f, |at| match src {
                Some(w) => super::read::append_at(&w.shared, &view.segments, at, w.st.tail.0),
                None => Ok(None),
            })?;
            let chain = src.map_or_else(Vec::new, |w| fork_chain(&w.shared.chain, &w.shared, resolved.fork.fork_point));
            fork = Some((resolved, chain));
        }
        let existing = self.streams.get(req.path.as_str()).map(|w| (&w.st.meta, w.st.tail));
        let (mut meta, tail) = match rules::create(existing, fork.as_ref().map(|f| &f.0), &req, self.next_id)? {
            CreatePlan::Existing(info) => return Ok(CreateOutcome::Existing(info)),
            CreatePlan::Create { meta, tail } => (meta, tail),
        };
        self.configs.intern(&mut meta.config);
        let id = meta.id;
        self.next_id += 1;
        let at = g.record(&Record::Create { id, path: &req.path, meta: &meta, data: &req.initial });
        let start = meta.fork.map_or(0, |f| f.fork_point);
        let chain = match fork {
            Some((_, chain)) => {
                if let Some(src) = req.fork.as_ref().and_then(|f| self.streams.get(f.source.as_str())) {
                    src.shared.forks.fetch_add(1, Ordering::Relaxed);
                    self.source_paths.insert(src.st.meta.id, src.shared.path.clone());
                }
                chain
            }
            None => Vec::new(),
        };
        let data = StreamData { start, extents: Vec::new(), hot: Default::default() };
        let shared = new_shared(&meta, Arc::from(req.path.as_str()), tail, chain, 0, req.now_ms, data);
        let mut st = StreamState::new(meta, tail);
        // Replay notes the same from the record's creation time.
        st.created();
        if !req.initial.is_empty() {
            g.effects.push(Effect::Data { shared: shared.clone(), end: tail.0, at, hot: req.initial.clone() });
        }
        let info = st.info();
        self.streams.insert(Box::new(WStream { st, shared: shared.clone() }));
        self.count_streams();
        g.effects.push(Effect::Insert { shared });
        Ok(CreateOutcome::Created(info))
    }

    /// Decides one append by the stream state machine and stages it as one record.
    pub(super) fn append(&mut self, req: &AppendRequest, g: &mut Group) -> Result<AppendOutcome, AppendError> {
        self.append_counted(req, g, self.producers_held())
    }

    /// The producer states held across all streams (expired ones until the prune drops them):
    /// what `--max-producers` is compared with.
    pub(super) fn producers_held(&self) -> u64 {
        self.counters.producers.load(Ordering::Relaxed)
    }

    /// [`Store::append`] with the producer count the caps compare given: a transaction's appends
    /// are staged against the count its checks saw ([`Staging`]).
    pub(super) fn append_counted(
        &mut self,
        req: &AppendRequest,
        g: &mut Group,
        producers_total: u64,
    ) -> Result<AppendOutcome, AppendError> {
        rules::shape::append(req)?;
        if let Some(w) = self.streams.get(req.path.as_str()) {
            if let Err(e) = rules::writable(w.st.meta.soft_deleted, w.shared.expired(req.now_ms), w.shared.forks()) {
                // Removed (or soft-deleted while forks read it) in this group, as the sweep would.
                self.drop_if_expired(&req.path, req.now_ms, g);
                return Err(e);
            }
        }
        let Some(w) = self.streams.get_mut(req.path.as_str()) else { return Err(AppendError::NotFound) };
        if rules::write_slides_ttl(req, &w.st.meta) {
            w.shared.touch(req.now_ms);
        }
        let written = match w.st.append(req, &self.cfg.retention, producers_total)? {
            Step::Answer(outcome) => return Ok(outcome),
            Step::Write(written) => written,
        };
        if written.new_producer {
            self.counters.producers.fetch_add(1, Ordering::Relaxed);
        }
        let e: &AppendEffects<'_> = &written.effects;
        let producer = e.producer.map(|p| AcceptedProducer {
            id: p.id,
            epoch: p.epoch,
            seq: p.seq,
            details: Some((p.digest, p.at_ms)),
        });
        let split = is_on!(self.cfg, SplitProducer) && producer.is_some();
        let at = g.record(&Record::Append {
            id: w.st.meta.id,
            new_tail: e.new_tail.0,
            close: e.close,
            stream_seq: e.stream_seq,
            producer: if split { None } else { producer.clone() },
            key: e.key.map(|(k, entry)| (k, entry.digest, entry.at_ms)),
            time: e.write_time,
            data: &req.data,
        });
        if split {
            let rec = Record::Append {
                id: w.st.meta.id,
                new_tail: e.new_tail.0,
                close: false,
                stream_seq: None,
                producer,
                key: None,
                time: None,
                data: &[],
            };
            g.record_split(&rec);
        }
        if !req.data.is_empty() {
            g.effects.push(Effect::Data { shared: w.shared.clone(), end: w.st.tail.0, at, hot: req.data.clone() });
        }
        g.effects.push(Effect::Publish { shared: w.shared.clone(), tail: w.st.tail, closed: w.st.meta.closed });
        Ok(written.outcome)
    }

    /// Drops the state of producers idle for longer than the TTL and idempotency keys older than
    /// their window (the rules already treat both as absent; this gives the memory back, and
    /// keeps them out of the next checkpoint). Called before each checkpoint, so state cannot
    /// pile up for longer than a checkpoint interval.
    pub fn prune_writers(&mut self, now_ms: i64) -> PruneOutcome {
        let retention = self.cfg.retention;
        let mut out = PruneOutcome::default();
        for w in self.streams.values_mut() {
            let pruned = w.st.prune(now_ms, &retention);
            out.producers += pruned.producers.len() as u64;
            out.keys += pruned.keys.len() as u64;
        }
        self.counters.producers.fetch_sub(out.producers, Ordering::Relaxed);
        out
    }

    /// [`Store::prune_writers`] as of the latest request time seen (before a checkpoint).
    pub fn prune_idle(&mut self) -> PruneOutcome {
        self.prune_writers(self.latest_ms)
    }
}

/// Records a move of `w`'s earliest offset (already applied to its state): one Trim record, and
/// the readers' view trimmed once the frame is durable.
fn record_trim(w: &WStream, earliest: Offset, g: &mut Group) {
    g.record(&Record::Trim { id: w.st.meta.id, earliest: earliest.0 });
    g.effects.push(Effect::Trim { shared: w.shared.clone(), earliest: earliest.0 });
}
