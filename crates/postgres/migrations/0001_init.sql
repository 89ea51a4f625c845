-- Oncelog PostgreSQL engine, schema version 1. Applied once per schema by `schema::migrate`,
-- inside one transaction, under an advisory lock (several nodes may start at once).

-- Stream ids are never reused: a re-created path gets a new id, so tokens of a deleted
-- incarnation never match its successor.
CREATE SEQUENCE stream_ids;

-- One row per stream (including soft-deleted ones kept for their forks). Every write to a
-- stream locks this row (`FOR UPDATE`) and decides with the shared rules against what it reads
-- under that lock; `tail` is the offset after the last committed byte.
CREATE TABLE streams (
  id             bigint PRIMARY KEY,
  -- "C" collation: paths sort byte-wise (= by code point in UTF-8), as the embedded engines
  -- list them, and a prefix is one index range.
  path           text COLLATE "C" NOT NULL UNIQUE,
  created_ms     bigint NOT NULL,
  content_type   text NOT NULL,
  expiry_kind    smallint NOT NULL,          -- 0 never, 1 sliding TTL (seconds), 2 at (Unix ms)
  expiry_value   bigint NOT NULL,
  closed         boolean NOT NULL,
  stream_seq     text,
  soft_deleted   boolean NOT NULL,
  source_id      bigint,                     -- a fork's direct source
  fork_point     bigint,
  earliest       bigint NOT NULL,
  tail           bigint NOT NULL,
  ret_max_age_s  bigint,
  ret_max_bytes  bigint,
  compaction     boolean NOT NULL,
  -- Reads slide a TTL too: they are flushed here in batches (see `maint`), appends directly.
  last_access_ms bigint NOT NULL,
  -- Retention time marks (`retention::TimeMark`s), encoded by `row::encode_marks`; NULL when the
  -- stream has no maximum age.
  marks          bytea
) WITH (fillfactor = 70);
CREATE INDEX streams_source ON streams (source_id) WHERE source_id IS NOT NULL;
CREATE INDEX streams_expiring ON streams (id) WHERE expiry_kind <> 0;
CREATE INDEX streams_retained ON streams (id) WHERE ret_max_age_s IS NOT NULL OR ret_max_bytes IS NOT NULL;
CREATE INDEX streams_compacted ON streams (id) WHERE compaction;

-- One row per append: it occupies [end_off - octet_length(bytes), end_off) of its stream. No
-- foreign key: removing a stream is one row, its data goes through `gc`.
CREATE TABLE data (
  stream_id bigint NOT NULL,
  end_off   bigint NOT NULL,
  bytes     bytea NOT NULL,
  PRIMARY KEY (stream_id, end_off)
);
-- Stored uncompressed out of line: appends are mostly already dense, and a partial read
-- fetches only the chunks it needs.
ALTER TABLE data ALTER COLUMN bytes SET STORAGE EXTERNAL;

-- Idempotent producers per stream: `codec::producer` records (epoch, seq, receipt window).
CREATE TABLE producers (
  stream_id bigint NOT NULL REFERENCES streams (id) ON DELETE CASCADE,
  producer  text NOT NULL,
  state     bytea NOT NULL,
  PRIMARY KEY (stream_id, producer)
);

-- Idempotency-Key entries per stream (`codec::key_entry`), key = the KeyId's 16 bytes.
CREATE TABLE idem_keys (
  stream_id bigint NOT NULL REFERENCES streams (id) ON DELETE CASCADE,
  key       bytea NOT NULL,
  entry     bytea NOT NULL,
  PRIMARY KEY (stream_id, key)
);

-- `Engine::transact`'s metadata map (subscriptions).
CREATE TABLE meta (
  key   bytea PRIMARY KEY,
  value bytea NOT NULL
);

-- Data waiting for removal: all of a removed stream's (floor NULL), or a trimmed stream's appends
-- ending at or below `floor`. Taken by any node with SKIP LOCKED.
CREATE TABLE gc (
  stream_id bigint PRIMARY KEY,
  floor     bigint
);
