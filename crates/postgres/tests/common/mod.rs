//! A PostgreSQL engine per test on its own schema of the test database.

#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, Ordering};

use oncelog_postgres::{PgEngine, PgOptions};
use oncelog_storage::contract::Harness;
use oncelog_storage::Engine;

/// The test database's URL, or a panic that says how to get one.
pub fn url() -> String {
    std::env::var("ONCELOG_TEST_POSTGRES_URL").unwrap_or_else(|_| {
        panic!(
            "PostgreSQL tests need ONCELOG_TEST_POSTGRES_URL: ./scripts/test starts a private cluster and sets it; \
             by hand: `url=$(scripts/postgres start /tmp/pg) && ONCELOG_TEST_POSTGRES_URL=$url cargo test -p oncelog-postgres`"
        )
    })
}

/// A plain session on the test database (as the engine connects: TLS settings included).
pub async fn session() -> tokio_postgres::Client {
    let (cfg, tls) = oncelog_postgres::driver_config(&url()).expect("test URL");
    let (client, conn) = cfg.connect(tls).await.expect("connect to the test database");
    tokio::spawn(conn);
    client
}

/// A schema name no other test of this run (or an earlier run on the same cluster) uses.
pub fn fresh_schema() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    format!("t_{}_{}_{}", std::process::id(), nanos, N.fetch_add(1, Ordering::Relaxed))
}

/// Options for tests: a small pool, two committers (the machine has two cores).
pub fn options(schema: &str) -> PgOptions {
    PgOptions { schema: schema.to_owned(), pool_size: 4, committers: 2, ..PgOptions::new(url()) }
}

pub struct PgHarness {
    engine: PgEngine,
    schema: String,
}

impl Harness for PgHarness {
    type Engine = PgEngine;

    async fn open() -> Self {
        let schema = fresh_schema();
        let engine = PgEngine::open(options(&schema)).await.expect("open the PostgreSQL engine");
        PgHarness { engine, schema }
    }

    fn engine(&self) -> &PgEngine {
        &self.engine
    }

    async fn reopen(&mut self) {
        self.engine.shutdown().await.expect("shutdown");
        self.engine = PgEngine::open(options(&self.schema)).await.expect("reopen the PostgreSQL engine");
    }
}
