-- Hand-offs to external classifiers. The key is stable for one logical
-- operation (item, the version it started waiting at, provider): retries
-- reuse it. At most one active (pending or sent) request per item.
CREATE TABLE provider_requests (
    key             TEXT PRIMARY KEY,
    provider        TEXT NOT NULL,
    item_id         TEXT NOT NULL REFERENCES items (id),
    item_version    BIGINT NOT NULL,
    status          TEXT NOT NULL
                    CHECK (status IN ('pending', 'sent', 'answered', 'superseded', 'timed_out', 'cancelled')),
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at BIGINT NOT NULL,
    deadline_at     BIGINT NOT NULL,
    superseded_by   TEXT,
    last_error      TEXT,
    created_at      BIGINT NOT NULL,
    updated_at      BIGINT NOT NULL
);
CREATE INDEX provider_requests_item ON provider_requests (item_id, created_at);
CREATE UNIQUE INDEX provider_requests_active ON provider_requests (item_id) WHERE status IN ('pending', 'sent');
CREATE INDEX provider_requests_due ON provider_requests (next_attempt_at) WHERE status = 'pending';
CREATE INDEX provider_requests_deadline ON provider_requests (deadline_at) WHERE status IN ('pending', 'sent');

-- Every verified callback, stored with its raw payload before it is
-- applied; (provider, event_id) is unique, so a repeat is recognised.
CREATE TABLE provider_callbacks (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    provider     TEXT NOT NULL,
    event_id     TEXT NOT NULL,
    request_key  TEXT NOT NULL,
    item_id      TEXT NOT NULL,
    payload      TEXT NOT NULL,
    received_at  BIGINT NOT NULL,
    processed_at BIGINT,
    outcome      TEXT NOT NULL CHECK (outcome IN ('applied', 'duplicate', 'stale', 'unknown')),
    detail       TEXT NOT NULL DEFAULT '',
    UNIQUE (provider, event_id)
);
CREATE INDEX provider_callbacks_item ON provider_callbacks (item_id, id);

-- Decisions gain the `defer` verdict (a rule handed the item to a provider)
-- and the `provider` phase (a provider's callback decided). SQLite cannot
-- alter a CHECK constraint: the table is rebuilt (nothing references it).
CREATE TABLE decisions_v2 (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    item_id        TEXT NOT NULL REFERENCES items (id),
    item_version   BIGINT NOT NULL,
    plugin         TEXT NOT NULL,
    plugin_version TEXT NOT NULL,
    plugin_digest  TEXT NOT NULL,
    phase          TEXT NOT NULL CHECK (phase IN ('sync', 'async', 'provider')),
    verdict        TEXT CHECK (verdict IN ('allow', 'flag', 'defer', 'hold', 'reject')),
    score          REAL NOT NULL,
    labels         TEXT NOT NULL,
    reason         TEXT NOT NULL,
    mode           TEXT NOT NULL CHECK (mode IN ('enforce', 'shadow')),
    applied        BOOLEAN NOT NULL,
    duration_us    BIGINT NOT NULL,
    outcome        TEXT NOT NULL CHECK (outcome IN ('ok', 'error', 'trap', 'timeout', 'memory', 'invalid')),
    error          TEXT,
    created_at     BIGINT NOT NULL,
    reversed_at    BIGINT
);
INSERT INTO decisions_v2 (id, item_id, item_version, plugin, plugin_version, plugin_digest, phase, verdict, score,
    labels, reason, mode, applied, duration_us, outcome, error, created_at, reversed_at)
SELECT id, item_id, item_version, plugin, plugin_version, plugin_digest, phase, verdict, score,
    labels, reason, mode, applied, duration_us, outcome, error, created_at, reversed_at FROM decisions;
DROP TABLE decisions;
ALTER TABLE decisions_v2 RENAME TO decisions;
CREATE INDEX decisions_item ON decisions (item_id, id);
CREATE INDEX decisions_digest ON decisions (plugin_digest, id);
