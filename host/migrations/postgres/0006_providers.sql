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
    id           BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
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
-- and the `provider` phase (a provider's callback decided).
ALTER TABLE decisions
    DROP CONSTRAINT decisions_verdict_check,
    ADD CONSTRAINT decisions_verdict_check CHECK (verdict IN ('allow', 'flag', 'defer', 'hold', 'reject')),
    DROP CONSTRAINT decisions_phase_check,
    ADD CONSTRAINT decisions_phase_check CHECK (phase IN ('sync', 'async', 'provider'));
