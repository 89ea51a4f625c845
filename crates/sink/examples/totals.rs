//! The custom sink of docs/SINKS.md, kept here so that it compiles with the crate (cargo builds
//! examples with the tests): running totals, an effect that is not idempotent, applied exactly
//! once. Run it against a server and a database of your own:
//! `cargo run -p oncelog-sink --example totals`.

use std::time::Duration;

use oncelog_client::{Client, StreamOffset};
use oncelog_sink::{ApplyError, Batch, Sink, SinkOptions, StreamRef, Target, Worker};
use tokio_postgres::Transaction;

/// Adds each message's `n` to its stream's total: not idempotent, applied exactly once.
struct Totals;

impl Sink for Totals {
    async fn prepare(&self, tx: &Transaction<'_>, schema: &str) -> Result<(), ApplyError> {
        tx.batch_execute(&format!(
            "CREATE TABLE IF NOT EXISTS {schema}.totals (stream text PRIMARY KEY, sum bigint NOT NULL)"
        ))
        .await?;
        Ok(())
    }

    async fn apply(
        &self,
        tx: &Transaction<'_>,
        stream: &StreamRef,
        batch: &Batch<'_>,
        _next: &StreamOffset,
    ) -> Result<u64, ApplyError> {
        let Batch::Messages(messages) = batch else { return Ok(0) };
        let mut n = 0i64;
        for m in messages {
            let v: serde_json::Value = serde_json::from_str(m.json.get()).map_err(|e| ApplyError::Other(e.into()))?;
            n += v["n"].as_i64().unwrap_or(0);
        }
        tx.execute("INSERT INTO totals VALUES ($1, 0) ON CONFLICT DO NOTHING", &[&stream.path]).await?;
        tx.execute("UPDATE totals SET sum = sum + $2 WHERE stream = $1", &[&stream.path, &n]).await?;
        Ok(messages.len() as u64)
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let client = Client::new("http://127.0.0.1:4437/v1/stream")?;
    let target = Target::new("postgres://app@127.0.0.1/shop", "totals_sink", Duration::from_secs(30))?;
    let opts = SinkOptions::new("totals", "orders/*", "sinks/totals/wake", "totals-1");
    Worker::new(client, target, Totals, opts).run().await?;
    Ok(())
}
