//! Live readers that stop reading cannot make the server hold much memory.
//!
//! The real `oncelog` binary runs as a child process so that its resident memory can be read
//! from `/proc`. Two hundred SSE readers subscribe to a binary stream (base64 on the wire, the
//! largest framing) and never read; a writer appends large messages; a normal SSE reader must
//! still receive every byte, and the server's RSS must stay under [`RSS_GROWTH_BOUND`] above
//! what it used before the readers came. Reading each append whole and framing each event whole
//! pinned a copy of each message per stalled reader (896 MiB here with the copy read, more with
//! the base64 copy too); bounded reads framed a piece at a time pin one piece.
//!
//! Linux only: it reads `/proc/PID/status`.

#![cfg(target_os = "linux")]

mod common;

use std::time::{Duration, Instant};

use common::Server;

use futures_util::StreamExt;
use oncelog_client::{Client, CreateOptions, LiveMode, ReadFrom, ReadOptions};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpSocket, TcpStream};

const STALLED_READERS: usize = 200;
const MESSAGES: usize = 6;
const MESSAGE_BYTES: usize = 4 << 20;
/// The stated bound: what 200 stalled SSE readers of 4 MiB messages may add to the server's
/// resident memory. Each holds at most one read of `SSE_READ_BYTES` (64 KiB), the HTTP/1 write
/// queue (64 KiB) and one framed piece: about 160 KiB, 32 MiB for 200, plus the connections
/// themselves, and the hot tail's copy of the 24 MiB appended (36-39 MiB measured in all; 14 MiB
/// with no stalled reader). Before: 896 MiB with whole appends read per reader, and more with each
/// event framed whole; 55-94 MiB while the runtime could start a blocking thread per disk read.
const RSS_GROWTH_BOUND: u64 = 64 << 20;
/// The server's threads: the runtime's workers, at most `8 x cores` (at least 16) blocking threads
/// for disk reads, the log writer and housekeeping. 21 measured here; with tokio's default of 512
/// blocking threads the stalled readers' reads started 59-127.
const THREAD_BOUND: u64 = 40;

/// A reader that asks for the stream's future over SSE and then never reads: a small receive
/// window, so the server's writes block almost at once.
async fn stalled_reader(server: &Server) -> TcpStream {
    let socket = TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(4096).expect("receive buffer");
    let mut conn = socket.connect(server.addr()).await.expect("connect");
    conn.write_all(b"GET /v1/stream/fanout?offset=now&live=sse HTTP/1.1\r\nHost: t\r\n\r\n").await.expect("request");
    conn
}

fn message(i: usize) -> Vec<u8> {
    (0..MESSAGE_BYTES).map(|j| (j.wrapping_mul(31) ^ i.wrapping_mul(7919)) as u8).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_sse_readers_that_never_read_keep_rss_bounded_while_a_normal_reader_gets_everything() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("data"), &["--fsync", "false", "--write-timeout-ms", "120000"]);
    let client = Client::new(format!("{}/v1/stream", server.url)).expect("client");
    let stream = client.stream("fanout");
    stream.create(CreateOptions::content_type("application/octet-stream")).await.expect("create");

    let mut stalled = Vec::new();
    for _ in 0..STALLED_READERS {
        stalled.push(stalled_reader(&server).await);
    }
    let reader = stream.clone();
    let normal = tokio::spawn(async move {
        let mut got = Vec::new();
        let mut chunks = reader.read(ReadOptions::new(ReadFrom::Beginning, LiveMode::Sse));
        while got.len() < MESSAGES * MESSAGE_BYTES {
            let chunk = chunks.next().await.expect("the reader ended early").expect("read");
            got.extend_from_slice(&chunk.data);
        }
        got
    });
    // The stalled readers are in place (each got its headers queued) before the data comes.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = server.rss_bytes();

    let mut expected = Vec::new();
    for i in 0..MESSAGES {
        let m = message(i);
        stream.append(m.clone(), Default::default()).await.expect("append");
        expected.extend_from_slice(&m);
    }
    let got = tokio::time::timeout(Duration::from_secs(120), normal)
        .await
        .expect("normal reader timed out")
        .expect("reader task");
    assert!(got == expected, "the normal reader got {} bytes, not the {} appended", got.len(), expected.len());

    // Whatever the stalled readers pin is pinned by now; sample for a moment.
    let mut peak = 0;
    let mut threads = 0;
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(2) {
        peak = peak.max(server.rss_bytes());
        threads = threads.max(server.threads());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let growth = peak.saturating_sub(before);
    eprintln!(
        "RSS before {} MiB, peak {} MiB, growth {} MiB, threads {threads}",
        before >> 20,
        peak >> 20,
        growth >> 20
    );
    assert!(
        growth < RSS_GROWTH_BOUND,
        "{STALLED_READERS} stalled readers grew the server's RSS by {} MiB (bound {} MiB)",
        growth >> 20,
        RSS_GROWTH_BOUND >> 20
    );
    assert!(
        threads <= THREAD_BOUND,
        "the server ran {threads} threads (bound {THREAD_BOUND}): disk reads are not pooled"
    );
    drop(stalled);
}
