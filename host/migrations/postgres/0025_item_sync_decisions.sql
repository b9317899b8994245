-- The sync evaluation in force before one of an item's async evaluations
-- (what a backtest combines the async verdict with) is the item's newest
-- sync decision before it. Through `decisions_item` that read walks back
-- over every async decision in between: for an item flagged all day, its
-- whole history, once per replayed evaluation. This index holds only the
-- sync decisions, so the read is one seek (history.rs::sync_decisions_before).
CREATE INDEX decisions_item_sync ON decisions (item_id, id) WHERE phase = 'sync';
