//! Losing the disk with `--object-store` (`--ack-mode local`): the real binary under a producer
//! and a keyed writer, SIGKILL, its data directory deleted, a fresh node on an empty directory
//! and the same bucket. What comes back is a prefix of what was acknowledged (the shipping
//! window may be missing, nothing is doubled), and the writers' retries of everything they sent
//! end with every append exactly once: a restored append's retry is a duplicate (204), a lost
//! one's is new (200). Against a real S3 API server (moto, `ONCELOG_TEST_S3_ENDPOINT`) and a
//! local directory. And the node replaced while paused (SIGSTOP, a takeover, SIGCONT): nothing
//! it writes afterwards becomes visible, and it stops taking writes with its reason. Unix only
//! (signals).

#![cfg(unix)]

mod common;

use std::time::Duration;

use common::Server;
use reqwest::{Client, StatusCode};

const APPENDS: u64 = 150;

fn body(i: u64) -> String {
    format!("p{i:04}|")
}

fn key_body(i: u64) -> String {
    format!("k{i:04}|")
}

/// The `--object-store` URL and the environment the server needs for it.
fn store(kind: &str, dir: &std::path::Path) -> (String, Vec<(&'static str, String)>) {
    if kind == "dir" {
        return (format!("file://{}/bucket", dir.display()), Vec::new());
    }
    (oncelog_bucket::test_support::s3_location("cli").to_string(), oncelog_bucket::test_support::s3_env())
}

fn start(data: &std::path::Path, url: &str, env: &[(&'static str, String)]) -> Server {
    start_mode(data, url, env, "local")
}

/// `--ack-mode bucket` ships only when writes wait (no timed rounds: a minute apart).
fn start_mode(data: &std::path::Path, url: &str, env: &[(&'static str, String)], mode: &str) -> Server {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let interval = if mode == "bucket" { "1m" } else { "100ms" };
    Server::start_env(
        data,
        "127.0.0.1:0",
        &["--object-store", url, "--ship-interval", interval, "--ack-mode", mode],
        &env,
    )
}

async fn produce(http: &Client, url: &str, i: u64) -> StatusCode {
    let seq = i.to_string();
    let r = http
        .post(url)
        .header("content-type", "text/plain")
        .header("producer-id", "p")
        .header("producer-epoch", "0")
        .header("producer-seq", seq.as_str())
        .body(body(i))
        .send()
        .await
        .expect("post");
    r.status()
}

async fn keyed(http: &Client, url: &str, i: u64) -> StatusCode {
    let key = format!("key-{i}");
    let r = http
        .post(url)
        .header("content-type", "text/plain")
        .header("idempotency-key", key.as_str())
        .body(key_body(i))
        .send()
        .await
        .expect("post");
    r.status()
}

async fn text(http: &Client, url: &str) -> String {
    http.get(format!("{url}?offset=-1")).send().await.expect("get").text().await.expect("text")
}

async fn disk_loss(kind: &str, mode: &str) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (url, env) = store(kind, tmp.path());
    let data = tmp.path().join("data");
    let http = Client::new();
    let server = start_mode(&data, &url, &env, mode);
    let (p_url, k_url) = (format!("{}/v1/stream/p", server.url), format!("{}/v1/stream/k", server.url));
    for u in [&p_url, &k_url] {
        let r = http.put(u).header("content-type", "text/plain").send().await.expect("put");
        assert_eq!(r.status(), StatusCode::CREATED);
    }
    // Both writers at once, every append acknowledged.
    let (a, b) = tokio::join!(
        async {
            for i in 0..APPENDS {
                assert_eq!(produce(&http, &p_url, i).await, StatusCode::OK);
            }
        },
        async {
            for i in 0..APPENDS {
                assert_eq!(keyed(&http, &k_url, i).await, StatusCode::OK);
            }
        }
    );
    let ((), ()) = (a, b);
    // `local`: a few shipping rounds, then the machine is gone (SIGKILL and the disk with it);
    // `bucket`: gone the moment the last answer arrived.
    if mode == "local" {
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    server.kill9();
    std::fs::remove_dir_all(&data).expect("delete the data directory");

    let server = start(&data, &url, &env);
    let (p_url, k_url) = (format!("{}/v1/stream/p", server.url), format!("{}/v1/stream/k", server.url));
    let restored = text(&http, &p_url).await;
    let all: String = (0..APPENDS).map(body).collect();
    assert!(all.starts_with(&restored), "a prefix of what was acknowledged, in order: {restored:?}");
    let kept = restored.len() / body(0).len();
    let restored_keys = text(&http, &k_url).await;
    let all_keys: String = (0..APPENDS).map(key_body).collect();
    assert!(all_keys.starts_with(&restored_keys), "{restored_keys:?}");
    if mode == "bucket" {
        assert_eq!(restored, all, "--ack-mode bucket: every acknowledged append, once");
        assert_eq!(restored_keys, all_keys);
    }
    println!(
        "{kind} {mode}: restored {kept} of {APPENDS} producer appends and {} of {APPENDS} keyed ones; the rest was in the shipping window",
        restored_keys.len() / key_body(0).len()
    );
    assert!(kept > 0, "shipping rounds ran before the kill: something must have been shipped");
    // The writers retry everything: restored appends are duplicates, lost ones new.
    for i in 0..APPENDS {
        let want = if i < kept as u64 { StatusCode::NO_CONTENT } else { StatusCode::OK };
        assert_eq!(produce(&http, &p_url, i).await, want, "producer retry of {i}");
        let kept_keys = (restored_keys.len() / key_body(0).len()) as u64;
        let want = if i < kept_keys { StatusCode::NO_CONTENT } else { StatusCode::OK };
        assert_eq!(keyed(&http, &k_url, i).await, want, "keyed retry of {i}");
    }
    assert_eq!(text(&http, &p_url).await, all, "every producer append exactly once");
    assert_eq!(text(&http, &k_url).await, all_keys, "every keyed append exactly once");
}

/// Sends `signal` (`-STOP`, `-CONT`) to a child this test started.
fn signal(server: &Server, signal: &str) {
    let ok = std::process::Command::new("kill").args([signal, &server.pid().to_string()]).status().expect("kill");
    assert!(ok.success(), "kill {signal}");
}

async fn a_paused_node_is_fenced_by_its_successor(kind: &str, mode: &str) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (url, env) = store(kind, tmp.path());
    let http = Client::new();
    let old = start_mode(&tmp.path().join("old"), &url, &env, mode);
    let old_url = format!("{}/v1/stream/p", old.url);
    let r = http.put(&old_url).header("content-type", "text/plain").send().await.expect("put");
    assert_eq!(r.status(), StatusCode::CREATED);
    for i in 0..20 {
        assert_eq!(produce(&http, &old_url, i).await, StatusCode::OK);
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    // Paused (a long GC, a frozen VM); meanwhile a new node takes the bucket over.
    signal(&old, "-STOP");
    let new = start(&tmp.path().join("new"), &url, &env);
    let new_url = format!("{}/v1/stream/p", new.url);
    assert_eq!(text(&http, &new_url).await, (0..20).map(body).collect::<String>());
    for i in 20..25 {
        assert_eq!(produce(&http, &new_url, i).await, StatusCode::OK);
    }
    // The old node wakes up and takes a write locally before it finds out.
    signal(&old, "-CONT");
    let zombie = http
        .post(&old_url)
        .header("content-type", "text/plain")
        .header("producer-id", "z")
        .header("producer-epoch", "0")
        .header("producer-seq", "0")
        .body("zombie|")
        .send()
        .await
        .expect("post");
    println!("{kind} {mode}: the paused node answered {} to a write after it resumed", zombie.status());
    if mode == "bucket" {
        assert_eq!(
            zombie.status(),
            StatusCode::SERVICE_UNAVAILABLE,
            "--ack-mode bucket acknowledges nothing after a takeover"
        );
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        match common::load::readyz(&old.url).await {
            Some((StatusCode::SERVICE_UNAVAILABLE, reason)) => {
                assert!(reason.contains("fenced"), "{reason}");
                break;
            }
            other => assert!(std::time::Instant::now() < deadline, "the old node was not fenced: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(produce(&http, &old_url, 25).await, StatusCode::SERVICE_UNAVAILABLE, "a fenced node takes no write");
    // Nothing of the old node's after the takeover is visible: not on the new node, and not on
    // a node restored from the bucket after it.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let want: String = (0..25).map(body).collect();
    assert_eq!(text(&http, &new_url).await, want);
    new.kill9();
    let third = start(&tmp.path().join("third"), &url, &env);
    assert_eq!(text(&http, &format!("{}/v1/stream/p", third.url)).await, want);
    old.kill9();
}

#[tokio::test]
async fn a_paused_node_is_fenced_with_a_directory_bucket() {
    a_paused_node_is_fenced_by_its_successor("dir", "local").await;
}

#[tokio::test]
async fn a_paused_node_in_bucket_mode_acknowledges_nothing_after_the_takeover() {
    a_paused_node_is_fenced_by_its_successor("s3", "bucket").await;
}

#[tokio::test]
async fn a_paused_node_is_fenced_with_an_s3_bucket() {
    a_paused_node_is_fenced_by_its_successor("s3", "local").await;
}

#[tokio::test]
async fn disk_loss_with_a_directory_bucket() {
    disk_loss("dir", "local").await;
}

#[tokio::test]
async fn disk_loss_in_bucket_mode_with_a_directory_bucket() {
    disk_loss("dir", "bucket").await;
}

#[tokio::test]
async fn disk_loss_in_bucket_mode_with_an_s3_bucket() {
    disk_loss("s3", "bucket").await;
}

#[tokio::test]
async fn disk_loss_with_an_s3_bucket() {
    disk_loss("s3", "local").await;
}

/// What the tier records while the node starts (its writer epoch, set once) is
/// exported: the metrics recorder is installed before the engine opens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gauges_set_at_start_are_exported() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (url, env) = store("dir", tmp.path());
    let server = start(&tmp.path().join("data"), &url, &env);
    let metrics =
        Client::new().get(format!("{}/metrics", server.url)).send().await.expect("metrics").text().await.expect("text");
    assert!(metrics.lines().any(|l| l == "oncelog_bucket_epoch 1"), "the epoch is missing from:\n{metrics}");
}
