//! Bytes an engine returns that are a range of a file, mapped read-only into memory, and the
//! registry that lets the HTTP layer find the file behind them: a plain socket then sends them
//! with `sendfile(2)` from the page cache (no copy through user memory), while every other
//! consumer (TLS, HTTP/2, a test) just reads the memory.
//!
//! Why a registry keyed by address: hyper hands a connection's writer only byte slices, so the
//! writer recognises a body slice by the address range it lies in. A range is registered for
//! exactly as long as its mapping lives (the guard is dropped before the memory is unmapped),
//! so an address found here is never a reused one.

use std::collections::BTreeMap;
use std::fs::File;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

struct Entry {
    len: usize,
    file: Arc<File>,
    offset: u64,
}

/// Live ranges by start address.
static LIVE: Mutex<BTreeMap<usize, Entry>> = Mutex::new(BTreeMap::new());
/// How many ranges are live: writers skip the lock when none is.
static COUNT: AtomicUsize = AtomicUsize::new(0);

/// Slices shorter than this are never looked up: for them a copy costs less than the lookup
/// and a system call of their own (and the small writes of live readers stay lock-free).
pub const LOOKUP_MIN: usize = 16 * 1024;

/// Keeps a range registered; dropping it ends the registration.
#[must_use = "the range is unregistered when this is dropped"]
pub struct Registration {
    start: usize,
}

/// Registers `len` bytes at `ptr` as the contents of `file` from `offset`.
///
/// The caller promises that the memory holds exactly those file bytes, unchanged, for as long as
/// the returned guard lives, and that it drops the guard before the memory goes.
pub fn register(ptr: *const u8, len: usize, file: Arc<File>, offset: u64) -> Registration {
    let start = ptr as usize;
    if let Ok(mut live) = LIVE.lock() {
        live.insert(start, Entry { len, file, offset });
        COUNT.fetch_add(1, Ordering::Release);
    }
    Registration { start }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Ok(mut live) = LIVE.lock() {
            if live.remove(&self.start).is_some() {
                COUNT.fetch_sub(1, Ordering::Release);
            }
        }
    }
}

/// Where the bytes of `slice` are in a file.
pub struct FileSpan {
    pub file: Arc<File>,
    pub offset: u64,
}

/// The file range behind `slice`, when all of it lies inside one registered range (and it is at
/// least [`LOOKUP_MIN`] long); `None`: write its bytes.
pub fn lookup(slice: &[u8]) -> Option<FileSpan> {
    if slice.len() < LOOKUP_MIN || COUNT.load(Ordering::Acquire) == 0 {
        return None;
    }
    let at = slice.as_ptr() as usize;
    let live = LIVE.lock().ok()?;
    let (start, e) = live.range(..=at).next_back()?;
    let inside = at - start;
    (inside.checked_add(slice.len())? <= e.len)
        .then(|| FileSpan { file: e.file.clone(), offset: e.offset + inside as u64 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slice_is_found_only_inside_a_live_range() {
        let file = Arc::new(tempfile_like());
        let memory = vec![7u8; 100_000];
        let reg = register(memory.as_ptr(), 60_000, file.clone(), 1_000);
        let found = lookup(&memory[100..40_000]).expect("inside");
        assert_eq!(found.offset, 1_100);
        assert!(lookup(&memory[100..60_000]).is_some(), "up to the range's end");
        assert!(lookup(&memory[100..60_001]).is_none(), "past the range's end");
        assert!(lookup(&memory[..LOOKUP_MIN - 1]).is_none(), "too short to look up");
        drop(reg);
        assert!(lookup(&memory[100..40_000]).is_none(), "gone with its registration");
    }

    fn tempfile_like() -> File {
        File::open("/proc/self/stat").expect("a file to name")
    }
}
