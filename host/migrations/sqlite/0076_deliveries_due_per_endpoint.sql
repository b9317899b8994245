-- The webhook claim (store/outbox.rs, `CLAIM`) walks one endpoint's due
-- deliveries in due order, and checks each candidate against its item's
-- earliest pending version. With the endpoint leading `deliveries_due`,
-- the walk stops at the claim's limit instead of reading every pending
-- delivery and sorting them on each claim (the rowid, `id`, breaks ties in
-- every SQLite index); with the item leading `deliveries_order`, the check
-- reads only that item's pending deliveries.
DROP INDEX deliveries_due;
CREATE INDEX deliveries_due ON deliveries (endpoint, next_attempt_at) WHERE status = 'pending';
DROP INDEX deliveries_order;
CREATE INDEX deliveries_order ON deliveries (item_id, endpoint, item_version) WHERE status = 'pending';
