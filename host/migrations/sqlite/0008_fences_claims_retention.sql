-- Idempotency claims carry a token: the effect's transaction completes a
-- key only while its token still holds it (a retry that took the key over
-- after its lock expired owns it then).
ALTER TABLE idempotency_keys ADD COLUMN claim TEXT;

-- The content version an item's text is at (bumped by an edit): a
-- provider's answer stands for the content version it judged.
ALTER TABLE items ADD COLUMN content_version BIGINT NOT NULL DEFAULT 1;

-- Evaluations committed per item: the fence of evaluation commits (one
-- commit per snapshot, whichever worker judged it).
ALTER TABLE items ADD COLUMN eval_round BIGINT NOT NULL DEFAULT 0;
ALTER TABLE provider_requests ADD COLUMN content_version BIGINT NOT NULL DEFAULT 1;
ALTER TABLE provider_requests ADD COLUMN answer_verdict TEXT CHECK (answer_verdict IN ('allow', 'flag', 'hold', 'reject'));
ALTER TABLE provider_requests ADD COLUMN answer_score REAL;
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
CREATE INDEX outbox_created ON outbox (created_at);
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

-- Webhook fan-out by cursor: each endpoint reads the outbox feed from its
-- own position, so no row is updated per event, an endpoint added later
-- starts where it is told to, and a process that does not know an
-- endpoint cannot mark events fanned out for it. Endpoints that already
-- received deliveries resume behind the last event fanned out.
CREATE TABLE webhook_cursors (
    endpoint   TEXT PRIMARY KEY,
    txid       BIGINT NOT NULL,
    seq        BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);
INSERT INTO webhook_cursors (endpoint, txid, seq, updated_at)
SELECT d.endpoint,
       (SELECT o.txid FROM outbox o WHERE o.fanned_out ORDER BY o.txid DESC, o.seq DESC LIMIT 1),
       (SELECT o.seq FROM outbox o WHERE o.fanned_out ORDER BY o.txid DESC, o.seq DESC LIMIT 1),
       0
FROM (SELECT DISTINCT endpoint FROM deliveries) d
WHERE EXISTS (SELECT 1 FROM outbox WHERE fanned_out);
DROP INDEX outbox_unfanned;
ALTER TABLE outbox DROP COLUMN fanned_out;
