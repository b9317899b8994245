-- The webhook claim (store/outbox.rs, `CLAIM`) walks one endpoint's due
-- deliveries in due order, and checks each candidate against its item's
-- earliest pending version. Each index now serves one of the two and
-- nothing else (the claim writes the check's endpoint condition so that no
-- B-tree serves it): on a table not analysed yet, PostgreSQL's estimates
-- made both indexes look alike and it read every pending delivery of the
-- endpoint per candidate. `id` ends `deliveries_due` so that the walk is in
-- exactly the claim's order and stops at its limit.
DROP INDEX deliveries_due;
CREATE INDEX deliveries_due ON deliveries (endpoint, next_attempt_at, id) WHERE status = 'pending';
DROP INDEX deliveries_order;
CREATE INDEX deliveries_order ON deliveries (item_id, endpoint, item_version) WHERE status = 'pending';
