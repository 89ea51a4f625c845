//! Workload S1: N idempotent producers over M streams, closed loop (one request in flight per
//! producer), fixed body size, fixed duration after a warm-up that is not counted.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::common::{self, json_f64, json_str, LatencySummary};

#[derive(clap::Args, Debug)]
pub struct AppendArgs {
    /// Base URL of the server (loopback only).
    #[arg(long, default_value = "http://127.0.0.1:4437")]
    pub url: String,
    /// Number of producers; each sends one request at a time on its own connection.
    #[arg(long, default_value_t = 64)]
    pub producers: usize,
    /// Number of streams; producer i appends to stream i mod M.
    #[arg(long, default_value_t = 8)]
    pub streams: usize,
    /// Body size of each append, in bytes.
    #[arg(long, default_value_t = 1024)]
    pub body_bytes: usize,
    /// Measured duration, in seconds.
    #[arg(long, default_value_t = 20)]
    pub duration: u64,
    /// Warm-up before measuring, in seconds (requests during it are not counted).
    #[arg(long, default_value_t = 3)]
    pub warmup: u64,
    /// Per-request timeout, in seconds (a timed-out request counts as an error and is retried
    /// with the same sequence number, as an idempotent producer would).
    #[arg(long, default_value_t = 10)]
    pub request_timeout: u64,
    /// Print the acknowledged-append rate every second on stderr.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub progress: bool,
}

/// Counters shared with the progress printer.
struct Live {
    acked: Arc<AtomicU64>,
    max_us: Arc<AtomicU64>,
}

/// What one producer saw during the measured window.
#[derive(Default)]
struct ProducerReport {
    latencies_us: Vec<u32>,
    acked: u64,
    duplicates: u64,
    errors: u64,
    error_kinds: BTreeMap<String, u64>,
}

pub async fn run(args: AppendArgs) -> Result<(), String> {
    let base = common::loopback_base(&args.url)?;
    if args.producers == 0 || args.streams == 0 || args.duration == 0 {
        return Err("--producers, --streams and --duration must be positive".into());
    }
    let tag = common::run_tag();
    let streams: Vec<String> = (0..args.streams)
        .map(|i| format!("bench-s1-{tag}-{i}"))
        .collect();
    let timeout = Duration::from_secs(args.request_timeout.max(1));

    let setup = common::client(timeout)?;
    for s in &streams {
        common::create_stream(&setup, &base, s).await?;
    }
    drop(setup);

    let body = Bytes::from(
        (0..args.body_bytes)
            .map(|i| b'a' + (i % 26) as u8)
            .collect::<Vec<u8>>(),
    );
    let acked_live = Arc::new(AtomicU64::new(0));
    // Largest latency (µs) seen since the last progress line.
    let max_live = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let measure_from = start + Duration::from_secs(args.warmup);
    let stop_at = measure_from + Duration::from_secs(args.duration);

    eprintln!(
        "append: {} producers over {} streams, {} B bodies, warm-up {} s, measuring {} s, {}",
        args.producers, args.streams, args.body_bytes, args.warmup, args.duration, base
    );

    let mut tasks = Vec::with_capacity(args.producers);
    for p in 0..args.producers {
        let client = common::client(timeout)?;
        let url = format!("{base}/v1/stream/{}", streams[p % streams.len()]);
        let producer_id = format!("bench-{tag}-p{p}");
        let body = body.clone();
        let live = Live {
            acked: acked_live.clone(),
            max_us: max_live.clone(),
        };
        tasks.push(tokio::spawn(async move {
            producer_loop(client, url, producer_id, body, measure_from, stop_at, live).await
        }));
    }

    let progress = if args.progress {
        let acked_live = acked_live.clone();
        let max_live = max_live.clone();
        Some(tokio::spawn(async move {
            let mut tick = tokio::time::interval_at(
                tokio::time::Instant::from_std(start + Duration::from_secs(1)),
                Duration::from_secs(1),
            );
            let mut last = 0u64;
            loop {
                tick.tick().await;
                let now = acked_live.load(Ordering::Relaxed);
                let t = start.elapsed().as_secs_f64();
                // Label the second that just ended by where it started.
                let began = Instant::now()
                    .checked_sub(Duration::from_secs(1))
                    .unwrap_or(start);
                let phase = if began < measure_from {
                    "warm-up"
                } else {
                    "measure"
                };
                let max_ms = max_live.swap(0, Ordering::Relaxed) as f64 / 1000.0;
                eprintln!(
                    "  t={t:5.1}s {phase} {:>7} acks/s  max latency {max_ms:7.1} ms",
                    now - last
                );
                last = now;
                if Instant::now() >= stop_at {
                    break;
                }
            }
        }))
    } else {
        None
    };

    let mut reports = Vec::with_capacity(tasks.len());
    for t in tasks {
        reports.push(t.await.map_err(|e| format!("producer task failed: {e}"))?);
    }
    if let Some(p) = progress {
        p.abort();
    }

    let mut latencies = Vec::new();
    let (mut acked, mut duplicates, mut errors) = (0u64, 0u64, 0u64);
    let mut kinds: BTreeMap<String, u64> = BTreeMap::new();
    for r in reports {
        acked += r.acked;
        duplicates += r.duplicates;
        errors += r.errors;
        latencies.extend(r.latencies_us);
        for (k, v) in r.error_kinds {
            *kinds.entry(k).or_default() += v;
        }
    }
    let secs = args.duration as f64;
    let rate = acked as f64 / secs;
    let lat = LatencySummary::from_micros(latencies);

    println!(
        "S1 append results ({} s measured after {} s warm-up)",
        args.duration, args.warmup
    );
    println!(
        "  producers/streams     {}/{}",
        args.producers, args.streams
    );
    println!(
        "  acknowledged appends  {acked} ({rate:.0}/s, {:.2} MB/s of payload)",
        rate * args.body_bytes as f64 / 1e6
    );
    println!("  duplicates (204)      {duplicates}");
    println!("  errors                {errors}");
    for (k, v) in &kinds {
        println!("    {k}: {v}");
    }
    println!(
        "  latency ms            p50 {:.2}  p90 {:.2}  p99 {:.2}  p99.9 {:.2}  max {:.2}  (mean {:.2}, n={})",
        lat.p50_ms, lat.p90_ms, lat.p99_ms, lat.p999_ms, lat.max_ms, lat.mean_ms, lat.count
    );
    println!(
        "{}",
        common::summary_line(&[
            ("bench", json_str("append")),
            ("producers", args.producers.to_string()),
            ("streams", args.streams.to_string()),
            ("body_bytes", args.body_bytes.to_string()),
            ("duration_s", args.duration.to_string()),
            ("warmup_s", args.warmup.to_string()),
            ("acked", acked.to_string()),
            ("appends_per_s", json_f64(rate, 1)),
            ("p50_ms", json_f64(lat.p50_ms, 3)),
            ("p90_ms", json_f64(lat.p90_ms, 3)),
            ("p99_ms", json_f64(lat.p99_ms, 3)),
            ("p999_ms", json_f64(lat.p999_ms, 3)),
            ("max_ms", json_f64(lat.max_ms, 3)),
            ("mean_ms", json_f64(lat.mean_ms, 3)),
            ("duplicates", duplicates.to_string()),
            ("errors", errors.to_string()),
        ])
    );
    if acked == 0 {
        return Err("no append was acknowledged".into());
    }
    Ok(())
}

/// One producer: sequence numbers 0, 1, 2, ... sent one at a time. A failed request (transport
/// error, timeout or unexpected status) is retried with the same sequence number.
async fn producer_loop(
    client: reqwest::Client,
    url: String,
    producer_id: String,
    body: Bytes,
    measure_from: Instant,
    stop_at: Instant,
    live: Live,
) -> ProducerReport {
    let mut rep = ProducerReport::default();
    let mut seq: u64 = 0;
    loop {
        let sent = Instant::now();
        if sent >= stop_at {
            break;
        }
        let result = client
            .post(&url)
            .header("content-type", "application/octet-stream")
            .header("producer-id", producer_id.as_str())
            .header("producer-epoch", "0")
            .header("producer-seq", seq.to_string())
            .body(body.clone())
            .send()
            .await;
        let outcome: Result<u16, String> = match result {
            Ok(resp) => {
                let status = resp.status().as_u16();
                match resp.bytes().await {
                    Ok(_) => Ok(status),
                    Err(e) => Err(format!("body: {}", error_kind(&e))),
                }
            }
            Err(e) => Err(error_kind(&e)),
        };
        let done = Instant::now();
        // Counted only if the request both started and finished inside the measured window.
        let counted = sent >= measure_from && done <= stop_at;
        match outcome {
            Ok(200) => {
                seq += 1;
                let us = u32::try_from(done.duration_since(sent).as_micros()).unwrap_or(u32::MAX);
                live.acked.fetch_add(1, Ordering::Relaxed);
                live.max_us.fetch_max(u64::from(us), Ordering::Relaxed);
                if counted {
                    rep.acked += 1;
                    rep.latencies_us.push(us);
                }
            }
            Ok(204) => {
                // Duplicate: the server already had this sequence number (after a retry).
                seq += 1;
                if counted {
                    rep.duplicates += 1;
                }
            }
            Ok(other) => {
                if counted {
                    rep.errors += 1;
                    *rep.error_kinds.entry(format!("HTTP {other}")).or_default() += 1;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(kind) => {
                if counted {
                    rep.errors += 1;
                    *rep.error_kinds.entry(kind).or_default() += 1;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    rep
}

fn error_kind(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        "timeout".into()
    } else if e.is_connect() {
        "connect error".into()
    } else {
        format!("transport error: {e}")
    }
}
