//! A `streams` row as the shared rules see it ([`StreamMeta`], tail, last access, time marks),
//! and the few encodings this engine keeps in columns.
//!
//! Offsets, ids and times are stored as `bigint`: offsets never exceed `Offset::MAX` (< 2^63)
//! and ids come from a sequence, so the casts are exact; a stored value out of range is a
//! corrupt row, never a panic.

use oncelog_protocol::headers::Expiry;
use oncelog_protocol::Offset;
use oncelog_storage::retention::{TimeMark, TimeMarks};
use oncelog_storage::{RetentionPolicy, StreamMeta};
use tokio_postgres::Row;

use crate::error::RowError;

/// The `streams` columns every query that builds a [`Stream`] selects, in this order.
pub(crate) const COLS: &str = "id, path, created_ms, content_type, expiry_kind, expiry_value, closed, stream_seq, \
     soft_deleted, source_id, fork_point, earliest, tail, ret_max_age_s, ret_max_bytes, compaction, last_access_ms, marks";

/// One stream as stored.
#[derive(Debug, Clone)]
pub(crate) struct Stream {
    /// `None`: detached from its path by a purge (kept, soft-deleted, for its forks).
    pub path: Option<String>,
    pub meta: StreamMeta,
    pub tail: Offset,
    /// As stored; reads of this node not yet flushed are in [`crate::watch::Touches`].
    pub last_access_ms: i64,
    pub marks: TimeMarks,
}

pub(crate) fn u64_of(v: i64, col: &'static str) -> Result<u64, RowError> {
    u64::try_from(v).map_err(|_| RowError::Range(col))
}

/// An id or offset as a `bigint` (both stay below 2^63, see the module note).
pub(crate) fn i64_of(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl Stream {
    pub fn from_row(r: &Row) -> Result<Stream, RowError> {
        let expiry = match (r.get::<_, i16>(4), r.get::<_, i64>(5)) {
            (0, _) => Expiry::Never,
            (1, secs) => Expiry::Ttl(u64_of(secs, "expiry_value")?),
            (2, at) => Expiry::At(at),
            _ => return Err(RowError::Range("expiry_kind")),
        };
        let fork = match (r.get::<_, Option<i64>>(9), r.get::<_, Option<i64>>(10)) {
            (Some(s), Some(p)) => Some(oncelog_storage::ForkOf {
                source_id: u64_of(s, "source_id")?,
                fork_point: u64_of(p, "fork_point")?,
            }),
            _ => None,
        };
        let opt = |v: Option<i64>, col| v.map(|v| u64_of(v, col)).transpose();
        let config = oncelog_storage::StreamConfig {
            content_type: r.get(3),
            expiry,
            retention: RetentionPolicy {
                max_age_s: opt(r.get(13), "ret_max_age_s")?,
                max_bytes: opt(r.get(14), "ret_max_bytes")?,
            },
            compaction: r.get(15),
        };
        let meta = StreamMeta {
            closed: r.get(6),
            stream_seq: r.get(7),
            fork,
            soft_deleted: r.get(8),
            earliest: Offset(u64_of(r.get(11), "earliest")?),
            ..StreamMeta::with_config(u64_of(r.get(0), "id")?, r.get(2), config)
        };
        let marks = match r.get::<_, Option<&[u8]>>(17) {
            Some(b) => decode_marks(b)?,
            None => TimeMarks::new(),
        };
        Ok(Stream { path: r.get(1), meta, tail: Offset(u64_of(r.get(12), "tail")?), last_access_ms: r.get(16), marks })
    }
}

/// `(expiry_kind, expiry_value)` of an expiry.
pub(crate) fn expiry_columns(e: Expiry) -> (i16, i64) {
    match e {
        Expiry::Never => (0, 0),
        Expiry::Ttl(secs) => (1, i64_of(secs)),
        Expiry::At(at) => (2, at),
    }
}

/// Time marks as a column ([`oncelog_storage::codec::marks`]); `None` for an empty list
/// (streams without a maximum age keep none).
pub(crate) fn encode_marks(marks: &[TimeMark]) -> Option<Vec<u8>> {
    (!marks.is_empty()).then(|| oncelog_storage::codec::marks::encode(marks))
}

pub(crate) fn decode_marks(b: &[u8]) -> Result<TimeMarks, RowError> {
    oncelog_storage::codec::marks::decode(b).map_err(RowError::from)
}

/// Whether PostgreSQL can store `s` as `text` (it refuses NUL characters).
pub(crate) fn text_ok(s: &str) -> bool {
    !s.contains('\0')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_round_trip() {
        let marks =
            vec![TimeMark { end: Offset(10), at_ms: -5 }, TimeMark { end: Offset(Offset::MAX.0), at_ms: i64::MAX }];
        let bytes = encode_marks(&marks).expect("non-empty");
        assert_eq!(decode_marks(&bytes).expect("decode"), marks);
        assert!(encode_marks(&[]).is_none());
        assert!(decode_marks(&bytes[..16]).is_err());
    }
}
