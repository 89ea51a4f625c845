//! An incremental Server-Sent Events parser (the event-stream format of the HTML standard, as
//! protocol section 5.8 uses it), and the control-event payload.
//!
//! The protocol crate encodes SSE on the server side; parsing belongs to clients, so it lives
//! here. Bytes arrive in arbitrary pieces; [`SseParser::push`] buffers them and
//! [`SseParser::next_event`] yields complete events. Lines end in `\n`, `\r\n` or `\r`; a field
//! value loses exactly one leading space; comment lines (`:`) and `id`/`retry` fields are
//! ignored; `data` lines of one event are joined with `\n`.
//!
//! One deliberate departure: an event with a `data` line whose text is empty is still
//! dispatched (the standard drops it), so that an empty `control` event is reported as the
//! protocol error it is instead of vanishing.

use bytes::{Buf, BytesMut};
use serde::Deserialize;

use crate::error::Error;

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field; `message` when absent.
    pub event: String,
    /// The `data:` lines joined with `\n`.
    pub data: String,
}

/// The incremental parser.
#[derive(Debug, Default)]
pub struct SseParser {
    /// Bytes received but not yet split into lines.
    buf: BytesMut,
    /// The current event's type, if an `event:` line was seen.
    event: Option<String>,
    /// The current event's data lines, joined so far.
    data: String,
    /// Whether the current event has any `data:` line (even an empty one).
    saw_data: bool,
}

impl SseParser {
    /// Adds received bytes.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next complete event, if the buffered bytes hold one. A line that is not UTF-8 is an
    /// error.
    pub fn next_event(&mut self) -> Result<Option<SseEvent>, Error> {
        while let Some(line) = self.take_line() {
            let line = String::from_utf8(line).map_err(|_| Error::InvalidResponse("SSE line is not UTF-8".into()))?;
            if line.is_empty() {
                if let Some(ev) = self.dispatch() {
                    return Ok(Some(ev));
                }
                continue;
            }
            if line.starts_with(':') {
                continue;
            }
            let (field, value) = match line.split_once(':') {
                Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
                None => (line.as_str(), ""),
            };
            match field {
                "event" => self.event = Some(value.to_owned()),
                "data" => {
                    if self.saw_data {
                        self.data.push('\n');
                    }
                    self.data.push_str(value);
                    self.saw_data = true;
                }
                _ => {}
            }
        }
        Ok(None)
    }

    /// Whether bytes of an unfinished event are buffered (the connection ended mid-event).
    pub fn has_partial_event(&self) -> bool {
        !self.buf.is_empty() || self.saw_data || self.event.is_some()
    }

    fn dispatch(&mut self) -> Option<SseEvent> {
        let event = self.event.take();
        let saw_data = std::mem::take(&mut self.saw_data);
        let data = std::mem::take(&mut self.data);
        if !saw_data && event.is_none() {
            return None;
        }
        Some(SseEvent { event: event.filter(|e| !e.is_empty()).unwrap_or_else(|| "message".into()), data })
    }

    /// The next line without its terminator, if a whole one is buffered. A trailing `\r` waits
    /// for the next byte, which may be the `\n` of a `\r\n`.
    fn take_line(&mut self) -> Option<Vec<u8>> {
        let pos = self.buf.iter().position(|&b| b == b'\n' || b == b'\r')?;
        let terminator_len = match (self.buf[pos], self.buf.get(pos + 1)) {
            (b'\r', Some(b'\n')) => 2,
            (b'\r', None) => return None,
            _ => 1,
        };
        let line = self.buf.split_to(pos).to_vec();
        self.buf.advance(terminator_len);
        Some(line)
    }
}

/// The JSON of an `event: control`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ControlEvent {
    /// Where to resume: the offset after everything sent so far.
    pub stream_next_offset: String,
    /// The cursor to echo on reconnection (absent once closed).
    #[serde(default)]
    pub stream_cursor: Option<String>,
    /// Caught up with the tail.
    #[serde(default)]
    pub up_to_date: bool,
    /// The stream is closed and everything was sent: EOF.
    #[serde(default)]
    pub stream_closed: bool,
}

impl ControlEvent {
    /// Parses a control event's data; anything but an object with a non-empty
    /// `streamNextOffset` is a protocol error.
    pub fn parse(data: &str) -> Result<ControlEvent, Error> {
        let c: ControlEvent = serde_json::from_str(data)
            .map_err(|e| Error::InvalidResponse(format!("SSE control event is not valid JSON ({e}): {data:?}")))?;
        if c.stream_next_offset.is_empty() {
            return Err(Error::InvalidResponse("SSE control event has an empty streamNextOffset".into()));
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(p: &mut SseParser) -> Vec<SseEvent> {
        let mut out = Vec::new();
        while let Some(e) = p.next_event().expect("parse") {
            out.push(e);
        }
        out
    }

    #[test]
    fn parses_events_split_anywhere() {
        let text = b"event: data\ndata:[\ndata: {\"k\":1}\ndata:]\n\n: comment\nevent: control\r\ndata: {\"streamNextOffset\":\"5\"}\r\n\r\n";
        for split in 0..text.len() {
            let mut p = SseParser::default();
            p.push(&text[..split]);
            let mut got = all(&mut p);
            p.push(&text[split..]);
            got.extend(all(&mut p));
            assert_eq!(got.len(), 2, "split at {split}");
            assert_eq!(got[0], SseEvent { event: "data".into(), data: "[\n{\"k\":1}\n]".into() });
            assert_eq!(got[1].event, "control");
            assert_eq!(ControlEvent::parse(&got[1].data).expect("control").stream_next_offset, "5");
        }
    }

    #[test]
    fn one_leading_space_is_stripped_and_cr_alone_ends_lines() {
        let mut p = SseParser::default();
        p.push(b"event:data\rdata:  two spaces\r\rdata\n\n");
        let got = all(&mut p);
        assert_eq!(got[0].data, " two spaces");
        assert_eq!(got[1], SseEvent { event: "message".into(), data: String::new() });
    }

    #[test]
    fn empty_control_data_is_dispatched_and_refused() {
        let mut p = SseParser::default();
        p.push(b"event: control\ndata:\n\n");
        let got = all(&mut p);
        assert_eq!(got.len(), 1);
        assert!(ControlEvent::parse(&got[0].data).is_err());
        assert!(ControlEvent::parse("{invalid").is_err());
        assert!(ControlEvent::parse(r#"{"streamNextOffset":""}"#).is_err());
        let c = ControlEvent::parse(r#"{"streamNextOffset":"7","streamCursor":"3","upToDate":true}"#).expect("ok");
        assert_eq!((c.stream_cursor.as_deref(), c.up_to_date, c.stream_closed), (Some("3"), true, false));
    }

    #[test]
    fn partial_events_are_visible() {
        let mut p = SseParser::default();
        p.push(b"event: data\ndata: x\n");
        assert!(all(&mut p).is_empty());
        assert!(p.has_partial_event());
    }

    /// The server's encoder (protocol crate) and this parser must agree on every payload: text
    /// with any line breaks or leading spaces, and binary as base64.
    mod against_the_encoder {
        use super::*;
        use base64::Engine as _;
        use oncelog_protocol::sse::{control_event, data_event, Control, DataEncoding};
        use oncelog_protocol::Offset;
        use proptest::prelude::*;

        proptest! {
            #[test]
            fn text_payloads_round_trip(text in "[ a-z\r\n\u{e9}]{0,40}", next in 0u64..1 << 40) {
                let mut wire = Vec::new();
                data_event(&mut wire, text.as_bytes(), DataEncoding::Text);
                control_event(&mut wire, &Control { next_offset: Offset(next), cursor: Some(9), up_to_date: true, closed: false, end_reason: None });
                let mut p = SseParser::default();
                p.push(&wire);
                let got = all(&mut p);
                prop_assert_eq!(got.len(), 2);
                // SSE has no way to carry a lone CR: it arrives as a line break.
                let expected = text.replace("\r\n", "\n").replace('\r', "\n");
                prop_assert_eq!(&got[0].data, &expected);
                let c = ControlEvent::parse(&got[1].data).expect("control");
                prop_assert_eq!(c.stream_next_offset, Offset(next).to_string());
            }

            #[test]
            fn binary_payloads_round_trip(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
                let mut wire = Vec::new();
                data_event(&mut wire, &bytes, DataEncoding::Base64);
                let mut p = SseParser::default();
                p.push(&wire);
                let got = all(&mut p);
                prop_assert_eq!(got.len(), 1);
                let decoded = base64::engine::general_purpose::STANDARD.decode(got[0].data.replace('\n', "")).expect("base64");
                prop_assert_eq!(decoded, bytes);
            }
        }
    }
}
