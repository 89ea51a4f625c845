//! The clients: pipelined idempotent producers (several per stream), `Idempotency-Key` writers,
//! plain appends, `If-Match` writers racing on one stream, and long-poll and SSE readers. Each
//! appends records unique in the run (`<process>:<n>\n`) and records every operation it
//! finishes. With several nodes each client starts on one and moves to the next after an
//! unknown outcome, so retries cross nodes (deduplication must hold across them).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use oncelog_protocol::Offset;
use reqwest::StatusCode;

use super::record::Recorder;
use crate::history::{OpKind, Outcome, Stamp};

/// What every client shares.
pub struct Ctx {
    pub http: reqwest::Client,
    /// The nodes' base URLs.
    pub bases: Vec<String>,
    pub rec: Recorder,
    /// Set when the workloads should stop starting new operations.
    pub stop: AtomicBool,
    /// Set when an operation still being retried should give up (its outcome stays unknown).
    pub give_up: AtomicBool,
    /// Answers 500-599 other than 503, by status.
    pub server_errors: std::sync::Mutex<std::collections::BTreeMap<u16, u64>>,
}

impl Ctx {
    /// `stream` on node `node` (modulo the number of nodes).
    pub fn url(&self, node: usize, stream: &str) -> String {
        format!("{}/v1/stream/{stream}", self.bases[node % self.bases.len()])
    }

    /// Node `node`'s base URL for the client library (streams under it).
    pub fn client_base(&self, node: usize) -> String {
        format!("{}/v1/stream/", self.bases[node % self.bases.len()])
    }

    /// Counts a server error that is not 503.
    pub fn note(&self, status: StatusCode) {
        if status.is_server_error() && status != StatusCode::SERVICE_UNAVAILABLE {
            *self.server_errors.lock().unwrap_or_else(|p| p.into_inner()).entry(status.as_u16()).or_default() += 1;
        }
    }
}

fn next_offset(r: &reqwest::Response) -> Option<u64> {
    r.headers().get("stream-next-offset").and_then(|v| v.to_str().ok()).and_then(|v| Offset::parse(v).ok()).map(|o| o.0)
}

/// A request answered with a status this workload understands, or none (a lost connection, a
/// timeout: the outcome is unknown).
async fn post(
    ctx: &Ctx,
    node: usize,
    stream: &str,
    body: &str,
    headers: &[(&str, String)],
) -> Option<(StatusCode, Option<u64>)> {
    let mut req = ctx
        .http
        .post(ctx.url(node, stream))
        .header("content-type", "text/plain")
        .body(body.to_owned())
        .timeout(Duration::from_secs(5));
    for (k, v) in headers {
        req = req.header(*k, v);
    }
    let r = req.send().await.ok()?;
    ctx.note(r.status());
    Some((r.status(), next_offset(&r)))
}

/// Sends one append until its outcome is known (retrying the same request after a lost answer,
/// a 5xx or a gap, on the next node after an unknown outcome) or the run gives up; records it.
async fn until_known(
    ctx: &Ctx,
    process: &str,
    node: usize,
    stream: &str,
    record: String,
    headers: Vec<(&str, String)>,
    stamp: Option<Stamp>,
) {
    let invoked = ctx.rec.now();
    let mut outcome = Outcome::Unknown;
    let mut answered = None;
    let mut node = node;
    while !ctx.give_up.load(Ordering::Relaxed) {
        match post(ctx, node, stream, &record, &headers).await {
            Some((s, next)) if s.is_success() => {
                outcome = Outcome::Ok;
                answered = next;
                break;
            }
            // A gap: a predecessor is not in yet (it is being retried too).
            Some((StatusCode::CONFLICT, _)) => tokio::time::sleep(Duration::from_millis(50)).await,
            Some((s, _)) if s.is_client_error() && s != StatusCode::TOO_MANY_REQUESTS => {
                outcome = Outcome::Failed;
                break;
            }
            _ => {
                node += 1;
                tokio::time::sleep(Duration::from_millis(100)).await
            }
        }
    }
    let kind = OpKind::Append { stream: stream.into(), record, stamp, if_match: None, next_offset: answered };
    ctx.rec.record(process, invoked, outcome, kind);
}

/// Producer `name` on `stream`: `window` requests in flight with consecutive sequence numbers.
pub async fn producer(ctx: Arc<Ctx>, name: String, node: usize, stream: String, window: u64) {
    let mut seq = 0;
    while !ctx.stop.load(Ordering::Relaxed) {
        let batch = (seq..seq + window).map(|s| {
            let stamp = Stamp { producer: name.clone(), epoch: 0, seq: s };
            let headers = vec![
                ("producer-id", name.clone()),
                ("producer-epoch", "0".to_owned()),
                ("producer-seq", s.to_string()),
            ];
            until_known(&ctx, &name, node, &stream, format!("{name}:{s}\n"), headers, Some(stamp))
        });
        futures_util::future::join_all(batch).await;
        seq += window;
    }
}

/// A writer whose every append carries its own `Idempotency-Key`, retried until known.
pub async fn keyed(ctx: Arc<Ctx>, name: String, node: usize, stream: String) {
    let mut n = 0u64;
    while !ctx.stop.load(Ordering::Relaxed) {
        until_known(
            &ctx,
            &name,
            node,
            &stream,
            format!("{name}:{n}\n"),
            vec![("idempotency-key", format!("{name}-{n}"))],
            None,
        )
        .await;
        n += 1;
    }
}

/// Plain appends, never retried: an unanswered one stays unknown.
pub async fn plain(ctx: Arc<Ctx>, name: String, node: usize, stream: String) {
    let mut n = 0u64;
    while !ctx.stop.load(Ordering::Relaxed) {
        let record = format!("{name}:{n}\n");
        let invoked = ctx.rec.now();
        let (outcome, answered) = match post(&ctx, node + n as usize, &stream, &record, &[]).await {
            Some((s, next)) if s.is_success() => (Outcome::Ok, next),
            Some((s, _)) if s.is_client_error() => (Outcome::Failed, None),
            _ => (Outcome::Unknown, None),
        };
        ctx.rec.record(
            &name,
            invoked,
            outcome,
            OpKind::Append { stream: stream.clone(), record, stamp: None, if_match: None, next_offset: answered },
        );
        if outcome != Outcome::Ok {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        n += 1;
    }
}

/// Reads the tail, then appends only if the tail is still that (`If-Match`); racers on one
/// stream compete for each tail.
pub async fn racer(ctx: Arc<Ctx>, name: String, node: usize, stream: String) {
    let mut n = 0u64;
    while !ctx.stop.load(Ordering::Relaxed) {
        let tail = match ctx.http.head(ctx.url(node, &stream)).timeout(Duration::from_secs(5)).send().await {
            Ok(r) if r.status().is_success() => next_offset(&r),
            _ => None,
        };
        let Some(tail) = tail else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let record = format!("{name}:{n}\n");
        let invoked = ctx.rec.now();
        let (outcome, answered) =
            match post(&ctx, node, &stream, &record, &[("if-match", format!("\"{}\"", Offset(tail)))]).await {
                Some((s, next)) if s.is_success() => (Outcome::Ok, next),
                Some((s, _)) if s.is_client_error() => (Outcome::Failed, None),
                _ => (Outcome::Unknown, None),
            };
        let kind =
            OpKind::Append { stream: stream.clone(), record, stamp: None, if_match: Some(tail), next_offset: answered };
        ctx.rec.record(&name, invoked, outcome, kind);
        n += 1;
    }
}

/// A long-poll reader from the start of `stream`: each answer with data is one read.
pub async fn reader(ctx: Arc<Ctx>, name: String, node: usize, stream: String) {
    let mut from = 0u64;
    while !ctx.stop.load(Ordering::Relaxed) {
        let invoked = ctx.rec.now();
        let url = format!("{}?offset={}&live=long-poll", ctx.url(node, &stream), Offset(from));
        let r = match ctx.http.get(url).timeout(Duration::from_secs(10)).send().await {
            Ok(r) if r.status() == StatusCode::OK => r,
            Ok(r) => {
                ctx.note(r.status());
                continue;
            }
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let next = next_offset(&r);
        let Ok(body) = r.text().await else { continue };
        if body.is_empty() {
            continue;
        }
        let len = body.len() as u64;
        ctx.rec.record(&name, invoked, Outcome::Ok, OpKind::Read { stream: stream.clone(), from, bytes: body });
        from = next.unwrap_or(from + len);
    }
}

/// The whole of `stream` once the faults have healed (catch-up reads to the tail).
pub async fn final_contents(ctx: &Ctx, stream: &str) -> Result<String, String> {
    let mut out = String::new();
    for _ in 0..100_000 {
        let url = format!("{}?offset={}", ctx.url(0, stream), Offset(out.len() as u64));
        let r = ctx.http.get(url).send().await.map_err(|e| format!("final read of {stream}: {e}"))?;
        if r.status() == StatusCode::NOT_FOUND {
            return Ok(out);
        }
        if !r.status().is_success() {
            return Err(format!("final read of {stream}: {}", r.status()));
        }
        let done = r.headers().get("stream-up-to-date").is_some();
        let body = r.text().await.map_err(|e| format!("final read of {stream}: {e}"))?;
        out.push_str(&body);
        if done || body.is_empty() {
            return Ok(out);
        }
    }
    Err(format!("final read of {stream}: never up to date"))
}

/// The byte position a client-library token names (`-1`: the start).
pub fn offset_of(o: &oncelog_client::StreamOffset) -> u64 {
    o.to_oncelog().map_or(0, |o| o.0)
}

/// An SSE reader from the start of `stream` through the client library (which reconnects from
/// its last confirmed offset by itself): each chunk with data is one read.
pub async fn sse_reader(ctx: Arc<Ctx>, name: String, node: usize, stream: String) {
    use futures_util::StreamExt;
    let Ok(client) =
        oncelog_client::Client::builder(ctx.client_base(node)).request_timeout(Duration::from_secs(10)).build()
    else {
        return;
    };
    let mut from = 0u64;
    while !ctx.stop.load(Ordering::Relaxed) {
        let start = oncelog_client::StreamOffset::from(Offset(from));
        let mut opts = oncelog_client::ReadOptions::new(start, oncelog_client::LiveMode::Sse);
        opts.retry = oncelog_client::RetryPolicy::default().with_max_attempts(None).ok();
        let mut chunks = client.stream(&stream).read(opts);
        let mut invoked = ctx.rec.now();
        while !ctx.stop.load(Ordering::Relaxed) {
            match tokio::time::timeout(Duration::from_millis(500), chunks.next()).await {
                Err(_) => continue,
                Ok(Some(Ok(chunk))) => {
                    if !chunk.data.is_empty() {
                        let bytes = String::from_utf8_lossy(&chunk.data).into_owned();
                        ctx.rec.record(
                            &name,
                            invoked,
                            Outcome::Ok,
                            OpKind::Read { stream: stream.clone(), from, bytes },
                        );
                    }
                    from = offset_of(&chunk.next_offset);
                    invoked = ctx.rec.now();
                }
                // The reader gave up (or ended): a new one from where this one stood.
                Ok(Some(Err(_)) | None) => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    break;
                }
            }
        }
    }
}
