//! Fill: write a given volume of data over several streams (one idempotent producer per stream,
//! closed loop, large appends), then record each stream's tail in a manifest. Used before a
//! SIGKILL to measure how long the server takes to recover that volume (`ready`).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::common::{self, error_kind, json_f64, json_str};

#[derive(clap::Args, Debug)]
pub struct FillArgs {
    #[command(flatten)]
    pub target: common::TargetArgs,
    /// Total volume to write, in MB (10^6 bytes), spread evenly over the streams.
    #[arg(long, default_value_t = 1000)]
    pub size_mb: u64,
    /// Number of streams, each written by its own producer and connection.
    #[arg(long, default_value_t = 4)]
    pub streams: usize,
    /// Size of each append, in bytes.
    #[arg(long, default_value_t = 64 * 1024)]
    pub append_bytes: usize,
    /// Abort (with an error) if writing takes longer than this, in seconds.
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
    /// Write NAME<TAB>TAIL for every stream here (for `ready`).
    #[arg(long)]
    pub manifest: Option<PathBuf>,
}

pub async fn run(args: FillArgs) -> Result<(), String> {
    let target = args.target.resolve()?;
    if args.size_mb == 0 || args.streams == 0 || args.append_bytes == 0 {
        return Err("--size-mb, --streams and --append-bytes must be positive".into());
    }
    let limit = Duration::from_secs(args.timeout.max(1));
    match tokio::time::timeout(limit, run_inner(&args, &target)).await {
        Ok(r) => r,
        Err(_) => Err(format!("fill aborted: not finished after {} s", args.timeout)),
    }
}

async fn run_inner(args: &FillArgs, target: &common::Target) -> Result<(), String> {
    let tag = common::run_tag();
    let total = args.size_mb * 1_000_000;
    let per_stream = total / args.streams as u64;
    let chunk = Bytes::from((0..args.append_bytes).map(|i| (i % 251) as u8).collect::<Vec<u8>>());
    let setup = common::client(Duration::from_secs(30))?;
    let mut names = Vec::with_capacity(args.streams);
    for i in 0..args.streams {
        let name = format!("bench-fill-{tag}-{i}");
        common::create_stream(&setup, &target.stream_url(&name), "application/octet-stream").await?;
        names.push(name);
    }
    eprintln!(
        "fill: {} MB over {} streams in appends of {} B, {}",
        args.size_mb,
        args.streams,
        args.append_bytes,
        target.describe()
    );

    let start = Instant::now();
    let mut tasks = Vec::with_capacity(args.streams);
    for name in &names {
        let client = common::client(Duration::from_secs(60))?;
        let url = target.stream_url(name);
        let producer = format!("{name}-writer");
        let chunk = chunk.clone();
        tasks.push(tokio::spawn(async move { write_stream(client, url, producer, chunk, per_stream).await }));
    }
    let mut appends = 0u64;
    for t in tasks {
        appends += t.await.map_err(|e| format!("writer task failed: {e}"))??;
    }
    let elapsed = start.elapsed().as_secs_f64();

    // The tails as the server reports them now: what a restarted server must show again.
    let mut entries = Vec::with_capacity(names.len());
    for name in &names {
        let url = target.stream_url(name);
        match common::head_tail(&setup, &url).await {
            Ok((200, Some(tail))) => entries.push((name.clone(), tail)),
            Ok((status, _)) => return Err(format!("HEAD {url}: status {status} without a tail")),
            Err(e) => return Err(format!("HEAD {url}: {}", error_kind(&e))),
        }
    }
    if let Some(path) = &args.manifest {
        common::write_manifest(path, &entries)?;
    }
    let written = per_stream * args.streams as u64;
    let mb_per_s = written as f64 / 1e6 / elapsed.max(1e-9);
    println!(
        "Fill results: {written} B in {appends} appends over {} streams, {elapsed:.2} s ({mb_per_s:.0} MB/s)",
        args.streams
    );
    println!(
        "{}",
        common::summary_line(&[
            ("bench", json_str("fill")),
            ("size_bytes", written.to_string()),
            ("streams", args.streams.to_string()),
            ("append_bytes", args.append_bytes.to_string()),
            ("appends", appends.to_string()),
            ("elapsed_s", json_f64(elapsed, 3)),
            ("mb_per_s", json_f64(mb_per_s, 1)),
        ])
    );
    Ok(())
}

/// Writes `bytes` to one stream, one append at a time; returns the number of appends.
async fn write_stream(
    client: reqwest::Client,
    url: String,
    producer: String,
    chunk: Bytes,
    bytes: u64,
) -> Result<u64, String> {
    let mut written = 0u64;
    let mut seq = 0u64;
    let mut failures = 0u32;
    while written < bytes {
        let n = usize::try_from((bytes - written).min(chunk.len() as u64)).unwrap_or(chunk.len());
        let result = client
            .post(&url)
            .header("content-type", "application/octet-stream")
            .header("producer-id", producer.as_str())
            .header("producer-epoch", "0")
            .header("producer-seq", seq.to_string())
            .body(chunk.slice(..n))
            .send()
            .await;
        let outcome = match result {
            Ok(resp) => {
                let status = resp.status().as_u16();
                let text = resp.bytes().await.unwrap_or_default();
                match status {
                    200 | 204 => Ok(()),
                    other => Err(format!("status {other}: {}", String::from_utf8_lossy(&text))),
                }
            }
            Err(e) => Err(error_kind(&e)),
        };
        match outcome {
            Ok(()) => {
                written += n as u64;
                seq += 1;
                failures = 0;
            }
            // Retried with the same sequence number; a server that keeps failing ends the run.
            Err(e) if failures < 5 => {
                failures += 1;
                eprintln!("  {url} seq {seq}: {e}; retrying");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(format!("append to {url} seq {seq}: {e}")),
        }
    }
    Ok(seq)
}
