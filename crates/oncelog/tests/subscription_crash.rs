//! Crash safety of subscriptions, end to end with `kill -9`: the real `oncelog` binary is killed
//! while inputs are appended (waking the subscription), while a worker claims, and while it
//! sends transactional commits; after every restart on the same data directory:
//! - no acknowledged commit is lost (the cursor is at least where the commit acked),
//! - the cursor and the generation never move back,
//! - outputs and acks agree: the output holds exactly the input messages below the cursor,
//!   and at the end every input is in the output exactly once, in order.
//!
//! The worker resends an unanswered commit unchanged (a duplicate if it was applied).

#![cfg(unix)]

mod common;

use std::time::Duration;

use reqwest::{Client, StatusCode};
use serde_json::{json, Value};

const ROUNDS: usize = 80;

/// A small deterministic sequence (spread, not secrecy).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

struct Node {
    dir: std::path::PathBuf,
    port: u16,
    server: Option<common::Server>,
}

impl Node {
    fn up(&mut self) {
        if self.server.is_none() {
            let addr = format!("127.0.0.1:{}", self.port);
            self.server = Some(common::Server::start_at(&self.dir, &addr, &[]));
        }
    }

    fn kill9(&mut self) {
        if let Some(s) = self.server.take() {
            s.kill9();
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}/v1/stream/{path}", self.port)
    }
}

async fn send(
    http: &Client,
    method: reqwest::Method,
    url: &str,
    token: Option<&str>,
    body: Option<String>,
    ct: &str,
) -> Result<(StatusCode, reqwest::header::HeaderMap, String), reqwest::Error> {
    let mut r = http.request(method, url).timeout(Duration::from_secs(10));
    if let Some(t) = token {
        r = r.bearer_auth(t);
    }
    if let Some(b) = body {
        r = r.header("content-type", ct).body(b);
    }
    let resp = r.send().await?;
    let (status, headers) = (resp.status(), resp.headers().clone());
    Ok((status, headers, resp.text().await?))
}

/// An offset token for byte position `n`.
fn offset(n: u64) -> String {
    format!("0000000000000000_{n:016}")
}

/// The JSON messages of `path`, each with the offset after it. Every append here is one
/// message written compactly, so its stored form is its text plus one `,`.
async fn messages(http: &Client, node: &Node, path: &str) -> Vec<(Value, String)> {
    let (status, _, body) =
        send(http, reqwest::Method::GET, &format!("{}?offset=-1", node.url(path)), None, None, "").await.expect("read");
    assert_eq!(status, StatusCode::OK, "{body}");
    let items: Vec<Value> = serde_json::from_str(&body).expect("JSON array");
    let mut end = 0u64;
    items
        .into_iter()
        .map(|v| {
            end += v.to_string().len() as u64 + 1;
            (v, offset(end))
        })
        .collect()
}

/// Cursor and generation as the server reports them.
async fn state(http: &Client, node: &Node) -> (String, u64) {
    let (status, _, body) =
        send(http, reqwest::Method::GET, &node.url("__ds/subscriptions/pipe"), None, None, "").await.expect("get");
    assert_eq!(status, StatusCode::OK, "{body}");
    let v: Value = serde_json::from_str(&body).expect("json");
    let acked = v["streams"]
        .as_array()
        .and_then(|s| s.iter().find(|l| l["path"] == "in/a"))
        .map(|l| l["acked_offset"].as_str().unwrap_or("").to_owned())
        .unwrap_or_default();
    (acked, v["generation"].as_u64().unwrap_or(0))
}

/// How many inputs lie below `cursor` (which is always at a message boundary).
fn done_before(inputs: &[(Value, String)], cursor: &str) -> usize {
    if cursor == offset(0) {
        return 0;
    }
    inputs
        .iter()
        .position(|(_, end)| end == cursor)
        .map(|i| i + 1)
        .unwrap_or_else(|| panic!("cursor {cursor} is not a message boundary"))
}

/// Outputs and acks agree: the output is exactly the inputs below the cursor, in order.
async fn check_agreement(http: &Client, node: &Node, cursor: &str) {
    let inputs = messages(http, node, "in/a").await;
    let below: Vec<Value> = inputs[..done_before(&inputs, cursor)].iter().map(|(v, _)| v.clone()).collect();
    let outs: Vec<Value> = messages(http, node, "out").await.into_iter().map(|(v, _)| v["message"].clone()).collect();
    assert_eq!(outs, below, "the output holds exactly the inputs below the cursor {cursor}");
}

/// The commit of everything from the cursor on (one output per input), or `None` when done.
fn commit_body(inputs: &[(Value, String)], cursor: &str, wake_id: &str, generation: u64) -> Option<(String, String)> {
    let todo: Vec<Value> = inputs[done_before(inputs, cursor)..].iter().map(|(m, _)| json!({ "message": m })).collect();
    let (_, end) = inputs.last()?;
    if todo.is_empty() {
        return None;
    }
    let body = json!({
        "wake_id": wake_id, "generation": generation,
        "acks": [{ "stream": "in/a", "offset": end }],
        "appends": [{ "stream": "out", "producer": { "id": "sub:pipe", "epoch": generation, "seq": 0 }, "data": todo }],
        "done": true,
    });
    Some((body.to_string(), end.clone()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscription_state_survives_kill_9_during_wakes_claims_and_commits() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut node = Node { dir: dir.path().join("data"), port: free_port(), server: None };
    node.up();
    let http = Client::new();
    for p in ["wake", "in/a", "out"] {
        let (s, _, b) = send(&http, reqwest::Method::PUT, &node.url(p), None, Some(String::new()), "application/json")
            .await
            .expect("create");
        assert_eq!(s, StatusCode::CREATED, "{b}");
    }
    let cfg = json!({ "type": "pull-wake", "pattern": "in/*", "wake_stream": "wake", "lease_ttl_ms": 5000 });
    let (s, _, b) = send(
        &http,
        reqwest::Method::PUT,
        &node.url("__ds/subscriptions/pipe"),
        None,
        Some(cfg.to_string()),
        "application/json",
    )
    .await
    .expect("put");
    assert_eq!(s, StatusCode::CREATED, "{b}");

    let mut rng = Lcg(0xC0FFEE);
    let (mut next_input, mut commits_built) = (0u64, 0u64);
    let (mut commits_acked, mut duplicates, mut fenced) = (0usize, 0usize, 0usize);
    // The worker: its claim (token, wake id, generation) and an unanswered commit.
    let mut claim: Option<(String, String, u64)> = None;
    let mut pending: Option<(String, String)> = None; // (body, acked offset)
    let (mut last_cursor, mut last_generation) = (String::new(), 0u64);
    let mut committed_cursor = String::new();
    let mut kills = 0;
    for round in 0..ROUNDS + 30 {
        let killing = round < ROUNDS;
        node.up();
        // One action, maybe interrupted by kill -9 at a random moment.
        let action = rng.next(3);
        let fut = {
            let http = http.clone();
            let url = |p: &str| node.url(p);
            let (input_url, claim_url, commit_url, sub_url) = (
                url("in/a"),
                url("__ds/subscriptions/pipe/claim"),
                url("__ds/subscriptions/pipe/commit"),
                url("__ds/subscriptions/pipe"),
            );
            let claim = claim.clone();
            let pending = pending.clone();
            let n = next_input;
            tokio::spawn(async move {
                if let (Some((token, _, _)), Some((body, _))) = (&claim, &pending) {
                    return (
                        "commit",
                        send(
                            &http,
                            reqwest::Method::POST,
                            &commit_url,
                            Some(token),
                            Some(body.clone()),
                            "application/json",
                        )
                        .await,
                    );
                }
                if action == 0 || (claim.is_none() && action == 1) {
                    let body = json!({ "n": n }).to_string();
                    let r = http
                        .post(&input_url)
                        .header("content-type", "application/json")
                        .header("producer-id", "feeder")
                        .header("producer-epoch", "0")
                        .header("producer-seq", n.to_string())
                        .body(body)
                        .send()
                        .await;
                    return (
                        "append",
                        match r {
                            Ok(resp) => Ok((resp.status(), resp.headers().clone(), String::new())),
                            Err(e) => Err(e),
                        },
                    );
                }
                if claim.is_none() {
                    return (
                        "claim",
                        send(
                            &http,
                            reqwest::Method::POST,
                            &claim_url,
                            None,
                            Some(json!({ "worker": "w" }).to_string()),
                            "application/json",
                        )
                        .await,
                    );
                }
                ("read", send(&http, reqwest::Method::GET, &sub_url, None, None, "").await)
            })
        };
        if killing && rng.next(2) == 0 {
            tokio::time::sleep(Duration::from_micros(rng.next(6_000))).await;
            node.kill9();
            kills += 1;
        }
        let (what, result) = fut.await.expect("action task");
        match (what, result) {
            ("append", Ok((status, _, _))) if status.is_success() => next_input += 1,
            ("claim", Ok((StatusCode::OK, _, body))) => {
                let v: Value = serde_json::from_str(&body).expect("claim JSON");
                claim = Some((
                    v["token"].as_str().expect("token").to_owned(),
                    v["wake_id"].as_str().expect("wake id").to_owned(),
                    v["generation"].as_u64().expect("generation"),
                ));
            }
            ("commit", Ok((StatusCode::OK, _, body))) => {
                commits_acked += 1;
                duplicates += usize::from(body.contains("\"duplicate\":true"));
                committed_cursor = pending.take().map(|(_, a)| a).unwrap_or_default();
                claim = None;
            }
            ("commit", Ok((StatusCode::CONFLICT, _, body))) if body.contains("FENCED") => {
                // The lease ran out across a restart: this work passes to the next claim.
                fenced += 1;
                pending = None;
                claim = None;
            }
            ("read", Ok((StatusCode::OK, _, _))) => {
                node.up();
                let (cursor, _) = state(&http, &node).await;
                let inputs = messages(&http, &node, "in/a").await;
                if let Some((_, wake_id, generation)) = &claim {
                    pending = commit_body(&inputs, &cursor, wake_id, *generation);
                    commits_built += 1;
                }
            }
            _ => {}
        }
        // After every action (and restart): nothing acknowledged moved back or got lost.
        node.up();
        let (cursor, generation) = state(&http, &node).await;
        assert!(cursor >= last_cursor, "the cursor moved back: {last_cursor} -> {cursor}");
        assert!(generation >= last_generation, "the generation moved back: {last_generation} -> {generation}");
        assert!(cursor >= committed_cursor, "an acknowledged commit was lost: cursor {cursor} < {committed_cursor}");
        check_agreement(&http, &node, &cursor).await;
        (last_cursor, last_generation) = (cursor, generation);
    }
    assert!(
        kills >= 20 && commits_acked >= 5,
        "the run killed the server ({kills} times) between commits ({commits_acked})"
    );

    // Drain without kills: claim and commit until everything is out.
    for _ in 0..50 {
        let (cursor, _) = state(&http, &node).await;
        let inputs = messages(&http, &node, "in/a").await;
        if inputs.last().is_some_and(|(_, end)| *end == cursor) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (s, _, body) = send(
            &http,
            reqwest::Method::POST,
            &node.url("__ds/subscriptions/pipe/claim"),
            None,
            Some(json!({ "worker": "w" }).to_string()),
            "application/json",
        )
        .await
        .expect("claim");
        if s != StatusCode::OK {
            // The earlier claim's lease has to run out first.
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        }
        let v: Value = serde_json::from_str(&body).expect("claim");
        let Some((body, _)) =
            commit_body(&inputs, &cursor, v["wake_id"].as_str().unwrap_or(""), v["generation"].as_u64().unwrap_or(0))
        else {
            break;
        };
        let (s, _, b) = send(
            &http,
            reqwest::Method::POST,
            &node.url("__ds/subscriptions/pipe/commit"),
            v["token"].as_str(),
            Some(body),
            "application/json",
        )
        .await
        .expect("commit");
        assert_eq!(s, StatusCode::OK, "{b}");
    }
    let outputs: Vec<u64> =
        messages(&http, &node, "out").await.iter().map(|(v, _)| v["message"]["n"].as_u64().expect("n")).collect();
    let inputs: Vec<u64> =
        messages(&http, &node, "in/a").await.iter().map(|(v, _)| v["n"].as_u64().expect("n")).collect();
    assert_eq!(inputs, (0..next_input).collect::<Vec<_>>(), "every acknowledged input, once");
    assert_eq!(outputs, inputs, "every input in the output exactly once, in order");
    eprintln!("{} inputs, {kills} kills, {commits_built} commits built, {commits_acked} acknowledged ({duplicates} as duplicates of an applied one), {fenced} fenced", inputs.len());
}
