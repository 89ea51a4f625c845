//! What the service holds in memory: one [`Entry`] per subscription, the [`Inner`] state behind
//! its lock, the lock-free [`Filter`]s a stream write consults, and the [`PatternMemo`] of which
//! listed paths each pattern matches.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use oncelog_protocol::Offset;

use super::config::{links, wake_stream};
use super::{Cursor, SubRecord};

/// One subscription in memory.
#[derive(Debug, Clone)]
pub(super) struct Entry {
    pub(super) rec: SubRecord,
    /// The record's bytes as stored (loaded, or last written here): what every write expects to
    /// find, byte for byte, so that it fails if someone else changed the record meanwhile. Kept
    /// rather than re-encoded: a record written by an older version decodes, but would not
    /// encode back to the same bytes.
    pub(super) stored: Bytes,
    /// Cursors moved past the baseline: by an ack, or started at a tail when a path was linked
    /// by name later (`relink`). What a subscription must remember per stream, so it grows
    /// with the streams its workers acknowledge, not with every stream it matches.
    pub(super) cursors: BTreeMap<String, Cursor>,
    /// Where the streams that existed at creation start (their tails then), by stream
    /// incarnation: shared, never changed after creation, so cloning an entry (every decision
    /// does) costs a reference count, whatever the subscription matched.
    pub(super) baseline: Arc<Baseline>,
    /// The generation last handed to the dispatcher (memory only: after a restart a live wake is
    /// delivered again, with the same generation, which receivers treat as a repeat).
    pub(super) sent: u64,
    /// A delivery of the current wake is in flight.
    pub(super) in_flight: bool,
    /// Memory only: the last look found no wake and nothing pending, and nothing that could
    /// change that has happened since except through paths that look again themselves (writes
    /// via [`Subscriptions::on_write`], acks, releases). The dispatcher's pass skips it, but for
    /// a full pass every [`FULL_PASS_MS`](super::FULL_PASS_MS).
    ///
    /// [`Subscriptions::on_write`]: super::Subscriptions::on_write
    pub(super) settled: bool,
}

impl Entry {
    pub(super) fn new(rec: SubRecord, stored: Bytes) -> Entry {
        Entry {
            rec,
            stored,
            cursors: BTreeMap::new(),
            baseline: Arc::default(),
            sent: 0,
            in_flight: false,
            settled: false,
        }
    }

    pub(super) fn links_path(&self, path: &str) -> bool {
        links(&self.rec.explicit, self.rec.config.pattern.as_deref(), wake_stream(&self.rec), path)
    }

    /// Where processing of the stream `stream_id` at `path` stands: its cursor when it refers to
    /// that incarnation, else its tail at creation when it existed then (the baseline), else
    /// the beginning.
    pub(super) fn acked(&self, path: &str, stream_id: u64) -> Offset {
        match self.cursors.get(path) {
            Some(c) if c.stream_id == stream_id => c.acked,
            _ => self.baseline.get(stream_id).unwrap_or(Offset::ZERO),
        }
    }
}

/// The tails of the streams a subscription linked at creation (backfill), keyed by stream
/// incarnation id, sorted: 16 bytes a stream in memory and a few stored
/// ([`super::codec::encode_baseline`]), where a cursor per stream cost about 290 in memory (its
/// path, map nodes, the engine's copy of its key) and 50 on disk, for every subscription. A
/// stream created later, or re-created (a new id), is not in it and starts at 0; a stream empty
/// at creation is left out, 0 being its default anyway.
///
/// Subscriptions created over the same streams while they did not move have equal baselines:
/// they share one ([`Baseline::share`]), so 128 subscriptions of one pattern over idle streams
/// hold one.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Baseline {
    tails: Box<[(u64, Offset)]>,
    /// Of `tails`, to find an equal baseline without comparing every entry.
    digest: u64,
}

impl Baseline {
    /// From `(stream id, tail)` pairs in any order (an id is one stream: given twice, once kept).
    pub(super) fn new(mut tails: Vec<(u64, Offset)>) -> Baseline {
        use std::hash::{Hash, Hasher};
        tails.retain(|(_, t)| *t > Offset::ZERO);
        tails.sort_by_key(|(id, _)| *id);
        tails.dedup_by_key(|(id, _)| *id);
        let mut h = std::collections::hash_map::DefaultHasher::new();
        tails.hash(&mut h);
        Baseline { tails: tails.into_boxed_slice(), digest: h.finish() }
    }

    pub(super) fn get(&self, stream_id: u64) -> Option<Offset> {
        self.tails.binary_search_by_key(&stream_id, |(id, _)| *id).ok().map(|i| self.tails[i].1)
    }

    pub(super) fn entries(&self) -> &[(u64, Offset)] {
        &self.tails
    }

    pub(super) fn len(&self) -> usize {
        self.tails.len()
    }

    /// `new`, or an equal baseline among `others` (shared rather than held twice).
    pub(super) fn share<'a>(new: Baseline, others: impl IntoIterator<Item = &'a Arc<Baseline>>) -> Arc<Baseline> {
        if new.tails.is_empty() {
            return Arc::default();
        }
        others.into_iter().find(|o| o.digest == new.digest && ***o == new).cloned().unwrap_or_else(|| Arc::new(new))
    }
}

/// The state behind the service's lock.
#[derive(Default)]
pub(super) struct Inner {
    /// `false` also after a write found the stored state changed: the next call reloads.
    pub(super) loaded: bool,
    pub(super) subs: BTreeMap<String, Entry>,
    pub(super) next_uid: u64,
    /// `next_uid` as stored (`None`: never stored), what a create expects.
    pub(super) next_uid_stored: Option<Bytes>,
    /// When the dispatcher's pass next looks at every subscription ([`FULL_PASS_MS`](super::FULL_PASS_MS)).
    pub(super) next_full_pass_ms: i64,
}

/// What a stream write consults without taking the lock: what a subscription links, and until
/// when a write cannot wake it (its current wake is live, or a webhook retry is pending).
#[derive(Debug, Clone)]
pub(super) struct Filter {
    explicit: std::collections::BTreeSet<String>,
    pattern: Option<String>,
    wake_stream: Option<String>,
    quiet_until_ms: i64,
}

impl Filter {
    pub(super) fn of(rec: &SubRecord) -> Filter {
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
    pub(super) fn may_wake(&self, path: &str, now_ms: i64) -> bool {
        now_ms >= self.quiet_until_ms
            && links(&self.explicit, self.pattern.as_deref(), self.wake_stream.as_deref(), path)
    }
}

/// Which paths each pattern matches, for the paths its listing showed (memory only). Linking by
/// pattern lists the streams under the pattern's literal prefix on every view, wake plan and
/// claim; matching each of them again, a deep path against a long pattern, cost a tenant with
/// 1,500 deep streams 1.1 s of CPU per `GET`, under the service's one lock. With the memo a
/// pattern is matched against a path once while both exist: a call matches only the paths new
/// since the last listing.
///
/// Bounded: a pattern's verdicts are pruned to its latest listing once they outnumber it by
/// half again, a pattern no subscription has any more is forgotten
/// ([`PatternMemo::keep_only`]), and all patterns together hold at most [`MAX_VERDICTS`]:
/// beyond, the other patterns' verdicts are dropped (matched again when next listed). Without
/// that, each distinct pattern over the same streams kept a verdict per stream: a tenant
/// creating subscriptions with ever new patterns over its streams grew it without end. The map's lock is held for lookups and inserts only, never
/// while matching nor across an `await`; each pattern has its own, so tenants do not wait on
/// each other's listings.
/// Most verdicts the [`PatternMemo`] holds over all patterns (about 80 bytes each).
pub(super) const MAX_VERDICTS: usize = 1 << 18;

#[derive(Default)]
pub(super) struct PatternMemo {
    by_pattern: Mutex<HashMap<String, Arc<Mutex<HashMap<String, bool>>>>>,
    /// Verdicts held over all patterns (as counted at each change; exact after a drop).
    held: std::sync::atomic::AtomicUsize,
    /// Pattern matches evaluated (memo misses), for tests and diagnostics.
    evaluations: AtomicU64,
}

impl PatternMemo {
    /// Whether `pattern` matches each of `paths` (one listing), in order.
    pub(super) fn verdicts<'a>(
        &self,
        pattern: &str,
        paths: impl ExactSizeIterator<Item = &'a str> + Clone,
    ) -> Vec<bool> {
        let memo = self
            .by_pattern
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(pattern.to_owned())
            .or_default()
            .clone();
        let known: Vec<Option<bool>> = {
            let m = memo.lock().unwrap_or_else(PoisonError::into_inner);
            paths.clone().map(|p| m.get(p).copied()).collect()
        };
        // Matched with no lock held.
        let fresh: Vec<(usize, bool)> = paths
            .clone()
            .zip(&known)
            .enumerate()
            .filter(|(_, (_, k))| k.is_none())
            .map(|(i, (p, _))| (i, super::glob::matches(pattern, p)))
            .collect();
        self.evaluations.fetch_add(fresh.len() as u64, Ordering::Relaxed);
        let mut out: Vec<bool> = known.iter().map(|k| k.unwrap_or(false)).collect();
        let mut m = memo.lock().unwrap_or_else(PoisonError::into_inner);
        let before = m.len();
        let listed: Vec<&str> = paths.collect();
        for &(i, v) in &fresh {
            out[i] = v;
            // A listing larger than the whole memo is matched each time rather than kept.
            if listed.len() <= MAX_VERDICTS {
                m.insert(listed[i].to_owned(), v);
            }
        }
        if m.len() > listed.len() + listed.len() / 2 + 64 {
            let keep: std::collections::HashSet<&str> = listed.iter().copied().collect();
            m.retain(|p, _| keep.contains(p.as_str()));
        }
        let after = m.len();
        drop(m);
        let held = if after >= before {
            self.held.fetch_add(after - before, Ordering::Relaxed) + (after - before)
        } else {
            let fewer = before - after;
            let old = self.held.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |h| Some(h.saturating_sub(fewer)));
            old.unwrap_or(0).saturating_sub(fewer)
        };
        if held > MAX_VERDICTS {
            self.keep_only(std::iter::once(pattern));
        }
        out
    }

    /// Verdicts held now, over all patterns.
    pub(super) fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    /// Forgets the patterns not in `live` (after a subscription was deleted or changed).
    pub(super) fn keep_only<'a>(&self, live: impl Iterator<Item = &'a str>) {
        let live: std::collections::HashSet<&str> = live.collect();
        let mut all = self.by_pattern.lock().unwrap_or_else(PoisonError::into_inner);
        all.retain(|p, _| live.contains(p.as_str()));
        let held = all.values().map(|m| m.lock().unwrap_or_else(PoisonError::into_inner).len()).sum();
        self.held.store(held, Ordering::Relaxed);
    }

    pub(super) fn evaluations(&self) -> u64 {
        self.evaluations.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{SubConfig, SubKind, Wake};

    fn rec(kind: SubKind) -> SubRecord {
        SubRecord {
            uid: 1,
            id: "s".into(),
            config: SubConfig {
                kind,
                pattern: Some("jobs/*".into()),
                streams: vec!["x".into()],
                lease_ttl_ms: 1_000,
                description: None,
                outputs: Vec::new(),
            },
            created_ms: 0,
            generation: 0,
            wake: None,
            last_done: 0,
            failures: 0,
            next_attempt_ms: 0,
            explicit: ["x".to_string()].into(),
        }
    }

    fn wake(lease_until_ms: Option<i64>) -> Option<Wake> {
        Some(Wake { generation: 1, holder: None, lease_until_ms, snapshot: Vec::new() })
    }

    #[test]
    fn a_write_may_wake_what_links_it_and_is_not_quiet() {
        let pull = rec(SubKind::PullWake { wake_stream: "jobs/wake".into() });
        let f = Filter::of(&pull);
        assert!(f.may_wake("x", 0) && f.may_wake("jobs/a", 0));
        assert!(!f.may_wake("y", 0), "not linked");
        assert!(!f.may_wake("jobs/wake", 0), "its own wake stream");
        let unclaimed = Filter::of(&SubRecord { wake: wake(None), ..pull.clone() });
        assert!(!unclaimed.may_wake("x", i64::MAX - 1), "an unclaimed wake waits without end");
        let leased = Filter::of(&SubRecord { wake: wake(Some(500)), ..pull.clone() });
        assert!(!leased.may_wake("x", 499));
        assert!(leased.may_wake("x", 500), "the lease ran out");
        let hook = rec(SubKind::Webhook { url: "https://h.example".into() });
        let retrying =
            Filter::of(&SubRecord { failures: 1, next_attempt_ms: 800, wake: wake(Some(500)), ..hook.clone() });
        assert!(!retrying.may_wake("x", 799), "the later of lease end and retry time");
        assert!(retrying.may_wake("x", 800));
        let retry_done = Filter::of(&SubRecord { failures: 0, next_attempt_ms: 800, ..hook });
        assert!(retry_done.may_wake("x", 0), "a retry time counts only after failures");
    }

    #[test]
    fn a_pattern_is_matched_against_a_path_once_and_forgotten_with_it() {
        let memo = PatternMemo::default();
        let paths: Vec<String> = (0..100).map(|i| format!("jobs/{i}")).chain(["other/x".to_string()]).collect();
        let listed = || paths.iter().map(String::as_str);
        let first = memo.verdicts("jobs/*", listed());
        assert_eq!(first.iter().filter(|v| **v).count(), 100);
        assert!(!first[100]);
        assert_eq!(memo.evaluations(), 101);
        assert_eq!(memo.verdicts("jobs/*", listed()), first, "the same answers from the memo");
        assert_eq!(memo.evaluations(), 101, "nothing matched again");
        // A shorter listing: only new paths are matched; old verdicts past the bound are pruned.
        let fewer = ["jobs/new".to_string()];
        assert_eq!(memo.verdicts("jobs/*", fewer.iter().map(String::as_str)), [true]);
        assert_eq!(memo.evaluations(), 102);
        let m = memo.by_pattern.lock().expect("lock")["jobs/*"].clone();
        assert_eq!(m.lock().expect("lock").len(), 1, "pruned to the listing");
        memo.keep_only(["other/*"].into_iter());
        assert!(memo.by_pattern.lock().expect("lock").is_empty(), "a pattern nobody has is forgotten");
    }

    /// Each distinct pattern over the same streams kept a verdict per stream, without bound: a
    /// tenant making ever new patterns grew the memo by its streams each time.
    #[test]
    fn the_memo_holds_at_most_max_verdicts_over_all_patterns() {
        let memo = PatternMemo::default();
        let paths: Vec<String> = (0..MAX_VERDICTS / 8).map(|i| format!("t/{i}")).collect();
        for n in 0..12 {
            let pattern = format!("t/{}*", "*".repeat(n % 2)) + &"/**".repeat(n / 2);
            let v = memo.verdicts(&pattern, paths.iter().map(String::as_str));
            assert_eq!(v.len(), paths.len());
            assert!(memo.held() <= MAX_VERDICTS, "{} verdicts after {} patterns", memo.held(), n + 1);
        }
        let counted: usize =
            memo.by_pattern.lock().expect("lock").values().map(|m| m.lock().expect("lock").len()).sum();
        assert_eq!(counted, memo.held(), "the count is what the maps hold");
        // The pattern being listed keeps its verdicts: a repeat matches nothing again.
        let before = memo.evaluations();
        memo.verdicts("t/**/*", paths.iter().map(String::as_str));
        memo.verdicts("t/**/*", paths.iter().map(String::as_str));
        assert_eq!(memo.evaluations() - before, paths.len() as u64, "matched once, then remembered");
    }

    #[test]
    fn baselines_answer_by_incarnation_and_equal_ones_are_shared() {
        let b = Baseline::new(vec![(9, Offset(3)), (2, Offset(5)), (4, Offset::ZERO)]);
        assert_eq!((b.get(2), b.get(9), b.get(4), b.get(7)), (Some(Offset(5)), Some(Offset(3)), None, None));
        let first = Baseline::share(b, []);
        let same = Baseline::share(Baseline::new(vec![(2, Offset(5)), (9, Offset(3))]), [&first]);
        assert!(Arc::ptr_eq(&first, &same), "an equal baseline is shared");
        let other = Baseline::share(Baseline::new(vec![(2, Offset(6)), (9, Offset(3))]), [&first]);
        assert!(!Arc::ptr_eq(&first, &other));
    }

    #[test]
    fn acked_is_the_cursor_of_that_incarnation_else_the_beginning() {
        let mut e = Entry::new(rec(SubKind::PullWake { wake_stream: "w".into() }), Bytes::new());
        e.cursors.insert("x".into(), Cursor { stream_id: 4, acked: Offset(9) });
        assert_eq!(e.acked("x", 4), Offset(9));
        assert_eq!(e.acked("x", 5), Offset::ZERO);
        assert_eq!(e.acked("y", 4), Offset::ZERO);
        assert!(e.links_path("x") && e.links_path("jobs/a") && !e.links_path("w") && !e.links_path("__ds/x"));
    }
}
