//! `oncelog ship FILE STREAM`: follows a log file like `tail -F` (rotation by rename and by
//! truncation) and appends each line, newline included, to a byte stream exactly once, across
//! restarts, SIGKILL and rotation.
//!
//! How: lines are sent in batches, one at a time, each with the `Idempotency-Key`
//! `ship-{instance}-{n}`. Before batch `n` is sent, the state file ([`state`]) records it (its
//! bytes) together with the position in the file after it, and is synced; once the server
//! acknowledges it, the state says so. A shipper killed at any moment restarts from the state
//! file: the batch it may have sent is sent again with the same key and bytes, and the server
//! answers it from the first attempt if that landed (`204`), or stores it now; then reading
//! goes on after it. So nothing is doubled and nothing skipped, in order, as long as the restart
//! comes within the server's `--idempotency-window` (24 h by default) of the unanswered send:
//! a restart later than that sends the pending batch as new data if it had landed.
//!
//! Following the file is [`follow`]'s part. Limits: the state file is the shipper's memory (a
//! new one ships FILE from its start again, under new keys); one shipper per state file (a lock
//! file beside it); across a stop, one rotation by rename is recovered (the old file is found in
//! FILE's directory by its identity), not two; with `copytruncate`, lines written to FILE after
//! the copy and before the truncation, and lines the shipper had not read when the truncation
//! happened, are not shipped (they are in the copy) — the race logrotate documents for that mode.
//!
//! It talks (at info: a start line, then a progress line at most every `--progress-interval-ms`)
//! and ends cleanly: on SIGTERM or Ctrl-C it lets the append in flight finish (for up to
//! [`STOP_GRACE`]; one still unanswered then is in the state file and is sent again at the next
//! start), saves its state, removes its lock file and exits 0. A start that fails leaves no lock
//! file either.

mod follow;
mod state;

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bytes::Bytes;
use oncelog_client::{AppendOptions, RetryPolicy, StreamHandle};

use crate::conn::{Conn, ConnError};
use follow::{Follower, Limits, Step};
use state::{FileId, Pending, State};

/// On SIGTERM, how long the append in flight may take to be answered before the shipper exits
/// without its answer (the batch is in the state file and is sent again at the next start).
pub const STOP_GRACE: Duration = Duration::from_secs(5);

#[derive(clap::Args)]
pub struct ShipArgs {
    #[command(flatten)]
    conn: Conn,
    /// The file to follow (it may not exist yet). A symbolic link to a regular file is followed;
    /// a FIFO, device or directory is refused.
    file: PathBuf,
    /// Stream name (its path under the URL); a byte stream, not `application/json`.
    stream: String,
    /// Where the shipper keeps its position and its unacknowledged batch (with a lock file
    /// beside it, PATH.lock, while it runs). Default: FILE.oncelog-ship. Keep it: a new state
    /// file ships FILE from its start again. Never followed through a symbolic link.
    #[arg(long, value_name = "PATH")]
    state_file: Option<PathBuf>,
    /// How often to look at FILE when there is nothing new, in milliseconds.
    #[arg(long, default_value_t = 200)]
    poll_ms: u64,
    /// Largest batch (one append) in bytes; a longer line travels alone.
    #[arg(long, default_value_t = 1 << 20)]
    batch_bytes: usize,
    /// Longest line, newline included, and so the largest append the shipper sends: at most the
    /// server's --max-append-bytes. A longer line is what --on-long-line says.
    #[arg(long, default_value_t = 16 << 20)]
    max_line_bytes: usize,
    /// A line longer than --max-line-bytes: `stop` (exit 1, naming its offset and length),
    /// `split` (ship it in pieces of --max-line-bytes, each exactly once) or `skip` (ship the
    /// lines around it; a warning names its offset and length).
    #[arg(long, env = "ONCELOG_SHIP_ON_LONG_LINE", value_enum, default_value = "stop")]
    on_long_line: OnLongLine,
    /// Most often a progress line (lines and bytes shipped, lag) is logged, in milliseconds;
    /// one is logged only when something was shipped since the last.
    #[arg(long, env = "ONCELOG_SHIP_PROGRESS_INTERVAL_MS", default_value_t = 10_000)]
    progress_interval_ms: u64,
    #[command(flatten)]
    pub log: crate::logging::LogArgs,
}

/// What the shipper does with a line longer than `--max-line-bytes`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum OnLongLine {
    /// Exit with an error naming the line's offset and length (nothing after it is shipped).
    Stop,
    /// Ship it in pieces of `--max-line-bytes` (its bytes arrive whole and in order).
    Split,
    /// Leave it out, with a warning, and ship on after it.
    Skip,
}

/// Why `oncelog ship` stopped.
#[derive(Debug, thiserror::Error)]
pub enum ShipError {
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{} is {what}, not a regular file: refused ({why})", path.display())]
    NotRegular { path: PathBuf, what: &'static str, why: &'static str },
    #[error("state file {}: {why}", path.display())]
    BadState { path: PathBuf, why: &'static str },
    #[error("state file {} is {len} bytes, more than a state file of this shipper holds ({max}: its header and one batch of at most --max-line-bytes): refused, not read", path.display())]
    StateTooLarge { path: PathBuf, len: u64, max: u64 },
    #[error("state file {} is in use by another `oncelog ship`", path.display())]
    Locked { path: PathBuf },
    #[error("state file {} belongs to stream {stream}: give this shipper a --state-file of its own", path.display())]
    OtherStream { path: PathBuf, stream: String },
    #[error(
        "{}: the line at byte {offset} {}, more than --max-line-bytes ({max}); nothing from it on was shipped. Raise --max-line-bytes (and the server's --max-append-bytes), or start again with --on-long-line split or skip",
        path.display(),
        match len { Some(len) => format!("is {len} bytes long (newline included)"), None => format!("has {seen} bytes and no newline yet") }
    )]
    LineTooLong { path: PathBuf, offset: u64, len: Option<u64>, seen: u64, max: usize },
    #[error(
        "the server refused a batch of {bytes} bytes as too large (413: {message}): set --max-line-bytes ({max_line_bytes} now) and --batch-bytes to at most the server's --max-append-bytes and start again; {}",
        if *rewound { "its lines are read again then" } else { "the state file was written by an older shipper and cannot go back to where the batch began" }
    )]
    RefusedTooLarge { bytes: usize, message: String, max_line_bytes: usize, rewound: bool },
    #[error("stream {0} is a JSON stream; `ship` appends lines of bytes (create the stream with a text content type)")]
    JsonStream(String),
    #[error("cannot watch for SIGTERM: {0}")]
    Signal(std::io::Error),
    #[error(transparent)]
    Conn(#[from] ConnError),
    #[error(transparent)]
    Client(#[from] oncelog_client::Error),
}

pub async fn ship(a: ShipArgs) -> Result<(), ShipError> {
    // First: a SIGTERM from the moment the shipper runs ends it cleanly.
    let mut stop = stop_signal()?;
    let state_path = a.state_file.clone().unwrap_or_else(|| state::sibling(&a.file, ".oncelog-ship"));
    // Removed when `ship` returns, however it returns.
    let _lock = Lock::take(&state_path)?;
    let limits = Limits {
        batch_bytes: a.batch_bytes.max(1),
        max_line_bytes: a.max_line_bytes.max(a.batch_bytes).max(1),
        on_long_line: a.on_long_line,
    };
    // The largest batch: a line of the limit, or a rotated file's last line of the limit with
    // the newline that was added.
    let mut st = State::load(&state_path, &a.stream, limits.max_line_bytes + 1)?;

    // A shipper outlives server restarts: no attempt limit, backoff capped at 5 s.
    let forever = RetryPolicy::new(Duration::from_millis(100), Duration::from_secs(5), 2.0)?.with_max_attempts(None)?;
    let stream = a.conn.client(Some(forever))?.stream(&a.stream);
    let content_type = stream.content_type().await?;
    if oncelog_protocol::content_type::is_json(&content_type) {
        return Err(ShipError::JsonStream(a.stream));
    }
    tracing::info!(
        file = %a.file.display(),
        stream = %a.stream,
        state_file = %state_path.display(),
        position = st.cursor.position,
        batch = st.batch,
        pending_bytes = st.pending.as_ref().map_or(0, |p| p.bytes.len()),
        "ship started"
    );
    let append_options = |st: &State| AppendOptions {
        content_type: Some(content_type.clone()),
        idempotency_key: Some(st.key()),
        ..AppendOptions::default()
    };
    let mut progress = Progress::new(Duration::from_millis(a.progress_interval_ms.max(1)));

    // What a killed predecessor may have sent: again, with the same key and bytes.
    if let Some(pending) = st.pending.clone() {
        let sent = send(&stream, Bytes::from(pending.bytes.clone()), append_options(&st), &mut stop).await;
        if !sent_or_refused(&mut st, &state_path, pending, sent, &limits, &mut progress)? {
            return stopped(&st, &progress);
        }
    }
    let mut follower = Follower::resume(a.file, st.cursor.clone())?;
    let poll = Duration::from_millis(a.poll_ms.max(1));
    // The follower's reads and the state file's fsync run on this task, not `spawn_blocking`:
    // it is the process's only task and `block_on` drives it on the main thread, while the HTTP
    // connection's tasks run on the runtime's workers; and each step waits for the last anyway
    // (a batch is saved, then sent, then saved again).
    loop {
        if *stop.borrow() {
            return stopped(&st, &progress);
        }
        let from = follower.cursor().position;
        match follower.step(limits)? {
            Step::Lines(bytes) => {
                // Recorded before it is sent: a restart sends exactly these bytes under this key.
                st.cursor = follower.cursor().clone();
                let pending = Pending { bytes, from: Some(from) };
                st.pending = Some(pending.clone());
                st.save(&state_path)?;
                let sent = send(&stream, Bytes::from(pending.bytes.clone()), append_options(&st), &mut stop).await;
                if !sent_or_refused(&mut st, &state_path, pending, sent, &limits, &mut progress)? {
                    return stopped(&st, &progress);
                }
                progress.report(|| follower.lag());
            }
            Step::Moved => {
                st.cursor = follower.cursor().clone();
                st.save(&state_path)?;
            }
            Step::Skipped { offset, len } => {
                tracing::warn!(
                    file = %follower.path().display(),
                    offset,
                    length = len,
                    max_line_bytes = limits.max_line_bytes,
                    "skipped a line longer than --max-line-bytes (--on-long-line skip)"
                );
                // Recorded: a restart does not read it again.
                st.cursor = follower.cursor().clone();
                st.save(&state_path)?;
            }
            Step::Idle => {
                tokio::select! {
                    () = tokio::time::sleep(poll) => {}
                    _ = stop.wait_for(|&stopping| stopping) => {}
                }
            }
        }
    }
}

/// Records the answer to batch `st.batch` (`pending`): stored (or answered from an earlier
/// attempt), or refused as too large. `false` when the shipper was stopped before the answer came
/// (the batch stays pending in the state file).
fn sent_or_refused(
    st: &mut State,
    state_path: &Path,
    pending: Pending,
    sent: Result<bool, oncelog_client::Error>,
    limits: &Limits,
    progress: &mut Progress,
) -> Result<bool, ShipError> {
    match sent {
        Ok(true) => {
            st.pending = None;
            st.batch += 1;
            // Also recorded when the file goes quiet: a pending batch left in the state could be
            // resent after the idempotency window, as new data.
            st.save(state_path)?;
            progress.shipped(&pending.bytes);
            Ok(true)
        }
        Ok(false) => Ok(false),
        Err(oncelog_client::Error::PayloadTooLarge { message }) => {
            // Nothing was stored: rather than send it again at every start, go back to where the
            // batch began (under a new batch number: its key is never used for other bytes), so
            // the next start reads its lines again under the limits it is given then.
            let rewound = match pending.from {
                Some(from) => {
                    st.cursor.position = from;
                    st.cursor.head.truncate(usize::try_from(from).unwrap_or(usize::MAX));
                    st.pending = None;
                    st.batch += 1;
                    st.save(state_path)?;
                    true
                }
                None => false,
            };
            Err(ShipError::RefusedTooLarge {
                bytes: pending.bytes.len(),
                message,
                max_line_bytes: limits.max_line_bytes,
                rewound,
            })
        }
        Err(e) => Err(e.into()),
    }
}

/// The end after SIGTERM: the state is saved (every change is saved when it is made).
fn stopped(st: &State, progress: &Progress) -> Result<(), ShipError> {
    tracing::info!(
        lines = progress.lines,
        bytes = progress.bytes,
        position = st.cursor.position,
        pending_bytes = st.pending.as_ref().map_or(0, |p| p.bytes.len()),
        "ship stopped (SIGTERM)"
    );
    Ok(())
}

/// One batch, retried by the client until the server answers (a repeat of a batch that landed
/// is answered from the first attempt). On SIGTERM it is given [`STOP_GRACE`] to be answered;
/// `Ok(false)`: it was not, and the shipper stops without its answer.
async fn send(
    stream: &StreamHandle,
    bytes: Bytes,
    opts: AppendOptions,
    stop: &mut tokio::sync::watch::Receiver<bool>,
) -> Result<bool, oncelog_client::Error> {
    let append = stream.append(bytes, opts);
    tokio::pin!(append);
    let appended = tokio::select! {
        r = &mut append => r?,
        _ = stop.wait_for(|&stopping| stopping) => match tokio::time::timeout(STOP_GRACE, &mut append).await {
            Ok(r) => r?,
            Err(_) => {
                tracing::warn!("stopping with a batch unanswered: it is sent again, under the same key, at the next start");
                return Ok(false);
            }
        },
    };
    tracing::debug!(next_offset = %appended.next_offset, "batch stored");
    Ok(true)
}

/// Changes once SIGTERM or SIGINT arrives. The handlers are installed when this is called.
fn stop_signal() -> Result<tokio::sync::watch::Receiver<bool>, ShipError> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).map_err(ShipError::Signal)?;
    let mut int = signal(SignalKind::interrupt()).map_err(ShipError::Signal)?;
    let (tx, rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        tracing::info!("stopping: the append in flight, if any, is finished first");
        // Kept alive until the process ends: waiting on a dropped sender fails at once.
        let _ = tx.send(true);
        std::future::pending::<()>().await;
    });
    Ok(rx)
}

/// What was shipped since the start, and when it was last logged.
struct Progress {
    every: Duration,
    lines: u64,
    bytes: u64,
    logged_at: Instant,
    logged_bytes: u64,
}

impl Progress {
    fn new(every: Duration) -> Progress {
        Progress { every, lines: 0, bytes: 0, logged_at: Instant::now(), logged_bytes: 0 }
    }

    fn shipped(&mut self, batch: &[u8]) {
        self.lines += batch.iter().filter(|&&b| b == b'\n').count() as u64;
        self.bytes += batch.len() as u64;
    }

    /// A progress line, when the interval has passed and something was shipped since the last.
    fn report(&mut self, lag: impl FnOnce() -> u64) {
        if self.bytes == self.logged_bytes || self.logged_at.elapsed() < self.every {
            return;
        }
        tracing::info!(lines = self.lines, bytes = self.bytes, lag_bytes = lag(), "shipped");
        self.logged_at = Instant::now();
        self.logged_bytes = self.bytes;
    }
}

/// `PATH.lock`, locked for the life of the process and removed when the shipper ends (also after
/// a failed start): two shippers on one state file would send different batches under the same
/// keys.
struct Lock {
    path: PathBuf,
    _file: File,
}

impl Lock {
    fn take(state_path: &Path) -> Result<Lock, ShipError> {
        let path = state::sibling(state_path, ".lock");
        // A shipper that ends removes the file it held; one that opened that file just before
        // could then lock a file no longer at PATH.lock while a third locks a new one. So the
        // lock counts only if PATH.lock is still the file locked; else it is tried again.
        for _ in 0..3 {
            let file =
                state::open_regular(&path, OpenOptions::new().create(true).truncate(false).write(true).mode(0o600))?
                    .ok_or_else(|| ShipError::Io { path: path.clone(), source: std::io::ErrorKind::NotFound.into() })?;
            match file.try_lock() {
                Ok(()) => {}
                Err(std::fs::TryLockError::WouldBlock) => {
                    return Err(ShipError::Locked { path: state_path.to_owned() })
                }
                Err(std::fs::TryLockError::Error(source)) => return Err(ShipError::Io { path, source }),
            }
            let held = file
                .metadata()
                .map(|m| FileId::of(&m))
                .map_err(|source| ShipError::Io { path: path.clone(), source })?;
            if std::fs::symlink_metadata(&path).is_ok_and(|m| FileId::of(&m) == held) {
                return Ok(Lock { path, _file: file });
            }
        }
        Err(ShipError::Locked { path: state_path.to_owned() })
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        // Removed while still locked (the file closes after this), so no other shipper holds it.
        if let Err(e) = std::fs::remove_file(&self.path) {
            tracing::warn!(path = %self.path.display(), error = %e, "cannot remove the lock file");
        }
    }
}
