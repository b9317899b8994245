-- Evaluation snapshots are numbered, and a decision names its snapshot by
-- that number as well as by digest (docs/ARCHITECTURE.md, "History").
--
-- A unique index on the sha256 puts every new snapshot at a random place
-- in a B-tree: each one dirtied an index page of its own, written whole to
-- the WAL at commit, and this was the largest cost of storing snapshots.
-- Snapshots are never shared between evaluations (each holds its
-- evaluation's `now_ms`), so they need no dedupe: a row is appended under
-- the next `id`, which the evaluation's decisions store in `snapshot_id`,
-- and reads go by it. `snapshot_digest` stays the stamp: a read keys what
-- it found by the row's digest, so a snapshot is only ever used for the
-- decisions that name its digest. Configs are few and shared by every
-- decision of a deployed config: they stay content-addressed, inserted
-- once under a unique index of their own.
--
-- SQLite cannot drop a primary key, so the table is rebuilt.
CREATE TABLE snapshots_v2 (
    id           INTEGER PRIMARY KEY,
    digest       TEXT NOT NULL,
    kind         TEXT NOT NULL CHECK (kind IN ('snapshot', 'config')),
    body         BLOB NOT NULL,
    bytes        BIGINT NOT NULL,
    stored_bytes BIGINT NOT NULL,
    used_at      BIGINT NOT NULL
);
INSERT INTO snapshots_v2 (digest, kind, body, bytes, stored_bytes, used_at)
    SELECT digest, kind, body, bytes, stored_bytes, used_at FROM snapshots ORDER BY used_at, digest;
DROP TABLE snapshots;
ALTER TABLE snapshots_v2 RENAME TO snapshots;
CREATE INDEX snapshots_used ON snapshots (used_at);
CREATE UNIQUE INDEX snapshots_config ON snapshots (digest) WHERE kind = 'config';

ALTER TABLE decisions ADD COLUMN snapshot_id BIGINT;
-- The snapshots stored so far, found by digest once (a temporary index).
CREATE INDEX snapshots_digest_once ON snapshots (digest);
UPDATE decisions SET snapshot_id = (
    SELECT s.id FROM snapshots s WHERE s.digest = decisions.snapshot_digest AND s.kind = 'snapshot'
) WHERE snapshot_digest IS NOT NULL;
DROP INDEX snapshots_digest_once;
