//! The PostgreSQL sink (`oncelog sink postgres`): streams into tables of the sink's schema.
//!
//! | table | key | holds |
//! |---|---|---|
//! | `state` | (stream, type, key) | State Protocol streams: each live entity's current `value` (`jsonb`) and the `offset` of the change that set it |
//! | `messages` | (stream, offset) | other JSON streams: one row per message, its `value` (`jsonb`) |
//! | `chunks` | (stream, offset) | byte streams: one row per read, its `data` (`bytea`) and `next_offset` |
//! | `positions` | stream | the worker's: where each stream is applied up to (see [`crate::position`]) |
//!
//! Every batch is a handful of set-based statements (arrays bound as parameters, `unnest`ed),
//! not one statement per message.

mod net;

use oncelog_client::StreamOffset;
use tokio_postgres::Transaction;

use crate::batch::{Batch, Message, StreamKind, StreamRef};
use crate::error::ApplyError;
use crate::position::as_i64;
use crate::sink::Sink;
pub use net::Net;

/// Streams into the `state`, `messages` and `chunks` tables of `schema` (the worker's).
#[derive(Debug, Clone)]
pub struct PostgresSink {
    schema: String,
}

impl PostgresSink {
    /// For the worker whose target uses `schema` (checked there: a plain identifier).
    pub fn new(schema: impl Into<String>) -> PostgresSink {
        PostgresSink { schema: schema.into() }
    }
}

impl Sink for PostgresSink {
    async fn prepare(&self, tx: &Transaction<'_>, schema: &str) -> Result<(), ApplyError> {
        tx.batch_execute(&format!(
            "CREATE TABLE IF NOT EXISTS {schema}.state (
                stream text NOT NULL, type text NOT NULL, key text NOT NULL,
                value jsonb NOT NULL, \"offset\" bigint NOT NULL,
                PRIMARY KEY (stream, type, key));
             CREATE TABLE IF NOT EXISTS {schema}.messages (
                stream text NOT NULL, \"offset\" bigint NOT NULL, value jsonb NOT NULL,
                PRIMARY KEY (stream, \"offset\"));
             CREATE TABLE IF NOT EXISTS {schema}.chunks (
                stream text NOT NULL, \"offset\" bigint NOT NULL, next_offset bigint NOT NULL, data bytea NOT NULL,
                PRIMARY KEY (stream, \"offset\"));"
        ))
        .await?;
        Ok(())
    }

    async fn apply(&self, tx: &Transaction<'_>, stream: &StreamRef, batch: &Batch<'_>, _next: &StreamOffset) -> Result<u64, ApplyError> {
        let schema = &self.schema;
        match (stream.kind, batch) {
            (StreamKind::State, Batch::Messages(m)) => state(tx, schema, &stream.path, m).await,
            (_, Batch::Messages(m)) => messages(tx, schema, &stream.path, m).await,
            (_, Batch::Bytes { offset, data }) => {
                let (at, next) = (as_i64(offset.0), as_i64(offset.0 + data.len() as u64));
                tx.execute(&format!("INSERT INTO {schema}.chunks (stream, \"offset\", next_offset, data) VALUES ($1, $2, $3, $4)"), &[&stream.path, &at, &next, data])
                    .await?;
                Ok(1)
            }
        }
    }
}

/// A State Protocol batch: its net effect ([`Net`]) as at most three statements.
async fn state(tx: &Transaction<'_>, schema: &str, stream: &str, messages: &[Message<'_>]) -> Result<u64, ApplyError> {
    let net = Net::of(messages).map_err(|(offset, source)| ApplyError::NotState { stream: stream.to_owned(), offset, source })?;
    if net.reset {
        tx.execute(&format!("DELETE FROM {schema}.state WHERE stream = $1"), &[&stream]).await?;
    }
    let (mut del_t, mut del_k) = (Vec::new(), Vec::new());
    let (mut set_t, mut set_k, mut set_v, mut set_o) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for ((t, k), v) in &net.entities {
        match v {
            None => {
                del_t.push(t.as_str());
                del_k.push(k.as_str());
            }
            Some((value, offset)) => {
                set_t.push(t.as_str());
                set_k.push(k.as_str());
                set_v.push(*value);
                set_o.push(as_i64(*offset));
            }
        }
    }
    if !del_t.is_empty() {
        tx.execute(
            &format!("DELETE FROM {schema}.state s USING unnest($2::text[], $3::text[]) AS d(t, k) WHERE s.stream = $1 AND s.type = d.t AND s.key = d.k"),
            &[&stream, &del_t, &del_k],
        )
        .await?;
    }
    if !set_t.is_empty() {
        tx.execute(
            &format!(
                "INSERT INTO {schema}.state (stream, type, key, value, \"offset\")
                 SELECT $1, t, k, v::jsonb, o FROM unnest($2::text[], $3::text[], $4::text[], $5::int8[]) AS u(t, k, v, o)
                 ON CONFLICT (stream, type, key) DO UPDATE SET value = EXCLUDED.value, \"offset\" = EXCLUDED.\"offset\""
            ),
            &[&stream, &set_t, &set_k, &set_v, &set_o],
        )
        .await?;
    }
    Ok(net.changes)
}

/// A JSON batch: one row per message.
async fn messages(tx: &Transaction<'_>, schema: &str, stream: &str, messages: &[Message<'_>]) -> Result<u64, ApplyError> {
    let offsets: Vec<i64> = messages.iter().map(|m| as_i64(m.offset.0)).collect();
    let values: Vec<&str> = messages.iter().map(|m| m.json.get()).collect();
    let n = tx
        .execute(
            &format!("INSERT INTO {schema}.messages (stream, \"offset\", value) SELECT $1, o, v::jsonb FROM unnest($2::int8[], $3::text[]) AS u(o, v)"),
            &[&stream, &offsets, &values],
        )
        .await?;
    Ok(n)
}
