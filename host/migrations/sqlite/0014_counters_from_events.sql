-- An item's counters are derived from its events: every event inserted adds
-- one to its item's counter of its kind, in the statement that inserts it,
-- so no write path can store an event without counting it or count one it
-- did not store. Retention deletes old events but never their counts (the
-- counters are of events ever appended; they sum to the item's event_seq).
CREATE TRIGGER events_counted AFTER INSERT ON events
BEGIN
    INSERT INTO counters (item_id, name, value) VALUES (NEW.item_id, NEW.kind, 1)
    ON CONFLICT (item_id, name) DO UPDATE SET value = value + 1;
END;
