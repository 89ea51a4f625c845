//! Stored forms of subscriptions ([`crate::SubRecord`]) and their cursors
//! ([`crate::Cursor`]), kept in the engine metadata map under `sub/{id}` and
//! `cur/{uid:016x}/{path}` (or, for a path too long for that key, `curl/{uid:016x}/{sha-256 of
//! the path, hex}`).
//!
//! `SubRecord`, tag `0x01`: uid varint, id str, kind u8 (1 webhook: url str; 2 pull-wake: wake
//! stream str), pattern flag u8 [+ str], explicit-at-creation count varint + strs, lease ttl
//! varint, description flag u8 [+ str], created ms i64, generation varint, wake flag u8 [+
//! generation varint, holder flag u8 [+ str], lease flag u8 [+ until ms i64], snapshot count
//! varint + per entry (path str, stream id varint, tail varint)], failures varint, next attempt
//! ms i64, explicit-now count varint + strs, last done generation varint, output prefix count
//! varint + strs (absent in records written before outputs existed: none). Strings are u32-length-prefixed UTF-8.
//!
//! `Cursor`, tag `0x01`: stream id varint, acked offset varint. Under a `curl/` key, tag `0x02`:
//! stream id varint, acked offset varint, path str (the key names only its digest).
//!
//! A baseline chunk (`base/{uid:016x}/{chunk:08x}`: the tails of the streams a subscription
//! linked at creation), tag `0x01`: count varint, then per stream, by increasing stream id, the
//! id's increase over the previous one (the first: the id) varint and the tail varint. Absent
//! for subscriptions created before baselines, whose starting points are `cur/` cursors.
//!
//! The dispatcher lease (`lease/dispatcher`), tag `0x01`: holder u64, end (Unix ms) i64.
//!
//! The next subscription uid (`seq/subscription`), tag `0x01`: u64. (Before tags it was the bare
//! u64, 8 bytes: still read.)
//!
//! All fixed-width integers little-endian.

use std::collections::BTreeSet;

use oncelog_protocol::Offset;

use super::{Cursor, SubConfig, SubKind, SubRecord, Wake};
use oncelog_storage::codec::{DecodeError, Decoder, Encoder};

const TAG_V1: u8 = 0x01;
/// A cursor that carries its stream's path (stored under a digest key).
const TAG_NAMED_CURSOR: u8 = 0x02;

fn opt_str(e: &mut Encoder, v: Option<&str>) {
    match v {
        Some(s) => e.u8(1).str(s),
        None => e.u8(0),
    };
}

fn get_opt_str(d: &mut Decoder<'_>) -> Result<Option<String>, DecodeError> {
    Ok(if d.bool()? { Some(d.string()?) } else { None })
}

fn strs<'a>(e: &mut Encoder, v: impl ExactSizeIterator<Item = &'a String>) {
    e.varint(v.len() as u64);
    for s in v {
        e.str(s);
    }
}

fn get_strs(d: &mut Decoder<'_>) -> Result<Vec<String>, DecodeError> {
    let n = d.varint()?;
    // Each string takes at least its 4-byte length: a count beyond that is damage.
    if n > d.remaining() as u64 / 4 {
        return Err(DecodeError::Truncated);
    }
    (0..n).map(|_| d.string()).collect()
}

pub fn encode(r: &SubRecord) -> Vec<u8> {
    let mut e = Encoder(Vec::with_capacity(128));
    e.u8(TAG_V1).varint(r.uid).str(&r.id);
    match &r.config.kind {
        SubKind::Webhook { url } => e.u8(1).str(url),
        SubKind::PullWake { wake_stream } => e.u8(2).str(wake_stream),
    };
    opt_str(&mut e, r.config.pattern.as_deref());
    strs(&mut e, r.config.streams.iter());
    e.varint(u64::from(r.config.lease_ttl_ms));
    opt_str(&mut e, r.config.description.as_deref());
    e.i64(r.created_ms).varint(r.generation);
    match &r.wake {
        None => {
            e.u8(0);
        }
        Some(w) => {
            e.u8(1).varint(w.generation);
            opt_str(&mut e, w.holder.as_deref());
            match w.lease_until_ms {
                Some(t) => e.u8(1).i64(t),
                None => e.u8(0),
            };
            e.varint(w.snapshot.len() as u64);
            for (path, id, tail) in &w.snapshot {
                e.str(path).varint(*id).varint(tail.0);
            }
        }
    }
    e.varint(u64::from(r.failures)).i64(r.next_attempt_ms);
    strs(&mut e, r.explicit.iter());
    e.varint(r.last_done);
    strs(&mut e, r.config.outputs.iter());
    e.0
}

pub fn decode(bytes: &[u8]) -> Result<SubRecord, DecodeError> {
    let mut d = Decoder(bytes);
    d.tag(TAG_V1)?;
    let uid = d.varint()?;
    let id = d.string()?;
    let kind = match d.u8()? {
        1 => SubKind::Webhook { url: d.string()? },
        2 => SubKind::PullWake { wake_stream: d.string()? },
        _ => return Err(DecodeError::InvalidValue),
    };
    let pattern = get_opt_str(&mut d)?;
    let streams = get_strs(&mut d)?;
    let lease_ttl_ms = u32::try_from(d.varint()?).map_err(|_| DecodeError::InvalidValue)?;
    let description = get_opt_str(&mut d)?;
    let created_ms = d.i64()?;
    let generation = d.varint()?;
    let wake = if d.bool()? {
        let generation = d.varint()?;
        let holder = get_opt_str(&mut d)?;
        let lease_until_ms = if d.bool()? { Some(d.i64()?) } else { None };
        let n = d.varint()?;
        if n > d.remaining() as u64 / 6 {
            return Err(DecodeError::Truncated);
        }
        let mut snapshot = Vec::new();
        for _ in 0..n {
            snapshot.push((d.string()?, d.varint()?, Offset(d.varint()?)));
        }
        Some(Wake { generation, holder, lease_until_ms, snapshot })
    } else {
        None
    };
    let failures = u32::try_from(d.varint()?).map_err(|_| DecodeError::InvalidValue)?;
    let next_attempt_ms = d.i64()?;
    let explicit: BTreeSet<String> = get_strs(&mut d)?.into_iter().collect();
    let last_done = d.varint()?;
    let outputs = if d.remaining() > 0 { get_strs(&mut d)? } else { Vec::new() };
    d.finish()?;
    let config = SubConfig { kind, pattern, streams, lease_ttl_ms, description, outputs };
    Ok(SubRecord { uid, id, config, created_ms, generation, wake, last_done, failures, next_attempt_ms, explicit })
}

pub fn encode_cursor(c: &Cursor) -> Vec<u8> {
    let mut e = Encoder(Vec::with_capacity(12));
    e.u8(TAG_V1).varint(c.stream_id).varint(c.acked.0);
    e.0
}

pub fn decode_cursor(bytes: &[u8]) -> Result<Cursor, DecodeError> {
    let mut d = Decoder(bytes);
    d.tag(TAG_V1)?;
    let c = Cursor { stream_id: d.varint()?, acked: Offset(d.varint()?) };
    d.finish()?;
    Ok(c)
}

/// A cursor with its stream's path, for a key that names only the path's digest.
pub fn encode_named_cursor(path: &str, c: &Cursor) -> Vec<u8> {
    let mut e = Encoder(Vec::with_capacity(16 + path.len()));
    e.u8(TAG_NAMED_CURSOR).varint(c.stream_id).varint(c.acked.0).str(path);
    e.0
}

pub fn decode_named_cursor(bytes: &[u8]) -> Result<(String, Cursor), DecodeError> {
    let mut d = Decoder(bytes);
    d.tag(TAG_NAMED_CURSOR)?;
    let c = Cursor { stream_id: d.varint()?, acked: Offset(d.varint()?) };
    let path = d.string()?;
    d.finish()?;
    Ok((path, c))
}

/// One chunk of a baseline: `(stream id, tail)` pairs sorted by id.
pub fn encode_baseline(entries: &[(u64, Offset)]) -> Vec<u8> {
    let mut e = Encoder(Vec::with_capacity(4 + entries.len() * 4));
    e.u8(TAG_V1).varint(entries.len() as u64);
    let mut prev = 0;
    for (id, tail) in entries {
        e.varint(id - prev).varint(tail.0);
        prev = *id;
    }
    e.0
}

pub fn decode_baseline(bytes: &[u8]) -> Result<Vec<(u64, Offset)>, DecodeError> {
    let mut d = Decoder(bytes);
    d.tag(TAG_V1)?;
    let n = d.varint()?;
    // Each entry takes at least two bytes: a count beyond that is damage.
    if n > d.remaining() as u64 / 2 {
        return Err(DecodeError::Truncated);
    }
    let mut out = Vec::with_capacity(n as usize);
    let mut id = 0u64;
    for _ in 0..n {
        id = id.checked_add(d.varint()?).ok_or(DecodeError::InvalidValue)?;
        out.push((id, Offset(d.varint()?)));
    }
    d.finish()?;
    Ok(out)
}

/// The dispatcher lease: who holds it (a node's id) and until when (Unix ms).
pub fn encode_lease(holder: u64, until_ms: i64) -> Vec<u8> {
    let mut e = Encoder(Vec::with_capacity(17));
    e.u8(TAG_V1).u64(holder).i64(until_ms);
    e.0
}

pub fn decode_lease(bytes: &[u8]) -> Result<(u64, i64), DecodeError> {
    let mut d = Decoder(bytes);
    d.tag(TAG_V1)?;
    let lease = (d.u64()?, d.i64()?);
    d.finish()?;
    Ok(lease)
}

/// The next subscription uid.
pub fn encode_uid(next: u64) -> Vec<u8> {
    let mut e = Encoder(Vec::with_capacity(9));
    e.u8(TAG_V1).u64(next);
    e.0
}

pub fn decode_uid(bytes: &[u8]) -> Result<u64, DecodeError> {
    if let Ok(bare) = <[u8; 8]>::try_from(bytes) {
        // Written before tags: the bare u64.
        return Ok(u64::from_le_bytes(bare));
    }
    let mut d = Decoder(bytes);
    d.tag(TAG_V1)?;
    let next = d.u64()?;
    d.finish()?;
    Ok(next)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn text() -> impl Strategy<Value = String> {
        "[a-z/*é]{0,12}"
    }

    fn record() -> impl Strategy<Value = SubRecord> {
        let kind = prop_oneof![
            text().prop_map(|url| SubKind::Webhook { url }),
            text().prop_map(|wake_stream| SubKind::PullWake { wake_stream })
        ];
        let wake = proptest::option::of((
            any::<u64>(),
            proptest::option::of(text()),
            proptest::option::of(any::<i64>()),
            proptest::collection::vec((text(), any::<u64>(), any::<u64>()), 0..3),
        ));
        (
            (
                any::<u64>(),
                text(),
                kind,
                proptest::option::of(text()),
                proptest::collection::vec(text(), 0..3),
                any::<u32>(),
                proptest::option::of(text()),
            ),
            (
                any::<i64>(),
                any::<u64>(),
                wake,
                any::<u32>(),
                any::<i64>(),
                proptest::collection::btree_set(text(), 0..3),
                any::<u64>(),
                proptest::collection::vec(text(), 0..3),
            ),
        )
            .prop_map(
                |(
                    (uid, id, kind, pattern, streams, lease_ttl_ms, description),
                    (created_ms, generation, wake, failures, next_attempt_ms, explicit, last_done, outputs),
                )| SubRecord {
                    last_done,
                    uid,
                    id,
                    config: SubConfig { kind, pattern, streams, lease_ttl_ms, description, outputs },
                    created_ms,
                    generation,
                    wake: wake.map(|(generation, holder, lease_until_ms, snap)| Wake {
                        generation,
                        holder,
                        lease_until_ms,
                        snapshot: snap.into_iter().map(|(p, i, t)| (p, i, Offset(t))).collect(),
                    }),
                    failures,
                    next_attempt_ms,
                    explicit,
                },
            )
    }

    proptest! {
        #[test]
        fn records_round_trip(r in record()) {
            prop_assert_eq!(decode(&encode(&r)), Ok(r));
        }

        #[test]
        fn cursors_round_trip(stream_id: u64, acked: u64) {
            let c = Cursor { stream_id, acked: Offset(acked) };
            prop_assert_eq!(decode_cursor(&encode_cursor(&c)), Ok(c));
        }

        #[test]
        fn baselines_round_trip(mut ids in proptest::collection::vec(any::<u64>(), 0..50), tail: u64) {
            ids.sort_unstable();
            ids.dedup();
            let entries: Vec<(u64, Offset)> = ids.into_iter().map(|id| (id, Offset(tail))).collect();
            prop_assert_eq!(decode_baseline(&encode_baseline(&entries)).expect("decodes"), entries);
        }

        #[test]
        fn named_cursors_round_trip(stream_id: u64, acked: u64, path in "[a-z/é]{0,40}") {
            let c = Cursor { stream_id, acked: Offset(acked) };
            prop_assert_eq!(decode_named_cursor(&encode_named_cursor(&path, &c)), Ok((path, c)));
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..80)) {
            let _ = decode(&bytes);
            let _ = decode_cursor(&bytes);
            let _ = decode_named_cursor(&bytes);
        }
    }

    proptest! {
        #[test]
        fn leases_and_uids_round_trip(holder: u64, until: i64, next: u64) {
            prop_assert_eq!(decode_lease(&encode_lease(holder, until)), Ok((holder, until)));
            prop_assert_eq!(decode_uid(&encode_uid(next)), Ok(next));
            prop_assert_eq!(decode_uid(&next.to_le_bytes()), Ok(next));
        }
    }

    #[test]
    fn unknown_tags_are_refused() {
        assert_eq!(decode_lease(&[0x02; 17]), Err(DecodeError::UnknownTag(0x02)));
        assert_eq!(decode_uid(&[0x02; 9]), Err(DecodeError::UnknownTag(0x02)));
        assert_eq!(decode(&[0x02]), Err(DecodeError::UnknownTag(0x02)));
        assert_eq!(decode_cursor(&[0x09, 0, 0]), Err(DecodeError::UnknownTag(0x09)));
        assert_eq!(decode_named_cursor(&[0x01, 0, 0]), Err(DecodeError::UnknownTag(0x01)));
    }
}
