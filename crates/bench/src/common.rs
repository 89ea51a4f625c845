//! Helpers shared by the benchmarks: loopback URL check, HTTP clients, latency statistics and
//! the machine-readable summary line.

use std::fmt::Write as _;
use std::net::IpAddr;
use std::time::Duration;

/// Prefix of the one machine-readable line each benchmark prints on stdout. The rest of the line
/// is a flat JSON object (numbers and plain ASCII strings only).
pub const SUMMARY_PREFIX: &str = "oncelog-bench-summary ";

/// Parses `url` and refuses anything that is not plain HTTP to a loopback address: the load
/// generator must never be pointed at a machine other than the one it runs on.
pub fn loopback_base(url: &str) -> Result<String, String> {
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("invalid --url {url:?}: {e}"))?;
    if parsed.scheme() != "http" {
        return Err(format!("--url must use http:// (got {:?})", parsed.scheme()));
    }
    let host = parsed.host_str().ok_or_else(|| format!("--url {url:?} has no host"))?;
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let is_loopback =
        bare.eq_ignore_ascii_case("localhost") || bare.parse::<IpAddr>().map(|ip| ip.is_loopback()).unwrap_or(false);
    if !is_loopback {
        return Err(format!("--url must point at a loopback address (127.0.0.0/8, ::1, localhost); got {host:?}"));
    }
    Ok(url.trim_end_matches('/').to_string())
}

/// An HTTP/1.1 client that keeps (at most) one idle keep-alive connection. Each simulated
/// producer or reader owns one, so each uses its own TCP connection, as a real client would.
pub fn client(request_timeout: Duration) -> Result<reqwest::Client, String> {
    pooled_client(request_timeout, 1)
}

/// An HTTP/1.1 client keeping up to `max_idle` idle keep-alive connections. Concurrent requests
/// through it each get their own connection (HTTP/1.1 has no multiplexing), so one such client
/// can serve many readers without building one client (and TLS setup) per reader.
pub fn pooled_client(request_timeout: Duration, max_idle: usize) -> Result<reqwest::Client, String> {
    reqwest::Client::builder()
        .http1_only()
        .pool_max_idle_per_host(max_idle)
        .tcp_nodelay(true)
        // Plain HTTP to loopback only: skip loading the system's root certificates, which makes
        // building a client cheap.
        .tls_built_in_root_certs(false)
        .no_proxy()
        .timeout(request_timeout)
        .connect_timeout(Duration::from_secs(5))
        .build()
        .map_err(|e| format!("cannot build HTTP client: {e}"))
}

/// Percent-encodes a query value (offset tokens are opaque to clients).
pub fn encode_query_value(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for b in v.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// Run-unique suffix for stream and producer names, so repeated runs against one server never
/// collide with earlier data.
pub fn run_tag() -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    format!("{}-{}", std::process::id(), nanos % 1_000_000_000_000)
}

/// Latency summary over exact samples (microseconds). Percentiles use the nearest-rank method.
pub struct LatencySummary {
    pub count: usize,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
    pub mean_ms: f64,
}

impl LatencySummary {
    pub fn from_micros(mut samples: Vec<u32>) -> Self {
        samples.sort_unstable();
        let n = samples.len();
        let pick = |p: f64| -> f64 {
            if n == 0 {
                return 0.0;
            }
            let rank = (p * n as f64).ceil() as usize;
            f64::from(samples[rank.clamp(1, n) - 1]) / 1000.0
        };
        let mean_ms =
            if n == 0 { 0.0 } else { samples.iter().map(|&s| u64::from(s)).sum::<u64>() as f64 / n as f64 / 1000.0 };
        LatencySummary {
            count: n,
            p50_ms: pick(0.50),
            p90_ms: pick(0.90),
            p99_ms: pick(0.99),
            p999_ms: pick(0.999),
            max_ms: samples.last().map_or(0.0, |&s| f64::from(s) / 1000.0),
            mean_ms,
        }
    }
}

/// Builds the JSON summary line from (key, value) pairs; values are already JSON literals.
pub fn summary_line(fields: &[(&str, String)]) -> String {
    let body: Vec<String> = fields.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
    format!("{SUMMARY_PREFIX}{{{}}}", body.join(","))
}

pub fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

pub fn json_f64(v: f64, decimals: usize) -> String {
    if v.is_finite() {
        format!("{v:.decimals$}")
    } else {
        "null".into()
    }
}

/// Where the streams live: `--url` (loopback only) and `--prefix`, shared by every subcommand.
#[derive(clap::Args, Debug, Clone)]
pub struct TargetArgs {
    /// Base URL of the server (loopback only). Several nodes of one cluster (PostgreSQL engine):
    /// comma-separated; `append` spreads each producer's requests over them (request `seq` of
    /// producer `p` to node `(p + seq) % n`, a retry to the next node), the other benchmarks use
    /// the first.
    #[arg(long, default_value = "http://127.0.0.1:4437")]
    pub url: String,
    /// Path under which the server serves streams: stream NAME is at URL/PREFIX/NAME. Oncelog
    /// uses `/v1/stream`; the reference Node server and Electric's server treat every path as a
    /// stream name and are run with an empty prefix (`--prefix ''`).
    #[arg(long, default_value = "/v1/stream")]
    pub prefix: String,
}

/// A resolved [`TargetArgs`]: the base URL(s) plus the normalised prefix.
#[derive(Clone, Debug)]
pub struct Target {
    root: String,
    /// Every node's root (the first is `root`).
    roots: Vec<String>,
    described: String,
}

impl TargetArgs {
    pub fn resolve(&self) -> Result<Target, String> {
        let mut roots = Vec::new();
        for url in self.url.split(',').map(str::trim).filter(|u| !u.is_empty()) {
            roots.push(self.resolve_one(url)?);
        }
        let root = roots.first().cloned().ok_or("--url is empty")?;
        let described = roots.join(", ");
        Ok(Target { root, roots, described })
    }

    fn resolve_one(&self, url: &str) -> Result<String, String> {
        let base = loopback_base(url)?;
        let prefix = self.prefix.trim_matches('/');
        if prefix.contains(['?', '#', ' ']) {
            return Err(format!("--prefix {:?} must be a plain path (no '?', '#' or spaces)", self.prefix));
        }
        Ok(if prefix.is_empty() { base } else { format!("{base}/{prefix}") })
    }
}

impl Target {
    /// URL of stream `name` (names used by the benchmarks need no escaping).
    pub fn stream_url(&self, name: &str) -> String {
        format!("{}/{name}", self.root)
    }

    /// URL of stream `name` on every node, in `--url` order.
    pub fn stream_urls(&self, name: &str) -> Vec<String> {
        self.roots.iter().map(|r| format!("{r}/{name}")).collect()
    }

    /// Human-readable description for progress lines.
    pub fn describe(&self) -> &str {
        &self.described
    }
}

/// Creates a stream (PUT) with `content_type`. 201 (created) and 200 (already there, same
/// config) both count as ready. Returns the `Stream-Next-Offset` of the answer, if any.
pub async fn create_stream(client: &reqwest::Client, url: &str, content_type: &str) -> Result<Option<String>, String> {
    let resp = client
        .put(url)
        .header("content-type", content_type)
        .send()
        .await
        .map_err(|e| format!("PUT {url}: {}", error_kind(&e)))?;
    let status = resp.status();
    let next = header_str(&resp, "stream-next-offset");
    let body = resp.bytes().await.unwrap_or_default();
    if status.as_u16() == 201 || status.as_u16() == 200 {
        Ok(next)
    } else {
        Err(format!("PUT {url}: unexpected status {status}: {}", String::from_utf8_lossy(&body)))
    }
}

/// HEAD of a stream: the status and the `Stream-Next-Offset` (the tail), if the answer has one.
pub async fn head_tail(client: &reqwest::Client, url: &str) -> Result<(u16, Option<String>), reqwest::Error> {
    let resp = client.head(url).send().await?;
    Ok((resp.status().as_u16(), header_str(&resp, "stream-next-offset")))
}

/// A response header as an owned string (None if absent or not visible ASCII).
pub fn header_str(resp: &reqwest::Response, name: &str) -> Option<String> {
    resp.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned)
}

/// Short classification of a transport error, used as a key when counting errors.
pub fn error_kind(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        "timeout".into()
    } else if e.is_connect() {
        "connect error".into()
    } else {
        format!("transport error: {e}")
    }
}

/// Microseconds since the first call in this process: the clock that writers stamp into
/// payloads and readers compare against (both run in this process, so no clock skew).
pub fn now_micros() -> u64 {
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let epoch = *EPOCH.get_or_init(std::time::Instant::now);
    u64::try_from(epoch.elapsed().as_micros()).unwrap_or(u64::MAX)
}

/// Duration as microseconds saturated into a u32 (about 71 minutes), the unit of latency samples.
pub fn micros_u32(d: Duration) -> u32 {
    u32::try_from(d.as_micros()).unwrap_or(u32::MAX)
}

/// A manifest names streams and their expected tails (`Stream-Next-Offset`), one
/// `NAME<TAB>TAIL` line each. Written by `streams` and `fill`, checked by `ready` after a
/// restart.
pub fn write_manifest(path: &std::path::Path, entries: &[(String, String)]) -> Result<(), String> {
    let mut text = String::new();
    for (name, tail) in entries {
        let _ = writeln!(text, "{name}\t{tail}");
    }
    std::fs::write(path, text).map_err(|e| format!("cannot write manifest {}: {e}", path.display()))
}

pub fn read_manifest(path: &std::path::Path) -> Result<Vec<(String, String)>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read manifest {}: {e}", path.display()))?;
    let mut entries = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let (name, tail) = line
            .split_once('\t')
            .ok_or_else(|| format!("manifest {} line {}: expected NAME<TAB>TAIL", path.display(), i + 1))?;
        entries.push((name.to_string(), tail.to_string()));
    }
    if entries.is_empty() {
        return Err(format!("manifest {} names no stream", path.display()));
    }
    Ok(entries)
}

/// CPU time (user + system, every thread) a process has used so far, in seconds, from
/// `/proc/PID/stat`: how the benchmarks charge a server for the work of one phase (read before
/// and after it). `None` if the process is gone or the file cannot be parsed.
pub fn process_cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let ticks = cpu_ticks_of_stat(&stat)?;
    // SAFETY: sysconf only reads a configuration value.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (per_second > 0).then(|| ticks as f64 / per_second as f64)
}

/// utime + stime (fields 14 and 15) of a `/proc/PID/stat` line. The command name (field 2) is
/// in parentheses and may hold spaces or parentheses itself, so fields are counted after the
/// last `)`.
fn cpu_ticks_of_stat(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_ascii_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// Formats a map of error kinds as a JSON object.
pub fn json_counts(kinds: &std::collections::BTreeMap<String, u64>) -> String {
    let body: Vec<String> = kinds.iter().map(|(k, v)| format!("{}:{v}", json_str(k))).collect();
    format!("{{{}}}", body.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_ticks_are_utime_plus_stime_after_the_command_name() {
        // A command name with a space and a parenthesis; utime 1234, stime 56.
        let line = "4242 (odd) name) S 1 4242 4242 0 -1 4194560 100 0 0 0 1234 56 0 0 20 0 9 0 77 \
                    1000000 300 18446744073709551615";
        assert_eq!(cpu_ticks_of_stat(line), Some(1290));
        assert_eq!(cpu_ticks_of_stat("4242 (x) S 1 2"), None);
        let own = process_cpu_seconds(std::process::id()).expect("own /proc/PID/stat");
        assert!(own >= 0.0);
    }

    #[test]
    fn only_loopback_urls_pass() {
        assert!(loopback_base("http://127.0.0.1:4437").is_ok());
        assert!(loopback_base("http://127.1.2.3:80/").is_ok());
        assert!(loopback_base("http://localhost:1").is_ok());
        assert!(loopback_base("http://[::1]:4437").is_ok());
        assert!(loopback_base("http://10.0.0.1:4437").is_err());
        assert!(loopback_base("http://example.com").is_err());
        assert!(loopback_base("https://127.0.0.1").is_err());
        assert_eq!(loopback_base("http://127.0.0.1:9/").unwrap(), "http://127.0.0.1:9");
    }

    #[test]
    fn percentiles_nearest_rank() {
        let s = LatencySummary::from_micros((1..=1000).collect());
        assert_eq!(s.count, 1000);
        assert!((s.p50_ms - 0.5).abs() < 1e-9);
        assert!((s.p99_ms - 0.99).abs() < 1e-9);
        assert!((s.p999_ms - 0.999).abs() < 1e-9);
        assert!((s.max_ms - 1.0).abs() < 1e-9);
        let empty = LatencySummary::from_micros(Vec::new());
        assert_eq!(empty.count, 0);
    }

    #[test]
    fn targets_join_prefix() {
        let t = |url: &str, prefix: &str| {
            TargetArgs { url: url.into(), prefix: prefix.into() }.resolve().map(|t| t.stream_url("s"))
        };
        assert_eq!(t("http://127.0.0.1:1", "/v1/stream").unwrap(), "http://127.0.0.1:1/v1/stream/s");
        assert_eq!(t("http://127.0.0.1:1/", "v1/stream/").unwrap(), "http://127.0.0.1:1/v1/stream/s");
        assert_eq!(t("http://127.0.0.1:1", "").unwrap(), "http://127.0.0.1:1/s");
        assert!(t("http://127.0.0.1:1", "/a?b").is_err());
        assert!(t("http://10.1.1.1:1", "").is_err());
    }

    #[test]
    fn manifest_round_trip() {
        let dir = std::env::temp_dir().join(format!("oncelog-bench-test-{}", run_tag()));
        let entries = vec![("a".to_string(), "0_1".to_string()), ("b".into(), "0_2".into())];
        write_manifest(&dir, &entries).unwrap();
        assert_eq!(read_manifest(&dir).unwrap(), entries);
        let _ = std::fs::remove_file(&dir);
    }

    #[test]
    fn query_encoding() {
        assert_eq!(encode_query_value("0000_0001"), "0000_0001");
        assert_eq!(encode_query_value("a b/c"), "a%20b%2Fc");
    }
}
