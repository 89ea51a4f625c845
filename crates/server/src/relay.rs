//! Wakes from other threads gathered per connection runtime (issue 47 step 4): the log writer
//! answers a committed group of appends from its own thread, and each answer wakes the
//! connection task that waits for it. On a current-thread runtime each such wake from outside
//! costs a write to the runtime's eventfd (measured: 0.96 `write` calls per append at
//! `--io-threads 2`), however many arrive together.
//!
//! A connection's task is polled with a waker of its own ([`Relayed`]). Woken on its runtime's
//! thread (its socket, its timers), it wakes the task at once. Woken from another thread, it
//! queues itself on the runtime's [`Relay`] and wakes the relay's task only if the relay is not
//! already due to run: one cross-thread wake per runtime per burst (a group's answers), after
//! which the relay wakes each queued task from inside its runtime, where a wake is a push onto
//! the local run queue. Nothing here knows what woke a task.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Wake, Waker};

use futures_util::task::AtomicWaker;

thread_local! {
    /// The relay of the runtime this thread runs, if it runs one (0: none).
    static ON_RELAY: Cell<usize> = const { Cell::new(0) };
}

/// One runtime's relay; see the module docs.
pub struct Relay {
    /// Non-zero and unique per process: the thread-local mark of its runtime's thread.
    id: usize,
    queue: Mutex<Vec<Arc<RelayWaker>>>,
    /// The relay's task was woken and has not drained the queue since.
    due: AtomicBool,
    task: AtomicWaker,
    /// Times a pusher woke the relay's task (each a cross-thread wake of the runtime).
    woken: std::sync::atomic::AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Relay {
    pub fn new() -> Arc<Relay> {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1);
        Arc::new(Relay {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            queue: Mutex::new(Vec::new()),
            due: AtomicBool::new(false),
            task: AtomicWaker::new(),
            woken: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// Marks the calling thread as this relay's runtime thread.
    pub fn enter(&self) {
        ON_RELAY.with(|r| r.set(self.id));
    }

    fn on_its_thread(&self) -> bool {
        ON_RELAY.with(|r| r.get() == self.id)
    }

    /// The relay's task: run it on its runtime (spawned there); it never ends.
    ///
    /// While wakes keep coming it stays due (pushers then wake nothing) and runs again from its
    /// own runtime after each drain; only a drain that finds the queue empty makes it not due,
    /// so a burst costs one cross-thread wake however it interleaves with the drains.
    pub async fn run(self: Arc<Self>) {
        std::future::poll_fn(|cx| {
            self.task.register(cx.waker());
            loop {
                let queued = std::mem::take(&mut *lock(&self.queue));
                if !queued.is_empty() {
                    for w in queued {
                        w.queued.store(false, Ordering::SeqCst);
                        w.wake_task();
                    }
                    // Again after the tasks just woken have run (a local wake).
                    cx.waker().wake_by_ref();
                    return Poll::<()>::Pending;
                }
                self.due.store(false, Ordering::SeqCst);
                // A waker queued between the take and the line above found the relay due and
                // woke nothing: take it now.
                if lock(&self.queue).is_empty() || self.due.swap(true, Ordering::SeqCst) {
                    return Poll::Pending;
                }
            }
        })
        .await;
    }

    fn push(&self, w: Arc<RelayWaker>) {
        lock(&self.queue).push(w);
        if !self.due.swap(true, Ordering::SeqCst) {
            self.woken.fetch_add(1, Ordering::Relaxed);
            self.task.wake();
        }
    }

    /// Times the relay's task was woken from another thread.
    pub fn woken(&self) -> u64 {
        self.woken.load(Ordering::Relaxed)
    }

    /// Wraps `fut` so that wakes from other threads reach it through this relay.
    pub fn wrap<F: Future>(self: &Arc<Self>, fut: F) -> Relayed<F> {
        let inner =
            Arc::new(RelayWaker { relay: Arc::clone(self), task: AtomicWaker::new(), queued: AtomicBool::new(false) });
        Relayed { fut: Box::pin(fut), waker: Waker::from(Arc::clone(&inner)), inner }
    }
}

/// The waker a [`Relayed`] future is polled with.
struct RelayWaker {
    relay: Arc<Relay>,
    /// The task's own waker, as of its last poll (registered on every poll, without a lock:
    /// this is on every connection's hot path).
    task: AtomicWaker,
    /// On the relay's queue already.
    queued: AtomicBool,
}

impl RelayWaker {
    /// Wakes the task (its waker is taken: the poll that follows registers it again).
    fn wake_task(&self) {
        self.task.wake();
    }
}

impl Wake for RelayWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if self.relay.on_its_thread() {
            self.wake_task();
        } else if !self.queued.swap(true, Ordering::SeqCst) {
            self.relay.push(Arc::clone(self));
        }
    }
}

/// A future polled with a relayed waker; see the module docs.
pub struct Relayed<F> {
    fut: Pin<Box<F>>,
    /// Made once: the same waker on every poll (`will_wake` holds for whoever keeps it).
    waker: Waker,
    inner: Arc<RelayWaker>,
}

impl<F: Future> Future for Relayed<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        self.inner.task.register(cx.waker());
        let this = &mut *self;
        let mut relayed = Context::from_waker(&this.waker);
        this.fut.as_mut().poll(&mut relayed)
    }
}
