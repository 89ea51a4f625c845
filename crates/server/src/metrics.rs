//! Prometheus metrics: what is recorded, and the `/metrics` scrape.
//!
//! Recording goes through the `metrics` facade (engines record their own, such as group-commit
//! sizes and fsync latency); this module installs the Prometheus recorder once per process and
//! renders it. Without an installed recorder every recording is a no-op, which is how
//! `--metrics false` costs nothing.
//!
//! | metric | type | labels | meaning |
//! |---|---|---|---|
//! | `oncelog_appends_total` | counter | `outcome` | append requests that reached the engine, by outcome: `new`, `duplicate`, `fenced`, `gap`, `closed`, `rejected` |
//! | `oncelog_append_bytes_total` | counter | `outcome` | their body bytes, same labels |
//! | `oncelog_commit_to_ack_seconds` | histogram | | from handing an append to the engine to its durable answer |
//! | `oncelog_parked_appends_total` | counter | | producer appends that waited for their predecessors |
//! | `oncelog_group_commit_commands` | histogram | | commands per group commit |
//! | `oncelog_group_commit_seconds` | histogram | | write + sync (log) or decide + write + COMMIT (PostgreSQL) of one group |
//! | `oncelog_fsync_seconds` | histogram | | the sync of one group (log engine) |
//! | `oncelog_checkpoint_seconds` | histogram | | writing one checkpoint (log engine) |
//! | `oncelog_live_readers` | gauge | `mode` | open long-poll and SSE reads |
//! | `oncelog_http_requests_total` | counter | `method`, `status` | every answered stream request (common statuses by code, the rest `other`) |
//! | `oncelog_connections_accepted_total` | counter | | TCP connections accepted |
//! | `oncelog_streams` | gauge | | streams that exist |
//! | `oncelog_producers` | gauge | | idempotent producers remembered |
//! | `oncelog_subscriptions` | gauge | | subscriptions that exist |
//! | `oncelog_subscription_calls_total` | counter | `call`, `outcome` | claim, ack, callback, release and commit requests: `ok`, `duplicate` (a resent commit), `fenced`, `refused` (any other error) |
//! | `oncelog_webhook_deliveries_total` | counter | `outcome` | webhook deliveries: `ok`, `failed` (a retry is scheduled) |
//! | `process_resident_memory_bytes` | gauge | | the server's RSS (Linux) |

use std::sync::OnceLock;
use std::time::Duration;

use metrics::{Counter, Histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use oncelog_storage::{AppendError, AppendOutcome, AppendStatus, EngineStats};

/// Bucket bounds for latency histograms: 50 µs to 10 s.
const LATENCY_BUCKETS: &[f64] =
    &[0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0];
/// Bucket bounds for group sizes.
const COUNT_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 4096.0];

static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// Outcomes of an append, in the order of [`Handles::appends`].
const OUTCOMES: [&str; 6] = ["new", "duplicate", "fenced", "gap", "closed", "rejected"];
/// Methods with their own label; everything else is `other`.
const METHODS: [&str; 7] = ["GET", "HEAD", "PUT", "POST", "DELETE", "OPTIONS", "other"];
/// Statuses with their own label; everything else is `other`.
const STATUSES: [&str; 17] =
    ["200", "201", "204", "304", "400", "401", "403", "404", "405", "408", "409", "410", "413", "429", "500", "503", "other"];

/// Metric handles registered once: recording on the request path is then an atomic add, not a
/// registry lookup with label allocation.
struct Handles {
    appends: [Counter; 6],
    append_bytes: [Counter; 6],
    commit_to_ack: Histogram,
    requests: Vec<Counter>,
}

static HANDLES: OnceLock<Handles> = OnceLock::new();

fn handles() -> Option<&'static Handles> {
    HANDLES.get()
}

fn register() -> Handles {
    Handles {
        appends: OUTCOMES.map(|o| metrics::counter!("oncelog_appends_total", "outcome" => o)),
        append_bytes: OUTCOMES.map(|o| metrics::counter!("oncelog_append_bytes_total", "outcome" => o)),
        commit_to_ack: metrics::histogram!("oncelog_commit_to_ack_seconds"),
        requests: METHODS
            .iter()
            .flat_map(|m| STATUSES.iter().map(move |s| metrics::counter!("oncelog_http_requests_total", "method" => *m, "status" => *s)))
            .collect(),
    }
}

/// Installs the process-wide Prometheus recorder (once; later calls return the same handle).
/// `None` when another recorder was installed first by an embedding application.
pub fn install() -> Option<PrometheusHandle> {
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS)
                .and_then(|b| b.set_buckets_for_metric(Matcher::Full("oncelog_group_commit_commands".into()), COUNT_BUCKETS))
                .ok()?;
            let recorder = builder.build_recorder();
            let handle = recorder.handle();
            metrics::set_global_recorder(recorder).ok()?;
            let _ = HANDLES.set(register());
            Some(handle)
        })
        .clone()
}

/// Records one engine answer to an append of `bytes` body bytes.
pub fn appended(r: &Result<AppendOutcome, AppendError>, bytes: usize, took: Duration) {
    let Some(h) = handles() else { return };
    let outcome = match r {
        Ok(o) => match o.status {
            AppendStatus::Appended => 0,
            AppendStatus::Duplicate => 1,
            AppendStatus::AlreadyClosed => 4,
        },
        Err(AppendError::ProducerFenced { .. }) => 2,
        Err(AppendError::ProducerSeqGap { .. }) => 3,
        Err(AppendError::Closed { .. }) => 4,
        Err(_) => 5,
    };
    h.appends[outcome].increment(1);
    h.append_bytes[outcome].increment(bytes as u64);
    if r.is_ok() {
        h.commit_to_ack.record(took.as_secs_f64());
    }
}

/// Counts an open live read for as long as it lives.
pub struct LiveReader(&'static str);

impl LiveReader {
    pub fn open(mode: &'static str) -> Self {
        metrics::gauge!("oncelog_live_readers", "mode" => mode).increment(1.0);
        LiveReader(mode)
    }
}

impl Drop for LiveReader {
    fn drop(&mut self) {
        metrics::gauge!("oncelog_live_readers", "mode" => self.0).decrement(1.0);
    }
}

/// Records an answered request.
pub fn request(method: &axum::http::Method, status: axum::http::StatusCode) {
    let Some(h) = handles() else { return };
    let m = METHODS.iter().position(|m| *m == method.as_str()).unwrap_or(METHODS.len() - 1);
    let s = STATUSES.iter().position(|s| *s == status.as_str()).unwrap_or(STATUSES.len() - 1);
    if let Some(c) = h.requests.get(m * STATUSES.len() + s) {
        c.increment(1);
    }
}

/// Records one fenced subscription call (`call`: claim, ack, callback, release, commit).
pub fn subscription_call(call: &str, outcome: &'static str) {
    let call = match call {
        "claim" => "claim",
        "ack" => "ack",
        "callback" => "callback",
        "release" => "release",
        _ => "commit",
    };
    metrics::counter!("oncelog_subscription_calls_total", "call" => call, "outcome" => outcome).increment(1);
}

/// Records one webhook delivery's outcome.
pub fn webhook_delivery(ok: bool) {
    metrics::counter!("oncelog_webhook_deliveries_total", "outcome" => if ok { "ok" } else { "failed" }).increment(1);
}

/// The scrape: gauges read now, then everything in Prometheus text format.
pub fn render(handle: &PrometheusHandle, stats: EngineStats, subscriptions: usize) -> String {
    metrics::gauge!("oncelog_subscriptions").set(subscriptions as f64);
    metrics::gauge!("oncelog_streams").set(stats.streams as f64);
    metrics::gauge!("oncelog_producers").set(stats.producers as f64);
    metrics::counter!("oncelog_parked_appends_total").absolute(stats.parked_appends);
    if let Some(rss) = resident_bytes() {
        metrics::gauge!("process_resident_memory_bytes").set(rss as f64);
    }
    handle.render()
}

/// Resident set size from `/proc/self/statm` (pages × page size); `None` off Linux.
fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // The page size is 4 KiB on every platform this reads /proc on that we build for.
    Some(pages * 4096)
}
