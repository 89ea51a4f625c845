//! Helpers shared by the embedded engine's scenario tests.

use oncelog_protocol::Offset;

use super::EmbeddedEngine;
use oncelog_storage::Engine;

/// Copies a data directory, as a crashed process would have left it (the copy has no lock
/// holder, so it can be reopened while the original engine is still alive).
pub(super) fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    for entry in std::fs::read_dir(from).expect("read_dir") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("type").is_dir() {
            std::fs::create_dir_all(&target).expect("mkdir");
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy");
        }
    }
}

/// Reads a whole stream in small pages, so paging and segment boundaries are exercised.
pub(super) async fn read_all(e: &EmbeddedEngine, path: &str, page: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let mut at = Offset::ZERO;
    loop {
        let c = e.read(path, at, page, 0).await.expect("read");
        out.extend_from_slice(&c.data);
        at = c.next;
        if c.up_to_date() {
            return out;
        }
    }
}
