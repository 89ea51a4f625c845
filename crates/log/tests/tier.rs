//! The log in a bucket (`--object-store`): a node that loses its disk comes back from the bucket
//! with every shipped append once and its producers' and keys' deduplication state, what was not
//! shipped is lost whole (a retry of it is new, never doubled), and the node it replaced is
//! fenced. Against a real S3 API server (moto, `ONCELOG_TEST_S3_ENDPOINT`, started by
//! `scripts/test`) and a local directory.

use std::time::{Duration, Instant};

use oncelog_bucket::{Bucket, Location};
use oncelog_log::tier::{AckMode, Tier};
use oncelog_log::{Durability, LogEngine, LogOptions};
use oncelog_storage::contract::*;
use oncelog_storage::*;

/// A fresh bucket prefix of kind `kind` ("s3" or "dir"), kept alive by the guard.
fn bucket(kind: &str, name: &str) -> (Bucket, Option<tempfile::TempDir>) {
    if kind == "s3" {
        return (oncelog_bucket::test_support::s3_bucket(&format!("log-{name}")), None);
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let location: Location = format!("file://{}/bucket", dir.path().display()).parse().expect("url");
    (Bucket::open(&location, &[]).expect("open"), Some(dir))
}

/// An engine on `dir` shipping to `bucket` every `interval`, with small segments and frequent
/// checkpoints so that rotation, checkpoints and dropped segments all happen.
fn open(dir: &std::path::Path, bucket: &Bucket, node: &str, interval: Duration) -> Result<LogEngine, StorageError> {
    open_acking(dir, bucket, node, interval, AckMode::Local)
}

fn open_acking(
    dir: &std::path::Path,
    bucket: &Bucket,
    node: &str,
    interval: Duration,
    ack: AckMode,
) -> Result<LogEngine, StorageError> {
    open_with(dir, bucket, node, interval, ack, oncelog_log::tier::SWEEP_AFTER)
}

fn open_with(
    dir: &std::path::Path,
    bucket: &Bucket,
    node: &str,
    interval: Duration,
    ack: AckMode,
    sweep_after: Duration,
) -> Result<LogEngine, StorageError> {
    open_tiered(dir, bucket, node, interval, ack, sweep_after, None)
}

/// [`open`] with `--cache-max-bytes`.
fn open_cached(
    dir: &std::path::Path,
    bucket: &Bucket,
    node: &str,
    cache_max_bytes: Option<u64>,
) -> Result<LogEngine, StorageError> {
    let (ms50, hour) = (Duration::from_millis(50), oncelog_log::tier::SWEEP_AFTER);
    open_tiered(dir, bucket, node, ms50, AckMode::Local, hour, cache_max_bytes)
}

fn open_tiered(
    dir: &std::path::Path,
    bucket: &Bucket,
    node: &str,
    interval: Duration,
    ack: AckMode,
    sweep_after: Duration,
    cache_max_bytes: Option<u64>,
) -> Result<LogEngine, StorageError> {
    let mut opts = LogOptions::new(dir);
    opts.durability = Durability::Buffered;
    opts.segment_bytes = 64 << 10;
    opts.checkpoint_bytes = 96 << 10;
    opts.reclaim_interval = Duration::from_millis(50);
    opts.tier = Some(Tier {
        bucket: bucket.clone(),
        ship_interval: interval,
        node: node.into(),
        ack,
        sweep_after,
        cache_max_bytes,
        delete_grace: if sweep_after.is_zero() { Duration::ZERO } else { oncelog_log::tier::DELETE_GRACE },
    });
    LogEngine::open(opts)
}

/// Waits until everything `e` wrote is in a published cut.
async fn shipped(e: &LogEngine) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (written, published) = e.shipping().expect("a bucket");
        if published >= written {
            return;
        }
        assert!(Instant::now() < deadline, "not shipped in time: written {written}, published {published}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn body(i: u64) -> String {
    format!("{i:05}-{}|", "x".repeat(1000))
}

/// Appends `range` of producer `p`'s sequence to "a", each its own body, and a keyed append of
/// each to "b"; returns the outcomes of the producer appends.
async fn write(e: &LogEngine, range: std::ops::Range<u64>) -> Vec<AppendOutcome> {
    let mut out = Vec::new();
    for i in range {
        out.push(append(e, produce("a", &body(i), "p", 0, i)).await);
        let k = append(e, keyed("b", &format!("{i}|"), &format!("k{i}"))).await;
        assert_eq!(k.status, AppendStatus::Appended);
    }
    out
}

/// A node on `dir` that creates "a" and "b", writes `range`, ships it and stops.
async fn wrote_and_stopped(dir: &std::path::Path, b: &Bucket, node: &str, range: std::ops::Range<u64>) {
    let e = open(dir, b, node, Duration::from_millis(50)).expect("open");
    create(&e, create_req("a", "text/plain")).await;
    create(&e, create_req("b", "text/plain")).await;
    write(&e, range).await;
    e.shutdown().await.expect("shutdown ships");
}

async fn disk_loss_keeps_every_shipped_append_once(kind: &str) {
    let (b, _guard) = bucket(kind, "loss");
    let (a_dir, b_dir) = (tempfile::tempdir().expect("tempdir"), tempfile::tempdir().expect("tempdir"));
    let old = open(a_dir.path(), &b, "old", Duration::from_millis(50)).expect("open");
    create(&old, create_req("a", "text/plain")).await;
    create(&old, create_req("b", "text/plain")).await;
    let first = write(&old, 0..120).await;
    // A subscription: its state is the engine's metadata map, written by transactions.
    create(&old, create_req("wake", "application/json")).await;
    let subs = oncelog_subscriptions::Subscriptions::new(std::sync::Arc::new(old.clone()));
    let config = oncelog_subscriptions::SubConfig {
        kind: oncelog_subscriptions::SubKind::PullWake { wake_stream: "wake".into() },
        pattern: None,
        streams: vec!["a".into()],
        lease_ttl_ms: 1_000,
        description: Some("kept by the bucket".into()),
        outputs: Vec::new(),
    };
    subs.put("sub", config, 0).await.expect("put a subscription");
    shipped(&old).await;
    let tail_a = first.last().expect("appends").next_offset;
    // Each sealed segment ends up as one object (folded), whatever the rounds that shipped it.
    let deadline = Instant::now() + Duration::from_secs(20);
    let cut = loop {
        let cut = b.newest().await.expect("newest").expect("a manifest").cut;
        if cut.segments.iter().all(|s| s.number == cut.end.segment || s.ranges.len() == 1) {
            break cut;
        }
        assert!(Instant::now() < deadline, "sealed segments not folded: {cut:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(cut.checkpoint.is_some() && cut.segments.len() > 1, "a checkpoint and several segments shipped: {cut:?}");

    // The disk is lost; a fresh node on an empty directory comes back from the bucket.
    let new = open(b_dir.path(), &b, "new", Duration::from_millis(50)).expect("restore");
    assert_eq!(read_all(&new, "a", 1 << 20).await, (0..120).map(body).collect::<String>(), "every append once");
    // Every producer retry of an acknowledged append is a duplicate; the last one's (the
    // receipt a producer keeps) answers with its original offset.
    for i in (0..120u64).step_by(17) {
        let again = append(&new, produce("a", &body(i), "p", 0, i)).await;
        assert_eq!(again.status, AppendStatus::Duplicate, "retry of {i}");
    }
    let last = append(&new, produce("a", &body(119), "p", 0, 119)).await;
    assert_eq!((last.status, last.next_offset), (AppendStatus::Duplicate, tail_a));
    let sub = oncelog_subscriptions::Subscriptions::new(std::sync::Arc::new(new.clone())).get("sub", 0).await;
    let sub = sub.expect("the subscription came back");
    assert_eq!(sub.record.config.description.as_deref(), Some("kept by the bucket"));
    let k = append(&new, keyed("b", "7|", "k7")).await;
    assert_eq!(k.status, AppendStatus::Duplicate, "an idempotency key's retry");
    let next = append(&new, produce("a", &body(120), "p", 0, 120)).await;
    assert_eq!(next.status, AppendStatus::Appended);
    assert_eq!(next.next_offset.0, tail_a.0 + body(120).len() as u64);

    // The old node (still running: paused, partitioned) is fenced at its next publish and stops.
    let zombie = old.append(produce("a", "zombie|", "p", 0, 120)).await;
    assert!(zombie.is_ok(), "taken locally before the old node finds out: {zombie:?}");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Readiness::NotReady { reason } = old.readiness() {
            assert!(reason.contains("fenced"), "{reason}");
            break;
        }
        assert!(Instant::now() < deadline, "the old node was not fenced");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(old.append(produce("a", "zombie|", "p", 0, 121)).await.is_err(), "a fenced node takes no write");
    // Nothing the old node wrote after the takeover is visible on the new one.
    shipped(&new).await;
    let on_new = read_all(&new, "a", 1 << 20).await;
    assert_eq!(on_new, (0..121).map(body).collect::<String>());
    let _ = old.shutdown().await;
    new.shutdown().await.expect("shutdown");
}

async fn what_was_not_shipped_is_lost_whole_and_taken_as_new(kind: &str) {
    let (b, _guard) = bucket(kind, "window");
    let (a_dir, b_dir) = (tempfile::tempdir().expect("tempdir"), tempfile::tempdir().expect("tempdir"));
    // A long interval: only the shutdown's last round ships.
    let hour = Duration::from_secs(3600);
    let first = open(a_dir.path(), &b, "a1", hour).expect("open");
    create(&first, create_req("a", "text/plain")).await;
    create(&first, create_req("b", "text/plain")).await;
    let shipped_part = write(&first, 0..40).await;
    first.shutdown().await.expect("shutdown ships");
    drop(first);
    // The same disk again (a restart): it holds the bucket's cut, and goes on from it.
    let again = open(a_dir.path(), &b, "a2", hour).expect("reopen on the same disk");
    let unshipped = write(&again, 40..70).await;
    assert!(unshipped.iter().all(|o| o.status == AppendStatus::Appended));

    // The disk is lost before the next round: the new node has the shipped part only.
    let new = open(b_dir.path(), &b, "new", Duration::from_millis(50)).expect("restore");
    assert_eq!(read_all(&new, "a", 1 << 20).await, (0..40).map(body).collect::<String>());
    let lost = 70 - 40;
    println!("unshipped window lost with the disk: {lost} producer appends");
    // A retry of a lost append is new, and lands where the lost one was: nothing doubled.
    for i in 40..70u64 {
        let o = append(&new, produce("a", &body(i), "p", 0, i)).await;
        assert_eq!((o.status, o.next_offset), (AppendStatus::Appended, unshipped[(i - 40) as usize].next_offset));
    }
    let dup = append(&new, produce("a", &body(3), "p", 0, 3)).await;
    assert_eq!(dup.status, AppendStatus::Duplicate);
    assert!(shipped_part[3].next_offset < unshipped[0].next_offset);
    assert_eq!(read_all(&new, "a", 1 << 20).await, (0..70).map(body).collect::<String>());
    // The restarted node finds out at its last round.
    let _ = again.shutdown().await;
    match again.readiness() {
        Readiness::NotReady { reason } => assert!(reason.contains("fenced"), "{reason}"),
        other => panic!("the replaced node was not fenced: {other:?}"),
    }
    new.shutdown().await.expect("shutdown");
}

async fn a_disk_the_bucket_moved_past_is_refused(kind: &str) {
    let (b, _guard) = bucket(kind, "diverged");
    let (a_dir, b_dir) = (tempfile::tempdir().expect("tempdir"), tempfile::tempdir().expect("tempdir"));
    wrote_and_stopped(a_dir.path(), &b, "a", 0..5).await;
    // Another node restores and writes on.
    let other = open(b_dir.path(), &b, "b", Duration::from_millis(50)).expect("restore");
    write(&other, 5..10).await;
    other.shutdown().await.expect("shutdown");
    drop(other);
    // The first disk comes back: starting on it would fork the history.
    let err = open(a_dir.path(), &b, "a", Duration::from_millis(50)).err().expect("refused").to_string();
    assert!(err.contains("not this data directory's"), "{err}");
}

async fn a_directory_that_ran_without_a_bucket_is_shipped_whole(kind: &str) {
    let (b, _guard) = bucket(kind, "late");
    let (a_dir, b_dir) = (tempfile::tempdir().expect("tempdir"), tempfile::tempdir().expect("tempdir"));
    // Without a bucket first: a stream whose data is trimmed away, so the checkpoint removes
    // the first segments, and one that stays.
    let mut opts = LogOptions::new(a_dir.path());
    opts.durability = Durability::Buffered;
    opts.segment_bytes = 64 << 10;
    opts.checkpoint_bytes = 96 << 10;
    let plain = LogEngine::open(opts).expect("open");
    create(&plain, create_req("x", "text/plain")).await;
    create(&plain, create_req("a", "text/plain")).await;
    create(&plain, create_req("b", "text/plain")).await;
    for i in 0..200u64 {
        append(&plain, append_req("x", &body(i))).await;
    }
    let tail = plain.head("x", 0).await.expect("head").tail;
    plain.trim("x", tail, 0).await.expect("trim");
    write(&plain, 0..20).await;
    plain.shutdown().await.expect("shutdown");
    drop(plain);
    let first_segment = a_dir.path().join("log").join(format!("{:020}.seg", 1));
    assert!(!first_segment.exists(), "the checkpoint removed the first segment");
    // With a bucket now: its first cut must carry the checkpoint, or a restore has no start.
    let shipping = open(a_dir.path(), &b, "a", Duration::from_millis(50)).expect("open");
    shipped(&shipping).await;
    let new = open(b_dir.path(), &b, "new", Duration::from_millis(50)).expect("restore");
    assert_eq!(read_all(&new, "a", 1 << 20).await, (0..20).map(body).collect::<String>());
    assert_eq!(new.head("x", 0).await.expect("head").earliest, tail);
    new.shutdown().await.expect("shutdown");
    let _ = shipping.shutdown().await;
}

async fn bucket_mode_acknowledges_only_what_the_bucket_holds(kind: &str) {
    let (b, _guard) = bucket(kind, "bucket-mode");
    let (a_dir, b_dir) = (tempfile::tempdir().expect("tempdir"), tempfile::tempdir().expect("tempdir"));
    // No timed rounds: only the writes' own rounds ship.
    let ack = AckMode::Bucket { timeout: Duration::from_secs(10) };
    let old = open_acking(a_dir.path(), &b, "old", Duration::from_secs(3600), ack).expect("open");
    create(&old, create_req("a", "text/plain")).await;
    create(&old, create_req("b", "text/plain")).await;
    let acked = write(&old, 0..60).await;
    // A retry answered from the writer's state waits for the bucket too.
    let dup = append(&old, produce("a", &body(59), "p", 0, 59)).await;
    assert_eq!((dup.status, dup.next_offset), (AppendStatus::Duplicate, acked[59].next_offset));
    assert_eq!(read_all(&old, "a", 1 << 20).await, (0..60).map(body).collect::<String>());
    // Many writes at once: groups wait while later ones are written, and the log rotates
    // meanwhile (64 KiB segments); each keeps the segment it was written to.
    create(&old, create_req("c", "text/plain")).await;
    let mut set = tokio::task::JoinSet::new();
    for i in 0..64u64 {
        let e = old.clone();
        set.spawn(async move { e.append(append_req("c", &format!("{i:04}{}", "y".repeat(4092)))).await });
    }
    while let Some(r) = set.join_next().await {
        assert!(r.expect("join").is_ok());
    }
    let c = read_all(&old, "c", 1 << 22).await;
    let mut pieces: Vec<&str> = (0..64).map(|i| &c[i * 4096..(i + 1) * 4096]).collect();
    pieces.sort_unstable();
    assert!(
        pieces.iter().enumerate().all(|(i, p)| p.starts_with(&format!("{i:04}")) && p.ends_with('y')),
        "every write's own bytes"
    );
    // The disk is lost the moment the last answer arrived: everything answered is there.
    let new = open(b_dir.path(), &b, "new", Duration::from_millis(50)).expect("restore");
    assert_eq!(read_all(&new, "a", 1 << 20).await, (0..60).map(body).collect::<String>());
    let again = append(&new, produce("a", &body(59), "p", 0, 59)).await;
    assert_eq!((again.status, again.next_offset), (AppendStatus::Duplicate, acked[59].next_offset));
    let _ = old.shutdown().await;
    new.shutdown().await.expect("shutdown");
}

/// `--ack-mode bucket` with the bucket away (a directory store made unreachable): writes are
/// answered 503 after the timeout, with their outcome unknown; once the bucket is back they
/// become visible, a producer's retry of one is a duplicate, and new writes go on.
async fn bucket_mode_answers_503_while_the_bucket_is_away(_kind: &str) {
    let root = tempfile::tempdir().expect("tempdir");
    let store_dir = root.path().join("bucket");
    let b = Bucket::open(&format!("file://{}", store_dir.display()).parse().expect("url"), &[]).expect("open");
    let a_dir = tempfile::tempdir().expect("tempdir");
    let ack = AckMode::Bucket { timeout: Duration::from_millis(300) };
    let e = open_acking(a_dir.path(), &b, "a", Duration::from_secs(3600), ack).expect("open");
    create(&e, create_req("a", "text/plain")).await;
    assert_eq!(append(&e, produce("a", &body(0), "p", 0, 0)).await.status, AppendStatus::Appended);
    // The bucket goes away: its directory is replaced by a file.
    let away = root.path().join("away");
    std::fs::rename(&store_dir, &away).expect("move the bucket away");
    std::fs::write(&store_dir, b"not a directory").expect("block the bucket's path");
    let started = Instant::now();
    let lost = e.append(produce("a", &body(1), "p", 0, 1)).await;
    assert!(
        matches!(lost, Err(AppendError::Storage(StorageError::Unavailable(_)))),
        "answered 503 while the bucket is away: {lost:?}"
    );
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(read_all(&e, "a", 1 << 20).await, body(0), "not visible while the bucket does not hold it");
    // Back: the next write ships both, and the one answered 503 turns out to have been written.
    std::fs::remove_file(&store_dir).expect("unblock");
    std::fs::rename(&away, &store_dir).expect("the bucket is back");
    assert_eq!(append(&e, produce("a", &body(2), "p", 0, 2)).await.status, AppendStatus::Appended);
    assert_eq!(read_all(&e, "a", 1 << 20).await, (0..3).map(body).collect::<String>());
    let retry = append(&e, produce("a", &body(1), "p", 0, 1)).await;
    assert_eq!(retry.status, AppendStatus::Duplicate);
    e.shutdown().await.expect("shutdown");
}

/// Waits until `e` is fenced.
async fn fenced(e: &LogEngine) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Readiness::NotReady { reason } = e.readiness() {
            assert!(reason.contains("fenced"), "{reason}");
            return;
        }
        assert!(Instant::now() < deadline, "not fenced");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The log objects present that the newest manifest does not name.
async fn unnamed(b: &Bucket) -> Vec<String> {
    let cut = b.newest().await.expect("newest").expect("a manifest").cut;
    let mut named: Vec<&str> = cut.segments.iter().flat_map(|s| s.ranges.iter().map(|r| r.key.as_str())).collect();
    named.extend(cut.checkpoint.iter().map(|c| c.object.key.as_str()));
    b.objects().await.expect("list").into_iter().map(|(k, _)| k).filter(|k| !named.contains(&k.as_str())).collect()
}

/// A fenced writer's leftovers (objects it stored for a publish that failed) are swept by its
/// successor, and nothing a cut names is: a node restored after the sweep has every append.
/// Both sweep after every round (objects of any age), so the replaced node, idle and not yet
/// fenced meanwhile, must not sweep by its stale cut (it would take its successor's objects).
async fn the_sweep_deletes_what_no_cut_names_and_nothing_else(kind: &str) {
    let (b, _guard) = bucket(kind, "sweep");
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().expect("tempdir")).collect();
    let ms50 = Duration::from_millis(50);
    let old = open_with(dirs[0].path(), &b, "old", ms50, AckMode::Local, Duration::ZERO).expect("open");
    create(&old, create_req("a", "text/plain")).await;
    create(&old, create_req("b", "text/plain")).await;
    write(&old, 0..60).await;
    shipped(&old).await;
    let new = open_with(dirs[1].path(), &b, "new", ms50, AckMode::Local, Duration::ZERO).expect("restore");
    write(&new, 60..70).await;
    shipped(&new).await;
    // The old node has nothing to ship: only its sweep can find out (checked at the end, so
    // that a sweep by its stale cut would first show as objects missing from the restore).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut seen_leftover = false;
    // A stray of the old epoch (as a crashed round leaves one) that the sweep must take.
    let stray = "epoch-0000000001/seg-00000000000000000099-000000000000-000000000010";
    b.put_stray(stray, bytes::Bytes::from_static(b"0123456789")).await.expect("stray");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left = unnamed(&b).await;
        seen_leftover |= left.iter().any(|k| k.starts_with("epoch-0000000001/"));
        if !left.iter().any(|k| k.starts_with("epoch-0000000001/")) {
            break;
        }
        assert!(Instant::now() < deadline, "left after the sweeps: {left:?}");
        tokio::time::sleep(ms50).await;
    }
    assert!(!b.objects().await.expect("list").iter().any(|(k, _)| k == stray), "the stray was swept");
    println!("{kind}: leftovers of the old epoch were seen before the sweep: {seen_leftover}");
    write(&new, 70..80).await;
    shipped(&new).await;
    let third = open(dirs[2].path(), &b, "third", ms50).expect("restore after the sweep");
    assert_eq!(read_all(&third, "a", 1 << 20).await, (0..80).map(body).collect::<String>());
    fenced(&old).await;
    let _ = old.shutdown().await;
    let _ = new.shutdown().await;
    third.shutdown().await.expect("shutdown");
}

/// The largest value a sweep of this process set `oncelog_bucket_missing_objects` to since the
/// last [`MissingObjects::reset`]: the largest, since the sweeps of the other tests here set it
/// too, to 0. Read through a global recorder of that one gauge, installed by the first call;
/// every other metric goes nowhere.
struct MissingObjects(std::sync::atomic::AtomicU64);

impl MissingObjects {
    fn get() -> &'static std::sync::Arc<MissingObjects> {
        static SEEN: std::sync::OnceLock<std::sync::Arc<MissingObjects>> = std::sync::OnceLock::new();
        SEEN.get_or_init(|| {
            let max = std::sync::Arc::new(MissingObjects(std::sync::atomic::AtomicU64::new(0)));
            metrics::set_global_recorder(MissingRecorder(max.clone())).expect("the only recorder of this test process");
            max
        })
    }

    fn seen(&self) -> f64 {
        f64::from_bits(self.0.load(std::sync::atomic::Ordering::Relaxed))
    }

    fn reset(&self) {
        self.0.store(0, std::sync::atomic::Ordering::Relaxed);
    }
}

impl metrics::GaugeFn for MissingObjects {
    fn increment(&self, _: f64) {}
    fn decrement(&self, _: f64) {}
    fn set(&self, value: f64) {
        // Non-negative floats order as their bits do.
        self.0.fetch_max(value.max(0.0).to_bits(), std::sync::atomic::Ordering::Relaxed);
    }
}

struct MissingRecorder(std::sync::Arc<MissingObjects>);

impl metrics::Recorder for MissingRecorder {
    fn describe_counter(&self, _: metrics::KeyName, _: Option<metrics::Unit>, _: metrics::SharedString) {}
    fn describe_gauge(&self, _: metrics::KeyName, _: Option<metrics::Unit>, _: metrics::SharedString) {}
    fn describe_histogram(&self, _: metrics::KeyName, _: Option<metrics::Unit>, _: metrics::SharedString) {}
    fn register_counter(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        metrics::Counter::noop()
    }
    fn register_gauge(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        if key.name() == "oncelog_bucket_missing_objects" {
            metrics::Gauge::from_arc(self.0.clone())
        } else {
            metrics::Gauge::noop()
        }
    }
    fn register_histogram(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Histogram {
        metrics::Histogram::noop()
    }
}

/// Issue 45 item 11: an object the published cut names, deleted under the running node, is
/// noticed by its next sweep (the gauge, and an ERROR line naming it), not by a failed restore.
async fn an_object_deleted_under_a_running_node_is_noticed(kind: &str) {
    let (b, _guard) = bucket(kind, "missing");
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = MissingObjects::get();
    missing.reset();
    let ms50 = Duration::from_millis(50);
    let e = open_with(dir.path(), &b, "n", ms50, AckMode::Local, Duration::ZERO).expect("open");
    create(&e, create_req("a", "text/plain")).await;
    create(&e, create_req("b", "text/plain")).await;
    write(&e, 0..20).await;
    shipped(&e).await;
    let cut = b.newest().await.expect("newest").expect("a manifest").cut;
    let gone = cut.segments[0].ranges[0].key.clone();
    let deadline = Instant::now() + Duration::from_secs(20);
    // Sweeps before the deletion found nothing missing (those of other tests neither).
    assert_eq!(missing.seen(), 0.0, "an object was missing before one was deleted");
    b.delete(&gone).await;
    while missing.seen() < 1.0 {
        assert!(Instant::now() < deadline, "{gone}, named by the published cut, was deleted and no sweep noticed");
        tokio::time::sleep(ms50).await;
    }
    e.shutdown().await.expect("shutdown");
}

/// The segment files in the data directory `dir`.
fn local_segments(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir.join("log"))
        .expect("log directory")
        .filter(|e| e.as_ref().is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".seg")))
        .count()
}

/// A node of the given cache restored from a bucket holding appends 0..300: how many of the
/// cut's segments it has on its disk right after the start, and of how many.
/// (The bucket's directory guard comes back too, for a directory bucket.)
async fn restored(
    kind: &str,
    name: &str,
    dirs: &[tempfile::TempDir],
    cache: Option<u64>,
) -> (Bucket, Option<tempfile::TempDir>, LogEngine, usize) {
    let (b, guard) = bucket(kind, name);
    wrote_and_stopped(dirs[0].path(), &b, "old", 0..300).await;
    let cut = b.newest().await.expect("newest").expect("a manifest").cut;
    assert!(cut.checkpoint.is_some(), "a checkpoint shipped");
    let new = open_cached(dirs[1].path(), &b, "new", cache).expect("restore");
    let local = local_segments(dirs[1].path());
    println!("{kind}: restored with {local} of the cut's {} segments on the disk", cut.segments.len());
    assert!(local < cut.segments.len(), "the restore left old segments in the bucket");
    (b, guard, new, cut.segments.len())
}

/// A restore downloads only what recovery replays and serves at once: older segments are read
/// from the bucket. Under a small `--cache-max-bytes` the sealed segments the bucket holds
/// leave the disk as the node writes on, and a restart on that directory reads them from the
/// bucket too.
async fn old_segments_are_read_from_the_bucket_under_a_small_cache(kind: &str) {
    let dirs: Vec<tempfile::TempDir> = (0..2).map(|_| tempfile::tempdir().expect("tempdir")).collect();
    let (b, _guard, new, _) = restored(kind, "cold", &dirs, Some(1)).await;
    assert_eq!(read_all(&new, "a", 1 << 20).await, (0..300).map(body).collect::<String>(), "every append once");
    // A backup of the directory cannot copy what is only in the bucket, and says so.
    let copy = tempfile::tempdir().expect("tempdir");
    let refused = oncelog_log::backup::backup(dirs[1].path(), &copy.path().join("b")).expect_err("refused");
    assert!(refused.to_string().contains("in the bucket only"), "{refused}");
    for i in (0..300u64).step_by(37) {
        let again = append(&new, produce("a", &body(i), "p", 0, i)).await;
        assert_eq!(again.status, AppendStatus::Duplicate, "retry of {i}");
    }
    assert_eq!(append(&new, keyed("b", "7|", "k7")).await.status, AppendStatus::Duplicate);
    // Writing on: every sealed segment the bucket holds leaves the disk.
    write(&new, 300..400).await;
    shipped(&new).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let left = local_segments(dirs[1].path());
    assert!(left <= 2, "only the segments the cut may still grow in stay: {left}");
    let all: String = (0..400).map(body).collect();
    assert_eq!(read_all(&new, "a", 1 << 20).await, all);
    new.shutdown().await.expect("shutdown");
    drop(new);
    let again = open_cached(dirs[1].path(), &b, "again", Some(1)).expect("restart on a directory with cold segments");
    assert_eq!(read_all(&again, "a", 1 << 20).await, all);
    again.shutdown().await.expect("shutdown");
}

/// Without a cache limit the restored node fetches the old segments back in the background.
async fn the_cache_fills_back_after_a_restore(kind: &str) {
    let dirs: Vec<tempfile::TempDir> = (0..2).map(|_| tempfile::tempdir().expect("tempdir")).collect();
    let (_b, _guard, new, segments) = restored(kind, "fill", &dirs, None).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while local_segments(dirs[1].path()) < segments {
        assert!(Instant::now() < deadline, "the cache did not fill back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(read_all(&new, "a", 1 << 20).await, (0..300).map(body).collect::<String>());
    new.shutdown().await.expect("shutdown");
}

/// A log of more segments than a manifest holds itself is published through a segment table
/// (the sweep, running every round here, keeps it: the cut names it), and a node that lost its
/// disk comes back from it with every append once and its producer's state.
async fn a_long_log_is_restored_through_its_segment_table(kind: &str) {
    let (b, _guard) = bucket(kind, "long");
    let dirs: Vec<tempfile::TempDir> = (0..2).map(|_| tempfile::tempdir().expect("tempdir")).collect();
    let old =
        open_with(dirs[0].path(), &b, "old", Duration::from_millis(20), AckMode::Local, Duration::ZERO).expect("open");
    create(&old, create_req("a", "text/plain")).await;
    create(&old, create_req("b", "text/plain")).await;
    write(&old, 0..1200).await;
    shipped(&old).await;
    // A round or two more: the sweep runs after each, the fold of the last sealed segment too.
    tokio::time::sleep(Duration::from_millis(200)).await;
    shipped(&old).await;
    let m = b.newest().await.expect("newest").expect("a manifest");
    let table = m.table.as_ref().expect("a segment table");
    println!("{kind}: {} segments, {} of them in the table", m.cut.segments.len(), table.segments);
    assert!(table.segments >= oncelog_bucket::bucket::TABLE_AT as u64);
    old.shutdown().await.expect("shutdown");
    drop(old);
    let new = open(dirs[1].path(), &b, "new", Duration::from_millis(50)).expect("restore");
    assert_eq!(read_all(&new, "a", 1 << 24).await, (0..1200).map(body).collect::<String>());
    for i in (0..1200u64).step_by(97) {
        assert_eq!(
            append(&new, produce("a", &body(i), "p", 0, i)).await.status,
            AppendStatus::Duplicate,
            "retry of {i}"
        );
    }
    new.shutdown().await.expect("shutdown");
}

/// A cache fill (a download of up to a segment) holds up no acknowledgement: with every GET
/// answered 4 s late, appends in `bucket` mode are acknowledged while the fill still waits for
/// its bytes, and the cache fills back once the bucket answers again. (S3 only: the delay is the
/// fault proxy's.)
async fn a_cache_fill_holds_up_no_acknowledgement(kind: &str) {
    use oncelog_bucket::fault_proxy::Fault;
    assert_eq!(kind, "s3");
    let (b, proxy) = proxied("fill-slow");
    let dirs: Vec<tempfile::TempDir> = (0..2).map(|_| tempfile::tempdir().expect("tempdir")).collect();
    wrote_and_stopped(dirs[0].path(), &b, "old", 0..300).await;
    let cut: Vec<u64> =
        b.newest().await.expect("newest").expect("a manifest").cut.segments.iter().map(|s| s.number).collect();
    // A long interval: rounds run when appends ask for them, so no fill starts before the
    // slow GETs are set.
    let (hour, ten_s) = (oncelog_log::tier::SWEEP_AFTER, Duration::from_secs(10));
    let new =
        open_tiered(dirs[1].path(), &b, "new", ten_s, AckMode::Bucket { timeout: Duration::from_secs(30) }, hour, None)
            .expect("restore");
    proxy.set(Fault::SlowGets(Duration::from_secs(4)));
    let cold = |dir: &std::path::Path| {
        let local: Vec<String> = std::fs::read_dir(dir.join("log"))
            .expect("log directory")
            .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect();
        cut.iter().filter(|n| !local.contains(&format!("{n:020}.seg"))).count()
    };
    let before = cold(dirs[1].path());
    assert!(before > 0, "no cold segment to fill");
    // The first round ships, sweeps (a slow listing) and starts a fill; the appends after it
    // are acknowledged by rounds of their own.
    for i in 300..306 {
        assert_eq!(append(&new, produce("a", &body(i), "p", 0, i)).await.status, AppendStatus::Appended);
    }
    assert_eq!(cold(dirs[1].path()), before, "an acknowledgement waited for a cache fill");
    proxy.set(Fault::Pass);
    let deadline = Instant::now() + Duration::from_secs(30);
    while cold(dirs[1].path()) > 0 {
        assert!(Instant::now() < deadline, "the cache did not fill back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(read_all(&new, "a", 1 << 20).await, (0..306).map(body).collect::<String>());
    new.shutdown().await.expect("shutdown");
}

/// A prefix of the test S3 API server through a fault proxy (which keeps connections alive, as
/// S3 does; moto's own server closes them).
fn proxied(name: &str) -> (Bucket, oncelog_bucket::fault_proxy::FaultProxy) {
    let proxy = oncelog_bucket::fault_proxy::FaultProxy::start(&oncelog_bucket::test_support::s3_endpoint());
    (oncelog_bucket::test_support::s3_bucket_via(&proxy.url, &format!("log-{name}")), proxy)
}

/// Cold reads go on while the shipper sleeps between rounds: the restore's requests ran on the
/// shipper's runtime, and a client shared with the cold reads would send their GETs over those
/// connections, which only move while the shipper's runtime runs (here: once in 20 s). (S3
/// only, through the proxy: connections kept alive.)
async fn a_cold_read_waits_for_no_shipping_round(kind: &str) {
    assert_eq!(kind, "s3");
    let (b, _proxy) = proxied("cold-idle");
    let dirs: Vec<tempfile::TempDir> = (0..2).map(|_| tempfile::tempdir().expect("tempdir")).collect();
    wrote_and_stopped(dirs[0].path(), &b, "old", 0..300).await;
    let (interval, hour) = (Duration::from_secs(20), oncelog_log::tier::SWEEP_AFTER);
    let new = open_tiered(dirs[1].path(), &b, "new", interval, AckMode::Local, hour, Some(1)).expect("restore");
    let read = tokio::time::timeout(Duration::from_secs(10), read_all(&new, "a", 1 << 20))
        .await
        .expect("a cold read waited for the shipper's next round");
    assert_eq!(read, (0..300).map(body).collect::<String>());
    new.shutdown().await.expect("shutdown");
}

/// A node restoring while the old writer, still running, appends and publishes round after
/// round: the restored node goes on from exactly the cut it restored (the old writer can
/// publish nothing after the takeover), so what it ships continues that cut and a node
/// restored after it reads what it reads.
async fn a_restore_while_the_old_writer_publishes_continues_the_cut_it_restored(kind: &str) {
    let (b, _guard) = bucket(kind, "race");
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().expect("tempdir")).collect();
    let old = open(dirs[0].path(), &b, "old", Duration::from_millis(5)).expect("open");
    create(&old, create_req("a", "text/plain")).await;
    create(&old, create_req("b", "text/plain")).await;
    for i in 0..10 {
        append(&old, produce("a", &body(i), "p", 0, i)).await;
    }
    shipped(&old).await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let busy = {
        let (old, stop) = (old.clone(), stop.clone());
        tokio::spawn(async move {
            let mut i = 10;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && i < 50_000 {
                if old.append(produce("a", &body(i), "p", 0, i)).await.is_err() {
                    break;
                }
                i += 1;
                if i % 16 == 0 {
                    tokio::task::yield_now().await;
                }
            }
            i
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let new = open(dirs[1].path(), &b, "new", Duration::from_millis(50)).expect("restore");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let sent = busy.await.expect("the old writer's task");
    let on_new = read_all(&new, "a", 1 << 24).await;
    let k = (on_new.len() / body(0).len()) as u64;
    assert_eq!(on_new, (0..k).map(body).collect::<String>(), "a prefix of the old writer's appends");
    println!("{kind}: the old writer appended {sent}; the restore took over with {k}");
    for i in k..k + 20 {
        assert_eq!(append(&new, produce("a", &body(i), "p", 0, i)).await.status, AppendStatus::Appended);
    }
    shipped(&new).await;
    let want: String = (0..k + 20).map(body).collect();
    assert_eq!(read_all(&new, "a", 1 << 24).await, want);
    let third = open(dirs[2].path(), &b, "third", Duration::from_millis(50)).expect("restore after it");
    assert_eq!(read_all(&third, "a", 1 << 24).await, want, "the bucket continues the restored cut");
    let _ = old.shutdown().await;
    let _ = new.shutdown().await;
    third.shutdown().await.expect("shutdown");
}

/// A second node started on a running node's data directory is refused before it touches the
/// bucket: it fences no one and restores nothing over the running node's files.
async fn a_second_node_on_a_running_directory_fences_no_one(kind: &str) {
    let (b, _guard) = bucket(kind, "twice");
    let dir = tempfile::tempdir().expect("tempdir");
    let first = open(dir.path(), &b, "first", Duration::from_millis(50)).expect("open");
    create(&first, create_req("a", "text/plain")).await;
    create(&first, create_req("b", "text/plain")).await;
    write(&first, 0..10).await;
    shipped(&first).await;
    let epoch = b.newest().await.expect("newest").expect("a manifest").epoch;
    let err = open(dir.path(), &b, "second", Duration::from_millis(50)).err().expect("refused").to_string();
    assert!(err.contains("another oncelog server is using this data directory"), "{err}");
    assert_eq!(b.newest().await.expect("newest").expect("a manifest").epoch, epoch, "no takeover");
    write(&first, 10..20).await;
    shipped(&first).await;
    assert!(matches!(first.readiness(), Readiness::Ready), "the running node is not fenced");
    assert_eq!(read_all(&first, "a", 1 << 20).await, (0..20).map(body).collect::<String>());
    first.shutdown().await.expect("shutdown");
}

/// A directory whose node was replaced does not take the bucket back, even if its successor
/// has published nothing since (it may have acknowledged writes locally): only the bucket's
/// last writer's directory goes on; the successor's does.
async fn a_replaced_directory_does_not_take_the_bucket_back(kind: &str) {
    let (b, _guard) = bucket(kind, "back");
    let (a_dir, b_dir) = (tempfile::tempdir().expect("tempdir"), tempfile::tempdir().expect("tempdir"));
    wrote_and_stopped(a_dir.path(), &b, "a", 0..5).await;
    let second = open(b_dir.path(), &b, "b", Duration::from_millis(50)).expect("restore");
    second.shutdown().await.expect("shutdown");
    drop(second);
    let epoch = b.newest().await.expect("newest").expect("a manifest").epoch;
    let err = open(a_dir.path(), &b, "a", Duration::from_millis(50)).err().expect("refused").to_string();
    assert!(err.contains("took the bucket over after this directory's writer"), "{err}");
    assert_eq!(b.newest().await.expect("newest").expect("a manifest").epoch, epoch, "no takeover");
    let again = open(b_dir.path(), &b, "b", Duration::from_millis(50)).expect("the last writer's directory goes on");
    assert_eq!(read_all(&again, "a", 1 << 20).await, (0..5).map(body).collect::<String>());
    again.shutdown().await.expect("shutdown");
}

/// A deleted stream's data leaves the bucket: the segments that held only it leave the cut at
/// the checkpoint after the delete, and their objects are deleted after the grace (0 here).
async fn a_deleted_streams_objects_leave_the_bucket(kind: &str) {
    removed_data_leaves_the_bucket(kind, true).await;
}

/// The same for a stream trimmed to its tail (retention and compaction trim the same way).
async fn a_trimmed_streams_objects_leave_the_bucket(kind: &str) {
    removed_data_leaves_the_bucket(kind, false).await;
}

async fn removed_data_leaves_the_bucket(kind: &str, delete: bool) {
    let (b, _guard) = bucket(kind, if delete { "deleted" } else { "trimmed" });
    let dirs: Vec<tempfile::TempDir> = (0..2).map(|_| tempfile::tempdir().expect("tempdir")).collect();
    let e =
        open_with(dirs[0].path(), &b, "n", Duration::from_millis(50), AckMode::Local, Duration::ZERO).expect("open");
    create(&e, create_req("gone", "text/plain")).await;
    for i in 0..200u64 {
        append(&e, produce("gone", &body(i), "g", 0, i)).await;
    }
    create(&e, create_req("a", "text/plain")).await;
    create(&e, create_req("b", "text/plain")).await;
    write(&e, 0..20).await;
    shipped(&e).await;
    let before = b.newest().await.expect("newest").expect("a manifest").cut;
    // The segments holding only "gone" (all but the last two).
    let only_gone: Vec<String> = before
        .segments
        .iter()
        .filter(|s| s.number + 2 < before.end.segment)
        .flat_map(|s| s.ranges.iter().map(|r| r.key.clone()))
        .collect();
    assert!(!only_gone.is_empty(), "segments that hold only the stream to delete: {before:?}");
    if delete {
        e.delete("gone", 0).await.expect("delete");
    } else {
        let tail = e.head("gone", 0).await.expect("head").tail;
        e.trim("gone", tail, 0).await.expect("trim");
    }
    write(&e, 20..25).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let present: Vec<String> = b.objects().await.expect("list").into_iter().map(|(k, _)| k).collect();
        let left: Vec<&String> = only_gone.iter().filter(|k| present.contains(k)).collect();
        if left.is_empty() {
            break;
        }
        if Instant::now() >= deadline {
            let now = b.newest().await.expect("newest").expect("a manifest").cut;
            let segs: Vec<(u64, usize)> = now.segments.iter().map(|s| (s.number, s.ranges.len())).collect();
            let was: Vec<(u64, usize)> = before.segments.iter().map(|s| (s.number, s.ranges.len())).collect();
            panic!("objects of the deleted stream's segments left: {left:?}; the cut's segments {segs:?}, before {was:?}, checkpoint {:?}", now.checkpoint.map(|c| c.lsn));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    shipped(&e).await;
    e.shutdown().await.expect("shutdown");
    drop(e);
    let restored = open(dirs[1].path(), &b, "r", Duration::from_millis(50)).expect("restore");
    assert_eq!(read_all(&restored, "a", 1 << 20).await, (0..25).map(body).collect::<String>());
    if delete {
        assert!(restored.head("gone", 0).await.is_err(), "the deleted stream stays deleted");
    } else {
        assert_eq!(read_all(&restored, "gone", 1 << 20).await, "", "the trimmed stream stays trimmed");
    }
    restored.shutdown().await.expect("shutdown");
}

macro_rules! on_both {
    ($($case:ident),* $(,)?) => {
        mod s3 {
            $(
                #[test]
                fn $case() {
                    oncelog_storage::contract::run(|| super::$case("s3"));
                }
            )*
        }
        mod dir {
            $(
                #[test]
                fn $case() {
                    oncelog_storage::contract::run(|| super::$case("dir"));
                }
            )*
        }
    };
}

on_both!(
    disk_loss_keeps_every_shipped_append_once,
    what_was_not_shipped_is_lost_whole_and_taken_as_new,
    a_disk_the_bucket_moved_past_is_refused,
    a_directory_that_ran_without_a_bucket_is_shipped_whole,
    bucket_mode_acknowledges_only_what_the_bucket_holds,
    the_sweep_deletes_what_no_cut_names_and_nothing_else,
    old_segments_are_read_from_the_bucket_under_a_small_cache,
    the_cache_fills_back_after_a_restore,
    a_restore_while_the_old_writer_publishes_continues_the_cut_it_restored,
    a_second_node_on_a_running_directory_fences_no_one,
    a_replaced_directory_does_not_take_the_bucket_back,
    a_deleted_streams_objects_leave_the_bucket,
    a_trimmed_streams_objects_leave_the_bucket,
    a_long_log_is_restored_through_its_segment_table,
);

/// Both store kinds in one test: the gauge it watches is one for the whole process.
#[test]
fn an_object_deleted_under_a_running_node_is_noticed_on_both() {
    oncelog_storage::contract::run(|| an_object_deleted_under_a_running_node_is_noticed("dir"));
    oncelog_storage::contract::run(|| an_object_deleted_under_a_running_node_is_noticed("s3"));
}

/// Made unreachable by replacing a directory: one store kind only.
#[test]
fn bucket_mode_answers_503_while_the_bucket_is_away_dir() {
    oncelog_storage::contract::run(|| bucket_mode_answers_503_while_the_bucket_is_away("dir"));
}

/// Slowed by the fault proxy in front of the S3 API server: one store kind only.
#[test]
fn a_cache_fill_holds_up_no_acknowledgement_s3() {
    oncelog_storage::contract::run(|| a_cache_fill_holds_up_no_acknowledgement("s3"));
}

/// Through the fault proxy: one store kind only.
#[test]
fn a_cold_read_waits_for_no_shipping_round_s3() {
    oncelog_storage::contract::run(|| a_cold_read_waits_for_no_shipping_round("s3"));
}
