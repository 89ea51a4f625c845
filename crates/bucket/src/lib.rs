//! Oncelog's object-storage tier (issue 35; plan in docs/design/issue-35-plan.md).
//!
//! The log engine's bucket holds its log itself — ranges of segment files (whole frames) and
//! checkpoints — and a manifest naming a prefix of the frame sequence. An append and all its
//! effects are one record in one frame, so any prefix of frames is a state the engine was in:
//! a restored node's producer states and keys are exactly those of the data restored.
//!
//! - [`location`]: `--object-store` values (`s3://BUCKET/PREFIX`, `file:///DIR`).
//! - [`manifest`]: the manifest, its stored form (versioned JSON) and its invariants.
//! - [`keys`]: object names under a prefix.
//! - [`bucket`]: the prefix and its one writer: takeover with the next epoch, publish by
//!   creating the next manifest (a zombie of an older epoch finds the name taken: fenced),
//!   immutable objects checked by CRC32C.

pub mod bucket;
pub mod keys;
pub mod location;
pub mod manifest;

pub use bucket::{Bucket, BucketError, Writer};
pub use location::{Location, LocationError};
pub use manifest::{CheckpointRef, Cut, LogPosition, Manifest, ManifestError, ObjectRef, SegmentRef, Takeover};
