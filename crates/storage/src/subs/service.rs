//! [`Subscriptions`]: the subscription state of one server, its decisions, and their persistence
//! through [`Engine::transact`].
//!
//! The state lives in memory behind one lock, loaded from the engine's metadata map on first
//! use; every change is written (one transaction) before it is applied in memory or answered, so
//! what a caller was told is durable. Nothing here reads a clock: `now_ms` comes with each call.
//!
//! Every write is a compare-and-set on the subscription's record as it was loaded (and on the
//! cursors it moves), so a change decided on stale state fails instead of overwriting. Over an
//! engine that several processes share ([`Engine::shared`]) the state is also reloaded on every
//! call, a conflicting change is decided once more on fresh state, and only the process holding
//! the dispatcher lease (`lease/dispatcher` in the metadata map) hands out webhook deliveries.
//!
//! Liveness is derived from time: a lease whose end has passed counts as ended at once, and a
//! record is written only when something new happens (a wake, a claim, an ack). Deadlines are
//! Unix ms in the records, so they survive restarts.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use oncelog_protocol::Offset;
use tokio::sync::{Mutex, Notify};

use super::*;
use crate::codec::subscription as codec;
use crate::{AppendOutcome, AppendRequest, Engine, MetaWrite, TxnError, TxnOutcome, TxnRequest};

const SUB_PREFIX: &str = "sub/";
const CURSOR_PREFIX: &str = "cur/";
const KEY_PREFIX: &str = "key/";
const NEXT_UID: &str = "seq/subscription";
/// Over a shared engine: which process hands out webhook deliveries, and until when
/// ([`encode_lease`]).
const LEASE_KEY: &str = "lease/dispatcher";
/// How long the dispatcher lease lasts unless renewed: how long webhooks wait when its holder
/// dies. Renewed once less than half of it is left, so passes (at least one a second) keep it.
pub const DISPATCH_LEASE_MS: i64 = 10_000;

/// A compare-and-set guard of [`TxnRequest::expect`].
type Guard = (Vec<u8>, Option<Bytes>);

/// Paths under this prefix are the server's own API, never linked.
pub const RESERVED_PREFIX: &str = "__ds/";

fn sub_key(id: &str) -> Vec<u8> {
    format!("{SUB_PREFIX}{id}").into_bytes()
}

fn cursor_prefix(uid: u64) -> String {
    format!("{CURSOR_PREFIX}{uid:016x}/")
}

fn cursor_key(uid: u64, path: &str) -> Vec<u8> {
    format!("{}{path}", cursor_prefix(uid)).into_bytes()
}

/// The metadata write that stores a subscription's record.
fn record_write(rec: &SubRecord) -> MetaWrite {
    MetaWrite { key: sub_key(&rec.id), value: Some(codec::encode(rec).into()) }
}

/// The guard that the cursor of `uid` at `path` is still `c` (`None`: absent). The cursor
/// codec has one canonical form, so encoding what was loaded gives the stored bytes.
fn cursor_guard(uid: u64, path: &str, c: Option<&Cursor>) -> Guard {
    (cursor_key(uid, path), c.map(|c| codec::encode_cursor(c).into()))
}

/// Dispatcher holder ids of this process that no live [`Subscriptions`] uses any more.
static FREE_NODE_IDS: std::sync::Mutex<Vec<u64>> = std::sync::Mutex::new(Vec::new());

/// A holder id for a new [`Subscriptions`]: distinct from every other live one
/// ([`crate::clock::unique_id`]). A dropped instance's id goes to the next one made in this
/// process: that is the same dispatcher reopened, and it takes its own lease over at once
/// instead of waiting out [`DISPATCH_LEASE_MS`].
fn take_node_id() -> u64 {
    FREE_NODE_IDS.lock().ok().and_then(|mut f| f.pop()).unwrap_or_else(crate::clock::unique_id)
}

/// The metadata write that stores one cursor of subscription `uid`.
fn cursor_write(uid: u64, path: &str, c: &Cursor) -> MetaWrite {
    MetaWrite { key: cursor_key(uid, path), value: Some(codec::encode_cursor(c).into()) }
}

/// Whether a path may be linked at all.
fn linkable(path: &str) -> bool {
    !path.is_empty() && !path.starts_with(RESERVED_PREFIX) && path != "__ds"
}

impl SubConfig {
    /// Checks and normalizes a configuration as received.
    pub fn normalized(mut self) -> Result<SubConfig, InvalidSub> {
        self.pattern = match self.pattern {
            Some(p) => Some(glob::check(&p)?).filter(|p| !p.is_empty()),
            None => None,
        };
        self.streams.sort();
        self.streams.dedup();
        self.outputs.sort();
        self.outputs.dedup();
        if self.pattern.is_none() && self.streams.is_empty() {
            return Err(InvalidSub::NoTarget);
        }
        if !(MIN_LEASE_TTL_MS..=MAX_LEASE_TTL_MS).contains(&self.lease_ttl_ms) {
            return Err(InvalidSub::LeaseTtl);
        }
        if self.streams.iter().any(|s| !linkable(s)) {
            return Err(InvalidSub::BadPath);
        }
        if let SubKind::PullWake { wake_stream } = &self.kind {
            if wake_stream.is_empty() {
                return Err(InvalidSub::BadPath);
            }
        }
        Ok(self)
    }
}

/// A subscription id as it may appear in a URL segment.
pub fn valid_id(id: &str) -> Result<(), InvalidSub> {
    if id.is_empty() || id.len() > 256 || id.contains('/') {
        return Err(InvalidSub::BadId);
    }
    Ok(())
}

/// One subscription in memory.
#[derive(Debug, Clone)]
struct Entry {
    rec: SubRecord,
    /// The record's bytes as stored (loaded, or last written here): what every write expects to
    /// find, byte for byte, so that it fails if someone else changed the record meanwhile. Kept
    /// rather than re-encoded: a record written by an older version decodes, but would not
    /// encode back to the same bytes.
    stored: Bytes,
    cursors: BTreeMap<String, Cursor>,
    /// The generation last handed to the dispatcher (memory only: after a restart a live wake is
    /// delivered again, with the same generation, which receivers treat as a repeat).
    sent: u64,
    /// A delivery of the current wake is in flight.
    in_flight: bool,
    /// Memory only: the last look found no wake and nothing pending, and nothing that could
    /// change that has happened since except through paths that look again themselves (writes
    /// via [`Subscriptions::on_write`], acks, releases). The dispatcher's pass skips it, but for
    /// a full pass every [`FULL_PASS_MS`].
    settled: bool,
}

/// How often the dispatcher's pass looks at every subscription, settled ones included: the
/// safety net for tails that moved without [`Subscriptions::on_write`] (a crash between an
/// append and its wake, a compaction's snapshot, a failed wake).
pub const FULL_PASS_MS: i64 = 10_000;

/// Whether a subscription with these explicit links, pattern and wake stream links `path`
/// (before looking at whether a stream exists there). A pull-wake subscription never links its
/// own wake stream: each wake event would be new work for the next wake, without end.
fn links(explicit: &BTreeSet<String>, pattern: Option<&str>, wake_stream: Option<&str>, path: &str) -> bool {
    if !linkable(path) || wake_stream == Some(path) {
        return false;
    }
    explicit.contains(path) || pattern.is_some_and(|p| glob::matches(p, path))
}

fn wake_stream(rec: &SubRecord) -> Option<&str> {
    match &rec.config.kind {
        SubKind::PullWake { wake_stream } => Some(wake_stream),
        SubKind::Webhook { .. } => None,
    }
}

/// What a stream write consults without taking the lock: what a subscription links, and until
/// when a write cannot wake it (its current wake is live, or a webhook retry is pending).
#[derive(Debug, Clone)]
struct Filter {
    explicit: BTreeSet<String>,
    pattern: Option<String>,
    wake_stream: Option<String>,
    quiet_until_ms: i64,
}

impl Filter {
    fn of(rec: &SubRecord) -> Filter {
        let lease = match &rec.wake {
            // An unclaimed pull wake waits for a claim without end.
            Some(w) => w.lease_until_ms.unwrap_or(i64::MAX),
            None => i64::MIN,
        };
        let retry = if rec.failures > 0 { rec.next_attempt_ms } else { i64::MIN };
        Filter {
            explicit: rec.explicit.clone(),
            pattern: rec.config.pattern.clone(),
            wake_stream: wake_stream(rec).map(str::to_owned),
            quiet_until_ms: lease.max(retry),
        }
    }

    /// Whether a write to `path` at `now_ms` may wake this subscription.
    fn may_wake(&self, path: &str, now_ms: i64) -> bool {
        now_ms >= self.quiet_until_ms && links(&self.explicit, self.pattern.as_deref(), self.wake_stream.as_deref(), path)
    }
}

impl Entry {
    fn new(rec: SubRecord, stored: Bytes) -> Entry {
        Entry { rec, stored, cursors: BTreeMap::new(), sent: 0, in_flight: false, settled: false }
    }

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

    fn links_path(&self, path: &str) -> bool {
        links(&self.rec.explicit, self.rec.config.pattern.as_deref(), wake_stream(&self.rec), path)
    }

    /// Where processing of the stream `stream_id` at `path` stands: its cursor when it refers to
    /// that incarnation, else the beginning.
    fn acked(&self, path: &str, stream_id: u64) -> Offset {
        match self.cursors.get(path) {
            Some(c) if c.stream_id == stream_id => c.acked,
            _ => Offset::ZERO,
        }
    }
}

#[derive(Default)]
struct Inner {
    /// `false` also after a write found the stored state changed: the next call reloads.
    loaded: bool,
    subs: BTreeMap<String, Entry>,
    next_uid: u64,
    /// `next_uid` as stored (`None`: never stored), what a create expects.
    next_uid_stored: Option<Bytes>,
    /// Opaque secrets of the layer above (signing keys), by name.
    keys: BTreeMap<String, Bytes>,
    /// When the dispatcher's pass next looks at every subscription ([`FULL_PASS_MS`]).
    next_full_pass_ms: i64,
}

/// Verdict of [`Subscriptions::put`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutVerdict {
    Created,
    Existing,
}

/// A wake handed to a worker: by claim, or in a webhook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WakeNotice {
    pub id: String,
    pub uid: u64,
    pub generation: u64,
    pub wake_id: String,
    /// The linked streams with pending work.
    pub streams: Vec<Link>,
    pub lease_ttl_ms: u32,
    /// Webhook subscriptions: where to deliver it.
    pub url: Option<String>,
    /// Deliveries that failed in a row before this one (sets the next backoff).
    pub failures: u32,
}

/// What an ack, callback or commit did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AckOutcome {
    /// A new wake was issued at once: work arrived after the acknowledged wake began.
    pub next_wake: bool,
    /// A transactional commit of a wake that had already ended with it: nothing done again.
    pub duplicate: bool,
    /// Outcomes of a commit's appends (empty otherwise, and for a duplicate).
    pub appends: Vec<AppendOutcome>,
}

/// How an ack arrives: each is valid for one kind of subscription only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckVia {
    /// `…/callback` with a webhook callback token.
    Callback,
    /// `…/ack` with a claim token.
    Ack,
    /// `…/commit` (either kind): acks with output appends.
    Commit,
}

/// An ack, callback or commit as [`Subscriptions::ack`] takes it.
#[derive(Debug, Clone)]
pub struct AckRequest {
    pub fence: Fence,
    pub acks: Vec<Ack>,
    /// The worker is finished with this wake.
    pub done: bool,
    pub via: AckVia,
    /// A commit's output appends (empty for acks and callbacks).
    pub outputs: Vec<AppendRequest>,
}

/// Work for the webhook dispatcher.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Due {
    pub deliveries: Vec<WakeNotice>,
    /// The next time something becomes due without a new event (a lease end, a retry time).
    pub next_deadline_ms: Option<i64>,
}

/// The subscriptions of one server over one engine.
pub struct Subscriptions<E> {
    engine: Arc<E>,
    inner: Mutex<Inner>,
    /// One [`Filter`] per subscription, replaced after every change (`None` until the state is
    /// loaded): a write to a stream no subscription could be woken by (none exists, or each
    /// holds a live wake: the common case under load) takes no lock.
    filters: std::sync::RwLock<Option<Arc<Vec<Filter>>>>,
    /// Notified when a webhook wake is issued or a delivery schedule changes.
    pub notify: Notify,
    /// Who this instance is in the dispatcher lease ([`take_node_id`]).
    node: u64,
    /// Over a shared engine: the last pass of [`Self::due`] held the dispatcher lease.
    dispatching: AtomicBool,
}

impl<E> Drop for Subscriptions<E> {
    fn drop(&mut self) {
        if let Ok(mut free) = FREE_NODE_IDS.lock() {
            free.push(self.node);
        }
    }
}

/// Runs `op`, and once more after a [`SubError::Conflict`]: the first try decided on state that
/// another process changed before it was written (the conflict marked it for reload), the
/// second decides again, fencing included, on the state reloaded from the engine.
async fn retried<T, F: Future<Output = Result<T, SubError>>>(mut op: impl FnMut() -> F) -> Result<T, SubError> {
    match op().await {
        Err(SubError::Conflict) => op().await,
        r => r,
    }
}

impl<E: Engine> Subscriptions<E> {
    pub fn new(engine: Arc<E>) -> Self {
        Subscriptions {
            engine,
            inner: Mutex::new(Inner::default()),
            filters: Default::default(),
            notify: Notify::new(),
            node: take_node_id(),
            dispatching: AtomicBool::new(false),
        }
    }

    /// Whether other processes may change the state too ([`Engine::shared`]).
    pub fn is_shared(&self) -> bool {
        self.engine.shared()
    }

    /// Whether this instance hands out webhook deliveries: always over an engine of its own;
    /// over a shared one, when its last [`Self::due`] held the dispatcher lease. Cheap.
    pub fn is_dispatcher(&self) -> bool {
        !self.engine.shared() || self.dispatching.load(Ordering::Relaxed)
    }

    /// The state, loaded first if needed; over a shared engine reloaded on every call, because
    /// other processes change it.
    async fn lock(&self) -> Result<tokio::sync::MutexGuard<'_, Inner>, SubError> {
        let mut inner = self.inner.lock().await;
        if !inner.loaded || self.engine.shared() {
            self.reload(&mut inner).await?;
        }
        Ok(inner)
    }

    /// Replaces the state with the engine's, keeping what only memory knows (what was sent, what
    /// is in flight, what is settled, when the next full pass is) for subscriptions that are
    /// still the same incarnation; then republishes the filters.
    async fn reload(&self, inner: &mut Inner) -> Result<(), SubError> {
        let mut fresh = self.load().await?;
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

    /// How many subscriptions exist (as of the last change; 0 before they are loaded). Cheap.
    pub fn count(&self) -> usize {
        self.published().map_or(0, |f| f.len())
    }

    /// The filters as last published (`None` before the state is loaded).
    fn published(&self) -> Option<Arc<Vec<Filter>>> {
        self.filters.read().ok().and_then(|f| f.clone())
    }

    /// Republishes the filters after a change of `inner.subs`.
    fn refresh(&self, inner: &Inner) {
        let filters: Vec<Filter> = inner.subs.values().map(|e| Filter::of(&e.rec)).collect();
        if let Ok(mut f) = self.filters.write() {
            *f = Some(Arc::new(filters));
        }
    }

    /// The state as stored (memory-only fields at their defaults).
    async fn load(&self) -> Result<Inner, SubError> {
        let corrupt = |e: crate::codec::DecodeError| SubError::Storage(e.into());
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
        let next_uid_stored = self.meta_get(NEXT_UID.as_bytes()).await?;
        let next_uid = match &next_uid_stored {
            Some(v) => codec::decode_uid(v).map_err(corrupt)?,
            None => 1,
        };
        let mut keys = BTreeMap::new();
        for (k, v) in self.engine.meta_scan(KEY_PREFIX.as_bytes()).await? {
            keys.insert(String::from_utf8_lossy(&k[KEY_PREFIX.len()..]).into_owned(), v);
        }
        Ok(Inner { loaded: true, subs, next_uid, next_uid_stored, keys, next_full_pass_ms: 0 })
    }

    /// The value stored under exactly `key` (a scan of the key as a prefix, which it also is).
    async fn meta_get(&self, key: &[u8]) -> Result<Option<Bytes>, SubError> {
        Ok(self.engine.meta_scan(key).await?.into_iter().find(|(k, _)| k == key).map(|(_, v)| v))
    }

    /// Commits `txn`. A conflict means the state here is stale: it is reloaded on the next call.
    async fn write(&self, inner: &mut Inner, txn: TxnRequest) -> Result<TxnOutcome, TxnError> {
        let r = self.engine.transact(txn).await;
        if matches!(r, Err(TxnError::Conflict { .. })) {
            inner.loaded = false;
        }
        r
    }

    // --- the secrets of the layer above -------------------------------------------------------

    /// Every stored secret, by name.
    pub async fn keys(&self) -> Result<BTreeMap<String, Bytes>, SubError> {
        Ok(self.lock().await?.keys.clone())
    }

    /// Stores a secret under `name` unless one is there; answers the one stored. When another
    /// process stored one first, that one is answered: every process then uses the same.
    pub async fn key_or_insert(&self, name: &str, value: Bytes, now_ms: i64) -> Result<Bytes, SubError> {
        let mut inner = self.lock().await?;
        if let Some(v) = inner.keys.get(name) {
            return Ok(v.clone());
        }
        let key = format!("{KEY_PREFIX}{name}").into_bytes();
        let expect = vec![(key.clone(), None)];
        let txn = TxnRequest { expect, meta: vec![MetaWrite { key, value: Some(value.clone()) }], now_ms, ..Default::default() };
        match self.write(&mut inner, txn).await {
            Ok(_) => {
                inner.keys.insert(name.to_owned(), value.clone());
                Ok(value)
            }
            Err(TxnError::Conflict { .. }) => {
                self.reload(&mut inner).await?;
                // Gone again already (removed meanwhile): the caller may try again.
                inner.keys.get(name).cloned().ok_or(SubError::Conflict)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Forgets stored secrets. Unguarded: removing what is gone already is no harm.
    pub async fn remove_keys(&self, names: &[String], now_ms: i64) -> Result<(), SubError> {
        let mut inner = self.lock().await?;
        let meta = names.iter().map(|n| MetaWrite { key: format!("{KEY_PREFIX}{n}").into_bytes(), value: None }).collect();
        self.write(&mut inner, TxnRequest { meta, now_ms, ..Default::default() }).await?;
        for n in names {
            inner.keys.remove(n);
        }
        Ok(())
    }

    // --- configuration ------------------------------------------------------------------------

    /// Creates the subscription `id`, or confirms it when it exists with the same configuration.
    /// New links start at the linked streams' current tails (backfill).
    pub async fn put(&self, id: &str, config: SubConfig, now_ms: i64) -> Result<(PutVerdict, SubView), SubError> {
        valid_id(id)?;
        let config = config.normalized()?;
        retried(|| self.put_once(id, &config, now_ms)).await
    }

    async fn put_once(&self, id: &str, config: &SubConfig, now_ms: i64) -> Result<(PutVerdict, SubView), SubError> {
        let mut inner = self.lock().await?;
        if let Some(e) = inner.subs.get(id) {
            if e.rec.config != *config {
                return Err(SubError::AlreadyExists);
            }
            let view = self.view(e, now_ms).await?;
            return Ok((PutVerdict::Existing, view));
        }
        let uid = inner.next_uid;
        let rec = SubRecord {
            uid,
            id: id.to_owned(),
            explicit: config.streams.iter().cloned().collect(),
            config: config.clone(),
            created_ms: now_ms,
            generation: 0,
            wake: None,
            last_done: 0,
            failures: 0,
            next_attempt_ms: 0,
        };
        let mut entry = Entry::new(rec, Bytes::new());
        for link in self.links(&entry, now_ms).await? {
            if link.stream_id != 0 {
                entry.cursors.insert(link.path, Cursor { stream_id: link.stream_id, acked: link.tail });
            }
        }
        // Nobody created this id, nor took this uid, meanwhile (the new uid's cursors are then
        // ours alone).
        let expect = vec![(sub_key(id), None), (NEXT_UID.as_bytes().to_vec(), inner.next_uid_stored.clone())];
        let next_uid = Bytes::from(codec::encode_uid(uid + 1));
        let mut meta = vec![MetaWrite { key: NEXT_UID.as_bytes().to_vec(), value: Some(next_uid.clone()) }];
        meta.extend(entry.cursors.iter().map(|(p, c)| cursor_write(uid, p, c)));
        meta.push(entry.seal());
        self.write(&mut inner, TxnRequest { expect, meta, now_ms, ..Default::default() }).await?;
        inner.next_uid = uid + 1;
        inner.next_uid_stored = Some(next_uid);
        let view = self.view(&entry, now_ms).await?;
        inner.subs.insert(id.to_owned(), entry);
        self.refresh(&inner);
        Ok((PutVerdict::Created, view))
    }

    pub async fn get(&self, id: &str, now_ms: i64) -> Result<SubView, SubError> {
        let inner = self.lock().await?;
        let e = inner.subs.get(id).ok_or(SubError::NotFound)?;
        self.view(e, now_ms).await
    }

    /// The subscription's record, without looking at its streams (cheaper than [`Self::get`]).
    pub async fn record(&self, id: &str) -> Result<SubRecord, SubError> {
        let inner = self.lock().await?;
        inner.subs.get(id).map(|e| e.rec.clone()).ok_or(SubError::NotFound)
    }

    /// Every subscription, by id.
    pub async fn list(&self) -> Result<Vec<SubRecord>, SubError> {
        Ok(self.lock().await?.subs.values().map(|e| e.rec.clone()).collect())
    }

    /// Deletes the subscription and its cursors; `false` when there was none.
    pub async fn delete(&self, id: &str, now_ms: i64) -> Result<bool, SubError> {
        retried(|| self.delete_once(id, now_ms)).await
    }

    async fn delete_once(&self, id: &str, now_ms: i64) -> Result<bool, SubError> {
        let mut inner = self.lock().await?;
        let Some(e) = inner.subs.get(id) else { return Ok(false) };
        let mut meta: Vec<MetaWrite> = e.cursors.keys().map(|p| MetaWrite { key: cursor_key(e.rec.uid, p), value: None }).collect();
        meta.push(MetaWrite { key: sub_key(id), value: None });
        // The record as loaded: a change meanwhile (a new cursor, say) is seen before deleting.
        let expect = e.guards([]);
        self.write(&mut inner, TxnRequest { expect, meta, now_ms, ..Default::default() }).await?;
        inner.subs.remove(id);
        self.refresh(&inner);
        Ok(true)
    }

    /// Adds explicit links (at the streams' current tails) and removes others; both idempotent.
    /// Removing an explicit link keeps the stream linked when the pattern matches it.
    pub async fn relink(&self, id: &str, add: Vec<String>, remove: Vec<String>, now_ms: i64) -> Result<(), SubError> {
        if add.iter().chain(&remove).any(|p| !linkable(p)) {
            return Err(InvalidSub::BadPath.into());
        }
        retried(|| self.relink_once(id, &add, &remove, now_ms)).await
    }

    async fn relink_once(&self, id: &str, add: &[String], remove: &[String], now_ms: i64) -> Result<(), SubError> {
        let mut inner = self.lock().await?;
        let e = inner.subs.get(id).ok_or(SubError::NotFound)?;
        let mut next = e.clone();
        let mut cursor_writes = Vec::new();
        for path in add {
            if next.rec.explicit.insert(path.clone()) && !e.links_path(path) {
                if let Ok(info) = self.engine.head(path, now_ms).await {
                    let c = Cursor { stream_id: info.id, acked: info.tail };
                    next.cursors.insert(path.clone(), c);
                    cursor_writes.push((path.clone(), c));
                }
            }
        }
        for path in remove {
            next.rec.explicit.remove(path);
        }
        next.settled = false;
        if next.rec.explicit == e.rec.explicit {
            return Ok(());
        }
        let expect = e.guards(cursor_writes.iter().map(|(p, _)| p));
        let mut meta: Vec<MetaWrite> = cursor_writes.iter().map(|(p, c)| cursor_write(next.rec.uid, p, c)).collect();
        meta.push(next.seal());
        self.write(&mut inner, TxnRequest { expect, meta, now_ms, ..Default::default() }).await?;
        inner.subs.insert(id.to_owned(), next);
        self.refresh(&inner);
        Ok(())
    }

    // --- views --------------------------------------------------------------------------------

    /// The linked streams of `e` now: explicit ones (also where no stream exists) and the
    /// pattern's matches, explicit first when both.
    async fn links(&self, e: &Entry, now_ms: i64) -> Result<Vec<Link>, SubError> {
        let mut out: BTreeMap<String, Link> = BTreeMap::new();
        if let Some(pattern) = &e.rec.config.pattern {
            for l in self.engine.list_streams(&glob::literal_prefix(pattern), now_ms).await? {
                if links(&BTreeSet::new(), Some(pattern), wake_stream(&e.rec), &l.path) {
                    let acked = e.acked(&l.path, l.info.id);
                    out.insert(l.path.clone(), Link { path: l.path, link_type: LinkType::Glob, stream_id: l.info.id, acked, tail: l.info.tail });
                }
            }
        }
        for path in &e.rec.explicit {
            let (stream_id, tail) = match self.engine.head(path, now_ms).await {
                Ok(info) => (info.id, info.tail),
                Err(crate::LookupError::Storage(s)) => return Err(s.into()),
                Err(_) => (0, Offset::ZERO),
            };
            let acked = if stream_id == 0 { Offset::ZERO } else { e.acked(path, stream_id) };
            out.insert(path.clone(), Link { path: path.clone(), link_type: LinkType::Explicit, stream_id, acked, tail });
        }
        Ok(out.into_values().collect())
    }

    async fn view(&self, e: &Entry, now_ms: i64) -> Result<SubView, SubError> {
        Ok(SubView { record: e.rec.clone(), links: self.links(e, now_ms).await? })
    }

    async fn notice(&self, e: &Entry, generation: u64, now_ms: i64) -> Result<WakeNotice, SubError> {
        let streams = self.links(e, now_ms).await?.into_iter().filter(Link::has_pending).collect();
        Ok(WakeNotice {
            id: e.rec.id.clone(),
            uid: e.rec.uid,
            generation,
            wake_id: e.rec.wake_id(generation),
            streams,
            lease_ttl_ms: e.rec.config.lease_ttl_ms,
            url: match &e.rec.config.kind {
                SubKind::Webhook { url } => Some(url.clone()),
                SubKind::PullWake { .. } => None,
            },
            failures: e.rec.failures,
        })
    }

    // --- wakes --------------------------------------------------------------------------------

    /// Issues the next wake of `next` if it has none live, is not waiting for a delivery retry,
    /// and has pending work: the changes go into `next`, the wake event (pull-wake) is returned
    /// as the append to make with them.
    async fn plan_wake(&self, next: &mut Entry, trigger: Option<&str>, now_ms: i64) -> Result<Option<Option<AppendRequest>>, SubError> {
        if next.rec.live_wake(now_ms).is_some() {
            return Ok(None);
        }
        let webhook = matches!(next.rec.config.kind, SubKind::Webhook { .. });
        if webhook && next.rec.failures > 0 && now_ms < next.rec.next_attempt_ms {
            return Ok(None);
        }
        let pending: Vec<Link> = self.links(next, now_ms).await?.into_iter().filter(Link::has_pending).collect();
        if pending.is_empty() {
            // An expired wake with nothing left to do simply ends.
            if next.rec.wake.is_some() {
                next.rec.wake = None;
                return Ok(Some(None));
            }
            return Ok(None);
        }
        let generation = next.rec.generation + 1;
        next.rec.generation = generation;
        let lease_until_ms = webhook.then(|| now_ms.saturating_add(i64::from(next.rec.config.lease_ttl_ms)));
        let snapshot = pending.iter().map(|l| (l.path.clone(), l.stream_id, l.tail)).collect();
        next.rec.wake = Some(Wake { generation, holder: None, lease_until_ms, snapshot });
        let event = match &next.rec.config.kind {
            SubKind::Webhook { .. } => None,
            SubKind::PullWake { wake_stream } => {
                let stream = trigger.unwrap_or(&pending[0].path);
                let msg = serde_json::json!({
                    "type": "wake",
                    "subscription_id": next.rec.id,
                    "stream": stream,
                    "generation": generation,
                    "ts": now_ms,
                });
                Some(AppendRequest::plain(wake_stream.clone(), "application/json", true, Bytes::from(format!("{msg},")), now_ms))
            }
        };
        Ok(Some(event))
    }

    /// Writes `next` (its record and the cursors in `cursors`) with `appends`, as one
    /// transaction, provided the record and those cursors are still as the entry in memory has
    /// them (else [`SubError::Conflict`], and the state is reloaded on the next call); on
    /// success it replaces the entry in memory. A pull-wake event whose wake stream refuses it
    /// (deleted, closed) is dropped rather than blocking the wake: workers can still claim.
    async fn commit(
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
        let mut meta: Vec<MetaWrite> = cursors.iter().filter_map(|p| next.cursors.get(p).map(|c| cursor_write(next.rec.uid, p, c))).collect();
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

    /// After a write to `path`: wakes the subscriptions linked to it that have no live wake.
    /// Wake events may themselves be writes to linked streams; those are followed too (each
    /// subscription wakes at most once, so this ends).
    pub async fn on_write(&self, path: &str, now_ms: i64) -> Result<(), SubError> {
        // Loaded, and no subscription can be woken by this write: nothing to do, no lock.
        if self.published().is_some_and(|f| !f.iter().any(|f| f.may_wake(path, now_ms))) {
            return Ok(());
        }
        let mut inner = self.lock().await?;
        let mut todo = vec![path.to_owned()];
        let mut woken = BTreeSet::new();
        while let Some(path) = todo.pop() {
            let ids: Vec<String> = inner.subs.values().filter(|e| !woken.contains(&e.rec.id) && e.links_path(&path)).map(|e| e.rec.id.clone()).collect();
            for id in ids {
                let Some(e) = inner.subs.get(&id) else { continue };
                let mut next = e.clone();
                if let Some(event) = self.plan_wake(&mut next, Some(&path), now_ms).await? {
                    woken.insert(id);
                    let event_path = event.as_ref().map(|ev| ev.path.clone());
                    if self.commit_or_reload(&mut inner, next, event, now_ms).await? {
                        todo.extend(event_path);
                    }
                }
            }
        }
        Ok(())
    }

    /// Commits a wake decided by a pass over many subscriptions (a write's, the dispatcher's);
    /// `false` when another process changed the subscription meanwhile (woke it, most likely):
    /// the state is reloaded and the pass goes on with the others rather than failing.
    async fn commit_or_reload(&self, inner: &mut Inner, next: Entry, event: Option<AppendRequest>, now_ms: i64) -> Result<bool, SubError> {
        match self.commit(inner, next, &[], Vec::new(), event, now_ms).await {
            Ok(_) => Ok(true),
            Err(SubError::Conflict) => {
                self.reload(inner).await?;
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    // --- pull-wake workers --------------------------------------------------------------------

    /// A worker claims the current wake (or, with pending work and none live, a new one). The
    /// worker holding it may claim again (a retry after a lost answer): same wake, lease renewed.
    pub async fn claim(&self, id: &str, worker: &str, now_ms: i64) -> Result<WakeNotice, SubError> {
        retried(|| self.claim_once(id, worker, now_ms)).await
    }

    async fn claim_once(&self, id: &str, worker: &str, now_ms: i64) -> Result<WakeNotice, SubError> {
        let mut inner = self.lock().await?;
        let e = inner.subs.get(id).ok_or(SubError::NotFound)?;
        if !matches!(e.rec.config.kind, SubKind::PullWake { .. }) {
            return Err(SubError::WrongType { needs: "pull-wake" });
        }
        let mut next = e.clone();
        if let Some(w) = e.rec.live_wake(now_ms) {
            // The holder claiming again (its answer was lost) gets the same wake back.
            if let Some(holder) = w.holder.as_ref().filter(|h| h.as_str() != worker) {
                return Err(SubError::AlreadyClaimed { holder: holder.clone(), generation: w.generation });
            }
        } else if self.plan_wake(&mut next, None, now_ms).await?.is_none() || next.rec.wake.is_none() {
            return Err(SubError::NoPendingWork);
        }
        let ttl = i64::from(next.rec.config.lease_ttl_ms);
        let generation = match next.rec.wake.as_mut() {
            Some(w) => {
                w.holder = Some(worker.to_owned());
                w.lease_until_ms = Some(now_ms.saturating_add(ttl));
                w.generation
            }
            None => return Err(SubError::NoPendingWork),
        };
        let notice = self.notice(&next, generation, now_ms).await?;
        self.commit(&mut inner, next, &[], Vec::new(), None, now_ms).await?;
        Ok(notice)
    }

    /// Checks `fence` against the subscription's current wake.
    fn fenced(e: &Entry, fence: &Fence, via: AckVia, now_ms: i64) -> Result<(), SubError> {
        let kind_ok = match via {
            AckVia::Callback => matches!(e.rec.config.kind, SubKind::Webhook { .. }),
            AckVia::Ack => matches!(e.rec.config.kind, SubKind::PullWake { .. }),
            AckVia::Commit => true,
        };
        if !kind_ok {
            return Err(SubError::WrongType { needs: if via == AckVia::Callback { "webhook" } else { "pull-wake" } });
        }
        if fence.uid != e.rec.uid {
            return Err(SubError::TokenInvalid);
        }
        let w = e.rec.live_wake(now_ms).ok_or(SubError::Fenced)?;
        let current = fence.token_generation == w.generation && fence.generation == w.generation && fence.wake_id == e.rec.wake_id(w.generation);
        // A pull wake is acted on only by its claimant (a webhook's receiver holds it at once).
        let held = matches!(e.rec.config.kind, SubKind::Webhook { .. }) || w.holder.is_some();
        if !current || !held {
            return Err(SubError::Fenced);
        }
        Ok(())
    }

    /// Applies `acks` to `next` (all checked before any applies); returns the paths moved.
    async fn apply_acks(&self, next: &mut Entry, acks: &[Ack], now_ms: i64) -> Result<Vec<String>, SubError> {
        let links = self.links(next, now_ms).await?;
        let mut moved = Vec::new();
        for a in acks {
            let invalid = |why| SubError::InvalidOffset { stream: a.stream.clone(), why };
            let link = links.iter().find(|l| l.path == a.stream && l.stream_id != 0).ok_or_else(|| invalid("not a linked stream"))?;
            if a.offset > link.tail {
                return Err(invalid("beyond the stream's tail"));
            }
            let current = next.acked(&a.stream, link.stream_id);
            if a.offset < current {
                return Err(invalid("behind the acknowledged offset: cursors never move back"));
            }
            if a.offset > current {
                next.cursors.insert(a.stream.clone(), Cursor { stream_id: link.stream_id, acked: a.offset });
                moved.push(a.stream.clone());
            }
        }
        Ok(moved)
    }

    /// An ack (`…/ack`), a callback (`…/callback`) or a transactional commit (`…/commit`, with
    /// `outputs`): acks move cursors; `done` ends the wake (and issues the next one at once when
    /// work remains); without it the lease is extended. The outputs, the cursors and the wake
    /// change are one transaction.
    pub async fn ack(&self, id: &str, req: AckRequest, now_ms: i64) -> Result<AckOutcome, SubError> {
        let (outcome, wake_path) = retried(|| self.ack_once(id, req.clone(), now_ms)).await?;
        if let Some(p) = wake_path {
            match self.on_write(&p, now_ms).await {
                // The ack is in; a wake event that another process's change got in the way of
                // is that process's to follow (or the dispatcher's next pass).
                Ok(()) | Err(SubError::Conflict) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(outcome)
    }

    /// [`Self::ack`] up to its commit; also answers where a wake event was appended, a write that
    /// may wake other subscriptions.
    async fn ack_once(&self, id: &str, req: AckRequest, now_ms: i64) -> Result<(AckOutcome, Option<String>), SubError> {
        let AckRequest { fence, acks, done, via, outputs } = req;
        let (fence, acks) = (&fence, &acks[..]);
        let mut inner = self.lock().await?;
        let e = inner.subs.get(id).ok_or(SubError::NotFound)?;
        if let Err(err) = Self::fenced(e, fence, via, now_ms) {
            // A retried commit of the wake that ended with it: its acks (hence, atomically, its
            // outputs) are in. Answer as before; write nothing.
            let ended_by_it = via == AckVia::Commit
                && fence.uid == e.rec.uid
                && e.rec.last_done != 0
                && fence.generation == e.rec.last_done
                && fence.token_generation == e.rec.last_done
                && fence.wake_id == e.rec.wake_id(e.rec.last_done);
            if ended_by_it && matches!(err, SubError::Fenced) {
                let links = self.links(e, now_ms).await?;
                let all_in = acks.iter().all(|a| links.iter().any(|l| l.path == a.stream && l.stream_id != 0 && e.acked(&l.path, l.stream_id) >= a.offset));
                if all_in {
                    return Ok((AckOutcome { next_wake: false, duplicate: true, appends: Vec::new() }, None));
                }
            }
            return Err(err);
        }
        let mut next = e.clone();
        let moved = self.apply_acks(&mut next, acks, now_ms).await?;
        let mut event = None;
        let mut next_wake = false;
        if done {
            next.rec.last_done = next.rec.generation;
            next.rec.wake = None;
            if let Some(ev) = self.plan_wake(&mut next, None, now_ms).await? {
                next_wake = next.rec.wake.is_some();
                event = ev;
            }
        } else if let Some(w) = next.rec.wake.as_mut() {
            w.lease_until_ms = Some(now_ms.saturating_add(i64::from(next.rec.config.lease_ttl_ms)));
        }
        let wake_path = event.as_ref().map(|ev| ev.path.clone());
        let appends = self.commit(&mut inner, next, &moved, outputs, event, now_ms).await?;
        Ok((AckOutcome { next_wake, duplicate: false, appends }, wake_path))
    }

    /// The worker gives the wake up without finishing it; pending work is woken again at once.
    pub async fn release(&self, id: &str, fence: &Fence, now_ms: i64) -> Result<(), SubError> {
        retried(|| self.release_once(id, fence, now_ms)).await
    }

    async fn release_once(&self, id: &str, fence: &Fence, now_ms: i64) -> Result<(), SubError> {
        let mut inner = self.lock().await?;
        let e = inner.subs.get(id).ok_or(SubError::NotFound)?;
        Self::fenced(e, fence, AckVia::Ack, now_ms)?;
        let mut next = e.clone();
        next.rec.wake = None;
        let event = self.plan_wake(&mut next, None, now_ms).await?.flatten();
        self.commit(&mut inner, next, &[], Vec::new(), event, now_ms).await?;
        Ok(())
    }

    // --- webhook dispatch ---------------------------------------------------------------------

    /// What the dispatcher should send now, after issuing the wakes that are due without an
    /// event (leases that ran out with work pending, retry times reached, and after a restart).
    ///
    /// Over a shared engine only the process holding the dispatcher lease does this (taking or
    /// renewing it here); the others answer nothing due, having reloaded the state, so that their
    /// writes keep waking subscriptions created elsewhere.
    pub async fn due(&self, now_ms: i64) -> Result<Due, SubError> {
        let nothing = Due { deliveries: Vec::new(), next_deadline_ms: None };
        let shared = self.engine.shared();
        // Alone on the engine, nothing can exist that this instance has not seen.
        if !shared && self.published().is_some_and(|f| f.is_empty()) {
            return Ok(nothing);
        }
        let mut inner = self.lock().await?;
        if shared && !self.hold_lease(now_ms).await? {
            return Ok(nothing);
        }
        self.issue_due_wakes(&mut inner, now_ms).await?;
        self.deliveries(&mut inner, now_ms).await
    }

    /// Takes the dispatcher lease when it is free (absent, ended, unreadable, or this
    /// instance's), renewing it once less than half is left; answers whether this instance holds
    /// it. Both under compare-and-set: of two processes taking it at once, one gets it.
    async fn hold_lease(&self, now_ms: i64) -> Result<bool, SubError> {
        let held = self.try_lease(now_ms).await;
        self.dispatching.store(matches!(held, Ok(true)), Ordering::Relaxed);
        held
    }

    async fn try_lease(&self, now_ms: i64) -> Result<bool, SubError> {
        let key = LEASE_KEY.as_bytes();
        let stored = self.meta_get(key).await?;
        // Anything that is not a lease (damage) is simply taken over.
        match stored.as_deref().and_then(|v| codec::decode_lease(v).ok()) {
            Some((holder, until)) if holder == self.node && until.saturating_sub(now_ms) > DISPATCH_LEASE_MS / 2 => return Ok(true),
            Some((holder, until)) if holder != self.node && now_ms < until => return Ok(false),
            _ => {}
        }
        let value = Bytes::from(codec::encode_lease(self.node, now_ms.saturating_add(DISPATCH_LEASE_MS)));
        let txn = TxnRequest { expect: vec![(key.to_vec(), stored)], meta: vec![MetaWrite { key: key.to_vec(), value: Some(value) }], now_ms, ..Default::default() };
        match self.engine.transact(txn).await {
            Ok(_) => Ok(true),
            // Another process took or renewed it first.
            Err(TxnError::Conflict { .. }) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Issues the wakes due without an event: every subscription not settled, and all of them
    /// on a full pass.
    async fn issue_due_wakes(&self, inner: &mut Inner, now_ms: i64) -> Result<(), SubError> {
        let ids: Vec<String> = inner.subs.keys().cloned().collect();
        let full = now_ms >= inner.next_full_pass_ms;
        if full {
            inner.next_full_pass_ms = now_ms.saturating_add(FULL_PASS_MS);
        }
        for id in &ids {
            let Some(e) = inner.subs.get(id) else { continue };
            if !full && e.settled && e.rec.wake.is_none() {
                continue;
            }
            let mut next = e.clone();
            match self.plan_wake(&mut next, None, now_ms).await? {
                Some(event) => {
                    next.settled = false;
                    self.commit_or_reload(inner, next, event, now_ms).await?;
                }
                None => {
                    if let Some(e) = inner.subs.get_mut(id) {
                        e.settled = e.rec.wake.is_none() && e.rec.failures == 0;
                    }
                }
            }
        }
        Ok(())
    }

    /// The live webhook wakes not sent yet (or whose retry time has come), marked in flight;
    /// and the next deadline.
    async fn deliveries(&self, inner: &mut Inner, now_ms: i64) -> Result<Due, SubError> {
        let ids: Vec<String> = inner.subs.keys().cloned().collect();
        let mut deliveries = Vec::new();
        let mut deadline: Option<i64> = None;
        let mut soonest = |t: i64| deadline = Some(deadline.map_or(t, |d| d.min(t)));
        for id in &ids {
            let Some(e) = inner.subs.get(id) else { continue };
            if e.rec.failures > 0 && e.rec.next_attempt_ms > now_ms {
                soonest(e.rec.next_attempt_ms);
            }
            let Some(w) = e.rec.live_wake(now_ms) else { continue };
            if let Some(t) = w.lease_until_ms {
                soonest(t);
            }
            let url = match &e.rec.config.kind {
                SubKind::Webhook { url } => url.clone(),
                SubKind::PullWake { .. } => continue,
            };
            // After a failure nothing is sent before the stored retry time (also after a
            // restart, which forgets what was sent); then the wake is sent again.
            let waiting = e.rec.failures > 0 && now_ms < e.rec.next_attempt_ms;
            let retry_due = e.rec.failures > 0 && !waiting;
            if e.in_flight || waiting || (e.sent == w.generation && !retry_due) {
                continue;
            }
            let generation = w.generation;
            let mut notice = self.notice(e, generation, now_ms).await?;
            notice.url = Some(url);
            deliveries.push(notice);
            if let Some(e) = inner.subs.get_mut(id) {
                e.sent = generation;
                e.in_flight = true;
            }
        }
        Ok(Due { deliveries, next_deadline_ms: deadline })
    }

    /// The receiver accepted the delivery of `generation`; with `done` its snapshot is acked and
    /// the wake ends. Nothing happens when that wake is no longer current (a callback got there
    /// first).
    pub async fn delivered(&self, id: &str, generation: u64, done: bool, now_ms: i64) -> Result<(), SubError> {
        retried(|| self.delivered_once(id, generation, done, now_ms)).await
    }

    async fn delivered_once(&self, id: &str, generation: u64, done: bool, now_ms: i64) -> Result<(), SubError> {
        let mut inner = self.lock().await?;
        let Some(e) = inner.subs.get_mut(id) else { return Ok(()) };
        e.in_flight = false;
        let current = e.rec.live_wake(now_ms).is_some_and(|w| w.generation == generation);
        if !current || (!done && e.rec.failures == 0) {
            return Ok(());
        }
        let mut next = e.clone();
        next.rec.failures = 0;
        next.rec.next_attempt_ms = 0;
        let mut moved = Vec::new();
        let mut event = None;
        if done {
            for (path, stream_id, tail) in next.rec.wake.take().map(|w| w.snapshot).unwrap_or_default() {
                if next.acked(&path, stream_id) < tail {
                    next.cursors.insert(path.clone(), Cursor { stream_id, acked: tail });
                    moved.push(path);
                }
            }
            next.rec.last_done = generation;
            event = self.plan_wake(&mut next, None, now_ms).await?.flatten();
        }
        self.commit(&mut inner, next, &moved, Vec::new(), event, now_ms).await?;
        Ok(())
    }

    /// A delivery of `generation` failed: the next attempt waits `backoff_ms`. The schedule is
    /// stored, so a restart does not retry early.
    pub async fn delivery_failed(&self, id: &str, generation: u64, backoff_ms: i64, now_ms: i64) -> Result<(), SubError> {
        retried(|| self.delivery_failed_once(id, generation, backoff_ms, now_ms)).await
    }

    async fn delivery_failed_once(&self, id: &str, generation: u64, backoff_ms: i64, now_ms: i64) -> Result<(), SubError> {
        let mut inner = self.lock().await?;
        let Some(e) = inner.subs.get_mut(id) else { return Ok(()) };
        e.in_flight = false;
        if e.rec.wake.as_ref().is_none_or(|w| w.generation != generation) {
            return Ok(());
        }
        let mut next = e.clone();
        next.rec.failures = next.rec.failures.saturating_add(1);
        next.rec.next_attempt_ms = now_ms.saturating_add(backoff_ms);
        self.commit(&mut inner, next, &[], Vec::new(), None, now_ms).await?;
        Ok(())
    }
}

