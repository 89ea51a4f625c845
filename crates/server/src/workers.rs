//! Per-core serving (`--io-threads`, issue 47 step 3): connections run on N single-threaded
//! runtimes, each on a thread of its own, instead of one work-stealing runtime. The acceptor
//! hands each new connection to the runtime with the fewest open ones; a connection never moves
//! after that, so its task, its timers and its socket's readiness stay on one thread (no
//! stealing, no cross-thread wake between the socket and the task that reads it).
//!
//! Everything a request reaches beyond its connection (the engine's writer thread, the blocking
//! pool of disk reads, the sweeper) is shared as before. Wakes from those threads reach a
//! connection through its runtime's [`Relay`]: one cross-thread wake per runtime per burst (a
//! committed group's answers), not one per task.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::net::TcpStream;
use tokio::runtime::Handle;

use crate::relay::Relay;

/// One connection runtime per core: the default of `--io-threads`.
pub fn default_count() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

/// One runtime and the connections it serves.
struct Worker {
    handle: Handle,
    relay: Arc<Relay>,
    open: Arc<AtomicUsize>,
    /// Dropped with the pool: the thread's runtime then returns and is dropped, ending its
    /// tasks.
    _stop: tokio::sync::oneshot::Sender<()>,
}

/// The pool of connection runtimes; see the module docs.
pub struct Workers {
    workers: Vec<Worker>,
}

/// Gives a connection's count back when its task ends (or is dropped).
struct Open(Arc<AtomicUsize>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Workers {
    /// Starts `n` runtimes (threads `oncelog-io-0` …). Each may run `max_blocking` blocking
    /// tasks at once (disk reads started by its requests).
    pub fn start(n: usize, max_blocking: usize) -> std::io::Result<Workers> {
        let mut workers = Vec::with_capacity(n);
        for i in 0..n {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .max_blocking_threads(max_blocking.max(1))
                .thread_name(format!("oncelog-io-{i}-blocking"))
                .build()?;
            let handle = runtime.handle().clone();
            let relay = Relay::new();
            handle.spawn(Arc::clone(&relay).run());
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let marked = Arc::clone(&relay);
            std::thread::Builder::new().name(format!("oncelog-io-{i}")).spawn(move || {
                marked.enter();
                let _ = runtime.block_on(stopped);
            })?;
            workers.push(Worker { handle, relay, open: Arc::new(AtomicUsize::new(0)), _stop: stop });
        }
        Ok(Workers { workers })
    }

    /// Connections open on each runtime, in order.
    pub fn open(&self) -> Vec<usize> {
        self.workers.iter().map(|w| w.open.load(Ordering::Relaxed)).collect()
    }

    /// Runs `serve` with `stream` on the runtime with the fewest open connections. The stream
    /// leaves this runtime's reactor and joins that one's.
    pub fn spawn_connection<F, Fut>(&self, stream: TcpStream, serve: F)
    where
        F: FnOnce(TcpStream) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let Some(worker) = self.workers.iter().min_by_key(|w| w.open.load(Ordering::Relaxed)) else {
            return;
        };
        let std_stream = match stream.into_std() {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "a connection could not be handed to its runtime");
                return;
            }
        };
        worker.open.fetch_add(1, Ordering::Relaxed);
        let open = Open(Arc::clone(&worker.open));
        worker.handle.spawn(worker.relay.wrap(async move {
            let _open = open;
            // Registered with this runtime's reactor: must run inside it.
            match TcpStream::from_std(std_stream) {
                Ok(stream) => serve(stream).await,
                Err(e) => tracing::warn!(error = %e, "a connection could not join its runtime"),
            }
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Four connections over two runtimes: two each, every one served on an `oncelog-io-`
    /// thread, and each runtime's count given back when its connections end.
    #[tokio::test]
    async fn connections_are_spread_over_the_runtimes_and_stay_on_their_threads() {
        let workers = Workers::start(2, 2).expect("runtimes");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (release, _) = tokio::sync::broadcast::channel::<()>(1);
        let (threads, mut seen) = tokio::sync::mpsc::unbounded_channel::<String>();
        let mut clients = Vec::new();
        for _ in 0..4 {
            let client = TcpStream::connect(addr).await.expect("connect");
            let (stream, _) = listener.accept().await.expect("accept");
            let (mut wait, threads) = (release.subscribe(), threads.clone());
            workers.spawn_connection(stream, move |stream| async move {
                let name = std::thread::current().name().unwrap_or_default().to_string();
                let _ = threads.send(name);
                let _ = wait.recv().await;
                drop(stream);
            });
            clients.push(client);
        }
        for _ in 0..4 {
            let name =
                tokio::time::timeout(Duration::from_secs(5), seen.recv()).await.expect("served").expect("a name");
            assert!(name.starts_with("oncelog-io-"), "served on {name:?}");
        }
        assert_eq!(workers.open(), vec![2, 2], "the runtime with the fewest takes the next");
        let _ = release.send(());
        for _ in 0..100 {
            if workers.open() == vec![0, 0] {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("counts not given back: {:?}", workers.open());
    }
    /// 200 connection tasks on one runtime, all answered at once from another thread (as the log
    /// writer answers a group): the runtime is woken from outside once, not once per task (on a
    /// current-thread runtime each such wake is a write to its eventfd: measured in a server
    /// under S1, 1.00 such writes per append without the relay, 0.13 with it).
    #[tokio::test]
    async fn answers_from_another_thread_wake_a_runtime_once_per_burst_not_once_per_task() {
        const TASKS: usize = 200;
        let workers = Workers::start(1, 2).expect("runtime");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (senders_tx, senders_rx) = std::sync::mpsc::channel::<tokio::sync::oneshot::Sender<()>>();
        // Counted, not sent: a message to this test's runtime would itself wake it from another
        // thread (a write) and blur the count.
        let done = Arc::new(AtomicUsize::new(0));
        let mut clients = Vec::new();
        for _ in 0..TASKS {
            let client = TcpStream::connect(addr).await.expect("connect");
            let (stream, _) = listener.accept().await.expect("accept");
            let (answer, wait) = tokio::sync::oneshot::channel::<()>();
            senders_tx.send(answer).expect("queued");
            let done = Arc::clone(&done);
            workers.spawn_connection(stream, move |stream| async move {
                let _ = wait.await;
                done.fetch_add(1, Ordering::SeqCst);
                drop(stream);
            });
            clients.push(client);
        }
        // Every task waits on its answer (and the runtime is parked) before the burst.
        tokio::time::sleep(Duration::from_millis(300)).await;
        // The burst comes while the runtime's thread is busy (as when the writer answers a
        // group while connections run), so how the answers interleave with the relay's drains
        // does not decide the count.
        workers.workers[0].handle.spawn(async { std::thread::sleep(Duration::from_millis(300)) });
        tokio::time::sleep(Duration::from_millis(50)).await;
        let before = workers.workers[0].relay.woken();
        std::thread::spawn(move || {
            for answer in senders_rx.try_iter() {
                let _ = answer.send(());
            }
        })
        .join()
        .expect("the answering thread");
        for _ in 0..250 {
            if done.load(Ordering::SeqCst) == TASKS {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let woken = workers.workers[0].relay.woken() - before;
        assert_eq!(done.load(Ordering::SeqCst), TASKS, "every task ran");
        assert_eq!(woken, 1, "the runtime was woken {woken} times from outside for one burst of {TASKS}");
    }
}
