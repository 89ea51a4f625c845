//! Many streams: create N streams and append once to each, from C concurrent connections.
//! Reports streams per second (create + append), errors by kind, and writes a manifest naming a
//! few of the streams with their tails, so `ready` can tell when a restarted server has them
//! again.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::common::{self, error_kind, json_f64, json_str, LatencySummary};

#[derive(clap::Args, Debug)]
pub struct StreamsArgs {
    #[command(flatten)]
    pub target: common::TargetArgs,
    /// Number of streams to create (each then gets one append). 1000000 works; it takes a
    /// while.
    #[arg(long, default_value_t = 20_000)]
    pub count: u64,
    /// Concurrent connections, each creating streams one after the other.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// Body size of the one append to each stream, in bytes.
    #[arg(long, default_value_t = 100)]
    pub body_bytes: usize,
    /// Stop starting new streams after this many seconds (the run then reports what it did).
    #[arg(long, default_value_t = 300)]
    pub timeout: u64,
    /// Write NAME<TAB>TAIL lines for a sample of the streams here (for `ready`).
    #[arg(long)]
    pub manifest: Option<PathBuf>,
}

#[derive(Default)]
struct WorkerReport {
    done: u64,
    create_errors: u64,
    append_errors: u64,
    error_kinds: BTreeMap<String, u64>,
    latencies_us: Vec<u32>,
    /// (index, name, tail) of the streams this worker finished that belong to the sample.
    sample: Vec<(u64, String, String)>,
}

pub async fn run(args: StreamsArgs) -> Result<(), String> {
    let target = Arc::new(args.target.resolve()?);
    if args.count == 0 || args.concurrency == 0 {
        return Err("--count and --concurrency must be positive".into());
    }
    let tag = common::run_tag();
    let body = Bytes::from(vec![b'x'; args.body_bytes]);
    let next = Arc::new(AtomicU64::new(0));
    let finished = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let stop_at = start + Duration::from_secs(args.timeout.max(1));
    // The first, a middle and the last stream (by index) are checked after a restart.
    let sample_at: Arc<Vec<u64>> = Arc::new(vec![0, args.count / 2, args.count - 1]);

    eprintln!(
        "streams: creating {} streams with one {} B append each over {} connections, {}",
        args.count,
        args.body_bytes,
        args.concurrency,
        target.describe()
    );

    let progress = {
        let finished = finished.clone();
        tokio::spawn(async move {
            let mut last = 0;
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let now = finished.load(Ordering::Relaxed);
                eprintln!("  t={:5.1}s {:>7} streams/s ({now} done)", start.elapsed().as_secs_f64(), now - last);
                last = now;
            }
        })
    };

    let mut tasks = Vec::with_capacity(args.concurrency);
    for _ in 0..args.concurrency {
        let client = common::client(Duration::from_secs(30))?;
        let (target, next, finished, body, tag, sample_at) =
            (target.clone(), next.clone(), finished.clone(), body.clone(), tag.clone(), sample_at.clone());
        let count = args.count;
        tasks.push(tokio::spawn(async move {
            let mut rep = WorkerReport::default();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count || Instant::now() >= stop_at {
                    break;
                }
                let name = format!("bench-many-{tag}-{i}");
                let url = target.stream_url(&name);
                let began = Instant::now();
                if let Err(kind) = common::create_stream(&client, &url, "application/octet-stream").await {
                    rep.create_errors += 1;
                    *rep.error_kinds.entry(short_kind("create", &kind)).or_default() += 1;
                    continue;
                }
                match append(&client, &url, body.clone()).await {
                    Ok(tail) => {
                        rep.done += 1;
                        rep.latencies_us.push(common::micros_u32(began.elapsed()));
                        finished.fetch_add(1, Ordering::Relaxed);
                        if sample_at.contains(&i) {
                            rep.sample.push((i, name, tail));
                        }
                    }
                    Err(kind) => {
                        rep.append_errors += 1;
                        *rep.error_kinds.entry(format!("append: {kind}")).or_default() += 1;
                    }
                }
            }
            rep
        }));
    }
    let mut reports = Vec::with_capacity(tasks.len());
    for t in tasks {
        reports.push(t.await.map_err(|e| format!("worker task failed: {e}"))?);
    }
    progress.abort();
    let elapsed = start.elapsed().as_secs_f64();

    let (mut done, mut create_errors, mut append_errors) = (0u64, 0u64, 0u64);
    let mut kinds: BTreeMap<String, u64> = BTreeMap::new();
    let mut latencies = Vec::new();
    let mut sample = Vec::new();
    for r in reports {
        done += r.done;
        create_errors += r.create_errors;
        append_errors += r.append_errors;
        latencies.extend(r.latencies_us);
        sample.extend(r.sample);
        for (k, v) in r.error_kinds {
            *kinds.entry(k).or_default() += v;
        }
    }
    sample.sort();
    let attempted = next.load(Ordering::Relaxed).min(args.count);
    let rate = done as f64 / elapsed.max(1e-9);
    let lat = LatencySummary::from_micros(latencies);

    if let Some(path) = &args.manifest {
        let entries: Vec<(String, String)> = sample.iter().map(|(_, n, t)| (n.clone(), t.clone())).collect();
        if entries.is_empty() {
            return Err("no sample stream was created; no manifest written".into());
        }
        common::write_manifest(path, &entries)?;
    }

    println!("Many-streams results ({} streams asked, {} connections)", args.count, args.concurrency);
    println!("  created + appended    {done} of {attempted} attempted in {elapsed:.2} s ({rate:.0} streams/s)");
    println!("  errors                {create_errors} creates, {append_errors} appends");
    for (k, v) in &kinds {
        println!("    {k}: {v}");
    }
    println!("  create+append ms      p50 {:.2}  p99 {:.2}  max {:.2}", lat.p50_ms, lat.p99_ms, lat.max_ms);
    println!(
        "{}",
        common::summary_line(&[
            ("bench", json_str("streams")),
            ("count", args.count.to_string()),
            ("attempted", attempted.to_string()),
            ("concurrency", args.concurrency.to_string()),
            ("done", done.to_string()),
            ("elapsed_s", json_f64(elapsed, 3)),
            ("streams_per_s", json_f64(rate, 1)),
            ("create_errors", create_errors.to_string()),
            ("append_errors", append_errors.to_string()),
            ("errors", (create_errors + append_errors).to_string()),
            ("error_kinds", common::json_counts(&kinds)),
            ("p50_ms", json_f64(lat.p50_ms, 3)),
            ("p99_ms", json_f64(lat.p99_ms, 3)),
            ("max_ms", json_f64(lat.max_ms, 3)),
        ])
    );
    if done == 0 {
        return Err("no stream was created and appended to".into());
    }
    Ok(())
}

/// One append without producer headers; returns the tail (`Stream-Next-Offset`) after it.
async fn append(client: &reqwest::Client, url: &str, body: Bytes) -> Result<String, String> {
    let resp = client
        .post(url)
        .header("content-type", "application/octet-stream")
        .body(body)
        .send()
        .await
        .map_err(|e| error_kind(&e))?;
    let status = resp.status().as_u16();
    let next = common::header_str(&resp, "stream-next-offset");
    let _ = resp.bytes().await;
    match (status, next) {
        (200 | 204, Some(tail)) => Ok(tail),
        (200 | 204, None) => Err("no Stream-Next-Offset".into()),
        (other, _) => Err(format!("HTTP {other}")),
    }
}

/// Error kinds from `create_stream` carry the URL; keep only what differs between errors.
fn short_kind(what: &str, message: &str) -> String {
    let kind = if let Some(i) = message.find("unexpected status ") {
        let status = &message[i + "unexpected status ".len()..];
        format!("HTTP {}", status.split(':').next().unwrap_or(status).trim())
    } else if let Some((_, rest)) = message.split_once(": ") {
        rest.to_string()
    } else {
        message.to_string()
    };
    format!("{what}: {kind}")
}
