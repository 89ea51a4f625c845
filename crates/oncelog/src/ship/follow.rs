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
//! - **Partial line**: bytes after the last newline wait for their newline, and are not read
//!   again at every poll: how far they were searched for a newline is kept. In a file that was
//!   rotated away, a last line that never got one is shipped with a newline added.
//! - **Long line** (longer than `--max-line-bytes`, newline included): `--on-long-line` says what
//!   happens. `stop` fails at once, naming its offset and length; `split` hands it out in pieces
//!   of `--max-line-bytes` (each a batch of its own, exactly once as batches are); `skip` moves
//!   the cursor past it once its newline has arrived (the caller records that). The line is never
//!   held in memory whole: it is searched for its newline a chunk at a time.
//! - **Not a regular file**: FILE (or what a symbolic link at FILE points to, which is fine) must
//!   be a regular file; a FIFO, device or directory is refused, opened without waiting for a
//!   FIFO's writer.
//! - **Restart**: [`Follower::resume`] finds the cursor's file under FILE, or, when FILE was
//!   rotated while the shipper was stopped, in FILE's directory by its identity, and finishes it
//!   first.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use std::os::unix::fs::OpenOptionsExt;

use super::state::{Cursor, FileId, HEAD_BYTES};
use super::{OnLongLine, ShipError};

/// What one look at the file found.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// Whole lines (newline included) from the cursor's old position; the cursor moved past them.
    Lines(Vec<u8>),
    /// The cursor moved to another file or back to the start, with nothing to send: persist it.
    Moved,
    /// A line longer than the limit (`--on-long-line skip`), `len` bytes from `offset`, newline
    /// included: the cursor moved past it. Persist it, so a restart does not read it again.
    Skipped { offset: u64, len: u64 },
    /// Nothing new.
    Idle,
}

/// Limits of one look.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Most bytes handed out at once (a longer line goes alone).
    pub batch_bytes: usize,
    /// Longest line, newline included; a longer one is what `on_long_line` says. At least
    /// `batch_bytes`.
    pub max_line_bytes: usize,
    pub on_long_line: OnLongLine,
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
    /// Bytes from the cursor known to hold no newline: a line still being written (or one too
    /// long that waits for its newline to be skipped) is searched from here at the next look, not
    /// read again from its start. 0 whenever the cursor moves.
    scanned: u64,
}

impl Follower {
    /// Picks up where `cursor` left off: in FILE if it is still the same file with the same
    /// content, else in the rotated file found in FILE's directory, else at the start of FILE.
    pub fn resume(path: PathBuf, cursor: Cursor) -> Result<Follower, ShipError> {
        let mut f = Follower { path, open: None, cursor: Cursor::default(), rotated_at: None, scanned: 0 };
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
            tracing::warn!(
                file = %f.path.display(),
                position = cursor.position,
                "{} was replaced while the shipper was stopped and the old file is gone: anything it held after byte {} was not shipped",
                f.path.display(),
                cursor.position
            );
            return Ok(f);
        };
        f.open = Some(file);
        f.cursor = cursor;
        Ok(f)
    }

    /// FILE, as given.
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn cursor(&self) -> &Cursor {
        &self.cursor
    }

    /// Bytes of the open file not handed out yet (what the shipper lags behind it); 0 before
    /// FILE exists.
    pub fn lag(&self) -> u64 {
        let Some(file) = &self.open else { return 0 };
        file.metadata().map_or(0, |m| m.len().saturating_sub(self.cursor.position))
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
            let (lines, skip) = match read_lines(file, pos, size, limits, &mut self.scanned).map_err(io)? {
                Read::Lines(lines) => (lines, 0),
                Read::Skip(len) => (Vec::new(), len),
                Read::Unfinished => (Vec::new(), 0),
                Read::TooLong { len, seen } => return Err(self.too_long(len, seen, limits)),
                Read::Truncated => return Ok(self.restart_file()),
            };
            // Checked again after the read: bytes read across a truncation are not trusted.
            let now = file.metadata().map_err(io)?.len();
            let end = pos + lines.len() as u64 + skip;
            if now < end || !self.intact(file, now).map_err(io)? {
                return Ok(self.restart_file());
            }
            if skip > 0 {
                if !skip_head(file, &mut self.cursor, skip).map_err(io)? {
                    return Ok(self.restart_file());
                }
                self.rotated_at = None;
                self.scanned = 0;
                return Ok(Step::Skipped { offset: pos, len: skip });
            }
            if !lines.is_empty() {
                self.rotated_at = None;
                self.scanned = 0;
                self.cursor.advance(&lines);
                return Ok(Step::Lines(lines));
            }
        }
        self.rotation(size, limits)
    }

    /// The error for a line longer than the limit at the cursor (`--on-long-line stop`).
    fn too_long(&self, len: Option<u64>, seen: u64, limits: Limits) -> ShipError {
        ShipError::LineTooLong {
            path: self.path.clone(),
            offset: self.cursor.position,
            len,
            seen,
            max: limits.max_line_bytes,
        }
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
        tracing::warn!(file = %self.path.display(), "{} was truncated; reading it again from the start", self.path.display());
        self.cursor.position = 0;
        self.cursor.head.clear();
        self.rotated_at = None;
        self.scanned = 0;
        Step::Moved
    }

    /// At the end of the open file: has FILE been rotated away from it?
    fn rotation(&mut self, size: u64, limits: Limits) -> Result<Step, ShipError> {
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
            let io = |source| ShipError::Io { path: self.path.clone(), source };
            let Some(file) = &self.open else { return Ok(Step::Idle) };
            let len = size - pos;
            let max = limits.max_line_bytes as u64;
            // With the newline added it would be longer than the limit.
            if len >= max {
                match limits.on_long_line {
                    OnLongLine::Stop => return Err(self.too_long(Some(len + 1), len, limits)),
                    OnLongLine::Skip => {
                        if !skip_head(file, &mut self.cursor, len).map_err(io)? {
                            return Ok(Step::Idle);
                        }
                        self.scanned = 0;
                        return Ok(Step::Skipped { offset: pos, len });
                    }
                    OnLongLine::Split => {
                        // A piece now; the rest, shorter, at the next look.
                        let mut piece = vec![0; limits.max_line_bytes];
                        file.read_exact_at(&mut piece, pos).map_err(io)?;
                        self.scanned = 0;
                        self.cursor.advance(&piece);
                        return Ok(Step::Lines(piece));
                    }
                }
            }
            let mut rest = vec![0; usize::try_from(len).unwrap_or(usize::MAX)];
            file.read_exact_at(&mut rest, pos).map_err(io)?;
            tracing::info!(file = %self.path.display(), "the rotated file's last line had no newline; shipped with one added");
            self.scanned = 0;
            self.cursor.advance(&rest);
            rest.push(b'\n');
            return Ok(Step::Lines(rest));
        }
        self.open = None;
        self.rotated_at = None;
        self.scanned = 0;
        self.cursor = Cursor::default();
        self.open_file(Step::Moved)
    }

    /// Opens FILE to read it from its start; `missing` when it does not exist.
    fn open_file(&mut self, missing: Step) -> Result<Step, ShipError> {
        match open_log(&self.path) {
            Ok(file) => {
                let meta = file.metadata().map_err(|source| ShipError::Io { path: self.path.clone(), source })?;
                if !meta.is_file() {
                    return Err(ShipError::NotRegular {
                        path: self.path.clone(),
                        what: super::state::kind(&meta.file_type()),
                        why: "`oncelog ship` follows a regular file (a symbolic link to one is fine)",
                    });
                }
                self.cursor = Cursor { file: Some(FileId::of(&meta)), position: 0, head: Vec::new() };
                self.open = Some(file);
                self.scanned = 0;
                Ok(Step::Moved)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(missing),
            Err(source) => Err(ShipError::Io { path: self.path.clone(), source }),
        }
    }
}

/// Opens a log file (through a symbolic link, as `tail -F` does) without waiting for a writer
/// when it is a FIFO (`O_NONBLOCK`, which regular files ignore): the caller looks at what it is.
fn open_log(path: &Path) -> std::io::Result<File> {
    std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path)
}

/// Moves `cursor` past `len` bytes of `file` without handing them out, reading only what its
/// head still lacks; `false` when the file ended first (truncated meanwhile).
fn skip_head(file: &File, cursor: &mut Cursor, len: u64) -> std::io::Result<bool> {
    let room = (HEAD_BYTES.saturating_sub(cursor.head.len()) as u64).min(len);
    let mut head = vec![0; room as usize];
    if !read_at(file, &mut head, cursor.position)? {
        return Ok(false);
    }
    cursor.head.extend_from_slice(&head);
    cursor.position += len;
    Ok(true)
}

/// What [`read_lines`] found.
enum Read {
    /// Whole lines, newline included, or (`--on-long-line split`) a piece of a long line.
    Lines(Vec<u8>),
    /// A line whose newline has not arrived yet.
    Unfinished,
    /// A line longer than `max_line_bytes`, this long (newline included), to skip.
    Skip(u64),
    /// A line longer than `max_line_bytes` (`--on-long-line stop`): its length, newline
    /// included, when its newline is in the file; `seen`, the bytes of it in the file.
    TooLong { len: Option<u64>, seen: u64 },
    /// The file turned out shorter than its size said: truncated meanwhile.
    Truncated,
}

/// How much of a long line is read at once while its newline is searched for.
const SCAN_CHUNK: u64 = 64 << 10;

/// The whole lines from `pos`: up to `batch_bytes` of them, or one longer line (up to
/// `max_line_bytes`, which is at least `batch_bytes`), or what `on_long_line` says of a line
/// longer still. `scanned`: bytes from `pos` already known to hold no newline (kept up to date).
fn read_lines(file: &File, pos: u64, size: u64, limits: Limits, scanned: &mut u64) -> std::io::Result<Read> {
    if pos + *scanned > size {
        return Ok(Read::Truncated);
    }
    let available = size - pos;
    let max = limits.max_line_bytes as u64;
    if *scanned == 0 {
        let want = available.min(limits.batch_bytes as u64) as usize;
        let mut buf = vec![0; want];
        if !read_at(file, &mut buf, pos)? {
            return Ok(Read::Truncated);
        }
        if let Some(i) = buf.iter().rposition(|&b| b == b'\n') {
            buf.truncate(i + 1);
            return Ok(Read::Lines(buf));
        }
        *scanned = want as u64;
    }
    // A line longer than a batch, or one still being written: its newline is searched for in
    // the bytes not searched yet, as far as the policy needs (`split` only to the limit; the
    // others to the end, to tell the line's length).
    let until = match limits.on_long_line {
        OnLongLine::Split => size.min(pos + max),
        OnLongLine::Stop | OnLongLine::Skip => size,
    };
    let mut chunk = Vec::new();
    let mut newline = None;
    while pos + *scanned < until {
        let at = pos + *scanned;
        chunk.resize((until - at).min(SCAN_CHUNK) as usize, 0);
        if !read_at(file, &mut chunk, at)? {
            return Ok(Read::Truncated);
        }
        if let Some(i) = chunk.iter().position(|&b| b == b'\n') {
            newline = Some(*scanned + i as u64);
            break;
        }
        *scanned += chunk.len() as u64;
    }
    match newline {
        Some(i) if i < max => {
            let mut line = vec![0; i as usize + 1];
            if !read_at(file, &mut line, pos)? {
                return Ok(Read::Truncated);
            }
            Ok(Read::Lines(line))
        }
        Some(i) => match limits.on_long_line {
            OnLongLine::Skip => Ok(Read::Skip(i + 1)),
            // (`split` searched only up to the limit.)
            OnLongLine::Stop | OnLongLine::Split => Ok(Read::TooLong { len: Some(i + 1), seen: available }),
        },
        None if *scanned >= max => match limits.on_long_line {
            OnLongLine::Stop => Ok(Read::TooLong { len: None, seen: available }),
            // Its newline has not arrived: it is skipped once it has.
            OnLongLine::Skip => Ok(Read::Unfinished),
            OnLongLine::Split => {
                let mut piece = vec![0; limits.max_line_bytes];
                if !read_at(file, &mut piece, pos)? {
                    return Ok(Read::Truncated);
                }
                Ok(Read::Lines(piece))
            }
        },
        None => Ok(Read::Unfinished),
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
    let file = open_log(path).ok()?;
    let meta = file.metadata().ok()?;
    (meta.is_file() && FileId::of(&meta) == id).then_some(file)
}

/// The file `id` under another name in FILE's directory (where rotation renames it), opened.
fn find_in_dir(path: &Path, id: FileId) -> std::io::Result<Option<File>> {
    for entry in std::fs::read_dir(dir_of(path))? {
        let entry = entry?;
        let Ok(meta) = entry.metadata() else { continue };
        if meta.is_file() && FileId::of(&meta) == id {
            if let Ok(file) = open_log(&entry.path()) {
                // Opened by name: make sure the name still meant that file.
                if file.metadata().map(|m| m.is_file() && FileId::of(&m) == id).unwrap_or(false) {
                    tracing::info!(
                        file = %entry.path().display(),
                        "finishing {} (rotated while the shipper was stopped)",
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

    const LIMITS: Limits = Limits { batch_bytes: 64, max_line_bytes: 1024, on_long_line: OnLongLine::Stop };

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
        drain_with(f, LIMITS).0
    }

    /// Steps until idle, collecting the lines and the skips.
    fn drain_with(f: &mut Follower, limits: Limits) -> (Vec<u8>, Vec<(u64, u64)>) {
        let (mut out, mut skips) = (Vec::new(), Vec::new());
        for _ in 0..100 {
            match f.step(limits).expect("step") {
                Step::Lines(l) => out.extend_from_slice(&l),
                Step::Skipped { offset, len } => skips.push((offset, len)),
                Step::Moved => {}
                Step::Idle => return (out, skips),
            }
        }
        panic!("never idle");
    }

    #[test]
    fn a_line_still_being_written_is_searched_from_where_the_last_look_stopped() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("app.log");
        append(&log, b"one\n");
        let mut f = Follower::resume(log.clone(), Cursor::default()).expect("follower");
        assert_eq!(drain(&mut f), b"one\n");
        // Longer than a batch, no newline yet: searched once, not read again at every look.
        append(&log, &[b'x'; 500]);
        assert_eq!(drain(&mut f), b"");
        assert_eq!(f.scanned, 500);
        // Proof that the searched bytes are not read again: a newline put among them in place
        // (no logger does that) goes unseen.
        std::fs::OpenOptions::new().write(true).open(&log).expect("open").write_all_at(b"\n", 300).expect("write");
        append(&log, &[b'y'; 100]);
        assert_eq!(drain(&mut f), b"");
        assert_eq!(f.scanned, 600);
        append(&log, b"\ntwo\n");
        let mut line = [[b'x'; 500].as_slice(), &[b'y'; 100], b"\n"].concat();
        line[300 - 4] = b'\n';
        assert_eq!(drain(&mut f), [line.as_slice(), b"two\n"].concat());
        assert_eq!(f.scanned, 0);
    }

    #[test]
    fn a_long_line_stops_splits_or_is_skipped() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("app.log");
        let long = [vec![b'z'; 2500], b"\n".to_vec()].concat();
        append(&log, &[b"a\n".as_slice(), &long, b"b\n"].concat());
        let limits = |on_long_line| Limits { on_long_line, ..LIMITS };

        let mut f = Follower::resume(log.clone(), Cursor::default()).expect("follower");
        assert_eq!(f.step(LIMITS).expect("step"), Step::Moved);
        assert_eq!(f.step(LIMITS).expect("step"), Step::Lines(b"a\n".to_vec()));
        match f.step(LIMITS) {
            Err(ShipError::LineTooLong { offset: 2, len: Some(2501), max: 1024, .. }) => {}
            other => panic!("{other:?}"),
        }

        let mut f = Follower::resume(log.clone(), Cursor::default()).expect("follower");
        let (got, skips) = drain_with(&mut f, limits(OnLongLine::Split));
        assert_eq!(got, std::fs::read(&log).expect("read"));
        assert!(skips.is_empty());

        let mut f = Follower::resume(log.clone(), Cursor::default()).expect("follower");
        let (got, skips) = drain_with(&mut f, limits(OnLongLine::Skip));
        assert_eq!((got.as_slice(), skips.as_slice()), (b"a\nb\n".as_slice(), [(2, 2501)].as_slice()));
        // Resumed from the cursor after the skip: nothing again.
        let mut f = Follower::resume(log.clone(), f.cursor().clone()).expect("follower");
        assert_eq!(drain_with(&mut f, limits(OnLongLine::Skip)), (Vec::new(), Vec::new()));
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
