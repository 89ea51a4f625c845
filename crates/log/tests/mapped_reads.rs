//! Reads of segment data through memory mappings (`File::map_range`): every shape of read
//! returns exactly the stored bytes — a lone append (a slice of the mapping), pieces of runs of
//! appends, small runs read with `pread` where one buffer is asked for, bounded reads cut inside
//! an append, reads across segments — and a segment is mapped once for all its reads as pieces,
//! the mapping gone with the segment's last holder, while a buffer's mapping goes with it.

use oncelog_log::{Durability, LogEngine, LogOptions};
use oncelog_protocol::Offset;
use oncelog_storage::contract::{create, create_req};
use oncelog_storage::{AppendRequest, Engine, ReadRequest};

fn engine(dir: &std::path::Path) -> LogEngine {
    let mut o = LogOptions::new(dir);
    o.durability = Durability::Buffered;
    // Nothing kept in memory: every read goes to the segment files.
    o.hot_bytes = 0;
    // Small segments, so reads cross them.
    o.segment_bytes = 1 << 20;
    LogEngine::open(o).expect("open")
}

fn payload(i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|k| ((i * 31 + k * 7) % 251) as u8).collect()
}

fn append(path: &str, data: Vec<u8>) -> AppendRequest {
    AppendRequest::plain(path, "application/octet-stream", false, data.into(), 0)
}

/// A fresh engine in its own directory, with the byte stream "a" created.
async fn with_stream_a() -> (tempfile::TempDir, LogEngine) {
    let dir = tempfile::tempdir().expect("tempdir");
    let e = engine(dir.path());
    create(&e, create_req("a", "application/octet-stream")).await;
    (dir, e)
}

/// Lines of this process's memory map that name a file under `dir`.
fn mappings_under(dir: &std::path::Path) -> usize {
    let maps = std::fs::read_to_string("/proc/self/maps").expect("/proc/self/maps");
    let dir = dir.to_str().expect("utf-8 temp dir");
    maps.lines().filter(|l| l.contains(dir)).count()
}

#[test]
fn every_shape_of_read_returns_the_stored_bytes() {
    oncelog_storage::contract::run(|| async {
        let (_dir, e) = with_stream_a().await;
        create(&e, create_req("b", "application/octet-stream")).await;
        // Stream a: large and small appends; stream b's appends between them leave gaps of a
        // record header (small runs coalesce) or of more than 4 KiB (runs break).
        let sizes = [70_000, 3_000, 5_000, 100_000, 1_000, 20_000, 20_000, 30_000, 200, 150_000, 64 * 1024, 9];
        let mut expected = Vec::new();
        for round in 0..4 {
            for (k, len) in sizes.iter().enumerate() {
                let data = payload(round * 100 + k, *len);
                expected.extend_from_slice(&data);
                e.append(append("a", data)).await.expect("append a");
                let gap = if k % 3 == 0 { 10_000 } else { 100 };
                e.append(append("b", payload(k, gap))).await.expect("append b");
            }
        }
        let total = expected.len() as u64;
        // Reads from every kind of start, bounded and not, of several sizes.
        let mut starts: Vec<u64> = vec![0, 1, 4097, 69_999, 70_000, 73_000, 78_000, 200_000, total - 9, total - 1];
        starts.extend((0..total).step_by(123_457));
        for from in starts {
            for max in [1, 4096, 65_536, 70_000, 100_000, 300_000, 1 << 20, 8 << 20] {
                for bounded in [false, true] {
                    let mut req = ReadRequest::new("a", Offset(from), max, 0);
                    if bounded {
                        req = req.bounded();
                    }
                    let chunk = e.read(req).await.expect("read");
                    let got = chunk.data.len() as u64;
                    assert!(got > 0, "a read below the tail returns bytes (from {from}, max {max})");
                    assert_eq!(
                        chunk.next,
                        Offset(from + got),
                        "next offset (from {from}, max {max}, bounded {bounded})"
                    );
                    assert!(
                        chunk.data[..] == expected[from as usize..(from + got) as usize],
                        "bytes from {from}, {got} of them (max {max}, bounded {bounded})"
                    );
                    if bounded {
                        assert!(got <= max as u64, "a bounded read holds at most its limit");
                    }
                    // The same read in pieces (runs of large appends mapped and sliced).
                    let mut req = ReadRequest::new("a", Offset(from), max, 0);
                    if bounded {
                        req = req.bounded();
                    }
                    let pieces = e.read_pieces(req).await.expect("read pieces");
                    let joined: Vec<u8> = pieces.pieces.iter().flat_map(|p| p.iter().copied()).collect();
                    assert!(joined[..] == chunk.data[..], "pieces from {from} (max {max}, bounded {bounded})");
                    assert_eq!(pieces.next, chunk.next);
                }
            }
        }
        e.shutdown().await.expect("shutdown");
    });
}

#[test]
fn a_segment_is_mapped_once_for_every_read_and_unmapped_with_the_engine() {
    oncelog_storage::contract::run(|| async {
        let (dir, e) = with_stream_a().await;
        let big = payload(1, 300_000);
        e.append(append("a", big.clone())).await.expect("append");
        assert_eq!(mappings_under(dir.path()), 0, "nothing mapped before a read");
        // Read as one buffer (what the server reads itself: SSE, JSON): a mapping of its own,
        // gone with the answer, so the pages the server touched leave the process with it.
        let chunk = e.read(ReadRequest::new("a", Offset(0), 1 << 20, 0)).await.expect("read");
        assert!(chunk.data[..] == big[..]);
        assert_eq!(mappings_under(dir.path()), 1, "a lone large append is answered from a mapping");
        drop(chunk);
        assert_eq!(mappings_under(dir.path()), 0, "that mapping goes with the answer");
        // Read as pieces (what a socket sends), of every size: slices of the segment's one
        // mapping (no mmap per read).
        for (from, max) in [(0, 1 << 20), (10, 1000), (4097, 100_000)] {
            let read = e.read_pieces(ReadRequest::new("a", Offset(from), max, 0).bounded()).await.expect("read");
            let joined: Vec<u8> = read.pieces.iter().flat_map(|p| p.iter().copied()).collect();
            assert!(joined[..] == big[from as usize..from as usize + joined.len()]);
            assert_eq!(mappings_under(dir.path()), 1, "still the one mapping");
        }
        e.shutdown().await.expect("shutdown");
        drop(e);
        assert_eq!(mappings_under(dir.path()), 0, "the mapping goes with the segment's last holder");
    });
}

#[test]
fn appends_are_handed_over_as_slices_of_one_mapping_large_and_small() {
    oncelog_storage::contract::run(|| async {
        let (dir, e) = with_stream_a().await;
        let mut all = Vec::new();
        for i in 0..8 {
            let data = payload(i, 40_000);
            all.extend_from_slice(&data);
            e.append(append("a", data)).await.expect("append");
        }
        let read = e.read_pieces(ReadRequest::new("a", Offset(0), 320_000, 0).bounded()).await.expect("read");
        assert_eq!(read.pieces.len(), 8, "one piece per append, not one gathered buffer");
        let joined: Vec<u8> = read.pieces.iter().flat_map(|p| p.iter().copied()).collect();
        assert!(joined == all);
        assert_eq!(mappings_under(dir.path()), 1, "the pieces are mapped segment memory");
        // Small appends too: a piece each, no copy (a socket gathers them into vectored writes).
        create(&e, create_req("small", "application/octet-stream")).await;
        let mut small = Vec::new();
        for i in 0..100 {
            let data = payload(i, 1_000);
            small.extend_from_slice(&data);
            e.append(append("small", data)).await.expect("append");
        }
        let read = e.read_pieces(ReadRequest::new("small", Offset(0), 100_000, 0).bounded()).await.expect("read");
        assert_eq!(read.pieces.len(), 100, "a slice per small append");
        let joined: Vec<u8> = read.pieces.iter().flat_map(|p| p.iter().copied()).collect();
        assert!(joined == small);
        assert_eq!(mappings_under(dir.path()), 1, "slices of the same mapping");
        e.shutdown().await.expect("shutdown");
    });
}
