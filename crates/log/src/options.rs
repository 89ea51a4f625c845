//! What an engine is opened with: where its files are, what "acknowledged" means, sizes, and
//! (in tests) switches that make it fail on purpose.

use std::path::PathBuf;
#[cfg(any(test, feature = "failpoints"))]
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use oncelog_storage::clock::{Clock, SystemClock};
use oncelog_storage::rules::Retention;

use crate::fs;

/// What "acknowledged" means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Acknowledged after `fdatasync` of the frame (the default): survives power loss.
    Fsync,
    /// Acknowledged after the frame is handed to the OS: survives a process crash, not a power
    /// loss. An explicit, weaker choice for throughput.
    Buffered,
}

#[derive(Clone)]
pub struct LogOptions {
    /// Where the files are (the data directory, or a simulated disk).
    pub fs: Arc<dyn fs::Fs>,
    pub durability: Durability,
    /// A new segment starts when a frame would take the current one past this.
    pub segment_bytes: u64,
    /// A checkpoint is written after this many bytes of log (bounds replay at start).
    pub checkpoint_bytes: u64,
    /// After a trim, a checkpoint (which gives the trimmed space back) is written at most this
    /// long after the previous one.
    pub reclaim_interval: Duration,
    /// Store-wide bound on the hot tail (recent appends kept in memory for live readers).
    pub hot_bytes: usize,
    /// Where recovery takes "now" from (the start of every recovered stream's TTL window).
    pub clock: Arc<dyn Clock>,
    /// Fault injection for tests (feature `failpoints`; absent from other builds).
    #[cfg(any(test, feature = "failpoints"))]
    pub failpoints: Failpoints,
    /// How long idle producer state counts (`--producer-state-ttl`).
    pub retention: Retention,
    /// The bucket the log is shipped to (`--object-store`), if any.
    pub tier: Option<Tier>,
}

/// Where a node's log goes besides its disk ([`crate::tier`]).
#[derive(Clone, Debug)]
pub struct Tier {
    pub bucket: oncelog_bucket::Bucket,
    /// How often what was synced is shipped and published (`--ship-interval`).
    pub ship_interval: Duration,
    /// Who this node is, in the manifests it writes (`host:pid`).
    pub node: String,
    /// When a write is acknowledged (`--ack-mode`).
    pub ack: AckMode,
    /// How old an object no cut names must be before the sweep deletes it
    /// ([`crate::tier::SWEEP_AFTER`]; tests make it 0).
    pub sweep_after: Duration,
    /// The most bytes of segment files kept on the local disk (`--cache-max-bytes`; `None`:
    /// all). Older sealed segments the bucket holds are evicted past it and read from the
    /// bucket ([`crate::cold`]).
    pub cache_max_bytes: Option<u64>,
    /// How long objects a published cut dropped stay in the bucket before they are deleted
    /// ([`crate::tier::DELETE_GRACE`]; tests make it 0).
    pub delete_grace: Duration,
}

/// When a write is acknowledged with a bucket (`--ack-mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AckMode {
    /// After the local fsync; shipped within the ship interval.
    Local,
    /// Once a published cut holds it; readers see it from then on too. A write that waited
    /// `timeout` is answered 503 (outcome unknown) and becomes visible once the bucket holds it.
    Bucket { timeout: Duration },
}

/// Switches that make the log fail on purpose, so fail-stop behaviour can be tested through the
/// server on a real disk. Cheap to clone; all clones share the switches. Only with the feature
/// `failpoints` (which other crates' tests turn on): a production build has none, and its write
/// path checks none.
#[cfg(any(test, feature = "failpoints"))]
#[derive(Debug, Clone, Default)]
pub struct Failpoints {
    sync_error: Arc<std::sync::atomic::AtomicBool>,
}

#[cfg(any(test, feature = "failpoints"))]
impl Failpoints {
    /// While set, every group commit fails as if `fdatasync` had returned EIO.
    pub fn fail_sync(&self, on: bool) {
        self.sync_error.store(on, Ordering::SeqCst);
    }

    pub(crate) fn sync_should_fail(&self) -> bool {
        self.sync_error.load(Ordering::SeqCst)
    }
}

impl LogOptions {
    /// Defaults on the real file system under `data_dir`.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        Self::with_fs(Arc::new(fs::RealFs::new(data_dir.into())))
    }

    pub fn with_fs(fs: Arc<dyn fs::Fs>) -> Self {
        Self {
            fs,
            durability: Durability::Fsync,
            segment_bytes: 64 << 20,
            checkpoint_bytes: 256 << 20,
            reclaim_interval: Duration::from_secs(10),
            hot_bytes: 32 << 20,
            clock: Arc::new(SystemClock::default()),
            #[cfg(any(test, feature = "failpoints"))]
            failpoints: Failpoints::default(),
            retention: Retention::default(),
            tier: None,
        }
    }
}
