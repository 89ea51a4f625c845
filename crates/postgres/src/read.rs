//! Reads: a stream's row as readers see it, bytes through a fork's chain, live waits,
//! listings. Every read asks the database, so it reflects writes acknowledged by any node.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use deadpool_postgres::GenericClient;
use futures_util::FutureExt;
use oncelog_protocol::headers::Expiry;
use oncelog_protocol::Offset;
use oncelog_storage::machine::chain::{self, fork_chain, Segment};
use oncelog_storage::rules;
use oncelog_storage::*;
use tokio::time::Instant;

use crate::error::{Fail, RowError};
use crate::row::{i64_of, text_ok, u64_of, Stream, COLS};
use crate::shared::Shared;

/// How often a live wait re-reads its stream when nothing woke it: the last resort behind the
/// notifications and the node's poll of watched tails (`bus`), which wake it much sooner.
pub(crate) const WAIT_POLL: Duration = Duration::from_secs(5);

/// A read found no row where the stream's data should be: a trim removed it meanwhile.
pub(crate) struct Gap;

impl Shared {
    /// The row at `path`, if any (`lock`: `FOR UPDATE`, inside a transaction).
    pub(crate) async fn fetch(&self, c: &impl GenericClient, path: &str, lock: Lock) -> Result<Option<Stream>, Fail> {
        if !text_ok(path) {
            return Ok(None);
        }
        // Built once: this is every read's first statement.
        static SQL: LazyLock<[String; 3]> = LazyLock::new(|| {
            let base = format!("SELECT {COLS} FROM streams WHERE path = $1");
            [base.clone(), format!("{base} FOR UPDATE"), format!("{base} FOR UPDATE SKIP LOCKED")]
        });
        let sql = &SQL[match lock {
            Lock::None => 0,
            Lock::Update => 1,
            Lock::SkipLocked => 2,
        }];
        let stmt = c.prepare_cached(sql).await?;
        match c.query_opt(&stmt, &[&path]).await? {
            Some(r) => Ok(Some(Stream::from_row(&r)?)),
            None => Ok(None),
        }
    }

    /// When the stream was last read or written, as this node knows it.
    pub(crate) fn last_access(&self, s: &Stream) -> i64 {
        self.touches.at(s.meta.id).map_or(s.last_access_ms, |t| t.max(s.last_access_ms))
    }

    pub(crate) fn expired(&self, s: &Stream, now_ms: i64) -> bool {
        !s.meta.soft_deleted && rules::expired(s.meta.config.expiry, self.last_access(s), now_ms)
    }

    /// How many streams fork stream `id`.
    pub(crate) async fn forks(&self, c: &impl GenericClient, id: u64) -> Result<usize, Fail> {
        let stmt = c.prepare_cached("SELECT count(*) FROM streams WHERE source_id = $1").await?;
        let n: i64 = c.query_one(&stmt, &[&i64_of(id)]).await?.get(0);
        Ok(usize::try_from(n).unwrap_or(usize::MAX))
    }

    /// The stream at `path` as a reader sees it at `now_ms` ([`rules::visible`]).
    pub(crate) async fn visible(
        &self,
        c: &deadpool_postgres::Client,
        path: &str,
        now_ms: i64,
    ) -> Result<Result<Stream, LookupError>, Fail> {
        let found = self.fetch(c, path, Lock::None).await?;
        self.judge(found, now_ms, Some(c)).await
    }

    /// How a reader sees the row `found` at `now_ms`: its forks are counted (one more query, on
    /// `c` or a pooled connection) only when it has expired, where they decide 404 or 410.
    async fn judge(
        &self,
        found: Option<Stream>,
        now_ms: i64,
        c: Option<&deadpool_postgres::Client>,
    ) -> Result<Result<Stream, LookupError>, Fail> {
        let Some(s) = found else { return Ok(Err(LookupError::NotFound)) };
        let expired = self.expired(&s, now_ms);
        let forks = match (expired, c) {
            (false, _) => 0,
            (true, Some(c)) => self.forks(c, s.meta.id).await?,
            (true, None) => self.forks(&self.client().await?, s.meta.id).await?,
        };
        Ok(rules::visible(s.meta.soft_deleted, expired, forks).map(|()| s))
    }

    /// A read slides a TTL window (written later, in a batch).
    pub(crate) fn touch(&self, s: &Stream, now_ms: i64) {
        if matches!(s.meta.config.expiry, Expiry::Ttl(_)) {
            self.touches.touch(s.meta.id, now_ms);
        }
    }

    /// The inherited segments of a fork (empty for a stream that is none). Immutable, so kept
    /// per id once computed.
    pub(crate) async fn chain(&self, c: &impl GenericClient, s: &Stream) -> Result<Arc<Vec<Segment<u64>>>, Fail> {
        if let Some(chain) = self.cached_chain(s.meta.id) {
            return Ok(chain);
        }
        if s.meta.fork.is_none() {
            // Remembered too: a woken reader's read (`read_woken`) needs the chain without the row.
            return Ok(self.remember_chain(s.meta.id, Vec::new()));
        }
        let stmt = c
            .prepare_cached(
                "WITH RECURSIVE a(id, source_id, fork_point, depth) AS ( \
                   SELECT id, source_id, fork_point, 0 FROM streams WHERE id = $1 \
                   UNION ALL SELECT s.id, s.source_id, s.fork_point, a.depth + 1 FROM streams s JOIN a ON s.id = a.source_id) \
                 SELECT id, fork_point FROM a ORDER BY depth DESC",
            )
            .await?;
        let rows = c.query(&stmt, &[&i64_of(s.meta.id)]).await?;
        // Root first: each stream's chain extends its source's.
        let mut chain = Vec::new();
        let mut parent: Option<u64> = None;
        for r in &rows {
            let id = u64_of(r.get(0), "id")?;
            if let Some(p) = parent {
                let point = r.get::<_, Option<i64>>(1).ok_or(RowError::Range("fork_point"))?;
                chain = fork_chain(&chain, &p, u64_of(point, "fork_point")?);
            }
            parent = Some(id);
        }
        if parent != Some(s.meta.id) {
            return Err(RowError::Range("source_id").into());
        }
        Ok(self.remember_chain(s.meta.id, chain))
    }

    pub(crate) fn cached_chain(&self, id: u64) -> Option<Arc<Vec<Segment<u64>>>> {
        self.chains.lock().unwrap_or_else(|p| p.into_inner()).get(&id).cloned()
    }

    fn remember_chain(&self, id: u64, chain: Vec<Segment<u64>>) -> Arc<Vec<Segment<u64>>> {
        let chain = Arc::new(chain);
        let mut map = self.chains.lock().unwrap_or_else(|p| p.into_inner());
        // Bounded: chains are cheap to read again.
        if map.len() >= 100_000 {
            map.clear();
        }
        map.insert(id, chain.clone());
        chain
    }

    /// Stored bytes from `from`, through `chain` and then stream `id`'s own data, up to `tail`
    /// and about `max_bytes` (whole appends, except where a segment boundary cuts one); also
    /// whether `from` is a minted offset (an append's start or a segment boundary).
    pub(crate) async fn scan(
        &self,
        c: &impl GenericClient,
        chain: &[Segment<u64>],
        id: u64,
        from: Offset,
        tail: Offset,
        max_bytes: usize,
    ) -> Result<Result<(Bytes, Offset, bool), Gap>, Fail> {
        let stmt = c
            .prepare_cached(
                "SELECT end_off, bytes FROM data WHERE stream_id = $1 AND end_off > $2 ORDER BY end_off LIMIT $3",
            )
            .await?;
        let mut out = BytesMut::new();
        let mut r = chain::ReadCursor::new(chain, from.0, max_bytes, false);
        let mut limit: i64 = 8;
        'parts: for part in chain::parts(chain, &id, from.0, tail.0) {
            let seg_end = part.end;
            while r.pos() < seg_end {
                let rows = c.query(&stmt, &[&i64_of(*part.source), &i64_of(r.pos()), &limit]).await?;
                limit = (limit * 4).min(256);
                if rows.is_empty() {
                    return Ok(Err(Gap));
                }
                for row in &rows {
                    let end = u64_of(row.get(0), "end_off")?;
                    let v: &[u8] = row.get(1);
                    let start = end.saturating_sub(v.len() as u64);
                    if start >= seg_end {
                        break;
                    }
                    let Ok(range) = r.take(start, end, seg_end) else { return Ok(Err(Gap)) };
                    out.extend_from_slice(&v[range]);
                    if r.full() || r.pos() >= seg_end {
                        break;
                    }
                }
                if r.full() {
                    break 'parts;
                }
            }
        }
        Ok(Ok((out.freeze(), Offset(r.pos()), r.aligned())))
    }

    /// The append of stream `id` (through `chain`) that starts exactly at `at`, cut at the
    /// segment boundary it lies in: what a fork sub-offset counts into.
    pub(crate) async fn append_at(
        &self,
        c: &impl GenericClient,
        chain: &[Segment<u64>],
        id: u64,
        at: u64,
        tail: u64,
    ) -> Result<Option<Bytes>, Fail> {
        let Some(part) = chain::part_at(chain, &id, at, tail) else { return Ok(None) };
        let stmt = c
            .prepare_cached(
                "SELECT end_off, bytes FROM data WHERE stream_id = $1 AND end_off > $2 ORDER BY end_off LIMIT 1",
            )
            .await?;
        let Some(r) = c.query_opt(&stmt, &[&i64_of(*part.source), &i64_of(at)]).await? else { return Ok(None) };
        let end = u64_of(r.get(0), "end_off")?;
        let v: &[u8] = r.get(1);
        let start = end.saturating_sub(v.len() as u64);
        let Some(range) = chain::append_at(start, end, at, part.end) else { return Ok(None) };
        Ok(Some(Bytes::copy_from_slice(&v[range])))
    }

    pub(crate) async fn head(&self, path: &str, now_ms: i64) -> Result<Result<StreamInfo, LookupError>, Fail> {
        let c = self.client().await?;
        Ok(self.visible(&c, path, now_ms).await?.map(|s| s.meta.info(s.tail)))
    }

    /// The row at `path` as of a read that began after this node's last wake-up, shared with
    /// every waiter asking the same now (`flight`).
    async fn fetch_fresh(&self, path: &str) -> Result<Option<Stream>, StorageError> {
        let key = (path.to_owned(), self.watches.epoch.now());
        let me = self.me();
        let path = path.to_owned();
        self.rows
            .run(key, move || {
                async move {
                    let me = me.ok_or(StorageError::ShuttingDown)?;
                    let c = me.client().await?;
                    Ok(me.fetch(&c, &path, Lock::None).await?)
                }
                .boxed()
            })
            .await
    }

    /// [`Shared::visible`] over a shared row read; expiry is judged at this reader's `now_ms`.
    async fn visible_fresh(&self, path: &str, now_ms: i64) -> Result<Result<Stream, LookupError>, Fail> {
        let found = self.fetch_fresh(path).await?;
        self.judge(found, now_ms, None).await
    }

    pub(crate) async fn read(
        &self,
        path: &str,
        from: Offset,
        max_bytes: usize,
        now_ms: i64,
    ) -> Result<Result<ReadChunk, LookupError>, Fail> {
        // One connection for the row and (when not known yet) the fork chain; the data comes
        // through a shared read, on a connection of its own.
        let c = self.client().await?;
        let s = match self.visible(&c, path, now_ms).await? {
            Ok(s) => s,
            Err(e) => return Ok(Err(e)),
        };
        self.touch(&s, now_ms);
        let info = s.meta.info(s.tail);
        match rules::read_start(&info, from) {
            Err(e) => return Ok(Err(e)),
            Ok(Some(at_tail)) => return Ok(Ok(at_tail)),
            Ok(None) => {}
        }
        let chain = self.chain(&c, &s).await?;
        drop(c);
        self.read_shared(path, info, chain, from, max_bytes).await
    }

    /// A woken reader's read ([`oncelog_storage::Engine::read_woken`]): the stream as its wait
    /// saw it (after the wake-up), so no row read; a stream whose chain this node does not know
    /// yet is read afresh.
    pub(crate) async fn read_woken(
        &self,
        path: &str,
        from: Offset,
        max_bytes: usize,
        seen: &StreamInfo,
        now_ms: i64,
    ) -> Result<Result<ReadChunk, LookupError>, Fail> {
        let Some(chain) = self.cached_chain(seen.id) else { return self.read(path, from, max_bytes, now_ms).await };
        if matches!(seen.config.expiry, Expiry::Ttl(_)) {
            self.touches.touch(seen.id, now_ms);
        }
        match rules::read_start(seen, from) {
            Err(e) => Ok(Err(e)),
            Ok(Some(at_tail)) => Ok(Ok(at_tail)),
            Ok(None) => self.read_shared(path, seen.clone(), chain, from, max_bytes).await,
        }
    }

    /// The data of a read, shared with every reader asking for the same range now (`flight`).
    async fn read_shared(
        &self,
        path: &str,
        info: StreamInfo,
        chain: Arc<Vec<Segment<u64>>>,
        from: Offset,
        max_bytes: usize,
    ) -> Result<Result<ReadChunk, LookupError>, Fail> {
        let key = (info.id, from.0, info.tail.0, max_bytes);
        let (me, id, tail) = (self.me(), info.id, info.tail);
        let scanned = self
            .scans
            .run(key, move || {
                async move {
                    let me = me.ok_or(StorageError::ShuttingDown)?;
                    let c = me.client().await?;
                    Ok(me.scan(&c, &chain, id, from, tail, max_bytes).await?.ok())
                }
                .boxed()
            })
            .await?;
        match scanned {
            Some((data, next, aligned)) => Ok(Ok(ReadChunk { info, data, next, aligned })),
            None => {
                // A trim committed during the read: the earliest offset as of now decides.
                let c = self.client().await?;
                let earliest = self.fetch(&c, path, Lock::None).await?.map_or(info.earliest, |s| s.meta.earliest);
                if from < earliest {
                    Ok(Err(LookupError::Trimmed { earliest }))
                } else {
                    Err(RowError::Range("data (a gap in a stream's appends)").into())
                }
            }
        }
    }

    pub(crate) async fn wait(
        &self,
        path: &str,
        after: Offset,
        timeout: Duration,
        now_ms: i64,
    ) -> Result<Result<WaitOutcome, LookupError>, Fail> {
        let deadline = Instant::now() + timeout;
        let first = match self.within(self.visible_fresh(path, now_ms)).await? {
            Ok(s) => s,
            Err(e) => return Ok(Err(e)),
        };
        self.touch(&first, now_ms);
        let id = first.meta.id;
        let notify = self.watches.get(id);
        loop {
            let notified = notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            // Read after registering: a commit in between is not missed. No connection is held
            // while waiting (waiters must not hold connections).
            let s = match self.within(self.visible_fresh(path, now_ms)).await? {
                Ok(s) if s.meta.id == id => s,
                // Replaced by a new incarnation: this one is gone.
                Ok(_) => return Ok(Err(LookupError::NotFound)),
                Err(e) => return Ok(Err(e)),
            };
            let info = s.meta.info(s.tail);
            if s.tail > after || s.meta.closed {
                return Ok(Ok(WaitOutcome::Changed(info)));
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(Ok(WaitOutcome::TimedOut(info)));
            }
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep_until(deadline.min(now + WAIT_POLL)) => {}
            }
        }
    }

    pub(crate) async fn list_streams(&self, prefix: &str, now_ms: i64) -> Result<Vec<Listed>, Fail> {
        if !text_ok(prefix) {
            return Ok(Vec::new());
        }
        let c = self.client().await?;
        let rows = match successor(prefix) {
            Some(end) => {
                let stmt = c
                    .prepare_cached(&format!(
                        "SELECT {COLS} FROM streams WHERE path >= $1 AND path < $2 AND NOT soft_deleted ORDER BY path"
                    ))
                    .await?;
                c.query(&stmt, &[&prefix, &end]).await?
            }
            None => {
                let stmt = c
                    .prepare_cached(&format!(
                        "SELECT {COLS} FROM streams WHERE path >= $1 AND NOT soft_deleted ORDER BY path"
                    ))
                    .await?;
                c.query(&stmt, &[&prefix]).await?
            }
        };
        let mut out = Vec::new();
        for r in &rows {
            let s = Stream::from_row(r)?;
            let Some(path) = s.path.as_ref().filter(|p| p.starts_with(prefix)) else { continue };
            if !self.expired(&s, now_ms) {
                out.push(Listed { info: s.meta.info(s.tail), path: path.clone() });
            }
        }
        Ok(out)
    }

    pub(crate) async fn compaction_candidates(&self, min_bytes: u64) -> Result<Vec<(String, Offset)>, Fail> {
        let c = self.client().await?;
        let stmt = c
            .prepare_cached(&format!("SELECT {COLS} FROM streams WHERE compaction AND NOT soft_deleted AND tail - earliest >= $1 ORDER BY path"))
            .await?;
        let now_ms = oncelog_storage::SystemClock::default().now_ms();
        let mut out = Vec::new();
        for r in &c.query(&stmt, &[&i64_of(min_bytes)]).await? {
            let s = Stream::from_row(r)?;
            let info = s.meta.info(s.tail);
            let Some(path) = s.path.clone() else { continue };
            if !self.expired(&s, now_ms) && compaction::is_candidate(&info, min_bytes) {
                out.push((path, s.tail));
            }
        }
        Ok(out)
    }

    pub(crate) async fn meta_scan(&self, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Bytes)>, Fail> {
        let c = self.client().await?;
        let stmt = c.prepare_cached("SELECT key, value FROM meta WHERE key >= $1 ORDER BY key").await?;
        let mut out = Vec::new();
        for r in &c.query(&stmt, &[&prefix]).await? {
            let key: Vec<u8> = r.get(0);
            if !key.starts_with(prefix) {
                break;
            }
            out.push((key, Bytes::copy_from_slice(r.get::<_, &[u8]>(1))));
        }
        Ok(out)
    }
}

/// How a row is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lock {
    None,
    Update,
    /// `FOR UPDATE SKIP LOCKED`: background work leaves a row another node is changing alone.
    SkipLocked,
}

/// The least string greater than every string starting with `prefix` (in code point order,
/// which "C"-collated UTF-8 sorts by), or `None` when there is none (empty prefix, or only
/// `char::MAX`s).
pub(crate) fn successor(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        let mut next = last as u32 + 1;
        if (0xD800..0xE000).contains(&next) {
            next = 0xE000;
        }
        if let Some(c) = char::from_u32(next) {
            chars.push(c);
            return Some(chars.into_iter().collect());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::successor;

    #[test]
    fn successors_bound_every_extension_of_a_prefix() {
        assert_eq!(successor("a/b"), Some("a/c".to_owned()));
        assert_eq!(successor(""), None);
        assert_eq!(successor("a\u{10FFFF}"), Some("b".to_owned()));
        assert_eq!(successor("\u{D7FF}"), Some("\u{E000}".to_owned()));
        for p in ["x", "x/", "é", "a\u{10FFFF}"] {
            let end = successor(p).expect("bounded");
            for ext in ["", "z", "\u{10FFFF}\u{10FFFF}"] {
                assert!(format!("{p}{ext}") < end, "{p}{ext} < {end}");
            }
        }
    }
}
