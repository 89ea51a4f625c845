//! Opening a data directory: the checkpoint loaded, the log after it replayed (a torn tail cut,
//! damage anywhere else refused), every stream's state rebuilt through the stream state
//! machine's one `apply`, and readers' state built.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use oncelog_protocol::digest::BodyDigest;
use oncelog_protocol::Offset;
use oncelog_storage::machine::chain::fork_chain;
use oncelog_storage::machine::parking::ParkingLot;
use oncelog_storage::machine::{self, AppendEffects, StreamState};
use oncelog_storage::*;

use crate::error::{backend, corrupt, LogError};
use crate::format::{self, AcceptedProducer, Checkpoint, Extent, Replayed};
use crate::fs::Fs;

use super::commit::new_segment;
use super::path_table::PathTable;
use super::view::{new_shared, Counters, StreamData, StreamView, View};
use super::{io_err, RecoveryReport, Store, StoreConfig, WStream};

// ---------------------------------------------------------------------------------------------
// Recovery

/// A stream as recovery rebuilds it, before readers exist.
struct Building {
    /// `None`: detached from its path by a purge (kept for its forks).
    path: Option<String>,
    st: StreamState,
    start: u64,
    extents: Vec<Extent>,
}

/// Opens the store: loads the checkpoint, replays the log after it (cutting a torn tail), and
/// rebuilds readers' state. Refuses to start on corruption anywhere but a torn tail.
pub(crate) fn open(fs: Arc<dyn Fs>, cfg: StoreConfig, now_ms: i64) -> Result<(Store, RecoveryReport), StorageError> {
    if fs.exists("keyspaces").map_err(|e| io_err("inspect the data directory", e))? {
        return Err(backend(LogError::FjallDirectory));
    }
    fs.create_dir("").map_err(|e| io_err("create the data directory", e))?;
    let lock = fs.lock(format::LOCK).map_err(|e| match e.kind() {
        std::io::ErrorKind::WouldBlock => backend(LogError::Locked),
        _ => io_err("lock the data directory", e),
    })?;
    let fresh = !fs.exists(format::LOG_DIR).map_err(|e| io_err("inspect the data directory", e))?;
    if fresh {
        fs.create_dir(format::LOG_DIR).map_err(|e| io_err("create the log directory", e))?;
        fs.sync_dir("").map_err(|e| io_err("sync the data directory", e))?;
    }
    let mut report = RecoveryReport::default();
    let cp = if let Some(buf) = super::checkpoint::read_checkpoint(&*fs)? {
        report.from_checkpoint = true;
        Checkpoint::decode(&buf, now_ms).map_err(|e| corrupt(format!("checkpoint: {e}")))?
    } else {
        Checkpoint {
            lsn: 0,
            segment: 1,
            pos: format::SEGMENT_HEADER,
            next_id: 1,
            streams: Vec::new(),
            meta: Vec::new(),
        }
    };
    let mut numbers: Vec<u64> = fs
        .list(format::LOG_DIR)
        .map_err(|e| io_err("list the log directory", e))?
        .iter()
        .filter_map(|n| format::parse_segment_name(n))
        .collect();
    numbers.sort_unstable();
    // Segments before the checkpoint's hold only data (or nothing still needed).
    let first = numbers.iter().position(|n| *n >= cp.segment).unwrap_or(numbers.len());
    let to_replay = &numbers[first..];
    report.segments_replayed = to_replay.len();
    for w in to_replay.windows(2) {
        if w[1] != w[0] + 1 {
            return Err(corrupt(format!("log segment {} is missing", w[0] + 1)));
        }
    }
    if to_replay.first().is_some_and(|n| *n != cp.segment)
        || (to_replay.is_empty() && report.from_checkpoint && cp.lsn > 0 && cp.pos > format::SEGMENT_HEADER)
    {
        return Err(corrupt(format!("log segment {} (where the checkpoint continues) is missing", cp.segment)));
    }

    let mut streams: HashMap<u64, Building> = HashMap::new();
    let mut next_id = cp.next_id;
    let mut meta: BTreeMap<Vec<u8>, Bytes> = cp.meta.into_iter().collect();
    for s in cp.streams {
        let st = StreamState {
            meta: s.meta,
            tail: Offset(s.tail),
            producers: s.producers.into_iter().collect(),
            producers_elsewhere: 0,
            keys: (!s.keys.is_empty()).then(|| Box::new(s.keys.into_iter().collect())),
            marks: s.marks,
        };
        streams.insert(st.meta.id, Building { path: s.path, st, start: s.start, extents: s.extents });
    }
    // Every segment a checkpointed stream still has data in must be there (a backup that missed
    // one, or a file removed by hand): refuse to start rather than fail its reads later.
    let present: std::collections::HashSet<u64> = numbers.iter().copied().collect();
    for b in streams.values() {
        if let Some(missing) = b.extents.iter().map(|e| e.segment()).find(|n| !present.contains(n)) {
            return Err(corrupt(format!(
                "log segment {missing} is missing (stream {} at {:?} has data in it)",
                b.st.meta.id, b.path
            )));
        }
    }
    let mut segments = std::collections::BTreeMap::new();
    for n in &numbers[..first] {
        let f = fs.open(&format::segment_name(*n), false).map_err(|e| io_err("open a log segment", e))?;
        segments.insert(*n, f);
    }
    let mut lsn = cp.lsn;
    let mut active = None;
    for (i, n) in to_replay.iter().enumerate() {
        let last = i + 1 == to_replay.len();
        let name = format::segment_name(*n);
        let f = fs.open(&name, false).map_err(|e| io_err("open a log segment", e))?;
        let len = f.len().map_err(|e| io_err("read a log segment", e))?;
        let mut buf = vec![0u8; len as usize];
        f.read_exact_at(&mut buf, 0).map_err(|e| io_err("read a log segment", e))?;
        let header_ok = buf.len() >= format::SEGMENT_HEADER as usize
            && buf[..format::SEGMENT_HEADER as usize] == format::segment_header(*n);
        let mut pos = if *n == cp.segment { cp.pos as usize } else { format::SEGMENT_HEADER as usize };
        if !header_ok {
            let covered = *n == cp.segment && cp.pos > format::SEGMENT_HEADER;
            if !last || covered || find_frame_after(&buf, 0, lsn).is_some() {
                return Err(corrupt(format!("{name}: bad segment header")));
            }
            // Created but its header never reached the disk: start it again.
            let f = new_segment(&*fs, *n, cfg.segment_bytes, true)?;
            report.torn_bytes_cut += len;
            segments.insert(*n, f.clone());
            active = Some((f, *n, format::SEGMENT_HEADER));
            continue;
        }
        if pos > buf.len() {
            return Err(corrupt(format!("{name} ends at byte {} before the checkpoint's position {pos}", buf.len())));
        }
        loop {
            if pos == buf.len() {
                break;
            }
            let frame =
                format::parse_frame_header(buf.get(pos..pos + format::FRAME_HEADER).unwrap_or(&[])).filter(|h| {
                    buf.len() >= pos + format::FRAME_HEADER + h.len
                        && format::frame_is_valid(h, &buf[pos..pos + format::FRAME_HEADER + h.len])
                });
            let Some(h) = frame else {
                // Where written bytes end; only zeros after it (allocated space, never data).
                let Some(last_written) = buf[pos..].iter().rposition(|b| *b != 0) else {
                    // Allocated space not written yet: the clean end of this segment.
                    break;
                };
                if !last || find_frame_after(&buf, pos + 1, lsn).is_some() {
                    return Err(corrupt(format!(
                        "{name}: damaged frame at byte {pos} with acknowledged frames after it; the data directory needs repair (see docs/OPERATIONS.md)"
                    )));
                }
                // A torn tail: never acknowledged. Cut it, durably.
                report.torn_bytes_cut += last_written as u64 + 1;
                f.set_len(pos as u64).map_err(|e| io_err("cut a torn log tail", e))?;
                f.sync_data().map_err(|e| io_err("cut a torn log tail", e))?;
                break;
            };
            if h.lsn != lsn + 1 {
                return Err(corrupt(format!(
                    "{name}: frame at byte {pos} has lsn {} where {} was expected",
                    h.lsn,
                    lsn + 1
                )));
            }
            let payload = &buf[pos + format::FRAME_HEADER..pos + format::FRAME_HEADER + h.len];
            let records =
                format::decode_payload(payload).map_err(|e| corrupt(format!("{name}: frame at byte {pos}: {e}")))?;
            let base = (pos + format::FRAME_HEADER) as u64;
            for r in records {
                replay(r, *n, base, now_ms, &mut streams, &mut next_id, &mut meta)
                    .map_err(|e| corrupt(format!("{name}: frame at byte {pos}: {e}")))?;
            }
            lsn = h.lsn;
            report.frames_replayed += 1;
            pos += format::FRAME_HEADER + h.len;
        }
        segments.insert(*n, f.clone());
        if last {
            active = Some((f, *n, pos as u64));
        }
    }
    let (active, active_no, active_len) = match active {
        Some((f, no, len)) => {
            // The space of the segment written next, allocated again after a cut (or for the
            // first time in a directory written before segments were allocated): data below
            // the length is untouched.
            f.allocate(cfg.segment_bytes).map_err(|e| io_err("allocate a log segment", e))?;
            f.sync_data().map_err(|e| io_err("allocate a log segment", e))?;
            (f, no, len)
        }
        None => {
            let no = numbers.last().map_or(cp.segment, |n| n + 1).max(cp.segment);
            let f = new_segment(&*fs, no, cfg.segment_bytes, true)?;
            segments.insert(no, f.clone());
            (f, no, format::SEGMENT_HEADER)
        }
    };

    // Readers' state: chains need sources first; build in id order (a source is older).
    let mut order: Vec<u64> = streams.keys().copied().collect();
    order.sort_unstable();
    let mut fork_counts: HashMap<u64, usize> = HashMap::new();
    for b in streams.values() {
        if let Some(f) = b.st.meta.fork {
            *fork_counts.entry(f.source_id).or_default() += 1;
        }
    }
    let mut shared_by_id: HashMap<u64, Arc<StreamView>> = HashMap::new();
    let mut wstreams = PathTable::default();
    let mut source_paths = HashMap::new();
    let mut configs = super::configs::Configs::default();
    let mut detached = HashMap::new();
    let mut producers = 0usize;
    for id in order {
        let Some(mut b) = streams.remove(&id) else { continue };
        configs.intern(&mut b.st.meta.config);
        let chain = match b.st.meta.fork {
            None => Vec::new(),
            Some(f) => {
                let src = shared_by_id
                    .get(&f.source_id)
                    .ok_or_else(|| corrupt(format!("stream {id}: fork source {} is missing", f.source_id)))?;
                fork_chain(&src.chain, src, f.fork_point)
            }
        };
        let data = StreamData { start: b.start, extents: b.extents, hot: Default::default() };
        let forks = fork_counts.get(&id).copied().unwrap_or(0);
        // A detached stream is listed nowhere ([`StreamView::path`]).
        let path: Arc<str> = Arc::from(b.path.as_deref().unwrap_or(""));
        let listed = b.path.is_some();
        let shared = new_shared(&b.st.meta, path, b.st.tail, chain, forks, now_ms, data);
        report.streams += 1;
        report.bytes += b.st.tail.0;
        report.closed_streams += usize::from(b.st.meta.closed);
        report.producers += b.st.producers.len();
        producers += b.st.producers.len();
        shared_by_id.insert(id, shared.clone());
        let w = Box::new(WStream { st: b.st, shared });
        if listed {
            if forks > 0 {
                source_paths.insert(id, w.shared.path.clone());
            }
            wstreams.insert(w);
        } else {
            detached.insert(id, w);
        }
    }
    let view = Arc::new(View::default());
    if let Ok(mut m) = view.streams.write() {
        *m = wstreams.values().map(|w| w.shared.clone()).collect();
    }
    if let Ok(mut s) = view.segments.write() {
        *s = segments;
    }
    if let Ok(mut s) = view.synced.lock() {
        *s = super::view::Synced { lsn, segment: active_no, pos: active_len };
    }
    let counters = Arc::new(Counters::default());
    counters.streams.store((wstreams.len() + detached.len()) as u64, Ordering::Relaxed);
    counters.producers.store(producers as u64, Ordering::Relaxed);
    let store = Store {
        fs,
        view,
        cfg,
        streams: wstreams,
        source_paths,
        configs,
        detached,
        next_id,
        active,
        active_no,
        active_len,
        lsn,
        since_checkpoint: 0,
        reclaim_wanted: false,
        // Only request times count: recovery's clock may be far from the requests' (tests).
        latest_ms: i64::MIN,
        parked: Some(ParkingLot::counting(counters.parked.clone())),
        counters,
        poisoned: false,
        hot_queue: VecDeque::new(),
        hot_bytes: 0,
        meta,
        _lock: lock,
    };
    Ok((store, report))
}

/// Whether a valid frame with an LSN above `lsn` starts anywhere at or after `from`: proof
/// that damage before it hit acknowledged data rather than a torn tail.
fn find_frame_after(buf: &[u8], from: usize, lsn: u64) -> Option<usize> {
    let magic = format::FRAME_MAGIC.to_le_bytes();
    let mut i = from;
    while i + format::FRAME_HEADER <= buf.len() {
        let at = buf[i..].windows(4).position(|w| w == magic)? + i;
        if let Some(h) = format::parse_frame_header(&buf[at..]) {
            let end = at + format::FRAME_HEADER + h.len;
            if h.lsn > lsn && end <= buf.len() && format::frame_is_valid(&h, &buf[at..end]) {
                return Some(at);
            }
        }
        i = at + 1;
    }
    None
}

/// An Append record's effects as the writer applied them (the machine's one description);
/// producer effects written before their details were kept count from `now_ms`.
fn replayed<'a>(
    new_tail: u64,
    close: bool,
    stream_seq: &'a Option<String>,
    producer: &'a Option<AcceptedProducer<String>>,
    key: Option<(oncelog_protocol::digest::KeyId, BodyDigest, i64)>,
    time: Option<i64>,
    now_ms: i64,
) -> AppendEffects<'a> {
    AppendEffects {
        new_tail: Offset(new_tail),
        close,
        stream_seq: stream_seq.as_deref(),
        producer: producer.as_ref().map(|p| {
            let (digest, at_ms) = p.details.unwrap_or((BodyDigest::UNKNOWN, now_ms));
            machine::ProducerEffect { id: &p.id, epoch: p.epoch, seq: p.seq, digest, at_ms }
        }),
        key: key.map(|(k, digest, at_ms)| (k, KeyEntry { end: Offset(new_tail), digest, at_ms })),
        write_time: time,
    }
}

/// Applies one replayed record to the state being rebuilt.
/// `now_ms` stands in for the activity time of producer effects written before it was kept.
fn replay(
    r: Replayed,
    segment: u64,
    base: u64,
    now_ms: i64,
    streams: &mut HashMap<u64, Building>,
    next_id: &mut u64,
    meta: &mut BTreeMap<Vec<u8>, Bytes>,
) -> Result<(), String> {
    match r {
        Replayed::Create { id, path, meta, data_at, data_len } => {
            if meta.id != id || streams.contains_key(&id) {
                return Err(format!("create of stream {id} twice"));
            }
            let start = meta.fork.map_or(0, |f| f.fork_point);
            let tail = start + data_len;
            let extents =
                if data_len > 0 { vec![Extent::new(tail, segment, base + data_at as u64)] } else { Vec::new() };
            *next_id = (*next_id).max(id + 1);
            let mut st = StreamState::new(meta, Offset(tail));
            st.created();
            streams.insert(id, Building { path: Some(path), st, start, extents });
        }
        Replayed::Append { id, new_tail, close, stream_seq, producer, key, time, data_at, data_len } => {
            let b = streams.get_mut(&id).ok_or_else(|| format!("append to unknown stream {id}"))?;
            // Only the power-loss test's split-producer mutant writes producer effects apart
            // from their data; production replay holds every record to its data.
            let mutant_split = cfg!(test) && data_len == 0 && !close && producer.is_some() && new_tail <= b.st.tail.0;
            if mutant_split {
                let tail = b.st.tail;
                b.st.apply(&replayed(new_tail, false, &None, &producer, None, None, now_ms));
                b.st.tail = tail;
                return Ok(());
            }
            if new_tail != b.st.tail.0 + data_len {
                return Err(format!("append to stream {id} ends at {new_tail}, expected {}", b.st.tail.0 + data_len));
            }
            if data_len > 0 {
                b.extents.push(Extent::new(new_tail, segment, base + data_at as u64));
            }
            b.st.apply(&replayed(new_tail, close, &stream_seq, &producer, key, time, now_ms));
        }
        Replayed::SoftDelete { id } => {
            let b = streams.get_mut(&id).ok_or_else(|| format!("delete of unknown stream {id}"))?;
            b.st.soft_delete();
        }
        Replayed::Detach { id } => {
            let b = streams.get_mut(&id).ok_or_else(|| format!("detach of unknown stream {id}"))?;
            if b.path.take().is_none() {
                return Err(format!("detach of stream {id} twice"));
            }
            b.st.soft_delete();
        }
        Replayed::Trim { id, earliest } => {
            let b = streams.get_mut(&id).ok_or_else(|| format!("trim of unknown stream {id}"))?;
            b.st.set_earliest(Offset(earliest));
        }
        Replayed::Remove { id } => {
            streams.remove(&id).ok_or_else(|| format!("removal of unknown stream {id}"))?;
        }
        Replayed::Meta { key, value: Some(v) } => {
            meta.insert(key, Bytes::from(v));
        }
        Replayed::Meta { key, value: None } => {
            meta.remove(&key);
        }
    }
    Ok(())
}
