//! Key layouts, one per keyspace.
//!
//! | keyspace    | key                                   | value                          |
//! |-------------|---------------------------------------|--------------------------------|
//! | `streams`   | stream path (UTF-8)                   | [`super::StreamMeta`]          |
//! | `data`      | stream id (u64 BE) ++ end offset (u64 BE) | the append's stored bytes  |
//! | `producers` | stream id (u64 BE) ++ producer id     | [`super::ProducerRecord`]      |
//! | `idempotency` | stream id (u64 BE) ++ key id (u128 BE) | [`oncelog_storage::codec::key_entry`] |
//! | `marks`     | stream id (u64 BE) ++ mark number (u64 BE) | [`mark_value`]: end u64 LE ++ time (Unix ms) i64 LE |
//! | `gc`        | stream id (u64 BE)                    | empty: data of a deleted stream still to be removed |
//! | `meta`      | `0x00` ++ metadata key ([`meta`])     | the metadata value's bytes, as given ([`oncelog_storage::MetaWrite`]) |
//! | `sys`       | `next_stream_id`                      | [`super::sys`] (tagged u64)    |
//!
//! A data key holds the append's *end* offset, so the append containing offset `o` is the first
//! key at or after `(id, o + 1)`: one forward range scan serves any read, and the last key of a
//! stream gives its tail on recovery.

use oncelog_protocol::digest::KeyId;

pub const NEXT_STREAM_ID: &[u8] = b"next_stream_id";

pub fn data(stream_id: u64, end: u64) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&stream_id.to_be_bytes());
    k[8..].copy_from_slice(&end.to_be_bytes());
    k
}

/// Splits a data key into (stream id, end offset).
pub fn parse_data(key: &[u8]) -> Option<(u64, u64)> {
    let id = u64::from_be_bytes(key.get(..8)?.try_into().ok()?);
    let end = u64::from_be_bytes(key.get(8..16)?.try_into().ok()?);
    (key.len() == 16).then_some((id, end))
}

pub fn stream_prefix(stream_id: u64) -> [u8; 8] {
    stream_id.to_be_bytes()
}

pub fn producer(stream_id: u64, producer_id: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(8 + producer_id.len());
    k.extend_from_slice(&stream_id.to_be_bytes());
    k.extend_from_slice(producer_id.as_bytes());
    k
}

pub fn idempotency(stream_id: u64, key: KeyId) -> [u8; 24] {
    let mut k = [0u8; 24];
    k[..8].copy_from_slice(&stream_id.to_be_bytes());
    k[8..].copy_from_slice(&key.0.to_be_bytes());
    k
}

/// A stream's time mark number `no` (marks are numbered from 0 in the order they start; the
/// last one is rewritten as it extends). Same layout as a data key.
pub fn mark(stream_id: u64, no: u64) -> [u8; 16] {
    data(stream_id, no)
}

pub fn mark_value(m: &oncelog_storage::TimeMark) -> [u8; 16] {
    let mut v = [0u8; 16];
    v[..8].copy_from_slice(&m.end.0.to_le_bytes());
    v[8..].copy_from_slice(&m.at_ms.to_le_bytes());
    v
}

pub fn parse_mark_value(v: &[u8]) -> Option<oncelog_storage::TimeMark> {
    let end = u64::from_le_bytes(v.get(..8)?.try_into().ok()?);
    let at_ms = i64::from_le_bytes(v.get(8..16)?.try_into().ok()?);
    (v.len() == 16).then_some(oncelog_storage::TimeMark { end: oncelog_protocol::Offset(end), at_ms })
}

/// The first byte of every `meta` key (see [`meta`]).
const META_KEY_LEAD: u8 = 0x00;

/// The stored key of engine-metadata key `key` ([`oncelog_storage::Engine::transact`]). The
/// leading byte is there because fjall refuses an empty key, which the seam allows; it is the
/// same for every key, so stored order is the metadata's key order.
pub fn meta(key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + key.len());
    k.push(META_KEY_LEAD);
    k.extend_from_slice(key);
    k
}

/// The metadata key a stored `meta` key holds.
pub fn parse_meta(stored: &[u8]) -> Option<&[u8]> {
    stored.strip_prefix(&[META_KEY_LEAD])
}

/// Splits an idempotency key into (stream id, key id).
pub fn parse_idempotency(key: &[u8]) -> Option<(u64, KeyId)> {
    let id = u64::from_be_bytes(key.get(..8)?.try_into().ok()?);
    let k = u128::from_be_bytes(key.get(8..24)?.try_into().ok()?);
    (key.len() == 24).then_some((id, KeyId(k)))
}

/// Splits a producer key into (stream id, producer id).
pub fn parse_producer(key: &[u8]) -> Option<(u64, String)> {
    let id = u64::from_be_bytes(key.get(..8)?.try_into().ok()?);
    let producer = std::str::from_utf8(key.get(8..)?).ok()?;
    Some((id, producer.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn data_keys_sort_by_stream_then_offset(a: (u64, u64), b: (u64, u64)) {
            prop_assert_eq!(data(a.0, a.1).cmp(&data(b.0, b.1)), a.cmp(&b));
            prop_assert_eq!(parse_data(&data(a.0, a.1)), Some(a));
        }

        #[test]
        fn meta_keys_keep_key_order_and_round_trip(a: Vec<u8>, b: Vec<u8>) {
            prop_assert_eq!(meta(&a).cmp(&meta(&b)), a.cmp(&b));
            let stored = meta(&a);
            prop_assert_eq!(parse_meta(&stored), Some(a.as_slice()));
        }

        #[test]
        fn producer_keys_round_trip(id: u64, p in "\\PC{1,20}") {
            prop_assert_eq!(parse_producer(&producer(id, &p)), Some((id, p.clone())));
        }
    }
}
