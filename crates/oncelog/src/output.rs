//! How `read` and `tail` print what they read: each message's bytes exactly as the server stored
//! them, never parsed into values and serialised again (that would sort keys, round big numbers
//! and rewrite `2.50` as `2.5`: a log must hand back the bytes it was given).
//!
//! - JSON streams: a read is `[` + the stored messages joined by `,` + `]` (protocol crate,
//!   `json`). It is cut into the raw text of each element ([`RawValue`]), printed one per line.
//! - Byte streams: the bytes as they come.
//! - `--offsets`: each record is preceded by its offset and a tab. A JSON record is a message; a
//!   byte stream's record is a line (cut after each `\n`, newline kept), since reads do not show
//!   where one append ended and the next began. A record's offset follows from the chunk's
//!   `Stream-Next-Offset` minus the stored bytes before it (a JSON message takes its length
//!   plus one `,` of the offset space), so only Oncelog's offset tokens can be used.

use std::io::Write;

use oncelog_client::{Chunk, StreamOffset};
use oncelog_protocol::Offset;
use serde_json::value::RawValue;

/// Why a read could not be printed.
#[derive(Debug, thiserror::Error)]
pub enum PrintError {
    /// Writing stdout failed (a reader piped into `head` that is done: not an error).
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    /// A read's answer cannot be cut into messages (or, with `--offsets`, into offsets).
    #[error("the server's answer cannot be printed: {0}")]
    BadRead(&'static str),
}

/// Prints chunks as they arrive; keeps the start of a line a chunk cut in two (`--offsets` on a
/// byte stream), so that each line is printed once, with the offset where it starts.
#[derive(Default)]
pub struct Printer {
    /// Whether records carry their offset.
    offsets: bool,
    /// The unfinished line of a byte stream: where it starts, and its bytes so far.
    partial: Option<(Offset, Vec<u8>)>,
}

impl Printer {
    pub fn new(offsets: bool) -> Printer {
        Printer { offsets, partial: None }
    }

    /// Prints one chunk and flushes, so a live tail shows data as it arrives.
    pub fn chunk(&mut self, out: &mut impl Write, chunk: &Chunk) -> Result<(), PrintError> {
        match (chunk.json, self.offsets) {
            (true, false) => {
                for m in messages(&chunk.data)? {
                    out.write_all(m.get().as_bytes())?;
                    out.write_all(b"\n")?;
                }
            }
            (true, true) => {
                let items = messages(&chunk.data)?;
                // Stored form: each message's text and one `,`.
                let stored: u64 = items.iter().map(|m| m.get().len() as u64 + 1).sum();
                let mut at = start_of(chunk, stored)?;
                for m in items {
                    write!(out, "{at}\t")?;
                    out.write_all(m.get().as_bytes())?;
                    out.write_all(b"\n")?;
                    at = Offset(at.0 + m.get().len() as u64 + 1);
                }
            }
            (false, false) => out.write_all(&chunk.data)?,
            (false, true) => self.lines(out, chunk)?,
        }
        out.flush()?;
        Ok(())
    }

    /// Prints a byte stream's line that never got its newline (the read ended inside it), with
    /// a newline added so that the output stays one record per line.
    pub fn finish(&mut self, out: &mut impl Write) -> Result<(), PrintError> {
        if let Some((at, bytes)) = self.partial.take() {
            write!(out, "{at}\t")?;
            out.write_all(&bytes)?;
            out.write_all(b"\n")?;
            out.flush()?;
        }
        Ok(())
    }

    /// `--offsets` on a byte stream: one record per line.
    fn lines(&mut self, out: &mut impl Write, chunk: &Chunk) -> Result<(), PrintError> {
        let start = start_of(chunk, chunk.data.len() as u64)?;
        // A jump (the reader restarted after a trim) ends the unfinished line where it was.
        if self.partial.as_ref().is_some_and(|(at, bytes)| at.0 + bytes.len() as u64 != start.0) {
            self.finish(out)?;
        }
        let mut at = start;
        let mut rest = &chunk.data[..];
        while !rest.is_empty() {
            let (line, tail, complete) = match rest.iter().position(|&b| b == b'\n') {
                Some(i) => (&rest[..=i], &rest[i + 1..], true),
                None => (rest, &[][..], false),
            };
            let (line_at, mut bytes) = self.partial.take().unwrap_or((at, Vec::new()));
            bytes.extend_from_slice(line);
            if complete {
                write!(out, "{line_at}\t")?;
                out.write_all(&bytes)?;
            } else {
                self.partial = Some((line_at, bytes));
            }
            at = Offset(at.0 + line.len() as u64);
            rest = tail;
        }
        Ok(())
    }
}

/// The raw text of each message of a JSON read (none in an empty chunk).
fn messages(data: &[u8]) -> Result<Vec<&RawValue>, PrintError> {
    if data.is_empty() {
        return Ok(Vec::new());
    }
    serde_json::from_slice(data).map_err(|_| PrintError::BadRead("a JSON read that is not an array of messages"))
}

/// Where `chunk` starts: its next offset minus the `stored` bytes it carries.
fn start_of(chunk: &Chunk, stored: u64) -> Result<Offset, PrintError> {
    let end = to_position(&chunk.next_offset)?;
    end.0.checked_sub(stored).map(Offset).ok_or(PrintError::BadRead("a read carries more bytes than its offsets span"))
}

fn to_position(token: &StreamOffset) -> Result<Offset, PrintError> {
    token.to_oncelog().ok_or(PrintError::BadRead("--offsets needs Oncelog's offset tokens"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn chunk(data: &'static [u8], next: u64, json: bool) -> Chunk {
        Chunk {
            data: Bytes::from_static(data),
            next_offset: Offset(next).into(),
            up_to_date: true,
            closed: false,
            cursor: None,
            json,
        }
    }

    fn print(offsets: bool, chunks: &[Chunk]) -> String {
        let mut p = Printer::new(offsets);
        let mut out = Vec::new();
        for c in chunks {
            p.chunk(&mut out, c).expect("printed");
        }
        p.finish(&mut out).expect("finished");
        String::from_utf8(out).expect("utf-8")
    }

    #[test]
    fn json_messages_are_printed_as_stored_with_their_offsets() {
        // Stored from offset 100: `{"z":1, "a":2.50},` (18 bytes), then `7,` (2 bytes).
        let c = chunk(br#"[{"z":1, "a":2.50},7]"#, 120, true);
        assert_eq!(print(false, std::slice::from_ref(&c)), "{\"z\":1, \"a\":2.50}\n7\n");
        let o = |n: u64| Offset(n).to_string();
        assert_eq!(print(true, &[c]), format!("{}\t{{\"z\":1, \"a\":2.50}}\n{}\t7\n", o(100), o(118)));
    }

    #[test]
    fn byte_lines_cut_across_chunks_are_printed_once_from_where_they_start() {
        let o = |n: u64| Offset(n).to_string();
        let chunks = [chunk(b"ab\ncd", 5, false), chunk(b"e\nf", 8, false)];
        assert_eq!(print(true, &chunks), format!("{}\tab\n{}\tcde\n{}\tf\n", o(0), o(3), o(7)));
        assert_eq!(print(false, &chunks), "ab\ncde\nf");
    }

    #[test]
    fn offsets_that_do_not_add_up_are_refused() {
        assert!(matches!(
            Printer::new(true).chunk(&mut Vec::new(), &chunk(b"[1,2]", 3, true)),
            Err(PrintError::BadRead(_))
        ));
        let foreign = Chunk { next_offset: StreamOffset::new("abc"), ..chunk(b"x", 1, false) };
        assert!(matches!(Printer::new(true).chunk(&mut Vec::new(), &foreign), Err(PrintError::BadRead(_))));
    }
}
