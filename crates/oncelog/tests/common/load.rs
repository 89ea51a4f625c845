//! Load for the multi-node tests, and its exactly-once check.
//!
//! Idempotent producers on one text stream, each with several requests in flight; request `seq`
//! of producer `i` carries the body [`record`]`(i, seq)` and goes to a node chosen by
//! [`Route`], and every retry of it (same epoch, seq and body) to the next node in turn, until
//! it is acknowledged (200, or 204 for a duplicate). [`check_stream`] then holds the final
//! stream against what was sent and acknowledged.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use oncelog_client::{LiveMode, ReadFrom, ReadOptions, RetryPolicy};
use reqwest::StatusCode;

/// Which node a request goes to first (retries go to the next node in turn).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// Node `(i + seq) % n`: a producer's consecutive requests on different nodes, so a
    /// request often reaches its node before its predecessor is in (parked, or a 409).
    Alternate,
    /// Node `i % n`: each producer's requests on one node while all goes well.
    Sticky,
}

/// Where the load goes and how hard.
#[derive(Clone)]
pub struct Load {
    pub stream: String,
    /// The nodes' base URLs (`http://127.0.0.1:PORT`).
    pub urls: Arc<Vec<String>>,
    pub route: Route,
    /// Requests in flight per producer.
    pub in_flight: usize,
    /// Requests not acknowledged by then are given up (and the test fails).
    pub give_up: Instant,
}

/// One acknowledgement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ack {
    /// 200 (new data) or 204 (a duplicate).
    pub status: u16,
    /// Its `Stream-Next-Offset`: where the record ends in the stream.
    pub offset: u64,
}

/// What the load saw.
#[derive(Default)]
pub struct Tally {
    /// Acknowledged `(producer, seq)`, with the first acknowledgement's answer.
    pub acked: BTreeMap<(usize, u64), Ack>,
    /// Sequence numbers issued per producer (`0..n` were sent, at least once).
    pub issued: BTreeMap<usize, u64>,
    /// 200 answers.
    pub appended: u64,
    /// 204 answers (a retry whose first attempt had been committed).
    pub duplicates: u64,
    pub retries: u64,
    /// 409 answers (a predecessor not in yet): retried.
    pub gaps: u64,
    /// 503 answers: retried.
    pub unavailable: u64,
    /// Requests with no answer (connection refused or reset, timeout): retried.
    pub no_answer: u64,
    /// Requests that had an attempt answered 503 or not at all (an outcome the producer could
    /// not know) before they were acknowledged.
    pub uncertain: BTreeSet<(usize, u64)>,
    /// When the last 503 and the last unanswered request happened.
    pub last_unavailable: Option<Instant>,
    pub last_no_answer: Option<Instant>,
    /// Answers that must never happen (a 500, a 4xx other than a gap, a 200/204 without a valid
    /// offset): what, which request, and when.
    pub wrong: Vec<String>,
}

/// The body of request `seq` of producer `i`: unique, and self-delimiting in the stream.
pub fn record(i: usize, seq: u64) -> String {
    format!("p{i}-{seq};")
}

/// `(producer, seq)` of one record, given without its `;`.
pub fn parse_record(rec: &str) -> Option<(usize, u64)> {
    let (p, s) = rec.strip_prefix('p')?.split_once('-')?;
    Some((p.parse().ok()?, s.parse().ok()?))
}

fn parse_offset(r: &reqwest::Response) -> Option<u64> {
    let token = r.headers().get("stream-next-offset")?.to_str().ok()?;
    let (generation, position) = token.split_once('_')?;
    if generation.bytes().any(|b| b != b'0') {
        return None;
    }
    position.parse().ok()
}

/// Sends request `seq` of producer `i` until it is acknowledged (or `give_up` passes).
pub async fn send_until_acked(http: reqwest::Client, load: Load, i: usize, seq: u64, tally: Arc<Mutex<Tally>>) {
    let mut attempt = 0usize;
    let urls = &load.urls;
    while Instant::now() < load.give_up {
        let first = match load.route {
            Route::Alternate => i + seq as usize,
            Route::Sticky => i,
        };
        let url = &urls[(first + attempt) % urls.len()];
        let req = http
            .post(format!("{url}/v1/stream/{}", load.stream))
            .header("content-type", "text/plain")
            .header("producer-id", format!("p{i}"))
            .header("producer-epoch", "0")
            .header("producer-seq", seq.to_string())
            .body(record(i, seq))
            .timeout(Duration::from_secs(10));
        let retry_after = match req.send().await {
            Ok(r) if r.status() == StatusCode::OK || r.status() == StatusCode::NO_CONTENT => {
                let mut t = tally.lock().expect("tally");
                let status = r.status().as_u16();
                match parse_offset(&r) {
                    Some(offset) => {
                        if status == 200 {
                            t.appended += 1;
                        } else {
                            t.duplicates += 1;
                        }
                        t.acked.entry((i, seq)).or_insert(Ack { status, offset });
                    }
                    None => t.wrong.push(format!("p{i} seq {seq}: {status} without a Stream-Next-Offset")),
                }
                return;
            }
            // Its predecessor was lost with a node or a database, or is still on its way.
            Ok(r) if r.status() == StatusCode::CONFLICT => {
                tally.lock().expect("tally").gaps += 1;
                Duration::from_millis(30)
            }
            Ok(r) if r.status() == StatusCode::SERVICE_UNAVAILABLE => {
                let mut t = tally.lock().expect("tally");
                t.unavailable += 1;
                t.last_unavailable = Some(Instant::now());
                t.uncertain.insert((i, seq));
                Duration::from_millis(100)
            }
            Ok(r) => {
                let status = r.status();
                let body = r.text().await.unwrap_or_default();
                tally.lock().expect("tally").wrong.push(format!("p{i} seq {seq} via {url}: {status} {}", body.trim()));
                Duration::from_millis(100)
            }
            // The node is down or the request timed out: the next node takes the retry.
            Err(_) => {
                let mut t = tally.lock().expect("tally");
                t.no_answer += 1;
                t.last_no_answer = Some(Instant::now());
                t.uncertain.insert((i, seq));
                Duration::from_millis(50)
            }
        };
        tally.lock().expect("tally").retries += 1;
        attempt += 1;
        tokio::time::sleep(retry_after).await;
    }
}

/// Producer `i`: sequence numbers in order from 0, `load.in_flight` at a time, until `limit`
/// were issued, `stop` is set, or `load.give_up` passes (then unacknowledged requests fail the
/// test); returns once every issued request was acknowledged or given up.
pub async fn producer(i: usize, load: Load, limit: Option<u64>, stop: Arc<AtomicBool>, tally: Arc<Mutex<Tally>>) {
    let http = reqwest::Client::new();
    let window = Arc::new(tokio::sync::Semaphore::new(load.in_flight));
    let mut tasks = tokio::task::JoinSet::new();
    let mut seq = 0u64;
    while !stop.load(Ordering::Relaxed) && Instant::now() < load.give_up && limit.is_none_or(|n| seq < n) {
        while tasks.try_join_next().is_some() {}
        let permit = window.clone().acquire_owned().await.expect("semaphore");
        tally.lock().expect("tally").issued.insert(i, seq + 1);
        let (http, load, tally) = (http.clone(), load.clone(), tally.clone());
        tasks.spawn(async move {
            send_until_acked(http, load, i, seq, tally).await;
            drop(permit);
        });
        seq += 1;
    }
    while tasks.join_next().await.is_some() {}
}

/// A reader of `stream` through `base` from the beginning, in mode `live`, with unlimited
/// retries; every byte it gets goes to `sink` as it comes (so what it read is known even if it
/// never ends). `Ok` at EOF (or, catching up, once up to date), `Err` when the client gives up.
pub async fn tail(base: String, stream: String, live: LiveMode, sink: Arc<Mutex<Vec<u8>>>) -> Result<(), String> {
    let client = oncelog_client::Client::new(format!("{base}/v1/stream")).map_err(|e| e.to_string())?;
    let retry = RetryPolicy::default().with_max_attempts(None).map_err(|e| e.to_string())?;
    let opts = ReadOptions { retry: Some(retry), ..ReadOptions::new(ReadFrom::Beginning, live) };
    let mut chunks = Box::pin(client.stream(&stream).read(opts));
    while let Some(c) = chunks.next().await {
        let c = c.map_err(|e| format!("reader ({live:?} via {base}): {e}"))?;
        sink.lock().expect("sink").extend_from_slice(&c.data);
        if c.closed {
            return Ok(());
        }
    }
    Ok(())
}

/// The whole stream as `base` serves it now.
pub async fn read_all(base: &str, stream: &str) -> Vec<u8> {
    let sink = Arc::new(Mutex::new(Vec::new()));
    tail(base.to_owned(), stream.to_owned(), LiveMode::CatchUp, sink.clone()).await.expect("catch-up read");
    let bytes = sink.lock().expect("sink").clone();
    bytes
}

pub async fn create_stream(base: &str, stream: &str) {
    let r = reqwest::Client::new()
        .put(format!("{base}/v1/stream/{stream}"))
        .header("content-type", "text/plain")
        .send()
        .await
        .expect("create");
    assert!(r.status().is_success(), "create: {}", r.status());
}

/// Closes the stream, retrying through an outage (at most 20 s).
pub async fn close_stream(base: &str, stream: &str) {
    let http = reqwest::Client::new();
    let mut last = String::new();
    for _ in 0..100 {
        match http
            .post(format!("{base}/v1/stream/{stream}"))
            .header("stream-closed", "true")
            .timeout(Duration::from_secs(5))
            .send()
            .await
        {
            Ok(r) if r.status().is_success() => return,
            Ok(r) => last = r.status().to_string(),
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("could not close stream {stream} through {base}: {last}");
}

/// `/readyz`: its status and body, or `None` when the node does not answer within 2 s.
pub async fn readyz(base: &str) -> Option<(StatusCode, String)> {
    let r = reqwest::Client::new().get(format!("{base}/readyz")).timeout(Duration::from_secs(2)).send().await.ok()?;
    let status = r.status();
    Some((status, r.text().await.unwrap_or_default()))
}

/// Checks the final stream against what was sent and acknowledged: every record one that was
/// sent, none twice, in sequence order per producer; every acknowledged request in it, ending
/// exactly where its acknowledgement said. Returns how many records it holds.
pub fn check_stream(bytes: &[u8], tally: &Tally) -> usize {
    let text = std::str::from_utf8(bytes).expect("utf-8 records");
    let mut seen: BTreeMap<(usize, u64), Vec<u64>> = BTreeMap::new();
    let mut last: BTreeMap<usize, u64> = BTreeMap::new();
    let mut out_of_order = Vec::new();
    let mut never_sent = BTreeSet::new();
    let mut end = 0u64;
    for rec in text.split_inclusive(';') {
        end += rec.len() as u64;
        let key = rec.strip_suffix(';').and_then(parse_record);
        let Some((p, seq)) = key else { panic!("not a record the producers send: {rec:?} ending at byte {end}") };
        if tally.issued.get(&p).is_none_or(|n| seq >= *n) {
            never_sent.insert((p, seq));
        }
        seen.entry((p, seq)).or_default().push(end);
        if let Some(prev) = last.insert(p, seq) {
            if seq <= prev {
                out_of_order.push(format!("p{p}: seq {seq} after {prev}"));
            }
        }
    }
    assert!(never_sent.is_empty(), "records in the stream that no producer sent: {never_sent:?}");
    let twice: Vec<_> = seen.iter().filter(|(_, ends)| ends.len() > 1).collect();
    assert!(twice.is_empty(), "records written more than once (record: end offsets): {twice:?}");
    assert!(out_of_order.is_empty(), "records out of order: {out_of_order:?}");
    let missing: Vec<_> = tally.acked.iter().filter(|(k, _)| !seen.contains_key(k)).collect();
    assert!(
        missing.is_empty(),
        "{} acknowledged appends are not in the final stream (an acknowledged append was lost), e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(10)]
    );
    let misplaced: Vec<_> = tally
        .acked
        .iter()
        .filter(|(k, a)| seen.get(k).is_some_and(|ends| ends[0] != a.offset))
        .map(|(k, a)| {
            format!(
                "p{}-{}: answered {} with offset {}, ends at {} in the stream",
                k.0, k.1, a.status, a.offset, seen[k][0]
            )
        })
        .collect();
    assert!(
        misplaced.is_empty(),
        "acknowledgements with the wrong offset: {:?}",
        &misplaced[..misplaced.len().min(10)]
    );
    seen.len()
}
