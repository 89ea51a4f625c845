//! Kill and restart of a producing process, with its zombie fenced.
//!
//! `oncelog append` runs as a child process fed from a pipe, talking to the server through a
//! proxy the test controls. Mid-stream the proxy starts holding requests (they reached the
//! network but not the server, like packets stuck in a slow path), and the child is killed with
//! SIGKILL while those requests are pending. A second `oncelog append` starts with the same
//! producer id and epoch file, so it runs under a bumped epoch; it resumes after the last
//! message found in the stream. Then the proxy releases the dead process's requests. They
//! arrive late, under the old epoch, and must all be fenced (`403`); the stream must hold every
//! message exactly once, in order (at most once is the guarantee; exactly once follows from the
//! resume).
//!
//! Unix only: SIGKILL and exit statuses that name the signal.

#![cfg(unix)]

mod common;

use std::io::Write;
use std::net::SocketAddr;
use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{bin, run, Harness};
use futures_util::StreamExt;
use oncelog_client::{CreateOptions, ReadOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

const STREAM: &str = "restart/exactly-once";
const TOTAL: usize = 20_000;
const LIMIT: Duration = Duration::from_secs(30);

/// A proxy that can hold requests and counts what passes.
#[derive(Default)]
struct Gate {
    /// While set, client → server chunks are held instead of forwarded.
    hold: AtomicBool,
    /// Wakes held chunks when `hold` is cleared.
    released: Notify,
    /// Requests forwarded while open.
    forwarded: AtomicU64,
    /// Responses received before the release (to forwarded requests).
    answered: AtomicU64,
    /// Requests held.
    held: AtomicU64,
    /// Statuses of responses received after the release (to held requests).
    late: Mutex<Vec<u16>>,
    /// Set at release: later responses go to `late`.
    after_release: AtomicBool,
}

impl Gate {
    fn release(&self) {
        self.after_release.store(true, Ordering::SeqCst);
        self.hold.store(false, Ordering::SeqCst);
        self.released.notify_waiters();
    }
}

async fn gate_proxy(upstream: SocketAddr, gate: Arc<Gate>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = TcpStream::connect(upstream).await else { continue };
            let (mut cr, mut cw) = client.into_split();
            let (mut sr, mut sw) = server.into_split();
            let g = gate.clone();
            // Client → server. Held chunks are forwarded on release even if the client is dead
            // by then: that is the zombie's late request.
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                while let Ok(n) = cr.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    let is_post =
                        [&b"POST "[..], b"HEAD ", b"GET ", b"PUT ", b"DELETE "].iter().any(|m| buf[..n].starts_with(m));
                    if g.hold.load(Ordering::SeqCst) {
                        if is_post {
                            g.held.fetch_add(1, Ordering::SeqCst);
                        }
                        while g.hold.load(Ordering::SeqCst) {
                            let notified = g.released.notified();
                            if !g.hold.load(Ordering::SeqCst) {
                                break;
                            }
                            notified.await;
                        }
                    } else if is_post {
                        g.forwarded.fetch_add(1, Ordering::SeqCst);
                    }
                    if sw.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
                // Keep the server side open: answers to late requests must still arrive.
                std::future::pending::<()>().await;
                drop(sw);
            });
            let g = gate.clone();
            // Server → client, counting responses; a dead client does not stop the reading.
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                while let Ok(n) = sr.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    if buf[..n].starts_with(b"HTTP/1.1 ") {
                        let status = std::str::from_utf8(&buf[9..12.min(n)])
                            .ok()
                            .and_then(|s| s.parse::<u16>().ok())
                            .unwrap_or(0);
                        if g.after_release.load(Ordering::SeqCst) {
                            g.late.lock().expect("lock").push(status);
                        } else {
                            g.answered.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    let _ = cw.write_all(&buf[..n]).await;
                }
            });
        }
    });
    addr
}

fn message(n: usize) -> String {
    format!("m{n:06}\n")
}

/// The stream's messages, read directly from the server.
fn stored_messages(h: &Harness) -> Vec<String> {
    h.rt.block_on(async {
        let mut r = h.client().stream(STREAM).read(ReadOptions::default());
        let mut bytes = Vec::new();
        while let Some(c) = r.next().await {
            bytes.extend_from_slice(&c.expect("read").data);
        }
        String::from_utf8(bytes).expect("utf-8").lines().map(str::to_owned).collect()
    })
}

fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + LIMIT;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_killed_producer_restarts_with_a_bumped_epoch_and_its_zombie_is_fenced() {
    let h = Harness::start();
    let gate = Arc::new(Gate::default());
    let proxy = h.rt.block_on(gate_proxy(h.addr, gate.clone()));
    h.rt.block_on(h.client().stream(STREAM).create(CreateOptions::content_type("text/plain"))).expect("create");
    let epoch_file = h.dir.path().join("writer.epoch");
    let args = |url: String| {
        let mut c = bin();
        c.args([
            "append",
            STREAM,
            "--producer-id",
            "writer",
            "--linger-ms",
            "1",
            "--batch-items",
            "20",
            "--max-in-flight",
            "5",
        ])
        .arg("--epoch-file")
        .arg(&epoch_file)
        .args(["--url", &url]);
        c
    };

    // Session 1, through the proxy, fed from a pipe for as long as it lives.
    let mut first = args(format!("http://{proxy}/v1/stream"))
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn session 1");
    let mut pipe = first.stdin.take().expect("stdin");
    let feeder = std::thread::spawn(move || {
        for n in 0..TOTAL {
            if pipe.write_all(message(n).as_bytes()).is_err() {
                return; // the process was killed
            }
        }
    });
    let tail_bytes = |h: &Harness| {
        h.rt.block_on(h.client().stream(STREAM).head())
            .expect("head")
            .next_offset
            .to_oncelog()
            .expect("oncelog offset")
            .get()
    };
    wait_until("session 1 stored some messages", || tail_bytes(&h) >= 200 * 8);

    // Mid-stream: hold what session 1 sends next, then kill it with requests pending.
    gate.hold.store(true, Ordering::SeqCst);
    wait_until("session 1 has requests held in the network", || gate.held.load(Ordering::SeqCst) >= 2);
    std::thread::sleep(Duration::from_millis(50));
    first.kill().expect("SIGKILL");
    let status = first.wait().expect("reap");
    assert_eq!(status.signal(), Some(9), "session 1 died of SIGKILL");
    let _ = feeder.join();
    assert_eq!(std::fs::read_to_string(&epoch_file).expect("epoch file").trim(), "0");
    wait_until("every forwarded request was answered", || {
        gate.answered.load(Ordering::SeqCst) >= gate.forwarded.load(Ordering::SeqCst)
    });
    let held = gate.held.load(Ordering::SeqCst);

    // Resume after the last message in the stream, under a bumped epoch, straight to the server.
    let before = stored_messages(&h);
    let resume = before.len();
    assert!(resume > 0 && resume < TOTAL, "killed mid-stream ({resume} of {TOTAL} stored)");
    assert_eq!(before, (0..resume).map(|n| message(n).trim_end().to_owned()).collect::<Vec<_>>());
    let rest: String = (resume..TOTAL).map(message).collect();
    let out = run(args(h.base.clone()), rest.as_bytes(), LIMIT);
    assert!(out.ok, "session 2 failed: {}", out.stderr);
    assert_eq!(std::fs::read_to_string(&epoch_file).expect("epoch file").trim(), "1", "session 2 ran under epoch 1");

    // The zombie's late requests arrive now: all fenced.
    gate.release();
    wait_until("the held requests were answered", || gate.late.lock().expect("lock").len() as u64 >= held);
    let late = gate.late.lock().expect("lock").clone();
    assert!(late.iter().all(|s| *s == 403), "late requests of epoch 0 must be fenced, got {late:?}");

    let after = stored_messages(&h);
    assert_eq!(after.len(), TOTAL, "each message exactly once");
    assert_eq!(after, (0..TOTAL).map(|n| message(n).trim_end().to_owned()).collect::<Vec<_>>(), "in order");
    println!(
        "kill and restart: session 1 stored {resume} messages and was SIGKILLed with {held} requests held in the \
         network; session 2 (epoch 1) stored the remaining {}; the zombie's {} late requests were all fenced (403); \
         {TOTAL} messages, 0 duplicates, 0 lost",
        TOTAL - resume,
        late.len()
    );
}
