//! What a request needs: the operations it performs on which streams, and the grants a token
//! carries to match against.
//!
//! The token claim (documented in `docs/SECURITY.md`):
//!
//! ```json
//! { "oncelog": { "grants": [
//!     { "prefix": "chats/42/", "ops": ["read", "append"] },
//!     { "stream": "logs/app", "ops": ["all"] }
//! ] } }
//! ```
//!
//! A grant names a stream set, `stream` (one exact path) or `prefix` (every path starting with
//! it; `""` is every stream), and operations: `read` (GET and HEAD, every live mode), `append`,
//! `create`, `close`, `delete`, or the groups `write` (append + close), `manage` (create +
//! delete) and `all`. Forking needs `create` on the new path and `read` on the source. Unknown
//! operation names grant nothing (tokens minted for a newer server stay safe on an older one).

use axum::http::request::Parts;
use axum::http::HeaderMap;
use oncelog_protocol::headers::names;

use crate::request_kind::{Kind, SubCall};
use serde::{Deserialize, Serialize};

/// One operation on one stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Read,
    Append,
    Create,
    Close,
    Delete,
    /// Moving a stream's earliest offset forward (`Stream-Trim-To`, `Stream-Compact`).
    Trim,
}

impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Op::Read => "read",
            Op::Append => "append",
            Op::Create => "create",
            Op::Close => "close",
            Op::Delete => "delete",
            Op::Trim => "trim",
        })
    }
}

impl Op {
    /// The operations an operation name in a grant stands for.
    fn named(name: &str) -> &'static [Op] {
        match name {
            "read" => &[Op::Read],
            "append" => &[Op::Append],
            "create" => &[Op::Create],
            "close" => &[Op::Close],
            "delete" => &[Op::Delete],
            "trim" => &[Op::Trim],
            "write" => &[Op::Append, Op::Close],
            "manage" => &[Op::Create, Op::Delete, Op::Trim],
            "all" => &[Op::Read, Op::Append, Op::Create, Op::Close, Op::Delete, Op::Trim],
            _ => &[],
        }
    }
}

/// The `oncelog` claim of a token.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScopeClaim {
    pub grants: Vec<GrantClaim>,
}

/// One grant as written in a token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrantClaim {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    pub ops: Vec<String>,
}

/// A grant's stream set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamSet {
    Exact(String),
    Prefix(String),
}

impl StreamSet {
    fn contains(&self, path: &str) -> bool {
        match self {
            StreamSet::Exact(p) => p == path,
            StreamSet::Prefix(p) => path.starts_with(p.as_str()),
        }
    }
}

/// What a verified token allows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scope {
    grants: Vec<(StreamSet, Vec<Op>)>,
}

/// A grant that names both or neither of `stream` and `prefix`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a grant must name exactly one of `stream` and `prefix`")]
pub struct BadGrant;

impl Scope {
    pub fn from_claim(claim: &ScopeClaim) -> Result<Scope, BadGrant> {
        let mut grants = Vec::with_capacity(claim.grants.len());
        for g in &claim.grants {
            let set = match (&g.stream, &g.prefix) {
                (Some(s), None) => StreamSet::Exact(s.trim_start_matches('/').to_owned()),
                (None, Some(p)) => StreamSet::Prefix(p.trim_start_matches('/').to_owned()),
                _ => return Err(BadGrant),
            };
            let ops = g.ops.iter().flat_map(|o| Op::named(o).iter().copied()).collect();
            grants.push((set, ops));
        }
        Ok(Scope { grants })
    }

    /// Exactly one stream, reads only: what a signed URL grants.
    pub fn read_one(path: &str) -> Scope {
        Scope { grants: vec![(StreamSet::Exact(path.to_owned()), vec![Op::Read])] }
    }

    pub fn allows(&self, path: &str, op: Op) -> bool {
        self.grants.iter().any(|(set, ops)| set.contains(path) && ops.contains(&op))
    }

    /// Whether `op` is allowed on every path that starts with `prefix` (a prefix grant covering
    /// it): what a subscription pattern with that literal prefix may reach.
    pub fn allows_all_under(&self, prefix: &str, op: Op) -> bool {
        self.grants.iter().any(|(set, ops)| {
            matches!(set, StreamSet::Prefix(p) if prefix.starts_with(p.as_str())) && ops.contains(&op)
        })
    }

    /// The non-empty prefix grants allowing `op` that cover `target` (a path, or a pattern's
    /// literal prefix): the shares a subscription following `target` counts against. A grant
    /// of every stream (`""`) confines nothing, and has no share.
    pub fn prefixes_covering(&self, target: &str, op: Op) -> Vec<String> {
        self.grants
            .iter()
            .filter_map(|(set, ops)| match set {
                StreamSet::Prefix(p) if !p.is_empty() && target.starts_with(p.as_str()) && ops.contains(&op) => {
                    Some(p.clone())
                }
                _ => None,
            })
            .collect()
    }
}

/// The stream path of a request URI under `/v1/stream/`, percent-decoded as the router does.
pub fn stream_path(parts: &Parts) -> Option<String> {
    let raw = parts.uri.path().strip_prefix(crate::request::STREAM_PREFIX)?;
    crate::request::decode_stream_path(raw).ok().map(std::borrow::Cow::into_owned)
}

/// Subscription routes whose credentials are checked by their handler rather than by grants:
/// the public key set, and the callback, ack, release and commit calls (their bearer is a
/// subscription token). Managing a subscription (`__ds/subscriptions/{id}`: PUT `create`, GET
/// `read`, DELETE `delete`, `…/streams` `append`/`delete`) and claiming (`…/claim`: `append`)
/// need grants on those paths like any stream.
///
/// Decided by the router's own parse of the raw, still percent-encoded path
/// ([`SubCall::parse`]): an id that only *decodes* to `…/ack` is a management call of that id,
/// and goes through the grants like one.
pub fn subscription_token_checked(method: &axum::http::Method, raw_path: &str) -> bool {
    raw_path.starts_with("/v1/stream/__ds/")
        && matches!(SubCall::parse(method, raw_path), Ok(SubCall::Jwks | SubCall::Fenced { .. }))
}

/// Routes that need valid credentials but no grant on their own path, whatever the method:
/// the stream listing (`__ds/streams`), whose answer is filtered by the caller's `read` grants
/// instead ([`crate::listing`]), so a token learns only paths it could read anyway. Decided by
/// the router's own parse of the raw path, like [`subscription_token_checked`].
pub fn filtered_by_grants(raw_path: &str) -> bool {
    raw_path.starts_with("/v1/stream/__ds/")
        && SubCall::parse(&axum::http::Method::GET, raw_path) == Ok(SubCall::Streams)
}

/// The operations a request of kind `kind` performs on `path` (and, for a fork, on its
/// source), for access control.
pub fn required(kind: Kind, path: &str, headers: &HeaderMap) -> Vec<(String, Op)> {
    let on = |op| (path.to_owned(), op);
    match kind {
        Kind::Read | Kind::Head => vec![on(Op::Read)],
        Kind::Create => vec![on(Op::Create)],
        Kind::Fork => {
            let host = headers.get("host").and_then(|v| v.to_str().ok());
            let source = headers.get(names::STREAM_FORKED_FROM).and_then(|v| v.to_str().ok());
            // An unusable source is refused by the handler (400); it grants nothing here.
            let read_source = source.and_then(|s| crate::request::fork_source(s, host).ok()).map(|s| (s, Op::Read));
            std::iter::once(on(Op::Create)).chain(read_source).collect()
        }
        Kind::Append { closes: false } => vec![on(Op::Append)],
        Kind::Append { closes: true } => vec![on(Op::Append), on(Op::Close)],
        Kind::Close => vec![on(Op::Close)],
        Kind::Trim | Kind::Compact => vec![on(Op::Trim)],
        Kind::Delete => vec![on(Op::Delete)],
        Kind::Preflight | Kind::NotAllowed => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope(grants: &[(&str, bool, &[&str])]) -> Scope {
        let claim = ScopeClaim {
            grants: grants
                .iter()
                .map(|(p, exact, ops)| GrantClaim {
                    stream: exact.then(|| p.to_string()),
                    prefix: (!exact).then(|| p.to_string()),
                    ops: ops.iter().map(|o| o.to_string()).collect(),
                })
                .collect(),
        };
        Scope::from_claim(&claim).expect("valid claim")
    }

    #[test]
    fn grants_match_by_exact_path_or_prefix_and_operation() {
        let s =
            scope(&[("chats/42/", false, &["read", "append"]), ("logs/app", true, &["all"]), ("x", true, &["bogus"])]);
        assert!(s.allows("chats/42/a", Op::Read) && s.allows("chats/42/a", Op::Append));
        assert!(!s.allows("chats/42/a", Op::Delete));
        assert!(!s.allows("chats/43/a", Op::Read));
        assert!(s.allows("logs/app", Op::Delete) && !s.allows("logs/app2", Op::Read));
        assert!(!s.allows("x", Op::Read), "unknown operations grant nothing");
        let groups = scope(&[("", false, &["write"])]);
        assert!(groups.allows("any/thing", Op::Close) && !groups.allows("any/thing", Op::Read));
        // Trimming is its own operation, in `manage` and `all`, not in `write`.
        assert!(!groups.allows("any/thing", Op::Trim));
        assert!(s.allows("logs/app", Op::Trim) && scope(&[("", false, &["manage"])]).allows("a", Op::Trim));
        let trim = axum::http::Request::post("/v1/stream/a")
            .header(names::STREAM_TRIM_TO, "0")
            .body(())
            .expect("request")
            .into_parts()
            .0;
        assert_eq!(
            required(Kind::of(&trim.method, &trim.headers), "a", &trim.headers),
            vec![("a".to_owned(), Op::Trim)]
        );
        let compact = axum::http::Request::post("/v1/stream/a")
            .header(names::STREAM_COMPACT, "true")
            .body(())
            .expect("request")
            .into_parts()
            .0;
        assert_eq!(
            required(Kind::of(&compact.method, &compact.headers), "a", &compact.headers),
            vec![("a".to_owned(), Op::Trim)]
        );
        let fork = axum::http::Request::put("/v1/stream/f")
            .header(names::STREAM_FORKED_FROM, "/v1/stream/src")
            .body(())
            .expect("request")
            .into_parts()
            .0;
        assert_eq!(
            required(Kind::Fork, "f", &fork.headers),
            vec![("f".to_owned(), Op::Create), ("src".to_owned(), Op::Read)]
        );
        assert_eq!(
            required(Kind::Append { closes: true }, "a", &fork.headers),
            vec![("a".to_owned(), Op::Append), ("a".to_owned(), Op::Close)]
        );
        let bad =
            ScopeClaim { grants: vec![GrantClaim { stream: Some("a".into()), prefix: Some("b".into()), ops: vec![] }] };
        assert_eq!(Scope::from_claim(&bad), Err(BadGrant));
    }
}
