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
//! | `oncelog_bucket_puts_total` | counter | | objects and manifests created in the bucket (`--object-store`) |
//! | `oncelog_bucket_errors_total` | counter | | shipping rounds to the bucket that failed (tried again) |
//! | `oncelog_bucket_shipped_bytes_total` | counter | | log bytes shipped to the bucket |
//! | `oncelog_bucket_unshipped_bytes` | gauge | | log bytes written and not yet in a published cut, as of the last round |
//! | `oncelog_bucket_unshipped_seconds` | gauge | | seconds since the bucket last held everything synced (0 when it does), as of the last round |
//! | `oncelog_bucket_swept_total` | counter | | objects no cut names that the sweep deleted (a fenced writer's, a failed round's, a crashed node's) |
//! | `oncelog_bucket_missing_objects` | gauge | | objects the published cut names that the last sweep did not find in the bucket (deleted or lost under the node; a restore would fail) |
//! | `oncelog_bucket_folds_total` | counter | | segments whose objects were folded into one (sealed ones, and a growing one past 32 objects) |
//! | `oncelog_bucket_gets_total` | counter | | ranged GETs of cold reads and cache fills (--object-store) |
//! | `oncelog_bucket_cold_read_hits_total` | counter | | cold reads answered from the blocks kept in memory (read-ahead included) |
//! | `oncelog_bucket_cold_segments` | gauge | | segments only in the bucket (left there by a restore, or evicted) |
//! | `oncelog_bucket_cache_bytes` | gauge | | bytes of segment files on the local disk (`--cache-max-bytes` bounds it) |
//! | `oncelog_bucket_cache_evictions_total` | counter | | sealed segments evicted from the local disk under `--cache-max-bytes` |
//! | `oncelog_bucket_cache_fills_total` | counter | | cold segments fetched back onto the local disk |
//! | `oncelog_bucket_publish_seconds` | histogram | | creating one manifest |
//! | `oncelog_bucket_epoch` | gauge | | this node's writer epoch of the bucket prefix |
//! | `oncelog_live_readers` | gauge | `mode` | open long-poll and SSE reads |
//! | `oncelog_http_requests_total` | counter | `method`, `status` | every answered stream request (common statuses by code, the rest `other`) |
//! | `oncelog_connections_accepted_total` | counter | | TCP connections accepted |
//! | `oncelog_connections_evicted_total` | counter | `reason` | connections closed at `--max-connections` to admit a new one: `idle`, `slow` ([`crate::conns`]) |
//! | `oncelog_live_readers_departed_total` | counter | | HTTP/1 live reads dropped because their client closed the connection while they waited |
//! | `oncelog_sse_parks_total` | counter | | times an SSE reader parked at the tail with its runtime's fan-out ([`crate::fanout`]) |
//! | `oncelog_sse_parked_events_total` | counter | | events a fan-out wrote to a parked reader (one per reader) |
//! | `oncelog_sse_handed_back_total` | counter | `reason` | parked readers handed back to their task: `full` (socket full or failed), `event` (not one shareable piece), `stream` (closed, deleted, trimmed) |
//! | `oncelog_sendfile_bytes_total` | counter | | catch-up body bytes sent with `sendfile(2)` from a segment file ([`crate::sendfile_io`]) |
//! | `oncelog_streams` | gauge | | streams that exist |
//! | `oncelog_producers` | gauge | | idempotent producers remembered |
//! | `oncelog_subscriptions` | gauge | | subscriptions that exist |
//! | `oncelog_subscription_calls_total` | counter | `call`, `outcome` | claim, ack, callback, release and commit requests: `ok`, `duplicate` (a resent commit), `fenced`, `refused` (any other error) |
//! | `oncelog_webhook_deliveries_total` | counter | `outcome` | webhook deliveries: `ok`, `failed` (a retry is scheduled) |
//! | `oncelog_subscription_lag_bytes` | gauge | `subscription` | over its links, tail minus acknowledged offset (computed at most every [`LAG_REFRESH_MS`], by the first scrape after, and shared; the first [`MAX_LAG_SERIES`] subscriptions by id) |
//! | `oncelog_subscription_pending_streams` | gauge | `subscription` | its links with unacknowledged data (same) |
//! | `oncelog_stream_appends_total` | counter | `stream` | new appends to a stream `--metrics-streams` names (its first `--metrics-streams-max` such streams) |
//! | `oncelog_stream_append_bytes_total` | counter | `stream` | their body bytes |
//! | `oncelog_stream_reads_total` | counter | `stream` | reads of it: catch-up and long-poll answers, SSE data events |
//! | `oncelog_stream_read_bytes_total` | counter | `stream` | stored bytes those reads carried |
//! | `oncelog_stream_overflow_total` | counter | `counter` | the same four (`appends`, `append_bytes`, `reads`, `read_bytes`) summed over named streams beyond the cap |
//! | `process_resident_memory_bytes` | gauge | | the server's RSS (Linux) |
//!
//! Every metric has a `# HELP` line: [`install`] describes the ones recorded through the facade,
//! and [`render`] writes the per-subscription and per-stream families itself. Those two are
//! rendered from what exists at the scrape rather than kept in the recorder, whose series live
//! for the life of the process: a deleted subscription's lag would otherwise stay at its last
//! value forever.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{OnceLock, RwLock};
use std::time::Duration;

use metrics::{Counter, Histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use oncelog_storage::{AppendError, AppendOutcome, AppendStatus, EngineStats};
use oncelog_subscriptions::{glob, SubLag};

/// Most subscriptions given lag series: bounds the scrape's size and the work of computing it
/// (each is looked at as a `GET` of it would), whoever may create subscriptions.
pub const MAX_LAG_SERIES: usize = 1000;

/// Subscription lag is computed at most this often (ms); scrapes in between, and concurrent
/// ones, print the last computation. Computing it looks at every subscription's streams: done
/// per scrape, four anonymous scrapers at 128 subscriptions took the whole machine.
pub const LAG_REFRESH_MS: i64 = 5_000;

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
const STATUSES: [&str; 17] = [
    "200", "201", "204", "304", "400", "401", "403", "404", "405", "408", "409", "410", "413", "429", "500", "503",
    "other",
];

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
            .flat_map(|m| {
                STATUSES
                    .iter()
                    .map(move |s| metrics::counter!("oncelog_http_requests_total", "method" => *m, "status" => *s))
            })
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
                .and_then(|b| {
                    b.set_buckets_for_metric(Matcher::Full("oncelog_group_commit_commands".into()), COUNT_BUCKETS)
                })
                .ok()?;
            let recorder = builder.build_recorder();
            let handle = recorder.handle();
            metrics::set_global_recorder(recorder).ok()?;
            describe();
            let _ = HANDLES.set(register());
            upkeep(handle.clone());
            Some(handle)
        })
        .clone()
}

/// How often the recorder folds recorded histogram samples into its buckets.
const UPKEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Folds the recorder's histogram samples into their buckets every [`UPKEEP_EVERY`]. The
/// recorder keeps every sample until a scrape (or an upkeep) drains it: an append records two,
/// so a server nobody scraped held millions of them after a load run (tens of MB of RSS). A
/// plain thread, so it runs whatever runtime the embedding application has, for the process's
/// life (the recorder is installed once).
fn upkeep(handle: PrometheusHandle) {
    let spawned = std::thread::Builder::new().name("metrics-upkeep".into()).spawn(move || loop {
        std::thread::sleep(UPKEEP_EVERY);
        handle.run_upkeep();
    });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "metrics upkeep thread not started: histogram samples are folded only when /metrics is scraped");
    }
}

/// The `# HELP` text of every metric recorded through the facade, here or in an engine (the
/// table at the top of this module says the same).
fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        "oncelog_appends_total",
        "Append requests that reached the engine, by outcome: new, duplicate, fenced, gap, closed, rejected."
    );
    describe_counter!("oncelog_append_bytes_total", "Body bytes of those append requests, by outcome.");
    describe_histogram!(
        "oncelog_commit_to_ack_seconds",
        "Seconds from handing an append to the engine to its durable answer."
    );
    describe_counter!("oncelog_parked_appends_total", "Producer appends that waited for their predecessors.");
    describe_histogram!("oncelog_group_commit_commands", "Commands per group commit.");
    describe_histogram!(
        "oncelog_group_commit_seconds",
        "Seconds of one group commit: write and sync (log engine) or decide, write and COMMIT (PostgreSQL)."
    );
    describe_histogram!("oncelog_fsync_seconds", "Seconds of the sync of one group (log engine).");
    describe_histogram!("oncelog_checkpoint_seconds", "Seconds writing one checkpoint (log engine).");
    describe_counter!("oncelog_bucket_puts_total", "Objects and manifests created in the bucket (--object-store).");
    describe_counter!("oncelog_bucket_errors_total", "Shipping rounds to the bucket that failed (tried again).");
    describe_counter!("oncelog_bucket_shipped_bytes_total", "Log bytes shipped to the bucket.");
    describe_gauge!(
        "oncelog_bucket_unshipped_bytes",
        "Log bytes written and not yet in a published cut, as of the last round."
    );
    describe_gauge!(
        "oncelog_bucket_unshipped_seconds",
        "Seconds since the bucket last held everything synced (0 when it does), as of the last round."
    );
    describe_counter!("oncelog_bucket_gets_total", "Ranged GETs of cold reads and cache fills.");
    describe_counter!("oncelog_bucket_cold_read_hits_total", "Cold reads answered from the blocks kept in memory.");
    describe_gauge!("oncelog_bucket_cold_segments", "Segments only in the bucket (left by a restore, or evicted).");
    describe_gauge!("oncelog_bucket_cache_bytes", "Bytes of segment files on the local disk.");
    describe_counter!(
        "oncelog_bucket_cache_evictions_total",
        "Sealed segments evicted from the local disk under --cache-max-bytes."
    );
    describe_counter!("oncelog_bucket_cache_fills_total", "Cold segments fetched back onto the local disk.");
    describe_counter!("oncelog_bucket_folds_total", "Segments whose objects were folded into one.");
    describe_counter!("oncelog_bucket_swept_total", "Objects no cut names that the sweep deleted (leftovers).");
    describe_gauge!("oncelog_bucket_missing_objects", "Named objects the last sweep did not find.");
    describe_histogram!("oncelog_bucket_publish_seconds", "Creating one manifest.");
    describe_gauge!("oncelog_bucket_epoch", "This node's writer epoch of the bucket prefix.");
    describe_gauge!("oncelog_live_readers", "Open live reads, by mode: long-poll, sse.");
    describe_counter!(
        "oncelog_live_readers_refused_total",
        "Live reads refused (503), by the bound that refused them: total, stream, connections."
    );
    describe_counter!("oncelog_http_requests_total", "Answered stream requests, by method and status.");
    describe_counter!("oncelog_connections_accepted_total", "TCP connections accepted.");
    describe_counter!(
        "oncelog_connections_evicted_total",
        "Connections closed at --max-connections to admit a new one, by what they were: idle, slow."
    );
    describe_counter!(
        "oncelog_live_readers_departed_total",
        "HTTP/1 live reads dropped because their client closed the connection while they waited."
    );
    describe_counter!("oncelog_sse_parks_total", "Times an SSE reader parked at the tail with its runtime's fan-out.");
    describe_counter!(
        "oncelog_sse_parked_events_total",
        "Events a fan-out wrote to a parked SSE reader (one per reader)."
    );
    describe_counter!(
        "oncelog_sse_handed_back_total",
        "Parked SSE readers handed back to their task, by reason: full, event, stream."
    );
    describe_counter!(
        "oncelog_sendfile_bytes_total",
        "Catch-up body bytes sent with sendfile(2) straight from a segment file."
    );
    describe_gauge!("oncelog_streams", "Streams that exist.");
    describe_gauge!("oncelog_producers", "Idempotent producers remembered.");
    describe_gauge!("oncelog_subscriptions", "Subscriptions that exist.");
    describe_counter!(
        "oncelog_subscription_calls_total",
        "Subscription claim, ack, callback, release and commit requests, by outcome: ok, duplicate, fenced, refused."
    );
    describe_counter!(
        "oncelog_webhook_deliveries_total",
        "Webhook deliveries, by outcome: ok, failed (retried later)."
    );
    describe_gauge!("process_resident_memory_bytes", "Resident memory of the server process in bytes.");
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

/// A live reader refused by the bound `reason` (`total`, `stream`, `connections`).
pub fn live_reader_refused(reason: &'static str) {
    metrics::counter!("oncelog_live_readers_refused_total", "reason" => reason).increment(1);
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

/// What a scrape shows besides the recorder's metrics.
pub struct Scrape<'a> {
    pub stats: EngineStats,
    pub subscriptions: usize,
    /// Per subscription (at most [`MAX_LAG_SERIES`]); empty when they could not be computed.
    pub lags: &'a [SubLag],
    /// `--metrics-streams`, when given.
    pub streams: Option<&'a StreamSeries>,
}

/// The scrape: gauges read now, then everything in Prometheus text format.
pub fn render(handle: &PrometheusHandle, scrape: Scrape<'_>) -> String {
    metrics::gauge!("oncelog_subscriptions").set(scrape.subscriptions as f64);
    metrics::gauge!("oncelog_streams").set(scrape.stats.streams as f64);
    metrics::gauge!("oncelog_producers").set(scrape.stats.producers as f64);
    metrics::counter!("oncelog_parked_appends_total").absolute(scrape.stats.parked_appends);
    if let Some(rss) = resident_bytes() {
        metrics::gauge!("process_resident_memory_bytes").set(rss as f64);
    }
    let mut out = handle.render();
    if !scrape.lags.is_empty() {
        let ids = |l: &SubLag| l.id.clone();
        family(
            &mut out,
            "oncelog_subscription_lag_bytes",
            "gauge",
            "Bytes a subscription has not acknowledged: over its linked streams, tail minus acknowledged offset.",
            "subscription",
            scrape.lags.iter().map(|l| (ids(l), l.bytes)),
        );
        family(
            &mut out,
            "oncelog_subscription_pending_streams",
            "gauge",
            "Linked streams of a subscription with unacknowledged data.",
            "subscription",
            scrape.lags.iter().map(|l| (ids(l), l.pending_streams as u64)),
        );
    }
    if let Some(series) = scrape.streams {
        series.render(&mut out);
    }
    out
}

/// Writes one family of samples with a single label, in the exporter's layout (a blank line
/// after each family).
fn family(
    out: &mut String,
    name: &str,
    kind: &str,
    help: &str,
    label: &str,
    samples: impl Iterator<Item = (String, u64)>,
) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    for (value, n) in samples {
        let _ = writeln!(out, "{name}{{{label}=\"{}\"}} {n}", escape_label(&value));
    }
    out.push('\n');
}

/// A label value as the text format wants it: backslash, double quote and newline escaped
/// (stream paths and subscription ids may hold any of them).
fn escape_label(value: &str) -> String {
    let mut s = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

/// The four counters of one stream.
#[derive(Default)]
struct StreamCounters {
    appends: AtomicU64,
    append_bytes: AtomicU64,
    reads: AtomicU64,
    read_bytes: AtomicU64,
}

/// Per-stream counters for the streams `--metrics-streams GLOB` names, for at most
/// `--metrics-streams-max` of them: the first that many matching streams to be appended to or
/// read get their own series, for the life of the process (a deleted stream's stay; a restart
/// starts over); the rest are summed into `oncelog_stream_overflow_total`. Without the flag
/// there is no `StreamSeries` and the request paths check one `Option`; with it, a stream that
/// has its series costs a read lock and a hash lookup per append or read, and any other stream
/// also a pattern match.
pub struct StreamSeries {
    /// Normalized ([`glob::check`]).
    pattern: String,
    max: usize,
    slots: RwLock<HashMap<Box<str>, StreamCounters>>,
    overflow: StreamCounters,
}

impl StreamSeries {
    /// `pattern` as [`glob::check`] accepts it (the configuration was validated).
    pub fn new(pattern: &str, max: usize) -> Result<Self, glob::PatternError> {
        Ok(StreamSeries {
            pattern: glob::check(pattern)?,
            max,
            slots: RwLock::default(),
            overflow: StreamCounters::default(),
        })
    }

    /// Runs `f` on `path`'s counters: its own, the overflow's, or none when the pattern does not
    /// name it.
    fn with(&self, path: &str, f: impl Fn(&StreamCounters)) {
        let full = match self.slots.read() {
            Ok(slots) => match slots.get(path) {
                Some(c) => return f(c),
                None => slots.len() >= self.max,
            },
            // A panic while a slot was added: counting is not worth failing a request for.
            Err(_) => return,
        };
        if !glob::matches(&self.pattern, path) {
            return;
        }
        if full {
            return f(&self.overflow);
        }
        let Ok(mut slots) = self.slots.write() else { return };
        // Another request may have taken the last place, or this path's, meanwhile.
        if let Some(c) = slots.get(path) {
            return f(c);
        }
        if slots.len() >= self.max {
            return f(&self.overflow);
        }
        f(slots.entry(path.into()).or_default());
    }

    /// One new append of `bytes` body bytes to `path`.
    pub fn appended(&self, path: &str, bytes: usize) {
        self.with(path, |c| {
            c.appends.fetch_add(1, Ordering::Relaxed);
            c.append_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        });
    }

    /// One read of `path` that carried `bytes` stored bytes.
    pub fn read(&self, path: &str, bytes: usize) {
        self.reads(path, 1, bytes);
    }

    /// `count` reads of `bytes` each (one event a fan-out wrote to that many readers), with one
    /// lookup of the stream's series.
    pub fn reads(&self, path: &str, count: usize, bytes: usize) {
        self.with(path, |c| {
            c.reads.fetch_add(count as u64, Ordering::Relaxed);
            c.read_bytes.fetch_add((count * bytes) as u64, Ordering::Relaxed);
        });
    }

    /// More bytes of a read already counted (the later pieces of a streamed catch-up response:
    /// one answer is one read, whatever number of pieces it is sent in).
    pub fn read_more(&self, path: &str, bytes: usize) {
        self.with(path, |c| {
            c.read_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        });
    }

    fn render(&self, out: &mut String) {
        let Ok(slots) = self.slots.read() else { return };
        let mut paths: Vec<&str> = slots.keys().map(AsRef::as_ref).collect();
        paths.sort_unstable();
        type Pick = fn(&StreamCounters) -> &AtomicU64;
        let families: [(&str, &str, Pick); 4] = [
            ("oncelog_stream_appends_total", "New appends to a stream named by --metrics-streams.", |c| &c.appends),
            ("oncelog_stream_append_bytes_total", "Body bytes of those appends.", |c| &c.append_bytes),
            (
                "oncelog_stream_reads_total",
                "Reads of a stream named by --metrics-streams: catch-up and long-poll answers, SSE data events.",
                |c| &c.reads,
            ),
            ("oncelog_stream_read_bytes_total", "Stored bytes those reads carried.", |c| &c.read_bytes),
        ];
        for (name, help, pick) in families {
            if paths.is_empty() {
                continue;
            }
            let samples =
                paths.iter().filter_map(|p| slots.get(*p).map(|c| ((*p).to_owned(), pick(c).load(Ordering::Relaxed))));
            family(out, name, "counter", help, "stream", samples);
        }
        let overflow = [
            ("appends", &self.overflow.appends),
            ("append_bytes", &self.overflow.append_bytes),
            ("reads", &self.overflow.reads),
            ("read_bytes", &self.overflow.read_bytes),
        ];
        family(
            out,
            "oncelog_stream_overflow_total",
            "counter",
            "Appends, append bytes, reads and read bytes of streams named by --metrics-streams beyond --metrics-streams-max, summed.",
            "counter",
            overflow.iter().map(|(k, v)| ((*k).to_owned(), v.load(Ordering::Relaxed))),
        );
    }
}

/// Resident set size from `/proc/self/statm` (pages × page size); `None` off Linux.
fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // The page size is 4 KiB on every platform this reads /proc on that we build for.
    Some(pages * 4096)
}
