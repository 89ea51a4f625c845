//! The state file of `oncelog ship`: where in which file the shipper stands, and the one batch
//! that may be on its way to the server.
//!
//! ```text
//! oncelog-ship 1
//! instance 0190c8e2-7b1f-7c3a-9d2e-4f5a6b7c8d9e
//! stream logs/app
//! batch 42
//! file 2049 1234567
//! position 12345
//! head 6c696e652030303030300a
//! pending 17 12328
//! <17 raw bytes>
//! ```
//!
//! - `instance`: minted when the file is created; batch `n` is appended with the
//!   `Idempotency-Key` `ship-{instance}-{n}`, so two shippers (two state files) never share keys.
//! - `stream`: the stream the position is in; another stream is refused (its shipper would skip
//!   what this one shipped).
//! - `batch`: the number of the next batch, or of the pending one.
//! - `file DEV INODE` (or `file -` before the file was first seen), `position`: the byte of that
//!   file where reading goes on; `head`: its first bytes (up to [`HEAD_BYTES`], hex), by which a
//!   file truncated and written again past `position` is told from the one that was read.
//! - `pending LEN FROM` + the bytes, last: batch `batch` was about to be sent, or sent without an
//!   answer. The cursor above is where reading goes on *after* it; `FROM` is the position where
//!   it began (in the same file), where reading goes back to when the server refuses the batch
//!   as too large (`413`: nothing was stored). It is written (and synced) before the batch is
//!   sent; on a restart it is sent again with the same key, so the server answers it from the
//!   first attempt if that one landed. (Files written before `FROM` existed have `pending LEN`.)
//!
//! Replaced atomically (write a temporary file beside it, fsync, rename, fsync the directory),
//! so a crash leaves the old state or the new one. Neither the state file nor its temporary
//! file is ever opened through a symbolic link, and the state file is read only when it is a
//! regular file of a size a state can have: a link planted beside the log must not make the
//! shipper overwrite, create or read another file (issue 45).

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::ShipError;

/// How many of a file's first bytes identify its content.
pub const HEAD_BYTES: usize = 256;

const MAGIC: &str = "oncelog-ship 1";

/// Most bytes a state file holds besides its pending batch: the header lines, of which only the
/// stream name can be long. A larger file is not a state of this shipper and is not read.
pub const HEADER_MAX: u64 = 64 << 10;

/// A file by its identity, which a rename keeps and a new file does not share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileId {
    pub dev: u64,
    pub ino: u64,
}

impl FileId {
    pub fn of(meta: &std::fs::Metadata) -> FileId {
        use std::os::unix::fs::MetadataExt;
        FileId { dev: meta.dev(), ino: meta.ino() }
    }
}

/// Where reading goes on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cursor {
    /// The file being followed; `None` before FILE first existed.
    pub file: Option<FileId>,
    /// Bytes of it already shipped (or in the pending batch).
    pub position: u64,
    /// Its first `min(position, HEAD_BYTES)` bytes.
    pub head: Vec<u8>,
}

impl Cursor {
    /// The cursor after `bytes` more of the same file (the head grows until it is full).
    pub fn advance(&mut self, bytes: &[u8]) {
        self.position += bytes.len() as u64;
        let room = HEAD_BYTES.saturating_sub(self.head.len());
        self.head.extend_from_slice(&bytes[..room.min(bytes.len())]);
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct State {
    pub instance: String,
    pub stream: String,
    pub batch: u64,
    pub cursor: Cursor,
    pub pending: Option<Pending>,
}

/// The batch that may be on its way to the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    pub bytes: Vec<u8>,
    /// Where in the cursor's file the batch began; `None` in a state written before this was
    /// recorded.
    pub from: Option<u64>,
}

impl State {
    /// A shipper to `stream` that has shipped nothing.
    pub fn new(stream: &str) -> State {
        State {
            instance: oncelog_client::new_idempotency_key(),
            stream: stream.to_owned(),
            batch: 0,
            cursor: Cursor::default(),
            pending: None,
        }
    }

    /// The `Idempotency-Key` of batch `self.batch`.
    pub fn key(&self) -> String {
        format!("ship-{}-{}", self.instance, self.batch)
    }

    /// The state in `path` of a shipper to `stream`, or a new one when there is no such file.
    /// `max_pending` is the largest batch this shipper sends: a file longer than a state with
    /// such a batch can be is refused before it is read (a link to `/dev/zero` is refused as a
    /// link, a device or FIFO as not a regular file).
    pub fn load(path: &Path, stream: &str, max_pending: usize) -> Result<State, ShipError> {
        if stream.contains('\n') {
            return Err(ShipError::BadState {
                path: path.to_owned(),
                why: "a stream name with a newline cannot be recorded",
            });
        }
        let Some(file) = open_regular(path, OpenOptions::new().read(true))? else {
            return Ok(State::new(stream));
        };
        let io = |source| ShipError::Io { path: path.to_owned(), source };
        let max = HEADER_MAX + max_pending as u64;
        let len = file.metadata().map_err(io)?.len();
        let mut bytes = Vec::new();
        // `take`: the file may grow between the look at its size and the read.
        if len <= max {
            bytes.reserve(len as usize);
            (&file).take(max + 1).read_to_end(&mut bytes).map_err(io)?;
        }
        if len > max || bytes.len() as u64 > max {
            return Err(ShipError::StateTooLarge { path: path.to_owned(), len: len.max(bytes.len() as u64), max });
        }
        let state = State::decode(&bytes).map_err(|why| ShipError::BadState { path: path.to_owned(), why })?;
        if state.stream != stream {
            return Err(ShipError::OtherStream { path: path.to_owned(), stream: state.stream });
        }
        Ok(state)
    }

    /// Replaces `path` with this state, durably.
    pub fn save(&self, path: &Path) -> Result<(), ShipError> {
        let io = |p: &Path| {
            let p = p.to_owned();
            move |source| ShipError::Io { path: p, source }
        };
        let tmp = sibling(path, ".tmp");
        // What a crash left there, or a link planted there, goes (unlink removes a link, never
        // its target); the new file is created only where nothing is (`O_EXCL` also refuses a
        // link planted meanwhile). Only the shipper's user reads it: it holds log lines.
        match std::fs::remove_file(&tmp) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(ShipError::Io { path: tmp, source }),
        }
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)
            .map_err(io(&tmp))?;
        f.write_all(&self.encode()).map_err(io(&tmp))?;
        f.sync_all().map_err(io(&tmp))?;
        std::fs::rename(&tmp, path).map_err(io(path))?;
        // The rename is durable once the directory is synced.
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir))
    }

    fn encode(&self) -> Vec<u8> {
        let file = match self.cursor.file {
            Some(id) => format!("{} {}", id.dev, id.ino),
            None => "-".to_owned(),
        };
        let head: String = self.cursor.head.iter().map(|b| format!("{b:02x}")).collect();
        let mut out = format!(
            "{MAGIC}\ninstance {}\nstream {}\nbatch {}\nfile {file}\nposition {}\nhead {head}\n",
            self.instance, self.stream, self.batch, self.cursor.position
        )
        .into_bytes();
        if let Some(p) = &self.pending {
            let head = match p.from {
                Some(from) => format!("pending {} {from}\n", p.bytes.len()),
                None => format!("pending {}\n", p.bytes.len()),
            };
            out.extend_from_slice(head.as_bytes());
            out.extend_from_slice(&p.bytes);
        }
        out
    }

    fn decode(bytes: &[u8]) -> Result<State, &'static str> {
        let mut rest = bytes;
        let mut line = |key: &str| take_line(&mut rest, key);
        if line("")? != MAGIC {
            return Err("not an `oncelog ship` state file (or another version)");
        }
        let instance = line("instance")?.to_owned();
        if instance.is_empty() || !instance.bytes().all(|b| b.is_ascii_graphic()) {
            return Err("bad instance");
        }
        let stream = line("stream")?.to_owned();
        let number = |t: &str| t.parse::<u64>().map_err(|_| "bad number");
        let batch = number(line("batch")?)?;
        let file = match line("file")? {
            "-" => None,
            t => {
                let (dev, ino) = t.split_once(' ').ok_or("bad file")?;
                Some(FileId { dev: number(dev)?, ino: number(ino)? })
            }
        };
        let position = number(line("position")?)?;
        let hex = line("head")?;
        if hex.len() % 2 != 0 || hex.len() / 2 > HEAD_BYTES {
            return Err("bad head");
        }
        let head = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).map_err(|_| "bad head"))
            .collect::<Result<Vec<u8>, _>>()?;
        if head.len() as u64 != position.min(HEAD_BYTES as u64) {
            return Err("head and position disagree");
        }
        let pending = if rest.is_empty() {
            None
        } else {
            let value = take_line(&mut rest, "pending")?;
            let (len, from) = match value.split_once(' ') {
                Some((len, from)) => (number(len)?, Some(number(from)?)),
                None => (number(value)?, None),
            };
            if rest.len() as u64 != len || len == 0 {
                return Err("the pending batch is cut short");
            }
            if from.is_some_and(|f| f > position) {
                return Err("the pending batch begins after the position");
            }
            Some(Pending { bytes: rest.to_vec(), from })
        };
        Ok(State { instance, stream, batch, cursor: Cursor { file, position, head }, pending })
    }
}

/// The next line of `rest` (taken off it), which must be `key`, a space and a value: the value.
/// An empty `key` takes the whole line.
fn take_line<'a>(rest: &mut &'a [u8], key: &str) -> Result<&'a str, &'static str> {
    let end = rest.iter().position(|&b| b == b'\n').ok_or("cut short")?;
    let text = std::str::from_utf8(&rest[..end]).map_err(|_| "not text")?;
    *rest = &rest[end + 1..];
    if key.is_empty() {
        return Ok(text);
    }
    text.strip_prefix(key).and_then(|t| t.strip_prefix(' ')).ok_or("a line is missing or out of order")
}

/// Opens `path` without following a symbolic link (`O_NOFOLLOW`) or waiting for a FIFO's writer
/// (`O_NONBLOCK`, which regular files ignore), and only if it is a regular file; `None` when
/// there is nothing at `path`. For the shipper's own files: state and lock.
pub fn open_regular(path: &Path, opts: &mut OpenOptions) -> Result<Option<File>, ShipError> {
    let file = match opts.custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK).open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(ShipError::NotRegular { path: path.to_owned(), what: "a symbolic link", why: OWN_FILES })
        }
        Err(source) => return Err(ShipError::Io { path: path.to_owned(), source }),
    };
    let meta = file.metadata().map_err(|source| ShipError::Io { path: path.to_owned(), source })?;
    if !meta.is_file() {
        return Err(ShipError::NotRegular { path: path.to_owned(), what: kind(&meta.file_type()), why: OWN_FILES });
    }
    Ok(Some(file))
}

const OWN_FILES: &str = "the shipper's state and lock files are never followed through a link, nor read from a device";

/// What a file that is not a regular file is, in words.
pub fn kind(t: &std::fs::FileType) -> &'static str {
    if t.is_symlink() {
        "a symbolic link"
    } else if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else {
        "something else"
    }
}

/// `path` with `suffix` added to its file name.
pub fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_reads_back_as_written() {
        let mut s = State::new("logs/app");
        assert_eq!(State::decode(&s.encode()), Ok(s.clone()));
        s.batch = 7;
        s.cursor = Cursor { file: Some(FileId { dev: 2049, ino: 99 }), position: 3, head: b"a\tb".to_vec() };
        s.pending = Some(Pending { bytes: b"line\r\n\xff\nlast\n".to_vec(), from: Some(1) });
        assert_eq!(State::decode(&s.encode()), Ok(s.clone()));
        // As written before `from` was recorded.
        s.pending = Some(Pending { bytes: b"x\n".to_vec(), from: None });
        assert_eq!(State::decode(&s.encode()), Ok(s.clone()));
        s.pending = Some(Pending { bytes: b"line\r\n\xff\nlast\n".to_vec(), from: Some(1) });
        let mut cut = s.encode();
        cut.pop();
        assert!(State::decode(&cut).is_err());
        assert!(State::decode(b"something else\n").is_err());
    }

    #[test]
    fn the_head_holds_the_first_bytes_only() {
        let mut c = Cursor::default();
        c.advance(&[b'x'; 200]);
        c.advance(&[b'y'; 100]);
        assert_eq!(c.position, 300);
        assert_eq!(c.head.len(), HEAD_BYTES);
        assert_eq!(&c.head[199..201], b"xy");
    }
}
