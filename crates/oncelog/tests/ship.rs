//! `oncelog ship` under rotation and SIGKILL: every line of the file in the stream exactly once,
//! in order.
//!
//! The test writes numbered lines to a log file (opened with `O_APPEND`, as loggers do) while
//! `oncelog ship` follows it; the shipper starts before the file exists. Along the way the file is
//! rotated by rename twice (once while the shipper runs; once while it is stopped, with lines it
//! never read left in the old file and the old file renamed again, as logrotate shifts
//! `app.log.1` to `app.log.2`) and truncated twice, copytruncate style (once while the shipper
//! runs; once while it is stopped, the new content growing past the old position before it
//! comes back). Throughout, the shipper is SIGKILLed at random moments and restarted. At the end
//! the stream must hold the concatenation of all lines, and one more restart must add nothing.
//!
//! Copytruncate loses the lines written after the copy that the shipper has not read yet (the
//! race logrotate documents); the test truncates only once the stream holds everything written,
//! so that every line must arrive.
//!
//! Unix only: SIGKILL, inodes.

#![cfg(unix)]

mod common;

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::{bin, Harness};
use futures_util::StreamExt;
use oncelog_client::{CreateOptions, LiveMode, ReadFrom, ReadOptions};

const STREAM: &str = "logs/app";
const LINES: usize = 6000;
/// Rotation by rename while the shipper runs.
const RENAME_LIVE: usize = 1000;
/// Rotation by rename while the shipper is stopped: it is stopped at `RENAME_STOPPED`, the file
/// is rotated `GAP` lines later, and it restarts `GAP` lines after that.
const RENAME_STOPPED: usize = 2000;
/// Copytruncate while the shipper runs.
const TRUNCATE_LIVE: usize = 3000;
/// Copytruncate while the shipper is stopped; it restarts after `REGROW` more lines, which are
/// more bytes than the file held at the truncation.
const TRUNCATE_STOPPED: usize = 4000;
const GAP: usize = 100;
const REGROW: usize = 1200;
/// The whole test must end well within a minute.
const DEADLINE: Duration = Duration::from_secs(50);

fn line(i: usize) -> String {
    // Varying lengths, a tab and a CR: the lines are bytes, shipped as they are.
    format!("{i:06}\t{}\r\n", "x".repeat(i % 37))
}

/// A small seeded generator (xorshift64*): kill moments that differ per run, replayable.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}

struct Shipper {
    cmd: Vec<std::ffi::OsString>,
    /// Every run's stderr, appended.
    log: PathBuf,
    child: Option<Child>,
    kills: usize,
}

impl Shipper {
    fn start(&mut self) {
        assert!(self.child.is_none(), "already running");
        let err = OpenOptions::new().create(true).append(true).open(&self.log).expect("stderr log");
        let child = bin()
            .args(&self.cmd)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(err))
            .spawn()
            .expect("spawn oncelog ship");
        self.child = Some(child);
    }

    /// SIGKILL, after checking that it did not stop by itself.
    fn kill(&mut self) {
        let mut child = self.child.take().expect("running");
        if let Some(status) = child.try_wait().expect("try_wait") {
            panic!("oncelog ship stopped by itself ({status}):\n{}", self.stderr());
        }
        child.kill().expect("SIGKILL");
        child.wait().expect("wait");
        self.kills += 1;
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Shipper {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Everything in the stream now.
fn stream_bytes(h: &Harness) -> Vec<u8> {
    h.rt.block_on(async {
        let mut out = Vec::new();
        let mut chunks = h.client().stream(STREAM).read(ReadOptions::new(ReadFrom::Beginning, LiveMode::CatchUp));
        while let Some(c) = chunks.next().await {
            out.extend_from_slice(&c.expect("read").data);
        }
        out
    })
}

/// Waits until the stream holds `expected` (it may only grow towards it), or fails.
fn wait_for(h: &Harness, expected: &[u8], shipper: &Shipper, started: Instant) {
    loop {
        let got = stream_bytes(h);
        if got == expected {
            return;
        }
        assert!(
            expected.starts_with(&got),
            "the stream is not a prefix of the lines written:\n{}\n{}",
            describe(&got, expected),
            shipper.stderr()
        );
        assert!(
            started.elapsed() < DEADLINE,
            "the stream did not catch up ({} of {} bytes):\n{}",
            got.len(),
            expected.len(),
            shipper.stderr()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Which line numbers are doubled, missing or out of order.
fn describe(got: &[u8], expected: &[u8]) -> String {
    let numbers = |b: &[u8]| -> Vec<String> {
        String::from_utf8_lossy(b).lines().map(|l| l.split('\t').next().unwrap_or("").to_owned()).collect()
    };
    let (g, e) = (numbers(got), numbers(expected));
    let first_diff = g.iter().zip(e.iter()).position(|(a, b)| a != b);
    format!(
        "{} lines in the stream, {} written; first difference at line {:?}: {:?} instead of {:?}",
        g.len(),
        e.len(),
        first_diff,
        first_diff.map(|i| &g[i]),
        first_diff.map(|i| &e[i])
    )
}

fn rename(dir: &Path, from: &str, to: &str) {
    let from = dir.join(from);
    if from.exists() {
        std::fs::rename(from, dir.join(to)).expect("rename");
    }
}

/// Copytruncate: copy the file, then truncate it in place (the writer's `O_APPEND` handle goes
/// on at the new end).
fn copytruncate(log: &Path, copy: &Path) {
    std::fs::copy(log, copy).expect("copy");
    OpenOptions::new().write(true).open(log).expect("open").set_len(0).expect("truncate");
}

#[test]
fn every_line_is_shipped_once_across_rotations_and_sigkills() {
    let h = Harness::start();
    h.rt.block_on(h.client().stream(STREAM).create(CreateOptions::content_type("text/plain"))).expect("create");
    let dir = h.dir.path().join("logs");
    std::fs::create_dir(&dir).expect("logs dir");
    let log = dir.join("app.log");
    let seed = std::env::var("SHIP_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64) | 1
    });
    eprintln!("seed {seed} (SHIP_SEED={seed} replays the kill moments)");
    let mut rng = Rng(seed);
    let mut shipper = Shipper {
        cmd: [
            "ship".into(),
            log.clone().into_os_string(),
            STREAM.into(),
            "--url".into(),
            h.base.clone().into(),
            "--state-file".into(),
            h.dir.path().join("ship.state").into_os_string(),
            "--poll-ms".into(),
            "20".into(),
        ]
        .into(),
        log: h.dir.path().join("ship.stderr"),
        child: None,
        kills: 0,
    };
    let started = Instant::now();
    // Started before the file exists.
    shipper.start();
    let open = |path: &Path| OpenOptions::new().create(true).append(true).open(path).expect("open log");
    let mut writer: File = open(&log);
    let mut written = Vec::new();
    let mut truncated_at = 0;
    let mut next_kill = Instant::now() + Duration::from_millis(50 + rng.below(300));
    for i in 0..LINES {
        match i {
            RENAME_LIVE => {
                rename(&dir, "app.log", "app.log.1");
                writer = open(&log);
            }
            RENAME_STOPPED => shipper.kill(),
            i if i == RENAME_STOPPED + GAP => {
                // The shipper left lines unread in the old file, which moves twice meanwhile.
                rename(&dir, "app.log.1", "app.log.2");
                rename(&dir, "app.log", "app.log.1");
                writer = open(&log);
            }
            i if i == RENAME_STOPPED + 2 * GAP => shipper.start(),
            TRUNCATE_LIVE => {
                wait_for(&h, &written, &shipper, started);
                copytruncate(&log, &dir.join("app.log.copy1"));
            }
            TRUNCATE_STOPPED => {
                wait_for(&h, &written, &shipper, started);
                shipper.kill();
                truncated_at = std::fs::metadata(&log).expect("stat").len();
                copytruncate(&log, &dir.join("app.log.copy2"));
            }
            i if i == TRUNCATE_STOPPED + REGROW => {
                // Grown past where the shipper stood: only the file's first bytes tell.
                assert!(std::fs::metadata(&log).expect("stat").len() > truncated_at);
                shipper.start();
            }
            _ => {}
        }
        let l = line(i);
        writer.write_all(l.as_bytes()).expect("write");
        written.extend_from_slice(l.as_bytes());
        if shipper.child.is_some() && Instant::now() >= next_kill {
            shipper.kill();
            // Back at once, or after a pause in which the file moves on.
            if rng.below(2) == 0 {
                std::thread::sleep(Duration::from_millis(rng.below(100)));
            }
            shipper.start();
            next_kill = Instant::now() + Duration::from_millis(50 + rng.below(300));
        }
        std::thread::sleep(Duration::from_micros(800));
    }
    wait_for(&h, &written, &shipper, started);
    // Nothing more arrives, and a restart on the same state adds nothing either.
    shipper.kill();
    shipper.start();
    std::thread::sleep(Duration::from_millis(500));
    shipper.kill();
    let got = stream_bytes(&h);
    assert!(got == written, "{}\n{}", describe(&got, &written), shipper.stderr());
    eprintln!(
        "{LINES} lines, {} bytes, {} SIGKILLs, {:.1} s",
        written.len(),
        shipper.kills,
        started.elapsed().as_secs_f64()
    );
    // The scenarios happened as planned: the stopped rotation was finished from the old file,
    // both truncations were noticed.
    let notes = shipper.stderr();
    eprintln!("{notes}");
    assert!(notes.contains("app.log.1 (rotated while the shipper was stopped)"), "{notes}");
    assert!(notes.matches("was truncated").count() >= 2, "{notes}");
    assert!(shipper.kills >= 6, "too few kills to mean anything: {}", shipper.kills);
}

#[test]
fn one_shipper_per_state_file_one_stream_per_state_file_and_no_json_streams() {
    let h = Harness::start();
    h.rt.block_on(h.client().stream(STREAM).create(CreateOptions::content_type("text/plain"))).expect("create");
    h.rt.block_on(h.client().stream("events").create(CreateOptions::content_type("application/json"))).expect("create");
    let log = h.dir.path().join("app.log");
    std::fs::write(&log, "one\n").expect("log");
    let ship = |stream: &str| {
        let mut c = bin();
        c.args(["ship".as_ref(), log.as_os_str(), stream.as_ref(), "--url".as_ref(), h.base.as_ref()]);
        c
    };
    let mut first = Shipper {
        cmd: ship(STREAM).get_args().map(ToOwned::to_owned).collect(),
        log: h.dir.path().join("first.stderr"),
        child: None,
        kills: 0,
    };
    first.start();
    wait_for(&h, b"one\n", &first, Instant::now());
    // The default state file is FILE.oncelog-ship; a second shipper on it is refused.
    assert!(h.dir.path().join("app.log.oncelog-ship").exists());
    let second = common::run(ship(STREAM), b"", Duration::from_secs(10));
    assert!(!second.ok && second.stderr.contains("in use by another `oncelog ship`"), "{}", second.stderr);
    first.kill();
    // The state file belongs to its stream: another would skip what the first one shipped.
    let other = common::run(ship("events"), b"", Duration::from_secs(10));
    assert!(!other.ok && other.stderr.contains("belongs to stream logs/app"), "{}", other.stderr);
    let mut json = ship("events");
    json.arg("--state-file").arg(h.dir.path().join("events.state"));
    let json = common::run(json, b"", Duration::from_secs(10));
    assert!(!json.ok && json.stderr.contains("is a JSON stream"), "{}", json.stderr);
}
