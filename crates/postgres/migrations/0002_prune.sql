-- Version 2: writer state that can be pruned, and time marks in their tagged form. A producer's last activity and a key's time of
-- acceptance as columns (both are also inside the encoded state), so the sweep deletes the rows
-- the rules already treat as absent: producers idle past --producer-state-ttl, keys past
-- --idempotency-window. Rows written before this version count from the migration (they are
-- kept one TTL / window longer, never deleted early).
ALTER TABLE producers ADD COLUMN active_ms bigint;
UPDATE producers SET active_ms = (extract(epoch from clock_timestamp()) * 1000)::bigint;
ALTER TABLE producers ALTER COLUMN active_ms SET NOT NULL;

ALTER TABLE idem_keys ADD COLUMN at_ms bigint;
UPDATE idem_keys SET at_ms = (extract(epoch from clock_timestamp()) * 1000)::bigint;
ALTER TABLE idem_keys ALTER COLUMN at_ms SET NOT NULL;
-- One row per keyed append: the table is large where keys are used, so the sweep finds the old
-- ones by index. (Producer rows are few per stream and rewritten on every append: no index, so
-- their updates stay HOT; the sweep scans them, at most once a minute.)
CREATE INDEX idem_keys_at ON idem_keys (at_ms);

-- Time marks in their tagged stored form (`codec::marks`, tag 0x01 before the same 16-byte
-- marks as before).
UPDATE streams SET marks = '\x01'::bytea || marks WHERE marks IS NOT NULL;
