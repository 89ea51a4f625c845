//! `oncelog-bench`: load generators for Oncelog (see docs/BENCHMARKS.md and scripts/bench-peers).
//!
//! * `append` ([`append`]): workload S1, idempotent producers in a closed loop (optionally
//!   several requests in flight per producer), reports appends/s, latency and 409s.
//! * `read` ([`read`]): writes one large stream, then measures concurrent catch-up reads of it.
//! * `sse` and `longpoll` ([`live`]): R live readers of one stream while a writer appends;
//!   append→delivery latency and whether every reader got every message.
//! * `streams` ([`streams`]): create N streams with one append each; streams/s and errors.
//! * `fill` ([`fill`]): write a volume of data over several streams and record their tails.
//! * `ready` ([`ready`]): after a restart, time until the recorded streams answer HEAD with
//!   their tails.
//! * `free-port` ([`port`]): print an unused loopback TCP port.
//! * `peers` ([`peers`]): Oncelog and its peer servers side by side, servers alternating, each
//!   scenario run through the generators above; writes a markdown table and an SVG chart
//!   (`scripts/bench-peers` builds the release binaries and runs it).
//!
//! All talk only to loopback URLs (`--url`, with `--prefix` for where streams live) and stop by
//! themselves. Each benchmark prints human-readable results and one final machine-readable line
//! starting with `oncelog-bench-summary ` followed by a flat JSON object.

mod append;
mod common;
mod disk;
mod fill;
mod live;
mod peers;
mod port;
mod read;
mod ready;
mod streams;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "oncelog-bench", version, about = "Load generator for Oncelog (loopback only)")]
struct Cli {
    /// Tokio worker threads for the generator (0 = one per CPU; `peers` does not use it).
    #[arg(long, global = true, default_value_t = 0, display_order = 100)]
    threads: usize,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Workload S1: N idempotent producers over M streams, closed loop, 1 KiB appends.
    Append(append::AppendArgs),
    /// Write one large stream, then read it whole with R concurrent catch-up readers.
    Read(read::ReadArgs),
    /// R SSE readers of one stream while one writer appends: append→delivery latency.
    Sse(live::LiveArgs),
    /// R long-poll readers of one stream while one writer appends: append→delivery latency.
    Longpoll(live::LiveArgs),
    /// Create N streams and append once to each: streams/s, errors.
    Streams(streams::StreamsArgs),
    /// Write a volume of data over several streams; record their tails in a manifest.
    Fill(fill::FillArgs),
    /// Poll the streams of a manifest until each answers HEAD with its recorded tail.
    Ready(ready::ReadyArgs),
    /// A bare pwrite + fdatasync loop: the physical limit of one durable append here.
    Disk(disk::DiskArgs),
    /// Print an unused TCP port on 127.0.0.1.
    FreePort,
    /// Oncelog side by side with its peers (Electric's Rust server, the reference Node server):
    /// every scenario on fresh servers, servers alternating; writes a markdown table of medians
    /// with Oncelog/Electric ratios and an SVG chart next to it (what scripts/bench-peers runs).
    #[command(
        override_usage = "scripts/bench-peers [OPTIONS]\n       oncelog-bench peers [OPTIONS]",
        after_help = peers::AFTER_HELP,
        args_override_self = true
    )]
    Peers(peers::PeersArgs),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    // Not a load generator: it starts servers and generators as processes, without a runtime.
    let command = match cli.command {
        Command::Peers(args) => return peers::run(args),
        other => other,
    };
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    if cli.threads > 0 {
        builder.worker_threads(cli.threads);
    }
    let runtime = match builder.build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("oncelog-bench: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match command {
            Command::Append(a) => append::run(a).await,
            Command::Read(r) => read::run(r).await,
            Command::Sse(l) => live::run(l, live::Mode::Sse).await,
            Command::Longpoll(l) => live::run(l, live::Mode::LongPoll).await,
            Command::Streams(s) => streams::run(s).await,
            Command::Fill(f) => fill::run(f).await,
            Command::Ready(r) => ready::run(r).await,
            Command::Disk(d) => disk::run(d),
            Command::FreePort => port::run(),
            Command::Peers(_) => Err("peers runs without the async runtime".into()),
        }
    });
    // Do not wait for stray tasks (e.g. a request stuck past its deadline).
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("oncelog-bench: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
