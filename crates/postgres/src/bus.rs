//! Wake-ups between nodes. After a commit, a node wakes its own waiters at once and tells the
//! other nodes with `pg_notify`, **batched and never inside the append's transaction**: NOTIFY
//! takes a database-wide lock held until commit, which cut append throughput about 8x when it
//! was (measured, docs/design/issue-11-plan.md section 12). A dedicated connection `LISTEN`s
//! (a pooled one cannot: its messages are polled privately), wakes this node's waiters of the
//! streams named and kicks its parked requests. Notifications can be lost (a reconnect, a
//! full queue), so a poll of the streams this node's readers wait on, every [`TAIL_POLL`],
//! is the safety net; after a reconnect every waiter is woken to look again.
//!
//! Payload: `"<node id hex> <stream id hex> <stream id hex> …"`, at most [`MAX_PAYLOAD`] bytes
//! (PostgreSQL's limit is 8000); a node skips its own.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::mpsc;
use tokio_postgres::AsyncMessage;
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::row::i64_of;
use crate::shared::Shared;

/// Least time between two notifications of one node: each is a small transaction that takes
/// the database's notification lock, and sending one per group cost about 20% of the append
/// rate (S1, one node; docs/BENCHMARKS.md). Wake-ups on other nodes wait this much at most.
pub(crate) const NOTIFY_EVERY: Duration = Duration::from_millis(5);

/// The safety-net poll of watched streams' tails.
pub(crate) const TAIL_POLL: Duration = Duration::from_secs(1);
const MAX_PAYLOAD: usize = 7_900;

/// The channel of a schema's cluster (an identifier: at most 63 bytes).
pub(crate) fn channel(schema: &str) -> String {
    let mut c = format!("oncelog_{schema}");
    c.truncate(63);
    c
}

/// Sends this node's commits to the others: waits for one stream id, takes every other one
/// queued meanwhile, sends them in as few notifications as fit, repeats. While one batch is
/// being sent the next accumulates, so the rate of notifications adapts to the database.
pub(crate) async fn notifier(shared: Arc<Shared>, mut rx: mpsc::UnboundedReceiver<u64>) {
    let channel = channel(&shared.schema);
    let prefix = format!("{:x}", shared.node);
    let mut last = tokio::time::Instant::now();
    while let Some(first) = rx.recv().await {
        // Paced: what commits meanwhile rides along in the same notification.
        tokio::time::sleep_until(last + NOTIFY_EVERY).await;
        last = tokio::time::Instant::now();
        let mut ids = HashSet::from([first]);
        while let Ok(id) = rx.try_recv() {
            ids.insert(id);
        }
        let mut payloads = Vec::new();
        let mut p = prefix.clone();
        for id in ids {
            let item = format!(" {id:x}");
            if p.len() + item.len() > MAX_PAYLOAD {
                payloads.push(std::mem::replace(&mut p, prefix.clone()));
            }
            p.push_str(&item);
        }
        payloads.push(p);
        let sent = async {
            let c = shared.client().await?;
            let stmt = c.prepare_cached("SELECT pg_notify($1, $2)").await?;
            for p in &payloads {
                c.query(&stmt, &[&channel, p]).await?;
            }
            Ok::<(), crate::error::Fail>(())
        };
        if let Err(f) = sent.await {
            // Left to the other nodes' tail poll.
            tracing::debug!(error = ?f, "could not notify other nodes");
        }
    }
}

/// Listens for the other nodes' commits; reconnects with backoff after losing its connection
/// (readiness reports the loss meanwhile) and then wakes every waiter, as notifications may
/// have been missed.
pub(crate) async fn listener(shared: Arc<Shared>, cfg: tokio_postgres::Config, tls: MakeRustlsConnect) {
    let channel = channel(&shared.schema);
    let mut backoff = Duration::from_millis(100);
    loop {
        match listen_once(&shared, &cfg, &tls, &channel).await {
            Ok(()) => backoff = Duration::from_millis(100),
            Err(e) => {
                shared.set_listen_down(Some(format!("PostgreSQL unreachable: {e}")));
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
            }
        }
    }
}

async fn listen_once(
    shared: &Shared,
    cfg: &tokio_postgres::Config,
    tls: &MakeRustlsConnect,
    channel: &str,
) -> Result<(), tokio_postgres::Error> {
    let (client, mut conn) = cfg.connect(tls.clone()).await?;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let driver = tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| conn.poll_message(cx));
        while let Some(m) = messages.next().await {
            match m {
                Ok(AsyncMessage::Notification(n)) => {
                    if tx.send(n.payload().to_owned()).is_err() {
                        return Ok(());
                    }
                }
                Ok(_) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    });
    client.batch_execute(&format!("LISTEN {channel}")).await?;
    shared.set_listen_down(None);
    // Anything committed while this node was not listening: every waiter looks again.
    shared.watches.wake_all();
    shared.kick.notify_waiters();
    let own = format!("{:x}", shared.node);
    let mut poll = tokio::time::interval(TAIL_POLL);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut seen: HashMap<u64, (i64, bool)> = HashMap::new();
    loop {
        tokio::select! {
            payload = rx.recv() => {
                let Some(payload) = payload else { break };
                let mut parts = payload.split(' ');
                if parts.next() == Some(own.as_str()) {
                    continue;
                }
                for id in parts.filter_map(|p| u64::from_str_radix(p, 16).ok()) {
                    shared.watches.wake(id);
                }
                shared.kick.notify_waiters();
            }
            _ = poll.tick() => {
                if let Err(e) = poll_watched(shared, &client, &mut seen).await {
                    tracing::debug!(error = %e, "tail poll failed");
                    break;
                }
            }
        }
    }
    drop(client);
    match driver.await {
        Ok(Err(e)) => Err(e),
        _ => Ok(()),
    }
}

/// Wakes the waiters of every watched stream whose tail, closure or existence changed since the
/// last poll (or that this poll sees for the first time).
async fn poll_watched(
    shared: &Shared,
    client: &tokio_postgres::Client,
    seen: &mut HashMap<u64, (i64, bool)>,
) -> Result<(), tokio_postgres::Error> {
    let watched = shared.watches.watched();
    if watched.is_empty() {
        seen.clear();
        return Ok(());
    }
    let ids: Vec<i64> = watched.iter().map(|id| i64_of(*id)).collect();
    let rows = client.query("SELECT id, tail, closed OR soft_deleted FROM streams WHERE id = ANY($1)", &[&ids]).await?;
    let mut now: HashMap<u64, (i64, bool)> = HashMap::new();
    for r in &rows {
        if let Ok(id) = u64::try_from(r.get::<_, i64>(0)) {
            now.insert(id, (r.get(1), r.get(2)));
        }
    }
    for id in watched {
        if now.get(&id) != seen.get(&id) || !now.contains_key(&id) {
            shared.watches.wake(id);
        }
    }
    *seen = now;
    Ok(())
}
