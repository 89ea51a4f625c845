//! An exactly-once pipeline worker: turns every message of the streams a pull-wake
//! subscription follows into one message of an output stream, with one transactional commit
//! per wake (outputs and input acks together). Kill it at any moment, run as many as you like:
//! every input message reaches the output exactly once, in order per input stream.
//!
//! ```text
//! oncelog-pipeline-example BASE_URL SUBSCRIPTION WAKE_STREAM OUTPUT WORKER
//! # e.g. oncelog-pipeline-example http://127.0.0.1:4437/v1/stream totals wake totals worker-1
//! ```
//! The subscription must exist (pull-wake, its wake stream, the inputs by pattern or name); the
//! output is a JSON stream. Each output message is `{"input": <path>, "message": <input message>}`.

use std::time::Duration;

use futures_util::StreamExt;
use oncelog_client::{Claim, Client, Error, LiveMode, ReadFrom, ReadOptions, StreamOffset};
use serde_json::{json, Value};

/// Reads `path` from the claim's acked offset to at least its tail at the wake; returns the
/// messages and where they end.
async fn read_pending(
    client: &Client,
    path: &str,
    from: &StreamOffset,
    to: &StreamOffset,
) -> Result<(Vec<Value>, StreamOffset), Error> {
    let mut reader = client.stream(path).read(ReadOptions::new(ReadFrom::Offset(from.clone()), LiveMode::CatchUp));
    let (mut messages, mut end) = (Vec::new(), from.clone());
    while let Some(chunk) = reader.next().await {
        let chunk = chunk?;
        messages.extend(chunk.json_items::<Value>()?);
        end = chunk.next_offset.clone();
        if end >= *to || chunk.up_to_date {
            break;
        }
    }
    Ok((messages, end))
}

/// Processes one wake: everything pending, in one commit (one output append: a commit takes
/// one append per stream).
async fn process(client: &Client, claim: &Claim, output: &str) -> Result<(), Error> {
    let mut commit = claim.commit();
    let mut out = Vec::new();
    for link in claim.streams.iter().filter(|l| l.has_pending) {
        let (messages, end) = read_pending(client, &link.path, &link.acked_offset, &link.tail_offset).await?;
        out.extend(messages.into_iter().map(|m| json!({ "input": link.path, "message": m })));
        commit = commit.ack(&link.path, &end);
    }
    if !out.is_empty() {
        commit = commit.append_json(output, Value::Array(out));
    }
    // The same commit may be sent again when its outcome is unknown: it is a duplicate then.
    let mut attempts = 0;
    loop {
        match commit.clone().send(true).await {
            Ok(_) => return Ok(()),
            Err(e) if e.is_transient() && attempts < 5 => {
                attempts += 1;
                tokio::time::sleep(Duration::from_millis(100 << attempts)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, base, sub, wake, output, worker] = args.as_slice() else {
        eprintln!("usage: oncelog-pipeline-example BASE_URL SUBSCRIPTION WAKE_STREAM OUTPUT WORKER");
        std::process::exit(2);
    };
    let client = match Client::new(base.as_str()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("oncelog-pipeline-example: {e}");
            std::process::exit(2);
        }
    };
    let subs = client.subscriptions();
    loop {
        let claim =
            match subs.wait_for_claim(sub, worker, wake, Duration::from_millis(300), Duration::from_secs(5)).await {
                Ok(Some(c)) => c,
                Ok(None) => continue,
                Err(e) => {
                    eprintln!("{worker}: claim failed: {e}");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
        match process(&client, &claim, output).await {
            Ok(()) => {}
            // Another worker took over (our lease ran out): its work now, not ours.
            Err(e) if e.is_fenced() => eprintln!("{worker}: fenced at generation {}", claim.generation),
            Err(e) => {
                eprintln!("{worker}: {e}; releasing");
                let _ = claim.release().await;
            }
        }
    }
}
