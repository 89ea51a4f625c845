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
        return Err(format!(
            "--url must use http:// (got {:?})",
            parsed.scheme()
        ));
    }
    let host = parsed
        .host_str()
        .ok_or_else(|| format!("--url {url:?} has no host"))?;
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let is_loopback = bare.eq_ignore_ascii_case("localhost")
        || bare
            .parse::<IpAddr>()
            .map(|ip| ip.is_loopback())
            .unwrap_or(false);
    if !is_loopback {
        return Err(format!(
            "--url must point at a loopback address (127.0.0.0/8, ::1, localhost); got {host:?}"
        ));
    }
    Ok(url.trim_end_matches('/').to_string())
}

/// An HTTP/1.1 client that keeps (at most) one idle keep-alive connection. Each simulated
/// producer or reader owns one, so each uses its own TCP connection, as a real client would.
pub fn client(request_timeout: Duration) -> Result<reqwest::Client, String> {
    reqwest::Client::builder()
        .http1_only()
        .pool_max_idle_per_host(1)
        .tcp_nodelay(true)
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
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
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
        let mean_ms = if n == 0 {
            0.0
        } else {
            samples.iter().map(|&s| u64::from(s)).sum::<u64>() as f64 / n as f64 / 1000.0
        };
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

/// Creates a stream (PUT). 201 (created) and 200 (already there, same config) both count as ready.
pub async fn create_stream(client: &reqwest::Client, base: &str, name: &str) -> Result<(), String> {
    let url = format!("{base}/v1/stream/{name}");
    let resp = client
        .put(&url)
        .header("content-type", "application/octet-stream")
        .send()
        .await
        .map_err(|e| format!("PUT {url}: {e}"))?;
    let status = resp.status();
    let body = resp.bytes().await.unwrap_or_default();
    if status.as_u16() == 201 || status.as_u16() == 200 {
        Ok(())
    } else {
        Err(format!(
            "PUT {url}: unexpected status {status}: {}",
            String::from_utf8_lossy(&body)
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_urls_pass() {
        assert!(loopback_base("http://127.0.0.1:4437").is_ok());
        assert!(loopback_base("http://127.1.2.3:80/").is_ok());
        assert!(loopback_base("http://localhost:1").is_ok());
        assert!(loopback_base("http://[::1]:4437").is_ok());
        assert!(loopback_base("http://10.0.0.1:4437").is_err());
        assert!(loopback_base("http://example.com").is_err());
        assert!(loopback_base("https://127.0.0.1").is_err());
        assert_eq!(
            loopback_base("http://127.0.0.1:9/").unwrap(),
            "http://127.0.0.1:9"
        );
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
    fn query_encoding() {
        assert_eq!(encode_query_value("0000_0001"), "0000_0001");
        assert_eq!(encode_query_value("a b/c"), "a%20b%2Fc");
    }
}
