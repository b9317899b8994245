-- An item's counters are derived from its events: every statement that
-- inserts events adds them to their items' counters of their kinds, summed
-- per (item, kind) and in key order (so concurrent statements lock counter
-- rows in one order), in the statement itself. No write path can store an
-- event without counting it or count one it did not store. Retention
-- deletes old events but never their counts (the counters are of events
-- ever appended; they sum to the item's event_seq).
CREATE FUNCTION count_events() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO counters (item_id, name, value)
    SELECT item_id, kind, count(*) FROM appended GROUP BY item_id, kind ORDER BY item_id, kind
    ON CONFLICT (item_id, name) DO UPDATE SET value = counters.value + excluded.value;
    RETURN NULL;
END
$$;

CREATE TRIGGER events_counted AFTER INSERT ON events
REFERENCING NEW TABLE AS appended
FOR EACH STATEMENT EXECUTE FUNCTION count_events();
