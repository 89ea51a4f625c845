//! Server-Sent Events encoding (protocol section 5.8).

use base64::Engine as _;

use bytes::Bytes;

use crate::Offset;

/// How data events carry the stream's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataEncoding {
    /// `text/*` and `application/json`: the bytes are UTF-8 text, one `data:` line per line.
    Text,
    /// Everything else: standard base64, announced by `stream-sse-data-encoding: base64`.
    Base64,
}

/// Appends one `event: data` event carrying `payload` to `out`.
pub fn data_event(out: &mut Vec<u8>, payload: &[u8], encoding: DataEncoding) {
    for piece in DataEvent::new(Bytes::copy_from_slice(payload), encoding) {
        out.extend_from_slice(&piece);
    }
}

/// Largest piece of an event's payload [`DataEvent`] frames at once (before base64 expansion).
pub const PIECE_BYTES: usize = 24 << 10;

/// One `event: data` event, framed piece by piece: each piece covers at most [`PIECE_BYTES`] of
/// the payload. A server that sends a piece only when the connection took the previous one
/// holds one piece per reader however large the payload, where framing the whole event at once
/// would pin a copy of it (base64 adds a third) for as long as the reader does not read.
///
/// The pieces joined are the event; where they are cut does not change it: text is cut only
/// between characters and never inside a `\r\n`, base64 only at multiples of three bytes.
#[derive(Debug)]
pub struct DataEvent {
    payload: Bytes,
    /// Framed so far.
    pos: usize,
    encoding: DataEncoding,
    /// Written before the payload, on the same `data:` line (the `[` of a JSON array).
    open: &'static [u8],
    /// Written after it (the `]`).
    close: &'static [u8],
    /// The next text line begins a new `data:` line (none is open).
    at_line_start: bool,
    started: bool,
    finished: bool,
    /// [`PIECE_BYTES`]; smaller in tests, so that small payloads are cut too.
    piece_bytes: usize,
}

impl DataEvent {
    pub fn new(payload: Bytes, encoding: DataEncoding) -> DataEvent {
        DataEvent::wrapped(payload, encoding, b"", b"")
    }

    /// An event whose data is `open`, `payload`, `close` (these two must hold no line break).
    pub fn wrapped(payload: Bytes, encoding: DataEncoding, open: &'static [u8], close: &'static [u8]) -> DataEvent {
        DataEvent {
            payload,
            pos: 0,
            encoding,
            open,
            close,
            at_line_start: true,
            started: false,
            finished: false,
            piece_bytes: PIECE_BYTES,
        }
    }

    /// Where the next piece of text may end: at most [`PIECE_BYTES`] on, moved back to the start
    /// of a character and out of a `\r\n` pair.
    fn text_cut(&self) -> usize {
        let p = &self.payload;
        let mut end = (self.pos + self.piece_bytes).min(p.len());
        if end < p.len() {
            // A UTF-8 character has at most three continuation bytes; a longer run is not text.
            let continues = |i: usize| i < p.len() && (p[i] & 0xC0) == 0x80;
            let floor = end.saturating_sub(3).max(self.pos + 1);
            let mut cut = end;
            while cut > floor && continues(cut) {
                cut -= 1;
            }
            if continues(cut) {
                // No room to go back (a tiny piece): go on to the character's end instead.
                cut = end;
                while cut < (end + 3).min(p.len()) && continues(cut) {
                    cut += 1;
                }
            }
            end = cut;
            if end >= p.len() {
                return end;
            }
            if p[end - 1] == b'\r' && p[end] == b'\n' {
                end += 1;
            }
        }
        end
    }

    fn frame_text(&mut self, out: &mut Vec<u8>, piece: &[u8]) {
        // A line break inside the payload becomes a new `data:` line; the client joins them with
        // '\n'. Lone '\r' and "\r\n" are line breaks in SSE too. Bytes that are not UTF-8 are
        // replaced (pieces end between characters, so this matches converting the whole).
        let text = String::from_utf8_lossy(piece);
        let mut rest: &str = &text;
        loop {
            let brk = rest.find(['\r', '\n']);
            let line = &rest[..brk.unwrap_or(rest.len())];
            if self.at_line_start && !(line.is_empty() && brk.is_none()) {
                // `data:` without a space, except before a line that starts with one: SSE parsers
                // strip exactly one leading space, so this keeps such lines intact.
                out.extend_from_slice(if line.starts_with(' ') { b"data: " } else { b"data:" });
                self.at_line_start = false;
            }
            out.extend_from_slice(line.as_bytes());
            let Some(at) = brk else { break };
            out.push(b'\n');
            self.at_line_start = true;
            let skip = if rest[at..].starts_with("\r\n") { 2 } else { 1 };
            rest = &rest[at + skip..];
        }
    }
}

impl DataEvent {
    /// About how many bytes the next piece takes (to size the buffer it is written into: a
    /// small event's piece is small).
    pub fn next_piece_len(&self) -> usize {
        let payload = (self.payload.len() - self.pos).min(self.piece_bytes);
        payload * 4 / 3 + self.open.len() + self.close.len() + 32
    }

    /// Writes the next piece to `out`; false when that was the last (or there is none).
    pub fn next_into(&mut self, out: &mut Vec<u8>) -> bool {
        if self.finished {
            return false;
        }
        if !self.started {
            self.started = true;
            if self.encoding == DataEncoding::Text && self.open.is_empty() {
                // The first line's `data:` depends on how the payload begins.
                out.extend_from_slice(b"event: data\n");
            } else {
                out.extend_from_slice(b"event: data\ndata:");
                out.extend_from_slice(self.open);
                self.at_line_start = false;
            }
        }
        if self.pos < self.payload.len() {
            let end = match self.encoding {
                DataEncoding::Base64 => (self.pos + (self.piece_bytes / 3 * 3).max(3)).min(self.payload.len()),
                DataEncoding::Text => self.text_cut(),
            };
            let piece = self.payload.slice(self.pos..end);
            self.pos = end;
            match self.encoding {
                DataEncoding::Base64 => {
                    let encoded = base64::engine::general_purpose::STANDARD.encode(&piece);
                    out.extend_from_slice(encoded.as_bytes());
                }
                DataEncoding::Text => self.frame_text(out, &piece),
            }
            if self.pos < self.payload.len() {
                return true;
            }
        }
        // The end: the last line (an empty one when the payload is empty or ends in a break).
        if self.at_line_start {
            out.extend_from_slice(b"data:");
        }
        out.extend_from_slice(self.close);
        out.extend_from_slice(b"\n\n");
        self.finished = true;
        false
    }
}

impl Iterator for DataEvent {
    type Item = Bytes;

    fn next(&mut self) -> Option<Bytes> {
        if self.finished {
            return None;
        }
        let mut out = Vec::new();
        self.next_into(&mut out);
        Some(Bytes::from(out))
    }
}

/// The fields of an `event: control` event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Control {
    pub next_offset: Offset,
    /// Present while the stream is open.
    pub cursor: Option<u64>,
    pub up_to_date: bool,
    pub closed: bool,
    /// Why the server ends the response although the stream is open (an Oncelog extension,
    /// `endReason`; clients that do not know it reconnect as after any end). `tokenExpired`: the
    /// reader's credentials expired, and reconnecting needs new ones. `trimmed`: a trim passed
    /// the reader's offset; reconnecting from it answers `410` with the earliest offset.
    pub end_reason: Option<&'static str>,
}

/// Appends one `event: control` event to `out`. It carries `id: <next offset>`: a browser's
/// `EventSource` remembers it and sends it back as `Last-Event-ID` when it reconnects by itself
/// (to the URL it was opened with), so the server resumes where the events stopped instead of
/// replaying from the URL's `offset`.
pub fn control_event(out: &mut Vec<u8>, c: &Control) {
    use std::io::Write as _;
    // Written by hand, not through `serde_json::Value`: every SSE reader gets one per delivery,
    // and building a map, a string per field and the escaping pass showed in the fan-out
    // profile. Nothing here needs escaping: offsets and cursors are digits and `_`, the end
    // reasons are fixed words (checked below). Fields in the order `serde_json`'s map used
    // (sorted), so the bytes are what they were (test `control_matches_the_json_it_replaced`).
    debug_assert!(c.end_reason.is_none_or(|r| r.bytes().all(|b| b.is_ascii_alphanumeric())));
    // `data:` right after `event:`, as clients matching the text (the conformance suite) expect;
    // the order of fields within an event means nothing to SSE parsers.
    out.extend_from_slice(b"event: control\ndata:{");
    if let Some(reason) = c.end_reason {
        let _ = write!(out, "\"endReason\":\"{reason}\",");
    }
    if c.closed {
        out.extend_from_slice(b"\"streamClosed\":true,");
    }
    if let Some(cursor) = c.cursor {
        let _ = write!(out, "\"streamCursor\":\"{cursor}\",");
    }
    let _ = write!(out, "\"streamNextOffset\":\"{}\"", c.next_offset);
    if c.up_to_date || c.closed {
        out.extend_from_slice(b",\"upToDate\":true");
    }
    let _ = write!(out, "}}\nid:{}\n\n", c.next_offset);
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// The whole event framed at once, the plain way: what the pieces must add up to.
    fn reference(payload: &[u8], encoding: DataEncoding, open: &str, close: &str) -> Vec<u8> {
        let mut out = b"event: data\n".to_vec();
        match encoding {
            DataEncoding::Base64 => {
                out.extend_from_slice(b"data:");
                out.extend_from_slice(open.as_bytes());
                out.extend_from_slice(base64::engine::general_purpose::STANDARD.encode(payload).as_bytes());
                out.extend_from_slice(close.as_bytes());
                out.push(b'\n');
            }
            DataEncoding::Text => {
                let text = format!("{open}{}{close}", String::from_utf8_lossy(payload));
                for line in text.replace("\r\n", "\n").replace('\r', "\n").split('\n') {
                    out.extend_from_slice(if line.starts_with(' ') { b"data: " } else { b"data:" });
                    out.extend_from_slice(line.as_bytes());
                    out.push(b'\n');
                }
            }
        }
        out.push(b'\n');
        out
    }

    fn pieces(
        payload: &[u8],
        encoding: DataEncoding,
        open: &'static str,
        close: &'static str,
        piece_bytes: usize,
    ) -> Vec<Bytes> {
        let mut event =
            DataEvent::wrapped(Bytes::copy_from_slice(payload), encoding, open.as_bytes(), close.as_bytes());
        event.piece_bytes = piece_bytes;
        event.collect()
    }

    proptest! {
        #[test]
        fn pieces_add_up_to_the_whole_event(
            // Line breaks, spaces, multi-byte characters and stray bytes, densely.
            payload in proptest::collection::vec(prop_oneof![
                Just(b'\r'), Just(b'\n'), Just(b' '), Just(b'a'), Just(0xC3u8), Just(0xA9u8), Just(0xE2u8), Just(0x82u8), any::<u8>()
            ], 0..200),
            piece_bytes in 1usize..40,
            base64 in any::<bool>(),
            json in any::<bool>(),
        ) {
            let encoding = if base64 { DataEncoding::Base64 } else { DataEncoding::Text };
            let (open, close) = if json { ("[", "]") } else { ("", "") };
            let got = pieces(&payload, encoding, open, close, piece_bytes);
            prop_assert_eq!(got.concat(), reference(&payload, encoding, open, close));
            // No piece covers much more than its share of the payload.
            let bound = piece_bytes * 4 / 3 + 3 + 32 + piece_bytes * 6;
            prop_assert!(got.iter().all(|p| p.len() <= bound));
        }
    }

    #[test]
    fn a_large_payload_is_framed_in_bounded_pieces() {
        let payload = vec![b'x'; 1 << 20];
        for encoding in [DataEncoding::Text, DataEncoding::Base64] {
            let got: Vec<Bytes> = DataEvent::new(Bytes::from(payload.clone()), encoding).collect();
            assert!(got.len() >= (1 << 20) / PIECE_BYTES, "{} pieces", got.len());
            assert!(got.iter().all(|p| p.len() <= PIECE_BYTES * 4 / 3 + 64));
            assert_eq!(got.concat(), reference(&payload, encoding, "", ""));
        }
    }

    #[test]
    fn text_lines_become_data_lines() {
        let mut out = Vec::new();
        data_event(&mut out, b"a\nb\r\nc", DataEncoding::Text);
        assert_eq!(out, b"event: data\ndata:a\ndata:b\ndata:c\n\n");
        let mut out = Vec::new();
        data_event(&mut out, b" x\ry", DataEncoding::Text);
        assert_eq!(out, b"event: data\ndata:  x\ndata:y\n\n");
    }

    #[test]
    fn binary_is_base64() {
        let mut out = Vec::new();
        data_event(&mut out, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], DataEncoding::Base64);
        assert_eq!(out, b"event: data\ndata:AQIDBAUGBwgJCg==\n\n");
    }

    /// The control event as it was built before, through `serde_json`.
    fn control_reference(c: &Control) -> Vec<u8> {
        let mut obj = serde_json::Map::new();
        obj.insert("streamNextOffset".into(), c.next_offset.to_string().into());
        if let Some(cursor) = c.cursor {
            obj.insert("streamCursor".into(), cursor.to_string().into());
        }
        if c.up_to_date || c.closed {
            obj.insert("upToDate".into(), true.into());
        }
        if c.closed {
            obj.insert("streamClosed".into(), true.into());
        }
        if let Some(reason) = c.end_reason {
            obj.insert("endReason".into(), reason.into());
        }
        format!("event: control\ndata:{}\nid:{}\n\n", serde_json::Value::Object(obj), c.next_offset).into_bytes()
    }

    proptest! {
        #[test]
        fn control_matches_the_json_it_replaced(
            next in any::<u64>(),
            cursor in proptest::option::of(any::<u64>()),
            up_to_date in any::<bool>(),
            closed in any::<bool>(),
            reason in proptest::option::of(proptest::sample::select(vec!["trimmed", "tokenExpired"])),
        ) {
            let c = Control { next_offset: Offset(next), cursor, up_to_date, closed, end_reason: reason };
            let mut out = Vec::new();
            control_event(&mut out, &c);
            prop_assert_eq!(String::from_utf8(out).unwrap(), String::from_utf8(control_reference(&c)).unwrap());
        }
    }

    #[test]
    fn control_fields() {
        let mut out = Vec::new();
        control_event(
            &mut out,
            &Control { next_offset: Offset(5), cursor: Some(9), up_to_date: true, closed: false, end_reason: None },
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "event: control\ndata:{\"streamCursor\":\"9\",\"streamNextOffset\":\"0000000000000000_0000000000000005\",\"upToDate\":true}\nid:0000000000000000_0000000000000005\n\n"
        );
        let mut out = Vec::new();
        control_event(
            &mut out,
            &Control { next_offset: Offset(5), cursor: None, up_to_date: false, closed: true, end_reason: None },
        );
        let s = String::from_utf8(out).unwrap();
        assert!(s.contains("\"streamClosed\":true") && s.contains("\"upToDate\":true") && !s.contains("Cursor"));
    }
}
