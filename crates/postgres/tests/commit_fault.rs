//! A `COMMIT` whose connection is lost before its answer: the appends of that group are never
//! acknowledged (an error, 503 over HTTP), and a retry of one of them is decided again against
//! what the database holds. Needs `ONCELOG_TEST_POSTGRES_URL` (plain TCP to the same cluster is
//! used through a proxy: the proxy must read the protocol's messages).
//!
//! The proxy cuts the connection exactly at the `COMMIT` that follows the append's data on the
//! wire (a needle in the append's body), so the moment is made, not waited for: the failover test
//! (`crates/oncelog/tests/failover.rs`) reaches it by freezing processes and catches the mutant
//! below in some runs only, where the group's deadline answers first.
//!
//! Mutant: the committer ignoring the error of its `COMMIT` (`writer.rs`, `try_group` without
//! `?` on `group.flush`) answers the append as written; this test then finds an acknowledged
//! append missing from the stream, in every run.

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use oncelog_postgres::{PgEngine, PgOptions};
use oncelog_protocol::Offset;
use oncelog_storage::contract::{create, create_req, produce, read_all};
use oncelog_storage::{AppendError, AppendStatus, Engine};

/// The simple-query message `COMMIT` as the driver sends it: tag `Q`, length 11, the text and NUL.
const COMMIT: &[u8] = b"Q\0\0\0\x0bCOMMIT\0";
/// What marks the append whose `COMMIT` is cut (it travels in the same flight, in the data).
const NEEDLE: &str = "cut-at-commit-7f3a";

/// A TCP proxy to the test cluster that, while armed, closes the first connection on which a
/// `COMMIT` follows [`NEEDLE`], before forwarding the `COMMIT`.
struct Proxy {
    port: u16,
    armed: Arc<AtomicBool>,
    cuts: Arc<AtomicUsize>,
}

impl Proxy {
    fn start(upstream: (String, u16)) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let (armed, cuts) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicUsize::new(0)));
        let (a, c) = (armed.clone(), cuts.clone());
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let Ok(server) = TcpStream::connect((upstream.0.as_str(), upstream.1)) else { continue };
                let (a, c) = (a.clone(), c.clone());
                std::thread::spawn(move || forward(client, server, a, c));
            }
        });
        Proxy { port, armed, cuts }
    }
}

fn forward(client: TcpStream, server: TcpStream, armed: Arc<AtomicBool>, cuts: Arc<AtomicUsize>) {
    let (Ok(mut from_client), Ok(mut to_server)) = (client.try_clone(), server.try_clone()) else { return };
    let (mut from_server, mut to_client) = (server, client);
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut from_server, &mut to_client);
        let _ = to_client.shutdown(Shutdown::Both);
    });
    // What this connection sent since its last `COMMIT`: where the needle is looked for.
    let mut since_commit: Vec<u8> = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match from_client.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let start = since_commit.len();
        since_commit.extend_from_slice(&buf[..n]);
        let hit = find(&since_commit, COMMIT);
        if let Some(at) = hit {
            let needled = find(&since_commit[..at], NEEDLE.as_bytes()).is_some();
            if needled && armed.swap(false, Ordering::SeqCst) {
                // Everything before the COMMIT goes through; the COMMIT never does.
                let _ = to_server.write_all(&since_commit[start.min(at)..at]);
                cuts.fetch_add(1, Ordering::SeqCst);
                let _ = to_server.shutdown(Shutdown::Both);
                let _ = from_client.shutdown(Shutdown::Both);
                return;
            }
        }
        if to_server.write_all(&buf[..n]).is_err() {
            break;
        }
        if let Some(at) = hit {
            since_commit.drain(..at + COMMIT.len());
        }
    }
    let _ = to_server.shutdown(Shutdown::Both);
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_append_whose_commit_was_cut_is_never_acknowledged() {
    let (cfg, _) = oncelog_postgres::driver_config(&common::url()).expect("test URL");
    let port = cfg.get_ports().first().copied().unwrap_or(5432);
    let proxy = Proxy::start(("127.0.0.1".into(), port));
    let user = cfg.get_user().unwrap_or("postgres");
    let db = cfg.get_dbname().unwrap_or("postgres");
    let url = format!("postgres://{user}@127.0.0.1:{}/{db}?sslmode=disable", proxy.port);
    let opts = PgOptions { schema: common::fresh_schema(), pool_size: 2, committers: 1, ..PgOptions::new(url) };
    let e = PgEngine::open(opts).await.expect("open through the proxy");
    create(&e, create_req("s", "text/plain")).await;
    let first = e.append(produce("s", "before,", "p", 0, 0)).await.expect("append before the cut");
    assert_eq!(first.next_offset, Offset(7));

    proxy.armed.store(true, Ordering::SeqCst);
    let body = format!("x-{NEEDLE}");
    let cut = e.append(produce("s", &body, "p", 0, 1)).await;
    assert_eq!(proxy.cuts.load(Ordering::SeqCst), 1, "the proxy cut the append's COMMIT");
    assert!(matches!(cut, Err(AppendError::Storage(_))), "an append whose COMMIT was lost was answered {cut:?}");

    // The retry is decided against what the database holds: nothing of the lost group.
    let retry = e.append(produce("s", &body, "p", 0, 1)).await.expect("retry");
    assert_eq!((retry.status, retry.next_offset), (AppendStatus::Appended, Offset(7 + body.len() as u64)));
    let again = e.append(produce("s", &body, "p", 0, 1)).await.expect("a retry of the acknowledged one");
    assert_eq!((again.status, again.next_offset), (AppendStatus::Duplicate, retry.next_offset));
    assert_eq!(read_all(&e, "s", 1 << 20).await, format!("before,{body}"));
    e.shutdown().await.expect("shutdown");
}
