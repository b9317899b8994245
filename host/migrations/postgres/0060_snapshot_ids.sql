-- Evaluation snapshots are numbered, and a decision names its snapshot by
-- that number as well as by digest (docs/ARCHITECTURE.md, "History").
--
-- A unique index on the sha256 puts every new snapshot at a random place
-- in a B-tree: each one dirtied an index page of its own, and this was the
-- largest cost of storing snapshots. Snapshots are never shared between
-- evaluations (each holds its evaluation's `now_ms`), so they need no
-- dedupe: a row is appended under the next `id`, which the evaluation's
-- decisions store in `snapshot_id`, and reads go by it. `snapshot_digest`
-- stays the stamp: a read keys what it found by the row's digest, so a
-- snapshot is only ever used for the decisions that name its digest.
-- Configs are few and shared by every decision of a deployed config: they
-- stay content-addressed, inserted once under a unique index of their own.
ALTER TABLE snapshots DROP CONSTRAINT snapshots_pkey;
ALTER TABLE snapshots ADD COLUMN id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY;
CREATE UNIQUE INDEX snapshots_config ON snapshots (digest) WHERE kind = 'config';

ALTER TABLE decisions ADD COLUMN snapshot_id BIGINT;
UPDATE decisions d SET snapshot_id = s.id FROM snapshots s
    WHERE s.digest = d.snapshot_digest AND s.kind = 'snapshot';
