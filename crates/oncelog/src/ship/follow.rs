//! Following FILE as `tail -F` does, in whole lines, with a cursor that says exactly which bytes
//! of which file have been handed out.
//!
//! - **Rename** (logrotate's default, `create`): the file open is kept. Once FILE names another
//!   file and the old one has been quiet for one poll (the application may still finish a line
//!   in it), the old file is read to its end and the new one from its start.
//! - **Truncation** (`copytruncate`): the file is shorter than the position, or its first bytes
//!   changed (it was truncated and written past the position between two looks): reading starts
//!   again at 0. Bytes read in the same look as a truncation are dropped rather than trusted,
//!   since they may be new content read from the old position.
//! - **Partial line**: bytes after the last newline wait for their newline. In a file that was
//!   rotated away, a last line that never got one is shipped with a newline added.
//! - **Restart**: [`Follower::resume`] finds the cursor's file under FILE, or, when FILE was
//!   rotated while the shipper was stopped, in FILE's directory by its identity, and finishes it
//!   first.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::state::{Cursor, FileId};
use super::ShipError;

/// What one look at the file found.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// Whole lines (newline included) from the cursor's old position; the cursor moved past them.
    Lines(Vec<u8>),
    /// The cursor moved to another file or back to the start, with nothing to send: persist it.
    Moved,
    /// Nothing new.
    Idle,
}

/// Limits of one look.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Most bytes handed out at once (a longer line goes alone).
    pub batch_bytes: usize,
    /// Longest line, newline included; a longer one stops the shipper. At least `batch_bytes`.
    pub max_line_bytes: usize,
}

pub struct Follower {
    /// FILE, as given.
    path: PathBuf,
    /// The file the cursor is in, open; `None` until FILE exists.
    open: Option<File>,
    /// Where reading goes on.
    cursor: Cursor,
    /// The old file's size when FILE was first seen to name another file (a rotation waits for
    /// one quiet poll).
    rotated_at: Option<u64>,
}

impl Follower {
    /// Picks up where `cursor` left off: in FILE if it is still the same file with the same
    /// content, else in the rotated file found in FILE's directory, else at the start of FILE.
    pub fn resume(path: PathBuf, cursor: Cursor) -> Result<Follower, ShipError> {
        let mut f = Follower { path, open: None, cursor: Cursor::default(), rotated_at: None };
        let Some(id) = cursor.file else {
            return Ok(f);
        };
        let found = match same_file(&f.path, id) {
            Some(file) => Some(file),
            None => {
                find_in_dir(&f.path, id).map_err(|source| ShipError::Io { path: dir_of(&f.path).to_owned(), source })?
            }
        };
        let Some(file) = found else {
            eprintln!(
                "oncelog ship: {} was replaced while the shipper was stopped and the old file is gone: anything it held after byte {} was not shipped",
                f.path.display(),
                cursor.position
            );
            return Ok(f);
        };
        f.open = Some(file);
        f.cursor = cursor;
        Ok(f)
    }

    pub fn cursor(&self) -> &Cursor {
        &self.cursor
    }

    /// One look: new lines, a move to another file or back to the start, or nothing.
    pub fn step(&mut self, limits: Limits) -> Result<Step, ShipError> {
        let io = |source| ShipError::Io { path: self.path.clone(), source };
        let Some(file) = &self.open else {
            return self.open_file(Step::Idle);
        };
        let size = file.metadata().map_err(io)?.len();
        if !self.intact(file, size).map_err(io)? {
            return Ok(self.restart_file());
        }
        let pos = self.cursor.position;
        if size > pos {
            let lines = match read_lines(file, pos, size, limits).map_err(io)? {
                Read::Lines(lines) => lines,
                Read::Unfinished => Vec::new(),
                Read::TooLong => {
                    return Err(ShipError::LineTooLong { path: self.path.clone(), max: limits.max_line_bytes })
                }
                Read::Truncated => return Ok(self.restart_file()),
            };
            // Checked again after the read: bytes read across a truncation are not trusted.
            let now = file.metadata().map_err(io)?.len();
            if now < pos + lines.len() as u64 || !self.intact(file, now).map_err(io)? {
                return Ok(self.restart_file());
            }
            if !lines.is_empty() {
                self.rotated_at = None;
                self.cursor.advance(&lines);
                return Ok(Step::Lines(lines));
            }
        }
        self.rotation(size)
    }

    /// Whether the open file still holds what the cursor says was read: not shorter than the
    /// position, and its first bytes unchanged.
    fn intact(&self, file: &File, size: u64) -> std::io::Result<bool> {
        if size < self.cursor.position {
            return Ok(false);
        }
        let mut head = vec![0; self.cursor.head.len()];
        match file.read_exact_at(&mut head, 0) {
            Ok(()) => Ok(head == self.cursor.head),
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The file was truncated (or rewritten): its new content is read from the start.
    fn restart_file(&mut self) -> Step {
        eprintln!("oncelog ship: {} was truncated; reading it again from the start", self.path.display());
        self.cursor.position = 0;
        self.cursor.head.clear();
        self.rotated_at = None;
        Step::Moved
    }

    /// At the end of the open file: has FILE been rotated away from it?
    fn rotation(&mut self, size: u64) -> Result<Step, ShipError> {
        let renamed = match std::fs::metadata(&self.path) {
            Ok(meta) => Some(FileId::of(&meta)) != self.cursor.file,
            // Between the rename and the new file's creation: keep reading the old one.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
            Err(source) => return Err(ShipError::Io { path: self.path.clone(), source }),
        };
        if !renamed {
            self.rotated_at = None;
            return Ok(Step::Idle);
        }
        if self.rotated_at != Some(size) {
            // First seen, or the old file still grows: give it one more poll.
            self.rotated_at = Some(size);
            return Ok(Step::Idle);
        }
        let pos = self.cursor.position;
        if size > pos {
            // A last line without newline: it will not get one any more.
            let mut rest = vec![0; usize::try_from(size - pos).unwrap_or(usize::MAX)];
            let Some(file) = &self.open else { return Ok(Step::Idle) };
            file.read_exact_at(&mut rest, pos).map_err(|source| ShipError::Io { path: self.path.clone(), source })?;
            eprintln!("oncelog ship: the rotated file's last line had no newline; shipped with one added");
            self.cursor.advance(&rest);
            rest.push(b'\n');
            return Ok(Step::Lines(rest));
        }
        self.open = None;
        self.rotated_at = None;
        self.cursor = Cursor::default();
        self.open_file(Step::Moved)
    }

    /// Opens FILE to read it from its start; `missing` when it does not exist.
    fn open_file(&mut self, missing: Step) -> Result<Step, ShipError> {
        match File::open(&self.path) {
            Ok(file) => {
                let meta = file.metadata().map_err(|source| ShipError::Io { path: self.path.clone(), source })?;
                self.cursor = Cursor { file: Some(FileId::of(&meta)), position: 0, head: Vec::new() };
                self.open = Some(file);
                Ok(Step::Moved)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(missing),
            Err(source) => Err(ShipError::Io { path: self.path.clone(), source }),
        }
    }
}

/// What [`read_lines`] found.
enum Read {
    /// Whole lines, newline included.
    Lines(Vec<u8>),
    /// A line whose newline has not arrived yet.
    Unfinished,
    /// A line longer than `max_line_bytes`.
    TooLong,
    /// The file turned out shorter than its size said: truncated meanwhile.
    Truncated,
}

/// The whole lines from `pos`: up to `batch_bytes` of them, or one longer line (up to
/// `max_line_bytes`, which is at least `batch_bytes`).
fn read_lines(file: &File, pos: u64, size: u64, limits: Limits) -> std::io::Result<Read> {
    let available = size - pos;
    let want = available.min(limits.batch_bytes as u64) as usize;
    let mut buf = vec![0; want];
    if !read_at(file, &mut buf, pos)? {
        return Ok(Read::Truncated);
    }
    if let Some(i) = buf.iter().rposition(|&b| b == b'\n') {
        buf.truncate(i + 1);
        return Ok(Read::Lines(buf));
    }
    if available == want as u64 {
        return Ok(Read::Unfinished);
    }
    // A line longer than a batch: read on to its newline, within the line limit.
    let longest = available.min(limits.max_line_bytes as u64 + 1) as usize;
    let mut line = vec![0; longest];
    if !read_at(file, &mut line, pos)? {
        return Ok(Read::Truncated);
    }
    match line.iter().position(|&b| b == b'\n') {
        Some(i) if i < limits.max_line_bytes => {
            line.truncate(i + 1);
            Ok(Read::Lines(line))
        }
        _ if longest > limits.max_line_bytes => Ok(Read::TooLong),
        _ => Ok(Read::Unfinished),
    }
}

/// Fills `buf` from `pos`; `false` when the file ends first.
fn read_at(file: &File, buf: &mut [u8], pos: u64) -> std::io::Result<bool> {
    match file.read_exact_at(buf, pos) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(false),
        Err(e) => Err(e),
    }
}

/// FILE, opened, if it is the file `id`.
fn same_file(path: &Path, id: FileId) -> Option<File> {
    let file = File::open(path).ok()?;
    let meta = file.metadata().ok()?;
    (FileId::of(&meta) == id).then_some(file)
}

/// The file `id` under another name in FILE's directory (where rotation renames it), opened.
fn find_in_dir(path: &Path, id: FileId) -> std::io::Result<Option<File>> {
    for entry in std::fs::read_dir(dir_of(path))? {
        let entry = entry?;
        let Ok(meta) = entry.metadata() else { continue };
        if meta.is_file() && FileId::of(&meta) == id {
            if let Ok(file) = File::open(entry.path()) {
                // Opened by name: make sure the name still meant that file.
                if file.metadata().map(|m| FileId::of(&m) == id).unwrap_or(false) {
                    eprintln!(
                        "oncelog ship: finishing {} (rotated while the shipper was stopped)",
                        entry.path().display()
                    );
                    return Ok(Some(file));
                }
            }
        }
    }
    Ok(None)
}

fn dir_of(path: &Path) -> &Path {
    path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    const LIMITS: Limits = Limits { batch_bytes: 64, max_line_bytes: 1024 };

    fn append(path: &Path, bytes: &[u8]) {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .expect("open")
            .write_all(bytes)
            .expect("write");
    }

    /// Steps until idle, collecting the lines.
    fn drain(f: &mut Follower) -> Vec<u8> {
        let mut out = Vec::new();
        for _ in 0..100 {
            match f.step(LIMITS).expect("step") {
                Step::Lines(l) => out.extend_from_slice(&l),
                Step::Moved => {}
                Step::Idle => return out,
            }
        }
        panic!("never idle");
    }

    #[test]
    fn lines_wait_for_their_newline_and_batches_end_at_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("app.log");
        let mut f = Follower::resume(log.clone(), Cursor::default()).expect("follower");
        assert_eq!(f.step(LIMITS).expect("step"), Step::Idle, "no file yet");
        append(&log, b"one\ntw");
        assert_eq!(drain(&mut f), b"one\n");
        append(&log, b"o\n");
        assert_eq!(drain(&mut f), b"two\n");
        // More than a batch: cut at a newline.
        let many: Vec<u8> = (0..20).flat_map(|i| format!("line {i:02}\n").into_bytes()).collect();
        append(&log, &many);
        let Step::Lines(first) = f.step(LIMITS).expect("step") else { panic!("lines") };
        assert!(first.len() <= 64 && first.ends_with(b"\n"));
        assert_eq!([first, drain(&mut f)].concat(), many);
    }

    #[test]
    fn a_truncated_file_is_read_again_from_its_start_even_when_it_grew_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("app.log");
        append(&log, b"old 1\nold 2\n");
        let mut f = Follower::resume(log.clone(), Cursor::default()).expect("follower");
        assert_eq!(drain(&mut f), b"old 1\nold 2\n");
        // Truncated and written past the old position before the next look.
        std::fs::OpenOptions::new().write(true).open(&log).expect("open").set_len(0).expect("truncate");
        append(&log, b"new 1\nnew 2\nnew 3\n");
        assert_eq!(drain(&mut f), b"new 1\nnew 2\nnew 3\n");
        // And across a restart: the cursor's head does not match the content any more.
        let cursor = f.cursor().clone();
        std::fs::OpenOptions::new().write(true).open(&log).expect("open").set_len(0).expect("truncate");
        append(&log, b"newer 1\nnewer 2\nnewer 3\n");
        let mut f = Follower::resume(log.clone(), cursor).expect("follower");
        assert_eq!(drain(&mut f), b"newer 1\nnewer 2\nnewer 3\n");
    }

    #[test]
    fn a_renamed_file_is_finished_before_the_new_one_also_after_a_restart() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("app.log");
        append(&log, b"a\n");
        let mut f = Follower::resume(log.clone(), Cursor::default()).expect("follower");
        assert_eq!(drain(&mut f), b"a\n");
        append(&log, b"b\nunfinished");
        std::fs::rename(&log, dir.path().join("app.log.1")).expect("rename");
        append(&log, b"c\n");
        let mut got = Vec::new();
        for _ in 0..5 {
            got.extend(drain(&mut f));
        }
        assert_eq!(got, b"b\nunfinished\nc\n");
        // Stopped at this cursor; rotated again meanwhile; resumed: the rest of the old file first.
        append(&log, b"d\n");
        let cursor = f.cursor().clone();
        std::fs::rename(dir.path().join("app.log.1"), dir.path().join("app.log.2")).expect("rename");
        std::fs::rename(&log, dir.path().join("app.log.1")).expect("rename");
        append(&log, b"e\n");
        let mut f = Follower::resume(log.clone(), cursor).expect("follower");
        let mut got = Vec::new();
        for _ in 0..5 {
            got.extend(drain(&mut f));
        }
        assert_eq!(got, b"d\ne\n");
    }
}
