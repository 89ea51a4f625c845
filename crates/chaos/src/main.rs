//! `oncelog-chaos`: one seeded run of the fault suite (see `oncelog_chaos`); `scripts/chaos`
//! builds and calls it. Ends with `chaos: N operations, F faults, V violations`; the exit status
//! is 0 only when V is 0.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, ValueEnum};

#[derive(Clone, Copy, ValueEnum)]
enum EngineKind {
    Log,
    Postgres,
    /// The log engine keeping its log in a bucket (`--ack-mode bucket`): the S3 API server at
    /// `ONCELOG_TEST_S3_ENDPOINT` (bucket `oncelog-test`) behind a fault proxy.
    LogBucket,
}

#[derive(Parser)]
#[command(name = "oncelog-chaos", about = "A seeded run of Oncelog under faults, checked for exactly-once")]
struct Args {
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Length of the faulty part of the run, in seconds (`--minutes` in scripts/chaos).
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    #[arg(long, value_enum, default_value = "log")]
    engine: EngineKind,
    /// The `oncelog` binary.
    #[arg(long)]
    bin: PathBuf,
    /// `scripts/postgres` (the PostgreSQL engine's clusters).
    #[arg(long, default_value = "scripts/postgres")]
    pg_script: PathBuf,
    /// Where the history, the nodes' logs and the report go.
    #[arg(long)]
    out: PathBuf,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let engine = match args.engine {
        EngineKind::Log => oncelog_chaos::run::Engine::Log,
        EngineKind::Postgres => oncelog_chaos::run::Engine::Postgres,
        EngineKind::LogBucket => oncelog_chaos::run::Engine::LogBucket,
    };
    let plan = oncelog_chaos::run::Plan {
        seed: args.seed,
        duration: Duration::from_secs(args.seconds),
        engine,
        bin: args.bin,
        pg_script: args.pg_script,
        out: args.out,
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("chaos: cannot start a runtime: {e}");
            return ExitCode::from(2);
        }
    };
    match runtime.block_on(oncelog_chaos::run::run(&plan)) {
        Ok(s) => {
            for v in s.violations.iter().take(20) {
                eprintln!("violation: {v}");
            }
            println!("chaos: {} operations, {} faults, {} violations", s.operations, s.faults, s.violations.len());
            if s.violations.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("chaos: the run failed: {e}");
            ExitCode::from(2)
        }
    }
}
