//! The server's secrets (webhook signing keys, the token key) kept in the engine's metadata map
//! (`oncelog_server::signing`): two nodes on one PostgreSQL schema storing the same secret at
//! once both end up with the one stored first. Needs `ONCELOG_TEST_POSTGRES_URL` (./scripts/test
//! starts a private cluster and sets it).

use bytes::Bytes;
use oncelog_postgres::{PgEngine, PgOptions};
use oncelog_server::signing::{stored, stored_or_insert};

fn options(url: &str, schema: &str) -> PgOptions {
    PgOptions { schema: schema.to_owned(), pool_size: 2, committers: 1, ..PgOptions::new(url.to_owned()) }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_storing_one_secret_at_once_keep_the_same() {
    let url = std::env::var("ONCELOG_TEST_POSTGRES_URL").unwrap_or_else(|_| {
        panic!("this test needs ONCELOG_TEST_POSTGRES_URL: ./scripts/test starts a private cluster and sets it")
    });
    let schema = format!("t_secrets_{}", std::process::id());
    let a = PgEngine::open(options(&url, &schema)).await.expect("open node A");
    let b = PgEngine::open(options(&url, &schema)).await.expect("open node B");
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
