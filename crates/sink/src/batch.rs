//! What a sink is handed: one read of one stream, cut into messages that each know their offset.
//!
//! A JSON read is `[` + the stored messages + `]` (protocol crate, `json`): every message's text
//! is exactly as stored and takes its length plus one `,` of the offset space, so each message's
//! own offset follows from where the read started, and the read's `Stream-Next-Offset` checks the
//! sum. That is what lets a JSON row be keyed by its message's offset, and a State Protocol row
//! name the offset of the change that set it.

use oncelog_client::{Chunk, StreamOffset};
use oncelog_protocol::state::{self, Change, StateError};
use oncelog_protocol::Offset;
use serde_json::value::RawValue;

use crate::error::SinkError;

/// How a stream is applied: from its metadata (`HEAD`), unless the worker's [`crate::Mode`]
/// says otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamKind {
    /// Created with `Stream-Compaction: state` (every message is a State Protocol message: the
    /// server refuses anything else, and compactions replace history with a snapshot), or any
    /// JSON stream under `--mode state`.
    State,
    /// Any other `application/json` stream: messages.
    Json,
    /// Anything else, or any stream under `--mode chunks`: bytes, cut wherever a read ended.
    Bytes,
}

/// The stream a batch comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamRef {
    /// Its path (the name under the server's stream URL).
    pub path: String,
    pub kind: StreamKind,
}

/// One message of a JSON stream.
#[derive(Debug, Clone, Copy)]
pub struct Message<'a> {
    /// Where the message starts in the stream (a byte position of the stored form).
    pub offset: Offset,
    /// Its JSON text, byte for byte as appended (after the server's validation).
    pub json: &'a RawValue,
}

impl<'a> Message<'a> {
    /// The message as the State Protocol reads it: the parser the server's compaction uses.
    pub fn change(&self) -> Result<Change<'a>, StateError> {
        state::parse(self.json.get().as_bytes())
    }
}

/// One read of one stream: what a sink applies in one transaction.
#[derive(Debug)]
pub enum Batch<'a> {
    /// The messages of a JSON or State Protocol stream, in stream order.
    Messages(Vec<Message<'a>>),
    /// A piece of a byte stream, starting at `offset` (the batch's `next_offset` says where it
    /// ends). Under `--mode chunks`, a JSON stream's read as a reader gets it: a JSON array of
    /// its messages, not as long as its offsets' span.
    Bytes { offset: Offset, data: &'a [u8] },
}

impl Batch<'_> {
    /// Messages or chunks in it (a chunk counts one).
    pub fn len(&self) -> usize {
        match self {
            Batch::Messages(m) => m.len(),
            Batch::Bytes { data, .. } => usize::from(!data.is_empty()),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// An Oncelog offset token as a position; anything else cannot be keyed or compared by bytes.
pub fn offset_of(stream: &str, token: &StreamOffset) -> Result<Offset, SinkError> {
    token.to_oncelog().ok_or_else(|| SinkError::Offsets {
        stream: stream.to_owned(),
        why: "an offset token that is not Oncelog's: the sink works with Oncelog servers only",
    })
}

/// Cuts the read `chunk` of `stream`, which started at `start`, into the batch a sink applies.
pub fn decode<'a>(stream: &StreamRef, start: Offset, chunk: &'a Chunk) -> Result<Batch<'a>, SinkError> {
    let end = offset_of(&stream.path, &chunk.next_offset)?;
    let bad = |why| SinkError::Offsets { stream: stream.path.clone(), why };
    if end < start {
        return Err(bad("a read ended before it started"));
    }
    if stream.kind == StreamKind::Bytes && !chunk.json {
        if (chunk.data.len() as u64) != end.0 - start.0 {
            return Err(bad("a read's bytes do not span its offsets"));
        }
        return Ok(Batch::Bytes { offset: start, data: &chunk.data });
    }
    if chunk.data.is_empty() {
        return if end == start {
            Ok(Batch::Messages(Vec::new()))
        } else {
            Err(bad("an empty JSON read moved the offset"))
        };
    }
    let items: Vec<&RawValue> =
        serde_json::from_slice(&chunk.data).map_err(|_| bad("a JSON read that is not an array of messages"))?;
    let mut at = start.0;
    let mut messages = Vec::with_capacity(items.len());
    for json in items {
        messages.push(Message { offset: Offset(at), json });
        // Stored form: the message's text and one `,`.
        at += json.get().len() as u64 + 1;
    }
    if at != end.0 {
        return Err(bad("a JSON read's messages do not add up to its offsets (not an Oncelog server, or whitespace added on the way)"));
    }
    if stream.kind == StreamKind::Bytes {
        // A JSON stream applied as chunks (`--mode chunks`): the read as a reader gets it, a
        // JSON array, once its messages were checked against its offsets like any JSON read's.
        // Its length is not the offsets' span (no `,` after the last message, the brackets).
        return Ok(Batch::Bytes { offset: start, data: &chunk.data });
    }
    Ok(Batch::Messages(messages))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn chunk(data: &'static [u8], next: u64) -> Chunk {
        Chunk {
            data: Bytes::from_static(data),
            next_offset: Offset(next).into(),
            up_to_date: true,
            closed: false,
            cursor: None,
            json: true,
        }
    }

    fn json_stream() -> StreamRef {
        StreamRef { path: "s".into(), kind: StreamKind::Json }
    }

    #[test]
    fn each_message_gets_the_offset_it_was_stored_at() {
        // Stored: `{"a":1},` (8 bytes) then `[2, 3],` (7 bytes), from offset 100.
        let c = chunk(br#"[{"a":1},[2, 3]]"#, 115);
        let Ok(Batch::Messages(m)) = decode(&json_stream(), Offset(100), &c) else { panic!("messages") };
        assert_eq!(
            m.iter().map(|m| (m.offset.0, m.json.get())).collect::<Vec<_>>(),
            vec![(100, r#"{"a":1}"#), (108, "[2, 3]")]
        );
    }

    #[test]
    fn reads_that_do_not_add_up_are_refused() {
        assert!(matches!(
            decode(&json_stream(), Offset(100), &chunk(br#"[{"a":1}]"#, 120)),
            Err(SinkError::Offsets { .. })
        ));
        assert!(matches!(
            decode(&json_stream(), Offset(100), &chunk(br#"[{"a": 1}]"#, 108)),
            Err(SinkError::Offsets { .. })
        ));
        assert!(matches!(decode(&json_stream(), Offset(100), &chunk(b"", 101)), Err(SinkError::Offsets { .. })));
        let bytes = StreamRef { path: "b".into(), kind: StreamKind::Bytes };
        let raw = |data, next| Chunk { json: false, ..chunk(data, next) };
        assert!(matches!(
            decode(&bytes, Offset(0), &raw(b"abc", 3)),
            Ok(Batch::Bytes { offset: Offset(0), data: b"abc" })
        ));
        assert!(matches!(decode(&bytes, Offset(0), &raw(b"abc", 4)), Err(SinkError::Offsets { .. })));
    }

    #[test]
    fn a_json_read_as_chunks_is_checked_like_messages_and_kept_whole() {
        let bytes = StreamRef { path: "j".into(), kind: StreamKind::Bytes };
        // `{"a":1},` and `[2, 3],` from 100: the read's array whole, its offsets checked.
        let c = chunk(br#"[{"a":1},[2, 3]]"#, 115);
        assert!(matches!(
            decode(&bytes, Offset(100), &c),
            Ok(Batch::Bytes { offset: Offset(100), data: br#"[{"a":1},[2, 3]]"# })
        ));
        assert!(matches!(decode(&bytes, Offset(100), &chunk(br#"[{"a":1}]"#, 120)), Err(SinkError::Offsets { .. })));
    }

    #[test]
    fn state_messages_are_read_by_the_protocol_parser() {
        let c = chunk(br#"[{"type":"u","key":"1","value":{"n":1},"headers":{"operation":"insert"}},{"headers":{"control":"reset"}}]"#, 104);
        let stream = StreamRef { path: "s".into(), kind: StreamKind::State };
        let Ok(Batch::Messages(m)) = decode(&stream, Offset(0), &c) else { panic!("messages") };
        assert!(matches!(m[0].change(), Ok(Change::Set { value: r#"{"n":1}"#, .. })));
        assert_eq!(m[1].change(), Ok(Change::Reset));
    }
}
