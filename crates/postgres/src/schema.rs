//! Versioned migrations, applied at open: safely when several nodes start at once.
//!
//! Invariants: migrations only roll forward; each is applied in its own transaction together
//! with its row in `oncelog_schema`, so a crash leaves a schema at a whole version; a session
//! holding the advisory lock (one key per schema) is the only one migrating, and the others
//! find the work done when they get it; a schema migrated by a newer binary is refused.

use tokio_postgres::Client;

use crate::error::OpenError;

/// `(version, SQL)`, oldest first.
const MIGRATIONS: &[(i32, &str)] = &[
    (1, include_str!("../migrations/0001_init.sql")),
    (2, include_str!("../migrations/0002_prune.sql")),
    (3, include_str!("../migrations/0003_detach.sql")),
];

/// The newest schema version this binary knows.
pub const SCHEMA_VERSION: i32 = 3;

/// Whether `name` is a schema name used unquoted in SQL (so it needs no quoting anywhere).
pub fn valid_schema(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some('a'..='z' | '_'))
        && chars.all(|c| matches!(c, 'a'..='z' | '0'..='9' | '_'))
        && name.len() <= 63
}

/// Applies every missing migration to `schema`.
pub(crate) async fn migrate(client: &mut Client, schema: &str) -> Result<(), OpenError> {
    let key = crate::shared::lock_key(schema, b"migrate", b"");
    client.execute("SELECT pg_advisory_lock($1)", &[&key]).await?;
    let result = migrate_locked(client, schema).await;
    // Released even after a failure; a lost connection releases it anyway.
    let unlocked = client.execute("SELECT pg_advisory_unlock($1)", &[&key]).await;
    result?;
    unlocked?;
    Ok(())
}

async fn migrate_locked(client: &mut Client, schema: &str) -> Result<(), OpenError> {
    let started = std::time::Instant::now();
    client
        .batch_execute(&format!(
            "CREATE SCHEMA IF NOT EXISTS {schema};
             CREATE TABLE IF NOT EXISTS {schema}.oncelog_schema (version int PRIMARY KEY, applied_ms bigint NOT NULL, by_binary text NOT NULL);"
        ))
        .await?;
    let found: i32 =
        client.query_one(&format!("SELECT coalesce(max(version), 0) FROM {schema}.oncelog_schema"), &[]).await?.get(0);
    if found > SCHEMA_VERSION {
        return Err(OpenError::NewerSchema { schema: schema.to_owned(), found, known: SCHEMA_VERSION });
    }
    let mut applied = 0;
    for (version, sql) in MIGRATIONS.iter().filter(|(v, _)| *v > found) {
        let step = std::time::Instant::now();
        let fail = |cause| OpenError::Migration { version: *version, cause };
        let tx = client.transaction().await.map_err(fail)?;
        tx.batch_execute(&format!("SET LOCAL search_path TO {schema};\n{sql}")).await.map_err(fail)?;
        let by = concat!("oncelog ", env!("CARGO_PKG_VERSION"));
        tx.execute(
            &format!("INSERT INTO {schema}.oncelog_schema (version, applied_ms, by_binary) VALUES ($1, (extract(epoch from now()) * 1000)::bigint, $2)"),
            &[version, &by],
        )
        .await
        .map_err(fail)?;
        tx.commit().await.map_err(fail)?;
        applied += 1;
        tracing::info!(schema, version, elapsed_ms = millis(step), "applied PostgreSQL migration");
    }
    // One line per start and node, migrated or not: which version the schema was found at and
    // is at now, what the operator checks before and after an upgrade.
    tracing::info!(
        schema,
        found_version = found,
        version = SCHEMA_VERSION,
        migrations_applied = applied,
        elapsed_ms = millis(started),
        "PostgreSQL schema ready"
    );
    Ok(())
}

/// Milliseconds since `started`, for log lines.
fn millis(started: std::time::Instant) -> u64 {
    u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX)
}
