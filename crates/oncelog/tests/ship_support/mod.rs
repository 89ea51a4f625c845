//! What the shipper's tests share (`ship_files.rs`, `ship_lifecycle.rs`): a shipper child that
//! runs until the test stops it, with its stderr in a file, and the stream it ships into read
//! back whole.

// Each test file uses part of it.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use oncelog_client::{LiveMode, ReadFrom, ReadOptions};

use crate::common::Harness;

/// The stream the shipper tests ship into.
pub const STREAM: &str = "logs/app";

/// A shipper that runs until the test stops it; stderr goes to a file.
pub struct Running {
    child: Option<Child>,
    stderr: PathBuf,
}

impl Running {
    pub fn start(mut cmd: std::process::Command, stderr: PathBuf) -> Running {
        let err = std::fs::File::create(&stderr).expect("stderr file");
        let child = cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(err).spawn().expect("spawn oncelog ship");
        Running { child: Some(child), stderr }
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Polls until stderr holds a line with all of `words`; that line.
    pub fn wait_line(&self, words: &[&str]) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(line) = self.stderr().lines().find(|l| words.iter().all(|w| l.contains(w))) {
                return line.to_owned();
            }
            assert!(Instant::now() < deadline, "no line with {words:?}:\n{}", self.stderr());
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Sends SIGTERM.
    pub fn sigterm(&self) {
        let pid = self.child.as_ref().expect("running").id().to_string();
        let kill = std::process::Command::new("kill").args(["-TERM", &pid]).status().expect("kill");
        assert!(kill.success());
    }

    /// Its exit status (it must end within 10 s).
    pub fn wait(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("running");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = child.try_wait().expect("wait") {
                return status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("oncelog ship did not end within 10 s of SIGTERM:\n{}", self.stderr());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// SIGTERM, then its exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        self.sigterm();
        self.wait()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Everything in [`STREAM`] now.
pub fn stream_bytes(h: &Harness) -> Vec<u8> {
    h.rt.block_on(async {
        let mut out = Vec::new();
        let mut chunks = h.client().stream(STREAM).read(ReadOptions::new(ReadFrom::Beginning, LiveMode::CatchUp));
        while let Some(c) = chunks.next().await {
            out.extend_from_slice(&c.expect("read").data);
        }
        out
    })
}

/// Waits until the stream holds exactly `expected`, or fails (after 30 s, or as soon as it holds
/// something that is not a prefix of it) with the shipper's stderr.
pub fn wait_for(h: &Harness, expected: &[u8], shipper: &Running) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let got = stream_bytes(h);
        if got == expected {
            return;
        }
        assert!(
            Instant::now() < deadline && expected.starts_with(&got),
            "the stream holds {} bytes, {:?}..., expected {} bytes:\n{}",
            got.len(),
            String::from_utf8_lossy(&got[..got.len().min(80)]),
            expected.len(),
            shipper.stderr()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until the stream holds at least `n` bytes (a shipper caught mid-file), or fails after
/// 20 s with the shipper's stderr.
pub fn wait_until_holds(h: &Harness, n: usize, shipper: &Running) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while stream_bytes(h).len() < n {
        assert!(Instant::now() < deadline, "nothing shipped:\n{}", shipper.stderr());
        std::thread::sleep(Duration::from_millis(5));
    }
}
