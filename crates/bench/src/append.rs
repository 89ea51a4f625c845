//! Workload S1: N idempotent producers over M streams, closed loop (by default one request in
//! flight per producer), fixed body size, fixed duration after a warm-up that is not counted.
//!
//! With `--in-flight K` each producer keeps K requests with consecutive sequence numbers in
//! flight, each on its own connection (HTTP/1.1 has no multiplexing), so they can reach the
//! server out of order. A 409 for a sequence gap is then retried once the producer's previous
//! sequence number is acknowledged, as a pipelining client would do.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::common::{self, error_kind, json_f64, json_str, LatencySummary};

#[derive(clap::Args, Debug)]
pub struct AppendArgs {
    #[command(flatten)]
    pub target: common::TargetArgs,
    /// Number of producers; each sends one request at a time on its own connection (or
    /// --in-flight requests on as many connections).
    #[arg(long, default_value_t = 64)]
    pub producers: usize,
    /// Requests each producer keeps in flight, with consecutive sequence numbers, each on its
    /// own connection.
    #[arg(long, default_value_t = 1)]
    pub in_flight: usize,
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
    /// Pull-wake subscriptions (Oncelog's subscription API) following every benchmark stream by
    /// pattern, created before the run; none claims, so each holds one live wake: the cost
    /// measured is that of appends to linked streams.
    #[arg(long, default_value_t = 0)]
    pub subscriptions: usize,
    /// Print the acknowledged-append rate every second on stderr.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub progress: bool,
}

/// Counters shared with the progress printer.
struct Live {
    acked: Arc<AtomicU64>,
    max_us: Arc<AtomicU64>,
}

/// What one connection of a producer saw during the measured window.
#[derive(Default)]
struct ProducerReport {
    latencies_us: Vec<u32>,
    acked: u64,
    duplicates: u64,
    /// 409 answers (sequence gap: a later request overtook an earlier one).
    conflicts: u64,
    /// Requests started and finished inside the window, whatever their outcome.
    requests: u64,
    errors: u64,
    error_kinds: BTreeMap<String, u64>,
}

/// Sequence numbers of one producer, shared by its in-flight connections.
struct ProducerSeq {
    /// Next sequence number to hand out.
    next: AtomicU64,
    /// How many sequence numbers are known to be stored (0..done): a 200 or 204 for seq s
    /// means the server has every earlier one as well.
    done: tokio::sync::watch::Sender<u64>,
}

pub async fn run(args: AppendArgs) -> Result<(), String> {
    let target = args.target.resolve()?;
    if args.producers == 0 || args.streams == 0 || args.duration == 0 || args.in_flight == 0 {
        return Err("--producers, --streams, --in-flight and --duration must be positive".into());
    }
    let tag = common::run_tag();
    let streams: Vec<String> = (0..args.streams).map(|i| format!("bench-s1-{tag}-{i}")).collect();
    let timeout = Duration::from_secs(args.request_timeout.max(1));

    let setup = common::client(timeout)?;
    if args.subscriptions > 0 {
        let wake = format!("bench-wake-{tag}");
        common::create_stream(&setup, &target.stream_url(&wake), "application/json").await?;
        for i in 0..args.subscriptions {
            let url = target.stream_url(&format!("__ds/subscriptions/bench-{tag}-{i}"));
            let cfg = format!(
                r#"{{"type":"pull-wake","pattern":"bench-s1-{tag}-*","wake_stream":"{wake}","lease_ttl_ms":30000}}"#
            );
            let r = setup
                .put(&url)
                .header("content-type", "application/json")
                .body(cfg)
                .send()
                .await
                .map_err(|e| format!("PUT {url}: {e}"))?;
            if r.status().as_u16() != 201 {
                return Err(format!("PUT {url}: {}", r.status()));
            }
        }
    }
    for s in &streams {
        common::create_stream(&setup, &target.stream_url(s), "application/octet-stream").await?;
    }
    drop(setup);

    let body = Bytes::from((0..args.body_bytes).map(|i| b'a' + (i % 26) as u8).collect::<Vec<u8>>());
    let acked_live = Arc::new(AtomicU64::new(0));
    // Largest latency (µs) seen since the last progress line.
    let max_live = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let measure_from = start + Duration::from_secs(args.warmup);
    let stop_at = measure_from + Duration::from_secs(args.duration);

    eprintln!(
        "append: {} producers x {} in flight over {} streams, {} B bodies, warm-up {} s, measuring {} s, {}",
        args.producers,
        args.in_flight,
        args.streams,
        args.body_bytes,
        args.warmup,
        args.duration,
        target.describe()
    );

    let mut tasks = Vec::with_capacity(args.producers * args.in_flight);
    for p in 0..args.producers {
        let urls = Arc::new(target.stream_urls(&streams[p % streams.len()]));
        let producer_id = Arc::new(format!("bench-{tag}-p{p}"));
        let seqs = Arc::new(ProducerSeq { next: AtomicU64::new(0), done: tokio::sync::watch::Sender::new(0) });
        for _ in 0..args.in_flight {
            let lane = Lane {
                client: common::client(timeout)?,
                urls: urls.clone(),
                producer: p,
                producer_id: producer_id.clone(),
                seqs: seqs.clone(),
                pipelined: args.in_flight > 1,
            };
            let body = body.clone();
            let live = Live { acked: acked_live.clone(), max_us: max_live.clone() };
            tasks.push(tokio::spawn(async move { lane.run(body, measure_from, stop_at, live).await }));
        }
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
                let began = Instant::now().checked_sub(Duration::from_secs(1)).unwrap_or(start);
                let phase = if began < measure_from { "warm-up" } else { "measure" };
                let max_ms = max_live.swap(0, Ordering::Relaxed) as f64 / 1000.0;
                eprintln!("  t={t:5.1}s {phase} {:>7} acks/s  max latency {max_ms:7.1} ms", now - last);
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
    let (mut conflicts, mut requests) = (0u64, 0u64);
    let mut kinds: BTreeMap<String, u64> = BTreeMap::new();
    for r in reports {
        acked += r.acked;
        duplicates += r.duplicates;
        errors += r.errors;
        conflicts += r.conflicts;
        requests += r.requests;
        latencies.extend(r.latencies_us);
        for (k, v) in r.error_kinds {
            *kinds.entry(k).or_default() += v;
        }
    }
    let secs = args.duration as f64;
    let rate = acked as f64 / secs;
    let lat = LatencySummary::from_micros(latencies);
    // Every acknowledgement since the streams were created, warm-up included: the denominator
    // for the server's CPU time per append, which is sampled around the whole run.
    let acked_total = acked_live.load(Ordering::Relaxed);
    let requests_per_append = if acked > 0 { requests as f64 / acked as f64 } else { f64::NAN };

    println!("S1 append results ({} s measured after {} s warm-up)", args.duration, args.warmup);
    println!("  producers/streams     {}/{} ({} in flight per producer)", args.producers, args.streams, args.in_flight);
    println!(
        "  acknowledged appends  {acked} ({rate:.0}/s, {:.2} MB/s of payload)",
        rate * args.body_bytes as f64 / 1e6
    );
    println!("  duplicates (204)      {duplicates}");
    println!(
        "  conflicts (409)       {conflicts} ({requests} requests, {requests_per_append:.2} per acknowledged append)"
    );
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
            ("in_flight", args.in_flight.to_string()),
            ("streams", args.streams.to_string()),
            ("subscriptions", args.subscriptions.to_string()),
            ("body_bytes", args.body_bytes.to_string()),
            ("duration_s", args.duration.to_string()),
            ("warmup_s", args.warmup.to_string()),
            ("acked", acked.to_string()),
            ("acked_total", acked_total.to_string()),
            ("appends_per_s", json_f64(rate, 1)),
            ("p50_ms", json_f64(lat.p50_ms, 3)),
            ("p90_ms", json_f64(lat.p90_ms, 3)),
            ("p99_ms", json_f64(lat.p99_ms, 3)),
            ("p999_ms", json_f64(lat.p999_ms, 3)),
            ("max_ms", json_f64(lat.max_ms, 3)),
            ("mean_ms", json_f64(lat.mean_ms, 3)),
            ("duplicates", duplicates.to_string()),
            ("conflicts", conflicts.to_string()),
            ("requests", requests.to_string()),
            ("requests_per_append", json_f64(requests_per_append, 3)),
            ("errors", errors.to_string()),
        ])
    );
    if acked == 0 {
        return Err("no append was acknowledged".into());
    }
    Ok(())
}

/// One connection of a producer.
struct Lane {
    client: reqwest::Client,
    /// The stream on every node: request `seq` goes to node `(producer + seq + attempt) % n`.
    urls: Arc<Vec<String>>,
    producer: usize,
    producer_id: Arc<String>,
    seqs: Arc<ProducerSeq>,
    /// Several lanes share the producer: a 409 means "overtaken", not an error.
    pipelined: bool,
}

impl Lane {
    /// Takes the producer's next sequence number, sends it until the server has it, repeats.
    /// A failed request (transport error, timeout or unexpected status) is retried with the
    /// same sequence number. With one lane this is the plain closed loop: 0, 1, 2, ... one at
    /// a time.
    async fn run(self, body: Bytes, measure_from: Instant, stop_at: Instant, live: Live) -> ProducerReport {
        let mut rep = ProducerReport::default();
        let mut done_rx = self.seqs.done.subscribe();
        'next_seq: while Instant::now() < stop_at {
            let seq = self.seqs.next.fetch_add(1, Ordering::Relaxed);
            let seq_text = seq.to_string();
            // Latency runs from the first attempt: retries (and waits after a 409) included.
            let first_sent = Instant::now();
            let mut attempt = 0usize;
            loop {
                let sent = Instant::now();
                if sent >= stop_at {
                    break 'next_seq;
                }
                let url = &self.urls[(self.producer + seq as usize + attempt) % self.urls.len()];
                attempt += 1;
                let outcome = self.send(url, &seq_text, body.clone()).await;
                let done = Instant::now();
                // Counted only if the request both started and finished inside the window.
                let counted = sent >= measure_from && done <= stop_at;
                if counted {
                    rep.requests += 1;
                }
                match outcome {
                    Ok(200) => {
                        self.mark_done(seq);
                        let us = common::micros_u32(done.duration_since(first_sent));
                        live.acked.fetch_add(1, Ordering::Relaxed);
                        live.max_us.fetch_max(u64::from(us), Ordering::Relaxed);
                        if first_sent >= measure_from && done <= stop_at {
                            rep.acked += 1;
                            rep.latencies_us.push(us);
                        }
                        continue 'next_seq;
                    }
                    Ok(204) => {
                        // Duplicate: the server already had this sequence number (after a retry).
                        self.mark_done(seq);
                        if counted {
                            rep.duplicates += 1;
                        }
                        continue 'next_seq;
                    }
                    Ok(409) if self.pipelined && seq > 0 => {
                        if counted {
                            rep.conflicts += 1;
                        }
                        // Overtaken: wait until the previous number is stored (or a short
                        // while, in case that request failed and is being retried), then resend.
                        let wait = done_rx.wait_for(|&d| d >= seq);
                        let _ = tokio::time::timeout(Duration::from_millis(50), wait).await;
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
        }
        rep
    }

    async fn send(&self, url: &str, seq: &str, body: Bytes) -> Result<u16, String> {
        let resp = self
            .client
            .post(url)
            .header("content-type", "application/octet-stream")
            .header("producer-id", self.producer_id.as_str())
            .header("producer-epoch", "0")
            .header("producer-seq", seq)
            .body(body)
            .send()
            .await
            .map_err(|e| error_kind(&e))?;
        let status = resp.status().as_u16();
        match resp.bytes().await {
            Ok(_) => Ok(status),
            Err(e) => Err(format!("body: {}", error_kind(&e))),
        }
    }

    /// Records that the server has every sequence number up to and including `seq`.
    fn mark_done(&self, seq: u64) {
        self.seqs.done.send_if_modified(|d| {
            if *d < seq + 1 {
                *d = seq + 1;
                true
            } else {
                false
            }
        });
    }
}
