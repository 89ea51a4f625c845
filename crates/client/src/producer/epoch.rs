//! Epoch persistence: the hook that lets a restarted process bump its epoch and so fence its own
//! zombie (section 5.2.1, "Bootstrap and Restart Flow").

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::Error;

/// Loads and stores a producer's epoch. Called from a blocking thread, so plain file or
/// database I/O is fine.
///
/// At start the producer uses `load() + 1` (or the configured epoch, if higher) and calls
/// `store()` with it **before** sending anything, so a crash at any moment can never lead to two
/// sessions with the same epoch. Auto-claim stores each new epoch the same way.
pub trait EpochStore: Send + Sync {
    /// The last stored epoch of `producer_id`, or `None` if it never ran.
    fn load(&self, producer_id: &str) -> Result<Option<u64>, Error>;
    /// Durably records that `producer_id` now uses `epoch`.
    fn store(&self, producer_id: &str, epoch: u64) -> Result<(), Error>;
}

/// An [`EpochStore`] keeping the epoch as decimal text in one file (one producer per file),
/// replaced atomically (write, fsync, rename, fsync the directory).
#[derive(Debug, Clone)]
pub struct FileEpochStore {
    /// The file.
    path: PathBuf,
}

impl FileEpochStore {
    /// A store in `path` (the file need not exist yet; its directory must).
    pub fn new(path: impl Into<PathBuf>) -> FileEpochStore {
        FileEpochStore { path: path.into() }
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

fn io_err(what: &str, path: &Path, e: std::io::Error) -> Error {
    Error::EpochStore(format!("{what} {}: {e}", path.display()))
}

impl EpochStore for FileEpochStore {
    fn load(&self, _producer_id: &str) -> Result<Option<u64>, Error> {
        match fs::read_to_string(&self.path) {
            Ok(text) => text.trim().parse::<u64>().map(Some).map_err(|_| {
                Error::EpochStore(format!("{} does not hold an epoch: {:?}", self.path.display(), text.trim()))
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_err("cannot read", &self.path, e)),
        }
    }

    fn store(&self, _producer_id: &str, epoch: u64) -> Result<(), Error> {
        let tmp = self.path.with_extension("tmp");
        let mut f = fs::File::create(&tmp).map_err(|e| io_err("cannot create", &tmp, e))?;
        f.write_all(format!("{epoch}\n").as_bytes()).map_err(|e| io_err("cannot write", &tmp, e))?;
        f.sync_all().map_err(|e| io_err("cannot sync", &tmp, e))?;
        fs::rename(&tmp, &self.path).map_err(|e| io_err("cannot replace", &self.path, e))?;
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            // Makes the rename itself durable; not every platform can open a directory.
            if let Ok(d) = fs::File::open(dir) {
                let _ = d.sync_all();
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_store_round_trips() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = FileEpochStore::new(dir.path().join("epoch"));
        assert_eq!(s.load("p").expect("load"), None);
        s.store("p", 7).expect("store");
        assert_eq!(s.load("p").expect("load"), Some(7));
        fs::write(s.path(), "garbage").expect("write");
        assert!(s.load("p").is_err());
    }
}
