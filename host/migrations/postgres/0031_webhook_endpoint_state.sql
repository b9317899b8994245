-- A webhook endpoint whose receiver answered `410 Gone` is disabled: its
-- deliveries wait (nothing is claimed for it) until a moderator enables it
-- again. It has a row here while it is disabled, so the state survives
-- restarts and every process sees it; disabling is an insert the primary
-- key decides, enabling a delete. The state is kept apart from
-- webhook_cursors on purpose: every fan-out round updates a cursor, and the
-- claim of every delivery looks here, which must stay cheap on a table
-- that almost never changes.
CREATE TABLE webhook_endpoints_disabled (
    endpoint    TEXT PRIMARY KEY,
    disabled_at BIGINT NOT NULL,
    reason      TEXT NOT NULL
);

-- Each change of an endpoint's state, written in the change's own transaction.
CREATE TABLE webhook_endpoint_events (
    id         BIGSERIAL PRIMARY KEY,
    endpoint   TEXT NOT NULL,
    action     TEXT NOT NULL CHECK (action IN ('disabled', 'enabled')),
    actor      TEXT NOT NULL,
    reason     TEXT NOT NULL,
    created_at BIGINT NOT NULL
);
CREATE INDEX webhook_endpoint_events_endpoint ON webhook_endpoint_events (endpoint, id);
