//! Live-tail fan-out: R readers follow one JSON stream (`live=sse` or `live=long-poll`) while
//! one writer appends small messages. Each message carries its sequence number and the time
//! the writer sent it; readers parse both, so the benchmark measures append→delivery latency
//! (the append's own commit included) and whether every reader got every message.
//!
//! The writer sends at a fixed rate (`--rate`, or closed loop with `--rate 0`), one request at
//! a time. Readers start at the stream's tail before the writer begins, and resume from the
//! last offset they were given when the server ends a response (SSE responses are bounded in
//! time by some servers; long-poll answers 204 when nothing arrives).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{self, error_kind, json_f64, json_str, LatencySummary};

#[derive(clap::Args, Debug)]
pub struct LiveArgs {
    #[command(flatten)]
    pub target: common::TargetArgs,
    /// Number of concurrent readers of the one stream, each on its own connection.
    #[arg(long, default_value_t = 200)]
    pub readers: usize,
    /// Messages per second the writer sends (one request at a time); 0 = closed loop.
    #[arg(long, default_value_t = 100)]
    pub rate: u32,
    /// Approximate size of each JSON message, in bytes (padding included).
    #[arg(long, default_value_t = 100)]
    pub body_bytes: usize,
    /// How long the writer writes, in seconds (warm-up included).
    #[arg(long, default_value_t = 10)]
    pub duration: u64,
    /// Messages sent during the first seconds are delivered and checked but not part of the
    /// latency figures.
    #[arg(long, default_value_t = 1)]
    pub warmup: u64,
    /// After the writer stops, how long readers may take to receive the rest, in seconds.
    #[arg(long, default_value_t = 3)]
    pub drain: u64,
    /// How long all readers may take to connect before the writer starts anyway, in seconds.
    #[arg(long, default_value_t = 30)]
    pub connect_timeout: u64,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Mode {
    Sse,
    LongPoll,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Sse => "sse",
            Mode::LongPoll => "long-poll",
        }
    }
}

/// State shared by the writer and the readers.
struct Shared {
    /// Readers that are following the stream (SSE: response headers received; long-poll: the
    /// initial catch-up read answered).
    connected: AtomicU64,
    /// Messages the writer got acknowledged, once it has stopped (u64::MAX before): a reader
    /// that has them all stops early.
    final_count: AtomicU64,
    /// Messages stamped before this time (µs, [`common::now_micros`]) are warm-up: delivered
    /// and checked, but not part of the latency figures. u64::MAX until the writer starts.
    measure_from_us: AtomicU64,
}

#[derive(Default)]
struct ReaderReport {
    latencies_us: Vec<u32>,
    /// Distinct messages received, in order (sequence numbers 0..).
    received: u64,
    /// Messages that arrived twice or after a gap.
    anomalies: u64,
    /// Live requests: SSE connections (the first one included) or long-polls.
    requests: u64,
    /// SSE responses that started with 200.
    requests_ok: u64,
    errors: u64,
    error_kinds: BTreeMap<String, u64>,
}

struct WriterReport {
    acked: u64,
    errors: u64,
    error_kinds: BTreeMap<String, u64>,
    latencies_us: Vec<u32>,
    elapsed: Duration,
}

pub async fn run(args: LiveArgs, mode: Mode) -> Result<(), String> {
    let target = args.target.resolve()?;
    if args.readers == 0 || args.duration == 0 {
        return Err("--readers and --duration must be positive".into());
    }
    if args.warmup >= args.duration {
        return Err("--warmup must be shorter than --duration".into());
    }
    let stream = format!("bench-live-{}", common::run_tag());
    let url = target.stream_url(&stream);
    // Several nodes (`--url A,B`): the writer on the first, the readers on the last, so each
    // message crosses from one node to another (live tail across nodes).
    let reader_url = target.stream_urls(&stream).pop().unwrap_or_else(|| url.clone());
    // Per-request bound: one SSE response may last the whole run.
    let whole_run = Duration::from_secs(args.connect_timeout + args.duration + args.drain + 30);

    let setup = common::client(Duration::from_secs(10))?;
    let start_offset = match common::create_stream(&setup, &url, "application/json").await? {
        Some(o) => o,
        None => match common::head_tail(&setup, &url).await {
            Ok((200, Some(o))) => o,
            Ok((status, _)) => return Err(format!("HEAD {url}: status {status} without a tail")),
            Err(e) => return Err(format!("HEAD {url}: {}", error_kind(&e))),
        },
    };
    drop(setup);

    let rate_text = if args.rate == 0 { "closed-loop".to_string() } else { format!("{}/s", args.rate) };
    eprintln!(
        "{}: {} readers, writer {rate_text} messages of ~{} B for {} s (warm-up {} s), writer {url}, readers {reader_url}",
        mode.name(),
        args.readers,
        args.body_bytes,
        args.duration,
        args.warmup,
    );

    let shared = Arc::new(Shared {
        connected: AtomicU64::new(0),
        final_count: AtomicU64::new(u64::MAX),
        measure_from_us: AtomicU64::new(u64::MAX),
    });
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    // Readers share one client: each concurrent request still gets its own connection.
    let readers_client = common::pooled_client(whole_run, args.readers)?;
    let mut readers = Vec::with_capacity(args.readers);
    for _ in 0..args.readers {
        let reader = Reader {
            client: readers_client.clone(),
            url: reader_url.clone(),
            mode,
            shared: shared.clone(),
            stop: stop_rx.clone(),
        };
        let offset = start_offset.clone();
        readers.push(tokio::spawn(reader.run(offset)));
    }

    // Wait (bounded) until every reader follows the stream.
    let connect_started = Instant::now();
    let connect_deadline = connect_started + Duration::from_secs(args.connect_timeout);
    while shared.connected.load(Ordering::Relaxed) < args.readers as u64 && Instant::now() < connect_deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let connected = shared.connected.load(Ordering::Relaxed);
    eprintln!("  {connected}/{} readers connected in {:.2} s", args.readers, connect_started.elapsed().as_secs_f64());
    // Let the live requests that follow the first answer reach the server.
    tokio::time::sleep(Duration::from_millis(300)).await;

    shared.measure_from_us.store(common::now_micros() + args.warmup * 1_000_000, Ordering::Relaxed);
    let w = write_loop(
        common::client(Duration::from_secs(10))?,
        url.clone(),
        args.rate,
        args.body_bytes,
        Duration::from_secs(args.duration),
    )
    .await;
    shared.final_count.store(w.acked, Ordering::Relaxed);
    eprintln!(
        "  writer: {} messages in {:.2} s; readers get up to {} s more",
        w.acked,
        w.elapsed.as_secs_f64(),
        args.drain
    );
    let drain = Duration::from_secs(args.drain);
    let stopper = tokio::spawn(async move {
        tokio::time::sleep(drain).await;
        let _ = stop_tx.send(true);
    });

    let mut reports = Vec::with_capacity(readers.len());
    for r in readers {
        reports.push(r.await.map_err(|e| format!("reader task failed: {e}"))?);
    }
    stopper.abort();

    let mut latencies = Vec::new();
    let (mut complete, mut missing, mut anomalies, mut requests, mut errors) = (0u64, 0u64, 0u64, 0u64, 0u64);
    let mut kinds: BTreeMap<String, u64> = BTreeMap::new();
    let mut fewest = w.acked;
    for r in reports {
        let got = r.received.min(w.acked);
        if got == w.acked {
            complete += 1;
        }
        fewest = fewest.min(got);
        missing += w.acked - got;
        anomalies += r.anomalies;
        requests += r.requests;
        errors += r.errors;
        for (k, v) in r.error_kinds {
            *kinds.entry(k).or_default() += v;
        }
        latencies.extend(r.latencies_us);
    }
    let lat = LatencySummary::from_micros(latencies);
    let wlat = LatencySummary::from_micros(w.latencies_us);
    let writer_rate = w.acked as f64 / w.elapsed.as_secs_f64().max(1e-9);
    let expected = w.acked * args.readers as u64;
    let delivered_fraction = if expected == 0 { f64::NAN } else { (expected - missing) as f64 / expected as f64 };

    println!(
        "Live {} results ({} readers, {} s writing, warm-up {} s)",
        mode.name(),
        args.readers,
        args.duration,
        args.warmup
    );
    println!(
        "  writer                {} messages ({writer_rate:.1}/s), {} errors, append p50 {:.2} ms, p99 {:.2} ms",
        w.acked, w.errors, wlat.p50_ms, wlat.p99_ms
    );
    for (k, v) in &w.error_kinds {
        println!("    writer {k}: {v}");
    }
    println!(
        "  readers               {connected}/{n} connected, {complete}/{n} got every message; {missing} deliveries missing ({delivered_fraction:.4} delivered); fewest received {fewest}",
        n = args.readers
    );
    println!(
        "  anomalies             {anomalies} duplicate/out-of-order; {requests} live requests; {errors} reader errors"
    );
    for (k, v) in &kinds {
        println!("    reader {k}: {v}");
    }
    println!(
        "  delivery latency ms   p50 {:.2}  p90 {:.2}  p99 {:.2}  p99.9 {:.2}  max {:.2}  (mean {:.2}, n={})",
        lat.p50_ms, lat.p90_ms, lat.p99_ms, lat.p999_ms, lat.max_ms, lat.mean_ms, lat.count
    );
    println!(
        "{}",
        common::summary_line(&[
            ("bench", json_str(mode.name())),
            ("readers", args.readers.to_string()),
            ("connected", connected.to_string()),
            ("rate", args.rate.to_string()),
            ("body_bytes", args.body_bytes.to_string()),
            ("duration_s", args.duration.to_string()),
            ("warmup_s", args.warmup.to_string()),
            ("messages", w.acked.to_string()),
            ("writer_per_s", json_f64(writer_rate, 1)),
            ("writer_errors", w.errors.to_string()),
            ("writer_p99_ms", json_f64(wlat.p99_ms, 3)),
            ("readers_complete", complete.to_string()),
            ("missing", missing.to_string()),
            ("delivered_fraction", json_f64(delivered_fraction, 6)),
            ("anomalies", anomalies.to_string()),
            ("reader_requests", requests.to_string()),
            ("reader_errors", errors.to_string()),
            ("reader_error_kinds", common::json_counts(&kinds)),
            ("deliveries", lat.count.to_string()),
            ("p50_ms", json_f64(lat.p50_ms, 3)),
            ("p90_ms", json_f64(lat.p90_ms, 3)),
            ("p99_ms", json_f64(lat.p99_ms, 3)),
            ("p999_ms", json_f64(lat.p999_ms, 3)),
            ("max_ms", json_f64(lat.max_ms, 3)),
            ("mean_ms", json_f64(lat.mean_ms, 3)),
        ])
    );
    if w.acked == 0 {
        return Err("the writer got no append acknowledged".into());
    }
    Ok(())
}

/// The writer: one idempotent producer, message `s` is sequence number `s`, one request at a
/// time, paced to `rate` per second (0: as fast as acknowledged). A failed request is retried
/// with the same sequence number and a fresh send time.
async fn write_loop(
    client: reqwest::Client,
    url: String,
    rate: u32,
    body_bytes: usize,
    duration: Duration,
) -> WriterReport {
    let start = Instant::now();
    let end = start + duration;
    let interval = (rate > 0).then(|| Duration::from_secs_f64(1.0 / f64::from(rate)));
    let producer_id = format!("bench-live-writer-{}", common::run_tag());
    let mut rep = WriterReport {
        acked: 0,
        errors: 0,
        error_kinds: BTreeMap::new(),
        latencies_us: Vec::new(),
        elapsed: Duration::ZERO,
    };
    let mut next_send = start;
    let mut seq: u64 = 0;
    loop {
        if let Some(iv) = interval {
            if next_send > Instant::now() {
                tokio::time::sleep_until(next_send.into()).await;
            }
            // Behind schedule: send now, without bursting to catch up.
            next_send = (next_send + iv).max(Instant::now());
        }
        let sent = Instant::now();
        if sent >= end {
            break;
        }
        let body = message(seq, common::now_micros(), body_bytes);
        let result = client
            .post(&url)
            .header("content-type", "application/json")
            .header("producer-id", producer_id.as_str())
            .header("producer-epoch", "0")
            .header("producer-seq", seq.to_string())
            .body(body)
            .send()
            .await;
        let outcome = match result {
            Ok(resp) => {
                let status = resp.status().as_u16();
                match resp.bytes().await {
                    Ok(_) => Ok(status),
                    Err(e) => Err(format!("body: {}", error_kind(&e))),
                }
            }
            Err(e) => Err(error_kind(&e)),
        };
        match outcome {
            // 204: a retry the server already had.
            Ok(200 | 204) => {
                rep.latencies_us.push(common::micros_u32(sent.elapsed()));
                rep.acked += 1;
                seq += 1;
            }
            other => {
                rep.errors += 1;
                let kind = match other {
                    Ok(status) => format!("HTTP {status}"),
                    Err(kind) => kind,
                };
                *rep.error_kinds.entry(kind).or_default() += 1;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    rep.elapsed = start.elapsed().min(duration);
    rep
}

/// One JSON message: `{"s":SEQ,"t":MICROS,"p":"aaa…"}`, padded to about `size` bytes.
fn message(seq: u64, t_us: u64, size: usize) -> String {
    let bare = format!("{{\"s\":{seq},\"t\":{t_us},\"p\":\"\"}}");
    let pad = size.saturating_sub(bare.len());
    format!("{{\"s\":{seq},\"t\":{t_us},\"p\":\"{}\"}}", "a".repeat(pad))
}

/// Finds every `(s, t)` pair in JSON text holding messages made by [`message`] (an array of
/// them, one per line, or SSE data); tolerant of whitespace around the colons.
fn parse_stamps(text: &str) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some((s, after_s)) = number_after_key(rest, "\"s\"") {
        match number_after_key(after_s, "\"t\"") {
            Some((t, after_t)) => {
                out.push((s, t));
                rest = after_t;
            }
            None => break,
        }
    }
    out
}

/// The first `KEY : DIGITS` in `text`: the number and the text after it.
fn number_after_key<'a>(text: &'a str, key: &str) -> Option<(u64, &'a str)> {
    let mut rest = text;
    loop {
        let at = rest.find(key)?;
        let after = rest[at + key.len()..].trim_start();
        if let Some(value) = after.strip_prefix(':') {
            let value = value.trim_start();
            let digits = value.bytes().take_while(u8::is_ascii_digit).count();
            if digits > 0 {
                if let Ok(n) = value[..digits].parse() {
                    return Some((n, &value[digits..]));
                }
            }
        }
        rest = &rest[at + key.len()..];
    }
}

/// The string value of `"key":"..."` in a JSON object (no escapes expected: offsets, cursors).
fn string_field(text: &str, key: &str) -> Option<String> {
    let quoted = format!("\"{key}\"");
    let at = text.find(&quoted)?;
    let after = text[at + quoted.len()..].trim_start().strip_prefix(':')?;
    let value = after.trim_start().strip_prefix('"')?;
    let end = value.find('"')?;
    Some(value[..end].to_string())
}

/// Incremental Server-Sent Events parser: feed it chunks, get complete `(event, data)` pairs.
#[derive(Default)]
struct SseParser {
    buf: Vec<u8>,
    event: String,
    data: String,
    has_data: bool,
}

impl SseParser {
    fn push(&mut self, chunk: &[u8], out: &mut Vec<(String, String)>) {
        self.buf.extend_from_slice(chunk);
        let mut start = 0;
        while let Some(nl) = self.buf[start..].iter().position(|&b| b == b'\n') {
            let end = start + nl;
            let mut line = &self.buf[start..end];
            if line.last() == Some(&b'\r') {
                line = &line[..line.len() - 1];
            }
            let line = String::from_utf8_lossy(line).into_owned();
            start = end + 1;
            if line.is_empty() {
                if self.has_data {
                    let event =
                        if self.event.is_empty() { "message".to_string() } else { std::mem::take(&mut self.event) };
                    out.push((event, std::mem::take(&mut self.data)));
                }
                self.event.clear();
                self.data.clear();
                self.has_data = false;
            } else if let Some(v) = line.strip_prefix("event:") {
                self.event = v.strip_prefix(' ').unwrap_or(v).to_string();
            } else if let Some(v) = line.strip_prefix("data:") {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(v.strip_prefix(' ').unwrap_or(v));
                self.has_data = true;
            }
            // Comments (":…") and other fields are ignored.
        }
        self.buf.drain(..start);
    }
}

/// One reader of the stream.
struct Reader {
    client: reqwest::Client,
    url: String,
    mode: Mode,
    shared: Arc<Shared>,
    stop: tokio::sync::watch::Receiver<bool>,
}

/// Where a reader is in the stream and what it has seen.
struct Progress {
    offset: String,
    cursor: Option<String>,
    next_seq: u64,
    rep: ReaderReport,
}

impl Progress {
    /// Records the messages of one delivery, received at `now_us`.
    fn deliver(&mut self, text: &str, now_us: u64, measure_from_us: u64) {
        for (s, t) in parse_stamps(text) {
            if s == self.next_seq {
                self.rep.received += 1;
                self.next_seq += 1;
                if t >= measure_from_us {
                    self.rep.latencies_us.push(u32::try_from(now_us.saturating_sub(t)).unwrap_or(u32::MAX));
                }
            } else if s < self.next_seq {
                self.rep.anomalies += 1;
            } else {
                // A gap: some messages never came (counted as missing at the end).
                self.rep.anomalies += 1;
                self.rep.received += 1;
                self.next_seq = s + 1;
            }
        }
    }

    fn error(&mut self, kind: String) {
        self.rep.errors += 1;
        *self.rep.error_kinds.entry(kind).or_default() += 1;
    }
}

impl Reader {
    async fn run(mut self, offset: String) -> ReaderReport {
        let mut p = Progress { offset, cursor: None, next_seq: 0, rep: ReaderReport::default() };
        if self.mode == Mode::LongPoll {
            // A long-poll request is only answered when data arrives; a catch-up read first
            // shows that this reader is there.
            loop {
                if self.stopped() {
                    return p.rep;
                }
                match self.poll(&mut p, false).await {
                    Ok(()) => break,
                    Err(kind) => {
                        p.error(kind);
                        self.pause(Duration::from_millis(100)).await;
                    }
                }
            }
            self.shared.connected.fetch_add(1, Ordering::Relaxed);
        }
        while !self.stopped() && !self.has_all(&p) {
            p.rep.requests += 1;
            let result = match self.mode {
                Mode::Sse => self.follow_sse(&mut p).await,
                Mode::LongPoll => self.poll(&mut p, true).await,
            };
            if let Err(kind) = result {
                p.error(kind);
                self.pause(Duration::from_millis(100)).await;
            }
        }
        p.rep
    }

    fn stopped(&self) -> bool {
        *self.stop.borrow()
    }

    fn has_all(&self, p: &Progress) -> bool {
        p.next_seq >= self.shared.final_count.load(Ordering::Relaxed)
    }

    /// Sleeps, unless told to stop first.
    async fn pause(&mut self, d: Duration) {
        let _ = tokio::time::timeout(d, self.stop.wait_for(|&s| s)).await;
    }

    fn request_url(&self, p: &Progress, live: Option<&str>) -> String {
        let mut url = format!("{}?offset={}", self.url, common::encode_query_value(&p.offset));
        if let Some(live) = live {
            url.push_str("&live=");
            url.push_str(live);
        }
        if let Some(c) = &p.cursor {
            url.push_str("&cursor=");
            url.push_str(&common::encode_query_value(c));
        }
        url
    }

    /// One GET: a catch-up read (`live` false) or a long-poll. Moves the offset forward.
    async fn poll(&mut self, p: &mut Progress, live: bool) -> Result<(), String> {
        let url = self.request_url(p, live.then_some("long-poll"));
        let send = self.client.get(&url).send();
        let resp = tokio::select! {
            r = send => r.map_err(|e| error_kind(&e))?,
            _ = self.stop.wait_for(|&s| s) => return Ok(()),
        };
        let status = resp.status().as_u16();
        let next = common::header_str(&resp, "stream-next-offset");
        let cursor = common::header_str(&resp, "stream-cursor");
        let body = tokio::select! {
            b = resp.bytes() => b.map_err(|e| format!("body: {}", error_kind(&e)))?,
            _ = self.stop.wait_for(|&s| s) => return Ok(()),
        };
        let now = common::now_micros();
        match status {
            200 | 204 => {
                if status == 200 {
                    let measure_from = self.shared.measure_from_us.load(Ordering::Relaxed);
                    p.deliver(&String::from_utf8_lossy(&body), now, measure_from);
                }
                if let Some(n) = next {
                    p.offset = n;
                }
                if cursor.is_some() {
                    p.cursor = cursor;
                }
                Ok(())
            }
            other => Err(format!("HTTP {other}")),
        }
    }

    /// One SSE response, followed until the server ends it, the reader has every message, or
    /// the run stops.
    async fn follow_sse(&mut self, p: &mut Progress) -> Result<(), String> {
        let url = self.request_url(p, Some("sse"));
        let send = self.client.get(&url).send();
        let mut resp = tokio::select! {
            r = send => r.map_err(|e| error_kind(&e))?,
            _ = self.stop.wait_for(|&s| s) => return Ok(()),
        };
        let status = resp.status().as_u16();
        if status != 200 {
            return Err(format!("HTTP {status}"));
        }
        if p.rep.requests_ok == 0 {
            self.shared.connected.fetch_add(1, Ordering::Relaxed);
        }
        p.rep.requests_ok += 1;
        let mut parser = SseParser::default();
        let mut events = Vec::new();
        loop {
            let chunk = tokio::select! {
                c = resp.chunk() => c.map_err(|e| format!("body: {}", error_kind(&e)))?,
                _ = self.stop.wait_for(|&s| s) => return Ok(()),
            };
            let Some(chunk) = chunk else {
                // The server ended the response: reconnect from the last control offset.
                return Ok(());
            };
            let now = common::now_micros();
            parser.push(&chunk, &mut events);
            let measure_from = self.shared.measure_from_us.load(Ordering::Relaxed);
            for (event, data) in events.drain(..) {
                match event.as_str() {
                    "control" => {
                        if let Some(o) = string_field(&data, "streamNextOffset") {
                            p.offset = o;
                        }
                        if let Some(c) = string_field(&data, "streamCursor") {
                            p.cursor = Some(c);
                        }
                    }
                    _ => p.deliver(&data, now, measure_from),
                }
            }
            if self.has_all(p) {
                return Ok(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip() {
        let m = message(7, 123_456, 100);
        assert_eq!(m.len(), 100);
        assert_eq!(parse_stamps(&m), vec![(7, 123_456)]);
        let arr = format!("[{},{}]", message(1, 10, 0), message(2, 20, 50));
        assert_eq!(parse_stamps(&arr), vec![(1, 10), (2, 20)]);
        assert_eq!(parse_stamps("[{\"s\" : 3, \"t\": 4}]"), vec![(3, 4)]);
        assert!(parse_stamps("[]").is_empty());
    }

    #[test]
    fn sse_events_across_chunks() {
        let mut p = SseParser::default();
        let mut out = Vec::new();
        p.push(b"event: data\ndata:[{\"s\":0,", &mut out);
        assert!(out.is_empty());
        p.push(b"\"t\":5}]\r\n\r\n: keep-alive\n\nevent: control\n", &mut out);
        p.push(b"data:{\"streamNextOffset\":\"0_9\",\"upToDate\":true}\n\n", &mut out);
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].0, "data");
        assert_eq!(parse_stamps(&out[0].1), vec![(0, 5)]);
        assert_eq!(string_field(&out[1].1, "streamNextOffset").as_deref(), Some("0_9"));
    }

    #[test]
    fn progress_counts_gaps_and_duplicates() {
        let mut p = Progress { offset: String::new(), cursor: None, next_seq: 0, rep: ReaderReport::default() };
        p.deliver(&message(0, 100, 0), 150, 0);
        p.deliver(&message(0, 100, 0), 150, 0);
        p.deliver(&message(2, 100, 0), 300, 200);
        assert_eq!(p.rep.received, 2);
        assert_eq!(p.rep.anomalies, 2);
        assert_eq!(p.rep.latencies_us, vec![50]);
    }
}
