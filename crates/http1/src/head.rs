//! A request head: parsed from the connection's read buffer, its body's framing decided.
//!
//! `httparse` tokenizes the request line and the header fields (and already refuses obs-fold,
//! whitespace before a colon, control characters and non-token methods in a request); the rules
//! on top are ours, and each refusal is a variant of [`HeadError`]. A request whose framing two
//! parties could read differently is refused, never guessed at (RFC 9112 section 6.3, and the
//! request-smuggling cases behind it):
//!
//! - a line that ends with a bare LF (a proxy that splits lines only at CRLF sees other fields);
//! - `Content-Length` with `Transfer-Encoding`, or two `Content-Length` fields (even equal ones);
//! - a `Content-Length` that is not 1 to 19 digits (no sign, no list, no spaces inside);
//! - `Transfer-Encoding` on an HTTP/1.0 request; a coding list in which `chunked` is missing, not
//!   last or repeated; any coding besides `chunked` (not implemented: 501).
//!
//! The `Host` rules (exactly one on HTTP/1.1, a numeric port) are the server's
//! (`oncelog-server`'s `request.rs`), so that every front end applies the same ones.
//!
//! The header fields are not copied: the head's bytes are split off the read buffer once and
//! every value (and the target) is a slice of them, as hyper does.

use bytes::{Bytes, BytesMut};
use http::header::{CONNECTION, CONTENT_LENGTH, EXPECT, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri, Version};

/// Most header fields a request may carry (hyper's default; the server's limit of today).
pub const MAX_HEADERS: usize = 100;

/// Limits on a request head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadLimits {
    /// Most header fields (at most [`MAX_HEADERS`]).
    pub max_headers: usize,
    /// Most bytes of a head, request line and blank line included.
    pub max_head_bytes: usize,
}

impl Default for HeadLimits {
    fn default() -> Self {
        HeadLimits { max_headers: MAX_HEADERS, max_head_bytes: 64 << 10 }
    }
}

/// How a request's body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body (neither `Content-Length` nor `Transfer-Encoding`).
    None,
    /// Exactly this many bytes.
    Length(u64),
    /// `Transfer-Encoding: chunked` ([`crate::chunked`]).
    Chunked,
}

/// A parsed request head.
#[derive(Debug)]
pub struct Head {
    pub method: Method,
    pub uri: Uri,
    pub version: Version,
    pub headers: HeaderMap,
    pub framing: Framing,
    /// Whether the client lets the connection carry another request after this one.
    pub keep_alive: bool,
    /// `Expect: 100-continue` on an HTTP/1.1 request with a body: the client waits for an
    /// interim answer before sending it.
    pub expect_continue: bool,
}

/// Why a request head is refused. The connection is closed after the answer: its framing can no
/// longer be trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HeadError {
    #[error("request head larger than {limit} bytes")]
    TooLarge { limit: usize },
    #[error("more than {limit} header fields")]
    TooManyHeaders { limit: usize },
    #[error("a line of the request head ends with a bare LF; lines end with CRLF")]
    BareLf,
    #[error("malformed request line")]
    RequestLine,
    #[error("unsupported HTTP version; this server speaks HTTP/1.0 and HTTP/1.1")]
    Version,
    #[error("malformed header field")]
    HeaderField,
    #[error("invalid request target")]
    Target,
    #[error("Content-Length and Transfer-Encoding together")]
    LengthAndEncoding,
    #[error("more than one Content-Length field")]
    TwoLengths,
    #[error("Content-Length is not a decimal number")]
    BadLength,
    #[error("Transfer-Encoding on an HTTP/1.0 request")]
    EncodingOnHttp10,
    #[error("Transfer-Encoding must end with chunked, once")]
    BadChunked,
    #[error("only the chunked transfer coding is supported")]
    UnsupportedCoding,
}

impl HeadError {
    /// The status the refusal is answered with.
    pub fn status(self) -> StatusCode {
        match self {
            HeadError::TooLarge { .. } | HeadError::TooManyHeaders { .. } => {
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
            }
            HeadError::Version => StatusCode::HTTP_VERSION_NOT_SUPPORTED,
            HeadError::UnsupportedCoding => StatusCode::NOT_IMPLEMENTED,
            _ => StatusCode::BAD_REQUEST,
        }
    }
}

/// Where each piece of the head lies in its bytes (`httparse` borrows the read buffer; the head
/// is split off it afterwards and the pieces sliced from that, without copies).
#[derive(Clone, Copy, Default)]
struct Span {
    start: usize,
    end: usize,
}

impl Span {
    fn of(base: &[u8], part: &[u8]) -> Span {
        let start = part.as_ptr() as usize - base.as_ptr() as usize;
        Span { start, end: start + part.len() }
    }
}

/// Parses the head at the start of `buf`. `Ok(None)`: incomplete, read more (the bytes so far are
/// within the limits). `Ok(Some(head))`: the head was split off `buf`, which now starts with the
/// body (or the next request).
pub fn parse(buf: &mut BytesMut, limits: &HeadLimits) -> Result<Option<Head>, HeadError> {
    let max_headers = limits.max_headers.min(MAX_HEADERS);
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut spans = [(Span::default(), Span::default()); MAX_HEADERS];
    let (len, method, target, minor, count) = {
        let mut req = httparse::Request::new(&mut fields[..max_headers]);
        let len = match req.parse(buf) {
            Ok(httparse::Status::Complete(len)) => len,
            Ok(httparse::Status::Partial) => {
                if buf.len() > limits.max_head_bytes {
                    return Err(HeadError::TooLarge { limit: limits.max_head_bytes });
                }
                if has_bare_lf(buf) {
                    return Err(HeadError::BareLf);
                }
                return Ok(None);
            }
            Err(e) => return Err(refusal(e, max_headers, has_bare_lf(buf))),
        };
        if len > limits.max_head_bytes {
            return Err(HeadError::TooLarge { limit: limits.max_head_bytes });
        }
        if has_bare_lf(&buf[..len]) {
            return Err(HeadError::BareLf);
        }
        let (Some(method), Some(path), Some(minor)) = (req.method, req.path, req.version) else {
            return Err(HeadError::RequestLine);
        };
        let count = req.headers.len();
        for (span, field) in spans.iter_mut().zip(req.headers.iter()) {
            *span = (Span::of(buf, field.name.as_bytes()), Span::of(buf, field.value));
        }
        (len, Span::of(buf, method.as_bytes()), Span::of(buf, path.as_bytes()), minor, count)
    };
    let bytes = buf.split_to(len).freeze();
    let method = Method::from_bytes(&bytes[method.start..method.end]).map_err(|_| HeadError::RequestLine)?;
    let uri = Uri::from_maybe_shared(bytes.slice(target.start..target.end)).map_err(|_| HeadError::Target)?;
    let version = if minor == 0 { Version::HTTP_10 } else { Version::HTTP_11 };
    let mut headers = HeaderMap::with_capacity(count);
    for (name, value) in &spans[..count] {
        let name = HeaderName::from_bytes(&bytes[name.start..name.end]).map_err(|_| HeadError::HeaderField)?;
        let value = value_of(&bytes, *value)?;
        headers.append(name, value);
    }
    let framing = framing(&headers, version)?;
    let (close, keep_alive_token) = connection_tokens(&headers);
    let keep_alive = match version {
        Version::HTTP_11 => !close,
        _ => keep_alive_token && !close,
    };
    let expect_continue = version == Version::HTTP_11
        && framing != Framing::None
        && headers.get(EXPECT).is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    Ok(Some(Head { method, uri, version, headers, framing, keep_alive, expect_continue }))
}

fn value_of(bytes: &Bytes, span: Span) -> Result<HeaderValue, HeadError> {
    HeaderValue::from_maybe_shared(bytes.slice(span.start..span.end)).map_err(|_| HeadError::HeaderField)
}

fn refusal(e: httparse::Error, max_headers: usize, bare_lf: bool) -> HeadError {
    match e {
        httparse::Error::TooManyHeaders => HeadError::TooManyHeaders { limit: max_headers },
        httparse::Error::Version => HeadError::Version,
        httparse::Error::HeaderName | httparse::Error::HeaderValue => HeadError::HeaderField,
        // httparse takes a bare LF as a line end; where it failed further on, the bare LF is
        // the reason to give.
        _ if bare_lf => HeadError::BareLf,
        _ => HeadError::RequestLine,
    }
}

/// Whether some LF in `bytes` is not preceded by a CR.
fn has_bare_lf(bytes: &[u8]) -> bool {
    bytes.iter().enumerate().any(|(i, &b)| b == b'\n' && (i == 0 || bytes[i - 1] != b'\r'))
}

/// The body's framing (see the module docs for the rules).
fn framing(headers: &HeaderMap, version: Version) -> Result<Framing, HeadError> {
    let mut lengths = headers.get_all(CONTENT_LENGTH).iter();
    let length = lengths.next();
    if lengths.next().is_some() {
        return Err(HeadError::TwoLengths);
    }
    let mut encodings = headers.get_all(TRANSFER_ENCODING).iter().peekable();
    if encodings.peek().is_none() {
        return match length {
            None => Ok(Framing::None),
            Some(v) => Ok(Framing::Length(decimal(v.as_bytes()).ok_or(HeadError::BadLength)?)),
        };
    }
    if version == Version::HTTP_10 {
        return Err(HeadError::EncodingOnHttp10);
    }
    if length.is_some() {
        return Err(HeadError::LengthAndEncoding);
    }
    let (mut codings, mut chunked, mut last_chunked) = (0usize, 0usize, false);
    for value in encodings {
        for coding in list(value.as_bytes()) {
            codings += 1;
            last_chunked = coding.eq_ignore_ascii_case(b"chunked");
            chunked += usize::from(last_chunked);
        }
    }
    if chunked != 1 || !last_chunked {
        return Err(HeadError::BadChunked);
    }
    if codings > 1 {
        return Err(HeadError::UnsupportedCoding);
    }
    Ok(Framing::Chunked)
}

/// A `Content-Length` value: 1 to 19 ASCII digits, at most `u64::MAX`.
fn decimal(bytes: &[u8]) -> Option<u64> {
    if bytes.is_empty() || bytes.len() > 19 || !bytes.iter().all(u8::is_ascii_digit) {
        return None;
    }
    bytes.iter().try_fold(0u64, |n, &d| n.checked_mul(10)?.checked_add(u64::from(d - b'0')))
}

/// The non-empty elements of a comma-separated field value, without surrounding whitespace.
fn list(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value.split(|&b| b == b',').map(|e| e.trim_ascii()).filter(|e| !e.is_empty())
}

/// Whether `Connection` lists `close`, and `keep-alive`.
fn connection_tokens(headers: &HeaderMap) -> (bool, bool) {
    let (mut close, mut keep_alive) = (false, false);
    for value in headers.get_all(CONNECTION) {
        for token in list(value.as_bytes()) {
            close |= token.eq_ignore_ascii_case(b"close");
            keep_alive |= token.eq_ignore_ascii_case(b"keep-alive");
        }
    }
    (close, keep_alive)
}

#[cfg(test)]
mod tests;
