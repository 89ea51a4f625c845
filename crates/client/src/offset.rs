//! Offsets as a client sees them: opaque tokens minted by the server (protocol section 8).
//!
//! Oncelog's own token shape is [`oncelog_protocol::Offset`]; a client that may talk to any
//! Durable Streams server must not interpret tokens, so [`StreamOffset`] keeps the server's
//! string as is and converts to and from [`Offset`] only on request. Tokens compare
//! lexicographically, which the protocol guarantees is stream order.

use std::fmt;

use oncelog_protocol::{Offset, OffsetParam};

/// A position in a stream, exactly as the server spelled it in `Stream-Next-Offset` or an SSE
/// control event.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Deserialize)]
#[serde(transparent)]
pub struct StreamOffset(String);

impl StreamOffset {
    /// Wraps a token obtained from a server (or persisted from an earlier read).
    pub fn new(token: impl Into<String>) -> StreamOffset {
        StreamOffset(token.into())
    }

    /// The token text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The token as Oncelog's typed offset, when it has Oncelog's shape.
    pub fn to_oncelog(&self) -> Option<Offset> {
        Offset::parse(&self.0).ok()
    }
}

impl fmt::Display for StreamOffset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<Offset> for StreamOffset {
    fn from(o: Offset) -> Self {
        StreamOffset(o.to_string())
    }
}

impl From<&str> for StreamOffset {
    fn from(s: &str) -> Self {
        StreamOffset(s.to_owned())
    }
}

impl From<String> for StreamOffset {
    fn from(s: String) -> Self {
        StreamOffset(s)
    }
}

/// Where a read starts: the value of the `offset` query parameter.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ReadFrom {
    /// `-1`: the first byte of the stream.
    #[default]
    Beginning,
    /// `now`: the tail at the time of the first request; only later data is read.
    Now,
    /// A token from an earlier read or append.
    Offset(StreamOffset),
}

impl ReadFrom {
    /// The query parameter value.
    pub fn as_query(&self) -> &str {
        match self {
            ReadFrom::Beginning => "-1",
            ReadFrom::Now => "now",
            ReadFrom::Offset(o) => o.as_str(),
        }
    }

    /// Parses the text a user typed: `-1`, `now`, or a token.
    pub fn parse(text: &str) -> ReadFrom {
        match text {
            "-1" => ReadFrom::Beginning,
            "now" => ReadFrom::Now,
            token => ReadFrom::Offset(StreamOffset::new(token)),
        }
    }
}

impl From<OffsetParam> for ReadFrom {
    fn from(p: OffsetParam) -> Self {
        match p {
            OffsetParam::Start => ReadFrom::Beginning,
            OffsetParam::Now => ReadFrom::Now,
            OffsetParam::At(o) => ReadFrom::Offset(o.into()),
        }
    }
}

impl From<StreamOffset> for ReadFrom {
    fn from(o: StreamOffset) -> Self {
        ReadFrom::Offset(o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_orders() {
        let a = StreamOffset::from(Offset(5));
        let b = StreamOffset::from(Offset(40));
        assert!(a < b, "tokens order as positions");
        assert_eq!(a.to_oncelog(), Some(Offset(5)));
        assert_eq!(StreamOffset::new("abc").to_oncelog(), None);
        assert_eq!(ReadFrom::from(OffsetParam::Now).as_query(), "now");
        assert_eq!(ReadFrom::parse("-1"), ReadFrom::Beginning);
        assert_eq!(ReadFrom::parse(&a.to_string()), ReadFrom::Offset(a));
    }
}
