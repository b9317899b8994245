-- A webhook endpoint whose receiver answered `410 Gone` is disabled: its
-- deliveries wait (nothing is claimed for it) until a moderator enables it
-- again. The state lives with the endpoint's cursor, so it survives
-- restarts and every process sees it; each change has its row in
-- webhook_endpoint_events, written in the change's own transaction.
ALTER TABLE webhook_cursors ADD COLUMN disabled_at BIGINT;
ALTER TABLE webhook_cursors ADD COLUMN disabled_reason TEXT;

CREATE TABLE webhook_endpoint_events (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    endpoint   TEXT NOT NULL,
    action     TEXT NOT NULL CHECK (action IN ('disabled', 'enabled')),
    actor      TEXT NOT NULL,
    reason     TEXT NOT NULL,
    created_at BIGINT NOT NULL
);
CREATE INDEX webhook_endpoint_events_endpoint ON webhook_endpoint_events (endpoint, id);
