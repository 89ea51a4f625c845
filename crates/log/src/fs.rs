//! All file I/O of the log goes through [`Fs`] and [`File`], so that tests can swap the real
//! disk ([`RealFs`]) for a simulated one ([`crate::sim::SimFs`]) that forgets unsynced writes
//! at a power cut. The surface is exactly what the log needs and no more: positional reads and
//! writes, `fdatasync`, a directory `fsync`, listing, atomic rename, removal.
//!
//! Names are relative to the store's root directory and use `/` separators.

use std::io;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use bytes::Bytes;

/// Mapped ranges at least this long get read-ahead started (`MADV_WILLNEED`) when they are
/// handed out, and only they get a mapping of their own ([`File::map_alone`]): for less, a
/// `pread` costs less than mapping and unmapping.
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
    /// The `len` bytes at `pos` as a mapping of their own, unmapped when the last `Bytes` of it
    /// drops, or `None` (as [`File::map_range`]; also for ranges under [`MAP_MIN`]). For an
    /// answer the server reads itself (an SSE event encoded, a JSON array): the pages it touches
    /// leave the process with the answer, where the file's one mapping would keep them mapped
    /// (and counted in its RSS) for as long as the segment lives.
    fn map_alone(&self, pos: u64, len: usize) -> io::Result<Option<Bytes>> {
        let _ = (pos, len);
        Ok(None)
    }
    /// Whether [`File::map_range`] answers without waiting for I/O (a local file: mapping reads
    /// nothing, the pages are read when the bytes are sent). A read made only of such ranges
    /// then needs no hand-off to the blocking pool.
    fn maps_without_io(&self) -> bool {
        false
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

/// The file in an `Arc` so a mapped range can name its file while a socket sends it
/// ([`oncelog_storage::file_bytes`]).
struct RealFile(Arc<std::fs::File>, Mutex<Option<Bytes>>);

impl RealFile {
    fn new(file: std::fs::File) -> Self {
        RealFile(Arc::new(file), Mutex::new(None))
    }

    /// The whole file mapped, once (the second field keeps it): every read of the file slices
    /// this one mapping, so a read costs no `mmap`/`munmap` (nor the TLB flush of an unmap on
    /// every thread), and pages once mapped stay mapped for the next reader. Mapped anew, larger,
    /// when a read reaches past it (a segment written past the size it was allocated); slices of
    /// the older mapping keep it alive until they drop. `None`: no mapping could be made.
    fn mapped(&self, end: u64) -> io::Result<Option<Bytes>> {
        let mut cached = self.1.lock().map_err(|_| io::Error::other("segment mapping lock poisoned"))?;
        if let Some(whole) = cached.as_ref().filter(|w| w.len() as u64 >= end) {
            return Ok(Some(whole.clone()));
        }
        let len =
            usize::try_from(self.0.metadata()?.len()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        if (len as u64) < end {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "a mapped read past the end of its segment"));
        }
        let whole = self.map(0, len);
        cached.clone_from(&whole);
        Ok(whole)
    }

    /// `len` bytes from `pos` mapped read-only and registered ([`oncelog_storage::file_bytes`])
    /// for as long as the `Bytes` live; `None` when no mapping can be made (out of
    /// `vm.max_map_count` or address space: the caller reads instead).
    fn map(&self, pos: u64, len: usize) -> Option<Bytes> {
        // SAFETY: the mapping is read-only and the trait's contract (above) keeps the bytes it
        // exposes unchanged while it lives: the log maps only published records, which it never
        // rewrites, and never shortens a segment outside recovery (before any read, on a handle
        // of its own).
        let map = match unsafe { memmap2::MmapOptions::new().offset(pos).len(len).map(&*self.0) } {
            Ok(map) => map,
            Err(e) => {
                tracing::debug!(error = %e, "cannot map a segment range; reading it");
                return None;
            }
        };
        let registration = oncelog_storage::file_bytes::register(map.as_ptr(), len, self.0.clone(), pos);
        Some(Bytes::from_owner(Mapped { _registration: registration, map }))
    }
}

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

/// Starts read-ahead of the pages under `mapped` (a slice of a mapping), so they are in the page
/// cache when a socket sends them (`sendfile(2)` never touches the mapping itself).
fn will_need(mapped: &Bytes) {
    let at = mapped.as_ptr() as usize;
    let page = at & !4095;
    // SAFETY: the page-aligned range starts at most 4095 bytes before `mapped`, inside the same
    // mapping (mappings start on a page), and ends with it; advice changes no memory contents.
    unsafe { libc::madvise(page as *mut libc::c_void, at + mapped.len() - page, libc::MADV_WILLNEED) };
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
        let start = usize::try_from(pos).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        let Some(end) = start.checked_add(len) else { return Err(io::ErrorKind::InvalidInput.into()) };
        let Some(whole) = self.mapped(end as u64)? else { return Ok(None) };
        let range = whole.slice(start..end);
        if len >= MAP_MIN {
            will_need(&range);
        }
        Ok(Some(range))
    }
    fn maps_without_io(&self) -> bool {
        true
    }
    fn map_alone(&self, pos: u64, len: usize) -> io::Result<Option<Bytes>> {
        if len < MAP_MIN {
            return Ok(None);
        }
        let mapped = self.map(pos, len);
        if let Some(b) = &mapped {
            will_need(b);
        }
        Ok(mapped)
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
        Ok(Arc::new(RealFile::new(f)))
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
        // Small ranges are slices of the same one mapping.
        let small = file.map_range(5, 10).expect("map").expect("a real file maps");
        assert!(small[..] == data[5..15]);
        // An offset inside a page, a length that ends inside one.
        let (pos, len) = (4097u64, 100_001usize);
        let mapped = file.map_range(pos, len).expect("map").expect("a real file maps");
        assert_eq!(mapped.len(), len);
        assert!(mapped[..] == data[pos as usize..pos as usize + len]);
        // Removing the file (a trimmed segment) leaves what is mapped readable.
        drop(file);
        fs.remove("seg").expect("remove");
        assert!(mapped.slice(1..).as_ref() == &data[pos as usize + 1..pos as usize + len]);
        assert!(small[..] == data[5..15]);
    }

    #[test]
    fn a_file_is_mapped_once_and_again_only_when_it_grew() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = RealFile::new(tempfile::tempfile_in(dir.path()).expect("file"));
        file.write_all_at(&[1u8; 100_000], 0).expect("write");
        let a = file.map_range(0, 10).expect("map").expect("maps");
        let b = file.map_range(50_000, 10).expect("map").expect("maps");
        let whole = |f: &RealFile| f.1.lock().expect("lock").as_ref().map(|w| (w.as_ptr(), w.len()));
        let first = whole(&file).expect("mapped");
        assert_eq!(first.1, 100_000);
        assert_eq!(b.as_ptr(), a.as_ptr().wrapping_add(50_000), "one mapping, sliced");
        // A read past the mapping (the file grew): mapped anew, and the old slices still read.
        file.write_all_at(&[2u8; 100_000], 100_000).expect("write");
        let c = file.map_range(150_000, 10).expect("map").expect("maps");
        assert_eq!(&c[..], &[2u8; 10]);
        assert_eq!(whole(&file).expect("mapped").1, 200_000);
        assert_eq!(&a[..], &[1u8; 10]);
        // Past the end of the file: refused, not mapped.
        assert!(file.map_range(199_995, 10).is_err());
    }
}
