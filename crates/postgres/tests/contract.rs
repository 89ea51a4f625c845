//! The engine contract suite on PostgreSQL: every case on a fresh schema of the test database.
//!
//! Needs `ONCELOG_TEST_POSTGRES_URL` (the README's test command starts a private cluster and
//! sets it; by hand: `scripts/postgres start DIR`). Without it every case fails and says so:
//! a test that cannot reach its database has not passed.

mod common;

oncelog_storage::engine_contract_tests!(common::PgHarness);
oncelog_subscriptions::subscription_contract_tests!(common::PgHarness);
