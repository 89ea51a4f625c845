//! `oncelog ship` and the files around it (issue 45): the state file, its temporary file and the
//! lock file are never opened through a symbolic link, nor read when they are not regular files
//! of a size a state can have; FILE must be a regular file (a link to one is fine), and a FIFO
//! there is refused rather than waited on; a line longer than `--max-line-bytes` (or than what the
//! server accepts: `413`) stops the shipper with its offset and length, is split or is skipped, as
//! `--on-long-line` says, and never stops it for good.
//!
//! Unix only: symbolic links, FIFOs, signals.

#![cfg(unix)]

mod common;
mod ship_support;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::{bin, Harness};
use oncelog_client::CreateOptions;
use oncelog_log::{Durability, LogEngine, LogOptions};
use oncelog_server::{serve, AllowAll, AppState, ServerConfig};
use ship_support::{stream_bytes, wait_for, Running, STREAM};

/// How long a shipper that must refuse to start may take (it must not block or read forever).
const REFUSED_WITHIN: Duration = Duration::from_secs(10);
/// The server's largest append in the long-line tests.
const SERVER_MAX: usize = 4096;

/// A server whose largest append is `max_append_bytes`, with the byte stream `STREAM`.
fn server(max_append_bytes: usize) -> Harness {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut opts = LogOptions::new(dir.path().join("data"));
    opts.durability = Durability::Buffered;
    let engine = LogEngine::open(opts).expect("engine");
    let config = ServerConfig { max_append_bytes, ..ServerConfig::default() };
    let state = AppState::new(Arc::new(engine), config).with_auth(Arc::new(AllowAll));
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).expect("bind");
    let addr = listener.local_addr().expect("addr");
    rt.spawn(serve(listener, state, std::future::pending()));
    let h = Harness { rt, addr, base: format!("http://{addr}/v1/stream"), dir };
    h.rt.block_on(h.client().stream(STREAM).create(CreateOptions::content_type("text/plain"))).expect("create");
    h
}

/// `oncelog ship FILE STREAM --state-file STATE` on `h` with `args`.
fn ship(h: &Harness, file: &Path, state: &Path, args: &[&str]) -> std::process::Command {
    let mut c = bin();
    c.arg("ship").arg(file).arg(STREAM).args(["--url", &h.base, "--poll-ms", "20"]).arg("--state-file").arg(state);
    c.args(args).env("NO_COLOR", "1");
    c
}

fn append(path: &Path, bytes: &[u8]) {
    use std::io::Write;
    std::fs::OpenOptions::new().append(true).open(path).and_then(|mut f| f.write_all(bytes)).expect("append");
}

fn symlink(target: &Path, link: &Path) {
    std::os::unix::fs::symlink(target, link).expect("symlink");
}

fn mkfifo(path: &Path) {
    let made = std::process::Command::new("mkfifo").arg(path).status().expect("mkfifo");
    assert!(made.success(), "mkfifo {}", path.display());
}

#[test]
fn a_link_planted_as_the_temporary_state_file_leaves_its_target_alone() {
    let h = server(SERVER_MAX);
    let dir = h.dir.path();
    let (log, state, victim) = (dir.join("app.log"), dir.join("app.state"), dir.join("precious"));
    std::fs::write(&log, "one\ntwo\n").expect("log");
    std::fs::write(&victim, "precious\n").expect("victim");
    // Where the shipper writes its next state before renaming it into place.
    symlink(&victim, &dir.join("app.state.tmp"));
    let mut shipper = Running::start(ship(&h, &log, &state, &[]), dir.join("ship.stderr"));
    wait_for(&h, b"one\ntwo\n", &shipper);
    assert_eq!(std::fs::read(&victim).expect("victim"), b"precious\n", "the link's target was written");
    assert!(shipper.terminate().success(), "{}", shipper.stderr());
    let meta = std::fs::symlink_metadata(&state).expect("state");
    assert!(meta.file_type().is_file(), "the state file is a regular file");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(meta.permissions().mode() & 0o777, 0o600, "the state holds log lines: only its owner reads it");
}

/// Starts a shipper on `state` that must be refused at once (`REFUSED_WITHIN`) with `why`,
/// leaving no lock file.
fn refused(h: &Harness, state: &Path, args: &[&str], why: &str) {
    let log = h.dir.path().join("app.log");
    std::fs::write(&log, "one\n").expect("log");
    let out = common::run(ship(h, &log, state, args), b"", REFUSED_WITHIN);
    assert!(!out.ok && out.stderr.contains(why), "expected {why:?}:\n{}", out.stderr);
    let lock = PathBuf::from(format!("{}.lock", state.display()));
    assert!(std::fs::symlink_metadata(&lock).is_err(), "{} left behind", lock.display());
    assert!(stream_bytes(h).is_empty());
}

#[test]
fn a_state_file_that_is_a_link_is_refused_and_its_target_left_alone() {
    let h = server(SERVER_MAX);
    let dir = h.dir.path();
    let victim = dir.join("precious");
    std::fs::write(&victim, "precious\n").expect("victim");
    let linked = dir.join("linked.state");
    symlink(&victim, &linked);
    refused(&h, &linked, &[], "linked.state is a symbolic link, not a regular file");
    assert_eq!(std::fs::read(&victim).expect("victim"), b"precious\n");
}

#[test]
fn a_state_file_linked_to_dev_zero_is_refused_at_once() {
    let h = server(SERVER_MAX);
    // Read to its end, it would never end: refused as a link, before anything is read.
    let zero = h.dir.path().join("zero.state");
    symlink(Path::new("/dev/zero"), &zero);
    refused(&h, &zero, &[], "zero.state is a symbolic link, not a regular file");
}

#[test]
fn a_state_file_that_is_a_fifo_or_larger_than_a_state_can_be_is_refused_with_the_reason() {
    let h = server(SERVER_MAX);
    let dir = h.dir.path();
    // Opened for reading, a FIFO waits for a writer.
    let fifo = dir.join("fifo.state");
    mkfifo(&fifo);
    refused(&h, &fifo, &[], "fifo.state is a FIFO, not a regular file");
    // Larger than a header (64 KiB) and one batch of --max-line-bytes (plus a newline) can be.
    let large = dir.join("large.state");
    std::fs::write(&large, vec![b'x'; (64 << 10) + 2000 + 2]).expect("large state");
    let args = ["--max-line-bytes", "2000", "--batch-bytes", "1000"];
    refused(&h, &large, &args, "is 67538 bytes, more than a state file of this shipper holds (67537");
}

#[test]
fn a_lock_file_that_is_a_link_is_refused_and_creates_nothing() {
    let h = server(SERVER_MAX);
    let dir = h.dir.path();
    let (log, state) = (dir.join("app.log"), dir.join("app.state"));
    std::fs::write(&log, "one\n").expect("log");
    let target = dir.join("created-through-the-link");
    symlink(&target, &dir.join("app.state.lock"));
    let out = common::run(ship(&h, &log, &state, &[]), b"", REFUSED_WITHIN);
    assert!(!out.ok && out.stderr.contains("app.state.lock is a symbolic link, not a regular file"), "{}", out.stderr);
    assert!(!target.exists(), "a file was created through the lock file's link");
    assert!(stream_bytes(&h).is_empty());
}

#[test]
fn a_fifo_at_file_is_refused_without_waiting_for_a_writer() {
    let h = server(SERVER_MAX);
    let dir = h.dir.path();
    let log = dir.join("app.log");
    mkfifo(&log);
    let out = common::run(ship(&h, &log, &dir.join("app.state"), &[]), b"", REFUSED_WITHIN);
    assert!(!out.ok && out.stderr.contains("app.log is a FIFO, not a regular file"), "{}", out.stderr);
    assert!(!dir.join("app.state.lock").exists(), "lock file left behind");
}

#[test]
fn a_symbolic_link_to_a_regular_log_file_is_followed() {
    let h = server(SERVER_MAX);
    let dir = h.dir.path();
    let (real, log) = (dir.join("real.log"), dir.join("app.log"));
    std::fs::write(&real, "one\n").expect("log");
    symlink(&real, &log);
    let mut shipper = Running::start(ship(&h, &log, &dir.join("app.state"), &[]), dir.join("ship.stderr"));
    wait_for(&h, b"one\n", &shipper);
    append(&real, b"two\n");
    wait_for(&h, b"one\ntwo\n", &shipper);
    assert!(shipper.terminate().success(), "{}", shipper.stderr());
}

/// `a`, a line of 10,001 bytes (newline included) at byte 2, `b`.
fn file_with_a_long_line(dir: &Path) -> (PathBuf, Vec<u8>) {
    let log = dir.join("app.log");
    let content = [b"a\n".as_slice(), &[b'x'; 10_000], b"\nb\n"].concat();
    std::fs::write(&log, &content).expect("log");
    (log, content)
}

const LIMITS: [&str; 4] = ["--max-line-bytes", "4096", "--batch-bytes", "1024"];

#[test]
fn a_long_line_stops_the_shipper_naming_its_offset_length_and_the_limit_at_every_start() {
    let h = server(SERVER_MAX);
    let dir = h.dir.path();
    let (log, _) = file_with_a_long_line(dir);
    let state = dir.join("app.state");
    for _ in 0..2 {
        let out = common::run(ship(&h, &log, &state, &LIMITS), b"", REFUSED_WITHIN);
        assert!(
            !out.ok
                && out.stderr.contains(
                    "the line at byte 2 is 10001 bytes long (newline included), more than --max-line-bytes (4096)"
                )
                && out.stderr.contains("--on-long-line split or skip"),
            "{}",
            out.stderr
        );
        assert_eq!(stream_bytes(&h), b"a\n");
        assert!(!dir.join("app.state.lock").exists(), "lock file left behind");
    }
}

#[test]
fn a_long_line_is_shipped_in_pieces_of_the_largest_append_with_split() {
    let h = server(SERVER_MAX);
    let dir = h.dir.path();
    let (log, content) = file_with_a_long_line(dir);
    let mut args = LIMITS.to_vec();
    args.extend(["--on-long-line", "split"]);
    let mut shipper = Running::start(ship(&h, &log, &dir.join("app.state"), &args), dir.join("ship.stderr"));
    // Every piece fit the server's limit, and the bytes arrived whole and in order.
    wait_for(&h, &content, &shipper);
    assert!(shipper.terminate().success(), "{}", shipper.stderr());
}

#[test]
fn a_long_line_is_left_out_with_a_warning_with_skip_also_across_a_restart() {
    let h = server(SERVER_MAX);
    let dir = h.dir.path();
    let (log, _) = file_with_a_long_line(dir);
    let state = dir.join("app.state");
    let mut args = LIMITS.to_vec();
    args.extend(["--on-long-line", "skip"]);
    let mut shipper = Running::start(ship(&h, &log, &state, &args), dir.join("ship.stderr"));
    wait_for(&h, b"a\nb\n", &shipper);
    shipper.wait_line(&["WARN", "skipped a line longer than --max-line-bytes", "offset=2", "length=10001"]);
    assert!(shipper.terminate().success(), "{}", shipper.stderr());
    // A long line last in the file: the skip itself is in the state, and a restart reads on after
    // it without sending or skipping anything again.
    let long_last = [vec![b'y'; 5000], b"\n".to_vec()].concat();
    append(&log, &long_last);
    let mut shipper = Running::start(ship(&h, &log, &state, &args), dir.join("ship2.stderr"));
    shipper.wait_line(&["WARN", "skipped a line", "offset=10005", "length=5001"]);
    assert!(shipper.terminate().success(), "{}", shipper.stderr());
    append(&log, b"c\n");
    let mut shipper = Running::start(ship(&h, &log, &state, &args), dir.join("ship3.stderr"));
    wait_for(&h, b"a\nb\nc\n", &shipper);
    assert!(shipper.terminate().success(), "{}", shipper.stderr());
    assert!(!shipper.stderr().contains("skipped"), "skipped again:\n{}", shipper.stderr());
    assert_eq!(stream_bytes(&h), b"a\nb\nc\n");
}

#[test]
fn a_line_the_server_refuses_as_too_large_is_not_sent_again_at_the_next_start() {
    let h = server(SERVER_MAX);
    let dir = h.dir.path();
    let (log, content) = file_with_a_long_line(dir);
    let state = dir.join("app.state");
    // --max-line-bytes (16 MiB by default) above the server's limit: the line is sent, refused.
    let out = common::run(ship(&h, &log, &state, &["--batch-bytes", "1024"]), b"", REFUSED_WITHIN);
    assert!(
        !out.ok
            && out.stderr.contains("the server refused a batch of 10001 bytes as too large (413")
            && out.stderr.contains("its lines are read again then"),
        "{}",
        out.stderr
    );
    assert_eq!(stream_bytes(&h), b"a\n");
    // Started again within the server's limit: the line is read again and split.
    let mut args = LIMITS.to_vec();
    args.extend(["--on-long-line", "split"]);
    let mut shipper = Running::start(ship(&h, &log, &state, &args), dir.join("ship.stderr"));
    wait_for(&h, &content, &shipper);
    assert!(shipper.terminate().success(), "{}", shipper.stderr());
}
