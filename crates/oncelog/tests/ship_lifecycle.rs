//! `oncelog ship` talks and ends cleanly (issue 46): a start line (file, stream, the position it
//! resumes from) and progress lines (lines and bytes shipped, lag) at info on stderr; on SIGTERM
//! it finishes the append in flight, saves its state, removes its lock file and exits 0, and a
//! restart ships nothing twice; a start that fails leaves no lock file.
//!
//! Unix only: signals.

#![cfg(unix)]

mod common;
mod ship_support;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{bin, Harness};
use oncelog_client::CreateOptions;
use ship_support::{stream_bytes, wait_for, wait_until_holds, Running, STREAM};

fn harness() -> Harness {
    let h = Harness::start();
    h.rt.block_on(h.client().stream(STREAM).create(CreateOptions::content_type("text/plain"))).expect("create");
    h
}

fn ship(h: &Harness, file: &Path, stream: &str, args: &[&str]) -> std::process::Command {
    let mut c = bin();
    c.arg("ship").arg(file).arg(stream).args(["--url", &h.base, "--poll-ms", "20"]).args(args).env("NO_COLOR", "1");
    c
}

fn lines(from: usize, to: usize) -> Vec<u8> {
    (from..to).flat_map(|i| format!("line {i:06}\n").into_bytes()).collect()
}

#[test]
fn the_shipper_logs_where_it_starts_and_its_progress() {
    let h = harness();
    let dir = h.dir.path();
    let log = dir.join("app.log");
    let first = lines(0, 100);
    std::fs::write(&log, &first).expect("log");
    let args = ["--progress-interval-ms", "50"];
    let mut shipper = Running::start(ship(&h, &log, STREAM, &args), dir.join("ship.stderr"));
    let start = shipper.wait_line(&["INFO", "ship started"]);
    assert!(
        start.contains(&format!("file={}", log.display()))
            && start.contains("stream=logs/app")
            && start.contains("position=0"),
        "{start}"
    );
    wait_for(&h, &first, &shipper);
    // A progress line comes after a batch once the interval has passed since the start (or the
    // last one): lines are added, one at a time, until it does.
    let mut total = 100;
    let progress = loop {
        let line = lines(total, total + 1);
        std::fs::OpenOptions::new()
            .append(true)
            .open(&log)
            .and_then(|mut f| std::io::Write::write_all(&mut f, &line))
            .expect("append");
        total += 1;
        let shipped: Vec<String> =
            shipper.stderr().lines().filter(|l| l.contains(" shipped ")).map(ToOwned::to_owned).collect();
        if let Some(first) = shipped.first() {
            break first.clone();
        }
        assert!(total < 2000, "no progress line:\n{}", shipper.stderr());
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(
        progress.contains("INFO") && progress.contains("lag_bytes=") && !progress.contains("lines=100 "),
        "{progress}"
    );
    wait_for(&h, &lines(0, total), &shipper);
    assert!(shipper.terminate().success(), "{}", shipper.stderr());
    // Resumed where it stopped.
    let mut shipper = Running::start(ship(&h, &log, STREAM, &args), dir.join("ship2.stderr"));
    let start = shipper.wait_line(&["INFO", "ship started"]);
    assert!(start.contains(&format!("position={}", total * 12)), "{start}\n(progress was: {progress})");
    assert!(shipper.terminate().success(), "{}", shipper.stderr());
}

#[test]
fn sigterm_finishes_the_append_and_exits_0_and_a_restart_ships_nothing_twice() {
    let h = harness();
    let dir = h.dir.path();
    let log = dir.join("app.log");
    let content = lines(0, 10_000);
    std::fs::write(&log, &content).expect("log");
    let state = dir.join("app.log.oncelog-ship");
    let lock = dir.join("app.log.oncelog-ship.lock");
    // Small batches (each saved twice with fsync): shipping takes long enough to be stopped
    // midway.
    let args = ["--batch-bytes", "1024"];
    let mut shipper = Running::start(ship(&h, &log, STREAM, &args), dir.join("ship.stderr"));
    wait_until_holds(&h, 10_000, &shipper);
    let status = shipper.terminate();
    assert_eq!(status.code(), Some(0), "{}", shipper.stderr());
    assert!(shipper.stderr().contains("ship stopped (SIGTERM)"), "{}", shipper.stderr());
    // The append in flight was finished and recorded: no batch is pending.
    let saved = std::fs::read(&state).expect("state");
    assert!(!saved.windows(8).any(|w| w == b"pending "), "{}", String::from_utf8_lossy(&saved));
    assert!(!lock.exists(), "lock file left behind");
    let shipped = stream_bytes(&h);
    assert!(content.starts_with(&shipped));
    // Restarted: the rest, once.
    let mut shipper = Running::start(ship(&h, &log, STREAM, &args), dir.join("ship2.stderr"));
    let start = shipper.wait_line(&["ship started"]);
    assert!(start.contains(&format!("position={}", shipped.len())), "{start}");
    wait_for(&h, &content, &shipper);
    assert_eq!(shipper.terminate().code(), Some(0), "{}", shipper.stderr());
    assert!(stream_bytes(&h) == content, "the stream differs from the file");
}

#[test]
fn sigterm_while_an_append_waits_for_its_answer_lets_it_finish() {
    let h = harness();
    let dir = h.dir.path();
    let log = dir.join("app.log");
    let content = lines(0, 10_000);
    std::fs::write(&log, &content).expect("log");
    let state = dir.join("app.log.oncelog-ship");
    // The shipper talks to the server through a path that can go silent.
    let proxy = h.rt.block_on(common::freeze::FreezeProxy::start(h.addr));
    let mut cmd = bin();
    cmd.arg("ship").arg(&log).arg(STREAM).args(["--poll-ms", "20", "--batch-bytes", "1024", "--url"]);
    cmd.arg(format!("http://{}/v1/stream", proxy.addr)).env("NO_COLOR", "1");
    let mut shipper = Running::start(cmd, dir.join("ship.stderr"));
    wait_until_holds(&h, 5_000, &shipper);
    let deadline = Instant::now() + Duration::from_secs(20);
    // Frozen: the next batch is recorded as pending and waits for its answer.
    proxy.freeze();
    let pending = || std::fs::read(&state).is_ok_and(|s| s.windows(8).any(|w| w == b"pending "));
    loop {
        if pending() {
            std::thread::sleep(Duration::from_millis(100));
            if pending() {
                break;
            }
        }
        assert!(Instant::now() < deadline, "no batch waits:\n{}", shipper.stderr());
        std::thread::sleep(Duration::from_millis(5));
    }
    // Stopped while it waits; the path heals within the shipper's grace: the answer is recorded.
    shipper.sigterm();
    shipper.wait_line(&["stopping: the append in flight, if any, is finished first"]);
    proxy.heal();
    let status = shipper.wait();
    assert_eq!(status.code(), Some(0), "{}", shipper.stderr());
    assert!(!pending(), "the batch in flight was not finished:\n{}", shipper.stderr());
    // And the rest, once.
    let mut shipper = Running::start(ship(&h, &log, STREAM, &[]), dir.join("ship2.stderr"));
    wait_for(&h, &content, &shipper);
    assert_eq!(shipper.terminate().code(), Some(0), "{}", shipper.stderr());
}

#[test]
fn a_failed_start_leaves_no_lock_file() {
    let h = harness();
    h.rt.block_on(h.client().stream("events").create(CreateOptions::content_type("application/json"))).expect("create");
    let dir = h.dir.path();
    let log = dir.join("app.log");
    std::fs::write(&log, "one\n").expect("log");
    let lock = dir.join("app.log.oncelog-ship.lock");
    for (stream, why) in [("no/such/stream", "stream not found"), ("events", "is a JSON stream")] {
        let out = common::run(ship(&h, &log, stream, &[]), b"", Duration::from_secs(10));
        assert!(!out.ok && out.stderr.contains(why), "{stream}: {}", out.stderr);
        assert!(!lock.exists(), "{stream}: lock file left behind");
    }
}
