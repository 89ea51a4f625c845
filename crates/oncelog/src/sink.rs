//! `oncelog sink postgres`: a worker of `oncelog-sink` that applies the streams matching a pattern
//! to a PostgreSQL database exactly once (docs/SINKS.md), with its progress as Prometheus metrics
//! on `--metrics-addr`. Thin: the worker, the guarantee and the tables live in the library.

use std::net::SocketAddr;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use oncelog_sink::{Mode, OnRefused, OnTrimmed, PostgresSink, SinkOptions, Target, Worker};

use crate::conn::{Conn, ConnError};

#[derive(clap::Subcommand)]
pub enum SinkCommand {
    /// Apply the streams matching --pattern to PostgreSQL tables, exactly once: State Protocol
    /// streams as rows per entity, other JSON streams as rows per message, byte streams as rows
    /// per read; each read and its position in one transaction (docs/SINKS.md).
    Postgres(PostgresArgs),
}

impl SinkCommand {
    /// The log flags (main sets up the log before the command runs).
    pub fn log(&self) -> &crate::logging::LogArgs {
        match self {
            SinkCommand::Postgres(a) => &a.log,
        }
    }

    /// The target's connection string (its password is kept out of the log).
    pub fn target(&self) -> &str {
        match self {
            SinkCommand::Postgres(a) => &a.target,
        }
    }
}

/// What to do when a stream's history from the stored position on was trimmed away.
#[derive(Clone, Copy, clap::ValueEnum)]
pub enum Trimmed {
    /// Stop with an error naming the stream and the bytes that would be skipped.
    Fail,
    /// Go on from the earliest offset; the skipped bytes are counted (positions.lost_bytes,
    /// oncelog_sink_lost_bytes_total).
    Skip,
}

/// What to do when the target refuses a message and would on every try (a value `jsonb`
/// refuses, a SQLSTATE class 22 data exception, a non-State-Protocol message in a State Protocol
/// stream).
#[derive(Clone, Copy, clap::ValueEnum)]
pub enum Refused {
    /// Stop with an error naming the stream, the message's offset and the database's reason.
    Stop,
    /// Set that stream aside before the read holding the refused message (reason in
    /// positions.set_aside_reason, oncelog_sink_streams_set_aside_total); the others go on.
    SkipStream,
}

/// Which table each stream's data goes to.
#[derive(Clone, Copy, clap::ValueEnum)]
pub enum ModeArg {
    /// From each stream's metadata: `Stream-Compaction: state` → state, other JSON streams →
    /// messages, anything else → chunks.
    Auto,
    /// Every JSON stream's messages are State Protocol changes (a plain application/json stream
    /// written by @durable-streams/state, say) → state; a stream that is not JSON is refused.
    State,
    /// Every JSON stream → messages (State Protocol streams too); a stream that is not JSON is
    /// refused.
    Messages,
    /// Every stream → chunks (a JSON stream's chunk is the read's JSON array).
    Chunks,
}

#[derive(clap::Args)]
pub struct PostgresArgs {
    #[command(flatten)]
    conn: Conn,
    /// The streams to apply: `*` matches one path segment, `**` any number.
    #[arg(long, env = "ONCELOG_SINK_PATTERN", value_name = "GLOB")]
    pattern: String,
    /// The target database, as `oncelog serve --storage` takes a PostgreSQL URL: a libpq URL or
    /// key=value string, several hosts, sslmode / sslrootcert / sslcert / sslkey, PGPASSWORD.
    #[arg(long, env = "ONCELOG_SINK_TARGET", value_name = "URL", hide_env_values = true)]
    target: String,
    /// Schema of the sink's tables (state, messages, chunks, positions); created if missing.
    #[arg(long, env = "ONCELOG_SINK_SCHEMA", value_name = "NAME", default_value = "oncelog_sink")]
    schema: String,
    /// The pull-wake subscription the workers of this sink share (default: sink-SCHEMA).
    #[arg(long, env = "ONCELOG_SINK_SUBSCRIPTION", value_name = "ID")]
    subscription: Option<String>,
    /// Its wake stream (default: sinks/SUBSCRIPTION/wake; created if missing).
    #[arg(long, env = "ONCELOG_SINK_WAKE_STREAM", value_name = "PATH")]
    wake_stream: Option<String>,
    /// This worker's name. Restarted under the same name a worker takes its claim back at once;
    /// under a new name it waits for the old lease to end. Default: HOSTNAME-SUBSCRIPTION, the
    /// same at every start on this host (a second sink of the subscription running on this host
    /// at the same time gets HOSTNAME-SUBSCRIPTION-2, and so on).
    #[arg(long, env = "ONCELOG_SINK_WORKER")]
    worker: Option<String>,
    /// Which table each stream goes to: `auto` (from its metadata), `state` (every JSON stream
    /// holds State Protocol changes), `messages` or `chunks`.
    #[arg(long, env = "ONCELOG_SINK_MODE", value_enum, default_value = "auto")]
    mode: ModeArg,
    /// Skip history: at start, a stream the sink has never applied starts at its current tail
    /// (recorded as its position) instead of its first byte. Streams created later are applied
    /// whole.
    #[arg(long, env = "ONCELOG_SINK_FROM_NOW")]
    from_now: bool,
    /// How long a claim lasts without an ack (each applied read acks): s, m, h or d.
    #[arg(long, env = "ONCELOG_SINK_LEASE_TTL", default_value = "30s", value_parser = crate::token::parse_duration)]
    lease_ttl: Duration,
    /// When history from a stream's position on was trimmed: `fail` or `skip` (State Protocol
    /// streams restart from their snapshot either way).
    #[arg(long, env = "ONCELOG_SINK_ON_TRIMMED", value_enum, default_value = "fail")]
    on_trimmed: Trimmed,
    /// When the target refuses a message of a stream: `stop`, or `skip-stream` (set that stream
    /// aside and go on with the others).
    #[arg(long, env = "ONCELOG_SINK_ON_REFUSED", value_enum, default_value = "stop")]
    on_refused: Refused,
    /// Deadline of each statement in the target; a paused worker's open transaction is ended by
    /// PostgreSQL after 3/5 of it (s, m, h or d).
    #[arg(long, env = "ONCELOG_SINK_STATEMENT_TIMEOUT", default_value = "30s", value_parser = crate::token::parse_duration)]
    statement_timeout: Duration,
    /// Serve Prometheus metrics (rows applied, lag per stream in bytes, ...) at http://ADDR/metrics.
    #[arg(long, env = "ONCELOG_SINK_METRICS_ADDR", value_name = "ADDR")]
    metrics_addr: Option<SocketAddr>,
    #[command(flatten)]
    log: crate::logging::LogArgs,
}

/// Why `oncelog sink` stopped.
#[derive(Debug, thiserror::Error)]
pub enum SinkCliError {
    #[error(transparent)]
    Sink(#[from] oncelog_sink::SinkError),
    #[error(transparent)]
    Conn(#[from] ConnError),
    #[error("--metrics-addr {addr}: {source}")]
    Metrics { addr: SocketAddr, source: std::io::Error },
    #[error("cannot install the metrics recorder (one is installed already)")]
    Recorder,
}

pub async fn run(cmd: SinkCommand) -> Result<(), SinkCliError> {
    let SinkCommand::Postgres(a) = cmd;
    if let Some(addr) = a.metrics_addr {
        serve_metrics(addr).await?;
    }
    let subscription = a.subscription.clone().unwrap_or_else(|| format!("sink-{}", a.schema));
    let wake_stream = a.wake_stream.clone().unwrap_or_else(|| format!("sinks/{subscription}/wake"));
    // Held until the process ends: it keeps the default name this process's alone on this host.
    let (worker, _slot) = match a.worker.clone() {
        Some(w) => (w, None),
        None => default_worker(&host_name(), &subscription, &std::env::temp_dir()),
    };
    let mut opts = SinkOptions::new(subscription, &a.pattern, wake_stream, worker);
    opts.lease_ttl = a.lease_ttl;
    opts.from_now = a.from_now;
    opts.mode = match a.mode {
        ModeArg::Auto => Mode::Auto,
        ModeArg::State => Mode::State,
        ModeArg::Messages => Mode::Messages,
        ModeArg::Chunks => Mode::Chunks,
    };
    opts.on_trimmed = match a.on_trimmed {
        Trimmed::Fail => OnTrimmed::Fail,
        Trimmed::Skip => OnTrimmed::Skip,
    };
    opts.on_refused = match a.on_refused {
        Refused::Stop => OnRefused::Stop,
        Refused::SkipStream => OnRefused::SkipStream,
    };
    let target = Target::new(&a.target, &a.schema, a.statement_timeout)?;
    let worker = Worker::new(a.conn.client(None)?, target, PostgresSink::new(&a.schema), opts);
    // On SIGTERM the claim is given back, so another worker takes over at once.
    Ok(worker.run_until(stop_signal()).await?)
}

/// SIGTERM or Ctrl-C (serve.rs has the same for the server; this one is the sink's own so the
/// two commands stay independent).
async fn stop_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = term => {}
    }
}

/// This host's name: the kernel's, else `/etc/hostname`, else `$HOSTNAME`, else `sink`.
fn host_name() -> String {
    let read = |p: &str| std::fs::read_to_string(p).ok().map(|h| h.trim().to_owned());
    [read("/proc/sys/kernel/hostname"), read("/etc/hostname"), std::env::var("HOSTNAME").ok()]
        .into_iter()
        .flatten()
        .find(|h| !h.is_empty())
        .unwrap_or_else(|| "sink".to_owned())
}

/// How many sinks of one subscription on one host get a name of their own; past that they
/// share the last one (still exactly once: the target's compare-and-set, not the name, keeps
/// batches apart).
const SLOTS: u32 = 64;

/// The default worker name: `HOST-SUBSCRIPTION`, the same at every start on this host, so a
/// restarted sink takes its old claim back at once instead of waiting for its lease to end (a
/// name with the process id would wait `--lease-ttl`). Two sinks of one subscription running on
/// one host must not share a name (both would hold the one claim at once): each name is held by
/// an exclusive lock on a file in `dir` for the life of the process (released by the kernel
/// when the process dies, however it dies), and a name that is held is passed over for the
/// next, `HOST-SUBSCRIPTION-2` and on. Answers the name and the lock file keeping it; without
/// a usable `dir`, the first name, unlocked.
fn default_worker(host: &str, subscription: &str, dir: &std::path::Path) -> (String, Option<std::fs::File>) {
    let base = format!("{host}-{subscription}");
    for slot in 1..=SLOTS {
        let name = if slot == 1 { base.clone() } else { format!("{base}-{slot}") };
        // File names keep to characters that are safe anywhere.
        let file: String = name
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') { c } else { '_' })
            .collect();
        let path = dir.join(format!("oncelog-sink-{file}.lock"));
        let opened = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(&path);
        let f = match opened {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot keep the default worker name to this process (a second sink on this host would share it)");
                return (base, None);
            }
        };
        match f.try_lock() {
            Ok(()) => return (name, Some(f)),
            Err(std::fs::TryLockError::WouldBlock) => continue,
            Err(std::fs::TryLockError::Error(e)) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot keep the default worker name to this process (a second sink on this host would share it)");
                return (base, None);
            }
        }
    }
    (format!("{base}-{SLOTS}"), None)
}

/// Installs a Prometheus recorder and serves it at `addr` (`/metrics`).
async fn serve_metrics(addr: SocketAddr) -> Result<(), SinkCliError> {
    let handle = recorder().ok_or(SinkCliError::Recorder)?;
    let listener =
        tokio::net::TcpListener::bind(addr).await.map_err(|source| SinkCliError::Metrics { addr, source })?;
    let bound = listener.local_addr().map_err(|source| SinkCliError::Metrics { addr, source })?;
    let app = axum::Router::new().route("/metrics", axum::routing::get(move || std::future::ready(handle.render())));
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "metrics endpoint stopped");
        }
    });
    tracing::info!(%bound, "metrics at /metrics");
    Ok(())
}

/// As the server's recorder: latency histograms with the same buckets.
fn recorder() -> Option<PrometheusHandle> {
    let buckets = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0];
    let recorder = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &buckets)
        .ok()?
        .build_recorder();
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder).ok()?;
    oncelog_sink::metrics::describe();
    Some(handle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_worker_name_is_stable_and_one_process_s_alone() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (first, lock) = default_worker("h1", "sink-s", dir.path());
        assert_eq!(first, "h1-sink-s");
        // Held: a second sink of the subscription on this host gets the next name.
        let (second, lock2) = default_worker("h1", "sink-s", dir.path());
        assert_eq!(second, "h1-sink-s-2");
        // The first one gone (its lock released, as the kernel does when a process dies): a
        // restart gets its name back.
        drop(lock);
        assert_eq!(default_worker("h1", "sink-s", dir.path()).0, "h1-sink-s");
        drop(lock2);
        // Another subscription, another name; odd characters stay out of the file name.
        assert_eq!(default_worker("h/1", "a b", dir.path()).0, "h/1-a b");
        assert!(dir.path().join("oncelog-sink-h_1-a_b.lock").exists());
    }
}
