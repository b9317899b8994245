-- Historical analysis (host/src/backtest/, store/history.rs): the input of
-- every evaluation, and backtest runs.

-- The documents evaluations judged, content-addressed: `digest` is the
-- sha256 (hex) of the canonical JSON, `body` that JSON compressed with zstd.
-- `kind = 'snapshot'` is the snapshot without its config (one per
-- evaluation, shared by every plugin of it: it holds the evaluation's
-- `now_ms`); `kind = 'config'` is one plugin's config. A decision names both
-- (`snapshot_digest`, `config_digest`). `used_at` is when the first decision
-- named the document: retention deletes snapshots older than
-- `retention.snapshots_ms` (configs are kept), and a backtest counts their
-- decisions `not_replayable` ("snapshot expired").
CREATE TABLE snapshots (
    digest       TEXT PRIMARY KEY,
    kind         TEXT NOT NULL CHECK (kind IN ('snapshot', 'config')),
    body         BLOB NOT NULL,
    bytes        BIGINT NOT NULL,
    stored_bytes BIGINT NOT NULL,
    used_at      BIGINT NOT NULL
);
CREATE INDEX snapshots_used ON snapshots (used_at);

ALTER TABLE decisions ADD COLUMN config_digest TEXT;
-- A backtest pages through the decisions of one plugin name in a time
-- window by (created_at, id).
CREATE INDEX decisions_plugin_time ON decisions (plugin, created_at, id);

-- Backtests started through the API (`POST /v1/backtests`). The process
-- running one beats `heartbeat_at`; a `running` row whose heartbeat stopped
-- belongs to a process that went away and is marked failed.
CREATE TABLE backtests (
    id           TEXT PRIMARY KEY,
    status       TEXT NOT NULL CHECK (status IN ('running', 'done', 'failed', 'cancelled')),
    request      TEXT NOT NULL,
    candidate    TEXT NOT NULL,
    created_by   TEXT NOT NULL,
    done         BIGINT NOT NULL DEFAULT 0,
    total        BIGINT NOT NULL DEFAULT 0,
    report       TEXT,
    error        TEXT,
    created_at   BIGINT NOT NULL,
    heartbeat_at BIGINT NOT NULL,
    finished_at  BIGINT
);
CREATE INDEX backtests_created ON backtests (created_at);
