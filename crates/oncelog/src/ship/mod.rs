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

mod follow;
mod state;

use std::fs::File;
use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use oncelog_client::{AppendOptions, RetryPolicy, StreamHandle};

use crate::conn::{Conn, ConnError};
use follow::{Follower, Limits, Step};
use state::State;

#[derive(clap::Args)]
pub struct ShipArgs {
    #[command(flatten)]
    conn: Conn,
    /// The file to follow (it may not exist yet).
    file: PathBuf,
    /// Stream name (its path under the URL); a byte stream, not `application/json`.
    stream: String,
    /// Where the shipper keeps its position and its unacknowledged batch (with a lock file
    /// beside it, PATH.lock). Default: FILE.oncelog-ship. Keep it: a new state file ships FILE
    /// from its start again.
    #[arg(long, value_name = "PATH")]
    state_file: Option<PathBuf>,
    /// How often to look at FILE when there is nothing new, in milliseconds.
    #[arg(long, default_value_t = 200)]
    poll_ms: u64,
    /// Largest batch (one append) in bytes; a longer line travels alone.
    #[arg(long, default_value_t = 1 << 20)]
    batch_bytes: usize,
    /// Longest line, newline included; a longer one stops the shipper (raise the server's
    /// --max-append-bytes too).
    #[arg(long, default_value_t = 16 << 20)]
    max_line_bytes: usize,
}

/// Why `oncelog ship` stopped.
#[derive(Debug, thiserror::Error)]
pub enum ShipError {
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("state file {}: {why}", path.display())]
    BadState { path: PathBuf, why: &'static str },
    #[error("state file {} is in use by another `oncelog ship`", path.display())]
    Locked { path: PathBuf },
    #[error("state file {} belongs to stream {stream}: give this shipper a --state-file of its own", path.display())]
    OtherStream { path: PathBuf, stream: String },
    #[error("{}: a line is longer than {max} bytes (--max-line-bytes)", path.display())]
    LineTooLong { path: PathBuf, max: usize },
    #[error("stream {0} is a JSON stream; `ship` appends lines of bytes (create the stream with a text content type)")]
    JsonStream(String),
    #[error(transparent)]
    Conn(#[from] ConnError),
    #[error(transparent)]
    Client(#[from] oncelog_client::Error),
}

pub async fn ship(a: ShipArgs) -> Result<(), ShipError> {
    let state_path = a.state_file.clone().unwrap_or_else(|| state::sibling(&a.file, ".oncelog-ship"));
    let _lock = lock(&state_path)?;
    let mut st = State::load(&state_path, &a.stream)?;

    // A shipper outlives server restarts: no attempt limit, backoff capped at 5 s.
    let forever = RetryPolicy::new(Duration::from_millis(100), Duration::from_secs(5), 2.0)?.with_max_attempts(None)?;
    let stream = a.conn.client(Some(forever))?.stream(&a.stream);
    let content_type = stream.content_type().await?;
    if oncelog_protocol::content_type::is_json(&content_type) {
        return Err(ShipError::JsonStream(a.stream));
    }
    let send_batch = |st: &State, bytes: Vec<u8>| {
        let opts = AppendOptions {
            content_type: Some(content_type.clone()),
            idempotency_key: Some(st.key()),
            ..AppendOptions::default()
        };
        send(&stream, Bytes::from(bytes), opts)
    };

    // What a killed predecessor may have sent: again, with the same key and bytes.
    if let Some(bytes) = st.pending.take() {
        send_batch(&st, bytes).await?;
        st.batch += 1;
        st.save(&state_path)?;
    }
    let limits =
        Limits { batch_bytes: a.batch_bytes.max(1), max_line_bytes: a.max_line_bytes.max(a.batch_bytes).max(1) };
    let mut follower = Follower::resume(a.file, st.cursor.clone())?;
    let poll = Duration::from_millis(a.poll_ms.max(1));
    // The follower's reads and the state file's fsync run on this task, not `spawn_blocking`:
    // it is the process's only task and `block_on` drives it on the main thread, while the HTTP
    // connection's tasks run on the runtime's workers; and each step waits for the last anyway
    // (a batch is saved, then sent, then saved again).
    loop {
        match follower.step(limits)? {
            Step::Lines(bytes) => {
                // Recorded before it is sent: a restart sends exactly these bytes under this key.
                st.cursor = follower.cursor().clone();
                st.pending = Some(bytes.clone());
                st.save(&state_path)?;
                send_batch(&st, bytes).await?;
                st.pending = None;
                st.batch += 1;
                // Also recorded when the file goes quiet: a pending batch left in the state
                // could be resent after the idempotency window, as new data.
                st.save(&state_path)?;
            }
            Step::Moved => {
                st.cursor = follower.cursor().clone();
                st.save(&state_path)?;
            }
            Step::Idle => tokio::time::sleep(poll).await,
        }
    }
}

/// One batch, retried by the client until the server answers (a repeat of a batch that landed
/// is answered from the first attempt).
async fn send(stream: &StreamHandle, bytes: Bytes, opts: AppendOptions) -> Result<(), ShipError> {
    let appended = stream.append(bytes, opts).await?;
    tracing::debug!(next_offset = %appended.next_offset, "batch stored");
    Ok(())
}

/// Holds `PATH.lock` for the life of the process: two shippers on one state file would send
/// different batches under the same keys.
fn lock(state_path: &std::path::Path) -> Result<File, ShipError> {
    let path = state::sibling(state_path, ".lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|source| ShipError::Io { path: path.clone(), source })?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(ShipError::Locked { path: state_path.to_owned() }),
        Err(std::fs::TryLockError::Error(source)) => Err(ShipError::Io { path, source }),
    }
}
