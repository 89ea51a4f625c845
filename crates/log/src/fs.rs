//! All file I/O of the log goes through [`Fs`] and [`File`], so that tests can swap the real
//! disk ([`RealFs`]) for a simulated one ([`crate::sim::SimFs`]) that forgets unsynced writes
//! at a power cut. The surface is exactly what the log needs and no more: positional reads and
//! writes, `fdatasync`, a directory `fsync`, listing, atomic rename, removal.
//!
//! Names are relative to the store's root directory and use `/` separators.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;

/// Ranges shorter than this are read with `pread`: mapping a range costs two system calls and a
/// TLB flush at unmap, which a copy of a few KiB undercuts.
pub const MAP_MIN: usize = 64 * 1024;

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
    /// The `len` bytes at `pos` as shared memory, without copying them out of the page cache
    /// (the range memory-mapped, unmapped when the last `Bytes` of it drops), or `None` when this
    /// file gives no such view (the simulated disk), the range is too small to be worth a
    /// mapping, or no mapping can be made (the process is out of them): the caller then reads
    /// with [`File::read_exact_at`]. Only for bytes that are never
    /// rewritten and a file that is never cut below them while they are held: the log maps only
    /// what it has published (durable, below the tail), and cuts a segment only in recovery,
    /// before any read.
    fn map_range(&self, pos: u64, len: usize) -> io::Result<Option<Bytes>> {
        let _ = (pos, len);
        Ok(None)
    }
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

/// In an `Arc` so a mapped range can name its file while a socket sends it
/// ([`oncelog_storage::file_bytes`]).
struct RealFile(Arc<std::fs::File>);

/// A mapped range, registered while it lives. Field order matters: the registration is dropped
/// before the memory is unmapped, so no address is ever registered after it could be reused.
struct Mapped {
    _registration: oncelog_storage::file_bytes::Registration,
    map: memmap2::Mmap,
}

impl AsRef<[u8]> for Mapped {
    fn as_ref(&self) -> &[u8] {
        &self.map
    }
}

impl File for RealFile {
    fn read_exact_at(&self, buf: &mut [u8], pos: u64) -> io::Result<()> {
        std::os::unix::fs::FileExt::read_exact_at(&*self.0, buf, pos)
    }
    fn write_all_at(&self, buf: &[u8], pos: u64) -> io::Result<()> {
        std::os::unix::fs::FileExt::write_all_at(&*self.0, buf, pos)
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
    fn map_range(&self, pos: u64, len: usize) -> io::Result<Option<Bytes>> {
        if len < MAP_MIN {
            return Ok(None);
        }
        // SAFETY: the mapping is read-only and the trait's contract (above) keeps the bytes it
        // exposes unchanged while it lives: the log maps only published records, which it never
        // rewrites, and never shortens a segment outside recovery.
        let map = match unsafe { memmap2::MmapOptions::new().offset(pos).len(len).map(&*self.0) } {
            Ok(map) => map,
            // Out of mappings (`vm.max_map_count`) or address space: the caller reads instead.
            Err(e) => {
                tracing::debug!(error = %e, "cannot map a segment range; reading it");
                return Ok(None);
            }
        };
        // Pages are not faulted in here: a plain socket sends them with `sendfile(2)` without
        // ever touching the mapping. Read-ahead is started so they are in the page cache by then.
        let _ = map.advise(memmap2::Advice::WillNeed);
        let registration = oncelog_storage::file_bytes::register(map.as_ptr(), len, self.0.clone(), pos);
        Ok(Some(Bytes::from_owner(Mapped { _registration: registration, map })))
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
        let f =
            std::fs::OpenOptions::new().read(true).write(true).create(create).truncate(false).open(self.path(name))?;
        Ok(Arc::new(RealFile(Arc::new(f))))
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
        let f =
            std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(self.path(name))?;
        f.try_lock().map_err(|e| match e {
            std::fs::TryLockError::WouldBlock => io::Error::from(io::ErrorKind::WouldBlock),
            std::fs::TryLockError::Error(e) => e,
        })?;
        Ok(Box::new(f))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mapped_range_is_the_file_bytes_and_outlives_the_file_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fs = RealFs::new(dir.path());
        let file = fs.open("seg", true).expect("open");
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 253) as u8).collect();
        file.write_all_at(&data, 0).expect("write");
        // Below the threshold: no mapping, the caller reads.
        assert!(file.map_range(5, MAP_MIN - 1).expect("map").is_none());
        // An offset inside a page, a length that ends inside one.
        let (pos, len) = (4097u64, 100_001usize);
        let mapped = file.map_range(pos, len).expect("map").expect("a real file maps");
        assert_eq!(mapped.len(), len);
        assert!(mapped[..] == data[pos as usize..pos as usize + len]);
        // Removing the file (a trimmed segment) leaves what is mapped readable.
        drop(file);
        fs.remove("seg").expect("remove");
        assert!(mapped.slice(1..).as_ref() == &data[pos as usize + 1..pos as usize + len]);
    }
}
