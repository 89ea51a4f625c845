//! Helpers shared by the embedded engine's scenario tests.

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
            copy_sparse(&entry.path(), &target);
        }
    }
}

/// Copies a file leaving its zero blocks as holes: fjall preallocates each journal to 64 MiB
/// with `set_len`, and a plain copy would write all of it (tests must not need much free disk).
fn copy_sparse(from: &std::path::Path, to: &std::path::Path) {
    use std::io::{Read, Seek, SeekFrom, Write};
    const BLOCK: usize = 64 << 10;
    let mut src = std::fs::File::open(from).expect("open source");
    let len = src.metadata().expect("metadata").len();
    let mut dst = std::fs::File::create(to).expect("create copy");
    let mut buf = vec![0u8; BLOCK];
    loop {
        let n = src.read(&mut buf).expect("read");
        if n == 0 {
            break;
        }
        if buf[..n].iter().all(|b| *b == 0) {
            dst.seek(SeekFrom::Current(n as i64)).expect("seek");
        } else {
            dst.write_all(&buf[..n]).expect("write");
        }
    }
    dst.set_len(len).expect("set_len");
}

/// Overwrites `bytes` at `at` in place (no rewrite of the whole file).
pub(super) fn write_at(path: &std::path::Path, at: u64, bytes: &[u8]) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(path).expect("open for writing");
    f.write_all_at(bytes, at).expect("write in place");
}
