//! What an SSE reader and its runtime's fan-out ([`crate::fanout`]) share: the bounded read
//! behind an event, the framing of an event whole, and how often a waiting reader renews its
//! stream's TTL. Below both, so that neither depends on the other for it.

use std::time::Duration;

use bytes::Bytes;
use oncelog_protocol::sse::{self, Control, DataEncoding};
use oncelog_protocol::Offset;
use oncelog_storage::{Engine, ReadChunk, ReadRequest, StreamInfo};

use crate::state::AppState;

/// How often a waiting live reader renews its stream's sliding TTL.
pub const TTL_RENEW_INTERVAL: Duration = Duration::from_secs(1);

/// Most an SSE reader of a byte stream holds of it at once, whatever the size of its appends:
/// the reads behind the events are cut to this size (a JSON stream's reads are whole messages).
/// With the events framed a piece at a time, this bounds what a reader that stops reading pins.
pub const SSE_READ_BYTES: usize = 64 << 10;

/// The next chunk for an SSE response; `seen`: what the wait that woke this reader saw.
pub async fn sse_read<E: Engine>(
    st: &AppState<E>,
    path: &str,
    from: Offset,
    json: bool,
    seen: Option<&StreamInfo>,
    now_ms: i64,
) -> Result<ReadChunk, oncelog_storage::LookupError> {
    let max = if json { st.config.max_read_bytes } else { st.config.max_read_bytes.min(SSE_READ_BYTES) };
    let mut req = ReadRequest::new(path, from, max, now_ms);
    if !json {
        req = req.bounded();
    }
    if let Some(seen) = seen {
        req = req.after(seen);
    }
    st.engine.read(req).await
}

/// The data event of an SSE answer for `chunk` (a JSON stream's messages as one array).
pub fn data_event(chunk: &ReadChunk, encoding: DataEncoding, json: bool) -> sse::DataEvent {
    if json {
        let inner = chunk.data.strip_suffix(b",").map_or(chunk.data.len(), <[u8]>::len);
        sse::DataEvent::wrapped(chunk.data.slice(..inner), encoding, b"[", b"]")
    } else {
        sse::DataEvent::new(chunk.data.clone(), encoding)
    }
}

/// The data event for `chunk` and its control event (with `cursor`), framed whole, when the
/// chunk is one piece of a stream that is not compacted (whose events any reader at the chunk's
/// start may share).
pub fn frame_whole(chunk: &ReadChunk, encoding: DataEncoding, json: bool, cursor: u64) -> Option<Bytes> {
    if chunk.data.len() > sse::PIECE_BYTES || chunk.info.config.compaction {
        return None;
    }
    let (up_to_date, closed) = (chunk.up_to_date(), chunk.info.closed && chunk.up_to_date());
    let mut event = data_event(chunk, encoding, json);
    let mut out = Vec::with_capacity(event.next_piece_len() + 160);
    while event.next_into(&mut out) {}
    let control =
        Control { next_offset: chunk.next, cursor: (!closed).then_some(cursor), up_to_date, closed, end_reason: None };
    sse::control_event(&mut out, &control);
    Some(Bytes::from(out))
}
