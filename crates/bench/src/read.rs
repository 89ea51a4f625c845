//! Catch-up read benchmark: write one stream of a given size with large appends, then let R
//! readers each read it whole, concurrently, from offset -1 to the tail.
//!
//! Readers read as a user's client does: each response body is consumed as it streams in
//! (bytes counted per piece, never collected into one buffer: a reader that buffers whole bodies
//! measures its own copying, and penalises a server that answers in few large responses). Two
//! kinds of reader (`--reader`): `keep-alive` reuses one connection for its requests, as the
//! official clients do; `per-request` opens a new connection for every request, as `curl` in a
//! shell loop does, so a server that needs many requests per stream pays for each.

use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::common::{self, json_f64, json_str};

#[derive(clap::Args, Debug)]
pub struct ReadArgs {
    #[command(flatten)]
    pub target: common::TargetArgs,
    /// Size of the stream to write and read back, in MB (10^6 bytes).
    #[arg(long, default_value_t = 500)]
    pub size_mb: u64,
    /// Size of each append while writing the stream, in bytes.
    #[arg(long, default_value_t = 1 << 20)]
    pub append_bytes: usize,
    /// Number of concurrent readers; each reads the whole stream.
    #[arg(long, default_value_t = 4)]
    pub readers: usize,
    /// Abort (with an error) if writing plus reading takes longer than this, in seconds.
    #[arg(long, default_value_t = 120)]
    pub timeout: u64,
    /// How each reader connects: `keep-alive` (one connection for all its requests),
    /// `per-request` (a new connection for every request), or `both`, one pass each.
    #[arg(long, value_enum, default_value_t = ReaderKind::KeepAlive)]
    pub reader: ReaderKind,
    /// The server's process id (on this machine): the summary then gives the server's CPU time
    /// per GB read in each reading pass (`cpu_ms_per_gb`, `per_request_cpu_ms_per_gb`), from
    /// `/proc/PID/stat` before and after the pass; the write phase is not counted.
    #[arg(long)]
    pub server_pid: Option<u32>,
    /// The stream's name (default: a fresh `bench-read-TAG`).
    #[arg(long)]
    pub stream: Option<String>,
    /// Read `--stream` as it is, without writing it first (for example on a node restored from
    /// a bucket): its size is what the readers find, and they must all find the same.
    #[arg(long, requires = "stream")]
    pub no_write: bool,
    /// After our own readers, two passes of readers that are not ours (`python3` and `curl`
    /// must be installed): Python's `http.client` on keep-alive connections reading each body
    /// 1 MiB at a time, then `curl` once per request. The summary gains `python_mb_per_s`,
    /// `curl_mb_per_s` and, with `--server-pid`, their server CPU per GB.
    #[arg(long)]
    pub foreign: bool,
}

/// The foreign readers' program (see `--foreign`), run with `python3 -c`.
const FOREIGN_READER: &str = include_str!("foreign_reader.py");

/// How a reader connects (see the module docs).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReaderKind {
    KeepAlive,
    PerRequest,
    /// Both, one after the other, on the same stream (the summary's `total_mb_per_s` is the
    /// keep-alive pass, `per_request_mb_per_s` the other).
    Both,
}

struct ReaderReport {
    bytes: u64,
    requests: u64,
    elapsed: Duration,
}

pub async fn run(args: ReadArgs) -> Result<(), String> {
    let target = args.target.resolve()?;
    if args.readers == 0 || args.size_mb == 0 || args.append_bytes == 0 {
        return Err("--readers, --size-mb and --append-bytes must be positive".into());
    }
    let limit = Duration::from_secs(args.timeout.max(1));
    match tokio::time::timeout(limit, run_inner(&args, &target)).await {
        Ok(r) => r,
        Err(_) => Err(format!("read benchmark aborted: not finished after {} s", args.timeout)),
    }
}

async fn run_inner(args: &ReadArgs, target: &common::Target) -> Result<(), String> {
    let total = if args.no_write { 0 } else { args.size_mb * 1_000_000 };
    let stream = args.stream.clone().unwrap_or_else(|| format!("bench-read-{}", common::run_tag()));
    let url = target.stream_url(&stream);
    let request_timeout = Duration::from_secs(60);

    // Phase 1: write the stream with one idempotent producer, one large append at a time.
    let writer = common::client(request_timeout)?;
    if !args.no_write {
        common::create_stream(&writer, &url, "application/octet-stream").await?;
    }
    let chunk = Bytes::from((0..args.append_bytes).map(|i| (i % 251) as u8).collect::<Vec<u8>>());
    if !args.no_write {
        eprintln!(
            "read: writing {} MB to {stream} in appends of {} B (server fsync setting applies)",
            args.size_mb, args.append_bytes
        );
    }
    let write_start = Instant::now();
    let mut written: u64 = 0;
    let mut seq: u64 = 0;
    while written < total {
        let n = usize::try_from((total - written).min(args.append_bytes as u64)).unwrap_or(args.append_bytes);
        let resp = writer
            .post(&url)
            .header("content-type", "application/octet-stream")
            .header("producer-id", "bench-read-writer")
            .header("producer-epoch", "0")
            .header("producer-seq", seq.to_string())
            .body(chunk.slice(..n))
            .send()
            .await
            .map_err(|e| format!("append seq {seq}: {e}"))?;
        let status = resp.status();
        let text = resp.bytes().await.unwrap_or_default();
        if status.as_u16() != 200 {
            return Err(format!("append seq {seq}: status {status}: {}", String::from_utf8_lossy(&text)));
        }
        written += n as u64;
        seq += 1;
    }
    let write_s = write_start.elapsed().as_secs_f64().max(1e-9);
    eprintln!("  wrote {written} B in {seq} appends, {write_s:.2} s ({:.0} MB/s)", written as f64 / 1e6 / write_s);
    drop(writer);

    // Phase 2: R readers, started together, each reading everything; with `--reader both`,
    // once keeping connections alive and then once with a connection per request.
    let kinds = match args.reader {
        ReaderKind::Both => vec![ReaderKind::KeepAlive, ReaderKind::PerRequest],
        k => vec![k],
    };
    let mut phases = Vec::with_capacity(kinds.len());
    let server_cpu = || args.server_pid.and_then(common::process_cpu_seconds);
    for kind in kinds {
        let cpu_before = server_cpu();
        let (wall, reports) = read_phase(args.readers, kind, &url, request_timeout).await?;
        let cpu_s = cpu_before.zip(server_cpu()).map(|(b, a)| a - b);
        if args.no_write && written == 0 {
            // The stream as it is: every reader must find the same, and something.
            written = reports.first().map_or(0, |r| r.bytes);
            if written == 0 {
                return Err(format!("{stream} is empty"));
            }
        }
        for (i, r) in reports.iter().enumerate() {
            if r.bytes != written {
                return Err(format!("reader {i} ({kind:?}) read {} B, expected {written} B", r.bytes));
            }
        }
        phases.push((kind, wall, reports, cpu_s));
    }
    // `--foreign`: (mode, MB/s in all, requests, server CPU ms per GB) for each foreign pass.
    let mut foreign = Vec::new();
    if args.foreign {
        for mode in ["python", "curl"] {
            let cpu_before = server_cpu();
            let (wall, reports) = foreign_phase(args.readers, mode, &url).await?;
            let cpu_s = cpu_before.zip(server_cpu()).map(|(b, a)| a - b);
            for (i, r) in reports.iter().enumerate() {
                if r.bytes != written {
                    return Err(format!("{mode} reader {i} read {} B, expected {written} B", r.bytes));
                }
            }
            let bytes: u64 = reports.iter().map(|r| r.bytes).sum();
            let requests: u64 = reports.iter().map(|r| r.requests).sum();
            let cpu = cpu_s.filter(|_| bytes > 0).map(|s| s * 1e3 / (bytes as f64 / 1e9));
            foreign.push((mode, bytes as f64 / 1e6 / wall, requests, cpu));
        }
    }
    // Server CPU milliseconds per GB (10^9 bytes) the readers of a pass received.
    let cpu_ms_per_gb = |cpu_s: Option<f64>, reports: &[ReaderReport]| {
        let bytes: u64 = reports.iter().map(|r| r.bytes).sum();
        cpu_s.filter(|_| bytes > 0).map(|s| s * 1e3 / (bytes as f64 / 1e9))
    };
    let (_, wall, reports, cpu_s) = phases.remove(0);
    let cpu_keep_alive = cpu_ms_per_gb(cpu_s, &reports);
    let per_request = phases.pop().map(|(_, wall, reports, cpu_s)| {
        let bytes: u64 = reports.iter().map(|r| r.bytes).sum();
        (bytes as f64 / 1e6 / wall, reports.iter().map(|r| r.requests).sum::<u64>(), cpu_ms_per_gb(cpu_s, &reports))
    });
    let total_read: u64 = reports.iter().map(|r| r.bytes).sum();
    let aggregate = total_read as f64 / 1e6 / wall;
    let sum_of_rates: f64 = reports.iter().map(|r| r.bytes as f64 / 1e6 / r.elapsed.as_secs_f64()).sum();
    let times: Vec<f64> = reports.iter().map(|r| r.elapsed.as_secs_f64()).collect();

    println!("Catch-up read results ({:.0} MB stream, {} readers)", written as f64 / 1e6, args.readers);
    println!(
        "  write phase           {:.2} s ({:.0} MB/s, {seq} appends of {} B)",
        write_s,
        written as f64 / 1e6 / write_s,
        args.append_bytes
    );
    for (i, r) in reports.iter().enumerate() {
        println!(
            "  reader {i}              {:.3} s, {} requests, {:.0} MB/s",
            r.elapsed.as_secs_f64(),
            r.requests,
            r.bytes as f64 / 1e6 / r.elapsed.as_secs_f64()
        );
    }
    println!("  total                 {:.0} MB/s ({total_read} B in {wall:.3} s wall; sum of per-reader rates {sum_of_rates:.0} MB/s)", aggregate);
    if let Some(cpu) = cpu_keep_alive {
        println!("  server CPU            {cpu:.0} ms per GB read");
    }
    if let Some((rate, requests, cpu)) = per_request {
        println!("  a connection per request: {rate:.0} MB/s in all ({requests} requests)");
        if let Some(cpu) = cpu {
            println!("  server CPU (a connection per request) {cpu:.0} ms per GB read");
        }
    }
    for (mode, rate, requests, cpu) in &foreign {
        let cpu = cpu.map_or_else(String::new, |c| format!(", server CPU {c:.0} ms per GB read"));
        println!("  {mode} readers: {rate:.0} MB/s in all ({requests} requests){cpu}");
    }
    let opt_f64 = |v: Option<f64>| v.map_or_else(|| "null".into(), |v| json_f64(v, 1));
    let foreign_field = |mode: &str, pick: fn(&(&str, f64, u64, Option<f64>)) -> Option<f64>| {
        foreign.iter().find(|f| f.0 == mode).and_then(pick).map_or_else(|| "null".into(), |v| json_f64(v, 1))
    };
    let times_json = format!("[{}]", times.iter().map(|t| json_f64(*t, 3)).collect::<Vec<_>>().join(","));
    println!(
        "{}",
        common::summary_line(&[
            ("bench", json_str("read")),
            ("size_bytes", written.to_string()),
            ("append_bytes", args.append_bytes.to_string()),
            ("readers", args.readers.to_string()),
            (
                "reader",
                json_str(match args.reader {
                    ReaderKind::KeepAlive => "keep-alive",
                    ReaderKind::PerRequest => "per-request",
                    ReaderKind::Both => "both",
                })
            ),
            ("requests", reports.iter().map(|r| r.requests).sum::<u64>().to_string()),
            // `--reader both`: the second pass, a connection per request.
            ("per_request_mb_per_s", per_request.map_or_else(|| "null".into(), |(r, _, _)| json_f64(r, 1))),
            ("per_request_requests", per_request.map_or_else(|| "null".into(), |(_, n, _)| n.to_string())),
            // `--server-pid`: the server's CPU time per GB received, each pass.
            ("cpu_ms_per_gb", opt_f64(cpu_keep_alive)),
            ("per_request_cpu_ms_per_gb", opt_f64(per_request.and_then(|(_, _, c)| c))),
            // `--foreign`: readers that are not ours.
            ("python_mb_per_s", foreign_field("python", |f| Some(f.1))),
            ("python_cpu_ms_per_gb", foreign_field("python", |f| f.3)),
            ("curl_mb_per_s", foreign_field("curl", |f| Some(f.1))),
            ("curl_requests", foreign_field("curl", |f| Some(f.2 as f64))),
            ("curl_cpu_ms_per_gb", foreign_field("curl", |f| f.3)),
            ("write_s", json_f64(write_s, 3)),
            ("write_mb_per_s", json_f64(written as f64 / 1e6 / write_s, 1)),
            ("wall_s", json_f64(wall, 3)),
            ("total_mb_per_s", json_f64(aggregate, 1)),
            // What one response carries on average: servers differ in how much a catch-up
            // read returns, which sets the number of round trips a reader makes.
            (
                "mean_response_kb",
                json_f64(
                    reports.iter().map(|r| r.bytes).sum::<u64>() as f64
                        / 1024.0
                        / reports.iter().map(|r| r.requests.max(1)).sum::<u64>() as f64,
                    1
                )
            ),
            ("sum_reader_mb_per_s", json_f64(sum_of_rates, 1)),
            ("reader_s", times_json),
            ("errors", "0".into()),
        ])
    );
    Ok(())
}

/// `readers` readers of `url` of one kind, started together: the wall time and each one's report.
async fn read_phase(
    readers: usize,
    kind: ReaderKind,
    url: &str,
    request_timeout: Duration,
) -> Result<(f64, Vec<ReaderReport>), String> {
    let mut clients = Vec::with_capacity(readers);
    for _ in 0..readers {
        // No idle connection kept: every request connects anew.
        let idle = if kind == ReaderKind::PerRequest { 0 } else { 1 };
        clients.push(common::pooled_client(request_timeout, idle)?);
    }
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(readers + 1));
    let mut tasks = Vec::with_capacity(readers);
    for client in clients {
        let url = url.to_owned();
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            read_all(client, url).await
        }));
    }
    barrier.wait().await;
    let read_start = Instant::now();
    let mut reports = Vec::with_capacity(tasks.len());
    for t in tasks {
        reports.push(t.await.map_err(|e| format!("reader task failed: {e}"))??);
    }
    Ok((read_start.elapsed().as_secs_f64(), reports))
}

/// `readers` foreign readers of `url` (`mode`: `python` or `curl`, see `--foreign`), one process
/// each, started together: the wall time until the last one ends and each one's report.
async fn foreign_phase(readers: usize, mode: &str, url: &str) -> Result<(f64, Vec<ReaderReport>), String> {
    let start = Instant::now();
    let mut children = Vec::with_capacity(readers);
    for _ in 0..readers {
        let child = std::process::Command::new("python3")
            .args(["-c", FOREIGN_READER, mode, url])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start python3 for the {mode} readers: {e}"))?;
        children.push(child);
    }
    // Each child waited for on a blocking thread, so the benchmark's own timeout still applies.
    let waits: Vec<_> = children
        .into_iter()
        .map(|child| {
            tokio::task::spawn_blocking(move || {
                let out = child.wait_with_output().map_err(|e| format!("waiting for a reader: {e}"))?;
                Ok::<_, String>((start.elapsed(), out))
            })
        })
        .collect();
    let mut reports = Vec::with_capacity(readers);
    for wait in waits {
        let (elapsed, out) = wait.await.map_err(|e| format!("reader wait failed: {e}"))??;
        if !out.status.success() {
            return Err(format!("{mode} reader failed: {}", String::from_utf8_lossy(&out.stderr).trim()));
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let number = |key: &str| {
            let rest = text.split(&format!("\"{key}\": ")).nth(1)?;
            rest.split(|c: char| !c.is_ascii_digit()).next()?.parse::<u64>().ok()
        };
        let (Some(bytes), Some(requests)) = (number("bytes"), number("requests")) else {
            return Err(format!("{mode} reader printed no report: {text}"));
        };
        reports.push(ReaderReport { bytes, requests, elapsed });
    }
    Ok((start.elapsed().as_secs_f64(), reports))
}

/// Reads the stream from the start until the server says the tail is reached, each body counted
/// piece by piece as it arrives.
async fn read_all(client: reqwest::Client, url: String) -> Result<ReaderReport, String> {
    let start = Instant::now();
    let mut offset = String::from("-1");
    let (mut bytes, mut requests) = (0u64, 0u64);
    loop {
        let resp = client
            .get(format!("{url}?offset={}", common::encode_query_value(&offset)))
            .send()
            .await
            .map_err(|e| format!("GET at offset {offset}: {e}"))?;
        requests += 1;
        let status = resp.status();
        if status.as_u16() != 200 {
            return Err(format!("GET at offset {offset}: status {status}"));
        }
        let header = |name: &str| resp.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
        let next =
            header("stream-next-offset").ok_or_else(|| format!("GET at offset {offset}: no Stream-Next-Offset"))?;
        let up_to_date = header("stream-up-to-date").is_some_and(|v| v.eq_ignore_ascii_case("true"));
        let mut resp = resp;
        let mut body_len = 0u64;
        while let Some(piece) = resp.chunk().await.map_err(|e| format!("GET at offset {offset}: body: {e}"))? {
            body_len += piece.len() as u64;
        }
        bytes += body_len;
        if up_to_date {
            break;
        }
        if body_len == 0 && next == offset {
            return Err(format!("GET at offset {offset}: no progress and not up to date"));
        }
        offset = next;
    }
    Ok(ReaderReport { bytes, requests, elapsed: start.elapsed() })
}
