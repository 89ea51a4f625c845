//! The chunked request-body decoder (RFC 9112 section 7.1): a state machine over the
//! connection's read buffer, resumable at any split of its input (a test splits every body
//! everywhere). Data comes out as slices of the buffer, never copied.
//!
//! Strict where two parties could disagree on where the body ends: sizes are 1 to 16 hex digits
//! (no sign, no `0x`, whitespace only before an extension or the line end), every line ends with
//! CRLF (a bare LF or CR is refused), a chunk's data is followed by exactly CRLF, and trailer
//! fields may not be folded. Extensions and trailer fields are read and dropped, each within a
//! bound.

use bytes::{Buf, Bytes, BytesMut};

/// Most hex digits of a chunk size (16: any `u64`).
pub const MAX_SIZE_DIGITS: u8 = 16;
/// Most bytes of one chunk line's extensions.
pub const MAX_EXTENSION_BYTES: usize = 4 << 10;
/// Most bytes of the trailer section.
pub const MAX_TRAILER_BYTES: usize = 16 << 10;

/// Why a chunked body is refused (`400`; the connection is closed after the answer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ChunkedError {
    #[error("a chunk size is not a hexadecimal number")]
    BadSize,
    #[error("a chunk size has more than {MAX_SIZE_DIGITS} digits")]
    SizeTooLong,
    #[error("a chunk extension is malformed")]
    BadExtension,
    #[error("chunk extensions longer than {MAX_EXTENSION_BYTES} bytes")]
    ExtensionTooLong,
    #[error("a line of the chunked body does not end with CRLF")]
    BadLineEnd,
    #[error("a chunk's data is not followed by CRLF")]
    MissingCrlf,
    #[error("a trailer field is malformed")]
    BadTrailer,
    #[error("trailer fields longer than {MAX_TRAILER_BYTES} bytes")]
    TrailersTooLarge,
}

/// What one call of [`ChunkedDecoder::decode`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Chunk {
    /// Body bytes (split off the buffer).
    Data(Bytes),
    /// The buffer holds no more of the body: read more.
    NeedMore,
    /// The body ended (its last chunk and trailers consumed); what follows in the buffer is the
    /// next request.
    End,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// In a chunk size's digits.
    Size {
        value: u64,
        digits: u8,
    },
    /// Whitespace after the size: an extension or the line end must follow.
    SizeSpace {
        value: u64,
    },
    /// In a chunk's extensions, up to the line end.
    Extension {
        value: u64,
        len: usize,
    },
    /// The size line's CR seen.
    SizeLf {
        value: u64,
    },
    Data {
        remaining: u64,
    },
    DataCr,
    DataLf,
    /// At the start of a trailer line (or of the final empty line).
    TrailerStart {
        total: usize,
    },
    TrailerField {
        total: usize,
    },
    TrailerLf {
        total: usize,
    },
    /// The final empty line's CR seen.
    EndLf,
    Done,
}

/// See the module docs.
#[derive(Debug, Clone)]
pub struct ChunkedDecoder {
    state: State,
}

impl Default for ChunkedDecoder {
    fn default() -> Self {
        ChunkedDecoder { state: State::Size { value: 0, digits: 0 } }
    }
}

fn is_space(b: u8) -> bool {
    b == b' ' || b == b'\t'
}

/// A byte a field line or an extension may not hold (controls other than HTAB, and DEL).
fn is_control(b: u8) -> bool {
    (b < 0x20 && b != b'\t') || b == 0x7f
}

impl ChunkedDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether the body's end was reached.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Consumes framing from the start of `buf` and returns the next piece of body data, or
    /// what else stopped it (see [`Chunk`]).
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Chunk, ChunkedError> {
        let mut used = 0;
        let result = loop {
            if let State::Data { remaining } = self.state {
                buf.advance(used);
                used = 0;
                if buf.is_empty() {
                    break Ok(Chunk::NeedMore);
                }
                let n = usize::try_from(remaining).map_or(buf.len(), |r| r.min(buf.len()));
                let remaining = remaining - n as u64;
                self.state = if remaining == 0 { State::DataCr } else { State::Data { remaining } };
                break Ok(Chunk::Data(buf.split_to(n).freeze()));
            }
            if self.state == State::Done {
                break Ok(Chunk::End);
            }
            let Some(&b) = buf.get(used) else { break Ok(Chunk::NeedMore) };
            used += 1;
            if let Err(e) = self.step(b) {
                break Err(e);
            }
        };
        buf.advance(used.min(buf.len()));
        result
    }

    /// One framing byte.
    fn step(&mut self, b: u8) -> Result<(), ChunkedError> {
        self.state = match self.state {
            State::Size { value, digits } => match (b as char).to_digit(16) {
                Some(d) if digits < MAX_SIZE_DIGITS => {
                    State::Size { value: value << 4 | u64::from(d), digits: digits + 1 }
                }
                Some(_) => return Err(ChunkedError::SizeTooLong),
                None if digits == 0 => return Err(ChunkedError::BadSize),
                None => after_size(value, b)?,
            },
            State::SizeSpace { value } => match b {
                b if is_space(b) => State::SizeSpace { value },
                _ => after_size(value, b)?,
            },
            State::Extension { value, len } => match b {
                b'\r' => State::SizeLf { value },
                b if is_control(b) => return Err(ChunkedError::BadExtension),
                _ if len >= MAX_EXTENSION_BYTES => return Err(ChunkedError::ExtensionTooLong),
                _ => State::Extension { value, len: len + 1 },
            },
            State::SizeLf { value } => match b {
                b'\n' if value == 0 => State::TrailerStart { total: 0 },
                b'\n' => State::Data { remaining: value },
                _ => return Err(ChunkedError::BadLineEnd),
            },
            State::DataCr => match b {
                b'\r' => State::DataLf,
                _ => return Err(ChunkedError::MissingCrlf),
            },
            State::DataLf => match b {
                b'\n' => State::Size { value: 0, digits: 0 },
                _ => return Err(ChunkedError::MissingCrlf),
            },
            State::TrailerStart { total } => match b {
                b'\r' => State::EndLf,
                // A folded line (obs-fold) or a field starting with a control.
                b if is_space(b) || is_control(b) => return Err(ChunkedError::BadTrailer),
                _ => State::TrailerField { total: trailer_byte(total)? },
            },
            State::TrailerField { total } => match b {
                b'\r' => State::TrailerLf { total },
                b if is_control(b) => return Err(ChunkedError::BadTrailer),
                _ => State::TrailerField { total: trailer_byte(total)? },
            },
            State::TrailerLf { total } => match b {
                b'\n' => State::TrailerStart { total: trailer_byte(total)? },
                _ => return Err(ChunkedError::BadLineEnd),
            },
            State::EndLf => match b {
                b'\n' => State::Done,
                _ => return Err(ChunkedError::BadLineEnd),
            },
            // `decode` never steps in these states.
            State::Data { .. } | State::Done => self.state,
        };
        Ok(())
    }
}

/// The byte after a chunk size's digits (or the whitespace after them).
fn after_size(value: u64, b: u8) -> Result<State, ChunkedError> {
    match b {
        b if is_space(b) => Ok(State::SizeSpace { value }),
        b';' => Ok(State::Extension { value, len: 0 }),
        b'\r' => Ok(State::SizeLf { value }),
        b'\n' => Err(ChunkedError::BadLineEnd),
        _ => Err(ChunkedError::BadSize),
    }
}

fn trailer_byte(total: usize) -> Result<usize, ChunkedError> {
    if total >= MAX_TRAILER_BYTES {
        return Err(ChunkedError::TrailersTooLarge);
    }
    Ok(total + 1)
}

#[cfg(test)]
mod tests;
