//! The dispatcher's pass over every subscription: the wakes due without an event (leases that
//! ran out with work pending, retry times reached), and the webhook deliveries to hand out.

use super::rules::{self, Woke};
use super::state::Inner;
use super::{Due, SubError, Subscriptions};
use oncelog_storage::engine::Engine;

/// How often the dispatcher's pass looks at every subscription, settled ones included: the
/// safety net for tails that moved without [`Subscriptions::on_write`] (a crash between an
/// append and its wake, a compaction's snapshot, a failed wake).
pub const FULL_PASS_MS: i64 = 10_000;

impl<E: Engine> Subscriptions<E> {
    /// Issues the wakes due without an event: every subscription not settled, and all of them
    /// on a full pass.
    pub(super) async fn issue_due_wakes(&self, inner: &mut Inner, now_ms: i64) -> Result<(), SubError> {
        let ids: Vec<String> = inner.subs.keys().cloned().collect();
        let full = now_ms >= inner.next_full_pass_ms;
        if full {
            inner.next_full_pass_ms = now_ms.saturating_add(FULL_PASS_MS);
        }
        for id in &ids {
            let Some(e) = inner.subs.get(id) else { continue };
            if rules::pass_skips(e, full) {
                continue;
            }
            let mut next = e.clone();
            let event = match self.plan_wake(&mut next, None, now_ms).await? {
                Woke::Nothing => {
                    if let Some(e) = inner.subs.get_mut(id) {
                        e.settled = rules::settles(&e.rec);
                    }
                    continue;
                }
                Woke::Ended => None,
                Woke::Issued(event) => event,
            };
            next.settled = false;
            self.commit_or_reload(inner, next, event, now_ms).await?;
        }
        Ok(())
    }

    /// The live webhook wakes not sent yet (or whose retry time has come), marked in flight;
    /// and the next deadline.
    pub(super) async fn deliveries(&self, inner: &mut Inner, now_ms: i64) -> Result<Due, SubError> {
        let ids: Vec<String> = inner.subs.keys().cloned().collect();
        let mut deliveries = Vec::new();
        let mut deadline: Option<i64> = None;
        for id in &ids {
            let Some(e) = inner.subs.get(id) else { continue };
            let (due_at, send) = rules::delivery(e, now_ms);
            if let Some(t) = due_at {
                deadline = Some(deadline.map_or(t, |d| d.min(t)));
            }
            let Some((generation, url)) = send else { continue };
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
}
