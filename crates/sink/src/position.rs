//! Positions: where each stream has been applied up to, in the target database, one row per
//! stream — and the guard that makes a batch apply once.
//!
//! [`advance`] is the first statement of every batch transaction: a compare-and-set of the
//! stream's position from the one the worker read before reading the batch to the one after it.
//! If another worker moved it meanwhile (a claim that passed on while this worker was paused or
//! cut off), it changes no row and the worker rolls back: the batch it read is someone else's
//! now. If another worker's transaction is moving it right now, the row lock makes this one wait
//! for its outcome first. Either way two transactions can never both apply the batch that starts
//! at one position.
//!
//! A stream **set aside** (`--on-refused skip-stream`: the target refused one of its messages)
//! has `set_aside_reason` set (naming the refused message's offset), and its position is where
//! the read holding that message starts. No batch of it commits while the reason is set
//! ([`advance`] refuses), and the worker does not read it; clearing the reason (`UPDATE … SET
//! set_aside_reason = NULL`) resumes it.

use std::collections::BTreeMap;

use oncelog_client::StreamOffset;
use oncelog_protocol::Offset;
use tokio_postgres::{GenericClient, Transaction};

use crate::error::SinkError;

/// The positions table in `schema`.
pub fn ddl(schema: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {schema}.positions (
            stream text PRIMARY KEY,
            next_offset text NOT NULL,      -- where the next read starts (the server's token)
            position bigint NOT NULL,       -- the same as a byte position: the compare-and-set key
            rows_applied bigint NOT NULL DEFAULT 0,
            lost_bytes bigint NOT NULL DEFAULT 0,  -- skipped over trimmed history (--on-trimmed skip)
            updated_at timestamptz NOT NULL DEFAULT now()
        );
        -- Added later, so that a positions table made by an older sink gets them too: why the
        -- stream is set aside (NULL: it is not) and since when. Only when missing: ALTER TABLE
        -- waits for every transaction on the table, a frozen worker's included, even when the
        -- columns exist.
        DO $$ BEGIN
            IF (SELECT count(*) FROM pg_attribute WHERE attrelid = '{schema}.positions'::regclass
                  AND attname IN ('set_aside_reason', 'set_aside_at') AND NOT attisdropped) < 2 THEN
                ALTER TABLE {schema}.positions ADD COLUMN IF NOT EXISTS set_aside_reason text,
                    ADD COLUMN IF NOT EXISTS set_aside_at timestamptz;
            END IF;
        END $$"
    )
}

/// A stream's row in the positions table, as the worker reads it before reading the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    /// Where it stands: a new stream stands at 0.
    pub position: Offset,
    /// Why it is set aside (the target refused a message of the read from `position`), if it is.
    pub set_aside: Option<String>,
}

/// Where `stream` stands in the target, and whether it is set aside.
pub async fn stored(client: &impl GenericClient, schema: &str, stream: &str) -> Result<Stored, SinkError> {
    let row = client
        .query_opt(&format!("SELECT position, set_aside_reason FROM {schema}.positions WHERE stream = $1"), &[&stream])
        .await?;
    let (at, set_aside): (i64, Option<String>) = row.map_or((0, None), |r| (r.get(0), r.get(1)));
    Ok(Stored { position: Offset(u64::try_from(at).unwrap_or(0)), set_aside })
}

/// The rows of those of `streams` that have one (a stream without stands at 0).
pub async fn stored_all(
    client: &impl GenericClient,
    schema: &str,
    streams: &[&str],
) -> Result<BTreeMap<String, Stored>, SinkError> {
    let rows = client
        .query(
            &format!("SELECT stream, position, set_aside_reason FROM {schema}.positions WHERE stream = ANY($1)"),
            &[&streams],
        )
        .await?;
    Ok(rows
        .into_iter()
        .map(|r| {
            let at: i64 = r.get(1);
            (r.get(0), Stored { position: Offset(u64::try_from(at).unwrap_or(0)), set_aside: r.get(2) })
        })
        .collect())
}

/// Records `stream` as applied up to `at` (token `token`) without applying anything, if it has
/// no position yet (`--from-now`); answers whether it did. A row that exists is left alone: its
/// position is what was applied.
pub async fn start_at(
    client: &impl GenericClient,
    schema: &str,
    stream: &str,
    token: &StreamOffset,
    at: Offset,
) -> Result<bool, SinkError> {
    let n = client
        .execute(
            &format!("INSERT INTO {schema}.positions (stream, next_offset, position) VALUES ($1, $2, $3) ON CONFLICT (stream) DO NOTHING"),
            &[&stream, &token.as_str(), &as_i64(at.0)],
        )
        .await?;
    Ok(n == 1)
}

/// Where `stream` stands in the target: a new stream stands at 0.
pub async fn read(client: &impl GenericClient, schema: &str, stream: &str) -> Result<Offset, SinkError> {
    Ok(stored(client, schema, stream).await?.position)
}

/// Moves `stream` from `from` (as read before the batch) to `to`, adding `lost` skipped bytes;
/// `Err(PositionMoved)` when the stored position is no longer `from`, or the stream was set aside
/// meanwhile. Must run first in the batch's transaction (see the module docs).
pub async fn advance(
    tx: &Transaction<'_>,
    schema: &str,
    stream: &str,
    from: Offset,
    to: &StreamOffset,
    to_pos: Offset,
    lost: u64,
) -> Result<(), SinkError> {
    let (from_i, to_i, lost_i) = (as_i64(from.0), as_i64(to_pos.0), as_i64(lost));
    let moved = if from == Offset::ZERO {
        // No row yet, or a row still at 0: the insert is the compare-and-set of "absent", the
        // update the one of 0 (a row at 0 exists after a skip or a failed first batch).
        tx.execute(
            &format!(
                "INSERT INTO {schema}.positions AS p (stream, next_offset, position, lost_bytes) VALUES ($1, $2, $3, $4)
                 ON CONFLICT (stream) DO UPDATE SET next_offset = EXCLUDED.next_offset, position = EXCLUDED.position,
                   lost_bytes = p.lost_bytes + EXCLUDED.lost_bytes, updated_at = now()
                 WHERE p.position = 0 AND p.set_aside_reason IS NULL"
            ),
            &[&stream, &to.as_str(), &to_i, &lost_i],
        )
        .await?
    } else {
        tx.execute(
            &format!(
                "UPDATE {schema}.positions SET next_offset = $3, position = $4, lost_bytes = lost_bytes + $5, updated_at = now()
                 WHERE stream = $1 AND position = $2 AND set_aside_reason IS NULL"
            ),
            &[&stream, &from_i, &to.as_str(), &to_i, &lost_i],
        )
        .await?
    };
    if moved == 1 {
        Ok(())
    } else {
        Err(SinkError::PositionMoved { stream: stream.to_owned() })
    }
}

/// Adds `rows` to the stream's applied count (same transaction, after the sink's effect).
pub async fn count(tx: &Transaction<'_>, schema: &str, stream: &str, rows: u64) -> Result<(), SinkError> {
    tx.execute(
        &format!("UPDATE {schema}.positions SET rows_applied = rows_applied + $2 WHERE stream = $1"),
        &[&stream, &as_i64(rows)],
    )
    .await?;
    Ok(())
}

/// Sets `stream` aside with `reason` (same transaction, after [`advance`] checked its position).
pub async fn set_aside(tx: &Transaction<'_>, schema: &str, stream: &str, reason: &str) -> Result<(), SinkError> {
    tx.execute(
        &format!("UPDATE {schema}.positions SET set_aside_reason = $2, set_aside_at = now() WHERE stream = $1"),
        &[&stream, &reason],
    )
    .await?;
    Ok(())
}

/// An offset, position or count as a `bigint`: offsets are below 10^16 (the token's width).
pub(crate) fn as_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}
