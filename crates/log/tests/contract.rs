//! The log engine runs the engine contract suite, on a temporary directory; `reopen` shuts the
//! engine down and recovers a new one from the same directory.

use oncelog_log::{Durability, LogEngine, LogOptions};
use oncelog_storage::contract::Harness;
use oncelog_storage::Engine;

struct Log {
    dir: tempfile::TempDir,
    /// `None` only inside `reopen`: the old engine must be gone before the directory reopens.
    engine: Option<LogEngine>,
}

fn open(dir: &std::path::Path) -> LogEngine {
    let mut opts = LogOptions::new(dir);
    // The contract is about behaviour; durability has its own tests (power loss, kill -9).
    opts.durability = Durability::Buffered;
    LogEngine::open(opts).expect("open the log engine")
}

impl Harness for Log {
    type Engine = LogEngine;

    async fn open() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let engine = open(dir.path());
        Log { dir, engine: Some(engine) }
    }

    fn engine(&self) -> &LogEngine {
        self.engine.as_ref().expect("engine open")
    }

    async fn reopen(&mut self) {
        if let Some(old) = self.engine.take() {
            old.shutdown().await.expect("shutdown");
        }
        self.engine = Some(open(self.dir.path()));
    }
}

oncelog_storage::engine_contract_tests!(Log);
oncelog_subscriptions::subscription_contract_tests!(Log);

/// One server per data directory: a second engine on the same directory is refused while the
/// first is open, and opens once it is gone.
#[test]
fn a_second_engine_on_the_same_directory_is_refused() {
    oncelog_storage::contract::run(|| async {
        let dir = tempfile::tempdir().expect("tempdir");
        let first = open(dir.path());
        let err = LogEngine::open(LogOptions::new(dir.path())).err().expect("refused").to_string();
        assert!(err.contains("another oncelog server"), "{err}");
        first.shutdown().await.expect("shutdown");
        drop(first);
        let again = LogEngine::open(LogOptions::new(dir.path()));
        assert!(again.is_ok(), "{:?}", again.err());
    });
}

/// A data directory that does not exist yet is created (the lock file needs it first).
#[test]
fn a_missing_data_directory_is_created() {
    oncelog_storage::contract::run(|| async {
        let dir = tempfile::tempdir().expect("tempdir");
        let engine = open(&dir.path().join("not/yet/there"));
        engine.shutdown().await.expect("shutdown");
    });
}

/// Producer state idle past the TTL is not only ignored but dropped: after the checkpoint a
/// shutdown writes, the engine counts no producers, and the next start recovers none.
#[test]
fn idle_producers_are_dropped_at_the_next_checkpoint() {
    use oncelog_storage::contract::{append, create, create_req, produce};
    use oncelog_storage::rules::Retention;
    use oncelog_storage::AppendRequest;
    oncelog_storage::contract::run(|| async {
        let dir = tempfile::tempdir().expect("tempdir");
        let ttl = Retention::DEFAULT_PRODUCER_TTL_MS;
        let e = open(dir.path());
        create(&e, create_req("s", "text/plain")).await;
        for p in ["a", "b", "c"] {
            append(&e, AppendRequest { now_ms: 0, ..produce("s", "x", p, 0, 0) }).await;
        }
        // "c" stays active; the others go idle for longer than the TTL.
        append(&e, AppendRequest { now_ms: ttl / 2, ..produce("s", "y", "c", 0, 1) }).await;
        append(&e, AppendRequest { now_ms: ttl + 1, ..oncelog_storage::contract::append_req("s", "z") }).await;
        assert_eq!(e.stats().producers, 3);
        e.shutdown().await.expect("shutdown");
        assert_eq!(e.stats().producers, 1, "dropped before the shutdown checkpoint");
        drop(e);
        let again = open(dir.path());
        assert_eq!(again.stats().producers, 1, "and not recovered");
    });
}
