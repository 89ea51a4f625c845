//! The on-disk format of the log. This comment is the format's specification; the code below
//! and its round-trip tests hold it.
//!
//! ## Files
//! - `log/NNNNNNNNNNNNNNNNNNNN.seg` (20 decimal digits, the segment number, from 1, no gaps):
//!   segments of the log. A segment starts with a 16-byte header (`ONCELOG\x01` then the segment
//!   number, u64 little-endian) and holds frames back to back, then zeros to its end: a segment's
//!   space is allocated (`fallocate`) when it is created, so writing a frame changes no file
//!   size. Zeros where a frame header would start are a segment's clean end (a frame starts
//!   with a non-zero magic). Segments written before allocation simply end after their last
//!   frame. Only the last segment is written; a segment is never rewritten, only deleted whole
//!   once nothing in it is needed.
//! - `checkpoint`: the whole state as of one frame (see [`Checkpoint`]); optional, derived,
//!   replaced atomically (`checkpoint.tmp`, fsync, rename, directory fsync).
//! - `lock`: empty; locked (`flock`) while a server has the directory open.
//!
//! ## Frames
//! One frame is one group commit: written with one `pwrite`, made durable with one `fdatasync`.
//!
//! ```text
//! magic u32 = 0x474C_4E4F ("ONLG") | crc32c u32 | payload length u32 | lsn u64 | payload
//! ```
//! The CRC (Castagnoli) covers the length, the lsn and the payload. LSNs start at 1 and grow by
//! one per frame across segments, so recovery can tell a torn tail from a hole.
//!
//! ## Records (inside a payload, back to back)
//! Each starts with a tag byte; all integers are LEB128 varints unless noted:
//! - `0x01` **Create**: id, path (len + bytes), the stream's metadata as
//!   [`oncelog_storage::codec::stream_meta`] (len + bytes), initial data (len + bytes).
//! - `0x02` **Append**: id, new tail, flags u8 (bit 0 close, bit 1 `Stream-Seq`, bit 2 producer,
//!   bit 3 producer details, bit 4 idempotency key, bit 5 write time), [`Stream-Seq` (len +
//!   bytes)], [producer id (len + bytes), epoch, seq], [body digest u64 little-endian, time of
//!   acceptance in Unix ms], [key id u128 little-endian, body digest u64 little-endian, time of
//!   acceptance], [write time in Unix ms], data (len + bytes). A record has a producer or a key,
//!   never both. The write time is set on the appends of streams with a maximum age, and
//!   replayed into the stream's time marks ([`oncelog_storage::retention`]).
//!   Bit 3 is set with every bit 2 this version writes; records without it (written before body
//!   digests and producer activity times were kept) replay with an unknown digest and the
//!   recovery time as the producer's activity.
//!   The data and *all* of its effects are one record inside one checksummed frame: a power cut
//!   keeps all of them or none.
//! - `0x03` **SoftDelete**: id. The stream keeps its data for its forks; its producers are dropped.
//! - `0x04` **Remove**: id. The stream and its producers are gone; its data is garbage.
//! - `0x05` **Trim**: id, earliest. Reads from before `earliest` are refused from here on; the
//!   bytes stay until space reclamation drops them (forks keep reading what they reference).
//! - `0x06` **Meta**: key (len + bytes), kind u8 (0 delete, 1 put), [value (len + bytes)]. One
//!   change to the engine metadata map (subscriptions keep their state there). A transaction is
//!   its Meta and Append records in one frame: a power cut keeps all of them or none.
//! - `0x07` **Detach**: id. A purging delete of a stream that forks still read
//!   ([`oncelog_storage::rules::Removal::Detach`]): as SoftDelete (if it was not soft-deleted
//!   yet), and the stream no longer holds its path: the path is free for a new stream (a later
//!   Create of it is another id), and this one is kept by id only, for its forks, until a Remove
//!   of it (written when its last fork goes). One record, so the path is released and the data
//!   kept together or not at all.
//!
//! ## Invariants
//! 1. A frame is acknowledged only after it (and every frame before it) was synced; a new segment
//!    is created, and the directory synced, before any frame goes into it.
//! 2. Hence after a power cut only the tail of the last segment can be damaged: recovery cuts a
//!    torn tail there (a tail of zeros is the clean end of any segment, nothing to cut). A bad
//!    frame anywhere else, or one followed by a valid frame of a higher LSN, is corruption of acknowledged data: recovery refuses to start and says where.
//! 3. Replaying every frame after the checkpoint's position, in order, over the checkpoint's
//!    state yields the state at the last frame; records are effects decided by the rules before
//!    they were written, never re-decided.

use oncelog_protocol::digest::{BodyDigest, KeyId};
use oncelog_protocol::producer::ProducerState;
use oncelog_protocol::Offset;
use oncelog_storage::codec::{key_entry, marks, stream_meta, DecodeError, Decoder, Encoder, ProducerRecord};
use oncelog_storage::{KeyEntry, StreamMeta};

pub const SEGMENT_MAGIC: &[u8; 8] = b"ONCELOG\x01";
pub const SEGMENT_HEADER: u64 = 16;
pub const FRAME_MAGIC: u32 = 0x474C_4E4F;
pub const FRAME_HEADER: usize = 20;
/// Largest frame payload; a bigger length in a header is damage, not data.
pub const MAX_FRAME: usize = 1 << 30;

/// Largest single record's data. A group stops taking commands at `MAX_GROUP_BYTES`, so its
/// frame stays below `MAX_GROUP_BYTES` + this + headers, well inside [`MAX_FRAME`] (a
/// longer frame header would read as damage at recovery).
pub const MAX_RECORD_BYTES: usize = MAX_FRAME / 2;

// What the engines refuse ([`oncelog_storage::rules::shape::MAX_RECORD_BYTES`]) must fit a record.
const _: () = assert!(oncelog_storage::rules::shape::MAX_RECORD_BYTES <= MAX_RECORD_BYTES);

pub const CHECKPOINT: &str = "checkpoint";
/// Locked while a server has the directory open.
pub const LOCK: &str = "lock";
/// With `--object-store`: this data directory's identity, the suffix of the `node` of the
/// manifests its writers create (so a directory knows whether it was the bucket's last writer).
pub const DIR_ID: &str = "dir-id";
pub const CHECKPOINT_TMP: &str = "checkpoint.tmp";
pub const LOG_DIR: &str = "log";
/// Layout 6: layout 5 in which a stream's path may be empty, meaning a stream detached from its
/// path (see the Detach record). Written only when a checkpoint holds such a stream, so a
/// directory that never detached one stays readable by binaries that predate it; a binary that
/// knows layout 5 only refuses it rather than taking an empty path for a stream's.
const CHECKPOINT_MAGIC_V6: &[u8; 8] = b"ONCECKP\x06";
const CHECKPOINT_MAGIC: &[u8; 8] = b"ONCECKP\x05";
/// Checkpoints without engine metadata (and all those written before it existed): the same
/// without the metadata list. Written whenever the map is empty, so a directory that never used
/// it stays readable by binaries that predate it.
const CHECKPOINT_MAGIC_V4: &[u8; 8] = b"ONCECKP\x04";
/// Layout 3: layout 4 without the metadata list.
const CHECKPOINT_MAGIC_V3: &[u8; 8] = b"ONCECKP\x03";
/// Checkpoints written before time marks: the same without the per-stream mark list.
const CHECKPOINT_MAGIC_V2: &[u8; 8] = b"ONCECKP\x02";
/// Checkpoints written before idempotency keys: also without the per-stream key list.
const CHECKPOINT_MAGIC_V1: &[u8; 8] = b"ONCECKP\x01";

const TAG_CREATE: u8 = 0x01;
const TAG_APPEND: u8 = 0x02;
const TAG_SOFT_DELETE: u8 = 0x03;
const TAG_REMOVE: u8 = 0x04;
const TAG_TRIM: u8 = 0x05;
const TAG_META: u8 = 0x06;
const TAG_DETACH: u8 = 0x07;

pub fn segment_name(n: u64) -> String {
    format!("{LOG_DIR}/{n:020}.seg")
}

/// The segment number of a file name in `log/`, if it is one.
pub fn parse_segment_name(file: &str) -> Option<u64> {
    let digits = file.strip_suffix(".seg")?;
    (digits.len() == 20).then(|| digits.parse().ok()).flatten()
}

pub fn segment_header(n: u64) -> [u8; SEGMENT_HEADER as usize] {
    let mut h = [0u8; SEGMENT_HEADER as usize];
    h[..8].copy_from_slice(SEGMENT_MAGIC);
    h[8..].copy_from_slice(&n.to_le_bytes());
    h
}

/// Fills in the frame header in the first [`FRAME_HEADER`] bytes of `frame` (whose payload
/// follows them).
pub fn seal_frame(frame: &mut [u8], lsn: u64) {
    let len = (frame.len() - FRAME_HEADER) as u32;
    frame[8..12].copy_from_slice(&len.to_le_bytes());
    frame[12..20].copy_from_slice(&lsn.to_le_bytes());
    let crc = crc32c::crc32c(&frame[8..]);
    frame[0..4].copy_from_slice(&FRAME_MAGIC.to_le_bytes());
    frame[4..8].copy_from_slice(&crc.to_le_bytes());
}

/// A frame header as read back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub crc: u32,
    pub len: usize,
    pub lsn: u64,
}

/// Parses a frame header; `None` when the magic is wrong or the length impossible.
pub fn parse_frame_header(h: &[u8]) -> Option<FrameHeader> {
    let word = |r: std::ops::Range<usize>| h.get(r).and_then(|b| <[u8; 4]>::try_from(b).ok()).map(u32::from_le_bytes);
    if word(0..4)? != FRAME_MAGIC {
        return None;
    }
    let len = word(8..12)? as usize;
    let lsn = u64::from_le_bytes(h.get(12..20)?.try_into().ok()?);
    (len <= MAX_FRAME).then_some(FrameHeader { crc: word(4..8)?, len, lsn })
}

/// Whether `frame` (header and payload) checks out.
pub fn frame_is_valid(h: &FrameHeader, frame: &[u8]) -> bool {
    frame.len() == FRAME_HEADER + h.len && crc32c::crc32c(&frame[8..]) == h.crc
}

/// A producer's acceptance inside an Append record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcceptedProducer<S> {
    pub id: S,
    pub epoch: u64,
    pub seq: u64,
    /// Digest and acceptance time; `None` in records written before they were kept.
    pub details: Option<(BodyDigest, i64)>,
}

/// One record, as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record<'a> {
    Create {
        id: u64,
        path: &'a str,
        meta: &'a StreamMeta,
        data: &'a [u8],
    },
    Append {
        id: u64,
        new_tail: u64,
        close: bool,
        stream_seq: Option<&'a str>,
        producer: Option<AcceptedProducer<&'a str>>,
        key: Option<(KeyId, BodyDigest, i64)>,
        /// When it was written, for streams whose retention needs it.
        time: Option<i64>,
        data: &'a [u8],
    },
    SoftDelete {
        id: u64,
    },
    Remove {
        id: u64,
    },
    Trim {
        id: u64,
        earliest: u64,
    },
    Meta {
        key: &'a [u8],
        value: Option<&'a [u8]>,
    },
    Detach {
        id: u64,
    },
}

/// One record, as read back: data is located (offset of its first byte in the payload and its
/// length), not copied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Replayed {
    Create {
        id: u64,
        path: String,
        meta: StreamMeta,
        data_at: usize,
        data_len: u64,
    },
    Append {
        id: u64,
        new_tail: u64,
        close: bool,
        stream_seq: Option<String>,
        producer: Option<AcceptedProducer<String>>,
        key: Option<(KeyId, BodyDigest, i64)>,
        time: Option<i64>,
        data_at: usize,
        data_len: u64,
    },
    SoftDelete {
        id: u64,
    },
    Remove {
        id: u64,
    },
    Trim {
        id: u64,
        earliest: u64,
    },
    Meta {
        key: Vec<u8>,
        value: Option<Vec<u8>>,
    },
    Detach {
        id: u64,
    },
}

/// Appends `rec` to a frame payload; returns where its data starts within `out`.
pub fn encode(rec: &Record<'_>, out: &mut Vec<u8>) -> usize {
    let mut e = Encoder(std::mem::take(out));
    let at = match rec {
        Record::Create { id, path, meta, data } => {
            e.u8(TAG_CREATE).varint(*id).varint(path.len() as u64);
            e.0.extend_from_slice(path.as_bytes());
            let m = stream_meta::encode(meta);
            e.varint(m.len() as u64);
            e.0.extend_from_slice(&m);
            e.varint(data.len() as u64);
            let at = e.0.len();
            e.0.extend_from_slice(data);
            at
        }
        Record::Append { id, new_tail, close, stream_seq, producer, key, time, data } => {
            let details = producer.as_ref().and_then(|p| p.details);
            let flags = u8::from(*close)
                | u8::from(stream_seq.is_some()) << 1
                | u8::from(producer.is_some()) << 2
                | u8::from(details.is_some()) << 3
                | u8::from(key.is_some()) << 4
                | u8::from(time.is_some()) << 5;
            e.u8(TAG_APPEND).varint(*id).varint(*new_tail).u8(flags);
            if let Some(s) = stream_seq {
                e.varint(s.len() as u64);
                e.0.extend_from_slice(s.as_bytes());
            }
            if let Some(p) = producer {
                e.varint(p.id.len() as u64);
                e.0.extend_from_slice(p.id.as_bytes());
                e.varint(p.epoch).varint(p.seq);
            }
            if let Some((digest, at_ms)) = details {
                // Times before 1970 do not occur; they are recorded as 0.
                e.u64(digest.0).varint(u64::try_from(at_ms).unwrap_or(0));
            }
            if let Some((k, digest, at_ms)) = key {
                e.0.extend_from_slice(&k.0.to_le_bytes());
                e.u64(digest.0).varint(u64::try_from(*at_ms).unwrap_or(0));
            }
            if let Some(at_ms) = time {
                e.varint(u64::try_from(*at_ms).unwrap_or(0));
            }
            e.varint(data.len() as u64);
            let at = e.0.len();
            e.0.extend_from_slice(data);
            at
        }
        Record::SoftDelete { id } => {
            e.u8(TAG_SOFT_DELETE).varint(*id);
            e.0.len()
        }
        Record::Remove { id } => {
            e.u8(TAG_REMOVE).varint(*id);
            e.0.len()
        }
        Record::Detach { id } => {
            e.u8(TAG_DETACH).varint(*id);
            e.0.len()
        }
        Record::Trim { id, earliest } => {
            e.u8(TAG_TRIM).varint(*id).varint(*earliest);
            e.0.len()
        }
        Record::Meta { key, value } => {
            e.u8(TAG_META).varint(key.len() as u64);
            e.0.extend_from_slice(key);
            e.u8(u8::from(value.is_some()));
            if let Some(v) = value {
                e.varint(v.len() as u64);
                e.0.extend_from_slice(v);
            }
            e.0.len()
        }
    };
    *out = e.0;
    at
}

fn var_bytes<'a>(d: &mut Decoder<'a>) -> Result<&'a [u8], DecodeError> {
    let n = usize::try_from(d.varint()?).map_err(|_| DecodeError::Truncated)?;
    d.take(n)
}

fn var_string(d: &mut Decoder<'_>) -> Result<String, DecodeError> {
    String::from_utf8(var_bytes(d)?.to_vec()).map_err(|_| DecodeError::InvalidUtf8)
}

/// Decodes every record of a frame payload.
pub fn decode_payload(payload: &[u8]) -> Result<Vec<Replayed>, DecodeError> {
    let mut d = Decoder(payload);
    let mut out = Vec::new();
    while d.remaining() > 0 {
        let at_data = |d: &Decoder<'_>| payload.len() - d.remaining();
        let rec = match d.u8()? {
            TAG_CREATE => {
                let id = d.varint()?;
                let path = var_string(&mut d)?;
                let meta = stream_meta::decode(var_bytes(&mut d)?)?;
                let data_len = d.varint()?;
                let data_at = at_data(&d);
                d.take(usize::try_from(data_len).map_err(|_| DecodeError::Truncated)?)?;
                Replayed::Create { id, path, meta, data_at, data_len }
            }
            TAG_APPEND => {
                let id = d.varint()?;
                let new_tail = d.varint()?;
                let flags = d.u8()?;
                // Details (bit 3) exist only with a producer (bit 2); a key (bit 4) never with one.
                if flags & !0b11_1111 != 0 || flags & 0b1100 == 0b1000 || flags & 0b1_0100 == 0b1_0100 {
                    return Err(DecodeError::InvalidValue);
                }
                let stream_seq = if flags & 2 != 0 { Some(var_string(&mut d)?) } else { None };
                let mut producer = if flags & 4 != 0 {
                    Some(AcceptedProducer {
                        id: var_string(&mut d)?,
                        epoch: d.varint()?,
                        seq: d.varint()?,
                        details: None,
                    })
                } else {
                    None
                };
                if let (Some(p), true) = (&mut producer, flags & 8 != 0) {
                    let digest = BodyDigest(d.u64()?);
                    let at_ms = i64::try_from(d.varint()?).map_err(|_| DecodeError::InvalidValue)?;
                    p.details = Some((digest, at_ms));
                }
                let key = if flags & 16 != 0 {
                    let k = u128::from_le_bytes(d.take(16)?.try_into().map_err(|_| DecodeError::Truncated)?);
                    let digest = BodyDigest(d.u64()?);
                    let at_ms = i64::try_from(d.varint()?).map_err(|_| DecodeError::InvalidValue)?;
                    Some((KeyId(k), digest, at_ms))
                } else {
                    None
                };
                let time = if flags & 32 != 0 {
                    Some(i64::try_from(d.varint()?).map_err(|_| DecodeError::InvalidValue)?)
                } else {
                    None
                };
                let data_len = d.varint()?;
                let data_at = at_data(&d);
                d.take(usize::try_from(data_len).map_err(|_| DecodeError::Truncated)?)?;
                Replayed::Append {
                    id,
                    new_tail,
                    close: flags & 1 != 0,
                    stream_seq,
                    producer,
                    key,
                    time,
                    data_at,
                    data_len,
                }
            }
            TAG_SOFT_DELETE => Replayed::SoftDelete { id: d.varint()? },
            TAG_REMOVE => Replayed::Remove { id: d.varint()? },
            TAG_DETACH => Replayed::Detach { id: d.varint()? },
            TAG_TRIM => Replayed::Trim { id: d.varint()?, earliest: d.varint()? },
            TAG_META => {
                let key = var_bytes(&mut d)?.to_vec();
                let value = match d.u8()? {
                    0 => None,
                    1 => Some(var_bytes(&mut d)?.to_vec()),
                    _ => return Err(DecodeError::InvalidValue),
                };
                Replayed::Meta { key, value }
            }
            t => return Err(DecodeError::UnknownTag(t)),
        };
        out.push(rec);
    }
    Ok(out)
}

/// Where one append's bytes lie: the stream offset where they end, and the segment and file
/// position where they start. 16 bytes per append in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    pub end: u64,
    /// Segment number (high 24 bits) and file position (low 40 bits: segments stay below 1 TiB).
    loc: u64,
}

pub const MAX_SEGMENT_NUMBER: u64 = (1 << 24) - 1;
pub const MAX_SEGMENT_BYTES: u64 = 1 << 40;

impl Extent {
    pub fn new(end: u64, segment: u64, pos: u64) -> Self {
        debug_assert!(segment <= MAX_SEGMENT_NUMBER && pos < MAX_SEGMENT_BYTES);
        Extent { end, loc: segment << 40 | pos }
    }
    pub fn segment(&self) -> u64 {
        self.loc >> 40
    }
    pub fn pos(&self) -> u64 {
        self.loc & (MAX_SEGMENT_BYTES - 1)
    }
}

/// One stream in a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointStream {
    /// `None`: detached from its path (a purged source kept for its forks; layout 6).
    pub path: Option<String>,
    pub meta: StreamMeta,
    pub tail: u64,
    /// Where the stream's own data begins (0, or a fork's fork point).
    pub start: u64,
    pub producers: Vec<(String, ProducerState)>,
    pub extents: Vec<Extent>,
    pub keys: Vec<(KeyId, KeyEntry)>,
    pub marks: oncelog_storage::TimeMarks,
}

/// The state as of frame `lsn`; replay continues at `segment`, file position `pos`.
///
/// Layout: `ONCECKP\x05`, crc32c u32 of the body, body length u64, body: lsn, segment, pos,
/// next_id, stream count, then per stream: path (len + bytes; in layout 6, `ONCECKP\x06`, empty
/// for a stream detached from its path, which no create can name), metadata (len +
/// [`stream_meta`] bytes), tail, start, producer count and per producer (id, len +
/// [`ProducerRecord`] bytes), extent count and per extent (end minus the previous end, segment,
/// position), idempotency key count and per key (key id u128 little-endian, len + [`key_entry`]
/// bytes), time marks (len + [`marks`] bytes; length 0 for none); then the metadata entry count and per entry key (len + bytes) and value
/// (len + bytes), in key order. Varints unless noted. The engine-neutral parts are in their
/// shared stored forms (`oncelog_storage::codec`), as PostgreSQL stores them.
///
/// Earlier layouts are still read: `ONCECKP\x04` held each key inline (key id, end, digest u64,
/// time) and the marks inline (count, then per mark the end minus the previous mark's end and
/// the time); `ONCECKP\x03` is 4 without the metadata list, `ONCECKP\x02` (before marks) also
/// without the mark list, `ONCECKP\x01` (before keys) also without the key list.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Checkpoint {
    pub lsn: u64,
    pub segment: u64,
    pub pos: u64,
    pub next_id: u64,
    pub streams: Vec<CheckpointStream>,
    /// The engine metadata map, in key order.
    pub meta: Vec<(Vec<u8>, bytes::Bytes)>,
}

impl Checkpoint {
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Encoder(Vec::with_capacity(64 + self.streams.len() * 64));
        e.varint(self.lsn).varint(self.segment).varint(self.pos).varint(self.next_id).varint(self.streams.len() as u64);
        for s in &self.streams {
            let path = s.path.as_deref().unwrap_or("");
            e.varint(path.len() as u64);
            e.0.extend_from_slice(path.as_bytes());
            let m = stream_meta::encode(&s.meta);
            e.varint(m.len() as u64);
            e.0.extend_from_slice(&m);
            e.varint(s.tail).varint(s.start).varint(s.producers.len() as u64);
            for (id, state) in &s.producers {
                e.varint(id.len() as u64);
                e.0.extend_from_slice(id.as_bytes());
                let p = ProducerRecord::encode_state(state);
                e.varint(p.len() as u64);
                e.0.extend_from_slice(&p);
            }
            e.varint(s.extents.len() as u64);
            let mut prev = s.start;
            for x in &s.extents {
                e.varint(x.end.wrapping_sub(prev)).varint(x.segment()).varint(x.pos());
                prev = x.end;
            }
            e.varint(s.keys.len() as u64);
            for (k, entry) in &s.keys {
                e.0.extend_from_slice(&k.0.to_le_bytes());
                let entry = key_entry::encode(entry);
                e.varint(entry.len() as u64);
                e.0.extend_from_slice(&entry);
            }
            let m = if s.marks.is_empty() { Vec::new() } else { marks::encode(&s.marks) };
            e.varint(m.len() as u64);
            e.0.extend_from_slice(&m);
        }
        e.varint(self.meta.len() as u64);
        for (k, v) in &self.meta {
            e.varint(k.len() as u64);
            e.0.extend_from_slice(k);
            e.varint(v.len() as u64);
            e.0.extend_from_slice(v);
        }
        let body = e.0;
        let mut out = Vec::with_capacity(body.len() + 20);
        let detached = self.streams.iter().any(|s| s.path.is_none());
        out.extend_from_slice(if detached { CHECKPOINT_MAGIC_V6 } else { CHECKPOINT_MAGIC });
        out.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
        out.extend_from_slice(&(body.len() as u64).to_le_bytes());
        out.extend_from_slice(&body);
        out
    }

    /// `now_ms` stands in for the activity time of producer records written before it was kept.
    pub fn decode(bytes: &[u8], now_ms: i64) -> Result<Self, DecodeError> {
        let mut d = Decoder(bytes);
        let (layout, with_keys, with_marks, with_meta) = match d.take(8)? {
            m if m == CHECKPOINT_MAGIC_V6 => (6, true, true, true),
            m if m == CHECKPOINT_MAGIC => (5, true, true, true),
            m if m == CHECKPOINT_MAGIC_V4 => (4, true, true, true),
            m if m == CHECKPOINT_MAGIC_V3 => (3, true, true, false),
            m if m == CHECKPOINT_MAGIC_V2 => (2, true, false, false),
            m if m == CHECKPOINT_MAGIC_V1 => (1, false, false, false),
            _ => return Err(DecodeError::UnknownTag(bytes.first().copied().unwrap_or(0))),
        };
        let crc = d.u32()?;
        let len = usize::try_from(d.u64()?).map_err(|_| DecodeError::Truncated)?;
        let body = d.take(len)?;
        d.finish()?;
        if crc32c::crc32c(body) != crc {
            return Err(DecodeError::InvalidValue);
        }
        let mut d = Decoder(body);
        let mut c = Checkpoint {
            lsn: d.varint()?,
            segment: d.varint()?,
            pos: d.varint()?,
            next_id: d.varint()?,
            streams: Vec::new(),
            meta: Vec::new(),
        };
        let n = d.varint()?;
        for _ in 0..n {
            let path = match var_string(&mut d)? {
                // No create takes an empty path: before layout 6 it is damage.
                p if p.is_empty() && layout < 6 => return Err(DecodeError::InvalidValue),
                p if p.is_empty() => None,
                p => Some(p),
            };
            let meta = stream_meta::decode(var_bytes(&mut d)?)?;
            let tail = d.varint()?;
            let start = d.varint()?;
            let np = d.varint()?;
            let mut producers = Vec::new();
            for _ in 0..np {
                let id = var_string(&mut d)?;
                producers.push((id, ProducerRecord::decode(var_bytes(&mut d)?, now_ms)?.0));
            }
            let nx = d.varint()?;
            let mut extents = Vec::new();
            let mut prev = start;
            for _ in 0..nx {
                let end = prev.wrapping_add(d.varint()?);
                let (segment, pos) = (d.varint()?, d.varint()?);
                if segment > MAX_SEGMENT_NUMBER || pos >= MAX_SEGMENT_BYTES {
                    return Err(DecodeError::InvalidValue);
                }
                extents.push(Extent::new(end, segment, pos));
                prev = end;
            }
            let mut keys = Vec::new();
            if with_keys {
                for _ in 0..d.varint()? {
                    let k = KeyId(u128::from_le_bytes(d.take(16)?.try_into().map_err(|_| DecodeError::Truncated)?));
                    if layout >= 5 {
                        keys.push((k, key_entry::decode(var_bytes(&mut d)?)?));
                        continue;
                    }
                    let end = Offset(d.varint()?);
                    let digest = BodyDigest(d.u64()?);
                    let at_ms = i64::try_from(d.varint()?).map_err(|_| DecodeError::InvalidValue)?;
                    keys.push((k, KeyEntry { end, digest, at_ms }));
                }
            }
            let mut marks = oncelog_storage::TimeMarks::new();
            if layout >= 5 {
                let m = var_bytes(&mut d)?;
                if !m.is_empty() {
                    marks = marks::decode(m)?;
                }
            } else if with_marks {
                let mut prev = 0u64;
                for _ in 0..d.varint()? {
                    let end = prev.wrapping_add(d.varint()?);
                    let at_ms = i64::try_from(d.varint()?).map_err(|_| DecodeError::InvalidValue)?;
                    marks.push(oncelog_storage::TimeMark { end: Offset(end), at_ms });
                    prev = end;
                }
            }
            c.streams.push(CheckpointStream { path, meta, tail, start, producers, extents, keys, marks });
        }
        if with_meta {
            for _ in 0..d.varint()? {
                let k = var_bytes(&mut d)?.to_vec();
                let v = bytes::Bytes::copy_from_slice(var_bytes(&mut d)?);
                c.meta.push((k, v));
            }
        }
        d.finish()?;
        Ok(c)
    }
}

#[cfg(test)]
mod tests;
