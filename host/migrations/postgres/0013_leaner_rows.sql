-- Decisions name the code that made them by a small integer: one
-- `plugin_refs` row per (name, version, digest) instead of a version string
-- and a 64-character digest repeated on every decision and in two of its
-- indexes. Keep in step with ../sqlite/0013_leaner_rows.sql.
CREATE TABLE plugin_refs (
    id      BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name    TEXT NOT NULL,
    version TEXT NOT NULL,
    digest  TEXT NOT NULL,
    UNIQUE (digest, name, version)
);
INSERT INTO plugin_refs (name, version, digest)
SELECT plugin, plugin_version, plugin_digest FROM decisions
GROUP BY plugin, plugin_version, plugin_digest ORDER BY MIN(id);

ALTER TABLE decisions ADD COLUMN plugin_ref BIGINT REFERENCES plugin_refs (id);
UPDATE decisions d SET plugin_ref = r.id FROM plugin_refs r
WHERE r.digest = d.plugin_digest AND r.name = d.plugin AND r.version = d.plugin_version;
ALTER TABLE decisions ALTER COLUMN plugin_ref SET NOT NULL;

DROP INDEX decisions_digest;
DROP INDEX decisions_actions;
-- An author's counted decisions read an item's few decisions through `decisions_item`.
DROP INDEX decisions_item_created;
ALTER TABLE decisions DROP COLUMN plugin_version, DROP COLUMN plugin_digest;
-- A version's latest decisions (its figures) from the index alone.
CREATE INDEX decisions_code ON decisions (plugin_ref, id, outcome, verdict, duration_us);
-- A version's actions (applied flag, hold and reject) by time, for reversal rates.
CREATE INDEX decisions_actions ON decisions (plugin_ref, created_at, reversed_at)
    WHERE applied AND verdict IN ('flag', 'hold', 'reject');
