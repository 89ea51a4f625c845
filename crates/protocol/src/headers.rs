//! Header names and strict parsers for the request headers the protocol defines.
//!
//! Parsers return typed errors; the server maps them to `400 Bad Request` with the error's text as
//! the one-line reason. Nothing here knows about HTTP status codes.

/// Header names, lower-case as `http` stores them.
pub mod names {
    pub const STREAM_TTL: &str = "stream-ttl";
    pub const STREAM_EXPIRES_AT: &str = "stream-expires-at";
    pub const STREAM_CLOSED: &str = "stream-closed";
    pub const STREAM_SEQ: &str = "stream-seq";
    pub const STREAM_NEXT_OFFSET: &str = "stream-next-offset";
    pub const STREAM_UP_TO_DATE: &str = "stream-up-to-date";
    pub const STREAM_CURSOR: &str = "stream-cursor";
    pub const STREAM_SSE_DATA_ENCODING: &str = "stream-sse-data-encoding";
    pub const STREAM_FORKED_FROM: &str = "stream-forked-from";
    pub const STREAM_FORK_OFFSET: &str = "stream-fork-offset";
    pub const STREAM_FORK_SUB_OFFSET: &str = "stream-fork-sub-offset";
    pub const PRODUCER_ID: &str = "producer-id";
    pub const PRODUCER_EPOCH: &str = "producer-epoch";
    pub const PRODUCER_SEQ: &str = "producer-seq";
    pub const PRODUCER_EXPECTED_SEQ: &str = "producer-expected-seq";
    pub const PRODUCER_RECEIVED_SEQ: &str = "producer-received-seq";
    /// A conditional append: written only if the stream's tail is this offset (an Oncelog
    /// extension; `412 Precondition Failed` otherwise).
    pub const IF_MATCH: &str = "if-match";
    /// A strict compare-and-append (upstream protocol): the append is written only if the
    /// stream's tail is exactly this offset; else `409` with the tail in `Stream-Next-Offset`.
    pub const STREAM_EXPECTED_OFFSET: &str = "stream-expected-offset";
    /// On a `409`: why a producer request conflicts beyond a sequence gap (`body-mismatch`: the
    /// sequence number was accepted with a different body). An Oncelog extension.
    pub const PRODUCER_CONFLICT: &str = "producer-conflict";
    /// A key a writer without a sequence counter sends with an append: a repeat with the same key
    /// is answered from the first, not written again. An Oncelog extension.
    pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
    /// The earliest offset a stream can still be read from (on HEAD, trims and `410`s). An
    /// Oncelog extension (the name upstream's client design reads).
    pub const STREAM_EARLIEST_OFFSET: &str = "stream-earliest-offset";
    /// A trim: `POST` with an empty body moves the stream's earliest offset forward to this one.
    /// An Oncelog extension.
    pub const STREAM_TRIM_TO: &str = "stream-trim-to";
    /// A retention policy's maximum age in seconds (or `none`), on `PUT`, `HEAD` and `PUT`
    /// answers. An Oncelog extension.
    pub const STREAM_RETENTION_MAX_AGE: &str = "stream-retention-max-age";
    /// A retention policy's byte limit (or `none`), as [`STREAM_RETENTION_MAX_AGE`].
    pub const STREAM_RETENTION_MAX_BYTES: &str = "stream-retention-max-bytes";
    /// `state` on `PUT`: a JSON stream of State Protocol messages that compactions may shorten
    /// (shown on `HEAD`). An Oncelog extension.
    pub const STREAM_COMPACTION: &str = "stream-compaction";
    /// `true` on a `POST` with an empty body: compact the stream now. An Oncelog extension.
    pub const STREAM_COMPACT: &str = "stream-compact";
}

/// Longest accepted `Producer-Id`, in bytes. Producer ids are stored in keys; real ones are
/// UUIDs or host names.
pub const MAX_PRODUCER_ID_BYTES: usize = 1024;
/// Longest accepted `Stream-Seq`, in bytes.
pub const MAX_STREAM_SEQ_BYTES: usize = 1024;
/// Longest accepted stream path (after the stream root), in bytes. Paths are stored in keys.
pub const MAX_PATH_BYTES: usize = 4096;

/// The largest epoch or sequence number a producer may use: 2^53 - 1, so that values survive a
/// round trip through a JavaScript number.
pub const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;

/// Why a request header was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    #[error("Stream-TTL must be a non-negative decimal integer without sign or leading zeros")]
    InvalidTtl,
    #[error("Stream-Expires-At must be an RFC 3339 timestamp")]
    InvalidExpiresAt,
    #[error("Stream-TTL and Stream-Expires-At cannot both be set")]
    TtlAndExpiresAt,
    #[error("Producer-Id, Producer-Epoch and Producer-Seq must be sent together")]
    PartialProducer,
    #[error("Producer-Id must not be empty")]
    EmptyProducerId,
    #[error("Producer-Id must be at most 1024 bytes")]
    ProducerIdTooLong,
    #[error("Stream-Seq must be at most 1024 bytes")]
    StreamSeqTooLong,
    #[error("{0} must be an integer between 0 and 2^53-1")]
    InvalidProducerNumber(&'static str),
    #[error("Stream-Seq must not be empty")]
    EmptyStreamSeq,
    #[error("Content-Type is not a valid media type")]
    InvalidContentType,
    #[error("Stream-Fork-Sub-Offset must be a non-negative decimal integer without sign or leading zeros")]
    InvalidSubOffset,
    #[error("Stream-Fork-Offset and Stream-Fork-Sub-Offset require Stream-Forked-From")]
    ForkHeadersWithoutSource,
    #[error("a non-zero Stream-Fork-Sub-Offset requires Stream-Fork-Offset")]
    SubOffsetWithoutOffset,
    #[error("Stream-Forked-From must name a stream path")]
    InvalidForkSource,
    #[error("If-Match must be * or offsets returned by this server (Stream-Next-Offset), bare or quoted")]
    InvalidIfMatch,
    #[error("If-Match needs a strong tag: an offset, not W/\"...\"")]
    WeakIfMatch,
    #[error("Idempotency-Key must be 1 to 255 visible ASCII characters, bare or in double quotes")]
    InvalidIdempotencyKey,
    #[error("Stream-Compaction must be `state` (the only compaction there is)")]
    InvalidCompaction,
    #[error("Stream-Compact must be `true`")]
    InvalidCompact,
    #[error("{0} must be `none` or a decimal integer of at least 1 without sign or leading zeros")]
    InvalidRetentionLimit(&'static str),
    #[error("Idempotency-Key cannot be combined with Producer-Id/Epoch/Seq: a producer's sequence numbers already make its appends idempotent")]
    IdempotencyKeyWithProducer,
}

/// Longest accepted `Idempotency-Key`, in characters.
pub const MAX_IDEMPOTENCY_KEY_CHARS: usize = 255;

/// `Idempotency-Key`: 1 to 255 visible ASCII characters; one pair of surrounding double quotes
/// (the structured-field string form of the IETF draft) is taken off.
pub fn parse_idempotency_key(value: &str) -> Result<&str, HeaderError> {
    let key = value.strip_prefix('"').and_then(|v| v.strip_suffix('"')).unwrap_or(value);
    let visible = |b: u8| (0x21..=0x7e).contains(&b);
    if key.is_empty() || key.len() > MAX_IDEMPOTENCY_KEY_CHARS || !key.bytes().all(visible) {
        return Err(HeaderError::InvalidIdempotencyKey);
    }
    Ok(key)
}

/// Most offsets one `If-Match` may list.
pub const MAX_IF_MATCH_OFFSETS: usize = 16;

/// `If-Match` on an append: `None` for `*` (any tail: the stream only has to exist), else the
/// tails the append is allowed at. Each is an offset token as `Stream-Next-Offset` gives it,
/// bare or quoted like an entity tag; several are separated by commas.
pub fn parse_if_match(value: &str) -> Result<Option<Vec<crate::Offset>>, HeaderError> {
    let value = value.trim();
    if value == "*" {
        return Ok(None);
    }
    let mut offsets = Vec::new();
    for item in value.split(',') {
        let item = item.trim();
        if item.starts_with("W/") {
            return Err(HeaderError::WeakIfMatch);
        }
        let token = match item.strip_prefix('"') {
            Some(rest) => rest.strip_suffix('"').ok_or(HeaderError::InvalidIfMatch)?,
            None => item,
        };
        offsets.push(crate::Offset::parse(token).map_err(|_| HeaderError::InvalidIfMatch)?);
        if offsets.len() > MAX_IF_MATCH_OFFSETS {
            return Err(HeaderError::InvalidIfMatch);
        }
    }
    Ok(Some(offsets))
}

/// `Stream-Closed` counts only when its value is `true`, compared case-insensitively; any other
/// value is treated as absent (section 4.1).
pub fn closed_flag(value: Option<&str>) -> bool {
    value.is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
}

/// A strict non-negative decimal: `0`, or digits without a leading zero, sign, point or exponent.
fn parse_strict_decimal(value: &str) -> Option<u64> {
    let ok_shape =
        !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) && (value == "0" || !value.starts_with('0'));
    if ok_shape {
        value.parse::<u64>().ok()
    } else {
        None
    }
}

/// `Stream-TTL`: seconds, strictly `0` or a decimal without leading zeros.
pub fn parse_ttl(value: &str) -> Result<u64, HeaderError> {
    parse_strict_decimal(value).ok_or(HeaderError::InvalidTtl)
}

/// `Stream-Retention-Max-Age` / `-Max-Bytes`: `none` (no limit, whatever the server's default)
/// or a positive strict decimal. `name` is the header's display name, for the error.
pub fn parse_retention_limit(value: &str, name: &'static str) -> Result<Option<u64>, HeaderError> {
    if value.trim().eq_ignore_ascii_case("none") {
        return Ok(None);
    }
    match parse_strict_decimal(value.trim()) {
        Some(n) if n > 0 => Ok(Some(n)),
        _ => Err(HeaderError::InvalidRetentionLimit(name)),
    }
}

/// `Stream-Fork-Sub-Offset`: the same strict grammar as `Stream-TTL`.
pub fn parse_sub_offset(value: &str) -> Result<u64, HeaderError> {
    parse_strict_decimal(value).ok_or(HeaderError::InvalidSubOffset)
}

/// `Stream-Expires-At`: an RFC 3339 timestamp, returned as Unix milliseconds.
pub fn parse_expires_at(value: &str) -> Result<i64, HeaderError> {
    let t = time::OffsetDateTime::parse(value.trim(), &time::format_description::well_known::Rfc3339)
        .map_err(|_| HeaderError::InvalidExpiresAt)?;
    i64::try_from(t.unix_timestamp_nanos() / 1_000_000).map_err(|_| HeaderError::InvalidExpiresAt)
}

/// Renders Unix milliseconds as an RFC 3339 UTC timestamp.
pub fn format_rfc3339(unix_ms: i64) -> String {
    let nanos = i128::from(unix_ms) * 1_000_000;
    time::OffsetDateTime::from_unix_timestamp_nanos(nanos)
        .ok()
        .and_then(|t| t.format(&time::format_description::well_known::Rfc3339).ok())
        .unwrap_or_default()
}

/// The three idempotent-producer headers, validated together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProducerHeaders {
    pub id: String,
    pub epoch: u64,
    pub seq: u64,
}

fn parse_safe_integer(value: &str, name: &'static str) -> Result<u64, HeaderError> {
    let v = value.trim();
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return Err(HeaderError::InvalidProducerNumber(name));
    }
    match v.parse::<u64>() {
        Ok(n) if n <= MAX_SAFE_INTEGER => Ok(n),
        _ => Err(HeaderError::InvalidProducerNumber(name)),
    }
}

/// All three producer headers or none (section 5.2.1).
pub fn parse_producer(
    id: Option<&str>,
    epoch: Option<&str>,
    seq: Option<&str>,
) -> Result<Option<ProducerHeaders>, HeaderError> {
    match (id, epoch, seq) {
        (None, None, None) => Ok(None),
        (Some(id), Some(epoch), Some(seq)) => {
            if id.trim().is_empty() {
                return Err(HeaderError::EmptyProducerId);
            }
            if id.len() > MAX_PRODUCER_ID_BYTES {
                return Err(HeaderError::ProducerIdTooLong);
            }
            Ok(Some(ProducerHeaders {
                id: id.to_owned(),
                epoch: parse_safe_integer(epoch, "Producer-Epoch")?,
                seq: parse_safe_integer(seq, "Producer-Seq")?,
            }))
        }
        _ => Err(HeaderError::PartialProducer),
    }
}

/// The expiry a create request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Expiry {
    #[default]
    Never,
    /// Sliding window in seconds, reset by reads and writes.
    Ttl(u64),
    /// Absolute deadline in Unix milliseconds.
    At(i64),
}

/// `Stream-TTL` and `Stream-Expires-At` together; both at once is refused.
pub fn parse_expiry(ttl: Option<&str>, expires_at: Option<&str>) -> Result<Expiry, HeaderError> {
    match (ttl, expires_at) {
        (None, None) => Ok(Expiry::Never),
        (Some(t), None) => parse_ttl(t).map(Expiry::Ttl),
        (None, Some(e)) => parse_expires_at(e).map(Expiry::At),
        (Some(t), Some(e)) => {
            parse_ttl(t)?;
            parse_expires_at(e)?;
            Err(HeaderError::TtlAndExpiresAt)
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn retention_limits_are_none_or_positive_integers() {
        let n = "Stream-Retention-Max-Age";
        assert_eq!(parse_retention_limit("none", n), Ok(None));
        assert_eq!(parse_retention_limit("None", n), Ok(None));
        assert_eq!(parse_retention_limit("3600", n), Ok(Some(3600)));
        for bad in ["", "0", "01", "-1", "1.5", "1e3", "ten", "18446744073709551616"] {
            assert_eq!(parse_retention_limit(bad, n), Err(HeaderError::InvalidRetentionLimit(n)), "{bad:?}");
        }
    }

    #[test]
    fn idempotency_keys_are_visible_ascii_bare_or_quoted() {
        assert_eq!(
            parse_idempotency_key("0190f5a2-7c1e-7d3a-9f00-2b5c1d2e3f40"),
            Ok("0190f5a2-7c1e-7d3a-9f00-2b5c1d2e3f40")
        );
        assert_eq!(parse_idempotency_key("\"abc\""), Ok("abc"));
        let long = "k".repeat(MAX_IDEMPOTENCY_KEY_CHARS);
        assert_eq!(parse_idempotency_key(&long), Ok(long.as_str()));
        for bad in ["", "\"\"", "a b", "tab\tkey", "é", &"k".repeat(MAX_IDEMPOTENCY_KEY_CHARS + 1)] {
            assert_eq!(parse_idempotency_key(bad), Err(HeaderError::InvalidIdempotencyKey), "{bad:?}");
        }
    }

    #[test]
    fn if_match_takes_bare_quoted_and_listed_offsets() {
        use crate::Offset;
        let t = |n| Offset(n).to_string();
        assert_eq!(parse_if_match("*"), Ok(None));
        assert_eq!(parse_if_match(&t(5)), Ok(Some(vec![Offset(5)])));
        assert_eq!(parse_if_match(&format!(" \"{}\" ", t(5))), Ok(Some(vec![Offset(5)])));
        assert_eq!(parse_if_match(&format!("\"{}\", {}", t(1), t(2))), Ok(Some(vec![Offset(1), Offset(2)])));
        assert_eq!(parse_if_match(&format!("W/\"{}\"", t(5))), Err(HeaderError::WeakIfMatch));
        for bad in ["", "-1", "now", "5", "\"", "\"0000000000000000_0000000000000005", "a,b", ","] {
            assert_eq!(parse_if_match(bad), Err(HeaderError::InvalidIfMatch), "{bad:?}");
        }
        let many = vec![t(1); MAX_IF_MATCH_OFFSETS + 1].join(",");
        assert_eq!(parse_if_match(&many), Err(HeaderError::InvalidIfMatch));
    }

    use super::*;

    #[test]
    fn ttl_is_strict() {
        assert_eq!(parse_ttl("0"), Ok(0));
        assert_eq!(parse_ttl("3600"), Ok(3600));
        for bad in ["", "+3600", "03600", "3600.0", "3.6e3", "-1", " 1", "abc", "99999999999999999999999"] {
            assert_eq!(parse_ttl(bad), Err(HeaderError::InvalidTtl), "{bad:?}");
        }
    }

    #[test]
    fn sub_offset_is_strict() {
        assert_eq!(parse_sub_offset("0"), Ok(0));
        assert_eq!(parse_sub_offset("12"), Ok(12));
        for bad in ["-1", "abc", "1.5", "05", "+1", ""] {
            assert_eq!(parse_sub_offset(bad), Err(HeaderError::InvalidSubOffset), "{bad:?}");
        }
    }

    #[test]
    fn expires_at_parses_rfc3339() {
        assert_eq!(parse_expires_at("1970-01-01T00:00:01Z"), Ok(1000));
        assert_eq!(parse_expires_at("1970-01-01T01:00:01+01:00"), Ok(1000));
        assert!(parse_expires_at("tomorrow").is_err());
        assert_eq!(format_rfc3339(1000), "1970-01-01T00:00:01Z");
    }

    #[test]
    fn closed_flag_only_true() {
        assert!(closed_flag(Some("true")));
        assert!(closed_flag(Some("TRUE")));
        for v in ["false", "yes", "1", ""] {
            assert!(!closed_flag(Some(v)));
        }
        assert!(!closed_flag(None));
    }

    #[test]
    fn producer_headers_all_or_none() {
        assert_eq!(parse_producer(None, None, None), Ok(None));
        assert_eq!(parse_producer(Some("p"), Some("0"), None), Err(HeaderError::PartialProducer));
        assert_eq!(parse_producer(Some(""), Some("0"), Some("0")), Err(HeaderError::EmptyProducerId));
        let long = "p".repeat(MAX_PRODUCER_ID_BYTES + 1);
        assert_eq!(parse_producer(Some(&long), Some("0"), Some("0")), Err(HeaderError::ProducerIdTooLong));
        assert!(parse_producer(Some("p"), Some("-1"), Some("0")).is_err());
        assert!(parse_producer(Some("p"), Some("1.5"), Some("0")).is_err());
        assert!(parse_producer(Some("p"), Some("9007199254740992"), Some("0")).is_err());
        assert_eq!(
            parse_producer(Some("p"), Some("9007199254740991"), Some("3")),
            Ok(Some(ProducerHeaders { id: "p".into(), epoch: MAX_SAFE_INTEGER, seq: 3 }))
        );
    }

    #[test]
    fn expiry_rejects_both() {
        assert_eq!(parse_expiry(Some("5"), Some("1970-01-01T00:00:01Z")), Err(HeaderError::TtlAndExpiresAt));
        assert_eq!(parse_expiry(Some("5"), None), Ok(Expiry::Ttl(5)));
    }
}
