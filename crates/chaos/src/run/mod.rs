//! One run: the cluster, the workloads, the nemesis's seeded schedule, then the check.
//!
//! - `cluster`: the log engine's node (SIGKILL and restart);
//! - `workload`: the clients;
//! - `record`: the history as it happens.

mod cluster;
mod record;
mod workload;

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};

use crate::check::{self, Violation};
use crate::history::History;
use crate::report::Fault;
use cluster::LogNode;
use workload::Ctx;

/// What a run is asked to do.
pub struct Plan {
    pub seed: u64,
    pub duration: Duration,
    /// The `oncelog` binary to run.
    pub bin: PathBuf,
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
    #[error("{0}")]
    Setup(String),
}

const STREAMS: usize = 3;

pub async fn run(plan: &Plan) -> Result<Summary, RunError> {
    std::fs::create_dir_all(&plan.out)?;
    // The data directory on a 256 MiB tmpfs when the run may mount one: the disk can be filled.
    let disk = cluster::SmallDisk::mount(&plan.out.join("disk"), 256);
    let data = match &disk {
        Some(d) => d.path().join("data"),
        None => plan.out.join("data"),
    };
    let _ = std::fs::remove_dir_all(&data);
    let node = LogNode::start(&plan.bin, &data, &plan.out.join("node.log"))?;
    let ctx = Arc::new(Ctx {
        http: reqwest::Client::builder().pool_max_idle_per_host(64).build().map_err(|e| RunError::Setup(e.to_string()))?,
        base: node.url(),
        rec: record::Recorder::create(&plan.out.join("history.jsonl"))?,
        stop: Default::default(),
        give_up: Default::default(),
        server_errors: Default::default(),
    });
    let streams: Vec<String> = (0..STREAMS).map(|i| format!("s{i}")).chain(["race".to_owned()]).collect();
    for s in &streams {
        let r = ctx.http.put(ctx.url(s)).header("content-type", "text/plain").send().await.map_err(|e| RunError::Setup(e.to_string()))?;
        if !r.status().is_success() {
            return Err(RunError::Setup(format!("create {s}: {}", r.status())));
        }
    }
    let mut tasks = Vec::new();
    for i in 0..6 {
        tasks.push(tokio::spawn(workload::producer(ctx.clone(), format!("p{i}"), format!("s{}", i % STREAMS), 3)));
    }
    for i in 0..2 {
        tasks.push(tokio::spawn(workload::keyed(ctx.clone(), format!("k{i}"), format!("s{}", i % STREAMS))));
        tasks.push(tokio::spawn(workload::plain(ctx.clone(), format!("a{i}"), format!("s{}", (i + 1) % STREAMS))));
        tasks.push(tokio::spawn(workload::racer(ctx.clone(), format!("r{i}"), "race".to_owned())));
    }
    for s in &streams {
        tasks.push(tokio::spawn(workload::reader(ctx.clone(), format!("reader-{s}"), s.clone())));
    }

    // The nemesis: faults at seeded moments, on a blocking thread (signals, sleeps, and starting a
    // node blocks until it listens).
    let seed = plan.seed;
    let until = Instant::now() + plan.duration;
    let clock = ctx.clone();
    let nemesis = tokio::task::spawn_blocking(move || -> Result<(LogNode, Vec<Fault>, Option<cluster::SmallDisk>), cluster::NodeError> {
        let mut node = node;
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let mut faults = Vec::new();
        loop {
            let wait = Duration::from_millis(rng.random_range(500..3000));
            if Instant::now() + wait >= until {
                break;
            }
            std::thread::sleep(wait);
            let from_ms = clock.rec.now();
            let roll: f64 = rng.random();
            match &disk {
                // Frozen for longer than the clients' 5 s timeout at times, then resumed.
                _ if roll < 0.25 => {
                    node.pause(Duration::from_millis(rng.random_range(500..6000)));
                    faults.push(Fault { from_ms, to_ms: clock.rec.now(), kind: "pause" });
                }
                // A full disk for a while: writes fail (the engine stops taking them), then
                // space comes back and the node is restarted.
                Some(d) if roll < 0.5 => {
                    d.fill();
                    std::thread::sleep(Duration::from_millis(rng.random_range(500..2000)));
                    d.free();
                    node.restart()?;
                    faults.push(Fault { from_ms, to_ms: clock.rec.now(), kind: "disk full" });
                }
                _ => {
                    node.kill9();
                    std::thread::sleep(Duration::from_millis(rng.random_range(0..500)));
                    node.restart()?;
                    faults.push(Fault { from_ms, to_ms: clock.rec.now(), kind: "SIGKILL" });
                }
            }
        }
        Ok((node, faults, disk))
    });
    let (node, faults, disk) = nemesis.await.map_err(|_| RunError::Setup("the nemesis panicked".into()))??;
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
    // The node goes first: the tmpfs under it can only be unmounted then.
    drop(node);
    let disk_faults = disk.is_some();
    drop(disk);
    let history = History { ops: ctx.rec.finish(), finals };
    let mut violations = check::check(&history);
    let errors = std::mem::take(&mut *ctx.server_errors.lock().unwrap_or_else(|p| p.into_inner()));
    violations.extend(errors.into_iter().map(|(status, count)| Violation::ServerErrors { status, count }));
    std::fs::write(plan.out.join("timeline.svg"), crate::report::timeline_svg(&history.ops, &faults))?;
    std::fs::write(plan.out.join("report.md"), report(plan, &history, &faults, disk_faults, &violations))?;
    Ok(Summary { operations: history.ops.len(), faults: faults.len(), violations })
}

fn report(plan: &Plan, h: &History, faults: &[Fault], disk_faults: bool, violations: &[Violation]) -> String {
    use crate::history::{OpKind, Outcome};
    let count = |f: &dyn Fn(&crate::history::Op) -> bool| h.ops.iter().filter(|o| f(o)).count();
    let appends = |o: Outcome| count(&|op| op.outcome == o && matches!(op.kind, OpKind::Append { .. }));
    let mut s = format!(
        "# Chaos run, seed {}\n\n![timeline](timeline.svg)\n\n- engine: log, one node; nemesis: SIGKILL and restart, SIGSTOP pauses{}\n- duration: {} s\n- faults: {} ({} SIGKILL, {} disk full, {} pauses)\n- operations: {} (appends ok {}, failed {}, unknown {}; reads {})\n- bytes in the streams at the end: {}\n- violations: {}\n",
        plan.seed,
        if disk_faults { ", a full disk (tmpfs)" } else { " (no tmpfs: not root, so no full disk)" },
        plan.duration.as_secs(),
        faults.len(),
        faults.iter().filter(|f| f.kind == "SIGKILL").count(),
        faults.iter().filter(|f| f.kind == "disk full").count(),
        faults.iter().filter(|f| f.kind == "pause").count(),
        h.ops.len(),
        appends(Outcome::Ok),
        appends(Outcome::Failed),
        appends(Outcome::Unknown),
        count(&|op| matches!(op.kind, OpKind::Read { .. })),
        h.finals.values().map(String::len).sum::<usize>(),
        violations.len()
    );
    for v in violations {
        s.push_str(&format!("  - {v}\n"));
    }
    s
}
