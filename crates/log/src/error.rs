//! The log engine's own failures, and how they cross the storage seam.

use std::sync::Arc;

use oncelog_storage::StorageError;

/// The log engine's own failures (wrapped in [`StorageError`] at the seam).
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("cannot {what}: {source}")]
    Io { what: String, source: std::io::Error },
    #[error("the log is corrupt: {0}")]
    Corrupt(String),
    #[error(
        "this data directory was written by a pre-release engine (fjall, `keyspaces/`) that this \
         version no longer reads; start on an empty directory"
    )]
    FjallDirectory,
    #[error("another oncelog server is using this data directory")]
    Locked,
    #[error("a group commit does not fit a segment")]
    FrameTooLarge,
    #[error("the log has run out of segment numbers")]
    TooManySegments,
    #[error("log segment {0} is gone while a stream still reads it")]
    MissingSegment(u64),
    /// A transaction's append was refused while being staged after its check accepted it: a
    /// bug; the store stops writing rather than commit part of a transaction.
    #[error("a transaction's append was refused after its check accepted it: {0}")]
    TxnDiverged(String),
    /// A group's write or sync failed (a full disk, an I/O error): its outcome is unknown and
    /// the store takes no write until a restart recovers the log. Answered 503, as every later
    /// write is, never 500: nothing is wrong with the request, and a retry after the restart
    /// finds out what became of it.
    #[error("writes stopped after a storage failure: {0}")]
    WritesStopped(StorageError),
    /// The object store (`--object-store`) refused or failed an operation at start.
    #[error(transparent)]
    Bucket(#[from] oncelog_bucket::BucketError),
    /// The data directory has a log, and the bucket's state is not a prefix of it: another
    /// node wrote to the bucket after this directory's writer stopped.
    #[error(
        "the bucket's state is not this data directory's ({0}): another node has written to the bucket since; \
         start on an empty data directory to restore from the bucket"
    )]
    NotTheBucketsLog(String),
    /// A backup found segments the checkpoint needs missing, and still missing after the
    /// checkpoint stayed the same: not a race with the server, they are only in the bucket.
    #[error(
        "log segments {0:?} that the checkpoint needs are not in the data directory: with --object-store they \
         are in the bucket only (a restore leaves old segments there, --cache-max-bytes evicts them); the \
         bucket holds the log, or back up a node without a cache limit once it has fetched them back"
    )]
    SegmentsInTheBucket(Vec<u64>),
}

pub(crate) fn backend(e: LogError) -> StorageError {
    match e {
        LogError::Corrupt(_) => StorageError::Corrupt(Arc::new(e)),
        e => StorageError::Backend(Arc::new(e)),
    }
}

pub(crate) fn corrupt(why: String) -> StorageError {
    backend(LogError::Corrupt(why))
}
