//! Background removal of deleted streams' data, and of trimmed data.
//!
//! Deleting a stream removes its metadata and records its id in the `gc` keyspace in one batch;
//! this thread then removes the data keys in bounded batches and finally the `gc` entry. A crash
//! part-way simply resumes from the `gc` keyspace on the next start. Nothing here needs an fsync:
//! a lost removal is redone.
//!
//! A trim (or a retention move, or a compaction) of a stream no fork reads records
//! `trims[id] = earliest` in its batch; each pass removes that stream's data keys ending at or
//! below it. The entry stays until the stream goes (a pass over a range already emptied costs a
//! short scan), so a later trim's higher value is never lost to a race with this thread. Readers
//! re-check the earliest offset after their scan, and this thread is woken only after a trim is
//! published, so no read returns data from beyond a removed key.

use std::sync::{Arc, Condvar, Mutex};

use super::Keyspaces;

/// Keys removed per batch: bounds the memory and journal entry size of one removal step.
const KEYS_PER_BATCH: usize = 4096;

#[derive(Clone)]
pub(crate) struct GcHandle {
    signal: Arc<(Mutex<GcState>, Condvar)>,
    /// Joined on stop, so that after shutdown nothing but the engine holds the database.
    thread: Arc<Mutex<Option<std::thread::JoinHandle<()>>>>,
}

#[derive(Default)]
struct GcState {
    /// Set by `wake`, cleared when the thread starts a pass.
    pending: bool,
    stop: bool,
}

impl GcHandle {
    /// `pending`: whether recovery found work left (a first pass runs at once).
    pub fn start(ks: Arc<Keyspaces>, pending: bool) -> Self {
        let handle = GcHandle {
            signal: Arc::new((Mutex::new(GcState { pending, stop: false }), Condvar::new())),
            thread: Arc::new(Mutex::new(None)),
        };
        let h = handle.clone();
        match std::thread::Builder::new().name("oncelog-gc".into()).spawn(move || h.run(&ks)) {
            Ok(t) => {
                if let Ok(mut slot) = handle.thread.lock() {
                    *slot = Some(t);
                }
            }
            Err(e) => tracing::error!(error = %e, "could not start the garbage collector; deleted data stays on disk"),
        }
        handle
    }

    pub fn wake(&self) {
        let (lock, cv) = &*self.signal;
        if let Ok(mut s) = lock.lock() {
            s.pending = true;
            cv.notify_one();
        }
    }

    /// Stops the thread after its current pass and waits for it.
    pub fn stop(&self) {
        let (lock, cv) = &*self.signal;
        if let Ok(mut s) = lock.lock() {
            s.stop = true;
            cv.notify_one();
        }
        let thread = self.thread.lock().ok().and_then(|mut t| t.take());
        if let Some(t) = thread {
            let _ = t.join();
        }
    }

    fn run(&self, ks: &Keyspaces) {
        let (lock, cv) = &*self.signal;
        loop {
            {
                let Ok(mut s) = lock.lock() else { return };
                while !s.pending && !s.stop {
                    s = match cv.wait(s) {
                        Ok(s) => s,
                        Err(_) => return,
                    };
                }
                if s.stop {
                    return;
                }
                s.pending = false;
            }
            if let Err(e) = collect(ks) {
                tracing::warn!(error = %e, "garbage collection pass failed; will retry on the next delete or restart");
            }
        }
    }
}

/// One pass: removes the data of every stream listed in the `gc` keyspace.
fn collect(ks: &Keyspaces) -> Result<(), fjall::Error> {
    let ids: Vec<[u8; 8]> = ks
        .gc
        .iter()
        .filter_map(|g| g.key().ok())
        .filter_map(|k| <[u8; 8]>::try_from(k.as_ref()).ok())
        .collect();
    for id in ids {
        remove_all(ks, || ks.data.prefix(id))?;
        let mut batch = ks.db.batch();
        batch.remove(&ks.gc, id.to_vec());
        batch.commit()?;
    }
    let trims: Vec<(u64, u64)> = ks
        .trims
        .iter()
        .filter_map(|g| g.into_inner().ok())
        .filter_map(|(k, v)| Some((u64::from_be_bytes(k.as_ref().try_into().ok()?), u64::from_be_bytes(v.as_ref().try_into().ok()?))))
        .collect();
    for (id, earliest) in trims {
        let range = super::records::keys::data(id, 0)..=super::records::keys::data(id, earliest);
        remove_all(ks, || ks.data.range(range.clone()))?;
    }
    Ok(())
}

/// Removes every data key `keys()` yields, [`KEYS_PER_BATCH`] per batch, asking again after
/// each batch until it yields none.
fn remove_all(ks: &Keyspaces, keys: impl Fn() -> fjall::Iter) -> Result<(), fjall::Error> {
    loop {
        let batch_keys: Vec<_> = keys().take(KEYS_PER_BATCH).filter_map(|g| g.key().ok()).collect();
        if batch_keys.is_empty() {
            return Ok(());
        }
        let mut batch = ks.db.batch();
        for k in batch_keys {
            batch.remove(&ks.data, k);
        }
        batch.commit()?;
    }
}
