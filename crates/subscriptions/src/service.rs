//! [`Subscriptions`]: the public API of the subscription service, each operation a thin load →
//! decide → write over the modules beside this one.
//!
//! The state lives in memory behind one lock, loaded from the engine's metadata map on first
//! use; every change is written (one transaction, [`Engine::transact`]) before it is applied in
//! memory or answered, so what a caller was told is durable. Nothing here reads a clock:
//! `now_ms` comes with each call.
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

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::{Mutex, Notify};

use super::config::linkable;
use super::lease::take_node_id;
use super::rules::{self, Woke};
use super::state::{Baseline, Entry, Filter, Inner, PatternMemo};
use super::{Ack, Cursor, Fence, InvalidSub, Link, SubConfig, SubError, SubLag, SubRecord, SubView};
use oncelog_storage::engine::{AppendOutcome, AppendRequest, Engine};

pub use super::config::{reserved, valid_id, RESERVED_PREFIX};
pub use super::dispatch::FULL_PASS_MS;
pub use super::lease::DISPATCH_LEASE_MS;

/// Verdict of [`Subscriptions::put`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutVerdict {
    Created,
    Existing,
}

/// How many subscriptions a create may find ([`Subscriptions::put_within`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quota {
    /// In all.
    pub max: usize,
    /// The creator's shares: under each of these path prefixes, at most `per_prefix`
    /// subscriptions whose links lie there ([`counts_under`]). Empty: no share applies.
    pub prefixes: Vec<String>,
    pub per_prefix: usize,
}

impl Quota {
    /// No limit at all.
    pub fn unlimited() -> Quota {
        Quota { max: usize::MAX, prefixes: Vec::new(), per_prefix: usize::MAX }
    }
}

/// Whether `rec` counts toward the share of `prefix`: its pattern's literal prefix, one of its
/// explicit links or its wake stream lies under it. A subscription whose pattern reaches beyond
/// the prefix (`**`, an operator's) is not the prefix's.
pub fn counts_under(rec: &SubRecord, prefix: &str) -> bool {
    rec.config.pattern.as_deref().is_some_and(|p| super::glob::literal_prefix(p).starts_with(prefix))
        || rec.explicit.iter().any(|s| s.starts_with(prefix))
        || super::config::wake_stream(rec).is_some_and(|w| w.starts_with(prefix))
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
    pub(super) engine: Arc<E>,
    pub(super) inner: Mutex<Inner>,
    /// One [`Filter`] per subscription, replaced after every change (`None` until the state is
    /// loaded): a write to a stream no subscription could be woken by (none exists, or each
    /// holds a live wake: the common case under load) takes no lock.
    pub(super) filters: std::sync::RwLock<Option<Arc<Vec<Filter>>>>,
    /// Notified when a webhook wake is issued or a delivery schedule changes.
    pub notify: Notify,
    /// Who this instance is in the dispatcher lease ([`take_node_id`]).
    pub(super) node: u64,
    /// Over a shared engine: the last pass of [`Self::due`] held the dispatcher lease.
    pub(super) dispatching: AtomicBool,
    /// Which listed paths each pattern matches ([`PatternMemo`]).
    pub(super) memo: PatternMemo,
    /// Stream listings and lookups made to find links, for tests and diagnostics.
    pub(super) lookups: AtomicU64,
    /// The last lags computed for the metrics scrape, and when ([`Self::lags_cached`]).
    pub(super) lag_cache: Mutex<Option<(i64, Arc<Vec<SubLag>>)>>,
}

/// What the service remembers, counted ([`Subscriptions::remembered`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Remembered {
    pub subscriptions: usize,
    /// Cursors in memory (acked past a baseline, or started by a later link by name).
    pub cursors: usize,
    /// Baseline entries, over distinct baselines.
    pub baseline_entries: usize,
    /// Pattern verdicts held by the memo.
    pub verdicts: usize,
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
            memo: PatternMemo::default(),
            lookups: AtomicU64::new(0),
            lag_cache: Mutex::new(None),
        }
    }

    /// How many stream listings and lookups finding links has made so far. Cheap; for tests
    /// and diagnostics.
    pub fn lookups(&self) -> u64 {
        self.lookups.load(Ordering::Relaxed)
    }

    /// What the service remembers now, counted: what its memory grows with.
    pub async fn remembered(&self) -> Result<Remembered, SubError> {
        let inner = self.lock().await?;
        Ok(Remembered {
            subscriptions: inner.subs.len(),
            cursors: inner.subs.values().map(|e| e.cursors.len()).sum(),
            baseline_entries: {
                let mut seen = std::collections::HashSet::new();
                inner.subs.values().filter(|e| seen.insert(Arc::as_ptr(&e.baseline))).map(|e| e.baseline.len()).sum()
            },
            verdicts: self.memo.held(),
        })
    }

    /// How many times a pattern was matched against a stream path so far (each pattern once per
    /// path while both exist, not once per call). Cheap; for tests and diagnostics.
    pub fn pattern_evaluations(&self) -> u64 {
        self.memo.evaluations()
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

    /// How many subscriptions exist (as of the last change; 0 before they are loaded). Cheap.
    pub fn count(&self) -> usize {
        self.published().map_or(0, |f| f.len())
    }

    // --- configuration ------------------------------------------------------------------------

    /// Creates the subscription `id`, or confirms it when it exists with the same configuration.
    /// New links start at the linked streams' current tails (backfill).
    pub async fn put(&self, id: &str, config: SubConfig, now_ms: i64) -> Result<(PutVerdict, SubView), SubError> {
        self.put_within(id, config, &Quota::unlimited(), now_ms).await
    }

    /// [`Self::put`], refusing a create beyond `quota` ([`SubError::TooMany`],
    /// [`SubError::ShareUsed`]); confirming an existing subscription is never refused. Over a
    /// shared engine each node counts what it loaded, so nodes creating at once may pass the
    /// limit by one each.
    pub async fn put_within(
        &self,
        id: &str,
        config: SubConfig,
        quota: &Quota,
        now_ms: i64,
    ) -> Result<(PutVerdict, SubView), SubError> {
        valid_id(id)?;
        let config = &config.normalized()?;
        self.retrying(|mut inner| async move {
            if let Some(e) = inner.subs.get(id) {
                if e.rec.config != *config {
                    return Err(SubError::AlreadyExists);
                }
                let view = self.view(e, now_ms).await?;
                return Ok((PutVerdict::Existing, view));
            }
            if inner.subs.len() >= quota.max {
                return Err(SubError::TooMany { max: quota.max });
            }
            for prefix in &quota.prefixes {
                if inner.subs.values().filter(|e| counts_under(&e.rec, prefix)).count() >= quota.per_prefix {
                    return Err(SubError::ShareUsed { prefix: prefix.clone(), max: quota.per_prefix });
                }
            }
            let mut entry = Entry::new(rules::new_record(id, inner.next_uid, config, now_ms), Bytes::new());
            let links = self.links(&entry, now_ms).await?;
            entry.baseline = Baseline::share(rules::start_at_tails(links), inner.subs.values().map(|e| &e.baseline));
            self.create(&mut inner, &mut entry, now_ms).await?;
            let view = self.view(&entry, now_ms).await?;
            inner.subs.insert(id.to_owned(), entry);
            self.refresh(&inner);
            Ok((PutVerdict::Created, view))
        })
        .await
    }

    /// The subscription and its links now. Its streams are looked at after the lock is let go:
    /// a view decides nothing, and listing a pattern's streams must not hold up every other
    /// tenant's calls.
    pub async fn get(&self, id: &str, now_ms: i64) -> Result<SubView, SubError> {
        let e = self.lock().await?.subs.get(id).cloned().ok_or(SubError::NotFound)?;
        self.view(&e, now_ms).await
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
        self.retrying(|mut inner| async move {
            if !inner.subs.contains_key(id) {
                return Ok(false);
            }
            self.remove(&mut inner, id, now_ms).await?;
            Ok(true)
        })
        .await
    }

    /// Adds explicit links (at the streams' current tails) and removes others; both idempotent.
    /// Removing an explicit link keeps the stream linked when the pattern matches it.
    pub async fn relink(&self, id: &str, add: Vec<String>, remove: Vec<String>, now_ms: i64) -> Result<(), SubError> {
        if add.iter().chain(&remove).any(|p| !linkable(p)) {
            return Err(InvalidSub::BadPath.into());
        }
        let (add, remove) = (&add[..], &remove[..]);
        self.retrying(|mut inner| async move {
            let e = inner.subs.get(id).ok_or(SubError::NotFound)?;
            let mut next = e.clone();
            let mut started = Vec::new();
            for path in rules::relink(e, &mut next.rec, add, remove) {
                if let Ok(info) = self.engine.head(path, now_ms).await {
                    next.cursors.insert(path.clone(), Cursor { stream_id: info.id, acked: info.tail });
                    started.push(path.clone());
                }
            }
            next.settled = false;
            if next.rec.explicit == e.rec.explicit {
                return Ok(());
            }
            self.store(&mut inner, next, &started, now_ms).await
        })
        .await
    }

    // --- pull-wake workers --------------------------------------------------------------------

    /// A worker claims the current wake (or, with pending work and none live, a new one). The
    /// worker holding it may claim again (a retry after a lost answer): same wake, lease renewed.
    pub async fn claim(&self, id: &str, worker: &str, now_ms: i64) -> Result<WakeNotice, SubError> {
        self.retrying(|mut inner| async move {
            let e = inner.subs.get(id).ok_or(SubError::NotFound)?;
            let live = rules::may_claim(&e.rec, worker, now_ms)?;
            let mut next = e.clone();
            // Issued by the claim: no wake event, the worker is told at once.
            if !live && !matches!(self.plan_wake(&mut next, None, now_ms).await?, Woke::Issued(_)) {
                return Err(SubError::NoPendingWork);
            }
            let generation = rules::hold(&mut next.rec, worker, now_ms)?;
            let notice = self.notice(&next, generation, now_ms).await?;
            self.commit(&mut inner, next, &[], Vec::new(), None, now_ms).await?;
            Ok(notice)
        })
        .await
    }

    /// An ack (`…/ack`), a callback (`…/callback`) or a transactional commit (`…/commit`, with
    /// `outputs`): acks move cursors; `done` ends the wake (and issues the next one at once when
    /// work remains); without it the lease is extended. The outputs, the cursors and the wake
    /// change are one transaction.
    pub async fn ack(&self, id: &str, req: AckRequest, now_ms: i64) -> Result<AckOutcome, SubError> {
        // The outcome, and where a wake event was appended: a write that may wake others.
        let (outcome, wake_path) = self
            .retrying(|mut inner| {
                let AckRequest { fence, acks, done, via, outputs } = req.clone();
                async move {
                    let e = inner.subs.get(id).ok_or(SubError::NotFound)?;
                    if let Err(err) = rules::fence(&e.rec, &fence, via, now_ms) {
                        // A retried commit of the wake that ended with it: its acks (hence,
                        // atomically, its outputs) are in. Answer as before; write nothing.
                        if rules::ended_by(&e.rec, &fence, via) && matches!(err, SubError::Fenced) {
                            let links = self.links(e, now_ms).await?;
                            if rules::acked_already(e, &links, &acks) {
                                return Ok((
                                    AckOutcome { next_wake: false, duplicate: true, appends: Vec::new() },
                                    None,
                                ));
                            }
                        }
                        return Err(err);
                    }
                    let mut next = e.clone();
                    let links = self.links(&next, now_ms).await?;
                    let moved = rules::apply_acks(&mut next, &links, &acks)?;
                    let mut event = None;
                    let mut next_wake = false;
                    if done {
                        rules::finish(&mut next.rec);
                        if let Woke::Issued(ev) = self.plan_wake(&mut next, None, now_ms).await? {
                            next_wake = true;
                            event = ev;
                        }
                    } else {
                        rules::extend(&mut next.rec, now_ms);
                    }
                    let wake_path = event.as_ref().map(|ev| ev.path.clone());
                    let appends = self.commit(&mut inner, next, &moved, outputs, event, now_ms).await?;
                    Ok((AckOutcome { next_wake, duplicate: false, appends }, wake_path))
                }
            })
            .await?;
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

    /// The worker gives the wake up without finishing it; pending work is woken again at once.
    pub async fn release(&self, id: &str, fence: &Fence, now_ms: i64) -> Result<(), SubError> {
        self.retrying(|mut inner| async move {
            let e = inner.subs.get(id).ok_or(SubError::NotFound)?;
            rules::fence(&e.rec, fence, AckVia::Ack, now_ms)?;
            let mut next = e.clone();
            next.rec.wake = None;
            let event = self.plan_wake(&mut next, None, now_ms).await?.event();
            self.commit(&mut inner, next, &[], Vec::new(), event, now_ms).await?;
            Ok(())
        })
        .await
    }

    // --- wakes --------------------------------------------------------------------------------

    /// After a write to `path`: wakes the subscriptions linked to it that have no live wake.
    /// Wake events may themselves be writes to linked streams; those are followed too (each
    /// subscription wakes at most once, so this ends).
    pub async fn on_write(&self, path: &str, now_ms: i64) -> Result<(), SubError> {
        // Loaded, and no subscription can be woken by this write: nothing to do, no lock.
        if self.published().is_some_and(|f| !f.iter().any(|f| f.may_wake(path, now_ms))) {
            return Ok(());
        }
        // Boxed: every append's future holds this one, and the wake's state is kilobytes.
        Box::pin(self.wake_on_write(path, now_ms)).await
    }

    /// [`Self::on_write`] when a subscription may be woken.
    async fn wake_on_write(&self, path: &str, now_ms: i64) -> Result<(), SubError> {
        let mut inner = self.lock().await?;
        let mut todo = vec![path.to_owned()];
        let mut woken = BTreeSet::new();
        while let Some(path) = todo.pop() {
            let ids: Vec<String> = inner
                .subs
                .values()
                .filter(|e| !woken.contains(&e.rec.id) && e.links_path(&path))
                .map(|e| e.rec.id.clone())
                .collect();
            for id in ids {
                let Some(e) = inner.subs.get(&id) else { continue };
                let mut next = e.clone();
                let event = match self.plan_wake(&mut next, Some(&path), now_ms).await? {
                    Woke::Nothing => continue,
                    Woke::Ended => None,
                    Woke::Issued(event) => event,
                };
                woken.insert(id);
                let event_path = event.as_ref().map(|ev| ev.path.clone());
                if self.commit_or_reload(&mut inner, next, event, now_ms).await? {
                    todo.extend(event_path);
                }
            }
        }
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

    /// The receiver accepted the delivery of `generation`; with `done` its snapshot is acked and
    /// the wake ends. Nothing happens when that wake is no longer current (a callback got there
    /// first).
    pub async fn delivered(&self, id: &str, generation: u64, done: bool, now_ms: i64) -> Result<(), SubError> {
        self.retrying(|mut inner| async move {
            let Some(e) = inner.subs.get_mut(id) else { return Ok(()) };
            e.in_flight = false;
            if !rules::delivery_counts(&e.rec, generation, done, now_ms) {
                return Ok(());
            }
            let mut next = e.clone();
            let moved = rules::delivered(&mut next, generation, done);
            let event = if done { self.plan_wake(&mut next, None, now_ms).await?.event() } else { None };
            self.commit(&mut inner, next, &moved, Vec::new(), event, now_ms).await?;
            Ok(())
        })
        .await
    }

    /// A delivery of `generation` failed: the next attempt waits `backoff_ms`. The schedule is
    /// stored, so a restart does not retry early.
    pub async fn delivery_failed(
        &self,
        id: &str,
        generation: u64,
        backoff_ms: i64,
        now_ms: i64,
    ) -> Result<(), SubError> {
        self.retrying(|mut inner| async move {
            let Some(e) = inner.subs.get_mut(id) else { return Ok(()) };
            e.in_flight = false;
            if !rules::failure_counts(&e.rec, generation) {
                return Ok(());
            }
            let mut next = e.clone();
            rules::delivery_failed(&mut next.rec, backoff_ms, now_ms);
            self.commit(&mut inner, next, &[], Vec::new(), None, now_ms).await?;
            Ok(())
        })
        .await
    }
}
