//! Appends to several streams decided and written in one transaction: the committers' groups
//! (many requests, one COMMIT) and [`oncelog_storage::Engine::transact`] share this code.
//!
//! `load` locks the rows of every stream the requests name, in id order (the engine's one lock
//! order for stream rows, so two groups never deadlock on each other), and reads the producer
//! states and key entries they name into each stream's [`StreamState`]; `decide` runs the stream
//! state machine on it in request order, each request seeing the effects of the ones before it,
//! exactly as the log writer stages a group; `flush` writes every effect in one statement.

use std::collections::{HashMap, HashSet};

use bytes::Bytes;
use oncelog_protocol::digest::KeyId;
use oncelog_storage::codec::{key_entry, producer::ProducerRecord};
use oncelog_storage::machine::{Step, StreamState};
use oncelog_storage::rules::{self, Retention};
use oncelog_storage::*;
use oncelog_protocol::headers::Expiry;
use deadpool_postgres::Transaction;

use crate::error::{Fail, RowError};
use crate::row::{self, i64_of, text_ok, Stream, COLS};
use crate::shared::{Shared, MAX_VALUE_BYTES};

/// One stream of a group, as locked and changed so far.
pub(crate) struct Staged {
    /// The state the machine decides against: the row's metadata, tail and marks, and the
    /// producer states and key entries the group's requests name.
    pub st: StreamState,
    /// As stored; touches of this node not yet flushed are in [`crate::watch::Touches`].
    last_access_ms: i64,
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
            let Stream { path, meta, tail, last_access_ms, marks } = Stream::from_row(r)?;
            let st = StreamState { marks, ..StreamState::new(meta, tail) };
            let staged = Staged { st, last_access_ms, forks: 0, changed: false, dirty_producers: HashSet::new(), dirty_keys: Vec::new() };
            group.streams.insert(path, staged);
        }
        let id_of = |path: &str| group.streams.get(path).map(|g| i64_of(g.st.meta.id));
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
            group.streams.values().filter(|g| g.st.meta.expiry != Expiry::Never).map(|g| i64_of(g.st.meta.id)).collect();
        let by_id: HashMap<u64, String> = group.streams.iter().map(|(p, g)| (g.st.meta.id, p.clone())).collect();
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
            if let Some(g) = group.streams.get_mut(&path) {
                g.st.producers.insert(name, state);
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
            if let Some(g) = group.streams.get_mut(&path) {
                g.st.keys.get_or_insert_with(Default::default).insert(k, entry);
            }
        }
        let mut fork_rows = Vec::new();
        for r in &forks {
            fork_rows.push((path_of(r.get(0))?.clone(), r.get::<_, i64>(1)));
        }
        for (path, n) in fork_rows {
            if let Some(g) = group.streams.get_mut(&path) {
                g.forks = usize::try_from(n).unwrap_or(usize::MAX);
            }
        }
        Ok(group)
    }

    /// The stream `req` names as writers see it now (expired: absent, or gone while forks read
    /// it; the sweep removes it), its TTL slid by the request.
    fn stream(&mut self, req: &AppendRequest, shared: &Shared) -> Result<&mut Staged, AppendError> {
        storable(req)?;
        let Some(g) = self.streams.get_mut(&req.path) else { return Err(AppendError::NotFound) };
        let meta = &g.st.meta;
        let last_access = shared.touches.at(meta.id).map_or(g.last_access_ms, |t| t.max(g.last_access_ms));
        if !meta.soft_deleted && rules::expired(meta.expiry, last_access, req.now_ms) {
            return Err(if g.forks > 0 { AppendError::Gone } else { AppendError::NotFound });
        }
        if req.stream_id.is_none_or(|id| id == meta.id) && matches!(meta.expiry, Expiry::Ttl(_)) && req.now_ms > g.last_access_ms {
            // Any request that reaches the stream slides its TTL window.
            g.last_access_ms = req.now_ms;
            g.changed = true;
        }
        Ok(g)
    }

    /// The verdict on `req` against the group's state so far, staging nothing.
    pub fn check(&mut self, req: &AppendRequest, shared: &Shared, retention: &Retention) -> Result<(), AppendError> {
        self.stream(req, shared)?.st.check(req, retention)
    }

    /// Decides one append against the group's state so far (the stream state machine) and
    /// stages what it accepted.
    pub fn decide(&mut self, req: &AppendRequest, shared: &Shared, retention: &Retention) -> Result<AppendOutcome, AppendError> {
        let g = self.stream(req, shared)?;
        let w = match g.st.append(req, retention)? {
            Step::Answer(outcome) => return Ok(outcome),
            Step::Write(w) => w,
        };
        if let Some(p) = w.effects.producer {
            g.dirty_producers.insert(p.id.to_owned());
        }
        if let Some((k, _)) = w.effects.key {
            g.dirty_keys.push(k);
        }
        // The row holds the tail, closure, Stream-Seq and marks.
        g.changed = true;
        let id = i64_of(g.st.meta.id);
        self.new_producers += u64::from(w.new_producer);
        if !req.data.is_empty() {
            self.data.push((id, i64_of(w.effects.new_tail.0), req.data.clone()));
        }
        Ok(w.outcome)
    }

    /// Ids of the streams this group changed (to wake their readers after COMMIT).
    pub fn changed_ids(&self) -> Vec<u64> {
        self.streams.values().filter(|g| g.changed).map(|g| g.st.meta.id).collect()
    }

    /// Writes every staged effect (one statement per table, pipelined).
    pub async fn flush(&self, tx: &Transaction<'_>) -> Result<(), tokio_postgres::Error> {
        let (mut d_ids, mut d_ends, mut d_bytes) = (Vec::new(), Vec::new(), Vec::new());
        for (id, end, bytes) in &self.data {
            d_ids.push(*id);
            d_ends.push(*end);
            d_bytes.push(&bytes[..]);
        }
        let (mut p_ids, mut p_names, mut p_states, mut p_active) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let (mut k_ids, mut k_keys, mut k_entries, mut k_at) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let (mut s_ids, mut s_tails, mut s_closed, mut s_seqs, mut s_access, mut s_marks) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for g in self.streams.values() {
            let id = i64_of(g.st.meta.id);
            for name in &g.dirty_producers {
                if let Some(state) = g.st.producers.get(name) {
                    p_ids.push(id);
                    p_names.push(name.as_str());
                    p_states.push(ProducerRecord::encode_state(state));
                    p_active.push(state.last_active_ms);
                }
            }
            for k in &g.dirty_keys {
                if let Some(entry) = g.st.keys.as_ref().and_then(|m| m.get(k)) {
                    k_ids.push(id);
                    k_keys.push(key_bytes(*k).to_vec());
                    k_entries.push(key_entry::encode(entry));
                    k_at.push(entry.at_ms);
                }
            }
            if g.changed {
                s_ids.push(id);
                s_tails.push(i64_of(g.st.tail.0));
                s_closed.push(g.st.meta.closed);
                s_seqs.push(g.st.meta.stream_seq.as_deref());
                s_access.push(g.last_access_ms);
                s_marks.push(row::encode_marks(&g.st.marks));
            }
        }
        // One statement for every table (data-modifying CTEs): per-statement work in the
        // database dominates a group's cost, and empty arrays simply write nothing.
        let stmt = tx
            .prepare_cached(
                "WITH d AS (INSERT INTO data (stream_id, end_off, bytes) SELECT * FROM unnest($1::int8[], $2::int8[], $3::bytea[])), \
                 p AS (INSERT INTO producers (stream_id, producer, state, active_ms) SELECT * FROM unnest($4::int8[], $5::text[], $6::bytea[], $16::int8[]) \
                       ON CONFLICT (stream_id, producer) DO UPDATE SET state = excluded.state, active_ms = excluded.active_ms), \
                 k AS (INSERT INTO idem_keys (stream_id, key, entry, at_ms) SELECT * FROM unnest($7::int8[], $8::bytea[], $9::bytea[], $17::int8[]) \
                       ON CONFLICT (stream_id, key) DO UPDATE SET entry = excluded.entry, at_ms = excluded.at_ms) \
                 UPDATE streams s SET tail = u.tail, closed = u.closed, stream_seq = u.seq, \
                     last_access_ms = greatest(s.last_access_ms, u.la), marks = u.marks \
                 FROM unnest($10::int8[], $11::int8[], $12::bool[], $13::text[], $14::int8[], $15::bytea[]) AS u(id, tail, closed, seq, la, marks) \
                 WHERE s.id = u.id",
            )
            .await?;
        tx.execute(
            &stmt,
            &[&d_ids, &d_ends, &d_bytes, &p_ids, &p_names, &p_states, &k_ids, &k_keys, &k_entries, &s_ids, &s_tails, &s_closed, &s_seqs, &s_access, &s_marks, &p_active, &k_at],
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
