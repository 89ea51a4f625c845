-- Version 3: a stream can be detached from its path (a purging delete, `DELETE …?purge=true`, of
-- a source that forks still read; `rules::Removal::Detach`). Its row stays, by id, for its forks
-- (they name their source by id and read its data rows as before), with `path` NULL: a value no
-- request can name, so the path is free at once for a new, unrelated stream (UNIQUE allows any
-- number of NULLs). Such a row is soft-deleted, and goes with its last fork as any soft-deleted
-- source does. Dropping NOT NULL changes only the catalog.
ALTER TABLE streams ALTER COLUMN path DROP NOT NULL;
-- Every existing row has a path (the column was NOT NULL): nothing to validate, so no scan.
ALTER TABLE streams ADD CONSTRAINT streams_detached_are_deleted CHECK (path IS NOT NULL OR soft_deleted) NOT VALID;
