//! What a request must be before any stream state is consulted: the shape limits, one set for
//! every engine, so one request gets one answer whichever engine holds the stream. Each engine
//! calls these first, inside its write path; the HTTP layer's header parser refuses over-long
//! values earlier with the same limits, but a request built by a program (the server used as a
//! library, a transactional commit's outputs, which carry producer ids in JSON) reaches the
//! engine unparsed.

use crate::engine::{AppendError, AppendRequest, CompactError, CreateError};

pub use oncelog_protocol::headers::{MAX_PATH_BYTES, MAX_PRODUCER_ID_BYTES};

/// Largest body of one append, one create's initial body or one compaction piece, in bytes.
/// The smaller of what the engines can hold as one unit: PostgreSQL's `bytea` value tops out at
/// 1 GiB with room needed for escaping on the wire, the log engine's frame at 1 GiB with the
/// group around it; 256 MiB is well inside both, and 16 times the server's default
/// `--max-append-bytes`.
pub const MAX_RECORD_BYTES: usize = 256 << 20;

/// Whether `name` can name a stream or a producer on every engine: not empty, at most `max`
/// bytes, and no NUL character (PostgreSQL's `text` cannot hold one; refused everywhere so that
/// no engine takes what another cannot).
fn name_ok(name: &str, max: usize) -> bool {
    !name.is_empty() && name.len() <= max && !name.contains('\0')
}

/// Whether `path` can name a stream. A path that cannot is never found: reads and appends to it
/// are `NotFound`, a create of it `InvalidPath`.
pub fn path_ok(path: &str) -> bool {
    name_ok(path, MAX_PATH_BYTES)
}

/// Whether `id` can name a producer.
pub fn producer_id_ok(id: &str) -> bool {
    name_ok(id, MAX_PRODUCER_ID_BYTES)
}

/// The shape of a create: a path that can name a stream, an initial body that fits one record.
pub fn create(path: &str, initial_len: usize) -> Result<(), CreateError> {
    if !path_ok(path) {
        return Err(CreateError::InvalidPath);
    }
    if initial_len > MAX_RECORD_BYTES {
        return Err(CreateError::TooLarge);
    }
    Ok(())
}

/// The shape of an append: a path that can name a stream (else no stream is found), a producer
/// id that can name a producer, a body that fits one record.
pub fn append(req: &AppendRequest) -> Result<(), AppendError> {
    if !path_ok(&req.path) {
        return Err(AppendError::NotFound);
    }
    if req.producer.as_ref().is_some_and(|p| !producer_id_ok(&p.id)) {
        return Err(AppendError::InvalidProducerId);
    }
    if req.data.len() > MAX_RECORD_BYTES {
        return Err(AppendError::TooLarge);
    }
    Ok(())
}

/// The shape of a compaction's snapshot: every piece fits one record.
pub fn compact(pieces: &[bytes::Bytes]) -> Result<(), CompactError> {
    if pieces.iter().any(|p| p.len() > MAX_RECORD_BYTES) {
        return Err(CompactError::TooLarge);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_refused_when_empty_too_long_or_holding_nul() {
        assert!(path_ok("a"));
        assert!(path_ok(&"p".repeat(MAX_PATH_BYTES)));
        assert!(!path_ok(""));
        assert!(!path_ok(&"p".repeat(MAX_PATH_BYTES + 1)));
        assert!(!path_ok("a\0b"));
        assert!(producer_id_ok(&"p".repeat(MAX_PRODUCER_ID_BYTES)));
        assert!(!producer_id_ok(&"p".repeat(MAX_PRODUCER_ID_BYTES + 1)));
        assert!(!producer_id_ok(""));
        assert!(!producer_id_ok("\0"));
    }
}
