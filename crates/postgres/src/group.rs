//! Appends to several streams decided and written in one transaction: the committers' groups
//! (many requests, one COMMIT) and [`oncelog_storage::Engine::transact`] share this code.
//!
//! `load` locks the rows of every stream the requests name, in id order (the engine's one lock
//! order for stream rows, so two groups never deadlock on each other), and reads the producer
//! states and key entries they name; `decide` applies [`rules::append`] to that state in request
//! order, each request seeing the effects of the ones before it, exactly as the log
//! writer stages a batch; `flush` writes every effect in one statement.

use std::collections::{HashMap, HashSet};

use bytes::Bytes;
use oncelog_protocol::digest::KeyId;
use oncelog_protocol::producer::ProducerState;
use oncelog_storage::codec::{key_entry, producer::ProducerRecord};
use oncelog_storage::retention::{self, MarkChange};
use oncelog_storage::rules::{self, Retention, WriterState};
use oncelog_storage::*;
use oncelog_protocol::headers::Expiry;
use deadpool_postgres::Transaction;

use crate::error::{Fail, RowError};
use crate::row::{self, i64_of, text_ok, Stream, COLS};
use crate::{Shared, MAX_VALUE_BYTES};

/// One stream of a group, as locked and changed so far.
pub(crate) struct Staged {
    pub s: Stream,
    pub producers: HashMap<String, ProducerState>,
    pub keys: IdempotencyKeys,
    /// Forks reading it (loaded only for streams that may have expired: it decides 404 vs 410).
    forks: usize,
    /// The `streams` row must be rewritten.
    changed: bool,
    dirty_producers: HashSet<String>,
    dirty_keys: Vec<KeyId>,
}

#[derive(Default)]
pub(crate) struct Group {
    pub streams: HashMap<String, Staged>,
    /// `(stream id, end offset, bytes)` of every accepted append with data.
    data: Vec<(i64, i64, Bytes)>,
    /// Producer rows this group creates (for the engine's counters).
    pub new_producers: u64,
}

/// Refusals that need no state: what this engine cannot store.
pub(crate) fn storable(req: &AppendRequest) -> Result<(), AppendError> {
    if req.producer.as_ref().is_some_and(|p| p.id.is_empty() || p.id.len() > 4096 || !text_ok(&p.id)) {
        return Err(AppendError::ProducerIdTooLong);
    }
    if req.data.len() as u64 > MAX_VALUE_BYTES {
        return Err(AppendError::TooLarge);
    }
    Ok(())
}

fn key_bytes(k: KeyId) -> [u8; 16] {
    k.0.to_be_bytes()
}

impl Group {
    /// Locks and loads the streams `reqs` name (see the module note).
    pub async fn load(tx: &Transaction<'_>, reqs: &[&AppendRequest]) -> Result<Group, Fail> {
        let mut paths: Vec<&str> = reqs.iter().map(|r| r.path.as_str()).filter(|p| text_ok(p)).collect();
        paths.sort_unstable();
        paths.dedup();
        // Built once: every group's first statement.
        static LOCK_ROWS: std::sync::LazyLock<String> =
            std::sync::LazyLock::new(|| format!("SELECT {COLS} FROM streams WHERE path = ANY($1) ORDER BY id FOR UPDATE"));
        let stmt = tx.prepare_cached(&LOCK_ROWS).await?;
        let rows = tx.query(&stmt, &[&paths]).await?;
        let mut group = Group::default();
        for r in &rows {
            let s = Stream::from_row(r)?;
            let staged = Staged {
                s,
                producers: HashMap::new(),
                keys: None,
                forks: 0,
                changed: false,
                dirty_producers: HashSet::new(),
                dirty_keys: Vec::new(),
            };
            group.streams.insert(staged.s.path.clone(), staged);
        }
        let id_of = |path: &str| group.streams.get(path).map(|st| i64_of(st.s.meta.id));
        let (mut p_ids, mut p_names) = (Vec::new(), Vec::new());
        let (mut k_ids, mut k_keys) = (Vec::new(), Vec::new());
        for r in reqs {
            let Some(id) = id_of(&r.path) else { continue };
            if let Some(p) = r.producer.as_ref().filter(|p| text_ok(&p.id)) {
                p_ids.push(id);
                p_names.push(p.id.as_str());
            }
            if let Some(k) = r.idempotency_key {
                k_ids.push(id);
                k_keys.push(key_bytes(k).to_vec());
            }
        }
        let expiring: Vec<i64> =
            group.streams.values().filter(|st| st.s.meta.expiry != Expiry::Never).map(|st| i64_of(st.s.meta.id)).collect();
        let by_id: HashMap<u64, String> = group.streams.iter().map(|(p, st)| (st.s.meta.id, p.clone())).collect();
        // Pipelined: the three reads go out together (each only when it has something to ask).
        type P<'a> = &'a (dyn tokio_postgres::types::ToSql + Sync);
        let (p_params, k_params, f_params): ([P; 2], [P; 2], [P; 1]) = ([&p_ids, &p_names], [&k_ids, &k_keys], [&expiring]);
        let producers = query_if(
            tx,
            !p_ids.is_empty(),
            "SELECT p.stream_id, p.producer, p.state FROM producers p \
             JOIN unnest($1::int8[], $2::text[]) AS u(s, n) ON p.stream_id = u.s AND p.producer = u.n",
            &p_params,
        );
        let keys = query_if(
            tx,
            !k_ids.is_empty(),
            "SELECT k.stream_id, k.key, k.entry FROM idem_keys k \
             JOIN unnest($1::int8[], $2::bytea[]) AS u(s, k) ON k.stream_id = u.s AND k.key = u.k",
            &k_params,
        );
        let forks = query_if(
            tx,
            !expiring.is_empty(),
            "SELECT source_id, count(*) FROM streams WHERE source_id = ANY($1) GROUP BY source_id",
            &f_params,
        );
        let (producers, keys, forks) = futures_util::future::try_join3(producers, keys, forks).await?;
        let path_of = |id: i64| -> Result<&String, RowError> {
            by_id.get(&row::u64_of(id, "stream_id")?).ok_or(RowError::Range("stream_id"))
        };
        let mut producer_rows = Vec::new();
        for r in &producers {
            let path = path_of(r.get(0))?.clone();
            let state = ProducerRecord::decode(r.get(2), 0).map_err(RowError::from)?.0;
            producer_rows.push((path, r.get::<_, String>(1), state));
        }
        for (path, name, state) in producer_rows {
            if let Some(st) = group.streams.get_mut(&path) {
                st.producers.insert(name, state);
            }
        }
        let mut key_rows = Vec::new();
        for r in &keys {
            let path = path_of(r.get(0))?.clone();
            let raw: &[u8] = r.get(1);
            let k = KeyId(u128::from_be_bytes(raw.try_into().map_err(|_| RowError::Range("key"))?));
            key_rows.push((path, k, key_entry::decode(r.get(2)).map_err(RowError::from)?));
        }
        for (path, k, entry) in key_rows {
            if let Some(st) = group.streams.get_mut(&path) {
                st.keys.get_or_insert_with(Default::default).insert(k, entry);
            }
        }
        let mut fork_rows = Vec::new();
        for r in &forks {
            fork_rows.push((path_of(r.get(0))?.clone(), r.get::<_, i64>(1)));
        }
        for (path, n) in fork_rows {
            if let Some(st) = group.streams.get_mut(&path) {
                st.forks = usize::try_from(n).unwrap_or(usize::MAX);
            }
        }
        Ok(group)
    }

    /// Decides one append against the group's state so far and stages its effects.
    pub fn decide(&mut self, req: &AppendRequest, shared: &Shared, retention: &Retention) -> Result<AppendOutcome, AppendError> {
        storable(req)?;
        let Some(st) = self.streams.get_mut(&req.path) else { return Err(AppendError::NotFound) };
        let meta = &mut st.s.meta;
        let last_access = shared.touches.at(meta.id).map_or(st.s.last_access_ms, |t| t.max(st.s.last_access_ms));
        if !meta.soft_deleted && rules::expired(meta.expiry, last_access, req.now_ms) {
            // Expired: absent to writers (or gone while forks read it); the sweep removes it.
            return Err(if st.forks > 0 { AppendError::Gone } else { AppendError::NotFound });
        }
        if req.stream_id.is_none_or(|id| id == meta.id) && matches!(meta.expiry, Expiry::Ttl(_)) && req.now_ms > st.s.last_access_ms {
            // Any request that reaches the stream slides its TTL window.
            st.s.last_access_ms = req.now_ms;
            st.changed = true;
        }
        let writer = WriterState::of(req, &st.producers, &st.keys);
        let write = match rules::append(meta, st.s.tail, writer, req, retention)? {
            rules::AppendPlan::Answer(outcome) => return Ok(outcome),
            rules::AppendPlan::Write(w) => w,
        };
        let closed_before = meta.closed;
        w_apply(st, &write, req, &mut self.new_producers);
        if !req.data.is_empty() {
            self.data.push((i64_of(st.s.meta.id), i64_of(write.new_tail.0), req.data.clone()));
        }
        Ok(write.outcome(closed_before))
    }

    /// Ids of the streams this group changed (to wake their readers after COMMIT).
    pub fn changed_ids(&self) -> Vec<u64> {
        self.streams.values().filter(|st| st.changed).map(|st| st.s.meta.id).collect()
    }

    /// Writes every staged effect (one statement per table, pipelined).
    pub async fn flush(&self, tx: &Transaction<'_>) -> Result<(), tokio_postgres::Error> {
        let (mut d_ids, mut d_ends, mut d_bytes) = (Vec::new(), Vec::new(), Vec::new());
        for (id, end, bytes) in &self.data {
            d_ids.push(*id);
            d_ends.push(*end);
            d_bytes.push(&bytes[..]);
        }
        let (mut p_ids, mut p_names, mut p_states) = (Vec::new(), Vec::new(), Vec::new());
        let (mut k_ids, mut k_keys, mut k_entries) = (Vec::new(), Vec::new(), Vec::new());
        let (mut s_ids, mut s_tails, mut s_closed, mut s_seqs, mut s_access, mut s_marks) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for st in self.streams.values() {
            let id = i64_of(st.s.meta.id);
            for name in &st.dirty_producers {
                if let Some(state) = st.producers.get(name) {
                    p_ids.push(id);
                    p_names.push(name.as_str());
                    p_states.push(ProducerRecord::encode_state(state));
                }
            }
            for k in &st.dirty_keys {
                if let Some(entry) = st.keys.as_ref().and_then(|m| m.get(k)) {
                    k_ids.push(id);
                    k_keys.push(key_bytes(*k).to_vec());
                    k_entries.push(key_entry::encode(entry));
                }
            }
            if st.changed {
                s_ids.push(id);
                s_tails.push(i64_of(st.s.tail.0));
                s_closed.push(st.s.meta.closed);
                s_seqs.push(st.s.meta.stream_seq.as_deref());
                s_access.push(st.s.last_access_ms);
                s_marks.push(row::encode_marks(&st.s.marks));
            }
        }
        // One statement for every table (data-modifying CTEs): per-statement work in the
        // database dominates a group's cost, and empty arrays simply write nothing.
        let stmt = tx
            .prepare_cached(
                "WITH d AS (INSERT INTO data (stream_id, end_off, bytes) SELECT * FROM unnest($1::int8[], $2::int8[], $3::bytea[])), \
                 p AS (INSERT INTO producers (stream_id, producer, state) SELECT * FROM unnest($4::int8[], $5::text[], $6::bytea[]) \
                       ON CONFLICT (stream_id, producer) DO UPDATE SET state = excluded.state), \
                 k AS (INSERT INTO idem_keys (stream_id, key, entry) SELECT * FROM unnest($7::int8[], $8::bytea[], $9::bytea[]) \
                       ON CONFLICT (stream_id, key) DO UPDATE SET entry = excluded.entry) \
                 UPDATE streams s SET tail = u.tail, closed = u.closed, stream_seq = u.seq, \
                     last_access_ms = greatest(s.last_access_ms, u.la), marks = u.marks \
                 FROM unnest($10::int8[], $11::int8[], $12::bool[], $13::text[], $14::int8[], $15::bytea[]) AS u(id, tail, closed, seq, la, marks) \
                 WHERE s.id = u.id",
            )
            .await?;
        tx.execute(
            &stmt,
            &[&d_ids, &d_ends, &d_bytes, &p_ids, &p_names, &p_states, &k_ids, &k_keys, &k_entries, &s_ids, &s_tails, &s_closed, &s_seqs, &s_access, &s_marks],
        )
        .await
        .map(drop)
    }
}

/// Runs a prepared query, or answers no rows at once when there is nothing to ask.
async fn query_if(
    tx: &Transaction<'_>,
    ask: bool,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
    if !ask {
        return Ok(Vec::new());
    }
    let stmt = tx.prepare_cached(sql).await?;
    tx.query(&stmt, params).await
}

/// Applies an accepted append's effects to its staged stream.
fn w_apply(st: &mut Staged, w: &rules::AppendWrite, req: &AppendRequest, new_producers: &mut u64) {
    w.apply_meta(&mut st.s.meta, req);
    if let (Some((epoch, _)), Some(p)) = (w.producer, &req.producer) {
        let state = st.producers.entry(p.id.clone()).or_insert_with(|| {
            *new_producers += 1;
            ProducerState::new(epoch)
        });
        w.apply_producer(state);
        st.dirty_producers.insert(p.id.clone());
    }
    if let Some(k) = w.key {
        w.apply_key(&mut st.keys);
        st.dirty_keys.push(k);
    }
    if retention::note_write(&mut st.s.marks, &st.s.meta.retention, w.new_tail, req.now_ms) != MarkChange::None {
        st.changed = true;
    }
    st.s.tail = w.new_tail;
    st.changed = true;
}
