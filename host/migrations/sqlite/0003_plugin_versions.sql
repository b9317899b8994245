-- Every load, unload and failed load of a plugin file, per gavel process:
-- the history behind "which code decided this".
CREATE TABLE plugin_versions (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    node        TEXT NOT NULL,
    name        TEXT,
    version     TEXT,
    digest      TEXT,
    path        TEXT NOT NULL,
    mode        TEXT CHECK (mode IN ('enforce', 'shadow')),
    status      TEXT NOT NULL CHECK (status IN ('active', 'retired', 'failed', 'quarantined')),
    error       TEXT,
    loaded_at   BIGINT NOT NULL,
    unloaded_at BIGINT
);
CREATE INDEX plugin_versions_name ON plugin_versions (name, digest, loaded_at);
