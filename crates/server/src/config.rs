//! Server tunables. Defaults are what a production deployment should start from; the binary
//! exposes each as a flag and an environment variable.

use std::time::Duration;

#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// How long a long-poll waits for data before answering 204.
    pub long_poll_timeout: Duration,
    /// How long one SSE response lives before the server ends it so CDNs can collapse
    /// reconnections (section 10.2 suggests about 60 s).
    pub sse_max_duration: Duration,
    /// How long an idle SSE response goes without writing: then it sends a comment, which keeps
    /// proxies from closing it and shows whether the reader is still there.
    pub sse_keepalive: Duration,
    /// Largest request body accepted by append and create; larger gets 413.
    pub max_append_bytes: usize,
    /// Soft cap on one read response (whole appends are never split, so one large append can
    /// exceed it).
    pub max_read_bytes: usize,
    /// Most one catch-up response of a byte stream carries: such a response runs from the offset
    /// asked to the tail or this many bytes further, whichever comes first, and is streamed from
    /// storage `max_read_bytes` at a time (never held whole). A reader catching up on a long
    /// stream then needs one request per this many bytes, not one per `max_read_bytes`. JSON
    /// streams, long-poll and SSE reads keep `max_read_bytes`.
    pub catch_up_bytes: u64,
    /// How often the sweeper looks for expired streams and applies retention policies. Expiry is
    /// also checked on every access, so this only bounds how long expired data occupies disk;
    /// retention is applied only by the sweeper.
    pub sweep_interval: Duration,
    /// On shutdown, how long in-flight requests (live reads included) may take to finish before
    /// their connections are closed.
    pub shutdown_grace: Duration,
    /// Liveness probe path: 200 while the process serves.
    pub healthz_path: String,
    /// Readiness probe path: 200 while writes are accepted, 503 with the reason otherwise.
    pub readyz_path: String,
    /// Prometheus scrape path; `None` switches metrics off (nothing is recorded).
    pub metrics_path: Option<String>,
    /// Per-stream append and read counters for the streams this pattern matches
    /// (`--metrics-streams`; subscription pattern syntax); `None`: none.
    pub metrics_streams: Option<String>,
    /// Most streams given their own series (`--metrics-streams-max`); the rest are summed into
    /// one overflow series.
    pub metrics_streams_max: usize,
    /// Serve the metrics path on a listener of its own at this address (`--metrics-addr`,
    /// plain HTTP) and not on the main one; `None`: on the main one.
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Subscriptions that may exist, in all (`--max-subscriptions`); a create beyond is `429`.
    pub max_subscriptions: usize,
    /// Subscriptions under one prefix grant of a token (`--max-subscriptions-per-prefix`); a
    /// create beyond is `403`. Only prefix-confined tokens have a share.
    pub max_subscriptions_per_prefix: usize,
    /// Connections served at once; beyond it the listener waits for one to close.
    pub max_connections: usize,
    /// Time an HTTP/1 client gets to send a request's headers; also how long an idle keep-alive
    /// connection stays open.
    pub header_read_timeout: Duration,
    /// Longest pause between two pieces of a request body before the request is answered `408`.
    pub body_read_timeout: Duration,
    /// Longest a whole request body may take to arrive (`408` past it): a client dripping a byte
    /// just inside `body_read_timeout` would otherwise hold its request, and its memory, for as
    /// long as it likes.
    pub body_total_timeout: Duration,
    /// Longest a write to a client may stay blocked because the client does not read; then the
    /// connection is closed (a stalled live reader holds memory no longer than this).
    pub write_timeout: Duration,
    /// Live readers (long-poll and SSE) at once, in all; beyond it `503` with `Retry-After`.
    pub max_live_readers: usize,
    /// Live readers of one stream at once; beyond it `503` with `Retry-After`.
    pub max_live_readers_per_stream: usize,
    /// Appends per second per writer (token, or client address without authentication); 0: off.
    pub append_rate_limit: u32,
    /// Append body bytes per second per writer; 0: off.
    pub append_byte_rate_limit: u32,
    /// Browser origins allowed to read answers.
    pub cors_origins: crate::headers::CorsOrigins,
    /// Serve HTTPS with these certificate files; `None`: cleartext (HTTP/1.1 and h2c).
    pub tls: Option<crate::tls::TlsFiles>,
    /// Which engine serves plain (not TLS) HTTP/1 connections (`--http1-engine`); TLS and
    /// HTTP/2 are hyper's either way.
    pub http1_engine: Http1Engine,
    /// Runtimes of their own, one thread each, that connections are spread over
    /// (`--io-threads`; by default one per core); 0: connections run on the caller's runtime.
    pub io_threads: usize,
    /// How often an HTTP/2 connection is pinged, to find peers that vanished without closing.
    pub h2_ping_interval: Duration,
    /// How long the answer to a ping may take before the connection (and its streams) is dropped.
    pub h2_ping_timeout: Duration,
    /// The retention policy of streams created without `Stream-Retention-Max-Age` /
    /// `-Max-Bytes` (`--retention-max-age`, `--retention-max-bytes`); none by default. Fixed
    /// into each stream at creation.
    pub default_retention: oncelog_storage::RetentionPolicy,
    /// The sweeper compacts a stream made for compaction once its history (tail minus earliest
    /// offset) reaches this many bytes, and again each time it grew by as much
    /// (`--compaction-min-bytes`); 0 leaves compaction to requests.
    pub compaction_min_bytes: u64,
    /// Development mode for webhooks (`--dev-webhooks`): also `http` URLs to `localhost` and
    /// `127.0.0.0/8`, for receivers on this machine. Off in production.
    pub dev_webhooks: bool,
    /// The base URL clients reach this server at (`--public-url`), for the callback and JWKS
    /// URLs subscriptions hand out; `None`: the address the server listens on.
    pub public_url: Option<String>,
    /// How long one webhook delivery may take before it counts as failed.
    pub webhook_timeout: Duration,
    /// The webhook signing key is replaced once it is this old; the old one stays published for
    /// an hour ([`crate::signing::RETIRED_KEY_GRACE_MS`]).
    pub webhook_key_max_age: Duration,
    /// `--access-log`: the request log ([`crate::access_log`]) at `info`; otherwise at `debug`
    /// (a `5xx` is always logged).
    pub access_log: bool,
}

impl ServerConfig {
    /// What a request body may be: its size and how long it may take.
    pub fn body_limits(&self) -> crate::body::BodyLimits {
        crate::body::BodyLimits {
            max_bytes: self.max_append_bytes,
            pause: self.body_read_timeout,
            total: self.body_total_timeout,
        }
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            long_poll_timeout: Duration::from_secs(20),
            sse_max_duration: Duration::from_secs(60),
            sse_keepalive: Duration::from_secs(15),
            max_append_bytes: 16 << 20,
            max_read_bytes: 1 << 20,
            catch_up_bytes: 64 << 20,
            sweep_interval: Duration::from_secs(5),
            shutdown_grace: Duration::from_secs(2),
            healthz_path: "/healthz".into(),
            readyz_path: "/readyz".into(),
            metrics_path: Some("/metrics".into()),
            metrics_streams: None,
            metrics_streams_max: 100,
            metrics_addr: None,
            max_subscriptions: 10_000,
            max_subscriptions_per_prefix: 1_000,
            max_connections: 16_384,
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(10),
            body_total_timeout: Duration::from_secs(60),
            write_timeout: Duration::from_secs(30),
            max_live_readers: 15_360,
            max_live_readers_per_stream: 15_360,
            append_rate_limit: 0,
            append_byte_rate_limit: 0,
            cors_origins: crate::headers::CorsOrigins::Any,
            tls: None,
            h2_ping_interval: Duration::from_secs(30),
            h2_ping_timeout: Duration::from_secs(20),
            http1_engine: Http1Engine::default(),
            io_threads: crate::workers::default_count(),
            default_retention: oncelog_storage::RetentionPolicy::NONE,
            compaction_min_bytes: 16 << 20,
            dev_webhooks: false,
            public_url: None,
            webhook_timeout: Duration::from_secs(10),
            webhook_key_max_age: Duration::from_secs(30 * 24 * 3600),
            access_log: false,
        }
    }
}

/// A configuration the server cannot run with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("{name} path {path:?} must start with '/' and lie outside /v1/stream/")]
    OpsPath { name: &'static str, path: String },
    #[error("{0} and another endpoint share a path")]
    DuplicatePath(&'static str),
    #[error("{0} must not be zero")]
    Zero(&'static str),
    #[error("metrics streams pattern: {0}")]
    MetricsStreams(#[from] oncelog_subscriptions::glob::PatternError),
}

impl ServerConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut seen: Vec<&str> = Vec::new();
        let ops = [
            ("healthz", Some(&self.healthz_path)),
            ("readyz", Some(&self.readyz_path)),
            ("metrics", self.metrics_path.as_ref()),
        ];
        for (name, path) in ops {
            let Some(path) = path else { continue };
            let ok = path.starts_with('/')
                && path.len() > 1
                && !path.starts_with("/v1/stream")
                && !path.contains(['{', '}', '*']);
            if !ok {
                return Err(ConfigError::OpsPath { name, path: path.clone() });
            }
            if seen.contains(&path.as_str()) {
                return Err(ConfigError::DuplicatePath(name));
            }
            seen.push(path);
        }
        if self.sweep_interval.is_zero() {
            return Err(ConfigError::Zero("sweep interval"));
        }
        if self.sse_keepalive.is_zero() {
            return Err(ConfigError::Zero("SSE keep-alive"));
        }
        if self.max_read_bytes == 0 {
            return Err(ConfigError::Zero("max read bytes"));
        }
        if self.catch_up_bytes == 0 {
            return Err(ConfigError::Zero("catch-up bytes"));
        }
        if let Some(p) = &self.metrics_streams {
            oncelog_subscriptions::glob::check(p)?;
            if self.metrics_streams_max == 0 {
                return Err(ConfigError::Zero("metrics streams max"));
            }
        }
        if self.max_connections == 0 {
            return Err(ConfigError::Zero("max connections"));
        }
        if self.max_subscriptions == 0 || self.max_subscriptions_per_prefix == 0 {
            return Err(ConfigError::Zero("max subscriptions"));
        }
        if self.max_live_readers == 0 || self.max_live_readers_per_stream == 0 {
            return Err(ConfigError::Zero("max live readers"));
        }
        if self.webhook_timeout.is_zero() {
            return Err(ConfigError::Zero("webhook timeout"));
        }
        if self.webhook_key_max_age.is_zero() {
            return Err(ConfigError::Zero("webhook key max age"));
        }
        if self.header_read_timeout.is_zero()
            || self.body_read_timeout.is_zero()
            || self.body_total_timeout.is_zero()
            || self.write_timeout.is_zero()
        {
            return Err(ConfigError::Zero("read timeout"));
        }
        Ok(())
    }
}

/// The engine of plain (not TLS) HTTP/1 connections (`--http1-engine`): the server's own
/// ([`oncelog_http1`], issue 47; the default), or hyper (kept while issue 47 is under way).
/// Requests reach the same front service either way (`listen.rs`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Http1Engine {
    Hyper,
    #[default]
    Oncelog,
}

impl std::str::FromStr for Http1Engine {
    type Err = UnknownEngine;

    fn from_str(s: &str) -> Result<Self, UnknownEngine> {
        match s {
            "hyper" => Ok(Http1Engine::Hyper),
            "oncelog" => Ok(Http1Engine::Oncelog),
            _ => Err(UnknownEngine),
        }
    }
}

/// An `--http1-engine` other than `hyper` or `oncelog`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the HTTP/1 engine is `hyper` or `oncelog`")]
pub struct UnknownEngine;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ops_paths_are_checked() {
        assert_eq!(ServerConfig::default().validate(), Ok(()));
        for bad in ["healthz", "/", "/v1/stream/x", "/a/{x}"] {
            let c = ServerConfig { healthz_path: bad.into(), ..ServerConfig::default() };
            assert!(matches!(c.validate(), Err(ConfigError::OpsPath { .. })), "{bad}");
        }
        let c = ServerConfig { metrics_path: Some("/healthz".into()), ..ServerConfig::default() };
        assert_eq!(c.validate(), Err(ConfigError::DuplicatePath("metrics")));
        let off = ServerConfig { metrics_path: None, sweep_interval: Duration::ZERO, ..ServerConfig::default() };
        assert_eq!(off.validate(), Err(ConfigError::Zero("sweep interval")));
    }

    #[test]
    fn the_metrics_streams_pattern_and_cap_are_checked() {
        let with = |pattern: &str, max: usize| ServerConfig {
            metrics_streams: Some(pattern.into()),
            metrics_streams_max: max,
            ..ServerConfig::default()
        };
        assert_eq!(with("orders/**", 100).validate(), Ok(()));
        assert!(matches!(with("a/**/b/**/c/**/d/**/e/**", 100).validate(), Err(ConfigError::MetricsStreams(_))));
        assert_eq!(with("orders/*", 0).validate(), Err(ConfigError::Zero("metrics streams max")));
        // The cap alone (no pattern) is not looked at.
        assert_eq!(ServerConfig { metrics_streams_max: 0, ..ServerConfig::default() }.validate(), Ok(()));
    }
}
