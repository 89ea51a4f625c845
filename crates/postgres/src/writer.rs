//! Committers: batching within a node. Appends go to committer `hash(path) % K` over a channel;
//! a committer takes every request that is waiting (a *group*), decides them all in one
//! transaction under the streams' row locks, COMMITs once, and only then answers. So a group
//! costs one commit (one WAL flush) however many appends it carries, and 64 producers on one
//! stream share that stream's row lock once per group instead of queueing on it one by one:
//! the measured difference is about 30x (docs/design/issue-11-plan.md, section 12).
//!
//! A group is one [`Round`] of the stream state machine (`oncelog_storage::machine::parking`):
//! a producer request that arrives ahead of its predecessor waits here, in the committer that
//! owns its stream, up to [`oncelog_storage::rules::PARK_TIMEOUT`] from its arrival; when its predecessor is
//! accepted it is decided right behind it in the same transaction. Parked requests are also
//! tried again every [`RETRY_PARKED`] and when another node's commit is announced, in case the
//! predecessor landed through another node; each try decides against the database's state
//! under the row lock, like any append. A transaction the database aborts (deadlock,
//! serialisation) is decided again from the start ([`Round::retry`]).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use oncelog_storage::machine::parking::{AppendReply, ParkingLot, Pending, Round};
use oncelog_storage::machine::{self, Appender};
use oncelog_storage::rules::Retention;
use oncelog_storage::*;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::error::Fail;
use crate::group::Group;
use crate::shared::Shared;

/// How often parked requests are tried again when nothing on this node woke them.
pub(crate) const RETRY_PARKED: Duration = Duration::from_millis(20);

/// Most requests in one group: a bound on one transaction's size and lock set.
const MAX_GROUP: usize = 1024;
/// Most bytes in one group.
const MAX_GROUP_BYTES: usize = 16 << 20;

// Appends are nearly every command: boxing the large variant would add an allocation to each.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Cmd {
    Append {
        req: AppendRequest,
        reply: AppendReply,
        arrival: Instant,
    },
    /// Finish what is queued, answer parked requests, then stop.
    Stop(oneshot::Sender<()>),
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
            self.commit(std::mem::take(&mut queue)).await;
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
            Cmd::Append { req, reply, arrival } => queue.push(Pending::new(req, reply, arrival.into_std())),
            Cmd::Stop(done) => *stop = Some(done),
        }
    }

    /// Every parked request, to be tried again.
    fn unpark_all(&mut self) -> Vec<Pending> {
        self.lot.take_due(std::time::Instant::now() + Duration::from_secs(3600))
    }

    /// Commits one group (deciding it again after a transaction the database aborted as a
    /// deadlock or serialisation failure), answers its requests and parks the early ones.
    async fn commit(&mut self, mut batch: Vec<Pending>) {
        let (started, commands) = (std::time::Instant::now(), batch.len());
        let mut attempt = 0;
        let (round, group) = loop {
            let mut round = Round::default();
            let deadline = self.shared.deadline;
            let attempt_result = match tokio::time::timeout(deadline, self.try_group(&mut batch, &mut round)).await {
                Ok(r) => r,
                // Possibly in the middle of COMMIT: the outcome is unknown, so every request
                // of the group is answered 503 (never 2xx), and the connection is not reused.
                Err(_) => Err(self.shared.stalled()),
            };
            match attempt_result {
                Ok(group) => break (round, group),
                Err(f) => {
                    // Everything this attempt took on, released successors included.
                    let mut again = round.retry();
                    again.append(&mut batch);
                    batch = again;
                    if f.retryable() && attempt < 3 {
                        attempt += 1;
                        continue;
                    }
                    let e = StorageError::from(f);
                    self.shared.note_failure(&e);
                    for p in batch {
                        let _ = p.reply.send(Err(AppendError::Storage(e.clone())));
                    }
                    return;
                }
            }
        };
        machine::record_group_commit(commands, started.elapsed());
        self.shared.note_success();
        self.shared.stats.add_producers(group.new_producers as i64);
        for id in group.changed_ids() {
            self.shared.published(id);
        }
        round.settle(&mut self.lot, |reply, result| {
            let _ = reply.send(result);
        });
    }

    /// One attempt: the requests of `batch` (taken out as they are decided) decided in `round`
    /// in one transaction, committed.
    ///
    /// Two round trips: `BEGIN` with the reads that lock and load the streams, then the write
    /// with `COMMIT` (`Group::load`, `Group::flush`).
    async fn try_group(&mut self, batch: &mut Vec<Pending>, round: &mut Round) -> Result<Group, Fail> {
        let open = Unfinished(Some(self.shared.pool.get().await?));
        let c = open.client();
        let reqs: Vec<&AppendRequest> = batch.iter().map(|p| &p.req).collect();
        let mut group = Group::load(c, &reqs, true, &self.shared.retention).await?;
        let now = std::time::Instant::now();
        let mut deciding = Deciding::new(&mut group, &self.shared, false);
        for p in batch.drain(..) {
            round.decide(p, &mut self.lot, now, true, &mut |r| deciding.append(r));
        }
        group.flush(c, true).await?;
        open.finished();
        Ok(group)
    }
}

/// A pooled connection inside a transaction this committer opened with a bare `BEGIN` (so that
/// it travels with the first reads). Unless the transaction ended, the connection is taken out
/// of the pool when this is dropped (an error, a deadline that cancelled the group): closing
/// it ends the transaction, and the next user of the pool never finds one left open.
struct Unfinished(Option<deadpool_postgres::Client>);

impl Unfinished {
    fn client(&self) -> &deadpool_postgres::Client {
        self.0.as_ref().unwrap_or_else(|| unreachable!("taken only by finished()"))
    }

    /// `COMMIT` returned: the connection goes back to the pool.
    fn finished(mut self) {
        drop(self.0.take());
    }
}

impl Drop for Unfinished {
    fn drop(&mut self) {
        if let Some(c) = self.0.take() {
            drop(deadpool_postgres::Client::take(c));
        }
    }
}

/// A group being decided, as the machine's [`Appender`] (transactions use it too).
pub(crate) struct Deciding<'a> {
    pub group: &'a mut Group,
    pub shared: &'a Shared,
    pub retention: &'a Retention,
    /// This node's count of producer states when deciding began (`--max-producers` is enforced
    /// per node: see docs/OPERATIONS.md).
    producers_at_start: u64,
    /// A transaction: its checks and its appends compare the same count, so a new producer of
    /// one append cannot refuse a later append whose check passed.
    txn: bool,
}

impl<'a> Deciding<'a> {
    pub fn new(group: &'a mut Group, shared: &'a Shared, txn: bool) -> Self {
        let producers_at_start = u64::try_from(shared.stats.producers.load(Ordering::Relaxed)).unwrap_or(0);
        Deciding { group, shared, retention: &shared.retention, producers_at_start, txn }
    }

    /// The producer count `--max-producers` is compared with: this node's count, with the
    /// producers the group created so far (not yet committed, so not yet counted).
    fn producers_total(&self) -> u64 {
        if self.txn {
            self.producers_at_start
        } else {
            self.producers_at_start.saturating_add(self.group.new_producers)
        }
    }
}

impl Appender for Deciding<'_> {
    fn append(&mut self, req: &AppendRequest) -> Result<AppendOutcome, AppendError> {
        let total = self.producers_total();
        self.group.decide(req, self.shared, self.retention, total)
    }

    fn check(&mut self, req: &AppendRequest) -> Result<(), AppendError> {
        let total = self.producers_total();
        self.group.check(req, self.shared, self.retention, total)
    }

    fn diverged(&mut self, e: AppendError) -> StorageError {
        StorageError::Backend(Arc::new(e))
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
