//! Subscription workers: a pull-wake subscription over the producers' streams; each worker
//! claims a wake, reads every linked stream from its acknowledged offset, and writes one output
//! line per input record (`<generation>|<record>`) to `out` together with the acks, in one
//! transactional commit. A commit whose outcome is unknown is sent again (the same commit: its
//! producer stamps make a repeat a duplicate) until it is known or the lease is surely gone.
//!
//! Leases are short (3 s), so pauses, partitions and skewed clocks hand work to the other
//! worker while a zombie still holds a claim: what it commits then must be fenced.

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

/// The subscription over `inputs`, its wake stream and its output stream, made once.
pub async fn setup(ctx: &Ctx, inputs: &[String]) -> Result<(), String> {
    for (s, ct) in [(WAKE, "application/json"), (OUT, "text/plain")] {
        let r = ctx.http.put(ctx.url(0, s)).header("content-type", ct).send().await.map_err(|e| format!("create {s}: {e}"))?;
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
    let Ok(client) = Client::builder(ctx.client_base(node)).retry_policy(RetryPolicy::none()).request_timeout(Duration::from_secs(5)).build() else { return };
    let subs = client.subscriptions();
    while !ctx.stop.load(Ordering::Relaxed) {
        match subs.claim(SUBSCRIPTION, &name).await {
            Ok(Ok(claim)) => work(&ctx, &name, node, claim).await,
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
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
        // Whole records only: the ack ends after the last complete line.
        let Some(end) = body.rfind('\n').map(|i| i + 1) else { continue };
        for line in body[..end].lines() {
            output.push_str(&format!("{generation}|{line}\n"));
        }
        let to = from + end as u64;
        commit = commit.ack(&link.path, &StreamOffset::new(Offset(to).to_string()));
        inputs.push(Input { stream: link.path.clone(), from, to });
    }
    if inputs.is_empty() {
        let _ = claim.ack(&[], true).await;
        return;
    }
    let commit = commit.append_text(OUT, &output);
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
