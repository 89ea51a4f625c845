//! Writes other than appends, each one transaction on a pooled connection: create (and fork),
//! delete (soft delete and cascade), trim, compact, transact, and the background sweeps
//! (expiry, retention, garbage collection) that any node may run without doing the work twice.
//!
//! Lock order (with the committers' groups): meta-key advisory locks, then the path advisory
//! lock of a create, then stream rows. Rows of one family (a fork and its sources) may be locked
//! child first; a deadlock that produces is detected by the database and the transaction run
//! again ([`Fail::retryable`]).

use std::collections::BTreeMap;

use bytes::Bytes;
use deadpool_postgres::{GenericClient, Transaction};
use oncelog_protocol::headers::Expiry;
use oncelog_protocol::Offset;
use oncelog_storage::machine::{self, StreamState};
use oncelog_storage::retention;
use oncelog_storage::rules::{self, Removal};
use oncelog_storage::*;

use crate::error::Fail;
use crate::group::Group;
use crate::read::Lock;
use crate::row::{self, expiry_columns, i64_of, text_ok, u64_of, Stream};
use crate::shared::{lock_key, Effects, Shared};
use crate::writer::Deciding;

/// How much later than its TTL says a stream is removed by the sweep: reads on other nodes
/// reach the database in batches (`maint::TOUCH_FLUSH`), so a stream read there a moment ago
/// may not show it yet. Readers see the exact expiry at once; only the removal waits.
pub(crate) const EXPIRY_GRACE_MS: i64 = 1_000;

/// Runs `$attempt` (an expression giving `Result<Result<T, E>, Fail>`) within the node's
/// deadline ([`Shared::within`]), again while the database aborts it as a conflict (a deadlock,
/// a serialisation failure, a lock or statement timeout); a lasting failure becomes
/// `E::Storage`. `@unbounded`: without the deadline, for work that bounds its own round trips.
macro_rules! retry {
    ($shared:expr, $attempt:expr) => {
        $crate::ops::retry!(@run $shared, $shared.within($attempt))
    };
    (@unbounded $shared:expr, $attempt:expr) => {
        $crate::ops::retry!(@run $shared, $attempt)
    };
    (@run $shared:expr, $attempt:expr) => {{
        let mut tries = 0;
        loop {
            match $attempt.await {
                Ok(r) => {
                    $shared.note_success();
                    break r;
                }
                Err(f) if f.retryable() && tries < 3 => tries += 1,
                Err(f) => {
                    let e = StorageError::from(f);
                    $shared.note_failure(&e);
                    break Err(e.into());
                }
            }
        }
    }};
}
pub(crate) use retry;

impl Shared {
    pub(crate) async fn create_once(&self, req: &CreateRequest) -> Result<Result<CreateOutcome, CreateError>, Fail> {
        if let Err(e) = rules::shape::create(&req.path, req.initial.len()) {
            return Ok(Err(e));
        }
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        let mut fx = Effects::default();
        // Two creates of one path (on any nodes) take turns: the second sees the first's row.
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&lock_key(&self.schema, b"path", req.path.as_bytes())])
            .await?;
        let existing = self.fetch_unexpired(&tx, &req.path, req.now_ms, &mut fx).await?;
        let mut fork = None;
        if let Some(f) = &req.fork {
            let src = if text_ok(&f.source) {
                self.fetch_unexpired(&tx, &f.source, req.now_ms, &mut fx).await?
            } else {
                None
            };
            // The append a sub-offset counts into, read before the rules ask for it.
            let mut append_at = None;
            if let Some(s) = src.as_ref().filter(|_| f.sub_offset > 0) {
                let at = f.offset.map_or(s.tail.0, |o| o.0);
                if at < s.tail.0 && at >= s.meta.earliest.0 {
                    let chain = self.chain(&tx, s).await?;
                    append_at = self.append_at(&tx, &chain, s.meta.id, at, s.tail.0).await?;
                }
            }
            match rules::resolve_fork(src.as_ref().map(|s| (&s.meta, s.tail)), f, |_| Ok(append_at)) {
                Ok(r) => fork = Some(r),
                Err(e) => {
                    tx.commit().await?;
                    self.apply(fx);
                    return Ok(Err(e));
                }
            }
        }
        let new_id: i64 = tx.query_one("SELECT nextval('stream_ids')", &[]).await?.get(0);
        let plan =
            rules::create(existing.as_ref().map(|s| (&s.meta, s.tail)), fork.as_ref(), req, u64_of(new_id, "id")?);
        let (meta, tail) = match plan {
            Err(e) => {
                tx.commit().await?;
                self.apply(fx);
                return Ok(Err(e));
            }
            Ok(rules::CreatePlan::Existing(info)) => {
                tx.commit().await?;
                self.apply(fx);
                return Ok(Ok(CreateOutcome::Existing(info)));
            }
            Ok(rules::CreatePlan::Create { meta, tail }) => (meta, tail),
        };
        let mut st = StreamState::new(meta, tail);
        st.created();
        if !req.initial.is_empty() {
            let stmt = tx.prepare_cached("INSERT INTO data (stream_id, end_off, bytes) VALUES ($1, $2, $3)").await?;
            tx.execute(&stmt, &[&new_id, &i64_of(tail.0), &&req.initial[..]]).await?;
        }
        insert_stream(&tx, &req.path, &st.meta, tail, req.now_ms, &st.marks).await?;
        tx.commit().await?;
        fx.streams += 1;
        self.apply(fx);
        Ok(Ok(CreateOutcome::Created(st.info())))
    }

    /// The row at `path`, locked; an expired stream is first removed (or soft-deleted while
    /// forks read it) in this transaction, as the log engine does before a create.
    async fn fetch_unexpired(
        &self,
        tx: &Transaction<'_>,
        path: &str,
        now_ms: i64,
        fx: &mut Effects,
    ) -> Result<Option<Stream>, Fail> {
        let Some(s) = self.fetch(tx, path, Lock::Update).await? else { return Ok(None) };
        if !self.expired(&s, now_ms) {
            return Ok(Some(s));
        }
        self.expire_row(tx, s, fx).await?;
        self.fetch(tx, path, Lock::Update).await
    }

    /// Deletes an expired (or to-be-deleted) stream as [`rules::delete`] decides.
    async fn expire_row(&self, tx: &Transaction<'_>, s: Stream, fx: &mut Effects) -> Result<(), Fail> {
        let forks = self.forks(tx, s.meta.id).await?;
        // Already soft-deleted (`Gone`): nothing to do.
        let verdict = rules::delete(&s.meta, s.tail, forks, &DeleteRequest::default());
        self.apply_removal(tx, s, verdict, fx).await.map(|_| ())
    }

    /// Persists what [`rules::delete`] decided for the locked row `s`; the verdict is handed
    /// back (an error: nothing was written).
    async fn apply_removal(
        &self,
        tx: &Transaction<'_>,
        s: Stream,
        verdict: Result<Removal, LookupError>,
        fx: &mut Effects,
    ) -> Result<Result<(), LookupError>, Fail> {
        match verdict {
            Ok(Removal::Remove) => self.remove(tx, s, fx).await?,
            Ok(Removal::SoftDelete) => self.soft_delete(tx, &s, false, fx).await?,
            Ok(Removal::Detach) => self.soft_delete(tx, &s, true, fx).await?,
            Err(e) => return Ok(Err(e)),
        }
        Ok(Ok(()))
    }

    /// Marks a stream deleted while forks still read its data; its writer state goes. `detach`
    /// (a purge): its path is released too (NULL, which no request names), in the same
    /// statement, so the path is free exactly when the row is kept for the forks alone.
    async fn soft_delete(&self, tx: &Transaction<'_>, s: &Stream, detach: bool, fx: &mut Effects) -> Result<(), Fail> {
        let id = i64_of(s.meta.id);
        let sql = if detach {
            "UPDATE streams SET soft_deleted = true, path = NULL WHERE id = $1"
        } else {
            "UPDATE streams SET soft_deleted = true WHERE id = $1"
        };
        tx.execute(sql, &[&id]).await?;
        fx.producers -= tx.execute("DELETE FROM producers WHERE stream_id = $1", &[&id]).await? as i64;
        tx.execute("DELETE FROM idem_keys WHERE stream_id = $1", &[&id]).await?;
        fx.wake.push(s.meta.id);
        Ok(())
    }

    /// Removes a stream (its data goes to `gc`); a fork releases its source, and a soft-deleted
    /// source whose last fork this was follows, up the chain.
    async fn remove(&self, tx: &Transaction<'_>, s: Stream, fx: &mut Effects) -> Result<(), Fail> {
        let mut next = Some(s);
        while let Some(s) = next.take() {
            let id = i64_of(s.meta.id);
            fx.producers -= tx.execute("DELETE FROM producers WHERE stream_id = $1", &[&id]).await? as i64;
            tx.execute("DELETE FROM idem_keys WHERE stream_id = $1", &[&id]).await?;
            tx.execute("DELETE FROM streams WHERE id = $1", &[&id]).await?;
            tx.execute("INSERT INTO gc (stream_id, floor) VALUES ($1, NULL) ON CONFLICT (stream_id) DO UPDATE SET floor = NULL", &[&id]).await?;
            fx.streams -= 1;
            fx.wake.push(s.meta.id);
            let Some(f) = s.meta.fork else { continue };
            let sql = format!("SELECT {} FROM streams WHERE id = $1 FOR UPDATE", row::COLS);
            let Some(r) = tx.query_opt(&sql, &[&i64_of(f.source_id)]).await? else { continue };
            let src = Stream::from_row(&r)?;
            let left = self.forks(tx, src.meta.id).await?;
            if rules::source_follows(&src.meta, left) {
                next = Some(src);
            }
        }
        Ok(())
    }

    pub(crate) async fn delete_once(
        &self,
        path: &str,
        req: &DeleteRequest,
        now_ms: i64,
    ) -> Result<Result<(), LookupError>, Fail> {
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        let mut fx = Effects::default();
        // Expired before this delete: first removed (or soft-deleted, while forks read it) as the
        // sweep would, as the log engine does; then the delete is decided on what is left (a
        // plain one of a soft-deleted stream is `410`, a purge detaches it).
        let Some(s) = self.fetch_unexpired(&tx, path, now_ms, &mut fx).await? else {
            tx.commit().await?;
            self.apply(fx);
            return Ok(Err(LookupError::NotFound));
        };
        let forks = self.forks(&tx, s.meta.id).await?;
        let verdict = rules::delete(&s.meta, s.tail, forks, req);
        let result = self.apply_removal(&tx, s, verdict, &mut fx).await?;
        tx.commit().await?;
        self.apply(fx);
        Ok(result)
    }

    pub(crate) async fn trim_once(
        &self,
        path: &str,
        to: Offset,
        now_ms: i64,
    ) -> Result<Result<TrimOutcome, TrimError>, Fail> {
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        let s = match self.fetch(&tx, path, Lock::Update).await? {
            Some(s) if !self.expired(&s, now_ms) => s,
            _ => return Ok(Err(TrimError::NotFound)),
        };
        let out = match self.apply_trim(&tx, s, to).await? {
            Ok(out) => out,
            Err(e) => return Ok(Err(e)),
        };
        tx.commit().await?;
        Ok(Ok(out))
    }

    /// Moves a locked stream's earliest offset as the stream state machine's trim decides
    /// (dropping its time marks below it), and queues the data below it for `gc`.
    async fn apply_trim(
        &self,
        tx: &Transaction<'_>,
        s: Stream,
        to: Offset,
    ) -> Result<Result<TrimOutcome, TrimError>, Fail> {
        let mut st = StreamState { marks: s.marks, ..StreamState::new(s.meta, s.tail) };
        match st.trim(to) {
            Err(e) => return Ok(Err(e)),
            Ok(None) => {}
            Ok(Some(earliest)) => store_earliest(tx, &st, earliest).await?,
        }
        Ok(Ok(TrimOutcome { earliest: st.meta.earliest, tail: st.tail }))
    }

    /// A compaction as the stream state machine decides it ([`StreamState::compact`]): the
    /// snapshot's pieces at the tail and the earliest offset moved to them, one transaction.
    pub(crate) async fn compact_once(&self, req: &CompactRequest) -> Result<Result<TrimOutcome, CompactError>, Fail> {
        if let Err(e) = rules::shape::compact(&req.pieces) {
            return Ok(Err(e));
        }
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        let s = match self.fetch(&tx, &req.path, Lock::Update).await? {
            Some(s) if !self.expired(&s, req.now_ms) => s,
            _ => return Ok(Err(CompactError::NotFound)),
        };
        let mut st = StreamState { marks: s.marks, ..StreamState::new(s.meta, s.tail) };
        let done = match st.compact(req) {
            Ok(done) => done,
            Err(e) => return Ok(Err(e)),
        };
        let id = i64_of(st.meta.id);
        let ends: Vec<i64> = done.ends.iter().map(|e| i64_of(e.0)).collect();
        let pieces: Vec<&[u8]> = req.pieces.iter().map(|p| &p[..]).collect();
        let ids = vec![id; ends.len()];
        tx.execute(
            "INSERT INTO data (stream_id, end_off, bytes) SELECT * FROM unnest($1::int8[], $2::int8[], $3::bytea[])",
            &[&ids, &ends, &pieces],
        )
        .await?;
        tx.execute("UPDATE streams SET tail = $2 WHERE id = $1", &[&id, &i64_of(st.tail.0)]).await?;
        if let Some(earliest) = done.earliest {
            store_earliest(&tx, &st, earliest).await?;
        }
        tx.commit().await?;
        self.apply(Effects { wake: vec![st.meta.id], ..Default::default() });
        Ok(Ok(TrimOutcome { earliest: st.meta.earliest, tail: st.tail }))
    }

    pub(crate) async fn transact_once(&self, txn: &TxnRequest) -> Result<Result<TxnOutcome, TxnError>, Fail> {
        if let Err(e) = rules::txn_shape(txn) {
            return Ok(Err(e));
        }
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        // A `FOR UPDATE` on an absent key locks nothing, so keys are locked by name: two
        // transactions guarding one key (present or not) take turns. Sorted: one lock order.
        let mut keys: Vec<&[u8]> =
            txn.expect.iter().map(|(k, _)| &k[..]).chain(txn.meta.iter().map(|w| &w.key[..])).collect();
        keys.sort_unstable();
        keys.dedup();
        for k in &keys {
            tx.execute("SELECT pg_advisory_xact_lock($1)", &[&lock_key(&self.schema, b"meta", k)]).await?;
        }
        let current: BTreeMap<Vec<u8>, Bytes> = if txn.expect.is_empty() {
            BTreeMap::new()
        } else {
            let ks: Vec<&[u8]> = txn.expect.iter().map(|(k, _)| &k[..]).collect();
            let rows = tx.query("SELECT key, value FROM meta WHERE key = ANY($1)", &[&ks]).await?;
            rows.iter().map(|r| (r.get::<_, Vec<u8>>(0), Bytes::copy_from_slice(r.get::<_, &[u8]>(1)))).collect()
        };
        if let Err(e) = rules::txn_expect(txn, |k| current.get(k)) {
            return Ok(Err(e));
        }
        let reqs: Vec<&AppendRequest> = txn.appends.iter().collect();
        let mut group = Group::load(&tx, &reqs, false, &self.retention).await?;
        let outcomes = match machine::transact(txn, &mut Deciding::new(&mut group, self, true)) {
            Ok(outcomes) => outcomes,
            Err(e) => return Ok(Err(e)),
        };
        // The last write of a key wins (one statement cannot upsert a key twice).
        let mut writes: BTreeMap<&[u8], Option<&[u8]>> = BTreeMap::new();
        for w in &txn.meta {
            writes.insert(&w.key, w.value.as_deref());
        }
        let (puts, dels): (Vec<_>, Vec<_>) = writes.into_iter().partition(|(_, v)| v.is_some());
        if !puts.is_empty() {
            let ks: Vec<&[u8]> = puts.iter().map(|(k, _)| *k).collect();
            let vs: Vec<&[u8]> = puts.iter().filter_map(|(_, v)| *v).collect();
            tx.execute(
                "INSERT INTO meta (key, value) SELECT * FROM unnest($1::bytea[], $2::bytea[]) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                &[&ks, &vs],
            )
            .await?;
        }
        if !dels.is_empty() {
            let ks: Vec<&[u8]> = dels.iter().map(|(k, _)| *k).collect();
            tx.execute("DELETE FROM meta WHERE key = ANY($1)", &[&ks]).await?;
        }
        group.flush(&tx, false).await?;
        tx.commit().await?;
        self.apply(Effects { wake: group.changed_ids(), streams: 0, producers: group.new_producers as i64 });
        // A producer append of this transaction may be the predecessor a parked append waits
        // for: the committer tries its parked appends now (as the log engine releases them in
        // the transaction's own group), not at its next periodic retry.
        if outcomes.iter().any(|o| o.producer.is_some()) {
            self.kick.notify_waiters();
        }
        Ok(Ok(TxnOutcome { appends: outcomes }))
    }

    /// The expiry sweep: removes (or soft-deletes) every stream whose expiry passed, each in its
    /// own transaction with the verdict checked again under the row lock; a row another node is
    /// changing is left for the next sweep.
    pub(crate) async fn expire(&self, now_ms: i64) -> Result<usize, Fail> {
        self.flush_touches().await?;
        let paths: Vec<String> = {
            let c = self.client().await?;
            let stmt = c
                .prepare_cached(
                    "SELECT path FROM streams WHERE expiry_kind <> 0 AND NOT soft_deleted AND \
                     ((expiry_kind = 2 AND expiry_value <= $1) OR (expiry_kind = 1 AND last_access_ms + expiry_value * 1000 + $2 <= $1)) \
                     ORDER BY id LIMIT 1000",
                )
                .await?;
            c.query(&stmt, &[&now_ms, &EXPIRY_GRACE_MS]).await?.iter().map(|r| r.get(0)).collect()
        };
        let mut n = 0;
        for path in paths {
            let mut c = self.client().await?;
            let tx = c.transaction().await?;
            let Some(s) = self.fetch(&tx, &path, Lock::SkipLocked).await? else { continue };
            let graced = match s.meta.config.expiry {
                Expiry::Ttl(_) => now_ms - EXPIRY_GRACE_MS,
                _ => now_ms,
            };
            if !self.expired(&s, graced) {
                continue;
            }
            let mut fx = Effects::default();
            self.expire_row(&tx, s, &mut fx).await?;
            tx.commit().await?;
            self.apply(fx);
            n += 1;
        }
        Ok(n)
    }

    /// Deletes the writer state the rules treat as absent at `now_ms`: producer rows idle past
    /// the producer TTL and key rows past the window (the same cut as
    /// `ProducerState::is_live` and `Retention::key_is_live`), a batch at a time so no statement
    /// holds many row locks. Any node may run it; deleting a row twice is deleting it once. A
    /// group that read such a row decides as if it were absent anyway, and its upsert
    /// re-inserts the state it writes.
    pub(crate) async fn prune(&self, now_ms: i64) -> Result<PruneOutcome, Fail> {
        let c = self.client().await?;
        // The machine's liveness rules as times (`Retention::dead_at_or_before`): the rows
        // deleted are the states `StreamState::prune` drops.
        let (producers_before, keys_before) = self.retention.dead_at_or_before(now_ms);
        let out = PruneOutcome {
            producers: delete_in_batches(&c, "producers", "active_ms", producers_before).await?,
            keys: delete_in_batches(&c, "idem_keys", "at_ms", keys_before).await?,
        };
        self.apply(Effects { wake: Vec::new(), streams: 0, producers: -(out.producers as i64) });
        Ok(out)
    }

    /// The retention sweep ([`retention::floor`] per stream with a policy).
    pub(crate) async fn retain(&self, now_ms: i64) -> Result<Retained, Fail> {
        let paths: Vec<String> = {
            let c = self.client().await?;
            let stmt = c
                .prepare_cached("SELECT path FROM streams WHERE (ret_max_age_s IS NOT NULL OR ret_max_bytes IS NOT NULL) AND NOT soft_deleted ORDER BY id")
                .await?;
            c.query(&stmt, &[]).await?.iter().map(|r| r.get(0)).collect()
        };
        let mut done = Retained::default();
        for path in paths {
            let mut c = self.client().await?;
            let tx = c.transaction().await?;
            let Some(s) = self.fetch(&tx, &path, Lock::SkipLocked).await? else { continue };
            if s.meta.soft_deleted || s.meta.config.retention.is_none() {
                continue;
            }
            let own_start = s.meta.fork.map_or(0, |f| f.fork_point);
            // `floor` asks for the append boundary at or below one cut (tail - max bytes): read
            // it first. A fork's retention drops only its own appends.
            let cut = s.meta.config.retention.max_bytes.and_then(|keep| s.tail.0.checked_sub(keep));
            let boundary = match cut {
                Some(cut) if cut >= own_start => {
                    let r = tx
                        .query_one(
                            "SELECT max(end_off) FROM data WHERE stream_id = $1 AND end_off > $2 AND end_off <= $3",
                            &[&i64_of(s.meta.id), &i64_of(own_start), &i64_of(cut)],
                        )
                        .await?;
                    match r.get::<_, Option<i64>>(0) {
                        Some(end) => Offset(u64_of(end, "end_off")?),
                        None => Offset(own_start),
                    }
                }
                _ => s.meta.earliest,
            };
            let Some(to) =
                retention::floor(&s.meta.config.retention, s.tail, s.meta.earliest, now_ms, &s.marks, |_| boundary)
            else {
                continue;
            };
            let from = s.meta.earliest;
            let moved = matches!(self.apply_trim(&tx, s, to).await?, Ok(out) if out.earliest == to);
            tx.commit().await?;
            // Counted once committed: a failed commit moved nothing.
            if moved {
                done.streams += 1;
                done.bytes += to.0.saturating_sub(from.0);
            }
        }
        Ok(done)
    }

    /// Removes data queued in `gc`: a removed stream's, or a trimmed stream's below its floor
    /// unless forks read the stream (they pin what they reference; such data stays).
    pub(crate) async fn gc(&self) -> Result<usize, Fail> {
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        let rows =
            tx.query("SELECT stream_id, floor FROM gc ORDER BY stream_id LIMIT 16 FOR UPDATE SKIP LOCKED", &[]).await?;
        let mut removed = 0;
        for r in &rows {
            let (id, floor): (i64, Option<i64>) = (r.get(0), r.get(1));
            match floor {
                None => removed += tx.execute("DELETE FROM data WHERE stream_id = $1", &[&id]).await?,
                Some(floor) => {
                    // The stream row (if any) is locked so no fork of it is created meanwhile;
                    // a fork created later starts at or above its earliest offset >= floor.
                    tx.execute("SELECT 1 FROM streams WHERE id = $1 FOR UPDATE", &[&id]).await?;
                    let forks = self.forks(&tx, u64_of(id, "stream_id")?).await?;
                    if forks == 0 {
                        removed += tx
                            .execute("DELETE FROM data WHERE stream_id = $1 AND end_off <= $2", &[&id, &floor])
                            .await?;
                    }
                }
            }
            tx.execute("DELETE FROM gc WHERE stream_id = $1", &[&id]).await?;
        }
        tx.commit().await?;
        Ok(usize::try_from(removed).unwrap_or(usize::MAX))
    }

    /// Writes this node's reads' TTL touches.
    pub(crate) async fn flush_touches(&self) -> Result<(), Fail> {
        let pending = self.touches.pending();
        if pending.is_empty() {
            return Ok(());
        }
        let ids: Vec<i64> = pending.iter().map(|(id, _)| i64_of(*id)).collect();
        let ts: Vec<i64> = pending.iter().map(|(_, t)| *t).collect();
        let c = self.client().await?;
        let stmt = c
            .prepare_cached(
                "UPDATE streams s SET last_access_ms = greatest(s.last_access_ms, u.t) FROM unnest($1::int8[], $2::int8[]) AS u(id, t) \
                 WHERE s.id = u.id AND s.last_access_ms < u.t",
            )
            .await?;
        c.execute(&stmt, &[&ids, &ts]).await?;
        self.touches.flushed(&pending);
        Ok(())
    }
}

/// Inserts a new stream's row.
async fn insert_stream(
    tx: &Transaction<'_>,
    path: &str,
    m: &StreamMeta,
    tail: Offset,
    now_ms: i64,
    marks: &retention::TimeMarks,
) -> Result<(), Fail> {
    let (kind, value) = expiry_columns(m.config.expiry);
    let stmt = tx
        .prepare_cached(
            "INSERT INTO streams (id, path, created_ms, content_type, expiry_kind, expiry_value, closed, stream_seq, soft_deleted, \
             source_id, fork_point, earliest, tail, ret_max_age_s, ret_max_bytes, compaction, last_access_ms, marks) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, NULL, false, $8, $9, $10, $11, $12, $13, $14, $15, $16)",
        )
        .await?;
    let opt = |v: Option<u64>| v.map(i64_of);
    tx.execute(
        &stmt,
        &[
            &i64_of(m.id),
            &path,
            &m.created_ms,
            &m.config.content_type,
            &kind,
            &value,
            &m.closed,
            &m.fork.map(|f| i64_of(f.source_id)),
            &m.fork.map(|f| i64_of(f.fork_point)),
            &i64_of(m.earliest.0),
            &i64_of(tail.0),
            &opt(m.config.retention.max_age_s),
            &opt(m.config.retention.max_bytes),
            &m.config.compaction,
            &now_ms,
            &row::encode_marks(marks),
        ],
    )
    .await?;
    Ok(())
}

/// Deletes the rows of `table` whose time `column` is at or before `before`, in batches of
/// 10,000, so no statement holds many row locks or runs long; returns how many went.
async fn delete_in_batches(c: &deadpool_postgres::Client, table: &str, column: &str, before: i64) -> Result<u64, Fail> {
    const BATCH: i64 = 10_000;
    let stmt = c
        .prepare_cached(&format!(
            "DELETE FROM {table} WHERE ctid = ANY(ARRAY(SELECT ctid FROM {table} WHERE {column} <= $1 LIMIT $2))"
        ))
        .await?;
    let mut deleted = 0;
    loop {
        let n = c.execute(&stmt, &[&before, &BATCH]).await?;
        deleted += n;
        if n < BATCH as u64 {
            return Ok(deleted);
        }
    }
}

/// Stores a stream's new earliest offset (already applied to `st`, its time marks with it) and
/// queues the data below it for `gc`.
async fn store_earliest(tx: &Transaction<'_>, st: &StreamState, earliest: Offset) -> Result<(), Fail> {
    let id = i64_of(st.meta.id);
    let marks = row::encode_marks(&st.marks);
    tx.execute("UPDATE streams SET earliest = $2, marks = $3 WHERE id = $1", &[&id, &i64_of(earliest.0), &marks])
        .await?;
    tx.execute(
        "INSERT INTO gc (stream_id, floor) VALUES ($1, $2) ON CONFLICT (stream_id) DO UPDATE SET floor = greatest(gc.floor, excluded.floor)",
        &[&id, &i64_of(earliest.0)],
    )
    .await?;
    Ok(())
}
