//! What a request under `/v1/stream/` asks for, decided once: its [`Kind`] from the method and
//! a few headers (all that access control needs, computed by [`crate::front`] before anything
//! else), then the [`Operation`] with its typed arguments (parsed by [`crate::handlers`], which
//! hands it to that operation's one handler). Data and pure parsing only: a leaf of the server.
//!
//! The routes under `__ds/` (the subscription API, and the stream listing) are routed by
//! [`SubCall`] on the raw, still percent-encoded path, so a stream path inside one segment
//! (`manual%2Fb`) stays one segment.

use axum::http::{HeaderMap, Method};
use oncelog_protocol::headers::{closed_flag, names};
use oncelog_protocol::Offset;
use oncelog_storage::StreamInfo;

use crate::request::{AppendHeaders, CreateHeaders, ReadQuery};

/// Which operation a stream request is, from its method and headers alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `GET`: catch-up, long-poll or SSE.
    Read,
    Head,
    /// `PUT` without `Stream-Forked-From`.
    Create,
    /// `PUT` with `Stream-Forked-From`.
    Fork,
    /// `POST` with a body (`closes`: it also closes the stream).
    Append {
        closes: bool,
    },
    /// `POST` with `Stream-Closed: true` and a body declared empty.
    Close,
    /// `POST` with `Stream-Trim-To`.
    Trim,
    /// `POST` with `Stream-Compact`.
    Compact,
    Delete,
    /// `OPTIONS`: a CORS preflight.
    Preflight,
    /// Any other method.
    NotAllowed,
}

impl Kind {
    pub fn of(method: &Method, headers: &HeaderMap) -> Kind {
        match *method {
            Method::GET => Kind::Read,
            Method::HEAD => Kind::Head,
            Method::PUT if headers.contains_key(names::STREAM_FORKED_FROM) => Kind::Fork,
            Method::PUT => Kind::Create,
            Method::POST if headers.contains_key(names::STREAM_TRIM_TO) => Kind::Trim,
            Method::POST if headers.contains_key(names::STREAM_COMPACT) => Kind::Compact,
            Method::POST => {
                let closes = closed_flag(headers.get(names::STREAM_CLOSED).and_then(|v| v.to_str().ok()));
                let length = headers.get("content-length");
                let declared_empty = length.is_some_and(|v| v.as_bytes() == b"0")
                    || (length.is_none() && !headers.contains_key("transfer-encoding"));
                if closes && declared_empty {
                    Kind::Close
                } else {
                    Kind::Append { closes }
                }
            }
            Method::DELETE => Kind::Delete,
            Method::OPTIONS => Kind::Preflight,
            _ => Kind::NotAllowed,
        }
    }
}

/// A stream request with its typed arguments. Operations on an existing stream carry what the
/// stream looked like when the request arrived (looked up before anything else: a missing
/// stream is `404` whatever else is wrong with the request).
#[derive(Debug)]
pub enum Operation {
    Read {
        info: StreamInfo,
        query: ReadQuery,
    },
    /// `If-Match` compared with the stream's tail.
    Head {
        info: StreamInfo,
        if_match: Option<Option<Vec<Offset>>>,
    },
    Create(CreateHeaders),
    Fork(CreateHeaders),
    Append {
        info: StreamInfo,
        headers: AppendHeaders,
    },
    Close {
        info: StreamInfo,
        headers: AppendHeaders,
    },
    Trim {
        info: StreamInfo,
        to: Offset,
    },
    Compact {
        info: StreamInfo,
    },
    /// `If-Match`: only if the tail is one of these; `purge` (`?purge=true`): a source that
    /// forks read is detached from its path instead of keeping it reserved.
    Delete {
        if_tail: Option<Vec<Offset>>,
        purge: bool,
    },
    Preflight,
}

/// A call under `/v1/stream/__ds/`: the subscription API, or the stream listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubCall {
    /// `GET streams`: the streams the caller may read (an Oncelog extension, answered by
    /// [`crate::listing`], not by the subscription API).
    Streams,
    /// `GET jwks.json`: the webhook signing keys.
    Jwks,
    /// `GET subscriptions`.
    List,
    Put(String),
    Get(String),
    Delete(String),
    /// `POST subscriptions/{id}/streams`.
    AddStreams(String),
    /// `DELETE subscriptions/{id}/streams/{path}`.
    RemoveStream {
        id: String,
        path: String,
    },
    Claim(String),
    /// Callback, ack, release and commit: the subscription token is the credential.
    Fenced {
        id: String,
        call: Fenced,
    },
}

/// The calls fenced by a subscription token and a generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fenced {
    Callback,
    Ack,
    Release,
    Commit,
}

impl Fenced {
    pub fn name(self) -> &'static str {
        match self {
            Fenced::Callback => "callback",
            Fenced::Ack => "ack",
            Fenced::Release => "release",
            Fenced::Commit => "commit",
        }
    }
}

/// Why a `__ds/` path is no call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoCall {
    /// A known route, another method (`405`).
    Method,
    /// No such route (`404`).
    Route,
}

fn segment(raw: &str) -> String {
    percent_encoding::percent_decode_str(raw).decode_utf8_lossy().into_owned()
}

impl SubCall {
    /// The call a method and a raw (percent-encoded) request path under `/v1/stream/__ds` make.
    pub fn parse(method: &Method, raw_path: &str) -> Result<SubCall, NoCall> {
        let rest = raw_path.strip_prefix("/v1/stream/__ds").unwrap_or("").trim_start_matches('/');
        let parts: Vec<&str> = rest.split('/').collect();
        let fenced = match parts.get(2).copied() {
            Some("callback") => Some(Fenced::Callback),
            Some("ack") => Some(Fenced::Ack),
            Some("release") => Some(Fenced::Release),
            Some("commit") => Some(Fenced::Commit),
            _ => None,
        };
        match (method, parts.as_slice(), fenced) {
            (&Method::GET, ["streams"], _) => Ok(SubCall::Streams),
            (&Method::GET, ["jwks.json"], _) => Ok(SubCall::Jwks),
            (&Method::GET, ["subscriptions"], _) => Ok(SubCall::List),
            (m, ["subscriptions", id], _) if !id.is_empty() => match *m {
                Method::PUT => Ok(SubCall::Put(segment(id))),
                Method::GET => Ok(SubCall::Get(segment(id))),
                Method::DELETE => Ok(SubCall::Delete(segment(id))),
                _ => Err(NoCall::Method),
            },
            (&Method::POST, ["subscriptions", id, "streams"], _) => Ok(SubCall::AddStreams(segment(id))),
            (&Method::DELETE, ["subscriptions", id, "streams", path], _) => {
                Ok(SubCall::RemoveStream { id: segment(id), path: segment(path) })
            }
            (&Method::POST, ["subscriptions", id, "claim"], _) => Ok(SubCall::Claim(segment(id))),
            (&Method::POST, ["subscriptions", id, _], Some(call)) => Ok(SubCall::Fenced { id: segment(id), call }),
            (
                _,
                ["streams"]
                | ["jwks.json"]
                | ["subscriptions"]
                | ["subscriptions", _, "streams" | "claim" | "callback" | "ack" | "release" | "commit"]
                | ["subscriptions", _, "streams", _],
                _,
            ) => Err(NoCall::Method),
            _ => Err(NoCall::Route),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(k, v)| (axum::http::HeaderName::from_static(k), axum::http::HeaderValue::from_static(v)))
            .collect()
    }

    #[test]
    fn kinds_follow_method_and_headers() {
        let none = headers(&[]);
        assert_eq!(Kind::of(&Method::GET, &none), Kind::Read);
        assert_eq!(Kind::of(&Method::PUT, &headers(&[("stream-forked-from", "a")])), Kind::Fork);
        assert_eq!(Kind::of(&Method::POST, &headers(&[("stream-trim-to", "0")])), Kind::Trim);
        assert_eq!(Kind::of(&Method::POST, &headers(&[("stream-compact", "true")])), Kind::Compact);
        assert_eq!(Kind::of(&Method::POST, &headers(&[("stream-closed", "true")])), Kind::Close);
        assert_eq!(
            Kind::of(&Method::POST, &headers(&[("stream-closed", "true"), ("content-length", "3")])),
            Kind::Append { closes: true }
        );
        assert_eq!(Kind::of(&Method::POST, &headers(&[("content-length", "3")])), Kind::Append { closes: false });
        assert_eq!(Kind::of(&Method::PATCH, &none), Kind::NotAllowed);
    }

    #[test]
    fn subscription_calls_route_on_the_raw_path() {
        let p = |m: Method, path: &str| SubCall::parse(&m, path);
        assert_eq!(p(Method::GET, "/v1/stream/__ds/jwks.json"), Ok(SubCall::Jwks));
        assert_eq!(p(Method::GET, "/v1/stream/__ds/streams"), Ok(SubCall::Streams));
        assert_eq!(p(Method::POST, "/v1/stream/__ds/streams"), Err(NoCall::Method));
        // A stream named `streams` inside one encoded segment is no route of its own.
        assert_eq!(p(Method::GET, "/v1/stream/__ds%2Fstreams"), Err(NoCall::Route));
        assert_eq!(
            p(Method::DELETE, "/v1/stream/__ds/subscriptions/s/streams/manual%2Fb"),
            Ok(SubCall::RemoveStream { id: "s".into(), path: "manual/b".into() })
        );
        assert_eq!(
            p(Method::POST, "/v1/stream/__ds/subscriptions/s/commit"),
            Ok(SubCall::Fenced { id: "s".into(), call: Fenced::Commit })
        );
        assert_eq!(p(Method::GET, "/v1/stream/__ds/subscriptions/s/ack"), Err(NoCall::Method));
        assert_eq!(p(Method::PATCH, "/v1/stream/__ds/subscriptions/s"), Err(NoCall::Method));
        assert_eq!(p(Method::GET, "/v1/stream/__ds/nothing/here"), Err(NoCall::Route));
    }
}
