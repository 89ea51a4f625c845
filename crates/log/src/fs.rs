//! All file I/O of the log goes through [`Fs`] and [`File`], so that tests can swap the real
//! disk ([`RealFs`]) for a simulated one ([`crate::sim::SimFs`]) that forgets unsynced writes
//! at a power cut. The surface is exactly what the log needs and no more: positional reads and
//! writes, `fdatasync`, a directory `fsync`, listing, atomic rename, removal.
//!
//! Names are relative to the store's root directory and use `/` separators.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

/// An open file. Positional I/O only, so readers and the writer share one handle without a seek
/// position between them.
#[allow(clippy::len_without_is_empty)] // a file's length is a size, not a collection's
pub trait File: Send + Sync + 'static {
    /// Fills `buf` from `pos`; fails with `UnexpectedEof` past the end.
    fn read_exact_at(&self, buf: &mut [u8], pos: u64) -> io::Result<()>;
    /// Writes all of `buf` at `pos`.
    fn write_all_at(&self, buf: &[u8], pos: u64) -> io::Result<()>;
    /// `fdatasync`: the contents (and size) written so far survive a power cut.
    fn sync_data(&self) -> io::Result<()>;
    fn len(&self) -> io::Result<u64>;
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// Reserves the file's blocks up to `len` (reading as zeros), so later writes below it change
    /// no file size: their `fdatasync` then has no size to flush. Best effort: a file system
    /// without `fallocate` just grows the file as it is written.
    fn allocate(&self, len: u64) -> io::Result<()>;
}

/// A directory tree of files.
pub trait Fs: Send + Sync + 'static {
    /// Opens `name`, creating it (empty) when `create` is set and it does not exist.
    fn open(&self, name: &str, create: bool) -> io::Result<Arc<dyn File>>;
    /// Whether `name` exists.
    fn exists(&self, name: &str) -> io::Result<bool>;
    /// File names directly inside directory `dir` ("" = the root).
    fn list(&self, dir: &str) -> io::Result<Vec<String>>;
    /// Creates directory `dir` (and its parents) if missing.
    fn create_dir(&self, dir: &str) -> io::Result<()>;
    /// Atomically replaces `to` with `from`. Durable only after [`Fs::sync_dir`].
    fn rename(&self, from: &str, to: &str) -> io::Result<()>;
    fn remove(&self, name: &str) -> io::Result<()>;
    /// `fsync` of directory `dir`: creations, renames and removals in it survive a power cut.
    fn sync_dir(&self, dir: &str) -> io::Result<()>;
    /// Takes an exclusive lock named `name` for as long as the returned guard lives; fails with
    /// `WouldBlock` when another process holds it (one server per data directory).
    fn lock(&self, name: &str) -> io::Result<Box<dyn std::any::Any + Send + Sync>>;
}

/// The real file system under a root directory.
#[derive(Debug, Clone)]
pub struct RealFs {
    root: PathBuf,
}

impl RealFs {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    fn path(&self, name: &str) -> PathBuf {
        if name.is_empty() {
            self.root.clone()
        } else {
            self.root.join(name)
        }
    }
}

struct RealFile(std::fs::File);

impl File for RealFile {
    fn read_exact_at(&self, buf: &mut [u8], pos: u64) -> io::Result<()> {
        std::os::unix::fs::FileExt::read_exact_at(&self.0, buf, pos)
    }
    fn write_all_at(&self, buf: &[u8], pos: u64) -> io::Result<()> {
        std::os::unix::fs::FileExt::write_all_at(&self.0, buf, pos)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }
    fn len(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }
    fn allocate(&self, len: u64) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        let len = libc::off_t::try_from(len).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: a plain syscall on a descriptor this struct owns; no memory is passed.
        let rc = unsafe { libc::fallocate(self.0.as_raw_fd(), 0, 0, len) };
        if rc == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) => Ok(()),
            _ => Err(e),
        }
    }
}

impl Fs for RealFs {
    fn open(&self, name: &str, create: bool) -> io::Result<Arc<dyn File>> {
        let f = std::fs::OpenOptions::new().read(true).write(true).create(create).truncate(false).open(self.path(name))?;
        Ok(Arc::new(RealFile(f)))
    }
    fn exists(&self, name: &str) -> io::Result<bool> {
        self.path(name).try_exists()
    }
    fn list(&self, dir: &str) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(self.path(dir))? {
            let entry = entry?;
            if let Some(n) = entry.file_name().to_str() {
                names.push(n.to_owned());
            }
        }
        names.sort();
        Ok(names)
    }
    fn create_dir(&self, dir: &str) -> io::Result<()> {
        std::fs::create_dir_all(self.path(dir))
    }
    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        std::fs::rename(self.path(from), self.path(to))
    }
    fn remove(&self, name: &str) -> io::Result<()> {
        std::fs::remove_file(self.path(name))
    }
    fn sync_dir(&self, dir: &str) -> io::Result<()> {
        std::fs::File::open(self.path(dir))?.sync_all()
    }
    fn lock(&self, name: &str) -> io::Result<Box<dyn std::any::Any + Send + Sync>> {
        let f = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(self.path(name))?;
        f.try_lock().map_err(|e| match e {
            std::fs::TryLockError::WouldBlock => io::Error::from(io::ErrorKind::WouldBlock),
            std::fs::TryLockError::Error(e) => e,
        })?;
        Ok(Box::new(f))
    }
}
