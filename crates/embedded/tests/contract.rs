//! The embedded engine runs the engine contract suite, on a temporary directory; `reopen` shuts
//! the engine down and recovers a new one from the same directory.

use oncelog_embedded::{Durability, EmbeddedEngine, EmbeddedOptions};
use oncelog_storage::contract::Harness;
use oncelog_storage::Engine;

struct Embedded {
    dir: tempfile::TempDir,
    /// `None` only inside `reopen`: the old engine must be gone before the directory reopens.
    engine: Option<EmbeddedEngine>,
}

fn open(dir: &std::path::Path) -> EmbeddedEngine {
    let mut opts = EmbeddedOptions::new(dir);
    // The contract is about behaviour; durability has its own tests (kill -9, failpoints).
    opts.durability = Durability::Buffered;
    EmbeddedEngine::open(opts).expect("open the embedded engine")
}

impl Harness for Embedded {
    type Engine = EmbeddedEngine;

    async fn open() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let engine = open(dir.path());
        Embedded { dir, engine: Some(engine) }
    }

    fn engine(&self) -> &EmbeddedEngine {
        self.engine.as_ref().expect("engine open")
    }

    async fn reopen(&mut self) {
        if let Some(old) = self.engine.take() {
            old.shutdown().await.expect("shutdown");
        }
        self.engine = Some(open(self.dir.path()));
    }
}

oncelog_storage::engine_contract_tests!(Embedded);
