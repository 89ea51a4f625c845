//! Progress, through the `metrics` facade (a no-op until the process installs a recorder; the
//! `oncelog sink` command installs a Prometheus one for `--metrics-addr`).
//!
//! | metric | type | labels | meaning |
//! |---|---|---|---|
//! | `oncelog_sink_rows_applied_total` | counter | `stream` | rows (effects) committed to the target |
//! | `oncelog_sink_batches_total` | counter | | batch transactions committed |
//! | `oncelog_sink_lag_bytes` | gauge | `stream` | the stream's tail (as last seen) minus its applied position |
//! | `oncelog_sink_lost_bytes_total` | counter | `stream` | trimmed history skipped over (`--on-trimmed skip`) |
//! | `oncelog_sink_streams_set_aside_total` | counter | `stream` | streams set aside because the target refused a message (`--on-refused skip-stream`) |
//! | `oncelog_sink_conflicts_total` | counter | | batches refused by the compare-and-set (another worker had moved the position) |
//! | `oncelog_sink_claims_total` | counter | `outcome` | claims served: `done`, `fenced` (the lease passed to another worker), `failed` |
//! | `oncelog_sink_batch_seconds` | histogram | | one batch: begin, compare-and-set, apply, commit |

use std::time::Duration;

/// Describes every metric above (the `# HELP` lines of a scrape), once, after a recorder is
/// installed.
pub fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_counter!("oncelog_sink_rows_applied_total", "Rows (effects) committed to the target, by stream.");
    describe_counter!("oncelog_sink_batches_total", "Batch transactions committed to the target.");
    describe_gauge!(
        "oncelog_sink_lag_bytes",
        "The stream's tail (as last seen) minus the position applied to the target, in bytes."
    );
    describe_counter!(
        "oncelog_sink_lost_bytes_total",
        "Trimmed history skipped over (--on-trimmed skip), in bytes, by stream."
    );
    describe_counter!(
        "oncelog_sink_streams_set_aside_total",
        "Streams set aside because the target refused a message (--on-refused skip-stream)."
    );
    describe_counter!(
        "oncelog_sink_conflicts_total",
        "Batches refused by the position's compare-and-set (another worker had moved it)."
    );
    describe_counter!("oncelog_sink_claims_total", "Claims served, by outcome: done, fenced, failed.");
    describe_histogram!("oncelog_sink_batch_seconds", "One batch: begin, compare-and-set, apply, commit.");
}

/// A batch of `rows` from `stream` committed in `took`.
pub fn committed(stream: &str, rows: u64, took: Duration) {
    metrics::counter!("oncelog_sink_rows_applied_total", "stream" => stream.to_owned()).increment(rows);
    metrics::counter!("oncelog_sink_batches_total").increment(1);
    metrics::histogram!("oncelog_sink_batch_seconds").record(took.as_secs_f64());
}

pub fn lag(stream: &str, bytes: u64) {
    metrics::gauge!("oncelog_sink_lag_bytes", "stream" => stream.to_owned()).set(bytes as f64);
}

pub fn lost(stream: &str, bytes: u64) {
    metrics::counter!("oncelog_sink_lost_bytes_total", "stream" => stream.to_owned()).increment(bytes);
}

/// `stream` was set aside: the target refused a message of it (`--on-refused skip-stream`).
pub fn set_aside(stream: &str) {
    metrics::counter!("oncelog_sink_streams_set_aside_total", "stream" => stream.to_owned()).increment(1);
}

pub fn conflict() {
    metrics::counter!("oncelog_sink_conflicts_total").increment(1);
}

pub fn claim(outcome: &'static str) {
    metrics::counter!("oncelog_sink_claims_total", "outcome" => outcome).increment(1);
}
