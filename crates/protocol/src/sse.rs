//! Server-Sent Events encoding (protocol section 5.8).

use base64::Engine as _;

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
    out.extend_from_slice(b"event: data\n");
    match encoding {
        DataEncoding::Base64 => {
            out.extend_from_slice(b"data:");
            out.extend_from_slice(base64::engine::general_purpose::STANDARD.encode(payload).as_bytes());
            out.push(b'\n');
        }
        DataEncoding::Text => {
            // A line break inside the payload becomes a new `data:` line; the client joins them
            // with '\n'. Lone '\r' and "\r\n" are line breaks in SSE too.
            let text = String::from_utf8_lossy(payload);
            let normalized = text.replace("\r\n", "\n").replace('\r', "\n");
            for line in normalized.split('\n') {
                // `data:` without a space, except before a line that starts with one: SSE parsers
                // strip exactly one leading space, so this keeps such lines intact.
                out.extend_from_slice(if line.starts_with(' ') { b"data: " } else { b"data:" });
                out.extend_from_slice(line.as_bytes());
                out.push(b'\n');
            }
        }
    }
    out.push(b'\n');
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
    /// reader's credentials expired, and reconnecting needs new ones.
    pub end_reason: Option<&'static str>,
}

/// Appends one `event: control` event to `out`.
pub fn control_event(out: &mut Vec<u8>, c: &Control) {
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
    out.extend_from_slice(b"event: control\ndata:");
    out.extend_from_slice(serde_json::Value::Object(obj).to_string().as_bytes());
    out.extend_from_slice(b"\n\n");
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn control_fields() {
        let mut out = Vec::new();
        control_event(&mut out, &Control { next_offset: Offset(5), cursor: Some(9), up_to_date: true, closed: false, end_reason: None });
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "event: control\ndata:{\"streamCursor\":\"9\",\"streamNextOffset\":\"0000000000000000_0000000000000005\",\"upToDate\":true}\n\n"
        );
        let mut out = Vec::new();
        control_event(&mut out, &Control { next_offset: Offset(5), cursor: None, up_to_date: false, closed: true, end_reason: None });
        let s = String::from_utf8(out).unwrap();
        assert!(s.contains("\"streamClosed\":true") && s.contains("\"upToDate\":true") && !s.contains("Cursor"));
    }
}
