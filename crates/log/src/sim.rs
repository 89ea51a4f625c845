//! A simulated disk for power-loss tests: [`SimFs`] keeps, for every file, what was written and
//! what was made durable (`fdatasync`), and for the directory tree what was changed and what was
//! made durable (directory `fsync`). [`SimFs::power_cut`] then throws away what a real machine
//! may lose, chosen by a seeded generator: unsynced bytes vanish, or a random prefix of them
//! survives, or that prefix survives with its last block torn into garbage; unsynced creations,
//! renames and removals are each kept or undone.
//!
//! It also fails on command: [`SimFs::fail_after`] makes the power go out after a given number of
//! operations (every later operation fails until the cut), and [`SimFs::fail_syncs`] makes
//! `fdatasync` report `EIO` the way Linux does, losing the unsynced bytes and reporting success on
//! the next call — the hazard fail-stop exists for.
//!
//! Directories themselves are treated as always existing once created (the log creates its one
//! directory before anything else and syncs its parent).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::sync::{Arc, Mutex, MutexGuard};

use rand::{Rng, RngCore};

use crate::fs::{File, Fs};

/// Shared simulated disk; clones see the same disk.
#[derive(Clone, Default)]
pub struct SimFs {
    disk: Arc<Mutex<Disk>>,
}

#[derive(Default)]
struct Disk {
    inodes: HashMap<u64, Inode>,
    /// Directory entries as the running system sees them.
    names: BTreeMap<String, u64>,
    /// Directory entries as they would be found after a power cut.
    durable_names: BTreeMap<String, u64>,
    dirs: BTreeSet<String>,
    next_inode: u64,
    /// Bumped at each power cut: handles opened before it stop working.
    generation: u64,
    /// Operations left before the power goes out (`None`: never).
    fail_after: Option<u64>,
    /// The power is out: everything fails until [`SimFs::power_cut`].
    dead: bool,
    /// `fdatasync` fails with `EIO` (and loses the unsynced bytes) while set.
    fail_syncs: bool,
}

#[derive(Default, Clone)]
struct Inode {
    data: Vec<u8>,
    durable: Vec<u8>,
}

fn dead() -> io::Error {
    io::Error::other("simulated power failure")
}

impl Disk {
    /// Accounts for one operation; fails once the power is out.
    fn op(&mut self, generation: Option<u64>) -> io::Result<()> {
        if self.dead || generation.is_some_and(|g| g != self.generation) {
            return Err(dead());
        }
        if let Some(n) = self.fail_after.as_mut() {
            if *n == 0 {
                self.dead = true;
                return Err(dead());
            }
            *n -= 1;
        }
        Ok(())
    }
}

fn parent(name: &str) -> &str {
    name.rsplit_once('/').map_or("", |(d, _)| d)
}

impl SimFs {
    pub fn new() -> Self {
        Self::default()
    }

    fn disk(&self) -> MutexGuard<'_, Disk> {
        // A panic elsewhere while holding the lock must not hide the original failure.
        self.disk.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The power goes out after `n` more operations (reads included).
    pub fn fail_after(&self, n: u64) {
        self.disk().fail_after = Some(n);
    }

    /// While set, `fdatasync` fails with `EIO`, the unsynced bytes are lost, and the next
    /// successful sync does not bring them back (Linux clears the dirty pages on error).
    pub fn fail_syncs(&self, on: bool) {
        self.disk().fail_syncs = on;
    }

    /// The power goes out now (if it has not already).
    pub fn kill(&self) {
        self.disk().dead = true;
    }

    /// Whether the power is out.
    pub fn is_dead(&self) -> bool {
        self.disk().dead
    }

    /// Cuts the power: every file keeps its synced contents plus, at random, none, a prefix, or
    /// a torn prefix of what was written after; every unsynced directory change is kept or
    /// undone at random. Old handles stop working; the disk is usable again afterwards.
    pub fn power_cut(&self, rng: &mut impl RngCore) {
        let mut d = self.disk();
        let names: BTreeSet<String> = d.names.keys().chain(d.durable_names.keys()).cloned().collect();
        let mut after = BTreeMap::new();
        for name in names {
            let (now, durable) = (d.names.get(&name).copied(), d.durable_names.get(&name).copied());
            let keep = if now == durable || rng.random_bool(0.5) { now } else { durable };
            if let Some(ino) = keep {
                after.insert(name, ino);
            }
        }
        let live: BTreeSet<u64> = after.values().copied().collect();
        d.inodes.retain(|ino, _| live.contains(ino));
        for inode in d.inodes.values_mut() {
            let mut kept = inode.durable.clone();
            if inode.data.len() > kept.len() && inode.data.starts_with(&kept) {
                let extra = &inode.data[kept.len()..];
                match rng.random_range(0..4u8) {
                    0 => {}
                    1 => kept.extend_from_slice(&extra[..rng.random_range(0..=extra.len())]),
                    2 => kept.extend_from_slice(extra),
                    _ => {
                        let n = rng.random_range(1..=extra.len());
                        kept.extend_from_slice(&extra[..n]);
                        let torn = rng.random_range(1..=n.min(512));
                        let len = kept.len();
                        rng.fill_bytes(&mut kept[len - torn..]);
                    }
                }
            } else if inode.data != kept && rng.random_bool(0.5) {
                // Truncated or rewritten since the last sync: either version may be found.
                kept = inode.data.clone();
            }
            inode.data = kept.clone();
            inode.durable = kept;
        }
        d.names = after.clone();
        d.durable_names = after;
        d.generation += 1;
        d.dead = false;
        d.fail_after = None;
        d.fail_syncs = false;
    }

    /// A file's current contents (for tests that corrupt a file on purpose).
    pub fn contents(&self, name: &str) -> Option<Vec<u8>> {
        let d = self.disk();
        d.names.get(name).and_then(|i| d.inodes.get(i)).map(|i| i.data.clone())
    }

    /// Replaces a file's contents, durably (a test's bit rot).
    pub fn set_contents(&self, name: &str, bytes: Vec<u8>) {
        let mut d = self.disk();
        if let Some(ino) = d.names.get(name).copied() {
            if let Some(i) = d.inodes.get_mut(&ino) {
                i.data = bytes.clone();
                i.durable = bytes;
            }
        }
    }
}

struct SimFile {
    disk: Arc<Mutex<Disk>>,
    ino: u64,
    generation: u64,
}

impl SimFile {
    fn with<T>(&self, f: impl FnOnce(&mut Disk, u64) -> io::Result<T>) -> io::Result<T> {
        let mut d = self.disk.lock().unwrap_or_else(|p| p.into_inner());
        d.op(Some(self.generation))?;
        f(&mut d, self.ino)
    }
}

fn inode(d: &mut Disk, ino: u64) -> io::Result<&mut Inode> {
    d.inodes.get_mut(&ino).ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "inode gone"))
}

impl File for SimFile {
    fn read_exact_at(&self, buf: &mut [u8], pos: u64) -> io::Result<()> {
        self.with(|d, ino| {
            let i = inode(d, ino)?;
            let start = usize::try_from(pos).map_err(|_| io::Error::from(io::ErrorKind::UnexpectedEof))?;
            let src =
                i.data.get(start..start + buf.len()).ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
            buf.copy_from_slice(src);
            Ok(())
        })
    }
    fn write_all_at(&self, buf: &[u8], pos: u64) -> io::Result<()> {
        self.with(|d, ino| {
            let i = inode(d, ino)?;
            let start = pos as usize;
            if i.data.len() < start + buf.len() {
                i.data.resize(start + buf.len(), 0);
            }
            i.data[start..start + buf.len()].copy_from_slice(buf);
            Ok(())
        })
    }
    fn sync_data(&self) -> io::Result<()> {
        self.with(|d, ino| {
            let fail = d.fail_syncs;
            let i = inode(d, ino)?;
            if fail {
                // The kernel drops the dirty pages and reports the error once.
                i.data = i.durable.clone();
                return Err(io::Error::other("simulated EIO on fdatasync"));
            }
            i.durable = i.data.clone();
            Ok(())
        })
    }
    fn len(&self) -> io::Result<u64> {
        self.with(|d, ino| Ok(inode(d, ino)?.data.len() as u64))
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.with(|d, ino| {
            inode(d, ino)?.data.resize(len as usize, 0);
            Ok(())
        })
    }
    /// Like a size change: zeros up to `len`, durable only after the next sync.
    fn allocate(&self, len: u64) -> io::Result<()> {
        self.with(|d, ino| {
            let i = inode(d, ino)?;
            if i.data.len() < len as usize {
                i.data.resize(len as usize, 0);
            }
            Ok(())
        })
    }
}

impl Fs for SimFs {
    fn open(&self, name: &str, create: bool) -> io::Result<Arc<dyn File>> {
        let mut d = self.disk();
        d.op(None)?;
        let ino = match d.names.get(name) {
            Some(ino) => *ino,
            None if create => {
                if !d.dirs.contains(parent(name)) && !parent(name).is_empty() {
                    return Err(io::Error::new(io::ErrorKind::NotFound, "no such directory"));
                }
                d.next_inode += 1;
                let ino = d.next_inode;
                d.inodes.insert(ino, Inode::default());
                d.names.insert(name.to_owned(), ino);
                ino
            }
            None => return Err(io::Error::new(io::ErrorKind::NotFound, format!("{name}: no such file"))),
        };
        Ok(Arc::new(SimFile { disk: self.disk.clone(), ino, generation: d.generation }))
    }
    fn exists(&self, name: &str) -> io::Result<bool> {
        let mut d = self.disk();
        d.op(None)?;
        Ok(d.names.contains_key(name) || d.dirs.contains(name))
    }
    fn list(&self, dir: &str) -> io::Result<Vec<String>> {
        let mut d = self.disk();
        d.op(None)?;
        Ok(d.names.keys().filter(|n| parent(n) == dir).map(|n| n.rsplit('/').next().unwrap_or(n).to_owned()).collect())
    }
    fn create_dir(&self, dir: &str) -> io::Result<()> {
        let mut d = self.disk();
        d.op(None)?;
        d.dirs.insert(dir.to_owned());
        Ok(())
    }
    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        let mut d = self.disk();
        d.op(None)?;
        let ino = d.names.remove(from).ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "rename source"))?;
        d.names.insert(to.to_owned(), ino);
        Ok(())
    }
    fn remove(&self, name: &str) -> io::Result<()> {
        let mut d = self.disk();
        d.op(None)?;
        d.names.remove(name).map(|_| ()).ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "remove"))
    }
    fn lock(&self, _name: &str) -> io::Result<Box<dyn std::any::Any + Send + Sync>> {
        // One simulated process at a time uses a simulated disk.
        Ok(Box::new(()))
    }
    fn sync_dir(&self, dir: &str) -> io::Result<()> {
        let mut d = self.disk();
        d.op(None)?;
        let current: Vec<(String, u64)> =
            d.names.iter().filter(|(n, _)| parent(n) == dir).map(|(n, i)| (n.clone(), *i)).collect();
        d.durable_names.retain(|n, _| parent(n) != dir);
        d.durable_names.extend(current);
        Ok(())
    }
}
