//! `oncelog serve`: picks and opens the storage engine (the log engine by default, PostgreSQL on request), then runs [`oncelog_server::serve`]
//! until SIGTERM or Ctrl-C. Flags, behaviour and the one stdout line are part of the contract.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::ArgAction;
use oncelog_log::{LogEngine, LogOptions};
use oncelog_postgres::{PgEngine, PgOptions};
use oncelog_server::auth::token::{TokenAuth, TokenConfig};
use oncelog_server::headers::CorsOrigins;
use oncelog_server::tls::TlsFiles;
use oncelog_server::{AppState, Authorize, ServerConfig};

#[derive(clap::Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub log: crate::logging::LogArgs,

    /// Log one line per stream request at info (method, path, status, bytes, duration, producer
    /// id / epoch / seq, the reason of a refusal); without it the line is at debug. A 5xx is
    /// always logged. Never tokens, signatures or bodies.
    #[arg(long, env = "ONCELOG_ACCESS_LOG")]
    access_log: bool,

    /// Address to listen on. Port 0 picks a free port; the chosen address is printed on stdout.
    #[arg(long, env = "ONCELOG_ADDR", default_value = "127.0.0.1:4437")]
    addr: SocketAddr,

    /// Directory holding the data; created if missing. One server per directory.
    #[arg(long, env = "ONCELOG_DATA_DIR", default_value = "./data")]
    data_dir: PathBuf,

    /// How long a long-poll read waits for new data before answering 204, in milliseconds.
    #[arg(long, env = "ONCELOG_LONG_POLL_TIMEOUT_MS", default_value_t = 20_000)]
    long_poll_timeout_ms: u64,

    /// Largest request body (append or create) in bytes; larger requests get 413.
    #[arg(long, env = "ONCELOG_MAX_APPEND_BYTES", default_value_t = 16 << 20)]
    max_append_bytes: usize,

    /// Soft cap on one read from storage: a JSON, long-poll or SSE response, or one piece of a
    /// streamed catch-up response (one append is never split, except to cut a byte stream's
    /// catch-up response at --catch-up-bytes).
    #[arg(long, env = "ONCELOG_MAX_READ_BYTES", default_value_t = 1 << 20)]
    max_read_bytes: usize,

    /// Most one catch-up response of a byte stream carries (to the tail or this many bytes,
    /// whichever comes first), streamed from storage --max-read-bytes at a time.
    #[arg(long, env = "ONCELOG_CATCH_UP_BYTES", default_value_t = 64 << 20)]
    catch_up_bytes: u64,

    /// How long one SSE response lasts before the server ends it (clients reconnect), in ms.
    #[arg(long, env = "ONCELOG_SSE_MAX_DURATION_MS", default_value_t = 60_000)]
    sse_max_duration_ms: u64,

    /// Acknowledge writes only after fdatasync (true, the default). With false, writes are
    /// acknowledged once handed to the OS: they survive a crash of oncelog but not of the machine.
    #[arg(long, env = "ONCELOG_FSYNC", default_value_t = true, action = ArgAction::Set)]
    fsync: bool,

    /// How often an HTTP/2 connection is pinged (to find peers that vanished), in ms.
    #[arg(long, env = "ONCELOG_H2_PING_INTERVAL_MS", default_value_t = 30_000)]
    h2_ping_interval_ms: u64,

    /// How long a ping's answer may take before the HTTP/2 connection is dropped, in ms.
    #[arg(long, env = "ONCELOG_H2_PING_TIMEOUT_MS", default_value_t = 20_000)]
    h2_ping_timeout_ms: u64,

    /// Which engine serves plain HTTP/1 connections: `oncelog` (the server's own, crates/http1)
    /// or `hyper`. TLS and HTTP/2 are served by hyper either way.
    #[arg(long, env = "ONCELOG_HTTP1_ENGINE", default_value = "oncelog")]
    http1_engine: oncelog_server::listen::Http1Engine,

    /// Threads that serve connections, each with a runtime of its own (a connection stays on
    /// one); by default one per core; 0: connections share the main work-stealing runtime.
    #[arg(long, env = "ONCELOG_IO_THREADS", default_value_t = oncelog_server::workers::default_count())]
    io_threads: usize,

    /// `--storage log`: memory for the hot tail, the most recent appends kept for live readers
    /// (shared by all streams; only streams a reader followed live in the last 30 s), in MiB.
    /// 0 turns it off (live reads then come from the page cache).
    #[arg(long, env = "ONCELOG_HOT_TAIL_MB", default_value_t = 32)]
    hot_tail_mb: usize,

    /// `--storage log`: also keep the log in a bucket, the durable home of its streams when this
    /// machine's disk is lost: `s3://BUCKET/PREFIX` (any S3 API store; endpoint, region and
    /// credentials from the standard AWS_* environment variables) or `file:///DIR`. A node
    /// started on an empty --data-dir restores from it; one writer per prefix (a node that takes
    /// it over fences the one before). See docs/OPERATIONS.md.
    #[arg(long, env = "ONCELOG_OBJECT_STORE", value_name = "URL")]
    object_store: Option<oncelog_bucket::Location>,

    /// With --object-store: when an append is acknowledged. `local`: after the local fsync, and
    /// shipped to the bucket within --ship-interval (losing the disk loses at most that window,
    /// never doubles anything). `bucket`: only once the bucket holds it (readers see it from
    /// then on too): losing the disk loses nothing acknowledged.
    #[arg(long, env = "ONCELOG_ACK_MODE", default_value = "local", value_enum, requires = "object_store")]
    ack_mode: AckMode,

    /// With --ack-mode bucket: how long a write waits for the bucket before it is answered 503
    /// with Retry-After (its outcome unknown: a producer's retry is recognised); it becomes
    /// visible once the bucket holds it (`500ms`, `5s`, `1m`).
    #[arg(long, env = "ONCELOG_BUCKET_ACK_TIMEOUT", default_value = "5s", value_parser = parse_interval, requires = "object_store")]
    bucket_ack_timeout: Duration,

    /// With --object-store: how often what was written is shipped to the bucket (`500ms`, `1s`,
    /// `1m`).
    #[arg(long, env = "ONCELOG_SHIP_INTERVAL", default_value = "1s", value_parser = parse_interval, requires = "object_store")]
    ship_interval: Duration,

    /// With --object-store: the most bytes of log segments kept on the local disk (`10GiB`,
    /// `512MiB`; default: all). Older segments the bucket holds are evicted past it and read
    /// from the bucket in 1 MiB blocks with read-ahead; with room, segments only in the bucket
    /// (after a restore, which downloads only what recovery replays) are fetched back.
    #[arg(long, env = "ONCELOG_CACHE_MAX_BYTES", value_parser = crate::token::parse_bytes, requires = "object_store")]
    cache_max_bytes: Option<u64>,

    /// On SIGTERM, how long in-flight requests (including live reads) may take to finish, in ms.
    #[arg(long, env = "ONCELOG_SHUTDOWN_GRACE_MS", default_value_t = 2_000)]
    shutdown_grace_ms: u64,

    /// Storage engine: `log` (Oncelog's own log in --data-dir, the default) or a PostgreSQL URL
    /// (`postgres://user@host:port/database`): several nodes then serve one database (see
    /// docs/OPERATIONS.md). A password missing from the URL is taken from PGPASSWORD.
    #[arg(long, env = "ONCELOG_STORAGE", default_value = "log")]
    pub(crate) storage: String,

    /// With a PostgreSQL URL: the schema holding Oncelog's tables (one database can host several
    /// Oncelog clusters, one schema each).
    #[arg(long, env = "ONCELOG_PG_SCHEMA", default_value = "oncelog")]
    pg_schema: String,

    /// With a PostgreSQL URL: database connections per node for requests (live readers do not
    /// hold one while they wait). Keep nodes x (this + 2) below the server's max_connections.
    #[arg(long, env = "ONCELOG_PG_POOL_SIZE", default_value_t = 16)]
    pg_pool_size: usize,

    /// With a PostgreSQL URL: committer tasks per node. Each batches the appends of its share of
    /// the streams into one transaction per group; fewer make larger groups (fewer commits,
    /// less CPU per append), more overlap more commits.
    #[arg(long, env = "ONCELOG_PG_COMMITTERS", default_value_t = 1)]
    pg_committers: usize,

    /// With a PostgreSQL URL: the deadline, in milliseconds, of each request's work in the
    /// database; past it the request is answered 503 with Retry-After (its outcome unknown: a
    /// producer's retry is recognised). Sessions derive their bounds from it, so PostgreSQL ends
    /// the transactions of a node cut off from it within 3/5 of it and other nodes go on.
    #[arg(long, env = "ONCELOG_PG_REQUEST_TIMEOUT_MS", default_value_t = 5000, value_parser = clap::value_parser!(u64).range(1000..=600_000))]
    pg_request_timeout_ms: u64,

    /// With a PostgreSQL URL: start even if the database's synchronous_commit is below on (off,
    /// local, remote_write), accepting that acknowledged appends may be lost in a database crash
    /// or failover. Without it such a database is refused at start.
    #[arg(long, env = "ONCELOG_PG_ACCEPT_COMMIT_LOSS")]
    pg_accept_commit_loss: bool,

    /// How long a producer's state (its epoch, sequence and receipts) is kept after its last
    /// accepted append: `7d`, `24h`, `30m`, `90s`. A retry that arrives later may be taken as new
    /// data (see docs/WRITE-MODES.md); expired state is pruned by the sweep within a minute.
    #[arg(long, env = "ONCELOG_PRODUCER_STATE_TTL", default_value = "7d", value_parser = crate::token::parse_duration)]
    pub producer_state_ttl: std::time::Duration,

    /// Live producer states one stream may hold. A Producer-Id new to the stream beyond it is
    /// refused with 429 and Retry-After, storing nothing (see docs/WRITE-MODES.md); producers the
    /// stream knows are never refused by it. A slot frees when a producer's state expires
    /// (--producer-state-ttl).
    #[arg(long, env = "ONCELOG_MAX_PRODUCERS_PER_STREAM", default_value_t = oncelog_storage::rules::Retention::DEFAULT_MAX_PRODUCERS_PER_STREAM, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_producers_per_stream: u64,

    /// Producer states the server may hold across all streams (each costs memory on the log
    /// engine: see docs/OPERATIONS.md). Beyond it a new producer is refused with 429 and
    /// Retry-After; expired states free their slots when the sweep prunes them (once a minute).
    /// On PostgreSQL it is counted per node (see docs/OPERATIONS.md).
    #[arg(long, env = "ONCELOG_MAX_PRODUCERS", default_value_t = oncelog_storage::rules::Retention::DEFAULT_MAX_PRODUCERS, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_producers: u64,

    /// How long an Idempotency-Key is remembered after its append: `24h`, `7d`, `30m`. A repeat
    /// that arrives later is taken as new data (see docs/WRITE-MODES.md).
    #[arg(long, env = "ONCELOG_IDEMPOTENCY_WINDOW", default_value = "24h", value_parser = crate::token::parse_duration)]
    pub idempotency_window: std::time::Duration,

    /// Default retention of streams created without `Stream-Retention-Max-Age`: data older than
    /// this (`7d`, `24h`, `30m`) is dropped by the sweep, in whole appends. Fixed into each stream
    /// at creation; none by default.
    #[arg(long, env = "ONCELOG_RETENTION_MAX_AGE", value_parser = crate::token::parse_duration)]
    pub retention_max_age: Option<std::time::Duration>,

    /// Default retention of streams created without `Stream-Retention-Max-Bytes`: keep at least
    /// this many of the newest bytes (`10G`, `512M`, or bytes), drop whole appends before them.
    /// Fixed into each stream at creation; none by default.
    #[arg(long, env = "ONCELOG_RETENTION_MAX_BYTES", value_parser = crate::token::parse_bytes)]
    pub retention_max_bytes: Option<u64>,

    /// Compact a stream created with `Stream-Compaction: state` in the background once its
    /// history reaches this size (`16M`, `1G`, bytes), and again each time it grew by as much;
    /// `off` leaves compaction to `POST` with `Stream-Compact: true`.
    #[arg(long, env = "ONCELOG_COMPACTION_MIN_BYTES", default_value = "16M", value_parser = parse_min_bytes)]
    pub compaction_min_bytes: u64,

    /// Development mode for webhooks: also allow `http` webhook URLs to `localhost` and
    /// `127.0.0.0/8` (receivers on this machine, as in tests). Never in production.
    #[arg(long, env = "ONCELOG_DEV_WEBHOOKS", default_value_t = false)]
    pub dev_webhooks: bool,

    /// The base URL clients reach this server at (e.g. `https://streams.example.com`), used in
    /// the callback and JWKS URLs subscriptions hand out; default: the listening address.
    #[arg(long, env = "ONCELOG_PUBLIC_URL")]
    pub public_url: Option<String>,

    /// How long one webhook delivery may take before it counts as failed and is retried, in ms.
    #[arg(long, env = "ONCELOG_WEBHOOK_TIMEOUT_MS", default_value_t = 10_000)]
    pub webhook_timeout_ms: u64,

    /// Replace the webhook signing key once it is this old (`30d`, `12h`); the old key stays in
    /// the published key set for an hour, so receivers and in-flight deliveries still verify.
    #[arg(long, env = "ONCELOG_WEBHOOK_KEY_MAX_AGE", default_value = "30d", value_parser = crate::token::parse_duration)]
    pub webhook_key_max_age: std::time::Duration,

    /// How often expired streams are looked for and deleted, and retention policies applied,
    /// in ms (access already hides expired streams).
    #[arg(long, env = "ONCELOG_SWEEP_INTERVAL_MS", default_value_t = 5_000)]
    sweep_interval_ms: u64,

    /// Record and serve Prometheus metrics.
    #[arg(long, env = "ONCELOG_METRICS", default_value_t = true, action = ArgAction::Set)]
    metrics: bool,

    /// Path of the Prometheus scrape.
    #[arg(long, env = "ONCELOG_METRICS_PATH", default_value = "/metrics")]
    metrics_path: String,

    /// Per-stream append and read counters (`oncelog_stream_*`, label `stream`) for the streams
    /// this pattern matches: `*` one path segment, `**` any number (`orders/**`). Off by default.
    #[arg(long, env = "ONCELOG_METRICS_STREAMS", value_name = "GLOB")]
    metrics_streams: Option<String>,

    /// With --metrics-streams: most streams given their own series (the first to be appended to
    /// or read); the others' counts are summed in `oncelog_stream_overflow_total`.
    #[arg(long, env = "ONCELOG_METRICS_STREAMS_MAX", default_value_t = 100)]
    metrics_streams_max: usize,

    /// Serve the metrics path only on a listener of its own at this address (plain HTTP, e.g.
    /// 127.0.0.1:9090), not on the main listener. Off by default (the main listener serves it).
    #[arg(long, env = "ONCELOG_METRICS_ADDR", value_name = "ADDR")]
    metrics_addr: Option<std::net::SocketAddr>,

    /// Most subscriptions that may exist, in all; a create beyond is refused `429`.
    #[arg(long, env = "ONCELOG_MAX_SUBSCRIPTIONS", default_value_t = 10_000)]
    max_subscriptions: usize,

    /// With access control: most subscriptions under one prefix grant of the creating token
    /// (what its pattern, streams and wake stream lie under); a create beyond is refused `403`.
    #[arg(long, env = "ONCELOG_MAX_SUBSCRIPTIONS_PER_PREFIX", default_value_t = 1_000)]
    max_subscriptions_per_prefix: usize,

    /// Path of the liveness probe (200 while the process serves).
    #[arg(long, env = "ONCELOG_HEALTHZ_PATH", default_value = "/healthz")]
    healthz_path: String,

    /// Path of the readiness probe (200 while writes are accepted, else 503 with the reason).
    #[arg(long, env = "ONCELOG_READYZ_PATH", default_value = "/readyz")]
    readyz_path: String,

    /// Connections served at once; beyond it new clients wait until one closes. Live readers on
    /// HTTP/1 (a connection each) may hold all but a sixteenth of them (at most 1,024 kept free),
    /// so writers always get in. Lowered at start, with a warning, when the process may not open
    /// that many files (the soft RLIMIT_NOFILE is raised to the hard one first).
    #[arg(long, env = "ONCELOG_MAX_CONNECTIONS", default_value_t = 16_384)]
    max_connections: usize,

    /// Time a client gets to send a request's headers, and how long an idle HTTP/1 keep-alive
    /// connection stays open, in ms.
    #[arg(long, env = "ONCELOG_HEADER_READ_TIMEOUT_MS", default_value_t = 10_000)]
    header_read_timeout_ms: u64,

    /// Longest pause between two pieces of a request body before the request gets 408, in ms.
    #[arg(long, env = "ONCELOG_BODY_READ_TIMEOUT_MS", default_value_t = 10_000)]
    body_read_timeout_ms: u64,

    /// Longest a whole request body may take to arrive, in ms; past it the request gets 408
    /// (a client dripping bytes just inside --body-read-timeout-ms is cut off here).
    #[arg(long, env = "ONCELOG_BODY_TOTAL_TIMEOUT_MS", default_value_t = 60_000)]
    body_total_timeout_ms: u64,

    /// Longest a write to a client may stay blocked because it does not read, in ms; then the
    /// connection is closed (a stalled live reader holds memory no longer than this).
    #[arg(long, env = "ONCELOG_WRITE_TIMEOUT_MS", default_value_t = 30_000)]
    write_timeout_ms: u64,

    /// Live readers (long-poll and SSE) at once, in all; beyond it 503 with Retry-After.
    #[arg(long, env = "ONCELOG_MAX_LIVE_READERS", default_value_t = 15_360)]
    max_live_readers: usize,

    /// Live readers of one stream at once; beyond it 503 with Retry-After. By default as many as
    /// in all: thousands of readers following one stream is what streams are for.
    #[arg(long, env = "ONCELOG_MAX_LIVE_READERS_PER_STREAM", default_value_t = 15_360)]
    max_live_readers_per_stream: usize,

    /// How long an idle SSE response goes without writing before it sends a comment, in ms.
    #[arg(long, env = "ONCELOG_SSE_KEEPALIVE_MS", default_value_t = 15_000)]
    sse_keepalive_ms: u64,

    /// Appends per second per writer (its token, or its address with authentication off);
    /// beyond it 429 with Retry-After. 0: no limit.
    #[arg(long, env = "ONCELOG_APPEND_RATE_LIMIT", default_value_t = 0)]
    append_rate_limit: u32,

    /// Append body bytes per second per writer; beyond it 429 with Retry-After. 0: no limit.
    #[arg(long, env = "ONCELOG_APPEND_BYTE_RATE_LIMIT", default_value_t = 0)]
    append_byte_rate_limit: u32,

    /// Browser origins allowed to read answers: `*` (any; the default, for development) or a
    /// comma-separated list such as https://app.example.com,https://admin.example.com.
    #[arg(long, env = "ONCELOG_CORS_ORIGINS", default_value = "*")]
    cors_origins: String,

    /// PEM certificate chain: serve HTTPS (with --tls-key); HTTP/2 and HTTP/1.1 by ALPN. The files
    /// are re-read when they change (new connections get the new certificate).
    #[arg(long, env = "ONCELOG_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,

    /// PEM private key of --tls-cert.
    #[arg(long, env = "ONCELOG_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,

    /// HMAC secret file: turns authentication on (bearer tokens, signed read URLs).
    #[arg(long, env = "ONCELOG_AUTH_SECRET_FILE")]
    auth_secret_file: Option<PathBuf>,

    /// JWKS file of public keys for bearer tokens from an identity provider: turns
    /// authentication on. Re-read when it changes, as is the secret file.
    #[arg(long, env = "ONCELOG_AUTH_JWKS")]
    auth_jwks: Option<PathBuf>,

    /// Required `iss` claim of bearer tokens.
    #[arg(long, env = "ONCELOG_AUTH_ISSUER")]
    auth_issuer: Option<String>,

    /// Required `aud` claim of bearer tokens.
    #[arg(long, env = "ONCELOG_AUTH_AUDIENCE")]
    auth_audience: Option<String>,

    /// Answer 404 instead of 403 to a valid token outside its grants, so a private stream's
    /// existence is not revealed.
    #[arg(long, env = "ONCELOG_AUTH_HIDE_FORBIDDEN", default_value_t = false, action = ArgAction::Set)]
    auth_hide_forbidden: bool,
}

/// `--ack-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AckMode {
    Local,
    Bucket,
}

/// Why `oncelog serve` could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("unknown storage {0:?}: the choices are `log` (the default) and a PostgreSQL URL (postgres://…)")]
    UnknownStorage(String),
    #[error("--fsync false does not apply to PostgreSQL: durability is the database's (synchronous_commit); leave --fsync at its default")]
    FsyncWithPostgres,
    #[error("--addr {addr}: {source}{}", bind_hint(source))]
    Bind { addr: SocketAddr, source: std::io::Error },
    #[error("--object-store does not apply to PostgreSQL: its durability is the database's")]
    ObjectStoreWithPostgres,
    #[error("--object-store {location}: {source}")]
    ObjectStore { location: String, source: oncelog_bucket::BucketError },
    /// The log engine could not open `--data-dir`: the path is named, so the operator knows
    /// which directory's permissions, space or contents to look at.
    #[error("--data-dir {}: {source}", path.display())]
    DataDir { path: std::path::PathBuf, source: oncelog_storage::StorageError },
}

pub async fn serve(args: ServeArgs) -> Result<(), Box<dyn std::error::Error>> {
    // The recorder goes in before the engine opens: what the engine records while it starts
    // (the bucket tier's writer epoch and cold segments, set once) is otherwise recorded into
    // no recorder and never exported. Installing is idempotent: the server's state takes the
    // same handle later.
    if args.metrics {
        oncelog_server::metrics::install();
    }
    let config = ServerConfig {
        long_poll_timeout: Duration::from_millis(args.long_poll_timeout_ms),
        sse_max_duration: Duration::from_millis(args.sse_max_duration_ms),
        max_append_bytes: args.max_append_bytes,
        max_read_bytes: args.max_read_bytes,
        catch_up_bytes: args.catch_up_bytes,
        sweep_interval: Duration::from_millis(args.sweep_interval_ms),
        shutdown_grace: Duration::from_millis(args.shutdown_grace_ms),
        healthz_path: args.healthz_path.clone(),
        readyz_path: args.readyz_path.clone(),
        metrics_path: args.metrics.then(|| args.metrics_path.clone()),
        metrics_streams: args.metrics_streams.clone(),
        metrics_streams_max: args.metrics_streams_max,
        metrics_addr: args.metrics_addr,
        max_subscriptions: args.max_subscriptions,
        max_subscriptions_per_prefix: args.max_subscriptions_per_prefix,
        max_connections: fit_connections(args.max_connections),
        header_read_timeout: Duration::from_millis(args.header_read_timeout_ms),
        body_read_timeout: Duration::from_millis(args.body_read_timeout_ms),
        body_total_timeout: Duration::from_millis(args.body_total_timeout_ms),
        write_timeout: Duration::from_millis(args.write_timeout_ms),
        h2_ping_interval: Duration::from_millis(args.h2_ping_interval_ms),
        h2_ping_timeout: Duration::from_millis(args.h2_ping_timeout_ms),
        http1_engine: args.http1_engine,
        io_threads: args.io_threads,
        max_live_readers: args.max_live_readers,
        max_live_readers_per_stream: args.max_live_readers_per_stream,
        sse_keepalive: Duration::from_millis(args.sse_keepalive_ms),
        cors_origins: CorsOrigins::parse(&args.cors_origins),
        append_rate_limit: args.append_rate_limit,
        append_byte_rate_limit: args.append_byte_rate_limit,
        tls: match (&args.tls_cert, &args.tls_key) {
            (Some(cert), Some(key)) => Some(TlsFiles { cert: cert.clone(), key: key.clone() }),
            _ => None,
        },
        compaction_min_bytes: args.compaction_min_bytes,
        dev_webhooks: args.dev_webhooks,
        public_url: args.public_url.clone(),
        webhook_timeout: Duration::from_millis(args.webhook_timeout_ms),
        webhook_key_max_age: args.webhook_key_max_age,
        access_log: args.access_log,
        default_retention: oncelog_storage::RetentionPolicy {
            max_age_s: args.retention_max_age.map(|d| d.as_secs()),
            max_bytes: args.retention_max_bytes,
        },
    };
    config.validate()?;
    let auth = access_control(&args)?;
    // Bound before the engine opens: an address in use is reported at once, naming it, not
    // after a recovery of minutes (connections made meanwhile wait in the backlog).
    let listener = tokio::net::TcpListener::bind(args.addr)
        .await
        .map_err(|source| StartError::Bind { addr: args.addr, source })?;
    match args.storage.as_str() {
        "log" => {
            let mut state = AppState::new(Arc::new(open_log(&args)?), config);
            if let Some(auth) = auth {
                state = state.with_auth(auth);
            }
            run(state, listener).await
        }
        url if is_postgres_url(url) => {
            let mut state = AppState::new(Arc::new(open_postgres(&args, url).await?), config);
            if let Some(auth) = auth {
                state = state.with_auth(auth);
            }
            run(state, listener).await
        }
        other => Err(StartError::UnknownStorage(other.to_owned()).into()),
    }
}

/// An interval: a number followed by `ms`, `s` or `m`, above zero.
fn parse_interval(text: &str) -> Result<Duration, String> {
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (n, unit) = text.split_at(split);
    let n: u64 = n.parse().map_err(|_| format!("{text:?}: expected a number followed by ms, s or m"))?;
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.saturating_mul(60)),
        _ => return Err(format!("{text:?}: the unit must be ms, s or m")),
    };
    if d.is_zero() {
        return Err("the interval must be positive".into());
    }
    Ok(d)
}

/// This node's name in the bucket's manifests: `host:pid`.
fn node_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_owned()).unwrap_or_default();
    format!("{}:{}", if host.is_empty() { "oncelog" } else { &host }, std::process::id())
}

/// `off` (0) or a size, as `token::parse_bytes` reads it.
fn parse_min_bytes(text: &str) -> Result<u64, String> {
    if text.eq_ignore_ascii_case("off") {
        return Ok(0);
    }
    crate::token::parse_bytes(text)
}

fn retention(args: &ServeArgs) -> oncelog_storage::rules::Retention {
    let ms = |d: std::time::Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
    oncelog_storage::rules::Retention {
        producer_ttl_ms: ms(args.producer_state_ttl),
        idempotency_window_ms: ms(args.idempotency_window),
        max_producers_per_stream: args.max_producers_per_stream,
        max_producers: args.max_producers,
    }
}

fn open_log(args: &ServeArgs) -> Result<LogEngine, Box<dyn std::error::Error>> {
    // The engine creates the directory itself (`LogEngine::open`), so every failure to use it is
    // reported once, naming the path.
    let mut opts = LogOptions::new(&args.data_dir);
    opts.durability = if args.fsync { oncelog_log::Durability::Fsync } else { oncelog_log::Durability::Buffered };
    opts.hot_bytes = args.hot_tail_mb << 20;
    opts.retention = retention(args);
    if let Some(location) = &args.object_store {
        let ack = match args.ack_mode {
            AckMode::Local => oncelog_log::tier::AckMode::Local,
            AckMode::Bucket => oncelog_log::tier::AckMode::Bucket { timeout: args.bucket_ack_timeout },
        };
        let bucket = oncelog_bucket::Bucket::open(location, &[])
            .map_err(|source| StartError::ObjectStore { location: location.to_string(), source })?;
        opts.tier = Some(oncelog_log::tier::Tier {
            bucket,
            ship_interval: args.ship_interval,
            node: node_name(),
            ack,
            sweep_after: oncelog_log::tier::SWEEP_AFTER,
            cache_max_bytes: args.cache_max_bytes,
            delete_grace: oncelog_log::tier::DELETE_GRACE,
        });
    }
    let started = std::time::Instant::now();
    let engine = LogEngine::open(opts).map_err(|source| StartError::DataDir { path: args.data_dir.clone(), source })?;
    let r = engine.recovery_report();
    tracing::info!(
        data_dir = %args.data_dir.display(),
        streams = r.streams,
        closed = r.closed_streams,
        producers = r.producers,
        bytes = r.bytes,
        from_checkpoint = r.from_checkpoint,
        segments_replayed = r.segments_replayed,
        frames_replayed = r.frames_replayed,
        torn_bytes_cut = r.torn_bytes_cut,
        elapsed_ms = started.elapsed().as_millis() as u64,
        fsync = args.fsync,
        "recovered"
    );
    Ok(engine)
}

/// Token authentication when a secret or JWKS file is given; otherwise none, with a warning
/// when the server is reachable from other machines.
fn access_control(args: &ServeArgs) -> Result<Option<Arc<dyn Authorize>>, Box<dyn std::error::Error>> {
    if args.auth_secret_file.is_none() && args.auth_jwks.is_none() {
        if !args.addr.ip().is_loopback() {
            tracing::warn!(addr = %args.addr, "authentication is off and the server listens beyond loopback: anyone who reaches it can read, write and delete every stream (see --auth-secret-file)");
        }
        return Ok(None);
    }
    let auth = TokenAuth::load(TokenConfig {
        secret_file: args.auth_secret_file.clone(),
        jwks_file: args.auth_jwks.clone(),
        issuer: args.auth_issuer.clone(),
        audience: args.auth_audience.clone(),
        hide_forbidden: args.auth_hide_forbidden,
    })?;
    auth.spawn_reloader(Duration::from_secs(1));
    tracing::info!(secret = args.auth_secret_file.is_some(), jwks = args.auth_jwks.is_some(), "authentication on");
    Ok(Some(auth))
}

/// File descriptors the server needs besides its connections: the log's segments and checkpoint,
/// the listener, a database pool and its `LISTEN` connection, webhook deliveries, stdio.
const FDS_BESIDES_CONNECTIONS: u64 = 512;

/// `max_connections`, lowered (with a warning) to what the process may open: the soft
/// `RLIMIT_NOFILE` is raised to the hard limit first, as far as it goes. A limit the server
/// would run into anyway is better met as a bound it keeps (new clients wait in the backlog,
/// live readers keep the reserve free) than as `accept` failing with `EMFILE`.
fn fit_connections(max_connections: usize) -> usize {
    let Some(limit) = raise_fd_limit() else { return max_connections };
    let usable = usize::try_from(limit.saturating_sub(FDS_BESIDES_CONNECTIONS)).unwrap_or(usize::MAX).max(16);
    if max_connections > usable {
        tracing::warn!(max_connections, fd_limit = limit, lowered_to = usable, "--max-connections does not fit the open-files limit (RLIMIT_NOFILE): lowered; raise the limit (systemd LimitNOFILE, ulimit -n) to serve more");
        return usable;
    }
    max_connections
}

/// Raises the soft open-files limit to the hard one; answers the soft limit now (`None` when it
/// cannot be read).
fn raise_fd_limit() -> Option<u64> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit and setrlimit only read and write the struct passed to them.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return None;
        }
        if lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit { rlim_cur: lim.rlim_max, rlim_max: lim.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                lim.rlim_cur = lim.rlim_max;
            }
        }
    }
    // `rlim_t` is `u64` on Linux, not on every target libc knows.
    #[allow(clippy::unnecessary_cast)]
    let limit = lim.rlim_cur as u64;
    Some(limit)
}

/// What to do about a listen address that cannot be bound.
fn bind_hint(e: &std::io::Error) -> &'static str {
    match e.kind() {
        std::io::ErrorKind::AddrInUse => " (another process listens there: stop it or choose another --addr)",
        std::io::ErrorKind::AddrNotAvailable => " (no interface of this machine has that address)",
        std::io::ErrorKind::PermissionDenied => " (ports below 1024 need privileges)",
        _ => "",
    }
}

/// Whether `--storage` names a PostgreSQL database.
fn is_postgres_url(s: &str) -> bool {
    s.starts_with("postgres://") || s.starts_with("postgresql://")
}

/// The URL without its password, for logs.
fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_owned() };
    match rest.split_once('@') {
        Some((user, host)) if user.contains(':') => {
            format!("{scheme}://{}:***@{host}", user.split(':').next().unwrap_or(""))
        }
        _ => url.to_owned(),
    }
}

async fn open_postgres(args: &ServeArgs, url: &str) -> Result<PgEngine, Box<dyn std::error::Error>> {
    if !args.fsync {
        return Err(StartError::FsyncWithPostgres.into());
    }
    if args.object_store.is_some() {
        return Err(StartError::ObjectStoreWithPostgres.into());
    }
    let mut opts = PgOptions::new(url);
    opts.schema = args.pg_schema.clone();
    opts.pool_size = args.pg_pool_size;
    opts.committers = args.pg_committers;
    opts.request_timeout = std::time::Duration::from_millis(args.pg_request_timeout_ms);
    opts.accept_commit_loss = args.pg_accept_commit_loss;
    opts.retention = retention(args);
    let started = std::time::Instant::now();
    let engine = PgEngine::open(opts).await?;
    tracing::info!(
        url = %redacted(url),
        schema = %args.pg_schema,
        pool = args.pg_pool_size,
        elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        "PostgreSQL engine open"
    );
    Ok(engine)
}

async fn run<E: oncelog_storage::Engine>(
    state: AppState<E>,
    listener: tokio::net::TcpListener,
) -> Result<(), Box<dyn std::error::Error>> {
    let local = listener.local_addr()?;
    // Before the address line goes out: a SIGTERM sent as soon as it is read must find the
    // handler, not the default action (killed, status 143 instead of a clean exit 0).
    let shutdown = shutdown_signal();
    // One line on stdout, for scripts and tests that start the server on port 0.
    let scheme = if state.config.tls.is_some() { "https" } else { "http" };
    println!("oncelog listening on {scheme}://{local}");
    tracing::info!(addr = %local, "listening");
    oncelog_server::serve(listener, state, shutdown).await?;
    tracing::info!("all writes synced; bye");
    Ok(())
}

/// SIGTERM or SIGINT. The handlers are installed when this is called, not when the future is
/// first polled.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    let (term, int) = {
        use tokio::signal::unix::{signal, SignalKind};
        (signal(SignalKind::terminate()).ok(), signal(SignalKind::interrupt()).ok())
    };
    async move {
        #[cfg(unix)]
        {
            let wait = |s: Option<tokio::signal::unix::Signal>| async move {
                match s {
                    Some(mut s) => {
                        s.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                () = wait(term) => {}
                () = wait(int) => {}
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
