//! A TCP proxy that can go silent: while frozen it forwards nothing in either direction and
//! closes nothing, as a network path that drops packets does (no RST, no FIN): both ends see an
//! open connection that never answers. New connections are accepted but not forwarded until the
//! path heals.

#![allow(dead_code)]

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct FreezeProxy {
    pub addr: SocketAddr,
    frozen: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl FreezeProxy {
    /// Listens on 127.0.0.1 (a free port) and forwards to `upstream`.
    pub async fn start(upstream: SocketAddr) -> FreezeProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the proxy");
        let addr = listener.local_addr().expect("proxy address");
        let (frozen, watch) = watch::channel(false);
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let watch = watch.clone();
                tokio::spawn(async move {
                    flowing(&watch).await;
                    let Ok(server) = TcpStream::connect(upstream).await else { return };
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    tokio::join!(pump(cr, sw, watch.clone()), pump(sr, cw, watch));
                });
            }
        });
        FreezeProxy { addr, frozen, task }
    }

    /// Stops forwarding (bytes already in flight stay where they are).
    pub fn freeze(&self) {
        let _ = self.frozen.send(true);
    }

    /// Forwards again, from where each direction stopped.
    pub fn heal(&self) {
        let _ = self.frozen.send(false);
    }
}

impl Drop for FreezeProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn flowing(watch: &watch::Receiver<bool>) {
    let mut w = watch.clone();
    let _ = w.wait_for(|frozen| !frozen).await;
}

/// Copies one direction, holding each chunk while the path is frozen (and reading no more).
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    watch: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        flowing(&watch).await;
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        flowing(&watch).await;
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}
