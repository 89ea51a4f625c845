//! Cold segments (`--object-store`, issue 35 step 5): sealed segments whose bytes are in the
//! bucket and not on the local disk — left in the bucket by a restore (which downloads only
//! what recovery replays, so a node serves at once), or evicted under `--cache-max-bytes`.
//!
//! [`TieredFs`] is the log's file system with a bucket: the data directory, plus the cold
//! segments as read-only files ([`ColdFile`]) under their usual names. Recovery, reads and the
//! shipper see one set of segments and never ask where a segment lives; only the shipper moves
//! segments between the two (evicting, filling the cache back), and only segments a published
//! cut holds whole.
//!
//! A cold read fetches aligned blocks of [`BLOCK`] bytes with ranged GETs of the objects that
//! hold them, keeps the last few blocks of each segment, and fetches the next [`READ_AHEAD`]
//! blocks in the background, in parallel (catch-up reads go forward; a reader needing a block
//! already on its way waits for it). Reads run off the async runtime (the
//! engine's disk reads are `spawn_blocking`), so a fetch blocks its thread like a disk read; the
//! fetches themselves run on a small runtime of their own.

use std::collections::BTreeMap;
use std::io;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use oncelog_bucket::{Bucket, SegmentRef};

use crate::format;
use crate::fs::{File, Fs};

/// The unit of a cold fetch.
pub(crate) const BLOCK: u64 = 1 << 20;

/// Blocks fetched ahead of a cold read, in parallel: a GET's round trip (tens of ms on S3)
/// is paid once per window, not once per block.
const READ_AHEAD: u64 = 4;

/// Blocks kept per cold segment: the window read ahead, the one being read, and a few more for
/// readers at nearby positions.
const KEPT_BLOCKS: usize = 8;

/// The runtime cold fetches run on: its own thread, ended when dropped.
struct Fetcher {
    handle: tokio::runtime::Handle,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Fetcher {
    fn start() -> io::Result<Fetcher> {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let handle = rt.handle().clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new().name("oncelog-cold-reads".into()).spawn(move || {
            let _ = rt.block_on(stopped);
        })?;
        Ok(Fetcher { handle, stop: Some(stop), thread: Some(thread) })
    }
}

impl Drop for Fetcher {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The cold segments and how to read them.
pub(crate) struct Cold {
    bucket: Bucket,
    segments: Mutex<BTreeMap<u64, Arc<ColdFile>>>,
    fetcher: Fetcher,
}

impl Cold {
    pub fn new(bucket: Bucket) -> io::Result<Arc<Cold>> {
        Ok(Arc::new(Cold { bucket, segments: Mutex::new(BTreeMap::new()), fetcher: Fetcher::start()? }))
    }

    /// Makes segment `seg` (as a published cut holds it) cold: its file is the bucket's.
    pub fn add(self: &Arc<Self>, seg: SegmentRef) -> Arc<ColdFile> {
        let file =
            Arc::new(ColdFile { cold: Arc::downgrade(self), seg: Arc::new(seg), blocks: Arc::new(Blocks::default()) });
        if let Ok(mut m) = self.segments.lock() {
            m.insert(file.seg.number, file.clone());
        }
        metrics::gauge!("oncelog_bucket_cold_segments").set(self.len() as f64);
        file
    }

    /// Segment `n` is local again (filled back) or gone.
    pub fn remove(&self, n: u64) {
        if let Ok(mut m) = self.segments.lock() {
            m.remove(&n);
        }
        metrics::gauge!("oncelog_bucket_cold_segments").set(self.len() as f64);
    }

    pub fn get(&self, n: u64) -> Option<Arc<ColdFile>> {
        self.segments.lock().ok()?.get(&n).cloned()
    }

    pub fn is_cold(&self, n: u64) -> bool {
        self.segments.lock().is_ok_and(|m| m.contains_key(&n))
    }

    /// The cold segments, newest first (the order the cache fills in: recent data is read most).
    pub fn newest_first(&self) -> Vec<Arc<ColdFile>> {
        self.segments.lock().map(|m| m.values().rev().cloned().collect()).unwrap_or_default()
    }

    fn len(&self) -> usize {
        self.segments.lock().map_or(0, |m| m.len())
    }

    /// Bytes `[from, to)` of `seg`, from the objects that hold them.
    async fn fetch(bucket: Bucket, seg: Arc<SegmentRef>, from: u64, to: u64) -> Result<Bytes, String> {
        let mut out = Vec::with_capacity((to - from) as usize);
        let mut at = seg.start;
        for r in &seg.ranges {
            let (lo, hi) = (at, at + r.len);
            at = hi;
            if hi <= from || lo >= to {
                continue;
            }
            let part = bucket.read_range(r, from.max(lo) - lo..to.min(hi) - lo).await.map_err(|e| e.to_string())?;
            metrics::counter!("oncelog_bucket_gets_total").increment(1);
            out.extend_from_slice(&part);
        }
        if out.len() as u64 != to - from {
            return Err(format!("segment {}: the bucket holds no bytes {from}..{to}", seg.number));
        }
        Ok(Bytes::from(out))
    }

    /// Blocks until `f` is done on the fetch runtime (a thread of the engine's blocking pool or
    /// a cache fill's, never an async task).
    fn block_on<T: Send + 'static>(
        &self,
        f: impl std::future::Future<Output = Result<T, String>> + Send + 'static,
    ) -> io::Result<T> {
        let (tx, rx) = std::sync::mpsc::channel();
        self.fetcher.handle.spawn(async move {
            let _ = tx.send(f.await);
        });
        rx.recv().map_err(|_| io::Error::other("the cold read runtime stopped"))?.map_err(io::Error::other)
    }

    /// Bytes `[from, to)` of `seg` as the bucket holds them (filling the cache back).
    pub fn download(&self, seg: &SegmentRef, from: u64, to: u64) -> io::Result<Bytes> {
        let (bucket, seg) = (self.bucket.clone(), Arc::new(seg.clone()));
        self.block_on(Cold::fetch(bucket, seg, from, to))
    }
}

/// A cold segment: read-only, its bytes fetched from the bucket in blocks.
pub(crate) struct ColdFile {
    /// Weak: the cold set owns its files, and a reader that outlives the engine just fails.
    cold: std::sync::Weak<Cold>,
    seg: Arc<SegmentRef>,
    blocks: Arc<Blocks>,
}

/// A cold segment's blocks in memory, and those being fetched (a reader that needs one waits
/// for that fetch rather than making its own).
#[derive(Default)]
struct Blocks {
    state: Mutex<BlockState>,
    arrived: std::sync::Condvar,
}

#[derive(Default)]
struct BlockState {
    /// Recently fetched blocks (block number, bytes), most recent last.
    kept: Vec<(u64, Bytes)>,
    fetching: std::collections::HashSet<u64>,
}

/// How long a reader waits for a block another fetch is bringing before it fetches it itself.
const FETCH_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

impl Blocks {
    fn hit(state: &mut BlockState, b: u64) -> Option<Bytes> {
        let i = state.kept.iter().position(|(n, _)| *n == b)?;
        let hit = state.kept.remove(i);
        let bytes = hit.1.clone();
        state.kept.push(hit);
        Some(bytes)
    }

    /// A fetch of block `b` ended (`None`: it failed; a reader fetches it again).
    fn arrived(&self, b: u64, bytes: Option<Bytes>) {
        if let Ok(mut st) = self.state.lock() {
            st.fetching.remove(&b);
            if let Some(bytes) = bytes {
                if !st.kept.iter().any(|(n, _)| *n == b) {
                    if st.kept.len() >= KEPT_BLOCKS {
                        st.kept.remove(0);
                    }
                    st.kept.push((b, bytes));
                }
            }
        }
        self.arrived.notify_all();
    }
}

impl ColdFile {
    pub fn segment(&self) -> &SegmentRef {
        &self.seg
    }

    #[cfg(test)]
    fn cached(&self, b: u64) -> Option<Bytes> {
        Blocks::hit(&mut *self.blocks.state.lock().ok()?, b)
    }

    fn block_range(&self, b: u64) -> (u64, u64) {
        let from = (b * BLOCK).max(self.seg.start);
        (from, ((b + 1) * BLOCK).min(self.seg.end()))
    }

    /// Block `b`: kept, being fetched (waited for), or fetched now; and the [`READ_AHEAD`]
    /// blocks after it fetched in the background, so a reader going forward finds them kept.
    fn block(&self, b: u64) -> io::Result<Bytes> {
        let cold = self.cold.upgrade().ok_or_else(|| io::Error::other("the engine stopped"))?;
        let hit = {
            let mut st = self.blocks.state.lock().map_err(|_| io::Error::other("cold blocks poisoned"))?;
            let deadline = std::time::Instant::now() + FETCH_WAIT;
            loop {
                if let Some(hit) = Blocks::hit(&mut st, b) {
                    break Some(hit);
                }
                let now = std::time::Instant::now();
                if !st.fetching.contains(&b) || now >= deadline {
                    st.fetching.insert(b);
                    break None;
                }
                st = self
                    .blocks
                    .arrived
                    .wait_timeout(st, deadline - now)
                    .map_err(|_| io::Error::other("cold blocks poisoned"))?
                    .0;
            }
        };
        let bytes = match hit {
            Some(hit) => {
                metrics::counter!("oncelog_bucket_cold_read_hits_total").increment(1);
                hit
            }
            None => {
                let (from, to) = self.block_range(b);
                let got = cold.block_on(Cold::fetch(cold.bucket.clone(), self.seg.clone(), from, to));
                self.blocks.arrived(b, got.as_ref().ok().cloned());
                got?
            }
        };
        for ahead in b + 1..=b + READ_AHEAD {
            let (from, to) = self.block_range(ahead);
            if from >= to {
                break;
            }
            let start = self.blocks.state.lock().is_ok_and(|mut st| {
                let fresh = !st.fetching.contains(&ahead) && !st.kept.iter().any(|(n, _)| *n == ahead);
                if fresh {
                    st.fetching.insert(ahead);
                }
                fresh
            });
            if start {
                let (bucket, seg, blocks) = (cold.bucket.clone(), self.seg.clone(), self.blocks.clone());
                cold.fetcher.handle.spawn(async move {
                    let got = Cold::fetch(bucket, seg, from, to).await.ok();
                    blocks.arrived(ahead, got);
                });
            }
        }
        Ok(bytes)
    }

    fn read_only() -> io::Error {
        io::Error::new(io::ErrorKind::PermissionDenied, "a cold segment (in the bucket) is read-only")
    }
}

impl File for ColdFile {
    fn read_exact_at(&self, buf: &mut [u8], pos: u64) -> io::Result<()> {
        let end = pos + buf.len() as u64;
        if pos < self.seg.start || end > self.seg.end() {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("segment {}: bytes {pos}..{end} are not in the bucket", self.seg.number),
            ));
        }
        let mut at = pos;
        while at < end {
            let b = at / BLOCK;
            let (from, _) = self.block_range(b);
            let block = self.block(b)?;
            let off = (at - from) as usize;
            let n = (block.len() - off).min((end - at) as usize);
            let into = (at - pos) as usize;
            buf[into..into + n].copy_from_slice(&block[off..off + n]);
            at += n as u64;
        }
        Ok(())
    }

    fn write_all_at(&self, _: &[u8], _: u64) -> io::Result<()> {
        Err(Self::read_only())
    }

    fn sync_data(&self) -> io::Result<()> {
        Ok(())
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.seg.end())
    }

    fn set_len(&self, _: u64) -> io::Result<()> {
        Err(Self::read_only())
    }

    fn allocate(&self, _: u64) -> io::Result<()> {
        Err(Self::read_only())
    }
}

/// The data directory plus the cold segments (see the module docs).
pub(crate) struct TieredFs {
    pub local: Arc<dyn Fs>,
    pub cold: Arc<Cold>,
    /// The data directory's lock, taken before the start touches the bucket or the directory
    /// (a second node started on the same directory must fence no one and restore nothing),
    /// handed to the store when it locks.
    pub held: Mutex<Option<Box<dyn std::any::Any + Send + Sync>>>,
}

impl TieredFs {
    fn cold_segment(&self, name: &str) -> Option<Arc<ColdFile>> {
        let n = name.strip_prefix(format::LOG_DIR)?.strip_prefix('/').and_then(format::parse_segment_name)?;
        self.cold.get(n)
    }
}

impl Fs for TieredFs {
    fn open(&self, name: &str, create: bool) -> io::Result<Arc<dyn File>> {
        if !create && !self.local.exists(name)? {
            if let Some(f) = self.cold_segment(name) {
                return Ok(f);
            }
        }
        self.local.open(name, create)
    }

    fn exists(&self, name: &str) -> io::Result<bool> {
        Ok(self.local.exists(name)? || self.cold_segment(name).is_some())
    }

    fn list(&self, dir: &str) -> io::Result<Vec<String>> {
        let mut names = self.local.list(dir)?;
        if dir == format::LOG_DIR {
            for f in self.cold.newest_first() {
                let name = format::segment_name(f.seg.number);
                let base = name.rsplit('/').next().unwrap_or(&name).to_owned();
                if !names.contains(&base) {
                    names.push(base);
                }
            }
        }
        Ok(names)
    }

    fn create_dir(&self, dir: &str) -> io::Result<()> {
        self.local.create_dir(dir)
    }

    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        self.local.rename(from, to)
    }

    /// A cold segment removed is dropped from the cold set (its objects leave the bucket with
    /// the cut that drops it).
    fn remove(&self, name: &str) -> io::Result<()> {
        if let Some(f) = self.cold_segment(name) {
            self.cold.remove(f.seg.number);
            if !self.local.exists(name)? {
                return Ok(());
            }
        }
        self.local.remove(name)
    }

    fn sync_dir(&self, dir: &str) -> io::Result<()> {
        self.local.sync_dir(dir)
    }

    fn lock(&self, name: &str) -> io::Result<Box<dyn std::any::Any + Send + Sync>> {
        if name == format::LOCK {
            if let Some(held) = self.held.lock().ok().and_then(|mut h| h.take()) {
                return Ok(held);
            }
        }
        self.local.lock(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oncelog_bucket::Location;

    /// A segment of `len` bytes (from 0) stored as objects of uneven sizes, as shipping rounds
    /// leave it.
    fn stored(dir: &std::path::Path, len: usize, cuts: &[usize]) -> (Bucket, SegmentRef, Vec<u8>) {
        let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        let location: Location = format!("file://{}/bucket", dir.display()).parse().expect("url");
        let bucket = Bucket::open(&location, &[]).expect("open");
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let ranges = rt.block_on(async {
            let w = bucket.take_over("t", 0).await.expect("take over");
            let mut bounds = vec![0];
            bounds.extend_from_slice(cuts);
            bounds.push(len);
            let mut ranges = Vec::new();
            for p in bounds.windows(2) {
                let key = oncelog_bucket::keys::range(1, 7, p[0] as u64, p[1] as u64);
                ranges.push(w.put(&key, Bytes::copy_from_slice(&data[p[0]..p[1]])).await.expect("put"));
            }
            ranges
        });
        (bucket, SegmentRef { number: 7, start: 0, ranges }, data)
    }

    #[test]
    fn a_cold_segment_reads_back_its_bytes_across_blocks_and_objects() {
        let dir = tempfile::tempdir().expect("tempdir");
        let len = 2 * BLOCK as usize + 300_000;
        let (bucket, seg, data) = stored(dir.path(), len, &[10, 700_000, BLOCK as usize + 5, 2 * BLOCK as usize]);
        let cold = Cold::new(bucket).expect("cold");
        let file = cold.add(seg.clone());
        assert_eq!(file.len().expect("len"), len as u64);
        // The first read fetches block 0 and reads block 1 ahead.
        let mut first = [0u8; 1];
        file.read_exact_at(&mut first, 0).expect("read");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while file.cached(1).is_none() {
            assert!(std::time::Instant::now() < deadline, "block 1 was not read ahead");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        // Forward in uneven steps, then backwards, then across both block boundaries in one
        // read.
        let mut at = 0;
        for step in [1usize, 4095, 65_536, 900_000, 333_333].iter().cycle() {
            if at >= len {
                break;
            }
            let n = (*step).min(len - at);
            let mut buf = vec![0u8; n];
            file.read_exact_at(&mut buf, at as u64).expect("read");
            assert_eq!(buf, data[at..at + n], "bytes {at}..{}", at + n);
            at += n;
        }
        for at in [2 * BLOCK as usize + 100, BLOCK as usize - 1, 3] {
            let mut buf = vec![0u8; 17];
            file.read_exact_at(&mut buf, at as u64).expect("read");
            assert_eq!(buf, data[at..at + 17]);
        }
        let mut all = vec![0u8; len - 1];
        file.read_exact_at(&mut all, 1).expect("read");
        assert_eq!(all, data[1..]);
        // Past the end: refused, not zeros.
        let mut buf = vec![0u8; 2];
        assert!(file.read_exact_at(&mut buf, len as u64 - 1).is_err());
        assert!(file.write_all_at(b"x", 0).is_err(), "read-only");
        assert_eq!(cold.download(&seg, seg.start, seg.end()).expect("download"), data);
    }

    #[test]
    fn the_tiered_file_system_lists_and_opens_cold_segments_and_forgets_removed_ones() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (bucket, seg, data) = stored(dir.path(), 5000, &[1000]);
        let local: Arc<dyn Fs> = Arc::new(crate::fs::RealFs::new(dir.path().join("data")));
        local.create_dir("").expect("dir");
        local.create_dir(format::LOG_DIR).expect("log dir");
        let cold = Cold::new(bucket).expect("cold");
        let fs = TieredFs { local, cold: cold.clone(), held: Mutex::new(None) };
        let name = format::segment_name(7);
        assert!(!fs.exists(&name).expect("exists"));
        cold.add(seg);
        assert!(fs.exists(&name).expect("exists"));
        assert_eq!(fs.list(format::LOG_DIR).expect("list"), vec![name.rsplit('/').next().expect("base").to_owned()]);
        let f = fs.open(&name, false).expect("open");
        let mut buf = vec![0u8; 5000];
        f.read_exact_at(&mut buf, 0).expect("read");
        assert_eq!(buf, data);
        fs.remove(&name).expect("remove");
        assert!(!fs.exists(&name).expect("exists") && !cold.is_cold(7));
    }
}
