//! An append's body as its stream stores it, the same for a `POST` ([`crate::handlers`]) and a
//! transactional commit's outputs ([`crate::subs`]).

use bytes::Bytes;
use oncelog_protocol::content_type;
use oncelog_protocol::digest::BodyDigest;
use oncelog_protocol::json::{self, EmptyArray};
use oncelog_storage::StreamInfo;

use crate::request::RequestError;

/// An append's body in stored form.
pub(crate) struct Stored {
    /// Framed as JSON: only when the request's and the stream's types both are JSON (any other
    /// mismatch is the engine's 409).
    pub json_framed: bool,
    pub data: Bytes,
    /// For a writer that can tell retries apart (a producer or a key): hashed here, on the
    /// request's task, not on the engine's writer.
    pub body_digest: Option<BodyDigest>,
}

/// Frames `body` for the stream `info` ([`Stored`]); on a compacted stream every message must be
/// a State Protocol message (a compaction must be able to fold every message it meets).
pub(crate) fn stored_body(
    info: &StreamInfo,
    content_type: Option<&str>,
    body: &Bytes,
    digest: bool,
) -> Result<Stored, RequestError> {
    let json_framed =
        content_type.is_some_and(|ct| content_type::is_json(ct) && content_type::is_json(&info.config.content_type));
    let data = match json_framed {
        true => Bytes::from(json::encode_body(body, EmptyArray::Rejected)?),
        false => body.clone(),
    };
    if info.config.compaction {
        oncelog_protocol::state::validate(&data)?;
    }
    let body_digest = digest.then(|| BodyDigest::of(&data));
    Ok(Stored { json_framed, data, body_digest })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use oncelog_protocol::Offset;
    use oncelog_storage::StreamConfig;

    use super::*;

    fn stream(content_type: &str, compaction: bool) -> StreamInfo {
        let config = StreamConfig {
            content_type: content_type.into(),
            expiry: Default::default(),
            retention: Default::default(),
            compaction,
        };
        StreamInfo { id: 1, config: Arc::new(config), tail: Offset(0), closed: false, earliest: Offset(0) }
    }

    #[test]
    fn a_body_is_stored_as_json_only_when_both_types_are_json() {
        let body = Bytes::from_static(b"[1,2]");
        let framed =
            stored_body(&stream("application/json", false), Some("application/json"), &body, true).expect("framed");
        let expected = Bytes::from(json::encode_body(&body, EmptyArray::Rejected).expect("encodes"));
        assert!(framed.json_framed);
        assert_ne!(expected, body);
        assert_eq!(framed.data, expected);
        assert_eq!(framed.body_digest, Some(BodyDigest::of(&expected)));
        // A text stream stores the bytes as sent; no digest unless asked for.
        let plain = stored_body(&stream("text/plain", false), Some("application/json"), &body, false).expect("plain");
        assert!(!plain.json_framed);
        assert_eq!((plain.data, plain.body_digest), (body, None));
        let empty = stored_body(
            &stream("application/json", false),
            Some("application/json"),
            &Bytes::from_static(b"[]"),
            false,
        );
        assert!(matches!(empty, Err(RequestError::Json(_))));
    }

    #[test]
    fn a_compacted_stream_stores_state_protocol_messages_only() {
        let compacted = stream("application/json", true);
        let r = stored_body(&compacted, Some("application/json"), &Bytes::from_static(b"{\"not\":\"state\"}"), false);
        assert!(matches!(r, Err(RequestError::NotStateProtocol(_))));
        let message = Bytes::from_static(br#"{"type":"user","key":"a","value":1,"headers":{"operation":"insert"}}"#);
        assert!(stored_body(&compacted, Some("application/json"), &message, false).is_ok());
    }
}
