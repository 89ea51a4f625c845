//! The target database: connections (taken exactly as the PostgreSQL engine takes its URL: libpq
//! URLs or `key=value` strings, `sslmode` / `sslrootcert` / `sslcert` / `sslkey`, several hosts,
//! `PGPASSWORD` and the `PGSSL*` variables), the sink's schema, and its one-time setup.

use std::time::Duration;

use deadpool_postgres::{Object, Pool};
use oncelog_postgres::OpenError;

use crate::error::SinkError;
use crate::position;
use crate::sink::Sink;

/// Connections to the target database, each with the sink's schema first on its search path.
#[derive(Clone)]
pub struct Target {
    pool: Pool,
    schema: String,
    /// The sessions' settings, for the check that a `prefer` connection did not fall back to
    /// plaintext.
    cfg: tokio_postgres::Config,
}

/// The engine's rule for schema names: no quoting needed anywhere, no injection.
pub use oncelog_postgres::schema::valid_schema;

impl Target {
    /// A pool of connections to `url` for the tables in `schema`. Connects lazily: a database
    /// that is away now is waited for by the worker, not refused here.
    ///
    /// `deadline` bounds every statement, and through the engine's session bounds also how long a
    /// paused or cut-off worker's transaction may sit idle holding rows (PostgreSQL ends it after
    /// 3/5 of it), so a live worker that waits on a zombie's lock waits a bounded time.
    pub fn new(url: &str, schema: &str, deadline: Duration) -> Result<Target, SinkError> {
        // The engine's session settings; `public` after the sink's schema, for a custom sink's
        // own tables.
        let (cfg, tls) = oncelog_postgres::session_config(url, schema, &["public"], deadline).map_err(|e| match e {
            OpenError::Schema(name) => SinkError::Schema(name),
            e => SinkError::TargetUrl(e),
        })?;
        let pool = oncelog_postgres::session_pool(cfg.clone(), tls, 2)?;
        Ok(Target { pool, schema: schema.to_owned(), cfg })
    }

    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// A connection (a new one when the last was broken, as after a database restart).
    pub async fn conn(&self) -> Result<Object, SinkError> {
        Ok(self.pool.get().await?)
    }

    /// Creates the schema, the positions table and `sink`'s tables if missing, in one
    /// transaction under an advisory lock (workers starting together would otherwise race on
    /// `CREATE … IF NOT EXISTS`).
    pub async fn prepare<S: Sink>(&self, sink: &S) -> Result<(), SinkError> {
        let mut conn = self.conn().await?;
        // As `oncelog serve` does: a plaintext fallback under sslmode=prefer is said out loud.
        oncelog_postgres::warn_if_plaintext(&conn, &self.cfg).await?;
        let tx = conn.transaction().await?;
        tx.execute("SELECT pg_advisory_xact_lock(hashtext('oncelog-sink:' || $1::text))", &[&self.schema]).await?;
        tx.batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS {}", self.schema)).await?;
        tx.batch_execute(&position::ddl(&self.schema)).await?;
        sink.prepare(&tx, &self.schema).await?;
        tx.commit().await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn urls_are_taken_as_the_engine_takes_them() {
        let d = Duration::from_secs(5);
        // Several hosts, in either form (nothing connects yet).
        assert!(Target::new(
            "postgres://app@db1:5432,db2:5433/shop?target_session_attrs=read-write&sslmode=disable",
            "s",
            d
        )
        .is_ok());
        assert!(Target::new("host=db1,db2 port=5432,5433 dbname=shop sslmode=disable", "s", d).is_ok());
        // The engine's refusals, word for word.
        let bad = Target::new("postgres://app@db/shop?sslmode=sometimes", "s", d).err().map(|e| e.to_string());
        assert_eq!(bad.as_deref(), Some("target database: invalid PostgreSQL URL: sslmode=\"sometimes\" is not one of disable, prefer, require, verify-ca, verify-full"));
        assert!(matches!(Target::new("postgres://app@db/shop?sslcert=/c.pem", "s", d), Err(SinkError::TargetUrl(_))));
        assert!(matches!(Target::new("postgres://app@db/shop", "Bad-Name", d), Err(SinkError::Schema(_))));
    }

    #[test]
    fn schema_names_need_no_quoting() {
        for ok in ["sink", "_s1", "a_b_9"] {
            assert!(valid_schema(ok), "{ok}");
        }
        for bad in ["", "9a", "Sink", "a-b", "a;drop", "a.b", &"x".repeat(64)] {
            assert!(!valid_schema(bad), "{bad}");
        }
    }
}
