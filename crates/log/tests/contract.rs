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
