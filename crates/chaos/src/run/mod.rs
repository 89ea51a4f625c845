//! One run: the system (nodes, databases, network, disk), the workloads, the nemesis's seeded
//! schedule, then the check.
//!
//! - `cluster`: the nodes (start, SIGKILL, pause, restart, skewed restart) and the log engine's
//!   small disk;
//! - the log engine on a bucket: the test S3 API server behind
//!   `oncelog_bucket::fault_proxy::FaultProxy` (kept in the `System`);
//! - `net`: the run's network namespaces and its partitions and slow links;
//! - `pg`: the primary and its synchronous standby (pause, failover);
//! - `skew`: the clock-skew library;
//! - `nemesis`: which fault when;
//! - `workload`, `worker`: the clients and the subscription workers;
//! - `record`: the history as it happens.

mod cluster;
mod nemesis;
mod net;
mod pg;
mod record;
mod skew;
mod worker;
mod workload;

use std::ffi::OsString;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};

use crate::check::{self, Violation};
use crate::history::{History, SubsEnd};
use crate::report::Fault;
use cluster::{Node, NodeSpec};
use nemesis::System;
use oncelog_bucket::fault_proxy::FaultProxy;
use workload::Ctx;

/// Which engine the nodes run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// One node, its data directory on a small tmpfs when the run may mount one.
    Log,
    /// Two nodes on a primary and a synchronous standby, each host in a namespace of its own.
    Postgres,
    /// One log-engine node (its data directory as [`Engine::Log`]'s) that keeps its log in a
    /// bucket with `--ack-mode bucket`: the test S3 API server (`ONCELOG_TEST_S3_ENDPOINT`)
    /// behind a fault proxy.
    LogBucket,
}

/// What a run is asked to do.
pub struct Plan {
    pub seed: u64,
    pub duration: Duration,
    pub engine: Engine,
    /// The `oncelog` binary to run.
    pub bin: PathBuf,
    /// `scripts/postgres` (for the PostgreSQL engine).
    pub pg_script: PathBuf,
    /// Where the history, the node's log and the report go.
    pub out: PathBuf,
}

/// What a run found.
pub struct Summary {
    pub operations: usize,
    pub faults: usize,
    pub violations: Vec<Violation>,
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Node(#[from] cluster::NodeError),
    #[error(transparent)]
    Net(#[from] net::NetError),
    #[error(transparent)]
    Pg(#[from] pg::PgError),
    #[error(transparent)]
    Skew(#[from] skew::SkewError),
    #[error(transparent)]
    Fault(#[from] nemesis::FaultError),
    #[error("{0}")]
    Setup(String),
}

const STREAMS: usize = 3;

/// The log engine's data directory: on a 256 MiB tmpfs when the run may mount one (the disk can
/// be filled), else under the run's output; emptied first.
fn log_data_dir(plan: &Plan) -> (Option<cluster::SmallDisk>, PathBuf) {
    let disk = cluster::SmallDisk::mount(&plan.out.join("disk"), 256);
    let data = match &disk {
        Some(d) => d.path().join("data"),
        None => plan.out.join("data"),
    };
    let _ = std::fs::remove_dir_all(&data);
    (disk, data)
}

/// The one node of the log engines: on loopback, no namespace, no clock skew, its log in
/// `node0.log`.
fn local_node(plan: &Plan, storage: Vec<OsString>, env: Vec<(&'static str, String)>) -> NodeSpec {
    NodeSpec {
        bin: plan.bin.clone(),
        storage,
        ip: Ipv4Addr::LOCALHOST,
        netns: None,
        log: plan.out.join("node0.log"),
        skew_lib: None,
        env,
    }
}

/// Starts what `plan.engine` needs.
fn start(plan: &Plan) -> Result<System, RunError> {
    let node_log = |i: usize| plan.out.join(format!("node{i}.log"));
    match plan.engine {
        Engine::Log => {
            let (disk, data) = log_data_dir(plan);
            let storage = vec![OsString::from("--data-dir"), data.into_os_string()];
            let spec = local_node(plan, storage, Vec::new());
            Ok(System { nodes: vec![Node::start(spec)?], bucket: None, pg: None, net: None, disk })
        }
        Engine::LogBucket => {
            // Checked here: the test-support helper would panic without it.
            if std::env::var_os("ONCELOG_TEST_S3_ENDPOINT").is_none_or(|v| v.is_empty()) {
                return Err(RunError::Setup(
                    "--engine log-bucket needs ONCELOG_TEST_S3_ENDPOINT (an S3 API server with the bucket oncelog-test: scripts/s3 start DIR; scripts/chaos starts one)".into(),
                ));
            }
            let proxy = FaultProxy::start(&oncelog_bucket::test_support::s3_endpoint());
            let (disk, data) = log_data_dir(plan);
            // A prefix of the run's own: a fresh bucket for every run.
            let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
            let mut storage = vec![OsString::from("--data-dir"), data.clone().into_os_string()];
            storage.extend(
                [
                    "--object-store",
                    &format!("s3://oncelog-test/chaos-{}-{nanos}", plan.seed),
                    "--ack-mode",
                    "bucket",
                    "--bucket-ack-timeout",
                    "2s",
                ]
                .map(OsString::from),
            );
            let spec = local_node(plan, storage, oncelog_bucket::test_support::s3_env_via(&proxy.url));
            let node = Node::start(spec)?;
            Ok(System {
                nodes: vec![node],
                bucket: Some(nemesis::BucketSide { proxy, data }),
                pg: None,
                net: None,
                disk,
            })
        }
        Engine::Postgres => {
            // Fresh clusters every run (a left-over one would hold the standby's slot).
            for d in ["db0", "db1"] {
                let _ = std::fs::remove_dir_all(plan.out.join(d));
            }
            let net = net::Net::create(&["n0", "n1", "db0", "db1"])?;
            let (db0, db1) = (net.host("db0").clone(), net.host("db1").clone());
            let pg = pg::PgPair::start(
                &plan.pg_script,
                [plan.out.join("db0"), plan.out.join("db1")],
                [db0.ns, db1.ns],
                [db0.ip, db1.ip],
            )?;
            let skew_lib = skew::build(&plan.out)?;
            let mut nodes = Vec::new();
            for i in 0..2 {
                let h = net.host(&format!("n{i}"));
                let storage = ["--storage", &pg.url(), "--pg-schema", "chaos"].map(OsString::from).to_vec();
                let spec = NodeSpec {
                    bin: plan.bin.clone(),
                    storage,
                    ip: h.ip,
                    netns: Some(h.ns.clone()),
                    log: node_log(i),
                    skew_lib: Some(skew_lib.clone()),
                    env: Vec::new(),
                };
                nodes.push(Node::start(spec)?);
            }
            Ok(System { nodes, bucket: None, pg: Some(pg), net: Some(net), disk: None })
        }
    }
}

pub async fn run(plan: &Plan) -> Result<Summary, RunError> {
    std::fs::create_dir_all(&plan.out)?;
    let system = start(plan)?;
    let ctx = Arc::new(Ctx {
        http: reqwest::Client::builder()
            .pool_max_idle_per_host(64)
            .build()
            .map_err(|e| RunError::Setup(e.to_string()))?,
        bases: system.nodes.iter().map(Node::url).collect(),
        rec: record::Recorder::create(&plan.out.join("history.jsonl"))?,
        stop: Default::default(),
        give_up: Default::default(),
        server_errors: Default::default(),
    });
    let inputs: Vec<String> = (0..STREAMS).map(|i| format!("s{i}")).collect();
    let streams: Vec<String> = inputs.iter().cloned().chain(["race".to_owned()]).collect();
    for s in &streams {
        let r = ctx
            .http
            .put(ctx.url(0, s))
            .header("content-type", "text/plain")
            .send()
            .await
            .map_err(|e| RunError::Setup(e.to_string()))?;
        if !r.status().is_success() {
            return Err(RunError::Setup(format!("create {s}: {}", r.status())));
        }
    }
    worker::setup(&ctx, &inputs).await.map_err(RunError::Setup)?;
    let mut tasks = Vec::new();
    for i in 0..6 {
        tasks.push(tokio::spawn(workload::producer(ctx.clone(), format!("p{i}"), i, format!("s{}", i % STREAMS), 3)));
    }
    for i in 0..2 {
        tasks.push(tokio::spawn(workload::keyed(ctx.clone(), format!("k{i}"), i, format!("s{}", i % STREAMS))));
        tasks.push(tokio::spawn(workload::plain(ctx.clone(), format!("a{i}"), i, format!("s{}", (i + 1) % STREAMS))));
        tasks.push(tokio::spawn(workload::racer(ctx.clone(), format!("r{i}"), i, "race".to_owned())));
        tasks.push(tokio::spawn(worker::worker(ctx.clone(), format!("w{i}"), i)));
    }
    for (i, s) in streams.iter().enumerate() {
        tasks.push(tokio::spawn(workload::reader(ctx.clone(), format!("poll-{s}"), i, s.clone())));
        tasks.push(tokio::spawn(workload::sse_reader(ctx.clone(), format!("sse-{s}"), i + 1, s.clone())));
    }

    // The nemesis: faults at seeded moments, on a blocking thread (signals, sleeps, and starting
    // a node blocks until it listens).
    let seed = plan.seed;
    let until = Instant::now() + plan.duration;
    let clock = ctx.clone();
    let nemesis = tokio::task::spawn_blocking(move || -> (System, Vec<Fault>, Option<nemesis::FaultError>) {
        let mut system = system;
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let mut faults = Vec::new();
        loop {
            let wait = Duration::from_millis(rng.random_range(500..3000));
            if Instant::now() + wait >= until {
                break;
            }
            std::thread::sleep(wait);
            let from_ms = clock.rec.now();
            match system.fault(&mut rng) {
                Ok(kind) => faults.push(Fault { from_ms, to_ms: clock.rec.now(), kind }),
                Err(e) => return (system, faults, Some(e)),
            }
        }
        (system, faults, None)
    });
    let (system, faults, failed) = nemesis.await.map_err(|_| RunError::Setup("the nemesis panicked".into()))?;
    if let Some(e) = failed {
        ctx.stop.store(true, Ordering::Relaxed);
        ctx.give_up.store(true, Ordering::Relaxed);
        return Err(e.into());
    }
    // Healed: no new operations; retries get a while to learn their outcomes.
    ctx.stop.store(true, Ordering::Relaxed);
    let settle = tokio::time::sleep(Duration::from_secs(15));
    tokio::pin!(settle);
    let all = futures_util::future::join_all(tasks);
    tokio::pin!(all);
    tokio::select! {
        _ = &mut all => {}
        _ = &mut settle => {
            ctx.give_up.store(true, Ordering::Relaxed);
            all.await;
        }
    }
    let mut finals = std::collections::BTreeMap::new();
    for s in &streams {
        finals.insert(s.clone(), workload::final_contents(&ctx, s).await.map_err(RunError::Setup)?);
    }
    let subs = subscription_end(&ctx).await.map_err(RunError::Setup)?;
    let engine = describe(plan, &system);
    // Everything the run started ends here, in order (nodes, the bucket's proxy, databases,
    // network, disk).
    drop(system);
    let history = History { ops: ctx.rec.finish(), finals, subs: Some(subs) };
    let mut violations = check::check(&history);
    let errors = std::mem::take(&mut *ctx.server_errors.lock().unwrap_or_else(|p| p.into_inner()));
    violations.extend(errors.into_iter().map(|(status, count)| Violation::ServerErrors { status, count }));
    std::fs::write(plan.out.join("timeline.svg"), crate::report::timeline_svg(&history.ops, &faults))?;
    std::fs::write(plan.out.join("report.md"), report(plan, &engine, &history, &faults, &violations))?;
    Ok(Summary { operations: history.ops.len(), faults: faults.len(), violations })
}

/// The subscription's acknowledged offsets and its output stream, once every fault healed.
async fn subscription_end(ctx: &Ctx) -> Result<SubsEnd, String> {
    let client = oncelog_client::Client::builder(ctx.client_base(0)).build().map_err(|e| e.to_string())?;
    let info = client
        .subscriptions()
        .get(worker::SUBSCRIPTION)
        .await
        .map_err(|e| format!("the subscription at the end: {e}"))?;
    let acked = info.streams.iter().map(|l| (l.path.clone(), workload::offset_of(&l.acked_offset))).collect();
    Ok(SubsEnd { acked, output: workload::final_contents(ctx, worker::OUT).await? })
}

/// The system and the faults it could get, for the report.
fn describe(plan: &Plan, system: &System) -> String {
    match plan.engine {
        Engine::Log => format!(
            "log, one node; nemesis: SIGKILL and restart, SIGSTOP pauses{}",
            if system.disk.is_some() { ", a full disk (tmpfs)" } else { " (no tmpfs: not root, so no full disk)" }
        ),
        Engine::LogBucket => format!(
            "log on a bucket (moto behind a fault proxy), --ack-mode bucket, one node{}; nemesis: disk loss (SIGKILL, the data directory deleted, restart: restored from the bucket), the bucket unreachable (1-10 s), throttling (every 3rd request 503 SlowDown, 1-5 s), slow answers (200-800 ms each, 1-5 s), lost PUT answers (1-5 s), SIGKILL and restart, SIGSTOP pauses",
            if system.disk.is_some() { ", its data directory on a tmpfs" } else { "" }
        ),
        Engine::Postgres => "PostgreSQL, two nodes on a primary and a synchronous standby (TLS, verify-full), each host in its own network namespace; nemesis: partitions (node-db, clients-node, primary-standby), slow links, pauses of a node and of the primary, SIGKILL of a node, failover, clock skew".to_owned(),
    }
}

fn report(plan: &Plan, engine: &str, h: &History, faults: &[Fault], violations: &[Violation]) -> String {
    use crate::history::{OpKind, Outcome};
    let count = |f: &dyn Fn(&crate::history::Op) -> bool| h.ops.iter().filter(|o| f(o)).count();
    let appends = |o: Outcome| count(&|op| op.outcome == o && matches!(op.kind, OpKind::Append { .. }));
    let commits = |o: Outcome| count(&|op| op.outcome == o && matches!(op.kind, OpKind::Commit { .. }));
    let mut kinds = std::collections::BTreeMap::<&str, usize>::new();
    for f in faults {
        *kinds.entry(f.kind).or_default() += 1;
    }
    let kinds: Vec<String> = kinds.iter().map(|(k, n)| format!("{n} {k}")).collect();
    let mut s = format!(
        "# Chaos run, seed {}\n\n![timeline](timeline.svg)\n\n- engine: {engine}\n- duration: {} s\n- faults: {} ({})\n- operations: {} (appends ok {}, failed {}, unknown {}; reads {}; subscription commits ok {}, fenced or refused {}, unknown {})\n- bytes in the streams at the end: {} (subscription output {})\n- violations: {}\n",
        plan.seed,
        plan.duration.as_secs(),
        faults.len(),
        kinds.join(", "),
        h.ops.len(),
        appends(Outcome::Ok),
        appends(Outcome::Failed),
        appends(Outcome::Unknown),
        count(&|op| matches!(op.kind, OpKind::Read { .. })),
        commits(Outcome::Ok),
        commits(Outcome::Failed),
        commits(Outcome::Unknown),
        h.finals.values().map(String::len).sum::<usize>(),
        h.subs.as_ref().map_or(0, |s| s.output.len()),
        violations.len()
    );
    for v in violations {
        s.push_str(&format!("  - {v}\n"));
    }
    s
}
