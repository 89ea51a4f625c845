//! One scenario on one fresh server: which `oncelog-bench` generator runs with which options
//! (each bounded in time), and what is taken from its summary line, the server's CPU time
//! (`/proc/PID/stat`) and memory (`/proc/PID/status`) into the results.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::options::{Config, Scenario, Server};
use super::servers::{self, with_suffix, Paths, RunningServer};
use super::stats::Results;
use super::PeersError;
use crate::common::{process_cpu_seconds, SUMMARY_PREFIX};

/// What a scenario runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plan {
    /// `append`: closed-loop producers over streams, 1 KiB appends.
    Append { producers: u32, streams: u32, in_flight: u32 },
    /// `sse` or `longpoll`: live readers of one stream while one writer appends.
    Live { kind: &'static str, readers: u32 },
    /// `read`: the catch-up stream written in appends of this size, then read whole.
    Catchup { append_bytes: u32 },
    /// `streams`, then SIGKILL and the time until the sampled streams are back.
    Streams,
    /// `fill`, then SIGKILL and the time until every tail is back.
    Recovery,
}

pub fn plan(scenario: Scenario) -> Plan {
    match scenario {
        Scenario::S1 => Plan::Append { producers: 64, streams: 8, in_flight: 1 },
        Scenario::S1Wide => Plan::Append { producers: 512, streams: 64, in_flight: 1 },
        Scenario::Inflight1 => Plan::Append { producers: 1, streams: 1, in_flight: 1 },
        Scenario::Inflight5 => Plan::Append { producers: 1, streams: 1, in_flight: 5 },
        Scenario::Sse200 => Plan::Live { kind: "sse", readers: 200 },
        Scenario::Sse1000 => Plan::Live { kind: "sse", readers: 1000 },
        Scenario::Sse5000 => Plan::Live { kind: "sse", readers: 5000 },
        Scenario::Longpoll50 => Plan::Live { kind: "longpoll", readers: 50 },
        Scenario::Catchup4k => Plan::Catchup { append_bytes: 4096 },
        Scenario::Catchup64k => Plan::Catchup { append_bytes: 65536 },
        Scenario::Catchup1m => Plan::Catchup { append_bytes: 1_048_576 },
        Scenario::Streams => Plan::Streams,
        Scenario::Recovery => Plan::Recovery,
    }
}

/// A number or plain string of a flat JSON summary object (`None` if absent or empty).
pub fn field(summary: &str, key: &str) -> Option<String> {
    let needle = format!("\"{key}\":");
    let rest = &summary[summary.find(&needle)? + needle.len()..];
    let value = match rest.strip_prefix('"') {
        Some(quoted) => quoted.split_once('"').map_or(quoted, |(v, _)| v),
        None => rest.split([',', '}']).next().unwrap_or(""),
    };
    Some(value.to_string()).filter(|v| !v.is_empty())
}

/// An object-valued field (`"reader_error_kinds":{...}`), as its text.
pub fn object_field(summary: &str, key: &str) -> Option<String> {
    let needle = format!("\"{key}\":{{");
    let start = summary.find(&needle)? + needle.len() - 1;
    let len = summary[start..].find('}')? + 1;
    Some(summary[start..start + len].to_string())
}

/// The summary line of a generator's output: the last line starting with the summary prefix.
pub fn summary_of(stdout: &str) -> Option<String> {
    stdout.lines().filter_map(|l| l.strip_prefix(SUMMARY_PREFIX)).next_back().map(str::to_string)
}

/// Set and not "0" (as the script's `[[ -n $v && $v != 0 ]]`).
fn nonzero(v: &Option<String>) -> bool {
    v.as_deref().is_some_and(|v| v != "0")
}

/// Server CPU (in µs) per unit of work, one decimal.
pub fn cpu_us_per(before: Option<f64>, after: Option<f64>, count: &Option<String>) -> Option<String> {
    let n: f64 = count.as_deref()?.parse().ok()?;
    let (before, after) = (before?, after?);
    (n != 0.0).then(|| format!("{:.1}", (after - before) * 1e6 / n))
}

/// One scenario, one server, one round.
pub struct Scene<'a> {
    pub scenario: Scenario,
    pub server: &'a mut RunningServer,
    pub cfg: &'a Config,
    pub paths: &'a Paths,
    pub results: &'a mut Results,
    /// `RUN_DIR/SCENARIO.SERVER.rROUND`: the prefix of this run's log files.
    pub tag: PathBuf,
    pub round: u64,
}

impl Scene<'_> {
    fn kind(&self) -> Server {
        self.server.kind
    }

    /// A remark printed under the table (with its round when there are several).
    pub fn note(&mut self, text: impl Into<String>) {
        let text = text.into();
        let text = if self.cfg.rounds > 1 { format!("round {}: {text}", self.round) } else { text };
        self.results.note(self.scenario, self.kind(), text);
    }

    fn record(&mut self, metric: &'static str, value: Option<String>) {
        self.results.record(self.scenario, metric, self.kind(), value.as_deref());
    }

    fn cpu(&self) -> Option<f64> {
        self.server.pid().and_then(process_cpu_seconds)
    }

    fn rss(&self) -> Option<String> {
        self.server.pid().and_then(servers::rss_mb)
    }

    /// Runs generator `name` against the server for at most `bound_s` seconds, its output in
    /// `TAG.NAME.out` / `.err`. Returns whether it succeeded, and its summary line.
    fn bench(&mut self, name: &str, bound_s: u64, args: &[String]) -> Result<(bool, Option<String>), PeersError> {
        let (out, err) =
            (with_suffix(&self.tag, &format!("{name}.out")), with_suffix(&self.tag, &format!("{name}.err")));
        let mut command = Command::new(&self.paths.bench_bin);
        command.arg(name).args(["--url", &self.server.url, "--prefix", self.server.prefix()]).args(args);
        let status = servers::run_bounded(command, &out, &err, Duration::from_secs(bound_s))?;
        let summary = summary_of(&std::fs::read_to_string(&out).unwrap_or_default());
        if let Some(s) = &summary {
            eprintln!("   {s}");
        }
        if status != 0 {
            let last = servers::tail_lines(&std::fs::read(&err).unwrap_or_default(), 1);
            eprintln!("   {name} failed (exit {status}): {}", last.trim_end());
        }
        Ok((status == 0, summary))
    }

    fn bench_or_note(&mut self, name: &str, bound_s: u64, args: &[String]) -> Result<Option<String>, PeersError> {
        let (ok, summary) = self.bench(name, bound_s, args)?;
        if !ok {
            self.note("generator failed");
        }
        Ok(summary)
    }

    pub fn run(&mut self) -> Result<(), PeersError> {
        match plan(self.scenario) {
            Plan::Append { producers, streams, in_flight } => self.append(producers, streams, in_flight),
            Plan::Live { kind, readers } => self.live(kind, readers),
            Plan::Catchup { append_bytes } => self.catchup(append_bytes),
            Plan::Streams => self.streams(),
            Plan::Recovery => self.recovery(),
        }
    }

    fn append(&mut self, producers: u32, streams: u32, in_flight: u32) -> Result<(), PeersError> {
        let cfg = self.cfg;
        let before = self.cpu();
        let args = words(&format!(
            "--producers {producers} --streams {streams} --in-flight {in_flight} --body-bytes 1024 \
             --duration {} --warmup {} --progress false",
            cfg.duration, cfg.warmup
        ));
        let summary = self.bench_or_note("append", cfg.duration + cfg.warmup + 60, &args)?;
        let after = self.cpu();
        let Some(summary) = summary else { return Ok(()) };
        let errors = field(&summary, "errors");
        if nonzero(&errors) {
            self.note(format!("{} failed requests", errors.as_deref().unwrap_or_default()));
        }
        for (metric, key) in [
            ("appends_per_s", "appends_per_s"),
            ("p50_ms", "p50_ms"),
            ("p99_ms", "p99_ms"),
            ("p999_ms", "p999_ms"),
            ("errors", "errors"),
            ("conflicts", "conflicts"),
            ("requests_per_append", "requests_per_append"),
        ] {
            self.record(metric, field(&summary, key));
        }
        let acked_total = field(&summary, "acked_total");
        if nonzero(&acked_total) {
            self.record("cpu_us_per_append", cpu_us_per(before, after, &acked_total));
        }
        let rss = self.rss();
        self.record("rss_mb", rss);
        if self.scenario == Scenario::Inflight1 {
            let per_second: Option<f64> = field(&summary, "appends_per_s").and_then(|r| r.parse().ok());
            if let Some(r) = per_second.filter(|r| *r != 0.0) {
                self.record("us_per_append", Some(format!("{:.1}", 1e6 / r)));
            }
            // The physical limit beside it, on the disk the server just wrote to: a bare loop of
            // pwrite + fdatasync of 1 KiB (oncelog-bench disk), with the server idle: into space
            // allocated ahead (as both servers' logs are), and growing the file with each write.
            for (space, metric) in [("allocate", "disk_allocate_us"), ("extend", "disk_extend_us")] {
                let us = self.disk(space)?;
                self.record(metric, us);
            }
        }
        Ok(())
    }

    /// `oncelog-bench disk` in the server's directory for 5 s (bounded at 60 s): µs per write.
    fn disk(&mut self, space: &str) -> Result<Option<String>, PeersError> {
        let (out, err) = (
            with_suffix(&self.tag, &format!("disk-{space}.out")),
            with_suffix(&self.tag, &format!("disk-{space}.err")),
        );
        let mut command = Command::new(&self.paths.bench_bin);
        command.arg("disk").arg("--dir").arg(self.server.dir());
        command.args(["--bytes", "1024", "--seconds", "5", "--space", space]);
        servers::run_bounded(command, &out, &err, Duration::from_secs(60))?;
        let summary = summary_of(&std::fs::read_to_string(&out).unwrap_or_default());
        Ok(summary.and_then(|s| field(&s, "us_per_write")))
    }

    fn live(&mut self, kind: &str, readers: u32) -> Result<(), PeersError> {
        let cfg = self.cfg;
        let before = self.cpu();
        let args = words(&format!(
            "--readers {readers} --rate {} --body-bytes 100 --duration {} --warmup 1 --drain 3 \
             --connect-timeout 60",
            cfg.sse_rate, cfg.duration
        ));
        let summary = self.bench_or_note(kind, cfg.duration + 150, &args)?;
        let after = self.cpu();
        let Some(summary) = summary else { return Ok(()) };
        // Server CPU over the whole run (readers connecting included) per message delivered.
        let deliveries = field(&summary, "deliveries");
        if nonzero(&deliveries) {
            self.record("cpu_us_per_delivery", cpu_us_per(before, after, &deliveries));
            self.record("p50_ms", field(&summary, "p50_ms"));
            self.record("p99_ms", field(&summary, "p99_ms"));
        } else {
            self.note("no message after the warm-up was delivered, so no latency");
        }
        let writer_rate = field(&summary, "writer_per_s");
        let reached: f64 = writer_rate.as_deref().and_then(|w| w.parse().ok()).unwrap_or(0.0);
        if cfg.sse_rate > 0 && reached < cfg.sse_rate as f64 / 2.0 {
            self.note(format!(
                "the writer reached only {} of the {} messages/s asked",
                writer_rate.as_deref().unwrap_or_default(),
                cfg.sse_rate
            ));
        }
        self.record("writer_per_s", writer_rate);
        for metric in ["readers_complete", "missing", "reader_errors"] {
            self.record(metric, field(&summary, metric));
        }
        let connected = field(&summary, "connected").unwrap_or_default();
        if connected != readers.to_string() {
            self.note(format!("only {connected}/{readers} readers connected"));
        }
        if let Some(kinds) = object_field(&summary, "reader_error_kinds").filter(|k| k != "{}") {
            self.note(format!("reader errors {kinds}"));
        }
        Ok(())
    }

    /// A stream of `--catchup-mb` MB written in appends of `append_bytes`, then read from its
    /// start by 4 readers following Stream-Next-Offset until up to date (what a reader catching
    /// up gets), each body counted as it streams in: once over keep-alive connections, once
    /// with a connection per request, then by readers that are not ours (Python's `http.client`
    /// on keep-alive connections, `curl` once per request).
    fn catchup(&mut self, append_bytes: u32) -> Result<(), PeersError> {
        let mb = self.cfg.catchup_mb;
        let mut args = words(&format!(
            "--size-mb {mb} --readers 4 --append-bytes {append_bytes} --reader both --foreign --timeout {}",
            mb + 400
        ));
        if let Some(pid) = self.server.pid() {
            args.extend(["--server-pid".to_string(), pid.to_string()]);
        }
        let Some(summary) = self.bench_or_note("read", mb + 410, &args)? else { return Ok(()) };
        for (metric, key) in [
            ("mb_per_s", "total_mb_per_s"),
            ("per_request_mb_per_s", "per_request_mb_per_s"),
            ("cpu_ms_per_gb", "cpu_ms_per_gb"),
            ("per_request_cpu_ms_per_gb", "per_request_cpu_ms_per_gb"),
            ("python_mb_per_s", "python_mb_per_s"),
            ("python_cpu_ms_per_gb", "python_cpu_ms_per_gb"),
            ("curl_mb_per_s", "curl_mb_per_s"),
            ("curl_cpu_ms_per_gb", "curl_cpu_ms_per_gb"),
            ("response_kb", "mean_response_kb"),
            ("write_mb_per_s", "write_mb_per_s"),
        ] {
            self.record(metric, field(&summary, key));
        }
        let rss = self.rss();
        self.record("rss_mb", rss);
        Ok(())
    }

    /// After a SIGKILL: restart on the same port and data directory, time until the manifest's
    /// streams answer HEAD with their tails.
    fn restart_and_time(&mut self, manifest: &Path, metric: &'static str) -> Result<(), PeersError> {
        let t0 = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        self.server.relaunch(self.paths)?;
        let mut args = words(&format!("--since-unix-ns {t0} --timeout 300"));
        args.extend(["--manifest".to_string(), manifest.display().to_string()]);
        let (ok, summary) = self.bench("ready", 330, &args)?;
        if !ok {
            self.note("restart: not every stream back with its tail");
        }
        let Some(summary) = summary else { return Ok(()) };
        if field(&summary, "ready").as_deref() == Some("true") {
            self.record(metric, field(&summary, "ready_ms"));
        }
        let mismatches = field(&summary, "mismatches");
        if nonzero(&mismatches) {
            self.note(format!("{} streams came back with another tail", mismatches.as_deref().unwrap_or_default()));
        }
        Ok(())
    }

    fn streams(&mut self) -> Result<(), PeersError> {
        let count = self.cfg.streams_count;
        let manifest = self.server.dir().join("manifest");
        let mut args =
            words(&format!("--count {count} --concurrency 16 --body-bytes 100 --timeout {}", count / 100 + 600));
        args.extend(["--manifest".to_string(), manifest.display().to_string()]);
        let Some(summary) = self.bench_or_note("streams", count / 100 + 660, &args)? else { return Ok(()) };
        self.record("streams_per_s", field(&summary, "streams_per_s"));
        self.record("errors", field(&summary, "errors"));
        let rss = self.rss();
        self.record("rss_mb", rss);
        if let Some(kinds) = object_field(&summary, "error_kinds").filter(|k| k != "{}") {
            self.note(format!("errors {kinds}"));
        }
        if !manifest.is_file() {
            return Ok(());
        }
        self.server.crash();
        self.restart_and_time(&manifest, "restart_ms")
    }

    fn recovery(&mut self) -> Result<(), PeersError> {
        let (gb, mb) = (self.cfg.recovery_gb.clone(), self.cfg.recovery_mb);
        let free_kb = servers::free_kb(self.server.dir()).unwrap_or(0);
        if u128::from(free_kb) * 1024 < u128::from(mb) * 3 * 1_000_000 {
            self.note(format!("skipped: less than 3x {gb} GB free"));
            eprintln!("   skipped: {} MB free, need {} MB", free_kb / 1000, mb * 3);
            return Ok(());
        }
        let manifest = self.server.dir().join("manifest");
        let mut args = words(&format!("--size-mb {mb} --streams 4 --append-bytes 65536 --timeout {}", mb / 5 + 600));
        args.extend(["--manifest".to_string(), manifest.display().to_string()]);
        let Some(summary) = self.bench_or_note("fill", mb / 5 + 660, &args)? else { return Ok(()) };
        self.record("fill_mb_per_s", field(&summary, "mb_per_s"));
        let data_mb = servers::du_mb(&self.server.data_dir());
        self.record("data_mb", data_mb);
        self.server.crash();
        self.restart_and_time(&manifest, "recovery_ms")
    }
}

/// Generator options without spaces in any value, as words.
fn words(text: &str) -> Vec<String> {
    text.split_whitespace().map(str::to_string).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SSE: &str = r#"{"bench":"sse","readers":200,"connected":198,"rate":100,"writer_per_s":100.0,"reader_error_kinds":{"timeout":2,"connect error":1},"deliveries":40000,"p50_ms":4.915,"p99_ms":8.297,"name":"a b"}"#;

    #[test]
    fn summary_fields() {
        assert_eq!(field(SSE, "readers").as_deref(), Some("200"));
        assert_eq!(field(SSE, "writer_per_s").as_deref(), Some("100.0"));
        assert_eq!(field(SSE, "p99_ms").as_deref(), Some("8.297"));
        assert_eq!(field(SSE, "name").as_deref(), Some("a b"));
        assert_eq!(field(SSE, "bench").as_deref(), Some("sse"));
        assert_eq!(field(SSE, "p999_ms"), None);
        assert_eq!(field(r#"{"ready":true}"#, "ready").as_deref(), Some("true"));
        assert_eq!(field(r#"{"x":null}"#, "x").as_deref(), Some("null"));
        assert_eq!(object_field(SSE, "reader_error_kinds").as_deref(), Some(r#"{"timeout":2,"connect error":1}"#));
        assert_eq!(object_field(r#"{"error_kinds":{},"n":1}"#, "error_kinds").as_deref(), Some("{}"));
        assert_eq!(object_field(SSE, "error_kinds"), None);
    }

    #[test]
    fn the_last_summary_line_counts() {
        let out = "progress\noncelog-bench-summary {\"n\":1}\nmore\noncelog-bench-summary {\"n\":2}\n";
        assert_eq!(summary_of(out).as_deref(), Some("{\"n\":2}"));
        assert_eq!(summary_of("no summary\n"), None);
    }

    #[test]
    fn cpu_per_unit() {
        assert_eq!(cpu_us_per(Some(1.0), Some(1.5), &Some("1000".into())).as_deref(), Some("500.0"));
        assert_eq!(cpu_us_per(Some(0.0), Some(0.01), &Some("3".into())).as_deref(), Some("3333.3"));
        assert_eq!(cpu_us_per(Some(1.0), Some(2.0), &Some("0".into())), None);
        assert_eq!(cpu_us_per(None, Some(2.0), &Some("10".into())), None);
        assert_eq!(cpu_us_per(Some(1.0), Some(2.0), &None), None);
    }

    #[test]
    fn plans_are_the_scripts() {
        assert_eq!(plan(Scenario::S1), Plan::Append { producers: 64, streams: 8, in_flight: 1 });
        assert_eq!(plan(Scenario::S1Wide), Plan::Append { producers: 512, streams: 64, in_flight: 1 });
        assert_eq!(plan(Scenario::Inflight5), Plan::Append { producers: 1, streams: 1, in_flight: 5 });
        assert_eq!(plan(Scenario::Sse5000), Plan::Live { kind: "sse", readers: 5000 });
        assert_eq!(plan(Scenario::Longpoll50), Plan::Live { kind: "longpoll", readers: 50 });
        assert_eq!(plan(Scenario::Catchup64k), Plan::Catchup { append_bytes: 65536 });
        assert_eq!(plan(Scenario::Recovery), Plan::Recovery);
    }
}
