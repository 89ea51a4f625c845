//! The log in a bucket (`--object-store`; docs/design/issue-35-plan.md): the shipper that sends
//! what the log has synced, as immutable ranges of segment files (whole frames) and checkpoints,
//! and publishes manifests naming a prefix of the frame sequence; and the start of a node on a
//! bucket: a restore into an empty data directory, or a check that the data directory holds the
//! bucket's cut, then the takeover that fences every older writer.
//!
//! Why whole frames and not a model of their own: an append and all its effects (producer
//! state, idempotency key, `Stream-Seq`, closure) are one record in one frame, and a
//! transaction one frame, so any prefix of frames is a state the engine was in. A restored node
//! is the old one as of the cut, producer states exactly consistent with the data.
//!
//! Invariants:
//! 1. A published cut names bytes the bucket holds: its objects are created before the manifest
//!    that names them ([`oncelog_bucket::Writer::publish`] after every `put`).
//! 2. A cut's checkpoint is as of an LSN at or before its end, and the segments it drops are
//!    exactly those that checkpoint made unnecessary: local segment files are removed only after
//!    a cut without them is published (`store::write_checkpoint_keeping`).
//! 3. A fenced shipper stops the engine's writes (fail-stop, with its reason): after a takeover
//!    nothing of this node's becomes visible, and it says so.
//! 4. Only the writer deletes log objects, and never one its published cut names: dropped ones
//!    after [`DELETE_GRACE`], and (the sweep) ones no cut names — a fenced writer's leftovers, a
//!    failed round's, a crashed node's doomed ones — once they are [`SWEEP_AFTER`] old.

use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use oncelog_bucket::{keys, Bucket, BucketError, CheckpointRef, Cut, LogPosition, ObjectRef, SegmentRef, Writer};
use oncelog_storage::StorageError;

use crate::cold::Cold;
use crate::error::{backend, LogError};
use crate::format;
use crate::fs::Fs;
use crate::store::{self, Counters, Synced, View};

pub use crate::options::{AckMode, Tier};

/// What the shipper is told between rounds.
pub(crate) enum ShipMsg {
    /// A checkpoint was written (the checkpointer).
    Checkpoint(Shipment),
    /// A group was written whose writers wait for the bucket (the writer, `--ack-mode bucket`):
    /// ship now.
    Synced,
}

/// A checkpoint written while shipping, with the segments it made unnecessary.
pub(crate) struct Shipment {
    pub lsn: u64,
    pub bytes: Vec<u8>,
    pub dead: Vec<u64>,
}

/// How often a start restores or checks again because the bucket moved on before its takeover
/// (each after a pause of `oncelog_bucket::bucket::TAKEOVER_PAUSE`: together far longer than a
/// busy writer takes to yield to the takeover's claim).
const TAKEOVER_ATTEMPTS: usize = 16;

/// Marks a restore in progress: a data directory holding it is restored again from scratch.
const RESTORING: &str = "restoring";

/// The bucket prefix this data directory's writer last took over (its `--object-store`
/// location): a directory started on another prefix says which one it leaves.
const PREFIX: &str = "object-store";

fn io(what: &str) -> impl Fn(std::io::Error) -> StorageError + '_ {
    move |e| backend(LogError::Io { what: what.into(), source: e })
}

pub(crate) fn bucket_err(e: BucketError) -> StorageError {
    backend(LogError::Bucket(e))
}

/// Whether the data directory holds no log yet (or only a restore that did not finish).
fn local_is_empty(fs: &dyn Fs) -> Result<bool, StorageError> {
    if fs.exists(RESTORING).map_err(io("inspect the data directory"))? {
        return Ok(true);
    }
    if fs.exists(format::CHECKPOINT).map_err(io("inspect the data directory"))? {
        return Ok(false);
    }
    if !fs.exists(format::LOG_DIR).map_err(io("inspect the data directory"))? {
        return Ok(true);
    }
    let names = fs.list(format::LOG_DIR).map_err(io("list the log directory"))?;
    Ok(!names.iter().any(|n| format::parse_segment_name(n).is_some()))
}

/// Before the store opens: takes the prefix over and restores its cut into an empty data
/// directory, or checks that a data directory with a log holds the bucket's cut (it may be
/// ahead, never elsewhere) and takes the prefix over *as of that cut*. Either way the writer's
/// cut is exactly the state the directory was restored or checked against, so what it ships
/// next continues it. Also returns the local checkpoint when it is newer than the cut's (a
/// directory that ran without the bucket, or whose last checkpoint was not shipped): the cut
/// may need it, since segments before it may be gone.
///
/// Why the order differs: an empty directory is a replacement node, so it fences the old
/// writer first (after its takeover no older writer can publish, the cut stands still while it
/// downloads); a directory with a log must not fence anyone unless it holds the bucket's cut,
/// so it checks first, and checks again if a manifest appeared meanwhile.
pub(crate) async fn prepare(
    fs: &dyn Fs,
    cold: &Arc<Cold>,
    tier: &Tier,
    now_ms: i64,
) -> Result<(Writer, Option<Shipment>), StorageError> {
    let (id, known) = dir_id(fs)?;
    let node = format!("{}/{id}", tier.node);
    let empty = local_is_empty(fs)?;
    let previous = read_small(fs, PREFIX, "read the directory's bucket prefix")?;
    let here = tier.bucket.location();
    let writer = if empty {
        let writer = tier.bucket.take_over(&node, now_ms).await.map_err(bucket_err)?;
        if !writer.published().cut.segments.is_empty() {
            restore(fs, &tier.bucket, &writer.published().cut, now_ms).await?;
        }
        writer
    } else {
        let mut attempts = 0;
        loop {
            attempts += 1;
            let newest = tier.bucket.newest().await.map_err(bucket_err)?;
            if let Some(m) = newest.as_ref() {
                // Another directory's writer took over since this one wrote: even if it added
                // nothing yet, this directory is not the bucket's (it may have acknowledged
                // writes this one never saw) and must not take the prefix back.
                let writer_dir = m.node.rsplit_once('/').map(|(_, d)| d);
                if known && writer_dir != Some(id.as_str()) {
                    return Err(backend(LogError::NotTheBucketsLog(format!(
                        "node {} took the bucket over after this directory's writer",
                        m.node
                    ))));
                }
                if !m.cut.segments.is_empty() {
                    check_holds(fs, &m.cut)?;
                }
            }
            if let Some(w) = tier.bucket.take_over_after(newest.as_ref(), &node, now_ms).await.map_err(bucket_err)? {
                break w;
            }
            // A busy writer took the name first: it is asked to yield (as `Bucket::take_over`
            // does), and this directory is checked against the state it leaves.
            let lost_to = tier.bucket.lost_takeover(newest.as_ref(), &node).await.map_err(bucket_err)?;
            if attempts >= TAKEOVER_ATTEMPTS {
                return Err(bucket_err(tier.bucket.contended(lost_to).await));
            }
            tracing::info!("the bucket moved on before the takeover; checking against its new state");
        }
    };
    match previous.as_deref() {
        // A directory that wrote to another prefix (typically a fenced node's, restarted with
        // a new `--object-store`) brings its log to this one and is no longer the old one's
        // writer: never silently.
        Some(old) if old != here && !empty => tracing::warn!(
            old_prefix = old,
            new_prefix = here,
            epoch = writer.epoch(),
            "this data directory last wrote to bucket prefix {old}; it took over {here} with its log \
             (the old prefix keeps what it had; this node no longer writes there)"
        ),
        Some(old) if old != here => {
            tracing::info!(
                old_prefix = old,
                new_prefix = here,
                "a data directory without a log: restored from the new prefix"
            )
        }
        _ => {}
    }
    if previous.as_deref() != Some(here) {
        write_small(fs, PREFIX, here, "record the directory's bucket prefix")?;
    }
    let cut = &writer.published().cut;
    // The cut's segments that are not here (left in the bucket by a restore, or evicted) are
    // cold: read from the bucket.
    for seg in &cut.segments {
        if !fs.exists(&format::segment_name(seg.number)).map_err(io("inspect the log directory"))? {
            cold.add(seg.clone());
        }
    }
    let cut_ckp = cut.checkpoint.as_ref().map_or(0, |c| c.lsn);
    let pending = local_checkpoint(fs, now_ms)?.filter(|s| s.lsn > cut_ckp);
    tracing::info!(location = %tier.bucket.location(), epoch = writer.epoch(), lsn = writer.published().cut.end.lsn, "writing to the bucket");
    metrics::gauge!("oncelog_bucket_epoch").set(writer.epoch() as f64);
    Ok((writer, pending))
}

/// This data directory's identity ([`format::DIR_ID`]), created (and synced) when missing;
/// whether it was there already (a directory without one cannot tell whether it was the
/// bucket's last writer, and is judged by its log alone).
fn dir_id(fs: &dyn Fs) -> Result<(String, bool), StorageError> {
    use std::hash::{BuildHasher, Hasher};
    fs.create_dir("").map_err(io("create the data directory"))?;
    if fs.exists(format::DIR_ID).map_err(io("inspect the data directory"))? {
        let f = fs.open(format::DIR_ID, false).map_err(io("read the directory id"))?;
        let mut buf = vec![0u8; f.len().map_err(io("read the directory id"))? as usize];
        f.read_exact_at(&mut buf, 0).map_err(io("read the directory id"))?;
        let id = String::from_utf8_lossy(&buf).trim().to_owned();
        if !id.is_empty() && id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Ok((id, true));
        }
    }
    // Random enough to tell directories apart: the std hasher's per-process random keys over
    // the time and the process id (no random-number crate for one number).
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
    h.write_u32(std::process::id());
    let id = format!("{:016x}", h.finish());
    let f = fs.open(format::DIR_ID, true).map_err(io("write the directory id"))?;
    f.set_len(0).map_err(io("write the directory id"))?;
    f.write_all_at(id.as_bytes(), 0).map_err(io("write the directory id"))?;
    f.sync_data().map_err(io("sync the directory id"))?;
    fs.sync_dir("").map_err(io("sync the data directory"))?;
    Ok((id, false))
}

/// The contents of the small text file `name` of the data directory (trimmed; `None`: absent).
fn read_small(fs: &dyn Fs, name: &str, what: &str) -> Result<Option<String>, StorageError> {
    if !fs.exists(name).map_err(io(what))? {
        return Ok(None);
    }
    let f = fs.open(name, false).map_err(io(what))?;
    let len = usize::try_from(f.len().map_err(io(what))?).unwrap_or(usize::MAX).min(4096);
    let mut buf = vec![0u8; len];
    f.read_exact_at(&mut buf, 0).map_err(io(what))?;
    Ok(Some(String::from_utf8_lossy(&buf).trim().to_owned()))
}

/// Replaces the small text file `name` of the data directory with `text`, synced.
fn write_small(fs: &dyn Fs, name: &str, text: &str, what: &str) -> Result<(), StorageError> {
    let f = fs.open(name, true).map_err(io(what))?;
    f.set_len(0).map_err(io(what))?;
    f.write_all_at(text.as_bytes(), 0).map_err(io(what))?;
    f.sync_data().map_err(io(what))?;
    fs.sync_dir("").map_err(io(what))
}

/// The data directory's checkpoint as a shipment (no segments to drop: the checkpointer that
/// wrote it removed them, or keeps them for the shipper's next checkpoint).
fn local_checkpoint(fs: &dyn Fs, now_ms: i64) -> Result<Option<Shipment>, StorageError> {
    let Some(bytes) = store::read_checkpoint(fs)? else { return Ok(None) };
    let cp = format::Checkpoint::decode(&bytes, now_ms)
        .map_err(|e| backend(LogError::Corrupt(format!("checkpoint: {e}"))))?;
    Ok(Some(Shipment { lsn: cp.lsn, bytes, dead: Vec::new() }))
}

/// Writes the cut's checkpoint and the segments recovery replays (from the one the checkpoint
/// continues in) into the data directory, byte for byte; the older segments stay in the bucket,
/// cold ([`prepare`] makes every segment of the cut that is not here so), and the shipper fills the local cache with them later: the
/// node serves once recovery ran, whatever the size of the log.
async fn restore(fs: &dyn Fs, bucket: &Bucket, cut: &Cut, now_ms: i64) -> Result<(), StorageError> {
    let started = Instant::now();
    fs.create_dir("").map_err(io("create the data directory"))?;
    if !fs.exists(RESTORING).map_err(io("inspect the data directory"))? {
        fs.open(RESTORING, true).map_err(io("mark the restore"))?;
        fs.sync_dir("").map_err(io("sync the data directory"))?;
    }
    // Whatever an earlier, interrupted restore left goes first.
    if fs.exists(format::CHECKPOINT).map_err(io("inspect the data directory"))? {
        fs.remove(format::CHECKPOINT).map_err(io("remove a partial restore"))?;
    }
    fs.create_dir(format::LOG_DIR).map_err(io("create the log directory"))?;
    for name in fs.list(format::LOG_DIR).map_err(io("list the log directory"))? {
        if format::parse_segment_name(&name).is_some() {
            fs.remove(&format!("{}/{name}", format::LOG_DIR)).map_err(io("remove a partial restore"))?;
        }
    }
    let mut bytes = 0u64;
    let checkpoint = match &cut.checkpoint {
        Some(c) => Some(bucket.read(&c.object).await.map_err(bucket_err)?),
        None => None,
    };
    // Without a checkpoint recovery replays every segment.
    let replay_from = match &checkpoint {
        Some(data) => {
            format::Checkpoint::decode(data, now_ms)
                .map_err(|e| backend(LogError::Corrupt(format!("the bucket's checkpoint: {e}"))))?
                .segment
        }
        None => 0,
    };
    for seg in cut.segments.iter().filter(|s| s.number >= replay_from) {
        let file = fs.open(&format::segment_name(seg.number), true).map_err(io("create a restored segment"))?;
        let mut at = seg.start;
        for r in &seg.ranges {
            let data = bucket.read(r).await.map_err(bucket_err)?;
            file.write_all_at(&data, at).map_err(io("write a restored segment"))?;
            at += r.len;
            bytes += r.len;
        }
        file.sync_data().map_err(io("sync a restored segment"))?;
    }
    fs.sync_dir(format::LOG_DIR).map_err(io("sync the log directory"))?;
    if let Some(data) = &checkpoint {
        store::install_checkpoint(fs, data)?;
        bytes += data.len() as u64;
    }
    fs.remove(RESTORING).map_err(io("finish the restore"))?;
    fs.sync_dir("").map_err(io("sync the data directory"))?;
    tracing::info!(
        bytes,
        segments = cut.segments.iter().filter(|s| s.number >= replay_from).count(),
        cold = cut.segments.iter().filter(|s| s.number < replay_from).count(),
        lsn = cut.end.lsn,
        elapsed = ?started.elapsed(),
        "restored the log from the bucket"
    );
    Ok(())
}

/// The frames of `buf` (the bytes of a segment from position `base`) from its start: where the
/// last whole, valid one ends and its LSN (`base` and 0 when there is none). `buf` may begin
/// with the segment's header (`base` 0).
fn whole_frames(buf: &[u8], base: u64) -> (u64, u64) {
    let mut at = if base == 0 { format::SEGMENT_HEADER as usize } else { 0 };
    let (mut end, mut lsn) = (if base == 0 { format::SEGMENT_HEADER } else { base }, 0);
    while let Some(h) = buf.get(at..).and_then(format::parse_frame_header) {
        let next = at + format::FRAME_HEADER + h.len;
        match buf.get(at..next) {
            Some(frame) if format::frame_is_valid(&h, frame) => {
                at = next;
                end = base + next as u64;
                lsn = h.lsn;
            }
            _ => break,
        }
    }
    (end.min(base + buf.len() as u64), lsn)
}

/// A data directory with a log must hold the bucket's cut: the cut's last range as stored
/// here, and a frame with the cut's last LSN ending where the cut ends. Anything else means
/// another node wrote to the bucket after this directory's writer (a takeover): its log went
/// elsewhere, and starting on it would fork the history.
fn check_holds(fs: &dyn Fs, cut: &Cut) -> Result<(), StorageError> {
    let diverged = |why: String| backend(LogError::NotTheBucketsLog(why));
    let (Some(seg), Some(last)) = (cut.segments.last(), cut.segments.last().and_then(|s| s.ranges.last())) else {
        return Ok(());
    };
    let name = format::segment_name(seg.number);
    if !fs.exists(&name).map_err(io("inspect the log directory"))? {
        return Err(diverged(format!("segment {} is not here", seg.number)));
    }
    let file = fs.open(&name, false).map_err(io("open a log segment"))?;
    let from = seg.end() - last.len;
    let mut buf = vec![0u8; last.len as usize];
    file.read_exact_at(&mut buf, from)
        .map_err(|_| diverged(format!("segment {} is shorter than the bucket's", seg.number)))?;
    if crc32c::crc32c(&buf) != last.crc32c {
        return Err(diverged(format!("segment {} differs at byte {from}", seg.number)));
    }
    let (end, lsn) = whole_frames(&buf, from);
    if (end, lsn) != (cut.end.pos, cut.end.lsn) && !(cut.end.pos == format::SEGMENT_HEADER && lsn == 0) {
        return Err(diverged(format!("frame {} does not end at byte {}", cut.end.lsn, cut.end.pos)));
    }
    Ok(())
}

/// The shipper: a thread of its own with a small runtime for the bucket's client.
pub(crate) struct Shipper {
    pub rx: mpsc::Receiver<ShipMsg>,
    pub writer: Writer,
    pub view: Arc<View>,
    pub counters: Arc<Counters>,
    pub fs: Arc<dyn Fs>,
    pub interval: Duration,
    /// The checkpoint waiting to be shipped (the newest one).
    pub pending: Option<Shipment>,
    /// Objects no published cut names any more, deleted once their grace period is over (a
    /// restore reading an older cut meanwhile still finds them).
    pub doomed: std::collections::VecDeque<(Instant, Vec<String>)>,
    /// When the bucket last held everything synced (for `oncelog_bucket_unshipped_seconds`).
    pub caught_up: Instant,
    /// [`Tier::sweep_after`].
    pub sweep_after: Duration,
    /// When the last sweep ran (`None`: not yet since the start).
    pub last_sweep: Option<Instant>,
    /// The cold segments ([`crate::cold`]); `fs` is the tiered file system over them and
    /// `local` the data directory itself.
    pub cold: Arc<Cold>,
    pub local: Arc<dyn Fs>,
    /// [`Tier::cache_max_bytes`].
    pub cache_max: Option<u64>,
    /// [`Tier::delete_grace`].
    pub delete_grace: Duration,
    /// The cache fill under way, if any.
    pub filling: Option<Fill>,
    /// `--ack-mode bucket`: the writer's queue, told after each publish (and a failure) so
    /// the groups waiting for the bucket are answered at once.
    pub wake: Option<crate::WriterTx>,
}

/// The cache filling back, on a thread of its own: a download of up to a segment must not
/// hold up the shipping rounds (and in `bucket` mode the acknowledgements waiting for them). It
/// fills cold segments one at a time, newest first, while they fit under `--cache-max-bytes`;
/// the shipper starts it when it finds one that fits and none is running, and joins it before
/// it ends, so nothing writes into the data directory after the engine stopped.
pub(crate) struct Fill {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

/// A fill downloads a segment in pieces of this size: what it holds in memory, and how long a
/// stop waits for it at most (one piece's GET).
const FILL_PIECE: u64 = 16 << 20;

/// How old a log object that no cut names must be before the sweep deletes it: far longer than
/// a shipping round (whose objects its publish names), a restore reading an older cut, or the
/// grace of dropped objects.
pub const SWEEP_AFTER: Duration = Duration::from_secs(3600);

/// Objects after which the segment a cut ends in is folded although it may still grow.
const FOLD_AT: usize = 32;

/// Where to fold a growing segment's objects from: the first object no larger than all the
/// objects after it together (`None`: each is larger than the rest after it, at most about
/// log2 of the segment's size of them). Folding from there at least doubles the size of the
/// object every folded byte is in, so a byte is uploaded again at most log2(segment / smallest
/// object) times.
fn fold_from(ranges: &[ObjectRef]) -> Option<usize> {
    let mut after = 0u64;
    let mut from = None;
    for (i, r) in ranges.iter().enumerate().rev() {
        if i + 1 < ranges.len() && r.len <= after {
            from = Some(i);
        }
        after += r.len;
    }
    from
}

/// How often the sweep lists the bucket (at most; sooner when objects may be swept sooner).
const SWEEP_EVERY: Duration = Duration::from_secs(600);

/// How long objects a cut dropped stay in the bucket: a restore that read the cut before has
/// this long to fetch them ([`Tier::delete_grace`]).
pub const DELETE_GRACE: Duration = Duration::from_secs(300);

impl Shipper {
    /// Ships every interval, and when a checkpoint arrives, until fenced, and once more when
    /// the engine stops (its checkpointer drops the channel after the last checkpoint). Blocks
    /// its own thread between rounds: nothing else runs on the shipper's runtime.
    pub async fn run(mut self) {
        loop {
            let mut stop = match self.rx.recv_timeout(self.interval) {
                Ok(m) => {
                    self.take(m);
                    false
                }
                Err(mpsc::RecvTimeoutError::Timeout) => false,
                Err(mpsc::RecvTimeoutError::Disconnected) => true,
            };
            // Everything that came meanwhile goes into this round: under load a round carries
            // the many groups written while the last one was uploading.
            loop {
                match self.rx.try_recv() {
                    Ok(m) => self.take(m),
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => {
                        stop = true;
                        break;
                    }
                }
            }
            let due = self.last_sweep.is_none_or(|t| t.elapsed() >= SWEEP_EVERY.min(self.sweep_after));
            let shipped = match self.ship().await {
                Ok(()) => self.fold().await,
                r => r,
            };
            let shipped = match shipped {
                Ok(()) if due => self.sweep().await,
                r => r,
            };
            if shipped.is_ok() {
                self.delete_doomed().await;
                self.cache();
            }
            self.gauge_behind();
            let stopped = match shipped {
                Ok(()) => None,
                Err(BucketError::Fenced { mine, by }) => Some(format!(
                    "writes stopped: fenced by writer epoch {by} of the bucket (this node was epoch {mine}); \
                     another node took the bucket over"
                )),
                Err(BucketError::Yielded { mine, by, node }) => Some(format!(
                    "writes stopped: node {node} is taking the bucket over as writer epoch {by} (this node was \
                     epoch {mine}); yielded to it"
                )),
                Err(e) => {
                    metrics::counter!("oncelog_bucket_errors_total").increment(1);
                    tracing::warn!(error = %e, "shipping to the bucket failed; trying again");
                    None
                }
            };
            if let Some(why) = stopped {
                tracing::error!("{why}");
                self.counters.fail(why);
                self.wake_writer();
                self.end_fill(true);
                return;
            }
            if stop {
                self.end_fill(true);
                return;
            }
        }
    }

    /// Tells the writer (in `--ack-mode bucket`) that the bucket's state changed.
    fn wake_writer(&self) {
        if let Some(tx) = self.wake.as_ref().and_then(|w| w.lock().ok().and_then(|tx| tx.clone())) {
            let _ = tx.send(crate::store::Command::Shipped);
        }
    }

    /// Takes the cache fill if it finished (or, with `stop`, stops it and waits for it).
    fn end_fill(&mut self, stop: bool) {
        let Some(f) = self.filling.take_if(|f| stop || f.thread.is_finished()) else { return };
        f.stop.store(stop, std::sync::atomic::Ordering::Relaxed);
        if f.thread.join().is_err() {
            tracing::warn!("the cache fill's thread panicked");
        }
    }

    /// Sets the gauges of what is synced and not yet in a published cut (bytes, and seconds
    /// since the bucket last held everything), after every round, failed ones too.
    fn gauge_behind(&mut self) {
        let synced: Synced = self.view.synced.lock().map(|s| *s).unwrap_or_default();
        let cut = &self.writer.published().cut;
        let behind = if synced.lsn <= cut.end.lsn {
            0
        } else {
            let sizes: Vec<(u64, u64)> = match self.view.segments.read() {
                Ok(segs) => segs
                    .iter()
                    .filter(|(n, _)| **n <= synced.segment)
                    .map(|(n, f)| (*n, if *n == synced.segment { synced.pos } else { f.len().unwrap_or(0) }))
                    .collect(),
                Err(_) => Vec::new(),
            };
            let shipped = |n: u64| cut.segments.iter().find(|s| s.number == n).map_or(0, SegmentRef::end);
            sizes.iter().map(|(n, len)| len.saturating_sub(shipped(*n))).sum::<u64>().max(1)
        };
        if behind == 0 {
            self.caught_up = Instant::now();
        }
        metrics::gauge!("oncelog_bucket_unshipped_bytes").set(behind as f64);
        let seconds = if behind == 0 { 0.0 } else { self.caught_up.elapsed().as_secs_f64() };
        metrics::gauge!("oncelog_bucket_unshipped_seconds").set(seconds);
    }

    fn take(&mut self, m: ShipMsg) {
        if let ShipMsg::Checkpoint(s) = m {
            self.pending = Some(s);
        }
    }

    /// Ships what was synced since the last publish, and the pending checkpoint once the cut
    /// reaches it, then publishes the new cut. Nothing is published unless every segment up to
    /// what was synced is shipped; the pending checkpoint and the local files it made
    /// unnecessary are let go only after a publish that holds it.
    async fn ship(&mut self) -> Result<(), BucketError> {
        let synced: Synced = self.view.synced.lock().map(|s| *s).unwrap_or_default();
        let mut cut = self.writer.published().cut.clone();
        // What the bucket already holds (the cut taken over, at first) counts as shipped.
        self.counters.shipped_lsn.fetch_max(cut.end.lsn, std::sync::atomic::Ordering::AcqRel);
        let epoch = self.writer.epoch();
        let mut changed = false;
        // A checkpoint at or before what was synced goes into this cut, and the segments it made
        // unnecessary leave it (every frame in them is at or before the checkpoint).
        let ckp = self.pending.as_ref().filter(|p| p.lsn <= synced.lsn);
        let dead: Vec<u64> = ckp.map(|p| p.dead.clone()).unwrap_or_default();
        let local: Vec<(u64, Arc<dyn crate::fs::File>)> = match self.view.segments.read() {
            Ok(segs) => segs
                .iter()
                .filter(|(n, _)| **n <= synced.segment && !dead.contains(n))
                .map(|(n, f)| (*n, f.clone()))
                .collect(),
            Err(_) => return Ok(()),
        };
        let mut end = cut.end;
        for (n, file) in local {
            let shipped = cut.segments.iter().find(|s| s.number == n).map_or(0, SegmentRef::end);
            let limit = if n == synced.segment { synced.pos } else { file.len().unwrap_or(0) };
            if shipped >= limit {
                continue;
            }
            let mut buf = vec![0u8; (limit - shipped) as usize];
            if let Err(e) = file.read_exact_at(&mut buf, shipped) {
                tracing::warn!(segment = n, error = %e, "a log segment could not be read for shipping");
                return Ok(());
            }
            let (upto, lsn) = if n == synced.segment { (synced.pos, synced.lsn) } else { whole_frames(&buf, shipped) };
            buf.truncate((upto - shipped) as usize);
            if buf.is_empty() {
                continue;
            }
            let object = self.writer.put(&keys::range(epoch, n, shipped, upto), Bytes::from(buf)).await?;
            metrics::counter!("oncelog_bucket_puts_total").increment(1);
            metrics::counter!("oncelog_bucket_shipped_bytes_total").increment(object.len);
            match cut.segments.iter_mut().find(|s| s.number == n) {
                Some(s) => s.ranges.push(object),
                None => cut.segments.push(SegmentRef { number: n, start: shipped, ranges: vec![object] }),
            }
            cut.segments.sort_by_key(|s| s.number);
            end = LogPosition { lsn: if lsn > 0 { lsn } else { end.lsn }, segment: n, pos: upto };
            changed = true;
        }
        let mut removed: Vec<ObjectRef> = Vec::new();
        let mut with_ckp = false;
        if let Some(p) = self.pending.as_ref().filter(|p| p.lsn <= end.lsn) {
            let key = keys::checkpoint(epoch, p.lsn, crc32c::crc32c(&p.bytes));
            let object = self.writer.put(&key, Bytes::from(p.bytes.clone())).await?;
            metrics::counter!("oncelog_bucket_puts_total").increment(1);
            let old = cut.checkpoint.replace(CheckpointRef { lsn: p.lsn, object });
            removed.extend(old.map(|c| c.object).filter(|o| !o.key.is_empty()));
            cut.segments.retain(|s| {
                let gone = p.dead.contains(&s.number);
                if gone {
                    removed.extend(s.ranges.iter().cloned());
                }
                !gone
            });
            with_ckp = true;
            changed = true;
        }
        if !changed {
            return Ok(());
        }
        cut.end = end;
        let started = Instant::now();
        // Segment tables the new manifest no longer names go the way of dropped objects.
        removed.extend(self.writer.publish(cut, now_ms()).await?);
        self.counters.shipped_lsn.store(end.lsn, std::sync::atomic::Ordering::Release);
        self.wake_writer();
        metrics::counter!("oncelog_bucket_puts_total").increment(1);
        metrics::histogram!("oncelog_bucket_publish_seconds").record(started.elapsed().as_secs_f64());
        if with_ckp {
            if let Some(p) = self.pending.take() {
                self.remove_local(&p.dead);
            }
        }
        if !removed.is_empty() {
            self.doomed.push_back((Instant::now() + self.delete_grace, removed.into_iter().map(|o| o.key).collect()));
        }
        Ok(())
    }

    /// Folds the objects of one segment of the published cut into one object, and publishes
    /// that: all of a sealed segment's, so a restore or a cold read of it is one object; and for
    /// the segment the cut ends in, once it has [`FOLD_AT`] objects, the ones [`fold_from`]
    /// picks, so its object count stays bounded while it grows slowly, each byte uploaded again
    /// only a logarithmic number of times. The objects it replaces are dropped after their
    /// grace. One segment per round, after the round's publish (which acknowledges): a fold
    /// delays only the next round.
    async fn fold(&mut self) -> Result<(), BucketError> {
        let cut = &self.writer.published().cut;
        let pick = cut.segments.iter().filter(|s| s.ranges.len() > 1 && !self.cold.is_cold(s.number)).find_map(|s| {
            if s.number < cut.end.segment {
                Some((s.clone(), 0))
            } else if s.ranges.len() >= FOLD_AT {
                fold_from(&s.ranges).map(|i| (s.clone(), i))
            } else {
                None
            }
        });
        let Some((seg, from)) = pick else { return Ok(()) };
        let Some(file) = self.view.segments.read().ok().and_then(|segs| segs.get(&seg.number).cloned()) else {
            return Ok(());
        };
        let pos = seg.start + seg.ranges[..from].iter().map(|r| r.len).sum::<u64>();
        let mut buf = vec![0u8; (seg.end() - pos) as usize];
        if let Err(e) = file.read_exact_at(&mut buf, pos) {
            tracing::warn!(segment = seg.number, error = %e, "a log segment could not be read for folding");
            return Ok(());
        }
        // The local bytes are the objects' (checked, as the fold replaces them).
        let mut at = 0usize;
        for r in &seg.ranges[from..] {
            if crc32c::crc32c(&buf[at..at + r.len as usize]) != r.crc32c {
                tracing::error!(segment = seg.number, object = %r.key, "a log segment differs from its objects; not folded");
                return Ok(());
            }
            at += r.len as usize;
        }
        let key = keys::range(self.writer.epoch(), seg.number, pos, seg.end());
        let object = self.writer.put(&key, Bytes::from(buf)).await?;
        metrics::counter!("oncelog_bucket_puts_total").increment(1);
        let mut next = cut.clone();
        let Some(entry) = next.segments.iter_mut().find(|s| s.number == seg.number) else { return Ok(()) };
        let mut replaced: Vec<ObjectRef> = entry.ranges.splice(from.., [object]).collect();
        replaced.extend(self.writer.publish(next, now_ms()).await?);
        metrics::counter!("oncelog_bucket_puts_total").increment(1);
        metrics::counter!("oncelog_bucket_folds_total").increment(1);
        self.doomed.push_back((Instant::now() + self.delete_grace, replaced.into_iter().map(|o| o.key).collect()));
        Ok(())
    }

    /// Deletes the log objects that neither the published cut names nor wait for their
    /// grace period to end, once they are [`Tier::sweep_after`] old (invariant 4). Runs
    /// between rounds, so every object of this writer's own rounds is named or doomed, or was
    /// left by a failed round (which the next round creates again if it needs it).
    ///
    /// Only while this writer's manifest is the newest: a zombie with nothing to ship never
    /// publishes, so without the check it would go on sweeping by its stale cut and delete the
    /// objects its successor wrote. A takeover after the check names, besides this cut, only
    /// objects younger than the sweep itself. Finding a newer writer fences this one.
    async fn sweep(&mut self) -> Result<(), BucketError> {
        self.last_sweep = Some(Instant::now());
        let mine = self.writer.published();
        if let Some(newest) = self.writer.bucket().newest().await? {
            if newest.number > mine.number || (newest.number == mine.number && newest.epoch != mine.epoch) {
                return Err(BucketError::Fenced { mine: mine.epoch, by: newest.epoch });
            }
            if newest.number < mine.number {
                // A listing that missed this writer's newest (not a snapshot): no verdict;
                // the next sweep looks again.
                return Ok(());
            }
        }
        let cut = &self.writer.published().cut;
        let mut named: std::collections::HashSet<&str> =
            cut.segments.iter().flat_map(|s| s.ranges.iter().map(|r| r.key.as_str())).collect();
        named.extend(cut.checkpoint.iter().map(|c| c.object.key.as_str()));
        named.extend(self.writer.published().table.iter().map(|t| t.object.key.as_str()));
        let objects = self.writer.bucket().objects().await?;
        self.check_named(&named, &objects);
        named.extend(self.doomed.iter().flat_map(|(_, keys)| keys.iter().map(String::as_str)));
        let before = now_ms().saturating_sub(i64::try_from(self.sweep_after.as_millis()).unwrap_or(i64::MAX));
        let gone: Vec<String> = objects
            .into_iter()
            .filter(|(k, at)| !named.contains(k.as_str()) && *at <= before)
            .map(|(k, _)| k)
            .collect();
        for k in &gone {
            self.writer.bucket().delete(k).await;
        }
        if !gone.is_empty() {
            metrics::counter!("oncelog_bucket_swept_total").increment(gone.len() as u64);
            tracing::info!(objects = gone.len(), "swept objects no cut names");
        }
        Ok(())
    }

    /// Checks that every object the published cut names (`named`) is among those listed:
    /// one deleted or lost under a running node would otherwise go unnoticed until a restore
    /// from the bucket fails. Sets `oncelog_bucket_missing_objects`, and says which ones with an
    /// ERROR line. Every named object was created before the manifest naming it was, and so
    /// before this listing started (a listing may miss only what is created while it runs).
    fn check_named(&self, named: &std::collections::HashSet<&str>, objects: &[(String, i64)]) {
        let listed: std::collections::HashSet<&str> = objects.iter().map(|(k, _)| k.as_str()).collect();
        let mut missing: Vec<&str> = named.iter().copied().filter(|k| !listed.contains(k)).collect();
        metrics::gauge!("oncelog_bucket_missing_objects").set(missing.len() as f64);
        if missing.is_empty() {
            return;
        }
        missing.sort_unstable();
        let shown = missing.iter().take(10).copied().collect::<Vec<_>>().join(", ");
        tracing::error!(
            manifest = %keys::manifest(self.writer.published().number),
            missing = missing.len(),
            "objects the published cut names are missing from the bucket (deleted or lost under this node): \
             {shown}; a restore from the bucket would fail"
        );
    }

    /// Deletes the objects whose grace period is over.
    async fn delete_doomed(&mut self) {
        while self.doomed.front().is_some_and(|(at, _)| *at <= Instant::now()) {
            if let Some((_, keys)) = self.doomed.pop_front() {
                for k in keys {
                    self.writer.bucket().delete(&k).await;
                }
            }
        }
    }

    /// Keeps the local segment files within `--cache-max-bytes`: evicts the oldest sealed
    /// segments the published cut holds whole (they turn cold), or, with room, starts filling
    /// one cold segment back (the newest: recent data is read most) when no fill is under way.
    fn cache(&mut self) {
        self.end_fill(false);
        let cut = &self.writer.published().cut;
        let Some(local) = local_segments(&self.view, &self.cold) else { return };
        let mut bytes = local.iter().map(|(_, len)| len).sum::<u64>();
        match self.cache_max {
            Some(max) if bytes > max => {
                // Oldest first; never the segment the cut ends in (it may grow) or later ones.
                for (n, len) in local {
                    if bytes <= max || n >= cut.end.segment {
                        break;
                    }
                    // Only a folded segment (one object): a cold read is then one GET.
                    let Some(seg) = cut.segments.iter().find(|s| s.number == n && s.ranges.len() == 1) else {
                        continue;
                    };
                    let file = self.cold.add(seg.clone());
                    if let Ok(mut segs) = self.view.segments.write() {
                        segs.insert(n, file);
                    }
                    // Readers holding the local file finish on it; the space returns after.
                    if let Err(e) = self.local.remove(&format::segment_name(n)) {
                        tracing::warn!(segment = n, error = %e, "an evicted segment's file was not removed");
                    }
                    bytes = bytes.saturating_sub(len);
                    metrics::counter!("oncelog_bucket_cache_evictions_total").increment(1);
                }
            }
            _ if self.filling.is_none() && next_fill(&self.cold, bytes, self.cache_max).is_some() => self.start_fill(),
            _ => {}
        }
        metrics::gauge!("oncelog_bucket_cache_bytes").set(bytes as f64);
        // Also every round: the start's cold segments were counted before metrics were on.
        metrics::gauge!("oncelog_bucket_cold_segments").set(self.cold.newest_first().len() as f64);
    }

    fn start_fill(&mut self) {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (cold, local, view, max, flag) =
            (self.cold.clone(), self.local.clone(), self.view.clone(), self.cache_max, stop.clone());
        match std::thread::Builder::new()
            .name("oncelog-cache-fill".into())
            .spawn(move || fill_while_room(&cold, &*local, &view, max, &flag))
        {
            Ok(thread) => self.filling = Some(Fill { stop, thread }),
            Err(e) => tracing::warn!(error = %e, "the cache fill's thread did not start"),
        }
    }

    /// Removes the local files of segments that a published cut no longer names (invariant 2).
    fn remove_local(&self, dead: &[u64]) {
        let present: Vec<u64> = match self.view.segments.read() {
            Ok(segs) => dead.iter().copied().filter(|n| segs.contains_key(n)).collect(),
            Err(_) => return,
        };
        if let Err(e) = store::remove_segments(&*self.fs, &self.view, &present) {
            tracing::warn!(error = %e, "a log segment the bucket no longer needs was not removed");
        }
    }
}

/// The segments on the local disk (number, length), oldest first; `None`: the view is poisoned.
fn local_segments(view: &View, cold: &Cold) -> Option<Vec<(u64, u64)>> {
    let segs = view.segments.read().ok()?;
    Some(segs.iter().filter(|(n, _)| !cold.is_cold(**n)).map(|(n, f)| (*n, f.len().unwrap_or(0))).collect())
}

/// The cold segment to fill back next: the newest, if it fits beside the `local` bytes.
fn next_fill(cold: &Cold, local: u64, max: Option<u64>) -> Option<SegmentRef> {
    let newest = cold.newest_first().into_iter().next()?;
    max.is_none_or(|max| local + newest.segment().end() <= max).then(|| newest.segment().clone())
}

/// The cache fill's thread: fills cold segments back while one fits and it is not stopped.
fn fill_while_room(cold: &Cold, local: &dyn Fs, view: &View, max: Option<u64>, stop: &std::sync::atomic::AtomicBool) {
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let Some(on_disk) = local_segments(view, cold) else { return };
        let Some(seg) = next_fill(cold, on_disk.iter().map(|(_, len)| len).sum(), max) else { return };
        match fill(cold, local, view, &seg, stop) {
            Ok(0) => {}
            Ok(_) => metrics::counter!("oncelog_bucket_cache_fills_total").increment(1),
            Err(e) => {
                // Tried again when the shipper next finds room (a round later).
                tracing::warn!(segment = seg.number, error = %e, "a cold segment was not filled back");
                return;
            }
        }
    }
}

/// Downloads cold segment `seg` into its local file (a temporary name, piece by piece, synced,
/// renamed) and makes it local again: its length, or 0 when it was stopped or the segment was
/// removed meanwhile.
fn fill(
    cold: &Cold,
    local: &dyn Fs,
    view: &View,
    seg: &SegmentRef,
    stop: &std::sync::atomic::AtomicBool,
) -> std::io::Result<u64> {
    let (name, tmp) = (format::segment_name(seg.number), format!("{}.fill", format::segment_name(seg.number)));
    if local.exists(&tmp)? {
        local.remove(&tmp)?;
    }
    let f = local.open(&tmp, true)?;
    let mut at = seg.start;
    while at < seg.end() {
        if stop.load(std::sync::atomic::Ordering::Relaxed) {
            drop(f);
            local.remove(&tmp)?;
            return Ok(0);
        }
        let to = (at + FILL_PIECE).min(seg.end());
        f.write_all_at(&cold.download(seg, at, to)?, at)?;
        at = to;
    }
    f.sync_data()?;
    local.rename(&tmp, &name)?;
    local.sync_dir(format::LOG_DIR)?;
    let file = local.open(&name, false)?;
    if let Ok(mut segs) = view.segments.write() {
        // Removed meanwhile (dropped by a checkpoint): not brought back. (A removal between
        // the rename and here may have deleted the file already.)
        if !segs.contains_key(&seg.number) {
            drop(segs);
            cold.remove(seg.number);
            return match local.remove(&name) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                _ => Ok(0),
            };
        }
        segs.insert(seg.number, file);
    }
    cold.remove(seg.number);
    Ok(seg.end())
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(lsn: u64, payload: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; format::FRAME_HEADER];
        f.extend_from_slice(payload);
        format::seal_frame(&mut f, lsn);
        f
    }

    fn objects(lens: &[u64]) -> Vec<ObjectRef> {
        lens.iter().map(|len| ObjectRef { key: String::new(), len: *len, crc32c: 0 }).collect()
    }

    #[test]
    fn a_growing_segment_folds_from_its_first_object_not_larger_than_the_rest() {
        assert_eq!(fold_from(&objects(&[100, 40, 20, 10, 5])), None, "each larger than the rest after it");
        assert_eq!(fold_from(&objects(&[100, 10, 5, 5])), Some(1), "10 is not larger than 5 + 5");
        assert_eq!(fold_from(&objects(&[100, 12, 5, 5])), Some(2));
        assert_eq!(fold_from(&objects(&[100, 10, 20, 1])), Some(1));
        assert_eq!(fold_from(&objects(&[1, 1, 1, 1])), Some(0));
        assert_eq!(fold_from(&objects(&[7])), None);
        // A trickle of equal objects, folded whenever FOLD_AT pile up: the count stays bounded
        // and every byte is uploaded again only a few times.
        let (mut ranges, mut uploaded, mut written) = (Vec::new(), 0u64, 0u64);
        for _ in 0..100_000 {
            ranges.push(1u64);
            written += 1;
            uploaded += 1;
            if ranges.len() >= FOLD_AT {
                let from = fold_from(&objects(&ranges)).expect("a fold");
                let folded: u64 = ranges.drain(from..).sum();
                uploaded += folded;
                ranges.push(folded);
            }
            assert!(ranges.len() <= FOLD_AT);
        }
        assert!(uploaded <= written * 20, "uploaded {uploaded} for {written}");
    }

    #[test]
    fn whole_frames_stop_at_a_torn_or_zero_tail() {
        let mut seg = format::segment_header(3).to_vec();
        seg.extend(frame(7, b"abc"));
        seg.extend(frame(8, b"defgh"));
        let two = seg.len() as u64;
        assert_eq!(whole_frames(&seg, 0), (two, 8));
        // Zeros (allocated space) after the last frame: the clean end.
        let mut padded = seg.clone();
        padded.extend([0u8; 64]);
        assert_eq!(whole_frames(&padded, 0), (two, 8));
        // A torn frame after them: cut before it.
        let mut torn = seg.clone();
        let third = frame(9, b"ijk");
        torn.extend(&third[..third.len() - 1]);
        assert_eq!(whole_frames(&torn, 0), (two, 8));
        // From a frame boundary inside the segment.
        let first_end = (format::SEGMENT_HEADER as usize + format::FRAME_HEADER + 3) as u64;
        assert_eq!(whole_frames(&seg[first_end as usize..], first_end), (two, 8));
        // Only the header: nothing, at the header's end.
        assert_eq!(whole_frames(&seg[..format::SEGMENT_HEADER as usize], 0), (format::SEGMENT_HEADER, 0));
    }
}
