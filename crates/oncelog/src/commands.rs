//! The client subcommands, built on `oncelog-client`: argument types, and one small function per
//! subcommand. Data goes to stdout, diagnostics to stderr; exit status 1 on any error.

use std::io::BufRead;
use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use oncelog_client::{
    AppendOptions, CreateOptions, FileEpochStore, Limit, LiveMode, OnTrimmed, ReadFrom, ReadOptions, RetryPolicy,
    StreamHandle, StreamOffset,
};
use serde_json::value::RawValue;

pub use crate::conn::{Conn, ConnError};
use crate::output::{PrintError, Printer};

/// Why a client subcommand failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The server or the network said no.
    #[error(transparent)]
    Client(#[from] oncelog_client::Error),
    /// Reading stdin or writing stdout failed.
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    /// The connection arguments could not be used.
    #[error(transparent)]
    Conn(#[from] ConnError),
    /// Stdin of a JSON stream is not a sequence of JSON values.
    #[error("stdin is not a sequence of JSON values: {0}")]
    NotJson(#[from] serde_json::Error),
    /// A single conditional or keyed append got nothing to send.
    #[error("--if-match, --expected-offset and --idempotency-key need data on stdin")]
    NoData,
    /// `sub create` needs exactly one delivery.
    #[error("give exactly one of --webhook-url and --wake-stream")]
    OneDelivery,
    /// Printing a read failed, or its answer cannot be cut into messages.
    #[error(transparent)]
    Print(#[from] PrintError),
}

/// Prints the error (if any) and picks the exit status.
pub fn exit(result: Result<(), CliError>) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        // A reader piped into `head` has nothing left to do.
        Err(CliError::Io(e) | CliError::Print(PrintError::Io(e))) if e.kind() == std::io::ErrorKind::BrokenPipe => {
            std::process::ExitCode::SUCCESS
        }
        // A conditional append lost the race (`--if-match`'s 412 or `--expected-offset`'s 409):
        // scripts retry on this status. The message names the current tail.
        Err(
            e @ CliError::Client(
                oncelog_client::Error::PreconditionFailed { .. } | oncelog_client::Error::ExpectedOffsetConflict { .. },
            ),
        ) => {
            eprintln!("oncelog: {e}");
            std::process::ExitCode::from(3)
        }
        Err(e) => {
            eprintln!("oncelog: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// A subcommand that only names a stream.
#[derive(clap::Args)]
pub struct StreamArgs {
    #[command(flatten)]
    conn: Conn,
    /// Stream name (its path under the URL).
    stream: String,
}

#[derive(clap::Args)]
pub struct DeleteArgs {
    #[command(flatten)]
    conn: Conn,
    /// Stream name (its path under the URL).
    stream: String,
    /// Also free the path of a stream that forks still read (an Oncelog extension, `DELETE
    /// …?purge=true`): without it such a stream's path stays reserved (410) until its last fork
    /// is gone; with it the path is free at once and the forks read on. Works on a stream
    /// already deleted that way too.
    #[arg(long)]
    purge: bool,
}

#[derive(clap::Args)]
pub struct LsArgs {
    #[command(flatten)]
    conn: Conn,
    /// Only streams whose path starts with this (no wildcards: `logs/` lists `logs/…`).
    #[arg(default_value = "")]
    prefix: String,
    /// Also show each stream's content type, tail offset and whether it is closed
    /// (tab-separated).
    #[arg(long, short = 'l')]
    long: bool,
}

#[derive(clap::Args)]
pub struct CreateArgs {
    #[command(flatten)]
    conn: Conn,
    /// Stream name (its path under the URL).
    stream: String,
    /// Content type of the stream.
    #[arg(long, default_value = "text/plain", conflicts_with = "json")]
    content_type: String,
    /// Shorthand for --content-type application/json (message mode).
    #[arg(long)]
    json: bool,
    /// Expire after this many seconds without reads or writes.
    #[arg(long, value_name = "SECONDS", conflicts_with = "expires_at")]
    ttl: Option<u64>,
    /// Expire at this RFC 3339 time.
    #[arg(long, value_name = "RFC3339")]
    expires_at: Option<String>,
    /// Create the stream already closed (empty, final).
    #[arg(long)]
    closed: bool,
    /// Drop data older than this (`7d`, `24h`, `30m`, `90s`), or `none` for no limit whatever
    /// the server's default. Without it, the server's default applies.
    #[arg(long, value_name = "DURATION|none", value_parser = parse_age_limit)]
    retention_max_age: Option<Limit>,
    /// Keep at least this many of the newest bytes (`10G`, `512M`, bytes) and drop whole appends
    /// before them, or `none`. Without it, the server's default applies.
    #[arg(long, value_name = "SIZE|none", value_parser = parse_size_limit)]
    retention_max_bytes: Option<Limit>,
    /// `state`: a JSON stream of State Protocol messages that `oncelog compact` can shorten.
    #[arg(long, value_enum)]
    compaction: Option<CompactionKind>,
}

/// The compactions a stream can be created for.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum CompactionKind {
    /// State Protocol: the latest value of each entity replaces the history.
    State,
}

fn parse_age_limit(text: &str) -> Result<Limit, String> {
    if text.eq_ignore_ascii_case("none") {
        return Ok(Limit::Unlimited);
    }
    crate::token::parse_duration(text).map(|d| Limit::At(d.as_secs()))
}

fn parse_size_limit(text: &str) -> Result<Limit, String> {
    if text.eq_ignore_ascii_case("none") {
        return Ok(Limit::Unlimited);
    }
    crate::token::parse_bytes(text).map(Limit::At)
}

/// What a reader does when its position was trimmed away (a trim or retention got there first).
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum TrimmedMode {
    /// Stop with an error naming the earliest offset.
    Fail,
    /// Go on from the earliest offset (what was dropped is skipped; a warning says so).
    Restart,
}

impl From<TrimmedMode> for OnTrimmed {
    fn from(m: TrimmedMode) -> OnTrimmed {
        match m {
            TrimmedMode::Fail => OnTrimmed::Fail,
            TrimmedMode::Restart => OnTrimmed::RestartFromEarliest,
        }
    }
}

#[derive(clap::Args)]
pub struct TrimArgs {
    #[command(flatten)]
    conn: Conn,
    /// Stream name (its path under the URL).
    stream: String,
    /// Drop everything before this offset (one the server returned; a JSON stream's must be a
    /// message boundary). A lower offset than the stream's earliest changes nothing.
    #[arg(long, value_name = "OFFSET")]
    to: String,
}

#[derive(clap::Args)]
pub struct AppendArgs {
    #[command(flatten)]
    conn: Conn,
    /// Stream name (its path under the URL).
    stream: String,
    /// Producer id: keep it stable across restarts of the same writer so its epochs fence each
    /// other. Defaults to a fresh id per run.
    #[arg(long, env = "ONCELOG_PRODUCER_ID")]
    producer_id: Option<String>,
    /// Producer epoch. With --epoch-file, the stored epoch + 1 is used when higher.
    #[arg(long)]
    epoch: Option<u64>,
    /// File that keeps the producer's epoch: each run uses a higher epoch than the last, so a
    /// restarted writer fences any request its killed predecessor still has in flight.
    #[arg(long, value_name = "PATH")]
    epoch_file: Option<PathBuf>,
    /// On 403 (a newer epoch of this producer id exists), claim a higher epoch and continue.
    #[arg(long)]
    auto_claim: bool,
    /// How long a batch waits for more lines, in milliseconds.
    #[arg(long, default_value_t = 5)]
    linger_ms: u64,
    /// Batches in flight at once.
    #[arg(long, default_value_t = 5)]
    max_in_flight: usize,
    /// Largest batch body in bytes.
    #[arg(long, default_value_t = 1 << 20)]
    batch_bytes: usize,
    /// Most items per batch.
    #[arg(long, default_value_t = 10_000)]
    batch_items: usize,
    /// Close the stream after the last line (EOF for readers).
    #[arg(long)]
    close: bool,
    /// Conditional append: all of stdin as one append, written only if the stream's tail is this
    /// offset (a Stream-Next-Offset printed earlier). Otherwise nothing is written, the current
    /// tail is printed on stderr and the exit status is 3. No producer is used.
    #[arg(long, value_name = "OFFSET", conflicts_with_all = ["producer_id", "epoch", "epoch_file", "auto_claim"])]
    if_match: Option<String>,
    /// The protocol's strict compare-and-append (`Stream-Expected-Offset`): all of stdin as one
    /// append, written only if the stream's tail is exactly this offset. Otherwise nothing is
    /// written, the current tail is printed on stderr and the exit status is 3, as with
    /// --if-match (the server answers 409 rather than 412; any server implementing the upstream
    /// header honours it). No producer is used.
    #[arg(long, value_name = "OFFSET", conflicts_with_all = ["producer_id", "epoch", "epoch_file", "auto_claim"])]
    expected_offset: Option<String>,
    /// All of stdin as one append with this Idempotency-Key (a new UUIDv7 when no value is
    /// given, printed on stderr): retried until acknowledged, never written twice. Running the
    /// command again with the same key and input is answered from the first run.
    #[arg(long, value_name = "KEY", num_args = 0..=1, default_missing_value = "", conflicts_with_all = ["producer_id", "epoch", "epoch_file", "auto_claim"])]
    idempotency_key: Option<String>,
}

/// Where a read starts: -1 (the beginning), now (the tail) or an offset token.
fn parse_from(s: &str) -> Result<ReadFrom, String> {
    if s.is_empty() {
        return Err("an offset must not be empty".into());
    }
    Ok(ReadFrom::parse(s))
}

#[derive(clap::Args)]
pub struct ReadArgs {
    #[command(flatten)]
    conn: Conn,
    /// Stream name (its path under the URL).
    stream: String,
    /// Start at -1 (the beginning), now, or an offset printed by an earlier command.
    #[arg(long, default_value = "-1", value_parser = parse_from, allow_hyphen_values = true)]
    from: ReadFrom,
    /// At the end, print the offset to resume from on stderr.
    #[arg(long)]
    print_offset: bool,
    /// Print each record's offset and a tab before it: each message of a JSON stream (where it
    /// starts; `--from` takes it where an append began), each line of a byte stream (a last line
    /// without newline gets one added).
    #[arg(long)]
    offsets: bool,
    /// When the read position was trimmed away: fail, or restart from the earliest offset.
    #[arg(long, value_enum, default_value = "fail")]
    on_trimmed: TrimmedMode,
}

/// Live transport for `tail`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum TailMode {
    Sse,
    LongPoll,
}

#[derive(clap::Args)]
pub struct TailArgs {
    #[command(flatten)]
    conn: Conn,
    /// Stream name (its path under the URL).
    stream: String,
    /// Start at -1 (the beginning), now (only new data), or an offset.
    #[arg(long, default_value = "now", value_parser = parse_from, allow_hyphen_values = true)]
    from: ReadFrom,
    /// How to wait for data.
    #[arg(long, value_enum, default_value = "sse")]
    mode: TailMode,
    /// At the end (EOF), print the final offset on stderr.
    #[arg(long)]
    print_offset: bool,
    /// Print each record's offset and a tab before it, as `read --offsets` does.
    #[arg(long)]
    offsets: bool,
    /// When the read position was trimmed away (the tail fell behind a trim or retention):
    /// fail, or restart from the earliest offset.
    #[arg(long, value_enum, default_value = "fail")]
    on_trimmed: TrimmedMode,
}

#[derive(clap::Args)]
pub struct CloseArgs {
    #[command(flatten)]
    conn: Conn,
    /// Stream name (its path under the URL).
    stream: String,
    /// A final message appended atomically with the close (sent through a producer, so a retry
    /// can never store it twice).
    #[arg(long)]
    data: Option<String>,
}

pub async fn create(a: CreateArgs) -> Result<(), CliError> {
    let s = a.conn.stream(&a.stream)?;
    let opts = CreateOptions {
        content_type: Some(if a.json { "application/json".into() } else { a.content_type }),
        ttl_seconds: a.ttl,
        expires_at: a.expires_at,
        closed: a.closed,
        retention_max_age_seconds: a.retention_max_age,
        retention_max_bytes: a.retention_max_bytes,
        state_compaction: matches!(a.compaction, Some(CompactionKind::State)),
        ..CreateOptions::default()
    };
    let created = s.create(opts).await?;
    if !created.created {
        eprintln!("oncelog: stream {} already exists with this configuration", a.stream);
    }
    println!("{}", created.next_offset);
    Ok(())
}

/// Reads stdin on a blocking thread: lines (each with its newline) or, for JSON streams,
/// whitespace-separated JSON values. Each value is checked by the parser but kept as the exact
/// text it was given ([`RawValue`]: key order, number spellings, escapes and whitespace inside
/// it); only the whitespace between values is dropped.
fn spawn_stdin_reader(json: bool) -> tokio::sync::mpsc::Receiver<Result<Bytes, CliError>> {
    let (tx, rx) = tokio::sync::mpsc::channel(1024);
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        let lock = stdin.lock();
        if json {
            for v in serde_json::Deserializer::from_reader(lock).into_iter::<Box<RawValue>>() {
                let item = v.map(|v| Bytes::from(String::from(Box::<str>::from(v)))).map_err(CliError::from);
                let stop = item.is_err();
                if tx.blocking_send(item).is_err() || stop {
                    return;
                }
            }
        } else {
            let mut lock = lock;
            loop {
                let mut line = Vec::new();
                match lock.read_until(b'\n', &mut line) {
                    Ok(0) => return,
                    Ok(_) => {
                        if tx.blocking_send(Ok(Bytes::from(line))).is_err() {
                            return;
                        }
                    }
                    Err(e) => {
                        let _ = tx.blocking_send(Err(e.into()));
                        return;
                    }
                }
            }
        }
    });
    rx
}

/// What makes `append` send stdin as one append: its conditions and key.
struct Once<'a> {
    if_match: Option<&'a str>,
    expected_offset: Option<&'a str>,
    key: Option<&'a str>,
}

/// `append --if-match` / `--expected-offset` / `--idempotency-key`: stdin as one append,
/// conditional and/or keyed.
async fn append_once(s: &oncelog_client::StreamHandle, once: Once<'_>, close: bool) -> Result<(), CliError> {
    let json = oncelog_protocol::content_type::is_json(&s.content_type().await?);
    let mut input = spawn_stdin_reader(json);
    let mut items = Vec::new();
    while let Some(item) = input.recv().await {
        items.push(item?);
    }
    if items.is_empty() {
        return Err(CliError::NoData);
    }
    let body = if json {
        let mut out = Vec::new();
        oncelog_protocol::json::write_array(items.iter().map(|b| &b[..]), &mut out);
        Bytes::from(out)
    } else {
        Bytes::from(items.concat())
    };
    let key = once.key.map(|k| {
        if k.is_empty() {
            let k = oncelog_client::new_idempotency_key();
            eprintln!("idempotency-key: {k}");
            k
        } else {
            k.to_owned()
        }
    });
    let opts = AppendOptions {
        if_match: once.if_match.map(StreamOffset::new),
        expected_offset: once.expected_offset.map(StreamOffset::new),
        idempotency_key: key,
        ..AppendOptions::default()
    };
    let appended = if close { s.append_and_close(body, opts).await? } else { s.append(body, opts).await? };
    println!("{}", appended.next_offset);
    Ok(())
}

pub async fn append(a: AppendArgs) -> Result<(), CliError> {
    let s = a.conn.stream(&a.stream)?;
    if a.if_match.is_some() || a.expected_offset.is_some() || a.idempotency_key.is_some() {
        let once = Once {
            if_match: a.if_match.as_deref(),
            expected_offset: a.expected_offset.as_deref(),
            key: a.idempotency_key.as_deref(),
        };
        return append_once(&s, once, a.close).await;
    }
    let content_type = s.content_type().await?;
    let id = a.producer_id.unwrap_or_else(|| {
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        format!("oncelog-cli-{}-{nanos}", std::process::id())
    });
    let mut b = s
        .producer(id)
        .content_type(content_type)
        .auto_claim(a.auto_claim)
        .linger(Duration::from_millis(a.linger_ms))
        .max_in_flight(a.max_in_flight)
        .max_batch_bytes(a.batch_bytes)
        .max_batch_items(a.batch_items);
    if let Some(e) = a.epoch {
        b = b.epoch(e);
    }
    if let Some(path) = a.epoch_file {
        b = b.epoch_store(FileEpochStore::new(path));
    }
    let producer = b.start().await?;
    tracing::info!(producer = producer.id(), epoch = producer.epoch(), "producing");
    let mut input = spawn_stdin_reader(producer.is_json());
    let mut last = None;
    let mut items = 0u64;
    while let Some(item) = input.recv().await {
        let item = item?;
        if item.is_empty() {
            continue;
        }
        last = Some(producer.append(item).await?);
        items += 1;
    }
    producer.flush().await?;
    let offset = if a.close {
        producer.close_stream(None).await?
    } else {
        producer.close().await?;
        match last {
            Some(receipt) => receipt.await?.next_offset,
            None => s.head().await?.next_offset,
        }
    };
    tracing::info!(items, stats = ?producer.stats(), "done");
    println!("{offset}");
    Ok(())
}

async fn print_stream(s: StreamHandle, opts: ReadOptions, print_offset: bool, offsets: bool) -> Result<(), CliError> {
    let mut chunks = s.read(opts);
    let stdout = std::io::stdout();
    let mut printer = Printer::new(offsets);
    while let Some(chunk) = chunks.next().await {
        printer.chunk(&mut stdout.lock(), &chunk?)?;
    }
    printer.finish(&mut stdout.lock())?;
    if print_offset {
        if let Some(o) = chunks.status().offset {
            eprintln!("{o}");
        }
    }
    Ok(())
}

pub async fn read(a: ReadArgs) -> Result<(), CliError> {
    let s = a.conn.stream(&a.stream)?;
    let opts = ReadOptions { on_trimmed: a.on_trimmed.into(), ..ReadOptions::new(a.from, LiveMode::CatchUp) };
    print_stream(s, opts, a.print_offset, a.offsets).await
}

pub async fn tail(a: TailArgs) -> Result<(), CliError> {
    // A tail must ride out server restarts: no attempt limit, backoff capped at 5 s.
    let forever = RetryPolicy::new(Duration::from_millis(100), Duration::from_secs(5), 2.0)?.with_max_attempts(None)?;
    let s = a.conn.client(Some(forever))?.stream(&a.stream);
    let live = match a.mode {
        TailMode::Sse => LiveMode::Sse,
        TailMode::LongPoll => LiveMode::LongPoll,
    };
    let opts = ReadOptions { on_trimmed: a.on_trimmed.into(), ..ReadOptions::new(a.from, live) };
    print_stream(s, opts, a.print_offset, a.offsets).await
}

pub async fn head(a: StreamArgs) -> Result<(), CliError> {
    let info = a.conn.stream(&a.stream)?.head().await?;
    println!("content-type: {}", info.content_type);
    println!("next-offset: {}", info.next_offset);
    println!("closed: {}", info.closed);
    if let Some(ttl) = info.ttl_seconds {
        println!("ttl: {ttl}");
    }
    if let Some(at) = info.expires_at {
        println!("expires-at: {at}");
    }
    if let Some(earliest) = info.earliest_offset {
        println!("earliest-offset: {earliest}");
    }
    if let Some(age) = info.retention_max_age_seconds {
        println!("retention-max-age: {age}");
    }
    if let Some(bytes) = info.retention_max_bytes {
        println!("retention-max-bytes: {bytes}");
    }
    if info.state_compaction {
        println!("compaction: state");
    }
    Ok(())
}

/// Prints the earliest offset after the compaction (where the snapshot starts).
pub async fn compact(a: StreamArgs) -> Result<(), CliError> {
    let t = a.conn.stream(&a.stream)?.compact().await?;
    println!("{}", t.earliest);
    Ok(())
}

/// Prints the earliest offset after the trim.
pub async fn trim(a: TrimArgs) -> Result<(), CliError> {
    let t = a.conn.stream(&a.stream)?.trim(&StreamOffset::new(a.to)).await?;
    println!("{}", t.earliest);
    Ok(())
}

pub async fn close(a: CloseArgs) -> Result<(), CliError> {
    let s = a.conn.stream(&a.stream)?;
    let offset = match a.data {
        None => s.close().await?,
        Some(data) => {
            let nanos =
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
            let producer = s.producer(format!("oncelog-close-{}-{nanos}", std::process::id())).start().await?;
            producer.close_stream(Some(Bytes::from(data))).await?
        }
    };
    println!("{offset}");
    Ok(())
}

pub async fn delete(a: DeleteArgs) -> Result<(), CliError> {
    let opts = oncelog_client::DeleteOptions { purge: a.purge, ..oncelog_client::DeleteOptions::default() };
    a.conn.stream(&a.stream)?.delete_with(opts).await?;
    Ok(())
}

/// `ls`: one path per line, or with `--long` `PATH<TAB>CONTENT-TYPE<TAB>NEXT-OFFSET<TAB>open|closed`,
/// in path order, following the listing's pages; written as each page arrives, so a long
/// listing starts at once and `| head` stops it early.
pub async fn ls(a: LsArgs) -> Result<(), CliError> {
    use std::io::Write as _;
    let client = a.conn.client(None)?;
    let mut streams = std::pin::pin!(client.list_streams(&a.prefix));
    let stdout = std::io::stdout();
    while let Some(l) = streams.next().await {
        let l = l?;
        let mut out = stdout.lock();
        if a.long {
            writeln!(
                out,
                "{}\t{}\t{}\t{}",
                l.path,
                l.content_type,
                l.next_offset,
                if l.closed { "closed" } else { "open" }
            )?;
        } else {
            writeln!(out, "{}", l.path)?;
        }
    }
    Ok(())
}
