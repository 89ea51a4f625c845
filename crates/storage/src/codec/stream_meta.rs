//! The stored form of [`StreamMeta`], a stream's metadata (the log engine's create records and
//! checkpoints).
//!
//! Layout, tag `0x02`: id u64, created_ms i64, content_type str, expiry kind u8 (0 never, 1 ttl,
//! 2 at) + value (u64 seconds or i64 ms; absent for 0), closed u8, stream_seq flag u8 + str,
//! fork flag u8 + (source id u64, fork point u64), soft_deleted u8, earliest u64. Tag `0x03`
//! adds, after `earliest`, the retention policy (max age flag u8 + u64 seconds, max bytes flag
//! u8 + u64) and the compaction flag u8; it is written only for streams that have a policy or
//! are made for compaction, so a store whose streams have neither stays readable by the version
//! before it. Tag `0x01` (before trims) is tag `0x02` without
//! `earliest`, which then is 0. All three are read.
//!
//! A fork records only its *direct* source and the position where it diverges; the whole chain
//! of ancestors is derived on recovery, and so are reference counts (the number of streams whose
//! `fork` names an id), so neither can drift from the records that define them.
//!
//! The tail is *not* stored: it is the end offset of the stream's last data key, so it can never
//! disagree with the data. Rewritten only when a field changes (create, close, `Stream-Seq`).

use crate::meta::{ForkOf, StreamMeta};
use oncelog_protocol::headers::Expiry;
use oncelog_protocol::Offset;

use super::{DecodeError, Decoder, Encoder};

const TAG_V1: u8 = 0x01;
const TAG_V2: u8 = 0x02;
const TAG_V3: u8 = 0x03;

/// Encodes `meta` as a tagged record.
pub fn encode(meta: &StreamMeta) -> Vec<u8> {
    let mut e = Encoder(Vec::with_capacity(64 + meta.config.content_type.len()));
    let tag = if meta.config.retention.is_none() && !meta.config.compaction { TAG_V2 } else { TAG_V3 };
    e.u8(tag).u64(meta.id).i64(meta.created_ms).str(&meta.config.content_type);
    match meta.config.expiry {
        Expiry::Never => e.u8(0),
        Expiry::Ttl(s) => e.u8(1).u64(s),
        Expiry::At(ms) => e.u8(2).i64(ms),
    };
    e.u8(u8::from(meta.closed));
    match &meta.stream_seq {
        None => e.u8(0),
        Some(s) => e.u8(1).str(s),
    };
    match meta.fork {
        None => e.u8(0),
        Some(f) => e.u8(1).u64(f.source_id).u64(f.fork_point),
    };
    e.u8(u8::from(meta.soft_deleted)).u64(meta.earliest.0);
    if tag == TAG_V3 {
        for limit in [meta.config.retention.max_age_s, meta.config.retention.max_bytes] {
            match limit {
                None => e.u8(0),
                Some(v) => e.u8(1).u64(v),
            };
        }
        e.u8(u8::from(meta.config.compaction));
    }
    e.0
}

/// Decodes a record written by [`encode`].
pub fn decode(bytes: &[u8]) -> Result<StreamMeta, DecodeError> {
    let mut d = Decoder(bytes);
    let tag = d.u8()?;
    if !matches!(tag, TAG_V1 | TAG_V2 | TAG_V3) {
        return Err(DecodeError::UnknownTag(tag));
    }
    let id = d.u64()?;
    let created_ms = d.i64()?;
    let content_type = d.string()?;
    let expiry = match d.u8()? {
        0 => Expiry::Never,
        1 => Expiry::Ttl(d.u64()?),
        2 => Expiry::At(d.i64()?),
        _ => return Err(DecodeError::InvalidValue),
    };
    let closed = d.bool()?;
    let stream_seq = if d.bool()? { Some(d.string()?) } else { None };
    let fork = if d.bool()? { Some(ForkOf { source_id: d.u64()?, fork_point: d.u64()? }) } else { None };
    let soft_deleted = d.bool()?;
    let earliest = Offset(if tag == TAG_V1 { 0 } else { d.u64()? });
    let mut retention = crate::retention::RetentionPolicy::NONE;
    let mut compaction = false;
    if tag == TAG_V3 {
        retention.max_age_s = if d.bool()? { Some(d.u64()?) } else { None };
        retention.max_bytes = if d.bool()? { Some(d.u64()?) } else { None };
        // Absent in the first records written with this tag (before compaction existed).
        compaction = if d.remaining() > 0 { d.bool()? } else { false };
    }
    d.finish()?;
    let config = crate::engine::StreamConfig { content_type, expiry, retention, compaction };
    Ok(StreamMeta {
        closed,
        stream_seq,
        fork,
        soft_deleted,
        earliest,
        ..StreamMeta::with_config(id, created_ms, config)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn expiry() -> impl Strategy<Value = Expiry> {
        prop_oneof![Just(Expiry::Never), any::<u64>().prop_map(Expiry::Ttl), any::<i64>().prop_map(Expiry::At)]
    }

    proptest! {
        #[test]
        fn round_trip(
            id: u64, created_ms: i64, content_type in "\\PC{0,40}", expiry in expiry(), closed: bool,
            stream_seq in proptest::option::of("\\PC{0,20}"),
            fork in proptest::option::of((any::<u64>(), any::<u64>())),
            soft_deleted: bool, earliest: u64,
            max_age_s in proptest::option::of(any::<u64>()), max_bytes in proptest::option::of(any::<u64>()),
            compaction: bool,
        ) {
            let fork = fork.map(|(source_id, fork_point)| ForkOf { source_id, fork_point });
            let retention = crate::retention::RetentionPolicy { max_age_s, max_bytes };
            let config = crate::engine::StreamConfig { content_type, expiry, retention, compaction };
            let m = StreamMeta { closed, stream_seq, fork, soft_deleted, earliest: Offset(earliest), ..StreamMeta::with_config(id, created_ms, config) };
            prop_assert_eq!(decode(&encode(&m)), Ok(m));
        }

        #[test]
        fn tag_3_records_without_the_compaction_flag_decode(max_age_s in proptest::option::of(any::<u64>())) {
            let retention = crate::retention::RetentionPolicy { max_age_s, max_bytes: Some(9) };
            let config = crate::engine::StreamConfig { content_type: "text/plain".into(), expiry: Expiry::Never, retention, compaction: false };
            let m = StreamMeta { earliest: Offset(2), ..StreamMeta::with_config(3, 1, config) };
            let mut bytes = encode(&m);
            prop_assert_eq!(bytes.pop(), Some(0));
            prop_assert_eq!(decode(&bytes), Ok(m));
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..96)) {
            let _ = decode(&bytes);
        }
    }
}
