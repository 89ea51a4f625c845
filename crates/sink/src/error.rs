//! The sink's errors: what a [`crate::Sink`] may answer ([`ApplyError`]) and why a worker
//! stopped or gave a claim back ([`SinkError`]), with the one distinction the worker acts on:
//! [`SinkError::is_fatal`] (stop and say why) or not (give the claim back, try again later).
//!
//! Every driver and pool error is shown through [`Described`] (the engine's, from
//! `oncelog-postgres`): the driver's own text for an
//! error the database reported is only "db error", so the database's words (severity, SQLSTATE,
//! message, detail, hint) are shown instead, and the causes under a connection error with it.

use std::fmt;

use oncelog_postgres::Described;
use oncelog_protocol::state::StateError;
use tokio_postgres::error::DbError;

/// Why a [`crate::Sink`] could not apply a batch. The batch's transaction is rolled back, so
/// nothing of it (and not its position) is in the target.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("target database: {}", Described(.0))]
    Db(#[from] tokio_postgres::Error),
    /// A message of a State Protocol stream that is not a State Protocol message (a stream made
    /// for compaction refuses such appends, so this means another writer or a bug).
    #[error("{stream} at offset {offset}: {source}")]
    NotState { stream: String, offset: u64, source: StateError },
    /// A message a custom sink cannot take (its own reason inside).
    #[error("{stream} at offset {offset}: {source}")]
    Message { stream: String, offset: u64, source: Box<dyn std::error::Error + Send + Sync> },
    /// Anything else a custom sink reports.
    #[error(transparent)]
    Other(Box<dyn std::error::Error + Send + Sync>),
}

impl ApplyError {
    /// Whether the target can never take this batch, however often it is tried: a data
    /// exception (SQLSTATE class 22: a value `jsonb` refuses, a number out of range), a message
    /// that is not a State Protocol message in a State Protocol stream, a message a custom sink
    /// refuses. Anything else (the database away, a conflict, a timeout) may pass on a retry.
    pub fn is_refusal(&self) -> bool {
        match self {
            ApplyError::NotState { .. } | ApplyError::Message { .. } => true,
            ApplyError::Db(e) => e.code().is_some_and(|c| c.code().starts_with("22")),
            ApplyError::Other(_) => false,
        }
    }
}

/// Why a worker stopped working on a claim.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// The target URL or its TLS settings are unusable (as the PostgreSQL engine judges them).
    #[error("target database: {}", Described(.0))]
    TargetUrl(#[from] oncelog_postgres::OpenError),
    #[error("invalid schema name {0:?}: use lowercase letters, digits and _ (at most 63, not starting with a digit)")]
    Schema(String),
    #[error("target database: {}", Described(.0))]
    Db(#[from] tokio_postgres::Error),
    #[error("target database connection: {}", Described(.0))]
    Pool(#[from] deadpool_postgres::PoolError),
    /// The Oncelog server or the network.
    #[error(transparent)]
    Client(#[from] oncelog_client::Error),
    #[error(transparent)]
    Apply(#[from] ApplyError),
    /// Another worker moved this stream's position after this one read it: the compare-and-set
    /// refused the batch (nothing was applied). Normal after a claim passed to another worker.
    #[error("{stream}: the position moved since it was read (another worker applied it or set the stream aside); nothing applied")]
    PositionMoved { stream: String },
    /// The history from the stored position on was trimmed and the stream is not a State
    /// Protocol stream: applying on would silently lose what was dropped.
    #[error(
        "{stream}: history from offset {position} was dropped (trimmed, the stream starts at {earliest} now); \
         the sink stops rather than skip {lost} bytes (--on-trimmed skip goes on and counts them)"
    )]
    Trimmed { stream: String, position: u64, earliest: u64, lost: u64 },
    /// A State Protocol stream whose history was dropped, but not by a compaction: what it starts
    /// with now is not a snapshot (a `reset`), so the rows cannot be rebuilt from it.
    #[error("{stream}: history from offset {position} was dropped and offset {earliest} does not start a snapshot (a reset): not a compaction; the sink stops")]
    NotASnapshot { stream: String, position: u64, earliest: u64 },
    /// The stream ends before the stored position: it was deleted and created again (or the
    /// target belongs to another server).
    #[error("{stream}: the stored position {position} is beyond the stream's tail {tail} (re-created stream, or another server's target?); the sink stops")]
    WentBack { stream: String, position: u64, tail: u64 },
    /// An offset token that is not Oncelog's, or a read whose messages do not add up to the
    /// offsets it reports.
    #[error("{stream}: {why}")]
    Offsets { stream: String, why: &'static str },
    /// The target refused the message at `offset` (for a byte stream: the read from `offset`)
    /// and would on every try ([`ApplyError::is_refusal`]); nothing of its batch was applied.
    /// What `--on-refused stop` stops with.
    #[error(
        "{stream}: the target refused the message at offset {offset}: {}; its batch was rolled back and the sink stops \
         (--on-refused skip-stream sets such a stream aside and goes on with the others)",
        Why(.source)
    )]
    Refused { stream: String, offset: u64, source: ApplyError },
    /// `--mode state` or `--mode messages` met a stream that is not JSON (with `--on-refused
    /// stop`; `skip-stream` sets it aside instead).
    #[error(
        "{stream}: --mode {mode} applies JSON streams only; this one is {content_type}; the sink stops \
         (--on-refused skip-stream sets such a stream aside and goes on with the others)"
    )]
    NotJson { stream: String, mode: &'static str, content_type: String },
}

impl SinkError {
    /// Whether retrying cannot help: the worker stops and the process exits with the reason.
    /// Everything else (the database or the server away, a lost claim, a moved position) gives
    /// the claim back and tries again.
    pub fn is_fatal(&self) -> bool {
        match self {
            SinkError::TargetUrl(_)
            | SinkError::Schema(_)
            | SinkError::Trimmed { .. }
            | SinkError::NotASnapshot { .. }
            | SinkError::WentBack { .. }
            | SinkError::Offsets { .. }
            | SinkError::Refused { .. }
            | SinkError::NotJson { .. } => true,
            // Comes back the same on every attempt: the batch can never apply.
            SinkError::Apply(a) if a.is_refusal() => true,
            // Credentials the server refuses do not get better by waiting.
            SinkError::Client(e) => !e.is_fenced() && matches!(e.status(), Some(401 | 403)),
            // Nor does a target that refuses the sink's login: a missing database, a missing
            // role, a wrong password, no pg_hba.conf entry. A database that is away, starting
            // up or out of connections is waited for.
            _ => self.database_says().is_some_and(|db| oncelog_postgres::refuses_login(db.code())),
        }
    }

    /// The database's own report under this error, if it made one.
    pub fn database_says(&self) -> Option<&DbError> {
        match self {
            SinkError::Db(e)
            | SinkError::Apply(ApplyError::Db(e))
            | SinkError::Pool(deadpool_postgres::PoolError::Backend(e)) => e.as_db_error(),
            _ => None,
        }
    }

    /// Whether this worker lost its claim (its lease passed to another worker).
    pub fn is_fenced(&self) -> bool {
        matches!(self, SinkError::Client(e) if e.is_fenced())
    }

    /// The sink's refusal inside ([`ApplyError::is_refusal`]), or the error as it was.
    pub(crate) fn into_refusal(self) -> Result<ApplyError, SinkError> {
        match self {
            SinkError::Apply(a) if a.is_refusal() => Ok(a),
            e => Err(e),
        }
    }
}

/// Why the target refused a message, without the stream and offset that name it elsewhere:
/// what [`SinkError::Refused`] shows and the positions table keeps for a set-aside stream.
pub(crate) struct Why<'a>(pub &'a ApplyError);

impl fmt::Display for Why<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            ApplyError::Db(e) => Described(e).fmt(f),
            ApplyError::NotState { source, .. } => source.fmt(f),
            ApplyError::Message { source, .. } => source.fmt(f),
            ApplyError::Other(e) => e.fmt(f),
        }
    }
}
