//! `oncelog`: the command line. `serve` runs the Durable Streams server on its storage engine;
//! `create | append | read | tail | head | close | delete | trim | compact | ls` are a client built on
//! `oncelog-client`; `ship` follows a log file into a stream exactly once; `sub` manages
//! subscriptions; `sink` applies streams to a database exactly once; `token` mints credentials;
//! `backup` copies a running log engine's data directory. Thin by design: all behaviour lives in
//! the library crates.
//!
//! Modules: [`serve`] (the server subcommand), [`conn`] (the connection arguments every client
//! subcommand shares), [`commands`] (the client subcommands), [`output`]
//! (how `read` and `tail` print), [`ship`] (`ship`: its state file, following the file), [`sub`]
//! (`sub create | get | delete | list | link | unlink`), [`sink`] (`sink postgres`), [`token`]
//! (`token issue`, `token sign-url`).

mod commands;
mod conn;
mod logging;
mod output;
mod serve;
#[cfg(unix)]
mod ship;
mod sink;
mod sub;
mod token;

use clap::{Parser, Subcommand};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

extern "C" {
    /// mimalloc's option setter (the static library `mimalloc` links; `libmimalloc-sys` only
    /// declares it behind a feature that pulls in another crate).
    fn mi_option_set(option: std::ffi::c_int, value: std::ffi::c_long);
}

/// `mi_option_arena_eager_commit` in mimalloc v3's `mi_option_e` (include/mimalloc.h), the
/// version `libmimalloc-sys` 0.1.49 builds by default.
const MI_OPTION_ARENA_EAGER_COMMIT: std::ffi::c_int = 4;

/// Memory that follows demand: mimalloc commits its first arena eagerly on Linux (overcommit),
/// about 9 MB of resident memory before anything is stored. Committed on use instead: idle RSS
/// 20.8 -> 11.9 MB, after S1 about 100 -> 72 MB, with no CPU cost in an A/B of S1
/// (docs/BENCHMARKS.md, issue 25). The arena is reserved by the first allocation, which the Rust
/// runtime makes before `main`, so the option is set by a constructor (`.init_array`), which the
/// loader runs before the runtime starts.
extern "C" fn lazy_arena_commit() {
    // SAFETY: mi_option_set only stores an option value; any option index and value are valid.
    unsafe { mi_option_set(MI_OPTION_ARENA_EAGER_COMMIT, 0) };
}

#[cfg(target_os = "linux")]
#[used]
#[link_section = ".init_array"]
static LAZY_ARENA_COMMIT: extern "C" fn() = lazy_arena_commit;

#[derive(Parser)]
#[command(name = "oncelog", version, about = "Durable Streams server and client with exactly-once producers")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the server on its crash-safe storage engine (`--storage`).
    Serve(Box<serve::ServeArgs>),
    /// Create a stream (succeeds if an identical one exists); prints its tail offset.
    Create(commands::CreateArgs),
    /// Append stdin to a stream through an exactly-once producer: one item per line, or one
    /// message per JSON value on a JSON stream (each value's exact text, never re-serialised).
    /// Prints the final offset.
    Append(commands::AppendArgs),
    /// Print a stream's content from an offset up to its current end, byte for byte as stored:
    /// one JSON message per line, or a byte stream's bytes as they are.
    Read(commands::ReadArgs),
    /// Follow a stream live (SSE or long-poll) until it is closed; prints as `read` does.
    Tail(commands::TailArgs),
    /// Follow a log file like `tail -F` (rotation by rename or truncation) and append each line
    /// to a byte stream exactly once, across restarts and SIGKILL. A state file (default
    /// FILE.oncelog-ship) holds the position and the one batch that may be unacknowledged; a
    /// restart resends that batch under the same Idempotency-Key, so it is stored once as long
    /// as the restart comes within the server's --idempotency-window (24 h by default).
    /// Bytes after the last newline wait for it; a rotated file's last line without one is
    /// shipped with a newline added. With copytruncate, lines not yet read when the file is
    /// truncated are not shipped (they are in the copy).
    #[cfg(unix)]
    Ship(ship::ShipArgs),
    /// Print a stream's metadata: content type, tail offset, closure, expiry, earliest offset,
    /// retention.
    Head(commands::StreamArgs),
    /// Close a stream (optionally appending a final message); prints the final offset.
    Close(commands::CloseArgs),
    /// Delete a stream and its data (`--purge`: also free the path of a stream that forks still
    /// read).
    Delete(commands::DeleteArgs),
    /// List the streams the credentials may read, in path order: one path per line, or with
    /// `--long` path, content type, tail offset and open/closed (an Oncelog extension).
    Ls(commands::LsArgs),
    /// Drop a stream's data before an offset (reads from before it then get 410); prints the
    /// earliest offset.
    Trim(commands::TrimArgs),
    /// Replace a State Protocol stream's history with a snapshot of its state (the stream was
    /// created with `--compaction state`); prints where the stream starts now.
    Compact(commands::StreamArgs),
    /// Manage subscriptions (webhook or pull-wake): create, get, delete, list, link, unlink.
    #[command(subcommand)]
    Sub(sub::SubCommand),
    /// Apply streams to a database exactly once: `sink postgres` (docs/SINKS.md).
    #[command(subcommand)]
    Sink(sink::SinkCommand),
    /// Mint bearer tokens and signed read URLs with the server's HMAC secret.
    #[command(subcommand)]
    Token(token::TokenCommand),
    /// Copy a log-engine data directory while its server keeps running; the copy opens as the
    /// state of one moment (`oncelog serve --data-dir DIR`).
    Backup(BackupArgs),
}

#[derive(clap::Args)]
struct BackupArgs {
    /// The server's data directory.
    #[arg(long, env = "ONCELOG_DATA_DIR", default_value = "./data")]
    data_dir: std::path::PathBuf,
    /// Where the copy goes: a new or empty directory.
    #[arg(long)]
    to: std::path::PathBuf,
    #[command(flatten)]
    log: logging::LogArgs,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    // The commands that run unattended log at info by default, with --log-level and
    // --log-format; client commands keep stderr quiet unless RUST_LOG asks.
    let secrets = logging::secrets_in(&match &cli.command {
        Command::Serve(a) => vec![a.storage.as_str()],
        Command::Sink(cmd) => vec![cmd.target()],
        _ => vec![],
    });
    logging::init(
        match &cli.command {
            Command::Serve(a) => &a.log,
            Command::Sink(cmd) => cmd.log(),
            Command::Backup(a) => &a.log,
            #[cfg(unix)]
            Command::Ship(a) => &a.log,
            _ => &logging::LogArgs::QUIET,
        },
        secrets,
    );
    // Blocking threads run the log engine's disk reads (and DNS for webhooks). Tokio's default
    // of 512 lets a crowd of readers that need the disk start hundreds of threads, each with its
    // stack and allocator heap: 200 stalled SSE readers made 127 threads and 60 MiB more RSS
    // (tests/stalled_readers.rs). Reads mostly come from the page cache and are CPU-bound, so a
    // few per core keep the disk busy and the memory flat.
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .max_blocking_threads((8 * cores).max(16))
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the async runtime");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = match cli.command {
        Command::Backup(a) => {
            let started = std::time::Instant::now();
            return match oncelog_log::backup::backup(&a.data_dir, &a.to) {
                Ok(r) => {
                    // The log line is for the operator's log (cron, a timer unit); the stdout
                    // line below is the command's answer, for scripts.
                    tracing::info!(
                        from = %a.data_dir.display(),
                        to = %a.to.display(),
                        bytes = r.bytes,
                        files = r.segments.len() + usize::from(r.checkpoint),
                        segments = r.segments.len(),
                        checkpoint = r.checkpoint,
                        restarts = r.restarts,
                        elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
                        "backup done"
                    );
                    println!(
                        "backed up {} segment(s){}, {} bytes, into {}",
                        r.segments.len(),
                        if r.checkpoint { " and the checkpoint" } else { "" },
                        r.bytes,
                        a.to.display()
                    );
                    std::process::ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("oncelog: backup failed: {e}");
                    std::process::ExitCode::FAILURE
                }
            };
        }
        Command::Token(cmd) => {
            return match token::run(cmd) {
                Ok(out) => {
                    println!("{out}");
                    std::process::ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("oncelog: {e}");
                    std::process::ExitCode::FAILURE
                }
            };
        }
        Command::Serve(args) => runtime.block_on(serve::serve(*args)),
        Command::Create(args) => return commands::exit(runtime.block_on(commands::create(args))),
        Command::Append(args) => return commands::exit(runtime.block_on(commands::append(args))),
        Command::Read(args) => return commands::exit(runtime.block_on(commands::read(args))),
        Command::Tail(args) => return commands::exit(runtime.block_on(commands::tail(args))),
        // Unattended like `serve`: its end is logged (in --log-format), not printed.
        #[cfg(unix)]
        Command::Ship(args) => runtime.block_on(ship::ship(args)).map_err(Into::into),
        Command::Head(args) => return commands::exit(runtime.block_on(commands::head(args))),
        Command::Close(args) => return commands::exit(runtime.block_on(commands::close(args))),
        Command::Delete(args) => return commands::exit(runtime.block_on(commands::delete(args))),
        Command::Ls(args) => return commands::exit(runtime.block_on(commands::ls(args))),
        Command::Trim(args) => return commands::exit(runtime.block_on(commands::trim(args))),
        Command::Compact(args) => return commands::exit(runtime.block_on(commands::compact(args))),
        Command::Sub(cmd) => return commands::exit(runtime.block_on(sub::run(cmd))),
        Command::Sink(cmd) => runtime.block_on(sink::run(cmd)).map_err(Into::into),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "oncelog stopped");
            std::process::ExitCode::FAILURE
        }
    }
}
