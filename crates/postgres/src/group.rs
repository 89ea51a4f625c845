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
use deadpool_postgres::GenericClient;
use oncelog_protocol::digest::KeyId;
use oncelog_protocol::headers::Expiry;
use oncelog_storage::codec::{key_entry, producer::ProducerRecord};
use oncelog_storage::machine::{Step, StreamState};
use oncelog_storage::rules::{self, Retention};
use oncelog_storage::*;
use tokio_postgres::Statement;

use crate::error::{Fail, RowError};
use crate::row::{self, i64_of, text_ok, Stream, COLS};
use crate::shared::Shared;

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

fn key_bytes(k: KeyId) -> [u8; 16] {
    k.0.to_be_bytes()
}

impl Group {
    /// Locks and loads the streams `reqs` name (see the module note). With `begin`, opens the
    /// transaction on `c` too. The statements go out together, one round trip: they run in
    /// order, so the producer and key reads (joined by path) see the rows already locked. When
    /// a request would create producer state (a producer with no live state on its stream), a
    /// second round trip counts the stream's other live producers for
    /// `--max-producers-per-stream` ([`StreamState::producers_elsewhere`]): a producer's first
    /// append pays it, its later ones do not.
    pub async fn load(
        c: &impl GenericClient,
        reqs: &[&AppendRequest],
        begin: bool,
        retention: &Retention,
    ) -> Result<Group, Fail> {
        let mut paths: Vec<&str> = reqs.iter().map(|r| r.path.as_str()).filter(|p| text_ok(p)).collect();
        paths.sort_unstable();
        paths.dedup();
        let (mut p_paths, mut p_names) = (Vec::new(), Vec::new());
        let (mut k_paths, mut k_keys) = (Vec::new(), Vec::new());
        for r in reqs.iter().filter(|r| text_ok(&r.path)) {
            if let Some(p) = r.producer.as_ref().filter(|p| text_ok(&p.id)) {
                p_paths.push(r.path.as_str());
                p_names.push(p.id.as_str());
            }
            if let Some(k) = r.idempotency_key {
                k_paths.push(r.path.as_str());
                k_keys.push(key_bytes(k).to_vec());
            }
        }
        // Built once: every group's first statement.
        static LOCK_ROWS: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
            format!("SELECT {COLS} FROM streams WHERE path = ANY($1) ORDER BY id FOR UPDATE")
        });
        // Prepared (once per connection) before anything is sent, so that nothing slips
        // between the statements below.
        let lock_stmt = c.prepare_cached(&LOCK_ROWS).await?;
        let p_stmt = prepare_if(
            c,
            !p_paths.is_empty(),
            "SELECT u.path, p.producer, p.state, p.active_ms FROM unnest($1::text[], $2::text[]) AS u(path, name) \
             JOIN streams s ON s.path = u.path JOIN producers p ON p.stream_id = s.id AND p.producer = u.name",
        )
        .await?;
        let k_stmt = prepare_if(
            c,
            !k_paths.is_empty(),
            "SELECT u.path, k.key, k.entry FROM unnest($1::text[], $2::bytea[]) AS u(path, key) \
             JOIN streams s ON s.path = u.path JOIN idem_keys k ON k.stream_id = s.id AND k.key = u.key",
        )
        .await?;
        let begin = async {
            if begin {
                c.batch_execute("BEGIN").await?;
            }
            Ok::<_, tokio_postgres::Error>(())
        };
        type P<'a> = &'a (dyn tokio_postgres::types::ToSql + Sync);
        let (l_params, p_params, k_params): ([P; 1], [P; 2], [P; 2]) =
            ([&paths], [&p_paths, &p_names], [&k_paths, &k_keys]);
        let lock = c.query(&lock_stmt, &l_params);
        let producers = query_if(c, p_stmt.as_ref(), &p_params);
        let keys = query_if(c, k_stmt.as_ref(), &k_params);
        let ((), rows, producers, keys) = futures_util::future::try_join4(begin, lock, producers, keys).await?;
        let mut group = Group::default();
        for r in &rows {
            let Stream { path, meta, tail, last_access_ms, marks } = Stream::from_row(r)?;
            // Locked by path, so every row has one (a detached row has none and is never here).
            let Some(path) = path else { continue };
            let st = StreamState { marks, ..StreamState::new(meta, tail) };
            let staged = Staged {
                st,
                last_access_ms,
                forks: 0,
                changed: false,
                dirty_producers: HashSet::new(),
                dirty_keys: Vec::new(),
            };
            group.streams.insert(path, staged);
        }
        // The `active_ms` of each loaded producer row, by path: the count below counts rows by it.
        let mut loaded_active: HashMap<&str, Vec<i64>> = HashMap::new();
        for r in &producers {
            let state = ProducerRecord::decode(r.get(2), 0).map_err(RowError::from)?.0;
            if let Some(g) = group.streams.get_mut(r.get::<_, &str>(0)) {
                g.st.producers.insert(r.get::<_, String>(1), state);
                loaded_active.entry(r.get::<_, &str>(0)).or_default().push(r.get(3));
            }
        }
        group.count_other_producers(c, reqs, retention, &loaded_active).await?;
        for r in &keys {
            let raw: &[u8] = r.get(1);
            let k = KeyId(u128::from_be_bytes(raw.try_into().map_err(|_| RowError::Range("key"))?));
            let entry = key_entry::decode(r.get(2)).map_err(RowError::from)?;
            if let Some(g) = group.streams.get_mut(r.get::<_, &str>(0)) {
                g.st.keys.get_or_insert_with(Default::default).insert(k, entry);
            }
        }
        // Forks decide 404 or 410 for an expired stream: counted only for streams that can
        // expire (rarely in a group), after the rows are known.
        let expiring: Vec<i64> = group
            .streams
            .values()
            .filter(|g| g.st.meta.config.expiry != Expiry::Never)
            .map(|g| i64_of(g.st.meta.id))
            .collect();
        if !expiring.is_empty() {
            let stmt = c
                .prepare_cached("SELECT source_id, count(*) FROM streams WHERE source_id = ANY($1) GROUP BY source_id")
                .await?;
            let by_id: HashMap<u64, &str> = group.streams.iter().map(|(p, g)| (g.st.meta.id, p.as_str())).collect();
            let mut fork_rows = Vec::new();
            for r in c.query(&stmt, &[&expiring]).await? {
                let id = row::u64_of(r.get(0), "source_id")?;
                let path = by_id.get(&id).ok_or(RowError::Range("source_id"))?;
                fork_rows.push(((*path).to_owned(), r.get::<_, i64>(1)));
            }
            for (path, n) in fork_rows {
                if let Some(g) = group.streams.get_mut(&path) {
                    g.forks = usize::try_from(n).unwrap_or(usize::MAX);
                }
            }
        }
        Ok(group)
    }

    /// Sets [`StreamState::producers_elsewhere`] of each stream where a request would create
    /// producer state: its live producer rows (`active_ms` past the TTL cut, as the prune
    /// deletes by) not loaded into its state. Under the stream's row lock, which every writer of
    /// its producer rows holds, so the count cannot grow before the group commits (the prune
    /// may only shrink it).
    async fn count_other_producers(
        &mut self,
        c: &impl GenericClient,
        reqs: &[&AppendRequest],
        retention: &Retention,
        loaded_active: &HashMap<&str, Vec<i64>>,
    ) -> Result<(), Fail> {
        // The earliest request time per stream: its cut counts the most rows as live.
        let mut cuts: HashMap<&str, i64> = HashMap::new();
        for r in reqs {
            let Some(g) = self.streams.get(&r.path) else { continue };
            let state = r.producer.as_ref().and_then(|p| g.st.producers.get(&p.id));
            if rules::makes_new_producer(r, state, retention) {
                let cut = retention.dead_at_or_before(r.now_ms).0;
                cuts.entry(r.path.as_str()).and_modify(|c| *c = (*c).min(cut)).or_insert(cut);
            }
        }
        if cuts.is_empty() {
            return Ok(());
        }
        let (paths, cut_ms): (Vec<&str>, Vec<i64>) = cuts.iter().map(|(p, c)| (*p, *c)).unzip();
        let stmt = c
            .prepare_cached(
                "SELECT u.path, count(*) FROM unnest($1::text[], $2::int8[]) AS u(path, cut) \
                 JOIN streams s ON s.path = u.path JOIN producers p ON p.stream_id = s.id AND p.active_ms > u.cut \
                 GROUP BY u.path",
            )
            .await?;
        for r in c.query(&stmt, &[&paths, &cut_ms]).await? {
            let path: &str = r.get(0);
            let (Some(cut), Some(g)) = (cuts.get(path), self.streams.get_mut(path)) else { continue };
            let loaded_live = loaded_active.get(path).map_or(0, |v| v.iter().filter(|a| **a > *cut).count());
            let live = u64::try_from(r.get::<_, i64>(1)).unwrap_or(0);
            g.st.producers_elsewhere = live.saturating_sub(loaded_live as u64);
        }
        Ok(())
    }

    /// The stream `req` names as writers see it now (expired: absent, or gone while forks read
    /// it; the sweep removes it), its TTL slid by the request.
    fn stream(&mut self, req: &AppendRequest, shared: &Shared) -> Result<&mut Staged, AppendError> {
        rules::shape::append(req)?;
        let Some(g) = self.streams.get_mut(&req.path) else { return Err(AppendError::NotFound) };
        let meta = &g.st.meta;
        let last_access = shared.touches.at(meta.id).map_or(g.last_access_ms, |t| t.max(g.last_access_ms));
        // The sweep removes it: nothing is written here.
        rules::writable(meta.soft_deleted, rules::expired(meta.config.expiry, last_access, req.now_ms), g.forks)?;
        if rules::write_slides_ttl(req, meta)
            && matches!(meta.config.expiry, Expiry::Ttl(_))
            && req.now_ms > g.last_access_ms
        {
            // Only a TTL needs the row written for it.
            g.last_access_ms = req.now_ms;
            g.changed = true;
        }
        Ok(g)
    }

    /// The verdict on `req` against the group's state so far, staging nothing.
    /// `producers_total`: this node's count of producer states across all streams.
    pub fn check(
        &mut self,
        req: &AppendRequest,
        shared: &Shared,
        retention: &Retention,
        producers_total: u64,
    ) -> Result<(), AppendError> {
        let verdict = self.stream(req, shared).and_then(|g| g.st.check(req, retention, producers_total));
        shared.seen.judged(&req.path, verdict.as_ref().err());
        verdict
    }

    /// Decides one append against the group's state so far (the stream state machine) and
    /// stages what it accepted.
    pub fn decide(
        &mut self,
        req: &AppendRequest,
        shared: &Shared,
        retention: &Retention,
        producers_total: u64,
    ) -> Result<AppendOutcome, AppendError> {
        let verdict = self.stage(req, shared, retention, producers_total);
        shared.seen.judged(&req.path, verdict.as_ref().err());
        verdict
    }

    fn stage(
        &mut self,
        req: &AppendRequest,
        shared: &Shared,
        retention: &Retention,
        producers_total: u64,
    ) -> Result<AppendOutcome, AppendError> {
        let g = self.stream(req, shared)?;
        let w = match g.st.append(req, retention, producers_total)? {
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

    /// Writes every staged effect (one statement for every table), then, with `commit`,
    /// commits: both sent at once, one round trip. A failed write makes that `COMMIT` a
    /// rollback, and the write's error is the answer.
    pub async fn flush(&self, c: &impl GenericClient, commit: bool) -> Result<(), tokio_postgres::Error> {
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
        let stmt = c
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
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 17] = [
            &d_ids, &d_ends, &d_bytes, &p_ids, &p_names, &p_states, &k_ids, &k_keys, &k_entries, &s_ids, &s_tails,
            &s_closed, &s_seqs, &s_access, &s_marks, &p_active, &k_at,
        ];
        let write = c.execute(&stmt, &params);
        let commit = async {
            if commit {
                c.batch_execute("COMMIT").await?;
            }
            Ok(())
        };
        futures_util::future::try_join(write, commit).await.map(drop)
    }
}

/// The statement for `sql`, prepared (once per connection), when there is something to ask.
async fn prepare_if(c: &impl GenericClient, ask: bool, sql: &str) -> Result<Option<Statement>, tokio_postgres::Error> {
    Ok(if ask { Some(c.prepare_cached(sql).await?) } else { None })
}

/// Runs a prepared query, or answers no rows at once when there is nothing to ask.
async fn query_if(
    c: &impl GenericClient,
    stmt: Option<&Statement>,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
    match stmt {
        Some(stmt) => c.query(stmt, params).await,
        None => Ok(Vec::new()),
    }
}
