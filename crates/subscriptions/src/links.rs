//! What a subscription links now, read from the engine's streams (their heads and listings):
//! its links, its view, a wake notice, and the next wake planned over the pending work.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use oncelog_protocol::Offset;

use super::config::{may_link, wake_stream};
use super::rules::{self, Woke};
use super::state::Entry;
use super::{glob, Link, LinkType, SubError, SubKind, SubLag, SubView, Subscriptions, WakeNotice};
use oncelog_storage::engine::{Engine, Listed};

/// Listings by prefix, shared by the subscriptions of one pass ([`Subscriptions::lags`]).
type Listings = HashMap<String, Arc<Vec<Listed>>>;

impl<E: Engine> Subscriptions<E> {
    /// The linked streams of `e` now: explicit ones (also where no stream exists) and the
    /// pattern's matches, explicit first when both.
    pub(super) async fn links(&self, e: &Entry, now_ms: i64) -> Result<Vec<Link>, SubError> {
        self.links_with(e, now_ms, &mut Listings::new()).await
    }

    /// [`Self::links`], taking the listing of a pattern's prefix from `listings` when an
    /// earlier subscription of the same pass listed it.
    async fn links_with(&self, e: &Entry, now_ms: i64, listings: &mut Listings) -> Result<Vec<Link>, SubError> {
        let mut out: BTreeMap<String, Link> = BTreeMap::new();
        if let Some(pattern) = &e.rec.config.pattern {
            let prefix = glob::literal_prefix(pattern);
            let listed = match listings.get(&prefix) {
                Some(l) => l.clone(),
                None => {
                    self.lookups.fetch_add(1, Ordering::Relaxed);
                    let l = Arc::new(self.engine.list_streams(&prefix, now_ms).await?);
                    listings.insert(prefix, l.clone());
                    l
                }
            };
            let verdicts = self.memo.verdicts(pattern, listed.iter().map(|l| l.path.as_str()));
            for (l, matched) in listed.iter().zip(verdicts) {
                if matched && may_link(wake_stream(&e.rec), &l.path) {
                    let acked = e.acked(&l.path, l.info.id);
                    out.insert(
                        l.path.clone(),
                        Link {
                            path: l.path.clone(),
                            link_type: LinkType::Glob,
                            stream_id: l.info.id,
                            acked,
                            tail: l.info.tail,
                        },
                    );
                }
            }
        }
        for path in &e.rec.explicit {
            self.lookups.fetch_add(1, Ordering::Relaxed);
            let (stream_id, tail) = match self.engine.head(path, now_ms).await {
                Ok(info) => (info.id, info.tail),
                Err(oncelog_storage::engine::LookupError::Storage(s)) => return Err(s.into()),
                Err(_) => (0, Offset::ZERO),
            };
            let acked = if stream_id == 0 { Offset::ZERO } else { e.acked(path, stream_id) };
            out.insert(
                path.clone(),
                Link { path: path.clone(), link_type: LinkType::Explicit, stream_id, acked, tail },
            );
        }
        Ok(out.into_values().collect())
    }

    /// The linked streams of `e` with work pending now.
    async fn pending(&self, e: &Entry, now_ms: i64) -> Result<Vec<Link>, SubError> {
        Ok(self.links(e, now_ms).await?.into_iter().filter(Link::has_pending).collect())
    }

    /// How far behind each of the first `max` subscriptions (by id) is now. Each costs what a
    /// `GET` of it costs (its explicit streams looked up, its pattern matched over its prefix's
    /// streams), except that subscriptions whose patterns share a literal prefix share its
    /// listing; the lock is held only to copy the entries (cheap: a baseline is shared).
    pub async fn lags(&self, max: usize, now_ms: i64) -> Result<Vec<SubLag>, SubError> {
        let entries: Vec<Entry> = self.lock().await?.subs.values().take(max).cloned().collect();
        let mut out = Vec::with_capacity(entries.len());
        let mut listings = Listings::new();
        for e in &entries {
            let links = self.links_with(e, now_ms, &mut listings).await?;
            out.push(SubLag {
                id: e.rec.id.clone(),
                bytes: links.iter().map(|l| l.tail.0.saturating_sub(l.acked.0)).sum(),
                pending_streams: links.iter().filter(|l| l.has_pending()).count(),
            });
        }
        Ok(out)
    }

    /// [`Self::lags`] as computed at most `max_age_ms` ago, for the metrics scrape: a scrape
    /// costs what it prints, not a look at every subscription's streams. Concurrent callers
    /// wait for one computation and share it.
    pub async fn lags_cached(&self, max: usize, max_age_ms: i64, now_ms: i64) -> Result<Arc<Vec<SubLag>>, SubError> {
        let mut cache = self.lag_cache.lock().await;
        if let Some((at, lags)) = cache.as_ref() {
            if (*at..at.saturating_add(max_age_ms)).contains(&now_ms) {
                return Ok(lags.clone());
            }
        }
        let lags = Arc::new(self.lags(max, now_ms).await?);
        *cache = Some((now_ms, lags.clone()));
        Ok(lags)
    }

    pub(super) async fn view(&self, e: &Entry, now_ms: i64) -> Result<SubView, SubError> {
        Ok(SubView { record: e.rec.clone(), links: self.links(e, now_ms).await? })
    }

    pub(super) async fn notice(&self, e: &Entry, generation: u64, now_ms: i64) -> Result<WakeNotice, SubError> {
        let streams = self.pending(e, now_ms).await?;
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

    /// Issues the next wake of `next` if it has none live, is not waiting for a delivery retry
    /// ([`rules::may_wake`]), and has pending work: the changes go into `next`, the wake event
    /// (pull-wake) comes with the answer, as the append to make with them ([`rules::wake`]).
    pub(super) async fn plan_wake(
        &self,
        next: &mut Entry,
        trigger: Option<&str>,
        now_ms: i64,
    ) -> Result<Woke, SubError> {
        if !rules::may_wake(&next.rec, now_ms) {
            return Ok(Woke::Nothing);
        }
        let pending = self.pending(next, now_ms).await?;
        Ok(rules::wake(&mut next.rec, &pending, trigger, now_ms))
    }
}
