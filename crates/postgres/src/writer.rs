//! Committers: batching within a node. Appends go to committer `hash(path) % K` over a channel;
//! a committer takes every request that is waiting (a *group*), decides them all in one
//! transaction under the streams' row locks, COMMITs once, and only then answers. So a group
//! costs one commit (one WAL flush) however many appends it carries, and 64 producers on one
//! stream share that stream's row lock once per group instead of queueing on it one by one:
//! the measured difference is about 30x (docs/design/issue-11-plan.md, section 12).
//!
//! Parking (see [`Engine::append`]): a producer request that arrives ahead of its predecessor
//! waits here, in the committer that owns its stream, up to [`rules::PARK_TIMEOUT`] from its
//! arrival. It is tried again in the group after the one that accepts its predecessor on this
//! node, and every [`RETRY_PARKED`] in case the predecessor landed through another node; each
//! try decides against the database's state under the row lock, like any append.

use std::sync::Arc;
use std::time::Duration;

use oncelog_storage::parking::{AppendReply, ParkingLot};
use oncelog_storage::rules::{self, PARK_TIMEOUT};
use oncelog_storage::*;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::error::Fail;
use crate::group::Group;
use crate::Shared;

/// How often parked requests are tried again when nothing on this node woke them.
pub(crate) const RETRY_PARKED: Duration = Duration::from_millis(20);

/// Most requests in one group: a bound on one transaction's size and lock set.
const MAX_GROUP: usize = 1024;
/// Most bytes in one group.
const MAX_GROUP_BYTES: usize = 16 << 20;

pub(crate) enum Cmd {
    Append { req: AppendRequest, reply: AppendReply, arrival: Instant },
    /// Finish what is queued, answer parked requests, then stop.
    Stop(oneshot::Sender<()>),
}

/// One request of a group.
struct Pending {
    req: AppendRequest,
    reply: AppendReply,
    /// When its parking ends: its arrival + PARK_TIMEOUT.
    deadline: Instant,
}

/// What a group decided for one request.
enum Decision {
    Done(Result<AppendOutcome, AppendError>),
    /// Wait for its predecessor; the refusal it got now (answered if a retry replaces it).
    Park(AppendError),
}

pub(crate) struct Committer {
    pub rx: mpsc::UnboundedReceiver<Cmd>,
    pub shared: Arc<Shared>,
    pub lot: ParkingLot,
}

impl Committer {
    pub async fn run(mut self) {
        let mut queue: Vec<Pending> = Vec::new();
        let mut stop: Option<oneshot::Sender<()>> = None;
        loop {
            if queue.is_empty() {
                if stop.is_some() {
                    break;
                }
                let tick = self.lot.next_deadline().map(|d| {
                    let d = Instant::from_std(d);
                    d.min(Instant::now() + RETRY_PARKED)
                });
                tokio::select! {
                    cmd = self.rx.recv() => match cmd {
                        Some(cmd) => self.accept(cmd, &mut queue, &mut stop),
                        None => break,
                    },
                    _ = sleep_until(tick) => {
                        queue.extend(self.unpark_all());
                    }
                    // Another node committed: a parked request's predecessor may be in.
                    _ = self.shared.kick.notified(), if !self.lot.is_empty() => {
                        queue.extend(self.unpark_all());
                    }
                }
            }
            let mut bytes: usize = queue.iter().map(|p| p.req.data.len()).sum();
            while queue.len() < MAX_GROUP && bytes < MAX_GROUP_BYTES {
                let Ok(cmd) = self.rx.try_recv() else { break };
                if let Cmd::Append { req, .. } = &cmd {
                    bytes += req.data.len();
                }
                self.accept(cmd, &mut queue, &mut stop);
            }
            if queue.is_empty() {
                continue;
            }
            let batch = std::mem::take(&mut queue);
            queue = self.commit(batch).await;
        }
        // Stopping: nothing parked will be tried again.
        for p in self.lot.take_due(std::time::Instant::now() + Duration::from_secs(3600)) {
            let _ = p.reply.send(Err(AppendError::Storage(StorageError::ShuttingDown)));
        }
        if let Some(done) = stop {
            let _ = done.send(());
        }
    }

    fn accept(&mut self, cmd: Cmd, queue: &mut Vec<Pending>, stop: &mut Option<oneshot::Sender<()>>) {
        match cmd {
            Cmd::Append { req, reply, arrival } => queue.push(Pending { req, reply, deadline: arrival + PARK_TIMEOUT }),
            Cmd::Stop(done) => *stop = Some(done),
        }
    }

    /// Every parked request, to be tried again.
    fn unpark_all(&mut self) -> Vec<Pending> {
        let all = self.lot.take_due(std::time::Instant::now() + Duration::from_secs(3600));
        all.into_iter().map(|p| Pending { req: p.req, reply: p.reply, deadline: Instant::from_std(p.deadline) }).collect()
    }

    /// Commits one group (retrying a transaction the database aborted as a deadlock or
    /// serialisation failure), answers its requests, parks the early ones; returns the parked
    /// requests whose predecessor this group accepted, for the next group.
    async fn commit(&mut self, batch: Vec<Pending>) -> Vec<Pending> {
        let mut attempt = 0;
        let (decisions, group) = loop {
            match self.try_group(&batch).await {
                Ok(done) => break done,
                Err(f) if f.retryable() && attempt < 3 => attempt += 1,
                Err(f) => {
                    let e = StorageError::from(f);
                    self.shared.note_failure(&e);
                    for p in batch {
                        let _ = p.reply.send(Err(AppendError::Storage(e.clone())));
                    }
                    return Vec::new();
                }
            }
        };
        self.shared.note_success();
        self.shared.stats.add_producers(group.new_producers as i64);
        for id in group.changed_ids() {
            self.shared.published(id);
        }
        let mut next = Vec::new();
        for (p, d) in batch.into_iter().zip(decisions) {
            match d {
                Decision::Park(answer) => {
                    // Keeps its original deadline across re-parks.
                    if let Some(older) = self.lot.park(p.req, p.reply, (p.deadline - PARK_TIMEOUT).into_std()) {
                        // A retry replaced it; the older copy gets the answer it would have had.
                        let _ = older.reply.send(Err(answer));
                    }
                }
                Decision::Done(result) => {
                    if let (Ok(o), Some(prod)) = (&result, &p.req.producer) {
                        if o.status == AppendStatus::Appended {
                            let state = group.streams.get(&p.req.path).and_then(|st| st.producers.get(&prod.id));
                            if let Some(successor) = state.and_then(|s| self.lot.take(&p.req.path, &prod.id, rules::next_expected(s))) {
                                next.push(Pending { req: successor.req, reply: successor.reply, deadline: Instant::from_std(successor.deadline) });
                            }
                        }
                    }
                    let _ = p.reply.send(result);
                }
            }
        }
        next
    }

    async fn try_group(&self, batch: &[Pending]) -> Result<(Vec<Decision>, Group), Fail> {
        let mut client = self.shared.pool.get().await?;
        let tx = client.transaction().await?;
        let reqs: Vec<&AppendRequest> = batch.iter().map(|p| &p.req).collect();
        let mut group = Group::load(&tx, &reqs).await?;
        let now = Instant::now();
        let retention = self.shared.retention;
        let decisions = batch
            .iter()
            .map(|p| match group.decide(&p.req, &self.shared, &retention) {
                Err(e) if rules::parkable(&p.req, &e) && now < p.deadline => Decision::Park(e),
                r => Decision::Done(r),
            })
            .collect();
        group.flush(&tx).await?;
        tx.commit().await?;
        Ok((decisions, group))
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
