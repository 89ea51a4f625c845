//! This engine's errors: why it could not open, and how a driver error becomes a
//! [`StorageError`] (the HTTP layer maps those to status codes, in one place).

use std::sync::Arc;

use oncelog_storage::StorageError;
use tokio_postgres::error::{DbError, SqlState};

/// Why [`crate::PgEngine::open`] failed.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("invalid PostgreSQL URL: {0}")]
    Url(#[source] tokio_postgres::Error),
    #[error("invalid schema name {0:?}: use lowercase letters, digits and _ (at most 63, not starting with a digit)")]
    Schema(String),
    #[error("invalid PostgreSQL URL: {0}")]
    ConnInfo(#[from] crate::conninfo::ConnInfoError),
    #[error(transparent)]
    TlsSetup(#[from] crate::tls::TlsSetupError),
    #[error("cannot connect to PostgreSQL over TLS: {0}")]
    Tls(String),
    #[error("cannot reach PostgreSQL within {secs} s: {cause}")]
    Unreachable { secs: u64, cause: String },
    /// The database answered, and what it said does not change by trying again: the database,
    /// the role or the password is wrong.
    #[error("PostgreSQL refused the connection: {0}")]
    Refused(String),
    #[error("the database has synchronous_commit={0}: an acknowledged append could be lost in a database crash or a failover; set it to on (or remote_apply), or accept the loss window with --pg-accept-commit-loss")]
    AsyncCommit(String),
    #[error("schema {schema:?} was migrated to version {found} by a newer oncelog; this binary knows up to {known}")]
    NewerSchema { schema: String, found: i32, known: i32 },
    #[error("applying migration {version}: {cause}")]
    Migration { version: i32, cause: tokio_postgres::Error },
    #[error(transparent)]
    Db(#[from] tokio_postgres::Error),
    #[error("connection pool: {0}")]
    Pool(#[from] deadpool_postgres::BuildError),
}

/// A value the stored state holds that this engine cannot read back (a corrupt or foreign row).
#[derive(Debug, thiserror::Error)]
pub enum RowError {
    #[error("stored value out of range in column {0}")]
    Range(&'static str),
    #[error("stored record: {0}")]
    Decode(#[from] oncelog_storage::codec::DecodeError),
}

impl From<RowError> for StorageError {
    fn from(e: RowError) -> Self {
        StorageError::Corrupt(Arc::new(e))
    }
}

/// Whether the database refused a session for a reason that stays until someone changes the
/// settings or the database: no such database (`3D000`), or invalid authorization (class `28`:
/// no such role, a wrong password, no `pg_hba.conf` entry). Retrying those would only hide the
/// cause behind "not reachable yet": the engine's start and the sink's both give up at once.
pub fn refuses_login(code: &SqlState) -> bool {
    *code == SqlState::INVALID_CATALOG_NAME || code.code().starts_with("28")
}

/// [`refuses_login`] for a failed connection attempt.
pub(crate) fn refused_for_good(e: &tokio_postgres::Error) -> bool {
    e.code().is_some_and(refuses_login)
}

/// Whether the database refused a transaction only because it ran into another one (a deadlock
/// or a serialisation failure): nothing was committed and running it again is safe.
pub(crate) fn retryable(e: &tokio_postgres::Error) -> bool {
    matches!(e.code(), Some(c) if *c == SqlState::T_R_DEADLOCK_DETECTED || *c == SqlState::T_R_SERIALIZATION_FAILURE)
        || busy(e)
}

/// A lock or statement timeout: the database is reachable but the work waited too long (rows
/// held by a transaction of a node that was cut off, until PostgreSQL ends it). Nothing was
/// committed; it is retried like a conflict, and never makes the node unready.
fn busy(e: &tokio_postgres::Error) -> bool {
    matches!(e.code(), Some(c) if *c == SqlState::LOCK_NOT_AVAILABLE || *c == SqlState::QUERY_CANCELED)
}

/// A driver error as the seam sees it: the database out of reach (a lost connection, a session
/// ended by the server — shut down, in recovery, idle in transaction too long —, too many
/// connections, a standby after a failover) is [`StorageError::Unavailable`] with
/// [`Unreachable`] (503, and the node unready until it reaches the database again); a lock or
/// statement timeout is `Unavailable` with [`Busy`] (503, the node stays ready); anything else
/// is a backend failure (500).
pub(crate) fn db(e: tokio_postgres::Error) -> StorageError {
    if busy(&e) {
        return StorageError::Unavailable(Arc::new(Busy(with_causes(&e))));
    }
    let io = std::error::Error::source(&e).is_some_and(|s| s.is::<std::io::Error>());
    let unavailable = e.is_closed()
        || io
        || e.code().is_some_and(|c| {
            let code = c.code();
            code.starts_with("08")
                || code.starts_with("57P")
                || code.starts_with("53")
                || code == "25006"
                || code == "25P03"
        });
    if unavailable {
        StorageError::Unavailable(Arc::new(Unreachable(with_causes(&e))))
    } else {
        StorageError::Backend(Arc::new(e))
    }
}

/// The pool could not hand out a connection.
pub(crate) fn pool(e: deadpool_postgres::PoolError) -> StorageError {
    StorageError::Unavailable(Arc::new(Unreachable(with_causes(&e))))
}

/// Shows a driver or pool error with what is under it: for an error the database reported,
/// its own words (`ERROR 22P05: unsupported Unicode escape sequence; detail: …`,
/// `FATAL 3D000: database "x" does not exist`) instead of the driver's "db error"; for any other,
/// each cause under it ("error connecting to server: Connection refused"), which the driver's
/// and the pool's own texts leave out. The engine's reasons (503s, start-up errors) and the
/// sink's say it alike.
pub struct Described<'a>(pub &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for Described<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut said: Vec<String> = Vec::new();
        let mut next = Some(self.0);
        while let Some(e) = next {
            if let Some(db) = e
                .downcast_ref::<tokio_postgres::Error>()
                .and_then(|p| p.as_db_error())
                .or_else(|| e.downcast_ref::<DbError>())
            {
                said.push(database_says(db));
                break;
            }
            // The pool's "Error occurred while creating a new object: …" adds nothing to the
            // driver's error under it.
            if let Some(deadpool_postgres::PoolError::Backend(inner)) = e.downcast_ref::<deadpool_postgres::PoolError>()
            {
                next = Some(inner);
                continue;
            }
            let text = e.to_string();
            if !said.iter().any(|s| s.contains(&text)) {
                said.push(text);
            }
            next = e.source();
        }
        f.write_str(&said.join(": "))
    }
}

/// The database's report on one line: severity, SQLSTATE, message, detail and hint (not its
/// context, which may quote the data).
fn database_says(db: &DbError) -> String {
    let mut text = format!("{} {}: {}", db.severity(), db.code().code(), db.message());
    for (label, part) in [("detail", db.detail()), ("hint", db.hint())] {
        if let Some(p) = part {
            text.push_str(&format!("; {label}: {p}"));
        }
    }
    text
}

/// [`Described`] as a string, for the reasons errors carry.
pub(crate) fn with_causes(e: &(dyn std::error::Error + 'static)) -> String {
    Described(e).to_string()
}

/// Why PostgreSQL cannot be used right now, as the 503's reason says it.
#[derive(Debug, thiserror::Error)]
#[error("PostgreSQL unreachable: {0}")]
pub struct Unreachable(pub String);

/// The database is reachable but the work waited too long for rows another transaction holds.
#[derive(Debug, thiserror::Error)]
#[error("PostgreSQL busy: {0}")]
pub struct Busy(pub String);

/// The request's work missed the node's deadline (`--pg-request-timeout-ms`): its outcome is
/// unknown, so it is answered 503 and may be retried (a producer's retry is recognised).
#[derive(Debug, thiserror::Error)]
#[error("PostgreSQL did not answer within {ms} ms")]
pub struct Stalled {
    pub ms: u64,
}

/// Why one attempt at a transaction failed for reasons other than the protocol's rules: the
/// caller retries a [`Fail::retryable`] one (nothing was committed) and answers the others
/// with their [`StorageError`].
#[derive(Debug)]
pub(crate) enum Fail {
    Db(tokio_postgres::Error),
    Other(StorageError),
}

impl Fail {
    pub fn retryable(&self) -> bool {
        matches!(self, Fail::Db(e) if retryable(e))
    }
}

impl From<tokio_postgres::Error> for Fail {
    fn from(e: tokio_postgres::Error) -> Self {
        Fail::Db(e)
    }
}

impl From<StorageError> for Fail {
    fn from(e: StorageError) -> Self {
        Fail::Other(e)
    }
}

impl From<RowError> for Fail {
    fn from(e: RowError) -> Self {
        Fail::Other(e.into())
    }
}

impl From<deadpool_postgres::PoolError> for Fail {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        Fail::Other(pool(e))
    }
}

impl From<Fail> for StorageError {
    fn from(f: Fail) -> Self {
        match f {
            Fail::Db(e) => db(e),
            Fail::Other(e) => e,
        }
    }
}

#[cfg(test)]
mod tests {
    #[derive(Debug, thiserror::Error)]
    #[error("error connecting to server")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn reasons_name_the_cause_under_the_drivers_words() {
        let e = Outer(std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "Connection refused (os error 111)"));
        assert_eq!(super::with_causes(&e), "error connecting to server: Connection refused (os error 111)");
    }
}
