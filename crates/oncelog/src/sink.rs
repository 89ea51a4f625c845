//! `oncelog sink postgres`: a worker of `oncelog-sink` that applies the streams matching a pattern
//! to a PostgreSQL database exactly once (docs/SINKS.md), with its progress as Prometheus metrics
//! on `--metrics-addr`. Thin: the worker, the guarantee and the tables live in the library.

use std::net::SocketAddr;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use oncelog_sink::{OnRefused, OnTrimmed, PostgresSink, SinkOptions, Target, Worker};

use crate::commands::Conn;

#[derive(clap::Subcommand)]
pub enum SinkCommand {
    /// Apply the streams matching --pattern to PostgreSQL tables, exactly once: State Protocol
    /// streams as rows per entity, other JSON streams as rows per message, byte streams as rows
    /// per read; each read and its position in one transaction (docs/SINKS.md).
    Postgres(PostgresArgs),
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
    /// This worker's name. Give each worker a stable one: restarted under the same name it takes
    /// its claim back at once; under a new name it waits for the old lease to end. Default:
    /// HOSTNAME-PID.
    #[arg(long, env = "ONCELOG_SINK_WORKER")]
    worker: Option<String>,
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
}

/// Why `oncelog sink` stopped.
#[derive(Debug, thiserror::Error)]
pub enum SinkCliError {
    #[error(transparent)]
    Sink(#[from] oncelog_sink::SinkError),
    #[error(transparent)]
    Cli(#[from] crate::commands::CliError),
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
    let worker = a.worker.clone().unwrap_or_else(default_worker);
    let mut opts = SinkOptions::new(subscription, &a.pattern, wake_stream, worker);
    opts.lease_ttl = a.lease_ttl;
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

fn default_worker() -> String {
    let host = std::fs::read_to_string("/etc/hostname").map(|h| h.trim().to_owned()).unwrap_or_default();
    let host = if host.is_empty() { "sink".to_owned() } else { host };
    format!("{host}-{}", std::process::id())
}

/// Installs a Prometheus recorder and serves it at `addr` (`/metrics`).
async fn serve_metrics(addr: SocketAddr) -> Result<(), SinkCliError> {
    let handle = recorder().ok_or(SinkCliError::Recorder)?;
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|source| SinkCliError::Metrics { addr, source })?;
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
    let recorder = PrometheusBuilder::new().set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &buckets).ok()?.build_recorder();
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder).ok()?;
    Some(handle)
}
