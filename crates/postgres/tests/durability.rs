//! The start check of the database's durability: `synchronous_commit` below `on` is refused
//! with its reason unless the loss window is accepted. Needs `ONCELOG_TEST_POSTGRES_URL`.

mod common;

use oncelog_postgres::{PgEngine, PgOptions};
use oncelog_storage::Engine;

/// The test URL with `synchronous_commit` set for its sessions.
fn with_commit(level: &str) -> String {
    let url = common::url();
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}options=-c%20synchronous_commit%3D{level}")
}

async fn open(level: &str, accept: bool) -> Result<PgEngine, oncelog_postgres::OpenError> {
    let opts = PgOptions {
        schema: common::fresh_schema(),
        pool_size: 2,
        committers: 1,
        accept_commit_loss: accept,
        ..PgOptions::new(with_commit(level))
    };
    PgEngine::open(opts).await
}

#[tokio::test]
async fn commits_below_on_are_refused_unless_the_loss_is_accepted() {
    for level in ["off", "local", "remote_write"] {
        let err = open(level, false).await.err().unwrap_or_else(|| panic!("synchronous_commit={level} was accepted"));
        let text = err.to_string();
        assert!(
            text.contains(&format!("synchronous_commit={level}")) && text.contains("--pg-accept-commit-loss"),
            "{text}"
        );
        let engine = open(level, true).await.unwrap_or_else(|e| panic!("accepted {level}: {e}"));
        engine.shutdown().await.expect("shutdown");
    }
    for level in ["on", "remote_apply"] {
        let engine = open(level, false).await.unwrap_or_else(|e| panic!("synchronous_commit={level} refused: {e}"));
        engine.shutdown().await.expect("shutdown");
    }
}
