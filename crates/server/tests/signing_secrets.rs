//! The server's secrets (webhook signing keys, the token key) kept in the engine's metadata map
//! (`oncelog_server::signing`): two nodes on one PostgreSQL schema storing the same secret at
//! once both end up with the one stored first. Needs `ONCELOG_TEST_POSTGRES_URL` (./scripts/test
//! starts a private cluster and sets it).

mod common;

use bytes::Bytes;
use oncelog_postgres::PgEngine;
use oncelog_server::signing::{stored, stored_or_insert};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_storing_one_secret_at_once_keep_the_same() {
    let schema = format!("t_secrets_{}", std::process::id());
    let a = PgEngine::open(common::postgres_options(&schema)).await.expect("open node A");
    let b = PgEngine::open(common::postgres_options(&schema)).await.expect("open node B");
    // Several rounds: the two must overlap for the race to be there at all.
    for round in 0..20 {
        let name = format!("token-{round}");
        let (x, y) = tokio::join!(
            stored_or_insert(&a, &name, Bytes::from_static(b"from A"), 0),
            stored_or_insert(&b, &name, Bytes::from_static(b"from B"), 0)
        );
        let (x, y) = (x.expect("on A"), y.expect("on B"));
        assert_eq!(x, y, "round {round}: both nodes answer the secret stored first");
        assert_eq!(stored(&a).await.expect("stored on A").get(&name), Some(&x));
        assert_eq!(stored(&b).await.expect("stored on B").get(&name), Some(&x));
    }
}
