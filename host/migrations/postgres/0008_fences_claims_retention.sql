-- Idempotency claims carry a token: the effect's transaction completes a
-- key only while its token still holds it (a retry that took the key over
-- after its lock expired owns it then).
ALTER TABLE idempotency_keys ADD COLUMN claim TEXT;

-- The content version an item's text is at (bumped by an edit): a
-- provider's answer stands for the content version it judged.
ALTER TABLE items ADD COLUMN content_version BIGINT NOT NULL DEFAULT 1;
ALTER TABLE provider_requests ADD COLUMN content_version BIGINT NOT NULL DEFAULT 1;
ALTER TABLE provider_requests ADD COLUMN answer_verdict TEXT CHECK (answer_verdict IN ('allow', 'flag', 'hold', 'reject'));
ALTER TABLE provider_requests ADD COLUMN answer_score DOUBLE PRECISION;
ALTER TABLE provider_requests ADD COLUMN answer_labels TEXT;
ALTER TABLE provider_requests ADD COLUMN answer_reason TEXT;
ALTER TABLE provider_requests ADD COLUMN answered_at BIGINT;

-- Who decided comes from the token (`actor_name`); a display note the
-- moderator typed is kept beside it, never as the identity.
ALTER TABLE transitions ADD COLUMN actor_note TEXT;

-- The stored snapshot a decision judged (content-addressed, see 0009).
ALTER TABLE decisions ADD COLUMN snapshot_digest TEXT;

-- Circuit-breaker history of each loaded version.
ALTER TABLE plugin_versions ADD COLUMN quarantines INTEGER NOT NULL DEFAULT 0;
ALTER TABLE plugin_versions ADD COLUMN quarantined_at BIGINT;
ALTER TABLE plugin_versions ADD COLUMN breaker_detail TEXT;
ALTER TABLE plugin_versions ADD COLUMN recovered_at BIGINT;

-- Authors are scoped per client, as items are.
DROP INDEX items_author;
DROP INDEX items_fingerprint;
CREATE INDEX items_client_author ON items (client, author, created_at);
CREATE INDEX items_client_fingerprint ON items (client, author, fingerprint, created_at);

-- Retention.
CREATE INDEX events_created ON events (created_at);
CREATE INDEX outbox_created ON outbox (created_at) WHERE fanned_out;
CREATE INDEX deliveries_delivered ON deliveries (created_at) WHERE status = 'delivered';
CREATE INDEX provider_callbacks_received ON provider_callbacks (received_at);

-- Authors, scoped per client as items are. A submission locks its author's
-- row (an upsert) before counting the author's duplicates, so concurrent
-- submissions by one author are decided one after the other. The row also
-- carries the author's account standing (see the standing migration).
CREATE TABLE authors (
    client           TEXT NOT NULL,
    author           TEXT NOT NULL,
    first_seen       BIGINT NOT NULL,
    last_seen        BIGINT NOT NULL,
    PRIMARY KEY (client, author)
);
INSERT INTO authors (client, author, first_seen, last_seen)
SELECT client, author, MIN(created_at), MAX(created_at) FROM items GROUP BY client, author;
