-- Retention found the outbox rows, events and evaluation snapshots past
-- their time through an index on their time (`created_at`, `used_at`),
-- which every transition's outbox row, every event and every stored
-- snapshot paid for on insert, for one query a minute. Their keys (`seq`,
-- `id`) grow with that time, so retention now bisects the key range for
-- the last row past its time and deletes in key order up to it
-- (`store/retention.rs`, `last_older_than`).
DROP INDEX IF EXISTS events_created;
DROP INDEX IF EXISTS outbox_created;
DROP INDEX IF EXISTS snapshots_used;
