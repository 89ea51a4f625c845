//! `oncelog-bench`: load generators for Oncelog (see docs/BENCHMARKS.md).
//!
//! * `append`: workload S1, idempotent producers in a closed loop, reports appends/s and latency.
//! * `read`: writes one large stream, then measures concurrent catch-up reads of all of it.
//!
//! Both only talk to loopback URLs and stop by themselves. Each prints human-readable results
//! and one final machine-readable line starting with `oncelog-bench-summary ` followed by JSON.

mod append;
mod common;
mod read;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "oncelog-bench",
    version,
    about = "Load generator for Oncelog (loopback only)"
)]
struct Cli {
    /// Tokio worker threads for the generator (0 = one per CPU).
    #[arg(long, global = true, default_value_t = 0)]
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
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
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
        match cli.command {
            Command::Append(a) => append::run(a).await,
            Command::Read(r) => read::run(r).await,
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
