//! What each subscription operation does to a subscription: pure decisions over an [`Entry`]
//! and the links read for it (no I/O, no `await`, no clock: `now_ms` comes with each call).
//!
//! The service ([`super::service`]) loads the state, reads the linked streams where a decision
//! needs them, calls these, and writes the outcome ([`super::store`]).

use bytes::Bytes;

use super::state::{Baseline, Entry};
use super::{Ack, AckVia, Cursor, Fence, Link, SubConfig, SubError, SubKind, SubRecord, Wake};
use oncelog_storage::engine::AppendRequest;

// --- configuration ----------------------------------------------------------------------------

/// The record of a new subscription `id`, incarnation `uid`: no wake yet, linking the streams
/// its configuration names.
pub(super) fn new_record(id: &str, uid: u64, config: &SubConfig, now_ms: i64) -> SubRecord {
    SubRecord {
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
    }
}

/// Where a new subscription starts: at the tails of the existing streams in `links` (backfill:
/// the work is what arrives after linking). Its baseline, no cursor (a cursor is written when
/// an ack moves past it).
pub(super) fn start_at_tails(links: Vec<Link>) -> Baseline {
    let tails = links.into_iter().filter(|l| l.stream_id != 0).map(|l| (l.stream_id, l.tail)).collect();
    Baseline::new(tails)
}

/// Adds `add` to the explicit links of `next` and removes `remove` (both idempotent; adds
/// first); answers the added paths that `before` linked in no way, in `add` order: their
/// cursors start at the streams' current tails.
pub(super) fn relink<'a>(
    before: &Entry,
    next: &mut SubRecord,
    add: &'a [String],
    remove: &[String],
) -> Vec<&'a String> {
    let mut fresh = Vec::new();
    for path in add {
        if next.explicit.insert(path.clone()) && !before.links_path(path) {
            fresh.push(path);
        }
    }
    for path in remove {
        next.explicit.remove(path);
    }
    fresh
}

// --- wakes ------------------------------------------------------------------------------------

/// What [`wake`] did to a subscription.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // made once per decision and consumed at once: no box needed
pub(super) enum Woke {
    /// Nothing: a wake is live, a webhook waits for its retry time, or no work is pending and
    /// there is no wake to end.
    Nothing,
    /// The wake had run out with nothing left to do, and ended.
    Ended,
    /// A new wake was issued; with the wake event to append with it (pull-wake).
    Issued(Option<AppendRequest>),
}

impl Woke {
    /// The wake event to append, if any.
    pub(super) fn event(self) -> Option<AppendRequest> {
        match self {
            Woke::Issued(event) => event,
            Woke::Nothing | Woke::Ended => None,
        }
    }
}

/// Whether a new wake may be issued for `rec` at `now_ms` (when work is pending): it has none
/// live, and is not a webhook waiting for its delivery retry time.
pub(super) fn may_wake(rec: &SubRecord, now_ms: i64) -> bool {
    if rec.live_wake(now_ms).is_some() {
        return false;
    }
    let webhook = matches!(rec.config.kind, SubKind::Webhook { .. });
    !(webhook && rec.failures > 0 && now_ms < rec.next_attempt_ms)
}

/// The next wake of `rec`, which [`may_wake`], given its links with `pending` work: the changes
/// go into `rec`; a pull-wake event names `trigger` (the write that woke it), else the first
/// pending stream.
pub(super) fn wake(rec: &mut SubRecord, pending: &[Link], trigger: Option<&str>, now_ms: i64) -> Woke {
    if pending.is_empty() {
        // An expired wake with nothing left to do simply ends.
        if rec.wake.is_some() {
            rec.wake = None;
            return Woke::Ended;
        }
        return Woke::Nothing;
    }
    let webhook = matches!(rec.config.kind, SubKind::Webhook { .. });
    let generation = rec.generation + 1;
    rec.generation = generation;
    let lease_until_ms = webhook.then(|| now_ms.saturating_add(i64::from(rec.config.lease_ttl_ms)));
    let snapshot = pending.iter().map(|l| (l.path.clone(), l.stream_id, l.tail)).collect();
    rec.wake = Some(Wake { generation, holder: None, lease_until_ms, snapshot });
    let event = match &rec.config.kind {
        SubKind::Webhook { .. } => None,
        SubKind::PullWake { wake_stream } => {
            let stream = trigger.unwrap_or(&pending[0].path);
            let msg = serde_json::json!({
                "type": "wake",
                "subscription_id": rec.id,
                "stream": stream,
                "generation": generation,
                "ts": now_ms,
            });
            Some(AppendRequest::plain(
                wake_stream.clone(),
                "application/json",
                true,
                Bytes::from(format!("{msg},")),
                now_ms,
            ))
        }
    };
    Woke::Issued(event)
}

// --- pull-wake workers ------------------------------------------------------------------------

/// Whether `worker` may claim a wake of `rec` at `now_ms`: only a pull-wake subscription, and a
/// live wake only when unclaimed or claimed by `worker` itself (a claim again after a lost
/// answer gets the same wake back). `Ok(true)`: there is a live wake to take; `Ok(false)`: a new
/// one must be issued first.
pub(super) fn may_claim(rec: &SubRecord, worker: &str, now_ms: i64) -> Result<bool, SubError> {
    if !matches!(rec.config.kind, SubKind::PullWake { .. }) {
        return Err(SubError::WrongType { needs: "pull-wake" });
    }
    match rec.live_wake(now_ms) {
        Some(w) => match w.holder.as_ref().filter(|h| h.as_str() != worker) {
            Some(holder) => Err(SubError::AlreadyClaimed { holder: holder.clone(), generation: w.generation }),
            None => Ok(true),
        },
        None => Ok(false),
    }
}

/// `worker` holds the wake of `rec`, its lease running from `now_ms`; answers its generation.
pub(super) fn hold(rec: &mut SubRecord, worker: &str, now_ms: i64) -> Result<u64, SubError> {
    let ttl = i64::from(rec.config.lease_ttl_ms);
    match rec.wake.as_mut() {
        Some(w) => {
            w.holder = Some(worker.to_owned());
            w.lease_until_ms = Some(now_ms.saturating_add(ttl));
            Ok(w.generation)
        }
        None => Err(SubError::NoPendingWork),
    }
}

/// Checks `fence` against the current wake of `rec`: the operation must fit the kind, the token
/// the incarnation, and generation and wake id the live wake, which a pull-wake worker must
/// hold (a webhook's receiver holds it at once).
pub(super) fn fence(rec: &SubRecord, fence: &Fence, via: AckVia, now_ms: i64) -> Result<(), SubError> {
    let kind_ok = match via {
        AckVia::Callback => matches!(rec.config.kind, SubKind::Webhook { .. }),
        AckVia::Ack => matches!(rec.config.kind, SubKind::PullWake { .. }),
        AckVia::Commit => true,
    };
    if !kind_ok {
        return Err(SubError::WrongType { needs: if via == AckVia::Callback { "webhook" } else { "pull-wake" } });
    }
    if fence.uid != rec.uid {
        return Err(SubError::TokenInvalid);
    }
    let w = rec.live_wake(now_ms).ok_or(SubError::Fenced)?;
    let current = fence.token_generation == w.generation
        && fence.generation == w.generation
        && fence.wake_id == rec.wake_id(w.generation);
    // A pull wake is acted on only by its claimant (a webhook's receiver holds it at once).
    let held = matches!(rec.config.kind, SubKind::Webhook { .. }) || w.holder.is_some();
    if !current || !held {
        return Err(SubError::Fenced);
    }
    Ok(())
}

/// Whether `fence`, presented by a commit, is that of the wake that ended last with a `done`:
/// then the commit may be a retry whose acks (hence, atomically, its outputs) are in already.
pub(super) fn ended_by(rec: &SubRecord, fence: &Fence, via: AckVia) -> bool {
    via == AckVia::Commit
        && fence.uid == rec.uid
        && rec.last_done != 0
        && fence.generation == rec.last_done
        && fence.token_generation == rec.last_done
        && fence.wake_id == rec.wake_id(rec.last_done)
}

/// Whether every one of `acks` is in already: each names a stream of `links` that exists and
/// that `e` has processed at least that far.
pub(super) fn acked_already(e: &Entry, links: &[Link], acks: &[Ack]) -> bool {
    acks.iter().all(|a| {
        links.iter().any(|l| l.path == a.stream && l.stream_id != 0 && e.acked(&l.path, l.stream_id) >= a.offset)
    })
}

/// Applies `acks` to `next`, whose streams are `links`: an ack must name an existing linked
/// stream, within its tail, and never move a cursor back. Answers the paths whose cursors
/// moved; on an error `next` is half changed and to be dropped, so that nothing applies unless
/// every ack passes.
pub(super) fn apply_acks(next: &mut Entry, links: &[Link], acks: &[Ack]) -> Result<Vec<String>, SubError> {
    let mut moved = Vec::new();
    for a in acks {
        let invalid = |why| SubError::InvalidOffset { stream: a.stream.clone(), why };
        let link = links
            .iter()
            .find(|l| l.path == a.stream && l.stream_id != 0)
            .ok_or_else(|| invalid("not a linked stream"))?;
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

/// A `done`: the current wake ends, remembered as the last one ended so (see [`ended_by`]).
pub(super) fn finish(rec: &mut SubRecord) {
    rec.last_done = rec.generation;
    rec.wake = None;
}

/// An ack without `done`: the wake's lease runs for the subscription's TTL from `now_ms`.
pub(super) fn extend(rec: &mut SubRecord, now_ms: i64) {
    let ttl = i64::from(rec.config.lease_ttl_ms);
    if let Some(w) = rec.wake.as_mut() {
        w.lease_until_ms = Some(now_ms.saturating_add(ttl));
    }
}

// --- webhook dispatch -------------------------------------------------------------------------

/// Whether the dispatcher's pass skips `e` looking for wakes due: it is settled and has no
/// wake, and this is not a full pass.
pub(super) fn pass_skips(e: &Entry, full: bool) -> bool {
    !full && e.settled && e.rec.wake.is_none()
}

/// Whether `rec`, found with nothing to wake, is settled: no wake, and no delivery failures.
pub(super) fn settles(rec: &SubRecord) -> bool {
    rec.wake.is_none() && rec.failures == 0
}

/// What the dispatcher's pass makes of `e` at `now_ms`: the earliest time it becomes due
/// without a new event (its retry time, its live wake's lease end), and the generation to
/// deliver now with the URL to deliver it to. Nothing to deliver when it has no live webhook
/// wake, one is in flight, its retry time has not come, or it was sent and no retry is due.
pub(super) fn delivery(e: &Entry, now_ms: i64) -> (Option<i64>, Option<(u64, String)>) {
    let mut deadline: Option<i64> = None;
    let mut soonest = |t: i64| deadline = Some(deadline.map_or(t, |d| d.min(t)));
    if e.rec.failures > 0 && e.rec.next_attempt_ms > now_ms {
        soonest(e.rec.next_attempt_ms);
    }
    let Some(w) = e.rec.live_wake(now_ms) else { return (deadline, None) };
    if let Some(t) = w.lease_until_ms {
        soonest(t);
    }
    let url = match &e.rec.config.kind {
        SubKind::Webhook { url } => url.clone(),
        SubKind::PullWake { .. } => return (deadline, None),
    };
    // After a failure nothing is sent before the stored retry time (also after a restart,
    // which forgets what was sent); then the wake is sent again.
    let waiting = e.rec.failures > 0 && now_ms < e.rec.next_attempt_ms;
    let retry_due = e.rec.failures > 0 && !waiting;
    if e.in_flight || waiting || (e.sent == w.generation && !retry_due) {
        return (deadline, None);
    }
    (deadline, Some((w.generation, url)))
}

/// Whether the receiver's acceptance of `generation` changes `rec`: it is the live wake's, and
/// it either ends it (`done`) or ends a run of failures.
pub(super) fn delivery_counts(rec: &SubRecord, generation: u64, done: bool, now_ms: i64) -> bool {
    let current = rec.live_wake(now_ms).is_some_and(|w| w.generation == generation);
    current && (done || rec.failures != 0)
}

/// The receiver accepted `generation`: failures are forgotten; with `done` the wake's snapshot
/// is acked and the wake ends as the last done. Answers the paths whose cursors moved.
pub(super) fn delivered(next: &mut Entry, generation: u64, done: bool) -> Vec<String> {
    next.rec.failures = 0;
    next.rec.next_attempt_ms = 0;
    let mut moved = Vec::new();
    if done {
        for (path, stream_id, tail) in next.rec.wake.take().map(|w| w.snapshot).unwrap_or_default() {
            if next.acked(&path, stream_id) < tail {
                next.cursors.insert(path.clone(), Cursor { stream_id, acked: tail });
                moved.push(path);
            }
        }
        next.rec.last_done = generation;
    }
    moved
}

/// Whether a failed delivery of `generation` concerns the current wake of `rec` (live or not).
pub(super) fn failure_counts(rec: &SubRecord, generation: u64) -> bool {
    rec.wake.as_ref().is_some_and(|w| w.generation == generation)
}

/// A delivery failed: one more failure, and no attempt before `backoff_ms` from `now_ms`.
pub(super) fn delivery_failed(rec: &mut SubRecord, backoff_ms: i64, now_ms: i64) {
    rec.failures = rec.failures.saturating_add(1);
    rec.next_attempt_ms = now_ms.saturating_add(backoff_ms);
}

#[cfg(test)]
mod tests;
