use oncelog_protocol::headers::Expiry;
use oncelog_protocol::producer::Receipt;
use oncelog_protocol::Offset;
use oncelog_storage::{ForkOf, KeyEntry};
use proptest::prelude::*;

use super::*;

fn meta() -> impl Strategy<Value = StreamMeta> {
    (
        any::<u64>(),
        "[a-z/+]{1,20}",
        any::<bool>(),
        proptest::option::of("[0-9]{1,5}"),
        proptest::option::of((any::<u64>(), any::<u64>())),
        any::<bool>(),
        proptest::option::of(any::<u64>()),
    )
        .prop_map(|(id, content_type, closed, stream_seq, fork, soft_deleted, max_age_s)| {
            let config = oncelog_storage::StreamConfig {
                content_type,
                expiry: Expiry::Ttl(60),
                retention: oncelog_storage::RetentionPolicy { max_age_s, max_bytes: None },
                compaction: closed && soft_deleted,
            };
            StreamMeta {
                closed,
                stream_seq,
                fork: fork.map(|(source_id, fork_point)| ForkOf { source_id, fork_point }),
                soft_deleted,
                earliest: Offset(7),
                ..StreamMeta::with_config(id, 7, config)
            }
        })
}

/// Encodes `rec` into a payload, decodes it back, and checks the data is where decoding says.
fn round_trip(rec: Record<'_>) -> Replayed {
    let mut payload = vec![0xAA; 3]; // records follow others in a payload
    let at = encode(&rec, &mut payload);
    let mut out = decode_payload(&payload[3..]).expect("decodes");
    assert_eq!(out.len(), 1);
    let r = out.remove(0);
    let (data_at, data_len) = match &r {
        Replayed::Create { data_at, data_len, .. } | Replayed::Append { data_at, data_len, .. } => {
            (*data_at, *data_len)
        }
        _ => (at - 3, 0),
    };
    assert_eq!(data_at + 3, at);
    let data = match &rec {
        Record::Create { data, .. } | Record::Append { data, .. } => *data,
        _ => &[],
    };
    assert_eq!(&payload[at..at + data_len as usize], data);
    r
}

proptest! {
    #[test]
    fn create_records_round_trip(id: u64, path in "[a-z/]{1,30}", m in meta(), data in proptest::collection::vec(any::<u8>(), 0..64)) {
        let r = round_trip(Record::Create { id, path: &path, meta: &m, data: &data });
        let data_at = match &r { Replayed::Create { data_at, .. } => *data_at, _ => usize::MAX };
        prop_assert_eq!(r, Replayed::Create { id, path, meta: m, data_at, data_len: data.len() as u64 });
    }

    #[test]
    fn append_records_round_trip(
        id: u64, new_tail: u64, close: bool,
        stream_seq in proptest::option::of("[0-9a-z]{0,12}"),
        producer in proptest::option::of(("[a-z0-9-]{1,20}", any::<u64>(), any::<u64>(), proptest::option::of((any::<u64>(), 0i64..i64::MAX)))),
        key in proptest::option::of((any::<u128>(), any::<u64>(), 0i64..i64::MAX)),
        time in proptest::option::of(0i64..i64::MAX),
        data in proptest::collection::vec(any::<u8>(), 0..64),
    ) {
        // A record has a producer or a key, never both.
        let key = if producer.is_some() { None } else { key.map(|(k, d, t)| (KeyId(k), BodyDigest(d), t)) };
        let producer = producer.map(|(id, epoch, seq, details)| AcceptedProducer { id, epoch, seq, details: details.map(|(d, t)| (BodyDigest(d), t)) });
        let p = producer.as_ref().map(|p| AcceptedProducer { id: p.id.as_str(), epoch: p.epoch, seq: p.seq, details: p.details });
        let r = round_trip(Record::Append { id, new_tail, close, stream_seq: stream_seq.as_deref(), producer: p, key, time, data: &data });
        match r {
            Replayed::Append { id: i, new_tail: t, close: c, stream_seq: s, producer: pr, key: k, time: tm, data_len, .. } => {
                prop_assert_eq!((i, t, c, s, pr, k, tm, data_len), (id, new_tail, close, stream_seq, producer, key, time, data.len() as u64));
            }
            other => prop_assert!(false, "{other:?}"),
        }
    }

    #[test]
    fn meta_records_round_trip(key in proptest::collection::vec(any::<u8>(), 0..40), value in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..80))) {
        let rec = Record::Meta { key: &key, value: value.as_deref() };
        prop_assert_eq!(round_trip(rec), Replayed::Meta { key: key.clone(), value: value.clone() });
    }

    #[test]
    fn deletes_round_trip(id: u64, kind in 0..3u8) {
        let (rec, want) = match kind {
            0 => (Record::SoftDelete { id }, Replayed::SoftDelete { id }),
            1 => (Record::Remove { id }, Replayed::Remove { id }),
            _ => (Record::Detach { id }, Replayed::Detach { id }),
        };
        prop_assert_eq!(round_trip(rec), want);
    }

    #[test]
    fn garbage_payloads_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..128)) {
        let _ = decode_payload(&bytes);
    }

    #[test]
    fn checkpoints_round_trip(
        lsn: u64, segment in 0..MAX_SEGMENT_NUMBER, pos in 0..MAX_SEGMENT_BYTES, next_id: u64,
        streams in proptest::collection::vec((meta(), proptest::option::of("[a-z/]{1,10}"), 0u64..1000, proptest::collection::vec((1u64..100, 1u64..50, 0u64..1_000_000), 0..5), proptest::collection::vec(("[a-z]{1,5}", any::<u64>(), any::<u64>()), 0..3), proptest::collection::vec((any::<u128>(), any::<u64>(), any::<u64>(), 0i64..i64::MAX), 0..3), proptest::collection::vec((1u64..1000, 0i64..i64::MAX), 0..4)), 0..5),
        meta_map in proptest::collection::btree_map(proptest::collection::vec(any::<u8>(), 0..12), proptest::collection::vec(any::<u8>(), 0..24), 0..4),
    ) {
        let streams = streams.into_iter().map(|(meta, path, start, ext, prods, keys, marks)| {
            let mut end = start;
            let extents = ext.into_iter().map(|(len, seg, p)| { end += len; Extent::new(end, seg, p) }).collect();
            let producers = prods.into_iter().map(|(id, epoch, seq)| {
                let mut s = ProducerState::new(epoch);
                s.accept(epoch, seq, Receipt { end: Offset(end), digest: BodyDigest(seq ^ end) }, end as i64);
                (id, s)
            }).collect();
            let keys = keys.into_iter().map(|(k, e, d, t)| (KeyId(k), KeyEntry { end: Offset(e), digest: BodyDigest(d), at_ms: t })).collect();
            let mut at = 0;
            let marks = marks.into_iter().map(|(len, t)| { at += len; oncelog_storage::TimeMark { end: Offset(at), at_ms: t } }).collect();
            CheckpointStream { path, meta, tail: end, start, producers, extents, keys, marks }
        }).collect();
        let meta: Vec<(Vec<u8>, bytes::Bytes)> = meta_map.into_iter().map(|(k, v)| (k, bytes::Bytes::from(v))).collect();
        let c = Checkpoint { lsn, segment, pos, next_id, streams, meta };
        let encoded = c.encode();
        // Layout 6 only when a stream is detached from its path (a purged source).
        let detached = c.streams.iter().any(|s| s.path.is_none());
        prop_assert_eq!(&encoded[..8], if detached { b"ONCECKP\x06" } else { b"ONCECKP\x05" });
        prop_assert_eq!(Checkpoint::decode(&encoded, 0), Ok(c));
    }

    #[test]
    fn garbage_checkpoints_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..128)) {
        let _ = Checkpoint::decode(&bytes, 0);
    }
}

#[test]
fn a_frame_checks_out_only_unchanged() {
    let mut frame = vec![0u8; FRAME_HEADER];
    encode(&Record::Remove { id: 9 }, &mut frame);
    seal_frame(&mut frame, 42);
    let h = parse_frame_header(&frame).expect("header");
    assert_eq!((h.lsn, h.len), (42, frame.len() - FRAME_HEADER));
    assert!(frame_is_valid(&h, &frame));
    for i in 4..frame.len() {
        let mut bad = frame.clone();
        bad[i] ^= 0x10;
        let ok = parse_frame_header(&bad).is_some_and(|h| frame_is_valid(&h, &bad));
        assert!(!ok, "flipping byte {i} went unnoticed");
    }
}

#[test]
fn segment_names_round_trip() {
    assert_eq!(parse_segment_name(segment_name(7).trim_start_matches("log/")), Some(7));
    assert_eq!(parse_segment_name("7.seg"), None);
    assert_eq!(parse_segment_name("checkpoint"), None);
}

/// An Append record as the previous version wrote it (producer without bit 3) still replays,
/// with no details; bit 3 without bit 2 is refused.
#[test]
fn append_records_without_producer_details_still_decode() {
    let mut payload = vec![0x02, 7, 10, 0b100];
    payload.extend_from_slice(&[1, b'p', 2, 3]); // producer "p", epoch 2, seq 3
    payload.extend_from_slice(&[2, b'h', b'i']);
    let got = decode_payload(&payload).expect("legacy record");
    match &got[..] {
        [Replayed::Append { id: 7, new_tail: 10, producer: Some(p), data_len: 2, .. }] => {
            assert_eq!((p.id.as_str(), p.epoch, p.seq, p.details), ("p", 2, 3, None));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(decode_payload(&[0x02, 7, 10, 0b1000, 0]), Err(DecodeError::InvalidValue));
}

/// A checkpoint of the previous version (no key lists) still loads.
#[test]
fn version_1_checkpoints_still_decode() {
    let body = [3u8, 1, 16, 9, 0]; // lsn 3, segment 1, pos 16, next id 9, no streams
    let mut bytes = b"ONCECKP\x01".to_vec();
    bytes.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
    bytes.extend_from_slice(&(body.len() as u64).to_le_bytes());
    bytes.extend_from_slice(&body);
    let c = Checkpoint::decode(&bytes, 0).expect("v1 checkpoint");
    assert_eq!((c.lsn, c.segment, c.pos, c.next_id, c.streams.len()), (3, 1, 16, 9, 0));
}

#[test]
fn version_2_checkpoints_decode_without_time_marks() {
    let meta = StreamMeta::new(4, 1, "text/plain");
    let s = CheckpointStream {
        path: Some("s".into()),
        meta,
        tail: 5,
        start: 0,
        producers: vec![],
        extents: vec![Extent::new(5, 1, 16)],
        keys: vec![],
        marks: vec![],
    };
    let c = Checkpoint { lsn: 2, segment: 1, pos: 40, next_id: 5, streams: vec![s], meta: Vec::new() };
    let v5 = c.encode();
    // A version 2 body is the same without the (here empty: one 0 byte each) marks and metadata
    // list at the end.
    let body = &v5[20..v5.len() - 2];
    let mut v2 = b"ONCECKP\x02".to_vec();
    v2.extend_from_slice(&crc32c::crc32c(body).to_le_bytes());
    v2.extend_from_slice(&(body.len() as u64).to_le_bytes());
    v2.extend_from_slice(body);
    assert_eq!(Checkpoint::decode(&v2, 0), Ok(c));
}

/// A checkpoint of layout 4 (keys and marks inline, not in their shared stored forms) still
/// loads, with the same keys and marks.
#[test]
fn version_4_checkpoints_with_inline_keys_and_marks_still_decode() {
    let mut meta = StreamMeta::new(4, 1, "text/plain");
    std::sync::Arc::make_mut(&mut meta.config).retention =
        oncelog_storage::RetentionPolicy { max_age_s: Some(60), max_bytes: None };
    let key = (KeyId(0x0102_0304), KeyEntry { end: Offset(5), digest: BodyDigest(99), at_ms: 1_000 });
    let marks = vec![
        oncelog_storage::TimeMark { end: Offset(3), at_ms: 10 },
        oncelog_storage::TimeMark { end: Offset(5), at_ms: 20 },
    ];
    let m = oncelog_storage::codec::stream_meta::encode(&meta);
    let mut body = vec![2u8, 1, 40, 5, 1]; // lsn, segment, pos, next id, one stream
    body.extend_from_slice(&[1, b's', m.len() as u8]);
    body.extend_from_slice(&m);
    body.extend_from_slice(&[5, 0, 0, 1, 5, 1, 16]); // tail, start, no producers, one extent
    body.push(1); // one key, inline
    body.extend_from_slice(&key.0 .0.to_le_bytes());
    body.push(5);
    body.extend_from_slice(&99u64.to_le_bytes());
    body.extend_from_slice(&[0xe8, 0x07]); // 1000 as a varint
    body.extend_from_slice(&[2, 3, 10, 2, 20]); // two marks: end deltas and times
    body.extend_from_slice(&[1, 1, b'k', 1, b'v']); // metadata: k = v
    let mut v4 = b"ONCECKP\x04".to_vec();
    v4.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
    v4.extend_from_slice(&(body.len() as u64).to_le_bytes());
    v4.extend_from_slice(&body);
    let c = Checkpoint::decode(&v4, 0).expect("v4 checkpoint");
    assert_eq!((c.streams[0].keys.clone(), c.streams[0].marks.clone()), (vec![key], marks));
    assert_eq!(c.meta, vec![(b"k".to_vec(), bytes::Bytes::from_static(b"v"))]);
    // Written again, it is layout 5 and reads back the same.
    assert_eq!(Checkpoint::decode(&c.encode(), 0), Ok(c));
}

/// An empty path is a detached stream only in layout 6: the same bytes under layout 5 are
/// damage, never a stream at the path "".
#[test]
fn only_layout_6_holds_detached_streams() {
    let meta = StreamMeta { soft_deleted: true, ..StreamMeta::new(4, 1, "text/plain") };
    let s = CheckpointStream {
        path: None,
        meta,
        tail: 5,
        start: 0,
        producers: vec![],
        extents: vec![Extent::new(5, 1, 16)],
        keys: vec![],
        marks: vec![],
    };
    let c = Checkpoint { lsn: 2, segment: 1, pos: 40, next_id: 5, streams: vec![s], meta: Vec::new() };
    let v6 = c.encode();
    assert_eq!(&v6[..8], b"ONCECKP\x06");
    assert_eq!(Checkpoint::decode(&v6, 0), Ok(c));
    let mut v5 = v6.clone();
    v5[..8].copy_from_slice(b"ONCECKP\x05");
    assert_eq!(Checkpoint::decode(&v5, 0), Err(DecodeError::InvalidValue));
}
