-- gavel schema, PostgreSQL dialect. Keep in step with ../sqlite/0001_init.sql.
-- Times are milliseconds since the Unix epoch.

CREATE TABLE items (
    id               TEXT PRIMARY KEY,
    client           TEXT NOT NULL,
    external_id      TEXT,
    kind             TEXT NOT NULL,
    author           TEXT NOT NULL,
    body             TEXT NOT NULL,
    context          TEXT NOT NULL,
    fingerprint      TEXT NOT NULL,
    status           TEXT NOT NULL CHECK (status IN ('pending_scan', 'visible', 'held_for_review', 'rejected', 'awaiting_provider', 'deleted')),
    version          BIGINT NOT NULL CHECK (version >= 1),
    decided_by       TEXT CHECK (decided_by IN ('system', 'rules', 'provider', 'moderator', 'author')),
    sync_verdict     TEXT CHECK (sync_verdict IN ('allow', 'flag', 'hold', 'reject')),
    needs_eval_since BIGINT,
    event_seq        BIGINT NOT NULL DEFAULT 0,
    evaluated_seq    BIGINT NOT NULL DEFAULT 0,
    created_at       BIGINT NOT NULL,
    updated_at       BIGINT NOT NULL,
    UNIQUE (client, external_id)
);
CREATE INDEX items_review ON items (status, updated_at, id);
CREATE INDEX items_author ON items (author, created_at);
CREATE INDEX items_fingerprint ON items (author, fingerprint, created_at);
CREATE INDEX items_needs_eval ON items (needs_eval_since) WHERE needs_eval_since IS NOT NULL;

CREATE TABLE events (
    id         BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    item_id    TEXT NOT NULL REFERENCES items (id),
    seq        BIGINT NOT NULL,
    kind       TEXT NOT NULL CHECK (kind IN ('upvote', 'downvote', 'flag', 'report', 'edit')),
    actor      TEXT NOT NULL,
    payload    TEXT,
    created_at BIGINT NOT NULL,
    UNIQUE (item_id, seq)
);

CREATE TABLE counters (
    item_id TEXT NOT NULL REFERENCES items (id),
    name    TEXT NOT NULL,
    value   BIGINT NOT NULL,
    PRIMARY KEY (item_id, name)
);

CREATE TABLE decisions (
    id             BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    item_id        TEXT NOT NULL REFERENCES items (id),
    item_version   BIGINT NOT NULL,
    plugin         TEXT NOT NULL,
    plugin_version TEXT NOT NULL,
    plugin_digest  TEXT NOT NULL,
    phase          TEXT NOT NULL CHECK (phase IN ('sync', 'async')),
    verdict        TEXT CHECK (verdict IN ('allow', 'flag', 'hold', 'reject')),
    score          DOUBLE PRECISION NOT NULL,
    labels         TEXT NOT NULL,
    reason         TEXT NOT NULL,
    mode           TEXT NOT NULL CHECK (mode IN ('enforce', 'shadow')),
    applied        BOOLEAN NOT NULL,
    duration_us    BIGINT NOT NULL,
    outcome        TEXT NOT NULL CHECK (outcome IN ('ok', 'error', 'trap', 'timeout', 'memory', 'invalid')),
    error          TEXT,
    created_at     BIGINT NOT NULL
);
CREATE INDEX decisions_item ON decisions (item_id, id);

CREATE TABLE transitions (
    id             BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    item_id        TEXT NOT NULL REFERENCES items (id),
    from_status    TEXT NOT NULL CHECK (from_status IN ('received', 'pending_scan', 'visible', 'held_for_review', 'rejected', 'awaiting_provider', 'deleted')),
    to_status      TEXT NOT NULL CHECK (to_status IN ('pending_scan', 'visible', 'held_for_review', 'rejected', 'awaiting_provider', 'deleted')),
    version        BIGINT NOT NULL,
    cause          TEXT NOT NULL,
    actor          TEXT NOT NULL CHECK (actor IN ('system', 'rules', 'provider', 'moderator', 'author')),
    actor_name     TEXT,
    reason         TEXT NOT NULL,
    correlation_id TEXT NOT NULL,
    created_at     BIGINT NOT NULL,
    -- One transition per item version: two commits can never both produce version N.
    UNIQUE (item_id, version)
);

CREATE TABLE idempotency_keys (
    scope           TEXT NOT NULL,
    key             TEXT NOT NULL,
    request_hash    TEXT NOT NULL,
    state           TEXT NOT NULL CHECK (state IN ('in_flight', 'done')),
    locked_until    BIGINT NOT NULL,
    response_status INTEGER,
    response_body   TEXT,
    created_at      BIGINT NOT NULL,
    expires_at      BIGINT NOT NULL,
    PRIMARY KEY (scope, key)
);
CREATE INDEX idempotency_expiry ON idempotency_keys (expires_at);
