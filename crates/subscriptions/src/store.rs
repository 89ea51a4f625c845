//! The service's persistence in the engine's metadata map: the key layout, loading and
//! reloading the state, the compare-and-set guarded writes, and [`Subscriptions::retrying`],
//! which decides once more after a write lost to another process.
//!
//! Every write is a compare-and-set on the subscription's record as it was loaded (and on the
//! cursors it moves), so a change decided on stale state fails instead of overwriting; the
//! state is then reloaded before the next decision.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use sha2::Digest as _;
use tokio::sync::MutexGuard;

use super::codec;
use super::state::{Baseline, Entry, Filter, Inner};
use super::{Cursor, SubError, SubKind, SubRecord, Subscriptions};
use oncelog_storage::engine::{
    AppendOutcome, AppendRequest, Engine, MetaWrite, TxnError, TxnOutcome, TxnRequest, MAX_META_KEY_BYTES,
};

const SUB_PREFIX: &str = "sub/";
const CURSOR_PREFIX: &str = "cur/";
/// Cursors of streams whose path would make a `cur/` key longer than [`MAX_META_KEY_BYTES`]
/// (a path may be 4,096 bytes, a key 1,024): keyed by the path's SHA-256, the path in the value.
/// Every other cursor keeps the readable `cur/` key it always had, so nothing stored moves.
const LONG_CURSOR_PREFIX: &str = "curl/";
const NEXT_UID: &str = "seq/subscription";
/// A subscription's baseline (the tails at creation, [`crate::state::Baseline`]), in chunks:
/// `base/{uid:016x}/{chunk:08x}`. Written once, with the record that creates the subscription.
const BASELINE_PREFIX: &str = "base/";
/// Streams per baseline chunk: a chunk stays well under a megabyte (at most 20 bytes a stream).
const BASELINE_CHUNK: usize = 8_192;

/// A compare-and-set guard of [`TxnRequest::expect`].
type Guard = (Vec<u8>, Option<Bytes>);

fn sub_key(id: &str) -> Vec<u8> {
    format!("{SUB_PREFIX}{id}").into_bytes()
}

fn cursor_prefix(uid: u64) -> String {
    format!("{CURSOR_PREFIX}{uid:016x}/")
}

/// The key of the cursor of subscription `uid` at `path`, and whether it names the path only by
/// its digest (the value then carries the path).
fn cursor_key(uid: u64, path: &str) -> (Vec<u8>, bool) {
    let plain = format!("{}{path}", cursor_prefix(uid));
    if plain.len() <= MAX_META_KEY_BYTES {
        return (plain.into_bytes(), false);
    }
    let digest = sha2::Sha256::digest(path.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    (format!("{LONG_CURSOR_PREFIX}{uid:016x}/{hex}").into_bytes(), true)
}

/// The stored form of the cursor `c` of subscription `uid` at `path`: its key and value. Each
/// has one canonical encoding, so encoding what was loaded gives the stored bytes (what guards
/// compare).
fn cursor_entry(uid: u64, path: &str, c: &Cursor) -> (Vec<u8>, Bytes) {
    let (key, named) = cursor_key(uid, path);
    let value = if named { codec::encode_named_cursor(path, c) } else { codec::encode_cursor(c) };
    (key, value.into())
}

fn baseline_prefix(uid: u64) -> String {
    format!("{BASELINE_PREFIX}{uid:016x}/")
}

fn baseline_key(uid: u64, chunk: usize) -> Vec<u8> {
    format!("{}{chunk:08x}", baseline_prefix(uid)).into_bytes()
}

/// The writes that store the baseline of subscription `uid`.
fn baseline_writes(uid: u64, baseline: &Baseline) -> impl Iterator<Item = MetaWrite> + '_ {
    baseline.entries().chunks(BASELINE_CHUNK).enumerate().map(move |(i, chunk)| MetaWrite {
        key: baseline_key(uid, i),
        value: Some(codec::encode_baseline(chunk).into()),
    })
}

/// The metadata write that stores a subscription's record.
fn record_write(rec: &SubRecord) -> MetaWrite {
    MetaWrite { key: sub_key(&rec.id), value: Some(codec::encode(rec).into()) }
}

/// The guard that the cursor of `uid` at `path` is still `c` (`None`: absent).
fn cursor_guard(uid: u64, path: &str, c: Option<&Cursor>) -> Guard {
    match c {
        Some(c) => {
            let (key, value) = cursor_entry(uid, path, c);
            (key, Some(value))
        }
        None => (cursor_key(uid, path).0, None),
    }
}

/// The metadata write that stores one cursor of subscription `uid`.
fn cursor_write(uid: u64, path: &str, c: &Cursor) -> MetaWrite {
    let (key, value) = cursor_entry(uid, path, c);
    MetaWrite { key, value: Some(value) }
}

impl Entry {
    /// The write that stores the record as it is now; from then on these are the stored bytes.
    fn seal(&mut self) -> MetaWrite {
        let w = record_write(&self.rec);
        self.stored = w.value.clone().unwrap_or_default();
        w
    }

    /// What a write of this entry (over `self` as loaded) expects: the record unchanged, and
    /// the cursors at `paths` too (a change that leaves the record's bytes as they were, a
    /// heartbeat in the same millisecond, would otherwise not notice another's cursor moves).
    fn guards<'a>(&self, paths: impl IntoIterator<Item = &'a String>) -> Vec<Guard> {
        let mut out = vec![(sub_key(&self.rec.id), Some(self.stored.clone()))];
        out.extend(paths.into_iter().map(|p| cursor_guard(self.rec.uid, p, self.cursors.get(p))));
        out
    }
}

impl<E: Engine> Subscriptions<E> {
    // --- loading ------------------------------------------------------------------------------

    /// The state, loaded first if needed; over a shared engine reloaded on every call, because
    /// other processes change it.
    pub(super) async fn lock(&self) -> Result<MutexGuard<'_, Inner>, SubError> {
        let mut inner = self.inner.lock().await;
        if !inner.loaded || self.engine.shared() {
            self.reload(&mut inner).await?;
        }
        Ok(inner)
    }

    /// Runs `op`, one decision and its write, on the state freshly [locked](Self::lock); and
    /// once more, on the state locked anew, when it answers [`SubError::Conflict`]. A conflict
    /// means a guarded write found the stored state changed by someone else (another process
    /// over a shared engine, [`Engine::shared`]) before it was written, and marked the state for
    /// reload ([`Self::write`]): the first try decided on stale state, the second decides
    /// again, fencing included, on the state reloaded from the engine. Whatever the second try
    /// answers (a conflict again included), and any answer of the first but a conflict, is
    /// final. The lock is not held between the two tries.
    pub(super) async fn retrying<'s, T, F>(
        &'s self,
        mut op: impl FnMut(MutexGuard<'s, Inner>) -> F,
    ) -> Result<T, SubError>
    where
        F: Future<Output = Result<T, SubError>>,
    {
        match op(self.lock().await?).await {
            Err(SubError::Conflict) => op(self.lock().await?).await,
            r => r,
        }
    }

    /// Replaces the state with the engine's, keeping what only memory knows (what was sent, what
    /// is in flight, what is settled, when the next full pass is) for subscriptions that are
    /// still the same incarnation; then republishes the filters.
    pub(super) async fn reload(&self, inner: &mut Inner) -> Result<(), SubError> {
        let mut fresh = self.load(inner).await?;
        fresh.next_full_pass_ms = inner.next_full_pass_ms;
        for (id, e) in fresh.subs.iter_mut() {
            if let Some(old) = inner.subs.get(id).filter(|old| old.rec.uid == e.rec.uid) {
                e.sent = old.sent;
                e.in_flight = old.in_flight;
                // Settled only holds for the record it was found on.
                e.settled = old.settled && old.stored == e.stored;
            }
        }
        *inner = fresh;
        self.refresh(inner);
        Ok(())
    }

    /// The filters as last published (`None` before the state is loaded).
    pub(super) fn published(&self) -> Option<Arc<Vec<Filter>>> {
        self.filters.read().ok().and_then(|f| f.clone())
    }

    /// Republishes the filters after a change of `inner.subs`.
    pub(super) fn refresh(&self, inner: &Inner) {
        self.memo.keep_only(inner.subs.values().filter_map(|e| e.rec.config.pattern.as_deref()));
        let filters: Vec<Filter> = inner.subs.values().map(|e| Filter::of(&e.rec)).collect();
        if let Ok(mut f) = self.filters.write() {
            *f = Some(Arc::new(filters));
        }
    }

    /// The state as stored (memory-only fields at their defaults). Baselines never change
    /// once written: those of the incarnations `known` holds are taken from it, not read again.
    async fn load(&self, known: &Inner) -> Result<Inner, SubError> {
        let corrupt = |e: oncelog_storage::codec::DecodeError| SubError::Storage(e.into());
        let mut subs = BTreeMap::new();
        let mut by_uid = BTreeMap::new();
        for (_, v) in self.engine.meta_scan(SUB_PREFIX.as_bytes()).await? {
            let rec = codec::decode(&v).map_err(corrupt)?;
            by_uid.insert(rec.uid, rec.id.clone());
            subs.insert(rec.id.clone(), Entry::new(rec, v));
        }
        for (k, v) in self.engine.meta_scan(CURSOR_PREFIX.as_bytes()).await? {
            let key = String::from_utf8_lossy(&k[CURSOR_PREFIX.len()..]).into_owned();
            let Some((uid, path)) = key.split_once('/') else { continue };
            let Some(id) = u64::from_str_radix(uid, 16).ok().and_then(|u| by_uid.get(&u)) else { continue };
            if let Some(e) = subs.get_mut(id) {
                e.cursors.insert(path.to_owned(), codec::decode_cursor(&v).map_err(corrupt)?);
            }
        }
        for (k, v) in self.engine.meta_scan(LONG_CURSOR_PREFIX.as_bytes()).await? {
            let key = String::from_utf8_lossy(&k[LONG_CURSOR_PREFIX.len()..]).into_owned();
            let Some((uid, _digest)) = key.split_once('/') else { continue };
            let Some(uid) = u64::from_str_radix(uid, 16).ok() else { continue };
            let Some(id) = by_uid.get(&uid) else { continue };
            let (path, cursor) = codec::decode_named_cursor(&v).map_err(corrupt)?;
            // The key is the digest of the path the value names; anything else is damage.
            if cursor_key(uid, &path).0 != k {
                return Err(corrupt(oncelog_storage::codec::DecodeError::InvalidValue));
            }
            if let Some(e) = subs.get_mut(id) {
                e.cursors.insert(path, cursor);
            }
        }
        let mut baselines: Vec<Arc<Baseline>> = Vec::new();
        for e in subs.values_mut() {
            if let Some(old) = known.subs.get(&e.rec.id).filter(|old| old.rec.uid == e.rec.uid) {
                e.baseline = old.baseline.clone();
                continue;
            }
            let mut tails = Vec::new();
            for (_, v) in self.engine.meta_scan(baseline_prefix(e.rec.uid).as_bytes()).await? {
                tails.extend(codec::decode_baseline(&v).map_err(corrupt)?);
            }
            e.baseline = Baseline::share(Baseline::new(tails), &baselines);
            if !e.baseline.entries().is_empty() && !baselines.iter().any(|b| Arc::ptr_eq(b, &e.baseline)) {
                baselines.push(e.baseline.clone());
            }
        }
        let next_uid_stored = self.meta_get(NEXT_UID.as_bytes()).await?;
        let next_uid = match &next_uid_stored {
            Some(v) => codec::decode_uid(v).map_err(corrupt)?,
            None => 1,
        };
        Ok(Inner { loaded: true, subs, next_uid, next_uid_stored, next_full_pass_ms: 0 })
    }

    /// The value stored under exactly `key` (a scan of the key as a prefix, which it also is).
    pub(super) async fn meta_get(&self, key: &[u8]) -> Result<Option<Bytes>, SubError> {
        Ok(self.engine.meta_scan(key).await?.into_iter().find(|(k, _)| k == key).map(|(_, v)| v))
    }

    // --- writing ------------------------------------------------------------------------------

    /// Commits `txn`. A conflict means the state here is stale: it is reloaded on the next call.
    async fn write(&self, inner: &mut Inner, txn: TxnRequest) -> Result<TxnOutcome, TxnError> {
        let r = self.engine.transact(txn).await;
        if matches!(r, Err(TxnError::Conflict { .. })) {
            inner.loaded = false;
        }
        r
    }

    /// Stores the new subscription `entry`, incarnation `inner.next_uid`, with its cursors,
    /// provided nobody created its id, nor took that uid, meanwhile (the new uid's cursors are
    /// then ours alone); then moves the uid sequence on. Not yet in memory: the caller adds it.
    pub(super) async fn create(&self, inner: &mut Inner, entry: &mut Entry, now_ms: i64) -> Result<(), SubError> {
        let uid = entry.rec.uid;
        let expect =
            vec![(sub_key(&entry.rec.id), None), (NEXT_UID.as_bytes().to_vec(), inner.next_uid_stored.clone())];
        let next_uid = Bytes::from(codec::encode_uid(uid + 1));
        let mut meta = vec![MetaWrite { key: NEXT_UID.as_bytes().to_vec(), value: Some(next_uid.clone()) }];
        meta.extend(entry.cursors.iter().map(|(p, c)| cursor_write(uid, p, c)));
        meta.extend(baseline_writes(uid, &entry.baseline));
        meta.push(entry.seal());
        self.write(inner, TxnRequest { expect, meta, now_ms, ..Default::default() }).await?;
        inner.next_uid = uid + 1;
        inner.next_uid_stored = Some(next_uid);
        Ok(())
    }

    /// Deletes the subscription `id` (which is in memory) and its cursors, provided its record
    /// is still as loaded (a change meanwhile, a new cursor say, is seen before deleting).
    pub(super) async fn remove(&self, inner: &mut Inner, id: &str, now_ms: i64) -> Result<(), SubError> {
        let e = inner.subs.get(id).ok_or(SubError::NotFound)?;
        let mut meta: Vec<MetaWrite> =
            e.cursors.keys().map(|p| MetaWrite { key: cursor_key(e.rec.uid, p).0, value: None }).collect();
        let chunks = e.baseline.len().div_ceil(BASELINE_CHUNK);
        meta.extend((0..chunks).map(|i| MetaWrite { key: baseline_key(e.rec.uid, i), value: None }));
        meta.push(MetaWrite { key: sub_key(id), value: None });
        let expect = e.guards([]);
        self.write(inner, TxnRequest { expect, meta, now_ms, ..Default::default() }).await?;
        inner.subs.remove(id);
        self.refresh(inner);
        Ok(())
    }

    /// Writes `next` (its record and the cursors at `cursors`) alone, guarded as
    /// [`Self::commit`] is; on success it replaces the entry in memory. Unlike a commit it does
    /// not notify the dispatcher: a change of links issues no wake.
    pub(super) async fn store(
        &self,
        inner: &mut Inner,
        mut next: Entry,
        cursors: &[String],
        now_ms: i64,
    ) -> Result<(), SubError> {
        let expect = inner.subs.get(&next.rec.id).ok_or(SubError::NotFound)?.guards(cursors);
        let mut meta: Vec<MetaWrite> =
            cursors.iter().filter_map(|p| next.cursors.get(p).map(|c| cursor_write(next.rec.uid, p, c))).collect();
        meta.push(next.seal());
        self.write(inner, TxnRequest { expect, meta, now_ms, ..Default::default() }).await?;
        inner.subs.insert(next.rec.id.clone(), next);
        self.refresh(inner);
        Ok(())
    }

    /// Writes `next` (its record and the cursors in `cursors`) with `appends`, as one
    /// transaction, provided the record and those cursors are still as the entry in memory has
    /// them (else [`SubError::Conflict`], and the state is reloaded on the next call); on
    /// success it replaces the entry in memory. A pull-wake event whose wake stream refuses it
    /// (deleted, closed) is dropped rather than blocking the wake: workers can still claim.
    pub(super) async fn commit(
        &self,
        inner: &mut Inner,
        mut next: Entry,
        cursors: &[String],
        outputs: Vec<AppendRequest>,
        event: Option<AppendRequest>,
        now_ms: i64,
    ) -> Result<Vec<AppendOutcome>, SubError> {
        let n = outputs.len();
        let expect = inner.subs.get(&next.rec.id).ok_or(SubError::NotFound)?.guards(cursors);
        let mut meta: Vec<MetaWrite> =
            cursors.iter().filter_map(|p| next.cursors.get(p).map(|c| cursor_write(next.rec.uid, p, c))).collect();
        meta.push(next.seal());
        let mut appends = outputs;
        let with_event = event.is_some();
        appends.extend(event);
        let txn = TxnRequest { meta, appends, now_ms, expect };
        let outcome = match self.write(inner, txn.clone()).await {
            Ok(o) => o,
            Err(TxnError::Append { index, error }) if index < n => {
                return Err(SubError::Append { index, stream: txn.appends[index].path.clone(), error });
            }
            Err(TxnError::Append { index, error }) if with_event && index == n => {
                tracing::warn!(stream = %txn.appends[index].path, %error, "wake event not written; the wake stands (workers can still claim)");
                let mut txn = txn;
                txn.appends.pop();
                self.write(inner, txn).await?
            }
            Err(e) => return Err(e.into()),
        };
        let webhook_wake = matches!(next.rec.config.kind, SubKind::Webhook { .. });
        inner.subs.insert(next.rec.id.clone(), next);
        self.refresh(inner);
        if webhook_wake {
            self.notify.notify_one();
        }
        let mut out = outcome.appends;
        out.truncate(n);
        Ok(out)
    }

    /// Commits a wake decided by a pass over many subscriptions (a write's, the dispatcher's);
    /// `false` when another process changed the subscription meanwhile (woke it, most likely):
    /// the state is reloaded and the pass goes on with the others rather than failing.
    pub(super) async fn commit_or_reload(
        &self,
        inner: &mut Inner,
        next: Entry,
        event: Option<AppendRequest>,
        now_ms: i64,
    ) -> Result<bool, SubError> {
        match self.commit(inner, next, &[], Vec::new(), event, now_ms).await {
            Ok(_) => Ok(true),
            Err(SubError::Conflict) => {
                self.reload(inner).await?;
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }
}
