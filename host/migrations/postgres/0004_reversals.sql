-- Decisions a moderator overturned: the basis of each plugin version's reversal rate.
ALTER TABLE decisions ADD COLUMN reversed_at BIGINT;
-- Per plugin version figures (GET /v1/plugins).
CREATE INDEX decisions_digest ON decisions (plugin_digest, id);
