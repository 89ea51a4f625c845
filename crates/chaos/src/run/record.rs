//! The run's history as it happens: each finished operation is one JSON line, written at once.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use crate::history::{Op, OpKind, Outcome};

pub struct Recorder {
    start: Instant,
    next_id: AtomicU64,
    file: Mutex<std::io::BufWriter<std::fs::File>>,
    ops: Mutex<Vec<Op>>,
}

impl Recorder {
    pub fn create(path: &std::path::Path) -> std::io::Result<Recorder> {
        Ok(Recorder {
            start: Instant::now(),
            next_id: AtomicU64::new(1),
            file: Mutex::new(std::io::BufWriter::new(std::fs::File::create(path)?)),
            ops: Mutex::new(Vec::new()),
        })
    }

    /// Milliseconds since the run began.
    pub fn now(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    pub fn record(&self, process: &str, invoked_ms: u64, outcome: Outcome, kind: OpKind) {
        let op = Op {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            process: process.to_owned(),
            invoked_ms,
            completed_ms: self.now(),
            outcome,
            kind,
        };
        if let Ok(line) = serde_json::to_string(&op) {
            let mut f = self.file.lock().unwrap_or_else(|p| p.into_inner());
            let _ = writeln!(f, "{line}");
        }
        self.ops.lock().unwrap_or_else(|p| p.into_inner()).push(op);
    }

    /// Everything recorded, the file flushed.
    pub fn finish(&self) -> Vec<Op> {
        let _ = self.file.lock().unwrap_or_else(|p| p.into_inner()).flush();
        std::mem::take(&mut *self.ops.lock().unwrap_or_else(|p| p.into_inner()))
    }
}
