//! Scenario tests of the log's failure handling on the simulated disk: fail-stop after a failed
//! sync, torn tails, damage in the middle, checkpoints and the space they give back.

use std::sync::Arc;

use oncelog_storage::contract::{create_req, produce};
use oncelog_storage::*;
use tokio::sync::oneshot;

use crate::format;
use crate::options::Durability;
use crate::sim::SimFs;
use crate::store::mutant::Mutant;
use crate::store::{self, Command, Group, Store, StoreConfig};

fn config() -> StoreConfig {
    StoreConfig {
        durability: Durability::Fsync,
        segment_bytes: 4096,
        hot_bytes: 0,
        mutant: Mutant::None,
        failpoints: Default::default(),
        retention: Default::default(),
    }
}

fn open(fs: &SimFs) -> Result<Store, StorageError> {
    store::open(Arc::new(fs.clone()), config(), 0).map(|(s, _)| s)
}

/// Runs one command as a group of its own: staged, committed, published.
fn run(store: &mut Store, cmd: Command) {
    let mut g = Group::new();
    store.stage(cmd, &mut g);
    let failure = store.commit(&mut g);
    store.finish(g, failure);
}

fn create(store: &mut Store, path: &str) {
    let (tx, mut rx) = oneshot::channel();
    run(store, Command::Create { req: create_req(path, "text/plain"), reply: tx });
    assert!(matches!(rx.try_recv(), Ok(Ok(CreateOutcome::Created(_)))));
}

/// Producer `p`, epoch 0, sequence number `seq`.
fn append(store: &mut Store, path: &str, seq: u64, data: &str) -> Result<AppendOutcome, AppendError> {
    let (tx, mut rx) = oneshot::channel();
    run(store, Command::Append { req: produce(path, data, "p", 0, seq), reply: tx });
    rx.try_recv().expect("answered")
}

fn delete(store: &mut Store, path: &str) {
    let (tx, mut rx) = oneshot::channel();
    run(store, Command::Delete { path: path.into(), req: DeleteRequest::default(), now_ms: 0, reply: tx });
    assert!(matches!(rx.try_recv(), Ok(Ok(()))));
}

fn contents(store: &Store, path: &str) -> Vec<u8> {
    let view = store.view();
    let s = view.streams.read().expect("lock").get(path).cloned().expect("stream");
    let tail = s.state.get().tail.0;
    crate::store::read::plan(&s, 0, tail, usize::MAX, false)
        .and_then(|p| p.bytes(&view.segments))
        .expect("read")
        .0
         .0
        .to_vec()
}

#[test]
fn a_failed_fdatasync_stops_every_later_write() {
    let fs = SimFs::new();
    let mut store = open(&fs).expect("open");
    create(&mut store, "s");
    append(&mut store, "s", 0, "kept").expect("first append");
    fs.fail_syncs(true);
    let failed = append(&mut store, "s", 1, "lost");
    // Unavailable (503, outcome unknown, retry after a restart), not Backend (500): the full
    // disk the fault suite made answered 500 before.
    assert!(matches!(failed, Err(AppendError::Storage(StorageError::Unavailable(_)))), "{failed:?}");
    let said = failed.as_ref().err().map(ToString::to_string).unwrap_or_default();
    assert!(said.contains("writes stopped after a storage failure") && said.contains("fdatasync"), "{said}");
    // The disk "recovers" and the next sync would report success: writes must stay stopped.
    fs.fail_syncs(false);
    let after = append(&mut store, "s", 1, "again");
    assert!(matches!(after, Err(AppendError::Storage(StorageError::Poisoned))), "{after:?}");
    assert!(store.counters().failed());
    assert_eq!(contents(&store, "s"), b"kept", "readers never saw the failed group");
    drop(store);
    fs.power_cut(&mut <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(1));
    let mut store = open(&fs).expect("reopen");
    assert_eq!(contents(&store, "s"), b"kept");
    assert_eq!(append(&mut store, "s", 1, "retry").map(|o| o.status).ok(), Some(AppendStatus::Appended));
}

#[test]
fn a_torn_tail_is_cut_and_everything_acknowledged_stays() {
    let fs = SimFs::new();
    let mut store = open(&fs).expect("open");
    create(&mut store, "s");
    append(&mut store, "s", 0, "one").expect("append");
    append(&mut store, "s", 1, "two").expect("append");
    let good = store.active_len() as usize;
    drop(store);
    let name = format::segment_name(1);
    let mut bytes = fs.contents(&name).expect("segment");
    assert!(
        bytes.len() > good + 44 && bytes[good..].iter().all(|b| *b == 0),
        "the segment's space is allocated, as zeros"
    );
    // A frame torn where the next one was being written, in the allocated space.
    bytes[good..good + 4].copy_from_slice(&format::FRAME_MAGIC.to_le_bytes());
    bytes[good + 4..good + 44].copy_from_slice(&[0xEE; 40]);
    fs.set_contents(&name, bytes);
    let (mut store, report) = store::open(Arc::new(fs.clone()), config(), 0).expect("a torn tail is not damage");
    assert_eq!(report.torn_bytes_cut, 44);
    let after = fs.contents(&name).expect("segment");
    assert!(after.len() > good && after[good..].iter().all(|b| *b == 0), "cut, and the space allocated again");
    assert_eq!(contents(&store, "s"), b"onetwo");
    assert_eq!(append(&mut store, "s", 1, "two").map(|o| o.status).ok(), Some(AppendStatus::Duplicate));
}

#[test]
fn damage_before_acknowledged_frames_refuses_to_start() {
    let fs = SimFs::new();
    let mut store = open(&fs).expect("open");
    create(&mut store, "s");
    append(&mut store, "s", 0, "first").expect("append");
    append(&mut store, "s", 1, "second").expect("append");
    drop(store);
    let name = format::segment_name(1);
    let mut bytes = fs.contents(&name).expect("segment");
    // Flip a bit inside the first frame's payload; valid frames follow it.
    let at = format::SEGMENT_HEADER as usize + format::FRAME_HEADER + 2;
    bytes[at] ^= 0x01;
    fs.set_contents(&name, bytes);
    let err = open(&fs).err().expect("must refuse").to_string();
    assert!(err.contains("damaged frame at byte 16") && err.contains("acknowledged frames after it"), "{err}");
}

#[test]
fn a_checkpoint_gives_back_the_segments_of_deleted_streams_and_recovery_starts_there() {
    let fs = SimFs::new();
    let mut store = open(&fs).expect("open");
    create(&mut store, "gone");
    create(&mut store, "kept");
    for seq in 0..40 {
        append(&mut store, "gone", seq, &"g".repeat(500)).expect("append");
    }
    append(&mut store, "kept", 0, "still here").expect("append");
    delete(&mut store, "gone");
    let segments_before = fs_segments(&fs);
    assert!(segments_before.len() > 3, "{segments_before:?}");
    let removed = store::write_checkpoint(&fs, store.view(), &store.snapshot()).expect("checkpoint");
    let segments_after = fs_segments(&fs);
    assert_eq!(removed, segments_before.len() - segments_after.len());
    assert!(
        removed >= segments_before.len() - 2,
        "only the segment of `kept` and the active one stay: {segments_after:?}"
    );
    drop(store);
    let (mut store, report) = store::open(Arc::new(fs.clone()), config(), 0).expect("reopen");
    assert!(report.from_checkpoint);
    assert_eq!(report.frames_replayed, 0);
    assert_eq!(contents(&store, "kept"), b"still here");
    assert_eq!(append(&mut store, "kept", 0, "still here").map(|o| o.status).ok(), Some(AppendStatus::Duplicate));
}

#[test]
fn a_data_directory_of_the_retired_fjall_engine_is_refused_with_a_reason() {
    let fs = SimFs::new();
    crate::fs::Fs::create_dir(&fs, "keyspaces").expect("dir");
    let err = open(&fs).err().expect("refused").to_string();
    assert!(err.contains("pre-release engine") && err.contains("no longer reads"), "{err}");
}

fn fs_segments(fs: &SimFs) -> Vec<String> {
    crate::fs::Fs::list(fs, format::LOG_DIR).expect("list")
}
