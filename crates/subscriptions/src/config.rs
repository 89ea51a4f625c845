//! Which configurations, ids and paths are valid, and which paths a subscription links: pure
//! checks, no I/O.

use std::collections::BTreeSet;

use super::{glob, InvalidSub, SubConfig, SubKind, SubRecord, MAX_LEASE_TTL_MS, MIN_LEASE_TTL_MS};

/// Paths under this prefix are the server's own API, never linked.
pub const RESERVED_PREFIX: &str = "__ds/";

/// Whether `path` is the server's own (`__ds` and everything under it: the subscription API,
/// the stream listing), which no client can reach as a stream. The one rule the router, the
/// listing and linking all ask.
pub fn reserved(path: &str) -> bool {
    path == "__ds" || path.starts_with(RESERVED_PREFIX)
}

/// Whether a path may be linked at all.
pub(super) fn linkable(path: &str) -> bool {
    !path.is_empty() && !reserved(path)
}

impl SubConfig {
    /// Checks and normalizes a configuration as received.
    pub fn normalized(mut self) -> Result<SubConfig, InvalidSub> {
        self.pattern = match self.pattern {
            Some(p) => Some(glob::check(&p)?).filter(|p| !p.is_empty()),
            None => None,
        };
        self.streams.sort();
        self.streams.dedup();
        self.outputs.sort();
        self.outputs.dedup();
        if self.pattern.is_none() && self.streams.is_empty() {
            return Err(InvalidSub::NoTarget);
        }
        if !(MIN_LEASE_TTL_MS..=MAX_LEASE_TTL_MS).contains(&self.lease_ttl_ms) {
            return Err(InvalidSub::LeaseTtl);
        }
        if self.streams.iter().any(|s| !linkable(s)) {
            return Err(InvalidSub::BadPath);
        }
        if let SubKind::PullWake { wake_stream } = &self.kind {
            if wake_stream.is_empty() {
                return Err(InvalidSub::BadPath);
            }
        }
        Ok(self)
    }
}

/// A subscription id as it may appear in a URL segment.
pub fn valid_id(id: &str) -> Result<(), InvalidSub> {
    if id.is_empty() || id.len() > 256 || id.contains('/') {
        return Err(InvalidSub::BadId);
    }
    Ok(())
}

/// Whether a subscription with these explicit links, pattern and wake stream links `path`
/// (before looking at whether a stream exists there). A pull-wake subscription never links its
/// own wake stream: each wake event would be new work for the next wake, without end.
pub(super) fn links(explicit: &BTreeSet<String>, pattern: Option<&str>, wake_stream: Option<&str>, path: &str) -> bool {
    may_link(wake_stream, path) && (explicit.contains(path) || pattern.is_some_and(|p| glob::matches(p, path)))
}

/// Whether a subscription whose wake stream is `wake_stream` may link `path` at all, by name or
/// by pattern: not a reserved path, not its own wake stream.
pub(super) fn may_link(wake_stream: Option<&str>, path: &str) -> bool {
    linkable(path) && wake_stream != Some(path)
}

/// The wake stream of a pull-wake subscription (`None` for a webhook).
pub(super) fn wake_stream(rec: &SubRecord) -> Option<&str> {
    match &rec.config.kind {
        SubKind::PullWake { wake_stream } => Some(wake_stream),
        SubKind::Webhook { .. } => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(pattern: Option<&str>, streams: &[&str]) -> SubConfig {
        SubConfig {
            kind: SubKind::PullWake { wake_stream: "wake".into() },
            pattern: pattern.map(Into::into),
            streams: streams.iter().map(|s| s.to_string()).collect(),
            lease_ttl_ms: 1_000,
            description: None,
            outputs: vec!["out/b".into(), "out/a".into(), "out/b".into()],
        }
    }

    #[test]
    fn normalizing_sorts_dedups_and_refuses_what_cannot_work() {
        let c = config(None, &["b", "a", "b"]).normalized().expect("valid");
        assert_eq!(c.streams, ["a", "b"]);
        assert_eq!(c.outputs, ["out/a", "out/b"]);
        assert_eq!(config(None, &[]).normalized(), Err(InvalidSub::NoTarget));
        assert_eq!(config(Some(""), &[]).normalized(), Err(InvalidSub::NoTarget), "an empty pattern is none");
        assert_eq!(config(None, &["__ds/x"]).normalized(), Err(InvalidSub::BadPath));
        assert_eq!(config(None, &["__ds"]).normalized(), Err(InvalidSub::BadPath));
        assert_eq!(config(None, &[""]).normalized(), Err(InvalidSub::BadPath));
        for ttl in [MIN_LEASE_TTL_MS - 1, MAX_LEASE_TTL_MS + 1] {
            assert_eq!(SubConfig { lease_ttl_ms: ttl, ..config(None, &["a"]) }.normalized(), Err(InvalidSub::LeaseTtl));
        }
        for ttl in [MIN_LEASE_TTL_MS, MAX_LEASE_TTL_MS] {
            assert!(SubConfig { lease_ttl_ms: ttl, ..config(None, &["a"]) }.normalized().is_ok());
        }
        let no_wake_stream =
            SubConfig { kind: SubKind::PullWake { wake_stream: String::new() }, ..config(None, &["a"]) };
        assert_eq!(no_wake_stream.normalized(), Err(InvalidSub::BadPath));
        let hook = SubConfig { kind: SubKind::Webhook { url: "https://h.example".into() }, ..config(Some("a/*"), &[]) };
        assert!(hook.normalized().is_ok());
    }

    #[test]
    fn ids_are_one_url_segment() {
        assert!(valid_id("a").is_ok());
        assert!(valid_id(&"x".repeat(256)).is_ok());
        assert_eq!(valid_id(""), Err(InvalidSub::BadId));
        assert_eq!(valid_id(&"x".repeat(257)), Err(InvalidSub::BadId));
        assert_eq!(valid_id("a/b"), Err(InvalidSub::BadId));
    }

    #[test]
    fn links_by_name_or_pattern_but_never_reserved_paths_or_the_wake_stream() {
        let explicit: BTreeSet<String> = ["x".to_string()].into();
        assert!(links(&explicit, None, None, "x"));
        assert!(!links(&explicit, None, None, "y"));
        assert!(links(&explicit, Some("jobs/*"), None, "jobs/a"));
        assert!(!links(&explicit, Some("jobs/*"), Some("jobs/a"), "jobs/a"), "its own wake stream");
        assert!(!links(&explicit, Some("jobs/*"), Some("x"), "x"), "its own wake stream, even named");
        assert!(!links(&BTreeSet::new(), Some("**"), None, "__ds/subscriptions"));
        assert!(!links(&BTreeSet::new(), Some("**"), None, "__ds"));
    }
}
