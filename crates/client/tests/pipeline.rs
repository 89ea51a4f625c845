//! End to end, exactly once: input streams → competing worker processes (the
//! `oncelog-pipeline-example` binary) that are SIGKILLed and restarted at random, and now and then
//! frozen (SIGSTOP) past their lease and thawed (SIGCONT), so they come back as zombies whose
//! work another worker took over → one output stream. Every input message must appear in the
//! output exactly once, in order per input.

mod common;

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use futures_util::StreamExt;
use oncelog_client::{AppendOptions, Client, CreateOptions, LiveMode, ReadFrom, ReadOptions, SubscriptionConfig};
use serde_json::{json, Value};

const INPUTS: [&str; 2] = ["orders/eu", "orders/us"];
const MESSAGES: u64 = 200;

/// Sends `signal` (`STOP`, `CONT`) to a worker process this test started.
fn signal(child: &Child, signal: &str) {
    let _ = Command::new("kill").args([&format!("-{signal}"), &child.id().to_string()]).status();
}

fn worker(base: &str, name: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_oncelog-pipeline-example"))
        .args([base, "totals", "wake", "totals", name])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start a worker")
}

/// A small deterministic sequence (the test needs spread, not secrecy).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

async fn output(client: &Client) -> Vec<Value> {
    let mut reader = client.stream("totals").read(ReadOptions::new(ReadFrom::Beginning, LiveMode::CatchUp));
    let mut all = Vec::new();
    while let Some(chunk) = reader.next().await {
        all.extend(chunk.expect("read totals").json_items::<Value>().expect("JSON"));
    }
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_input_reaches_the_output_exactly_once_while_workers_are_killed() {
    let server = common::TestServer::start().await;
    let client = Client::new(server.base.as_str()).expect("client");
    for path in ["wake", "totals"].iter().chain(&INPUTS) {
        client.stream(path).create(CreateOptions::content_type("application/json")).await.expect("create");
    }
    let config = SubscriptionConfig::pull_wake("wake").pattern("orders/*").lease_ttl(Duration::from_millis(1_000));
    client.subscriptions().put("totals", &config).await.expect("subscription");

    let mut workers: Vec<Child> = (0..2).map(|i| worker(&server.base, &format!("w{i}"))).collect();
    let mut rng = Lcg(0x5eed);
    let (mut sent, mut kills, mut freezes) = (0u64, 0, 0);
    // The frozen worker and when to thaw it.
    let mut frozen: Option<(usize, tokio::time::Instant)> = None;
    while sent < MESSAGES {
        for _ in 0..=rng.next(4) {
            if sent == MESSAGES {
                break;
            }
            let path = INPUTS[(sent % 2) as usize];
            let body = json!({ "n": sent }).to_string();
            client.stream(path).append(body, AppendOptions::default()).await.expect("append input");
            sent += 1;
        }
        tokio::time::sleep(Duration::from_millis(20 + rng.next(60))).await;
        match frozen {
            Some((i, until)) if tokio::time::Instant::now() >= until => {
                signal(&workers[i], "CONT");
                frozen = None;
            }
            None if rng.next(6) == 0 => {
                // Past its 1 s lease: another worker claims the next generation meanwhile.
                let i = rng.next(workers.len() as u64) as usize;
                signal(&workers[i], "STOP");
                freezes += 1;
                frozen = Some((i, tokio::time::Instant::now() + Duration::from_millis(1_500)));
            }
            _ => {}
        }
        if rng.next(5) == 0 {
            let i = rng.next(workers.len() as u64) as usize;
            if frozen.is_some_and(|(f, _)| f == i) {
                continue;
            }
            // SIGKILL: no chance to finish a commit, release, or say goodbye.
            workers[i].kill().expect("kill a worker we started");
            let _ = workers[i].wait();
            kills += 1;
            workers[i] = worker(&server.base, &format!("w{i}-{kills}"));
        }
    }
    if let Some((i, _)) = frozen.take() {
        signal(&workers[i], "CONT");
    }
    assert!(kills >= 3 && freezes >= 2, "the run killed ({kills}) and froze ({freezes}) workers");

    // Let the survivors finish: everything acked, every message out.
    let subs = client.subscriptions();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let info = subs.get("totals").await.expect("get");
        let done = INPUTS.iter().all(|p| info.link(p).is_some_and(|l| !l.has_pending));
        if done || tokio::time::Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for w in &mut workers {
        let _ = w.kill();
        let _ = w.wait();
    }
    let out = output(&client).await;
    let mut seen: HashMap<&str, Vec<u64>> = HashMap::new();
    for m in &out {
        let input = m["input"].as_str().expect("input");
        let n = m["message"]["n"].as_u64().expect("n");
        let path = INPUTS.iter().find(|p| **p == input).expect("a known input");
        seen.entry(path).or_default().push(n);
    }
    for (i, path) in INPUTS.iter().enumerate() {
        let want: Vec<u64> = (0..MESSAGES).filter(|n| n % 2 == i as u64).collect();
        let got = seen.get(path).cloned().unwrap_or_default();
        let first_difference = got.iter().zip(&want).position(|(a, b)| a != b);
        assert!(
            got == want,
            "{path}: {} messages out for {} in (every one once, in order); first difference at {first_difference:?}",
            got.len(),
            want.len()
        );
    }
    assert_eq!(out.len() as u64, MESSAGES);
    eprintln!(
        "{MESSAGES} messages, {kills} workers killed, {freezes} frozen past their lease, {} output messages",
        out.len()
    );
}
