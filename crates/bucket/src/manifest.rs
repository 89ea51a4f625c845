//! The manifest: which objects of the bucket prefix make up its state, a consistent cut of the
//! log engine's log. Stored as `manifest/NNNNNNNNNNNNNNNNNNNN` ([`crate::keys`]), immutable,
//! created once with `If-None-Match: *`; the newest is the prefix's state.
//!
//! Stored form: JSON (an operator can read it with any tool), `{"format":1, ...}`; a reader
//! refuses another format number rather than guess. Fields are only ever added with a default,
//! so a manifest stays readable by the version that wrote it and later ones.
//!
//! Invariants ([`Cut::check`], checked on every decode and before every publish):
//! 1. Per segment, the ranges are contiguous from the segment's first shipped byte: each starts
//!    where the one before it ends (no hole, no overlap), so a segment restored from them is the
//!    original file's prefix, byte for byte, and every `(segment, position)` index entry in the
//!    checkpoint means what it meant.
//! 2. Segments are listed in increasing number, and the cut's end lies in the last one, at the
//!    end of its last range: the cut is a prefix of the frame sequence ending at `end.lsn`.
//! 3. The checkpoint, if any, is as of an LSN at or before `end.lsn`; without one, the log
//!    starts at the first byte of segment 1 (a restore replays it from there).
//!
//! **The segment table** (format 2): a cut of a long log names thousands of segments (64 MiB
//! each: 16,000 for 1 TB, ~170 bytes of JSON each), and a manifest is written every round. So
//! the oldest segments — sealed and folded into one object each, which change only when a
//! checkpoint drops some — go into an immutable object of their own, the table (JSON list of
//! [`SegmentRef`], named by its content: [`crate::keys::table`]), which the manifest names with
//! [`TableRef`] and which rounds reuse while those segments stay as they are. In the stored
//! form `cut.segments` holds only the segments after the table's; in memory (as
//! [`crate::Bucket`] reads it) the table's come first, so a cut is always whole. Invariants 1-3
//! hold of the whole cut; the table's segments all come before the stored ones.

use serde::{Deserialize, Serialize};

/// The stored form's format number (2: a manifest may name a segment table).
pub const FORMAT: u32 = 2;

/// The formats this version reads: format 1 is format 2 without a table.
const FORMATS_READ: [u32; 2] = [1, 2];

/// One manifest: the cut it names and who named it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: u32,
    /// Its number: the key `manifest/{number}`.
    pub number: u64,
    /// The writer epoch that created it (one per takeover).
    pub epoch: u64,
    /// The number of the first manifest of each epoch, oldest first (this one's epoch last).
    /// Those are never deleted: a zombie of an older epoch can only ever try to create the
    /// first manifest of the epoch after it, and must find the name taken.
    pub takeovers: Vec<Takeover>,
    /// Who created it (`host:pid`), for operators.
    pub node: String,
    /// When, in Unix ms (the writer's clock; informational only).
    pub written_ms: i64,
    /// The segment table holding the cut's first segments (module note), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<TableRef>,
    pub cut: Cut,
}

/// A segment table: the object, and how many of the cut's first segments it holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableRef {
    pub object: ObjectRef,
    pub segments: u64,
}

/// The first manifest of an epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Takeover {
    pub epoch: u64,
    pub number: u64,
}

/// A consistent cut of the log: a checkpoint and the segment ranges holding every frame a
/// restore needs, up to `end`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cut {
    /// The checkpoint file and the LSN it is as of (`None`: replay from the first frame).
    pub checkpoint: Option<CheckpointRef>,
    /// The live segments and their shipped ranges, in increasing segment number.
    pub segments: Vec<SegmentRef>,
    /// Where the cut ends: after frame `end.lsn`, at `end.pos` of segment `end.segment`.
    pub end: LogPosition,
}

/// A position in the log: after frame `lsn`, which ends at byte `pos` of segment `segment`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogPosition {
    pub lsn: u64,
    pub segment: u64,
    pub pos: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointRef {
    pub lsn: u64,
    pub object: ObjectRef,
}

/// One live segment: the objects that hold its bytes from `start` on, back to back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentRef {
    pub number: u64,
    /// The first byte shipped (the segment's header included, so normally 0).
    pub start: u64,
    pub ranges: Vec<ObjectRef>,
}

/// An immutable object and what a reader checks it against.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectRef {
    pub key: String,
    pub len: u64,
    pub crc32c: u32,
}

/// Why a stored manifest was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    #[error("manifest is not readable JSON: {0}")]
    Json(String),
    #[error("manifest format {0} is not one this version reads (it reads {FORMAT})")]
    Format(u32),
    #[error("manifest is inconsistent: {0}")]
    Inconsistent(&'static str),
}

impl SegmentRef {
    /// Where the segment's shipped bytes end.
    pub fn end(&self) -> u64 {
        self.ranges.iter().fold(self.start, |at, r| at.saturating_add(r.len))
    }
}

impl Cut {
    /// The invariants in the module note.
    pub fn check(&self) -> Result<(), ManifestError> {
        let bad = |why| Err(ManifestError::Inconsistent(why));
        if self.segments.windows(2).any(|w| w[0].number >= w[1].number) {
            return bad("segments out of order");
        }
        if self.segments.iter().any(|s| s.ranges.iter().any(|r| r.len == 0)) {
            return bad("an empty range");
        }
        if self.segments.iter().any(|s| s.ranges.iter().try_fold(s.start, |at, r| at.checked_add(r.len)).is_none()) {
            return bad("a range past the end of the offset space");
        }
        match self.segments.last() {
            None if self.end != LogPosition::default() => return bad("an end without segments"),
            Some(last) if (last.number, last.end()) != (self.end.segment, self.end.pos) => {
                return bad("the end is not the end of the last segment's ranges")
            }
            _ => {}
        }
        if self.checkpoint.as_ref().is_some_and(|c| c.lsn > self.end.lsn) {
            return bad("a checkpoint past the end");
        }
        if self.checkpoint.is_none() && self.segments.first().is_some_and(|s| (s.number, s.start) != (1, 0)) {
            return bad("no checkpoint, and the log does not start at the first byte of segment 1");
        }
        Ok(())
    }
}

impl Manifest {
    /// The stored form: without the table's segments, which the table holds.
    pub fn encode(&self) -> Vec<u8> {
        // The stored form borrowed from this one (a manifest is encoded every ship round; its
        // cut may name thousands of segments, none of which is copied here). Field names as
        // `Manifest`'s and `Cut`'s, which `decode` reads.
        #[derive(Serialize)]
        struct Stored<'a> {
            format: u32,
            number: u64,
            epoch: u64,
            takeovers: &'a [Takeover],
            node: &'a str,
            written_ms: i64,
            #[serde(skip_serializing_if = "Option::is_none")]
            table: Option<&'a TableRef>,
            cut: StoredCut<'a>,
        }
        #[derive(Serialize)]
        struct StoredCut<'a> {
            checkpoint: Option<&'a CheckpointRef>,
            segments: &'a [SegmentRef],
            end: LogPosition,
        }
        let skip = self.table.as_ref().map_or(0, |t| usize::try_from(t.segments).unwrap_or(usize::MAX));
        let stored = Stored {
            format: self.format,
            number: self.number,
            epoch: self.epoch,
            takeovers: &self.takeovers,
            node: &self.node,
            written_ms: self.written_ms,
            table: self.table.as_ref(),
            cut: StoredCut {
                checkpoint: self.cut.checkpoint.as_ref(),
                segments: self.cut.segments.get(skip..).unwrap_or_default(),
                end: self.cut.end,
            },
        };
        // Serialising plain structs of numbers and strings cannot fail.
        serde_json::to_vec(&stored).expect("a manifest serialises")
    }

    /// Reads a stored manifest, refusing a format this version does not read or a cut that
    /// breaks the invariants. With a table, its segments are still to be put in with
    /// [`Manifest::with_table`] (the invariants are checked then).
    pub fn decode(bytes: &[u8]) -> Result<Manifest, ManifestError> {
        #[derive(Deserialize)]
        struct Head {
            format: u32,
        }
        let head: Head = serde_json::from_slice(bytes).map_err(|e| ManifestError::Json(e.to_string()))?;
        if !FORMATS_READ.contains(&head.format) {
            return Err(ManifestError::Format(head.format));
        }
        let mut m: Manifest = serde_json::from_slice(bytes).map_err(|e| ManifestError::Json(e.to_string()))?;
        if head.format == 1 && m.table.is_some() {
            return Err(ManifestError::Inconsistent("a table in a format 1 manifest"));
        }
        m.format = FORMAT;
        if m.table.is_none() {
            m.cut.check()?;
        }
        if m.takeovers.last().map(|t| t.epoch) != Some(m.epoch) {
            return Err(ManifestError::Inconsistent("its epoch's takeover is not listed last"));
        }
        // A hand-edited manifest must not make a takeover wrap an epoch or fence no one.
        if m.epoch == 0 || m.number == 0 {
            return Err(ManifestError::Inconsistent("writer epoch or number 0 (both start at 1)"));
        }
        if m.takeovers.windows(2).any(|w| w[0].epoch >= w[1].epoch || w[0].number >= w[1].number) {
            return Err(ManifestError::Inconsistent("its takeovers are not in increasing epoch and number"));
        }
        if m.takeovers.last().is_some_and(|t| t.number > m.number) {
            return Err(ManifestError::Inconsistent("its epoch's takeover is numbered after it"));
        }
        Ok(m)
    }

    /// A decoded manifest made whole: the segments its table holds (the table object's
    /// bytes, already checked against its CRC32C) before its own; the invariants checked.
    pub fn with_table(mut self, table: &[u8]) -> Result<Manifest, ManifestError> {
        let Some(t) = &self.table else { return Ok(self) };
        let mut segments = decode_table(table)?;
        if segments.len() as u64 != t.segments {
            return Err(ManifestError::Inconsistent("the table holds another number of segments than it says"));
        }
        if let (Some(last), Some(first)) = (segments.last(), self.cut.segments.first()) {
            if last.number >= first.number {
                return Err(ManifestError::Inconsistent("the table's segments do not come first"));
            }
        }
        segments.append(&mut self.cut.segments);
        self.cut.segments = segments;
        self.cut.check()?;
        Ok(self)
    }
}

/// A segment table's stored form.
pub fn encode_table(segments: &[SegmentRef]) -> Vec<u8> {
    serde_json::to_vec(segments).expect("segments serialise")
}

fn decode_table(bytes: &[u8]) -> Result<Vec<SegmentRef>, ManifestError> {
    serde_json::from_slice(bytes).map_err(|e| ManifestError::Json(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn object() -> impl Strategy<Value = ObjectRef> {
        ("[a-z0-9/-]{1,40}", 1u64..1 << 40, any::<u32>()).prop_map(|(key, len, crc32c)| ObjectRef { key, len, crc32c })
    }

    /// Consistent manifests: segments in order, the end where the last one's ranges end.
    fn manifest() -> impl Strategy<Value = Manifest> {
        let segments = proptest::collection::vec((1u64..50, 0u64..64, proptest::collection::vec(object(), 1..4)), 0..4);
        let starts_at_one = |segs: &mut Vec<(u64, u64, Vec<ObjectRef>)>| {
            if let Some(first) = segs.first_mut() {
                (first.0, first.1) = (1, 0);
            }
        };
        (segments, any::<u64>(), 1u64..1000, "[a-z0-9:.-]{0,20}", any::<i64>(), any::<bool>()).prop_map(
            move |(mut segs, lsn, epoch, node, written_ms, ckp)| {
                if !ckp {
                    starts_at_one(&mut segs);
                }
                let mut number = 0;
                let segments: Vec<SegmentRef> = segs
                    .into_iter()
                    .map(|(gap, start, ranges)| {
                        number += gap;
                        SegmentRef { number, start, ranges }
                    })
                    .collect();
                let end = segments.last().map_or(LogPosition::default(), |s| LogPosition {
                    lsn,
                    segment: s.number,
                    pos: s.end(),
                });
                let checkpoint = (ckp && !segments.is_empty())
                    .then(|| CheckpointRef { lsn: lsn / 2, object: ObjectRef { key: "c".into(), len: 9, crc32c: 1 } });
                Manifest {
                    format: FORMAT,
                    number: epoch * 3,
                    epoch,
                    takeovers: vec![Takeover { epoch, number: epoch * 2 }],
                    node,
                    written_ms,
                    table: None,
                    cut: Cut { checkpoint, segments, end },
                }
            },
        )
    }

    proptest! {
        #[test]
        fn a_manifest_reads_back_as_written(m in manifest()) {
            prop_assert_eq!(Manifest::decode(&m.encode()), Ok(m));
        }

        /// With its first `k` segments in a table, a manifest stores only the others and reads
        /// back whole with the table.
        #[test]
        fn a_manifest_with_a_table_reads_back_whole(m in manifest(), k in 0usize..4) {
            let k = k.min(m.cut.segments.len().saturating_sub(1));
            prop_assume!(k > 0);
            let table = encode_table(&m.cut.segments[..k]);
            let object = ObjectRef { key: "t".into(), len: table.len() as u64, crc32c: 3 };
            let m = Manifest { table: Some(TableRef { object, segments: k as u64 }), ..m };
            let stored = m.encode();
            let decoded = Manifest::decode(&stored).expect("decodes");
            prop_assert_eq!(decoded.cut.segments.len(), m.cut.segments.len() - k);
            prop_assert_eq!(decoded.with_table(&table), Ok(m));
        }
    }

    #[test]
    fn a_table_is_checked_against_its_manifest() {
        let mut m = sample();
        let table = encode_table(&m.cut.segments[..1]);
        m.table = Some(TableRef { object: ObjectRef { key: "t".into(), len: 1, crc32c: 1 }, segments: 1 });
        let stored = m.encode();
        assert_eq!(Manifest::decode(&stored).and_then(|d| d.with_table(&table)), Ok(m.clone()));
        // Another count than it holds; segments after the manifest's own; not a table.
        let two = encode_table(&m.cut.segments);
        assert!(matches!(
            Manifest::decode(&stored).and_then(|d| d.with_table(&two)),
            Err(ManifestError::Inconsistent(_))
        ));
        let later = encode_table(&[SegmentRef { number: 9, start: 0, ranges: m.cut.segments[0].ranges.clone() }]);
        assert!(matches!(
            Manifest::decode(&stored).and_then(|d| d.with_table(&later)),
            Err(ManifestError::Inconsistent(_))
        ));
        assert!(matches!(Manifest::decode(&stored).and_then(|d| d.with_table(b"{}")), Err(ManifestError::Json(_))));
        // A format 1 manifest (before tables) still reads; one with a table does not.
        let old = String::from_utf8(sample().encode()).expect("utf8").replace("\"format\":2", "\"format\":1");
        assert_eq!(Manifest::decode(old.as_bytes()), Ok(sample()));
        let odd = String::from_utf8(stored).expect("utf8").replace("\"format\":2", "\"format\":1");
        assert!(matches!(Manifest::decode(odd.as_bytes()), Err(ManifestError::Inconsistent(_))));
    }

    fn sample() -> Manifest {
        let r = |key: &str, len| ObjectRef { key: key.into(), len, crc32c: 7 };
        Manifest {
            format: FORMAT,
            number: 4,
            epoch: 2,
            takeovers: vec![Takeover { epoch: 1, number: 1 }, Takeover { epoch: 2, number: 3 }],
            node: "h:1".into(),
            written_ms: 0,
            table: None,
            cut: Cut {
                checkpoint: Some(CheckpointRef { lsn: 5, object: r("ckp", 100) }),
                segments: vec![
                    SegmentRef { number: 3, start: 0, ranges: vec![r("a", 10), r("b", 20)] },
                    SegmentRef { number: 4, start: 0, ranges: vec![r("c", 16)] },
                ],
                end: LogPosition { lsn: 9, segment: 4, pos: 16 },
            },
        }
    }

    #[test]
    fn manifests_that_break_an_invariant_are_refused() {
        assert_eq!(Manifest::decode(&sample().encode()), Ok(sample()));
        let refused = |f: &dyn Fn(&mut Manifest)| {
            let mut m = sample();
            f(&mut m);
            Manifest::decode(&m.encode())
        };
        assert!(matches!(refused(&|m| m.format = 3), Err(ManifestError::Format(3))));
        assert!(matches!(refused(&|m| m.cut.end.pos = 15), Err(ManifestError::Inconsistent(_))));
        assert!(matches!(refused(&|m| m.cut.end.segment = 3), Err(ManifestError::Inconsistent(_))));
        assert!(matches!(refused(&|m| m.cut.segments.swap(0, 1)), Err(ManifestError::Inconsistent(_))));
        assert!(matches!(refused(&|m| m.cut.segments[0].ranges[0].len = 0), Err(ManifestError::Inconsistent(_))));
        assert!(matches!(
            refused(&|m| m.cut.checkpoint.as_mut().expect("ckp").lsn = 10),
            Err(ManifestError::Inconsistent(_))
        ));
        assert!(matches!(refused(&|m| m.takeovers.pop().map(drop).unwrap_or(())), Err(ManifestError::Inconsistent(_))));
        assert!(matches!(refused(&|m| m.cut.checkpoint = None), Err(ManifestError::Inconsistent(_))));
        // Epochs and numbers a takeover could wrap or that would fence no one.
        let takeover_zero = |m: &mut Manifest| {
            m.epoch = 0;
            m.takeovers = vec![Takeover { epoch: 0, number: 3 }];
        };
        assert!(matches!(refused(&takeover_zero), Err(ManifestError::Inconsistent(_))));
        assert!(matches!(refused(&|m| m.takeovers[0].epoch = 2), Err(ManifestError::Inconsistent(_))));
        assert!(matches!(refused(&|m| m.takeovers[0].number = 3), Err(ManifestError::Inconsistent(_))));
        assert!(matches!(refused(&|m| m.takeovers[1].number = 5), Err(ManifestError::Inconsistent(_))));
        assert!(matches!(Manifest::decode(b"{\"format\":1}"), Err(ManifestError::Json(_))));
        assert!(matches!(Manifest::decode(b"not json"), Err(ManifestError::Json(_))));
    }
}
