//! Typed parsing of requests. Everything here returns [`RequestError`]; turning that into a
//! response is [`crate::error`]'s job.

use axum::http::HeaderMap;
use oncelog_protocol::headers::{self, names, Expiry, HeaderError, ProducerHeaders};
use oncelog_protocol::offset::OffsetError;
use oncelog_protocol::OffsetParam;

/// Why a request is malformed (answered 400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error(transparent)]
    Header(#[from] HeaderError),
    #[error(transparent)]
    Offset(#[from] OffsetError),
    /// Not [`OffsetError`]'s words ("-1, now, or a token"): those are read positions, and a
    /// header that names a tail takes neither.
    #[error("Stream-Expected-Offset must be a tail this server returned (Stream-Next-Offset); -1 and now are read positions, not tails (an empty stream's tail is {})", oncelog_protocol::Offset::ZERO)]
    ExpectedOffset,
    #[error(transparent)]
    Json(#[from] oncelog_protocol::json::JsonError),
    #[error("query parameter {0} must appear at most once")]
    RepeatedParam(&'static str),
    #[error("limit must be an integer from 1 to {max}")]
    ListLimit { max: usize },
    #[error("live reads require an offset parameter")]
    LiveWithoutOffset,
    #[error("live must be long-poll or sse")]
    UnknownLiveMode,
    #[error("header {0} is not valid UTF-8")]
    NonUtf8Header(&'static str),
    #[error("an empty body is only allowed with Stream-Closed: true")]
    EmptyBody,
    #[error("an empty body is only allowed with Stream-Closed: true, and {0:?} is not `true` (any other value counts as absent)")]
    EmptyBodyClosedValue(String),
    #[error("header {0} must appear at most once")]
    RepeatedHeader(&'static str),
    #[error("Content-Type is required when the body is not empty")]
    MissingContentType,
    #[error("offset is beyond the end of the stream")]
    OffsetBeyondTail,
    #[error("offset is not a message boundary of this JSON stream; use an offset the server returned")]
    OffsetInsideMessage,
    #[error("stream path must not be empty")]
    EmptyPath,
    #[error("stream path is not valid UTF-8 once percent-decoded")]
    PathNotUtf8,
    #[error("stream path must be at most 4096 bytes")]
    PathTooLong,
    #[error("the request needs exactly one valid Host header (RFC 9112 section 3.2)")]
    BadHost,
    #[error("the Host header's port must be a number from 0 to 65535")]
    BadHostPort,
    #[error("Stream-Trim-To and Stream-Compact cannot be sent together")]
    TrimAndCompact,
    #[error("this stream takes State Protocol messages only (it was created with Stream-Compaction: state): {0}")]
    NotStateProtocol(#[from] oncelog_protocol::state::StateError),
}

/// The route prefix of every stream operation.
pub const STREAM_PREFIX: &str = "/v1/stream/";

/// The stream path of a request path, as sent (not percent-decoded): what follows
/// [`STREAM_PREFIX`], when something does.
pub fn raw_stream_path(uri_path: &str) -> Option<&str> {
    uri_path.strip_prefix(STREAM_PREFIX).filter(|rest| !rest.is_empty())
}

/// A raw stream path percent-decoded, as every stream operation and access control read it.
pub fn decode_stream_path(raw: &str) -> Result<std::borrow::Cow<'_, str>, RequestError> {
    percent_encoding::percent_decode_str(raw).decode_utf8().map_err(|_| RequestError::PathNotUtf8)
}

/// The read mode of a GET.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Live {
    CatchUp,
    LongPoll,
    Sse,
}

/// The values of the query parameters `names` in the raw query string `raw` (percent-decoded),
/// each at most once: a parameter sent twice is refused rather than one of its values taken.
/// Other parameters are ignored (a signed URL's `expires` and `sig` among them).
pub fn params<const N: usize>(
    raw: Option<&str>,
    names: [&'static str; N],
) -> Result<[Option<String>; N], RequestError> {
    let mut found: [Option<String>; N] = std::array::from_fn(|_| None);
    for (k, v) in form_urlencoded::parse(raw.unwrap_or("").as_bytes()) {
        let Some(i) = names.iter().position(|n| *n == k) else { continue };
        if found[i].replace(v.into_owned()).is_some() {
            return Err(RequestError::RepeatedParam(names[i]));
        }
    }
    Ok(found)
}

/// A GET's query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadQuery {
    pub offset: OffsetParam,
    pub live: Live,
    pub cursor: Option<String>,
}

impl ReadQuery {
    /// Parses the raw query string: `offset` (strict, at most once), `live`, `cursor`; unknown
    /// parameters are ignored.
    pub fn parse(raw: Option<&str>) -> Result<ReadQuery, RequestError> {
        let [offset, live, cursor] = params(raw, ["offset", "live", "cursor"])?;
        let live = match live.as_deref() {
            None => Live::CatchUp,
            Some("long-poll") => Live::LongPoll,
            Some("sse") => Live::Sse,
            Some(_) => return Err(RequestError::UnknownLiveMode),
        };
        if live != Live::CatchUp && offset.is_none() {
            return Err(RequestError::LiveWithoutOffset);
        }
        let offset = OffsetParam::parse(offset.as_deref())?;
        Ok(ReadQuery { offset, live, cursor })
    }
}

/// The page size of a stream listing when the request names none.
pub const LIST_DEFAULT_LIMIT: usize = 100;
/// The largest page a stream listing answers: each page is cut from one scan of the prefix
/// (see [`crate::listing`]), so a page bounds the answer, not the scan.
pub const LIST_MAX_LIMIT: usize = 1000;

/// The query of `GET /v1/stream/__ds/streams`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListQuery {
    /// Only paths that start with this (`""`: every path).
    pub prefix: String,
    /// Only paths after this one in byte order: the `next` of the previous page.
    pub after: Option<String>,
    /// Most streams in the answer.
    pub limit: usize,
}

impl ListQuery {
    /// Parses the raw query string: `prefix`, `after`, `limit` (1 to [`LIST_MAX_LIMIT`]), each at
    /// most once; unknown parameters are ignored, as on reads (a signed URL's `expires` and
    /// `sig` among them).
    pub fn parse(raw: Option<&str>) -> Result<ListQuery, RequestError> {
        let [prefix, after, limit] = params(raw, ["prefix", "after", "limit"])?;
        let limit = match limit {
            None => LIST_DEFAULT_LIMIT,
            // Digits only: `+5`, ` 5` or `5.0` are refused rather than read as 5.
            Some(v) if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) => match v.parse::<usize>() {
                Ok(n) if (1..=LIST_MAX_LIMIT).contains(&n) => n,
                _ => return Err(RequestError::ListLimit { max: LIST_MAX_LIMIT }),
            },
            Some(_) => return Err(RequestError::ListLimit { max: LIST_MAX_LIMIT }),
        };
        Ok(ListQuery { prefix: prefix.unwrap_or_default(), after, limit })
    }
}

/// `Last-Event-ID` of an SSE request: the `id` of the last control event a browser's
/// `EventSource` received, which it sends when it reconnects by itself to the URL it was opened
/// with. It names the next offset to read and takes precedence over the URL's `offset` (which
/// is where the reader first started). Empty counts as absent.
pub fn last_event_id(h: &HeaderMap) -> Result<Option<oncelog_protocol::Offset>, RequestError> {
    match header(h, "last-event-id")?.map(str::trim) {
        None | Some("") => Ok(None),
        Some(v) => oncelog_protocol::Offset::parse(v).map(Some).map_err(RequestError::Offset),
    }
}

/// A protocol header's value. Sent twice, it is refused: taking either line silently would let
/// two parts of a proxy chain disagree about what was asked.
fn header<'a>(h: &'a HeaderMap, name: &'static str) -> Result<Option<&'a str>, RequestError> {
    let mut values = h.get_all(name).iter();
    let first = values.next();
    if values.next().is_some() {
        return Err(RequestError::RepeatedHeader(name));
    }
    first.map(|v| v.to_str().map_err(|_| RequestError::NonUtf8Header(name))).transpose()
}

/// RFC 9112 section 3.2: a request with more than one `Host`, or one that is not a
/// `host[:port]`, is `400`, and so is an HTTP/1.1 request without one (HTTP/1.0 may omit it; an
/// HTTP/2 request names its authority in `:authority` and may omit it too). The value is echoed
/// into `Location` and callback URLs: a guess between two, or a value with a space, would put
/// an attacker's text there.
pub fn check_host(version: axum::http::Version, h: &HeaderMap) -> Result<(), RequestError> {
    let mut all = h.get_all("host").iter();
    let first = all.next();
    if all.next().is_some() {
        return Err(RequestError::BadHost);
    }
    match first {
        None if version == axum::http::Version::HTTP_11 => Err(RequestError::BadHost),
        None => Ok(()),
        Some(v) => {
            let authority = axum::http::uri::Authority::try_from(v.as_bytes()).map_err(|_| RequestError::BadHost)?;
            let text = authority.as_str();
            if text.is_empty() || text.contains('@') {
                return Err(RequestError::BadHost);
            }
            // The `http` crate takes any characters after the colon as a port; such a Host would
            // be echoed into `Location` as the client's own authority.
            if !host_port_is_valid(text) {
                return Err(RequestError::BadHostPort);
            }
            Ok(())
        }
    }
}

/// Whether the port of `authority` (`host[:port]`, the host possibly a bracketed IPv6 literal),
/// if it has one, is a number from 0 to 65535 (RFC 9112 section 3.2 and RFC 3986 section 3.2.3;
/// an empty port is refused too: nothing useful is meant by it).
fn host_port_is_valid(authority: &str) -> bool {
    let host_end = if authority.starts_with('[') { authority.find(']').map_or(0, |i| i + 1) } else { 0 };
    match authority[host_end..].rfind(':') {
        None => true,
        Some(i) => {
            let port = &authority[host_end + i + 1..];
            !port.is_empty()
                && port.len() <= 5
                && port.bytes().all(|b| b.is_ascii_digit())
                && port.parse::<u16>().is_ok()
        }
    }
}

/// `Stream-Trim-To` of a trim: once, an offset token, and without `Stream-Compact` (either would
/// move the earliest offset; executing one of two would be a guess).
pub fn trim_to(h: &HeaderMap) -> Result<oncelog_protocol::Offset, RequestError> {
    if h.contains_key(names::STREAM_COMPACT) {
        return Err(RequestError::TrimAndCompact);
    }
    let to = header(h, names::STREAM_TRIM_TO)?.ok_or(OffsetError::Malformed)?;
    Ok(oncelog_protocol::Offset::parse(to.trim())?)
}

/// `Stream-Compact` of a compaction: once, `true` (any case), and without `Stream-Trim-To`.
pub fn compact(h: &HeaderMap) -> Result<(), RequestError> {
    if h.contains_key(names::STREAM_TRIM_TO) {
        return Err(RequestError::TrimAndCompact);
    }
    match header(h, names::STREAM_COMPACT)? {
        Some(v) if v.trim().eq_ignore_ascii_case("true") => Ok(()),
        _ => Err(HeaderError::InvalidCompact.into()),
    }
}

/// A `Content-Type` header, refused unless it is a media type.
fn content_type(h: &HeaderMap) -> Result<Option<String>, RequestError> {
    match header(h, "content-type")? {
        Some(ct) if !oncelog_protocol::content_type::is_valid(ct) => Err(HeaderError::InvalidContentType.into()),
        ct => Ok(ct.map(str::to_owned)),
    }
}

/// The headers of a PUT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateHeaders {
    /// As sent (echoed back exactly); `None` means the default, or the source's for a fork.
    pub content_type: Option<String>,
    /// `None` when neither `Stream-TTL` nor `Stream-Expires-At` was sent.
    pub expiry: Option<Expiry>,
    pub closed: bool,
    pub fork: Option<ForkHeaders>,
    /// `Stream-Retention-Max-Age`: absent (`None`: the server default), `none` (`Some(None)`),
    /// or seconds.
    pub retention_max_age: Option<Option<u64>>,
    /// `Stream-Retention-Max-Bytes`, as `retention_max_age`.
    pub retention_max_bytes: Option<Option<u64>>,
    /// `Stream-Compaction: state`.
    pub compaction: bool,
    /// `If-Match` (see [`if_match`]): the PUT only confirms an existing stream.
    pub if_match: Option<Option<Vec<oncelog_protocol::Offset>>>,
}

/// The fork headers of a PUT (section 4.2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForkHeaders {
    /// Source path relative to the stream root (`/v1/stream/`).
    pub source: String,
    /// `None`: the source's tail.
    pub offset: Option<oncelog_protocol::Offset>,
    pub sub_offset: u64,
}

/// The authority a request was sent to: HTTP/2's `:authority` (which the URI carries) or
/// HTTP/1.1's `Host`; `None` for an HTTP/1.0 request without one.
pub(crate) fn authority<'a>(uri: &'a axum::http::Uri, h: &'a HeaderMap) -> Option<&'a str> {
    uri.authority().map(|a| a.as_str()).or_else(|| h.get("host").and_then(|v| v.to_str().ok()))
}

/// The stream path named by `Stream-Forked-From`: a full URL of this server (its authority must
/// be the one the request was sent to, [`authority`]: forks never reach another server), an
/// absolute path under the stream root, or a path relative to it.
pub(crate) fn fork_source(value: &str, host: Option<&str>) -> Result<String, RequestError> {
    let without_origin = match value.split_once("://") {
        Some((_, rest)) => {
            let (authority, path) = rest.find('/').map_or((rest, ""), |i| rest.split_at(i));
            if !host.is_some_and(|h| h.eq_ignore_ascii_case(authority)) {
                return Err(HeaderError::InvalidForkSource.into());
            }
            path
        }
        None => value,
    };
    let path = without_origin.strip_prefix("/v1/stream/").unwrap_or(without_origin).trim_start_matches('/');
    let decoded =
        percent_encoding::percent_decode_str(path).decode_utf8().map_err(|_| HeaderError::InvalidForkSource)?;
    if decoded.is_empty() || decoded.len() > headers::MAX_PATH_BYTES {
        return Err(HeaderError::InvalidForkSource.into());
    }
    Ok(decoded.into_owned())
}

impl CreateHeaders {
    /// `authority`: where the request was sent ([`authority`]), which a fork source given as a
    /// full URL must name.
    pub fn parse(h: &HeaderMap, authority: Option<&str>) -> Result<Self, RequestError> {
        let content_type = content_type(h)?;
        let (ttl, expires_at) = (header(h, names::STREAM_TTL)?, header(h, names::STREAM_EXPIRES_AT)?);
        let expiry = match (ttl, expires_at) {
            (None, None) => None,
            _ => Some(headers::parse_expiry(ttl, expires_at)?),
        };
        let source = header(h, names::STREAM_FORKED_FROM)?;
        let offset = header(h, names::STREAM_FORK_OFFSET)?;
        let sub_offset = header(h, names::STREAM_FORK_SUB_OFFSET)?;
        let fork = match source {
            None if offset.is_some() || sub_offset.is_some() => {
                return Err(HeaderError::ForkHeadersWithoutSource.into())
            }
            None => None,
            Some(source) => {
                let sub_offset = sub_offset.map(headers::parse_sub_offset).transpose()?.unwrap_or(0);
                let offset = match offset.map(|o| OffsetParam::parse(Some(o))).transpose()? {
                    None | Some(OffsetParam::Now) => None,
                    Some(OffsetParam::Start) => Some(oncelog_protocol::Offset::ZERO),
                    Some(OffsetParam::At(o)) => Some(o),
                };
                if sub_offset > 0 && offset.is_none() {
                    return Err(HeaderError::SubOffsetWithoutOffset.into());
                }
                Some(ForkHeaders { source: fork_source(source, authority)?, offset, sub_offset })
            }
        };
        let limit = |name: &'static str, display: &'static str| -> Result<Option<Option<u64>>, RequestError> {
            Ok(header(h, name)?.map(|v| headers::parse_retention_limit(v, display)).transpose()?)
        };
        Ok(Self {
            content_type,
            expiry,
            closed: headers::closed_flag(header(h, names::STREAM_CLOSED)?),
            fork,
            retention_max_age: limit(names::STREAM_RETENTION_MAX_AGE, "Stream-Retention-Max-Age")?,
            retention_max_bytes: limit(names::STREAM_RETENTION_MAX_BYTES, "Stream-Retention-Max-Bytes")?,
            compaction: match header(h, names::STREAM_COMPACTION)? {
                None => false,
                Some(v) if v.trim().eq_ignore_ascii_case("state") => true,
                Some(_) => return Err(HeaderError::InvalidCompaction.into()),
            },
            if_match: if_match(h)?,
        })
    }
}

/// `If-Match` on any method: `None` when absent; `Some(None)` for `*` (the stream must exist);
/// else the tails it names. On `GET` it is compared with the response's entity tag instead.
pub fn if_match(h: &HeaderMap) -> Result<Option<Option<Vec<oncelog_protocol::Offset>>>, RequestError> {
    Ok(header(h, names::IF_MATCH)?.map(headers::parse_if_match).transpose()?)
}

/// The headers of a POST.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppendHeaders {
    pub content_type: Option<String>,
    pub close: bool,
    /// A `Stream-Closed` value other than `true`: ignored (section 4.1), but named in the
    /// answer to an empty body, which it does not permit.
    pub ignored_closed_value: Option<String>,
    pub stream_seq: Option<String>,
    pub producer: Option<ProducerHeaders>,
    /// `If-Match`: the tails the append may be written at (`None`: absent or `*`).
    pub if_match: Option<Vec<oncelog_protocol::Offset>>,
    /// `Idempotency-Key`, as kept.
    pub idempotency_key: Option<oncelog_protocol::digest::KeyId>,
    /// `Stream-Expected-Offset`: written only at exactly this tail.
    pub expected_offset: Option<oncelog_protocol::Offset>,
}

impl AppendHeaders {
    pub fn parse(h: &HeaderMap) -> Result<Self, RequestError> {
        let producer = headers::parse_producer(
            header(h, names::PRODUCER_ID)?,
            header(h, names::PRODUCER_EPOCH)?,
            header(h, names::PRODUCER_SEQ)?,
        )?;
        let stream_seq = match header(h, names::STREAM_SEQ)? {
            Some("") => return Err(HeaderError::EmptyStreamSeq.into()),
            Some(s) if s.len() > headers::MAX_STREAM_SEQ_BYTES => return Err(HeaderError::StreamSeqTooLong.into()),
            s => s.map(str::to_owned),
        };
        let closed = header(h, names::STREAM_CLOSED)?;
        let close = headers::closed_flag(closed);
        let idempotency_key = match header(h, names::IDEMPOTENCY_KEY)? {
            Some(_) if producer.is_some() => return Err(HeaderError::IdempotencyKeyWithProducer.into()),
            Some(v) => Some(oncelog_protocol::digest::KeyId::of(headers::parse_idempotency_key(v)?)),
            None => None,
        };
        Ok(Self {
            content_type: content_type(h)?,
            close,
            ignored_closed_value: closed.filter(|_| !close).map(str::to_owned),
            stream_seq,
            producer,
            if_match: if_match(h)?.flatten(),
            idempotency_key,
            expected_offset: header(h, names::STREAM_EXPECTED_OFFSET)?
                .map(|v| oncelog_protocol::Offset::parse(v.trim()).map_err(|_| RequestError::ExpectedOffset))
                .transpose()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oncelog_protocol::Offset;

    #[test]
    fn fork_sources_are_normalised() {
        assert_eq!(fork_source("/v1/stream/a/b", None).unwrap(), "a/b");
        assert_eq!(fork_source("http://h:1/v1/stream/a%20b", Some("h:1")).unwrap(), "a b");
        assert_eq!(fork_source("a", None).unwrap(), "a");
        assert!(fork_source("/v1/stream/", None).is_err());
        // Another server's URL, or any URL when the request names no host.
        assert!(fork_source("http://elsewhere:1/v1/stream/a", Some("h:1")).is_err());
        assert!(fork_source("http://h:1/v1/stream/a", None).is_err());
    }

    #[test]
    fn read_query_rules() {
        assert_eq!(ReadQuery::parse(None).unwrap().offset, OffsetParam::Start);
        let q = ReadQuery::parse(Some("offset=now&live=sse&cursor=7&foo=bar")).unwrap();
        assert_eq!((q.offset, q.live, q.cursor.as_deref()), (OffsetParam::Now, Live::Sse, Some("7")));
        let q = ReadQuery::parse(Some("offset=0000000000000000_0000000000000003")).unwrap();
        assert_eq!(q.offset, OffsetParam::At(Offset(3)));
        for bad in [
            "offset=",
            "offset=a&offset=b",
            "offset=0,1",
            "offset=0%201",
            "live=long-poll",
            "live=sse",
            "offset=-1&live=bogus",
            "offset=-1%0A",
            "offset=now%00",
        ] {
            assert!(ReadQuery::parse(Some(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn list_query_rules() {
        assert_eq!(
            ListQuery::parse(None).unwrap(),
            ListQuery { prefix: String::new(), after: None, limit: LIST_DEFAULT_LIMIT }
        );
        let q = ListQuery::parse(Some("prefix=a%2Fb%20&after=a%2Fb%20c&limit=1000&sig=x")).unwrap();
        assert_eq!(q, ListQuery { prefix: "a/b ".into(), after: Some("a/b c".into()), limit: 1000 });
        for bad in [
            "limit=0",
            "limit=1001",
            "limit=",
            "limit=+5",
            "limit=5.0",
            "limit=99999999999999999999999",
            "prefix=a&prefix=b",
            "after=a&after=b",
            "limit=1&limit=2",
        ] {
            assert!(ListQuery::parse(Some(bad)).is_err(), "{bad}");
        }
    }
}
