-- Lists moderators edit at runtime (host/src/lists/, host/src/store/lists.rs).
--
-- `lists` holds each list's current version; an edit is one conditional
-- update of it (`version = If-Match`) and the insert of the new version's
-- row, which is the edit's audit row (who, why, when), in one transaction.
-- Versions are immutable: each holds its canonical entries in full (JSON,
-- zstd-compressed) and their sha256 digest.
CREATE TABLE lists (
    name       TEXT PRIMARY KEY,
    kind       TEXT NOT NULL CHECK (kind IN ('terms', 'patterns', 'domains', 'strings', 'cidrs')),
    version    BIGINT NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);

CREATE TABLE list_versions (
    list        TEXT NOT NULL REFERENCES lists (name),
    version     BIGINT NOT NULL,
    digest      TEXT NOT NULL,
    entry_count BIGINT NOT NULL,
    entries     BLOB NOT NULL,
    actor_name  TEXT NOT NULL,
    reason      TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    PRIMARY KEY (list, version)
);
