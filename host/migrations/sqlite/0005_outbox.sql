-- Transactional outbox: one row per transition, written in the
-- transition's own transaction (event_id = item id ":" new version).
-- SQLite has one writer, so `seq` order is commit order; `txid` is always 0
-- here and exists so the feed's cursor has one shape on both stores.
CREATE TABLE outbox (
    seq            INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id       TEXT NOT NULL UNIQUE,
    item_id        TEXT NOT NULL REFERENCES items (id),
    item_version   BIGINT NOT NULL,
    client         TEXT NOT NULL,
    kind           TEXT NOT NULL,
    external_id    TEXT,
    from_status    TEXT NOT NULL,
    to_status      TEXT NOT NULL,
    cause          TEXT NOT NULL,
    actor          TEXT NOT NULL,
    reason         TEXT NOT NULL,
    correlation_id TEXT NOT NULL,
    created_at     BIGINT NOT NULL,
    fanned_out     BOOLEAN NOT NULL DEFAULT FALSE,
    txid           BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX outbox_unfanned ON outbox (seq) WHERE NOT fanned_out;
CREATE INDEX outbox_item ON outbox (item_id, item_version);
CREATE INDEX outbox_feed ON outbox (txid, seq);
CREATE INDEX outbox_client_feed ON outbox (client, txid, seq);

-- One row per (event, webhook endpoint): the delivery's state.
CREATE TABLE deliveries (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id        TEXT NOT NULL REFERENCES outbox (event_id),
    endpoint        TEXT NOT NULL,
    item_id         TEXT NOT NULL,
    item_version    BIGINT NOT NULL,
    status          TEXT NOT NULL CHECK (status IN ('pending', 'delivered', 'dead')),
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at BIGINT NOT NULL,
    last_error      TEXT,
    created_at      BIGINT NOT NULL,
    delivered_at    BIGINT,
    UNIQUE (event_id, endpoint)
);
CREATE INDEX deliveries_due ON deliveries (next_attempt_at) WHERE status = 'pending';
CREATE INDEX deliveries_order ON deliveries (endpoint, item_id, item_version) WHERE status = 'pending';
CREATE INDEX deliveries_dead ON deliveries (id) WHERE status = 'dead';
