//! Failover of the PostgreSQL engine: the primary dies mid-load and a synchronous standby is
//! promoted; two `oncelog serve` nodes find the new primary by themselves.
//!
//! Setup (all private, all stopped however the test ends): a primary cluster and a synchronous
//! streaming standby of it (`scripts/postgres start` and `standby`: pg_basebackup with a
//! replication slot, `synchronous_standby_names` naming it, `synchronous_commit=on`), each in
//! a temporary directory; two nodes on the two-host URL as libpq writes it,
//! `postgres://oncelog@127.0.0.1:P1,127.0.0.1:P2/postgres?target_session_attrs=read-write`, in
//! a schema of their own.
//!
//! Load: [`PRODUCERS`] idempotent producers on one text stream, [`PER_PRODUCER`] appends each,
//! [`IN_FLIGHT`] in flight per producer; producer `i` sends to node `i % 2` (so both nodes
//! carry load), and every retry (same epoch, seq and body) goes to the other node in turn,
//! after a 503, a 409 (predecessor not in yet) or no answer, until it is acknowledged
//! (`common::load`). Live readers, SSE and long-poll, on each node.
//!
//! Failover: once a third of the appends are acknowledged, the primary is killed
//! (`pg_ctl -m immediate`, like a power cut) while a COMMIT carrying appends is in flight, at
//! one of two [`Moment`]s, so the node that sent it cannot know its outcome; for [`OUTAGE`]
//! there is no primary (both nodes' `/readyz` must say 503 with a reason), then the standby is
//! promoted (`pg_ctl promote`). The two moments are the two answers the requirement names for
//! the retry of such a commit: 200 if it had not committed, 204 with the original offset if it
//! had. Which appends that COMMIT carried is read from the primary's pages (`pageinspect`,
//! the tuples of its transaction id) just before the kill. Both moments are made, not waited
//! for by luck: a process of the private clusters is paused with SIGSTOP (see [`Moment`]).
//!
//! Afterwards:
//! - both nodes' `/readyz` is 200 within [`READY_WITHIN`] of the promotion, with no restart;
//! - every request was acknowledged (the producers finish after the failover); no answer was
//!   a 500 or another status the protocol does not give here;
//! - the final stream holds every acknowledged append exactly once, in order per producer,
//!   ending at the offset its 200 or 204 gave, and nothing that was never sent;
//! - the appends of the COMMIT in flight were first answered 503 or not at all (never 2xx),
//!   and their retries 200 ([`Moment::BeforeFlush`]) or 204 ([`Moment::AwaitingStandby`]);
//! - every reader's bytes are a prefix of the final stream, and each reader reached its end.
//!
//! Mutant: a COMMIT whose outcome is unknown (the connection died before its answer) answered
//! as success → in [`Moment::BeforeFlush`], acknowledged appends missing from the stream (and
//! the producers' next requests refused as gaps until the test gives up, [`GIVE_UP`]); in
//! [`Moment::AwaitingStandby`], the appends of the COMMIT in flight answered 200 at once
//! instead of 503: both scenarios fail.
//!
//! Needs, besides the PostgreSQL server binaries, `psql` and the `pageinspect` extension (both
//! in Debian's `postgresql` package).
//!
//! The two scenarios take turns (one lock): the machine has two cores.

#![cfg(unix)]

mod common;

use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::load::{
    check_stream, close_stream, create_stream, parse_record, producer, read_all, readyz, tail, Load, Route, Tally,
};
use common::pg::{schema, Cluster, Node};
use oncelog_client::LiveMode;
use reqwest::StatusCode;

const STREAM: &str = "failover";
const PRODUCERS: usize = 8;
const PER_PRODUCER: u64 = 150;
const IN_FLIGHT: usize = 4;
const TOTAL: usize = PRODUCERS * PER_PRODUCER as usize;
/// The primary is killed once this many appends are acknowledged (at the next COMMIT of the
/// chosen moment).
const CRASH_AT: usize = TOTAL / 3;
/// From the crash to the promotion: no primary at all meanwhile.
const OUTAGE: Duration = Duration::from_millis(1500);
/// Both nodes ready again within this long of the promotion.
const READY_WITHIN: Duration = Duration::from_secs(10);
/// How long readiness is watched after the promotion (to say how late it was, if it was).
const READY_WATCH: Duration = Duration::from_secs(30);
/// Requests not acknowledged this long after the load began are given up (the test fails).
const GIVE_UP: Duration = Duration::from_secs(90);

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// When, in the life of a COMMIT carrying appends, the primary is killed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Moment {
    /// Received, not yet durable anywhere: `commit_delay` on the primary makes every COMMIT
    /// sleep 100 ms holding the WAL write lock before it flushes its commit record; the
    /// backend is caught in that sleep and frozen there (SIGSTOP, sent at once by the database
    /// session that found it), so that record is never flushed (nothing else can flush while
    /// it holds the lock) nor sent to the standby. Then the primary is killed (its postmaster
    /// SIGKILLs the frozen backend after 5 s). The commit is lost with the primary: its
    /// retries must be new data (200); an engine that answered it 2xx has lost those appends.
    BeforeFlush,
    /// Durable on the standby, not yet answered: the standby's WAL receiver is paused
    /// (SIGSTOP) so the primary's COMMIT waits for the standby (wait event `SyncRep`) with its
    /// WAL already sent; the kill comes then, and the receiver resumes and takes that WAL in
    /// before the promotion. The commit survives: its retries must be duplicates (204) with the
    /// original offsets.
    AwaitingStandby,
}

/// On the primary (with `pageinspect`): waits up to `patience` for a COMMIT in progress in
/// the phase asked for (`sync_rep`: waiting for the standby; else in `commit_delay`'s sleep,
/// where the backend is frozen at once with `kill -STOP`, run by the server as the OS user
/// that owns the backend) whose transaction inserted rows into `data`; answers
/// `'<xid> <their bytes>'`, or `'none'` when only COMMITs without appends wait for a paused
/// standby (nothing will change), or `'timeout'`. Rows of an uncommitted transaction are read
/// from the pages, where they already are. A backend whose commit finished before the stop
/// landed (the commit log says so) is let go and another is caught.
const FAILOVER_COMMIT: &str = r#"
CREATE FUNCTION public.failover_commit(sync_rep bool, data regclass, patience interval) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
  t0 timestamptz := clock_timestamp();
  b record;
  recs text;
  waiting bool;
BEGIN
  LOOP
    PERFORM pg_stat_clear_snapshot();
    waiting := false;
    FOR b IN SELECT pid, backend_xid AS x FROM pg_stat_activity
             WHERE pid <> pg_backend_pid() AND state = 'active' AND query = 'COMMIT' AND backend_xid IS NOT NULL
               AND CASE WHEN sync_rep THEN wait_event = 'SyncRep' ELSE wait_event IS NULL OR wait_event = 'CommitDelay' END
    LOOP
      waiting := true;
      SELECT string_agg(convert_from(substring(h.t_attrs[3] FROM 2), 'UTF8'), '') INTO recs
        FROM generate_series(0, pg_relation_size(data) / current_setting('block_size')::int - 1) AS p,
             LATERAL heap_page_item_attrs(get_raw_page(data::text, p::int), data) AS h
       WHERE h.t_xmin = b.x;
      IF recs IS NOT NULL THEN
        IF NOT sync_rep THEN
          -- The program reads what COPY writes before it acts: a program that exits first
          -- leaves COPY writing into a closed pipe (`could not close pipe to external
          -- command: Broken pipe`, seen once in a CI-like run).
          EXECUTE format('COPY (SELECT 1) TO PROGRAM %L', 'cat >/dev/null; kill -STOP ' || b.pid);
          -- The stop may land after the commit finished (the snapshot above is a moment ago,
          -- starting the shell takes milliseconds): then the node has its answer and nothing is
          -- in flight. The commit log turns committed before the backend answers; a transaction
          -- still in progress there is frozen before its answer. Otherwise let it go, try again.
          IF pg_xact_status(b.x::text::xid8) IS DISTINCT FROM 'in progress' THEN
            EXECUTE format('COPY (SELECT 1) TO PROGRAM %L', 'cat >/dev/null; kill -CONT ' || b.pid);
            CONTINUE;
          END IF;
        END IF;
        RETURN b.x::text || ' ' || recs;
      END IF;
    END LOOP;
    IF waiting AND sync_rep THEN
      RETURN 'none';
    END IF;
    IF clock_timestamp() - t0 > patience THEN
      RETURN 'timeout';
    END IF;
    PERFORM pg_sleep(0.001);
  END LOOP;
END $$"#;

/// Sends `sig` to the process `pid` (one of the standby's, which this test started), with
/// bash's own `kill` (a minimal system may have no /bin/kill); whether it was sent.
fn signal(sig: &str, pid: u32) -> bool {
    Command::new("bash").arg("-c").arg(format!("kill -{sig} {pid}")).status().is_ok_and(|s| s.success())
}

/// A paused process, resumed when dropped (also when the test fails, so the cluster can stop).
struct Paused(Option<u32>);

impl Paused {
    fn pause(pid: u32) -> Paused {
        assert!(signal("STOP", pid), "kill -STOP {pid}");
        Paused(Some(pid))
    }

    fn resume(&mut self) {
        if let Some(pid) = self.0.take() {
            // Not checked: it may be gone (a failing test's cluster stops anyway).
            signal("CONT", pid);
        }
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        self.resume();
    }
}

/// The COMMIT the kill caught: its transaction id and the appends it carried.
#[derive(Debug, Clone)]
struct InFlight {
    xid: String,
    appends: Vec<(usize, u64)>,
}

/// Waits for a COMMIT carrying appends at `moment` and kills the primary then; returns what
/// it caught (or why nothing) and when the primary was gone.
fn kill_primary_at(
    moment: Moment,
    primary: &Cluster,
    standby: &Cluster,
    schema: &str,
) -> (Result<InFlight, String>, Instant, usize) {
    let call = |sync_rep: bool| format!("SELECT public.failover_commit({sync_rep}, '{schema}.data', '10 s')");
    let mut tries = 0;
    let caught = match moment {
        // The backend caught is frozen before its commit record is flushed: the kill may come
        // at leisure.
        Moment::BeforeFlush => {
            tries += 1;
            let caught = primary.sql(&[&call(false)]);
            primary.crash();
            (caught, Instant::now())
        }
        // Paused, the standby holds up the first COMMIT that writes anything, which may be one
        // that carries no appends (a group of requests that all wait for predecessors still
        // locks the stream's row): then the receiver runs again and the next one is tried.
        Moment::AwaitingStandby => {
            let until = Instant::now() + Duration::from_secs(20);
            loop {
                tries += 1;
                let pid = standby.sql(&["SELECT pid FROM pg_stat_wal_receiver"]).expect("the standby's WAL receiver");
                let pid: u32 = pid.parse().unwrap_or_else(|_| panic!("no WAL receiver on the standby: {pid:?}"));
                let mut receiver = Paused::pause(pid);
                let caught = primary.sql(&[&call(true)]);
                if !matches!(caught.as_deref(), Ok("none")) || Instant::now() > until {
                    primary.crash();
                    let gone = Instant::now();
                    receiver.resume();
                    break (caught, gone);
                }
                receiver.resume();
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    };
    let (caught, gone) = caught;
    let in_flight = caught.and_then(|text| {
        let (xid, recs) = text.split_once(' ').ok_or_else(|| format!("no COMMIT carrying appends seen: {text}"))?;
        let appends = recs
            .split_terminator(';')
            .map(|r| parse_record(r).ok_or_else(|| format!("not a record: {r:?}")))
            .collect::<Result<_, _>>()?;
        Ok(InFlight { xid: xid.to_owned(), appends })
    });
    (in_flight, gone, tries)
}

/// What the failover looked like from outside.
#[derive(Debug, Default)]
struct Failover {
    /// Acknowledged appends when the primary was killed, and requests in flight then.
    acked_at_crash: usize,
    in_flight_at_crash: usize,
    /// The COMMIT the kill caught (or why none), after how many tries.
    caught: Option<Result<InFlight, String>>,
    tries: usize,
    /// Each node's first `/readyz` answer that was not 200 during the outage (status, body).
    outage_readyz: Vec<Option<(StatusCode, String)>>,
    /// From the crash to the promotion's start; how long `pg_ctl promote` took.
    crash_to_promote: Duration,
    promote_took: Duration,
    /// From the promotion's start until each node's `/readyz` was 200 (and both at once).
    ready_after: Vec<Option<Duration>>,
    both_ready_after: Option<Duration>,
    /// The moment the promotion started.
    promoted_at: Option<Instant>,
}

#[test]
fn failover_while_a_commit_is_not_yet_durable_loses_and_duplicates_nothing() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    failover(Moment::BeforeFlush);
}

#[test]
fn failover_while_a_commit_awaits_the_standby_loses_and_duplicates_nothing() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    failover(Moment::AwaitingStandby);
}

fn failover(moment: Moment) {
    let started = Instant::now();
    // Shared with the blocking tasks that kill the primary and promote the standby; each is
    // stopped when the last handle goes, however the test ends.
    let primary = Arc::new(Cluster::start());
    let standby = Arc::new(Cluster::standby_of(&primary));
    let mut setup = vec!["CREATE EXTENSION pageinspect", FAILOVER_COMMIT];
    if moment == Moment::BeforeFlush {
        // After the copy: the standby, once promoted, commits without the delay.
        setup.extend([
            "ALTER SYSTEM SET commit_delay = 100000",
            "ALTER SYSTEM SET commit_siblings = 0",
            "SELECT pg_reload_conf()",
        ]);
    }
    primary.sql(&setup).expect("setting up the primary");
    let url = format!(
        "postgres://oncelog@127.0.0.1:{},127.0.0.1:{}/postgres?target_session_attrs=read-write",
        primary.port(),
        standby.port()
    );
    let schema = schema("failover", if moment == Moment::BeforeFlush { "flush" } else { "standby" });
    let dir = tempfile::tempdir().expect("tempdir");
    let a = Node::start(&url, &schema, dir.path().join("a.log"));
    let b = Node::start(&url, &schema, dir.path().join("b.log"));
    let urls = vec![a.url(), b.url()];
    let _logs = LogsOnFailure(&a, &b);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");

    let (tally, failover, readers, whole, whole_b) = rt.block_on(async {
        create_stream(&urls[0], STREAM).await;
        let give_up = Instant::now() + GIVE_UP;
        let load = Load {
            stream: STREAM.into(),
            urls: Arc::new(urls.clone()),
            route: Route::Sticky,
            in_flight: IN_FLIGHT,
            give_up,
        };
        let tally = Arc::new(Mutex::new(Tally::default()));
        let never = Arc::new(AtomicBool::new(false));
        // Live readers on both nodes, from the beginning, until the stream is closed.
        let readers: Vec<_> =
            [(0, LiveMode::Sse), (0, LiveMode::LongPoll), (1, LiveMode::Sse), (1, LiveMode::LongPoll)]
                .into_iter()
                .map(|(node, mode)| {
                    let sink = Arc::new(Mutex::new(Vec::new()));
                    let task = tokio::spawn(tail(urls[node].clone(), STREAM.into(), mode, sink.clone()));
                    (format!("{mode:?} via node {}", ["A", "B"][node]), sink, task)
                })
                .collect();
        let producers: Vec<_> = (0..PRODUCERS)
            .map(|i| tokio::spawn(producer(i, load.clone(), Some(PER_PRODUCER), never.clone(), tally.clone())))
            .collect();

        // Mid-load: kill the primary while a COMMIT is in flight, leave the nodes without one
        // for OUTAGE, promote.
        let mut f = Failover::default();
        let waiting = Instant::now();
        loop {
            let (acked, issued) = {
                let t = tally.lock().expect("tally");
                (t.acked.len(), t.issued.values().sum::<u64>() as usize)
            };
            if acked >= CRASH_AT {
                f.acked_at_crash = acked;
                f.in_flight_at_crash = issued - acked;
                break;
            }
            assert!(
                waiting.elapsed() < Duration::from_secs(60),
                "the load did not reach {CRASH_AT} acknowledged appends within 60 s ({acked})"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let (primary2, standby2, schema2) = (primary.clone(), standby.clone(), schema.clone());
        let (caught, crashed, tries) =
            tokio::task::spawn_blocking(move || kill_primary_at(moment, &primary2, &standby2, &schema2))
                .await
                .expect("kill the primary");
        (f.caught, f.tries) = (Some(caught), tries);
        f.outage_readyz = vec![None; urls.len()];
        while crashed.elapsed() < OUTAGE {
            for (k, u) in urls.iter().enumerate() {
                if f.outage_readyz[k].is_none() {
                    f.outage_readyz[k] = readyz(u).await.filter(|(s, _)| *s != StatusCode::OK);
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let standby2 = standby.clone();
        let promoting = Instant::now();
        f.crash_to_promote = promoting - crashed;
        f.promoted_at = Some(promoting);
        tokio::task::spawn_blocking(move || standby2.promote()).await.expect("promote");
        f.promote_took = promoting.elapsed();
        f.ready_after = vec![None; urls.len()];
        while promoting.elapsed() < READY_WATCH {
            let mut all = true;
            for (k, u) in urls.iter().enumerate() {
                let ok = readyz(u).await.is_some_and(|(s, _)| s == StatusCode::OK);
                if ok && f.ready_after[k].is_none() {
                    f.ready_after[k] = Some(promoting.elapsed());
                }
                all &= ok;
            }
            if all {
                f.both_ready_after = Some(promoting.elapsed());
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }

        for p in producers {
            p.await.expect("producer");
        }
        let tally = Arc::try_unwrap(tally).ok().expect("producers done").into_inner().expect("tally");
        // The final stream, closed so the live readers end, as each node serves it.
        close_stream(&urls[0], STREAM).await;
        let whole = read_all(&urls[0], STREAM).await;
        let whole_b = read_all(&urls[1], STREAM).await;
        let mut ended = Vec::new();
        for (name, sink, task) in readers {
            let outcome = match tokio::time::timeout(Duration::from_secs(30), task).await {
                Ok(Ok(r)) => r,
                Ok(Err(e)) => Err(format!("reader task: {e}")),
                Err(_) => Err("still reading 30 s after the stream was closed".into()),
            };
            let bytes = sink.lock().expect("sink").clone();
            ended.push((name, bytes, outcome));
        }
        (tally, f, ended, whole, whole_b)
    });

    // What the new primary says of the transaction the kill caught, when it can know it: a
    // transaction id none of whose records reached the standby may be given anew after the
    // promotion (BeforeFlush).
    let fate = match (&failover.caught, moment) {
        (Some(Ok(c)), Moment::AwaitingStandby) => standby.sql(&[&format!("SELECT pg_xact_status('{}'::xid8)", c.xid)]),
        (Some(Ok(_)), Moment::BeforeFlush) => Err("not asked".into()),
        _ => Err("no COMMIT caught".into()),
    };
    let acked = tally.acked.len();
    // Signed: negative is before the promotion.
    let since_promotion = |t: Option<Instant>| match (t, failover.promoted_at) {
        (Some(t), Some(p)) if t >= p => format!("{:+.2} s", (t - p).as_secs_f64()),
        (Some(t), Some(p)) => format!("{:+.2} s", -(p - t).as_secs_f64()),
        _ => "never".into(),
    };
    let caught = failover.caught.clone().unwrap_or_else(|| Err("no kill".into()));
    // How the appends of the COMMIT in flight were answered in the end (status of the first
    // acknowledgement), and whether an attempt had been answered 503 or not at all before.
    let answers: Vec<String> = caught
        .as_ref()
        .map(|c| {
            c.appends
                .iter()
                .map(|k| {
                    let status = tally.acked.get(k).map_or("none".into(), |a| a.status.to_string());
                    format!(
                        "p{}-{}: {}{}",
                        k.0,
                        k.1,
                        if tally.uncertain.contains(k) { "503/no answer, then " } else { "" },
                        status
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    eprintln!(
        "failover ({moment:?}): {acked}/{TOTAL} acknowledged ({} as 200, {} as 204 duplicates), {} retries, {} 503s (last {} from the promotion), {} without answer (last {}), {} gap answers; \
         killed at {} acknowledged with {} in flight, {} tr{} to catch a COMMIT: xid {} ({:?} on the new primary), carrying {} appends answered [{}]; \
         promotion {:.2} s after the kill, took {:.2} s; /readyz during the outage {:?}; ready after the promotion: A {:?}, B {:?}, both {:?}; {:.1} s in all",
        tally.appended,
        tally.duplicates,
        tally.retries,
        tally.unavailable,
        since_promotion(tally.last_unavailable),
        tally.no_answer,
        since_promotion(tally.last_no_answer),
        tally.gaps,
        failover.acked_at_crash,
        failover.in_flight_at_crash,
        failover.tries,
        if failover.tries == 1 { "y" } else { "ies" },
        caught.as_ref().map_or_else(|e| format!("none ({e})"), |c| c.xid.clone()),
        fate,
        caught.as_ref().map_or(0, |c| c.appends.len()),
        answers.join(", "),
        failover.crash_to_promote.as_secs_f64(),
        failover.promote_took.as_secs_f64(),
        failover.outage_readyz,
        failover.ready_after[0],
        failover.ready_after[1],
        failover.both_ready_after,
        started.elapsed().as_secs_f64(),
    );

    // Exactly once first: it says the most about a wrong answer.
    let records = check_stream(&whole, &tally);
    assert!(whole == whole_b, "the nodes serve different streams: A {} bytes, B {} bytes", whole.len(), whole_b.len());
    assert!(
        tally.wrong.is_empty(),
        "answers that must not happen ({}): {:?}",
        tally.wrong.len(),
        &tally.wrong[..tally.wrong.len().min(10)]
    );
    let unacked: Vec<(usize, u64)> = (0..PRODUCERS)
        .flat_map(|i| (0..PER_PRODUCER).map(move |s| (i, s)))
        .filter(|k| !tally.acked.contains_key(k))
        .collect();
    assert!(
        unacked.is_empty(),
        "{} of {TOTAL} appends never acknowledged within {GIVE_UP:?} (e.g. {:?}): the nodes did not serve the producers after the failover",
        unacked.len(),
        &unacked[..unacked.len().min(10)]
    );
    assert_eq!(records, TOTAL, "the final stream holds every append once");
    for (k, o) in failover.outage_readyz.iter().enumerate() {
        let reason = o.as_ref().filter(|(s, _)| *s == StatusCode::SERVICE_UNAVAILABLE).map(|(_, body)| body.trim());
        assert!(
            reason.is_some_and(|r| r.len() > "not ready:".len()),
            "node {}'s /readyz during the outage: {o:?}, expected 503 with the reason",
            ["A", "B"][k]
        );
    }
    assert!(
        failover.both_ready_after.is_some_and(|t| t <= READY_WITHIN),
        "both nodes ready within {READY_WITHIN:?} of the promotion: A {:?}, B {:?} (watched for {READY_WATCH:?}); /readyz now: A {:?}, B {:?}",
        failover.ready_after[0],
        failover.ready_after[1],
        rt.block_on(readyz(&a.url())),
        rt.block_on(readyz(&b.url()))
    );
    for (name, bytes, outcome) in &readers {
        assert!(
            whole.starts_with(bytes),
            "reader {name}: its {} bytes are not a prefix of the final stream ({} bytes); first difference at byte {}",
            bytes.len(),
            whole.len(),
            bytes.iter().zip(whole.iter()).position(|(x, y)| x != y).unwrap_or(whole.len())
        );
        assert!(
            outcome.is_ok() && bytes.len() == whole.len(),
            "reader {name} did not read to the end ({} of {} bytes): {outcome:?}",
            bytes.len(),
            whole.len()
        );
    }
    // The COMMIT in flight: never answered 2xx before its outcome was known, and its retries
    // answered as its fate says. (The stream was checked above: a record answered 204 is in it
    // from before, one answered 200 was written by that answer, each exactly once.)
    let caught =
        caught.unwrap_or_else(|e| panic!("test setup: the kill caught no COMMIT carrying appends ({moment:?}): {e}"));
    for k in &caught.appends {
        assert!(
            tally.uncertain.contains(k),
            "p{}-{} (in the COMMIT in flight, xid {}) was never answered 503 or left unanswered: the kill did not catch that COMMIT in flight, or its unknown outcome was answered as known",
            k.0,
            k.1,
            caught.xid
        );
    }
    let statuses: Vec<Option<u16>> = caught.appends.iter().map(|k| tally.acked.get(k).map(|a| a.status)).collect();
    match moment {
        Moment::BeforeFlush => assert!(
            statuses.iter().all(|s| *s == Some(200)),
            "test setup: the COMMIT of xid {} was to be lost with the primary, but its appends were retried as {statuses:?} (204: it had landed; the kill came too late)",
            caught.xid
        ),
        Moment::AwaitingStandby => {
            // Its transaction id reached the standby with its commit record, so the new primary knows its fate.
            assert_eq!(fate.as_deref(), Ok("committed"), "test setup: the COMMIT of xid {} was to survive on the standby", caught.xid);
            assert!(
                statuses.iter().all(|s| *s == Some(204)),
                "the COMMIT of xid {} survived the failover, but the retries of its appends {:?} were answered {statuses:?}, expected 204 (a duplicate, with the original offset)",
                caught.xid,
                caught.appends
            );
        }
    }
    drop(_logs);
    drop((a, b));
    drop((standby, primary));
}

/// Prints the last lines of both nodes' logs (but 503s) when the test fails (the logs are in a
/// temporary directory that goes with the test).
struct LogsOnFailure<'a>(&'a Node, &'a Node);

impl Drop for LogsOnFailure<'_> {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        for (name, n) in [("A", self.0), ("B", self.1)] {
            let text = n.log_text();
            // Without the 503s every retry during the outage logs.
            let lines: Vec<&str> = text.lines().filter(|l| !l.contains("status=503")).collect();
            eprintln!(
                "--- node {name}'s log, last lines but 503s ---\n{}",
                lines[lines.len().saturating_sub(20)..].join("\n")
            );
        }
    }
}
