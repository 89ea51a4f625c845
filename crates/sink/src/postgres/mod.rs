//! The PostgreSQL sink (`oncelog sink postgres`): streams into tables of the sink's schema.
//!
//! | table | key | holds |
//! |---|---|---|
//! | `state` | (stream, type, key) | State Protocol streams: each live entity's current `value` (`jsonb`), the `stream_offset` of the change that set it, and `updated_at`, when that change was applied |
//! | `messages` | (stream, stream_offset) | other JSON streams: one row per message, its `value` (`jsonb`) |
//! | `chunks` | (stream, stream_offset) | byte streams: one row per read, its `data` (`bytea`) and `next_offset` |
//! | `positions` | stream | the worker's: where each stream is applied up to (see [`crate::position`]) |
//!
//! Every batch is a handful of set-based statements (arrays bound as parameters, `unnest`ed),
//! not one statement per message.
//!
//! The column of an offset is `stream_offset`, not `offset`, which is a reserved word in SQL
//! and had to be quoted in every query. Tables made by an older sink are migrated by
//! [`PostgresSink::prepare`]: the column renamed, `updated_at` added.

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
                value jsonb NOT NULL, stream_offset bigint NOT NULL,
                updated_at timestamptz NOT NULL DEFAULT now(),
                PRIMARY KEY (stream, type, key));
             CREATE TABLE IF NOT EXISTS {schema}.messages (
                stream text NOT NULL, stream_offset bigint NOT NULL, value jsonb NOT NULL,
                PRIMARY KEY (stream, stream_offset));
             CREATE TABLE IF NOT EXISTS {schema}.chunks (
                stream text NOT NULL, stream_offset bigint NOT NULL, next_offset bigint NOT NULL, data bytea NOT NULL,
                PRIMARY KEY (stream, stream_offset));
             {}",
            migration(schema)
        ))
        .await?;
        Ok(())
    }

    async fn apply(
        &self,
        tx: &Transaction<'_>,
        stream: &StreamRef,
        batch: &Batch<'_>,
        next: &StreamOffset,
    ) -> Result<u64, ApplyError> {
        let schema = &self.schema;
        match (stream.kind, batch) {
            (StreamKind::State, Batch::Messages(m)) => state(tx, schema, &stream.path, m).await,
            (_, Batch::Messages(m)) => messages(tx, schema, &stream.path, m).await,
            (_, Batch::Bytes { offset, data }) => {
                // Where the read ends: for a byte stream its start plus its length, for a JSON
                // stream read as chunks only the offset token says (the worker checked it).
                let next = next.to_oncelog().map_or(offset.0 + data.len() as u64, |o| o.0);
                let (at, next) = (as_i64(offset.0), as_i64(next));
                tx.execute(&format!("INSERT INTO {schema}.chunks (stream, stream_offset, next_offset, data) VALUES ($1, $2, $3, $4)"), &[&stream.path, &at, &next, data])
                    .await?;
                Ok(1)
            }
        }
    }
}

/// Brings tables made by an older sink up to date: `offset` renamed to `stream_offset`, `state`
/// given `updated_at` (its existing rows get the migration's time). Runs at every start, so it
/// changes nothing once done, and checks `pg_attribute` first: `ALTER TABLE` waits for every
/// transaction on the table, a frozen worker's included, even when it would change nothing.
/// (A worker of the older sink still running fails on the renamed column and retries; stop old
/// workers before starting new ones.)
fn migration(schema: &str) -> String {
    format!(
        "DO $$ DECLARE t text; BEGIN
            FOREACH t IN ARRAY ARRAY['state', 'messages', 'chunks'] LOOP
                IF EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = format('%I.%I', '{schema}', t)::regclass
                             AND attname = 'offset' AND NOT attisdropped) THEN
                    EXECUTE format('ALTER TABLE %I.%I RENAME COLUMN \"offset\" TO stream_offset', '{schema}', t);
                END IF;
            END LOOP;
            IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = '{schema}.state'::regclass
                             AND attname = 'updated_at' AND NOT attisdropped) THEN
                ALTER TABLE {schema}.state ADD COLUMN updated_at timestamptz NOT NULL DEFAULT now();
            END IF;
        END $$"
    )
}

/// A State Protocol batch: its net effect ([`Net`]) as at most three statements.
async fn state(tx: &Transaction<'_>, schema: &str, stream: &str, messages: &[Message<'_>]) -> Result<u64, ApplyError> {
    let net = Net::of(messages).map_err(|(offset, source)| ApplyError::NotState {
        stream: stream.to_owned(),
        offset,
        source,
    })?;
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
                "INSERT INTO {schema}.state (stream, type, key, value, stream_offset)
                 SELECT $1, t, k, v::jsonb, o FROM unnest($2::text[], $3::text[], $4::text[], $5::int8[]) AS u(t, k, v, o)
                 ON CONFLICT (stream, type, key) DO UPDATE SET value = EXCLUDED.value, stream_offset = EXCLUDED.stream_offset, updated_at = now()"
            ),
            &[&stream, &set_t, &set_k, &set_v, &set_o],
        )
        .await?;
    }
    Ok(net.changes)
}

/// A JSON batch: one row per message.
async fn messages(
    tx: &Transaction<'_>,
    schema: &str,
    stream: &str,
    messages: &[Message<'_>],
) -> Result<u64, ApplyError> {
    let offsets: Vec<i64> = messages.iter().map(|m| as_i64(m.offset.0)).collect();
    let values: Vec<&str> = messages.iter().map(|m| m.json.get()).collect();
    let n = tx
        .execute(
            &format!("INSERT INTO {schema}.messages (stream, stream_offset, value) SELECT $1, o, v::jsonb FROM unnest($2::int8[], $3::text[]) AS u(o, v)"),
            &[&stream, &offsets, &values],
        )
        .await?;
    Ok(n)
}
