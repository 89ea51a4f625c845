//! A response head encoded into one buffer, so that a head and a small body go out in one write;
//! the body's framing decided from the request and what the body knows of its size.

use bytes::{BufMut, BytesMut};
use http::header::{CONNECTION, CONTENT_LENGTH, DATE, TRANSFER_ENCODING};
use http::{HeaderMap, Method, StatusCode, Version};

/// How a response body goes on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFraming {
    /// No body and no length: `1xx`, `204`, `304` (RFC 9110 sections 15.2, 15.3.5, 15.4.5).
    None,
    /// The answer to `HEAD`: no body; the handler's `Content-Length` (what a `GET` would have
    /// carried) passed on as it is.
    Head,
    /// `Content-Length`.
    Length(u64),
    /// `Transfer-Encoding: chunked`: the length is not known in advance (HTTP/1.1).
    Chunked,
    /// Delimited by closing the connection: an unknown length to an HTTP/1.0 client.
    UntilClose,
}

impl BodyFraming {
    /// The framing of a response to a `method` request of `version` with `status`, whose body
    /// has `len` bytes when known.
    pub fn decide(method: &Method, version: Version, status: StatusCode, len: Option<u64>) -> BodyFraming {
        if status.is_informational() || status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED {
            BodyFraming::None
        } else if method == Method::HEAD {
            BodyFraming::Head
        } else {
            match (len, version) {
                (Some(n), _) => BodyFraming::Length(n),
                (None, Version::HTTP_11) => BodyFraming::Chunked,
                (None, _) => BodyFraming::UntilClose,
            }
        }
    }

    /// Whether body bytes are written at all.
    /// Whether a body so framed may be written from outside while it waits ([`crate::park`]):
    /// one whose length is not counted.
    pub fn parks(self) -> bool {
        matches!(self, BodyFraming::Chunked | BodyFraming::UntilClose)
    }

    pub fn has_body(self) -> bool {
        matches!(self, BodyFraming::Length(_) | BodyFraming::Chunked | BodyFraming::UntilClose)
    }
}

/// What a response head needs besides the handler's header fields.
#[derive(Debug, Clone, Copy)]
pub struct ResponseHead<'a> {
    pub status: StatusCode,
    /// The request's version: an HTTP/1.0 client that keeps the connection must be told so.
    pub version: Version,
    pub headers: &'a HeaderMap,
    pub framing: BodyFraming,
    /// Whether the connection stays open after this response (else `Connection: close`).
    pub keep_alive: bool,
}

impl ResponseHead<'_> {
    /// Appends the head to `dst`. The engine owns the framing fields: the handler's
    /// `Content-Length` (kept only on an answer to `HEAD` and on a `304`, where it describes the
    /// body a `GET` would have had; never on a `1xx` or `204`), `Transfer-Encoding` and
    /// `Connection` are replaced by what [`BodyFraming`] and `keep_alive` say. `Date` is added
    /// unless present.
    pub fn encode(&self, date: &[u8], dst: &mut BytesMut) {
        dst.put_slice(b"HTTP/1.1 ");
        dst.put_slice(self.status.as_str().as_bytes());
        dst.put_u8(b' ');
        dst.put_slice(self.status.canonical_reason().unwrap_or("Unknown").as_bytes());
        dst.put_slice(b"\r\n");
        let handler_length = self.framing == BodyFraming::Head
            || (self.framing == BodyFraming::None && self.status == StatusCode::NOT_MODIFIED);
        for (name, value) in self.headers {
            let framing_field = name == TRANSFER_ENCODING || name == CONNECTION || name == CONTENT_LENGTH;
            if framing_field && !(name == CONTENT_LENGTH && handler_length) {
                continue;
            }
            dst.put_slice(name.as_str().as_bytes());
            dst.put_slice(b": ");
            dst.put_slice(value.as_bytes());
            dst.put_slice(b"\r\n");
        }
        match self.framing {
            BodyFraming::Length(n) => {
                dst.put_slice(b"content-length: ");
                dst.put_slice(itoa::Buffer::new().format(n).as_bytes());
                dst.put_slice(b"\r\n");
            }
            BodyFraming::Chunked => dst.put_slice(b"transfer-encoding: chunked\r\n"),
            BodyFraming::None | BodyFraming::Head | BodyFraming::UntilClose => {}
        }
        if !self.keep_alive {
            dst.put_slice(b"connection: close\r\n");
        } else if self.version == Version::HTTP_10 {
            dst.put_slice(b"connection: keep-alive\r\n");
        }
        if !self.headers.contains_key(DATE) {
            dst.put_slice(b"date: ");
            dst.put_slice(date);
            dst.put_slice(b"\r\n");
        }
        dst.put_slice(b"\r\n");
    }
}

/// Appends the line that starts a chunk of `len` bytes (`len` > 0).
pub fn chunk_start(len: usize, dst: &mut BytesMut) {
    let (line, n) = chunk_line(len);
    dst.put_slice(&line[..n]);
}

/// The line that starts a chunk of `len` bytes (lowercase hex, then CRLF) and its length.
pub fn chunk_line(len: usize) -> ([u8; 18], usize) {
    let mut digits = [0u8; 16];
    let mut i = digits.len();
    let mut n = len;
    loop {
        i -= 1;
        digits[i] = b"0123456789abcdef"[n & 0xf];
        n >>= 4;
        if n == 0 {
            break;
        }
    }
    let mut line = [0u8; 18];
    let k = digits.len() - i;
    line[..k].copy_from_slice(&digits[i..]);
    line[k..k + 2].copy_from_slice(b"\r\n");
    (line, k + 2)
}

/// What ends a chunk's data.
pub const CHUNK_END: &[u8] = b"\r\n";
/// The last chunk and an empty trailer section.
pub const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

#[cfg(test)]
mod tests;
