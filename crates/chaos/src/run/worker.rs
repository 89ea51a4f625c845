//! Subscription workers: a pull-wake subscription over the producers' streams; each worker
//! claims a wake, reads every linked stream from its acknowledged offset, and writes one output
//! line per input record (`<generation>|<record>`) to `out` together with the acks, in one
//! transactional commit. A commit whose outcome is unknown is sent again (the same commit: its
//! producer stamps make a repeat a duplicate) until it is known or the lease is surely gone.
//!
//! Leases are short (3 s), so pauses, partitions, skewed clocks and the workers' own stalls
//! (one commit in sixteen waits 3.5 s after its read) hand work to the other worker while a
//! zombie still holds a claim: what it commits then must be fenced. Batches are bounded, so a
//! zombie and its successor often take the same range.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use oncelog_client::{Client, RetryPolicy, StreamOffset, SubscriptionConfig};
use oncelog_protocol::Offset;
use reqwest::StatusCode;

use super::workload::{offset_of, Ctx};
use crate::history::{Input, OpKind, Outcome};

pub const SUBSCRIPTION: &str = "chaos";
pub const WAKE: &str = "wake";
pub const OUT: &str = "out";
/// Input records per stream in one commit, at most.
const BATCH: usize = 8;

/// The subscription over `inputs`, its wake stream and its output stream, made once.
pub async fn setup(ctx: &Ctx, inputs: &[String]) -> Result<(), String> {
    for (s, ct) in [(WAKE, "application/json"), (OUT, "text/plain")] {
        let r = ctx
            .http
            .put(ctx.url(0, s))
            .header("content-type", ct)
            .send()
            .await
            .map_err(|e| format!("create {s}: {e}"))?;
        if !r.status().is_success() {
            return Err(format!("create {s}: {}", r.status()));
        }
    }
    let client = Client::builder(ctx.client_base(0)).build().map_err(|e| e.to_string())?;
    let mut config = SubscriptionConfig::pull_wake(WAKE).lease_ttl(Duration::from_secs(3)).output(OUT);
    for s in inputs {
        config = config.stream(s.clone());
    }
    client.subscriptions().put(SUBSCRIPTION, &config).await.map_err(|e| format!("create the subscription: {e}"))?;
    Ok(())
}

/// Worker `name` on node `node` until the run stops.
pub async fn worker(ctx: Arc<Ctx>, name: String, node: usize) {
    // No retries inside the library: this worker decides (and records) what a failure means.
    let Ok(client) = Client::builder(ctx.client_base(node))
        .retry_policy(RetryPolicy::none())
        .request_timeout(Duration::from_secs(5))
        .build()
    else {
        return;
    };
    let subs = client.subscriptions();
    while !ctx.stop.load(Ordering::Relaxed) {
        match subs.claim(SUBSCRIPTION, &name).await {
            Ok(Ok(claim)) => work(&ctx, &name, node, claim).await,
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// One commit in sixteen, decided by the worker's name and the generation (repeatable).
fn stalls(name: &str, generation: u64) -> bool {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (name, generation).hash(&mut h);
    h.finish().is_multiple_of(16)
}

async fn work(ctx: &Ctx, name: &str, node: usize, claim: oncelog_client::Claim) {
    let generation = claim.generation;
    let mut commit = claim.commit();
    let mut inputs = Vec::new();
    let mut output = String::new();
    for link in &claim.streams {
        let from = offset_of(&link.acked_offset);
        if from >= offset_of(&link.tail_offset) {
            continue;
        }
        let url = format!("{}?offset={}", ctx.url(node, &link.path), Offset(from));
        let Ok(r) = ctx.http.get(url).timeout(Duration::from_secs(5)).send().await else { return };
        if r.status() != StatusCode::OK {
            return;
        }
        let Ok(body) = r.text().await else { return };
        // Whole records only, at most BATCH of them: the ack ends after the last one taken.
        // Bounded batches make a zombie and its successor often take exactly the same range,
        // which only the generation fence keeps from being applied twice.
        let Some(end) = body.match_indices('\n').map(|(i, _)| i + 1).take(BATCH).last() else { continue };
        for line in body[..end].lines() {
            output.push_str(&format!("{generation}|{line}\n"));
        }
        let to = from + end as u64;
        commit = commit.ack(&link.path, &StreamOffset::from(Offset(to)));
        inputs.push(Input { stream: link.path.clone(), from, to });
    }
    if inputs.is_empty() {
        let _ = claim.ack(&[], true).await;
        return;
    }
    let commit = commit.append_text(OUT, &output);
    // Now and then the worker stalls between its read and its commit (a GC pause, a slow
    // dependency) past its lease: the other worker claims the next generation, and this one
    // commits as a zombie.
    if stalls(name, generation) {
        tokio::time::sleep(Duration::from_millis(3_500)).await;
    }
    let invoked = ctx.rec.now();
    let (mut outcome, mut unknown_before) = (Outcome::Unknown, false);
    // Past twice the lease the claim is surely someone else's: stop sending.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(6);
    while !ctx.give_up.load(Ordering::Relaxed) && tokio::time::Instant::now() < deadline {
        match commit.clone().send(true).await {
            Ok(_) => {
                outcome = Outcome::Ok;
                break;
            }
            // Refused (fenced, or any other 4xx): nothing of it was written by this attempt;
            // an earlier attempt with an unknown outcome may have been.
            Err(e) if e.status().is_some_and(|s| (400..500).contains(&s) && s != 429) => {
                outcome = if unknown_before { Outcome::Unknown } else { Outcome::Failed };
                break;
            }
            Err(e) => {
                if let Some(s) = e.status().and_then(|s| StatusCode::from_u16(s).ok()) {
                    ctx.note(s);
                }
                unknown_before = true;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    ctx.rec.record(name, invoked, outcome, OpKind::Commit { generation, inputs, output });
}
