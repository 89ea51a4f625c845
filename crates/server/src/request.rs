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
    #[error(transparent)]
    Json(#[from] oncelog_protocol::json::JsonError),
    #[error("query parameter {0} must appear at most once")]
    RepeatedParam(&'static str),
    #[error("live reads require an offset parameter")]
    LiveWithoutOffset,
    #[error("live must be long-poll or sse")]
    UnknownLiveMode,
    #[error("header {0} is not valid UTF-8")]
    NonUtf8Header(&'static str),
    #[error("an empty body is only allowed with Stream-Closed: true")]
    EmptyBody,
    #[error("Content-Type is required when the body is not empty")]
    MissingContentType,
    #[error("offset is beyond the end of the stream")]
    OffsetBeyondTail,
    #[error("stream path must not be empty")]
    EmptyPath,
}

/// The read mode of a GET.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Live {
    CatchUp,
    LongPoll,
    Sse,
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
        let (mut offset, mut live, mut cursor) = (None, None, None);
        for (k, v) in form_urlencoded::parse(raw.unwrap_or("").as_bytes()) {
            let slot = match k.as_ref() {
                "offset" => (&mut offset, "offset"),
                "live" => (&mut live, "live"),
                "cursor" => (&mut cursor, "cursor"),
                _ => continue,
            };
            if slot.0.replace(v.into_owned()).is_some() {
                return Err(RequestError::RepeatedParam(slot.1));
            }
        }
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

fn header<'a>(h: &'a HeaderMap, name: &'static str) -> Result<Option<&'a str>, RequestError> {
    h.get(name).map(|v| v.to_str().map_err(|_| RequestError::NonUtf8Header(name))).transpose()
}

/// The headers of a PUT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateHeaders {
    /// As sent (echoed back exactly), or the default.
    pub content_type: String,
    pub expiry: Expiry,
    pub closed: bool,
    /// `Stream-Forked-From` was sent (forks are not supported yet).
    pub fork: bool,
}

impl CreateHeaders {
    pub fn parse(h: &HeaderMap) -> Result<Self, RequestError> {
        let content_type = match header(h, "content-type")? {
            Some(ct) if !oncelog_protocol::content_type::is_valid(ct) => return Err(HeaderError::InvalidContentType.into()),
            Some(ct) => ct.to_owned(),
            None => oncelog_protocol::content_type::DEFAULT.to_owned(),
        };
        let expiry = headers::parse_expiry(header(h, names::STREAM_TTL)?, header(h, names::STREAM_EXPIRES_AT)?)?;
        let fork = [names::STREAM_FORKED_FROM, names::STREAM_FORK_OFFSET, names::STREAM_FORK_SUB_OFFSET]
            .iter()
            .any(|n| h.contains_key(*n));
        Ok(Self { content_type, expiry, closed: headers::closed_flag(header(h, names::STREAM_CLOSED)?), fork })
    }
}

/// The headers of a POST.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppendHeaders {
    pub content_type: Option<String>,
    pub close: bool,
    pub stream_seq: Option<String>,
    pub producer: Option<ProducerHeaders>,
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
            s => s.map(str::to_owned),
        };
        Ok(Self {
            content_type: header(h, "content-type")?.map(str::to_owned),
            close: headers::closed_flag(header(h, names::STREAM_CLOSED)?),
            stream_seq,
            producer,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oncelog_protocol::Offset;

    #[test]
    fn read_query_rules() {
        assert_eq!(ReadQuery::parse(None).unwrap().offset, OffsetParam::Start);
        let q = ReadQuery::parse(Some("offset=now&live=sse&cursor=7&foo=bar")).unwrap();
        assert_eq!((q.offset, q.live, q.cursor.as_deref()), (OffsetParam::Now, Live::Sse, Some("7")));
        let q = ReadQuery::parse(Some("offset=0000000000000000_0000000000000003")).unwrap();
        assert_eq!(q.offset, OffsetParam::At(Offset(3)));
        for bad in ["offset=", "offset=a&offset=b", "offset=0,1", "offset=0%201", "live=long-poll", "live=sse", "offset=-1&live=bogus", "offset=-1%0A", "offset=now%00"] {
            assert!(ReadQuery::parse(Some(bad)).is_err(), "{bad}");
        }
    }
}
